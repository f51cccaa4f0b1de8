"""Ctrl-C during a long replay ends `decodesched simulate` (a Numba kernel holds the interpreter, so the
CLI lets SIGINT act at once there) and leaves no output file behind; during grading it stops the
sandboxed runs under way.  SIGTERM and SIGHUP unwind the same way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from decodesched.cli import main


def test_sigint_during_a_replay_ends_the_run_and_writes_nothing(tmp_path):
    trace = tmp_path / "azure.csv"
    assert main(["trace", "convert", "bundled", "--load", "1.5", "--out", str(trace)]) == 0
    events = tmp_path / "ev.csv"
    p = subprocess.Popen([sys.executable, "-m", "decodesched.cli", "simulate", str(trace), "--policy", "aging",
                          "--kv-blocks", "2000", "--engine", "scan", "--events", str(events)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(5)  # loading and the start of the (minutes-long) scan replay
    assert p.poll() is None, p.stderr.read()
    os.kill(p.pid, signal.SIGINT)
    err = p.communicate(timeout=120)[1].decode()
    rc = p.returncode
    assert rc == 130 and err.endswith("decodesched: interrupted\n") and "Traceback" not in err, (rc, err)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["azure.csv", "azure.csv.meta.json"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_during_a_replay_says_so(tmp_path, sig):
    """While a kernel holds the interpreter, SIGTERM and SIGHUP ended the process as SIG_DFL does: no line, and
    a parent saw -15 rather than the 143 the CLI gives elsewhere.  Now the handler of `kernels.signal_nb` writes
    the CLI's line and exits 128 + the signal."""
    trace = tmp_path / "azure.csv"
    assert main(["trace", "convert", "bundled", "--load", "1.5", "--out", str(trace)]) == 0
    p = subprocess.Popen([sys.executable, "-m", "decodesched.cli", "simulate", str(trace), "--policy", "aging",
                          "--kv-blocks", "2000", "--engine", "scan"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))  # (as from a terminal, not nohup)
    time.sleep(5)  # loading and the start of the (minutes-long) scan replay
    assert p.poll() is None, p.stderr.read()
    os.kill(p.pid, sig)
    out, err = p.communicate(timeout=120)
    rc, err = p.returncode, err.decode()
    assert rc == 128 + sig and err.endswith(f"decodesched: terminated ({signal.Signals(sig).name})\n"), (rc, err)
    assert out == b"" and "Traceback" not in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_while_the_event_log_is_written_leaves_no_temporary_file(tmp_path, sig):
    """SIGTERM (kill, timeout, a job scheduler) or SIGHUP (the ssh session gone) ended the process where
    it stood: a hidden temporary event log of up to hundreds of MB stayed beside the output.  Now it
    unwinds as Ctrl-C does."""
    trace = tmp_path / "azure.csv"
    assert main(["trace", "convert", "bundled", "--load", "1.0", "--out", str(trace)]) == 0
    p = subprocess.Popen([sys.executable, "-m", "decodesched.cli", "simulate", str(trace), "--policy", "fcfs",
                          "--kv-blocks", "4000", "--events", str(tmp_path / "ev.csv")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))  # (as from a terminal, not nohup)
    deadline = time.monotonic() + 300
    # Writing (4 M rows) has begun: a temporary file with rows in it (the empty probe `check_writable` makes
    # before the replay has the same prefix, and a signal in the replay ends the process by its default action).
    while not any(x.name.startswith(".ev.csv.") and _size(x) > 0 for x in tmp_path.iterdir()):
        assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()
        time.sleep(0.01)
    os.kill(p.pid, sig)
    err = p.communicate(timeout=120)[1].decode()
    rc = p.returncode
    assert rc == 128 + sig and f"terminated ({sig.name})" in err and "Traceback" not in err, (rc, err)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["azure.csv", "azure.csv.meta.json"]


