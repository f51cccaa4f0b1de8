# Style: @dataclass(slots=True) state, an order=True frozen dataclass as the candidate record, IntEnum ranks
# inside the sort key, an Enum for the status internally (the attribute keeps the plain string), sorted(key=...).
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Phase(str, enum.Enum):
    PREFILL = 'prefill'
    DECODE = 'decode'


class Status(enum.Enum):
    WAITING = 'waiting'
    RUNNING = 'running'
    PREEMPTED = 'preempted'
    FINISHED = 'finished'


class PhaseRank(enum.IntEnum):
    PREFILL = 0
    DECODE = 1


class CacheRank(enum.IntEnum):
    HIT = 0
    MISS = 1


NO_DEADLINE: int = 1_000_000_000


@dataclass(slots=True)
class RequestState:
    request_id: int
    prompt_len: int
    max_new_tokens: int
    generated_len: int = 0
    phase: str = Phase.PREFILL.value
    priority: int = 0
    cache_hit: bool = False
    wait_steps: int = 0
    required_blocks: int = 1
    admitted: bool = False
    deadline_step: int | None = None
    preemptible: bool = True
    status: str = Status.WAITING.value
    preemptions: int = 0

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.generated_len

    @property
    def done(self) -> bool:
        return self.generated_len >= self.max_new_tokens

    def set_status(self, status: Status) -> None:
        self.status = status.value


@dataclass(frozen=True, order=True)
class Candidate:
    key: tuple
    index: int
    req: RequestState = field(compare=False)


@dataclass(frozen=True, order=True)
class VictimRank:
    effective_priority: int
    minus_blocks: int
    request_id: int


class DecodeSchedulerSim:
    """Advance one request per step."""

    POLICIES = frozenset({'fixed_priority', 'aging', 'deadline'})

    def __init__(self, policy: str = 'fixed_priority', free_kv_blocks: int = 1_000_000, aging_interval: int = 4):
        if policy not in self.POLICIES:
            raise ValueError('policy')
        if free_kv_blocks < 0 or aging_interval <= 0:
            raise ValueError('capacity / aging_interval')
        self.policy: str = policy
        self.free_kv_blocks: int = free_kv_blocks
        self.aging_interval: int = aging_interval
        self.clock: int = 0
        self.queue: list[RequestState] = []
        self.timeline: list[dict[str, int | str | bool | None]] = []

    def enqueue(self, request_id: int, prompt_len: int, max_new_tokens: int = 2, priority: int = 0,
                cache_hit: bool = False, required_blocks: int = 1, deadline_step: int | None = None,
                preemptible: bool = True) -> None:
        """Validate and queue a request."""
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
        return req.priority + (req.wait_steps // self.aging_interval if self.policy == 'aging' else 0)

    def _remaining_steps(self, req: RequestState) -> int:
        return (1 if req.phase == Phase.PREFILL.value else 0) + max(req.max_new_tokens - req.generated_len, 0)

    def _schedule_key(self, req: RequestState) -> tuple[int, int, int, int, int, int]:
        slack = NO_DEADLINE
        if self.policy == 'deadline' and req.deadline_step is not None:
            slack = req.deadline_step - self.clock - self._remaining_steps(req)
        phase_rank = PhaseRank.PREFILL if req.phase == Phase.PREFILL.value else PhaseRank.DECODE
        cache_rank = CacheRank.HIT if req.cache_hit else CacheRank.MISS
        return (slack, phase_rank, cache_rank, -self._effective_priority(req), req.total_len, req.request_id)

    def _victim_rank(self, req: RequestState) -> VictimRank:
        return VictimRank(self._effective_priority(req), -req.required_blocks, req.request_id)

    def _ensure_capacity(self, challenger: RequestState) -> int | None:
        if challenger.admitted:
            challenger.set_status(Status.RUNNING)
            return None
        if challenger.required_blocks <= self.free_kv_blocks:
            self.free_kv_blocks -= challenger.required_blocks
            challenger.admitted = True
            challenger.set_status(Status.RUNNING)
            return None
        bar = self._effective_priority(challenger)
        for victim in sorted((r for r in self.queue if r.admitted and not r.done and r.preemptible
                              and self._effective_priority(r) < bar), key=self._victim_rank):
            if self.free_kv_blocks + victim.required_blocks >= challenger.required_blocks:
                victim.admitted = False
                victim.set_status(Status.PREEMPTED)
                victim.preemptions += 1
                self.free_kv_blocks += victim.required_blocks
                self.free_kv_blocks -= challenger.required_blocks
                challenger.admitted = True
                challenger.set_status(Status.RUNNING)
                return victim.request_id
        return None

    def step(self) -> dict[str, int | str | bool | None] | None:
        candidates = [r for r in self.queue if not r.done]
        ordered = sorted(Candidate(self._schedule_key(r), i, r) for i, r in enumerate(candidates))
        chosen: RequestState | None = None
        preempted: int | None = None
        for cand in ordered:
            preempted = self._ensure_capacity(cand.req)
            if cand.req.admitted:
                chosen = cand.req
                break
        if chosen is None:
            return None
        for r in candidates:
            if r is not chosen:
                r.wait_steps += 1
        phase = chosen.phase
        if phase == Phase.PREFILL.value:
            chosen.phase = Phase.DECODE.value
            action = 'prefill_to_decode'
        else:
            chosen.generated_len += 1
            action = 'finish' if chosen.done else 'decode_one_step'
            if chosen.done:
                self.free_kv_blocks += chosen.required_blocks
                chosen.admitted = False
                chosen.set_status(Status.FINISHED)
        event = {'request_id': chosen.request_id, 'phase': phase, 'action': action, 'prompt_len': chosen.prompt_len,
                 'generated_len': chosen.generated_len, 'max_new_tokens': chosen.max_new_tokens,
                 'wait_steps': chosen.wait_steps, 'free_kv_blocks': self.free_kv_blocks,
                 'preempted_request_id': preempted,
                 'deadline_missed': chosen.deadline_step is not None
                 and self.clock + 1 + self._remaining_steps(chosen) > chosen.deadline_step}
        self.timeline.append(event)
        self.clock += 1
        return event

    def run(self, max_steps: int = 100) -> list[dict[str, int | str | bool | None]]:
        if max_steps < 0:
            raise ValueError('max_steps')
        steps = 0
        while steps < max_steps:
            if self.step() is None:
                break
            steps += 1
        return self.timeline
