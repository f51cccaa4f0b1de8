"""The Numba side of `decodesched._numba_cache`: cache locators for decodesched's kernels.

`install()` puts `PackageCacheLocator` first in Numba's locator list; for the package's own kernel
files it picks the folder by the rules in `_numba_cache`, and returns None for every other file
(Numba's own locators then decide).  A read-only locator loads but never saves.  A kernel's cache file that
cannot be read back is a miss, and a cache folder that takes no file costs only the cache, one notice each.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from numba.core import caching as _caching

from ._numba_cache import _installed, _kernels_dir, _notice, _writable, cache_subpath, user_cache_dir


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
        if not _kernel_file(py_file):
            return None  # not ours: Numba's own locators decide
        src = Path(py_file).resolve()
        from numba.core import config

        if config.CACHE_DIR:  # (Numba's own rule, with `cache_subpath`: Numba's raised for a folder not in UTF-8)
            given = Path(config.CACHE_DIR) / cache_subpath(py_file)
            if _writable(given):
                return _Located(py_func, py_file, given)
        in_tree = src.parent / "__pycache__"
        if not _installed(src) and _writable(in_tree):
            return _Located(py_func, py_file, in_tree)
        if _index_valid(py_func, py_file, in_tree):
            return _ReadOnlyLocator(py_func, py_file, in_tree)
        user = user_cache_dir() / cache_subpath(py_file)
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


def _kernel_file(py_file: str) -> bool:
    """Whether `py_file` is one of decodesched's kernel sources (whose cache folder and files this module handles)."""
    try:
        return Path(py_file).resolve().parent == _kernels_dir()
    except (OSError, TypeError):
        return False


def _ours(cache) -> bool:
    """Whether `cache` (a Numba `Cache`) is a decodesched kernel's."""
    return _kernel_file(getattr(cache._impl.locator, "_py_file", None))


class _TolerantCacheFile(_caching.IndexDataCacheFile):
    """Numba's index and data files of a kernel, except that one that cannot be read back (cut short or garbled: a
    crash or a full disk while it was copied or synced, a folder in its place) is a cache miss with one notice, and
    the kernel compiles and its save writes the files afresh.  Numba's raised from the unpickler, and every command
    that used the kernel ended in its traceback (or "invalid literal for int()"), until the file was deleted."""

    def _load_index(self):
        try:
            return super()._load_index()
        except NotADirectoryError:  # a folder that cannot exist (HOME=/dev/null): no cache, as a missing index
            return {}
        except Exception as exc:
            _unreadable(f"file {self._index_path}", exc)
            return {}

    def _load_data(self, name):
        try:
            return super()._load_data(name)
        except Exception as exc:
            _unreadable(f"file {self._data_path(name)}", exc)
            return None  # (`load`'s miss)


def _unreadable(what: str, exc: Exception) -> None:
    from ._io import _describe, from_interrupt

    if from_interrupt(exc):  # (Ctrl-C while the unpickler imported a module: the command's to act on)
        raise exc
    why = _describe(exc) if isinstance(exc, OSError) else "damaged"
    _notice(f"cannot read the kernel cache {what} ({why}); compiling that kernel again")


_original_init = _caching.Cache.__init__
_original_load = _caching.Cache.load_overload
_original_save = _caching.Cache.save_overload


def _cache_init(self, py_func):
    """Numba's, except that a kernel's cache reads its files through `_TolerantCacheFile`."""
    _original_init(self, py_func)
    if _ours(self):
        self._cache_file = _TolerantCacheFile(self._cache_path, self._impl.filename_base,
                                              self._impl.locator.get_source_stamp())


def _load_overload(self, sig, target_context):
    """Numba's load, except that a kernel's cached code that reads back but does not rebuild (a garbled file that
    still unpickles: "LLVM bitcode parsing error") is a miss, as an unreadable file is (`_TolerantCacheFile`)."""
    if not _ours(self):
        return _original_load(self, sig, target_context)
    try:
        return _original_load(self, sig, target_context)
    except Exception as exc:
        _unreadable(f"of {self._impl.filename_base} in {self._cache_path}", exc)
        return None


def _save_overload(self, sig, data):
    """Numba's save, except for the kernels: read-only locators save nothing, and a cache folder failing to take a
    file (full disk, removed folder; NUMBA_CACHE_DIR's too) costs only the cache, with one notice, not the run."""
    locator = self._impl.locator
    if not _ours(self):
        return _original_save(self, sig, data)
    if isinstance(locator, _NowhereLocator):
        _notice("no writable cache folder (set NUMBA_CACHE_DIR to one); the kernels compile in every run")
    if isinstance(locator, _ReadOnlyLocator):
        return None
    try:
        return _original_save(self, sig, data)
    except OSError as exc:
        from ._io import _describe

        _notice(f"cannot write the kernel cache in {locator.get_cache_path()} ({_describe(exc)}); running uncached")
        return None


def install() -> None:
    """Put `PackageCacheLocator` first in Numba's locator list, and guard the kernels' cache files (once)."""
    classes = _caching.CacheImpl._locator_classes
    if PackageCacheLocator not in classes:
        _caching.CacheImpl._locator_classes = [PackageCacheLocator, *classes]
        _caching.Cache.__init__ = _cache_init
        _caching.Cache.load_overload = _load_overload
        _caching.Cache.save_overload = _save_overload
