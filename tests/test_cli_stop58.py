"""Stop 58, the CLI in odd process environments: NUMBA_NUM_THREADS=0 (or text) and NUMBA_DISABLE_JIT=1 ended in
Numba's traceback, standard output on a full disk under PYTHONUNBUFFERED (``python -u``, Docker's usual setting) or
as ``--events -`` said "no space left on the device" without naming it, a SIGTERM while the console script was still
starting ended the command with no line, and a trace with its header repeated inside (two files joined) read as
"expected an integer"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from decodesched import load_trace
from decodesched.cli import main
from decodesched.trace import TraceError

from test_cli_hostile3 import TRACE, _FullStdout, one_line, run


def _command(argv, env_changes, **kwargs):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "NUMBA_NUM_THREADS",
                                                           "NUMBA_DISABLE_JIT")}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-m", "decodesched", *argv], capture_output=True, text=True, timeout=300,
                          env=env, **kwargs)


# ---------------------------------------------------------------- Numba's settings in the environment


@pytest.mark.parametrize("value", ["0", "-1", "abc", "", "1.5"])
def test_a_thread_count_numba_cannot_take_is_one_line_naming_it(monkeypatch, value):
    # Before: 0 or less was Numba's ValueError traceback at its import (even for --version), exit 1; text was ignored
    # with a warning (a traceback under PYTHONWARNINGS=error).
    monkeypatch.setenv("NUMBA_NUM_THREADS", value)
    code, out, err = run(["--version"])
    assert (code, out) == (2, "")
    assert one_line(err) == (f"decodesched: error: NUMBA_NUM_THREADS={value!r} is not a whole number of threads "
                             "from 1 up; set one (or unset NUMBA_NUM_THREADS)")


def test_a_zero_thread_count_in_a_fresh_process_is_the_line_not_numbas_traceback():
    done = _command(["--version"], {"NUMBA_NUM_THREADS": "0"})
    assert (done.returncode, done.stdout) == (2, "")
    assert "NUMBA_NUM_THREADS='0'" in one_line(done.stderr)


def test_a_good_thread_count_still_runs(monkeypatch):
    monkeypatch.setenv("NUMBA_NUM_THREADS", " 2 ")  # (as Numba reads it: int() takes the spaces)
    code, out, _ = run(["--version"])
    assert code == 0 and out.startswith("decodesched ")


@pytest.mark.parametrize("command", [["simulate", "{trace}", "--policy", "fcfs", "--kv-blocks", "4",
                                      "--events", "{out}.csv"],
                                     ["demo", "--out", "{out}"],
                                     ["warmup"]])
def test_a_command_that_replays_with_the_compiler_off_says_why_it_cannot(tmp_path, monkeypatch, command):
    # Before: "NotImplementedError: <intrinsic advise_huge_pages_nb> is not usable in pure-python" (warmup: an
    # AttributeError), exit 1, after the "compiling ..." notice.
    (tmp_path / "t.csv").write_text(TRACE)
    out = tmp_path / "out"
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "1")
    argv = [a.format(trace=tmp_path / "t.csv", out=out) for a in command]
    code, stdout, err = run(argv)
    assert (code, stdout) == (2, "")
    assert one_line(err) == (f"decodesched {command[0]}: error: NUMBA_DISABLE_JIT is set: the replay kernels need "
                             "Numba's compiler (they cannot run as plain Python); unset NUMBA_DISABLE_JIT")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]  # (no table, no folder of demo's)


def test_a_sweep_with_the_compiler_off_says_why_it_cannot(tmp_path):
    # Numba reads NUMBA_DISABLE_JIT at its import: the kernels' modules fail to build (sweep imports its batch kernel
    # before it asks for a compile notice).
    (tmp_path / "t.csv").write_text(TRACE)
    done = _command(["sweep", "t.csv", "--policy", "fcfs", "--kv-blocks", "4", "--out", "s.csv"],
                    {"NUMBA_DISABLE_JIT": "1"}, cwd=tmp_path)
    assert done.returncode == 2
    assert one_line(done.stderr).endswith("NUMBA_DISABLE_JIT is set: the replay kernels need Numba's compiler (they "
                                          "cannot run as plain Python); unset NUMBA_DISABLE_JIT")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_with_the_compiler_on_a_zero_disable_jit_still_runs(tmp_path, monkeypatch):
    (tmp_path / "t.csv").write_text(TRACE)
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "0")
    code, out, _ = run(["simulate", str(tmp_path / "t.csv"), "--policy", "fcfs", "--kv-blocks", "4"])
    assert code == 0 and "fcfs" in out


# ---------------------------------------------------------------- standard output on a full disk


_STREAMED = ["simulate", "{trace}", "--policy", "fcfs", "--kv-blocks", "4", "--events", "-"]


@pytest.mark.parametrize("argv, unbuffered", [(["trace", "inspect", "{trace}"], True), (_STREAMED, True),
                                              (_STREAMED, False)])  # (inspect, buffered: test_cli_hostile3.py)
def test_a_commands_output_into_a_full_disk_names_standard_output_buffered_or_not(tmp_path, monkeypatch, capsys,
                                                                                   argv, unbuffered):
    # Before: "error: no space left on the device" (print's own write under PYTHONUNBUFFERED, or the table of
    # --events - written to standard output's binary layer): which file?
    (tmp_path / "t.csv").write_text(TRACE)
    full = _FullStdout(unbuffered)
    monkeypatch.setattr(sys, "stdout", full)
    assert main([a.format(trace=tmp_path / "t.csv") for a in argv]) == 2
    assert one_line(capsys.readouterr().err) == \
        f"decodesched {' '.join(argv[:2 if argv[0] == 'trace' else 1])}: error: standard output: cannot write " \
        "(no space left on the device)"
    assert sys.stdout is full  # (the command's wrapper is gone)


def test_dev_full_under_pythonunbuffered_names_standard_output(tmp_path):
    (tmp_path / "t.csv").write_text(TRACE)
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "decodesched", "trace", "inspect", "t.csv"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=300, cwd=tmp_path,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 2
    assert one_line(done.stderr) == \
        "decodesched trace inspect: error: standard output: cannot write (no space left on the device)"


# ---------------------------------------------------------------- a signal while the console script starts

# The console script (its file is named `decodesched`), signalled after it imported the CLI and before `main` runs.
# It starts with the signal at its default, as a shell starts a command: under `nohup` (this suite's CI) SIGHUP is
# inherited ignored, and an ignored signal is rightly left so.
_SIGNALLED_AT_START = textwrap.dedent("""\
    import os, signal, sys
    signal.signal(signal.{sig}, signal.SIG_DFL)
    from decodesched import cli
    os.kill(os.getpid(), signal.{sig})
    sys.exit(cli.main())
