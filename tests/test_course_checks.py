"""The verdict checks: strict typing in the harness, judging, shrinking, messages, and the verdict path."""

import ast
import json
import os
import random
import re
from pathlib import Path

import pytest

from decodesched import model
from decodesched.grader import compare, harness, limits, mutants, scenarios, shrink, spec, verdict

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = (ROOT / "grader" / "solutions" / "reference.py").read_text(encoding="utf-8")


def _ns(source):
    import sys
    import types

    mod = types.ModuleType("solution_under_test")
    sys.modules["solution_under_test"] = mod
    harness.load_solution(source, mod.__dict__, 5.0)
    return mod.__dict__


def _inprocess_obs(source, scenarios):
    """Observations of a trusted solution without the sandbox (for fast unit tests)."""
    ns = _ns(source)
    return {s["id"]: harness.run_scenario(ns, json.loads(json.dumps(s["ops"]))) for s in scenarios}


# ---------------------------------------------------------------- the harness

def test_harness_is_stdlib_only_and_holds_no_reference_solution():
    src = (ROOT / "grader" / "harness.py").read_text(encoding="utf-8")
    tree = ast.parse(src)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"json", "os", "signal", "sys", "time", "types", "__future__", "ast"}
    for marker in ("victims.sort", "_effective_priority(req) <", "deadline_step - self.clock", "class DecodeSchedulerSim"):
        assert marker not in src


class _AlwaysEqual:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


