"""Stop 57: kernel memory that no limit saw, and a gradebook locked as the grading starts.

* Socket and pipe buffers are kernel memory outside every resident set: a run that filled 10 000 socketpairs took
  1.9 GB of the machine past its 512 MiB limit (and then timed out with the honest part's score). Each one a run
  holds past `sandbox.BUFFERS_FREE` now counts as memory at the most it may hold, and ``RLIMIT_NOFILE`` bounds the
  descriptors of each process (`sandbox.NOFILE_LIMIT`).
* System V message queues are kernel memory too: 32 000 queues of 16 KiB, 500 MB per run's IPC namespace, unseen.
  The run's namespace now allows `_launcher.MSG_QUEUES`.
* A gradebook that another program (formgrader, nbgrader) held locked for over SQLite's 5 s as the grading started
  was graded without the roster: grades.csv silently lost its ``missing`` rows. The roster is now read again as the
  grades are written into that gradebook (`pipeline.roster_now`), with one note on stderr.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from decodesched.grader import _launcher, limits, pipeline, sandbox, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.course import build_course, grade_folder, tool_env  # noqa: E402

SANDBOX = pytest.mark.skipif(os.geteuid() != 0 and not sandbox.userns_available(),
                             reason="needs root or user namespaces")

# Socketpairs, each send buffer raised as far as an unprivileged process may and filled, then held.
SOCKETS = '''
import socket as _socket
_held = []
def _fill_sockets(pairs, sndbuf=1 << 20):
    for _ in range(pairs):
        try:
            _a, _b = _socket.socketpair()
        except OSError:
            return
        _a.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDBUF, sndbuf)
        _a.setblocking(False)
        _held.append((_a, _b))
        try:
            while True:
                _a.send(bytes(65536))
        except OSError:
            pass
'''


def _run(tmp_path, code, **kw):
    (tmp_path / "x.py").write_text(code)
    args = dict(cwd=tmp_path, timeout_s=30, cpu_s=20, memory_mb=200)
    args.update(kw)
    return sandbox.run_isolated([sys.executable, "-I", "-S", "x.py"], **args)


def test_socket_buffers_a_run_holds_count_as_memory(tmp_path):
    # 200 socketpairs of 2 MiB each: about 400 MiB of kernel memory against a 200 MiB limit
    out = _run(tmp_path, SOCKETS + "import time\n_fill_sockets(200)\ntime.sleep(8)\nprint('not stopped')\n")
    assert out.memory_exceeded and b"not stopped" not in out.stdout, (out.notes, out.stderr[-500:])
    assert any("socket and pipe buffers" in n for n in out.notes), out.notes


def test_a_few_sockets_and_pipes_are_no_memory(tmp_path):
    # what an honest kernel run holds (22 sockets and 9 pipes in the kernel, 10 sockets in nbgrader) is not counted
    code = (SOCKETS + "import os\n_fill_sockets(20)\n_pipes = [os.pipe() for _ in range(12)]\n"
            "print('done', len(_held))\n")
    out = _run(tmp_path, code)
    assert not out.memory_exceeded and b"done 20" in out.stdout, (out.notes, out.stderr[-500:])


def test_each_process_of_a_run_has_a_bounded_number_of_descriptors(tmp_path):
    code = ("import os, resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE))\nfds = []\ntry:\n"
            "    while len(fds) < 100000:\n        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
            "except OSError as exc:\n    print('refused', exc.errno, len(fds) < 2000)\n")
    out = _run(tmp_path, code)
    lines = out.stdout.decode().split("\n")
    assert lines[0] == str((sandbox.NOFILE_LIMIT, sandbox.NOFILE_LIMIT)), out.stdout
    assert lines[1] == "refused 24 True", out.stdout  # EMFILE


@SANDBOX
def test_system_v_message_queues_of_a_run_are_bounded(tmp_path):
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nmade = 0\n"
            "while made < 40000 and libc.msgget(0, 0o1000 | 0o600) >= 0:\n    made += 1\nprint(made)\n")
    out = _run(tmp_path, code)
    assert out.stdout.strip() == str(_launcher.MSG_QUEUES).encode(), (out.stdout, out.stderr[-500:])


@SANDBOX
def test_a_solution_that_fills_socket_buffers_in_a_check_is_memory_and_earns_no_more():
    small = limits.Limits(cpu_s=30, memory_mb=256)
    attack = attacks.honest_source() + SOCKETS + '''
_honest_step = DecodeSchedulerSim.step
def _step(self):
    if self.clock >= 20:
        _fill_sockets(200)
    return _honest_step(self)
DecodeSchedulerSim.step = _step
'''
    cheat = verdict.verdict_for_source(attack, limits=small, shrink_failures=False)
    honest = verdict.verdict_for_source(attacks.honest_source(), limits=small, shrink_failures=False)
    assert cheat.status == "memory", (cheat.status, cheat.notes[:3])
    assert cheat.total <= honest.total


# --- with the real nbgrader ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_course(tmp_path_factory.mktemp("stop57"))


def _folder(folder: Path, release: Path, sources: dict) -> Path:
    folder.mkdir(parents=True)
    rel = json.loads(release.read_text(encoding="utf-8"))
    for sid, source in sources.items():
        (folder / f"{sid}.ipynb").write_text(json.dumps(attacks._with_solution(rel, source)), encoding="utf-8")
    return folder


@SANDBOX
@pytest.mark.slow
def test_real_kernels_run_under_the_descriptor_limit_and_a_socket_bomb_in_the_kernel_is_memory(built, tmp_path):
    # 800 sockets: past BUFFERS_FREE at 1 MiB each (the least `buffer_bytes` is, the default pipe-max-size) they
    # are over the limit wherever the test runs; about 200 MiB of kernel memory in fact
    bomb = attacks.reference_source() + SOCKETS + f"if {attacks.IN_KERNEL}:\n    _fill_sockets(400, 1 << 17)\n"
    subs = _folder(tmp_path / "subs", built[1], {"alice": attacks.reference_source(), "mallory": bomb})
    rows = grade_folder(subs, built[0], tmp_path / "out", "--memory-mb", "600")["rows"]
    assert (rows["alice"]["status"], rows["alice"]["score"]) == ("graded", "100")
    assert rows["mallory"]["status"] == "memory", rows["mallory"]


def test_a_gradebook_locked_as_the_grading_starts_still_gets_its_missing_rows(built, tmp_path, monkeypatch, capsys):
    course = tmp_path / "course"
    shutil.copytree(built[0], course)
    subprocess.run([sys.executable, "-m", "nbgrader", "db", "student", "add", "zoe"], cwd=course, env=tool_env(),
                   capture_output=True, check=True, timeout=300)
    real_open = pipeline.open_course

    def open_while_locked(root):  # formgrader writing the gradebook for over SQLite's 5 s as the grading starts
        con = sqlite3.connect(course / "gradebook.db")
        try:
            con.execute("BEGIN EXCLUSIVE")
            return real_open(root)
        finally:
            con.rollback()
            con.close()

    monkeypatch.setattr(pipeline, "open_course", open_while_locked)
    subs = _folder(tmp_path / "subs", built[1], {"alice": attacks.reference_source()})
    out = tmp_path / "out"
    missing: list = []
    pipeline.grade(subs, out, course=course, options=pipeline.Options(run_nbgrader=False, jobs=1, progress=False),
                   missing=missing)
    assert [r.student_id for r in missing] == ["zoe"]  # (for the command's summary line)
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        rows = {r["student_id"]: (r["status"], r["score"]) for r in csv.DictReader(fh)}
    assert rows == {"alice": ("graded", "100"), "zoe": ("missing", "0")}
    err = capsys.readouterr().err
    assert "is locked by another program" in err and "handed in nothing" in err, err
