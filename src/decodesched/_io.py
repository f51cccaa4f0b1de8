"""Small I/O helpers: files appear whole or not at all, outputs never damage inputs, and long work
shows progress.

Every file the project writes goes through `atomic_writer`.  Its rules (docs/files.md):

- a regular file (or a new name) is written to a temporary file beside it and renamed into place
  only when the block succeeds; a failure or Ctrl-C leaves no temporary file and the old file intact;
- ``-`` means standard output (for the commands whose output is a stream: events, requests);
- a symlink is never replaced: the file it points to is written (atomically, the link stays);
- a directory, device, FIFO or socket is refused, before anything is written;
- read-only file systems, missing folders, full disks, a closed pipe: `OutputError`, one line.

`check_outputs` refuses, before any work, an output that is an input, an input's ``.meta.json``
sidecar, or the same file as another output of the same command; in a CLI command the rename refuses them
again (a name that became a symbolic link to one while the command ran).  Inside `output_group` the files
of one command appear together: each is renamed into place only when every one was written.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import select
import stat
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from .errors import OutputError, UserError

STDOUT = "-"
CLOSED_PIPE = "standard output: the reader closed the pipe"  # (`cmd | head`: one line, exit 2)
CLOSED_STDOUT = "standard output is closed; send it to a file or to /dev/null"  # (`cmd >&-`)


class MissingFolderError(OutputError, FileNotFoundError):
    """An output whose folder does not exist (also a `FileNotFoundError`, as callers expect)."""


def _describe(exc: OSError) -> str:
    reasons = {
        errno.EROFS: "read-only file system",
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.EXDEV: "cannot move a file across file systems",
        errno.EPIPE: "the reader closed the pipe",
        errno.ENOENT: "no such file or folder",
        errno.ENOTDIR: "a part of the path is not a folder",
        errno.ENAMETOOLONG: "file name too long",
    }
    return reasons.get(exc.errno, exc.strerror or str(exc))


def extension_said(path) -> str:
    """An output name's extension as a refusal that lists the allowed ones says it: ``'.json'``, ``no extension``,
    or, for a name that is only an extension (``.csv``: ``$NAME.csv`` with NAME unset), that no name comes before
    it (such a name is refused, not written as a hidden file, docs/files.md)."""
    suffix, name = Path(path).suffix, Path(path).name
    if suffix:
        return f"'{suffix}'"
    return f"'{name}' alone, with no name before it" if name.startswith(".") and len(name) > 1 else "no extension"


def folder_name(text: str) -> str:
    """`text` as an output folder's name (`demo --out`, `report --out`); a `UserError` for one that is blank ('' is
    the current folder, whose files would be replaced: an unset variable) or holds a NUL character."""
    if not text.strip() or "\0" in text:
        raise UserError(f"{text!r}: not a folder name" + (" (it holds a NUL character)" if "\0" in text else ""))
    return text


def output_folder(text: str) -> Path:
    """`text` (`folder_name`) as a folder to write into, made if missing: a `UserError` for a broken symbolic link
    or something else already there."""
    out = Path(folder_name(text))
    if out.is_symlink() and not out.exists():
        raise UserError(f"{out}: is a broken symbolic link; --out names a folder")
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder; --out names a folder")
    return out


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # (an input named as a URL: `https://...`, `s3://...`)


def input_file(path, what: str = "file") -> Path:
    """`path` as an input to read: a regular file, or a FIFO (``<(command)``), which ends.

    Raises `UserError` (one line) for a missing path, a directory, a device (``/dev/zero`` never
    ends) or a socket, before anything is read.
    """
    given, path = path, Path(path)
    if isinstance(given, str) and not given.strip():  # (Path('') is the current folder: an unset variable)
        raise UserError(f"{given!r}: an empty file name; give the {what}'s path")
    try:
        mode = path.stat().st_mode
    except ValueError:  # (a NUL character: no file can have that name)
        raise UserError(f"{str(path)!r}: not a file name (it holds a NUL character)") from None
    except FileNotFoundError:
        if str(path) == STDOUT:  # (an output's word for standard output; an input is a file)
            raise UserError(f"-: standard input is not read here; give the {what}'s path, or <(command)") \
                from None
        if isinstance(given, str) and _URL.match(given):  # (as the name given: a Path would drop a slash of '//')
            raise UserError(f"{given}: is a URL; download it first (curl -LO URL) and give the file's path") from None
        raise UserError(f"{path}: no such file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({_describe(exc)})") from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{path}: is a directory, not a {what}")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        kind = "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        raise UserError(f"{path}: is {kind}, not a {what}")
    return path


# What a text input that is not UTF-8 is, by its first bytes, and the fix (`binary_input`).
_NOT_TEXT = ((b"\x1f\x8b", "is gzip-compressed; decompress it first (gunzip -k)"),
             (b"PK\x03\x04", "is a zip archive; extract the file from it first"),
             (b"\xff\xfe", "is UTF-16 text; save it as UTF-8"),
             (b"\xfe\xff", "is UTF-16 text; save it as UTF-8"),
             (b"PAR1", "is a Parquet file, not text (a trace or a table is read as Parquet when its name ends in "
                       ".parquet)"))


def binary_input(path) -> str | None:
    """The message for an input whose first bytes say it is no text file (gzip, zip, UTF-16), naming
    the fix; None for any other file, and for a FIFO (``<(command)``: it cannot be read again)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return None
    return next((f"{path}: {what}" for magic, what in _NOT_TEXT if head.startswith(magic)), None)


