"""Honest students graded for real (audit 64): correct solutions in styles a class writes (functools.total_ordering,
`global`s, numpy scalars in the events, a subclass of the class with helpers defined below it) and with the noise
around them (line magics before code that uses their names, `%%capture`, a guarded `input()`, megabytes of prints,
logging at DEBUG, a warning of their own, `import this`, a 5 s cell, a matplotlib plot) keep full marks in a real
`decodesched grade`; a near-miss is told its first differing event; a slow statement of the solution cell is said
plainly."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from decodesched.grader import harness, limits, spec, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.course import build_course, grade_folder  # noqa: E402

REF = attacks.reference_source()
SORT = "        for candidate in sorted(candidates, key=self._schedule_key):\n"
APPEND = "        self.timeline.append(event)\n"
EFF = "        return req.priority + (req.wait_steps // self.aging_interval if self.policy == 'aging' else 0)\n"
TIMELINE = "        self.timeline: List[Dict[str, int | str]] = []\n"
WAITS = "        for req in candidates:\n            if req is not chosen:\n                req.wait_steps += 1\n"


def edited(*edits, pre="", post=""):
    source = REF
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return pre + source + post


CORRECT = {
    # functools.total_ordering, a `global`, logging at DEBUG (megabytes on stderr), a warning of its own, `import this`,
    # prints of the whole queue at every step
    "total_ordering_globals_noise": edited(
        (SORT, "        global STEPS_TAKEN\n        STEPS_TAKEN += 1\n"
               "        log.debug('step %d: queue %s', STEPS_TAKEN, self.queue)\n"
               "        print(f'--- clock {self.clock} free {self.free_kv_blocks} ---')\n"
               "        for r in self.queue:\n            print('   ', r)\n"
               "        for candidate in sorted(candidates, key=lambda r: _Ranked(self._schedule_key(r))):\n"),
        (APPEND, "        if event['deadline_missed']:\n"
                 "            warnings.warn(f'request {chosen.request_id} missed its deadline')\n" + APPEND),
        pre="import functools\nimport logging\nimport warnings\nimport this\n"
            "logging.basicConfig(level=logging.DEBUG)\nlog = logging.getLogger('sched')\nSTEPS_TAKEN = 0\n\n\n"
            "@functools.total_ordering\nclass _Ranked:\n    def __init__(self, key):\n        self.key = key\n\n"
            "    def __eq__(self, other):\n        return self.key == other.key\n\n"
            "    def __lt__(self, other):\n        return self.key < other.key\n\n\n"),
    # line magics before code that uses their names, indented ones, a subclass with helpers defined below it
    "magics_subclass_helpers_below": edited(
        ("class DecodeSchedulerSim:\n", "class _BaseSim:\n"),
        (EFF, "        return _effective(req, self.policy, self.aging_interval)\n"),
        pre="%load_ext autoreload\n%autoreload 2\n",
        post="\n\nclass DecodeSchedulerSim(_BaseSim):\n"
             "    def __init__(self, *args, **kwargs):\n        super().__init__(*args, **kwargs)\n\n"
             "    def step(self):\n        return super().step()\n\n\n"
             "def _effective(req, policy, interval):\n"
             "    return req.priority + (req.wait_steps // interval if policy == 'aging' else 0)\n\n\n"
             "%time demo = DecodeSchedulerSim(policy='aging', free_kv_blocks=3)\n"
             "demo.enqueue(1, prompt_len=4, max_new_tokens=2)\n"
             "%time events = demo.run()\nprint(len(events), 'events')\n"
             "if False:\n    %timeit -n1 -r1 DecodeSchedulerSim()\n    !echo indented\n"),
    # %%capture over the cell, NumPy scalars in the waits and events, a timeline kept as a deque, a guarded input()
    "capture_numpy_deque_input": "%%capture captured\n" + edited(
        (WAITS, "        bump = (np.array([r.request_id for r in candidates]) != chosen.request_id).astype(np.int64)\n"
                "        for req, b in zip(candidates, bump):\n            req.wait_steps += b\n"),
        ("            'wait_steps': chosen.wait_steps,\n", "            'wait_steps': np.int64(chosen.wait_steps),\n"),
        (TIMELINE, "        self.timeline = collections.deque()\n"),
        pre="import collections\nimport numpy as np\n",
        post="\n\ntry:\n    DEBUG = input('debug? ') == 'y'\nexcept Exception:\n    DEBUG = False\n"),
}
NEAR_MISS = edited(("            preemptible=preemptible,\n        )\n",
                    "            preemptible=preemptible,\n            wait_steps=1,\n        )\n"))
# cells a student adds below the solution: a 5 s benchmark, a plot, a line magic
EXTRA_CELLS = ["import time\n_t = time.process_time()\nwhile time.process_time() - _t < 5:\n    pass\n",
               "%%capture\ntry:\n    import matplotlib\n    matplotlib.use('Agg')\n"
               "    import matplotlib.pyplot as plt\n    plt.plot([1, 2, 3])\n    plt.show()\n"
               "except ImportError:\n    pass\n",
               "%time sim = DecodeSchedulerSim()\n"]


def _text(page: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)).replace("&#x27;", "'")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("stop64")
    course, release_path = build_course(base)
    release = json.loads(release_path.read_text(encoding="utf-8"))
    subs = base / "subs"
    subs.mkdir()
    for name, source in {**CORRECT, "near_miss": NEAR_MISS}.items():
        nb = attacks._with_solution(release, source)
        if name == "total_ordering_globals_noise":
            at = next(i for i, c in enumerate(nb["cells"])
                      if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == spec.SOLUTION_CELL)
            nb["cells"][at + 1:at + 1] = [{"cell_type": "code", "execution_count": None, "id": f"extra-{i}",
                                           "metadata": {}, "outputs": [], "source": src}
                                          for i, src in enumerate(EXTRA_CELLS)]
        (subs / f"{name}.ipynb").write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    return grade_folder(subs, course, base / "out")


@pytest.mark.slow
@pytest.mark.parametrize("sid", sorted(CORRECT))
def test_a_correct_solution_in_a_class_style_keeps_full_marks(graded, sid):
    # a guard (verified right before this audit): each scores 100, status graded, in a real grading
    row = graded["rows"][sid]
    assert (row["status"], float(row["score"])) == ("graded", spec.MAX_SCORE), row


@pytest.mark.slow
def test_a_near_miss_is_told_its_first_differing_event_in_plain_words(graded):
    row = graded["rows"]["near_miss"]
    assert row["status"] == "graded" and float(row["score"]) < spec.MAX_SCORE
    page = _text((graded["out"] / "feedback" / "near_miss.html").read_text(encoding="utf-8"))
    first = "first difference / 第一个分歧: after the replay: request 0: expected wait_steps=0, got wait_steps=1"
    assert first in page
    assert "expected wait_steps=3, got wait_steps=4" in page  # the visible cell's own question
    assert not re.search(r"Traceback|_probe|BEGIN HIDDEN", page)


def test_a_slow_statement_of_the_cell_is_named_with_its_limit_and_no_check_is_said_lost():
    # a benchmark left at the bottom of the solution cell, over its per-statement CPU limit: the classes are graded
    # (100), the status is timeout, and the notes said only "line 213 timed out" and "checks that did not finish
    # score 0", though every check ran
    spin = "\nimport time as _t\n_t0 = _t.process_time()\nwhile _t.process_time() - _t0 < 30:\n    pass\n"
    source = REF + spin
    line = source.count("\n") - 1
    v = verdict.verdict_for_source(source, limits=limits.Limits(cpu_s=20, scenario_cpu_s=1.0), shrink_failures=False)
    assert (v.status, v.total) == ("timeout", 100.0), v.notes
    assert f"line {line} timed out (a top-level statement of the solution cell may use 1.5 s of CPU time; it was " \
           "skipped, the rest of the cell ran)" in v.notes, v.notes
    assert "time limit reached: a statement of the solution cell was stopped; every check ran" in v.notes, v.notes


def test_a_timeline_kept_as_a_deque_is_read_as_the_list_it_is():
    # every cell of the notebook, hidden ones included, reads run()'s events by len(), index and iteration: a
    # timeline kept as collections.deque passes them all, and scored 83.35 ("expected a list of events, got <bad
    # type: deque>" in three hidden cells)
    source = edited((TIMELINE, "        self.timeline = collections.deque()\n"), pre="import collections\n")
    v = verdict.verdict_for_source(source, shrink_failures=False)
    assert (v.status, v.total) == ("graded", 100.0), (v.notes, {k: c.lines[:1] for k, c in v.cells.items()
                                                                if c.score < c.max_score})


def test_a_deque_is_read_by_its_items_and_a_list_of_the_solutions_own_still_differs():
    import collections

    class Mine(list):
        pass

    class Forged(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    assert harness.normalise(collections.deque([{"a": 1}, (2, None)])) == [{"a": 1}, [2, None]]
    assert harness.normalise(Mine([1])) == "<bad type: Mine>"
    assert "overrides comparison" in harness.normalise(collections.deque([Forged(1)]))[0]
    assert harness.normalise(collections.deque(range(harness.MAX_ITEMS + 1))) == "<bad type: too long>"
