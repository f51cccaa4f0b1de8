"""A visible test cell scores what the student saw: when it passes in the notebook, its mirror among the
checks passes too (audit 6, finding 5: the mirrors compared whole states and events, the cells a few fields)."""

from __future__ import annotations

import json
import re
import types

import pytest

from decodesched.grader import harness, mutants, scenarios, spec, verdict

NB = json.loads(spec.SOURCE_NOTEBOOK.read_text(encoding="utf-8"))
REFERENCE = (spec.COURSE_ROOT.parent / "grader" / "solutions" / "reference.py").read_text(encoding="utf-8")
VISIBLE = [c.grade_id for c in spec.CELLS if c.grade_id.startswith("test_")]

# The audit's honest one-bug students whose visible cells pass in their notebook (s06, s08, s16).
AUDIT_BUGS = {
    "s06_no_free_on_finish": ("                self.free_kv_blocks += chosen.required_blocks\n", ""),
    "s08_no_wait_for_preempted": ("            if req is not chosen:\n                req.wait_steps += 1\n",
                                  "            if req is not chosen and req.status != 'preempted':\n"
                                  "                req.wait_steps += 1\n"),
    # review finding 2: the cell reads only len(run(max_steps=2)); its mirror compared the last event's action too
    "renamed_decode_action": ("'decode_one_step'", "'decode'"),
}


def _src(cell):
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def _cells():
    by_id = {}
    for cell in NB["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid:
            by_id[gid] = re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", "", _src(cell), flags=re.S)
    helper = next(_src(c) for c in NB["cells"] if c["cell_type"] == "code" and "def expect_equal" in _src(c))
    return by_id, helper


def _passes_in_notebook(source: str, gid: str) -> bool:
    by_id, helper = _cells()
    ns = {}
    exec(compile(source, "<solution>", "exec"), ns)
    exec(compile(helper, "<helper>", "exec"), ns)
    try:
        exec(compile(by_id[gid], gid, "exec"), ns)
    except Exception:  # noqa: BLE001
        return False
    return True


def _solutions():
    out = [("reference", REFERENCE)]
    out += [(m.name, m.source()) for m in mutants.MUTANTS]
    for name, (old, new) in AUDIT_BUGS.items():
        assert REFERENCE.count(old) == 1, name
        out.append((name, REFERENCE.replace(old, new)))
    return out


@pytest.mark.parametrize("name, source", _solutions(), ids=[n for n, _ in _solutions()])
def test_a_visible_cell_that_passes_in_the_notebook_scores_its_points(name, source, capsys):
    scen = scenarios.build_scenarios()
    mod = types.ModuleType("visible_under_test")
    harness.load_solution(source, mod.__dict__, 5.0)
    obs = {s["id"]: harness.run_scenario(mod.__dict__, json.loads(json.dumps(s["ops"]))) for s in scen}
    cells = verdict.judge(scen, obs)
    for gid in VISIBLE:
        if _passes_in_notebook(source, gid):
            assert cells[gid].score == cells[gid].max_score, (name, gid, cells[gid].lines)
    capsys.readouterr()


def test_a_renamed_decode_action_passes_the_visible_todo4_cell_and_its_mirror(capsys):
    old, new = AUDIT_BUGS["renamed_decode_action"]
    source = REFERENCE.replace(old, new)
    assert _passes_in_notebook(source, "test_todo4_step")
    scen = [s for s in scenarios.build_scenarios() if s["cell"] == "test_todo4_step"]
    mod = types.ModuleType("visible_under_test")
    harness.load_solution(source, mod.__dict__, 5.0)
    obs = {s["id"]: harness.run_scenario(mod.__dict__, json.loads(json.dumps(s["ops"]))) for s in scen}
    cell = verdict.judge(scen, obs)["test_todo4_step"]
    assert cell.score == cell.max_score == 3, cell.lines
    capsys.readouterr()