def not_text(path, exc: UnicodeDecodeError) -> str:
    """The message for a text input (CSV, JSON lines) that is not UTF-8: `binary_input`'s, else the decoder's, naming
    the line of the first byte that is not (a Latin-1 `é` in a million lines), where the file can be read again."""
    return binary_input(path) or _not_utf8_line(path) or f"{path}: not a UTF-8 text file ({exc.reason})"


def _not_utf8_line(path) -> str | None:
    r"""The message naming the line (ended by ``\n``, ``\r\n`` or a lone ``\r``, as the readers count them) of a
    regular file's first byte that is not UTF-8; None for a file that is UTF-8, or that cannot be read again."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as fh:
            line = 1
            for raw in fh:  # (split at b"\n": no byte of a UTF-8 character is one)
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    line += raw.count(b"\r", 0, exc.start)  # (old Mac line ends before it)
                    return (f"{path}: line {line}: not a UTF-8 text file ({exc.reason}: 0x{raw[exc.start]:02x}); "
                            "save it as UTF-8")
                line += 1 + raw.count(b"\r") - raw.endswith(b"\r\n")
    except OSError:
        return None
    return None


PIPE_LABEL = "pipe"  # the name of a trace read from ``<(command)``: its path, /dev/fd/63, names no file


def input_label(path) -> str | None:
    """The name to show for an input read from a process substitution (``/dev/fd/N``,
    ``/proc/self/fd/N``): `PIPE_LABEL`, not the descriptor's number; None for any other path (its
    reader names it, by its file name; a source that is not a path: None too)."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    path = Path(path)
    return PIPE_LABEL if path.name.isdigit() and path.parent.name == "fd" else None


