"""The grader and a tired instructor, round two of stop 60: `decodesched assignment build` run while a grading
starts, or while another build runs, on one course.

A build moves the release aside, makes a new one and checks it (a minute). A grading started then read no release
and said "the assignment is not built; run `decodesched assignment build`" (it was being built), or read the new
release before its checks; a second build put the first one's release back, ran nbgrader beside it, and the first
then removed what the second had kept aside. Now the build holds the course's build lock and a grading shares it
while it reads the course (`course.build_locked`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from decodesched.errors import UserError
from decodesched.grader import course as course_mod
from decodesched.grader import release, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks.course import tool_env  # noqa: E402

# A build whose nbgrader step waits until GO exists, then fails: the build puts back the release it replaced.
_PAUSED_BUILD = textwrap.dedent("""\
    import subprocess, sys, time
    from pathlib import Path
    from decodesched.errors import UserError
    from decodesched.grader import release

    course, started, go = map(Path, sys.argv[1:4])

    def paused(args, cwd, timeout=600):
        started.touch()
        while not go.exists():
            time.sleep(0.05)
        return subprocess.CompletedProcess(args, 1, "", "ValueError: stopped by the test")

    release._nbgrader = paused
    try:
        release.build_release(course, force=True)
    except UserError as exc:
        print(exc)
""")


@pytest.fixture
def building(tmp_path):
    """A built course (its release as `assignment build` left it) and a build of it under way, paused in its
    nbgrader step; yields (course, released bytes, go file) and lets the build end."""
    root = tmp_path / "c"
    course_mod.init_course(root)
    rel = root / "release" / spec.ASSIGNMENT / spec.NOTEBOOK
    rel.parent.mkdir(parents=True)
    released = (root / "source" / spec.ASSIGNMENT / spec.NOTEBOOK).read_bytes()
    rel.write_bytes(released)
    (root / "gradebook.db").write_bytes(b"")
    started, go = tmp_path / "started", tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", _PAUSED_BUILD, str(root), str(started), str(go)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tool_env())
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        yield root, released, go
    finally:
        go.touch()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "stopped by the test" in out, (out, err)
        assert rel.read_bytes() == released  # the release it replaced is back, whatever ran beside it
        assert [p.name for p in (root / "release").iterdir()] == [spec.ASSIGNMENT]


def test_a_grading_started_during_a_build_says_a_build_is_under_way(building, tmp_path):
    root, _released, _go = building
    (tmp_path / "subs").mkdir()
    proc = subprocess.run([sys.executable, "-m", "decodesched.cli", "grade", str(tmp_path / "subs"), "--out",
                           str(tmp_path / "out"), "--course", str(root), "--no-progress"],
                          capture_output=True, text=True, env=tool_env(), timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "`decodesched assignment build` is rebuilding this course's release" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_second_build_waits_for_the_first_and_never_runs_beside_it(building, monkeypatch):
    root, _released, _go = building

    def beside(args, cwd, timeout=600):
        raise AssertionError(f"nbgrader {args[0]} ran while another build was under way")

    monkeypatch.setattr(release, "_nbgrader", beside)
    with pytest.raises(UserError, match=r"another `decodesched assignment build` of this course .* is under way"):
        release.build_release(root, force=True)
    assert not (root / "release" / spec.ASSIGNMENT).exists()  # the first build's state, untouched


def test_gradings_read_a_course_together_and_write_nothing_into_it(tmp_path):
    root = tmp_path / "c"
    course_mod.init_course(root)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with course_mod.build_locked(root, exclusive=False):  # a course built before the lock existed: read unlocked
        pass
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    with course_mod.build_locked(root, exclusive=True):  # (a build makes the lock file)
        pass
    with course_mod.build_locked(root, exclusive=False), course_mod.build_locked(root, exclusive=False):
        with pytest.raises(UserError, match="under way"):
            with course_mod.build_locked(root, exclusive=True, wait_s=0.2):
                pass


def _gradebook(path: Path) -> None:
    """A gradebook of nbgrader's tables that `build_template` reads, with the assignment and its notebook."""
    import sqlite3

    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE assignment (id TEXT, name TEXT);
        CREATE TABLE notebook (id TEXT, name TEXT, assignment_id TEXT);
        CREATE TABLE source_cell (id TEXT, name TEXT, notebook_id TEXT, source TEXT, checksum TEXT);
        CREATE TABLE comment (id TEXT); CREATE TABLE grade (id TEXT); CREATE TABLE submitted_notebook (id TEXT);
        CREATE TABLE submitted_assignment (id TEXT); CREATE TABLE student (id TEXT);
    """)
    con.execute("INSERT INTO assignment VALUES ('a', ?)", (spec.ASSIGNMENT,))
    con.execute("INSERT INTO notebook VALUES ('n', ?, 'a')", (spec.NOTEBOOK[:-len(".ipynb")],))
    con.commit()
    con.close()


def test_the_kernel_runs_template_is_not_copied_from_a_gradebook_a_build_is_writing(tmp_path):
    import json

    from decodesched.grader import autograde

    root = tmp_path / "c"
    course_mod.init_course(root)
    nb = json.loads((root / "source" / spec.ASSIGNMENT / spec.NOTEBOOK).read_text(encoding="utf-8"))
    _gradebook(root / "gradebook.db")
    course = course_mod.Course(root, root / "release" / spec.ASSIGNMENT / spec.NOTEBOOK, nb, root / "gradebook.db")
    (tmp_path / "w1").mkdir()
    assert (autograde.build_template(course, tmp_path / "w1", 30) / "gradebook.db").is_file()
    (tmp_path / "w2").mkdir()
    with course_mod.build_locked(root, exclusive=True):  # a build started once the grading had read the course
        with pytest.raises(UserError, match="is rebuilding this course's release"):
            autograde.build_template(course, tmp_path / "w2", 30)