class _IntLike(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


def test_normalise_is_strict():
    assert harness.normalise((1, "a", None, True)) == [1, "a", None, True]
    assert harness.normalise({"k": [1, 2]}) == {"k": [1, 2]}
    assert harness.normalise(_AlwaysEqual()).startswith("<bad type: _AlwaysEqual; overrides comparison")
    assert harness.normalise(_IntLike(3)).startswith("<bad type: _IntLike; overrides comparison")
    assert harness.normalise(1.0).startswith("<float")
    assert harness.normalise({1: 2}).startswith("<bad type: dict key")
    np = pytest.importorskip("numpy")
    assert harness.normalise(np.int64(5)) == 5 and type(harness.normalise(np.int64(5))) is int
    assert harness.normalise(np.bool_(True)) is True


def test_same_distinguishes_bool_from_int_and_rejects_forged_values():
    assert not compare._same(True, 1) and not compare._same(1, True) and not compare._same(None, 0)
    assert compare._same([1, {"a": True}], [1, {"a": True}])
    assert not compare._same(3, harness.normalise(_IntLike(3)))


def test_eq_always_true_scores_zero_for_that_check():
    scen = [s for s in scenarios.build_scenarios() if s["id"] == "h4_event_wait"]
    src = REFERENCE + (
        "\nclass _Any:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
        "_orig = DecodeSchedulerSim.step\n"
        "def _step(self):\n    ev = _orig(self)\n    if ev is not None: ev['wait_steps'] = _Any()\n    return ev\n"
        "DecodeSchedulerSim.step = _step\n"
    )
    obs = _inprocess_obs(src, scen)
    assert "overrides comparison" in json.dumps(obs)
    cell = verdict.judge(scen, obs)["hidden_todo4_step"]
    assert cell.score == 0.0 and any("wait_steps" in ln for ln in cell.lines)


def test_harness_replay_is_spec_section_3():
    """The harness's replay loop over the model class gives exactly `decodesched.model.replay`."""
    rng = random.Random(7)
    for i in range(60):
        trace = scenarios._random_trace(rng, i)
        ns = {"DecodeSchedulerSim": model.DecodeSchedulerSim, "RequestState": model.RequestState}
        sim = model.DecodeSchedulerSim(trace["policy"], trace["free_kv_blocks"], trace["aging_interval"])
        got = harness.replay(sim, trace["rows"], scenarios._bound(trace))
        ref = model.replay(trace["rows"], trace["policy"], trace["free_kv_blocks"], trace["aging_interval"],
                           trace["max_steps"])
        assert got["events"] == [harness.normalise(e) for e in ref.events]
        assert got["free_kv_blocks"] == ref.free_kv_blocks and got["clock"] == ref.clock
        assert set(got["states"]) == {str(k) for k in ref.states}
        del ns


def test_load_solution_keeps_going_after_a_failing_statement():
    ns = {}
    errors = harness.load_solution("import not_a_module_xyz\nx = 1\nraise ValueError('boom')\ny = 2\n", ns, 5.0)
    assert ns["x"] == 1 and ns["y"] == 2
    assert len(errors) == 2 and "ModuleNotFoundError" in errors[0] and "ValueError" in errors[1]


# ---------------------------------------------------------------- judging

def test_scenarios_are_deterministic_and_cover_every_cell():
    a, b = scenarios.build_scenarios(0), scenarios.build_scenarios(0)
    assert [s["ops"] for s in a] == [s["ops"] for s in b]
    cells = {s["cell"] for s in a}
    assert cells == set(spec.CELL_IDS)
    assert sum(s["cell"] == "hidden_differential" for s in a) >= 200
    assert [s["ops"] for s in scenarios.build_scenarios(1)] != [s["ops"] for s in a]


def test_reference_in_process_passes_every_scenario():
    scen = scenarios.build_scenarios()
    verdicts = verdict.judge(scen, _inprocess_obs(REFERENCE, scen))
    assert {k: v.score for k, v in verdicts.items()} == {c.grade_id: float(c.points) for c in spec.CELLS}


def test_partial_credit_is_proportional_and_never_above_points():
    scen = scenarios.build_scenarios()
    obs = _inprocess_obs(mutants.by_name("m05_preempts_equal_priority").source(), scen)
    verdicts = verdict.judge(scen, obs)
    for c in spec.CELLS:
        v = verdicts[c.grade_id]
        assert 0 <= v.score <= c.points == v.max_score
    assert 0 < verdicts["hidden_todo3_capacity"].score < 16
    assert verdict.judge(scen, {})["hidden_differential"].score == 0


@pytest.mark.parametrize("name, own, spared", [
    # TODO 4's wait accounting: no longer 30 points of TODO 1-3 through the events' and states' wait_steps
    # (hidden_todo3_capacity keeps one check: under aging, the waits decide who may preempt)
    ("m08_wait_counted_for_chosen", "hidden_todo4_step",
     ("hidden_todo1_enqueue", "hidden_input_errors", "hidden_todo2_schedule_key")),
    # TODO 3's block accounting: no longer points of TODO 1-2 through every event's free_kv_blocks
    ("m21_admission_takes_no_blocks", "hidden_todo3_capacity",
     ("hidden_todo1_enqueue", "hidden_input_errors", "hidden_todo2_schedule_key")),
])
def test_a_bug_costs_points_in_its_own_todo_not_through_an_unrelated_field(name, own, spared):
    scen = scenarios.build_scenarios(n_random=0)
    cells = verdict.judge(scen, _inprocess_obs(mutants.by_name(name).source(), scen))
    assert cells[own].score < cells[own].max_score
    for gid in spared:
        assert cells[gid].score == cells[gid].max_score, (name, gid, cells[gid].lines)


def test_the_todo1_cell_still_reads_a_late_request_whole():
    """TODO 1's checks leave TODO 3-4's fields out of states read after a step, but not what enqueue sets."""
    old = "        self.queue.append(request)\n"
    assert REFERENCE.count(old) == 1
    late_waits = REFERENCE.replace(old, "        request.wait_steps = self.clock\n" + old)
    scen = [s for s in scenarios.build_scenarios(n_random=0) if s["cell"] == "hidden_todo1_enqueue"]
    cell = verdict.judge(scen, _inprocess_obs(late_waits, scen))["hidden_todo1_enqueue"]
    assert cell.score < cell.max_score and any("wait_steps" in ln for ln in cell.lines), cell.lines


def test_shrinking_finds_a_minimal_trace_and_names_the_first_diverging_event():
    src = mutants.by_name("m05_preempts_equal_priority").source()
    scen = scenarios.build_scenarios()
    obs = _inprocess_obs(src, scen)
    lines = verdict.judge(scen, obs, rerun=lambda more: _inprocess_obs(src, more))["hidden_differential"].lines
    text = "\n".join(lines)
    assert re.search(r"FAIL \d+ of \d+ random traces differ", text)
    first = next(ln for ln in lines if ln.startswith("first difference"))
    assert re.search(r"step \d+: expected request -?\d+ \w+, got request -?\d+ \w+", first), first
    head = lines.index("smallest failing trace / 最小失败轨迹:")
    table = lines[head + 3:lines.index(first)]
    assert 1 <= len(table) <= 2  # two requests of equal priority are enough to show this bug


def test_shrink_reduces_values_while_it_still_fails():
    trace = {"rows": [
        {"request_id": 17, "arrival_step": 5, "prompt_len": 6, "max_new_tokens": 4, "priority": 3, "cache_hit": True,
         "required_blocks": 4, "deadline_step": 14, "preemptible": False},
        {"request_id": -4, "arrival_step": 0, "prompt_len": 3, "max_new_tokens": 3, "priority": -2,
         "cache_hit": False, "required_blocks": 2, "deadline_step": None, "preemptible": True}],
        "policy": "deadline", "free_kv_blocks": 9, "aging_interval": 2, "max_steps": None}

    def student(more):  # "fails" whenever some request has max_new_tokens >= 2
        return {s["id"]: ([] if any(r["max_new_tokens"] >= 2 for r in s["trace"]["rows"]) else scenarios.expected_for(s["ops"]))
                for s in more}

    small, diff, got = shrink.shrink(trace, "x", student)
    assert len(small["rows"]) == 1
    r = small["rows"][0]
    assert r["max_new_tokens"] == 2 and r["prompt_len"] == 1 and r["required_blocks"] == 1 and r["priority"] == 0
    assert diff and got == student([scenarios.trace_scenario("again", small)])["again"]


def test_messages_say_expected_and_got():
    scen = scenarios.build_scenarios()
    for name, cell, pattern in [
        ("m18_deadline_flag_off_by_one", "hidden_todo4_step", r"expected deadline_missed=False, got deadline_missed=True"),
        ("m13_minus_one_means_no_victim", "hidden_todo3_capacity", r"expected preempted_request_id=-1, got preempted_request_id=None"),
        ("m09_slack_clamped_at_zero", "hidden_todo2_schedule_key", r"expected \(-\d+, .*\), got \(0, "),
    ]:
        obs = _inprocess_obs(mutants.by_name(name).source(), scen)
        lines = verdict.judge(scen, obs)[cell].lines
        assert any(re.search(pattern, ln) for ln in lines), (name, lines)


def test_feedback_never_contains_hidden_test_source():
    nb = json.loads(spec.SOURCE_NOTEBOOK.read_text(encoding="utf-8"))
    hidden = []
    for cell in nb["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        m = re.search(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", src, re.S)
        if m:
            hidden += [ln.strip() for ln in m.group(1).splitlines() if len(ln.strip()) > 15]
    assert hidden
    scen = scenarios.build_scenarios()
    for mutant in mutants.MUTANTS[:8]:
        text = json.dumps({k: v.lines for k, v in verdict.judge(scen, _inprocess_obs(mutant.source(), scen)).items()},
                          ensure_ascii=False)
        for ln in hidden:
            assert ln not in text
        assert "Traceback" not in text


# ---------------------------------------------------------------- the real verdict path (sandboxed child)

def test_verdict_reference_full_marks_and_release_zero():
    from decodesched.grader.selfcheck import release_solution_source

    v = verdict.verdict_for_source(REFERENCE)
    assert v.status == "graded" and v.total == v.max_total == 100
    rel = verdict.verdict_for_source(release_solution_source())
    assert rel.status == "graded" and all(c.score == 0 for c in rel.cells.values())
    assert any("NotImplementedError" in ln for c in rel.cells.values() for ln in c.lines)


def test_verdict_invalid_source():
    v = verdict.verdict_for_source("")
    assert v.status == "invalid" and v.total == 0


def test_verdict_student_cannot_import_the_reference_engine():
    v = verdict.verdict_for_source("from decodesched.model import DecodeSchedulerSim, RequestState\n")
    assert v.total == 0 and any("decodesched" in n for n in v.notes)


def test_verdict_crash_in_one_case_loses_only_those_checks():
    src = REFERENCE.replace(
        "        candidates = [req for req in self.queue if not req.done]\n",
        "        candidates = [req for req in self.queue if not req.done]\n"
        "        if self.policy == 'aging' and self.free_kv_blocks == 0:\n            import os; os._exit(3)\n", 1)
    v = verdict.verdict_for_source(src, shrink_failures=False)
    assert v.status == "crashed"
    assert 50 < v.total < 100
    assert any("died" in n for n in v.notes)


@pytest.mark.slow
def test_verdict_uninterruptible_loop_is_a_timeout_with_partial_credit():
    src = REFERENCE.replace(
        "        candidates = [req for req in self.queue if not req.done]\n",
        "        candidates = [req for req in self.queue if not req.done]\n"
        "        if self.policy == 'aging' and self.clock > 3:\n"
        "            while True:\n                try:\n                    pass\n                except BaseException:\n"
        "                    pass\n", 1)
    v = verdict.verdict_for_source(src, limits=limits.Limits(cpu_s=12), shrink_failures=False)
    assert v.status == "timeout" and 0 < v.total < 100


@pytest.mark.skipif(os.geteuid() != 0, reason="paths are hidden only when the grader runs as root")
def test_verdict_student_cannot_read_the_reference_model_from_disk():
    import decodesched

    model_py = Path(decodesched.__file__).resolve().parent / "model.py"
    src = f"exec(open({str(model_py)!r}).read())\n"
    v = verdict.verdict_for_source(src, shrink_failures=False)
    assert v.total == 0


def test_verdict_memory_growing_into_the_time_limit_is_memory():
    # A memory bomb on a machine where fresh memory comes slowly: each 8 MiB also costs CPU, so the
    # statement meets its CPU limit (1.5 s) with about 150-300 MiB more resident, well under the
    # 512 MiB limit but over a quarter of it: the status must be the one a fast machine gives.
    bomb = ("import time as _t\n_hog = []\n"
            "def _slow_bomb():\n    while True:\n        _hog.append(bytearray(8 * 2**20))\n"
            "        _end = _t.process_time() + 0.04\n        while _t.process_time() < _end:\n            pass\n"
            "_slow_bomb()\n")
    tight = limits.Limits(cpu_s=30, memory_mb=512, scenario_cpu_s=1.0)
    v = verdict.verdict_for_source(bomb + REFERENCE, limits=tight, shrink_failures=False)
    assert v.status == "memory" and v.total == 100
    assert any("line 9 raised MemoryError: memory kept growing until the time limit" in n for n in v.notes), v.notes
    # the same CPU spent without the memory is a timeout
    spin = bomb.replace("        _hog.append(bytearray(8 * 2**20))\n", "")
    v = verdict.verdict_for_source(spin + REFERENCE, limits=tight, shrink_failures=False)
    assert v.status == "timeout" and v.total == 100
    assert any("line 8 timed out" in n for n in v.notes), v.notes


def test_verdict_forked_processes_do_not_speak_for_the_harness():
    # A process forked by the solution, at load or inside a check, runs on into the harness's own
    # code; its result lines used to repeat the harness's and read as forged results ("tampered").
    # It now leaves at its first line, and the honest code earns what it earns.
    at_load = REFERENCE + "\nimport os as _os\nif _os.fork() == 0:\n    pass\n"
    in_a_check = REFERENCE + (
        "\nimport os as _os\n_forked = []\n_enqueue = DecodeSchedulerSim.enqueue\n"
        "def _forking_enqueue(self, *args, **kwargs):\n    if not _forked:\n        _forked.append(_os.fork())\n"
        "    return _enqueue(self, *args, **kwargs)\n"
        "DecodeSchedulerSim.enqueue = _forking_enqueue\n")
    for src in (at_load, in_a_check):
        v = verdict.verdict_for_source(src, shrink_failures=False)
        assert v.status == "graded" and v.total == 100, (v.status, v.total, v.notes)


def test_to_json_matches_json_for_plain_values():
    for value in [None, True, False, 0, -7, 2**70, "", "a\"b\\c\n\t\x01é中😀", [1, [None, {"k": "v"}]], {"a": [True, 3]}]:
        assert json.loads(harness.to_json(value)) == value
    assert harness.to_json("😀").isascii()


def test_verdict_builtins_patching_is_undone_and_reported():
    src = REFERENCE + "\nimport builtins as _b\n_b.isinstance = lambda obj, cls: True\n_b.sorted = lambda *a, **k: []\n"
    v = verdict.verdict_for_source(src, shrink_failures=False)
    assert v.total == 100  # the honest code earns what it earns, the harness is not disturbed
    assert v.status == "tampered" and any("isinstance" in n and "sorted" in n for n in v.notes)


@pytest.mark.slow
def test_verdict_slow_top_level_statement_is_skipped_not_fatal():
    src = "import time\ntime.sleep(60)\n" + REFERENCE
    v = verdict.verdict_for_source(src, limits=limits.Limits(cpu_s=20), shrink_failures=False)
    assert v.status == "timeout" and v.total == 100
    assert any("line 2 timed out" in n for n in v.notes)