def read_parquet_table(path, error=UserError):
    """``pyarrow.parquet.read_table(path)``, every failure one line as `error` (a `UserError` class):
    pyarrow missing (with the install hint), or a file it cannot read (its message on one line)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise error(f"{path}: reading Parquet needs pyarrow: pip install 'decodesched[data]'") from None
    try:
        return pq.read_table(path)
    except Exception as exc:  # pyarrow's errors have no common base class
        try:  # (a column twice: pyarrow says "Multiple matches for FieldRef.Name(...)" and lists the schema)
            names = pq.read_schema(path).names
        except Exception:
            names = []
        dup = sorted(n for n, k in Counter(names).items() if k > 1)
        if dup:
            raise error(f"{path}: duplicate column(s) {', '.join(dup)}") from None
        raise error(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())})") from None


def path_argument(path, name: str = "path"):
    """`path` if it is a path (a str or an os.PathLike), else a TypeError naming the argument `name`."""
    if not isinstance(path, (str, os.PathLike)):
        from .trace import show

        raise TypeError(f"{name} must be a path (a str or a pathlib.Path), got {show(path)}")
    return path


def output_target(path) -> Path:
    """The file that writing `path` really changes (a symlink's target); refuse a non-regular one.

    Raises `OutputError` for a directory, device, FIFO or socket, a read-only file (one this user may not
    write: a results file someone protected with ``chmod a-w``), a missing folder, a symlink loop, or a name
    that holds a NUL character.
    """
    text = os.fspath(path)
    if isinstance(text, str) and "\0" in text:
        raise OutputError(f"{text!r}: not a file name (it holds a NUL character)")
    if isinstance(path, str) and not path.strip():
        raise OutputError(f"{path!r}: an empty file name")
    if isinstance(path, str) and path.endswith(("/", os.sep)):  # (Path would drop the slash: a file, not a folder)
        raise OutputError(f"{path}: names a folder (it ends in /); give a file name")
    path = Path(path)
    target = path
    try:
        link = path.is_symlink()
    except OSError as exc:  # a name too long, a component that is a file
        raise OutputError(f"{path}: {_describe(exc)}") from None
    if link:
        try:
            target = path.resolve(strict=False)
        except (OSError, RuntimeError):
            raise OutputError(f"{path}: cannot follow the symbolic link") from None
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"{path}: {_describe(exc)}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{path}: is a directory; give a file name")
        if not stat.S_ISREG(st.st_mode):
            kind = ("a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                    "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else
                    "not a regular file")
            raise OutputError(f"{path}: is {kind}, not a regular file; refusing to write to it")
        if not os.access(target, os.W_OK):  # (replacing it would work: the folder is writable; as `cp`, refuse)
            raise OutputError(f"{path}: is read-only; make it writable (chmod u+w) or choose another name")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise MissingFolderError(f"{path}: no such directory {parent}")
    return target


def _same_file(a: Path, b: Path) -> bool:
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:
        pass
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):
        return False


META_SUFFIX = ".meta.json"  # a converted trace's metadata sidecar: ``<trace file>.meta.json``


def meta_path(trace_path) -> Path:
    """The metadata sidecar of the trace at `trace_path`, beside the file itself: through a symbolic link,
    beside its target (the sidecar belongs to the file, whichever name writes or reads it)."""
    path = Path(trace_path)
    if path.is_symlink():
        path = path.resolve()
    return Path(str(path) + META_SUFFIX)


# The running command's inputs and their sidecars, as `check_outputs` protected them ((path, what) pairs): checked
# again as each output is renamed into place (`_refuse_protected`), where an output that became a symbolic link to
# one of them while the command ran (`ln -sf trace.csv out.csv`) would overwrite it.  A list while `cli.main` runs.
protected_inputs: list | None = None


def check_outputs(outputs, inputs=()) -> None:
    """Refuse (UserError) outputs that would overwrite an input, an input's ``.meta.json`` sidecar, or
    each other; and any output `output_target` refuses.  `outputs` may hold None (not requested)."""
    seen: list[Path] = []
    stdout_used = False
    protected = []
    for inp in inputs:
        if inp is None or str(inp) == STDOUT:
            continue
        protected.append((Path(inp), "an input of this command"))
        for side in {Path(str(inp) + META_SUFFIX), meta_path(inp)}:  # (by its name, and by its file's)
            protected.append((side, f"the metadata sidecar of the input {inp}"))
    if protected_inputs is not None:
        protected_inputs.extend(protected)
    for out in outputs:
        if out is None:
            continue
        if str(out) == STDOUT:
            if stdout_used:
                raise UserError("two outputs are both '-' (standard output); give one of them a file name")
            stdout_used = True
            continue
        output_target(out)
        out = Path(out)
        for p, what in protected:
            if _same_file(out, p):
                raise UserError(f"{out}: is {what}; refusing to overwrite it")
        for other in seen:
            if _same_file(out, other):
                raise UserError(f"{out}: is the same file as another output ({other}); give each its own name")
        seen.append(out)


def stdout_error(exc: OSError) -> OSError:
    """A failed write to standard output as the error to raise: a closed pipe as it is (`CLOSED_PIPE`), any other
    (a full disk: its OSError names no file) as an `OutputError` that names standard output."""
    if isinstance(exc, (BrokenPipeError, UserError)):
        return exc
    return OutputError(f"standard output: cannot write ({_describe(exc)})")


class NamedStdout:
    """``sys.stdout`` while a command runs (`cli.main`): the stream as it is, but a write or flush that fails raises
    `stdout_error`'s error, so that ``cmd >/dev/full`` under ``python -u`` or PYTHONUNBUFFERED (where print's own
    write fails, with no file named) says "standard output", as the final flush of a buffered stream does."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        try:
            return self.stream.write(text)
        except OSError as exc:
            raise stdout_error(exc) from None

    def flush(self):
        try:
            self.stream.flush()
        except OSError as exc:
            raise stdout_error(exc) from None

    def __getattr__(self, name):
        return getattr(self.stream, name)


