"""Stop 56: a hostile solution's own `numpy`, and what an instructor expects of the grade run.

* The verdict harness read NumPy's scalar classes from ``sys.modules["numpy"]``, which the solution can replace:
  a module of its own whose ``int64`` (or ``bool_``) is a class with an ``__eq__`` that is always true passed that
  class off as NumPy's, read as the int or bool it converts to, with no tamper evidence (`graded` where an
  always-equal sort key is `tampered`). A class made at run time is now never one of NumPy's (`harness._HEAPTYPE`).
* Students of the course's roster (nbgrader's gradebook: `nbgrader db student add` or `import`) who handed in
  nothing had no row in grades.csv, while `nbgrader export` lists them with 0 points: they are now rows of status
  ``missing``, 0 points, no feedback page, with one note on stderr; a later grading of a late one into the same
  --out replaces that row (`pipeline.missing_rows`).
* A gradebook without the assignment (made again by `nbgrader db student import` after the build) or one that is
  no database: every submission's verdict ran, each student got an "internal error" traceback, and only then one
  line said what was wrong. Now that line comes before any grading (`course.unsubmitted`).
* A submitted/ tree of another assignment (`hw1/` in every student folder) said only "no submissions": it now
  names what the student folders hold.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from decodesched.errors import UserError
from decodesched.grader import harness, limits, notebook, sandbox, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.course import build_course, grade_folder, tool_env  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SANDBOX = pytest.mark.skipif(os.geteuid() != 0 and not sandbox.userns_available(),
                             reason="needs root or user namespaces")
NUMPY_NAMES = ("bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
               "float16", "float32", "float64")


class _Lie(tuple):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = tuple.__hash__


def test_a_fake_numpy_module_does_not_pass_a_lying_class_off_as_numpys(monkeypatch):
    fake = types.ModuleType("numpy")
    for name in NUMPY_NAMES:
        setattr(fake, name, _Lie)
    monkeypatch.setitem(sys.modules, "numpy", fake)
    assert harness.normalise(_Lie((1, 2))) == "<bad type: _Lie; overrides comparison>"
    assert harness.as_eq(_Lie((1, 2))) == "<bad type: _Lie; overrides comparison>"


def test_numpys_own_scalars_are_still_read_as_their_values():
    import numpy as np

    assert [harness.normalise(x) for x in (np.int64(3), np.bool_(True), np.uint8(7))] == [3, True, 7]
    assert harness.as_eq(np.float64(1e9)) == 1_000_000_000


FAKE_NUMPY = attacks.honest_source() + '''
import sys as _sys, types as _types
class _Lie(tuple):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = tuple.__hash__
_fake = _types.ModuleType("numpy")
for _name in ''' + repr(NUMPY_NAMES) + ''':
    setattr(_fake, _name, _Lie)
_sys.modules["numpy"] = _fake
_honest_key = DecodeSchedulerSim._schedule_key
DecodeSchedulerSim._schedule_key = lambda self, req: _Lie(_honest_key(self, req))
'''


@SANDBOX
def test_an_always_equal_key_behind_a_fake_numpy_is_tampered_and_earns_no_more():
    small = limits.Limits(cpu_s=30)
    cheat = verdict.verdict_for_source(FAKE_NUMPY, limits=small, shrink_failures=False)
    honest = verdict.verdict_for_source(attacks.honest_source(), limits=small, shrink_failures=False)
    assert cheat.status == "tampered", (cheat.status, cheat.notes[:2])
    assert cheat.total < honest.total


def test_a_tree_of_another_assignment_is_named_as_such(tmp_path):
    for sid in ("alice", "bob"):
        folder = tmp_path / "submitted" / sid / "hw1"
        folder.mkdir(parents=True)
        (folder / "hw1.ipynb").write_text(json.dumps(attacks.minimal_notebook()))
    with pytest.raises(UserError) as info:
        notebook.collect_submissions(tmp_path)
    assert "hw1/ (2 folder(s)), not decode_scheduling/" in str(info.value), info.value


# --- with the real nbgrader ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_course(tmp_path_factory.mktemp("stop56"))


def _course_copy(built, tmp_path: Path) -> Path:
    course = tmp_path / "course"
    shutil.copytree(built[0], course)
    return course


def _nbgrader(course: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=tool_env(), capture_output=True,
                   text=True, check=True, timeout=300)


def _folder(folder: Path, release: Path, notebooks: dict) -> Path:
    """`folder` with `<id>.ipynb` for each id -> notebook (a solution's source, or a whole notebook)."""
    folder.mkdir(parents=True)
    rel = json.loads(release.read_text(encoding="utf-8"))
    for sid, nb in notebooks.items():
        nb = attacks._with_solution(rel, nb) if isinstance(nb, str) else nb
        (folder / f"{sid}.ipynb").write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    return folder


def _odd_but_honest(release: Path) -> dict:
    """Correct notebooks as odd tools leave them: no notebook metadata at all, another language's kernelspec, and
    10,000 markdown cells that all share one cell id."""
    rel = json.loads(release.read_text(encoding="utf-8"))
    ref = attacks._with_solution(rel, attacks.reference_source())
    no_meta = {**ref, "metadata": {}}
    r_kernel = {**ref, "metadata": {**ref["metadata"], "kernelspec": {"name": "ir", "display_name": "R",
                                                                      "language": "R"}}}
    many = {**ref, "cells": [{**c, "id": "same"} for c in ref["cells"]]
            + [{"cell_type": "markdown", "id": "same", "metadata": {}, "source": "x"} for _ in range(10_000)]}
    return {"nometa": no_meta, "rkernel": r_kernel, "manycells": many}


def _export(course: Path) -> dict:
    """`nbgrader export`'s scores: student id -> raw score."""
    _nbgrader(course, "export")
    with open(course / "grades.csv", newline="", encoding="utf-8") as fh:
        return {r["student_id"]: float(r["raw_score"]) for r in csv.DictReader(fh)}


@pytest.mark.slow
def test_roster_students_who_handed_in_nothing_are_missing_rows_as_nbgrader_export_lists_them(built, tmp_path):
    course, release = _course_copy(built, tmp_path), built[1]
    for sid in ("bob", "carol"):
        _nbgrader(course, "db", "student", "add", sid)
    out = tmp_path / "out"
    subs = _folder(tmp_path / "subs", release, {"alice": attacks.reference_source(), **_odd_but_honest(release)})
    first = grade_folder(subs, course, out)
    rows = first["rows"]
    assert {s: (r["status"], r["score"]) for s, r in rows.items()} == {
        "alice": ("graded", "100"), "nometa": ("graded", "100"), "rkernel": ("graded", "100"),
        "manycells": ("graded", "100"), "bob": ("missing", "0"), "carol": ("missing", "0")}
    assert {v for k, v in rows["bob"].items() if k not in ("student_id", "status", "max_score")} == {"0"}
    assert not (out / "feedback" / "bob.html").exists() and (out / "feedback" / "alice.html").is_file()
    assert "handed in nothing" in first["stderr"] and "bob, carol" in first["stderr"]
    assert "graded 4 submission(s): 4 graded; 2 missing (on the roster, no submission); wrote" in first["stdout"]
    assert _export(course) == {s: float(r["score"]) for s, r in rows.items()}

    # bob hands in late, graded alone into the class's --out: his row is his grade, everyone else's stays
    late = grade_folder(_folder(tmp_path / "late", release, {"bob": attacks.honest_source()}), course, out)
    statuses = {s: r["status"] for s, r in late["rows"].items()}
    assert statuses == {"alice": "graded", "nometa": "graded", "rkernel": "graded", "manycells": "graded",
                        "bob": "graded", "carol": "missing"}
    assert 0 < float(late["rows"]["bob"]["score"]) < 100
    assert "graded 1 submission(s): 1 graded; 1 missing (on the roster" in late["stdout"]
    assert _export(course) == {s: float(r["score"]) for s, r in late["rows"].items()}


@pytest.mark.parametrize("gradebook", ["made again by a roster import", "not a database"])
def test_a_gradebook_without_the_assignment_stops_before_grading_with_one_line(built, tmp_path, gradebook):
    course = _course_copy(built, tmp_path)
    (course / "gradebook.db").unlink()
    if gradebook == "not a database":
        (course / "gradebook.db").write_bytes(b"not a database\n" * 200)
    else:
        _nbgrader(course, "db", "student", "add", "alice")
    subs = _folder(tmp_path / "subs", built[1], {"alice": attacks.reference_source(), "bob": attacks.honest_source()})
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "decodesched.cli", "grade", str(subs), "--out", str(out),
                           "--course", str(course), "--jobs", "1", "--no-progress"],
                          capture_output=True, text=True, env=tool_env(), cwd=REPO, timeout=600)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "gradebook" in lines[0] and "assignment build --force" in lines[0], proc.stderr[-2000:]
    assert not out.exists()


def test_a_gradebook_locked_by_another_program_is_graded_without_the_roster(built, tmp_path):
    """Formgrader or nbgrader writing the gradebook for over SQLite's 5 s as the grading starts: no roster (and no
    refusal), as before the roster was read; the write at the end has its own one-line error."""
    import sqlite3

    from decodesched.grader import course as course_mod

    gradebook = _course_copy(built, tmp_path) / "gradebook.db"
    assert course_mod.unsubmitted(gradebook) == []  # built, nobody added yet
    con = sqlite3.connect(gradebook)
    try:
        con.execute("INSERT INTO student (id) VALUES ('zoe')")
        con.commit()
        assert course_mod.unsubmitted(gradebook) == ["zoe"]
        con.execute("BEGIN EXCLUSIVE")
        assert course_mod.unsubmitted(gradebook) == []
    finally:
        con.rollback()
        con.close()
