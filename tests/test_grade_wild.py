"""Honest notebooks from every editor and habit (audit of the intake, round "wild"): a correct solution keeps its
grade however the notebook was saved. The unit tests check each cause; one `decodesched grade` run (slow) checks
what an instructor sees."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest

from decodesched.grader import autograde, notebook, pipeline, spec, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.attacks import minimal_notebook as _nb  # noqa: E402
from grader_attacks.course import build_course, grade_folder  # noqa: E402
from test_grade_formats import _nbgrader_reads, _release  # noqa: E402


SOLUTION = "class RequestState:\n    pass\n\nclass DecodeSchedulerSim:\n    pass\n"


def _gid(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _printed(megabytes: int) -> dict:
    """A cell whose saved outputs are `megabytes` of an earlier run's prints, as VS Code keeps them."""
    line = "%07d " + "x" * 41 + "\n"
    return {"cell_type": "code", "execution_count": 7, "metadata": {}, "source": "for i in range(3): print(i)\n",
            "outputs": [{"name": "stdout", "output_type": "stream",
                         "text": [line % i for i in range(megabytes * 2**20 // 49)]}]}


def test_a_notebook_big_with_the_prints_it_was_saved_with_is_read_without_them(tmp_path):
    # 30 MiB of old prints made an honest, correct notebook `invalid` ("the notebook is 31 MiB (limit 20 MiB")
    nb = _nb(solution=SOLUTION, extra_cells=[_printed(30)])
    path = tmp_path / "s.ipynb"
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    assert path.stat().st_size > 30 * 2**20
    loaded = notebook.load_notebook(path)
    assert notebook.solution_source(loaded) == SOLUTION
    assert [c.get("outputs") for c in loaded["cells"]] == [None, [], [], []]  # dropped: never graded



def test_a_big_notebook_of_millions_of_tiny_values_is_refused_before_it_is_parsed(tmp_path):
    # what bounds the grading process's memory now that a notebook may be 100 MiB: 17 MiB of `[]` would take 0.5 GB
    path = tmp_path / "s.ipynb"
    path.write_text('{"nbformat": 4, "cells": [], "x": [' + ",".join(["[]"] * 6_000_000) + "]}", encoding="utf-8")
    with pytest.raises(notebook.InvalidSubmission, match="JSON values .* mostly outputs"):
        notebook.load_notebook(path)


@pytest.mark.parametrize("bad_id", ["cell 3", "c" * 65, "", 12345])
def test_a_cell_id_nbformat_refuses_is_renamed_in_nbgraders_copy(bad_id):
    # nbgrader autograde stopped ("NotebookValidationError: 'cell 3' does not match '^[a-zA-Z0-9-_]+$'"), so a correct
    # notebook was `crashed`; the id names nothing nbgrader grades (its cells go by grade_id)
    pytest.importorskip("nbgrader")
    release = _release()
    nb = json.loads(json.dumps(release))
    nb["cells"][0]["id"] = bad_id
    nb["cells"][1]["id"] = "kept_as-is"
    with pytest.raises(Exception):  # noqa: B017 - nbformat's own error
        _nbgrader_reads(nb, release)
    fixed, notes = autograde.for_nbgrader(nb, release)
    _nbgrader_reads(fixed, release)
    assert fixed["cells"][1]["id"] == "kept_as-is" and notes == [
        "1 cell id(s) nbformat does not accept (1-64 letters, digits, - or _) were renamed in nbgrader's copy"]


def test_a_class_written_in_the_cell_below_the_solution_cell_is_named_as_such():
    # the feedback said only "the solution cell did not define DecodeSchedulerSim" (0 points, by the task's rule), not
    # that the class is in another cell while the grader runs only the solution cell, as it does for a helper there
    ref = attacks.reference_source()
    cut = ref.index("class DecodeSchedulerSim")
    v = verdict.verdict_for_source(ref[:cut], shrink_failures=False)
    assert v.total == 0 and v.undefined == ["DecodeSchedulerSim"]
    nb = _nb(solution=ref[:cut], extra_cells=[{"cell_type": "code", "execution_count": None, "metadata": {},
                                               "outputs": [], "source": ref[cut:]}])
    assert pipeline.defined_in_other_cells(nb, v.undefined) == ["DecodeSchedulerSim"]


def test_help_left_in_the_solution_cell_is_no_error():
    # `help(...)` raised NameError in the grader (`python -I -S` has no `site`, which adds it): a note that a line of
    # a correct notebook failed; it only prints in the notebook, as `obj?` (already ignored) does
    v = verdict.verdict_for_source(attacks.reference_source() + "\nhelp(DecodeSchedulerSim.step)\n",
                                   shrink_failures=False)
    assert v.total == spec.MAX_SCORE and v.notes == []


# --- end to end: one `decodesched grade` run over what editors and habits make of a correct notebook --------------

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode()
STEP = "        candidates = [req for req in self.queue if not req.done]\n"
WILD = ("lab4", "classic44", "nbformat40", "vscode", "colab", "earlier_errors", "habits", "tabs_unicode",
        "scratch_cells", "big_outputs", "odd_cell_id", "minified_crlf_bom")


def _code(source: str, **more) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source, **more}


def _variants(release: dict) -> dict[str, bytes]:
    """Each a correct solution, saved as an editor saves it or written as an honest student writes it."""
    ref = attacks.reference_source()
    assert STEP in ref, "the reference solution changed; update STEP"

    def nb(source=ref, edit=lambda nb: None) -> dict:
        out = attacks._with_solution(release, source)
        edit(out)
        return out

    def below_solution(*cells):
        def edit(nb):
            at = next(i for i, c in enumerate(nb["cells"]) if _gid(c) == spec.SOLUTION_CELL)
            nb["cells"][at + 1:at + 1] = list(cells)
        return edit

    def lab4(nb):  # JupyterLab 4: sources as lists of lines, counts, outputs, timing metadata
        for n, c in enumerate(nb["cells"]):
            c["source"] = "".join(c["source"]).splitlines(True)
            if c["cell_type"] == "code":
                c.update(execution_count=n, outputs=[{"name": "stdout", "output_type": "stream", "text": ["ok\n"]}])
                c["metadata"].update(tags=[], execution={"iopub.execute_input": "2026-12-01T10:00:00.1Z"})

    def classic(minor):  # classic Notebook (4.4) and older files (4.0-4.2): no cell ids
        def edit(nb):
            nb["nbformat_minor"] = minor
            for c in nb["cells"]:
                c.pop("id", None)
                if minor < 1:
                    c.pop("attachments", None)
                if c["cell_type"] == "code":
                    c["metadata"].update(collapsed=False, scrolled=True)
        return edit

    def vscode(nb):
        nb["metadata"]["vscode"] = {"interpreter": {"hash": "a" * 64}}
        nb["metadata"]["kernelspec"] = {"name": ".venv", "display_name": ".venv (Python 3.12.1)", "language": "python"}
        for c in nb["cells"]:
            if c["cell_type"] == "code":
                c.update(execution_count=None)
                c["metadata"]["vscode"] = {"languageId": "python"}

    def colab(nb):  # nbformat 4.0, ids in the metadata, an image and a widget in every code cell's outputs
        nb["nbformat_minor"] = 0
        nb["metadata"] = {"colab": {"provenance": []}, "accelerator": "GPU", "widgets": {
            "application/vnd.jupyter.widget-state+json": {"w1": {"model_name": "IntProgressModel", "state": {}}}}}
        for n, c in enumerate(nb["cells"]):
            c["metadata"]["id"] = c.pop("id", f"c{n}")
            c.pop("attachments", None)
            if c["cell_type"] == "code":
                c["metadata"].update(colab={"base_uri": "https://localhost:8080/", "height": 300}, outputId="0f1e")
                c["outputs"] = [{"output_type": "display_data", "metadata": {}, "data": {"image/png": PNG}},
                                {"output_type": "display_data", "metadata": {}, "data": {
                                    "application/vnd.jupyter.widget-view+json": {"model_id": "w1", "version_major": 2,
                                                                                 "version_minor": 0}}}]

    def earlier_errors(nb):  # the outputs of a run before the solution was finished
        for c in nb["cells"]:
            if c["cell_type"] == "code":
                c["outputs"] = [{"output_type": "error", "ename": "NameError", "evalue": "name 'sim' is not defined",
                                 "traceback": ["\x1b[0;31mNameError\x1b[0m: name 'sim' is not defined"]}]

    habits = ("%%time\nfrom __future__ import annotations\nimport numpy as np\nname = input('your name: ')\n"
              + ref.replace(STEP, STEP + "        for r in candidates:\n            print('candidate', r.request_id)\n")
              + "\n%timeit DecodeSchedulerSim()\n!pip list\nfiles = !ls\nhelp(DecodeSchedulerSim.step)\n")
    text = {
        "lab4": nb(edit=lab4), "classic44": nb(edit=classic(4)), "nbformat40": nb(edit=classic(0)),
        "vscode": nb(edit=vscode), "colab": nb(edit=colab), "earlier_errors": nb(edit=earlier_errors),
        "habits": nb(habits),
        "tabs_unicode": nb("# C:\\Users\\张三\\new\\test.ipynb\n"
                           + ref.replace("candidates", "候选").replace("    ", "\t")),
        "scratch_cells": nb(edit=below_solution(
            _code("answer = input('continue? ')\n"), _code("import matplotlib.pyplot as plt\nplt.plot([1, 2])\n"),
            _code("raise SystemExit('stop here')\n"))),
        "big_outputs": nb(edit=below_solution(_printed(21))),
        "odd_cell_id": nb(edit=below_solution(_code("print(1)\n", id="my cell (copy)"))),
        # an honest lower grade: the task says the classes are defined in the solution cell only
        "class_in_next_cell": nb(ref[:ref.index("class DecodeSchedulerSim")], below_solution(
            _code(ref[ref.index("class DecodeSchedulerSim"):]))),
    }
    files = {name: json.dumps(v, indent=1, ensure_ascii=False).encode() for name, v in text.items()}
    files["minified_crlf_bom"] = b"\xef\xbb\xbf" + json.dumps(nb(ref.replace("\n", "\r\n")), separators=(",", ":")
                                                            ).encode()
    return files


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("wild")
    course, release_path = build_course(base)
    subs = base / "subs"
    subs.mkdir()
    for name, data in _variants(json.loads(release_path.read_text(encoding="utf-8"))).items():
        (subs / f"{name}.ipynb").write_bytes(data)
    return grade_folder(subs, course, base / "out")


@pytest.mark.slow
def test_every_editor_and_habit_keeps_the_full_grade_with_plain_feedback(graded):
    rows = graded["rows"]
    assert sorted(rows) == sorted(WILD + ("class_in_next_cell",)), graded["stderr"]
    for sid in WILD:
        row = rows[sid]
        assert (row["status"], float(row["score"])) == ("graded", spec.MAX_SCORE), (sid, row)
        page = (graded["out"] / "feedback" / f"{sid}.html").read_text(encoding="utf-8")
        assert "Traceback" not in page and "Warning" not in page and "tamper" not in page, sid
    assert "invalid" not in graded["stderr"] and "Traceback" not in graded["stderr"], graded["stderr"]


@pytest.mark.slow
def test_a_class_in_another_cell_costs_the_grade_the_task_says_and_the_page_says_why(graded):
    row = graded["rows"]["class_in_next_cell"]
    assert (row["status"], float(row["score"])) == ("graded", 0.0)
    page = (graded["out"] / "feedback" / "class_in_next_cell.html").read_text(encoding="utf-8")
    assert "`DecodeSchedulerSim` is defined in another cell of your notebook" in page and "Traceback" not in page
