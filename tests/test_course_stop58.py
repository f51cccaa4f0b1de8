"""The course from the student's side (stop 58): the classic mistakes, written as real solutions, each lose points in
the hidden cells, and what the student reads points at the mistake: the item of the sort key that differs, the
request at the wrong place in the queue, and a schedule picture whenever a failing check has events to draw."""

from __future__ import annotations

import json
import re
import types

import pytest

from decodesched.grader import feedback, harness, pipeline, scenarios, spec, verdict

REFERENCE = (spec.COURSE_ROOT.parent / "grader" / "solutions" / "reference.py").read_text(encoding="utf-8")
KEY = ("        return (deadline_slack, phase_rank, cache_rank, -self._effective_priority(req), req.total_len, "
       "req.request_id)\n")
SLACK = "            deadline_slack = req.deadline_step - self.clock - self._remaining_steps(req)\n"
WALK = "        for candidate in sorted(candidates, key=self._schedule_key):\n"


def _edit(*pairs) -> str:
    source = REFERENCE
    for old, new in pairs:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


# Each a student's whole solution with one classic mistake (the mutants of grader/mutants.py hold more).
CLASSIC = {
    "tie_by_arrival": _edit((KEY, KEY.replace("req.request_id)", "self.queue.index(req))"))),
    "tie_by_arrival_in_step": _edit((WALK, WALK.replace("key=self._schedule_key",
                                                        "key=lambda r: self._schedule_key(r)[:-1]"))),
    "aging_from_arrival": _edit(
        ("        self.queue.append(request)\n",
         "        request.arrival = self.clock\n        self.queue.append(request)\n"),
        ("(req.wait_steps // self.aging_interval", "((self.clock - req.arrival) // self.aging_interval")),
    "admits_without_checking_blocks": _edit(("        if challenger.required_blocks <= self.free_kv_blocks:\n",
                                             "        if True:\n")),
    "slack_off_by_one": _edit((SLACK, SLACK.replace("(req)\n", "(req) + 1\n"))),
    "phase_swapped": _edit(("phase_rank = 0 if req.phase == 'prefill' else 1",
                            "phase_rank = 0 if req.phase == 'decode' else 1")),
    "cache_hit_ignored": _edit(("cache_rank = 0 if req.cache_hit else 1", "cache_rank = 0")),
    "key_mutates_priority": _edit((KEY, "        req.priority = self._effective_priority(req)\n"
                                   + KEY.replace("-self._effective_priority(req)", "-req.priority"))),
    "one_event_dict_reused": _edit(
        ("        event = {\n", "        event = self.__dict__.setdefault('_ev', {})\n        event.clear()\n"
                              "        event.update({\n"),
        ("> chosen.deadline_step,\n        }\n", "> chosen.deadline_step,\n        })\n")),
    "queue_sorted_in_place": _edit((WALK, "        self.queue.sort(key=self._schedule_key)\n"
                                          "        for candidate in [r for r in self.queue if not r.done]:\n")),
}


@pytest.fixture(scope="module")
def targeted():
    return scenarios.build_scenarios(n_random=0)


def _judge(source: str, scen: list) -> dict:
    """The cell verdicts of `source` on `scen`, run in process (the checks' code, no sandbox: the same comparisons)."""
    mod = types.ModuleType("stop58_under_test")
    harness.load_solution(source, mod.__dict__, 5.0)
    obs = {s["id"]: harness.run_scenario(mod.__dict__, json.loads(json.dumps(s["ops"]))) for s in scen}
    return verdict.judge(scen, obs)


@pytest.mark.parametrize("name", sorted(CLASSIC))
def test_every_classic_mistake_loses_points_in_the_hidden_cells_with_a_line_that_says_why(name, targeted, capsys):
    cells = _judge(CLASSIC[name], targeted)
    hidden = [g for g, c in cells.items()  # (no random traces here: the differential cell is left out)
              if spec.CELLS_BY_ID[g].hidden and g != "hidden_differential" and c.score < c.max_score]
    assert hidden, name
    for g in hidden:
        assert any(line.startswith("FAIL ") for line in cells[g].lines), (name, g)
        assert not any("assert " in line or "Traceback" in line for line in cells[g].lines), (name, g)
    capsys.readouterr()


@pytest.mark.parametrize("name, item", [("tie_by_arrival", "item 6, the request_id"),
                                        ("phase_swapped", "item 2, the phase rank"),
                                        ("cache_hit_ignored", "item 3, the cache rank"),
                                        ("slack_off_by_one", "item 1, the deadline slack")])
def test_a_wrong_sort_key_is_named_by_the_item_that_differs(name, item, targeted, capsys):
    cells = _judge(CLASSIC[name], targeted)
    lines = [x for x in cells["hidden_todo2_schedule_key"].lines if x.startswith("FAIL") and "_schedule_key(" in x]
    assert lines and all(item in line for line in lines), lines
    capsys.readouterr()


