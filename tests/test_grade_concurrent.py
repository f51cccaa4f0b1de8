"""Two grading runs at once on one machine: as root their submissions never share a private uid.

The uids used to be ``UID_BASE + (pid % 10000) * 1000 + slot``: two graders whose pids agree mod 10 000 ran
submissions under one uid (one could signal, ptrace or read the other's). Each grading process now holds
its ranges alone (`sandbox._claim_uid_range`: an flock per range in `sandbox.UID_LOCK_DIR`). The children
below all claim to have pid 4242, so ranges chosen by pid alone would be one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from decodesched.grader import sandbox

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="private uids are used as root only")
FAKE_PID = 4242

# A grading process in miniature: argv[1] is the lock folder, argv[2] what to do; it prints one JSON line.
CHILD = r"""
import json, os, sys
from decodesched.grader import sandbox
sandbox.UID_LOCK_DIR = sys.argv[1]
os.getpid = lambda: 4242
if sys.argv[2] in ("claim", "fork"):
    sandbox.hold_uid_range()
    seen = {"ranges": sorted(sandbox._uid_ranges)}
    if sys.argv[2] == "fork":  # what a child forked without exec believes it holds
        r, w = os.pipe()
        if os.fork() == 0:
            os.write(w, json.dumps(sorted(sandbox._uid_ranges)).encode())
            os._exit(0)
        os.close(w)
        seen["child"] = json.loads(os.read(r, 4096))
    print(json.dumps(seen), flush=True)
else:  # "run": a sandboxed command that says which uid and gid it ran as
    out = sandbox.run_isolated([sys.executable, "-I", "-S", "-c", "import os; print(os.getuid(), os.getgid())"],
                               cwd=sys.argv[3], timeout_s=60, cpu_s=10, memory_mb=400)
    uid, gid = map(int, out.stdout.split())
    print(json.dumps({"uid": uid, "gid": gid}), flush=True)