class _StdoutWriter:
    """Standard output as a file object that is never closed by us.  Text and bytes alike go to its
    binary layer, all of them: under ``python -u`` or PYTHONUNBUFFERED that layer is the raw file,
    whose write may take only part of the data (a reader that closes the pipe mid-write, a signal),
    and the text layer drops the rest without a word; so the rest is written again, and a reader
    gone for good is the next write's BrokenPipeError.  A text-only stream (a StringIO) takes text."""

    def __init__(self, binary: bool):
        if sys.stdout is None:  # the process started with it closed (`cmd >&-`)
            raise OutputError(CLOSED_STDOUT)
        self._text = sys.stdout
        self._binary = binary
        self._buffer = getattr(sys.stdout, "buffer", None)
        if self._buffer is not None:
            self._text.flush()  # what was printed before comes first

    def write(self, data):
        try:
            if self._buffer is None:
                return self._text.write(bytes(data).decode("utf-8") if self._binary else data)
            _write_all(self._buffer, memoryview(data if self._binary else data.encode("utf-8")).cast("B"))
        except OSError as exc:  # (a full disk: named as standard output)
            raise stdout_error(exc) from None
        return len(data)

    def flush(self):
        while True:
            try:
                (self._buffer or self._text).flush()
                return
            except BlockingIOError:  # a non-blocking descriptor that is full: wait until it takes more
                select.select([], [self._buffer or self._text], [])
            except OSError as exc:
                raise stdout_error(exc) from None


def _write_all(stream, view: memoryview) -> None:
    """Write all of `view` to a binary stream that may take part of it at a time: a raw file, or a
    non-blocking descriptor (left so by some parent processes), whose writes wait until it has room."""
    while view:
        try:
            n = stream.write(view)
        except BlockingIOError as exc:  # (a buffered stream: it kept what it says it took)
            n = exc.characters_written
            select.select([], [stream], [])
        if n is None:  # (a raw file that took nothing)
            select.select([], [stream], [])
            continue
        view = view[n:]


signal_record = None  # the running command's record of the signals that came (`cli._SignalRecord.interrupt`)


def stop_if_signalled() -> None:
    """Raise the KeyboardInterrupt (or `Terminated`) of a signal that came and raised nothing: one that lands in a
    callback of C code (Numba's compiler calls back through ctypes while it loads a kernel) is printed as
    "Exception ignored" and dropped, and the command would run on to its end.  Called where a command starts its
    replay (`immediate_interrupt`) and its outputs (`output_group`, `atomic_writer`), from the CLI's record
    (`signal_record`); nothing elsewhere, or outside the main thread."""
    import threading

    if signal_record is None or threading.current_thread() is not threading.main_thread():
        return
    signum = signal_record()
    if signum is not None:
        import signal

        raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


