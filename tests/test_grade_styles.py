"""Honest students whose code does not look like the reference: correct solutions in other styles score full
marks, and near-misses lose points in their own TODO's cells, with feedback that names a failing scenario.

The solutions are whole solution cells in `tests/grader_attacks/styles/` (each keeps the seed's interface): requests
in a dict keyed by id, in parallel lists, as dict records, slotted/ordered/frozen dataclasses, NamedTuples, Enums
inside; scheduling with heapq, sorted, min, cmp_to_key, bisect, np.lexsort, hand-written loops; events as dict
literals, dict(zip(...)), OrderedDict, {**base, ...}, NamedTuple._asdict(); print/logging/warnings/assert left in.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from decodesched.grader import harness, scenarios, spec, verdict

STYLES_DIR = Path(__file__).resolve().parent / "grader_attacks" / "styles"
# Styles that are another style with a few lines changed: (that style, [(old, new), ...]).
VARIANTS = {
    # events as collections.OrderedDict (fields in the documented order)
    "s08_ordereddict_events": ("s07_manual_loops_recursion", [
        ("import sys\n", "import collections\nimport sys\n"),
        ("        event = {}\n", "        event = collections.OrderedDict()\n")]),
    # warnings.warn when a request misses its deadline (shown once per location on stderr, in the notebook's test
    # cell that first triggers it) and logging.warning on a preemption (stderr through logging's last-resort
    # handler, every time)
    "s10_warnings_logging_stderr": ("s01_dict_by_id_heapq", [
        ("import heapq\n", "import heapq\nimport logging\nimport warnings\n"),
        ("            return victim.request_id\n",
         "            logging.warning('request %s preempts %s', challenger.request_id, victim.request_id)\n"
         "            return victim.request_id\n"),
        ("        self.timeline.append(event)\n",
         "        if missed:\n"
         "            warnings.warn(f'request {chosen.request_id} misses its deadline {chosen.deadline_step}')\n"
         "        self.timeline.append(event)\n")]),
}
STYLES = sorted([p.stem for p in STYLES_DIR.glob("s[0-9][0-9]_*.py")] + list(VARIANTS))
NB = json.loads(spec.SOURCE_NOTEBOOK.read_text(encoding="utf-8"))


def style(name: str) -> str:
    if name in VARIANTS:
        base, edits = VARIANTS[name]
        source = style(base)
        for old, new in edits:
            assert source.count(old) == 1, (name, old)
            source = source.replace(old, new)
        return source
    return (STYLES_DIR / f"{name}.py").read_text(encoding="utf-8")


def edited(name: str, old: str, new: str) -> str:
    source = style(name)
    assert source.count(old) == 1, (name, old)
    return source.replace(old, new)


def _src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


_RUN_CELLS = r"""
import io, json, sys, types
cells, source = json.load(sys.stdin)
module = types.ModuleType("__main__")
sys.modules["__main__"] = module  # the cells run as a kernel runs them, in __main__
failing = {}
out, err = io.StringIO(), io.StringIO()  # one stream each for the whole run, as a kernel's (logging keeps its stream)
real_stdout, sys.stdout, sys.stderr = sys.stdout, out, err
for gid, code, graded in cells:
    err.seek(0)
    err.truncate()
    try:
        exec(compile(source if code is None else code, gid, "exec"), module.__dict__)
    except Exception as exc:
        failing[gid] = "%s: %s" % (type(exc).__name__, exc)
        continue
    if err.getvalue() and graded:
        failing[gid] = "stderr"
