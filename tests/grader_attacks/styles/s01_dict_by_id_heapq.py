# Style: requests kept in a dict keyed by request_id (queue is a read-only view of it), scheduling with heapq,
# the victim with min(), events built with dict(zip(...)).
import heapq
from dataclasses import dataclass
from typing import Dict, List, Optional

EVENT_KEYS = ('request_id', 'phase', 'action', 'prompt_len', 'generated_len', 'max_new_tokens', 'wait_steps',
              'free_kv_blocks', 'preempted_request_id', 'deadline_missed')


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
    def total_len(self) -> int:
        return self.prompt_len + self.generated_len

    @property
    def done(self) -> bool:
        return self.generated_len >= self.max_new_tokens


class DecodeSchedulerSim:
    def __init__(self, policy: str = 'fixed_priority', free_kv_blocks: int = 1_000_000, aging_interval: int = 4):
        if policy not in ('fixed_priority', 'aging', 'deadline'):
            raise ValueError(f'unknown policy {policy!r}')
        if free_kv_blocks < 0:
            raise ValueError('free_kv_blocks must be >= 0')
        if aging_interval <= 0:
            raise ValueError('aging_interval must be > 0')
        self.policy = policy
        self.free_kv_blocks = free_kv_blocks
        self.aging_interval = aging_interval
        self.clock = 0
        self._by_id: Dict[int, RequestState] = {}
        self.timeline: List[dict] = []

    @property
    def queue(self) -> List[RequestState]:
        return list(self._by_id.values())

    def enqueue(self, request_id: int, prompt_len: int, max_new_tokens: int = 2, priority: int = 0,
                cache_hit: bool = False, required_blocks: int = 1, deadline_step: Optional[int] = None,
                preemptible: bool = True) -> None:
        if request_id in self._by_id:
            raise ValueError('duplicate request_id')
        if min(prompt_len, max_new_tokens, required_blocks) <= 0:
            raise ValueError('lengths and blocks must be positive')
        if deadline_step is not None and deadline_step <= self.clock:
            raise ValueError('deadline in the past')
        self._by_id[request_id] = RequestState(request_id, prompt_len, max_new_tokens, priority=priority,
                                               cache_hit=cache_hit, required_blocks=required_blocks,
                                               deadline_step=deadline_step, preemptible=preemptible)

    def _effective_priority(self, req: RequestState) -> int:
        if self.policy == 'aging':
            return req.priority + req.wait_steps // self.aging_interval
        return req.priority

    def _remaining_steps(self, req: RequestState) -> int:
        return (1 if req.phase == 'prefill' else 0) + max(req.max_new_tokens - req.generated_len, 0)

    def _schedule_key(self, req: RequestState) -> tuple:
        slack = 10**9
        if self.policy == 'deadline' and req.deadline_step is not None:
            slack = req.deadline_step - self.clock - self._remaining_steps(req)
        return (slack, int(req.phase != 'prefill'), int(not req.cache_hit), -self._effective_priority(req),
                req.total_len, req.request_id)

    def _ensure_capacity(self, challenger: RequestState) -> Optional[int]:
        if not challenger.admitted and challenger.required_blocks > self.free_kv_blocks:
            mine = self._effective_priority(challenger)
            enough = [r for r in self._by_id.values()
                      if r.admitted and not r.done and r.preemptible and self._effective_priority(r) < mine
                      and self.free_kv_blocks + r.required_blocks >= challenger.required_blocks]
            if not enough:
                return None
            victim = min(enough, key=lambda r: (self._effective_priority(r), -r.required_blocks, r.request_id))
            victim.admitted, victim.status = False, 'preempted'
            victim.preemptions += 1
            self.free_kv_blocks += victim.required_blocks - challenger.required_blocks
            challenger.admitted, challenger.status = True, 'running'
            return victim.request_id
        if not challenger.admitted:
            self.free_kv_blocks -= challenger.required_blocks
            challenger.admitted = True
        challenger.status = 'running'
        return None

    def step(self) -> Optional[dict]:
        candidates = [r for r in self._by_id.values() if not r.done]
        heap = [(self._schedule_key(r), n, r) for n, r in enumerate(candidates)]
        heapq.heapify(heap)
        chosen, preempted = None, None
        while heap:
            _, _, cand = heapq.heappop(heap)
            preempted = self._ensure_capacity(cand)
            if cand.admitted:
                chosen = cand
                break
        if chosen is None:
            return None
        for r in candidates:
            if r is not chosen:
                r.wait_steps += 1
        if chosen.phase == 'prefill':
            chosen.phase = 'decode'
            action, phase = 'prefill_to_decode', 'prefill'
        else:
            chosen.generated_len += 1
            action, phase = ('finish' if chosen.done else 'decode_one_step'), 'decode'
            if chosen.done:
                self.free_kv_blocks += chosen.required_blocks
                chosen.admitted, chosen.status = False, 'finished'
        missed = chosen.deadline_step is not None and self.clock + 1 + self._remaining_steps(chosen) > chosen.deadline_step
        event = dict(zip(EVENT_KEYS, (chosen.request_id, phase, action, chosen.prompt_len, chosen.generated_len,
                                      chosen.max_new_tokens, chosen.wait_steps, self.free_kv_blocks, preempted, missed)))
        self.timeline.append(event)
        self.clock += 1
        return event

    def run(self, max_steps: int = 100) -> List[dict]:
        if max_steps < 0:
            raise ValueError('max_steps must be >= 0')
        for _ in range(max_steps):
            if self.step() is None:
                break
        return self.timeline
