"""Stop 56, sweeps under misuse: two sweeps on one checkpoint, a sweep killed with SIGKILL and resumed, a stream
given twice, the same policy twice in `grid`, and `run_local`'s progress bar in Jupyter.  Each test runs the
command or the runner and checks the files it leaves, not only a message."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import types
from pathlib import Path

import numba
import pytest

from decodesched import Policy
from decodesched import batch as B
from decodesched import checkpoint as C
from decodesched.cli import main
from decodesched.errors import UserError
from decodesched.trace import TRACE_COLUMNS

TRACE_CSV = ",".join(TRACE_COLUMNS) + """
1,0,4,3,0,false,2,,true
2,0,2,2,5,true,3,10,true
3,1,3,4,1,false,4,6,false
-4,2,5,1,-2,false,1,,true
"""
GRID = ["--policy", "fcfs,aging", "--kv-blocks", "3,4,6", "--aging-interval", "1,4", "--threads", "1",
        "--chunk-size", "1", "--no-progress"]
N_SCENARIOS = 9

# A `decodesched sweep` that, once its first chunk is saved, writes READY and waits for GO before its next one.
STALLED = """
import os, sys, time
from decodesched import batch
from decodesched.cli import main
ready, go, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
real, calls = batch.simulate_batch, []
def stalled(*a, **k):
    calls.append(1)
    if len(calls) == 2:
        open(ready, "w").close()
        while not os.path.exists(go):
            time.sleep(0.05)
    return real(*a, **k)
