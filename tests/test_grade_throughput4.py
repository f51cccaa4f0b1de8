"""The gradebook written at the end of a grading: the same grades as nbgrader's own lookups give, in a few
queries per student (it took half a minute for 600 students: ten seven-table joins each)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from decodesched.grader import outputs, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks.course import build_course  # noqa: E402


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory):
    course, _ = build_course(tmp_path_factory.mktemp("throughput4"))
    return course / "gradebook.db"


def _rows(n: int, salt: int) -> list:
    return [(f"s{i:03d}", {c.grade_id: float((i * salt + k) % 7) / 2 for k, c in enumerate(spec.CELLS)})
            for i in range(n)]


def _statements(path: Path, rows: list) -> int:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    seen = []

    def count(conn, cursor, statement, *args):
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        outputs.write_gradebook(str(path), rows)
    finally:
        event.remove(Engine, "before_cursor_execute", count)
    return len(seen)


def test_the_gradebook_gets_every_grade_in_a_few_queries_per_student(gradebook, tmp_path):
    from nbgrader.api import Gradebook

    path = tmp_path / "gradebook.db"
    shutil.copy(gradebook, path)
    first, again = _rows(30, 3), _rows(40, 5)  # 30 new students, then a regrade of them with 10 more
    _statements(path, first)
    used = _statements(path, again)
    assert used <= 8 * len(again), used  # (ten `find_grade` joins a student: over 11 per student)
    with Gradebook(f"sqlite:///{path}") as gb:
        for student, cells in again:
            for c in spec.CELLS:
                grade = gb.find_grade(c.grade_id, spec.NOTEBOOK[:-6], spec.ASSIGNMENT, student)
                assert (grade.auto_score, grade.manual_score, grade.extra_credit, grade.needs_manual_grade) == \
                    (cells[c.grade_id], None, None, False), (student, c.grade_id)
