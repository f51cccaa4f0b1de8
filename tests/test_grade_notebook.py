"""grader.notebook: intake of a submissions folder and strict notebook checks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from decodesched.errors import UserError
from decodesched.grader import notebook, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks.attacks import minimal_notebook as _nb  # noqa: E402


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
    subs = notebook.collect_submissions(flat)
    assert [s.student_id for s in subs] == ["alice", "bad name!", "bob"]
    assert subs[1].problem and subs[0].problem is None and subs[0].path.name == "alice.ipynb"

    tree = tmp_path / "course"
    nbdir = tree / "submitted" / "carol" / spec.ASSIGNMENT
    nbdir.mkdir(parents=True)
    _write(nbdir / spec.NOTEBOOK, _nb())
    (tree / "submitted" / "dave" / spec.ASSIGNMENT).mkdir(parents=True)  # folder without the notebook
    for root in (tree, tree / "submitted"):
        subs = notebook.collect_submissions(root)
        assert [(s.student_id, s.problem is None) for s in subs] == [("carol", True), ("dave", False)]


def test_notebook_names_that_are_not_regular_files_are_listed_as_invalid(tmp_path):
    # A FIFO, a broken link or a link to a device named like a notebook was skipped without a word (a
    # student missing from the grades); now each is a row, invalid, and none is ever opened.
    import os

    flat = tmp_path / "flat"
    flat.mkdir()
    _write(flat / "alice.ipynb", _nb())
    os.mkfifo(flat / "fifo.ipynb")
    (flat / "broken.ipynb").symlink_to(tmp_path / "gone.ipynb")
    (flat / "device.ipynb").symlink_to("/dev/zero")
    (flat / "linked.ipynb").symlink_to(flat / "alice.ipynb")
    subs = {s.student_id: s for s in notebook.collect_submissions(flat)}
    assert sorted(subs) == ["alice", "broken", "device", "fifo", "linked"]
    for sid in ("broken", "device", "fifo"):
        assert subs[sid].path is None and "not a regular file" in subs[sid].problem
    assert subs["linked"].problem is None and notebook.load_notebook(subs["linked"].path)["cells"]
    for target in (flat / "fifo.ipynb", flat / "device.ipynb"):  # never waits on what it is given
        with pytest.raises(notebook.InvalidSubmission, match="not a regular file"):
            notebook.load_notebook(target)


def test_a_course_folder_without_submitted_is_no_submissions_folder(tmp_path):
    """`grade .` in a course folder took its source/ and release/ for two students (one graded 100, as
    the instructor's solution) and wrote them into the gradebook."""
    course = tmp_path / "course"
    for sid in ("source", "release"):
        (course / sid / spec.ASSIGNMENT).mkdir(parents=True)
        _write(course / sid / spec.ASSIGNMENT / spec.NOTEBOOK, _nb())
    (course / "nbgrader_config.py").write_text("c = get_config()\n")
    with pytest.raises(UserError, match="a course folder without a submitted/ folder"):
        notebook.collect_submissions(course)
    nbdir = course / "submitted" / "erin" / spec.ASSIGNMENT
    nbdir.mkdir(parents=True)
    _write(nbdir / spec.NOTEBOOK, _nb())
    assert [s.student_id for s in notebook.collect_submissions(course)] == ["erin"]


def test_collect_rejects_empty_and_missing(tmp_path):
    with pytest.raises(UserError):
        notebook.collect_submissions(tmp_path / "nope")
    with pytest.raises(UserError):
        notebook.collect_submissions(tmp_path)


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
    with pytest.raises(notebook.InvalidSubmission, match=reason):
        notebook.load_notebook(p)


def test_solution_cell_rules(tmp_path):
    nb = _nb(solution=["x = 1\n", "y = 2\n"])
    assert notebook.solution_source(nb) == "x = 1\ny = 2\n"
    none = _nb(solution="x = 1\n")  # (a cell that defines the classes is the solution: test_grade_formats)
    del none["cells"][1]["metadata"]["nbgrader"]
    with pytest.raises(notebook.InvalidSubmission, match="no solution cell"):
        notebook.solution_source(none)
    two = _nb(extra_cells=[json.loads(json.dumps(_nb(solution="x = 2\n")["cells"][1]))])  # (identical: graded once)
    with pytest.raises(notebook.InvalidSubmission, match="2 cells"):
        notebook.solution_source(two)
