"""Small I/O helpers: files appear whole or not at all, and long work shows progress."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path


@contextlib.contextmanager
def atomic_writer(path, mode: str = "w", encoding: str | None = "utf-8", newline: str | None = ""):
    """Open a temporary file beside `path`; rename it into place only if the block succeeds.

    A failure (or Ctrl-C) inside the block leaves no partial file and keeps an older `path` intact.
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise FileNotFoundError(f"{parent}: no such directory")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    try:
        kwargs = {} if "b" in mode else {"encoding": encoding, "newline": newline}
        with os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode of a new file
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class Progress:
    """A plain progress bar on stderr (only when it is a terminal, or when forced).

    >>> with Progress(3, "demo", enabled=False) as bar:
    ...     for _ in range(3):
    ...         bar.advance()
    """

    def __init__(self, total: int, label: str = "", enabled: bool | None = None, stream=None):
        self.total = max(int(total), 0)
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.done = 0
        self._start = time.monotonic()
        self._last = 0.0

    def __enter__(self):
        self._draw(force=True)
        return self

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._draw()

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1 and self.done < self.total:
            return
        self._last = now
        frac = self.done / self.total if self.total else 1.0
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        elapsed = now - self._start
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {elapsed:6.1f}s")
        self.stream.flush()

    def __exit__(self, *exc):
        if self.enabled:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()
        return False
