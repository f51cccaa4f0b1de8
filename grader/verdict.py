"""The verdict: judge a student's solution cell outside the student's kernel.

`verdict_for_source(source, limits=...)` runs the solution cell in the sandboxed harness
(`grader.observe`), collects plain observations with strict types, and compares them here, in the
grading process, with the same operations run on the reference model (`grader.scenarios`,
`grader.compare`). A failing random trace is shrunk (`grader.shrink`) and reported as a small table
with its first diverging event.

Each cell scores ``points * passed / total`` (never above its points). Feedback lines describe the
scenario and the first difference; they never contain test source or tracebacks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

from .compare import compare, not_run, setup_text, trace_table
from .limits import Limits
from .observe import BUDGET_SPENT, _timed_out, collect_observations, run_harness, why_stopped, default_hide
from .scenarios import N_RANDOM_TRACES, build_scenarios, expected_for, trace_scenario
from .shrink import shrink, size
from .spec import CELLS

MAX_LINES_PER_CELL = 6
_EVIDENCE_NOTE = "the solution went for files outside its checks: "


@dataclass
class CellVerdict:
    score: float
    max_score: float
    lines: list[str] = field(default_factory=list)
    picture: dict | None = None  # the first failing trace: its rows and both schedules (feedback draws it)


@dataclass
class Verdict:
    cells: dict[str, CellVerdict]
    status: str
    total: float
    max_total: float
    notes: list[str] = field(default_factory=list)
    undefined: list[str] = field(default_factory=list)  # names of NameErrors the solution's code raised

    def as_dict(self) -> dict:
        return {
            "status": self.status,
            "total": self.total,
            "max_total": self.max_total,
            "notes": list(self.notes),
            "cells": {k: {"score": v.score, "max_score": v.max_score, "lines": list(v.lines)} for k, v in self.cells.items()},
        }


def _observations_by_id(observations) -> dict:
    """Accept a dict id -> obs, or the harness's list of JSON lines."""
    if isinstance(observations, dict):
        return observations
    out = {}
    for line in observations or []:
        if isinstance(line, dict) and isinstance(line.get("id"), str) and "obs" in line:
            out[line["id"]] = line["obs"]
    return out


def _walk_bad(obj, found: set):
    if isinstance(obj, str):
        if obj.startswith("<bad type:"):
            found.add(obj)
    elif isinstance(obj, list):
        for x in obj:
            _walk_bad(x, found)
    elif isinstance(obj, dict):
        for x in obj.values():
            _walk_bad(x, found)


def judge(scenarios: list[dict], observations, *, rerun=None, shrink_budget_s: float = 120.0) -> dict[str, CellVerdict]:
    """Per graded cell: score, max score and feedback lines.

    `observations` maps scenario id -> the harness observations (or is the harness's JSON lines).
    `rerun(list_of_scenarios) -> dict id -> obs`, when given, runs more scenarios in a fresh harness
    (used to shrink a failing random trace).
    """
    obs_by_id = _observations_by_id(observations)
    by_cell: dict[str, list] = {c.grade_id: [] for c in CELLS}
    for s in scenarios:
        by_cell.setdefault(s["cell"], []).append(s)
    verdicts = {}
    for cell in CELLS:
        items = by_cell.get(cell.grade_id, [])
        failures = []
        passed = 0
        for s in items:
            d = compare(s, obs_by_id.get(s["id"]))
            if d:
                failures.append((s, d))
            else:
                passed += 1
        total = len(items)
        score = 0.0 if total == 0 else min(float(cell.points), round(cell.points * passed / total, 2))
        if passed < total and score >= cell.points:
            score = max(0.0, cell.points - 0.01)
        lines, picture = [], None
        if cell.grade_id == "hidden_differential":
            if failures:
                more, picture = _differential_lines(failures, total, rerun, shrink_budget_s, obs_by_id)
                lines.extend(more)
            else:
                lines.append(f"all {total} random traces match the reference engine event for event")
        else:
            skipped = [(s, d) for s, d in failures if not_run(d)]
            ran = [(s, d) for s, d in failures if not not_run(d)]
            for k, (s, d) in enumerate(ran[:MAX_LINES_PER_CELL]):
                lines.append(f"FAIL {s['what']}: {d}")
                if k == 0:
                    lines.append("  setup / 场景: " + setup_text(s))
                    picture = schedule_picture(s, obs_by_id.get(s["id"]), d)
            if len(ran) > MAX_LINES_PER_CELL:
                lines.append(f"... and {len(ran) - MAX_LINES_PER_CELL} more failing checks")
            if skipped:
                lines.append(_not_run_line(skipped, "checks"))
            if not failures:
                lines.append(f"all {total} checks passed")
        verdicts[cell.grade_id] = CellVerdict(score=score, max_score=float(cell.points), lines=lines, picture=picture)
    return verdicts


def _not_run_line(skipped: list, what: str) -> str:
    """One line for the checks that were never started: they score 0, but nothing says they would fail."""
    return (f"NOT RUN {len(skipped)} {what} / 未运行: {skipped[0][1][len('not run: '):]} (they score 0; "
            "they are not counted as failing)")


