"""Sweeps that survive interruption: finished chunks are saved as they complete, and a rerun resumes.

A checkpoint is a JSON-lines file (``<out>.partial.jsonl`` for ``decodesched sweep``, see
`checkpoint_path_for`).  Its first line holds a hash of decodesched's code, the traces and the scenarios
(`sweep_key`),
so a rerun of the *same* sweep (after Ctrl-C, a lost Dask scheduler, a crash) computes only the
scenarios not yet saved, while a different sweep starts afresh; each further line holds one finished
chunk: its scenario indices, their rows and a hash of both (a line edited since is not resumed from).
A torn last line (the run died while writing it) is ignored, and cut off when a resumed run appends to
the file, so that what it saves is read back.  One run at a time writes a checkpoint (`held`).
The file is removed once the sweep completes (``decodesched sweep`` removes it only once its CSV is
written: `finish`).

`run_local` runs a sweep on this machine in chunks: one `decodesched.batch.simulate_batch` call per
chunk, each saved before the next starts.  Ctrl-C acts within a fraction of a second (the kernels run
in a helper thread, see `batch.simulate_batch`) and keeps every finished chunk.
`decodesched.distributed.run_sweep` writes the same checkpoints from a Dask cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import re
import stat
import sys
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from .model import is_integer

CHECKPOINT_PREFIX = "decodesched-sweep-checkpoint/"
CHECKPOINT_FORMAT = CHECKPOINT_PREFIX + "3"  # 3: each chunk's line carries its hash (`_record_hash`)
DEFAULT_LOCAL_CHUNK = 16


CHECKPOINT_SUFFIX = ".partial.jsonl"


def checkpoint_path_for(out) -> str:
    """The checkpoint of ``decodesched sweep --out OUT``: ``OUT.partial.jsonl`` beside it, unless that
    name is longer than the folder allows for one name (``OUT`` itself may be as long as that, 255 bytes
    on most file systems): then a short hidden name in the same folder, made of a hash of OUT's name,
    ``.decodesched-sweep-<hash>.partial.jsonl``, the same for every run with that OUT."""
    return _beside(out, CHECKPOINT_SUFFIX)


def _beside(path, suffix: str) -> str:
    """``path + suffix``, or a short hidden name of the same folder where that name would be too long."""
    path = os.fspath(path)
    head, name = os.path.split(path)
    try:
        limit = os.pathconf(head or ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if len(os.fsencode(name + suffix)) <= limit:
        return path + suffix
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:24]
    return os.path.join(head, f".decodesched-sweep-{digest}{suffix}")


LOCK_SUFFIX = ".lock"
TEMPORARY_SUFFIX = ".tmp"


def temporary_path(checkpoint_path) -> str:
    """Where a new checkpoint is written before it is renamed into place (`Checkpoint._create`):
    ``<checkpoint>.tmp`` (`_beside`), one name per checkpoint, so that a run killed while writing it leaves
    no stray file that no later run would know of."""
    return _beside(checkpoint_path, TEMPORARY_SUFFIX)

_held: dict[tuple[str, int], int] = {}  # (lock file, thread) -> how many `held` blocks of that thread hold it


@contextlib.contextmanager
def held(checkpoint_path):
    """One sweep at a time per checkpoint: an exclusive `flock` on ``<checkpoint>.lock`` (`_beside`) for
    the block, or a `UserError` at once naming the process that holds it.  Two sweeps writing one
    checkpoint would append each other's chunks, and the first to finish would remove the file under the
    other.  The system drops the lock of a process that dies (kill -9 too), so a stale lock file never
    blocks; the file is removed at the end.  A block inside another of the same thread and checkpoint
    (``decodesched sweep`` around `run_local`) holds it already.  None (no checkpoint): no lock."""
    if not checkpoint_path:
        yield
        return
    path = _beside(checkpoint_path, LOCK_SUFFIX)
    me = (os.path.abspath(path), threading.get_ident())
    if me in _held:
        _held[me] += 1
        try:
            yield
        finally:
            _held[me] -= 1
        return
    fd = _lock(path, checkpoint_path)
    _held[me] = 1
    try:
        yield
    finally:
        del _held[me]
        if fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)  # (while still locked: a run that opened it meanwhile sees it gone, and retries)
            os.close(fd)


def _lock(path: str, checkpoint_path) -> int | None:
    """Open and lock `path` (see `held`); its file descriptor, or None where the system takes no `flock`."""
    from ._io import _describe
    from .errors import UserError

    try:
        import fcntl
    except ImportError:  # (Windows)
        return None
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as exc:
            why = "a symbolic link is there" if exc.errno == errno.ELOOP else _describe(exc)
            raise UserError(f"{path}: cannot create the sweep's lock file ({why}); move away what is there, or "
                            "choose another output name") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # (a FIFO there: reading it would wait forever)
            os.close(fd)
            raise UserError(f"{path}: the sweep keeps its lock file here, but this is not a file; move it away, "
                            "or choose another output name")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.read(fd, 32).decode("ascii", "replace").strip()
            os.close(fd)
            who = f" (process {pid})" if pid.isdigit() else ""
            raise UserError(f"{checkpoint_path}: another sweep{who} is running with this checkpoint; wait for it to "
                            "finish, or write to another output (--out, checkpoint_path)") from None
        except OSError:  # (a file system without flock: unlocked, as before)
            os.close(fd)
            return None
        try:
            now = os.stat(path, follow_symlinks=False)
            mine = os.fstat(fd)
            same = (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)
        except FileNotFoundError:
            same = False
        if not same:  # removed by the run that held it, after this one opened it: lock the file there now
            os.close(fd)
            continue
        text = os.read(fd, 64)
        if not re.fullmatch(rb"\d*\n?", text):  # (a file of someone else's, not a lock a killed sweep left)
            os.close(fd)
            raise UserError(f"{path}: the sweep keeps its lock file here, but this is another file; move it away, "
                            "or choose another output name")
        with contextlib.suppress(OSError):  # (only named in another run's refusal: a full disk is no reason to stop)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd


def shared_names(row: dict) -> dict:
    """`row` with the one shared copy of each column name (`sys.intern`): every row of a batch spells
    its own (the per-class names are made anew for each), about 5 KB a row that a sweep keeps until
    its CSV is written, more than half of a row's memory."""
    return {sys.intern(k): v for k, v in row.items()}


