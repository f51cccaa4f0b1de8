"""`decodesched assignment build` with real nbgrader, the release checks, and the grader self-check."""

import copy
import json
import shutil

import pytest

from decodesched.cli import main

from decodesched.errors import UserError
from decodesched.grader import release, selfcheck, spec

nbgrader = pytest.importorskip("nbgrader")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    course = tmp_path_factory.mktemp("course") / "assignments"
    shutil.copytree(spec.COURSE_ROOT, course, ignore=shutil.ignore_patterns("release", "gradebook.db", "submitted",
                                                                            "autograded", "feedback"))
    report = release.build_release(course, force=False)
    return course, report


@pytest.mark.slow
def test_build_makes_a_checked_release(built):
    course, report = built
    release = course / "release" / spec.ASSIGNMENT / spec.NOTEBOOK
    assert report.release == release and release.is_file()
    text = "\n".join(report.checks)
    for phrase in ("solutions stripped", "hidden tests absent", "validate passes on the source",
                   "--invert passes on the release", "scores 0 on every graded cell"):
        assert phrase in text
    nb = json.loads(release.read_text(encoding="utf-8"))
    raw = release.read_text(encoding="utf-8")
    assert "BEGIN SOLUTION" not in raw and "HIDDEN TESTS" not in raw
    sol = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == spec.SOLUTION_CELL)
    assert "".join(sol["source"]).count("raise NotImplementedError") >= 4
    assert (course / "gradebook.db").is_file()


@pytest.mark.slow
def test_build_cli_refuses_to_overwrite_without_force(built, capsys):
    course, _ = built
    assert main(["assignment", "build", "--course", str(course)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--force" in err[0]


@pytest.mark.slow
def test_a_forced_rebuild_that_fails_keeps_the_release_it_would_replace(built, tmp_path, capsys):
    course = tmp_path / "course"
    shutil.copytree(built[0], course)
    release_nb = course / "release" / spec.ASSIGNMENT / spec.NOTEBOOK
    before = release_nb.read_bytes()
    source = course / "source" / spec.ASSIGNMENT / spec.NOTEBOOK
    nb = json.loads(source.read_text(encoding="utf-8"))
    next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade"))["metadata"]["nbgrader"]["points"] = -5
    source.write_text(json.dumps(nb), encoding="utf-8")
    assert main(["assignment", "build", "--course", str(course), "--force"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # nbgrader's cause, not its "Please see the above traceback"
    assert len(err) == 1 and "ValidationError: -5 is less than the minimum of 0" in err[0], err
    assert release_nb.read_bytes() == before
    assert sorted(p.name for p in (course / "release").iterdir()) == [spec.ASSIGNMENT]


def test_a_release_a_killed_rebuild_kept_aside_is_put_back(tmp_path):
    aside = tmp_path / "release" / f".{spec.ASSIGNMENT}.previous"
    aside.mkdir(parents=True)
    (aside / spec.NOTEBOOK).write_text("old")
    assert release._previous_release(tmp_path) == aside and not aside.exists()
    assert (tmp_path / "release" / spec.ASSIGNMENT / spec.NOTEBOOK).read_text() == "old"
    aside.mkdir()  # and one left beside a newer release is dropped
    release._previous_release(tmp_path)
    assert not aside.exists() and (tmp_path / "release" / spec.ASSIGNMENT / spec.NOTEBOOK).read_text() == "old"


def test_build_cli_rejects_a_folder_that_is_not_a_course(tmp_path, capsys):
    assert main(["assignment", "build", "--course", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nbgrader_config.py" in err[0]


def _nb():
    return json.loads(spec.SOURCE_NOTEBOOK.read_text(encoding="utf-8"))


def _fake_release(source_nb):
    """What nbgrader makes, done by hand: regions replaced by the stub, hidden regions removed."""
    import re

    rel = copy.deepcopy(source_nb)
    for cell in rel["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        src = re.sub(r"^( *)### BEGIN SOLUTION\n.*?^ *### END SOLUTION$",
                     lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}raise NotImplementedError()", src,
                     flags=re.S | re.M)
        src = re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", "", src, flags=re.S)
        cell["source"] = src
    return rel


def test_check_release_accepts_a_clean_release():
    assert len(release.check_release(_nb(), _fake_release(_nb()))) >= 4


def _set_cell(nb, grade_id, fn):
    for cell in nb["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == grade_id:
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = fn(src)


@pytest.mark.parametrize("damage, message", [
    (lambda rel: _set_cell(rel, spec.SOLUTION_CELL, lambda s: s + "\n        victims.sort(key=lambda req: (self._effective_priority(req), -req.required_blocks, req.request_id))\n"),
     "solution code leaked"),
    (lambda rel: _set_cell(rel, "hidden_todo2_schedule_key", lambda s: s + "\nassert _probe._schedule_key(_probe.queue[0]) == (3, 0, 1, 0, 2, 1)\n"),
     "hidden test line leaked"),
    (lambda rel: _set_cell(rel, spec.SOLUTION_CELL, lambda s: s.replace("def step(self)", "def step(self, n=1)")),
     "interface"),
    (lambda rel: _set_cell(rel, spec.SOLUTION_CELL, lambda s: s.replace("raise NotImplementedError()", "pass")),
     "NotImplementedError stubs"),
])
def test_check_release_catches_leaks_and_changes(damage, message):
    rel = _fake_release(_nb())
    damage(rel)
    with pytest.raises(UserError, match=message):
        release.check_release(_nb(), rel)


@pytest.mark.slow
def test_selfcheck_judges_reference_release_and_every_mutant():
    table = selfcheck.run_selfcheck(jobs=2)
    rows = {r.name: r for r in table.rows}
    assert rows["reference"].ok and rows["reference"].score == 100
    assert rows["seed_reference"].ok and rows["seed_reference"].score == 100  # a completed seed is valid
    assert rows["release"].ok and rows["release"].score == 0
    mutants = [r for r in table.rows if r.expectation == "loses"]
    assert len(mutants) >= 15
    for r in mutants:
        assert r.bug, r.name
        assert r.ok and r.score < 100 and "FAIL" in r.detail, (r.name, r.status, r.score, r.detail)
    assert table.ok
    text = table.text()
    assert "all judged as expected" in text
