"""Shrinking a failing random trace never keeps a candidate that was not run, or was cut short by a limit that
earlier checks' hangs shortened (review finding 1): every shrinking batch gets the full per-check limit."""

from __future__ import annotations

import time
from pathlib import Path

from decodesched.grader import harness, limits, observe, scenarios, shrink

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = (ROOT / "grader" / "solutions" / "reference.py").read_text(encoding="utf-8")
STUCK = "        if chosen is None:\n            return None\n        ### END SOLUTION\n"
HANGS = REFERENCE.replace(STUCK, "        while chosen is None:\n            pass\n        ### END SOLUTION\n")
HANGING = ("he_constructor", "h3_zero_capacity", "h4_none_when_stuck")  # the ids on which HANGS hangs
NOT_RUN_OBS = [{"killed": harness.NOT_RUN}]


def _failing_random():
    sc = scenarios.build_scenarios(0, 8)
    r = next(s for s in sc if s["id"].startswith("r0_"))
    return r["trace"]


def test_candidates_that_were_not_run_are_never_the_smallest_failure():
    trace = _failing_random()
    diff = "step 1: expected x, got y"
    seen = []

    def rerun(more):
        seen.append(len(more))
        return {m["id"]: NOT_RUN_OBS for m in more}

    got = [{"the": "original"}]
    t, d, g = shrink.shrink(trace, diff, rerun, got=got)
    assert seen  # candidates were tried ...
    assert (t, d, g) == (trace, diff, got)  # ... and none counts as failing: the original trace stays


def test_a_real_failure_is_kept_beside_candidates_that_were_not_run():
    trace = _failing_random()
    rounds = []

    def rerun(more):
        rounds.append(more)
        if len(rounds) > 1:
            return {}
        # every candidate "not run" but the largest one, which really differs
        real = max(more, key=lambda m: shrink.size(m["trace"]))
        return {m["id"]: ([["wrong"]] if m is real else NOT_RUN_OBS) for m in more}

    t, d, _ = shrink.shrink(trace, "first", rerun)
    assert rounds and not d.startswith("not run")
    assert t == max((m["trace"] for m in rounds[0]), key=shrink.size)


def _only(ids):
    by = {s["id"]: s for s in scenarios.build_scenarios(0, 8)}
    return [by[i] for i in ids]


def test_a_shrinking_session_gives_every_candidate_the_full_limit_and_runs_it():
    # allowance 0.4 s: the first batch's two hangs spend it, and its third check is "not run"
    tight = limits.Limits(cpu_s=30, scenario_cpu_s=0.2, short_scenario_cpu_s=0.01, timeout_share=0.001)
    first = observe.run_harness(HANGS, _only(HANGING[:2] + ("h1_defaults",)), limits=tight,
                                hide=observe.default_hide(), serve=True)
    try:
        assert first.done and first.session is not None
        assert first.obs["h1_defaults"] == NOT_RUN_OBS
        start = time.monotonic()
        more = first.session.run(_only(("h4_none_when_stuck", "h1_order")))
        took = time.monotonic() - start
    finally:
        if first.session is not None:
            first.session.close()
    # the hang has its full 0.2 s limit (not the 0.01 s short one) and times out; the honest check runs
    assert more["h4_none_when_stuck"][-1].get("timeout") is True, more
    assert took >= 0.18
    assert more["h1_order"] != NOT_RUN_OBS
    assert not scenarios_compare("h1_order", more["h1_order"])


def scenarios_compare(sid, obs):
    from decodesched.grader.compare import compare
    return compare(_only((sid,))[0], obs)


def test_the_fallback_rerun_has_no_hang_allowance():
    tight = limits.Limits(cpu_s=30, scenario_cpu_s=0.2, short_scenario_cpu_s=0.01, timeout_share=0.001)
    run = observe.run_harness(HANGS, _only(HANGING + ("h1_order",)), limits=tight, hide=observe.default_hide(),
                              hang_rules=False)
    assert run.done
    assert all(run.obs[i][-1].get("timeout") is True for i in HANGING), run.obs
    assert not scenarios_compare("h1_order", run.obs["h1_order"])