def package_digest(modules, every_file: bool = False) -> str:
    """SHA-256 of the files of the packages `modules` (their ``.py`` files, or `every_file` but caches and built
    libraries), each by its path relative to its package folder and its bytes."""
    h = hashlib.sha256()
    for mod in modules:
        root = Path(mod.__file__).resolve().parent
        h.update(f"{mod.__name__}\0".encode())
        for path in sorted(root.rglob("*" if every_file else "*.py")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".so"):
                h.update(f"{path.relative_to(root).as_posix()}\0".encode("utf-8", "surrogateescape"))
                h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


_code_digest: str | None = None


def code_digest() -> str:
    """`package_digest` of the simulator's own code, the `decodesched` package and its kernels, once per process: a
    checkpoint made by another version (`sweep_key`) is not resumed from, and a Dask worker that runs another
    version refuses its chunks (`distributed._on_worker`), so that no table mixes rows of two versions of the replay
    or the metrics."""
    global _code_digest
    if _code_digest is None:
        import decodesched
        import decodesched.kernels

        _code_digest = package_digest((decodesched, decodesched.kernels))
    return _code_digest


def sweep_key(traces, scenarios) -> str:
    """A hash of the simulator's code (`code_digest`), the traces (every column, name and time scale) and the
    scenarios, in order (a user policy by its `Policy.fingerprint`: its name and all the code and constants its
    functions use).  Each setting counts as the replay takes it (`engine.check_config`): ``np.int64(5)`` steps as
    ``5``, ``2**70`` as ``2**61`` (no replay is longer), so that a resumed sweep finds the rows it wrote."""
    from .engine import check_config
    from .trace import ARRAY_FIELDS

    h = hashlib.sha256(code_digest().encode())
    for t in traces:
        h.update(repr((t.name, t.steps_per_second, len(t))).encode())
        for name in ARRAY_FIELDS:
            h.update(np.ascontiguousarray(getattr(t, name)).tobytes())
    fingerprints: dict[int, str] = {}  # one per Policy object: it follows every helper of the policy
    for s in scenarios:
        if isinstance(s.policy, str):
            policy = str(s.policy)  # (a NumPy string as the plain one it holds)
        else:
            if id(s.policy) not in fingerprints:
                fingerprints[id(s.policy)] = s.policy.fingerprint()
            policy = fingerprints[id(s.policy)]
        settings = check_config(s.policy, s.free_kv_blocks, s.aging_interval, s.max_steps)[1:]
        h.update(repr((int(s.trace), policy, *settings, int(s.replicate))).encode())
    return h.hexdigest()


