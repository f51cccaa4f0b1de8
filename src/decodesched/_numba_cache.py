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

Functions of other packages keep Numba's rules.  ``NUMBA_CACHE_LOCATOR_CLASSES`` (Numba's own
override) is respected as is; ``NUMBA_CACHE_LOCATOR_CLASSES=InTreeCacheLocator decodesched warmup``
is how an administrator ships a compiled cache beside an installed package (see docs/install.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import site
import sys
import sysconfig
import tempfile
from pathlib import Path

from numba.core import caching as _caching
from numba.misc.appdirs import AppDirs


@functools.lru_cache(maxsize=1)
def _kernels_dir() -> Path:
    """The folder of ``decodesched.kernels``."""
    import decodesched.kernels

    return Path(decodesched.kernels.__file__).resolve().parent


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
    """The user's cache folder for decodesched (XDG on Linux, the platform's folder elsewhere)."""
    return Path(AppDirs(appname="decodesched", appauthor=False).user_cache_dir)


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


class _Located(_caching._SourceFileBackedLocatorMixin, _caching._CacheLocator):
    """A locator at a fixed folder; `read_only` ones load but never save."""

    read_only = False

    def __init__(self, py_func, py_file, path: Path):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(path)

    def get_cache_path(self):
        return self._cache_path

    def ensure_cache_path(self):
        if not self.read_only:
            super().ensure_cache_path()


class _ReadOnlyLocator(_Located):
    read_only = True


class _NowhereLocator(_ReadOnlyLocator):
    """No writable folder and no shipped cache: compiled code lives only in this process."""


def _index_valid(py_func, py_file: str, folder: Path) -> bool:
    """Whether `folder` holds a cache index of `py_func` that is valid for this Numba and source."""
    loc = _ReadOnlyLocator(py_func, py_file, folder)
    modname = os.path.splitext(os.path.basename(py_file))[0]
    fullname = f"{modname}.{py_func.__qualname__}".replace("<", "").replace(">", "")
    base = "%s-%s.py%d%d%s" % (fullname, loc.get_disambiguator(), sys.version_info[0], sys.version_info[1],
                               getattr(sys, "abiflags", ""))
    if not (folder / f"{base}.nbi").is_file():
        return False
    try:
        index = _caching.IndexDataCacheFile(str(folder), base, loc.get_source_stamp())
        return bool(index._load_index())
    except Exception:  # an unreadable or foreign index is no shipped cache
        return False


class PackageCacheLocator(_caching._CacheLocator):
    """Chooses the cache folder of decodesched's kernels (see the module docstring); None elsewhere."""

    @classmethod
    def from_function(cls, py_func, py_file):
        try:
            src = Path(py_file).resolve()
        except OSError:
            return None
        kernels = _kernels_dir()
        if src.parent != kernels:
            return None  # not ours: Numba's own locators decide
        from numba.core import config

        if config.CACHE_DIR:
            loc = _caching.UserProvidedCacheLocator.from_function(py_func, py_file)
            if loc is not None:
                return loc
        in_tree = src.parent / "__pycache__"
        if not _installed(src) and _writable(in_tree):
            return _Located(py_func, py_file, in_tree)
        if _index_valid(py_func, py_file, in_tree):
            return _ReadOnlyLocator(py_func, py_file, in_tree)
        user = user_cache_dir() / _caching._CacheLocator.get_suitable_cache_subpath(py_file)
        if _writable(user):
            return _Located(py_func, py_file, user)
        return _NowhereLocator(py_func, py_file, user)

    # Never instantiated: from_function returns one of the locators above.
    def get_cache_path(self):  # pragma: no cover
        raise NotImplementedError

    def get_source_stamp(self):  # pragma: no cover
        raise NotImplementedError

    def get_disambiguator(self):  # pragma: no cover
        raise NotImplementedError


_original_save = _caching.Cache.save_overload


def _save_overload(self, sig, data):
    """Numba's save, except: read-only locators save nothing, and our cache folders failing to take
    a file (full disk, removed folder) costs only the cache, with one notice, not the run."""
    locator = self._impl.locator
    if isinstance(locator, _NowhereLocator):
        _notice("no writable cache folder (set NUMBA_CACHE_DIR to one); the kernels compile in every run")
    if isinstance(locator, _ReadOnlyLocator):
        return None
    if not isinstance(locator, _Located):
        return _original_save(self, sig, data)
    try:
        return _original_save(self, sig, data)
    except OSError as exc:
        _notice(f"cannot write the kernel cache in {locator.get_cache_path()} ({exc.strerror or exc}); "
                "running uncached")
        return None


def install() -> None:
    """Put `PackageCacheLocator` first in Numba's locator list (once)."""
    classes = _caching.CacheImpl._locator_classes
    if PackageCacheLocator not in classes:
        _caching.CacheImpl._locator_classes = [PackageCacheLocator, *classes]
        _caching.Cache.save_overload = _save_overload


def dispatcher_cold(dispatcher) -> bool:
    """True when `dispatcher` has no machine code in this process and none in its cache (it will compile)."""
    if getattr(dispatcher, "overloads", None):
        return False
    cache = getattr(dispatcher, "_cache", None)
    cache_file = getattr(cache, "_cache_file", None)
    if cache_file is None:
        return True
    try:
        return not cache_file._load_index()
    except Exception:
        return True


def compile_notice(dispatcher, what: str = "the replay kernel", seconds: str = "20-60 s") -> bool:
    """Say once on stderr that `dispatcher` is about to compile (when it has no cached machine code).

    Returns whether it will compile, so that callers can keep the compile out of their timings."""
    if not dispatcher_cold(dispatcher):
        return False
    _notice(f"compiling {what} (first run only, about {seconds}; `decodesched warmup` does it ahead)...")
    return True
