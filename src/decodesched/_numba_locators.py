"""The Numba side of `decodesched._numba_cache`: cache locators for decodesched's kernels.

`install()` puts `PackageCacheLocator` first in Numba's locator list; for the package's own kernel
files it picks the folder by the rules in `_numba_cache`, and returns None for every other file
(Numba's own locators then decide).  A read-only locator loads but never saves.
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
    """Put `PackageCacheLocator` first in Numba's locator list, and guard saving (once)."""
    classes = _caching.CacheImpl._locator_classes
    if PackageCacheLocator not in classes:
        _caching.CacheImpl._locator_classes = [PackageCacheLocator, *classes]
        _caching.Cache.save_overload = _save_overload
