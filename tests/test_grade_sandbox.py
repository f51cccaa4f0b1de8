"""grader.sandbox.run_isolated: limits, kills, output caps and (as root) isolation."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from decodesched.grader import sandbox

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import nobody  # noqa: E402


def _run(tmp_path, code, **kw):
    (tmp_path / "x.py").write_text(code)
    args = dict(cwd=tmp_path, timeout_s=10, cpu_s=5, memory_mb=400)
    args.update(kw)
    return sandbox.run_isolated([sys.executable, "-I", "-S", "x.py"], **args)


def _procs_with(token: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if token.encode() in fh.read():
                    with open(f"/proc/{name}/stat", "rb") as st:
                        if b") Z" not in st.read():
                            out.append(int(name))
        except OSError:
            pass
    return out


def test_plain_run_returns_output_and_scrubbed_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/should/not/leak")
    monkeypatch.setenv("SECRET_TOKEN", "abc")
    out = _run(tmp_path, "import os, sys\nprint('hi', os.environ.get('SECRET_TOKEN'), os.environ.get('PYTHONPATH'))\n"
                         "print(os.environ['DECODESCHED_SANDBOX'])\nsys.stderr.write('err')\n", marker="m-123")
    assert out.ok and out.returncode == 0 and out.signal is None
    assert out.stdout.splitlines() == [b"hi None None", b"m-123"]
    assert out.stderr == b"err"
    assert not out.timed_out and not out.memory_exceeded


def test_exit_code_and_signal_are_reported(tmp_path):
    assert _run(tmp_path, "import os; os._exit(7)").returncode == 7
    seg = _run(tmp_path, "import ctypes; ctypes.string_at(0)")
    assert seg.signal == signal.SIGSEGV and seg.returncode is None and not seg.ok


def test_loop_swallowing_interrupts_is_killed_at_the_wall_clock(tmp_path):
    start = time.monotonic()
    out = _run(tmp_path, "import time\nwhile True:\n  try:\n    time.sleep(0.05)\n  except BaseException:\n    pass\n",
               timeout_s=1.5)
    assert out.timed_out and not out.ok
    # Killed at the wall clock, not never: the loop uses no CPU, so only the 1.5 s wall clock ends it.
    # The bound is loose because starting the sandbox on a busy machine takes seconds (11 s under a
    # load of 8 on 2 cores).
    assert time.monotonic() - start < 60


def test_cpu_limit(tmp_path):
    out = _run(tmp_path, "while True: pass", cpu_s=1, timeout_s=20)
    assert out.timed_out and out.cpu_exceeded
    assert out.wall_s < 10


def test_address_space_limit_reports_memory(tmp_path):
    out = _run(tmp_path, "x = bytearray(2 * 1024**3)", memory_mb=300)
    assert out.memory_exceeded and not out.ok


def test_resident_memory_watchdog_without_address_space_limit(tmp_path):
    code = "hog = []\nwhile True:\n    hog.append(bytearray(32 * 1024 * 1024))\n"
    out = _run(tmp_path, code, memory_mb=200, address_space=False, timeout_s=30)
    assert out.memory_exceeded and out.returncode is None


@pytest.mark.parametrize("how", ["files", "deleted_but_open"])
def test_files_written_count_as_memory(tmp_path, how):
    # The run's folder is on /dev/shm: its files are RAM that no process's resident memory shows, and
    # RLIMIT_FSIZE bounds each file, not their number. 24 x 32 MiB against a 200 MiB limit.
    keep = "_held.append(fh); os.unlink(fh.name)" if how == "deleted_but_open" else "fh.close()"
    code = ("import os, time\n_held = []\nfor i in range(24):\n"
            "    fh = open(f'fill{i}', 'wb')\n    fh.write(bytes(32 * 2**20))\n    fh.flush()\n"
            f"    {keep}\n"
            "time.sleep(20)\nprint('not stopped')\n")
    out = _run(tmp_path, code, memory_mb=200, cpu_s=20, timeout_s=60)
    assert out.memory_exceeded and b"not stopped" not in out.stdout, (out.notes, out.stderr[-500:])
    assert out.wall_s < 15 and any("files written" in n for n in out.notes), out.notes


def test_too_many_files_count_as_memory(tmp_path):
    code = (f"import os, time\nos.mkdir('many')\nfor i in range({sandbox.MAX_FOLDER_ENTRIES + 1}):\n"
            "    open(f'many/{i}', 'w').close()\ntime.sleep(20)\n")
    out = _run(tmp_path, code, memory_mb=400, cpu_s=20, timeout_s=60)
    assert out.memory_exceeded and any(f"more than {sandbox.MAX_FOLDER_ENTRIES} files" in n for n in out.notes)


@pytest.mark.skipif(os.geteuid() != 0 and not sandbox.userns_available(), reason="needs root or user namespaces")
def test_system_v_shared_memory_is_bounded_and_dies_with_the_run(tmp_path):
    # Segments are RAM outside every resident set, and they used to outlive the run (until a reboot).
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
            "made = 0\nfor _ in range(4):\n    sid = libc.shmget(0, 48 << 20, 0o1000 | 0o600)\n"
            "    addr = libc.shmat(sid, None, 0) if sid >= 0 else None\n"
            "    if addr in (None, 2**64 - 1):\n        continue\n"
            "    ctypes.memset(addr, 1, 48 << 20)\n    libc.shmdt(ctypes.c_void_p(addr))\n    made += 1\n"
            "print(made)\n")
    with open("/proc/sysvipc/shm") as fh:
        before = fh.read()
    out = _run(tmp_path, code)
    assert out.ok, out.stderr[-500:]
    with open("/proc/sysvipc/shm") as fh:
        assert fh.read() == before
    if os.geteuid() == 0:  # the namespace's limits can be set
        assert out.stdout.strip() == b"1"


def test_passed_descriptors_reach_the_command_and_are_closed_after(tmp_path):
    read_end, write_end = os.pipe()
    out = _run(tmp_path, f"import os\nos.write({write_end}, b'through the pipe')\n", pass_fds=[write_end])
    assert out.ok, out.stderr[-500:]
    os.set_blocking(read_end, False)
    try:
        assert os.read(read_end, 100) == b"through the pipe"
        # EOF, not BlockingIOError: no copy of the write end is left, ours (run_isolated's) or the launcher's
        assert os.read(read_end, 100) == b""
    finally:
        os.close(read_end)


def test_background_processes_do_not_outlive_the_run(tmp_path):
    token = f"bg-{uuid.uuid4().hex}"
    code = (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.2)  # {token}'],"
        " start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execve('/bin/sleep', ['/bin/sleep', '1000', '{token}'], {{}})\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\nprint('parent done')\n"
    )
    out = _run(tmp_path, code)
    assert out.returncode == 0 and out.stdout.strip() == b"parent done"
    if os.geteuid() != 0 and sandbox.userns_available():
        # process 1 of its PID namespace: the kernel killed the rest with it, before the launcher looked
        assert out.leftovers_killed == 0 and _procs_with(token) == []
    else:
        assert out.leftovers_killed >= 2
    time.sleep(0.2)
    assert _procs_with(token) == []


def test_flooding_output_is_capped_without_deadlock(tmp_path):
    code = "import sys\nfor _ in range(400):\n    sys.stdout.write('x' * 100000)\n    sys.stderr.write('y' * 1000)\n"
    out = _run(tmp_path, code, max_output_bytes=50_000)
    assert out.returncode == 0
    assert len(out.stdout) == 50_000 and set(out.stdout) == {ord("x")}
    assert out.output_truncated


@pytest.mark.skipif(os.geteuid() != 0, reason="private uid and mount namespace need root")
def test_root_isolation_private_uid_hidden_paths_and_no_writes(tmp_path):
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    (secret_dir / "hidden.txt").write_text("hidden tests")
    protected = tmp_path / "protected"
    protected.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    code = (
        "import os\n"
        "print(os.getuid() != 0, os.getgid() != 0)\n"
        f"print(os.path.exists({str(secret_dir / 'hidden.txt')!r}))\n"
        "try:\n"
        f"    open({str(protected / 'pwned')!r}, 'w').write('x'); print('wrote')\n"
        "except OSError as e:\n"
        "    print('denied')\n"
        "open('mine.txt', 'w').write('ok'); print('own folder ok')\n"
        f"open({str(secret_dir / 'planted.txt')!r}, 'w').write('x'); print(os.listdir({str(secret_dir)!r}))\n"
        "try:\n"
        "    os.kill(1, 9); print('killed init?')\n"
        "except OSError:\n"
        "    print('no signal')\n"
    )
    (work / "x.py").write_text(code)
    out = sandbox.run_isolated([sys.executable, "-I", "-S", "x.py"], cwd=work, timeout_s=10, cpu_s=5,
                               memory_mb=400, hide=[secret_dir])
    assert out.stdout.decode().split("\n")[:6] == ["True True", "False", "denied", "own folder ok",
                                                     "['planted.txt']", "no signal"]
    assert not (protected / "pwned").exists()
    assert not (secret_dir / "planted.txt").exists()  # it landed in the trap, which lists it
    assert out.protected_writes == [str(secret_dir / "planted.txt")]
    assert (secret_dir / "hidden.txt").read_text() == "hidden tests"
    assert (work / "mine.txt").stat().st_uid == 0  # handed back to the grader after the run


@pytest.mark.skipif(os.geteuid() != 0, reason="private uid and mount namespace need root")
def test_covered_folders_are_empty_separate_and_share_one_bounded_tmpfs(tmp_path):
    # Every non-system top-level folder is a fresh writable folder; what a run can write into all of
    # them together (RAM: the memory watchdog does not see tmpfs pages) is bounded once, not per folder
    # (15 folders of 512 MiB each let one run hold 7.5 GiB).  Here 224 MiB go to each folder in turn.
    work = tmp_path / "work"
    work.mkdir()
    # what the sandbox binds back into the covers (run_isolated's `expose`): not listed as leftovers
    kept = [os.path.realpath(p) for p in (work, sys.prefix, sys.base_prefix)]
    kept.append(os.path.dirname(os.path.realpath(sys.executable)))
    code = (
        "import os\n"
        f"kept = {kept!r}\n"
        "def fresh(d):\n"
        "    return [n for n in os.listdir(d) if not any((k + '/').startswith(f'{d}/{n}/') for k in kept)]\n"
        "print(fresh('/tmp'), fresh('/var'))\n"
        "open('/tmp/a', 'w').write('x'); print(os.path.exists('/var/a'), os.path.exists('/dev/shm/a'))\n"
        "print(os.path.exists('x.py'))\n"
        "total = 0\n"
        "try:\n"
        "    for d in ('/tmp', '/var', '/dev/shm', '/opt', '/srv', '/mnt', '/home'):\n"
        "        for i in range(7):\n"
        "            with open(f'{d}/fill{i}', 'wb') as fh:\n"
        "                fh.write(bytes(32 * 2**20))\n"
        "            total += 32\n"
        "except OSError as exc:\n"
        "    print('full after', total, 'MiB', exc.errno)\n"
    )
    out = _run(work, code, timeout_s=60, cpu_s=30)
    lines = out.stdout.decode().split("\n")
    assert lines[:3] == ["[] []", "False False", "True"], (lines, out.stderr[-500:])
    assert lines[3].startswith("full after "), lines  # the writes ran out of room (not once per folder)
    full = lines[3].split()
    assert 256 <= int(full[2]) <= 1024 and full[4] == "28", lines  # errno 28: ENOSPC
    assert not any(p.name.startswith("fill") for p in Path("/tmp").iterdir())


def test_cpu_limit_counts_every_process_of_the_run(tmp_path):
    # Three processes, each far under RLIMIT_CPU on its own: together they break the 3 s budget.
    code = ("import subprocess, sys\n"
            "ps = [subprocess.Popen([sys.executable, '-I', '-S', '-c', 'while True: pass']) for _ in range(3)]\n"
            "[p.wait() for p in ps]\n")
    out = _run(tmp_path, code, cpu_s=3, timeout_s=120)
    assert out.timed_out and out.cpu_exceeded and not out.wall_exceeded
    assert out.cpu_s >= 3


def test_a_sleeper_is_stopped_by_the_wall_clock_backstop(tmp_path):
    out = _run(tmp_path, "import time\ntime.sleep(60)\n", cpu_s=5, timeout_s=1.5)
    assert out.timed_out and out.wall_exceeded and not out.cpu_exceeded


def test_fork_server_runs_are_sandboxed_like_fresh_ones(tmp_path):
    code = ("import os, sys\nprint(os.getsid(0) == os.getpid() or os.getsid(0), os.environ.get('DECODESCHED_SANDBOX'))\n"
            "print(os.getuid())\n")
    (tmp_path / "x.py").write_text(code)
    with sandbox.ForkServer("test-forkserver") as server:
        fresh = sandbox.run_isolated([sys.executable, "-I", "-S", "x.py"], cwd=tmp_path, timeout_s=30, cpu_s=5,
                                     memory_mb=400, marker="m-fresh")
        forked = sandbox.run_isolated([sys.executable, "-I", "-S", "x.py"], cwd=tmp_path, timeout_s=30, cpu_s=5,
                                      memory_mb=400, marker="m-forked", server=server)
        version = sandbox.run_isolated([sys.executable, "-m", "nbgrader", "--version"], cwd=tmp_path, timeout_s=60,
                                       cpu_s=20, memory_mb=1000, address_space=False, server=server)
        looping = sandbox.run_isolated([sys.executable, "-I", "-S", "-c", "while True: pass"], cwd=tmp_path,
                                       timeout_s=60, cpu_s=2, memory_mb=400, server=server)
    assert fresh.ok and forked.ok, (fresh.stderr, forked.stderr)
    assert fresh.stdout.split()[1] == b"m-fresh" and forked.stdout.split()[1] == b"m-forked"
    if os.geteuid() == 0:  # the private uid, not root, in both
        assert fresh.stdout.split()[2] != b"0" and forked.stdout.split()[2] != b"0"
    assert version.ok and version.stdout.strip(), version.stderr[-500:]  # nbgrader ran in the forked process
    assert looping.timed_out and looping.cpu_exceeded
    assert sandbox.find_sandboxed("test-forkserver") == [] and sandbox.find_sandboxed("m-forked") == []


def test_a_run_that_makes_no_progress_is_stopped_long_before_the_backstop(tmp_path):
    out = _run(tmp_path, "import time\nwhile True:\n    try:\n        time.sleep(600)\n    except BaseException:\n        pass\n",
               cpu_s=30, timeout_s=600)
    assert out.timed_out and out.wall_exceeded and not out.cpu_exceeded
    assert out.wall_s < sandbox.STALL_S * 4 and any("no progress" in n for n in out.notes)


def _nested_unmount(hidden_dir: str) -> str:
    """Python that makes a user and mount namespace of its own (root inside it), tries to unmount the
    trap over `hidden_dir` and the cover over /tmp, and prints whether it got in and what it sees."""
    return (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "uid, gid = os.getuid(), os.getgid()\n"
        "inside = libc.unshare(0x10000000 | 0x00020000) == 0\n"
        "if inside:\n"
        "    open('/proc/self/setgroups', 'w').write('deny')\n"
        "    open('/proc/self/uid_map', 'w').write(f'0 {uid} 1')\n"
        "    open('/proc/self/gid_map', 'w').write(f'0 {gid} 1')\n"
        f"    for target in ({hidden_dir!r}, '/tmp'):\n"
        "        libc.umount2(target.encode(), 2)\n"
        f"print(inside, sorted(os.listdir({hidden_dir!r})))\n"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="private uid and mount namespace need root")
def test_a_namespace_of_its_own_does_not_uncover_hidden_folders(tmp_path):
    """The mounts the sandbox made come into a namespace the command makes as one locked unit: root in
    its own user namespace, it can unmount neither a trap nor a cover."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "hidden.txt").write_text("hidden tests")
    work = tmp_path / "work"
    work.mkdir()
    out = _run(work, _nested_unmount(str(secret)), hide=[secret])
    assert out.stdout.decode().strip() == "True []", (out.stdout, out.stderr[-500:])