def _header(path) -> dict | None:
    """The first line of a regular file (not a link) at `path` that starts as a checkpoint of some sweep, else None."""
    path = Path(path)
    try:
        if path.is_symlink() or not path.is_file():
            return None
        with open(path, "rb") as fh:
            header = json.loads(fh.readline(4096) or b"null")
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) and str(header.get("format", "")).startswith(CHECKPOINT_PREFIX) \
        else None


def is_checkpoint(path) -> bool:
    """Whether `path` is a regular file (not a link) that starts as a checkpoint of some sweep."""
    return _header(path) is not None


def of_another_sweep(path, key: str) -> bool:
    """Whether `path` is a checkpoint (`is_checkpoint`) of another sweep than the one of `key` (`sweep_key`: other
    traces or scenarios, another decodesched, an older format): one that is not resumed from, and is replaced once
    the first chunk of this sweep is saved."""
    header = _header(path)
    return header is not None and (header.get("format") != CHECKPOINT_FORMAT or header.get("sweep") != key)


def check_checkpoint_path(path) -> None:
    """Refuse (UserError), before any work, a checkpoint path where something else lives: the sweep
    replaces or removes the file there, so it must be a checkpoint already, or nothing, in a folder
    that takes a new file."""
    from ._io import check_writable, output_target, path_argument
    from .errors import UserError

    path = Path(path_argument(path, "checkpoint_path"))
    if "\0" in str(path):
        output_target(path)  # (its one line for a name no file can have)
    tmp = temporary_path(path)
    if _stale_temporary(tmp) is False:  # (`_create` would fail on it only once the first chunk's work is done)
        what = "a folder" if os.path.isdir(tmp) else "not one a sweep left"
        raise UserError(f"{tmp}: the sweep writes its new checkpoint here first, but this is {what}; move it away "
                        "or choose another output name")
    if not path.is_symlink() and not path.exists():
        check_writable(path)  # (a missing or read-only folder: now, not after the first chunk's work)
        return
    if not is_checkpoint(path):
        what = "a symbolic link" if path.is_symlink() else "a folder" if path.is_dir() else "not a sweep checkpoint"
        raise UserError(f"{path}: the sweep keeps its checkpoint here, but this is {what}; move it away "
                        "or choose another output name")
    if not os.access(path, os.W_OK):  # (now, not once the first chunk's work is done and cannot be saved)
        raise UserError(f"{path}: the sweep's checkpoint is read-only; make it writable (chmod u+w) or move it away")


def _scan(fh, key: str, n_scenarios: int) -> tuple[dict[int, dict], int, bool] | None:
    """Read a checkpoint file opened in binary: ``(rows by scenario index, the length of its valid part,
    whether that part ends in a newline)``, or None when it is not a checkpoint of this sweep.  The
    valid part ends before the first line that is not a whole record (a torn last line) or whose hash is
    not that of its rows (`_record_hash`: edited, or damaged)."""
    first = fh.readline()
    try:
        header = json.loads(first or b"null")
    except ValueError:
        return None
    if not isinstance(header, dict) or header.get("format") != CHECKPOINT_FORMAT or header.get("sweep") != key:
        return None
    done: dict[int, dict] = {}
    end = len(first)
    for line in fh:
        try:
            rec = json.loads(line)
            if rec.pop("sha256") != _record_hash(rec):
                break  # a line edited or damaged since: it and what follows are computed again
            pairs = list(zip([int(i) for i in rec["indices"]], rec["rows"], strict=True))
        except (ValueError, KeyError, TypeError, AttributeError):
            break  # a torn last line
        done.update((i, shared_names(row)) for i, row in pairs if 0 <= i < n_scenarios)
        end += len(line)
        first = line
    return done, end, first.endswith(b"\n")


def _record_hash(record: dict) -> str:
    """The hash a chunk's line carries of its indices and rows (as JSON, which reads back to the same text):
    a line edited by hand or damaged on disk is not resumed from, so a resumed sweep's rows stay exactly
    those of an uninterrupted one."""
    return hashlib.sha256(json.dumps(record).encode()).hexdigest()


def read_checkpoint(path, key: str, n_scenarios: int) -> dict[int, dict]:
    """Rows saved by an earlier run of the same sweep: ``{scenario index: row}`` (empty if none).

    A file of another sweep, or one that cannot be read, yields nothing; a torn last line is ignored.
    """
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        with open(path, "rb") as fh:
            found = _scan(fh, key, n_scenarios)
    except (OSError, ValueError):
        return {}
    return found[0] if found is not None else {}


