# Style: NumPy for the arithmetic: the sort key is computed as one np.int64 array and returned as Python ints
# (int(np.int64)), candidates and victims ordered with np.lexsort; the state and the events keep Python values.
import numpy as np
from dataclasses import dataclass


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
    deadline_step: 'int | None' = None
    preemptible: bool = True
    status: str = 'waiting'
    preemptions: int = 0

    @property
    def total_len(self):
        return self.prompt_len + self.generated_len

    @property
    def done(self):
        return self.generated_len >= self.max_new_tokens


class DecodeSchedulerSim:
    def __init__(self, policy='fixed_priority', free_kv_blocks=1_000_000, aging_interval=4):
        if policy not in {'fixed_priority', 'aging', 'deadline'}:
            raise ValueError('policy')
        if free_kv_blocks < 0 or aging_interval <= 0:
            raise ValueError('free_kv_blocks / aging_interval')
        self.policy = policy
        self.free_kv_blocks = free_kv_blocks
        self.aging_interval = aging_interval
        self.clock = 0
        self.queue = []
        self.timeline = []

    def enqueue(self, request_id, prompt_len, max_new_tokens=2, priority=0, cache_hit=False, required_blocks=1,
                deadline_step=None, preemptible=True):
        if request_id in {r.request_id for r in self.queue}:
            raise ValueError('duplicate')
        if np.any(np.array([prompt_len, max_new_tokens, required_blocks]) <= 0):
            raise ValueError('positive')
        if deadline_step is not None and deadline_step <= self.clock:
            raise ValueError('deadline')
        self.queue.append(RequestState(request_id=request_id, prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                                       priority=priority, cache_hit=cache_hit, required_blocks=required_blocks,
                                       deadline_step=deadline_step, preemptible=preemptible))

    def _effective_priority(self, req):
        if self.policy != 'aging':
            return req.priority
        return req.priority + int(np.floor_divide(req.wait_steps, self.aging_interval))

    def _remaining_steps(self, req):
        return int(req.phase == 'prefill') + max(req.max_new_tokens - req.generated_len, 0)

    def _schedule_key(self, req):
        slack = np.int64(10) ** 9
        if self.policy == 'deadline' and req.deadline_step is not None:
            slack = np.int64(req.deadline_step) - self.clock - self._remaining_steps(req)
        row = np.array([slack, req.phase != 'prefill', not req.cache_hit, -self._effective_priority(req),
                        req.total_len, req.request_id], dtype=np.int64)
        return tuple(int(v) for v in row)

    def _ensure_capacity(self, challenger):
        if challenger.admitted:
            challenger.status = 'running'
            return None
        if challenger.required_blocks <= self.free_kv_blocks:
            self.free_kv_blocks -= challenger.required_blocks
            challenger.admitted = True
            challenger.status = 'running'
            return None
        mine = self._effective_priority(challenger)
        pool = [r for r in self.queue
                if r.admitted and not r.done and r.preemptible and self._effective_priority(r) < mine]
        if not pool:
            return None
        eff = np.array([self._effective_priority(r) for r in pool])
        blocks = np.array([r.required_blocks for r in pool])
        ids = np.array([r.request_id for r in pool])
        for i in np.lexsort((ids, -blocks, eff)):
            victim = pool[int(i)]
            if self.free_kv_blocks + victim.required_blocks >= challenger.required_blocks:
                victim.admitted = False
                victim.status = 'preempted'
                victim.preemptions += 1
                self.free_kv_blocks = self.free_kv_blocks + victim.required_blocks - challenger.required_blocks
                challenger.admitted = True
                challenger.status = 'running'
                return victim.request_id
        return None

    def step(self):
        candidates = [r for r in self.queue if not r.done]
        if not candidates:
            return None
        keys = np.array([self._schedule_key(r) for r in candidates], dtype=np.int64)
        order = np.lexsort(keys.T[::-1])
        chosen = preempted = None
        for i in order:
            cand = candidates[int(i)]
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
                 and self.clock + 1 + self._remaining_steps(chosen) > chosen.deadline_step}
        self.timeline.append(event)
        self.clock += 1
        return event

    def run(self, max_steps=100):
        if max_steps < 0:
            raise ValueError('max_steps')
        while max_steps > 0 and self.step() is not None:
            max_steps -= 1
        return self.timeline