@contextlib.contextmanager
def atomic_writer(path, mode: str = "w", encoding: str | None = "utf-8", newline: str | None = ""):
    """Open a temporary file beside `path`; rename it into place only if the block succeeds.

    A failure (or Ctrl-C) inside the block leaves no partial file and keeps an older `path` intact.
    ``-`` writes to standard output; a symlink's target is written (the link stays); a directory,
    device, FIFO or socket is refused.  OS errors become `OutputError` (one line).
    """
    stop_if_signalled()
    if str(path) == STDOUT:
        out = _StdoutWriter("b" in mode)
        try:
            yield out
            out.flush()
        except BrokenPipeError:
            raise OutputError(CLOSED_PIPE) from None
        return
    target = output_target(path)
    fd, tmp = _temporary_beside(path, target)
    try:
        try:
            mode_bits = stat.S_IMODE(os.stat(target).st_mode)
        except OSError:
            mode_bits = 0o666 & ~_umask()  # mkstemp makes 0600; give the usual mode of a new file
        kwargs = {} if "b" in mode else {"encoding": encoding, "newline": newline}
        with os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
        os.chmod(tmp, mode_bits)
        if _groups:  # renamed with the group's other files, when all of them are written
            _groups[-1].append((tmp, path))
            return
        output_target(path)  # it may have become a folder or a device meanwhile
        _refuse_protected([(path, target)])
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OutputError):
            raise
        raise OutputError(f"{path}: cannot write ({_describe(exc)})") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _temporary_beside(path, target: Path) -> tuple[int, str]:
    """A new hidden temporary file in `target`'s folder, ``(descriptor, name)``; `OutputError` naming
    `path` (the output as given) when that folder takes no new file (read-only, ``/proc``)."""
    parent = target.parent if str(target.parent) else Path(".")
    try:
        try:
            return tempfile.mkstemp(prefix=temp_prefix(target.name), suffix=".tmp", dir=parent)
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG or parent.is_absolute():
                raise
            return _relative_temporary(parent, temp_prefix(target.name), ".tmp")
    except OSError as exc:
        raise OutputError(f"{path}: cannot write in {parent} ({_describe(exc)})") from None


def _relative_temporary(parent: Path, prefix: str, suffix: str) -> tuple[int, str]:
    """`tempfile.mkstemp` with the relative name kept: mkstemp makes it absolute, and a current folder deeper than
    the 4,096 bytes a path may have (where relative names still work) refused every output as "file name too
    long"."""
    for _ in range(100):
        name = os.path.join(parent, f"{prefix}{os.urandom(6).hex()}{suffix}")
        try:
            return os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600), name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name")


def check_writable(path) -> None:
    """Refuse (`OutputError`, naming `path`), before any work, an output whose folder takes no new file:
    `atomic_writer` would fail only at the end.  Standard output passes."""
    if str(path) == STDOUT:
        return
    fd, tmp = _temporary_beside(path, output_target(path))
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)


# The temporary files of the open `output_group`s, innermost last: (temporary, path as given).
_groups: list[list[tuple[str, object]]] = []


def temp_prefix(name: str) -> str:
    """The prefix of a temporary file or folder beside `name`: hidden, and short enough that the
    name with mkstemp's 8 random characters stays under the 255 bytes a file name may have."""
    return f".{name[:64]}."


@contextlib.contextmanager
def output_group():
    """The files `atomic_writer` writes inside this block appear together: each waits under its
    temporary name, and all are renamed into place when the block ends without an error.  A failure
    or Ctrl-C anywhere in the block (in a later file, or in the work between them) leaves every older
    file as it was and no temporary file.  The renames themselves run with Ctrl-C held back, so that a
    command is either all written or not at all.  Nested groups join the outer one."""
    stop_if_signalled()
    pending: list = []
    _groups.append(pending)
    try:
        yield
    except BaseException:
        for tmp, _ in pending:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    finally:
        _groups.remove(pending)
    if _groups:
        _groups[-1].extend(pending)
        return
    replace_together(pending)


def replace_together(moves) -> None:
    """Rename each written temporary file of `moves` ((temporary, path as given) pairs) into place, all
    or none as far as the file system lets: every target is checked first (one that has become a
    folder or a device meanwhile refuses them all), and the renames run with Ctrl-C held back.  A
    failure removes the temporary files not yet renamed."""
    try:
        targets = [output_target(path) for _, path in moves]
        _refuse_protected([(path, target) for (_, path), target in zip(moves, targets)])
    except OSError:
        for tmp, _ in moves:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    folders = {os.path.dirname(os.path.abspath(t)) for t in targets} if len(targets) > 1 else ()
    with signals_held(), folders_locked(folders):
        for i, ((tmp, path), target) in enumerate(zip(moves, targets)):
            try:
                os.replace(tmp, target)
            except OSError as exc:
                for later, _ in moves[i:]:
                    with contextlib.suppress(OSError):
                        os.unlink(later)
                raise OutputError(f"{path}: cannot write ({_describe(exc)})") from None