sys.stdin.read()  # holds what it claimed until the test closes its stdin
"""


def _start(lock_dir, *args) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(lock_dir), *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        err = proc.stderr.read()
        _end(proc)
        raise AssertionError(err[-2000:])
    return proc, json.loads(line)


def _end(*procs) -> None:
    for proc in procs:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        proc.wait(60)
        proc.stdout.close()
        proc.stderr.close()


def _index(uid: int) -> int:
    return (uid - sandbox.UID_BASE) // sandbox.UID_RANGE


@needs_root
def test_two_graders_whose_pids_agree_run_submissions_under_disjoint_uids(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    locks = tmp_path / "locks"
    first, a = _start(locks, "run", tmp_path / "a")
    try:
        second, b = _start(locks, "run", tmp_path / "b")
        _end(second)
    finally:
        _end(first)
    assert a["uid"] != b["uid"], (a, b)  # (with uids by pid: both 1_904_242_000)
    for seen in (a, b):
        assert seen["gid"] == seen["uid"] and 0 <= _index(seen["uid"]) < sandbox.UID_RANGES
    assert _index(a["uid"]) != _index(b["uid"])


def test_concurrent_claims_are_disjoint_and_a_killed_graders_range_is_taken_again(tmp_path):
    locks = tmp_path / "locks"
    first, a = _start(locks, "claim")
    second, b = _start(locks, "claim")
    try:
        assert len(a["ranges"]) == len(b["ranges"]) == 1 and a["ranges"] != b["ranges"]
        first.kill()  # kill -9: no clean-up ran, the kernel drops its lock
        first.wait()
        third, c = _start(locks, "claim")
        _end(third)
    finally:
        _end(first, second)
    assert c["ranges"] == a["ranges"]  # the first choice for pid 4242 again: nothing leaked
    assert sorted(p.name for p in locks.iterdir()) == sorted(str(_index(r)) for r in a["ranges"] + b["ranges"])
    assert locks.stat().st_mode & 0o777 == 0o700


@needs_root
def test_a_range_in_which_a_process_still_lives_is_not_taken(tmp_path):
    # A grader killed with kill -9 can leave its submission running (its lock is gone, its uid is not).
    locks = tmp_path / "locks"
    first, a = _start(locks, "claim")
    _end(first)
    left = a["ranges"][0] + 7
    orphan = subprocess.Popen(["sleep", "120"], user=left, group=left, extra_groups=[], cwd="/",
                              stdin=subprocess.DEVNULL)
    try:
        second, b = _start(locks, "claim")
        _end(second)
    finally:
        orphan.kill()
        orphan.wait()
    assert b["ranges"] != a["ranges"]
    third, c = _start(locks, "claim")  # once it is gone, the range is free again
    _end(third)
    assert c["ranges"] == a["ranges"]


def _hostile(kind: str, tmp_path: Path) -> Path:
    path = tmp_path / "locks"
    if kind == "link to a good folder":
        (tmp_path / "real").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "real")
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "file":
        path.write_text("")
    elif kind == "world-writable folder":
        path.mkdir()
        path.chmod(0o777)
    elif kind == "another user's folder":
        path.mkdir(mode=0o700)
        os.chown(path, 65534, 65534)
    return path


@pytest.mark.parametrize("kind", ["link to a good folder", "dangling link", "file", "world-writable folder",
                                  pytest.param("another user's folder", marks=needs_root)])
def test_a_hostile_lock_folder_stops_the_grading_with_one_line(tmp_path, monkeypatch, kind):
    path = _hostile(kind, tmp_path)
    monkeypatch.setattr(sandbox, "UID_LOCK_DIR", str(path))
    monkeypatch.setattr(sandbox, "_uid_ranges", {})
    with pytest.raises(sandbox.UserError) as exc:
        sandbox.hold_uid_range()
    assert str(path) in str(exc.value) and "\n" not in str(exc.value) and "remove it" in str(exc.value)
    assert sandbox._uid_ranges == {}
    assert not (tmp_path / "nowhere").exists() and not any((tmp_path / "real").glob("*"))


@needs_root
def test_with_a_hostile_lock_folder_no_command_runs(tmp_path, monkeypatch):
    # Never back to shared uids: the run is refused before anything starts.
    monkeypatch.setattr(sandbox, "UID_LOCK_DIR", str(_hostile("link to a good folder", tmp_path)))
    monkeypatch.setattr(sandbox, "_uid_ranges", {})
    (tmp_path / "work").mkdir()
    with pytest.raises(sandbox.UserError):
        sandbox.run_isolated(["/bin/sh", "-c", "echo ran > ran"], cwd=tmp_path / "work", timeout_s=30, cpu_s=5,
                             memory_mb=400)
    assert not (tmp_path / "work" / "ran").exists()


@needs_root
def test_decodesched_grade_exits_2_with_one_line_when_no_uid_range_can_be_had(tmp_path):
    from decodesched.grader import spec

    course = tmp_path / "course"
    release = course / "release" / spec.ASSIGNMENT / spec.NOTEBOOK
    release.parent.mkdir(parents=True)
    shutil.copy(spec.SOURCE_NOTEBOOK, release)
    shutil.copy(spec.COURSE_ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    import sqlite3

    with contextlib.closing(sqlite3.connect(course / "gradebook.db")) as con, con:  # (what the roster read needs)
        con.executescript("CREATE TABLE assignment (id TEXT, name TEXT); CREATE TABLE notebook (id TEXT, name TEXT, "
                          "assignment_id TEXT); CREATE TABLE student (id TEXT); CREATE TABLE submitted_assignment "
                          "(student_id TEXT, assignment_id TEXT);")
        con.execute("INSERT INTO assignment VALUES ('a', ?)", (spec.ASSIGNMENT,))
        con.execute("INSERT INTO notebook VALUES ('n', ?, 'a')", (spec.NOTEBOOK[: -len(".ipynb")],))
    (tmp_path / "subs").mkdir()
    shutil.copy(release, tmp_path / "subs" / "alice.ipynb")
    locks = _hostile("world-writable folder", tmp_path)
    code = ("import sys; from decodesched.grader import sandbox; from decodesched import cli; "
            "sandbox.UID_LOCK_DIR = sys.argv[1]; sys.exit(cli.main(sys.argv[2:]))")
    proc = subprocess.run([sys.executable, "-c", code, str(locks), "grade", str(tmp_path / "subs"), "--out",
                           str(tmp_path / "out"), "--course", str(course), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(locks) in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_link_planted_as_a_lock_file_is_never_followed(tmp_path, monkeypatch):
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    (locks / str(FAKE_PID)).symlink_to(tmp_path / "victim")
    monkeypatch.setattr(sandbox, "UID_LOCK_DIR", str(locks))
    monkeypatch.setattr(sandbox, "_uid_ranges", {})
    monkeypatch.setattr(os, "getpid", lambda: FAKE_PID)
    sandbox.hold_uid_range()
    try:
        assert [_index(base) for base in sandbox._uid_ranges] == [FAKE_PID + 1]
        assert not (tmp_path / "victim").exists()
    finally:
        sandbox._close_all(list(sandbox._uid_ranges.values()))


def test_when_every_range_is_held_the_grading_stops_with_one_line(tmp_path, monkeypatch):
    import fcntl

    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    held = []
    for index in range(3):
        held.append(os.open(locks / str(index), os.O_RDWR | os.O_CREAT, 0o600))
        fcntl.flock(held[-1], fcntl.LOCK_EX)
    monkeypatch.setattr(sandbox, "UID_LOCK_DIR", str(locks))
    monkeypatch.setattr(sandbox, "UID_RANGES", 3)
    monkeypatch.setattr(sandbox, "_uid_ranges", {})
    try:
        with pytest.raises(sandbox.UserError, match="all 3 ranges of sandbox uids are held"):
            sandbox.hold_uid_range()
    finally:
        sandbox._close_all(held)
    assert sandbox._uid_ranges == {}


def test_a_forked_child_does_not_inherit_the_ranges_of_its_parent(tmp_path):
    proc, seen = _start(tmp_path / "locks", "fork")
    _end(proc)
    assert seen["child"] == [] and len(seen["ranges"]) == 1


# As an ordinary user with user namespaces (run as uid 65534 from root): two runs share the grader's uid, and
# still neither reaches the other. A grading process that starts run B, then run A, which is told B's pid.
USERNS_GRADER = r"""
import os, sys, threading, time
from decodesched.grader import sandbox
assert os.getuid() != 0 and sandbox.userns_available()
work = sys.argv[1]
for name in ("a", "b"):
    os.mkdir(os.path.join(work, name))
