"""A grading that stops (Ctrl-C, SIGTERM, a reboot) is resumed: the rerun into the same --out takes the gradings it
kept (`grader.resume`), runs only the others, and writes what an uninterrupted grading writes."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from decodesched.grader import pipeline, resume, sandbox, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.course import build_course, tool_env  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OPTIONS = dict(run_nbgrader=False, jobs=1, progress=False)
STATUS = {"alice": "graded", "bob": "timeout", "dave": "tampered"}  # carol: the grading stops at her
NOTE = "decodesched grade: note: took the kept gradings of {} submission(s)"


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _kept(out: Path) -> list[str]:
    folder = out / resume.FOLDER
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """`pipeline.grade` without nbgrader or sandbox: `state["graded"]` lists who was graded, `state["stop"]` makes
    carol's grading stop it once the two others that are kept are (Ctrl-C after 3 of 4)."""
    from decodesched.grader.course import Course

    course = Course(tmp_path / "course", tmp_path / "course" / "release.ipynb", {"cells": [], "v": 1},
                    tmp_path / "course" / "gradebook.db")
    state = {"graded": [], "gradebook": [], "stop": False, "course": course, "need": 2}
    monkeypatch.setattr(pipeline, "open_course", lambda _c: course)
    monkeypatch.setattr(pipeline, "update_gradebook", lambda _c, results, _s=None: state["gradebook"].append(
        sorted((r.student_id, r.status, r.score, tuple(r.cells.items())) for r in results)))

    def fake_grade_one(sub, _course, _tpl, _work, options, *a, **k):
        state["graded"].append(sub.student_id)
        if sub.student_id == "carol" and state["stop"]:
            deadline = time.monotonic() + 30
            while len(_kept(state["out"])) < state["need"] and time.monotonic() < deadline:
                time.sleep(0.01)
            raise KeyboardInterrupt
        cells = {c.grade_id: c.points * len(sub.student_id) / 10 for c in spec.CELLS}
        lines = {c.grade_id: [f"{sub.student_id}: check {c.grade_id} differs"] for c in spec.CELLS}
        pictures = {spec.CELLS[0].grade_id: {"trace": None, "expected": [{"action": "admit", "request_id": 1}],
                                             "got": [{"action": "admit", "request_id": 2}], "diff": "step 0"}}
        return pipeline.Result(sub.student_id, STATUS.get(sub.student_id, "graded"), sum(cells.values()),
                               float(spec.MAX_SCORE), cells, lines, [f"timeout {options.timeout_s}"],
                               pictures=pictures)

    monkeypatch.setattr(pipeline, "grade_one", fake_grade_one)
    subs = tmp_path / "subs"
    subs.mkdir()
    for sid in ("alice", "bob", "carol", "dave"):
        (subs / f"{sid}.ipynb").write_text(json.dumps(attacks.minimal_notebook()))
    pipeline.grade(subs, tmp_path / "clean", options=pipeline.Options(**OPTIONS))
    state.update(subs=subs, clean=_tree(tmp_path / "clean"), clean_gradebook=state["gradebook"][-1])
    return state


def _stopped(state, out: Path) -> None:
    state.update(stop=True, out=out, graded=[])
    with pytest.raises(KeyboardInterrupt):
        pipeline.grade(state["subs"], out, options=pipeline.Options(**OPTIONS))
    state["stop"] = False
    assert len(_kept(out)) == 2  # alice and dave; bob's `timeout` depends on the machine's load: not kept


def _rerun(state, out: Path, capsys, **options) -> tuple[list, str]:
    capsys.readouterr()
    state["graded"] = []
    pipeline.grade(state["subs"], out, options=pipeline.Options(**{**OPTIONS, **options}))
    return sorted(state["graded"]), capsys.readouterr().err


