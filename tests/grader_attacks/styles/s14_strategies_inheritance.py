# Style: a base class holds the mechanics, the policy is a strategy object chosen from a dict, priorities and keys
# come from operator/itertools helpers, next(filter(...)) picks the victim, the first admissible candidate is
# found with itertools.dropwhile.
import itertools
import operator
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional


@dataclass
class RequestState:
    request_id: int
    prompt_len: int
    max_new_tokens: int
    generated_len: int = 0
    phase: str = 'prefill'
    priority: int = 0
    cache_hit: bool = False
    wait_steps: int = 0
    required_blocks: int = 1
    admitted: bool = False
    deadline_step: Optional[int] = None
    preemptible: bool = True
    status: str = 'waiting'
    preemptions: int = 0

    @property
    def total_len(self):
        return self.prompt_len + self.generated_len

    @property
    def done(self):
        return self.generated_len >= self.max_new_tokens


class Policy(ABC):
    @abstractmethod
    def priority(self, req, interval): ...

    def slack(self, req, clock, remaining):
        return 1_000_000_000


class FixedPriority(Policy):
    def priority(self, req, interval):
        return req.priority


class Aging(Policy):
    def priority(self, req, interval):
        return operator.add(req.priority, operator.floordiv(req.wait_steps, interval))


class Deadline(FixedPriority):
    def slack(self, req, clock, remaining):
        if req.deadline_step is None:
            return super().slack(req, clock, remaining)
        return req.deadline_step - clock - remaining


POLICIES = {'fixed_priority': FixedPriority, 'aging': Aging, 'deadline': Deadline}


class _SchedulerBase:
    def __init__(self, policy, free_kv_blocks, aging_interval):
        if policy not in POLICIES:
            raise ValueError('policy')
        if free_kv_blocks < 0 or aging_interval <= 0:
            raise ValueError('capacity')
        self.policy = policy
        self._strategy = POLICIES[policy]()
        self.free_kv_blocks = free_kv_blocks
        self.aging_interval = aging_interval
        self.clock = 0
        self.queue = []
        self.timeline = []

    def _take(self, req):
        self.free_kv_blocks -= req.required_blocks
        req.admitted, req.status = True, 'running'

    def _give_back(self, req, status):
        self.free_kv_blocks += req.required_blocks
        req.admitted, req.status = False, status


class DecodeSchedulerSim(_SchedulerBase):
    def __init__(self, policy='fixed_priority', free_kv_blocks=1_000_000, aging_interval=4):
        super().__init__(policy, free_kv_blocks, aging_interval)

    def enqueue(self, request_id, prompt_len, max_new_tokens=2, priority=0, cache_hit=False, required_blocks=1,
                deadline_step=None, preemptible=True):
        if request_id in map(operator.attrgetter('request_id'), self.queue):
            raise ValueError('duplicate')
        if not all(v > 0 for v in (prompt_len, max_new_tokens, required_blocks)):
            raise ValueError('positive')
        if deadline_step is not None and deadline_step <= self.clock:
            raise ValueError('deadline')
        self.queue.append(RequestState(request_id, prompt_len, max_new_tokens, priority=priority, cache_hit=cache_hit,
                                       required_blocks=required_blocks, deadline_step=deadline_step,
                                       preemptible=preemptible))

    def _effective_priority(self, req):
        return self._strategy.priority(req, self.aging_interval)

    def _remaining_steps(self, req):
        return (1 if req.phase == 'prefill' else 0) + max(req.max_new_tokens - req.generated_len, 0)

    def _schedule_key(self, req):
        return (self._strategy.slack(req, self.clock, self._remaining_steps(req)),
                ('prefill', 'decode').index(req.phase), (True, False).index(req.cache_hit),
                -self._effective_priority(req), req.total_len, req.request_id)

    def _ensure_capacity(self, challenger):
        if challenger.admitted:
            challenger.status = 'running'
            return None
        if challenger.required_blocks <= self.free_kv_blocks:
            self._take(challenger)
            return None
        bar = self._effective_priority(challenger)
        ranked = sorted(filter(lambda r: r.admitted and not r.done and r.preemptible
                               and self._effective_priority(r) < bar, self.queue),
                        key=lambda r: (self._effective_priority(r), -r.required_blocks, r.request_id))
        victim = next(filter(lambda r: self.free_kv_blocks + r.required_blocks >= challenger.required_blocks,
                             ranked), None)
        if victim is None:
            return None
        self._give_back(victim, 'preempted')
        victim.preemptions += 1
        self._take(challenger)
        return victim.request_id

    def step(self):
        candidates = [r for r in self.queue if not r.done]
        outcome = {}

        def cannot_run(req):
            outcome['preempted'] = self._ensure_capacity(req)
            return not req.admitted

        chosen = next(itertools.dropwhile(cannot_run, sorted(candidates, key=self._schedule_key)), None)
        if chosen is None:
            return None
        for r in itertools.filterfalse(lambda r: r is chosen, candidates):
            r.wait_steps += 1
        phase = chosen.phase
        if phase == 'prefill':
            chosen.phase, action = 'decode', 'prefill_to_decode'
        else:
            chosen.generated_len += 1
            action = 'finish' if chosen.done else 'decode_one_step'
            if chosen.done:
                self._give_back(chosen, 'finished')
        event = {'request_id': chosen.request_id, 'phase': phase, 'action': action, 'prompt_len': chosen.prompt_len,
                 'generated_len': chosen.generated_len, 'max_new_tokens': chosen.max_new_tokens,
                 'wait_steps': chosen.wait_steps, 'free_kv_blocks': self.free_kv_blocks,
                 'preempted_request_id': outcome['preempted'],
                 'deadline_missed': chosen.deadline_step is not None
                 and self.clock + 1 + self._remaining_steps(chosen) > chosen.deadline_step}
        self.timeline.append(event)
        self.clock += 1
        return event

    def run(self, max_steps=100):
        if max_steps < 0:
            raise ValueError('max_steps')
        for _ in itertools.takewhile(lambda e: e is not None, (self.step() for _ in range(max_steps))):
            pass
        return self.timeline
