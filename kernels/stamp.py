"""The source stamp that keys Numba's cache for kernels calling kernels in other files.

Numba's cache key covers only a cached function's own file. A kernel that calls kernels from other
files closes over `source_stamp(...)` of those files (Numba puts closure values into its cache key),
so an edit of any of them compiles it afresh instead of loading stale machine code.
"""

import hashlib
from pathlib import Path

KERNELS = Path(__file__).resolve().parent


def source_stamp(*names: str) -> int:
    """A hash (int, >= 0) of the named files of this folder (e.g. ``"enums.py"``)."""
    h = hashlib.sha256()
    try:
        for name in names:
            h.update(name.encode() + b"\0" + (KERNELS / name).read_bytes())
    except OSError:  # pragma: no cover - sources not readable (e.g. a zip import): no stamp
        return 0
    return int.from_bytes(h.digest()[:7], "little")
