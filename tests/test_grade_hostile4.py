"""`decodesched grade` given output folders it cannot finish writing into: refused at once (exit 2, one line),
before any grading, with the gradebook and the folder as they were; a stopped write leaves no folder behind."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from decodesched.grader import pipeline

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks, nobody  # noqa: E402
from grader_attacks.course import build_course, tool_env  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _tree(root: Path) -> dict:
    """Every entry under `root` and what it is (a file's digest, or its kind)."""
    found = {}
    for p in sorted(root.rglob("*")):
        found[str(p.relative_to(root))] = (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and
                                           not p.is_symlink() else "link" if p.is_symlink() else "folder")
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_course(tmp_path_factory.mktemp("hostile4"))


@pytest.fixture
def course(built, tmp_path):
    """The course, and a folder with one correct submission by a student the gradebook has never seen (a grading
    that ran would add them): `tmp_path`'s name."""
    root, release = built
    subs = tmp_path / "subs"
    subs.mkdir()
    rel = json.loads(release.read_text())
    notebook = attacks._with_solution(rel, attacks.reference_source())
    (subs / f"{_student(tmp_path)}.ipynb").write_text(json.dumps(notebook))
    return root, subs


def _student(tmp_path: Path) -> str:
    return "s" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:12]


def _grade(subs: Path, out: Path, course: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "decodesched.cli", "grade", str(subs), "--out", str(out), "--course", str(course),
         "--jobs", "1", "--timeout", "30", "--no-progress"],
        capture_output=True, text=True, env=tool_env(), cwd=REPO, timeout=900)


def _in_the_way(out: Path, what: str) -> None:
    out.mkdir()
    if what == "grades.csv is a folder":
        (out / "grades.csv").mkdir()
    elif what == "feedback is a file":
        (out / "feedback").write_text("notes\n")
    elif what == "a page is a folder":
        (out / "feedback" / f"{_student(out.parent)}.html").mkdir(parents=True)
    elif what == "grades.csv is a FIFO":
        os.mkfifo(out / "grades.csv")


@pytest.mark.parametrize("what, said", [("grades.csv is a folder", "grades.csv: is a directory"),
                                        ("feedback is a file", "feedback: exists and is not a folder"),
                                        ("a page is a folder", ".html: is a directory"),
                                        ("grades.csv is a FIFO", "grades.csv: is a FIFO")])
def test_an_output_that_cannot_be_written_is_refused_before_any_grading(course, tmp_path, what, said):
    """These failed only once every submission was graded (hours, for a large class), with the new grades in the
    gradebook and none in grades.csv; a `feedback` file gave "File exists"."""
    root, subs = course
    out = tmp_path / "out"
    _in_the_way(out, what)
    before, gradebook = _tree(out), (root / "gradebook.db").read_bytes()
    proc = _grade(subs, out, root)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and lines[0].startswith("decodesched grade: error: "), lines
    assert _tree(out) == before
    assert (root / "gradebook.db").read_bytes() == gradebook


def test_an_output_folder_that_is_a_broken_link_is_named_as_one(course, tmp_path):
    root, subs = course
    (tmp_path / "out").symlink_to(tmp_path / "gone")
    proc = _grade(subs, tmp_path / "out", root)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"decodesched grade: error: {tmp_path / 'out'}: a link to {tmp_path / 'gone'}, "
                                   "which does not exist; make that folder or give another --out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "subs"]


@pytest.mark.skipif(nobody.available() is not None, reason=str(nobody.available()))
def test_a_read_only_output_folder_is_refused_before_any_grading(course, tmp_path):
    root, subs = course
    base = nobody.workdir()
    try:
        for name, src in (("course", root), ("subs", subs)):
            subprocess.run(["cp", "-a", str(src), str(base / name)], check=True)
        (base / "out").mkdir()
        nobody.give(base)
        os.chmod(base / "out", 0o555)
        gradebook = (base / "course" / "gradebook.db").read_bytes()
        proc = nobody.run(["-m", "decodesched.cli", "grade", str(base / "subs"), "--out", str(base / "out"),
                           "--course", str(base / "course"), "--jobs", "1", "--no-progress"], cwd=base)
        said = [ln for ln in proc.stderr.splitlines() if "note:" not in ln]  # (a note on weaker isolation)
        assert proc.returncode == 2 and said == [f"decodesched grade: error: {base / 'out'}: cannot write into "
                                                 "this folder; choose another --out"], proc.stderr[-3000:]
        assert list((base / "out").iterdir()) == []
        assert (base / "course" / "gradebook.db").read_bytes() == gradebook
    finally:
        nobody.cleanup(base)


def test_a_grading_stopped_while_it_writes_its_outputs_leaves_no_folder_of_its_own(course, tmp_path, monkeypatch):
    """Ctrl-C after the grading, as the pages are written: no grades.csv, no page, and neither the output folder
    nor its feedback folder, which this run made (the folder used to stay, with an empty feedback/)."""
    root, subs = course
    for notebook in subs.iterdir():
        notebook.write_text("")  # invalid: nothing runs
    real = pipeline.atomic_writer

    def interrupted(path, *args, **kwargs):
        if Path(path).name == "grades.csv":
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(pipeline, "atomic_writer", interrupted)
    options = pipeline.Options(run_nbgrader=False, progress=False)
    with pytest.raises(KeyboardInterrupt):
        pipeline.grade(subs, tmp_path / "out", course=root, options=options)
    assert not (tmp_path / "out").exists()
