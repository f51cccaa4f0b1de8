"""Real students' notebooks as their editors save them (audit of the intake, formats): a correct solution keeps its
100 whatever the file's encoding, its name's case, the cells' metadata, a copied or re-created solution cell; a file
that truly is no notebook is `invalid` with a reason an instructor can act on, never a traceback.

The unit tests check each cause; one `decodesched grade` run (slow) checks what an instructor sees."""

from __future__ import annotations

import copy
import json
import sys
import warnings
from pathlib import Path

import pytest

from decodesched.grader import autograde, notebook, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks.attacks import minimal_notebook as _nb  # noqa: E402

SOLUTION = "class RequestState:\n    pass\n\nclass DecodeSchedulerSim:\n    pass\n"
# nbgrader metadata of a cell of another assignment's notebook (a helper a student copied over)
FOREIGN = {"grade": False, "grade_id": "cell-5f2c9d0e1a", "locked": False, "schema_version": 3, "solution": True}


def _gid(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _write(path: Path, nb) -> Path:
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


# --- the file: encodings and what is no notebook -----------------------------------------------------------------

@pytest.mark.parametrize("encode", [
    pytest.param(lambda text: b"\xef\xbb\xbf" + text.encode("utf-8"), id="utf8-bom (Notepad)"),
    pytest.param(lambda text: text.encode("utf-16"), id="utf16-bom (PowerShell 5 Out-File)"),
])
def test_a_notebook_with_a_byte_order_mark_or_crlf_is_read(tmp_path, encode):
    nb = _nb(solution=SOLUTION)
    path = tmp_path / "s.ipynb"
    path.write_bytes(encode(json.dumps(nb, indent=1, ensure_ascii=False) + "\n"))
    assert notebook.solution_source(notebook.load_notebook(path)) == SOLUTION


@pytest.mark.parametrize("content, reason", [
    (b"", "the file is empty (0 bytes)"),
    (b"  \n", "the file is empty (only whitespace)"),
    (b'{"cells": [\n<<<<<<< HEAD\n{}\n=======\n{}\n>>>>>>> theirs\n]}', "git merge-conflict markers"),
    (b'{"nbformat": 4,\n "cells": [', "invalid JSON at line 2, column 12"),
    (b'{"nbformat": 3, "worksheets": []}', "it is nbformat 3, an old Jupyter format"),
    (b"\xff\xfe\x00", "invalid JSON"),
])
def test_a_file_that_is_no_notebook_says_why(tmp_path, content, reason):
    path = tmp_path / "s.ipynb"
    path.write_bytes(content)
    with pytest.raises(notebook.InvalidSubmission, match="^not a") as info:
        notebook.load_notebook(path)
    assert reason in str(info.value)


# --- the folder: names ------------------------------------------------------------------------------------------

def test_a_notebook_named_in_upper_case_is_a_submission(tmp_path):
    # `alice.IPYNB` (a Windows zip) was skipped as "not a .ipynb notebook": a student missing from the grades
    for name in ("alice.IPYNB", "bob.Ipynb", "carol.ipynb"):
        _write(tmp_path / name, _nb())
    skipped = []
    subs = notebook.collect_submissions(tmp_path, skipped)
    assert [s.student_id for s in subs] == ["alice", "bob", "carol"] and skipped == []
    assert all(s.problem is None for s in subs)


def test_the_same_student_in_two_cases_is_one_invalid_row(tmp_path):
    _write(tmp_path / "alice.ipynb", _nb())
    _write(tmp_path / "alice.IPYNB", _nb())
    if len(list(tmp_path.iterdir())) == 1:  # a case-insensitive file system
        pytest.skip("the file system folds case")
    (sub,) = notebook.collect_submissions(tmp_path)
    assert sub.path is None and "two submissions for the same student id" in sub.problem


def test_a_notebook_under_another_name_in_the_assignment_folder_is_named(tmp_path):
    folder = tmp_path / "submitted" / "alice" / spec.ASSIGNMENT
    folder.mkdir(parents=True)
    _write(folder / f"{spec.ASSIGNMENT} (1).ipynb", _nb())
    (sub,) = notebook.collect_submissions(tmp_path)
    assert sub.path is None and f"it holds {spec.ASSIGNMENT} (1).ipynb" in sub.problem


# --- the solution cell: copies and lost metadata ----------------------------------------------------------------

def test_an_identical_copy_of_the_solution_cell_is_graded_once():
    nb = _nb(solution=SOLUTION)
    at = next(i for i, c in enumerate(nb["cells"]) if _gid(c) == spec.SOLUTION_CELL)
    twin = copy.deepcopy(nb["cells"][at])
    twin["source"] = SOLUTION.replace("\n", "  \r\n")  # the same code, other whitespace
    nb["cells"].insert(at + 1, twin)
    source, notes = notebook.find_solution(nb)
    assert source == SOLUTION and "identical copies of the solution cell" in notes[0]
    twin["source"] = SOLUTION + "x = 1\n"
    with pytest.raises(notebook.InvalidSubmission, match="2 cells claim .* their code differs"):
        notebook.find_solution(nb)


def test_a_solution_cell_that_lost_its_metadata_is_the_cell_that_defines_the_classes():
    nb = _nb(solution=SOLUTION)
    at = next(i for i, c in enumerate(nb["cells"]) if _gid(c) == spec.SOLUTION_CELL)
    nb["cells"][at]["metadata"] = {"id": "xYz"}  # re-created by the student, or an editor dropped it
    nb["cells"].insert(at, {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                            "source": "%%time\nclass Helper:\n    pass\n"})
    source, notes = notebook.find_solution(nb)
    assert source == SOLUTION and "lost its nbgrader metadata" in notes[0]
    nb["cells"].append({**nb["cells"][at + 1], "source": SOLUTION + "# my second try\nx = 2\n"})
    with pytest.raises(notebook.InvalidSubmission, match="2 different code cells define"):
        notebook.find_solution(nb)
    nb = _nb(solution="x = 1\n")
    nb["cells"][1]["metadata"] = {}
    with pytest.raises(notebook.InvalidSubmission, match="no solution cell"):
        notebook.find_solution(nb)


# --- the locked/test cells: a code formatter ---------------------------------------------------------------------

def _release_with_test(source: str):
    nb = _nb(solution=SOLUTION)
    test = next(c for c in nb["cells"] if _gid(c) == "test_todo1_enqueue")
    test["source"] = source
    return nb


TEST = "sim = DecodeSchedulerSim()\nsim.enqueue(7, 3, 4, priority=-1, required_blocks=3, deadline_step=9)\nassert sim.phase == 'prefill'\n"
# what "Format notebook" (black, ruff) in VS Code or JupyterLab makes of it: quotes, a wrapped call
FORMATTED = ('sim = DecodeSchedulerSim()\nsim.enqueue(\n    7, 3, 4, priority=-1, required_blocks=3, deadline_step=9\n)\n'
             'assert sim.phase == "prefill"\n')


def test_a_test_cell_that_a_code_formatter_rewrote_is_graded_as_released_not_as_tampering():
    from decodesched.grader import evidence, pipeline

    release = _release_with_test(TEST)
    nb = _release_with_test(FORMATTED)
    restored, notes = pipeline.restore_formatting(nb, release)
    assert evidence.altered_cells(restored, release) == [] and "only the formatting" in notes[0]
    assert notebook._cell_source(restored["cells"][2]) == TEST
    changed = _release_with_test(FORMATTED.replace('"prefill"', '"decode"'))  # another program: still evidence
    restored, notes = pipeline.restore_formatting(changed, release)
    assert evidence.altered_cells(restored, release) == ["test_todo1_enqueue"] and notes == []


def test_cells_turned_into_markdown_by_a_key_press_are_graded_as_code():
    # Esc then M (or R) in Jupyter: nbgrader turns such a cell back (OverwriteCells); the grader said "invalid"
    # for the solution cell and "tampered" for a test cell
    from decodesched.grader import evidence, pipeline

    nb = _nb(solution=SOLUTION)
    sol = next(c for c in nb["cells"] if _gid(c) == spec.SOLUTION_CELL)
    sol["cell_type"] = "markdown"
    del sol["outputs"], sol["execution_count"]
    source, notes = notebook.find_solution(nb)
    assert source == SOLUTION and "turned into a markdown cell" in notes[0]
    release = _release_with_test(TEST)
    nb = _release_with_test(TEST)
    test = next(c for c in nb["cells"] if _gid(c) == "test_todo1_enqueue")
    test["cell_type"] = "raw"
    del test["outputs"], test["execution_count"]
    assert evidence.altered_cells(nb, release) == ["test_todo1_enqueue"]
    restored, notes = pipeline.restore_formatting(nb, release)
    assert evidence.altered_cells(restored, release) == [] and "turned into markdown or raw" in notes[0]
    fixed, _ = autograde.for_nbgrader(_nb(solution=SOLUTION) | {"cells": [
        {**c, "cell_type": "markdown"} if _gid(c) == spec.SOLUTION_CELL else c for c in _nb(solution=SOLUTION)["cells"]]},
        _nb(solution=SOLUTION))
    assert [c["cell_type"] for c in fixed["cells"]] == [c["cell_type"] for c in _nb()["cells"]]


# --- nbgrader's copy ---------------------------------------------------------------------------------------------

def _release():
    nb = _nb(solution=SOLUTION)
    for cell in nb["cells"]:
        if "nbgrader" in cell["metadata"]:
            cell["metadata"]["nbgrader"]["schema_version"] = 3
    return nb


def _nbgrader_reads(nb, release) -> None:
    """What nbgrader autograde does on reading a notebook (nbformat's schema, nbgrader's metadata schema, and
    OverwriteCells, which drops the grade_id of a cell its gradebook lacks before CheckCellMetadata); raises as it
    does."""
    import nbformat
    from nbgrader.nbgraderformat import MetadataValidator

    with warnings.catch_warnings():  # cells without ids (nbformat 4.4 and older) are valid; nbformat says so loudly
        warnings.simplefilter("ignore", nbformat.warnings.MissingIDFieldWarning)
        node = nbformat.reads(json.dumps(nb), as_version=4)
        nbformat.validate(node)
        MetadataValidator().validate_nb(node)
        known = {_gid(c) for c in release["cells"]} - {None}
        for cell in node.cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id", None) not in known | {None}:
                del cell.metadata.nbgrader["grade_id"]
        MetadataValidator().validate_nb(node)


@pytest.mark.parametrize("damage", ["no nbformat_minor", "markdown without metadata", "code without outputs",
                                    "foreign nbgrader cell", "old schema_version", "a key of nbgrader's lost"])
def test_nbgraders_copy_is_repaired_so_that_nbgrader_reads_it(damage):
    pytest.importorskip("nbgrader")
    release = _release()
    nb = copy.deepcopy(release)
    sol = next(c for c in nb["cells"] if _gid(c) == spec.SOLUTION_CELL)
    if damage == "no nbformat_minor":
        del nb["nbformat_minor"]
    elif damage == "markdown without metadata":
        del nb["cells"][0]["metadata"]
    elif damage == "code without outputs":
        del sol["outputs"], sol["execution_count"]
    elif damage == "foreign nbgrader cell":
        nb["cells"].append({"cell_type": "code", "metadata": {"nbgrader": dict(FOREIGN)}, "outputs": [],
                            "execution_count": 4, "source": "def helper():\n    return 1\n"})
    elif damage == "old schema_version":
        sol["metadata"]["nbgrader"]["schema_version"] = 1
    else:
        del sol["metadata"]["nbgrader"]["locked"]
    with pytest.raises(Exception):  # noqa: B017 - nbformat's and nbgrader's own errors
        _nbgrader_reads(nb, release)
    fixed, notes = autograde.for_nbgrader(nb, release)
    _nbgrader_reads(fixed, release)
    assert [notebook._cell_source(c) for c in fixed["cells"]] == [notebook._cell_source(c) for c in nb["cells"]]
    if damage == "foreign nbgrader cell":
        assert "cell-5f2c9d0e1a" in notes[0] and "nbgrader" not in fixed["cells"][-1]["metadata"]
    assert autograde.for_nbgrader(release, release) == (release, [])  # an untouched notebook is left as it is


def test_nbgraders_failure_is_named_by_its_exception_not_its_last_words():
    err = ("[AutogradeApp | ERROR] Traceback (most recent call last):\n  File \"x.py\", line 1\n"
           "nbgrader.nbgraderformat.common.ValidationError: Notebook failed to validate; the nbgrader metadata may be "
           "corrupted.\n[AutogradeApp | ERROR] Please see the the above traceback for details on the specific errors "
           "on the above failures.\n")
    assert autograde._last_line(err) == ("ValidationError: Notebook failed to validate; the nbgrader metadata may be "
                                         "corrupted.")
    assert autograde._last_line("just a line\n") == "just a line"


# --- what the instructor sees: one `decodesched grade` run -----------------------------------------------------

@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    from grader_attacks import attacks
    from grader_attacks.course import build_course, grade_folder

    base = tmp_path_factory.mktemp("formats")
    course, release_path = build_course(base)
    release = json.loads(release_path.read_text(encoding="utf-8"))
    correct = attacks._with_solution(release, attacks.reference_source())
    subs = base / "subs"
    subs.mkdir()
    text = json.dumps(correct, indent=1, ensure_ascii=False) + "\n"
    (subs / "bom.ipynb").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    (subs / "utf16.ipynb").write_bytes(text.encode("utf-16"))
    (subs / "UPPER.IPYNB").write_text(text, encoding="utf-8")
    nbs = {}
    nb = copy.deepcopy(correct)
    del nb["nbformat_minor"]
    nbs["no_minor"] = nb
    nb = copy.deepcopy(correct)
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            del cell["metadata"]
    nbs["markdown_no_metadata"] = nb
    nb = copy.deepcopy(correct)
    at = next(i for i, c in enumerate(nb["cells"]) if _gid(c) == spec.SOLUTION_CELL)
    nb["cells"].insert(at, {"cell_type": "code", "execution_count": 7, "id": "copied", "outputs": [],
                            "metadata": {"nbgrader": dict(FOREIGN)}, "source": "def helper():\n    return 1\n"})
    nbs["foreign_nbgrader_cell"] = nb
    nb = copy.deepcopy(correct)
    at = next(i for i, c in enumerate(nb["cells"]) if _gid(c) == spec.SOLUTION_CELL)
    nb["cells"].insert(at + 1, {**copy.deepcopy(nb["cells"][at]), "id": "copy-of-solution"})
    nbs["solution_duplicated"] = nb
    nb = copy.deepcopy(correct)
    nb["cells"][next(i for i, c in enumerate(nb["cells"]) if _gid(c) == spec.SOLUTION_CELL)]["metadata"] = {}
    nbs["solution_meta_lost"] = nb
    nb = copy.deepcopy(correct)
    for cell in nb["cells"]:  # "Format notebook" with black: every code cell, locked ones too
        if cell["cell_type"] == "code" and _gid(cell) != spec.SOLUTION_CELL:
            text = "".join(cell["source"])
            cell["source"] = text.replace("'prefill'", '"prefill"').replace("'waiting'", '"waiting"')
    nbs["formatted"] = nb
    nb = copy.deepcopy(correct)
    for cell in nb["cells"]:  # Esc M on the solution cell, Esc R on a test cell
        if _gid(cell) in (spec.SOLUTION_CELL, "test_todo2_schedule_key"):
            cell["cell_type"] = "markdown" if _gid(cell) == spec.SOLUTION_CELL else "raw"
            del cell["outputs"], cell["execution_count"]
    nbs["cells_retyped"] = nb
    for name, nb in nbs.items():
        _write(subs / f"{name}.ipynb", nb)
    (subs / "empty.ipynb").write_bytes(b"")
    return grade_folder(subs, course, base / "out", "--timeout", "60")


@pytest.mark.slow
@pytest.mark.parametrize("sid", ["bom", "utf16", "UPPER", "no_minor", "markdown_no_metadata", "foreign_nbgrader_cell",
                                 "solution_duplicated", "solution_meta_lost", "formatted",
                                 "cells_retyped"])
def test_a_correct_solution_saved_by_any_editor_scores_100(graded, sid):
    row = graded["rows"].get(sid)
    page = (graded["out"] / "feedback" / f"{sid}.html").read_text(encoding="utf-8") if row else ""
    assert row and (row["status"], float(row["score"])) == ("graded", spec.MAX_SCORE), (row, page[-2000:])
    assert "Traceback" not in graded["stderr"]


@pytest.mark.slow
def test_an_empty_file_is_one_invalid_row_with_its_reason(graded):
    assert graded["rows"]["empty"]["status"] == "invalid"
    assert "invalid empty: not a readable notebook: the file is empty (0 bytes)" in graded["stderr"]
