# Style: an IntEnum status machine inside (the attribute holds the name the interface asks for), a match
# statement for the step's action, a frozen dataclass for the victim candidate, min() over candidates.
from __future__ import annotations

import enum
from dataclasses import dataclass


class St(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3

    @property
    def text(self) -> str:
        return self.name.lower()


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
    deadline_step: int | None = None
    preemptible: bool = True
    status: str = St.WAITING.text
    preemptions: int = 0

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.generated_len

    @property
    def done(self) -> bool:
        return self.generated_len >= self.max_new_tokens

    def become(self, st: St) -> None:
        self.status = st.text


@dataclass(frozen=True)
class Victim:
    rank: tuple
    req: RequestState


class DecodeSchedulerSim:
    def __init__(self, policy: str = 'fixed_priority', free_kv_blocks: int = 1_000_000, aging_interval: int = 4):
        match policy:
            case 'fixed_priority' | 'aging' | 'deadline':
                pass
            case _:
                raise ValueError('policy')
        if free_kv_blocks < 0 or aging_interval <= 0:
            raise ValueError('capacity')
        self.policy = policy
        self.free_kv_blocks = free_kv_blocks
        self.aging_interval = aging_interval
        self.clock = 0
        self.queue: list[RequestState] = []
        self.timeline: list[dict] = []

    def enqueue(self, request_id: int, prompt_len: int, max_new_tokens: int = 2, priority: int = 0,
                cache_hit: bool = False, required_blocks: int = 1, deadline_step: int | None = None,
                preemptible: bool = True) -> None:
        if any(r.request_id == request_id for r in self.queue):
            raise ValueError('duplicate')
        if prompt_len <= 0 or max_new_tokens <= 0 or required_blocks <= 0:
            raise ValueError('positive')
        if deadline_step is not None and deadline_step <= self.clock:
            raise ValueError('deadline')
        self.queue.append(RequestState(request_id=request_id, prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                                       priority=priority, cache_hit=cache_hit, required_blocks=required_blocks,
                                       deadline_step=deadline_step, preemptible=preemptible))

    def _effective_priority(self, req: RequestState) -> int:
        match self.policy:
            case 'aging':
                return req.priority + req.wait_steps // self.aging_interval
            case _:
                return req.priority

    def _remaining_steps(self, req: RequestState) -> int:
        return (1 if req.phase == 'prefill' else 0) + max(req.max_new_tokens - req.generated_len, 0)

    def _schedule_key(self, req: RequestState) -> tuple[int, int, int, int, int, int]:
        match (self.policy, req.deadline_step):
            case ('deadline', int(deadline)):
                slack = deadline - self.clock - self._remaining_steps(req)
            case _:
                slack = 1_000_000_000
        return (slack, 0 if req.phase == 'prefill' else 1, 0 if req.cache_hit else 1,
                -self._effective_priority(req), req.total_len, req.request_id)

    def _ensure_capacity(self, challenger: RequestState) -> int | None:
        if challenger.admitted:
            challenger.become(St.RUNNING)
            return None
        if challenger.required_blocks <= self.free_kv_blocks:
            self.free_kv_blocks -= challenger.required_blocks
            challenger.admitted = True
            challenger.become(St.RUNNING)
            return None
        options = [Victim((self._effective_priority(r), -r.required_blocks, r.request_id), r) for r in self.queue
                   if r.admitted and not r.done and r.preemptible
                   and self._effective_priority(r) < self._effective_priority(challenger)
                   and self.free_kv_blocks + r.required_blocks >= challenger.required_blocks]
        if not options:
            return None
        victim = min(options, key=lambda v: v.rank).req
        victim.admitted = False
        victim.become(St.PREEMPTED)
        victim.preemptions += 1
        self.free_kv_blocks += victim.required_blocks - challenger.required_blocks
        challenger.admitted = True
        challenger.become(St.RUNNING)
        return victim.request_id

    def step(self) -> dict | None:
        candidates = [r for r in self.queue if not r.done]
        pool = list(candidates)
        chosen = preempted = None
        while pool:
            cand = min(pool, key=self._schedule_key)
            pool.remove(cand)
            preempted = self._ensure_capacity(cand)
            if cand.admitted:
                chosen = cand
                break
        if chosen is None:
            return None
        for r in candidates:
            if r is not chosen:
                r.wait_steps += 1
        match chosen.phase:
            case 'prefill':
                chosen.phase = 'decode'
                phase, action = 'prefill', 'prefill_to_decode'
            case 'decode':
                chosen.generated_len += 1
                phase, action = 'decode', 'finish' if chosen.done else 'decode_one_step'
                if chosen.done:
                    self.free_kv_blocks += chosen.required_blocks
                    chosen.admitted = False
                    chosen.become(St.FINISHED)
        event = {'request_id': chosen.request_id, 'phase': phase, 'action': action, 'prompt_len': chosen.prompt_len,
                 'generated_len': chosen.generated_len, 'max_new_tokens': chosen.max_new_tokens,
                 'wait_steps': chosen.wait_steps, 'free_kv_blocks': self.free_kv_blocks,
                 'preempted_request_id': preempted,
                 'deadline_missed': chosen.deadline_step is not None
                 and self.clock + 1 + self._remaining_steps(chosen) > chosen.deadline_step}
        self.timeline.append(event)
        self.clock += 1
        return event

    def run(self, max_steps: int = 100) -> list[dict]:
        if max_steps < 0:
            raise ValueError('max_steps')
        steps = 0
        while steps < max_steps and self.step() is not None:
            steps += 1
        return self.timeline
