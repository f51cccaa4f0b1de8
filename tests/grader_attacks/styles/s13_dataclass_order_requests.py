# Style: RequestState is @dataclass(order=True) and compares by a sort_index field only (every other field has
# compare=False): step() refreshes each candidate's sort_index and sorts the requests themselves; helper
# functions at module level; 1_000_000_000 as a module constant written 10 ** 9.
from dataclasses import dataclass, field
from typing import Optional, Tuple

NO_DEADLINE = 10 ** 9


@dataclass(order=True)
class RequestState:
    sort_index: Tuple[int, ...] = field(init=False, repr=False, default=())
    request_id: int = field(default=0, compare=False)
    prompt_len: int = field(default=1, compare=False)
    max_new_tokens: int = field(default=2, compare=False)
    generated_len: int = field(default=0, compare=False)
    phase: str = field(default='prefill', compare=False)
    priority: int = field(default=0, compare=False)
    cache_hit: bool = field(default=False, compare=False)
    wait_steps: int = field(default=0, compare=False)
    required_blocks: int = field(default=1, compare=False)
    admitted: bool = field(default=False, compare=False)
    deadline_step: Optional[int] = field(default=None, compare=False)
    preemptible: bool = field(default=True, compare=False)
    status: str = field(default='waiting', compare=False)
    preemptions: int = field(default=0, compare=False)

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.generated_len

    @property
    def done(self) -> bool:
        return self.generated_len >= self.max_new_tokens


def remaining(req: RequestState) -> int:
    return (req.phase == 'prefill') * 1 + max(req.max_new_tokens - req.generated_len, 0)


def victim_rank(sim: 'DecodeSchedulerSim', req: RequestState) -> Tuple[int, int, int]:
    return sim._effective_priority(req), -req.required_blocks, req.request_id


class DecodeSchedulerSim:
    def __init__(self, policy: str = 'fixed_priority', free_kv_blocks: int = 1_000_000, aging_interval: int = 4):
        if policy not in {'fixed_priority', 'aging', 'deadline'}:
            raise ValueError('policy')
        if free_kv_blocks < 0 or aging_interval <= 0:
            raise ValueError('capacity')
        self.policy = policy
        self.free_kv_blocks = free_kv_blocks
        self.aging_interval = aging_interval
        self.clock = 0
        self.queue: list = []
        self.timeline: list = []

    def enqueue(self, request_id: int, prompt_len: int, max_new_tokens: int = 2, priority: int = 0,
                cache_hit: bool = False, required_blocks: int = 1, deadline_step: Optional[int] = None,
                preemptible: bool = True) -> None:
        if request_id in {r.request_id for r in self.queue}:
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
        return remaining(req)

    def _schedule_key(self, req: RequestState) -> Tuple[int, int, int, int, int, int]:
        slack = NO_DEADLINE
        if self.policy == 'deadline' and req.deadline_step is not None:
            slack = req.deadline_step - self.clock - remaining(req)
        return (slack, 0 if req.phase == 'prefill' else 1, 0 if req.cache_hit else 1, -self._effective_priority(req),
                req.total_len, req.request_id)

    def _ensure_capacity(self, challenger: RequestState) -> Optional[int]:
        if not challenger.admitted:
            if challenger.required_blocks > self.free_kv_blocks:
                pool = [r for r in self.queue if r.admitted and not r.done and r.preemptible
                        and self._effective_priority(r) < self._effective_priority(challenger)
                        and self.free_kv_blocks + r.required_blocks >= challenger.required_blocks]
                if not pool:
                    return None
                pool.sort(key=lambda r: victim_rank(self, r))
                victim = pool[0]
                victim.admitted = False
                victim.status = 'preempted'
                victim.preemptions += 1
                self.free_kv_blocks += victim.required_blocks
                self.free_kv_blocks -= challenger.required_blocks
                challenger.admitted = True
                challenger.status = 'running'
                return victim.request_id
            self.free_kv_blocks -= challenger.required_blocks
            challenger.admitted = True
        challenger.status = 'running'
        return None

    def step(self):
        candidates = [r for r in self.queue if not r.done]
        for r in candidates:
            r.sort_index = self._schedule_key(r)
        chosen = preempted = None
        for cand in sorted(candidates):
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
            action = 'prefill_to_decode'
        else:
            chosen.generated_len += 1
            action = 'finish' if chosen.done else 'decode_one_step'
            if chosen.done:
                self.free_kv_blocks += chosen.required_blocks
                chosen.admitted = False
                chosen.status = 'finished'
        event = {'request_id': chosen.request_id, 'phase': 'prefill' if action == 'prefill_to_decode' else 'decode',
                 'action': action, 'prompt_len': chosen.prompt_len, 'generated_len': chosen.generated_len,
                 'max_new_tokens': chosen.max_new_tokens, 'wait_steps': chosen.wait_steps,
                 'free_kv_blocks': self.free_kv_blocks, 'preempted_request_id': preempted,
                 'deadline_missed': chosen.deadline_step is not None
                 and self.clock + 1 + remaining(chosen) > chosen.deadline_step}
        self.timeline.append(event)
        self.clock += 1
        return event

    def run(self, max_steps: int = 100) -> list:
        if max_steps < 0:
            raise ValueError('max_steps')
        list(iter(lambda: self.step() if len(self.timeline) < start + max_steps else None, None)) \
            if (start := len(self.timeline)) is not None else None
        return self.timeline
