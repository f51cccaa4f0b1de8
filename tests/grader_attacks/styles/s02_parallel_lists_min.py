# Style: structure-of-arrays in parallel Python lists; RequestState is a thin view (with __slots__) that reads and
# writes the columns; candidates chosen by repeated min(); the victim by sorted(); events as dict literals.
from typing import List, Optional

_COLUMNS = ('request_id', 'prompt_len', 'max_new_tokens', 'generated_len', 'phase', 'priority', 'cache_hit',
            'wait_steps', 'required_blocks', 'admitted', 'deadline_step', 'preemptible', 'status', 'preemptions')


class RequestState:
    """A view of row `row` of the simulator's columns."""
    __slots__ = ('_cols', '_row')

    def __init__(self, cols: dict, row: int) -> None:
        object.__setattr__(self, '_cols', cols)
        object.__setattr__(self, '_row', row)

    def __getattr__(self, name: str):
        cols = object.__getattribute__(self, '_cols')
        if name in cols:
            return cols[name][object.__getattribute__(self, '_row')]
        raise AttributeError(name)

    def __setattr__(self, name: str, value) -> None:
        if name not in self._cols:
            raise AttributeError(name)
        self._cols[name][self._row] = value

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.generated_len

    @property
    def done(self) -> bool:
        return self.generated_len >= self.max_new_tokens


class DecodeSchedulerSim:
    def __init__(self, policy: str = 'fixed_priority', free_kv_blocks: int = 1_000_000, aging_interval: int = 4):
        if policy not in ['fixed_priority', 'aging', 'deadline']:
            raise ValueError(policy)
        if free_kv_blocks < 0 or aging_interval <= 0:
            raise ValueError('bad capacity or aging interval')
        self.policy = policy
        self.free_kv_blocks = free_kv_blocks
        self.aging_interval = aging_interval
        self.clock = 0
        self._cols = {name: [] for name in _COLUMNS}
        self.timeline = []

    @property
    def queue(self) -> List[RequestState]:
        return [RequestState(self._cols, i) for i in range(len(self._cols['request_id']))]

    def enqueue(self, request_id, prompt_len, max_new_tokens=2, priority=0, cache_hit=False, required_blocks=1,
                deadline_step=None, preemptible=True):
        if request_id in self._cols['request_id']:
            raise ValueError('duplicate')
        if prompt_len <= 0 or max_new_tokens <= 0 or required_blocks <= 0:
            raise ValueError('must be positive')
        if deadline_step is not None and not deadline_step > self.clock:
            raise ValueError('deadline')
        row = dict(request_id=request_id, prompt_len=prompt_len, max_new_tokens=max_new_tokens, generated_len=0,
                   phase='prefill', priority=priority, cache_hit=cache_hit, wait_steps=0,
                   required_blocks=required_blocks, admitted=False, deadline_step=deadline_step,
                   preemptible=preemptible, status='waiting', preemptions=0)
        for name in _COLUMNS:
            self._cols[name].append(row[name])

    def _effective_priority(self, req):
        bonus = req.wait_steps // self.aging_interval if self.policy == 'aging' else 0
        return req.priority + bonus

    def _remaining_steps(self, req):
        return (req.phase == 'prefill') + max(req.max_new_tokens - req.generated_len, 0)

    def _schedule_key(self, req):
        if self.policy == 'deadline' and req.deadline_step is not None:
            slack = req.deadline_step - self.clock - self._remaining_steps(req)
        else:
            slack = int(1e9)
        return (slack, 0 if req.phase == 'prefill' else 1, 0 if req.cache_hit else 1,
                -self._effective_priority(req), req.total_len, req.request_id)

    def _ensure_capacity(self, challenger):
        if challenger.admitted:
            challenger.status = 'running'
            return None
        if challenger.required_blocks <= self.free_kv_blocks:
            self.free_kv_blocks -= challenger.required_blocks
            challenger.admitted = True
            challenger.status = 'running'
            return None
        need = challenger.required_blocks - self.free_kv_blocks
        ranked = sorted((r for r in self.queue if r.admitted and not r.done and r.preemptible
                         and self._effective_priority(r) < self._effective_priority(challenger)),
                        key=lambda r: (self._effective_priority(r), -r.required_blocks, r.request_id))
        for victim in ranked:
            if victim.required_blocks >= need:
                victim.admitted = False
                victim.status = 'preempted'
                victim.preemptions = victim.preemptions + 1
                self.free_kv_blocks = self.free_kv_blocks + victim.required_blocks - challenger.required_blocks
                challenger.admitted = True
                challenger.status = 'running'
                return victim.request_id
        return None

    def step(self):
        candidates = [r for r in self.queue if not r.done]
        left = list(candidates)
        chosen = preempted = None
        while left:
            cand = min(left, key=self._schedule_key)
            left.remove(cand)
            preempted = self._ensure_capacity(cand)
            if cand.admitted:
                chosen = cand
                break
        if chosen is None:
            return None
        for r in candidates:
            if r._row != chosen._row:
                r.wait_steps += 1
        was_prefill = chosen.phase == 'prefill'
        if was_prefill:
            chosen.phase = 'decode'
            action = 'prefill_to_decode'
        else:
            chosen.generated_len += 1
            action = 'finish' if chosen.done else 'decode_one_step'
            if chosen.done:
                self.free_kv_blocks += chosen.required_blocks
                chosen.admitted = False
                chosen.status = 'finished'
        event = {
            'request_id': chosen.request_id,
            'phase': 'prefill' if was_prefill else 'decode',
            'action': action,
            'prompt_len': chosen.prompt_len,
            'generated_len': chosen.generated_len,
            'max_new_tokens': chosen.max_new_tokens,
            'wait_steps': chosen.wait_steps,
            'free_kv_blocks': self.free_kv_blocks,
            'preempted_request_id': preempted,
            'deadline_missed': (chosen.deadline_step is not None
                                and self.clock + 1 + self._remaining_steps(chosen) > chosen.deadline_step),
        }
        self.timeline.append(event)
        self.clock += 1
        return event

    def run(self, max_steps=100):
        if max_steps < 0:
            raise ValueError('negative max_steps')
        n = 0
        while n < max_steps and self.step() is not None:
            n += 1
        return self.timeline
