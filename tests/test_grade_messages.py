"""What the feedback says when the student's code raises, does not load, or needs what the grader does not
give it (audit 6, findings 2, 3 and 4)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from decodesched.grader import compare, pipeline, scenarios, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks.attacks import minimal_notebook as _nb  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = (ROOT / "grader" / "solutions" / "reference.py").read_text(encoding="utf-8")
EFF = "        return req.priority + (req.wait_steps // self.aging_interval if self.policy == 'aging' else 0)\n"
HELPER = ("def effective_priority(req, policy, aging_interval):\n"
          "    return req.priority + (req.wait_steps // aging_interval if policy == 'aging' else 0)\n")


def _step_scenario():
    return next(s for s in scenarios.build_scenarios() if any(op[0] == "step" for op in s["ops"])
                and s["expected"][[op[0] for op in s["ops"]].index("step")] is not None)


def test_an_exception_in_step_is_shown_as_the_exception_not_as_an_event():
    s = _step_scenario()
    k = [op[0] for op in s["ops"]].index("step")
    obs = [*s["expected"][:k], {"raised": "NameError", "msg": "name 'helper' is not defined"}]
    d = compare.compare(s, obs)
    assert "got NameError: name 'helper' is not defined" in d and "None None" not in d
    assert "timeout" not in compare.compare(s, [*s["expected"][:k], {"raised": "ValueError", "msg": ""}])


def test_a_solution_cell_that_does_not_load_says_so():
    v = verdict.verdict_for_source(REFERENCE.replace("class DecodeSchedulerSim", "class DecodeSchedulerSim(", 1),
                                   shrink_failures=False)
    assert v.total == 0
    assert any(n.startswith("the solution cell did not define DecodeSchedulerSim, RequestState: SyntaxError")
               or n.startswith("the solution cell did not define DecodeSchedulerSim: SyntaxError") for n in v.notes), v.notes
    text = json.dumps([c.lines for c in v.cells.values()])
    assert "KeyError" not in text and "the solution cell did not define DecodeSchedulerSim" in text


def test_a_helper_in_another_cell_is_named_and_the_note_says_only_the_solution_cell_runs():
    source = REFERENCE.replace(EFF, "        return effective_priority(req, self.policy, self.aging_interval)\n")
    assert source != REFERENCE
    v = verdict.verdict_for_source(source, shrink_failures=False)
    assert v.undefined == ["effective_priority"]
    text = json.dumps([c.lines for c in v.cells.values()])
    assert "NameError: name 'effective_priority' is not defined" in text and "None None" not in text
    nb = _nb(solution=source, extra_cells=[{"cell_type": "code", "execution_count": None, "metadata": {},
                                            "outputs": [], "source": HELPER}])
    assert pipeline.defined_in_other_cells(nb, v.undefined) == ["effective_priority"]
    assert pipeline.defined_in_other_cells(_nb(solution=source), v.undefined) == []


def test_an_import_the_grader_does_not_provide_is_said_plainly():
    source = "import numba\n" + REFERENCE
    v = verdict.verdict_for_source(source, shrink_failures=False)
    assert v.total == 100  # the import is not used: nothing else fails
    assert any(n.startswith(verdict.MODULES_NOTE) and "`import numba` failed" in n for n in v.notes), v.notes
    inside = REFERENCE.replace(EFF, "        import pandas\n" + EFF)
    v = verdict.verdict_for_source(inside, shrink_failures=False)
    assert any("`import pandas` failed" in n for n in v.notes), v.notes
