"""Intake and outputs of a grade run that meets odd entries: a file name that is not UTF-8, a non-ASCII
student id, an archive handed in instead of a notebook (audit 6, findings 1 and 8)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from decodesched.grader import notebook, pipeline, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks.attacks import minimal_notebook as _nb  # noqa: E402

LATIN1 = os.fsdecode(b"\xe9l\xe8ve.ipynb")  # "élève" saved as Latin-1 (a Windows zip, an old Samba share)


def _folder(tmp_path):
    flat = tmp_path / "subs"
    flat.mkdir(parents=True)
    for name in ("alice.ipynb", LATIN1, "张三.ipynb"):
        (flat / name).write_text(json.dumps(_nb()))
    (flat / "m11_zipped.zip").write_bytes(b"PK\x03\x04")
    (flat / ".DS_Store").write_bytes(b"")
    (flat / "notes").mkdir()
    return flat


def test_a_name_that_is_not_utf8_is_an_invalid_row_named_with_escapes(tmp_path):
    skipped = []
    subs = {s.student_id: s for s in notebook.collect_submissions(_folder(tmp_path), skipped)}
    assert sorted(subs) == ["\\xe9l\\xe8ve", "alice", "张三"]
    bad = subs["\\xe9l\\xe8ve"]
    assert "not a plain name" in bad.problem and "not UTF-8" in bad.problem
    assert subs["张三"].problem is None and subs["alice"].problem is None  # nbgrader takes any Unicode id
    assert ("m11_zipped.zip", "not a .ipynb notebook (unpack an archive into the folder first)") in skipped
    assert ("notes/", f"a folder without {spec.ASSIGNMENT}/ inside") in skipped
    assert not any(name.startswith(".") for name, _ in skipped)


@pytest.mark.parametrize("sid, plain", [("alice", True), ("张三", True), ("b.wang+1", True), ("alice\n", False),
                                        ("e\u0301", False), ("-1", False), ("_x", False), ("a b", False)])
def test_plain_student_ids(sid, plain):
    assert bool(notebook.STUDENT_ID_RE.match(sid)) is plain



@pytest.fixture
def offline(monkeypatch, tmp_path):
    """`pipeline.grade` without a course or nbgrader: every readable notebook scores half marks."""
    from decodesched.grader.course import Course

    course = Course(tmp_path / "course", tmp_path / "course" / "release.ipynb", {"cells": []},
                    tmp_path / "course" / "gradebook.db")
    written = []
    monkeypatch.setattr(pipeline, "open_course", lambda _c: course)
    monkeypatch.setattr(pipeline, "update_gradebook", lambda _c, results, _s=None: written.append(list(results)))

    def fake_grade_one(sub, *a, **k):
        if sub.problem:
            return pipeline.Result(sub.student_id, "invalid", 0.0, float(spec.MAX_SCORE), pipeline._zero_cells(),
                                   {}, [sub.problem])
        cells = {c.grade_id: c.points / 2 for c in spec.CELLS}
        return pipeline.Result(sub.student_id, "graded", sum(cells.values()), float(spec.MAX_SCORE), cells,
                               {c.grade_id: [] for c in spec.CELLS})

    monkeypatch.setattr(pipeline, "grade_one", fake_grade_one)
    return written


def test_grading_a_folder_with_a_non_utf8_name_grades_everyone_and_says_why(tmp_path, offline, capsys):
    out = tmp_path / "out"
    results = pipeline.grade(_folder(tmp_path), out, options=pipeline.Options(run_nbgrader=False, jobs=1,
                                                                              progress=False))
    assert {r.student_id: r.status for r in results} == {"alice": "graded", "\\xe9l\\xe8ve": "invalid",
                                                        "张三": "graded"}
    rows = (out / "grades.csv").read_text(encoding="utf-8").splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["\\xe9l\\xe8ve", "alice", "张三"]
    assert rows[1].split(",")[1:4] == ["0", str(spec.MAX_SCORE), "invalid"]
    assert sorted(p.name for p in (out / "feedback").iterdir()) == ["alice.html", "张三.html"]
    err = capsys.readouterr().err.splitlines()
    assert "decodesched grade: skipped m11_zipped.zip: not a .ipynb notebook (unpack an archive into the folder " \
           "first)" in err
    assert any(line.startswith("decodesched grade: invalid \\xe9l\\xe8ve: the student id is not a plain name")
               for line in err)
    assert len(offline) == 1


def test_a_failure_before_the_outputs_writes_none_of_them(tmp_path, offline, monkeypatch):
    def broken(_c, _r, _s=None):
        raise OSError("the gradebook is locked")

    monkeypatch.setattr(pipeline, "update_gradebook", broken)
    out = tmp_path / "out"
    with pytest.raises(OSError):
        pipeline.grade(_folder(tmp_path), out, options=pipeline.Options(run_nbgrader=False, jobs=1, progress=False))
    assert not out.exists() or not any(out.rglob("*"))

    monkeypatch.setattr(pipeline, "update_gradebook", lambda *_a: None)
    monkeypatch.setattr(pipeline, "grades_csv_text", lambda _r: "\udce9")  # cannot be written as UTF-8
    with pytest.raises(UnicodeEncodeError):
        pipeline.grade(_folder(tmp_path / "x"), out, options=pipeline.Options(run_nbgrader=False, jobs=1,
                                                                             progress=False))
    assert not out.exists() or not any(out.rglob("*"))
