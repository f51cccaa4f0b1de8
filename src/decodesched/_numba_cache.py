"""Where the kernels' Numba cache lives (imported by ``decodesched/__init__.py`` before any kernel).

Numba's own rule caches beside the sources (``kernels/__pycache__``) whenever that folder is
writable.  For an installed package that is wrong: pip owns site-packages, and a leftover
``decodesched/kernels/__pycache__`` there turns ``decodesched`` into an empty namespace package after
a later ``pip install -e``.  So, for the package's own kernels only, the cache is chosen as follows:

1. ``NUMBA_CACHE_DIR`` when it is set and writable (Numba's own rule);
2. beside the sources, when they are a source checkout (not under site-packages) and writable;
3. a compiled cache shipped beside the sources (read-only or not), when it is valid for this
   Numba and these sources: loaded from, never written to;
4. the user's cache folder (``~/.cache/decodesched`` on Linux, the platform's equivalent elsewhere);
5. nowhere: the kernels compile in every process, and one notice line says so.

Functions of other packages keep Numba's rules.  This module imports no Numba (so that the CLI can
say "compiling ..." within a second of starting); the locators themselves are in `_numba_locators`.  ``NUMBA_CACHE_LOCATOR_CLASSES`` (Numba's own
override) is respected as is; ``NUMBA_CACHE_LOCATOR_CLASSES=InTreeCacheLocator decodesched warmup``
is how an administrator ships a compiled cache beside an installed package (see docs/install.md).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import site
import sys
import sysconfig
import tempfile
from pathlib import Path

# a cold compile of the fast replay kernel (every policy, aging's block mode included): 156 s on a quiet
# two-core machine on 2026-12-03 (207 s while aging's loop compiled twice), more on a busy one
COMPILE_SECONDS = "2-5 min"


@functools.lru_cache(maxsize=1)
def _kernels_dir() -> Path:
    """The folder of ``decodesched.kernels``, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("decodesched.kernels")
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def _installed(path: Path) -> bool:
    """Whether `path` lies in a package tree that pip manages (site-packages, dist-packages)."""
    roots = set()
    for key in ("purelib", "platlib"):
        with contextlib.suppress(KeyError):
            roots.add(Path(sysconfig.get_paths()[key]).resolve())
    with contextlib.suppress(AttributeError):
        roots.update(Path(p).resolve() for p in site.getsitepackages())
    with contextlib.suppress(AttributeError):
        roots.add(Path(site.getusersitepackages()).resolve())
    if any(root == path or root in path.parents for root in roots):
        return True
    return any(part in ("site-packages", "dist-packages") for part in path.parts)


def user_cache_dir() -> Path:
    """The user's cache folder for decodesched: ``$XDG_CACHE_HOME/decodesched`` or
    ``~/.cache/decodesched`` on Linux, ``~/Library/Caches/decodesched`` on macOS,
    ``%LOCALAPPDATA%\\decodesched\\Cache`` on Windows (the folders Numba's own user-wide cache uses)."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~\\AppData\\Local")
        return Path(base) / "decodesched" / "Cache"
    if sys.platform == "darwin":
        return Path(os.path.expanduser("~/Library/Caches")) / "decodesched"
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "decodesched"


def cache_subpath(py_file: str) -> str:
    """Numba's per-folder subpath inside a cache root: the folder's name and a hash of its path (of the path's bytes:
    Numba's ``str.encode()`` hash but for a folder whose name is not UTF-8, where it raised and so did every
    command)."""
    folder = os.path.dirname(os.path.abspath(py_file))
    return "_".join([os.path.split(folder)[-1], hashlib.sha1(os.fsencode(folder)).hexdigest()])


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


_notices: set[str] = set()


def _notice(msg: str) -> None:
    if msg not in _notices:
        _notices.add(msg)
        print(f"decodesched: {msg}", file=sys.stderr, flush=True)


def install() -> None:
    """Put decodesched's cache locator first in Numba's list (imports Numba; see `_numba_locators`)."""
    from . import _numba_locators

    _numba_locators.install()


def candidate_folders(py_file: str) -> list[Path]:
    """Every folder the rules above may pick for kernels of `py_file`."""
    out = []
    if os.environ.get("NUMBA_CACHE_DIR"):
        out.append(Path(os.environ["NUMBA_CACHE_DIR"]) / cache_subpath(py_file))
    out.append(Path(py_file).parent / "__pycache__")
    out.append(user_cache_dir() / cache_subpath(py_file))
    return out


def _env_int(name: str) -> int | None:
    """An environment variable read as Numba's configuration reads it (``int``; None when unset or unparsable)."""
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


JIT_DISABLED = ("NUMBA_DISABLE_JIT is set: the replay kernels need Numba's compiler (they cannot run as plain "
                "Python); unset NUMBA_DISABLE_JIT")