""")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_signal_before_main_runs_is_the_commands_line(tmp_path, sig):
    # Before: SIGTERM and SIGHUP were still at their default there: the process ended with no line (-15, -1).
    script = tmp_path / "decodesched"
    script.write_text(_SIGNALLED_AT_START.format(sig=sig))
    done = subprocess.run([sys.executable, str(script), "simulate", "t.csv", "--policy", "fcfs", "--kv-blocks", "4"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == \
        (128 + getattr(signal, sig), "", f"decodesched simulate: terminated ({sig})\n")


# ---------------------------------------------------------------- a trace with its header repeated inside


@pytest.mark.parametrize("spaced", [False, True])
def test_a_header_repeated_inside_a_trace_is_named_as_such(tmp_path, spaced):
    # Before: "row 3 (line 4), column request_id: expected an integer, got 'request_id'".
    second = TRACE.replace(",", " , ") if spaced else TRACE
    (tmp_path / "t.csv").write_text(TRACE + second)
    code, out, err = run(["trace", "inspect", str(tmp_path / "t.csv")])
    assert (code, out) == (2, "")
    assert one_line(err) == (f"decodesched trace inspect: error: {tmp_path / 't.csv'}: row 3 (line 4) repeats the "
                             "header (two traces joined whole?); remove it")
    with pytest.raises(TraceError, match=r"row 3 \(line 4\) repeats the header"):
        load_trace(tmp_path / "t.csv")


def test_a_row_whose_first_cell_only_looks_like_the_header_is_still_a_bad_integer(tmp_path):
    (tmp_path / "t.csv").write_text(TRACE + "request_id" + TRACE.splitlines()[1][1:] + "\n")  # ("request_id,0,4,...")
    with pytest.raises(TraceError, match=r"row 3 \(line 4\), column request_id: expected an integer"):
        load_trace(tmp_path / "t.csv")



# ---------------------------------------------------------------- a current folder deeper than a path may be


def test_outputs_by_relative_name_in_a_current_folder_deeper_than_path_max(tmp_path, monkeypatch):
    # Before: "e.csv: cannot write in . (file name too long)": mkstemp made the temporary file's name absolute,
    # 4,400 bytes, where the relative names (the trace read fine) work.
    monkeypatch.chdir(tmp_path)
    for _ in range(22):  # (each folder entered before the next is made: no absolute name is ever used)
        os.mkdir("d" * 200)
        os.chdir("d" * 200)
    assert len(os.getcwd()) > 4096
    with open("t.csv", "w") as fh:
        fh.write(TRACE)
    code, out, err = run(["simulate", "t.csv", "--policy", "fcfs", "--kv-blocks", "4", "--events", "e.csv",
                          "--requests", "r.csv"])
    assert (code, err) == (0, "") and "fcfs" in out
    assert sorted(os.listdir(".")) == ["e.csv", "r.csv", "t.csv"]
    with open("e.csv") as fh:
        assert fh.readline().startswith("step,request_id,")


# ---------------------------------------------------------------- a current folder removed before the run


def test_a_removed_current_folder_is_said_so(tmp_path, monkeypatch):
    # Before: "decodesched sweep: error: no such file or folder" (os.getcwd's error names no file).
    (tmp_path / "t.csv").write_text(TRACE)
    (tmp_path / "gone").mkdir()
    monkeypatch.chdir(tmp_path / "gone")
    os.rmdir(tmp_path / "gone")
    code, out, err = run(["sweep", str(tmp_path / "t.csv"), "--policy", "fcfs", "--kv-blocks", "4", "--out", "s.csv"])
    assert (code, out) == (2, "")
    assert one_line(err) == \
        "decodesched sweep: error: the current folder no longer exists (it was removed); cd to one that does"