def _differential_lines(failures, total, rerun, budget_s, obs_by_id) -> tuple[list[str], dict | None]:
    skipped = [(s, d) for s, d in failures if not_run(d)]
    failures = [(s, d) for s, d in failures if not not_run(d)]
    lines = [f"FAIL {len(failures)} of {total} random traces differ from the reference engine"] if failures else []
    if skipped:
        lines.append(_not_run_line(skipped, f"of {total} random traces"))
    not_run_ = [s for s, d in failures if d.startswith("did not run")]
    ran = [(s, d) for s, d in failures if not d.startswith("did not run")]
    if not ran:
        if not_run_:
            lines.append(f"{len(not_run_)} traces did not run to the end (crash, time or memory limit)")
        return lines, None
    s, d = min(ran, key=lambda item: size(item[0]["trace"]))
    trace, diff, got = s["trace"], d, obs_by_id.get(s["id"])
    if rerun is not None:
        trace, diff, got = shrink(trace, diff, rerun, budget_s, got=got)
    lines.append("smallest failing trace / 最小失败轨迹:")
    lines.extend(trace_table(trace))
    lines.append("first difference / 第一个分歧: " + diff)
    small = trace_scenario("shrunk", trace)
    small["expected"] = expected_for(small["ops"])
    return lines, schedule_picture(small, got, diff)


def schedule_picture(scenario: dict, got, diff: str) -> dict:
    """What the feedback draws for a failing scenario: the expected and the submitted schedule (the
    events of its steps, in order), the trace when it is a random one, and the first difference.
    Plain observations only: no test source."""
    return {"trace": scenario.get("trace"), "expected": schedule_events(scenario["expected"]),
            "got": schedule_events(got if isinstance(got, list) else []), "diff": diff}


def schedule_events(observations: list) -> list:
    """The events of a scenario's ``step``/``run``/``replay`` observations, in order (non-events as given)."""
    events = []
    for ob in observations or []:
        if isinstance(ob, dict) and isinstance(ob.get("events"), list):
            events.extend(ob["events"])
        elif isinstance(ob, dict) and "action" in ob:
            events.append(ob)
        elif isinstance(ob, list):
            events.extend(e for e in ob if isinstance(e, dict) and "action" in e)
    return events[:200]


def verdict_for_source(source, *, limits: Limits | dict | None = None, seed: int = 0, shrink_failures: bool = True,
                       hide=None, n_random: int = N_RANDOM_TRACES) -> Verdict:
    """Judge one solution cell's source: run it in the sandboxed harness, compare, score every cell."""
    if isinstance(limits, dict):
        limits = Limits(**limits)
    limits = limits or Limits()
    # Always hidden (as root), whatever the caller adds: the course and our own packages, so the
    # student's code cannot read and run the reference model from disk.
    hide = sorted(set(default_hide()) | set(hide or ()))
    max_total = float(sum(c.points for c in CELLS))
    if not isinstance(source, str) or not source.strip():
        cells = {c.grade_id: CellVerdict(0.0, float(c.points), ["no solution cell source / 没有找到解答单元格"])
                 for c in CELLS}
        return Verdict(cells=cells, status="invalid", total=0.0, max_total=max_total,
                       notes=["the solution cell is missing or empty"])
    scenarios = build_scenarios(seed, n_random)
    obs, runs, session = collect_observations(source, scenarios, limits, hide, serve=shrink_failures)
    try:
        verdict = _verdict(source, scenarios, obs, runs, session, limits, hide, shrink_failures, max_total)
    finally:
        if session is not None:
            session.close()
    if session is None or set(session.evidence) <= set(runs[0].evidence):
        return verdict
    return _with_evidence(verdict, sorted(set(runs[0].evidence) | set(session.evidence)))


def _with_evidence(verdict: Verdict, evidence: list) -> Verdict:
    """The verdict with the tamper evidence found once the shrinking session had ended: status tampered."""
    notes = [n for n in verdict.notes if not n.startswith(_EVIDENCE_NOTE)] + [_EVIDENCE_NOTE + "; ".join(evidence[:2])]
    return replace(verdict, status="tampered", notes=notes)


def _yielded(run) -> bool:
    """A run that stopped on purpose between two checks, near its CPU limit, and exited cleanly: a fresh one went on."""
    return run.yielded and getattr(run.outcome, "returncode", None) == 0


