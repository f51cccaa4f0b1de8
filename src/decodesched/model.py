"""The pure-Python model: the seed's reference scheduler, readable, and the oracle for every engine.

`DecodeSchedulerSim` and `RequestState` have exactly the interface of the course chapter's
reference solution (``shared/seed/decode_scheduling_seed_zh.txt``) and the same semantics, step
for step.  The only addition is policy ``fcfs`` (SPEC, research issue): its sort key is
``(phase_rank, enqueue clock, request_id)`` and preemption compares business priority as under
``fixed_priority``.  `replay` extends the class to requests that arrive over time (SPEC section 3).

``policy`` may also be a `decodesched.Policy` (SPEC section 8): the sort key is then
``key(r, clock) + (request_id,)`` and the effective priority ``effective_priority(r, clock)``,
called through the functions' Python versions (``.py_func``) on a `RequestView` of the request
(``arrival_step`` is its enqueue clock).

Nothing here is fast on purpose: it is the text the kernels are checked against.
"""

from __future__ import annotations

import numbers
import sys
from dataclasses import dataclass
from typing import Dict, List, Literal

Phase = Literal["prefill", "decode"]
RequestStatus = Literal["waiting", "running", "preempted", "finished"]

POLICIES = ("fixed_priority", "aging", "deadline", "fcfs")
NO_DEADLINE_SLACK = 1_000_000_000
DEFAULT_AGING_INTERVAL = 4  # the seed's default


@dataclass
class RequestState:
    """The minimal state of one request while it is scheduled (seed field order and defaults)."""

    request_id: int
    prompt_len: int
    max_new_tokens: int
    generated_len: int = 0
    phase: Phase = "prefill"
    priority: int = 0
    cache_hit: bool = False
    wait_steps: int = 0
    required_blocks: int = 1
    admitted: bool = False
    deadline_step: int | None = None
    preemptible: bool = True
    status: RequestStatus = "waiting"
    preemptions: int = 0
    # Not in the seed: the clock at enqueue, the arrival order used by policy ``fcfs``.
    enqueue_clock: int = 0

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.generated_len

    @property
    def done(self) -> bool:
        return self.generated_len >= self.max_new_tokens


# Why a NumPy integer overflow in a policy's Python version is refused (`DecodeSchedulerSim._policy_call`, `Policy`).
NUMPY_OVERFLOW_HINT = ("compiled code wraps around where NumPy refuses or wraps at its type's width (and computes "
                       "small integers in int64), so the replay would differ; compute in int64 (np.int64(...) or "
                       "Python ints), inside int64")


