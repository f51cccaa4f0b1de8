"""Run untrusted code (a student's solution, a student's kernel) under hard limits.

`run_isolated(argv, cwd=..., timeout_s=..., cpu_s=..., memory_mb=...)` starts ``argv`` through a
small stdlib-only launcher (``_launcher.py``) and returns an `Outcome`. What it guarantees:

* **Everything dies.** The launcher leads a new session/process group and is a child subreaper
  (orphans of the command re-parent to it). When the command ends, or the wall clock runs out, or
  memory runs over, the grader kills the whole process group, the launcher kills every descendant,
  and the grader scans ``/proc`` for any process carrying the run's marker: the environment
  variable ``DECODESCHED_SANDBOX=<uuid>`` (read from ``/proc/PID/environ``), the sandbox uid (as
  root), or the session id. Background processes that double-fork and `setsid` still die.
* **Limits.** ``RLIMIT_CPU`` (cpu_s; SIGXCPU, then SIGKILL), ``RLIMIT_AS`` per process
  (``memory_mb``, unless ``address_space=False``), a watchdog on the *sum* of resident memory of all
  the run's processes (``memory_mb``), the *sum* of the CPU time of all the run's processes (cpu_s;
  the launcher's process tree, watched every 0.1 s), ``RLIMIT_FSIZE`` (64 MiB per file),
  ``RLIMIT_NOFILE`` (NOFILE_LIMIT descriptors per process), ``RLIMIT_CORE`` = 0, a wall-clock backstop
  (timeout_s, stretched by the measured load while the run lasts; only a run that makes no progress should ever
  meet it), and as root ``RLIMIT_NPROC`` for the private uid (fork bombs). ``Outcome.cpu_exceeded`` /
  ``wall_exceeded`` say which one stopped it.
* **Files are memory.** ``cwd`` is on /dev/shm (`scratch_root`): what the command writes there is
  RAM that no resident set shows, and ``RLIMIT_FSIZE`` bounds each file, not their number. The
  watchdog counts the bytes under ``cwd`` and those of deleted files the run's processes hold open, and
  past BUFFERS_FREE sockets and pipes the most each may hold (kernel memory: `files_bytes`), with their
  resident memory against ``memory_mb``; more than MAX_FOLDER_ENTRIES
  entries or MAX_FOLDER_DEPTH levels also stop the run (``memory_exceeded``). The walk opens each
  folder relative to its parent without following links, and reads no file.
* **Channels.** ``pass_fds`` hands the command descriptors (the verdict harness's output and its
  session's pipe), so the grader needs no name in ``cwd``, which the command can replace.
* **Output.** stdout and stderr are drained by threads as they come (no pipe deadlock, however
  much is printed) and only the last ``max_output_bytes`` of each are kept.
* **Environment.** The child gets a scrubbed environment: a minimal ``PATH``, ``HOME=cwd``,
  ``LANG``, single-threaded BLAS, no ``PYTHONPATH``, plus what the caller passes in ``env``.

Extra isolation when the grader runs as root (as in CI and on the grading machine), and the mount
namespace (second point) also without root, wherever the machine lets an ordinary user make a user
namespace (`userns_available`):

* the command runs under a **private unprivileged uid/gid** (one per concurrent run, from a high
  range no real account uses), so it cannot write root-owned files (the instructor's gradebook,
  the output folder, the course, the repository), cannot read other runs' 0700 temp folders, and
  cannot signal the grader; ``cwd`` is handed to that uid for the run and back afterwards. Each
  grading process takes its uids from ranges of UID_RANGE that it holds alone (`_claim_uid_range`:
  an ``flock`` on a file of root's own folder UID_LOCK_DIR, released by the kernel when the process
  dies, and a range in which any process still lives is never taken), so two grading runs on one
  machine never run submissions under one uid;
* the command runs in a **private mount namespace** in which every folder of ``hide`` is covered by
  an empty tmpfs (the source notebook, the grader package, the submissions folder, the output
  folder), so it cannot even read them. The cover is a writable trap: whatever the command writes
  there never reaches the real folder and is listed in ``Outcome.protected_writes`` (evidence of
  tampering). Beyond ``hide``, the mount namespace denies by default: every top-level folder but
  the system ones (``/usr``, ``/etc``, ``/lib*``, ``/bin``, ``/dev``, ...) is a fresh empty folder
  (`covered_dirs`: ``/tmp``, ``/var``, ``/home``, ``/root``, ``/work``, ``/opt``, ... and ``/dev/shm``),
  all of them folders of one tmpfs of 512 MiB (``_launcher.COVER_OPTIONS``: what a run can write
  there is RAM the memory watchdog does not see, so it is bounded once, not per folder),
  with only its own ``cwd`` (writable), the interpreter and the venv bound back (read-only), so
  other copies of the course or the repository elsewhere on the machine, and whatever other runs
  left in ``/tmp``, are out of sight.

As root and in a user namespace the command also gets a System V IPC namespace of its own
(`_launcher._private_ipc`): shared memory segments, RAM that no resident set shows, die with the
run instead of outliving it, and hold 64 MiB at most where the namespace's limits can be set.

Without root the launcher makes that namespace inside a user namespace that maps only the grader's
own uid and gid, and the command runs with no capability (``_launcher._drop_capabilities``), as
process 1 of a PID namespace of its own: it runs as the grader's uid, but no process outside can
be named, so it cannot signal the grader (not even with ``kill(-1)``), and it and everything it
started die with the launcher. It is not held by ``RLIMIT_NPROC`` (the memory watchdog stops fork
bombs). Where user namespaces are off, the command can read and write whatever the grader can.

Not isolated (documented limits): the network; the system folders, which stay readable. The
pipeline's own checks (strict JSON verdicts computed outside, gradebook rewritten from verdicts,
output written only after every run ended) protect the grades in every case.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import functools
import json
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from decodesched.errors import UserError

from .limits import load_factor

LAUNCHER = Path(__file__).with_name("_launcher.py")
FORKSERVER = Path(__file__).with_name("forkserver.py")
MARKER_VAR = "DECODESCHED_SANDBOX"
FILE_SIZE_LIMIT = 64 * 1024 * 1024
UID_BASE = 1_900_000_000  # private uids for sandboxed runs (root only); no real account lives here ...
UID_RANGE = 1000  # ... in UID_RANGES ranges of this many, each held by one grading process at a time ...
UID_RANGES = 10_000
# ... through a lock file per range in a folder of root's own (on /run, a tmpfs: empty after a reboot)
UID_LOCK_DIR = os.path.join("/run" if os.path.isdir("/run") else "/tmp", "decodesched-uids")
NPROC_LIMIT = 256
NOFILE_LIMIT = 1024  # descriptors per process (RLIMIT_NOFILE; an honest kernel run holds about 60)
# Socket and pipe buffers are kernel memory that no resident set shows: one socket may hold 2 x net.core.wmem_max
# (8 MiB where that is 4 MiB), so 10 000 filled socketpairs took 1.9 GB of the machine past a 512 MiB limit. An
# honest run holds about 45 (a Jupyter kernel 22 sockets and 9 pipes, nbgrader 10 sockets); each one past
# BUFFERS_FREE counts as memory at the most it may hold (`_held_bytes`).
BUFFERS_FREE = 128  # three times what an honest run holds

# Set while a grading run is being interrupted (Ctrl-C): every watched run stops at once, and no new
# run starts (`Interrupted`), so the grader's threads come back in seconds, not after their queue.
STOPPING = threading.Event()


class Interrupted(Exception):
    """A sandboxed run not started because the grading is being interrupted (`STOPPING`)."""


@dataclass
class Outcome:
    """What happened to one sandboxed command."""

    returncode: int | None
    timed_out: bool
    memory_exceeded: bool
    signal: int | None
    stdout: bytes
    stderr: bytes
    wall_s: float
    cpu_s: float = 0.0
    cpu_exceeded: bool = False
    wall_exceeded: bool = False  # stopped by the wall-clock backstop (no progress), not by a CPU limit
    check_exceeded: bool = False  # stopped by the caller's `monitor` (a verdict check past its CPU limit)
    output_truncated: bool = False
    leftovers_killed: int = 0  # processes still alive after the command ended (killed by us)
    protected_writes: list = field(default_factory=list)  # files it created in hidden folders (root only)
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not (self.timed_out or self.memory_exceeded) and self.signal is None


def scratch_root() -> str | None:
    """Where the private folders of sandboxed runs go: /dev/shm when usable (memory: the throwaway
    gradebook copies commit dozens of times per run, and each commit is an fsync on a disk), else
    the default temporary folder."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and not os.path.islink(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return None