_NOBODY_PROBE = r"""
import json, os, sys
from pathlib import Path
from decodesched.grader import sandbox
base = Path(sys.argv[1])
secret, work, shared, other = base / "secret", base / "work", base / "shared", base / "other"
for d in (secret, work, shared, other):
    d.mkdir()
(secret / "hidden.txt").write_text("hidden tests")
(other / "left.txt").write_text("another run's file")
paths = {"secret": str(secret / "hidden.txt"), "other": str(other / "left.txt"), "shared": str(shared),
         "trap": str(secret / "planted.txt"), "venv": str(shared / "pwned"), "grader": os.getpid()}
code = (
    "import json, os\n"
    "def tries(path):\n"
    "    try:\n"
    "        open(path, 'w').write('x')\n"
    "        return 'wrote'\n"
    "    except OSError as exc:\n"
    "        return os.strerror(exc.errno)\n"
    "def signals(pid):\n"
    "    try:\n"
    "        os.kill(pid, 0)\n"
    "        return 'reached'\n"
    "    except OSError as exc:\n"
    "        return os.strerror(exc.errno)\n"
    f"p = {paths!r}\n"
    "caps = [ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('CapEff')][0]\n"
    "print(json.dumps({'uid': os.getuid(), 'caps': caps, 'secret': os.path.exists(p['secret']),\n"
    "                  'other': os.path.exists(p['other']), 'shared': os.path.isdir(p['shared']),\n"
    "                  'own': tries('mine.txt'), 'venv': tries(p['venv']), 'trap': tries(p['trap']),\n"
    "                  'pid': os.getpid(), 'grader': signals(p['grader'])}))\n"
)
(work / "x.py").write_text(code)
(work / "nested.py").write_text(sys.argv[2])
out = sandbox.run_isolated([sys.executable, "-I", "-S", "x.py"], cwd=work, timeout_s=30, cpu_s=10, memory_mb=400,
                           hide=[secret], expose=[shared])
nested = sandbox.run_isolated([sys.executable, "-I", "-S", "nested.py"], cwd=work, timeout_s=30, cpu_s=10,
                              memory_mb=400, hide=[secret])
print(json.dumps({"userns": sandbox.userns_available(), "seen": json.loads(out.stdout.decode() or "null"),
                  "nested": nested.stdout.decode().strip(),
                  "stderr": out.stderr.decode()[-500:], "protected_writes": out.protected_writes,
                  "planted": (secret / "planted.txt").exists(), "pwned": (shared / "pwned").exists(),
                  "mine": (work / "mine.txt").exists()}))
"""


