"""Style: run() drives a generator wrapped in list(); print() debugging left in (stdout), logging calls (a
logger of its own at DEBUG, so nothing reaches stderr), assert statements, docstrings and type hints; the queue is
a collections.deque; run() returns a copy of the timeline."""
import collections
import logging
from dataclasses import dataclass
from typing import Deque, Dict, Iterator, List, Optional, Union

log = logging.getLogger('decode_scheduler')
log.setLevel(logging.DEBUG)
DEBUG = True
Event = Dict[str, Union[int, str, bool, None]]


@dataclass
class RequestState:
    """One request."""
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
        """Prompt plus generated tokens."""
        return self.prompt_len + self.generated_len

    @property
    def done(self) -> bool:
        """All tokens generated."""
        return self.generated_len >= self.max_new_tokens


class DecodeSchedulerSim:
    """The simulator."""

    def __init__(self, policy: str = 'fixed_priority', free_kv_blocks: int = 1_000_000, aging_interval: int = 4) -> None:
        if policy not in {'fixed_priority', 'aging', 'deadline'}:
            raise ValueError('policy')
        if free_kv_blocks < 0 or aging_interval <= 0:
            raise ValueError('free_kv_blocks/aging_interval')
        self.policy: str = policy
        self.free_kv_blocks: int = free_kv_blocks
        self.aging_interval: int = aging_interval
        self.clock: int = 0
        self.queue: Deque[RequestState] = collections.deque()
        self.timeline: List[Event] = []
        log.debug('new simulator %s', policy)

    def enqueue(self, request_id: int, prompt_len: int, max_new_tokens: int = 2, priority: int = 0,
                cache_hit: bool = False, required_blocks: int = 1, deadline_step: Optional[int] = None,
                preemptible: bool = True) -> None:
        """Validate, then queue."""
        if any(r.request_id == request_id for r in self.queue):
            raise ValueError('duplicate')
        if prompt_len <= 0 or max_new_tokens <= 0 or required_blocks <= 0:
            raise ValueError('positive')
        if deadline_step is not None and deadline_step <= self.clock:
            raise ValueError('deadline')
        req = RequestState(request_id=request_id, prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                           priority=priority, cache_hit=cache_hit, required_blocks=required_blocks,
                           deadline_step=deadline_step, preemptible=preemptible)
        assert req.status == 'waiting' and not req.admitted
        self.queue.append(req)
        if DEBUG:
            print('enqueued', req)

    def _effective_priority(self, req: RequestState) -> int:
        """fixed or aging."""
        return req.priority + (req.wait_steps // self.aging_interval if self.policy == 'aging' else 0)

    def _remaining_steps(self, req: RequestState) -> int:
        return (1 if req.phase == 'prefill' else 0) + max(req.max_new_tokens - req.generated_len, 0)

    def _schedule_key(self, req: RequestState) -> tuple:
        """The sort key."""
        slack = 1_000_000_000
        if self.policy == 'deadline' and req.deadline_step is not None:
            slack = req.deadline_step - self.clock - self._remaining_steps(req)
        key = (slack, 0 if req.phase == 'prefill' else 1, 0 if req.cache_hit else 1, -self._effective_priority(req),
               req.total_len, req.request_id)
        assert len(key) == 6
        return key

    def _ensure_capacity(self, challenger: RequestState) -> Optional[int]:
        """Admit, or preempt one victim."""
        if challenger.admitted:
            challenger.status = 'running'
            return None
        if challenger.required_blocks <= self.free_kv_blocks:
            self.free_kv_blocks -= challenger.required_blocks
            challenger.admitted = True
            challenger.status = 'running'
            return None
        level = self._effective_priority(challenger)
        usable = [r for r in self.queue if r.admitted and not r.done and r.preemptible
                  and self._effective_priority(r) < level
                  and self.free_kv_blocks + r.required_blocks >= challenger.required_blocks]
        if not usable:
            log.debug('no victim for %s', challenger.request_id)
            return None
        # the best victim: lowest priority, then most blocks, then smallest id (max of the negated rank)
        victim = max(usable, key=lambda r: (-self._effective_priority(r), r.required_blocks, -r.request_id))
        victim.admitted = False
        victim.status = 'preempted'
        victim.preemptions += 1
        self.free_kv_blocks += victim.required_blocks - challenger.required_blocks
        challenger.admitted = True
        challenger.status = 'running'
        assert self.free_kv_blocks >= 0
        log.info('request %s preempted %s', challenger.request_id, victim.request_id)
        return victim.request_id

    def step(self) -> Optional[Event]:
        """Run one request for one step."""
        candidates = [r for r in self.queue if not r.done]
        chosen: Optional[RequestState] = None
        preempted: Optional[int] = None
        for cand in sorted(candidates, key=self._schedule_key):
            preempted = self._ensure_capacity(cand)
            if cand.admitted:
                chosen = cand
                break
        if chosen is None:
            if DEBUG:
                print('nothing can run at', self.clock)
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
        event: Event = {
            'request_id': chosen.request_id,
            'phase': 'prefill' if action == 'prefill_to_decode' else 'decode',
            'action': action,
            'prompt_len': chosen.prompt_len,
            'generated_len': chosen.generated_len,
            'max_new_tokens': chosen.max_new_tokens,
            'wait_steps': chosen.wait_steps,
            'free_kv_blocks': self.free_kv_blocks,
            'preempted_request_id': preempted,
            'deadline_missed': chosen.deadline_step is not None
            and self.clock + 1 + self._remaining_steps(chosen) > chosen.deadline_step,
        }
        self.timeline.append(event)
        self.clock += 1
        if DEBUG:
            print(f'step {self.clock}: {event}')
        log.debug('event %s', event)
        return event

    def _events(self, max_steps: int) -> Iterator[Event]:
        for _ in range(max_steps):
            event = self.step()
            if event is None:
                return
            yield event

    def run(self, max_steps: int = 100) -> List[Event]:
        """Step until done or max_steps."""
        if max_steps < 0:
            raise ValueError('max_steps')
        new = list(self._events(max_steps))
        assert len(new) <= max_steps
        return self.timeline[:]