# In each private scratch folder of a grading (`private_scratch`): a file its grading holds an exclusive flock on
# for as long as it runs. The kernel drops the lock when the process ends however it ends (SIGKILL, the OOM killer),
# so a folder whose lock no process holds is one a grading could not remove (`remove_stale_scratch`).
OWNER_LOCK = ".decodesched-owner.lock"


def private_scratch(prefix: str) -> tuple[Path, int]:
    """A new folder `prefix`... under `scratch_root`, and the descriptor that holds its OWNER_LOCK (close it once the
    folder is removed). The lock file is locked before it takes its name, so no other grading ever finds it
    unlocked while this one lives; the descriptor is not inherited by the programs the grading runs."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=scratch_root())).resolve()
    fd, tmp = tempfile.mkstemp(prefix=".owner-", dir=folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp, folder / OWNER_LOCK)
    except BaseException:
        os.close(fd)
        raise
    return folder, fd


def remove_stale_scratch(prefix: str) -> int:
    """Remove the private scratch folders `prefix`... under `scratch_root` that a grading killed by a signal it
    cannot catch left (a few MB each, in /dev/shm: memory): those of this user whose OWNER_LOCK no process holds.
    A folder without one (made by an older grader, or being made) and anything not a folder of this user is left.
    Returns how many were removed."""
    import shutil
    import tempfile

    removed = 0
    try:
        entries = list(os.scandir(scratch_root() or tempfile.gettempdir()))
    except OSError:
        return 0
    for entry in entries:
        try:
            if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False) \
                    or entry.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue
            fd = os.open(os.path.join(entry.path, OWNER_LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (held while removed: another cleaner passes over it)
        except OSError:
            os.close(fd)
            continue  # a grading under way
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
        finally:
            os.close(fd)
    return removed


# The folder of one process's sandboxed verdict runs (`process_scratch`), under `scratch_root`.
RUNS_PREFIX = "decodesched-runs-"
_runs_folder: tuple | None = None  # (pid, folder) of this process's `process_scratch`
_runs_lock = threading.Lock()


def process_scratch() -> Path:
    """This process's private scratch folder (`private_scratch`), made on its first use, removed as it exits: the
    folders of its sandboxed runs go in it, so a process killed by a signal it cannot catch leaves one folder that
    holds its OWNER_LOCK, which the next process to make one removes (`remove_stale_scratch`)."""
    import atexit
    import shutil

    global _runs_folder
    with _runs_lock:
        if _runs_folder is None or _runs_folder[0] != os.getpid():  # (a forked child makes its own)
            remove_stale_scratch(RUNS_PREFIX)
            folder, fd = private_scratch(RUNS_PREFIX)
            os.chmod(folder, 0o711)  # private uids must reach their own folder in it, but list nothing
            _runs_folder = (os.getpid(), folder)

            def remove(pid=os.getpid()):
                if pid == os.getpid():
                    shutil.rmtree(folder, ignore_errors=True)
                    os.close(fd)

            atexit.register(remove)
        return _runs_folder[1]


def _new_runs_lock() -> None:
    global _runs_lock
    _runs_lock = threading.Lock()  # in a forked child: a thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_new_runs_lock)


def is_root() -> bool:
    return os.geteuid() == 0


@functools.lru_cache(maxsize=1)
def userns_available() -> bool:
    """Without root: whether this machine lets the launcher make a user and mount namespace of its own,
    mount there and start a PID namespace (most Linux systems; not where unprivileged user namespaces
    are switched off or filtered). Asked once per process, of the launcher itself."""
    if is_root():
        return False
    try:
        probe = subprocess.run([sys.executable, "-I", "-S", str(LAUNCHER), "--probe-userns"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def weak_isolation() -> str | None:
    """One line for the grader's user when submissions would run with the grader's own access to
    files (neither root nor a user namespace here), else None."""
    if is_root() or userns_available():
        return None
    return ("submissions run with your own access to files here (neither root nor user namespaces): "
            "they can read the course and write where you can; see docs/grading.md")


# ----------------------------------------------------------------------------- private uids
_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()
_uid_ranges: dict[int, int] = {}  # first uid of each range this process holds -> its locked file's descriptor


def _forget_uid_ranges() -> None:
    """In a forked child: the parent's ranges are the parent's (closing our copies keeps its locks)."""
    global _uid_lock
    _uid_lock = threading.Lock()  # a thread of the parent may have held it at the fork
    _close_all(list(_uid_ranges.values()))
    _uid_ranges.clear()
    _uids_in_use.clear()


os.register_at_fork(after_in_child=_forget_uid_ranges)


def hold_uid_range() -> None:
    """Claim this process's first range of private uids now (as root; a fork server's start does): a machine
    on which no range can be had stops the grading with one line (`UserError`) before any run."""
    with _uid_lock:
        if not _uid_ranges:
            _claim_uid_range()


def _acquire_uid() -> int:
    with _uid_lock:
        for base in sorted(_uid_ranges):
            for uid in range(base, base + UID_RANGE):
                if uid not in _uids_in_use:
                    _uids_in_use.add(uid)
                    return uid
        uid = _claim_uid_range()  # every uid of our ranges runs a command: one more range
        _uids_in_use.add(uid)
        return uid


def _release_uid(uid: int) -> None:
    with _uid_lock:
        _uids_in_use.discard(uid)


def _claim_uid_range() -> int:
    """Hold a range of private uids that no other process holds and in which no process lives (one a grading
    run that was killed left behind), its lock file open for this process's life; returns its first uid."""
    dfd = _uid_lock_dir()
    try:
        start = os.getpid() % UID_RANGES  # spread: concurrent graders rarely try the same file first
        for i in range(UID_RANGES):
            index = (start + i) % UID_RANGES
            fd = _lock_uid_file(dfd, index)
            if fd is None:
                continue
            if index in _uid_ranges_alive():  # checked while we hold it: no one else starts a process there now
                os.close(fd)
                continue
            base = UID_BASE + index * UID_RANGE
            _uid_ranges[base] = fd
            return base
    finally:
        os.close(dfd)
    raise UserError(f"all {UID_RANGES} ranges of sandbox uids are held by other grading runs on this machine "
                    f"(locks in {UID_LOCK_DIR}); wait for one to end")


