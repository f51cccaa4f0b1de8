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


# ---- review findings 3, 4, 5, 10: ids that make names too long, look-alike ids, colliding names, raw names ----

LONG = "\U00020000" * 63 + "a"  # 253 bytes of UTF-8: a legal folder name, whose page "<id>.html" would not be


def _grade(folder, tmp_path):
    return pipeline.grade(folder, tmp_path / "out", options=pipeline.Options(run_nbgrader=False, jobs=1,
                                                                             progress=False))


@pytest.mark.parametrize("sid, why", [
    ("\U00020000" * 16 + "a", "too long"),  # 65 bytes: k-<id>-XXXXXXXX, <id>.html would still fit, but 64 is the rule
    (LONG, "too long"),
    ("\U0001d41a" * 62, "too long"),  # 248 bytes (and NFKC makes it "aaa...")
    ("\U0001d41a" * 3, "look-alike"),  # mathematical bold "aaa"
    ("\uff41\uff4c\uff49\uff43\uff45", "look-alike"),  # fullwidth "alice"
    ("\u3164", "look-alike"),  # HANGUL FILLER, shown as nothing
    ("\u1160a", "look-alike"),  # HANGUL JUNGSEONG FILLER: NFKC leaves it, still invisible
    ("\u1100\u1161\u11a8", "not in Unicode NFC"),  # NFD of "각" (its Jamo are letters)
])
def test_ids_too_long_or_look_alike_are_refused_with_a_reason(sid, why):
    assert notebook.id_problem(sid) is not None and why in notebook.id_problem(sid)
    assert not notebook.is_plain_id(sid)


@pytest.mark.parametrize("sid", ["alice", "张三", "\uac01", "b.wang+1", "\U00020000" * 16, "a" * 64])
def test_plain_ids_within_64_bytes_stay_plain(sid):
    assert notebook.id_problem(sid) is None


def test_a_long_unicode_id_is_an_invalid_row_and_everyone_else_gets_outputs(tmp_path, offline, capsys):
    root = tmp_path / "course" / "submitted"
    for sid in (LONG, "alice"):
        d = root / sid / spec.ASSIGNMENT
        d.mkdir(parents=True)
        (d / spec.NOTEBOOK).write_text(json.dumps(_nb()))
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / ("\U00020000" * 62 + ".ipynb")).write_text(json.dumps(_nb()))  # 254 bytes: mkdtemp("k-<id>-") failed
    results = _grade(tmp_path / "course", tmp_path)
    assert {r.student_id: r.status for r in results} == {LONG: "invalid", "alice": "graded"}
    assert (tmp_path / "out" / "grades.csv").is_file()
    assert sorted(p.name for p in (tmp_path / "out" / "feedback").iterdir()) == ["alice.html"]
    err = capsys.readouterr().err
    assert f"invalid {LONG}: the student id is too long (253 bytes" in err
    from decodesched.grader import outputs
    assert [sid for sid, _ in outputs.gradebook_rows(results)] == ["alice"]
    flat_results = pipeline.grade(flat, tmp_path / "out2", options=pipeline.Options(run_nbgrader=False, jobs=1,
                                                                                   progress=False))
    assert [r.status for r in flat_results] == ["invalid"] and "too long" in flat_results[0].notes[0]
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err


def test_nfc_and_nfd_twins_are_two_rows_and_the_nfd_one_is_invalid(tmp_path, offline):
    import unicodedata

    flat = tmp_path / "flat"
    flat.mkdir()
    nfc, nfd = "김민준", unicodedata.normalize("NFD", "김민준")
    assert nfc != nfd
    for sid in (nfc, nfd):
        (flat / f"{sid}.ipynb").write_text(json.dumps(_nb()))
    results = {r.student_id: r for r in _grade(flat, tmp_path)}
    assert results[nfc].status == "graded"
    assert results[nfd].status == "invalid" and "not in Unicode NFC" in results[nfd].notes[0]


def test_two_names_shown_alike_are_one_invalid_row_naming_both(tmp_path, offline, capsys):
    flat = tmp_path / "flat"
    flat.mkdir()
    for name in (os.fsdecode(b"\xe9.ipynb"), "\\xe9.ipynb", "alice.ipynb"):
        (flat / name).write_text(json.dumps(_nb()))
    subs = notebook.collect_submissions(flat)
    assert [s.student_id for s in subs] == ["\\xe9", "alice"]
    results = {r.student_id: r for r in _grade(flat, tmp_path)}
    assert results["\\xe9"].status == "invalid"
    note = results["\\xe9"].notes[0]
    assert note.startswith("two submissions for the same student id: ")
    assert "\\xe9.ipynb" in note and "\\\\xe9.ipynb" in note  # the byte 0xE9, and a literal backslash
    err = capsys.readouterr().err
    assert "invalid \\xe9: two submissions for the same student id" in err


def test_a_file_and_a_folder_for_one_student_are_one_invalid_row(tmp_path):
    root = tmp_path / "subs"
    (root / "alice" / spec.ASSIGNMENT).mkdir(parents=True)
    (root / "alice" / spec.ASSIGNMENT / spec.NOTEBOOK).write_text(json.dumps(_nb()))
    (root / "alice.ipynb").write_text(json.dumps(_nb()))
    (subs,) = notebook.collect_submissions(root)
    assert subs.problem == "two submissions for the same student id: alice.ipynb, alice/; keep one and grade again"


def test_names_on_stderr_are_escaped_never_raw(tmp_path, offline, capsys):
    flat = tmp_path / "flat"
    flat.mkdir()
    evil = "x\ndecodesched grade: graded everyone\x1b[2J\u202e"
    (flat / f"{evil}.ipynb").write_text(json.dumps(_nb()))
    (flat / f"{evil}.zip").write_bytes(b"PK\x03\x04")
    (flat / "alice.ipynb").write_text(json.dumps(_nb()))
    _grade(flat, tmp_path)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\u202e" not in err
    assert not any(line.startswith("decodesched grade: graded") for line in err.splitlines())
    shown = "x\\ndecodesched grade: graded everyone\\x1b[2J\\u202e"
    assert f"decodesched grade: invalid {shown}: the student id is not a plain name" in err
    assert f"decodesched grade: skipped {shown}.zip: not a .ipynb notebook" in err
    assert all(line.startswith("decodesched grade: ") for line in err.splitlines())


def test_printable_escapes_only_what_cannot_be_printed():
    assert notebook.printable("张三 \\xe9 a.b") == "张三 \\xe9 a.b"
    assert notebook.printable("a\r\n\t\x00\x7f\x9b\u200b") == "a\\r\\n\\t\\x00\\x7f\\x9b\\u200b"
