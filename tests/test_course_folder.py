"""grader.course: `assignment init` writes a course of one's own; which folder is the course."""

from __future__ import annotations

import json

import pytest

from decodesched.errors import UserError
from decodesched.grader import course, spec


def test_init_writes_a_ready_course_from_the_template(tmp_path):
    root = tmp_path / "c"
    written = course.init_course(root)
    assert sorted(p.relative_to(root).as_posix() for p in written) == [
        "README.md", "nbgrader_config.py", f"source/{spec.ASSIGNMENT}/{spec.NOTEBOOK}"]
    nb = json.loads((root / "source" / spec.ASSIGNMENT / spec.NOTEBOOK).read_text())
    assert nb == json.loads(spec.SOURCE_NOTEBOOK.read_text())
    assert "assignment build" in (root / "README.md").read_text()
    assert course.resolve_root(None, cwd=root) == root.resolve()
    assert course.resolve_root(root) == root.resolve()


def test_init_into_an_empty_existing_folder_but_never_over_files(tmp_path):
    course.init_course(tmp_path)
    with pytest.raises(UserError, match="not empty"):
        course.init_course(tmp_path)
    (tmp_path.parent / "afile").write_text("x")
    with pytest.raises(UserError, match="not a folder"):
        course.init_course(tmp_path.parent / "afile")


def test_init_refuses_an_empty_name_and_a_dangling_link(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(UserError, match="name is empty"):
        course.init_course("  ")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    with pytest.raises(UserError, match="symbolic link to a missing path"):
        course.init_course("dangling")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "keep.txt"]


def test_no_course_says_to_run_init(tmp_path):
    with pytest.raises(UserError, match="assignment init"):
        course.resolve_root(None, cwd=tmp_path)
    with pytest.raises(UserError, match="assignment init"):
        course.resolve_root(tmp_path)
    with pytest.raises(UserError, match="not built"):
        course.init_course(tmp_path / "c")
        course.open_course(tmp_path / "c")
