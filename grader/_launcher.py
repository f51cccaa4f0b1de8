"""Sandbox launcher: the process that stands between the grader and untrusted code.

Stdlib only; run as ``python -I -S _launcher.py SPEC_JSON STATUS_FD``. It is started by
`decodesched.grader.sandbox.run_isolated` as the leader of a new session. It

1. (as root, or without root in a user namespace of its own, when asked) enters a private mount
   namespace and a System V IPC namespace (`_private_ipc`), covers every non-system top-level folder
   with an empty one, binds back what the command needs (its folder writable, the interpreter and
   the venv read-only) and mounts a trap tmpfs over every path in ``hide`` (the course, the
   gradebook, other students, the output folder);
2. makes itself a *child subreaper*, so every orphaned descendant of the untrusted command is
   re-parented to this launcher instead of init, and can be found and killed;
3. forks; the child sets the resource limits, drops to the sandbox uid/gid (as root), moves
   into ``cwd`` and execs the command with the scrubbed environment and the descriptors of
   ``pass_fds`` (which the launcher itself then closes);
4. waits for the command, then kills every descendant still alive (background processes that
   would outlive the kernel), reaps them, and writes one JSON status line to STATUS_FD:
   ``{"returncode": int|None, "signal": int|None, "cpu_s": float, "leftovers": int}``.

On SIGTERM/SIGINT/SIGHUP it kills the whole tree too.  The grader does not trust this file's
report alone: it also kills the process group and scans /proc for the submission's marker.
"""

import ctypes
import ctypes.util
import functools
import json
import os
import resource
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_PDEATHSIG = 1
CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_RELATIME = 1 << 21
# All the covers of `_cover` together: at most this much data and this many files.
COVER_OPTIONS = b"size=512m,nr_inodes=65536,mode=0755"
SHM_BYTES = 64 * 1024 * 1024  # System V shared memory of one run, all segments together (`_private_ipc`)
# System V message queues of one run (`_private_ipc`): each holds msgmnb (16 KiB) of kernel memory, and the default
# 32 000 queues held 500 MB that no limit saw; 16 hold 256 KiB.
MSG_QUEUES = 16