class DecodeSchedulerSim:
    """Advance one request per step between prefill and decode, and record every event."""

    def __init__(self, policy: str = "fixed_priority", free_kv_blocks: int = 1_000_000,
                 aging_interval: int | None = None):
        # (the seed's default is 4: None is 4 too, unless the policy carries its own, `policy.replay_interval`)
        free_kv_blocks = _whole(free_kv_blocks, "free_kv_blocks")
        aging_interval = _whole(aging_interval, "aging_interval", none=True)
        custom = _custom_policy(policy)
        if custom is None and (not isinstance(policy, str) or policy not in POLICIES):
            from .trace import show

            raise ValueError(
                f"policy 必须是 {', '.join(POLICIES)} 之一 / policy must be one of {', '.join(POLICIES)}"
                f"{_own_policy_hint(policy)}; got {show(policy)}"
            )
        if custom is not None:
            from .policy import replay_interval

            aging_interval = replay_interval(custom, aging_interval)
        elif aging_interval is None:
            aging_interval = DEFAULT_AGING_INTERVAL
        if free_kv_blocks < 0 or aging_interval <= 0:
            raise ValueError(
                "容量不能为负，aging_interval 必须为正数 / free_kv_blocks must be >= 0 and aging_interval > 0; "
                f"got free_kv_blocks={free_kv_blocks}, aging_interval={aging_interval}"
            )
        # A Policy's functions, in Python (SPEC section 8); None for the built-in names.
        self._key = self._priority = None
        if custom is not None:
            custom = custom.with_aging_interval(aging_interval)
            self._key = custom.key.py_func
            self._priority = custom.effective_priority.py_func
        self.policy = policy
        self.free_kv_blocks = free_kv_blocks
        self.aging_interval = aging_interval
        self.clock = 0
        self.queue: List[RequestState] = []
        self.timeline: List[Dict[str, int | str]] = []

    def enqueue(
        self,
        request_id: int,
        prompt_len: int,
        max_new_tokens: int = 2,
        priority: int = 0,
        cache_hit: bool = False,
        required_blocks: int = 1,
        deadline_step: int | None = None,
        preemptible: bool = True,
    ) -> None:
        """Validate and register a request; it starts in prefill, waiting."""
        request_id, prompt_len, max_new_tokens, priority, required_blocks = (
            _whole(v, n) for v, n in ((request_id, "request_id"), (prompt_len, "prompt_len"),
                                      (max_new_tokens, "max_new_tokens"), (priority, "priority"),
                                      (required_blocks, "required_blocks")))
        deadline_step = _whole(deadline_step, "deadline_step", none=True)
        cache_hit, preemptible = _flag(cache_hit, "cache_hit"), _flag(preemptible, "preemptible")
        if request_id in {item.request_id for item in self.queue}:
            raise ValueError(f"重复的 request_id / duplicate request_id: {request_id}")
        if prompt_len <= 0 or max_new_tokens <= 0 or required_blocks <= 0:
            raise ValueError(
                "prompt_len、max_new_tokens 和 required_blocks 必须为正数 / prompt_len, max_new_tokens and "
                f"required_blocks must be positive; got {prompt_len}, {max_new_tokens}, {required_blocks}"
            )
        if deadline_step is not None and deadline_step <= self.clock:
            raise ValueError(
                f"deadline_step 必须晚于当前调度时钟 / deadline_step {deadline_step} must be after the clock {self.clock}"
            )
        self.queue.append(
            RequestState(
                request_id=request_id,
                prompt_len=prompt_len,
                max_new_tokens=max_new_tokens,
                priority=priority,
                cache_hit=cache_hit,
                required_blocks=required_blocks,
                deadline_step=deadline_step,
                preemptible=preemptible,
                enqueue_clock=self.clock,
            )
        )

    def _view(self, req: RequestState):
        """`req` as a policy's `RequestView` (SPEC section 8)."""
        from .kernels.scan_nb import RequestView

        deadline = req.deadline_step is not None
        return RequestView(req.request_id, req.enqueue_clock, req.prompt_len, req.max_new_tokens, req.generated_len,
                           0 if req.phase == "prefill" else 1, req.priority, int(req.cache_hit), req.wait_steps,
                           req.deadline_step if deadline else 0, int(deadline), int(req.preemptible),
                           req.preemptions, int(req.admitted))

    def _effective_priority(self, req: RequestState) -> int:
        """Business priority, plus one level per `aging_interval` waited steps under ``aging``."""
        if self._priority is not None:
            return self._policy_call("effective_priority", self._priority, req)
        effective_priority = req.priority
        if self.policy == "aging":
            effective_priority += req.wait_steps // self.aging_interval
        return effective_priority

    def _policy_call(self, what: str, fn, req: RequestState):
        """What a `Policy` function (`fn`, its Python version) returns for `req`, checked by `_policy_value`.  It runs
        with NumPy's integer overflow raising (`step`): NumPy's fixed-width arithmetic wraps around at its type's
        width in Python (``np.int32(a) * np.int32(b)``), where compiled code computes it in int64, so the replay
        would differ without a word (and NumPy's warning would land on stderr)."""
        try:
            value = fn(self._view(req), self.clock)
        except (FloatingPointError, OverflowError) as exc:  # (OverflowError: np.int8(300); compiled wraps)
            from .errors import UserError

            raise UserError(f"policy {self.policy.name!r}: {what}(r, clock) overflowed a NumPy integer in Python (the "
                            f"model) for request {req.request_id} at clock {self.clock} ({exc}): "
                            f"{NUMPY_OVERFLOW_HINT}") from exc
        return self._policy_value(what, req, value)

    def _policy_value(self, what: str, req: RequestState, value):
        """`value`, what a `Policy` function returned in Python for `req`: a tuple of integers (`key`) or an integer,
        a Python int within int64; anything else is a `UserError`.  The compiled function returns int64 there (`Policy`
        checks its type), so a float or bool that only the Python version gives (``2 ** -1``: 0.5, where compiled
        code gives 0), or a Python int past int64 (``r.priority * 1024`` at priority 2**53: 2**63, where compiled
        code wraps around to -2**63), would make the model and the replay disagree without a word."""
        items = value if what == "key" and isinstance(value, tuple) else (value,) if what != "key" else None
        if items is None or not all(is_integer(v) for v in items):
            from .errors import UserError

            want = "a tuple of integers" if what == "key" else "an integer"
            raise UserError(f"policy {self.policy.name!r}: {what}(r, clock) returned {value!r} in Python (the model) "
                            f"for request {req.request_id} at clock {self.clock}, not {want}; the compiled function "
                            "returns integers, so the replay would differ (an integer power with a negative "
                            "exponent is a float in Python: keep to +, -, *, // and %)")
        if any(isinstance(v, int) and not -2**63 <= v < 2**63 for v in items):  # (NumPy overflow: `_policy_call`)
            from .errors import UserError

            raise UserError(f"policy {self.policy.name!r}: {what}(r, clock) returned {value!r} in Python (the model) "
                            f"for request {req.request_id} at clock {self.clock}, past int64, where the compiled "
                            "function wraps around, so the replay would differ; keep every value inside int64")
        return value

    def _remaining_steps(self, req: RequestState) -> int:
        return (1 if req.phase == "prefill" else 0) + max(req.max_new_tokens - req.generated_len, 0)

    def _schedule_key(self, req: RequestState) -> tuple:
        """The sort key, smallest first: slack, phase, cache, -effective priority, length, id."""
        if self._key is not None:
            return self._policy_call("key", self._key, req) + (req.request_id,)
        phase_rank = 0 if req.phase == "prefill" else 1
        if self.policy == "fcfs":
            return (phase_rank, req.enqueue_clock, req.request_id)
        deadline_slack = NO_DEADLINE_SLACK
        if self.policy == "deadline" and req.deadline_step is not None:
            deadline_slack = req.deadline_step - self.clock - self._remaining_steps(req)
        cache_rank = 0 if req.cache_hit else 1
        return (deadline_slack, phase_rank, cache_rank, -self._effective_priority(req), req.total_len, req.request_id)

    def _ensure_capacity(self, challenger: RequestState) -> int | None:
        """Admit `challenger`, preempting at most one lower-priority preemptible request if needed.

        Returns the preempted request's id, or None.  On failure nothing changes and
        `challenger.admitted` stays False.
        """
        if challenger.admitted:
            challenger.status = "running"
            return None
        if challenger.required_blocks <= self.free_kv_blocks:
            self.free_kv_blocks -= challenger.required_blocks
            challenger.admitted = True
            challenger.status = "running"
            return None
        challenger_priority = self._effective_priority(challenger)
        victims = [
            req
            for req in self.queue
            if req.admitted and not req.done and req.preemptible and self._effective_priority(req) < challenger_priority
        ]
        victims.sort(key=lambda req: (self._effective_priority(req), -req.required_blocks, req.request_id))
        victim = next((req for req in victims if self.free_kv_blocks + req.required_blocks >= challenger.required_blocks), None)
        if victim is None:
            return None
        # The victim keeps its phase and progress; it only gives its blocks back.
        victim.admitted = False
        victim.status = "preempted"
        victim.preemptions += 1
        self.free_kv_blocks += victim.required_blocks
        self.free_kv_blocks -= challenger.required_blocks
        challenger.admitted = True
        challenger.status = "running"
        return victim.request_id

    def step(self) -> Dict[str, int | str] | None:
        """Choose and advance one unfinished request; record the event.  None if nothing can run."""
        if self._key is None:
            return self._step()
        import numpy as np

        with np.errstate(over="raise"):  # (a policy's NumPy arithmetic: `_policy_call`; once a step, not a call)
            return self._step()

    def _step(self) -> Dict[str, int | str] | None:
        candidates = [req for req in self.queue if not req.done]
        if not candidates:
            return None
        chosen = None
        preempted_request_id = None
        for candidate in sorted(candidates, key=self._schedule_key):
            preempted_request_id = self._ensure_capacity(candidate)
            if candidate.admitted:
                chosen = candidate
                break
        if chosen is None:
            return None
        for req in candidates:
            if req is not chosen:
                req.wait_steps += 1
        if chosen.phase == "prefill":
            chosen.phase = "decode"
            action = "prefill_to_decode"
        else:
            chosen.generated_len += 1
            action = "finish" if chosen.done else "decode_one_step"
            if chosen.done and chosen.admitted:
                self.free_kv_blocks += chosen.required_blocks
                chosen.admitted = False
                chosen.status = "finished"

        event = {
            "request_id": chosen.request_id,
            "phase": "prefill" if action == "prefill_to_decode" else "decode",
            "action": action,
            "prompt_len": chosen.prompt_len,
            "generated_len": chosen.generated_len,
            "max_new_tokens": chosen.max_new_tokens,
            "wait_steps": chosen.wait_steps,
            "free_kv_blocks": self.free_kv_blocks,
            "preempted_request_id": preempted_request_id,
            "deadline_missed": chosen.deadline_step is not None
            and self.clock + 1 + self._remaining_steps(chosen) > chosen.deadline_step,
        }
        self.timeline.append(event)
        self.clock += 1
        return event

    def run(self, max_steps: int = 100) -> List[Dict[str, int | str]]:
        """Step until every request is finished or `max_steps` steps ran; return the timeline."""
        max_steps = _whole(max_steps, "max_steps")
        if max_steps < 0:
            raise ValueError(f"max_steps 不能为负数 / max_steps must be >= 0; got {max_steps}")
        steps = 0
        while steps < max_steps:
            event = self.step()
            if event is None:
                break
            steps = steps + 1
        return self.timeline