def _refuse_protected(outputs) -> None:
    """Refuse (`OutputError`) renaming outputs ((path as given, file it changes) pairs) onto one of the running
    command's inputs (`protected_inputs`) or onto one file twice: a name that was checked (`check_outputs`) and then,
    while the command ran, became a symbolic link to such a file."""
    seen: list[tuple[object, Path]] = []
    for path, target in outputs:
        for p, what in protected_inputs or ():
            if _same_file(target, p):
                raise OutputError(f"{path}: became {what} while the command ran; refusing to overwrite it")
        for other, other_target in seen:
            if _same_file(target, other_target):
                raise OutputError(f"{path}: became the same file as another output ({other}) while the command "
                                  "ran; refusing to write both")
        seen.append((path, target))


@contextlib.contextmanager
def folders_made(folders):
    """Make each of `folders` (with its missing parents) for the block; a failure or Ctrl-C in the block, or in the
    making, removes the folders it made, innermost first (each only while empty), and leaves those that were there:
    an output folder that a command failing on a full disk made is not left behind, half-filled."""
    made: list[Path] = []
    try:
        for folder in map(Path, folders):
            made[:0] = [p for p in (folder, *folder.parents) if not p.exists() and not p.is_symlink()]
            folder.mkdir(parents=True, exist_ok=True)
        yield
    except BaseException:
        for p in made:
            with contextlib.suppress(OSError):
                p.rmdir()
        raise


_FOLDERS_HELD: dict[tuple[int, int, int], int] = {}  # (st_dev, st_ino, thread) -> blocks of `folders_locked` in it


@contextlib.contextmanager
def folders_locked(folders):
    """An exclusive `flock` on each of `folders` for the block, where the system takes one, taken in one order
    (by real path) so that no two processes wait on each other.  Two commands writing the same group of files at
    once (`trace convert`'s CSV and sidecar, two gradings' outputs) rename theirs one group after the other, never
    one's CSV beside the other's sidecar.  Reentrant in a thread: a folder this thread holds already is not locked
    again (a second descriptor's flock would wait on the first for ever: the grader's commit around
    `output_group`); another thread of the process waits, as another process does."""
    try:
        import fcntl
        import threading
    except ImportError:  # (Windows)
        yield
        return
    taken = []  # (key, fd or None)
    try:
        for folder in sorted({os.path.realpath(f) for f in folders}):
            try:
                fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino, threading.get_ident())
            if key in _FOLDERS_HELD:
                os.close(fd)
                fd = None
            else:
                with contextlib.suppress(OSError):  # (a file system without flock: as before)
                    fcntl.flock(fd, fcntl.LOCK_EX)
            _FOLDERS_HELD[key] = _FOLDERS_HELD.get(key, 0) + 1
            taken.append((key, fd))
        yield
    finally:
        for key, fd in reversed(taken):
            _FOLDERS_HELD[key] -= 1
            if not _FOLDERS_HELD[key]:
                del _FOLDERS_HELD[key]
            if fd is not None:
                os.close(fd)  # (releases its lock)