@functools.lru_cache(maxsize=1)
def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _children(pid):
    """Direct children of `pid` (pids whose parent is `pid`), from /proc."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        rest = stat[stat.rfind(b")") + 2:].split()
        if len(rest) > 1 and int(rest[1]) == pid:
            out.append(int(name))
    return out


def _kill_tree(me):
    """Kill and reap every descendant. Orphans re-parent to us (subreaper), so loop until none."""
    killed = 0
    for _ in range(10000):
        kids = _children(me)
        if not kids:
            break
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
    # reap anything left over
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    return killed


def _unshare(user=False):
    """A private mount namespace; with `user` (no root), inside a new user namespace that maps only our
    own uid and gid, which is what lets an unprivileged process mount there."""
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWNS | (CLONE_NEWUSER if user else 0)) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS{}) failed".format(" | CLONE_NEWUSER" if user else ""))
    if user:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate / failed")


def _private_network():
    """A network namespace of the command's own, with only its loopback up (nbgrader talks to its kernel
    over 127.0.0.1): no port another run holds, and no socket another run serves (the abstract UNIX
    sockets live in the network namespace), can reach or starve this one. Best effort, as before it existed."""
    import fcntl
    import socket
    import struct

    if _libc().unshare(CLONE_NEWNET) != 0:
        return
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            flags = struct.unpack("16sh", fcntl.ioctl(s, siocgifflags, struct.pack("16sh", b"lo", 0)))[1]
            fcntl.ioctl(s, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))
    except OSError:
        pass


def _private_ipc():
    """A System V IPC namespace of the command's own. Its shared memory segments are RAM that no process's
    resident memory shows and that outlives every process; here they die with the run, and hold SHM_BYTES
    at most where the namespace's limits can be set (as root; in a user namespace, on recent kernels), as its
    message queues (kernel memory too) are MSG_QUEUES at most."""
    if _libc().unshare(CLONE_NEWIPC) != 0:
        return  # best effort: as before this namespace existed
    for name, value in (("shmmax", SHM_BYTES), ("shmall", SHM_BYTES // os.sysconf("SC_PAGE_SIZE")),
                        ("msgmni", MSG_QUEUES)):
        try:
            with open(f"/proc/sys/kernel/{name}", "w") as fh:
                fh.write(str(value))
        except OSError:
            pass


def _hide(paths, kinds):
    """Cover each hidden folder with an empty, *writable* trap tmpfs; hidden files with /dev/null.

    The folder's real content is invisible. Anything the command writes lands in the trap, where
    `_trap_contents` finds it afterwards: evidence of a write to a protected place.
    """
    libc = _libc()
    traps = []
    for path in sorted(paths):
        if any(path.startswith(t.rstrip("/") + "/") for t in traps):
            continue  # already out of sight under an outer trap (and making it there would spring it)
        bpath = os.fsencode(path)
        if kinds.get(path) == "dir":
            os.makedirs(path, mode=0o755, exist_ok=True)  # it may be gone under a private /tmp
            rc = libc.mount(b"tmpfs", bpath, b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=1m,nr_inodes=256,mode=1777")
            if rc == 0:
                traps.append(path)
        elif kinds.get(path) == "file" and os.path.exists(path):
            rc = libc.mount(b"/dev/null", bpath, None, MS_BIND, None)
            if rc == 0:
                libc.mount(b"none", bpath, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
        else:
            continue
        if rc != 0:
            raise OSError(ctypes.get_errno(), f"could not hide {path}")
    return traps


def _trap_contents(traps, limit=20):
    found = []
    for trap in traps:
        for dirpath, dirnames, filenames in os.walk(trap):
            for name in sorted(dirnames + filenames):
                found.append(os.path.join(dirpath, name))
                if len(found) >= limit:
                    return found
    return found


def _expose(paths):
    """Make `paths` reachable for an unprivileged uid inside our private mount namespace.

    The interpreter may live under a 0700 directory (e.g. pyenv under /root). For the first
    ancestor that others cannot traverse, we cover it with an empty tmpfs (which also hides the
    rest of it, e.g. root's home) and bind-mount back only the child on the way to `path`.
    """
    libc = _libc()
    for path in paths:
        parts = os.path.abspath(path).split("/")[1:]
        cur = "/"
        for i, part in enumerate(parts[:-1]):
            cur = os.path.join(cur, part)
            try:
                mode = os.stat(cur).st_mode
            except OSError:
                break
            if mode & 0o001:
                continue
            child = os.path.join(cur, parts[i + 1])
            fd = os.open(child, os.O_PATH)
            try:
                if libc.mount(b"tmpfs", os.fsencode(cur), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64k,mode=0755") != 0:
                    raise OSError(ctypes.get_errno(), f"could not cover {cur}")
                if os.path.isdir(f"/proc/self/fd/{fd}"):
                    os.mkdir(child, 0o755)
                else:
                    open(child, "w").close()
                src = os.fsencode(f"/proc/self/fd/{fd}")
                if libc.mount(src, os.fsencode(child), None, MS_BIND | MS_REC, None) != 0:
                    raise OSError(ctypes.get_errno(), f"could not bind {child}")
                libc.mount(b"none", os.fsencode(cur), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
            finally:
                os.close(fd)


def _bind_readonly(path):
    """Make the bind mount at `path` read-only, keeping the flags it has (a user namespace may not clear them)."""
    has = os.statvfs(path).f_flag
    kept = 0
    for st, ms in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                   (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME)):
        kept |= ms if has & st else 0
    if _libc().mount(b"none", os.fsencode(path), None, MS_BIND | MS_REMOUNT | MS_RDONLY | kept, None) != 0:
        raise OSError(ctypes.get_errno(), f"could not make {path} read-only")


def _new_pid_namespace(libc):
    """The next child forked is process 1 of a PID namespace of its own: no process outside it can be
    named, so the command cannot signal the grader's processes (same uid without root), not even with
    ``kill(-1)``; when it ends, the kernel kills every process left in it."""
    if libc.unshare(CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID) failed")


def _drop_capabilities():
    """No capability left in this process (what the user namespace gave the launcher), nor gained by exec."""
    libc = _libc()
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _cover(dirs, keep, writable=()):
    """Cover each folder of `dirs` (every non-system top-level folder, and /dev/shm) with a fresh, empty,
    writable folder.

    Whatever is there (other students, other courses, copies of the repository, what other runs left
    in /tmp) disappears for the command; the paths in `keep` (its own working folder, the interpreter,
    the venv) are bind-mounted back at the same place, read-only but for those in `writable`.  The
    covers are folders of one tmpfs (COVER_OPTIONS: 512 MiB), bind-mounted in place, so that what the
    command can write into all of them together (RAM, which the memory watchdog does not see) is
    bounded once, not once per folder.
    """
    libc = _libc()
    dirs = [d for d in dirs if os.path.isdir(d) and not os.path.islink(d)]
    if not dirs:
        return
    # Every path to bind back is opened before anything is covered (the first cover hides dirs[0]).
    fds = [(k, os.open(k, os.O_PATH)) for k in sorted(set(keep))
           if os.path.exists(k) and any(k == d or k.startswith(d.rstrip("/") + "/") for d in dirs)]
    try:
        base = dirs[0]
        if libc.mount(b"tmpfs", os.fsencode(base), b"tmpfs", MS_NOSUID | MS_NODEV, COVER_OPTIONS) != 0:
            raise OSError(ctypes.get_errno(), f"could not cover {base}")
        covers = []
        for i in range(len(dirs)):
            c = os.path.join(base, f".cover{i}")
            os.mkdir(c)
            os.chmod(c, 0o1777)
            covers.append(c)
        # dirs[0] last: its bind hides the tmpfs's root and with it the other covers' source paths.
        for i in list(range(1, len(dirs))) + [0]:
            d = os.fsencode(dirs[i])
            if libc.mount(os.fsencode(covers[i]), d, None, MS_BIND, None) != 0:
                raise OSError(ctypes.get_errno(), f"could not cover {dirs[i]}")
            libc.mount(b"none", d, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV, None)
        for k, fd in fds:
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(k, mode=0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(k), mode=0o755, exist_ok=True)
                open(k, "w").close()
            if libc.mount(os.fsencode(f"/proc/self/fd/{fd}"), os.fsencode(k), None, MS_BIND | MS_REC, None) != 0:
                raise OSError(ctypes.get_errno(), f"could not bind {k}")
            if k not in writable:
                _bind_readonly(k)
    finally:
        for _, fd in fds:
            os.close(fd)


def _exec(spec):
    """Start the untrusted command: replace this (sandboxed, limited) process with it."""
    os.execvpe(spec["argv"][0], spec["argv"], spec["env"])


def launch(spec, status_fd, start=_exec):
    """Everything above, in this process (which must lead its own session); never returns.

    `start(spec)` runs in the sandboxed child once the limits and the uid are in place: by default it
    execs ``spec["argv"]``; the fork server (`forkserver.py`) passes one that runs nbgrader in-process.
    """
    me = os.getpid()
    traps = []
    userns = spec.get("uid") is None and spec.get("userns")
    if spec.get("uid") is not None or userns:  # a private mount namespace (root, or a user namespace)
        hide = spec.get("hide", [])
        kinds = {p: ("dir" if os.path.isdir(p) else "file" if os.path.exists(p) else None) for p in hide}
        _unshare(user=userns)
        _private_ipc()
        _private_network()
        _cover(spec.get("cover", []), [spec["cwd"]] + spec.get("expose", []), writable=[spec["cwd"]])
        traps = _hide(hide, kinds)
        _expose(spec.get("expose", []))
    _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def on_signal(signum, frame):
        _kill_tree(me)
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if userns:
        _new_pid_namespace(_libc())  # nothing may fork between this and the command's fork

    pid = os.fork()
    if pid == 0:  # the untrusted command
        try:
            if userns:  # process 1 of its namespace: it and everything in it die with this launcher
                _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                # A process group of its own: its parent cannot be named (getppid() is 0), and
                # kill(0) would otherwise reach this launcher's group.  Now it reaches the command's
                # own processes only, and process 1 ignores its own SIGKILL, as under root the
                # command's kill(parent) is refused: the same run either way.
                os.setpgid(0, 0)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            os.close(status_fd)
            if userns:
                _drop_capabilities()
            for name, (soft, hard) in spec["rlimits"].items():
                resource.setrlimit(getattr(resource, name), (soft, hard))
            if spec.get("uid") is not None:
                os.setgroups([])
                os.setgid(spec["gid"])
                os.setuid(spec["uid"])
                nproc = spec.get("nproc")
                if nproc:
                    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            os.chdir(spec["cwd"])
            os.umask(0o077)
            start(spec)
            os._exit(0)
        except SystemExit as exc:
            os._exit(exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1))
        except BaseException as exc:  # noqa: BLE001 - report and die, never fall back to our code
            try:
                os.write(2, f"sandbox: could not start {spec['argv'][0]!r}: {exc}\n".encode())
            finally:
                os._exit(127)

    for fd in spec.get("pass_fds", []):  # the command's channels (`run_isolated(pass_fds=...)`), not ours
        try:
            os.close(fd)
        except OSError:
            pass
    returncode = sig = None
    cpu_s = 0.0
    while True:
        try:
            _, status, usage = os.wait4(pid, 0)
            break
        except InterruptedError:
            continue
    cpu_s = usage.ru_utime + usage.ru_stime
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
    else:
        returncode = os.WEXITSTATUS(status)
    leftovers = _kill_tree(me)
    report = json.dumps({"returncode": returncode, "signal": sig, "cpu_s": cpu_s, "leftovers": leftovers,
                         "protected_writes": _trap_contents(traps)})
    try:
        os.write(status_fd, report.encode() + b"\n")
    except OSError:
        pass
    os._exit(0)


def probe_userns():
    """Exit 0 when this process can make a user and mount namespace, mount a tmpfs there (what a grader
    without root needs for the hidden folders and the covers) and start a PID namespace, else 1."""
    try:
        _unshare(user=True)
        libc = _libc()
        if libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64k") != 0:
            raise OSError(ctypes.get_errno(), "mount failed")
        _new_pid_namespace(libc)
        pid = os.fork()
        if pid == 0:
            _drop_capabilities()
            os._exit(0 if os.getpid() == 1 else 1)
        _, status = os.waitpid(pid, 0)
    except OSError:
        os._exit(1)
    os._exit(0 if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else 1)


def main():
    if sys.argv[1:] == ["--probe-userns"]:
        probe_userns()
    spec = json.loads(sys.argv[1])
    status_fd = int(sys.argv[2])
    os.set_inheritable(status_fd, False)
    launch(spec, status_fd)


if __name__ == "__main__":
    main()
