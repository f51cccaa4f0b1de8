"""The course as an instructor and a student meet it: `assignment init` + `build`, then the released notebook
executed headless with a real kernel (untouched, solved, wrong), and the course README's advice."""

import json
import subprocess
import sys

import pytest

from decodesched.grader import course, release, spec

pytest.importorskip("nbgrader")
nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

VISIBLE = [c.grade_id for c in spec.CELLS if not c.hidden]


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    folder = tmp_path_factory.mktemp("walk") / "course"
    course.init_course(folder)
    release.build_release(folder, force=False)
    return folder


def _cells(nb):
    return {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}


def _execute(folder, solution=None):
    nb = nbformat.read(folder / "release" / spec.ASSIGNMENT / spec.NOTEBOOK, as_version=4)
    if solution is not None:
        _cells(nb)[spec.SOLUTION_CELL].source = solution
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True).execute()
    cells = _cells(nb)
    stderr = [o.text for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "stream" and o.name == "stderr"]
    return cells, stderr


def _error(cell):
    return next((o for o in cell.outputs if o.output_type == "error"), None)


def _reference():
    nb = json.loads((spec.COURSE_ROOT / "source" / spec.ASSIGNMENT / spec.NOTEBOOK).read_text(encoding="utf-8"))
    sol = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == spec.SOLUTION_CELL)
    return "".join(sol["source"])


@pytest.mark.slow
def test_untouched_release_fails_each_visible_test_with_a_message_that_says_what_to_do(released):
    cells, stderr = _execute(released)
    assert stderr == []
    for grade_id in VISIBLE:
        err = _error(cells[grade_id])
        assert err is not None and err.ename == "NotImplementedError", grade_id
        assert "TODO" in err.evalue and "replace this line with your code" in err.evalue, (grade_id, err.evalue)


@pytest.mark.slow
def test_solved_and_wrong_notebooks_run_quietly_and_say_what_is_wrong(released):
    cells, stderr = _execute(released, _reference())
    assert stderr == []
    assert all(_error(cells[g]) is None for g in VISIBLE)
    wrong = _reference().replace("deadline_slack = req.deadline_step - self.clock - self._remaining_steps(req)",
                                 "deadline_slack = max(0, req.deadline_step - self.clock"
                                 " - self._remaining_steps(req))")
    cells, stderr = _execute(released, wrong)
    assert stderr == []
    err = _error(cells["test_todo2_schedule_key"])
    assert err.ename == "AssertionError" and "not clamped" in err.evalue and "expected -1" in err.evalue
    assert all(_error(cells[g]) is None for g in VISIBLE if g != "test_todo2_schedule_key")


@pytest.mark.slow
def test_nbgrader_validate_run_by_hand_in_the_course_prints_no_warning(released):
    rel = f"release/{spec.ASSIGNMENT}/{spec.NOTEBOOK}"
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "validate", "--invert", rel], cwd=released,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and release.INVERT_OK in proc.stdout + proc.stderr
    assert "WARNING" not in proc.stdout + proc.stderr, proc.stderr


def test_course_readme_warns_against_a_plain_nbgrader_autograde(tmp_path):
    folder = tmp_path / "course"
    course.init_course(folder)
    text = (folder / "README.md").read_text(encoding="utf-8")
    assert "Do not run `nbgrader autograde` here yourself" in text
    assert "nbgrader export" in text
