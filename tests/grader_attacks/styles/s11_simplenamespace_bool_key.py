# Style: requests are types.SimpleNamespace objects built from a defaults dict, the sort key holds bools
# (phase != 'prefill', not cache_hit: they compare as 0 and 1), the sentinel is int(1e9), events {**base, ...}.
import types

DEFAULTS = dict(generated_len=0, phase='prefill', wait_steps=0, admitted=False, status='waiting', preemptions=0)
SENTINEL = int(1e9)


class RequestState(types.SimpleNamespace):
    @property
    def total_len(self):
        return self.prompt_len + self.generated_len

    @property
    def done(self):
        return self.generated_len >= self.max_new_tokens


class DecodeSchedulerSim:
    def __init__(self, policy='fixed_priority', free_kv_blocks=1_000_000, aging_interval=4):
        if policy not in ('fixed_priority', 'aging', 'deadline'):
            raise ValueError('bad policy')
        if free_kv_blocks < 0 or aging_interval <= 0:
            raise ValueError('bad numbers')
        self.policy = policy
        self.free_kv_blocks = free_kv_blocks
        self.aging_interval = aging_interval
        self.clock = 0
        self.queue = []
        self.timeline = []

    def enqueue(self, request_id, prompt_len, max_new_tokens=2, priority=0, cache_hit=False, required_blocks=1,
                deadline_step=None, preemptible=True):
        if request_id in (r.request_id for r in self.queue):
            raise ValueError('duplicate')
        if not (prompt_len > 0 and max_new_tokens > 0 and required_blocks > 0):
            raise ValueError('positive')
        if deadline_step is not None and deadline_step <= self.clock:
            raise ValueError('deadline')
        self.queue.append(RequestState(**DEFAULTS, request_id=request_id, prompt_len=prompt_len,
                                       max_new_tokens=max_new_tokens, priority=priority, cache_hit=cache_hit,
                                       required_blocks=required_blocks, deadline_step=deadline_step,
                                       preemptible=preemptible))

    def _effective_priority(self, req):
        return req.priority + (req.wait_steps // self.aging_interval) * (self.policy == 'aging')

    def _remaining_steps(self, req):
        return (req.phase == 'prefill') + max(req.max_new_tokens - req.generated_len, 0)

    def _schedule_key(self, req):
        use_slack = self.policy == 'deadline' and req.deadline_step is not None
        slack = req.deadline_step - self.clock - self._remaining_steps(req) if use_slack else SENTINEL
        return (slack, req.phase != 'prefill', not req.cache_hit, -self._effective_priority(req), req.total_len,
                req.request_id)

    def _admit(self, req):
        self.free_kv_blocks -= req.required_blocks
        req.admitted, req.status = True, 'running'

    def _ensure_capacity(self, challenger):
        if challenger.admitted:
            challenger.status = 'running'
            return None
        if self.free_kv_blocks >= challenger.required_blocks:
            self._admit(challenger)
            return None
        victims = sorted((r for r in self.queue if r.admitted and not r.done and r.preemptible
                          and self._effective_priority(r) < self._effective_priority(challenger)),
                         key=lambda r: (self._effective_priority(r), -r.required_blocks, r.request_id))
        victim = next(iter([v for v in victims if self.free_kv_blocks + v.required_blocks >= challenger.required_blocks]), None)
        if victim is None:
            return None
        victim.admitted, victim.status, victim.preemptions = False, 'preempted', victim.preemptions + 1
        self.free_kv_blocks += victim.required_blocks
        self._admit(challenger)
        return victim.request_id

    def step(self):
        candidates = [r for r in self.queue if not r.done]
        chosen = preempted = None
        for req in sorted(candidates, key=self._schedule_key):
            preempted = self._ensure_capacity(req)
            if req.admitted:
                chosen = req
                break
        else:
            return None
        for req in candidates:
            if req is not chosen:
                req.wait_steps += 1
        base = {'request_id': chosen.request_id, 'prompt_len': chosen.prompt_len,
                'max_new_tokens': chosen.max_new_tokens, 'preempted_request_id': preempted}
        if chosen.phase == 'prefill':
            chosen.phase = 'decode'
            event = {**base, 'phase': 'prefill', 'action': 'prefill_to_decode'}
        else:
            chosen.generated_len += 1
            event = {**base, 'phase': 'decode', 'action': 'finish' if chosen.done else 'decode_one_step'}
            if chosen.done:
                self.free_kv_blocks += chosen.required_blocks
                chosen.admitted, chosen.status = False, 'finished'
        late = chosen.deadline_step is not None and self.clock + 1 + self._remaining_steps(chosen) > chosen.deadline_step
        event = {**event, 'generated_len': chosen.generated_len, 'wait_steps': chosen.wait_steps,
                 'free_kv_blocks': self.free_kv_blocks, 'deadline_missed': late}
        self.timeline.append(event)
        self.clock += 1
        return event

    def run(self, max_steps=100):
        if max_steps < 0:
            raise ValueError('max_steps')
        done = 0
        while done < max_steps:
            if self.step() is None:
                break
            done += 1
        return self.timeline