real_stdout.write(json.dumps(failing) + "\n")
"""


def notebook_cells_failing(source: str) -> dict:
    """The graded cells of the SOURCE notebook (hidden tests included) that fail with `source` as the solution cell,
    run one after another in a fresh interpreter as a kernel runs them; a cell that writes on stderr (a warning, a
    logging call) is noted as "stderr" (nbgrader's own rule scores such a cell 0)."""
    cells = []
    for cell in NB["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        gid = meta.get("grade_id")
        if cell["cell_type"] == "code" and (meta.get("grade") or gid in (spec.SOLUTION_CELL, "test_helpers")):
            cells.append((gid, None if gid == spec.SOLUTION_CELL else _src(cell), bool(meta.get("grade"))))
    out = subprocess.run([sys.executable, "-c", _RUN_CELLS], input=json.dumps([cells, source]), capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.splitlines()[-1])


# s10 leaves warnings.warn and logging.warning in: nbgrader's own rule scores a test cell with stderr output 0, but
# grades come from the verdict only (the notebook tells students warnings "do not change your score").
STDERR_IN_NOTEBOOK = {"s10_warnings_logging_stderr": {"test_todo2_schedule_key", "test_todo3_capacity",
                                                      "hidden_todo3_capacity"}}


@pytest.mark.parametrize("name", STYLES)
def test_a_correct_solution_in_another_style_passes_every_cell_of_the_notebook(name):
    failing = notebook_cells_failing(style(name))
    assert {k for k, v in failing.items() if v != "stderr"} == set(), failing
    assert {k for k, v in failing.items() if v == "stderr"} == STDERR_IN_NOTEBOOK.get(name, set())


@pytest.mark.parametrize("name", STYLES)
def test_a_correct_solution_in_another_style_scores_full_marks(name):
    v = verdict.verdict_for_source(style(name), shrink_failures=False)
    lost = {k: c.lines[:2] for k, c in v.cells.items() if c.score != c.max_score}
    assert (v.status, v.total, lost) == ("graded", 100.0, {}), v.notes
    assert not any("non-plain" in n or "did not define" in n for n in v.notes), v.notes


def test_there_are_enough_styles():
    assert 12 <= len(STYLES) <= 20, STYLES


# ---------------------------------------------------------------- findings (each failed before its fix)

def _judge_inprocess(source: str, n_random: int = 0) -> dict:
    scen = scenarios.build_scenarios(n_random=n_random)
    mod = types.ModuleType("style_under_test")
    sys.modules["style_under_test"] = mod
    try:
        assert harness.load_solution(source, mod.__dict__, 5.0) == []
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            obs = {s["id"]: harness.run_scenario(mod.__dict__, json.loads(json.dumps(s["ops"]))) for s in scen}
    finally:
        sys.modules.pop("style_under_test", None)
    return verdict.judge(scen, obs)


@pytest.mark.parametrize("factory", ["collections.OrderedDict()", "collections.defaultdict(int)"])
def test_an_event_built_as_a_standard_library_dict_is_read_as_the_dict_it_is(factory):
    """Finding 1: events built as collections.OrderedDict (or defaultdict) scored 31.57 / 100 (every hidden check that
    reads an event: '<bad type: OrderedDict>'), though every cell of the notebook, hidden tests included, passes."""
    source = edited("s08_ordereddict_events", "event = collections.OrderedDict()", f"event = {factory}")
    assert notebook_cells_failing(source) == {}
    v = verdict.verdict_for_source(source, shrink_failures=False)
    assert (v.status, v.total) == ("graded", 100.0), {k: c.lines[:1] for k, c in v.cells.items()
                                                      if c.score < c.max_score}


def test_a_dict_subclass_of_the_solutions_own_still_differs_and_forged_comparison_is_still_evidence():
    class Mine(dict):
        pass

    class Forged(dict):
        def __eq__(self, other):
            return True

        __hash__ = None

    assert harness.normalise(Mine(a=1)) == "<bad type: Mine>"
    assert "overrides comparison" in harness.normalise(Forged(a=1))
    od = __import__("collections").OrderedDict([("b", 2), ("a", [1, True])])
    assert harness.normalise(od) == {"b": 2, "a": [1, True]} and type(harness.normalise(od)) is dict


NAMEDTUPLE_KEY = edited("s05_namedtuple_bisect", "        return tuple(key)\n", "        return key\n")


def test_a_namedtuple_sort_key_is_compared_by_value_in_the_hidden_checks():
    """Finding 2: a sort key returned as a typing.NamedTuple (a tuple that compares as one: the notebook's hidden
    cell `key == (3, 0, 1, 0, 2, 1)` passes) lost all 14 points of hidden_todo2_schedule_key ('<bad type: SortKey>');
    the hidden checks compare the key by value (docs/grading.md). The visible cell's expect_equal checks the tuple's
    type: the student is told there, as for a list."""
    assert set(notebook_cells_failing(NAMEDTUPLE_KEY)) == {"test_todo2_schedule_key"}
    cells = _judge_inprocess(NAMEDTUPLE_KEY)
    assert cells["hidden_todo2_schedule_key"].score == 14.0, cells["hidden_todo2_schedule_key"].lines


def test_a_tuple_subclass_key_that_forges_comparison_is_still_evidence():
    src = NAMEDTUPLE_KEY.replace("class SortKey(NamedTuple):\n",
                                 "class _Lie(tuple):\n    def __eq__(self, other):\n        return True\n"
                                 "    __hash__ = tuple.__hash__\n\n\nclass SortKey(NamedTuple):\n")
    src = src.replace("        return key\n", "        return _Lie(key)\n")
    ns = {}
    harness.load_solution(src, ns, 5.0)
    box = {"sim": None}
    harness.run_op(ns, box, ["new", {}])
    harness.run_op(ns, box, ["enqueue", {"request_id": 1, "prompt_len": 2}])
    assert "overrides comparison" in harness.run_op(ns, box, ["key", 0])


# ---------------------------------------------------------------- honest near-misses

# name: (style, old, new, the TODO's own cells, cells that must keep full marks)
TODO_CELLS = {t: {c.grade_id for c in spec.CELLS if c.todo == f"TODO {t}"} for t in "1234"}
NEAR_MISSES = {
    "tiebreak_id_reversed": ("s01_dict_by_id_heapq", "                req.total_len, req.request_id)",
                             "                req.total_len, -req.request_id)", "2",
                             TODO_CELLS["1"] | TODO_CELLS["3"] | TODO_CELLS["4"]),
    "wait_counted_for_chosen": ("s07_manual_loops_recursion",
                                "            if r is not chosen:\n                r.wait_steps = r.wait_steps + 1",
                                "            r.wait_steps = r.wait_steps + 1", "4",
                                TODO_CELLS["1"] | TODO_CELLS["2"] | {"test_todo3_capacity"}),
    "victim_fewest_blocks_first": ("s09_generator_logging_prints",
                                   "(-self._effective_priority(r), r.required_blocks, -r.request_id)",
                                   "(-self._effective_priority(r), -r.required_blocks, -r.request_id)", "3",
                                   TODO_CELLS["1"] | TODO_CELLS["2"] | TODO_CELLS["4"]),
    "deadline_slack_off_by_one": ("s11_simplenamespace_bool_key",
                                  "req.deadline_step - self.clock - self._remaining_steps(req) if use_slack",
                                  "req.deadline_step - self.clock - self._remaining_steps(req) - 1 if use_slack", "2",
                                  TODO_CELLS["1"] | TODO_CELLS["3"] | TODO_CELLS["4"]),
    "deadline_missed_at_equality": ("s15_intenum_status_match",
                                    "self._remaining_steps(chosen) > chosen.deadline_step}",
                                    "self._remaining_steps(chosen) >= chosen.deadline_step}", "4",
                                    TODO_CELLS["1"] | TODO_CELLS["2"] | TODO_CELLS["3"]),
    "equal_priority_preempts": ("s12_slots_enum_property_heapq_victims",
                                "and self._effective_priority(r) < level]", "and self._effective_priority(r) <= level]",
                                "3", TODO_CELLS["1"] | TODO_CELLS["2"] | TODO_CELLS["4"]),
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_a_near_miss_loses_points_in_its_own_todo_with_a_scenario_it_can_read(name):
    base, old, new, todo, spared = NEAR_MISSES[name]
    v = verdict.verdict_for_source(edited(base, old, new), shrink_failures=False)
    assert v.status == "graded", v.notes
    own = TODO_CELLS[todo]
    lost = {k for k, c in v.cells.items() if c.score < c.max_score}
    assert lost & own, (name, lost)
    assert not lost & spared, (name, {k: v.cells[k].lines[:1] for k in lost & spared})
    first = next(k for k in spec.CELL_IDS if k in lost & own)
    lines = v.cells[first].lines
    assert lines[0].startswith("FAIL ") and ": expected " in lines[0], lines
    assert lines[1].startswith("  setup / 场景: sim = DecodeSchedulerSim("), lines
    assert not any(re.search(r"\bassert\b|_probe|BEGIN HIDDEN|Traceback", ln) for ln in lines), lines


def test_the_todo1_cell_does_not_depend_on_the_tie_break():
    """Finding 3: a reversed request_id tie-break (TODO 2) cost 1.33 points of hidden_todo1_enqueue: its check that
    each request has its own state stepped two tied requests, so the TODO 2 tie-break decided who ran."""
    base, old, new, _, _ = NEAR_MISSES["tiebreak_id_reversed"]
    cells = _judge_inprocess(edited(base, old, new))
    assert cells["hidden_todo1_enqueue"].score == 8.0, cells["hidden_todo1_enqueue"].lines
