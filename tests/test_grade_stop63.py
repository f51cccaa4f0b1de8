"""A student's code aimed at the hidden checks (stop 63): the verdict harness runs the solution in its own process, so
the solution can write any result line (``sys.modules["__main__"].run_scenario`` is looked up at each check). A line
whose first observation was ``{"killed": ...}``, the grader's own record of a check it stopped or never ran, was
taken as the grader's word: failing checks read "NOT RUN ... (they score 0; they are not counted as failing)", "did
not run to the end (<any text of the student's>)", or, with the grader's words for a spent CPU budget, made the status
`timeout`; never `tampered`. Now a line that says so is forged, but for the harness's own "not run" where the grader's
count of the checks that timed out says it was due (`observe._CheckMeter.claimed_not_run`; the grader reads a result
line too long to parse at its end, so it never counts fewer timeouts than the harness)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from decodesched.grader import harness, limits, observe, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.course import build_course, grade_folder  # noqa: E402

REFERENCE = attacks.reference_source()
STUB_AT = "def _ensure_capacity(self, challenger: RequestState) -> int | None:"
# TODO 3 left as a stub: every check that admits a request raises NotImplementedError
STUB = REFERENCE.replace(STUB_AT, STUB_AT + "\n        raise NotImplementedError\n\n    def _old(self, challenger):")
CLAIM = "the grader crashed on this check: please award its points"

# In the verdict harness only: a check whose observations hold an exception is reported in the grader's words.
FORGE = '''
import sys as _sys
_h = _sys.modules.get("__main__")
if hasattr(_h, "run_scenario"):
    _real = _h.run_scenario
    def _run_scenario(ns, ops, budget_s=None):
        obs = _real(ns, ops, budget_s)
        if any(isinstance(o, dict) and "raised" in o for o in obs):
            return [{"killed": %s}]
        return obs
    _h.run_scenario = _run_scenario
'''
WORDS = {"not_run": "_h.NOT_RUN", "budget_spent": repr(observe.BUDGET_SPENT), "own_text": repr(CLAIM)}


def _lines(v) -> str:
    return "\n".join(line for c in v.cells.values() for line in c.lines)


@pytest.fixture(scope="module")
def plain():
    """The verdicts of the reference and of the stub, as they are."""
    assert STUB != REFERENCE
    return {name: verdict.verdict_for_source(source, shrink_failures=False)
            for name, source in (("reference", REFERENCE), ("stub", STUB))}


@pytest.mark.parametrize("words", sorted(WORDS))
def test_a_line_in_the_graders_words_is_forged(words, plain):
    stub = plain["stub"]
    forged = verdict.verdict_for_source(STUB + FORGE % WORDS[words], shrink_failures=False)
    assert stub.status == "graded" and "NotImplementedError" in _lines(stub)
    assert forged.status == "tampered", (forged.status, forged.notes)
    assert forged.total <= stub.total
    text = _lines(forged)
    assert "NOT RUN" not in text and CLAIM not in text and observe.BUDGET_SPENT not in text
    assert any("written by someone else" in n for n in forged.notes), forged.notes


# An exception of the solution's own that claims another class through ``__class__`` (isinstance believes it; ``except``
# does not): as a ValueError it passed the checks of bad input, as a "MemoryError" it made the status `memory`.
LIAR = '''
class %(name)s(Exception):
    @property
    def __class__(self):
        return %(claims)s
_checked_enqueue = DecodeSchedulerSim.enqueue
def _enqueue(self, *args, **kwargs):
    try:
        return _checked_enqueue(self, *args, **kwargs)
    except ValueError as exc:
        raise %(name)s(str(exc)) from None
DecodeSchedulerSim.enqueue = _enqueue
'''


@pytest.mark.parametrize("name, claims", [("Refused", "ValueError"), ("MemoryError", "__import__('builtins').MemoryError")])
def test_an_exception_that_claims_another_class_is_read_by_its_own(name, claims, plain):
    honest = plain["reference"]
    liar = verdict.verdict_for_source(REFERENCE + LIAR % {"name": name, "claims": claims}, shrink_failures=False)
    full = honest.cells["hidden_input_errors"]
    assert honest.status == "graded" and full.score == full.max_score
    assert liar.status == "graded", (liar.status, liar.notes)
    assert liar.cells["hidden_input_errors"].score < full.max_score
    said = "\n".join(liar.cells["hidden_input_errors"].lines)
    assert name + (" (not the builtin)" if name == "MemoryError" else "") in said, said


def _meter_of(lines: list, ids: list):
    """A grader's `_CheckMeter` that has read `lines`, written as the harness writes them (`harness.to_json`)."""
    fd = observe._anonymous_file()
    os.write(fd, b"".join((harness.to_json(line) + "\n").encode("ascii") for line in lines))
    meter = observe._CheckMeter(fd, [{"id": sid} for sid in ids], limits.Limits(scenario_cpu_s=1.0),
                                timeouts_before=0, allowance_s=2.0, hang_rules=True)  # two timeouts, then "not run"
    meter.poll(None)
    os.close(fd)
    return meter


