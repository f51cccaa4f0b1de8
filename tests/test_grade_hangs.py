"""A solution whose checks hang loses the checks it really fails, the same ones on every run (audit 6, finding 7).

Checks that time out are budgeted by count, not by measured CPU time (`Limits.timeout_allowance_s`); a
harness close to its run's CPU limit stops between two checks and a fresh one goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from decodesched.grader import limits, observe, scenarios, verdict

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = (ROOT / "grader" / "solutions" / "reference.py").read_text(encoding="utf-8")
STUCK = "        if chosen is None:\n            return None\n        ### END SOLUTION\n"
HANGS = REFERENCE.replace(STUCK, "        while chosen is None:\n            pass\n        ### END SOLUTION\n")


def _summary(v):
    return v.status, v.total, {k: (c.score, c.lines[:2]) for k, c in v.cells.items()}


@pytest.mark.slow
def test_hanging_checks_lose_the_same_checks_on_every_run_and_not_run_is_said_apart():
    assert HANGS != REFERENCE
    tight = limits.Limits(cpu_s=12)  # allowance 6 s: two checks at 3 s, then the rest are not run
    first = verdict.verdict_for_source(HANGS, limits=tight, shrink_failures=False)
    again = verdict.verdict_for_source(HANGS, limits=tight, shrink_failures=False)
    assert _summary(first) == _summary(again)
    assert first.status == "timeout" and 0 < first.total < 100
    lines = first.cells["hidden_differential"].lines
    assert any(ln.startswith("NOT RUN ") and "not counted as failing" in ln for ln in lines), lines
    assert any("not run" in n for n in first.notes), first.notes

    roomy = verdict.verdict_for_source(HANGS, limits=limits.Limits(cpu_s=60), shrink_failures=False)
    lines = roomy.cells["hidden_differential"].lines
    assert not any(ln.startswith("NOT RUN") for ln in lines), lines  # every check ran: only real failures
    assert roomy.total > first.total


def _killed(o):
    return isinstance(o, list) and bool(o) and isinstance(o[0], dict) and "killed" in o[0]


def test_a_harness_near_its_cpu_limit_yields_between_checks_and_loses_nothing():
    scen = scenarios.build_scenarios(0, 8)
    hangs = 8  # he_constructor, h3_zero_capacity, h4_none_when_stuck and 5 random traces hang
    # 3 s of CPU per run, 0.5 s per check (no shorter limit, no allowance spent): a run gets through the honest
    # checks and a few hangs, then yields before a check that could meet its CPU limit; a fresh run goes on
    small = limits.Limits(cpu_s=3, scenario_cpu_s=0.5, short_scenario_cpu_s=0.5, timeout_share=100)
    pending, seen, runs = list(scen), [], []
    while pending and len(runs) < 8:
        timeouts = sum(1 for o in seen if o[-1] == {"timeout": True})
        run = observe.run_harness(HANGS, pending, limits=small, hide=observe.default_hide(), timeouts_before=timeouts)
        runs.append(run)
        assert not getattr(run.outcome, "timed_out", False)
        assert run.obs, "a run yielded before its first check"
        assert run.done or run.yielded
        assert not any(_killed(o) for o in run.obs.values()), run.obs  # nothing cut short, nothing "not run"
        assert list(run.obs) == [s["id"] for s in pending[:len(run.obs)]]  # in order, from where the last stopped
        seen += run.obs.values()
        pending = pending[len(run.obs):]
    assert not pending and len(runs) >= 2 and runs[0].yielded  # it did yield, and the rest ran in fresh runs
    assert len(seen) == len(scen)  # every check exactly once across the runs
    assert sum(1 for o in seen if o[-1] == {"timeout": True}) == hangs
    obs, runs, _ = observe.collect_observations(HANGS, scen, limits.Limits(cpu_s=40), observe.default_hide())
    assert len(obs) == len(scen)
    assert not any("killed" in o[0] for o in obs.values() if isinstance(o[0], dict)
                   and not str(o[0].get("killed", "")).startswith("not run"))


SLOW_ONCE = """
import time as _time
_step_once = DecodeSchedulerSim.step
_slow = [True]

def _slow_first_step(self):
    if _slow[0]:
        _slow[0] = False
        start = _time.process_time()
        while _time.process_time() - start < 1.5:  # past the per-check limit below, once per process
            pass
    return _step_once(self)
"""
SWALLOWS = SLOW_ONCE + """
def _step(self):
    while True:
        try:
            return _slow_first_step(self)
        except BaseException:  # the time limit too: try again
            continue
DecodeSchedulerSim.step = _step
"""


IGNORES = SLOW_ONCE + """
import signal as _signal

def _deaf_step(self):
    _signal.signal(_signal.SIGPROF, _signal.SIG_IGN)  # no alarm reaches the check
    _signal.signal(_signal.SIGALRM, _signal.SIG_IGN)
    _signal.setitimer(_signal.ITIMER_PROF, 0)
    return _slow_first_step(self)
DecodeSchedulerSim.step = _deaf_step
"""


@pytest.mark.parametrize("evader", [SWALLOWS, IGNORES], ids=["swallows", "silences"])
def test_a_check_that_evades_its_time_limit_still_timed_out(evader):
    """The per-check limit is an alarm in the solution's own process. A step() that took too long once and
    retried inside `except BaseException` scored 100 'graded' where the same step() without the retry lost the
    check (red-team finding); one that set SIGPROF and SIGALRM to SIG_IGN (or stopped the timer) ran its slow
    check to the end and passed it (round 2). The alarm is noted before it is raised, and a check that used more
    CPU time than its limit timed out whether or not its alarm came: all three lose the same check."""
    small = limits.Limits(cpu_s=30, scenario_cpu_s=0.5)
    plain = verdict.verdict_for_source(REFERENCE + SLOW_ONCE + "DecodeSchedulerSim.step = _slow_first_step\n",
                                       limits=small, shrink_failures=False)
    evading = verdict.verdict_for_source(REFERENCE + evader, limits=small, shrink_failures=False)
    assert plain.status == "timeout" and plain.total < 100, _summary(plain)
    assert (evading.status, evading.total) == (plain.status, plain.total), (_summary(evading), _summary(plain))