def _size(path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # (the probe, removed between the listing and the stat)
        return 0


def test_a_child_forked_inside_the_cli_ends_on_sigterm_as_usual():
    from decodesched._io import terminate_like_interrupt

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}  # (SIGHUP: ignored under nohup)
    with terminate_like_interrupt():
        if before[signal.SIGTERM] is signal.SIG_DFL:  # (a handler of someone else's is left alone)
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        pid = os.fork()
        if pid == 0:  # the child: the parent's cleanup is not its own
            os._exit(0 if all(signal.getsignal(sig) is h for sig, h in before.items()) else 1)
        assert os.waitpid(pid, 0)[1] == 0
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_an_ignored_sighup_stays_ignored():
    # `nohup decodesched sweep ...`: the hang-up must not stop it.
    from decodesched._io import terminate_like_interrupt

    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with terminate_like_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_during_grading_stops_the_runs_under_way_at_once(tmp_path, sig):
    """Ctrl-C in `decodesched grade` used to wait for every queued submission to finish grading (62 s
    for four such submissions); now the queued ones are cancelled and the sandboxed runs under way
    stopped: exit 130 in seconds, no grades, no gradebook change, no process left, no empty output
    folder.  SIGTERM (a job scheduler's `kill`) does the same, with exit 143."""
    import json

    from decodesched.grader import pipeline, sandbox, spec

    from grader_attacks.course import build_course, tool_env

    course, release_path = build_course(tmp_path)
    env = tool_env()
    release = json.loads(release_path.read_text())
    for cell in release["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == spec.SOLUTION_CELL:
            cell["source"] = "while True:\n    pass\n"  # each run spends its whole CPU limit
    subs = tmp_path / "subs"
    subs.mkdir()
    for i in range(6):
        (subs / f"s{i}.ipynb").write_text(json.dumps(release))
    gradebook = (course / "gradebook.db").read_bytes() if (course / "gradebook.db").exists() else None
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "decodesched.cli", "grade", str(subs), "--out", str(out),
                          "--course", str(course), "--jobs", "2", "--timeout", "120", "--no-progress"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    time.sleep(12)  # the fork server, the template and the first runs are under way
    assert p.poll() is None, p.stderr.read()
    start = time.monotonic()
    os.kill(p.pid, sig)
    err = p.communicate(timeout=600)[1].decode()
    rc, waited = p.returncode, time.monotonic() - start
    assert rc == 128 + sig and "Traceback" not in err, (rc, err[-2000:])
    assert waited < 30, f"the interrupt took {waited:.0f} s"  # before: 62 s, every submission graded
    assert not out.exists()
    assert ((course / "gradebook.db").read_bytes() if (course / "gradebook.db").exists() else None) == gradebook
    time.sleep(0.5)
    assert not sandbox.find_sandboxed(pipeline.marker_prefix(out))


API_SESSION = """
import sys, time
import decodesched
t = decodesched.load_trace(sys.argv[1])
decodesched.simulate(t, "aging", 2000, engine="scan", max_steps=10)  # (compiled before the signal)
print("ready", flush=True)
start = time.monotonic()
try:
    decodesched.simulate(t, "aging", 2000, engine="scan")  # (minutes)
    print("finished", flush=True)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - start:.0f} s", flush=True)
print("then", decodesched.simulate(t, "fcfs", 2000, max_steps=100).clock, flush=True)  # (the session goes on)
"""


def test_ctrl_c_in_the_apis_simulate_returns_to_the_session(tmp_path):
    """In Jupyter or a script, Ctrl-C (SIGINT: a kernel interrupt) during `simulate` waited for the whole replay:
    Python's handler runs between bytecodes, and the kernel held the interpreter for minutes.  The replay now runs
    in a helper thread (`_io.interruptible`, kernels with ``nogil=True``), so KeyboardInterrupt comes at once and
    the session goes on."""
    trace = tmp_path / "azure.csv"
    assert main(["trace", "convert", "bundled", "--load", "1.5", "--out", str(trace)]) == 0
    p = subprocess.Popen([sys.executable, "-c", API_SESSION, str(trace)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        time.sleep(2)  # (into the replay)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)  # (the replay alone takes minutes)
    finally:
        p.kill()
        p.communicate()
    assert p.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("interrupted after ") and lines[1].startswith("then ") and int(lines[1][5:]) > 0, out
    assert int(lines[0].split()[2]) < 60, out


def test_ctrl_c_while_the_signal_handler_compiles_is_ctrl_c(monkeypatch):
    """On a cold cache `immediate_interrupt` compiles `kernels.signal_nb` first (seconds on a busy machine). A
    Ctrl-C then, wrapped by Numba's compiler, was taken for a missing handler: the signal was swallowed and the
    replay ran on (CI saw a test time out). It is a KeyboardInterrupt, and nothing is cached."""
    import builtins

    from decodesched import _io

    real_import = builtins.__import__

    def interrupted_import(name, *args, **kwargs):
        if name.endswith("signal_nb") or (args[2:] and args[2] and "signal_nb" in args[2]):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as exc:
                raise RuntimeError("Failed in nopython mode pipeline (step: native lowering)") from exc
        return real_import(name, *args, **kwargs)

    _io._c_signal.cache_clear()
    monkeypatch.setattr(builtins, "__import__", interrupted_import)
    with pytest.raises(KeyboardInterrupt):
        _io._c_signal()
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert _io._c_signal() is not None  # (the interrupt was not cached as "no handler")
