"""Stop 63, every command in a strange environment: under ``python -OO`` (docstrings gone) every command, ``--help``
and ``--version`` included, ended in an AttributeError traceback (`assignment`'s description was its module's
docstring).  A Numba threading layer that cannot load (``NUMBA_THREADING_LAYER=tbb`` without TBB, a layer or
``NUMBA_THREADING_LAYER_PRIORITY`` Numba does not know) ended `sweep` and `warmup` in Numba's ValueError traceback.
``--help`` or ``--version`` into a closed standard output (``>&-``) was written to standard error, exit 0.  More
NUMBA_NUM_THREADS than the system lets a process start ended `sweep` in libgomp's "Thread creation failed" (exit
1) and `warmup` in a segmentation fault."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from test_cli_hostile3 import TRACE, one_line


def _cli(argv, tmp_path, *, flags=(), env=None, close_stdout=False) -> subprocess.CompletedProcess:
    """``python FLAGS -m decodesched ARGV`` in `tmp_path`, its standard output closed where asked (``>&-``)."""
    command = [sys.executable, *flags, "-m", "decodesched", *argv]
    if close_stdout:
        command = ["sh", "-c", 'exec "$@" >&-', "sh", *command]
    return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})})


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["assignment", "--help"], ["simulate", "--help"]])
def test_every_command_runs_under_python_OO(tmp_path, argv):
    # (not a replay: -OO changes the kernels' bytecode, so Numba's cache misses and it compiles for minutes)
    done = _cli(argv, tmp_path, flags=["-OO"])
    assert done.returncode == 0 and done.stderr == "" and done.stdout, done.stderr


def _tbb_loads() -> bool:
    try:
        importlib.import_module("numba.np.ufunc.tbbpool")  # (loads only with TBB's library)
    except ImportError:
        return False
    return True


LAYERS = [{"NUMBA_THREADING_LAYER": "junk"}, {"NUMBA_THREADING_LAYER_PRIORITY": "junk"},
          pytest.param({"NUMBA_THREADING_LAYER": "tbb"},
                       marks=pytest.mark.skipif(_tbb_loads(), reason="TBB is installed here"))]


@pytest.mark.parametrize("env", LAYERS)
@pytest.mark.parametrize("command", ["sweep", "warmup"])
def test_a_threading_layer_that_cannot_load_is_one_line_naming_its_variable(tmp_path, env, command):
    (tmp_path / "t.csv").write_text(TRACE)
    argv = ["sweep", "t.csv", "--policy", "fcfs", "--kv-blocks", "9", "--threads", "1", "--out", "m.csv",
            "--no-progress"] if command == "sweep" else ["warmup"]
    done = _cli(argv, tmp_path, env=env)
    (name, value), = env.items()
    line = one_line(done.stderr)
    assert done.returncode == 2 and f"{name}={value!r}" in line and "threading layer" in line, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]  # (no metrics, no checkpoint)


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["sweep", "--help"], []])
def test_help_into_a_closed_standard_output_says_so(tmp_path, argv):
    done = _cli(argv, tmp_path, close_stdout=True)
    assert done.returncode == 2 and "standard output is closed" in one_line(done.stderr)


@pytest.mark.skipif(sys.platform != "linux", reason="the limits are read from Linux's /proc")
@pytest.mark.parametrize("command", ["sweep", "warmup"])
def test_more_numba_threads_than_the_system_allows_is_one_line(tmp_path, command):
    (tmp_path / "t.csv").write_text(TRACE)
    argv = ["sweep", "t.csv", "--policy", "fcfs", "--kv-blocks", "9", "--out", "m.csv", "--no-progress"] \
        if command == "sweep" else ["warmup"]
    done = _cli(argv, tmp_path, env={"NUMBA_NUM_THREADS": str(2**23)})  # (above Linux's largest pid_max, 2**22)
    assert done.returncode == 2 and "NUMBA_NUM_THREADS='8388608'" in one_line(done.stderr), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]