def _uid_lock_dir() -> int:
    """UID_LOCK_DIR opened, made if missing; only a folder of our own that no one else can write into (no link,
    not another user's, not group- or world-writable, in a parent no one else can swap it in) is used."""
    path = UID_LOCK_DIR
    fix = f"remove it, or make it a folder of uid {os.geteuid()} with mode 700"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UserError(f"{path}: cannot make the folder of the sandbox's uid locks ({exc.strerror}); "
                        f"{fix}") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise UserError(f"{path}: the sandbox's uid locks need a folder here, not a link or a file; {fix}") from None
    st, parent = os.fstat(fd), os.stat(os.path.dirname(path))
    if st.st_uid != os.geteuid() or st.st_mode & 0o022 or parent.st_uid not in (0, os.geteuid()) \
            or (parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX):
        os.close(fd)
        raise UserError(f"{path}: the folder of the sandbox's uid locks is another user's or writable by others; "
                        f"{fix}")
    return fd


def _lock_uid_file(dfd: int, index: int) -> int | None:
    """The lock file of range `index`, opened and locked, or None when another process holds it, or it is no
    plain file (never followed: a link planted there reaches nothing, and that range is not used)."""
    try:
        fd = os.open(str(index), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                     dir_fd=dfd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            return None
        raise UserError(f"{UID_LOCK_DIR}/{index}: cannot open a lock file of the sandbox's uids ({exc.strerror}); "
                        f"make {UID_LOCK_DIR} writable") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BlockingIOError
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _uid_ranges_alive() -> set[int]:
    """The uid ranges in which some process lives (any of its real, effective, saved or file-system uids or
    gids), from ``/proc/PID/status``, which says them for every process."""
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as fh:
                lines = [line.split() for line in fh.read().splitlines() if line.startswith((b"Uid:", b"Gid:"))]
        except OSError:
            continue
        for word in (w for line in lines for w in line[1:]):
            index = (int(word) - UID_BASE) // UID_RANGE
            if 0 <= index < UID_RANGES:
                out.add(index)
    return out


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            with contextlib.suppress(FileNotFoundError):
                os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


# ----------------------------------------------------------------------------- /proc scanning
def _proc_stat(pid: int):
    """(ppid, pgid, sid, rss_pages, cpu_ticks) of a process, or None; cpu_ticks counts its own CPU time
    and that of its children it has waited for (utime + stime + cutime + cstime)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2:].split()
    try:
        return int(rest[1]), int(rest[2]), int(rest[3]), int(rest[21]), sum(int(x) for x in rest[11:15])
    except (IndexError, ValueError):
        return None


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _tree(root: int) -> list[int]:
    """`root` and all its descendants, from the kernel's children lists ([] when `root` is gone)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        out.append(pid)
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                    todo.extend(int(x) for x in fh.read().split())
            except (OSError, ValueError):
                pass
    return out


def _proc_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return marker in fh.read().split(b"\0")
    except OSError:
        return False


def find_marked(marker: str) -> list[int]:
    """PIDs of live processes whose environment carries ``DECODESCHED_SANDBOX=<marker>``.

    Tests use this to prove that nothing a submission started outlives the grading run.
    """
    needle = f"{MARKER_VAR}={marker}".encode()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid() and _has_marker(int(name), needle):
            if _proc_stat(int(name)) is not None:
                out.append(int(name))
    return out


def find_sandboxed(prefix: str = "") -> list[int]:
    """PIDs of live processes carrying any sandbox marker that starts with `prefix`."""
    needle = f"{MARKER_VAR}={prefix}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if any(item.startswith(needle) for item in env):
            st = _proc_stat(int(name))
            if st is not None:
                out.append(int(name))
    return out


class _Members:
    """Identifies the processes of one run: its session, its uid (root) or its env marker."""

    def __init__(self, sid: int, marker: str, uid: int | None):
        self.sid = sid
        self.needle = f"{MARKER_VAR}={marker}".encode()
        self.uid = uid
        self.me = os.getpid()

    def scan(self, with_rss: bool = False):
        """The run's live pids; with `with_rss`, also their summed resident memory (bytes) and CPU time (s).

        The periodic watchdog scans (`with_rss`) walk the launcher's process tree (it is a subreaper:
        every orphan of the run re-parents to it) through ``/proc/PID/task/TID/children``: listing all
        of /proc ten times a second per run cost more CPU than grading. The scans that kill
        (`kill_all`) list every process and also match the private uid and the environment marker."""
        pids, rss, ticks = [], 0, 0
        tree = _tree(self.sid) if with_rss else None
        candidates = tree if tree else [int(n) for n in os.listdir("/proc") if n.isdigit()]
        by_marker = not (with_rss and (tree or self.uid is not None))
        for pid in candidates:
            if pid == self.me:
                continue
            st = _proc_stat(pid)
            if st is None:
                continue
            mine = bool(tree) or st[2] == self.sid or st[1] == self.sid
            if not mine and self.uid is not None:
                mine = _proc_uid(pid) == self.uid
            if not mine and by_marker:
                mine = _has_marker(pid, self.needle)
            if mine:
                pids.append(pid)
                rss += st[3]
                ticks += st[4]
        return (pids, rss * os.sysconf("SC_PAGE_SIZE"), ticks / _CLK_TCK) if with_rss else pids

    def kill_all(self) -> int:
        killed = 0
        for _ in range(200):
            pids = [p for p in self.scan() if p != self.sid or True]
            alive = [p for p in pids if _proc_state(p) not in ("Z", None)]
            if not alive:
                break
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
            time.sleep(0.01)
        return killed


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2:raw.rfind(b")") + 3].decode()


