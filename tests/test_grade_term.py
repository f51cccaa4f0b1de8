"""An instructor's term with the grader: regrading some students into the class's --out, a test cell fixed and the
release rebuilt mid-term, late submissions in nbgrader's submitted/ tree, a grading stopped while it writes."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from decodesched._io import Terminated, terminate_like_interrupt
from decodesched.errors import UserError
from decodesched.grader import notebook, pipeline, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.course import grade_folder, tool_env  # noqa: E402

OPTIONS = dict(run_nbgrader=False, jobs=1, progress=False)


def _rows(out: Path) -> dict:
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        return {r["student_id"]: r for r in csv.DictReader(fh)}


def _flat(folder: Path, *ids: str) -> Path:
    folder.mkdir(parents=True)
    for sid in ids:
        (folder / f"{sid}.ipynb").write_text(json.dumps(attacks.minimal_notebook()))
    return folder


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """`pipeline.grade` without a course or nbgrader: student `s` scores `scores[s]` (default 50) of each cell's
    points in percent; the gradebook writes are recorded."""
    from decodesched.grader.course import Course

    course = Course(tmp_path / "course", tmp_path / "course" / "release.ipynb", {"cells": []},
                    tmp_path / "course" / "gradebook.db")
    state = {"scores": {}, "gradebook": []}
    monkeypatch.setattr(pipeline, "open_course", lambda _c: course)
    monkeypatch.setattr(pipeline, "update_gradebook", lambda _c, results, _s=None: state["gradebook"].append(
        {r.student_id: r.score for r in results}))

    def fake_grade_one(sub, *a, **k):
        cells = {c.grade_id: c.points * state["scores"].get(sub.student_id, 50) / 100 for c in spec.CELLS}
        return pipeline.Result(sub.student_id, "graded", sum(cells.values()), float(spec.MAX_SCORE), cells,
                               {c.grade_id: [] for c in spec.CELLS})

    monkeypatch.setattr(pipeline, "grade_one", fake_grade_one)
    return state


def test_regrading_one_student_into_the_class_out_keeps_everyone_elses_row(tmp_path, offline, capsys):
    out = tmp_path / "out"
    pipeline.grade(_flat(tmp_path / "class", "alice", "bob", "carol"), out, options=pipeline.Options(**OPTIONS))
    before = _rows(out)
    offline["scores"]["bob"] = 100  # bob's notebook replaced after grading; only his is graded again
    capsys.readouterr()
    pipeline.grade(_flat(tmp_path / "bob_only", "bob"), out, options=pipeline.Options(**OPTIONS))
    after = _rows(out)
    assert list(after) == ["alice", "bob", "carol"]  # before: bob's row alone, the class's grades gone
    assert after["alice"] == before["alice"] and after["carol"] == before["carol"]
    assert after["bob"]["score"] == "100"
    assert sorted(p.name for p in (out / "feedback").iterdir()) == ["alice.html", "bob.html", "carol.html"]
    err = capsys.readouterr().err
    assert "keeps the rows of 2 student(s)" in err and "alice, carol" in err
    # a late submission graded alone joins the table; grading the whole class again gives the same table
    offline["scores"]["dave"] = 80
    pipeline.grade(_flat(tmp_path / "late", "dave"), out, options=pipeline.Options(**OPTIONS))
    text = (out / "grades.csv").read_text()
    assert list(_rows(out)) == ["alice", "bob", "carol", "dave"]
    pipeline.grade(_flat(tmp_path / "all", "alice", "bob", "carol", "dave"), out, options=pipeline.Options(**OPTIONS))
    assert (out / "grades.csv").read_text() == text


@pytest.mark.parametrize("text", ["name,grade\nalice,12\n", "student_id,score\n",
                                  "student_id,score,max_score,status," + ",".join(spec.CELL_IDS) + "\nalice,x\n"])
def test_a_grades_csv_not_written_by_the_grader_is_refused_before_grading_and_kept(tmp_path, offline, text):
    out = tmp_path / "out"
    out.mkdir()
    (out / "grades.csv").write_text(text)
    with pytest.raises(UserError, match="not a grades.csv that `decodesched grade` wrote"):
        pipeline.grade(_flat(tmp_path / "class", "bob"), out, options=pipeline.Options(**OPTIONS))
    assert (out / "grades.csv").read_text() == text  # before: replaced, the instructor's table lost
    assert offline["gradebook"] == []


def test_a_sigterm_once_the_gradebook_is_written_still_writes_grades_csv(tmp_path, offline, monkeypatch):
    """A SIGTERM between the gradebook and grades.csv left the gradebook with the new grades and grades.csv with
    the old ones; now the signal waits until both are written."""
    out = tmp_path / "out"
    pipeline.grade(_flat(tmp_path / "class", "alice"), out, options=pipeline.Options(**OPTIONS))
    offline["scores"]["alice"] = 100
    record = pipeline.update_gradebook

    def then_terminated(*args):
        record(*args)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(pipeline, "update_gradebook", then_terminated)
    with terminate_like_interrupt(), pytest.raises(Terminated):
        pipeline.grade(tmp_path / "class", out, options=pipeline.Options(**OPTIONS))
    assert offline["gradebook"][-1] == {"alice": 100.0}
    assert _rows(out)["alice"]["score"] == "100"  # before: 50, as the gradebook was before
    assert not [p for p in out.rglob(".*")]  # no temporary file left


def test_the_submission_time_comes_from_nbgraders_timestamp_file_only(tmp_path):
    tree = tmp_path / "submitted" / "dave" / spec.ASSIGNMENT
    tree.mkdir(parents=True)
    (tree / spec.NOTEBOOK).write_text("{}")
    (tree / "timestamp.txt").write_text("2026-12-09 12:00:00.000000 UTC\n")
    flat = _flat(tmp_path / "flat", "erin")
    (flat / "timestamp.txt").write_text("2026-12-09 12:00:00 UTC")
    subs = {s.student_id: s for s in notebook.collect_submissions(tmp_path) + notebook.collect_submissions(flat)}
    assert notebook.submitted_at(subs["dave"]) == "2026-12-09 12:00:00.000000 UTC"
    assert notebook.submitted_at(subs["erin"]) is None
    (tree / "timestamp.txt").unlink()
    os.mkfifo(tree / "timestamp.txt")  # never opened: it would wait for ever
    assert notebook.submitted_at(subs["dave"]) is None


# ---- the real commands: `decodesched assignment init/build`, `decodesched grade`, `nbgrader export` ----

def _cli(*args, cwd):
    proc = subprocess.run([sys.executable, "-m", "decodesched.cli", *args], capture_output=True, text=True,
                          env=tool_env(), cwd=cwd, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _edit_cell(course: Path, grade_id: str, old: str, new: str) -> None:
    path = course / "source" / spec.ASSIGNMENT / spec.NOTEBOOK
    nb = json.loads(path.read_text(encoding="utf-8"))
    (cell,) = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id]
    source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    assert source.count(old) == 1
    cell["source"] = source.replace(old, new)
    path.write_text(json.dumps(nb, ensure_ascii=False, indent=1), encoding="utf-8")


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    """A course made and built with the real commands, two submissions collected into nbgrader's submitted/
    tree (dave's after the due date), graded once; then a visible test fixed and the release rebuilt."""
    root = tmp_path_factory.mktemp("term")
    _cli("assignment", "init", str(root / "course"), cwd=root)
    course = root / "course"
    first_build = _cli("assignment", "build", cwd=course)
    subprocess.run([sys.executable, "-m", "nbgrader", "db", "assignment", "add", spec.ASSIGNMENT,
                    "--duedate=2026-12-05 00:00:00 UTC"], cwd=course, env=tool_env(), capture_output=True, check=True)
    release = json.loads((course / "release" / spec.ASSIGNMENT / spec.NOTEBOOK).read_text())
    for sid, source, stamp in [("alice", attacks.reference_source(), "2026-12-01 10:00:00.000000 UTC"),
                               ("dave", attacks.honest_source(), "2026-12-09 12:00:00.000000 UTC")]:
        folder = course / "submitted" / sid / spec.ASSIGNMENT
        folder.mkdir(parents=True)
        (folder / spec.NOTEBOOK).write_text(json.dumps(attacks._with_solution(release, source)))
        (folder / "timestamp.txt").write_text(stamp)
    first = grade_folder(course, course, root / "out_first")
    _edit_cell(course, "test_todo1_enqueue", 'expect_equal("priority", ', 'expect_equal("priority after enqueue", ')
    rebuilt = _cli("assignment", "build", "--force", cwd=course)
    return {"course": course, "root": root, "first": first, "build_notes": (first_build.stderr, rebuilt.stderr)}


@pytest.mark.slow
def test_a_test_cell_fixed_and_rebuilt_leaves_earlier_submissions_graded_not_tampered(term):
    again = grade_folder(term["course"], term["course"], term["root"] / "out_rebuilt")
    first = term["first"]["rows"]
    # before: both tampered
    assert {s: r["status"] for s, r in again["rows"].items()} == {"alice": "graded", "dave": "graded"}
    assert again["rows"] == first
    page = (again["out"] / "feedback" / "alice.html").read_text(encoding="utf-8")
    assert "as an earlier release had them" in page and "test_todo1_enqueue" in page
    # a cell no release ever had is still evidence
    nb = json.loads((term["course"] / "submitted" / "alice" / spec.ASSIGNMENT / spec.NOTEBOOK).read_text())
    (cell,) = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "test_todo1_enqueue"]
    cell["source"] = "print('TODO 1 visible tests passed / 通过')\n"
    subs = term["root"] / "altered"
    subs.mkdir()
    (subs / "mallory.ipynb").write_text(json.dumps(nb))
    assert grade_folder(subs, term["course"], term["root"] / "out_altered")["rows"]["mallory"]["status"] == "tampered"


@pytest.mark.slow
def test_nbgrader_export_shows_when_each_student_submitted(term):
    subprocess.run([sys.executable, "-m", "nbgrader", "export"], cwd=term["course"], env=tool_env(),
                   capture_output=True, check=True)
    with open(term["course"] / "grades.csv", newline="") as fh:
        rows = {r["student_id"]: r for r in csv.DictReader(fh)}
    assert rows["alice"]["timestamp"] == "2026-12-01 10:00:00"  # before: empty, a late submission unseen
    assert rows["dave"]["timestamp"] == "2026-12-09 12:00:00" and rows["dave"]["duedate"] == "2026-12-05 00:00:00"
    assert float(rows["dave"]["raw_score"]) == float(term["first"]["rows"]["dave"]["score"])


@pytest.mark.slow
def test_a_build_says_when_an_edited_test_cell_is_not_what_grades(term):
    untouched, edited = term["build_notes"]
    assert "note" not in untouched
    assert "test cells differ from the template's: test_todo1_enqueue;" in edited  # before: nothing said
    assert len(edited.strip().splitlines()) == 1