class Checkpoint:
    """Append-only JSON lines: a header, then one line per finished chunk, flushed and synced.

    The file is made with the first chunk, whole (`_create`): a run that fails, is stopped or killed
    before any chunk was saved leaves no file behind (and a checkpoint of another sweep in its place untouched).
    A resumed run (`resumed`: the rows read back) appends to the file, after cutting off a torn last
    line that an interrupted run left (else its first record would be glued to that fragment, and
    every record after it unreadable); when the file is no longer this sweep's, it starts afresh.
    Rows keep NaN and inf (JSON's ``NaN`` / ``Infinity``, which Python's json reads back)."""

    def __init__(self, path, key: str, n_scenarios: int, resumed: dict[int, dict]):
        self.path = Path(path)
        self.key = key
        self.n_scenarios = n_scenarios
        self.header = {"format": CHECKPOINT_FORMAT, "sweep": key, "scenarios": n_scenarios}
        self.append = bool(resumed)
        self.fh = None

    def _cut_torn_tail(self) -> bool:
        """Cut the file after its last whole record, ending it in a newline; False when it is not a
        checkpoint of this sweep (any more)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            return False
        with os.fdopen(fd, "r+b") as fh:
            found = _scan(fh, self.key, self.n_scenarios)
            if found is None:
                return False
            _, end, newline = found
            fh.seek(end)
            fh.truncate()
            if not newline:
                fh.write(b"\n")
            fh.flush()
            with contextlib.suppress(OSError):
                os.fsync(fh.fileno())
        return True

    def _write(self, record: dict) -> None:
        line = json.dumps(record) + "\n"
        if self.fh is None:
            if not (self.append and self._cut_torn_tail()):
                self._create(json.dumps(self.header) + "\n" + line)
                line = ""
            self.fh = os.fdopen(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW), "w", encoding="utf-8")
        if line:
            self.fh.write(line)
            self.fh.flush()
            with contextlib.suppress(OSError):
                os.fsync(self.fh.fileno())

    def _create(self, text: str) -> None:
        """A new checkpoint appears whole, its header and first chunk written beside it (`temporary_path`) and
        renamed into place: one opened first and written after would be empty or torn if the run were killed
        between, a file the next run refuses as no checkpoint.  A link there is replaced, never followed.  The
        temporary file has one name per checkpoint, written only under its lock (`held`): one that a run killed
        here left is replaced by the next run's, and removed with the checkpoint (`finish`)."""
        tmp = temporary_path(self.path)
        try:
            _remove_stale_temporary(self.path)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)  # (the umask applies)
        except OSError as exc:  # (named as the checkpoint: the file the sweep's error line names)
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                with contextlib.suppress(OSError):
                    os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def add(self, indices: Sequence[int], rows: list[dict]) -> None:
        record = {"indices": [int(i) for i in indices], "rows": rows}
        self._write({**record, "sha256": _record_hash(record)})

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


def finish(checkpoint_path) -> None:
    """Remove a completed sweep's checkpoint (only a checkpoint: never a file put there since).  A
    runner given ``keep_checkpoint=True`` leaves this to its caller, to be called only once the rows
    are safely written (``decodesched sweep``: after its CSV), so that a failed write loses nothing."""
    if checkpoint_path and is_checkpoint(checkpoint_path):
        with contextlib.suppress(OSError):
            os.unlink(checkpoint_path)
    if checkpoint_path:
        with contextlib.suppress(OSError):
            _remove_stale_temporary(checkpoint_path)


def _remove_stale_temporary(checkpoint_path) -> None:
    """Remove the `temporary_path` a run killed in `Checkpoint._create` left (`_stale_temporary`); only the run
    holding the checkpoint's lock writes there (`held`), so it is stale.  Anything else there is kept (and
    `check_checkpoint_path` refuses it before any work)."""
    tmp = temporary_path(checkpoint_path)
    if _stale_temporary(tmp):
        os.unlink(tmp)


def _stale_temporary(tmp) -> bool | None:
    """What is at a `temporary_path`: None (nothing), True for what a run killed in `Checkpoint._create` leaves (a
    file, no link, that starts as a checkpoint does, or a part of that start: it may be torn anywhere; or a link,
    removed, never followed), False for anything else."""
    start = json.dumps({"format": CHECKPOINT_FORMAT}).encode()[:-1]
    try:
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return True
        raise
    try:
        head = os.read(fd, len(start)) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)
    return head is not None and start.startswith(head)