# ----------------------------------------------------------------------------- output capture
class _Tail(threading.Thread):
    """Drain a pipe to EOF, keeping only the last `cap` bytes."""

    def __init__(self, stream, cap: int):
        super().__init__(daemon=True)
        self.stream, self.cap = stream, cap
        self.buf = bytearray()
        self.total = 0

    def run(self):
        fd = self.stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.total += len(chunk)
            self.buf += chunk
            if len(self.buf) > 2 * self.cap:
                del self.buf[: len(self.buf) - self.cap]
        with contextlib.suppress(OSError):
            self.stream.close()

    def value(self) -> bytes:
        return bytes(self.buf[-self.cap:]) if self.cap else b""


def scrubbed_env(cwd, extra: dict | None = None) -> dict:
    env = {
        "PATH": os.pathsep.join(p for p in (os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin")),
        "HOME": str(cwd),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TMPDIR": str(cwd),
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "NUMBA_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "MPLBACKEND": "Agg",
    }
    env.update(extra or {})
    return env


# Top-level folders the command keeps seeing as they are (the system); every other one is covered.
SYSTEM_DIRS = frozenset({"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "sys"})


def interpreter_paths() -> set[str]:
    """What every run binds back for Python: the interpreter's folder, its installation and the venv."""
    return {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix),
            os.path.dirname(os.path.realpath(sys.executable))}


def covered_dirs() -> list[str]:
    """The folders a root-run command sees as fresh empty tmpfs: every top-level folder but the system
    ones (so /tmp, /var, /home, /root, /work, /opt, /srv, /mnt, ... and /dev/shm), deny by default.

    Copies of the course, the repository or other submissions can be anywhere on the machine; only
    what the command needs (its own folder, the interpreter and the venv, ``expose``) is bound back.
    """
    out = []
    for entry in sorted(os.listdir("/")):
        path = "/" + entry
        if entry in SYSTEM_DIRS or os.path.islink(path) or not os.path.isdir(path):
            continue
        out.append(path)
    if os.path.isdir("/dev/shm") and not os.path.islink("/dev/shm"):
        out.append("/dev/shm")
    return out


@dataclass
class _Watch:
    tree_cpu_s: float = 0.0
    cpu_exceeded: bool = False
    wall_exceeded: bool = False
    memory_exceeded: bool = False
    check_exceeded: bool = False


MAX_FOLDER_ENTRIES = 10_000  # files and folders in a run's own folder (an honest kernel run makes under 200) ...
MAX_FOLDER_DEPTH = 32  # ... and its depth: past either, the run is stopped (status memory)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK


class _TooMany(Exception):
    """A run's folder holds more than MAX_FOLDER_ENTRIES entries or is deeper than MAX_FOLDER_DEPTH."""


def _folder_bytes(fd: int, depth: int = 0, count: list | None = None) -> int:
    """Bytes allocated under the open folder `fd` (``st_blocks``: a sparse file counts what it holds), every
    folder opened relative to its parent without following a link (the run may swap one in meanwhile)."""
    count = [0] if count is None else count
    total = 0
    with os.scandir(fd) as entries:
        for entry in entries:
            count[0] += 1
            if count[0] > MAX_FOLDER_ENTRIES or depth > MAX_FOLDER_DEPTH:
                raise _TooMany
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            if stat.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                try:
                    total += _folder_bytes(sub, depth + 1, count)
                finally:
                    os.close(sub)
    return total


@functools.lru_cache(maxsize=1)
def buffer_bytes() -> int:
    """The most one socket or pipe may hold (2 x ``net.core.wmem_max`` or ``rmem_max``: SO_SNDBUF is doubled;
    ``fs.pipe-max-size``), as this machine is set up; 8 MiB where none can be read."""
    most = 0
    for name, factor in (("net/core/wmem_max", 2), ("net/core/rmem_max", 2), ("fs/pipe-max-size", 1)):
        with contextlib.suppress(OSError, ValueError):
            most = max(most, factor * int(Path("/proc/sys", name).read_text()))
    return most or 8 * 2**20


def _held_bytes(pids) -> int:
    """Bytes of the regular files the run's processes hold open after deleting them (and memfds): taken
    still, RAM on a tmpfs, but in no folder; and `buffer_bytes` for each socket or pipe they hold past
    BUFFERS_FREE (kernel memory)."""
    seen, total = set(), 0
    buffers = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            link = f"/proc/{pid}/fd/{fd}"
            try:
                target = os.readlink(link)
                if target.startswith(("socket:", "pipe:")):
                    buffers.add(target)
                    continue
                if not target.endswith(" (deleted)"):
                    continue
                st = os.stat(link)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total + max(0, len(buffers) - BUFFERS_FREE) * buffer_bytes()


def files_bytes(folder, pids=()) -> int | None:
    """What a run has written, in bytes: its own folder (on /dev/shm, RAM) and the deleted files (and past
    BUFFERS_FREE, the socket and pipe buffers) its processes `pids` hold open; None when the folder is too big
    to count (MAX_FOLDER_ENTRIES, MAX_FOLDER_DEPTH)."""
    try:
        fd = os.open(folder, _DIR_FLAGS)
    except OSError:
        return _held_bytes(pids)
    try:
        return _folder_bytes(fd) + _held_bytes(pids)
    except _TooMany:
        return None
    except OSError:
        return _held_bytes(pids)
    finally:
        os.close(fd)


STALL_S = 12.0  # a run whose processes together got less than STALL_SHARE of a core for this long ...
STALL_SHARE = 0.02  # ... is asleep (a blocked or sleeping submission), not starved, and is stopped


def _watch(alive, members: _Members, start: float, *, timeout_s: float, cpu_s: float, mem_bytes: int,
           notes: list, folder=None, monitor=None) -> _Watch:
    """Watch a run until it ends or breaks a limit: the CPU time and memory of all its processes together
    (every 0.1 s), and the wall-clock backstop, stretched by the measured load (every second). Memory is
    their resident memory plus what the run has written (`files_bytes` of `folder`): its folder is on
    /dev/shm, and files there are RAM that no process's resident memory shows. `monitor(cpu_s, rss_bytes)`,
    when given, is called with the run's CPU time and resident memory at every turn (every 0.02 s); a reason
    it returns stops the run (``check_exceeded``)."""
    w = _Watch()
    next_scan = next_load = 0.0
    factor = 1.0
    samples = collections.deque()  # (wall, tree CPU) of the last STALL_S seconds
    while alive():
        if STOPPING.is_set():
            notes.append("stopped: the grading was interrupted")
            break
        now = time.monotonic()
        if now >= next_load:
            next_load = now + 1.0
            factor = max(factor, load_factor())  # only ever more generous during one run
        if now - start > timeout_s * factor:
            w.wall_exceeded = True
            notes.append(f"wall-clock backstop reached ({timeout_s:.0f} s on a quiet machine, more under load)")
            break
        sampled = None
        if monitor is not None:
            sampled = pids, rss, cpu = members.scan(with_rss=True)
            w.tree_cpu_s = max(w.tree_cpu_s, cpu)
            try:
                reason = monitor(w.tree_cpu_s, rss)
            except Exception as exc:  # noqa: BLE001 - a broken monitor stops nothing (the other limits hold)
                notes.append(f"monitor failed: {type(exc).__name__}")
                reason, monitor = None, None
            if reason:
                w.check_exceeded = True
                notes.append(reason)
                break
        if now >= next_scan:
            next_scan = now + 0.1
            pids, rss, cpu = sampled or members.scan(with_rss=True)
            w.tree_cpu_s = max(w.tree_cpu_s, cpu)
            samples.append((now, w.tree_cpu_s))
            while samples and samples[0][0] < now - STALL_S:
                samples.popleft()
            if now - start > STALL_S + 1 and samples and now - samples[0][0] > STALL_S * 0.8 \
                    and w.tree_cpu_s - samples[0][1] < STALL_SHARE * (now - samples[0][0]):
                w.wall_exceeded = True  # asleep, not starved: even on a busy machine a runnable process gets more
                notes.append(f"no progress: under {STALL_SHARE:.0%} of a core for {STALL_S:g} s")
                break
            files = files_bytes(folder, pids) if folder is not None else 0
            if files is None or rss + files > mem_bytes:
                w.memory_exceeded = True
                notes.append(_memory_note(files, mem_bytes))
                break
            if w.tree_cpu_s > cpu_s + 0.5:
                w.cpu_exceeded = True
                notes.append(f"CPU limit of {cpu_s:g} s reached (all the run's processes together)")
                break
        time.sleep(0.02)
    return w


def _memory_note(files: int | None, mem_bytes: int) -> str:
    """Which limit the run broke, without the amounts measured when it was stopped (they vary from run to run, as do
    the note's CPU times: the feedback page of a submission is the same on every grading, any --jobs, busy or not)."""
    limit = f"the {mem_bytes // 2**20} MiB limit"
    if files is None:
        return f"more than {MAX_FOLDER_ENTRIES} files or {MAX_FOLDER_DEPTH} levels of folders written (over {limit})"
    if files < 2**20:
        return f"resident memory over {limit}"
    return f"resident memory and files written (or socket and pipe buffers held) over {limit}"


class _Process:
    """The launcher of one run, started fresh (``python -I -S _launcher.py``) or forked by a `ForkServer`;
    the small part of `subprocess.Popen` that `run_isolated` uses."""

    def __init__(self, pid, stdout, stderr, popen=None, pidfd=None):
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self._popen, self._pidfd = popen, pidfd
        self.returncode = None

    @classmethod
    def start(cls, spec, status_w, marker, server=None, pass_fds=()):
        if server is not None:
            with contextlib.suppress(OSError, ValueError, KeyError):
                return server.spawn(spec, status_w)
        popen = subprocess.Popen(
            [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(spec), str(status_w)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(status_w, *pass_fds),
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin", MARKER_VAR: marker + "-launcher"},
        )
        return cls(popen.pid, popen.stdout, popen.stderr, popen=popen)

    def poll(self):
        if self._popen is not None:
            self.returncode = self._popen.poll()
            return self.returncode
        if self._pidfd is not None and select.select([self._pidfd], [], [], 0)[0]:
            os.close(self._pidfd)
            self._pidfd = None
        return None if self._pidfd is not None else -1  # the fork server's child: its status comes by report

    def wait(self, timeout: float = 60.0):
        if self._popen is not None:
            self.returncode = self._popen.wait()
            return self.returncode
        if self._pidfd is not None:
            select.select([self._pidfd], [], [], timeout)
        return self.poll()


class ForkServer:
    """A started `forkserver.py` (one per grade run): `run_isolated(..., server=it)` forks its runs there.

    Use as a context manager; closing it ends the server. Thread-safe.
    """

    def __init__(self, marker: str = "forkserver"):
        import socket

        if is_root():
            hold_uid_range()  # before anything starts: no range of uids to be had is one line, not a crash per run
        self._socket = socket
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(FORKSERVER), str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
            env={"PATH": os.pathsep.join((os.path.dirname(sys.executable), "/usr/bin", "/bin")),
                 "PYTHONWARNINGS": "ignore", MARKER_VAR: marker},
        )
        theirs.close()
        self._sock = mine
        self._lock = threading.Lock()
        self._ready = False

    def _wait_ready(self):
        if not self._ready:
            self._sock.settimeout(300)
            try:
                if self._sock.recv(16) != b"ready":
                    raise OSError("the fork server did not start")
            finally:
                self._sock.settimeout(None)
            self._ready = True

    def spawn(self, spec: dict, status_w: int) -> _Process:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            with self._lock:
                self._wait_ready()
                self._socket.send_fds(self._sock, [json.dumps(spec).encode()], [out_w, err_w, status_w])
                msg, fds, _, _ = self._socket.recv_fds(self._sock, 4096, 1)
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        if not fds:
            os.close(out_r)
            os.close(err_r)
            raise OSError("the fork server answered " + msg.decode("utf-8", "replace")[:200])
        return _Process(json.loads(msg)["pid"], os.fdopen(out_r, "rb", buffering=0),
                        os.fdopen(err_r, "rb", buffering=0), pidfd=fds[0])

    def warm(self, course, assignment: str, student: str) -> bool:
        """Pre-initialise nbgrader in the server with one autograde of `student` in `course` (trusted:
        the release, nothing executed; see `grader.forkserver._warm`). False when it did not work
        (each run then sets nbgrader up itself, as before)."""
        with self._lock:
            self._wait_ready()
            self._sock.send(json.dumps({"warm": str(course), "assignment": assignment, "student": student}).encode())
            return json.loads(self._sock.recv(4096)).get("warm") is True

    def write_gradebook(self, path, rows: list, stamps: dict | None = None) -> bool:
        """`grader.outputs.write_gradebook(path, rows, stamps)` in the server, which has nbgrader imported (call it
        when every sandboxed run has ended). False when it did not work (the caller writes it itself)."""
        with self._lock:
            self._wait_ready()
            try:
                self._sock.send(json.dumps({"gradebook": str(path), "rows": rows, "stamps": stamps or {}}).encode())
            except OSError:  # e.g. too many students for one message
                return False
            return json.loads(self._sock.recv(4096)).get("gradebook") is True

    def abort(self):
        """End the server now (the grading is being stopped): a thread waiting for it to start, warm up or fork
        gets an error at once instead of waiting for nbgrader's import. Its runs are stopped by `STOPPING`."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(self._socket.SHUT_RDWR)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)

    def close(self):
        with contextlib.suppress(OSError):
            self._sock.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def run_isolated(
    argv,
    *,
    cwd,
    timeout_s: float,
    cpu_s: float,
    memory_mb: int,
    max_output_bytes: int = 1_000_000,
    env: dict | None = None,
    hide=(),
    address_space: bool = True,
    marker: str | None = None,
    expose=(),
    server: ForkServer | None = None,
    pass_fds=(),
    monitor=None,
) -> Outcome:
    """Run `argv` in `cwd` under the limits above; never raises for anything the command does.

    `env` is added to the scrubbed environment. `hide` lists paths made invisible to the command
    (root only). `address_space=False` skips ``RLIMIT_AS`` (Jupyter kernels map far more virtual
    memory than they use; the resident-memory watchdog still applies). `marker` lets the caller
    choose the run's marker (default: a fresh uuid) to look for leftovers afterwards. `server`, a
    started `ForkServer`, launches the run by forking it (same sandbox, no interpreter start-up;
    ``python -m nbgrader ...`` then runs in the pre-imported process). `pass_fds`: descriptors the command
    inherits at the same numbers (channels that no name in its writable folder can stand for); they are
    this call's to close, as soon as the command has them (the caller keeps its own copies), and such a
    run never goes through `server`. `monitor(cpu_s, rss_bytes)`: see `_watch` (the verdict's per-check CPU
    time, measured from outside the command).
    """
    open_fds = list(pass_fds)  # each closed once, as soon as it may be (a number closed twice may be another's)
    try:
        if STOPPING.is_set():
            raise Interrupted("the grading is being interrupted")
        return _run_isolated(argv, cwd=cwd, timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb,
                             max_output_bytes=max_output_bytes, env=env, hide=hide, address_space=address_space,
                             marker=marker, expose=expose, server=None if pass_fds else server, pass_fds=open_fds,
                             monitor=monitor)
    finally:
        _close_all(open_fds)


def nofile_limit() -> int:
    """NOFILE_LIMIT, or the grader's own hard limit where that is lower (a process without the capability to raise
    its hard limit could not set it)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return NOFILE_LIMIT if hard == resource.RLIM_INFINITY else min(NOFILE_LIMIT, hard)


def _close_all(fds: list) -> None:
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())


def _run_isolated(argv, *, cwd, timeout_s, cpu_s, memory_mb, max_output_bytes, env, hide, address_space, marker,
                  expose, server, pass_fds, monitor=None) -> Outcome:
    cwd = Path(cwd).resolve()
    marker = marker or uuid.uuid4().hex
    full_env = scrubbed_env(cwd, env)
    full_env[MARKER_VAR] = marker
    cpu_soft = max(1, int(round(cpu_s)))
    mem_bytes = int(memory_mb) * 1024 * 1024
    rlimits = {
        "RLIMIT_CPU": [cpu_soft, cpu_soft + 2],
        "RLIMIT_FSIZE": [FILE_SIZE_LIMIT, FILE_SIZE_LIMIT],
        "RLIMIT_CORE": [0, 0],
        "RLIMIT_NOFILE": [nofile_limit()] * 2,
    }
    if address_space:
        rlimits["RLIMIT_AS"] = [mem_bytes, mem_bytes]
    root = is_root()
    userns = not root and userns_available()
    uid = _acquire_uid() if root else None
    spec = {
        "argv": [str(a) for a in argv],
        "cwd": str(cwd),
        "env": full_env,
        "rlimits": rlimits,
        "uid": uid,
        "gid": uid,
        "nproc": NPROC_LIMIT if root else None,
        "userns": userns,
        # never hide the command's own folder (or a folder holding it)
        "hide": [h for h in (str(Path(p).resolve()) for p in hide if Path(p).exists())
                 if not (str(cwd) == h or str(cwd).startswith(h.rstrip("/") + "/"))] if root or userns else [],
        "cover": covered_dirs() if root or userns else [],
        "expose": sorted({*interpreter_paths(), str(cwd)} | {os.path.realpath(p) for p in expose}),
        "pass_fds": list(pass_fds),
    }
    notes = []
    status_r, status_w = os.pipe()
    start = time.monotonic()
    try:
        if root:
            _chown_tree(cwd, uid, uid)
        proc = _Process.start(spec, status_w, marker, server, pass_fds)
        _close_all(pass_fds)  # the command has its copies (a pipe's reader must not stay open here)
        os.close(status_w)
        status_w = None
        out_t, err_t = _Tail(proc.stdout, max_output_bytes), _Tail(proc.stderr, max_output_bytes)
        out_t.start()
        err_t.start()
        members = _Members(proc.pid, marker, uid)
        watch = _watch(lambda: proc.poll() is None, members, start, timeout_s=timeout_s, cpu_s=cpu_s,
                       mem_bytes=mem_bytes, notes=notes, folder=str(cwd), monitor=monitor)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        killed = members.kill_all()
        proc.wait()
        killed += members.kill_all()
        out_t.join(5)
        err_t.join(5)
        if out_t.is_alive() or err_t.is_alive():  # someone outside still holds our pipes
            killed += members.kill_all()
            out_t.join(5)
            err_t.join(5)
        wall = time.monotonic() - start
        report = {}
        with os.fdopen(status_r, "rb") as fh:
            status_r = None
            raw = fh.read()
        with contextlib.suppress(ValueError):
            report = json.loads(raw.decode() or "{}")
        returncode = report.get("returncode")
        sig = report.get("signal")
        if not report:
            # The launcher itself was killed (by us on timeout, or by the command without root).
            rc = proc.returncode  # None for a fork-server child: only its report says how it ended
            sig = -rc if rc is not None and rc < 0 else None
            returncode = None if sig else rc
            notes.append("launcher ended without a report")
        cpu_used = max(float(report.get("cpu_s", 0.0)), watch.tree_cpu_s)
        cpu_exceeded = watch.cpu_exceeded or sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_used >= cpu_soft)
        if cpu_exceeded and not watch.cpu_exceeded:
            notes.append(f"CPU limit of {cpu_soft} s reached")
        memory_exceeded = watch.memory_exceeded
        stderr = err_t.value()
        if not memory_exceeded and sig is None and returncode not in (0, None):
            # Out of address space: Python and numpy report MemoryError; C++ reports bad_alloc.
            tail = stderr[-4000:]
            if b"MemoryError" in tail or b"std::bad_alloc" in tail or b"Cannot allocate memory" in tail:
                memory_exceeded = True
                notes.append("ran out of memory (address-space limit)")
        return Outcome(
            returncode=returncode,
            timed_out=watch.wall_exceeded or cpu_exceeded or watch.check_exceeded,
            memory_exceeded=memory_exceeded,
            signal=sig,
            stdout=out_t.value(),
            stderr=stderr,
            wall_s=wall,
            cpu_s=cpu_used,
            cpu_exceeded=cpu_exceeded,
            wall_exceeded=watch.wall_exceeded,
            check_exceeded=watch.check_exceeded,
            output_truncated=out_t.total > max_output_bytes or err_t.total > max_output_bytes,
            leftovers_killed=int(report.get("leftovers", 0)) + killed,
            protected_writes=[str(p) for p in report.get("protected_writes", [])][:20],
            notes=notes,
        )
    finally:
        for fd in (status_r, status_w):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if uid is not None:
            with contextlib.suppress(OSError):
                _chown_tree(cwd, 0, 0)
            _release_uid(uid)