args = dict(timeout_s=120, cpu_s=5, memory_mb=400)
sleeper = [sys.executable, "-I", "-S", "-c", "import time; time.sleep(60)"]
t = threading.Thread(target=sandbox.run_isolated, args=(sleeper,), kwargs=dict(cwd=os.path.join(work, "b"),
                     marker="run-b", **args))
t.start()
deadline = time.monotonic() + 60
while not sandbox.find_marked("run-b") and time.monotonic() < deadline:
    time.sleep(0.05)
probe = '''
import os, sys
pid = int(sys.argv[1])
for what, reach in (("cwd", lambda: os.listdir(f"/proc/{pid}/cwd")), ("root", lambda: os.listdir(f"/proc/{pid}/root")),
                    ("environ", lambda: open(f"/proc/{pid}/environ", "rb").read()),
                    ("mem", lambda: open(f"/proc/{pid}/mem", "rb")), ("kill", lambda: os.kill(pid, 0))):
    try:
        reach()
        print(what, "reached")
    except OSError as exc:
        print(what, type(exc).__name__)
'''
out = sandbox.run_isolated([sys.executable, "-I", "-S", "-c", probe, str(sandbox.find_marked("run-b")[0])],
                           cwd=os.path.join(work, "a"), **args)
sandbox.STOPPING.set()
t.join()
print(out.stdout.decode(), end="")
"""


@pytest.mark.skipif(not ROOT, reason="needs root (to become another user)")
def test_with_user_namespaces_two_runs_share_a_uid_but_cannot_reach_each_other(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from grader_attacks import nobody

    work = nobody.workdir()
    try:
        (work / "grader.py").write_text(USERNS_GRADER)
        nobody.give(work)
        probe = nobody.run([str(work / "grader.py"), str(work)], cwd=work, timeout=300)
        if "userns_available" in probe.stderr:
            pytest.skip("user namespaces are off here")
        assert probe.returncode == 0, probe.stderr[-2000:]
        seen = dict(line.split() for line in probe.stdout.splitlines())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert seen == {"cwd": "PermissionError", "root": "PermissionError", "environ": "PermissionError",
                    "mem": "PermissionError", "kill": "ProcessLookupError"}
