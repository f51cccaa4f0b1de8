# Style: events are collections.OrderedDict (fields in the documented order), otherwise manual loops (as s07).
import collections
import sys
from dataclasses import dataclass
from typing import Optional

sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))


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


def lexicographically_less(a, b):
    i = 0
    while i < len(a):
        if a[i] != b[i]:
            return a[i] < b[i]
        i += 1
    return False


class DecodeSchedulerSim:
    def __init__(self, policy='fixed_priority', free_kv_blocks=1_000_000, aging_interval=4):
        ok_policy = policy == 'fixed_priority' or policy == 'aging' or policy == 'deadline'
        if not ok_policy:
            raise ValueError('policy')
        if free_kv_blocks < 0:
            raise ValueError('free_kv_blocks')
        if aging_interval <= 0:
            raise ValueError('aging_interval')
        self.policy = policy
        self.free_kv_blocks = free_kv_blocks
        self.aging_interval = aging_interval
        self.clock = 0
        self.queue = []
        self.timeline = []

    def enqueue(self, request_id, prompt_len, max_new_tokens=2, priority=0, cache_hit=False, required_blocks=1,
                deadline_step=None, preemptible=True):
        for r in self.queue:
            if r.request_id == request_id:
                raise ValueError('duplicate')
        if prompt_len < 1 or max_new_tokens < 1 or required_blocks < 1:
            raise ValueError('positive')
        if deadline_step is not None and deadline_step < self.clock + 1:
            raise ValueError('deadline')
        req = RequestState(request_id, prompt_len, max_new_tokens)
        req.priority = priority
        req.cache_hit = cache_hit
        req.required_blocks = required_blocks
        req.deadline_step = deadline_step
        req.preemptible = preemptible
        self.queue.append(req)

    def _effective_priority(self, req):
        p = req.priority
        if self.policy == 'aging':
            p += req.wait_steps // self.aging_interval
        return p

    def _remaining_steps(self, req):
        left = req.max_new_tokens - req.generated_len
        if left < 0:
            left = 0
        if req.phase == 'prefill':
            left += 1
        return left

    def _schedule_key(self, req):
        slack = 1_000_000_000
        if self.policy == 'deadline':
            if req.deadline_step is not None:
                slack = req.deadline_step - self.clock - self._remaining_steps(req)
        phase_rank = 1
        if req.phase == 'prefill':
            phase_rank = 0
        cache_rank = 1
        if req.cache_hit:
            cache_rank = 0
        return (slack, phase_rank, cache_rank, -self._effective_priority(req), req.total_len, req.request_id)

    def _ensure_capacity(self, challenger):
        if challenger.admitted:
            challenger.status = 'running'
            return None
        if challenger.required_blocks <= self.free_kv_blocks:
            self.free_kv_blocks -= challenger.required_blocks
            challenger.admitted = True
            challenger.status = 'running'
            return None
        best, best_rank = None, None
        for r in self.queue:
            if not r.admitted or r.done or not r.preemptible:
                continue
            if not self._effective_priority(r) < self._effective_priority(challenger):
                continue
            if self.free_kv_blocks + r.required_blocks < challenger.required_blocks:
                continue
            rank = (self._effective_priority(r), -r.required_blocks, r.request_id)
            if best is None or lexicographically_less(rank, best_rank):
                best, best_rank = r, rank
        if best is None:
            return None
        best.admitted = False
        best.status = 'preempted'
        best.preemptions += 1
        self.free_kv_blocks += best.required_blocks
        self.free_kv_blocks -= challenger.required_blocks
        challenger.admitted = True
        challenger.status = 'running'
        return best.request_id

    def step(self):
        candidates = []
        for r in self.queue:
            if not r.done:
                candidates.append(r)
        remaining = candidates[:]
        chosen = None
        preempted_request_id = None
        while remaining:
            best = 0
            for i in range(1, len(remaining)):
                if lexicographically_less(self._schedule_key(remaining[i]), self._schedule_key(remaining[best])):
                    best = i
            cand = remaining.pop(best)
            preempted_request_id = self._ensure_capacity(cand)
            if cand.admitted:
                chosen = cand
                break
        if chosen is None:
            return None
        for r in candidates:
            if r is not chosen:
                r.wait_steps = r.wait_steps + 1
        if chosen.phase == 'prefill':
            chosen.phase = 'decode'
            action = 'prefill_to_decode'
        else:
            chosen.generated_len = chosen.generated_len + 1
            if chosen.done:
                action = 'finish'
                self.free_kv_blocks = self.free_kv_blocks + chosen.required_blocks
                chosen.admitted = False
                chosen.status = 'finished'
            else:
                action = 'decode_one_step'
        missed = False
        if chosen.deadline_step is not None:
            missed = self.clock + 1 + self._remaining_steps(chosen) > chosen.deadline_step
        event = collections.OrderedDict()
        event['request_id'] = chosen.request_id
        event['phase'] = 'prefill' if action == 'prefill_to_decode' else 'decode'
        event['action'] = action
        event['prompt_len'] = chosen.prompt_len
        event['generated_len'] = chosen.generated_len
        event['max_new_tokens'] = chosen.max_new_tokens
        event['wait_steps'] = chosen.wait_steps
        event['free_kv_blocks'] = self.free_kv_blocks
        event['preempted_request_id'] = preempted_request_id
        event['deadline_missed'] = missed
        self.timeline.append(event)
        self.clock = self.clock + 1
        return event

    def run(self, max_steps=100):
        if max_steps < 0:
            raise ValueError('max_steps')
        for _ in range(max_steps):
            if self.step() is None:
                break
        return self.timeline
