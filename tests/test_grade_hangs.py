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


def test_a_harness_near_its_cpu_limit_yields_between_checks_and_loses_nothing():
    scen = scenarios.build_scenarios(0, 8)
    # 2.5 s of CPU in all: the first check that hangs (3 s) would meet the run's limit, so it yields first
    run = observe.run_harness(HANGS, scen, limits=limits.Limits(cpu_s=2.5), hide=observe.default_hide())
    assert run.yielded and not run.done
    assert not getattr(run.outcome, "timed_out", False)
    assert all(not (isinstance(o, list) and o and isinstance(o[0], dict) and "killed" in o[0]) for o in run.obs.values())
    obs, runs, _ = observe.collect_observations(HANGS, scen, limits.Limits(cpu_s=40), observe.default_hide())
    assert len(obs) == len(scen)
    assert not any("killed" in o[0] for o in obs.values() if isinstance(o[0], dict)
                   and not str(o[0].get("killed", "")).startswith("not run"))