@contextlib.contextmanager
def recording(checkpoint_path, key: str, n: int, done: dict, keep: bool):
    """A run's `Checkpoint` (None without a path), closed when the run ends; once the run is whole the
    file is removed (`finish`), unless `keep`."""
    checkpoint = Checkpoint(checkpoint_path, key, n, done) if checkpoint_path else None
    try:
        yield checkpoint
    finally:
        if checkpoint is not None:
            checkpoint.close()
    if not keep:
        finish(checkpoint_path)


def prepare(traces, scenarios: Sequence, chunk_size, checkpoint_path, stack: contextlib.ExitStack):
    """What every sweep runner checks first, before any work: the chunk size, the traces (loaded)
    and the scenarios (validated as a local run validates them); then it takes the checkpoint's lock
    (`held`, until `stack` closes) and returns ``(traces, scenarios, key, done)`` with the sweep's
    `sweep_key` and the rows already in the checkpoint."""
    from .batch import _as_list, check_scenarios, scenario_list
    from .errors import UserError
    from .trace import load_trace

    if not is_integer(chunk_size) or chunk_size < 1:
        raise UserError(f"chunk size must be a positive integer, got {chunk_size!r}")
    traces = [load_trace(t) for t in _as_list(traces)]
    scenarios = scenario_list(scenarios)
    if not traces or not scenarios:
        raise UserError("a sweep needs at least one trace and one scenario")
    check_scenarios(scenarios, len(traces))
    if checkpoint_path:
        check_checkpoint_path(checkpoint_path)
    key = sweep_key(traces, scenarios)
    stack.enter_context(held(checkpoint_path))
    done = read_checkpoint(checkpoint_path, key, len(scenarios)) if checkpoint_path else {}
    return traces, scenarios, key, done


def _chunk_traces(traces, scenarios) -> tuple[list, list]:
    """The traces that `scenarios` replay, and the scenarios pointing into that list: `simulate_batch`
    prepares and labels every trace it is given, so a chunk given all of a sweep's traces (``--replicates
    5000``: 5,000) spent minutes on traces it does not replay."""
    used = list(dict.fromkeys(sc.trace for sc in scenarios))
    where = {t: i for i, t in enumerate(used)}
    return [traces[t] for t in used], [dataclasses.replace(sc, trace=where[sc.trace]) for sc in scenarios]


def run_local(traces, scenarios: Sequence, *, chunk_size: int = DEFAULT_LOCAL_CHUNK, checkpoint_path=None,
              threads: int | None = None, engine: str = "fast", backend: str = "cpu",
              progress: bool | None = False, keep_checkpoint: bool = False) -> list[dict]:
    """Run `scenarios` over `traces` here, `chunk_size` scenarios per `simulate_batch` call (probably
    slowest first), saving each finished chunk to `checkpoint_path`; return the rows in scenario
    order, equal to ``simulate_batch(traces, scenarios).rows()``.  The checkpoint is removed at the
    end, unless `keep_checkpoint` (the caller then calls `finish` once it has written the rows)."""
    from .batch import ScenarioError, estimated_cost, progress_bar, simulate_batch, trace_labels
    from .engine import check_flag

    progress = check_flag("progress", progress, none=True)
    keep_checkpoint = check_flag("keep_checkpoint", keep_checkpoint)
    with contextlib.ExitStack() as stack:  # (the checkpoint's lock, `held`)
        traces, scenarios, key, done = prepare(traces, scenarios, chunk_size, checkpoint_path, stack)
        chunk_size = int(chunk_size)  # (checked; a NumPy int8 would wrap around in the chunk bounds)
        n = len(scenarios)
        cost = estimated_cost(traces, scenarios)
        todo = sorted((i for i in range(n) if i not in done), key=lambda i: (-cost[i], i))
        labels = trace_labels(traces, scenarios)
        with recording(checkpoint_path, key, n, done, keep_checkpoint) as checkpoint, \
                progress_bar(n, "sweep", progress) as bar:
            bar.advance(len(done))
            for a in range(0, len(todo), chunk_size):
                chunk = todo[a:a + chunk_size]
                try:
                    rows = simulate_batch(*_chunk_traces(traces, [scenarios[i] for i in chunk]), threads=threads,
                                          engine=engine, backend=backend).rows()
                except ScenarioError as exc:  # (named by its index in the sweep, not in the chunk)
                    raise exc.in_sweep(chunk[exc.index]) from exc.__cause__
                rows = [shared_names(row) for row in rows]
                for i, row in zip(chunk, rows):
                    row["trace"] = labels[scenarios[i].trace]  # labels of the whole sweep, not of the chunk
                    done[i] = row
                if checkpoint is not None:
                    checkpoint.add(chunk, rows)
                bar.advance(len(chunk))
        return [done[i] for i in range(n)]
