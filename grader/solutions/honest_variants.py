"""Honest students who write the reference in another style, and five who get one rule subtly wrong: each is the
reference solution cell (`reference.py`) with a few lines changed. Graded through `decodesched grade` beside a real
`nbgrader autograde` (hidden tests included) of the same notebooks, every correct one scores full marks in both
(`tests/test_grade_stop56b.py`); the wrong ones score differently there and here (docs/grading.md, `verdict.py`).

``CORRECT``: name -> edits of a solution that scores full marks; ``WRONG``: name -> edits of one that loses points.
An edit is ``(old, new)``, as in `grader.mutants`: `old` occurs exactly once in the reference."""

from __future__ import annotations

from ..mutants import Mutant

SORT = "        for candidate in sorted(candidates, key=self._schedule_key):\n"
FREE = ("            if chosen.done and chosen.admitted:\n"
        "                self.free_kv_blocks += chosen.required_blocks\n")
AGING = "req.wait_steps // self.aging_interval if self.policy == 'aging' else 0"
VICTIM = "self._effective_priority(req) < self._effective_priority(challenger)]"
KEY_END = "req.total_len, req.request_id)\n"
ADD = "        self.queue.append(request)\n"
CLASS = "class DecodeSchedulerSim:\n"
RUN_END = "        return self.timeline\n"

CORRECT = {
    "heapq_nsmallest": [("from dataclasses", "import heapq\nfrom dataclasses"),
                        (SORT, "        for candidate in heapq.nsmallest(len(candidates), candidates, "
                               "key=self._schedule_key):\n")],
    "bisect_insort": [("from dataclasses", "import bisect\nfrom dataclasses"),
                      (SORT, "        keys, order = [], []\n"
                             "        for req in candidates:\n"
                             "            key = self._schedule_key(req)\n"
                             "            at = bisect.bisect_right(keys, key)\n"
                             "            keys.insert(at, key)\n"
                             "            order.insert(at, req)\n"
                             "        for candidate in order:\n")],
    "cmp_to_key_lambda": [("from dataclasses", "import functools\nfrom dataclasses"),
                          (SORT, "        cmp = lambda a, b: (self._schedule_key(a) > self._schedule_key(b)) - "
                                 "(self._schedule_key(a) < self._schedule_key(b))\n"
                                 "        for candidate in sorted(candidates, key=functools.cmp_to_key(cmp)):\n")],
    "slots_dataclass": [("@dataclass\nclass RequestState", "@dataclass(slots=True)\nclass RequestState")],
    "numpy_lexsort": [("from dataclasses", "import numpy as np\nfrom dataclasses"),
                      (SORT, "        keys = np.array([self._schedule_key(req) for req in candidates], "
                             "dtype=np.int64)\n"
                             "        order = np.lexsort(keys.T[::-1])\n"
                             "        for candidate in [candidates[int(i)] for i in order]:\n")],
    "recursive_merge_sort": [(SORT, "        for candidate in self._merge_sorted(candidates):\n"),
                             ("    def step(self)",
                              "    def _merge_sorted(self, reqs):\n"
                              "        if len(reqs) <= 1:\n"
                              "            return list(reqs)\n"
                              "        left, right = self._merge_sorted(reqs[:len(reqs) // 2]), "
                              "self._merge_sorted(reqs[len(reqs) // 2:])\n"
                              "        out = []\n"
                              "        while left and right:\n"
                              "            out.append((left if self._schedule_key(left[0]) <= "
                              "self._schedule_key(right[0]) else right).pop(0))\n"
                              "        return out + left + right\n\n"
                              "    def step(self)")],
    "generator_order": [(SORT, "        for candidate in self._in_order(candidates):\n"),
                        ("    def step(self)",
                         "    def _in_order(self, reqs):\n"
                         "        \"\"\"Yield the requests in schedule order.\"\"\"\n"
                         "        yield from sorted(reqs, key=self._schedule_key)\n\n"
                         "    def step(self)")],
    "slow_selection_sort": [(SORT, "        order, rest = [], list(candidates)\n"
                                   "        while rest:\n"
                                   "            best = rest[0]\n"
                                   "            for req in rest:\n"
                                   "                if all(self._schedule_key(req) <= self._schedule_key(o) "
                                   "for o in rest):\n"
                                   "                    best = req\n"
                                   "            rest.remove(best)\n"
                                   "            order.append(best)\n"
                                   "        for candidate in order:\n")],
    "print_debugging": [(SORT, "        print('step', self.clock, 'candidates', [r.request_id for r in candidates])\n"
                               + SORT),
                        (ADD, ADD + "        print('enqueued', request)\n")],
    "main_demo_and_subclass": [(CLASS, "class _SchedulerBase:\n"),
                               (RUN_END, RUN_END + "\n\nclass DecodeSchedulerSim(_SchedulerBase):\n"
                                "    \"\"\"The released interface, on a base class of my own.\"\"\"\n\n\n"
                                "if __name__ == '__main__':\n"
                                "    demo = DecodeSchedulerSim(policy='aging', free_kv_blocks=2)\n"
                                "    demo.enqueue(1, prompt_len=4, max_new_tokens=2)\n"
                                "    demo.enqueue(2, prompt_len=2, max_new_tokens=1, priority=3)\n"
                                "    for event in demo.run():\n"
                                "        print(event)\n")],
}

WRONG = {
    "wait_off_by_one": [("            preemptible=preemptible,\n        )\n",
                         "            preemptible=preemptible,\n            wait_steps=1,\n        )\n")],
    "tie_break_reversed": [(KEY_END, "req.total_len, -req.request_id)\n")],
    "preempts_equal_priority": [(VICTIM, VICTIM.replace(" < ", " <= "))],
    "never_frees_blocks": [(FREE, "            if chosen.done and chosen.admitted:\n")],
    "aging_rounds_up": [(AGING, AGING.replace("req.wait_steps //", "-(-req.wait_steps //").replace(
        "aging_interval if", "aging_interval) if"))],
}


def source(name: str) -> str:
    """The solution cell of the variant `name` (of `CORRECT` or `WRONG`), edited as `mutants.Mutant` edits."""
    kind = "a correct solution in another style" if name in CORRECT else "a subtly wrong solution"
    return Mutant(name, kind, tuple({**CORRECT, **WRONG}[name])).source()
