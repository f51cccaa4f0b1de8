"""The outputs of a grade run: grades.csv and the instructor's gradebook (the pages: `grader.feedback`)."""

from __future__ import annotations

import contextlib
import csv
import io
import warnings

from decodesched.errors import UserError

from . import spec
from .course import Course
from .notebook import is_plain_id

def _fmt(x: float) -> str:
    return f"{x:g}"


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value) -> str:
    """A CSV cell a spreadsheet shows as text: one that starts like a formula (``=``, ``+``, ``-``, ``@``, tab,
    carriage return: a student id taken from a file name can) gets a leading ``'`` (OWASP's rule), and a
    carriage return is written ``\\r`` (the csv module would leave it unquoted, splitting the row)."""
    text = str(value)
    text = "'" + text if text.startswith(_FORMULA_START) else text
    return text.replace("\r", "\\r")


def grades_csv_text(results: list) -> str:
    """grades.csv: one row per result, sorted by student id; every cell through `csv_cell`."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["student_id", "score", "max_score", "status", *spec.CELL_IDS])
    for r in sorted(results, key=lambda r: r.student_id):
        row = [r.student_id, _fmt(r.score), _fmt(r.max_score), r.status, *(_fmt(r.cells[c]) for c in spec.CELL_IDS)]
        w.writerow([csv_cell(x) for x in row])
    return buf.getvalue()


def preload_gradebook() -> None:
    """Import nbgrader's gradebook API (2-3 s) while the submissions are graded, not after them."""
    import nbgrader.api  # noqa: F401


def gradebook_rows(results: list) -> list:
    """What the gradebook gets: (student_id, {grade_id: score}) of every result with a valid student id."""
    return [(r.student_id, {c.grade_id: r.cells[c.grade_id] for c in spec.CELLS})
            for r in sorted(results, key=lambda r: r.student_id) if is_plain_id(r.student_id)]


def update_gradebook(course: Course, results: list, server=None) -> None:
    """Write the verdicts into the instructor's gradebook, so `nbgrader export` agrees: in the fork
    server when there is one (it has nbgrader imported already; every sandboxed run has ended), else here."""
    rows = gradebook_rows(results)
    stamps = {r.student_id: r.timestamp for r in results if getattr(r, "timestamp", None)}
    if server is not None and server.write_gradebook(course.gradebook, rows, stamps):
        return
    from sqlalchemy.exc import SQLAlchemyError  # (only here: the grading process needs no SQLAlchemy otherwise)

    try:
        write_gradebook(str(course.gradebook), rows, stamps)
    except (SQLAlchemyError, OSError) as exc:  # locked by another program, a full disk, a read-only file
        why = str(getattr(exc, "orig", None) or exc).strip().split("\n")[0][:200]
        raise UserError(f"{course.gradebook}: cannot write the gradebook ({why}); grades.csv and the feedback "
                        "were not written") from None


def write_gradebook(path: str, rows: list, stamps: dict | None = None) -> None:
    """`update_gradebook`'s work: each row's auto scores into the gradebook at `path`, and the time a student
    submitted where `stamps` has it (nbgrader's timestamp.txt text, `notebook.submitted_at`). Scores entered by hand
    are kept, as nbgrader's autograde keeps them."""
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.utils import parse_utc

    with warnings.catch_warnings(), Gradebook(f"sqlite:///{path}") as gb:
        warnings.simplefilter("ignore")  # nbgrader's add_submission trips SQLAlchemy autoflush warnings
        assignment = gb.find_assignment(spec.ASSIGNMENT)
        # The notebook's cells by id, read once: a student's grades are then one query (`find_grade` per cell
        # was ten, each joining seven tables: half a minute for 600 students).
        notebook = next((nb for nb in assignment.notebooks if nb.name == spec.NOTEBOOK[:-6]), None)
        names = {cell.id: cell.name for cell in (notebook.grade_cells + notebook.task_cells if notebook else [])}
        notebook_id = notebook.id if notebook else None
        for student_id, cells in rows:
            gb.update_or_create_student(student_id)
            try:
                submission = gb.find_submission(spec.ASSIGNMENT, student_id)
            except MissingEntry:
                submission = gb.add_submission(spec.ASSIGNMENT, student_id)
            if (stamps or {}).get(student_id):  # as nbgrader's autograde records it; `nbgrader export` shows it
                with contextlib.suppress(ValueError, OverflowError, TypeError):
                    submission.timestamp = parse_utc(stamps[student_id])
            for submitted in submission.notebooks:
                if submitted.notebook_id != notebook_id:
                    continue
                for grade in submitted.grades:
                    name = names.get(grade.cell_id)
                    if name not in cells:
                        continue
                    # as nbgrader's autograde: a score or extra credit a grader entered (formgrader) is kept, and
                    # marked for review (`course.hand_graded` names them on stderr)
                    grade.auto_score = cells[name]
                    grade.needs_manual_grade = grade.manual_score is not None
            gb.db.commit()
