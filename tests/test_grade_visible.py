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


def _judge_visible(source: str) -> dict:
    """The verdicts of `source` on the targeted checks (in process, no random traces)."""
    scen = scenarios.build_scenarios(n_random=0)
    mod = types.ModuleType("visible_under_test")
    harness.load_solution(source, mod.__dict__, 5.0)
    obs = {s["id"]: harness.run_scenario(mod.__dict__, json.loads(json.dumps(s["ops"]))) for s in scen}
    return verdict.judge(scen, obs)


def _one_bug(*edits) -> str:
    source = REFERENCE
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


# The corners where a mirror was stricter than its cell: each one-bug solution passes some visible cells in the
# notebook and must score them in the grader; the hidden checks say what docs/grading.md says.
RENAMED_ENQUEUE = _one_bug(
    ("    def enqueue(self, request_id: int, prompt_len: int, max_new_tokens: int = 2,",
     "    def enqueue(self, rid: int, n_prompt: int, max_new_tokens: int = 2,"),
    ('        """校验并登记请求；请求从 prefill 阶段开始。 Validate and register a request; it starts in prefill."""\n',
     '        """校验并登记请求；请求从 prefill 阶段开始。 Validate and register a request; it starts in prefill."""\n'
     "        request_id, prompt_len = rid, n_prompt\n"))
FLOAT_SENTINEL = _one_bug(("        deadline_slack = 1_000_000_000\n", "        deadline_slack = 1e9\n"))
FLOAT_EVENT_ID = _one_bug(("            'request_id': chosen.request_id,\n",
                           "            'request_id': float(chosen.request_id),\n"))
DICT_SUBCLASS_EVENT = _one_bug(
    ("class DecodeSchedulerSim:\n", "class Event(dict):\n    pass\n\n\nclass DecodeSchedulerSim:\n"),
    ("        event = {\n", "        event = Event({\n"),
    ("        }\n        self.timeline.append(event)\n", "        })\n        self.timeline.append(event)\n"))


@pytest.mark.parametrize("name, source, passing, hidden_loses", [
    # 1. the cells pass request_id, prompt_len, max_new_tokens positionally (TODO 1's first call by keyword)
    ("renamed_enqueue_parameters", RENAMED_ENQUEUE, {"test_todo2_schedule_key", "test_todo3_capacity",
                                                     "test_todo4_step"}, "hidden_todo1_enqueue"),
    # 2. the TODO 2 cell compares the whole key with == (expect_equal checks the tuple's type, not its items')
    ("float_sentinel", FLOAT_SENTINEL, set(VISIBLE), None),
    #    the TODO 4 cell compares (events[0]['request_id'], events[0]['action']) with ==
    ("float_event_request_id", FLOAT_EVENT_ID, {"test_todo1_enqueue", "test_todo4_step"}, "hidden_todo4_step"),
    # 3. the cells read event['request_id'] and friends: a dict subclass answers them
    ("dict_subclass_event", DICT_SUBCLASS_EVENT, set(VISIBLE), "hidden_todo4_step"),
])
def test_a_mirror_is_no_stricter_than_its_cell(name, source, passing, hidden_loses, capsys):
    assert {gid for gid in VISIBLE if _passes_in_notebook(source, gid)} == passing, name
    cells = _judge_visible(source)
    for gid in passing:
        assert cells[gid].score == cells[gid].max_score == 3, (name, gid, cells[gid].lines)
    for gid in set(VISIBLE) - passing:
        assert cells[gid].score < cells[gid].max_score, (name, gid)
    if hidden_loses:  # the hidden checks keep the signature and the events' exact types
        assert cells[hidden_loses].score < cells[hidden_loses].max_score, (name, hidden_loses)
    capsys.readouterr()


def test_the_sort_key_is_compared_by_value_in_the_hidden_checks_too(capsys):
    """An integral float sentinel schedules exactly as the int: the key is only ever compared (== and <), by the
    notebook's own hidden cell and the seed's tests alike, so it costs no points; a float that is not equal does."""
    cells = _judge_visible(FLOAT_SENTINEL)
    short = {k: v.lines for k, v in cells.items() if v.score < v.max_score and k != "hidden_differential"}
    assert not short, short  # (no random traces here: a replay reads no key)
    off = _judge_visible(_one_bug(("        deadline_slack = 1_000_000_000\n", "        deadline_slack = 1e9 + 0.5\n")))
    assert off["test_todo2_schedule_key"].score < 3
    assert off["hidden_todo2_schedule_key"].score < off["hidden_todo2_schedule_key"].max_score
    assert any("<float: 1000000000.5>" in ln for ln in off["hidden_todo2_schedule_key"].lines)
    capsys.readouterr()