def test_a_key_with_the_wrong_number_of_items_says_what_the_items_are(targeted, capsys):
    five = _edit((KEY, KEY.replace(", req.request_id)", ")")))
    line = next(x for x in _judge(five, targeted)["hidden_todo2_schedule_key"].lines if x.startswith("FAIL"))
    assert "the key has 6 items: deadline slack, phase rank" in line, line
    capsys.readouterr()


def test_a_queue_reordered_in_place_is_said_as_such(targeted, capsys):
    cells = _judge(CLASSIC["queue_sorted_in_place"], targeted)
    line = next(x for x in cells["hidden_todo3_capacity"].lines if x.startswith("FAIL "))
    assert "queue[0]: expected request 1, got request 2 (the queue keeps enqueue order" in line, line
    capsys.readouterr()


def test_the_page_draws_the_first_failing_check_that_has_a_schedule(targeted, capsys):
    """A visible cell's failing check may read one field of run() (no events): the page then draws the first
    failing check with events instead of showing a difference alone (the reused event dict: every box the same)."""
    cells = _judge(CLASSIC["one_event_dict_reused"], targeted)
    pictures = {g: c.picture for g, c in cells.items() if c.picture}
    assert not pictures["test_todo4_step"]["expected"]  # its check reads len/first/last of run() only
    r = pipeline.Result("amy", "graded", sum(c.score for c in cells.values()), float(spec.MAX_SCORE),
                        {g: c.score for g, c in cells.items()}, {g: c.lines for g, c in cells.items()},
                        pictures=pictures)
    page = feedback.feedback_html(r)
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    assert len(svgs) == 1 and "first difference / 第一个分歧" in svgs[0]
    drawn = next(c for c in spec.CELLS if c.grade_id in pictures and pictures[c.grade_id]["expected"])
    assert f"{drawn.title}: where your schedule goes wrong" in page
    capsys.readouterr()


def test_a_visible_check_whose_step_raised_says_what_the_cell_reads_not_the_checks_bookkeeping(targeted, capsys):
    typo = _edit(("            chosen.generated_len += 1\n", "            chosen.generated_length += 1\n"))
    cells = _judge(typo, targeted)
    three, four = (next(x for x in cells[g].lines if x.startswith("FAIL ")) for g in ("test_todo3_capacity",
                                                                                      "test_todo4_step"))
    assert "step()['action'] after 1 step(s): expected action='finish', got AttributeError: " in three, three
    assert ("expected the number of events=7, the first event=(1, 'prefill_to_decode'), the last event=(2, 'finish'),"
            " got AttributeError") in four, four
    assert "{'" not in three + four
    capsys.readouterr()


def _helper():
    nb = json.loads(spec.SOURCE_NOTEBOOK.read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "test_helpers")
    ns: dict = {}
    exec(compile("".join(cell["source"]), "test_helpers", "exec"), ns)
    return ns["expect_equal"]


def test_the_notebooks_own_helper_names_the_item_of_a_tuple_that_differs():
    expect_equal = _helper()
    with pytest.raises(AssertionError) as err:
        expect_equal("key of a prefill request", (1_000_000_000, 0, 1, 0, 4, 0), (1_000_000_000, 0, 1, 0, 4, 1))
    assert str(err.value).endswith("got (1000000000, 0, 1, 0, 4, 0)（第 6 项不同 / item 6 differs）"), err.value
    for got, expected in (((1, 2), (1, 2, 3)), ([1, 2], (1, 2)), (3, 4)):  # no item to name: the message as before
        with pytest.raises(AssertionError) as err:
            expect_equal("x", got, expected)
        assert str(err.value) == f"x: 期望 expected {expected!r}, 实际 got {got!r}"
    expect_equal("a sentinel written 1e9 still equals", (1e9, 0), (1_000_000_000, 0))
    expect_equal("same", (1, "a"), (1, "a"))


def test_a_schedule_that_should_be_empty_is_said_so(capsys):
    """Nothing fits (0 free blocks): the reference runs no step; a solution that admits anyway ran one."""
    trace = {"policy": "fixed_priority", "free_kv_blocks": 0, "aging_interval": 1, "max_steps": None,
             "rows": [{"request_id": 0, "arrival_step": 0, "prompt_len": 1, "max_new_tokens": 1, "priority": 0,
                       "cache_hit": False, "required_blocks": 1, "deadline_step": None, "preemptible": True}]}
    s = scenarios.trace_scenario("empty", trace)
    s["expected"] = scenarios.expected_for(s["ops"])
    mod = types.ModuleType("stop58_under_test")
    harness.load_solution(CLASSIC["admits_without_checking_blocks"], mod.__dict__, 5.0)
    got = harness.run_scenario(mod.__dict__, json.loads(json.dumps(s["ops"])))
    cell = verdict.judge([s], {"empty": got})["hidden_differential"]
    assert "first difference / 第一个分歧: step 0: expected no event at all, got request 0 prefill_to_decode" \
        in cell.lines, cell.lines
    capsys.readouterr()