def test_a_stopped_grading_is_resumed_and_writes_what_an_uninterrupted_one_writes(offline, tmp_path, capsys):
    out = tmp_path / "out"
    _stopped(offline, out)
    graded, err = _rerun(offline, out, capsys)
    assert graded == ["bob", "carol"]
    assert [line for line in err.splitlines() if "kept" in line] == [
        NOTE.format(2) + f" from an earlier grading into {out} that stopped; grading the other 2 (--regrade grades "
        "all of them again)"]
    assert _tree(out) == offline["clean"]  # byte for byte, and nothing kept left once committed
    assert not (out / ".decodesched").exists()
    assert offline["gradebook"][-1] == offline["clean_gradebook"]
    assert _rerun(offline, out, capsys)[0] == ["alice", "bob", "carol", "dave"]  # (removed after the commit)


def test_regrade_takes_no_kept_grading(offline, tmp_path, capsys):
    out = tmp_path / "out"
    _stopped(offline, out)
    graded, err = _rerun(offline, out, capsys, regrade=True)
    assert graded == ["alice", "bob", "carol", "dave"] and "kept" not in err
    assert _tree(out) == offline["clean"]


@pytest.mark.parametrize("change", ["submission", "timeout", "memory", "release", "grader code"])
def test_a_changed_submission_release_limit_or_grader_is_graded_again(offline, tmp_path, capsys, monkeypatch,
                                                                     change):
    out = tmp_path / "out"
    _stopped(offline, out)
    options, again = {}, ["alice", "bob", "carol", "dave"]
    if change == "submission":
        (offline["subs"] / "alice.ipynb").write_text(json.dumps(attacks.minimal_notebook(), indent=1))
        again = ["alice", "bob", "carol"]
    elif change == "timeout":
        options = {"timeout_s": 119.0}
    elif change == "memory":
        options = {"memory_mb": 2048}
    elif change == "release":
        offline["course"].release = {"cells": [], "v": 2}
    else:
        monkeypatch.setattr(resume, "code_digest", lambda: "another grader version")
    graded, err = _rerun(offline, out, capsys, **options)
    assert graded == again
    assert ("kept" in err) == (change == "submission")


def _forge(path: Path, **changes) -> None:
    """The kept file at `path` with `changes` to its result and a digest that matches them again."""
    doc = json.loads(path.read_text())
    doc["result"].update(changes)
    doc["sha256"] = hashlib.sha256(json.dumps(doc["result"], ensure_ascii=True).encode()).hexdigest()
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("harm", ["truncated", "not JSON", "score changed", "another student's", "another key",
                                  "timeout status", "a symlink", "a hard link", "folder writable by others",
                                  "another owner", "a folder"])
def test_a_kept_file_that_does_not_verify_is_graded_again(offline, tmp_path, capsys, harm):
    out = tmp_path / "out"
    _stopped(offline, out)
    folder = out / resume.FOLDER
    files = {json.loads((folder / n).read_text())["result"]["student_id"]: folder / n for n in _kept(out)}
    alice, dave = files["alice"], files["dave"]
    if harm == "truncated":
        alice.write_bytes(alice.read_bytes()[:-40])
    elif harm == "not JSON":
        alice.write_bytes(b"\xff" * 100)
    elif harm == "score changed":
        text = json.loads(alice.read_text())
        text["result"]["score"] = 100.0
        alice.write_text(json.dumps(text))
    elif harm == "another student's":  # dave's verdict (verified) under alice's key
        shutil.copy(dave, alice)
    elif harm == "another key":  # alice's verdict, its key changed to another submission's (another course)
        doc = json.loads(alice.read_text())
        doc["key"] = "0" * 64
        alice.write_text(json.dumps(doc))
    elif harm == "timeout status":
        _forge(alice, status="timeout")
    elif harm == "a symlink":
        shutil.move(alice, tmp_path / "elsewhere.json")
        alice.symlink_to(tmp_path / "elsewhere.json")
    elif harm == "a hard link":
        os.link(alice, tmp_path / "second-name.json")
    elif harm == "folder writable by others":
        folder.chmod(0o777)
    elif harm == "another owner":
        if os.geteuid() != 0:
            pytest.skip("only root can give a file away")
        os.chown(alice, 12345, 12345)
    else:
        alice.unlink()
        alice.mkdir()
    graded, err = _rerun(offline, out, capsys)
    assert "alice" in graded and "carol" in graded
    # (a file in a folder others can write is never read, and left as it is)
    assert {k: v for k, v in _tree(out).items() if not k.startswith(".decodesched")} == offline["clean"]


