"""Stop 60, every command as a hostile newcomer: a kernel cache file cut short or garbled (a crash or a full disk
while a cache was copied or synced) ended every command in the unpickler's traceback, or as "invalid literal for
int()"; a NUMBA_CACHE_DIR on a full disk ended `warmup` and a first `simulate` with "no space left on the device",
naming nothing, where the cache beside the sources costs only the cache; an option given twice kept the last one
unsaid (`sweep --policy fcfs --policy aging` swept aging alone); `sweep a.csv --policy fcfs b.csv` said
"unrecognized arguments: b.csv"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import decodesched.kernels
from decodesched._numba_cache import cache_subpath

from test_cli_hostile3 import TRACE, one_line, run

KERNELS = Path(decodesched.kernels.__file__).resolve().parent
SIGNAL_PY = str(KERNELS / "signal_nb.py")


def _command(argv: list[str], cache: Path, prelude: str = "") -> subprocess.CompletedProcess:
    """`decodesched ARGV` in a fresh process with NUMBA_CACHE_DIR=`cache` (after `prelude`, Python run first)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "PYTHONWARNINGS"))}
    env["NUMBA_CACHE_DIR"] = str(cache)
    script = prelude + "\nimport sys\nfrom decodesched.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-W", "error", "-c", script, *argv], capture_output=True, text=True,
                          timeout=600, env=env)


def _signal_line(out: str) -> str:
    return next(line for line in out.splitlines() if "exit_on_signal_nb" in line)


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory) -> Path:
    """A NUMBA_CACHE_DIR holding every kernel: the cache `warmup` reports, copied (it warms it first)."""
    root = tmp_path_factory.mktemp("numba-cache")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "PYTHONWARNINGS"))}
    done = subprocess.run([sys.executable, "-m", "decodesched", "warmup"], capture_output=True, text=True,
                          timeout=900, env=env, check=True)
    where = Path(done.stdout.splitlines()[0].split("cache in ", 1)[1].split(" (")[0])
    shutil.copytree(where, root / cache_subpath(SIGNAL_PY))
    return root