def check_environment() -> None:
    """Refuse (`UserError`, one line) a Numba setting that would end a command in Numba's traceback: a thread
    count that is not a whole number from 1 up (Numba's import raises for 0 or less, and ignores text with a
    warning, an error under ``PYTHONWARNINGS=error``).  Imports no Numba."""
    from .errors import UserError

    text = os.environ.get("NUMBA_NUM_THREADS")
    if text is not None and (_env_int("NUMBA_NUM_THREADS") or 0) < 1:
        raise UserError(f"NUMBA_NUM_THREADS={text[:40]!r} is not a whole number of threads from 1 up; set one "
                        "(or unset NUMBA_NUM_THREADS)")
    if text is not None and (limit := _thread_limit()) is not None and _env_int("NUMBA_NUM_THREADS") > limit:
        raise UserError(f"NUMBA_NUM_THREADS={text[:40]!r} is more threads than this system lets a process start "
                        f"(at most {limit}); set a smaller number (or unset NUMBA_NUM_THREADS)")


def _thread_limit() -> int | None:
    """The most threads this system lets one process have (Linux: the kernel's thread and process-id limits, the
    cgroup's, a user's process limit); None where none is known.  More in NUMBA_NUM_THREADS ended a sweep in
    libgomp's "Thread creation failed" (exit 1) and a warmup in a segmentation fault, with no line of ours."""
    limits = []
    for name in ("/proc/sys/kernel/threads-max", "/proc/sys/kernel/pid_max", "/sys/fs/cgroup/pids.max"):
        with contextlib.suppress(OSError, ValueError):
            limits.append(int(Path(name).read_text()))  # (pids.max may say "max": no limit)
    with contextlib.suppress(ImportError, OSError, ValueError):
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        if soft != resource.RLIM_INFINITY and os.geteuid() != 0:  # (root's threads are not held to it)
            limits.append(soft)
    return min(limits, default=None)


def start_threads() -> None:
    """Start Numba's thread pool for the parallel kernels, refusing (`UserError`, one line) a threading layer that
    cannot load: ``NUMBA_THREADING_LAYER=tbb`` without TBB installed, or a layer or ``NUMBA_THREADING_LAYER_PRIORITY``
    Numba does not know, ended a sweep or warmup in Numba's ValueError traceback at the first parallel call."""
    import numba

    from .errors import UserError

    try:
        numba.get_num_threads()  # (launches the pool, once)
    except ValueError as exc:
        named = [f"{name}={os.environ[name][:40]!r}" for name in ("NUMBA_THREADING_LAYER",
                 "NUMBA_THREADING_LAYER_PRIORITY") if name in os.environ]
        raise UserError(f"Numba's threading layer did not load ({' '.join(str(exc).split())})"
                        + (f"; change or unset {' and '.join(named)}" if named else "")) from None


def require_jit() -> None:
    """Refuse (`UserError`) a command that runs a kernel while ``NUMBA_DISABLE_JIT`` is on (a nonzero integer, as
    Numba reads it): the kernels use compiled-only intrinsics, and ended in a NotImplementedError traceback."""
    from .errors import UserError

    if _env_int("NUMBA_DISABLE_JIT"):
        raise UserError(JIT_DISABLED)


def early_compile_notice(module: str = "fast_nb", function: str = "replay_fast_nb",
                         what: str = "the replay kernel") -> bool:
    """Before Numba is even imported: when no cache folder holds an index of `function`, it will
    surely compile; say so now.  (A stale index is caught later by `compile_notice`.)  A run with the
    compiler off is refused first (`require_jit`)."""
    require_jit()
    py_file = str(_kernels_dir() / f"{module}.py")
    for folder in candidate_folders(py_file):
        with contextlib.suppress(OSError):
            if any(folder.glob(f"{module}.*{function}-*.nbi")):
                return False
    _notice(compile_message(what))
    return True


def compile_message(what: str) -> str:
    return f"compiling {what} (first run only, about {COMPILE_SECONDS}; `decodesched warmup` does it ahead)..."


def in_cache(kernel) -> bool:
    """True when `kernel` (a dispatcher or C function) has machine code in its cache folder."""
    cache_file = getattr(getattr(kernel, "_cache", None), "_cache_file", None)
    try:
        return bool(cache_file is not None and cache_file._load_index())
    except Exception:
        return False


def dispatcher_cold(dispatcher) -> bool:
    """True when `dispatcher` has no machine code in this process and none in its cache (it will compile)."""
    return not getattr(dispatcher, "overloads", None) and not in_cache(dispatcher)


def compile_notice(dispatcher, what: str = "the replay kernel") -> bool:
    """Say once on stderr that `dispatcher` is about to compile (when it has no cached machine code).

    Returns whether it will compile, so that callers can keep the compile out of their timings.  A run with the
    compiler off is refused first (`require_jit`)."""
    require_jit()
    if not dispatcher_cold(dispatcher):
        return False
    _notice(compile_message(what))
    return True
