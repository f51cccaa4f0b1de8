"""grader.outputs: grades.csv and the feedback page."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

from decodesched.grader import outputs, pipeline, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _write(path, nb):
    path.write_text(json.dumps(nb))
    return path


def _result(sid, status="graded", score=None):
    cells = {c.grade_id: float(c.points) / 2 for c in spec.CELLS}
    lines = {c.grade_id: [f"line <b>{c.grade_id}</b>"] for c in spec.CELLS}
    return pipeline.Result(sid, status, sum(cells.values()) if score is None else score, float(spec.MAX_SCORE),
                           cells, lines, notes=["a note & more"])


def test_grades_csv_columns_sorted_rows():
    text = outputs.grades_csv_text([_result("zed", "timeout"), _result("amy")])
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["student_id", "score", "max_score", "status", *spec.CELL_IDS]
    assert [r[0] for r in rows[1:]] == ["amy", "zed"]
    assert rows[2][3] == "timeout" and float(rows[1][1]) == spec.MAX_SCORE / 2
    assert sum(float(x) for x in rows[1][4:]) == float(rows[1][1])


def test_grades_csv_cells_never_start_a_formula():
    # A student id comes from a file name in the flat layout: a spreadsheet must show it as text.
    ids = ['=HYPERLINK("http://evil.example";"click")', "@SUM(1+1)*cmd|' /C calc'!A0", "+1", "-1", "\tx", "\rx"]
    text = outputs.grades_csv_text([_result(sid, "invalid", 0.0) for sid in ids] + [_result("amy")])
    rows = list(csv.reader(io.StringIO(text)))[1:]
    assert sorted(r[0] for r in rows) == sorted(["'" + sid.replace("\r", "\\r") for sid in ids] + ["amy"])
    assert all(not cell.startswith(outputs._FORMULA_START) for r in rows for cell in r)