def is_integer(value) -> bool:
    """Whether `value` is an integer argument's value: an int, a NumPy integer (any `numbers.Integral`), but not a
    bool (Python's or NumPy's) nor a NumPy timedelta64, which NumPy counts as an integer: ``np.timedelta64(4)``
    was taken as 4 and ``np.timedelta64(4, "D")`` raised int()'s TypeError, naming no argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return False
    np = sys.modules.get("numpy")  # (not imported: the value is no NumPy timedelta; the model imports no NumPy)
    return np is None or not isinstance(value, np.timedelta64)


def _whole(value, name: str, none: bool = False):
    """`value` of integer argument `name` as a Python int (None too with `none`); a `UserError` (a ValueError, as
    the seed's own refusals) naming it for anything else: a bool, a float (NaN, inf or 3.0), a string, which the
    seed took and ran on (``prompt_len=nan`` in the events).  A NumPy integer becomes the Python int it holds:
    NumPy's fixed-width arithmetic wraps around (an int8 priority of 127 that waited one step under ``aging``
    became -128), Python's and the kernels' int64 (within the trace limits) do not."""
    if none and value is None:
        return None
    if is_integer(value):
        return int(value)
    from .engine import integral_hint
    from .errors import UserError
    from .trace import plain_value, show

    raise UserError(f"{name} 必须是整数 / {name} must be an integer{' or None' if none else ''}, "
                    f"got {show(plain_value(value))}{integral_hint(value)}")


def _flag(value, name: str) -> bool:
    """`value` of flag `name` as a bool: True/False (NumPy's too) or 1/0, as a trace column takes them; a
    `UserError` otherwise (a string such as ``"no"`` is truthy: taken, it did the opposite of what was asked)."""
    import numpy as np

    if isinstance(value, (bool, np.bool_)) or (is_integer(value) and value in (0, 1)):
        return bool(value)
    from .errors import UserError
    from .trace import show

    raise UserError(f"{name} 必须是 True 或 False / {name} must be True or False (or 1/0), got {show(value)}")


def _custom_policy(policy):
    """`policy` if it is a `decodesched.Policy`, else None (the model imports it only then)."""
    if isinstance(policy, str):
        return None
    from .policy import Policy

    return policy if isinstance(policy, Policy) else None


def _own_policy_hint(policy) -> str:
    """For a function given where a policy goes: a policy of one's own is a `decodesched.Policy`."""
    if not callable(policy):
        return ""
    return (", or a decodesched.Policy (a function alone is not a policy: "
            "Policy(name, key=@njit fn, effective_priority=@njit fn))")


def _trace_rows(rows) -> list:
    """`replay`'s rows as dicts: a sequence of dicts (or named tuples), or what `simulate` takes as well,
    a `decodesched.Trace`, the path of a trace file, a mapping of columns or a pandas DataFrame (read
    with `load_trace`, validated)."""
    import os
    from collections.abc import Mapping

    from .trace import Trace, load_trace

    if isinstance(rows, (str, os.PathLike, Mapping)) or hasattr(rows, "columns"):  # (columns: a DataFrame)
        rows = load_trace(rows)
    if isinstance(rows, Trace):
        return rows.rows()
    return [r._asdict() if hasattr(r, "_asdict") else dict(r) for r in rows]


@dataclass
class ModelReplay:
    """What `replay` returns: the seed's events (with ``step`` added), the final states and why it stopped."""

    events: List[Dict[str, int | str | bool | None]]
    states: Dict[int, RequestState]  # by trace row; rows that never arrived are absent
    clock: int
    free_kv_blocks: int
    stop: str  # "drained", "stuck" or "max_steps"


def replay(rows, policy: str = "fixed_priority", free_kv_blocks: int = 1_000_000, aging_interval: int | None = None,
           max_steps: int | None = None) -> ModelReplay:
    """Replay a trace over `DecodeSchedulerSim` exactly as SPEC section 3 defines it.

    `rows` is a sequence of dicts (or objects with a ``_asdict``) with the trace columns:
    ``request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit, required_blocks,
    deadline_step (int or None), preemptible``; or, as for `decodesched.simulate`, a loaded
    `decodesched.Trace` (its ``rows()``), the path of a trace file, a mapping of columns or a DataFrame.
    """
    max_steps = _whole(max_steps, "max_steps", none=True)
    if max_steps is not None and max_steps < 0:
        raise ValueError(f"max_steps 不能为负数 / max_steps must be >= 0; got {max_steps}")
    rows = _trace_rows(rows)
    sim = DecodeSchedulerSim(policy=policy, free_kv_blocks=free_kv_blocks, aging_interval=aging_interval)
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["arrival_step"], i))
    states: Dict[int, RequestState] = {}
    events = []
    pos = 0
    steps = 0
    while True:
        if max_steps is not None and steps >= max_steps:
            stop = "max_steps"
            break
        while pos < len(order) and rows[order[pos]]["arrival_step"] <= sim.clock:
            row = rows[order[pos]]
            sim.enqueue(
                request_id=row["request_id"],
                prompt_len=row["prompt_len"],
                max_new_tokens=row["max_new_tokens"],
                priority=row["priority"],
                cache_hit=row["cache_hit"],
                required_blocks=row["required_blocks"],
                deadline_step=row["deadline_step"],
                preemptible=row["preemptible"],
            )
            states[order[pos]] = sim.queue[-1]
            pos += 1
        clock = sim.clock
        event = sim.step()
        if event is not None:
            events.append({"step": clock, **event})
            steps += 1
            continue
        if pos < len(order):
            # An idle gap: jump to the next arrival; nobody waits during it.
            sim.clock = rows[order[pos]]["arrival_step"]
            continue
        stop = "drained" if all(s.done for s in states.values()) else "stuck"
        break
    return ModelReplay(events=events, states=states, clock=sim.clock, free_kv_blocks=sim.free_kv_blocks, stop=stop)
