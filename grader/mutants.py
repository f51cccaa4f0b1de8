"""One-bug variants of the reference solution cell (`solutions/reference.py`), for the self-check.

Each `Mutant` is the reference with a few lines replaced, as a student's almost-right answer would
be; `Mutant.source()` applies the edits (each edited text must occur exactly once in the reference,
so a change to the reference that moves a bug's lines fails loudly instead of silently testing
nothing) and starts the cell with a ``# MUTANT name: bug`` line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REFERENCE = Path(__file__).resolve().parent / "solutions" / "reference.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    edits: tuple[tuple[str, str], ...]  # (text of the reference, its replacement)

    def source(self, reference: str | None = None) -> str:
        text = REFERENCE.read_text(encoding="utf-8") if reference is None else reference
        for old, new in self.edits:
            if text.count(old) != 1:
                raise ValueError(f"mutant {self.name}: the text to replace occurs {text.count(old)} times")
            text = text.replace(old, new)
        return f"# MUTANT {self.name}: {self.bug}\n" + text


def by_name(name: str) -> Mutant:
    for m in MUTANTS:
        if m.name == name:
            return m
    raise KeyError(name)


MUTANTS = (
    Mutant(
        'm01_tiebreak_id_descending',
        'the last tie-break uses -request_id (larger ids first) instead of request_id',
        (
            (
                (
                    '        cache_rank = 0 if req.cache_hit else 1\n'
                    '        return (deadline_slack, phase_rank, cache_rank, -self._effective_priority(req), req.total_len, req.request_id)\n'
                    '\n'
                ),
                (
                    '        cache_rank = 0 if req.cache_hit else 1\n'
                    '        return (deadline_slack, phase_rank, cache_rank, -self._effective_priority(req), req.total_len, -req.request_id)\n'
                    '\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm02_deadline_slack_every_policy',
        'deadline slack is used under every policy, not only policy deadline',
        (
            (
                (
                    '        deadline_slack = 1_000_000_000\n'
                    "        if self.policy == 'deadline' and req.deadline_step is not None:\n"
                    '            deadline_slack = req.deadline_step - self.clock - self._remaining_steps(req)\n'
                ),
                (
                    '        deadline_slack = 1_000_000_000\n'
                    '        if req.deadline_step is not None:\n'
                    '            deadline_slack = req.deadline_step - self.clock - self._remaining_steps(req)\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm03_progress_reset_on_preemption',
        'a preempted request restarts from prefill with generated_len = 0',
        (
            (
                (
                    '        victim.preemptions += 1\n'
                    '        self.free_kv_blocks += victim.required_blocks\n'
                ),
                (
                    '        victim.preemptions += 1\n'
                    "        victim.phase = 'prefill'\n"
                    '        victim.generated_len = 0\n'
                    '        self.free_kv_blocks += victim.required_blocks\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm04_preempts_non_preemptible',
        'non-preemptible requests can be chosen as victims',
        (
            (
                (
                    '            return None\n'
                    '        victims = [req for req in self.queue if req.admitted and not req.done and req.preemptible and self._effective_priority(req) < self._effective_priority(challenger)]\n'
                    '        victims.sort(key=lambda req: (self._effective_priority(req), -req.required_blocks, req.request_id))\n'
                ),
                (
                    '            return None\n'
                    '        victims = [req for req in self.queue if req.admitted and not req.done and self._effective_priority(req) < self._effective_priority(challenger)]\n'
                    '        victims.sort(key=lambda req: (self._effective_priority(req), -req.required_blocks, req.request_id))\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm05_preempts_equal_priority',
        'a victim of equal priority can be preempted (<= instead of <)',
        (
            (
                (
                    '            return None\n'
                    '        victims = [req for req in self.queue if req.admitted and not req.done and req.preemptible and self._effective_priority(req) < self._effective_priority(challenger)]\n'
                    '        victims.sort(key=lambda req: (self._effective_priority(req), -req.required_blocks, req.request_id))\n'
                ),
                (
                    '            return None\n'
                    '        victims = [req for req in self.queue if req.admitted and not req.done and req.preemptible and self._effective_priority(req) <= self._effective_priority(challenger)]\n'
                    '        victims.sort(key=lambda req: (self._effective_priority(req), -req.required_blocks, req.request_id))\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm06_several_victims',
        'preempts several victims until the challenger fits, instead of at most one',
        (
            (
                (
                    '        victims.sort(key=lambda req: (self._effective_priority(req), -req.required_blocks, req.request_id))\n'
                    '        victim = next((req for req in victims if self.free_kv_blocks + req.required_blocks >= challenger.required_blocks), None)\n'
                    '        if victim is None:\n'
                    '            return None\n'
                ),
                (
                    '        victims.sort(key=lambda req: (self._effective_priority(req), -req.required_blocks, req.request_id))\n'
                    '        taken = []\n'
                    '        freed = self.free_kv_blocks\n'
                    '        for req in victims:\n'
                    '            if freed >= challenger.required_blocks:\n'
                    '                break\n'
                    '            taken.append(req)\n'
                    '            freed += req.required_blocks\n'
                    '        if freed < challenger.required_blocks or not taken:\n'
                    '            return None\n'
                ),
            ),
            (
                (
                    '            return None\n'
                    '        victim.admitted = False\n'
                    "        victim.status = 'preempted'\n"
                    '        victim.preemptions += 1\n'
                    '        self.free_kv_blocks += victim.required_blocks\n'
                    '        self.free_kv_blocks -= challenger.required_blocks\n'
                ),
                (
                    '            return None\n'
                    '        for victim in taken:\n'
                    '            victim.admitted = False\n'
                    "            victim.status = 'preempted'\n"
                    '            victim.preemptions += 1\n'
                    '            self.free_kv_blocks += victim.required_blocks\n'
                    '        self.free_kv_blocks -= challenger.required_blocks\n'
                ),
            ),
            (
                (
                    "        challenger.status = 'running'\n"
                    '        return victim.request_id\n'
                    '        ### END SOLUTION\n'
                ),
                (
                    "        challenger.status = 'running'\n"
                    '        return taken[0].request_id\n'
                    '        ### END SOLUTION\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm07_capacity_leak_victim_blocks',
        "capacity leak: the victim's blocks are never given back",
        (
            (
                (
                    '        victim.preemptions += 1\n'
                    '        self.free_kv_blocks += victim.required_blocks\n'
                    '        self.free_kv_blocks -= challenger.required_blocks\n'
                ),
                (
                    '        victim.preemptions += 1\n'
                    '        self.free_kv_blocks -= challenger.required_blocks\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm08_wait_counted_for_chosen',
        'wait_steps is also incremented for the chosen request',
        (
            (
                (
                    '        for req in candidates:\n'
                    '            if req is not chosen:\n'
                    '                req.wait_steps += 1\n'
                    '\n'
                ),
                (
                    '        for req in candidates:\n'
                    '            req.wait_steps += 1\n'
                    '\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm09_slack_clamped_at_zero',
        'overdue (negative) deadline slack is clamped to 0',
        (
            (
                (
                    "        if self.policy == 'deadline' and req.deadline_step is not None:\n"
                    '            deadline_slack = req.deadline_step - self.clock - self._remaining_steps(req)\n'
                    '        ### END SOLUTION\n'
                ),
                (
                    "        if self.policy == 'deadline' and req.deadline_step is not None:\n"
                    '            deadline_slack = max(0, req.deadline_step - self.clock - self._remaining_steps(req))\n'
                    '        ### END SOLUTION\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm10_slack_forgets_prefill_step',
        'deadline slack counts only the tokens left, forgetting the prefill step',
        (
            (
                (
                    "        if self.policy == 'deadline' and req.deadline_step is not None:\n"
                    '            deadline_slack = req.deadline_step - self.clock - self._remaining_steps(req)\n'
                    '        ### END SOLUTION\n'
                ),
                (
                    "        if self.policy == 'deadline' and req.deadline_step is not None:\n"
                    '            deadline_slack = req.deadline_step - self.clock - (req.max_new_tokens - req.generated_len)\n'
                    '        ### END SOLUTION\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm11_preemption_ignores_aging',
        'preemption compares raw priority, not effective (aged) priority',
        (
            (
                (
                    '            return None\n'
                    '        victims = [req for req in self.queue if req.admitted and not req.done and req.preemptible and self._effective_priority(req) < self._effective_priority(challenger)]\n'
                    '        victims.sort(key=lambda req: (self._effective_priority(req), -req.required_blocks, req.request_id))\n'
                ),
                (
                    '            return None\n'
                    '        victims = [req for req in self.queue if req.admitted and not req.done and req.preemptible and req.priority < challenger.priority]\n'
                    '        victims.sort(key=lambda req: (self._effective_priority(req), -req.required_blocks, req.request_id))\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm12_victim_fewest_blocks_first',
        'among equal-priority victims the one with the FEWEST blocks is taken first',
        (
            (
                (
                    '        victims = [req for req in self.queue if req.admitted and not req.done and req.preemptible and self._effective_priority(req) < self._effective_priority(challenger)]\n'
                    '        victims.sort(key=lambda req: (self._effective_priority(req), -req.required_blocks, req.request_id))\n'
                    '        victim = next((req for req in victims if self.free_kv_blocks + req.required_blocks >= challenger.required_blocks), None)\n'
                ),
                (
                    '        victims = [req for req in self.queue if req.admitted and not req.done and req.preemptible and self._effective_priority(req) < self._effective_priority(challenger)]\n'
                    '        victims.sort(key=lambda req: (self._effective_priority(req), req.required_blocks, req.request_id))\n'
                    '        victim = next((req for req in victims if self.free_kv_blocks + req.required_blocks >= challenger.required_blocks), None)\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm13_minus_one_means_no_victim',
        '-1 is used to mean "no victim", so a victim with request_id -1 is reported as None',
        (
            (
                (
                    "            challenger.status = 'running'\n"
                    '            return None\n'
                    '        if challenger.required_blocks <= self.free_kv_blocks:\n'
                ),
                (
                    "            challenger.status = 'running'\n"
                    '            return -1\n'
                    '        if challenger.required_blocks <= self.free_kv_blocks:\n'
                ),
            ),
            (
                (
                    "            challenger.status = 'running'\n"
                    '            return None\n'
                    '        victims = [req for req in self.queue if req.admitted and not req.done and req.preemptible and self._effective_priority(req) < self._effective_priority(challenger)]\n'
                ),
                (
                    "            challenger.status = 'running'\n"
                    '            return -1\n'
                    '        victims = [req for req in self.queue if req.admitted and not req.done and req.preemptible and self._effective_priority(req) < self._effective_priority(challenger)]\n'
                ),
            ),
            (
                (
                    '        if victim is None:\n'
                    '            return None\n'
                    '        victim.admitted = False\n'
                ),
                (
                    '        if victim is None:\n'
                    '            return -1\n'
                    '        victim.admitted = False\n'
                ),
            ),
            (
                (
                    '            preempted_request_id = self._ensure_capacity(candidate)\n'
                    '            if candidate.admitted:\n'
                ),
                (
                    '            preempted_request_id = self._ensure_capacity(candidate)\n'
                    '            if preempted_request_id == -1:\n'
                    '                preempted_request_id = None\n'
                    '            if candidate.admitted:\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm14_only_first_candidate',
        'only the first candidate in key order is tried; if it cannot be admitted the step does nothing',
        (
            (
                (
                    '        preempted_request_id = None\n'
                    '        for candidate in sorted(candidates, key=self._schedule_key):\n'
                    '            preempted_request_id = self._ensure_capacity(candidate)\n'
                    '            if candidate.admitted:\n'
                    '                chosen = candidate\n'
                    '                break\n'
                    '        if chosen is None:\n'
                ),
                (
                    '        preempted_request_id = None\n'
                    '        candidate = min(candidates, key=self._schedule_key)\n'
                    '        preempted_request_id = self._ensure_capacity(candidate)\n'
                    '        if candidate.admitted:\n'
                    '            chosen = candidate\n'
                    '        if chosen is None:\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm15_cache_rank_inverted',
        'cache misses sort before cache hits (cache_rank inverted)',
        (
            (
                (
                    "        phase_rank = 0 if req.phase == 'prefill' else 1\n"
                    '        cache_rank = 0 if req.cache_hit else 1\n'
                    '        return (deadline_slack, phase_rank, cache_rank, -self._effective_priority(req), req.total_len, req.request_id)\n'
                ),
                (
                    "        phase_rank = 0 if req.phase == 'prefill' else 1\n"
                    '        cache_rank = 1 if req.cache_hit else 0\n'
                    '        return (deadline_slack, phase_rank, cache_rank, -self._effective_priority(req), req.total_len, req.request_id)\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm16_enqueue_drops_preemptible',
        'enqueue forgets to pass preemptible, so every request is preemptible',
        (
            (
                (
                    '            deadline_step=deadline_step,\n'
                    '            preemptible=preemptible,\n'
                    '        )\n'
                ),
                (
                    '            deadline_step=deadline_step,\n'
                    '        )\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm17_no_deadline_slack_zero',
        'under policy deadline a request without a deadline gets slack 0 instead of the sentinel',
        (
            (
                (
                    '        deadline_slack = 1_000_000_000\n'
                    "        if self.policy == 'deadline' and req.deadline_step is not None:\n"
                    '            deadline_slack = req.deadline_step - self.clock - self._remaining_steps(req)\n'
                    '        ### END SOLUTION\n'
                ),
                (
                    '        deadline_slack = 1_000_000_000\n'
                    "        if self.policy == 'deadline':\n"
                    '            deadline_slack = 0 if req.deadline_step is None else req.deadline_step - self.clock - self._remaining_steps(req)\n'
                    '        ### END SOLUTION\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm18_deadline_flag_off_by_one',
        'deadline_missed uses >= instead of > (finishing exactly at the deadline is flagged)',
        (
            (
                (
                    "            'preempted_request_id': preempted_request_id,\n"
                    "            'deadline_missed': chosen.deadline_step is not None and self.clock + 1 + self._remaining_steps(chosen) > chosen.deadline_step,\n"
                    '        }\n'
                ),
                (
                    "            'preempted_request_id': preempted_request_id,\n"
                    "            'deadline_missed': chosen.deadline_step is not None and self.clock + 1 + self._remaining_steps(chosen) >= chosen.deadline_step,\n"
                    '        }\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm19_aging_under_every_policy',
        'aging raises the effective priority under every policy, not only aging',
        (
            (
                (
                    '        """返回 fixed/aging 共用的有效业务优先级。 The effective priority (fixed / aging)."""\n'
                    "        return req.priority + (req.wait_steps // self.aging_interval if self.policy == 'aging' else 0)\n"
                    '\n'
                ),
                (
                    '        """返回 fixed/aging 共用的有效业务优先级。 The effective priority (fixed / aging)."""\n'
                    '        return req.priority + req.wait_steps // self.aging_interval\n'
                    '\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm20_finished_removed_from_queue',
        'finished requests are removed from the queue (their ids can be reused, states vanish)',
        (
            (
                (
                    "                chosen.status = 'finished'\n"
                    '\n'
                ),
                (
                    "                chosen.status = 'finished'\n"
                    '                self.queue.remove(chosen)\n'
                    '\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm21_admission_takes_no_blocks',
        'capacity leak: admitting a request that fits does not take its blocks',
        (
            (
                (
                    '        if challenger.required_blocks <= self.free_kv_blocks:\n'
                    '            self.free_kv_blocks -= challenger.required_blocks\n'
                    '            challenger.admitted = True\n'
                ),
                (
                    '        if challenger.required_blocks <= self.free_kv_blocks:\n'
                    '            challenger.admitted = True\n'
                ),
            ),
        ),
    ),
    Mutant(
        'm22_victim_status_kept',
        "the victim's status is not set to 'preempted' (it still says running)",
        (
            (
                (
                    '        victim.admitted = False\n'
                    "        victim.status = 'preempted'\n"
                    '        victim.preemptions += 1\n'
                ),
                (
                    '        victim.admitted = False\n'
                    '        victim.preemptions += 1\n'
                ),
            ),
        ),
    ),
)
