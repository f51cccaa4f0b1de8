"""The submitted FILE rather than the code in it (stop 58): metadata that nbformat's schema refuses and pasted
screenshots no longer make an honest, correct notebook `crashed` (nbgrader stopped on them: "NotebookValidationError:
'python3' is not of type 'object'", "File too large"); JSON nested too deep, a folder in place of the notebook and a
link to the course's own notebooks (the solution) are `invalid` rows that say so; a submission edited while it is
graded is not kept for a resumed grading under its new bytes.

The unit tests check each cause; one `decodesched grade` run (slow) checks what an instructor sees."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from decodesched.grader import autograde, evidence, notebook, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.attacks import minimal_notebook as _nb  # noqa: E402
from grader_attacks.course import build_course, grade_folder  # noqa: E402
from test_grade_formats import _gid, _nbgrader_reads, _release  # noqa: E402
from test_grade_resume import offline  # noqa: E402,F401 - the fixture: `pipeline.grade` without nbgrader or sandbox


SOLUTION = "class RequestState:\n    pass\n\nclass DecodeSchedulerSim:\n    pass\n"


def _sol(nb):
    return next(c for c in nb["cells"] if _gid(c) == spec.SOLUTION_CELL)


# what a hand edit, a converter or another tool leaves in a notebook, each refused by nbformat 4.5's schema
SCHEMA_DAMAGE = {
    "kernelspec as text": lambda nb: nb["metadata"].update(kernelspec="python3"),
    "kernelspec without name": lambda nb: nb["metadata"].update(kernelspec={"display_name": "Python 3"}),
    "language_info as text": lambda nb: nb["metadata"].update(language_info="R"),
    "title not text": lambda nb: nb["metadata"].update(title=5),
    "authors as text": lambda nb: nb["metadata"].update(authors="me"),
    "a key the notebook has not": lambda nb: nb.update(worksheets=[]),
    "a key a cell has not": lambda nb: _sol(nb).update(prompt_number=3),
    "attachments on a code cell": lambda nb: _sol(nb).update(attachments={}),
    "attachments of another shape": lambda nb: nb["cells"][0].update(attachments={"a.png": "iVBORw0KGgo="}),
    "tags as text": lambda nb: _sol(nb)["metadata"].update(tags="todo"),
    "tags twice or with a comma": lambda nb: nb["cells"][0]["metadata"].update(tags=["a", "a", "b,c"]),
    "collapsed as text": lambda nb: _sol(nb)["metadata"].update(collapsed="yes"),
    "scrolled as text": lambda nb: _sol(nb)["metadata"].update(scrolled="no"),
    "jupyter as text": lambda nb: _sol(nb)["metadata"].update(jupyter="hidden"),
    "execution times as numbers": lambda nb: _sol(nb)["metadata"].update(execution={"iopub.status.busy": 5}),
    "an empty cell name": lambda nb: _sol(nb)["metadata"].update(name=""),
}


@pytest.mark.parametrize("damage", sorted(SCHEMA_DAMAGE))
def test_nbgraders_copy_keeps_only_what_nbformats_schema_allows(damage):
    pytest.importorskip("nbgrader")
    release = _release()
    release["metadata"] = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                           "language_info": {"name": "python"}}
    nb = copy.deepcopy(release)
    SCHEMA_DAMAGE[damage](nb)
    with pytest.raises(Exception):  # noqa: B017 - nbformat's own error
        _nbgrader_reads(nb, release)
    fixed, notes = autograde.for_nbgrader(nb, release)
    _nbgrader_reads(fixed, release)
    assert [notebook._cell_source(c) for c in fixed["cells"]] == [notebook._cell_source(c) for c in nb["cells"]]
    assert fixed["metadata"]["kernelspec"] == release["metadata"]["kernelspec"]
    if not any(key in damage for key in ("kernelspec", "language_info", "attachments")):  # (no note: not theirs)
        assert "left out of nbgrader's copy" in notes[-1], notes


def test_well_formed_metadata_stays_in_nbgraders_copy():
    release = _release()
    nb = copy.deepcopy(release)
    nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    _sol(nb)["metadata"].update(tags=["skip-execution"], collapsed=False, scrolled="auto", name="sol",
                                execution={"iopub.status.busy": "2026-12-01T10:00:00Z"}, jupyter={})
    fixed, notes = autograde.for_nbgrader(nb, release)
    assert fixed == nb and notes == []


def test_pasted_images_are_left_out_of_nbgraders_copy():
    # a markdown cell's attachments (screenshots pasted into the notebook) are no outputs: 64 MiB of them were kept,
    # and nbgrader could not write its graded copy ("OSError: [Errno 27] File too large": a correct notebook `crashed`)
    nb = _release()
    nb["cells"][0]["attachments"] = {f"shot{i}.png": {"image/png": "iVBORw0KGgo" * 1000} for i in range(10)}
    fixed, notes = autograde.for_nbgrader(nb, _release())
    assert "attachments" not in fixed["cells"][0] and notes == []
    assert notebook._cell_source(fixed["cells"][0]) == notebook._cell_source(nb["cells"][0])


@pytest.mark.parametrize("depth", [500, 100_000])
def test_json_nested_too_deep_is_invalid_and_says_so(tmp_path, depth):
    # 100 000 levels said only "invalid JSON", as for a typo; 500 to 990 were read, and nbgrader stopped on them
    # ("RecursionError": `crashed`) or the grader's own JSON writer could
    path = tmp_path / "s.ipynb"
    nb = json.dumps(_nb(solution=SOLUTION) | {"metadata": {"x": None}})
    path.write_text(nb.replace('"x": null', '"x": ' + "[" * depth + "]" * depth), encoding="utf-8")
    with pytest.raises(notebook.InvalidSubmission, match="nested too deep: over 100 levels"):
        notebook.load_notebook(path)


def test_a_notebook_nested_as_saved_ones_are_is_read(tmp_path):
    path = tmp_path / "s.ipynb"
    outputs = [{"output_type": "display_data", "metadata": {}, "data": {"application/json": {"x": None}}}]
    nb = json.dumps(_nb(solution=SOLUTION, extra_cells=[{"cell_type": "code", "metadata": {"x": None},
                                                         "outputs": outputs, "execution_count": 1, "source": ""}]))
    # 90 levels in a cell's metadata; 500 in an output's own JSON data (outputs are dropped: never graded)
    nb = nb.replace('"x": null', '"x": ' + "[" * 90 + "]" * 90, 1).replace('"x": null', '"x": ' + "[" * 500 + "]" * 500)
    path.write_text(nb, encoding="utf-8")
    assert notebook.solution_source(notebook.load_notebook(path)) == SOLUTION


def test_a_folder_in_place_of_the_notebook_is_the_students_invalid_row(tmp_path):
    # flat: `alice.ipynb/` was skipped as "a folder without decode_scheduling/ inside" (no row for alice); the
    # nbgrader tree said "it holds decode_scheduling.ipynb: rename the notebook to ...decode_scheduling.ipynb"
    flat = tmp_path / "flat"
    (flat / "alice.ipynb").mkdir(parents=True)
    (flat / "bob.ipynb").write_text(json.dumps(_nb()), encoding="utf-8")
    skipped = []
    subs = {s.student_id: s for s in notebook.collect_submissions(flat, skipped)}
    assert skipped == [] and subs["bob"].problem is None
    assert subs["alice"].path is None and subs["alice"].problem == "alice.ipynb is a folder, not a notebook file"
    tree = tmp_path / "tree" / "submitted" / "carol" / spec.ASSIGNMENT / spec.NOTEBOOK
    tree.mkdir(parents=True)
    (sub,) = notebook.collect_submissions(tmp_path / "tree")
    assert sub.path is None and sub.problem == (f"{spec.ASSIGNMENT}/{spec.NOTEBOOK} in the submission is a folder, "
                                                "not a notebook file")


def test_a_link_to_the_courses_own_notebooks_is_no_hand_in(tmp_path):
    # `tar` and `unzip` restore links: a student's archive unpacked into the folder handed in the instructor's source
    # notebook (`alice.ipynb -> ../course/source/...`), graded 100 (`tampered` only for its hidden test cells)
    from decodesched.grader import pipeline

    course = tmp_path / "course"
    for folder in ("source", "release", "submitted/bob"):
        (course / folder / spec.ASSIGNMENT).mkdir(parents=True)
        (course / folder / spec.ASSIGNMENT / spec.NOTEBOOK).write_text(json.dumps(_nb()), encoding="utf-8")
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "alice.ipynb").symlink_to(Path("..", "course", "source", spec.ASSIGNMENT, spec.NOTEBOOK))
    (subs / "carol").mkdir()
    (subs / "carol" / spec.ASSIGNMENT).symlink_to(course / "release" / spec.ASSIGNMENT)  # a folder link
    (subs / "bob.ipynb").symlink_to(course / "submitted" / "bob" / spec.ASSIGNMENT / spec.NOTEBOOK)  # (a regrade)
    (subs / "dave.ipynb").write_text(json.dumps(_nb()), encoding="utf-8")
    (subs / "erin.ipynb").symlink_to(subs / "dave.ipynb")
    got = {s.student_id: s for s in pipeline._linked_course_files(notebook.collect_submissions(subs), course)}
    assert got["alice"].path is None and got["alice"].problem.startswith(
        "the notebook is a link to the course's own source/ folder (")
    assert got["carol"].path is None and "the course's own release/ folder" in got["carol"].problem
    assert all(got[sid].problem is None and got[sid].path for sid in ("bob", "dave", "erin"))
    tree = course / "submitted"  # the course's own tree, graded as it is
    assert [s.problem for s in pipeline._linked_course_files(notebook.collect_submissions(tree), course)] == [None]


# --- a submission edited while it is graded (resume) -------------------------------------------------------------

def test_a_submission_edited_while_it_is_graded_is_not_kept_under_its_new_bytes(offline, tmp_path, capsys,
                                                                                 monkeypatch):
    # the verdict of the bytes read first was kept under the key of the bytes found at the end: a rerun after a stop
    # took it for the edited file, never grading what the student handed in last
    from decodesched.grader import pipeline
    from test_grade_resume import _kept, _rerun

    graded_as = {}
    grade_one = pipeline.grade_one

    def edited_while_graded(sub, *a, **k):
        graded_as[sub.student_id] = sub.path.read_bytes()
        if sub.student_id == "alice" and offline["stop"]:  # a second hand-in (a sync, a late copy) lands meanwhile
            sub.path.write_text(json.dumps(_nb(solution=SOLUTION), indent=2), encoding="utf-8")
        return grade_one(sub, *a, **k)

    monkeypatch.setattr(pipeline, "grade_one", edited_while_graded)
    out = tmp_path / "out"
    offline.update(stop=True, out=out, graded=[], need=1)
    with pytest.raises(KeyboardInterrupt):
        pipeline.grade(offline["subs"], out, options=pipeline.Options(run_nbgrader=False, jobs=1, progress=False))
    offline["stop"] = False
    assert len(_kept(out)) == 1  # dave's; alice's file changed as she was graded
    graded, _err = _rerun(offline, out, capsys)
    assert graded == ["alice", "bob", "carol"]
    assert graded_as["alice"] == (offline["subs"] / "alice.ipynb").read_bytes()  # her last hand-in was graded


# --- what the instructor sees: one `decodesched grade` run -----------------------------------------------------

@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("stop58")
    course, release_path = build_course(base)
    release = json.loads(release_path.read_text(encoding="utf-8"))
    correct = attacks._with_solution(release, attacks.reference_source())
    subs = base / "subs"
    nbs = {}
    nb = copy.deepcopy(correct)
    nb["metadata"].update(kernelspec="python3", language_info="python")
    nbs["kernel_as_text"] = nb
    nb = copy.deepcopy(correct)
    _sol(nb)["metadata"].update(tags="todo", collapsed="yes")
    _sol(nb)["prompt_number"] = 3
    nbs["cell_metadata_of_another_shape"] = nb
    nb = copy.deepcopy(correct)  # a bash kernel and an R language: nbgrader runs the release's Python kernel
    nb["metadata"].update(kernelspec={"name": "bash", "display_name": "Bash", "language": "bash"},
                          language_info={"name": "R"})
    nbs["kernel_bash"] = nb
    nb = attacks._with_solution(release, attacks.honest_source())  # a test cell edited, its checksum recomputed
    test = next(c for c in nb["cells"] if _gid(c) == "test_todo1_enqueue")
    test["source"] = "pass\n"
    test["metadata"]["nbgrader"]["checksum"] = evidence.nbgrader_checksum(test)
    nb["metadata"]["kernelspec"] = "python3"
    nbs["checksum_forged"] = nb
    nb = copy.deepcopy(correct)  # 66 MiB of screenshots pasted into a markdown cell
    nb["cells"][0]["attachments"] = {f"shot{i}.png": {"image/png": "iVBORw0KGgo" * 200_000} for i in range(33)}
    nbs["screenshots"] = nb
    tree = subs / "submitted"
    for sid, nb in nbs.items():
        folder = tree / sid / spec.ASSIGNMENT
        folder.mkdir(parents=True)
        (folder / spec.NOTEBOOK).write_text(json.dumps(nb, indent=1), encoding="utf-8")
        for name in ("numpy.py", "decodesched.py", "__init__.py"):  # would shadow imports from the working folder
            (folder / name).write_text("raise SystemExit('shadowed')\n", encoding="utf-8")
    (tree / "frank" / spec.ASSIGNMENT / spec.NOTEBOOK).mkdir(parents=True)
    (tree / "mallory" / spec.ASSIGNMENT).mkdir(parents=True)  # unpacked from her archive: a link to the solution
    (tree / "mallory" / spec.ASSIGNMENT / spec.NOTEBOOK).symlink_to(course / "source" / spec.ASSIGNMENT / spec.NOTEBOOK)
    return grade_folder(subs, course, base / "out", "--timeout", "60")


@pytest.mark.slow
def test_odd_metadata_keeps_the_full_grade_and_tampering_earns_nothing_more(graded):
    rows = graded["rows"]
    for sid in ("kernel_as_text", "cell_metadata_of_another_shape", "kernel_bash", "screenshots"):
        page = (graded["out"] / "feedback" / f"{sid}.html").read_text(encoding="utf-8")
        assert (rows[sid]["status"], float(rows[sid]["score"])) == ("graded", spec.MAX_SCORE), (sid, page[-1500:])
        assert "Traceback" not in page and "tamper" not in page, sid
    honest = rows["checksum_forged"]
    assert honest["status"] == "tampered" and float(honest["score"]) < spec.MAX_SCORE
    assert rows["frank"]["status"] == "invalid"
    assert (rows["mallory"]["status"], float(rows["mallory"]["score"])) == ("invalid", 0.0)
    assert "invalid mallory: the notebook is a link to the course's own source/ folder" in graded["stderr"]
    assert (f"invalid frank: {spec.ASSIGNMENT}/{spec.NOTEBOOK} in the submission is a folder, not a notebook file"
            in graded["stderr"]) and "Traceback" not in graded["stderr"]