LONG = {"over_64KiB": [10**6] * 20000, "over_MAX_LINE_BYTES": ["x" * 200] * 20000, "short": [1]}


@pytest.mark.parametrize("first, second", [("over_64KiB", "over_MAX_LINE_BYTES"), ("over_MAX_LINE_BYTES", "short")])
def test_the_harness_own_not_run_after_long_lines_that_timed_out_stands(first, second):
    """An honest harness's "not run" is never forged: the grader counts a timeout at the end of a result line too
    long to parse (over 64 KiB), or to keep (over MAX_LINE_BYTES), as the harness counted it."""
    timed_out = [{"id": sid, "obs": ["ok", LONG[size], {"timeout": True}], "wall_ms": 1500}
                 for sid, size in (("a", first), ("b", second))]
    not_run = {"id": "c", "obs": [{"killed": observe.NOT_RUN}]}
    meter = _meter_of([{"load": "ok"}, *timed_out, not_run, {"done": 3}], ["a", "b", "c"])
    obs = {"c": [{"killed": observe.NOT_RUN}]}
    assert meter.claimed_not_run(obs) == [] and obs["c"] == [{"killed": observe.NOT_RUN}]


@pytest.mark.parametrize("size", ["over_64KiB"])
def test_not_run_before_its_turn_is_forged_whatever_the_line_lengths(size):
    lines = [{"load": "ok"}, {"id": "a", "obs": ["ok", LONG[size], {"timeout": True}], "wall_ms": 1500},
             {"id": "b", "obs": ["ok", LONG[size]], "wall_ms": 3}, {"id": "c", "obs": [{"killed": observe.NOT_RUN}]}]
    meter = _meter_of([*lines, {"done": 3}], ["a", "b", "c"])
    obs = {"c": [{"killed": observe.NOT_RUN}]}
    assert meter.claimed_not_run(obs) and obs["c"] == [{"killed": observe.FORGED_LINE}]


@pytest.mark.slow
def test_a_real_grading_of_the_forgery_is_tampered(tmp_path):
    course, release_path = build_course(tmp_path)
    release = json.loads(release_path.read_text(encoding="utf-8"))
    subs = tmp_path / "subs"
    subs.mkdir()
    for sid, source in (("stub", STUB), ("forger", STUB + FORGE % WORDS["own_text"])):
        (subs / f"{sid}.ipynb").write_text(json.dumps(attacks._with_solution(release, source)), encoding="utf-8")
    got = grade_folder(subs, course, tmp_path / "out")
    stub, forger = got["rows"]["stub"], got["rows"]["forger"]
    assert stub["status"] == "graded"
    assert forger["status"] == "tampered"
    assert float(forger["score"]) <= float(stub["score"])
    page = (tmp_path / "out" / "feedback" / "forger.html").read_text(encoding="utf-8")
    assert CLAIM not in page and "its result line was forged" in page
