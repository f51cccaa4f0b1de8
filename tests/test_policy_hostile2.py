"""A researcher's own policies, met the way a hostile or careless one writes them: a helper or a constant edited
in another module of a ``cache=True`` policy, a policy module loaded again from Numba's disk cache, a function
that loops forever on the sample request, a constant past int64, a policy path that is no regular file, and a
policy that prints during the replay while the event log streams to standard output.  Each test checks
behaviour: the replay follows the code as it is now, Ctrl-C ends the process, standard output stays the table.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numba
import numpy as np
import pytest

from decodesched import Policy
from decodesched.cli import main
from decodesched.errors import UserError

TRACE_CSV = """\
request_id,arrival_step,prompt_len,max_new_tokens,priority,cache_hit,required_blocks,deadline_step,preemptible
1,0,4,3,0,false,2,,true
2,0,2,2,5,true,3,10,true
"""

POLICY_MODULE = """
import numba
import numpy as np
from decodesched import Policy
from helpers import helper


@numba.njit(cache=True)
def key(r, clock):
    return (helper(r),)


@numba.njit(cache=True)
def priority(r, clock):
    return r.priority


P = Policy("cached_mine", key=key, effective_priority=priority)
"""

# The compiled key and its Python version (the model's) on one request, from a fresh process.
SHOW_KEY = ("import numpy as np; from decodesched.policy import RequestView; import mine; "
            "r = RequestView(*[np.int64(v) for v in (1, 0, 4, 7, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0)]); "
            "print(mine.P.key(r, np.int64(0))[0], mine.P.key.py_func(r, 0)[0])")


def _python(code, cwd):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("helpers, edited", [
    ("import numba\n\n\n@numba.njit(cache=True)\ndef helper(r):\n    return r.max_new_tokens\n",
     "import numba\n\n\n@numba.njit(cache=True)\ndef helper(r):\n    return -r.max_new_tokens\n"),
    ("import numba\n\nSIGN = 1\n\n\n@numba.njit(cache=True)\ndef helper(r):\n    return SIGN * r.max_new_tokens\n",
     "import numba\n\nSIGN = -1\n\n\n@numba.njit(cache=True)\ndef helper(r):\n    return SIGN * r.max_new_tokens\n"),
])
def test_an_edit_in_another_module_is_not_served_stale_from_the_disk_cache(tmp_path, monkeypatch, helpers, edited):
    """Numba checks a cached function against its own file only: the policy's key, cached, would keep the old
    helper (or constant) of helpers.py, and the replay would run old code while the model runs the new."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba-cache"))
    (tmp_path / "mine.py").write_text(POLICY_MODULE)
    (tmp_path / "helpers.py").write_text(helpers)
    first = _python(SHOW_KEY, tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["7", "7"]
    (tmp_path / "helpers.py").write_text(edited)
    for _ in range(2):  # (the first run after the edit writes the cache anew, the second loads it)
        again = _python(SHOW_KEY, tmp_path)
        assert again.returncode == 0, again.stderr
        assert again.stdout.split() == ["-7", "-7"]


def test_a_policy_loaded_from_the_disk_cache_prints_no_warning(tmp_path, monkeypatch):
    """The check for parallel regions inspected the compiled code; code Numba loaded from its disk cache
    cannot be inspected, and Numba said so with a UserWarning on stderr at every import but the first."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba-cache"))
    (tmp_path / "mine.py").write_text(POLICY_MODULE)
    (tmp_path / "helpers.py").write_text("import numba\n\n\n@numba.njit(cache=True)\ndef helper(r):\n"
                                         "    return r.max_new_tokens\n")
    for _ in range(2):
        run = _python("import mine; print(mine.P.name)", tmp_path)
        assert run.returncode == 0, run.stderr
        assert (run.stdout, run.stderr) == ("cached_mine\n", "")


LOOPING = """
import sys
import numba
import numpy as np
from decodesched import Policy
from decodesched.policy import RequestView


@numba.njit
def key(r, clock):
    x = 0
    while r.prompt_len == 1 and x >= 0:  # the sample request has prompt_len 1: no end
        x += 1 - x % 2
    return (x,)


@numba.njit
def priority(r, clock):
    return r.priority


key(RequestView(*([2] * 14)), 0)  # compiled here; the loop starts inside Policy(...) below
print("looping", file=sys.stderr, flush=True)
P = Policy("looping", key=key, effective_priority=priority)
"""


def test_ctrl_c_stops_a_function_that_loops_on_the_sample_request(tmp_path):
    """Compiled code holds the interpreter, so Python's Ctrl-C handler never ran while Policy(...) called a
    function that loops: the command could only be killed.  Now Ctrl-C ends it at once, as in a replay."""
    (tmp_path / "loop.py").write_text(LOOPING)
    (tmp_path / "t.csv").write_text(TRACE_CSV)
    proc = subprocess.Popen([sys.executable, "-m", "decodesched", "simulate", "t.csv", "--policy", "loop.py:P",
                             "--kv-blocks", "8"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr.readline() == "looping\n"
        time.sleep(2)  # (into the loop)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 130 and err.endswith("decodesched: interrupted\n"), (proc.returncode, err)
    assert out == "" and "Traceback" not in err


@numba.njit
def wide_key(r, clock):
    return (r.priority + 2**70,)


@numba.njit
def wide_priority(r, clock):
    return (r.priority + 1) * 4611686018427387904 * 4  # 2**64


@numba.njit
def plain_key(r, clock):
    return (r.priority,)


@numba.njit
def plain_priority(r, clock):
    return r.priority


@pytest.mark.parametrize("key, priority, what", [(wide_key, plain_priority, "key"),
                                                 (plain_key, wide_priority, "effective_priority")])
def test_a_value_past_int64_is_refused_when_the_policy_is_made(key, priority, what):
    """Compiled, 2**70 wraps around to 0 while the model's Python computes it exactly: the replay and the
    model would order requests differently without a word."""
    with pytest.raises(UserError) as err:
        Policy("wide", key=key, effective_priority=priority)
    message = str(err.value)
    assert f"{what}(r, clock) gives" in message and "int64" in message and "\n" not in message


def test_a_policy_path_that_is_not_a_regular_file_is_named_so(tmp_path, capsys, monkeypatch):
    """A folder, a FIFO or a device named .py exists; the old line said there was no such file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(TRACE_CSV)
    (tmp_path / "folder.py").mkdir()
    os.mkfifo(tmp_path / "fifo.py")
    os.symlink("/dev/zero", tmp_path / "zero.py")
    for name in ("folder.py", "fifo.py", "zero.py"):
        assert main(["simulate", "t.csv", "--policy", f"{name}:P", "--kv-blocks", "8"]) == 2
        err = capsys.readouterr().err
        assert err == f"decodesched simulate: error: policy '{name}:P': {name} is not a regular file; " \
                      "give a Python file\n"


PRINTING = textwrap.dedent("""
    import numba
    from decodesched import Policy


    @numba.njit
    def key(r, clock):
        if clock == 1:
            print("policy says", r.request_id)
        return (r.request_id,)


    @numba.njit
    def priority(r, clock):
        return r.priority


    P = Policy("printing", key=key, effective_priority=priority)
""")


@pytest.mark.parametrize("command", [["simulate", "t.csv", "--events", "-"],
                                     ["sweep", "t.csv", "--out", "-", "--no-progress"],
                                     ["sweep", "t.csv", "--out", "-", "--no-progress", "--dask", "local"]])
def test_what_a_policy_prints_in_the_replay_stays_out_of_a_streamed_table(tmp_path, capfd, monkeypatch, command):
    """Compiled print writes to sys.stdout; with the table streamed there it became rows of the CSV."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(TRACE_CSV)
    (tmp_path / "printing.py").write_text(PRINTING)
    assert main([*command, "--policy", "printing.py:P", "--kv-blocks", "8"]) == 0
    out, err = capfd.readouterr()
    assert "policy says" not in out and "policy says" in err
    assert out.splitlines()[0].startswith(("step,", "trace,"))


@numba.njit
def depth(n):
    if n <= 0:
        return 0
    return 1 + depth(n - 1)


@numba.njit
def deep_key(r, clock):
    return (depth(r.request_id * 100_000_000),)


@numba.njit
def ping(n):
    return 0 if n <= 0 else pong(n - 1)


@numba.njit
def pong(n):
    return ping(n)


@numba.njit
def ping_priority(r, clock):
    return ping(r.priority)


@pytest.mark.parametrize("key, priority, culprit", [(deep_key, plain_priority, "depth"),
                                                    (plain_key, ping_priority, "ping")])
def test_a_recursive_policy_is_refused_before_it_can_overflow_the_stack(key, priority, culprit):
    """The sample request (id 0) returns at once; the replay's request ids recursed 10**8 deep and the
    process died of a segmentation fault, without a line."""
    with pytest.raises(UserError) as err:
        Policy("deep", key=key, effective_priority=priority)
    assert f"{culprit} calls itself" in str(err.value) and "write it as a loop" in str(err.value)


COUNTS = np.zeros(1, dtype=np.int64)


@numba.njit
def counting_key(r, clock):
    COUNTS[0] += 1
    return (COUNTS[0],)


def test_a_policy_that_writes_a_global_array_is_told_it_is_read_only():
    """Numba's first line ended in "found for signature:"; the reason is further down its message."""
    with pytest.raises(UserError) as err:
        Policy("counting", key=counting_key, effective_priority=plain_priority)
    message = str(err.value)
    assert "Cannot modify readonly array" in message and "keeps no state between calls" in message
    assert "\n" not in message
