"""The outputs of a grade run: grades.csv, one feedback page per student, the instructor's gradebook."""

from __future__ import annotations

import csv
import html
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


def feedback_html(r) -> str:
    e = html.escape
    rows = []
    for c in spec.CELLS:
        lines = r.lines.get(c.grade_id) or []
        items = "".join(f"<li>{e(line)}</li>" for line in lines)
        kind = "hidden" if c.hidden else "visible"
        rows.append(
            f"<tr><td>{e(c.title)}</td><td>{e(c.todo)}</td><td>{kind}</td>"
            f"<td>{_fmt(r.cells[c.grade_id])} / {c.points}</td><td><ul>{items}</ul></td></tr>"
        )
    notes = "".join(f"<li>{e(n)}</li>" for n in r.notes)
    return (
        "<!DOCTYPE html>\n<html lang=\"zh\"><head><meta charset=\"utf-8\">"
        f"<title>{e(spec.ASSIGNMENT)} - {e(r.student_id)}</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top}</style>"
        "</head><body>\n"
        f"<h1>{e(spec.ASSIGNMENT)}: {e(r.student_id)}</h1>\n"
        f"<p>得分 Score: <b>{_fmt(r.score)} / {_fmt(r.max_score)}</b> &nbsp; 状态 Status: <b>{e(r.status)}</b></p>\n"
        + (f"<ul class=\"notes\">{notes}</ul>\n" if notes else "")
        + "<table><tr><th>测试 Test</th><th>TODO</th><th></th><th>分数 Points</th><th>反馈 Feedback</th></tr>\n"
        + "\n".join(rows)
        + "\n</table>\n</body></html>\n"
    )


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