@contextlib.contextmanager
def signals_held():
    """Ctrl-C and UNWINDING_SIGNALS wait until the block ends, then act as they would have (in the main
    thread; elsewhere a no-op)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = [signal.SIGINT, *_unwinding(signal)]
    before = {sig: signal.getsignal(sig) for sig in held}
    for sig in held:
        if before[sig] not in (signal.SIG_IGN, None):
            signal.signal(sig, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:
                signal.signal(sig, handler)
        if caught:
            signal.raise_signal(caught[0])


# Signals that end a command the way Ctrl-C does, inside `terminate_like_interrupt`: SIGTERM (``kill``,
# ``timeout``, a job scheduler) and SIGHUP (the terminal or ssh session gone; ``nohup`` ignores it).
UNWINDING_SIGNALS = ("SIGTERM", "SIGHUP")


class Terminated(KeyboardInterrupt):
    """One of UNWINDING_SIGNALS: raised where Ctrl-C raises KeyboardInterrupt, so that it unwinds the
    same way (a temporary file removed, queued work cancelled, a sweep's checkpoint kept) instead of
    ending the process where it stands."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    def __str__(self) -> str:
        import signal

        return f"terminated ({signal.Signals(self.signum).name})"


def interrupt_status(exc: KeyboardInterrupt) -> int:
    """The exit status after Ctrl-C or another signal: 128 + the signal's number (130 for SIGINT)."""
    return 128 + exc.signum if isinstance(exc, Terminated) else 130


def interrupt_said(exc: KeyboardInterrupt) -> str:
    """How a command's line says it was stopped, as the CLI's own line does: ``interrupted`` (Ctrl-C), or
    ``terminated (SIGTERM)`` for one of UNWINDING_SIGNALS."""
    return str(exc) if isinstance(exc, Terminated) else "interrupted"


def _on_signal(signum, frame):
    raise Terminated(signum)


def _unwinding(signal):
    return [getattr(signal, name) for name in UNWINDING_SIGNALS if hasattr(signal, name)]


def _signals_default_in_child() -> None:
    """A child forked without exec ends on these signals as usual: the parent's cleanup is not its own."""
    import signal

    with contextlib.suppress(ValueError):
        for sig in _unwinding(signal):
            if signal.getsignal(sig) is _on_signal:
                signal.signal(sig, signal.SIG_DFL)


os.register_at_fork(after_in_child=_signals_default_in_child)


@contextlib.contextmanager
def terminate_like_interrupt():
    """UNWINDING_SIGNALS raise `Terminated` inside this block; a no-op outside the main thread, and for
    a signal that already has another handler (or is ignored, as ``nohup`` makes SIGHUP)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = [sig for sig in _unwinding(signal) if signal.getsignal(sig) is signal.SIG_DFL]
    for sig in ours:
        signal.signal(sig, _on_signal)
    try:
        yield
    finally:
        for sig in ours:
            signal.signal(sig, signal.SIG_DFL)


def interruptible(work, *, tick=None, on_interrupt=None, name: str = "decodesched-kernel"):
    """`work()`, run in a helper thread while this one waits in short slices (calling `tick()` after each), so
    that Ctrl-C (or a Jupyter kernel's interrupt) reaches the caller at once: `on_interrupt()` runs and the
    KeyboardInterrupt propagates, while the work under way finishes in the background (compiled code cannot be
    stopped; the kernels release the GIL, ``nogil=True``).  Returns what `work` returns, or raises its exception."""
    import threading

    done, failure = [], []

    def run():
        try:
            done.append(work())
        except BaseException as exc:  # re-raised in the calling thread
            failure.append(exc)

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.1)
            stop_if_signalled()  # (a signal that C code called back from dropped: acted on within a slice)
            if tick is not None:
                tick()
    except BaseException:
        if on_interrupt is not None:
            on_interrupt()
        raise
    if failure:
        raise failure[0]
    return done[0]


@contextlib.contextmanager
def immediate_interrupt():
    """Ctrl-C (and SIGTERM or SIGHUP, see `terminate_like_interrupt`) ends the process at once inside this block
    (a Numba kernel holds the interpreter, so Python's own handler would run only when the kernel
    returns), with the CLI's one line and exit status 128 + the signal (`kernels.signal_nb`; silently where
    that handler cannot be had).  Only for blocks that have nothing to clean up (no temporary file open); a
    no-op outside the main thread and inside another such block; a signal under a custom handler or ignored
    (SIGINT under ``nohup cmd &``) is left as it is, the others are still taken; Python's handlers are back after."""
    import signal
    import threading

    stop_if_signalled()  # (one that came while the kernel loaded, and raised nothing)
    main = threading.current_thread() is threading.main_thread()
    ours = [sig for sig in _unwinding(signal) if main and signal.getsignal(sig) is _on_signal]
    if main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        ours.insert(0, signal.SIGINT)
    if not ours or _immediate:
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in ours}
    _immediate.append(True)
    try:
        if not _exit_on_signals(ours):
            for sig in ours:
                signal.signal(sig, signal.SIG_DFL)
        # (again: loading the handler's kernel calls back through ctypes, where a signal is dropped, and from here on
        # the replay runs to its end before Python looks: CI saw 9.5 minutes of `--engine scan` pass so)
        stop_if_signalled()
        yield
    finally:
        _immediate.pop()
        for sig, handler in before.items():
            signal.signal(sig, handler)