def test_nothing_is_kept_where_submissions_run_with_the_grader_s_own_access(offline, tmp_path, monkeypatch):
    """Their code could write DIR there and plant a verdict."""
    monkeypatch.setattr(sandbox, "weak_isolation", lambda: "submissions run with your own access to files here")
    out = tmp_path / "out"
    offline.update(stop=True, out=out, need=0)
    with pytest.raises(KeyboardInterrupt):
        pipeline.grade(offline["subs"], out, options=pipeline.Options(**{**OPTIONS, "jobs": 2}))
    assert _kept(out) == []


def test_a_grading_that_fails_keeps_nothing(offline, tmp_path, monkeypatch):
    """A failure that is no stop (the gradebook cannot be written) leaves no output, kept gradings included."""
    def broken(*_a):
        raise OSError("the gradebook is locked")

    monkeypatch.setattr(pipeline, "update_gradebook", broken)
    out = tmp_path / "out"
    with pytest.raises(OSError):
        pipeline.grade(offline["subs"], out, options=pipeline.Options(**OPTIONS))
    assert not out.exists()


# ---- the real thing: nbgrader, the sandbox, a SIGINT ----

def _grade(subs: Path, out: Path, course: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "decodesched.cli", "grade", str(subs), "--out", str(out), "--course", str(course),
         "--jobs", "1", "--timeout", "30", "--no-progress", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tool_env(), cwd=REPO)


def _export(course: Path) -> list:
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "export", "--to=export.csv"], cwd=course,
                          capture_output=True, text=True, env=tool_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(course / "export.csv", newline="") as fh:
        return sorted(tuple(sorted(r.items())) for r in csv.DictReader(fh))


@pytest.mark.slow
def test_a_real_grading_stopped_by_ctrl_c_is_resumed_without_running_the_kept_submissions(tmp_path):
    course, release = build_course(tmp_path)
    rel = json.loads(release.read_text())
    subs = tmp_path / "subs"
    subs.mkdir()
    for name, source in [("st_one", attacks.reference_source()), ("st_two", attacks.honest_source()),
                         ("st_three", attacks.reference_source())]:
        (subs / f"{name}.ipynb").write_text(json.dumps(attacks._with_solution(rel, source)))
    shutil.copytree(course, tmp_path / "course2")
    clean = _grade(subs, tmp_path / "clean", course)
    _, err = clean.communicate(timeout=900)
    assert clean.returncode == 0, err[-3000:]

    course2, out = tmp_path / "course2", tmp_path / "out"
    p = _grade(subs, out, course2)
    try:
        deadline = time.monotonic() + 600
        while not _kept(out):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1][-3000:]
            time.sleep(0.02)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert (p.returncode, err.strip()) == (130, "decodesched grade: interrupted"), err[-3000:]
    kept = {json.loads((out / resume.FOLDER / n).read_text())["result"]["student_id"] for n in _kept(out)}
    assert 1 <= len(kept) <= 2

    p = _grade(subs, out, course2)
    ran = set()
    while p.poll() is None:  # which students' kernel runs the rerun starts
        for pid in sandbox.find_sandboxed(pipeline.marker_prefix(out)):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as fh:
                ran |= {sid for sid in ("st_one", "st_two", "st_three") if f"{sid}-".encode() in fh.read()}
        time.sleep(0.02)
    _, err = p.communicate()
    assert p.returncode == 0, err[-3000:]
    assert NOTE.format(len(kept)) in err
    assert not ran & kept
    assert _tree(out) == _tree(tmp_path / "clean")
    assert _export(course2) == _export(course)


def test_a_fifo_handed_in_is_never_waited_on_for_its_key(offline, tmp_path):
    fifo = offline["subs"] / "erin.ipynb"
    os.mkfifo(fifo)
    keeper = resume.Resume(tmp_path / "out", offline["course"], pipeline.Options(**OPTIONS), pipeline.Limits())
    from decodesched.grader.notebook import Submission

    assert keeper.key(Submission("erin", fifo)) is None
    assert keeper.key(Submission("alice", offline["subs"] / "alice.ipynb")) is not None
