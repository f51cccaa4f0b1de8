"""Red team, round 2: what a hostile student or a careless instructor did to the grader that round 1 had not.

* forged harness output whose shape the judge could not take (an id that is a list, arrays nested 900 deep):
  a grader error ("crashed", a traceback) instead of `tampered` with the honest part's score;
* the instructor's gradebook locked (formgrader, another nbgrader) at the end of a grading: a traceback;
* the ``._alice.ipynb`` files macOS leaves beside each copied file: a row of grades.csv;
* a correct but slow solution whose harness yielded between checks (near its CPU limit): "crashed".
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest

from decodesched.errors import UserError
from decodesched.grader import notebook, observe, outputs, pipeline, sandbox, spec, verdict
from decodesched.grader.course import Course
from decodesched.grader.limits import Limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.attacks import minimal_notebook as _nb  # noqa: E402

SANDBOX = pytest.mark.skipif(os.geteuid() != 0 and not sandbox.userns_available(),
                             reason="needs root or user namespaces")


def _write_to_channel(payload: bytes) -> str:
    """The honest (buggy) solution, then code that writes `payload` straight to the harness's output channel
    (its descriptor is in the job file, which the solution can read)."""
    return attacks.honest_source() + (
        "\nimport json as _j, os as _o\n"
        "_o.write(_j.load(open('in.json'))['out_fd'], " + repr(payload) + ")\n")


def test_a_result_line_whose_id_is_not_text_is_forged_not_a_grader_error():
    lines = [b'{"load":"ok"}', b'{"id":[1],"obs":[]}', b'{"id":{"a":1},"obs":[]}', b'{"id":"a","obs":[1]}']
    _load, _done, obs, forged, _patched, _slow = observe._parse(lines, [{"id": "a"}])
    assert obs == {"a": [1]}
    assert len([f for f in forged if f.startswith("unexpected result line")]) == 2, forged


def test_a_line_nested_deeper_than_the_harness_writes_is_forged():
    deep = b'{"id":"a","obs":["ok",' + b"[" * 900 + b"]" * 900 + b"]}"
    _load, _done, obs, forged, _patched, _slow = observe._parse([b'{"load":"ok"}', deep], [{"id": "a"}])
    assert list(obs) == [] and forged == ["a line nested too deep in the harness output"]
    assert not observe._too_deep(json.loads(b'{"obs":' + b"[" * 31 + b"]" * 31 + b"}"))


@SANDBOX
@pytest.mark.parametrize("payload", [
    b'{"load":"ok"}\n{"id":[1],"obs":[]}\n',
    b'{"load":"ok"}\n{"id":"h1_late_enqueue","obs":["ok","ok",' + b"[" * 900 + b"]" * 900 + b"]}\n",
], ids=["list_id", "nested_900"])
def test_forged_output_of_any_shape_is_tampered_with_the_honest_score(payload):
    v = verdict.verdict_for_source(_write_to_channel(payload), limits=Limits(cpu_s=20), shrink_failures=False)
    honest = verdict.verdict_for_source(attacks.honest_source(), limits=Limits(cpu_s=20), shrink_failures=False)
    assert v.status == "tampered", v.notes
    assert any("written by someone else" in n for n in v.notes), v.notes
    assert v.total == honest.total


@SANDBOX
def test_honest_values_nested_deep_are_not_taken_for_forgery():
    # The harness cuts what the solution returns at its own depth: whatever the solution nests, no honest line
    # comes near observe.MAX_DEPTH (the state of a request in a replay is the deepest place a value lands).
    source = attacks.reference_source() + (
        "\n_deep = 0\nfor _ in range(60):\n    _deep = [{'k': _deep}]\n"
        "DecodeSchedulerSim.step = lambda self: {'request_id': _deep, 'action': _deep}\n"
        "_enqueue = DecodeSchedulerSim.enqueue\n"
        "def _enqueue_deep(self, *a, **k):\n    _enqueue(self, *a, **k)\n    self.queue[-1].phase = _deep\n"
        "DecodeSchedulerSim.enqueue = _enqueue_deep\n")
    v = verdict.verdict_for_source(source, limits=Limits(cpu_s=20), shrink_failures=False)
    assert v.status == "graded", v.notes
    assert v.total < 50  # the wrong values failed their checks


def test_a_locked_gradebook_is_one_line_not_a_traceback(tmp_path):
    gradebook = tmp_path / "gradebook.db"
    con = sqlite3.connect(gradebook)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    course = Course(tmp_path, tmp_path / "release.ipynb", {"cells": []}, gradebook)
    result = pipeline.Result("alice", "graded", 0.0, float(spec.MAX_SCORE), {c.grade_id: 0.0 for c in spec.CELLS}, {})
    con.execute("BEGIN EXCLUSIVE")  # formgrader or another nbgrader writing: SQLite waits 5 s, then gives up
    try:
        with pytest.raises(UserError) as err:
            outputs.update_gradebook(course, [result], server=None)
    finally:
        con.rollback()
        con.close()
    message = str(err.value)
    assert "\n" not in message and str(gradebook) in message and "database is locked" in message, message
    assert "grades.csv" in message


def test_hidden_notebooks_macos_leaves_beside_a_copy_are_no_rows(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "alice.ipynb").write_text(json.dumps(_nb()))
    (subs / "._alice.ipynb").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X")  # AppleDouble
    skipped = []
    assert [s.student_id for s in notebook.collect_submissions(subs, skipped)] == ["alice"]
    assert skipped == []


def _run(obs, *, done=False, yielded=False, returncode=0, sig=None):
    outcome = sandbox.Outcome(returncode=returncode, timed_out=False, memory_exceeded=False, signal=sig, stdout=b"",
                              stderr=b"", wall_s=1.0, cpu_s=1.0)
    return observe.HarnessRun(load={"load": "ok"}, obs=obs, done=done, outcome=outcome, wall_s=1.0, yielded=yielded)


def _status(runs, obs, scen):
    return verdict._verdict("", scen, obs, runs, None, Limits(), (), False, 100.0)


def test_a_slow_solution_whose_harness_yielded_is_not_crashed():
    # A harness near its run's CPU limit stops between two checks on purpose and a fresh one goes on
    # (`harness.main`): a correct but slow solution was "crashed", its feedback saying its process had died.
    from decodesched.grader import scenarios

    scen = scenarios.build_scenarios(0, 4)
    right = {s["id"]: s["expected"] for s in scen}
    half = len(scen) // 2
    first = {s["id"]: right[s["id"]] for s in scen[:half]}
    rest = {s["id"]: right[s["id"]] for s in scen[half:]}
    v = _status([_run(first, yielded=True), _run(rest, done=True)], right, scen)
    assert (v.status, v.total) == ("graded", 100.0), v.notes
    assert not any("died" in n for n in v.notes), v.notes

    # the CPU budget ran out before the last checks: a time limit, not a crash
    spent = {**first, **{s["id"]: [{"killed": observe.BUDGET_SPENT}] for s in scen[half:]}}
    v = _status([_run(first, yielded=True)], spent, scen)
    assert v.status == "timeout" and v.total < 100, (v.status, v.notes)

    # a "yield" line followed by a crash is still a crash
    v = _status([_run(first, yielded=True, returncode=None, sig=11), _run(rest, done=True)], right, scen)
    assert v.status == "crashed" and any("killed by signal 11" in n for n in v.notes), v.notes


def test_a_notebook_whose_outputs_have_another_shape_is_read_as_without_outputs():
    # (the autograded notebook is read back after the kernel run: a cell's "outputs" that is not a list of
    # objects, written by a process the run left behind, raised TypeError in the grading process)
    from decodesched.grader import evidence

    nb = {"cells": [{"outputs": 5}, {"outputs": [7, {"output_type": "error", "ename": "X"}]}, "cell", {}]}
    assert evidence._error_outputs(nb) == [(1, {"output_type": "error", "ename": "X"})]
    assert evidence.cell_outputs({"outputs": {"a": 1}}) == [] and evidence._error_outputs({"cells": 3}) == []