def _damage(folder: Path, suffix: str, how: str) -> Path:
    """One cache file of the signal handler kernel, cut short or garbled."""
    path = next(folder.glob(f"signal_nb.exit_on_signal_nb-*{suffix}"))
    data = path.read_bytes()
    path.write_bytes({"cut short": data[: len(data) // 3], "garbled": b"garbage\n", "empty": b""}[how])
    return path


@pytest.mark.parametrize("suffix, how", [(".nbi", "garbled"), (".nbi", "cut short"), (".nbc", "empty")])
def test_a_damaged_kernel_cache_file_is_compiled_again_with_one_line_and_replaced(warm_cache, tmp_path, suffix, how):
    # Before: a traceback ending in "UnpicklingError: pickle data was truncated" (or EOFError, exit 1), or for a
    # garbled index "decodesched warmup: error: invalid literal for int() with base 10: 'arbage\n'", exit 2, in
    # every later run too.
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    damaged = _damage(cache / cache_subpath(SIGNAL_PY), suffix, how)
    first = _command(["warmup"], cache)
    assert first.returncode == 0, first.stderr
    assert first.stderr == f"decodesched: cannot read the kernel cache file {damaged} (damaged); compiling that " \
                           "kernel again\n"
    assert "compiled" in _signal_line(first.stdout)
    again = _command(["warmup"], cache)  # the save replaced the damaged file
    assert (again.returncode, again.stderr) == (0, "")
    assert "loaded from cache" in _signal_line(again.stdout)


GARBLED_CODE = textwrap.dedent("""
    from numba.core import caching

    rebuild = caching.CompileResultCacheImpl.rebuild

    def _garbled(self, target_context, payload):  # (what code garbled inside a file that unpickles gives)
        if self.filename_base.startswith("signal_nb.exit_on_signal_nb-"):
            raise RuntimeError("LLVM bitcode parsing error")
        return rebuild(self, target_context, payload)

    caching.CompileResultCacheImpl.rebuild = _garbled
""")


def test_cached_code_that_does_not_rebuild_is_compiled_again_with_one_line(warm_cache, tmp_path):
    # Before: a traceback ending in "RuntimeError: LLVM bitcode parsing error" (a data file garbled past its start).
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    folder = cache / cache_subpath(SIGNAL_PY)
    base = next(folder.glob("signal_nb.exit_on_signal_nb-*.nbi")).stem
    done = _command(["warmup"], cache, prelude=GARBLED_CODE)
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"decodesched: cannot read the kernel cache of {base} in {folder} (damaged); compiling " \
                          "that kernel again\n"
    assert "compiled (now cached)" in _signal_line(done.stdout)


FULL_DISK = textwrap.dedent("""
    import errno, os
    from numba.core import caching

    def _full(self, filepath):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filepath)

    caching.IndexDataCacheFile._open_for_write = _full
""")


def test_a_numba_cache_dir_on_a_full_disk_costs_only_the_cache(warm_cache, tmp_path):
    # Before: "decodesched warmup: error: no space left on the device", exit 2, once the kernel had compiled; and
    # where the cache beside the sources was full, warmup said "compiled (now cached)" below the notice.
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    folder = cache / cache_subpath(SIGNAL_PY)
    for path in folder.glob("signal_nb.*"):
        path.unlink()
    done = _command(["warmup"], cache, prelude=FULL_DISK)
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"decodesched: cannot write the kernel cache in {folder} (no space left on the device); " \
                          "running uncached\n"
    assert "compiled (not cached)" in _signal_line(done.stdout)  # (it said "compiled (now cached)")
    assert not list(folder.glob("signal_nb.*"))


# ---------------------------------------------------------------- an option given twice


@pytest.mark.parametrize("argv, option, listed", [
    (["sweep", "{trace}", "--policy", "fcfs", "--policy", "aging", "--kv-blocks", "4", "--out", "{out}"],
     "--policy", True),
    (["sweep", "{trace}", "--policy", "fcfs", "--kv-blocks", "4,8", "--kv-blocks=16", "--out", "{out}"],
     "--kv-blocks", True),
    (["simulate", "{trace}", "--policy", "fcfs", "--kv-blocks", "4", "--kv", "8", "--events", "{out}"],
     "--kv-blocks", False),
    (["simulate", "{trace}", "--policy", "fcfs", "--kv-blocks", "4", "--kv-blocks", "4", "--events", "{out}"],
     "--kv-blocks", False),
    (["trace", "convert", "bundled", "--load", "1", "--load", "2", "--out", "{out}"], "--load", False),
    (["demo", "--requests", "50", "--requests", "60", "--out", "{out}"], "--requests", False),
    (["report", "{trace}", "--out", "{out}", "--out", "{out}2"], "--out", False),
])
def test_an_option_given_twice_is_refused_naming_it(tmp_path, argv, option, listed):
    # Before: the last one was kept, unsaid: `sweep --policy fcfs --policy aging` swept aging alone, exit 0.
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    out = tmp_path / "out.csv"
    code, stdout, err = run([a.format(trace=trace, out=out) for a in argv])
    assert (code, stdout) == (2, "")
    assert one_line(err) == f"decodesched {' '.join(argv[:2 if argv[0] == 'trace' else 1])}: error: argument " \
                            f"{option}: given more than once; give it once" \
                            f"{', with its values comma-separated' if listed else ''} (see --help)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


# ---------------------------------------------------------------- traces among a sweep's options


@pytest.mark.parametrize("order", [["{a}", "--policy", "fcfs", "--kv-blocks", "4", "{b}"],
                                   ["--policy", "fcfs", "{a}", "--kv-blocks", "4", "{b}"],
                                   ["--policy", "fcfs", "--kv-blocks", "4", "--", "{a}", "{b}"]])
def test_a_sweep_takes_its_traces_among_its_options(tmp_path, order):
    # Before: "decodesched sweep: error: unrecognized arguments: b.csv" for a trace after an option, exit 2 (the
    # last order, every trace after `--`, ran before and still does).
    for name in ("a", "b"):
        (tmp_path / f"{name}.csv").write_text(TRACE)
    out = tmp_path / "m.csv"
    argv = ["sweep", "--threads", "1", "--no-progress", "--out", str(out),
            *(w.format(a=tmp_path / "a.csv", b=tmp_path / "b.csv") for w in order)]
    code, _, err = run(argv)
    assert code == 0, err
    assert [line.split(",")[0] for line in out.read_text().splitlines()[1:]] == ["a", "b"]
