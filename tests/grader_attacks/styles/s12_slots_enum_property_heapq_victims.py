# Style: a plain class with __slots__ whose phase is an enum.Enum inside (the attribute reads and writes the
# plain string through a property), the simulator with __slots__ too, victims popped from a heapq, the
# candidates from another heap, run() as a while loop over a generator.
import enum
import heapq


class Phase(enum.Enum):
    PREFILL = 'prefill'
    DECODE = 'decode'


class RequestState:
    __slots__ = ('request_id', 'prompt_len', 'max_new_tokens', 'generated_len', '_phase', 'priority', 'cache_hit',
                 'wait_steps', 'required_blocks', 'admitted', 'deadline_step', 'preemptible', 'status', 'preemptions')

    def __init__(self, request_id: int, prompt_len: int, max_new_tokens: int, priority: int = 0,
                 cache_hit: bool = False, required_blocks: int = 1, deadline_step=None, preemptible: bool = True):
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.max_new_tokens = max_new_tokens
        self.generated_len = 0
        self._phase = Phase.PREFILL
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
    def phase(self) -> str:
        return self._phase.value

    @phase.setter
    def phase(self, value: str) -> None:
        self._phase = Phase(value)

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.generated_len

    @property
    def done(self) -> bool:
        return self.generated_len >= self.max_new_tokens

    def __repr__(self) -> str:
        return f'RequestState(id={self.request_id}, {self.phase}, {self.generated_len}/{self.max_new_tokens})'


class DecodeSchedulerSim:
    __slots__ = ('policy', 'free_kv_blocks', 'aging_interval', 'clock', 'queue', 'timeline')

    def __init__(self, policy: str = 'fixed_priority', free_kv_blocks: int = 1_000_000, aging_interval: int = 4):
        if policy not in {'fixed_priority', 'aging', 'deadline'}:
            raise ValueError('policy')
        if free_kv_blocks < 0 or aging_interval <= 0:
            raise ValueError('capacity')
        self.policy = policy
        self.free_kv_blocks = free_kv_blocks
        self.aging_interval = aging_interval
        self.clock = 0
        self.queue = []
        self.timeline = []

    def enqueue(self, request_id, prompt_len, max_new_tokens=2, priority=0, cache_hit=False, required_blocks=1,
                deadline_step=None, preemptible=True):
        if any(r.request_id == request_id for r in self.queue):
            raise ValueError('duplicate')
        if prompt_len <= 0 or max_new_tokens <= 0 or required_blocks <= 0:
            raise ValueError('positive')
        if deadline_step is not None and deadline_step <= self.clock:
            raise ValueError('deadline')
        self.queue.append(RequestState(request_id, prompt_len, max_new_tokens, priority, cache_hit, required_blocks,
                                       deadline_step, preemptible))

    def _effective_priority(self, req):
        return req.priority + req.wait_steps // self.aging_interval if self.policy == 'aging' else req.priority

    def _remaining_steps(self, req):
        return (1 if req._phase is Phase.PREFILL else 0) + max(req.max_new_tokens - req.generated_len, 0)

    def _schedule_key(self, req):
        slack = 1_000_000_000
        if self.policy == 'deadline' and req.deadline_step is not None:
            slack = req.deadline_step - self.clock - self._remaining_steps(req)
        return (slack, 0 if req._phase is Phase.PREFILL else 1, 0 if req.cache_hit else 1,
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
        level = self._effective_priority(challenger)
        heap = [((self._effective_priority(r), -r.required_blocks, r.request_id), i, r)
                for i, r in enumerate(self.queue)
                if r.admitted and not r.done and r.preemptible and self._effective_priority(r) < level]
        heapq.heapify(heap)
        while heap:
            victim = heapq.heappop(heap)[2]
            if self.free_kv_blocks + victim.required_blocks < challenger.required_blocks:
                continue
            victim.admitted = False
            victim.status = 'preempted'
            victim.preemptions += 1
            self.free_kv_blocks += victim.required_blocks - challenger.required_blocks
            challenger.admitted = True
            challenger.status = 'running'
            return victim.request_id
        return None

    def step(self):
        candidates = [r for r in self.queue if not r.done]
        if not candidates:
            return None
        heap = [(self._schedule_key(r), r.request_id, r) for r in candidates]
        heapq.heapify(heap)
        chosen = preempted = None
        while heap and chosen is None:
            cand = heapq.heappop(heap)[2]
            preempted = self._ensure_capacity(cand)
            if cand.admitted:
                chosen = cand
        if chosen is None:
            return None
        for r in candidates:
            if r is not chosen:
                r.wait_steps += 1
        prefill = chosen._phase is Phase.PREFILL
        if prefill:
            chosen._phase = Phase.DECODE
        else:
            chosen.generated_len += 1
            if chosen.done:
                self.free_kv_blocks += chosen.required_blocks
                chosen.admitted = False
                chosen.status = 'finished'
        event = dict(request_id=chosen.request_id, phase='prefill' if prefill else 'decode',
                     action='prefill_to_decode' if prefill else ('finish' if chosen.done else 'decode_one_step'),
                     prompt_len=chosen.prompt_len, generated_len=chosen.generated_len,
                     max_new_tokens=chosen.max_new_tokens, wait_steps=chosen.wait_steps,
                     free_kv_blocks=self.free_kv_blocks, preempted_request_id=preempted,
                     deadline_missed=(chosen.deadline_step is not None
                                      and self.clock + 1 + self._remaining_steps(chosen) > chosen.deadline_step))
        self.timeline.append(event)
        self.clock += 1
        return event

    def _stepper(self):
        while True:
            event = self.step()
            if event is None:
                return
            yield event

    def run(self, max_steps=100):
        if max_steps < 0:
            raise ValueError('max_steps')
        it = self._stepper()
        count = 0
        while count < max_steps and next(it, None) is not None:
            count += 1
        return self.timeline