def _verdict(source, scenarios, obs, runs, session, limits, hide, shrink_failures, max_total) -> Verdict:
    outcomes = [r.outcome for r in runs]
    timed_out = any(getattr(o, "timed_out", False) for o in outcomes)
    memory = any(getattr(o, "memory_exceeded", False) for o in outcomes)
    died = [r for r in runs if not r.done and not _yielded(r)]
    crashed = bool(died) and not timed_out and not memory
    spent = not crashed and any(o == [{"killed": BUDGET_SPENT}] for o in obs.values())  # the CPU budget ran out
    all_obs_text = json.dumps(list(obs.values()))
    scenario_timeouts = '"timeout": true' in all_obs_text or any(r.slow_lines for r in runs)
    mem_in_obs = '"raised": "MemoryError"' in all_obs_text
    forged = [f for r in runs for f in r.forged]
    evidence = [e for r in runs for e in r.evidence]
    patched = sorted({n for r in runs for n in r.builtins_changed})
    load_errors = " ".join(str(r.load.get("error", "")) for r in runs if r.load)
    mem_in_obs = mem_in_obs or "MemoryError" in load_errors

    def rerun(more):
        if session is not None and session.alive():
            return session.run(more)
        small = replace(limits, cpu_s=min(limits.cpu_s, 20.0))
        return run_harness(source, more, limits=small, hide=hide, hang_rules=False).obs  # full limit per candidate

    can_rerun = shrink_failures and not timed_out and not memory and not crashed and not scenario_timeouts
    cells = judge(scenarios, obs, rerun=rerun if can_rerun else None)
    notes = []
    first = runs[0] if runs else None
    if first is not None and first.load is None:
        notes.append("the solution cell did not load (the checks' process stopped at once)")
    elif first is not None and first.load.get("load") == "error":
        notes.append(str(first.load.get("error", "the solution cell raised an error"))[:300])
    found: set = set()
    _walk_bad(list(obs.values()), found)
    suspicious = sorted(x for x in found if "overrides comparison" in x)
    if forged or suspicious or patched or evidence:
        status = "tampered"
        if evidence:
            notes.append(_EVIDENCE_NOTE + "; ".join(sorted(set(evidence))[:2]))
        if patched:
            notes.append("the solution replaced builtins (" + ", ".join(patched[:5]) + "); they were put back "
                         "before every check, so the checks saw the honest code only")
        if suspicious:
            notes.append("values with forged comparison were returned (" + ", ".join(suspicious[:3]) +
                         "): those checks score 0")
        if forged:
            notes.append("the checks' output was written by someone else: " + forged[0])
    elif memory or mem_in_obs:
        status = "memory"
        notes.append("memory limit reached: checks that ran out of memory score 0")
    elif timed_out or scenario_timeouts or spent:
        status = "timeout"
        hung = sum(1 for o in obs.values() if _timed_out(o))
        skipped = sum(1 for o in obs.values() if isinstance(o, list) and o and isinstance(o[0], dict)
                      and str(o[0].get("killed", "")).startswith("not run: "))
        lost = hung or timed_out or spent  # else only a statement of the cell was stopped as it loaded
        notes.append("time limit reached: " + ("checks that did not finish score 0" if lost else
                                               "a statement of the solution cell was stopped; every check ran")
                     + (f" ({hung} check(s) stopped at their time limit" if hung else "")
                     + (f"; {skipped} check(s) not run: the time allowed for checks that time out was spent"
                        if hung and skipped else "")
                     + (")" if hung else ""))
    elif crashed:
        status = "crashed"
        reasons = [why_stopped(r.outcome) for r in died]
        why = "; ".join(sorted(set(reasons)))
        notes.append(f"the checks' process died {len(reasons)} time(s) ({why}): each check it was running scores 0, "
                     "the others ran in a fresh process")
    else:
        status = "graded"
    if found and not suspicious:
        notes.append("non-plain values were returned (" + ", ".join(sorted(found)[:3]) + "): those checks failed")
    errors = [load_errors] + _raised_messages(obs)
    modules = sorted({m for text in errors for m in _NO_MODULE.findall(text)})
    if modules:
        notes.append(MODULES_NOTE + "; ".join(f"`import {m}` failed" for m in modules[:3])
                     + " / 评分时解答单元格只能使用标准库和 NumPy")
    undefined = sorted({n for text in errors for n in _UNDEFINED.findall(text)}
                       | {n for text in errors for found in _NOT_LOADED.findall(text) for n in found if n})
    total = round(sum(v.score for v in cells.values()), 2)
    return Verdict(cells=cells, status=status, total=total, max_total=max_total, notes=notes, undefined=undefined)


MODULES_NOTE = "the grader runs your solution cell with the standard library and NumPy only; "
_NO_MODULE = re.compile(r"No module named '([A-Za-z0-9_.]{1,60})'")
_UNDEFINED = re.compile(r"name '([A-Za-z_][A-Za-z0-9_]{0,60})' is not defined")
_NOT_LOADED = re.compile(r"the solution cell did not define (\w+)(?:, (\w+))?")  # the harness's words for a class


def _raised_messages(obs: dict) -> list[str]:
    """The messages of the exceptions the solution's code raised in the checks (each message once)."""
    found = set()
    for items in obs.values():
        for ob in items if isinstance(items, list) else ():
            if isinstance(ob, dict) and isinstance(ob.get("raised"), str) and isinstance(ob.get("msg"), str):
                found.add(f"{ob['raised']}: {ob['msg']}")
    return sorted(found)