batch.simulate_batch = stalled
sys.exit(main(argv))
"""


@numba.njit
def _key(r, clock):
    return (r.max_new_tokens - r.generated_len,)


@numba.njit
def _priority(r, clock):
    return -(r.max_new_tokens - r.generated_len)


SJF = Policy("sjf56s", key=_key, effective_priority=_priority)


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(TRACE_CSV)
    return path


@pytest.fixture
def expected(trace, tmp_path, capsys):
    """The CSV of an uninterrupted sweep, as bytes."""
    out = tmp_path / "whole" / "m.csv"
    out.parent.mkdir()
    assert main(["sweep", str(trace), *GRID, "--out", str(out)]) == 0
    capsys.readouterr()
    return out.read_bytes()


def _stalled(tmp_path, trace, out):
    """Start a stalled sweep writing `out`; returns (process, GO file) once its first chunk is saved."""
    ready, go = tmp_path / "ready", tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", STALLED, str(ready), str(go), "sweep", str(trace), *GRID,
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the stalled sweep did not start: {proc.communicate()}")
        time.sleep(0.05)
    return proc, go


def test_a_second_sweep_on_the_same_checkpoint_is_refused_while_the_first_runs(trace, tmp_path, expected, capsys):
    out = tmp_path / "m.csv"
    ck = C.checkpoint_path_for(str(out))
    first, go = _stalled(tmp_path, trace, out)
    try:
        saved = Path(ck).read_bytes()
        # (before: the second resumed from the first's checkpoint, finished, and removed it under the first)
        assert main(["sweep", str(trace), *GRID, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"another sweep (process {first.pid}) is running with this checkpoint" in err, err
        for run in (lambda: C.run_local([str(trace)], B.grid(1, ["fcfs"], [3], None), checkpoint_path=ck),
                    lambda: pytest.importorskip("decodesched.distributed").run_sweep(
                        [str(trace)], B.grid(1, ["fcfs"], [3], None), "tcp://127.0.0.1:9", checkpoint_path=ck)):
            with pytest.raises(UserError, match="another sweep .* is running with this checkpoint; wait for it"):
                run()
        assert Path(ck).read_bytes() == saved and not out.exists()  # nothing of the first's touched
    finally:
        go.touch()
        stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert out.read_bytes() == expected
    assert sorted(os.listdir(tmp_path)) == ["go", "m.csv", "ready", "t.csv", "whole"]  # no checkpoint, no lock


def test_a_sweep_killed_with_sigkill_resumes_to_the_same_bytes(trace, tmp_path, expected, capsys):
    out = tmp_path / "m.csv"
    killed, _ = _stalled(tmp_path, trace, out)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    ck = C.checkpoint_path_for(str(out))
    lock = ck + C.LOCK_SUFFIX
    assert os.path.exists(ck) and Path(lock).read_text() == f"{killed.pid}\n"  # what the killed run left
    with open(ck, "ab") as fh:
        fh.write(b'{"indices": [5], "ro')  # and a torn last line, as a kill during a write leaves
    assert main(["sweep", str(trace), *GRID, "--out", str(out)]) == 0  # (its lock died with it: no wait)
    capsys.readouterr()
    assert out.read_bytes() == expected
    assert not os.path.exists(ck) and not os.path.exists(lock)


def test_a_foreign_file_where_the_lock_goes_is_refused_and_kept(trace, tmp_path, capsys):
    out = tmp_path / "m.csv"
    lock = C.checkpoint_path_for(str(out)) + C.LOCK_SUFFIX
    with open(lock, "w") as fh:
        fh.write("my notes\n")
    assert main(["sweep", str(trace), *GRID, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "keeps its lock file here, but this is another file; move it away" in err, err
    assert Path(lock).read_text() == "my notes\n" and not out.exists()
    os.unlink(lock)
    os.symlink(trace, lock)  # a link there is never followed
    assert main(["sweep", str(trace), *GRID, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "cannot create the sweep's lock file" in err, err
    assert trace.read_text() == TRACE_CSV and os.path.islink(lock) and not out.exists()
    os.unlink(lock)
    os.mkfifo(lock)  # (opened and read, it would wait for a writer forever)
    assert main(["sweep", str(trace), *GRID, "--out", str(out)]) == 2
    assert "keeps its lock file here, but this is not a file" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.stat(lock).st_mode) and not out.exists()


def test_a_stream_given_twice_is_read_once_and_replayed_twice(tmp_path):
    out = tmp_path / "m.csv"
    done = subprocess.run([sys.executable, "-m", "decodesched", "sweep", "/dev/stdin", "/dev/stdin", "--policy",
                           "fcfs", "--kv-blocks", "3", "--threads", "1", "--out", str(out)], input=TRACE_CSV,
                          capture_output=True, text=True, timeout=300)
    # (before: "/dev/stdin: empty file", exit 2: the second reading found the stream used up)
    assert done.returncode == 0, done.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and lines[1].split(",")[1:] == lines[2].split(",")[1:]


def test_grid_refuses_a_value_given_twice_as_the_sweep_command_does():
    for args, what in (((SJF, SJF), [3], None), "policy 'sjf56s' is given twice; give each policy once"), (
            (["fcfs", "fcfs"], [3], None), "policy 'fcfs' is given twice; give each policy once"), (
            (["fcfs"], [3, 3], None), "kv_blocks holds 3 twice; give each value once"), (
            (["aging"], [3], [2, 2]), "aging_intervals holds 2 twice; give each value once"):
        # (before: two identical scenarios, two identical rows)
        with pytest.raises(UserError, match=f"^grid: {what}$"):
            B.grid(1, *args)


def test_run_local_progress_in_jupyter_is_one_display_updated_in_place(trace, monkeypatch, capfd):
    shown = []

    class Handle:
        def update(self, data, raw):
            shown.append(data["text/plain"])

    def display(data, raw, display_id):
        shown.append(data["text/plain"])
        return Handle()

    shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    monkeypatch.setitem(sys.modules, "IPython.display", types.SimpleNamespace(display=display))
    rows = C.run_local([str(trace)], B.grid(1, ["fcfs", "aging"], [3, 4], [1, 4]), chunk_size=1, threads=1,
                       progress=True)
    assert len(rows) == 6
    # (before: each redraw on stderr, "\rsweep [...] 1/6", kept by the notebook as one more output)
    assert capfd.readouterr().err == "" and shown and shown[-1].startswith("sweep [") and "6/6" in shown[-1]


def test_an_edited_checkpoint_line_is_computed_again_not_resumed(trace, tmp_path):
    ck = str(tmp_path / "c.jsonl")
    scenarios = B.grid(1, ["fcfs", "aging"], [3, 4, 6], [1, 4])
    want = json.dumps(B.simulate_batch([str(trace)], scenarios).rows())  # (NaN as NaN, 3 and 3.0 told apart)
    assert json.dumps(C.run_local([str(trace)], scenarios, chunk_size=2, threads=1, checkpoint_path=ck,
                                  keep_checkpoint=True)) == want
    lines = Path(ck).read_text().splitlines()
    assert len(lines) == 1 + 5
    edited = lines[2].replace('"finished": ', '"finished": 99', 1)  # (a hand edit, or a flipped bit on disk)
    assert edited != lines[2]
    Path(ck).write_text("\n".join([*lines[:2], edited, *lines[3:]]) + "\n")
    assert len(C.read_checkpoint(ck, C.sweep_key([B.load_trace(str(trace))], scenarios), len(scenarios))) == 2
    # (before: the edited value came back in the resumed sweep's rows)
    assert json.dumps(C.run_local([str(trace)], scenarios, chunk_size=2, threads=1, checkpoint_path=ck)) == want
    assert not os.path.exists(ck)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes a read-only file")
def test_a_read_only_checkpoint_is_refused_before_any_work(trace, tmp_path, capsys):
    out = tmp_path / "m.csv"
    ck = Path(C.checkpoint_path_for(str(out)))
    ck.write_text(json.dumps({"format": C.CHECKPOINT_FORMAT, "sweep": "another", "scenarios": 1}) + "\n")
    ck.chmod(0o444)
    # (before: the first chunk was computed, then "cannot write the sweep's checkpoint", and so on every rerun)
    assert main(["sweep", str(trace), *GRID, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "checkpoint is read-only; make it writable" in err, err
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["m.csv.partial.jsonl", "t.csv"]


def test_a_new_checkpoint_appears_whole_or_not_at_all(tmp_path):
    """Written in place, a new checkpoint was truncated first and filled after: a run killed or failing between
    left an empty or header-only file (an empty one the next run refuses as no checkpoint), in place of the
    checkpoint of another sweep that was there."""
    ck = tmp_path / "c.jsonl"
    other = C.Checkpoint(ck, "another sweep", 1, {})
    other.add([0], [{"finished": 1}])
    other.close()
    before = ck.read_bytes()
    new = C.Checkpoint(ck, "this sweep", 1, {})
    with pytest.raises(TypeError):
        new.add([0], [{"finished": object()}])  # (the first chunk cannot be written)
    new.close()
    assert ck.read_bytes() == before and os.listdir(tmp_path) == ["c.jsonl"]
    new = C.Checkpoint(ck, "this sweep", 1, {})
    new.add([0], [{"finished": 2}])
    new.close()
    assert C.read_checkpoint(ck, "this sweep", 1) == {0: {"finished": 2}} and os.listdir(tmp_path) == ["c.jsonl"]