_immediate: list = []  # not empty inside `immediate_interrupt` (an inner block leaves the outer one's handlers)


@functools.lru_cache(maxsize=None)
def _c_signal():
    """libc's ``signal`` and the address of `kernels.signal_nb.exit_on_signal_nb`; None where either cannot be
    had (no libc, a failed compile)."""
    try:
        import ctypes

        from .kernels.signal_nb import exit_on_signal_nb

        setter = ctypes.CDLL(None).signal
        setter.restype, setter.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_void_p]
        return setter, exit_on_signal_nb.address
    except Exception as exc:  # noqa: BLE001 - then the signals end the process silently, as SIG_DFL does
        if from_interrupt(exc):  # (Ctrl-C while the handler compiled, wrapped by Numba: not a missing handler)
            raise KeyboardInterrupt from None
        return None


def from_interrupt(exc: BaseException) -> bool:
    """Whether `exc` was raised because of a KeyboardInterrupt: Python turns one that lands in a class body's
    ``__set_name__`` into ``RuntimeError: Error calling __set_name__`` (seen with Ctrl-C while Numba imports), and
    Numba's compiler wraps what its passes raise."""
    seen = 0
    while exc is not None and seen < 100:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _exit_on_signals(sigs) -> bool:
    """Point `sigs` at the machine-code handler that writes one line and exits 128 + the signal (Python's record
    of their handlers is left as it is, so that restoring them reinstalls Python's); False where it is missing."""
    found = _c_signal()
    if found is None:
        return False
    setter, handler = found
    for sig in sigs:
        setter(int(sig), handler)
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class Progress:
    """A plain progress bar on stderr (only when it is a terminal, or when forced).

    With `enabled` None on a stream that is not a terminal (a log under nohup or CI, where a
    redrawn bar is one endless line) prints a plain line now and then instead: once both
    `LINE_FRACTION` of the work and `LINE_SECONDS` have passed since the last (at most ten lines, at
    most one each half minute, none for work that ends sooner), and a last line when any was printed.

    >>> with Progress(3, "demo", enabled=False) as bar:
    ...     for _ in range(3):
    ...         bar.advance()
    """

    LINE_FRACTION = 0.1
    LINE_SECONDS = 30.0

    def __init__(self, total: int, label: str = "", enabled: bool | None = None, stream=None):
        self.total = max(int(total), 0)
        self.label = label
        self.stream = stream or sys.stderr
        tty = _isatty(self.stream)
        self.lines = enabled is None and not tty
        self.enabled = (tty if enabled is None else enabled) and not self.lines
        self.done = 0
        self._start = time.monotonic()
        self._last = 0.0
        self._line_at = (0, self._start)  # (work done, time) of the last plain line, or of the start
        self._printed = False

    def __enter__(self):
        self._draw(force=True)
        return self

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._draw()

    def _line(self, final: bool = False) -> None:
        done, at = self._line_at
        now = time.monotonic()
        if final:
            if not self._printed:
                return
        elif (self.done - done < self.LINE_FRACTION * self.total or now - at < self.LINE_SECONDS
              or self.done >= self.total):
            return
        self._line_at = (self.done, now)
        self._printed = True
        share = f" ({100 * self.done // self.total}%)" if self.total else ""
        try:
            self.stream.write(f"{self.label}: {self.done} of {self.total} done{share}, {now - self._start:.0f} s\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed log costs the progress lines, never the work
            self.lines = False

    def _draw(self, force: bool = False) -> None:
        if self.lines:
            self._line()
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
        if self.lines and exc[0] is None:
            self._line(final=True)
        if self.enabled:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()
        return False


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):  # (a closed or file-like stream)
        return False
