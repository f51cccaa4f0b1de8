"""Shrinking a failing random trace: fewer requests, smaller values, while it still fails.

Deterministic: the number of rounds, not the clock, bounds the work (a busy machine gives the same
smallest trace as a quiet one); a generous wall-clock budget is only a backstop.
"""

from __future__ import annotations

import time

from .compare import compare, not_run
from .scenarios import SENTINEL, expected_for, trace_scenario

def size(trace: dict) -> tuple:
    rows = trace["rows"]
    total = 0
    for r in rows:
        total += r["prompt_len"] + r["max_new_tokens"] + r["required_blocks"] + abs(r["priority"]) + r["arrival_step"]
        total += abs(r["request_id"]) + (0 if r["deadline_step"] is None else 1 + min(r["deadline_step"], 10**6))
        total += int(r["cache_hit"]) + int(not r["preemptible"])
    return (len(rows), total, trace["free_kv_blocks"])


def _valid(trace: dict) -> bool:
    ids = [r["request_id"] for r in trace["rows"]]
    if len(set(ids)) != len(ids) or not trace["rows"]:
        return False
    for r in trace["rows"]:
        if r["prompt_len"] <= 0 or r["max_new_tokens"] <= 0 or r["required_blocks"] <= 0 or r["arrival_step"] < 0:
            return False
        if r["deadline_step"] is not None and r["deadline_step"] <= r["arrival_step"]:
            return False
    return trace["free_kv_blocks"] >= 0


def shrink_candidates(trace: dict) -> list[dict]:
    out = []

    def variant(rows=None, **cfg):
        t = {**trace, **cfg, "rows": rows if rows is not None else [dict(r) for r in trace["rows"]]}
        if _valid(t) and size(t) < size(trace):
            out.append(t)

    rows = trace["rows"]
    minimal = {"prompt_len": 1, "max_new_tokens": 1, "required_blocks": 1, "priority": 0, "cache_hit": False,
               "preemptible": True, "deadline_step": None}
    # Big jumps first: every row minimal, one field minimal in every row, one row minimal.
    variant(rows=[{**r, **minimal, "arrival_step": 0} for r in rows])
    for f, v in minimal.items():
        variant(rows=[{**r, f: v} for r in rows])
    variant(rows=[{**r, "arrival_step": 0,
                   "deadline_step": None if r["deadline_step"] is None else r["deadline_step"] - r["arrival_step"]}
                  for r in rows])
    for i in range(len(rows)):
        variant(rows=[{**r, **minimal} if j == i else dict(r) for j, r in enumerate(rows)])
    for i in range(len(rows)):
        variant(rows=[dict(r) for j, r in enumerate(rows) if j != i])
    for i, r in enumerate(rows):
        def change(**kw):
            new_rows = [dict(x) for x in rows]
            new_rows[i].update(kw)
            variant(rows=new_rows)
        for f in ("prompt_len", "max_new_tokens", "required_blocks"):
            if r[f] > 1:
                change(**{f: 1})
                change(**{f: (r[f] + 1) // 2})
                change(**{f: r[f] - 1})
        if r["priority"] != 0:
            change(priority=0)
            change(priority=int(r["priority"] / 2))
            change(priority=r["priority"] - (1 if r["priority"] > 0 else -1))
        if r["arrival_step"] > 0:
            shift = r["arrival_step"]
            change(arrival_step=0, deadline_step=None if r["deadline_step"] is None else r["deadline_step"] - shift)
            change(arrival_step=0)
            change(arrival_step=shift // 2)
            change(arrival_step=shift - 1)
        if r["deadline_step"] is not None:
            d, a = r["deadline_step"], r["arrival_step"]
            change(deadline_step=None)
            if d > 10**6:
                change(deadline_step=a + SENTINEL)
            change(deadline_step=a + 1)
            change(deadline_step=a + max(1, (d - a) // 2))
            change(deadline_step=d - 1)
        if r["cache_hit"]:
            change(cache_hit=False)
        if not r["preemptible"]:
            change(preemptible=True)
        if r["request_id"] != i and i not in {x["request_id"] for x in rows}:
            change(request_id=i)
    if trace["free_kv_blocks"] > 0:
        variant(free_kv_blocks=trace["free_kv_blocks"] // 2)
        variant(free_kv_blocks=trace["free_kv_blocks"] - 1)
    if trace["max_steps"] is not None:
        variant(max_steps=None)
    return out


def shrink(trace: dict, diff: str, rerun, budget_s: float = 120.0, max_rounds: int = 60, got=None):
    """Greedy shrinking: keep the smallest candidate that still fails, until none does (at most
    `max_rounds` rounds; `budget_s` of wall clock is only a backstop).

    Returns ``(trace, diff, got)``: the smallest failing trace, its first difference, and the
    submission's observations on it (`got` as given when nothing smaller fails). A candidate that did not
    run, or not to the end ("did not ...", "not run: ...") never counts as failing; `rerun` gives every
    candidate the full per-check limit (`observe.run_harness(hang_rules=False)`)."""
    deadline = time.monotonic() + budget_s
    for round_no in range(max_rounds):
        if time.monotonic() > deadline:
            break
        cands = shrink_candidates(trace)
        if not cands:
            break
        scen = [trace_scenario(f"s{round_no}_{i}", t) for i, t in enumerate(cands)]
        try:
            obs = rerun(scen)
        except Exception:  # noqa: BLE001 - a broken rerun just stops shrinking
            break
        if not obs:
            break
        best = None
        for sc_, t in zip(scen, cands):
            if sc_["id"] not in obs:
                continue
            sc_["expected"] = expected_for(sc_["ops"])
            dd = compare(sc_, obs[sc_["id"]])
            if not dd or dd.startswith("did not") or not_run(dd):
                continue  # it passed, or never ran (to the end): not a smaller failure
            if best is None or size(t) < size(best[0]):
                best = (t, dd, obs[sc_["id"]])
        if best is None:
            break
        trace, diff, got = best
    return trace, diff, got
