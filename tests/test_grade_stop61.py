"""The grader against students who edit nbgrader's metadata, and hand-ins that are no notebook (stop 61).

A test cell made a solution cell (or a task) with its source kept was no tamper evidence (the grading flags
compared were `grade`, `points` and `locked`; the checksum check, which would have seen it, never ran on a
source kept as a list of lines), and nbgrader's copy kept the student's flags: nbgrader stopped ("Inconsistent
checksums", "the nbgrader metadata may be corrupted") and the submission read `crashed`, as did a solution cell
made a graded cell worth 50 points. Now a changed flag of a locked/test cell is evidence and nbgrader's copy gets
the release's grading metadata. A gzip or zip file named ``.ipynb`` said "invalid JSON: the file is not UTF-8
text"; now the row says what the file is.

The unit tests check each cause; one `decodesched grade` run (slow) checks what an instructor sees."""

from __future__ import annotations

import bz2
import copy
import gzip
import io
import json
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from decodesched.grader import autograde, evidence, notebook, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks.attacks import _with_solution, reference_source  # noqa: E402
from grader_attacks.course import build_course, grade_folder  # noqa: E402

SOURCE = Path(__file__).resolve().parents[1] / "assignments" / "source" / spec.ASSIGNMENT / spec.NOTEBOOK
HIDDEN = "hidden_todo1_enqueue"


def _release() -> dict:
    return json.loads(SOURCE.read_text(encoding="utf-8"))


def _meta(nb: dict, grade_id: str) -> dict:
    cell = next(c for c in nb["cells"] if notebook._nbgrader_meta(c).get("grade_id") == grade_id)
    return cell["metadata"]["nbgrader"]


# (name, grade_id, the nbgrader metadata a student changed)
FLIPS = [
    ("made_solution", HIDDEN, {"solution": True}),
    ("made_task", HIDDEN, {"task": True}),
    ("solution_graded", spec.SOLUTION_CELL, {"grade": True, "points": 50}),
]


def _flipped(release: dict, grade_id: str, change: dict) -> dict:
    nb = copy.deepcopy(release)
    _meta(nb, grade_id).update(change)
    return nb


@pytest.mark.parametrize("change", [{"solution": True}, {"task": True}], ids=["solution", "task"])
def test_a_test_cells_changed_flag_is_tamper_evidence(change):
    release = _release()
    assert evidence.altered_cells(_flipped(release, HIDDEN, change), release) == [HIDDEN]
    assert evidence.altered_cells(copy.deepcopy(release), release) == []


@pytest.mark.parametrize("name,grade_id,change", FLIPS, ids=[f[0] for f in FLIPS])
def test_nbgraders_copy_gets_the_releases_grading_metadata(name, grade_id, change):
    release = _release()
    fixed, notes = autograde.for_nbgrader(_flipped(release, grade_id, change), release)
    got = _meta(fixed, grade_id)
    assert {k: got.get(k) for k in change} == {k: _meta(release, grade_id).get(k) for k in change}
    assert any(grade_id in n and "release's" in n for n in notes)
    assert not any("release's" in n for n in autograde.for_nbgrader(release, release)[1])  # untouched: no note


def _tar(data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo(spec.NOTEBOOK)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zip(data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(spec.NOTEBOOK, data)
    return buf.getvalue()


@pytest.mark.parametrize("pack,what", [(gzip.compress, "a gzip file"), (_zip, "a zip archive"), (_tar, "a tar archive"),
                                       (bz2.compress, "a bzip2 file")], ids=["gzip", "zip", "tar", "bzip2"])
def test_a_packed_notebook_is_invalid_and_says_what_it_is(tmp_path, pack, what):
    path = tmp_path / "alice.ipynb"
    path.write_bytes(pack(SOURCE.read_bytes()))
    with pytest.raises(notebook.InvalidSubmission) as exc:
        notebook.load_notebook(path)
    assert what in str(exc.value) and "unpack it" in str(exc.value) and "invalid JSON" not in str(exc.value)


# --- one real grading ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    pytest.importorskip("nbgrader")
    root = tmp_path_factory.mktemp("stop61")
    course, release_path = build_course(root)
    release = json.loads(release_path.read_text(encoding="utf-8"))
    correct = _with_solution(release, reference_source())
    subs = root / "subs"
    subs.mkdir()
    for name, grade_id, change in FLIPS:
        (subs / f"{name}.ipynb").write_text(json.dumps(_flipped(correct, grade_id, change)), encoding="utf-8")
    (subs / "packed.ipynb").write_bytes(gzip.compress(json.dumps(correct).encode("utf-8")))
    return grade_folder(subs, course, root / "out")


def _notes(out: Path, sid: str) -> str:
    return (out / "feedback" / f"{sid}.html").read_text(encoding="utf-8")


def test_a_flipped_flag_is_tampered_or_graded_never_crashed(graded):
    rows, out = graded["rows"], graded["out"]
    full = str(spec.MAX_SCORE)
    # a locked/test cell whose flags changed is evidence; its solution still earns what it earns
    for sid in ("made_solution", "made_task"):
        assert (rows[sid]["status"], rows[sid]["score"]) == ("tampered", full), (sid, rows[sid])
        assert "nbgrader autograde failed" not in _notes(out, sid)
    # the solution cell's flags are the student's editor's business: graded, nbgrader given the release's
    assert (rows["solution_graded"]["status"], rows["solution_graded"]["score"]) == ("graded", full)
    assert "nbgrader autograde failed" not in _notes(out, "solution_graded")
    assert rows["packed"]["status"] == "invalid"
    assert "invalid packed: not a readable notebook (the file is a gzip file" in graded["stderr"]
