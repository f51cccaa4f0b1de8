"""A class graded at scale and under load, and an instructor's next steps after `decodesched grade`.

1. The feedback page of a hostile submission (a memory hog, a fork bomb, one that sleeps) was not the same from one
   grading to the next, or between `--jobs 1` and `--jobs 2`: its notes gave the amounts measured when the sandbox
   stopped the run (``resident memory 2305 MiB``, then ``1564 MiB``; ``325 leftover process(es)``, then ``200``;
   ``0.5 s of CPU used``). They now name the limit only.
2. A score a grader entered by hand in formgrader (a manual score, extra credit) used to be wiped, silently, by the next
   `decodesched grade` of the student; nbgrader's own autograde keeps it and marks the cell for review."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from decodesched.grader import course as course_mod, outputs, sandbox, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.course import ASSIGNMENT, build_course, grade_folder, tool_env  # noqa: E402

NB = spec.NOTEBOOK[: -len(".ipynb")]


# Grows by chunks of random sizes, so each run is stopped at another resident size.
HOG = "import random\nhog = []\nwhile True:\n    hog.append(bytearray(random.randint(1, 40) * 2**20))\n"


def _notes(tmp_path, code: str) -> list:
    (tmp_path / "x.py").write_text(code)
    return sandbox.run_isolated([sys.executable, "-I", "-S", "x.py"], cwd=tmp_path, timeout_s=60, cpu_s=20,
                                memory_mb=160, address_space=False).notes


def test_what_stopped_a_run_is_said_the_same_way_on_every_run(tmp_path):
    hogs = [_notes(tmp_path, HOG) for _ in range(4)]
    assert hogs[0] and all(n == hogs[0] for n in hogs), hogs
    assert any("resident memory over the 160 MiB limit" in n for n in hogs[0]), hogs[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_course(tmp_path_factory.mktemp("scale58"))


@pytest.fixture(scope="module")
def course(built):
    return built[0]


FORK_BOMB = "import os as _o\nwhile True:\n    try:\n        _o.fork()\n    except OSError:\n        pass\n"


def test_a_class_with_a_fork_bomb_and_a_memory_hog_gets_the_same_pages_with_one_job_or_two(built, tmp_path):
    course, release = built
    rel = json.loads(release.read_text(encoding="utf-8"))
    honest = attacks.honest_source().rstrip() + "\n\n"
    sources = {"ref": attacks.reference_source(), "buggy": honest, "fork_bomb": honest + FORK_BOMB,
               "memory_hog": honest + attacks.ATTACKS["memory_bomb"]}
    subs = tmp_path / "subs"
    subs.mkdir()
    for name, source in sources.items():
        (subs / f"{name}.ipynb").write_text(json.dumps(attacks._with_solution(rel, source)), encoding="utf-8")
    one = grade_folder(subs, course, tmp_path / "one", "--jobs", "1")
    grade_folder(subs, course, tmp_path / "two")
    assert {s: r["status"] for s, r in one["rows"].items()} == {
        "ref": "graded", "buggy": "graded", "fork_bomb": "memory", "memory_hog": "memory"}
    assert (tmp_path / "one" / "grades.csv").read_bytes() == (tmp_path / "two" / "grades.csv").read_bytes()
    for name in sources:
        page = f"feedback/{name}.html"
        assert (tmp_path / "one" / page).read_text() == (tmp_path / "two" / page).read_text(), name


def _grade(gradebook: Path, student: str, cell: str):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{gradebook}") as gb:
        g = gb.find_grade(cell, NB, ASSIGNMENT, student)
        return g.auto_score, g.manual_score, g.extra_credit, g.needs_manual_grade


def _enter_by_hand(gradebook: Path, student: str, cell: str, manual, extra) -> None:
    """What formgrader does when a grader types a score and extra credit into a cell."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{gradebook}") as gb:
        g = gb.find_grade(cell, NB, ASSIGNMENT, student)
        g.manual_score, g.extra_credit = manual, extra
        gb.db.commit()


def test_the_gradebook_keeps_scores_entered_by_hand_as_nbgraders_autograde_does(course, tmp_path):
    gradebook = tmp_path / "gradebook.db"
    shutil.copy(course / "gradebook.db", gradebook)
    first, second = spec.CELLS[0].grade_id, spec.CELLS[1].grade_id
    rows = [("alice", {c.grade_id: 0.0 for c in spec.CELLS}), ("bob", {c.grade_id: 0.0 for c in spec.CELLS})]
    outputs.write_gradebook(str(gradebook), rows)
    _enter_by_hand(gradebook, "alice", first, 1.5, None)
    _enter_by_hand(gradebook, "bob", second, None, 0.5)
    assert course_mod.hand_graded(gradebook, ["alice", "bob", "carol"]) == ["alice", "bob"]
    again = [(s, {c.grade_id: float(c.points) for c in spec.CELLS}) for s in ("alice", "bob")]
    outputs.write_gradebook(str(gradebook), again)
    points = {c.grade_id: float(c.points) for c in spec.CELLS}
    assert _grade(gradebook, "alice", first) == (points[first], 1.5, None, True)  # review it: the auto score moved
    assert _grade(gradebook, "bob", second) == (points[second], None, 0.5, False)  # as nbgrader: no manual score
    assert _grade(gradebook, "alice", second) == (points[second], None, None, False)
    assert course_mod.hand_graded(gradebook, ["bob"]) == ["bob"]
    assert course_mod.hand_graded(tmp_path / "absent.db", ["bob"]) == []


def test_a_regrade_keeps_a_manual_grade_says_so_and_nbgrader_export_shows_it(course, tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "alice.ipynb").write_text('{"cells": [', encoding="utf-8")  # invalid: 0 points, no kernel run
    out = tmp_path / "out"
    first = grade_folder(subs, course, out)
    assert first["rows"]["alice"]["status"] == "invalid" and "by hand" not in first["stderr"]
    cell = spec.CELLS[0].grade_id
    _enter_by_hand(course / "gradebook.db", "alice", cell, 2.0, 1.0)
    again = grade_folder(subs, course, out, "--regrade")
    assert again["rows"]["alice"]["score"] == "0"  # grades.csv: this grading's score
    assert _grade(course / "gradebook.db", "alice", cell) == (0.0, 2.0, 1.0, True)
    notes = [line for line in again["stderr"].splitlines() if "by hand" in line]
    assert len(notes) == 1 and "alice" in notes[0] and "nbgrader export" in notes[0], again["stderr"]
    export = subprocess.run([sys.executable, "-m", "nbgrader", "export"], cwd=course, capture_output=True, text=True,
                            env=tool_env(), timeout=300)
    assert export.returncode == 0, export.stderr[-2000:]
    with open(course / "grades.csv", newline="", encoding="utf-8") as fh:
        exported = {r["student_id"]: r for r in csv.DictReader(fh) if r["assignment"] == ASSIGNMENT}
    assert float(exported["alice"]["score"]) == 3.0, exported["alice"]  # the manual score plus the extra credit
    (course / "grades.csv").unlink()
