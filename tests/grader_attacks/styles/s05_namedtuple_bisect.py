# Style: typing.NamedTuple records (the sort key is built as a NamedTuple and returned as a plain tuple, the event
# as NamedTuple._asdict()), candidates ordered with bisect.insort, helper functions at module level.
import bisect
from typing import List, NamedTuple, Optional


class SortKey(NamedTuple):
    deadline_slack: int
    phase_rank: int
    cache_rank: int
    neg_priority: int
    total_len: int
    request_id: int


class Event(NamedTuple):
    request_id: int
    phase: str
    action: str
    prompt_len: int
    generated_len: int
    max_new_tokens: int
    wait_steps: int
    free_kv_blocks: int
    preempted_request_id: Optional[int]
    deadline_missed: bool


class RequestState:
    def __init__(self, request_id, prompt_len, max_new_tokens, priority=0, cache_hit=False, required_blocks=1,
                 deadline_step=None, preemptible=True):
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.max_new_tokens = max_new_tokens
        self.generated_len = 0
        self.phase = 'prefill'
        self.priority = priority
        self.cache_hit = cache_hit
        self.wait_steps = 0
        self.required_blocks = required_blocks
        self.admitted = False
        self.deadline_step = deadline_step
        self.preemptible = preemptible
        self.status = 'waiting'
        self.preemptions = 0

    @property
    def total_len(self):
        return self.prompt_len + self.generated_len

    @property
    def done(self):
        return self.generated_len >= self.max_new_tokens


def remaining_steps(req: RequestState) -> int:
    return (1 if req.phase == 'prefill' else 0) + max(req.max_new_tokens - req.generated_len, 0)


def effective_priority(policy: str, aging_interval: int, req: RequestState) -> int:
    return req.priority + (req.wait_steps // aging_interval if policy == 'aging' else 0)


def missed_deadline(clock: int, req: RequestState) -> bool:
    return req.deadline_step is not None and clock + 1 + remaining_steps(req) > req.deadline_step


class DecodeSchedulerSim:
    def __init__(self, policy='fixed_priority', free_kv_blocks=1_000_000, aging_interval=4):
        if policy not in ('fixed_priority', 'aging', 'deadline'):
            raise ValueError('policy')
        if free_kv_blocks < 0 or aging_interval <= 0:
            raise ValueError('limits')
        self.policy = policy
        self.free_kv_blocks = free_kv_blocks
        self.aging_interval = aging_interval
        self.clock = 0
        self.queue: List[RequestState] = []
        self.timeline = []

    def enqueue(self, request_id, prompt_len, max_new_tokens=2, priority=0, cache_hit=False, required_blocks=1,
                deadline_step=None, preemptible=True):
        if request_id in [r.request_id for r in self.queue]:
            raise ValueError('duplicate')
        if prompt_len <= 0 or max_new_tokens <= 0 or required_blocks <= 0:
            raise ValueError('positive')
        if deadline_step is not None and deadline_step <= self.clock:
            raise ValueError('deadline')
        self.queue.append(RequestState(request_id, prompt_len, max_new_tokens, priority, cache_hit, required_blocks,
                                       deadline_step, preemptible))

    def _effective_priority(self, req):
        return effective_priority(self.policy, self.aging_interval, req)

    def _remaining_steps(self, req):
        return remaining_steps(req)

    def _schedule_key(self, req):
        slack = 1000000000
        if self.policy == 'deadline' and req.deadline_step is not None:
            slack = req.deadline_step - self.clock - remaining_steps(req)
        key = SortKey(deadline_slack=slack, phase_rank=0 if req.phase == 'prefill' else 1,
                      cache_rank=0 if req.cache_hit else 1, neg_priority=-self._effective_priority(req),
                      total_len=req.total_len, request_id=req.request_id)
        return tuple(key)

    def _ensure_capacity(self, challenger):
        if challenger.admitted:
            challenger.status = 'running'
            return None
        if challenger.required_blocks <= self.free_kv_blocks:
            self.free_kv_blocks -= challenger.required_blocks
            challenger.admitted, challenger.status = True, 'running'
            return None
        ranked = []
        for r in self.queue:
            if r.admitted and not r.done and r.preemptible and self._effective_priority(r) < self._effective_priority(challenger):
                bisect.insort(ranked, ((self._effective_priority(r), -r.required_blocks, r.request_id), id(r), r))
        for _, _, victim in ranked:
            if self.free_kv_blocks + victim.required_blocks >= challenger.required_blocks:
                victim.admitted, victim.status = False, 'preempted'
                victim.preemptions += 1
                self.free_kv_blocks += victim.required_blocks - challenger.required_blocks
                challenger.admitted, challenger.status = True, 'running'
                return victim.request_id
        return None

    def step(self):
        candidates = [r for r in self.queue if not r.done]
        order = []
        for n, r in enumerate(candidates):
            bisect.insort(order, (self._schedule_key(r), n))
        chosen = preempted = None
        for _, n in order:
            preempted = self._ensure_capacity(candidates[n])
            if candidates[n].admitted:
                chosen = candidates[n]
                break
        if chosen is None:
            return None
        for r in candidates:
            if r is not chosen:
                r.wait_steps += 1
        if chosen.phase == 'prefill':
            chosen.phase = 'decode'
            phase, action = 'prefill', 'prefill_to_decode'
        else:
            chosen.generated_len += 1
            phase, action = 'decode', 'finish' if chosen.done else 'decode_one_step'
            if chosen.done:
                self.free_kv_blocks += chosen.required_blocks
                chosen.admitted, chosen.status = False, 'finished'
        event = Event(chosen.request_id, phase, action, chosen.prompt_len, chosen.generated_len, chosen.max_new_tokens,
                      chosen.wait_steps, self.free_kv_blocks, preempted, missed_deadline(self.clock, chosen))._asdict()
        self.timeline.append(event)
        self.clock += 1
        return event

    def run(self, max_steps=100):
        if max_steps < 0:
            raise ValueError('max_steps')
        for _ in range(max_steps):
            if self.step() is None:
                break
        return self.timeline
