"""grader.pipeline pieces that need no kernel: intake, strict notebook checks, tamper checks, outputs."""

from __future__ import annotations

import csv
import io
import json

import pytest

from decodesched.errors import UserError
from decodesched.grader import pipeline, spec


def _nb(solution="class RequestState: pass\nclass DecodeSchedulerSim: pass\n", extra_cells=()):
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": "# intro"},
        {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": spec.SOLUTION_CELL, "solution": True,
                                                         "grade": False, "locked": False}},
         "source": solution, "outputs": [], "execution_count": None},
        {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "test_todo1_enqueue", "grade": True, "points": 3,
                                                         "locked": True, "solution": False}},
         "source": "assert 1 == 1\n", "outputs": [], "execution_count": None},
        *extra_cells,
    ]
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}


def _write(path, nb):
    path.write_text(json.dumps(nb))
    return path


def test_collect_flat_and_nbgrader_layouts(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    _write(flat / "bob.ipynb", _nb())
    _write(flat / "alice.ipynb", _nb())
    (flat / "notes.txt").write_text("ignored")
    _write(flat / "bad name!.ipynb", _nb())
    subs = pipeline.collect_submissions(flat)
    assert [s.student_id for s in subs] == ["alice", "bad name!", "bob"]
    assert subs[1].problem and subs[0].problem is None and subs[0].path.name == "alice.ipynb"

    tree = tmp_path / "course"
    nbdir = tree / "submitted" / "carol" / spec.ASSIGNMENT
    nbdir.mkdir(parents=True)
    _write(nbdir / spec.NOTEBOOK, _nb())
    (tree / "submitted" / "dave" / spec.ASSIGNMENT).mkdir(parents=True)  # folder without the notebook
    for root in (tree, tree / "submitted"):
        subs = pipeline.collect_submissions(root)
        assert [(s.student_id, s.problem is None) for s in subs] == [("carol", True), ("dave", False)]


def test_collect_rejects_empty_and_missing(tmp_path):
    with pytest.raises(UserError):
        pipeline.collect_submissions(tmp_path / "nope")
    with pytest.raises(UserError):
        pipeline.collect_submissions(tmp_path)


@pytest.mark.parametrize("content, reason", [
    (b"\xff\xfe not utf8", "invalid JSON"),
    (b'{"cells": [', "invalid JSON"),
    (b'[1, 2]', "nbformat 4"),
    (b'{"nbformat": 4, "cells": [{"cell_type": "code", "source": 5}]}', "not text"),
    (b'{"nbformat": 4, "cells": [{"cell_type": "evil", "source": ""}]}', "malformed"),
])
def test_unreadable_notebooks_are_invalid(tmp_path, content, reason):
    p = tmp_path / "s.ipynb"
    p.write_bytes(content)
    with pytest.raises(pipeline.InvalidSubmission, match=reason):
        pipeline.load_notebook(p)


def test_solution_cell_rules(tmp_path):
    nb = _nb(solution=["x = 1\n", "y = 2\n"])
    assert pipeline.solution_source(nb) == "x = 1\ny = 2\n"
    none = _nb()
    del none["cells"][1]["metadata"]["nbgrader"]
    with pytest.raises(pipeline.InvalidSubmission, match="no solution cell"):
        pipeline.solution_source(none)
    two = _nb(extra_cells=[json.loads(json.dumps(_nb()["cells"][1]))])
    with pytest.raises(pipeline.InvalidSubmission, match="2 cells"):
        pipeline.solution_source(two)


def test_altered_cells_detects_edited_tests_not_solutions():
    release = _nb()
    same = _nb(solution="anything the student wrote")
    assert pipeline.altered_cells(same, release) == []
    edited = _nb()
    edited["cells"][2]["source"] = "pass\n"
    assert pipeline.altered_cells(edited, release) == ["test_todo1_enqueue"]
    points = _nb()
    points["cells"][2]["metadata"]["nbgrader"]["points"] = 300
    assert pipeline.altered_cells(points, release) == ["test_todo1_enqueue"]
    deleted = _nb()
    del deleted["cells"][2]
    assert pipeline.altered_cells(deleted, release) == []  # nbgrader restores deleted graded cells
    dup = _nb(extra_cells=[json.loads(json.dumps(_nb()["cells"][2]))])
    assert pipeline.altered_cells(dup, release) == ["test_todo1_enqueue"]


def _result(sid, status="graded", score=None):
    cells = {c.grade_id: float(c.points) / 2 for c in spec.CELLS}
    lines = {c.grade_id: [f"line <b>{c.grade_id}</b>"] for c in spec.CELLS}
    return pipeline.Result(sid, status, sum(cells.values()) if score is None else score, float(spec.MAX_SCORE),
                           cells, lines, notes=["a note & more"])


def test_grades_csv_columns_sorted_rows():
    text = pipeline.grades_csv_text([_result("zed", "timeout"), _result("amy")])
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["student_id", "score", "max_score", "status", *spec.CELL_IDS]
    assert [r[0] for r in rows[1:]] == ["amy", "zed"]
    assert rows[2][3] == "timeout" and float(rows[1][1]) == spec.MAX_SCORE / 2
    assert sum(float(x) for x in rows[1][4:]) == float(rows[1][1])


def test_feedback_html_is_escaped_and_names_every_cell():
    page = pipeline.feedback_html(_result("amy"))
    assert "<b>test_todo1_enqueue</b>" not in page and "&lt;b&gt;test_todo1_enqueue&lt;/b&gt;" in page
    assert "a note &amp; more" in page
    for c in spec.CELLS:
        assert html_escape(c.title) in page
    assert "BEGIN HIDDEN TESTS" not in page


def html_escape(s):
    import html
    return html.escape(s)


def test_status_precedence_is_documented_order():
    assert pipeline.PRECEDENCE == ("invalid", "tampered", "memory", "timeout", "crashed", "graded")
    assert set(pipeline.PRECEDENCE) == set(pipeline.STATUSES)
    for status in pipeline.STATUSES:
        assert status in pipeline.__doc__


def test_canary_expectation_matches_plain_python(capsys):
    nonce = "n0nce"
    src = pipeline.canary_cell(nonce)["source"]
    with pytest.raises(AssertionError, match=nonce):
        exec(compile(src, "<canary>", "exec"), {})
    assert capsys.readouterr().out.strip() == pipeline._canary_expected(nonce)


@pytest.mark.parametrize("code", [
    "import builtins\nbuiltins.isinstance = lambda o, t: True\n",
    "import builtins as b\nsetattr(b, 'len', None)\n",
    "__builtins__['print'] = None\n",
    "vars(__builtins__).update(x=1)\n",
    "get_ipython().ast_transformers.append(object())\n",
    "ip = get_ipython()\nip.input_transformers_post.append(lambda l: l)\n",
    "import sqlite3\nsqlite3.connect('../../gradebook.db')\n",
])
def test_static_evidence_flags_plain_cheats(code):
    assert pipeline.static_evidence([code])


def test_static_evidence_accepts_honest_code():
    honest = (
        "%matplotlib inline\nfrom dataclasses import dataclass\nimport builtins\n"
        "x = builtins.len([1])\nclass DecodeSchedulerSim:\n    def step(self):\n        self.queue = sorted(self.queue)\n"
    )
    assert pipeline.static_evidence([honest, "def broken(:\n"]) == []


def test_cli_bad_input_exits_2_without_output(tmp_path, capsys):
    from decodesched import cli

    out = tmp_path / "out"
    assert cli.main(["grade", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert cli.main(["grade", str(tmp_path)]) == 2
    assert cli.main(["grade", str(tmp_path), "--out", str(out), "--jobs", "-1"]) == 2
    (tmp_path / "a.ipynb").write_text("{}")
    assert cli.main(["grade", str(tmp_path), "--out", str(out), "--course", str(tmp_path / "nocourse")]) == 2
    err = capsys.readouterr().err
    assert err.count("decodesched grade: error:") == 4 and "Traceback" not in err
    assert not out.exists()
