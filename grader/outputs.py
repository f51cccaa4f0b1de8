"""The outputs of a grade run: grades.csv and the instructor's gradebook (the pages: `grader.feedback`)."""

from __future__ import annotations

import csv
import io
import warnings

from . import spec
from .course import Course
from .notebook import STUDENT_ID_RE

def _fmt(x: float) -> str:
    return f"{x:g}"


def grades_csv_text(results: list) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["student_id", "score", "max_score", "status", *spec.CELL_IDS])
    for r in sorted(results, key=lambda r: r.student_id):
        w.writerow([r.student_id, _fmt(r.score), _fmt(r.max_score), r.status, *(_fmt(r.cells[c]) for c in spec.CELL_IDS)])
    return buf.getvalue()


def update_gradebook(course: Course, results: list) -> None:
    """Write the verdicts into the instructor's gradebook, so `nbgrader export` agrees."""
    from nbgrader.api import Gradebook, MissingEntry

    with warnings.catch_warnings(), Gradebook(f"sqlite:///{course.gradebook}") as gb:
        warnings.simplefilter("ignore")  # nbgrader's add_submission trips SQLAlchemy autoflush warnings
        gb.find_assignment(spec.ASSIGNMENT)
        for r in sorted(results, key=lambda r: r.student_id):
            if not STUDENT_ID_RE.match(r.student_id):
                continue
            gb.update_or_create_student(r.student_id)
            try:
                gb.find_submission(spec.ASSIGNMENT, r.student_id)
            except MissingEntry:
                gb.add_submission(spec.ASSIGNMENT, r.student_id)
            for c in spec.CELLS:
                try:
                    grade = gb.find_grade(c.grade_id, spec.NOTEBOOK[:-6], spec.ASSIGNMENT, r.student_id)
                except MissingEntry:
                    continue
                grade.auto_score = r.cells[c.grade_id]
                grade.manual_score = None
                grade.extra_credit = None
                grade.needs_manual_grade = False
            gb.db.commit()