@pytest.mark.skipif(nobody.available() is not None, reason=str(nobody.available()))
def test_without_root_a_user_namespace_hides_covers_and_binds_back_read_only():
    """A grader without root (uid 65534 here) isolates as root does, in a user namespace of its own:
    hidden folders are traps, other folders covered, the venv read-only, no capability left, and in
    a PID namespace of its own the grader's processes cannot be named (the same uid could signal them)."""
    base = nobody.workdir()
    try:
        proc = nobody.run(["-c", _NOBODY_PROBE, str(base), _nested_unmount(str(base / "secret"))], cwd=base)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        if not got["userns"]:
            pytest.skip("unprivileged user namespaces are not available on this machine")
        assert got["seen"] == {"uid": nobody.NOBODY, "caps": "0000000000000000", "secret": False, "other": False,
                               "shared": True, "own": "wrote", "venv": "Read-only file system", "trap": "wrote",
                               "pid": 1, "grader": "No such process"}, got
        assert got["protected_writes"] == [str(base / "secret" / "planted.txt")]
        assert got["nested"] == "True []", got  # its own namespace uncovers nothing
        assert (got["planted"], got["pwned"], got["mine"]) == (False, False, True)
    finally:
        nobody.cleanup(base)


@pytest.mark.skipif(os.geteuid() != 0 and not sandbox.userns_available(), reason="needs root or user namespaces")
def test_a_kernel_run_cannot_read_the_reference_even_where_python_s_prefix_is_bound_back(tmp_path):
    """Installed with pip, the package sits under sys.prefix, which every run binds back read-only for
    Python. The kernel run's hide list (`pipeline.default_hide`) left it out: a kernel read
    grader/solutions/reference.py and relayed it to its own verdict harness, a buggy solution scored 100
    (red-team finding). Here the package's folders are bound back as sys.prefix would be (`expose`)."""
    from decodesched.grader import observe, pipeline

    course = type("C", (), {"root": tmp_path / "course"})()
    course.root.mkdir()
    hide = pipeline.default_hide(course, tmp_path / "subs", tmp_path / "out")
    work = tmp_path / "work"
    work.mkdir()
    reference = Path(observe.__file__).resolve().parent / "solutions" / "reference.py"
    from decodesched import model as model_module

    model = Path(model_module.__file__).resolve()
    code = f"import os\nprint([os.path.exists(p) for p in ({str(reference)!r}, {str(model)!r})])\n"
    (work / "x.py").write_text(code)
    out = sandbox.run_isolated([sys.executable, "-I", "-S", "x.py"], cwd=work, timeout_s=20, cpu_s=10,
                               memory_mb=400, hide=hide, expose=observe.package_paths())
    assert reference.exists() and model.exists()
    assert out.stdout.decode().strip() == "[False, False]", (out.stdout, out.stderr[-2000:])


