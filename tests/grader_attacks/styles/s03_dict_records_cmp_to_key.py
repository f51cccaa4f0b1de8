# Style: each request is a dict (a dict subclass that also answers attribute access, as the tests read
# req.phase); ordering with functools.cmp_to_key; events built from a base dict with {**base, ...}.
import functools


class RequestState(dict):
    """A request as a plain mapping; attributes read and write its keys."""

    def __getattr__(self, name):
        if name == 'total_len':
            return self['prompt_len'] + self['generated_len']
        if name == 'done':
            return self['generated_len'] >= self['max_new_tokens']
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self[name] = value


def _cmp(a, b):
    return (a > b) - (a < b)


class DecodeSchedulerSim:
    def __init__(self, policy='fixed_priority', free_kv_blocks=1_000_000, aging_interval=4):
        if policy not in {'fixed_priority', 'aging', 'deadline'} or free_kv_blocks < 0 or aging_interval <= 0:
            raise ValueError('bad arguments')
        self.policy, self.free_kv_blocks, self.aging_interval = policy, free_kv_blocks, aging_interval
        self.clock = 0
        self.queue = []
        self.timeline = []

    def enqueue(self, request_id, prompt_len, max_new_tokens=2, priority=0, cache_hit=False, required_blocks=1,
                deadline_step=None, preemptible=True):
        if any(r['request_id'] == request_id for r in self.queue):
            raise ValueError('duplicate request id')
        if prompt_len <= 0 or max_new_tokens <= 0 or required_blocks <= 0:
            raise ValueError('not positive')
        if deadline_step is not None and deadline_step <= self.clock:
            raise ValueError('deadline not after the clock')
        self.queue.append(RequestState(
            request_id=request_id, prompt_len=prompt_len, max_new_tokens=max_new_tokens, generated_len=0,
            phase='prefill', priority=priority, cache_hit=cache_hit, wait_steps=0, required_blocks=required_blocks,
            admitted=False, deadline_step=deadline_step, preemptible=preemptible, status='waiting', preemptions=0))

    def _effective_priority(self, req):
        return req['priority'] + (req['wait_steps'] // self.aging_interval if self.policy == 'aging' else 0)

    def _remaining_steps(self, req):
        return (1 if req['phase'] == 'prefill' else 0) + max(req['max_new_tokens'] - req['generated_len'], 0)

    def _schedule_key(self, req):
        slack = 1_000_000_000
        if self.policy == 'deadline' and req['deadline_step'] is not None:
            slack = req['deadline_step'] - self.clock - self._remaining_steps(req)
        return (slack, 0 if req['phase'] == 'prefill' else 1, 0 if req['cache_hit'] else 1,
                -self._effective_priority(req), req.total_len, req['request_id'])

    def _compare(self, a, b):
        ka, kb = self._schedule_key(a), self._schedule_key(b)
        for x, y in zip(ka, kb):
            c = _cmp(x, y)
            if c:
                return c
        return 0

    def _victim_cmp(self, a, b):
        return (_cmp(self._effective_priority(a), self._effective_priority(b))
                or _cmp(b['required_blocks'], a['required_blocks'])
                or _cmp(a['request_id'], b['request_id']))

    def _ensure_capacity(self, challenger):
        if challenger['admitted']:
            challenger['status'] = 'running'
            return None
        if challenger['required_blocks'] <= self.free_kv_blocks:
            self.free_kv_blocks -= challenger['required_blocks']
            challenger.update(admitted=True, status='running')
            return None
        pool = [r for r in self.queue if r['admitted'] and not r.done and r['preemptible']
                and self._effective_priority(r) < self._effective_priority(challenger)]
        pool.sort(key=functools.cmp_to_key(self._victim_cmp))
        for victim in pool:
            if self.free_kv_blocks + victim['required_blocks'] >= challenger['required_blocks']:
                victim.update(admitted=False, status='preempted', preemptions=victim['preemptions'] + 1)
                self.free_kv_blocks += victim['required_blocks'] - challenger['required_blocks']
                challenger.update(admitted=True, status='running')
                return victim['request_id']
        return None

    def step(self):
        candidates = [r for r in self.queue if not r.done]
        if not candidates:
            return None
        chosen, preempted = None, None
        for cand in sorted(candidates, key=functools.cmp_to_key(self._compare)):
            preempted = self._ensure_capacity(cand)
            if cand['admitted']:
                chosen = cand
                break
        if chosen is None:
            return None
        for r in candidates:
            if r is not chosen:
                r['wait_steps'] += 1
        base = {'request_id': chosen['request_id'], 'prompt_len': chosen['prompt_len'],
                'max_new_tokens': chosen['max_new_tokens']}
        if chosen['phase'] == 'prefill':
            chosen['phase'] = 'decode'
            event = {**base, 'phase': 'prefill', 'action': 'prefill_to_decode'}
        else:
            chosen['generated_len'] += 1
            if chosen.done:
                self.free_kv_blocks += chosen['required_blocks']
                chosen.update(admitted=False, status='finished')
            event = {**base, 'phase': 'decode', 'action': 'finish' if chosen.done else 'decode_one_step'}
        event = {**event, 'generated_len': chosen['generated_len'], 'wait_steps': chosen['wait_steps'],
                 'free_kv_blocks': self.free_kv_blocks, 'preempted_request_id': preempted,
                 'deadline_missed': chosen['deadline_step'] is not None
                 and self.clock + 1 + self._remaining_steps(chosen) > chosen['deadline_step']}
        self.timeline.append(event)
        self.clock += 1
        return event

    def run(self, max_steps=100):
        if max_steps < 0:
            raise ValueError('max_steps < 0')
        for _ in range(max_steps):
            if not self.step():
                break
        return self.timeline