@pytest.mark.skipif(os.geteuid() != 0 and not sandbox.userns_available(), reason="needs root or user namespaces")
def test_each_run_has_a_network_of_its_own_with_loopback_up(tmp_path):
    """A red-team submission held every local port; an honest kernel run beside it could not start its
    kernel ('crashed'), and two runs of one submission talked over an abstract UNIX socket. Here the
    grader holds a port and serves an abstract socket; the run binds that very port, cannot reach the
    socket, and its loopback works (nbgrader talks to its kernel over 127.0.0.1)."""
    import socket

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    name = "\0decodesched-test-" + uuid.uuid4().hex
    served = socket.socket(socket.AF_UNIX)
    served.bind(name)
    served.listen()
    code = (
        "import socket\n"
        f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen()\n"
        "c = socket.create_connection(('127.0.0.1', " + str(port) + ")); print('port free, loopback up')\n"
        "try:\n"
        f"    socket.socket(socket.AF_UNIX).connect({name!r}); print('reached the grader')\n"
        "except OSError:\n"
        "    print('abstract socket unreachable')\n"
    )
    (tmp_path / "x.py").write_text(code)
    try:
        out = sandbox.run_isolated([sys.executable, "-I", "-S", "x.py"], cwd=tmp_path, timeout_s=20, cpu_s=10,
                                   memory_mb=400)
    finally:
        held.close()
        served.close()
    assert out.stdout.decode().split("\n")[:2] == ["port free, loopback up", "abstract socket unreachable"], \
        (out.stdout, out.stderr[-2000:])
