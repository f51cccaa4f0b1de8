"""`simulate`: replay a trace with a Numba kernel and wrap the arrays it returns.

The kernels (`decodesched.kernels`) take and return plain arrays; this module validates input,
allocates the outputs, and turns them into tables, metrics and files.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from . import metrics as _metrics
from ._io import interruptible
from .errors import UserError
from .policy import Policy, policy_name, replay_interval
from .kernels import enums as E
from .kernels.fields import KERNEL_TRACE_ARGS
from .model import is_integer
from .trace import INT64_MAX, MAX_TOTAL, Trace, _read_only, load_trace, plain_value, show, writable_base

POLICIES = E.POLICY_NAMES
ENGINES = ("fast", "scan")

EVENT_COLUMNS = (
    "step",
    "request_id",
    "phase",
    "action",
    "prompt_len",
    "generated_len",
    "max_new_tokens",
    "wait_steps",
    "free_kv_blocks",
    "preempted_request_id",
    "deadline_missed",
)


def policy_code(policy) -> int:
    """The kernel's policy code of a built-in name or a `Policy` (`policy.CUSTOM_CODE` for a user's)."""
    if isinstance(policy, Policy):
        return policy.code
    if not isinstance(policy, str) or policy not in POLICIES:
        raise UserError(f"unknown policy {show(policy)}; choose one of {', '.join(POLICIES)}, "
                        "or pass a decodesched.Policy")
    return POLICIES.index(policy)


def integral_hint(value) -> str:
    """For a float that holds a whole number (``4000.0``, ``np.linspace``'s values): the int to give."""
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return f" (a float: give the int {int(value)}; for NumPy values .astype(int))"
    return ""


# The scheduler's integer settings: (the least allowed, its words; the most allowed or None, its words).
SETTING_RANGES = {
    "free_kv_blocks": (0, ">= 0", MAX_TOTAL, "<= 2**61"),
    "aging_interval": (1, "> 0", INT64_MAX, "<= 2**63 - 1"),  # (a kernel takes int64; none waits 2**61 steps)
    "max_steps": (0, ">= 0", None, ""),
}


def check_setting(setting: str, value, name: str | None = None) -> int:
    """`value` of the integer setting `setting` (`SETTING_RANGES`) as an int; a UserError naming it as `name`
    (default `setting`) for a value that is no integer (a float, a bool, a string) or outside its range."""
    name = name or setting
    if not is_integer(value):
        raise UserError(f"{name} must be an integer{' or None' if setting == 'max_steps' else ''}, got "
                        f"{show(plain_value(value))}{integral_hint(value)}")
    low, low_text, high, high_text = SETTING_RANGES[setting]
    if value < low:
        raise UserError(f"{name} must be {low_text}, got {show(int(value))}")
    if high is not None and value > high:
        raise UserError(f"{name} must be {high_text}, got {show(int(value))}")
    return int(value)


def check_config(policy, free_kv_blocks, aging_interval, max_steps) -> tuple[int, int, int, int]:
    """Validate one scheduler configuration (`policy`: a built-in name or a `Policy`); return
    (policy code, capacity, interval, max_steps or -1)."""
    code = policy_code(policy)
    capacity = check_setting("free_kv_blocks", free_kv_blocks)
    interval = check_setting("aging_interval", aging_interval)
    # (no replay runs more than 2**61 steps: beyond, it is no limit)
    limit = -1 if max_steps is None else min(check_setting("max_steps", max_steps), MAX_TOTAL)
    return code, capacity, interval, limit


def check_flag(name: str, value, *, none: bool = False) -> bool | None:
    """`value` if it is a bool (or NumPy bool; None too with `none`), else a `UserError`: a string such
    as ``"no"`` is truthy, so taking it would silently do the opposite of what was asked."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if none and value is None:
        return None
    raise UserError(f"{name} must be True or False{' or None' if none else ''}, got {show(value)}")


def trace_arrays(trace: Trace):
    """The trace arrays in the order every replay kernel takes them (`kernels.fields.TRACE_FIELDS`)."""
    return tuple(writable_base(trace.arrival_order if name == "order" else getattr(trace, name))
                 for name in KERNEL_TRACE_ARGS)


def event_capacity(trace: Trace, max_steps: int) -> int:
    """Worst-case number of events: every request's prefill and tokens, or max_steps if smaller."""
    cap = trace.work_steps
    return cap if max_steps < 0 else min(cap, max_steps)


def _memory_bytes() -> int | None:
    """This machine's physical memory, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def refuse_beyond_memory(what: str, need: int, hint: str = "") -> None:
    """Refuse (UserError), before building it, something of `need` bytes that cannot fit in this machine's
    memory (or in any NumPy array): a typo such as ``--replicates 100000000`` would otherwise build for
    minutes, then swap or die."""
    memory = _memory_bytes()
    if need > INT64_MAX or (memory is not None and need > memory):
        has = f" ({memory / 2**30:.3g} GiB)" if memory is not None else ""
        raise UserError(f"{what} would take at least {need / 2**30:.3g} GiB, more than this machine's memory{has}"
                        + (f"; {hint}" if hint else ""))


def zeros_within_memory(what: str, rows: int, cols: int, hint: str = "") -> np.ndarray:
    """A zeroed int64 array of `rows` x `cols`, or one UserError line when it cannot fit (`refuse_beyond_memory`)
    or the allocation fails all the same."""
    need = int(rows) * int(cols) * 8
    refuse_beyond_memory(what, need, hint)
    try:
        return np.zeros((rows, cols), dtype=np.int64)
    except MemoryError:
        raise UserError(f"no memory for {what} ({need / 2**30:.3g} GiB)" + (f"; {hint}" if hint else "")) from None


def event_log_buffer(n_events: int) -> np.ndarray:
    """The zeroed event-log array of `n_events` rows; a log that cannot fit in this machine's memory
    is refused (UserError) before the replay, rather than failing (or swapping) in it."""
    return zeros_within_memory(f"the event log of {_metrics.counted(n_events, 'row')}", n_events, E.EV_NCOLS,
                               "record fewer steps (max_steps, --max-steps) or none (record_events=False; on the "
                               "command line, leave out --events)")


def replay_kernel(engine: str, policy=None):
    """The replay kernel for `engine`, or a user `Policy`'s own kernel (which ignores `engine`)."""
    if not isinstance(engine, str) or engine not in ENGINES:
        raise UserError(f"unknown engine {show(engine)}; choose one of {', '.join(ENGINES)}")
    if isinstance(policy, Policy) and not policy.is_builtin:
        return policy.kernel()
    if engine == "scan":
        from .kernels.scan_nb import replay_scan_nb

        return replay_scan_nb
    from .kernels.fast_nb import replay_fast_nb

    return replay_fast_nb


def simulate(trace, policy="fixed_priority", free_kv_blocks: int = 1_000_000, aging_interval: int | None = None,
             max_steps: int | None = None, *, record_events: bool = True, engine: str = "fast") -> "SimulationResult":
    """Replay `trace` under one policy and capacity; return events, per-request results and metrics.

    `aging_interval` None (the default) is the interval the policy carries (``builtin("aging", 8)``),
    else 4; a policy that carries one and another given is a `UserError` (`policy.replay_interval`).

    `trace` is anything `load_trace` accepts.  With ``record_events=False`` no event log is kept
    (only per-request results and metrics), for traces whose log would not fit in memory.
    `engine` is ``"fast"`` (default) or ``"scan"`` (the readable baseline); both are exact.
    `policy` is a built-in name or a `decodesched.Policy`; a user policy always runs on its own
    build of the scan kernel (`Policy.kernel`), a built-in one exactly as its name.  Ctrl-C (a Jupyter
    interrupt) raises KeyboardInterrupt at once; the replay under way then finishes in the background.

    >>> r = simulate({"request_id": [7], "arrival_step": [2], "prompt_len": [3], "max_new_tokens": [2],
    ...               "priority": [0], "cache_hit": [False], "required_blocks": [1],
    ...               "deadline_step": [None], "preemptible": [True]}, free_kv_blocks=4)
    >>> [e["action"] for e in r.timeline()], r.requests["ttft"].tolist()
    (['prefill_to_decode', 'decode_one_step', 'finish'], [2.0])
    """
    trace = load_trace(trace)
    aging_interval = replay_interval(policy, aging_interval)
    code, capacity, interval, limit = check_config(policy, free_kv_blocks, aging_interval, max_steps)
    record_events = check_flag("record_events", record_events)
    kernel = replay_kernel(engine, policy)
    n_events = event_capacity(trace, limit) if record_events else 0
    events = event_log_buffer(n_events)
    req_out = np.zeros((len(trace), E.RQ_NCOLS), dtype=np.int64)
    summary = np.zeros(E.SM_NCOLS, dtype=np.int64)
    # (in a helper thread, so that Ctrl-C or a Jupyter interrupt reaches the caller at once, not after the replay)
    interruptible(lambda: kernel(*trace_arrays(trace), code, capacity, interval, limit, events, req_out, summary))
    if record_events:
        events = events[: summary[E.SM_EVENTS]]
    return SimulationResult(trace, policy_name(policy), capacity, interval, plain_value(max_steps),
                            events if record_events else None, req_out, summary)


# A notebook shows a result's metrics table at once up to this many requests (computing it takes ~1.5 s
# per million requests); beyond it only after `result.metrics` was asked for.
HTML_METRICS_MAX_REQUESTS = 200_000


@dataclass
class SimulationResult:
    """The outcome of one replay.

    ``event_log`` is the raw int64 (n_events, EV_NCOLS) array (None when not recorded),
    ``request_state`` the raw int64 (n, RQ_NCOLS) array; `events`, `requests` and `metrics`
    give them as named columns.
    """

    trace: Trace
    policy: str
    free_kv_blocks: int
    aging_interval: int
    max_steps: int | None
    event_log: np.ndarray | None
    request_state: np.ndarray
    summary: np.ndarray
    _cache: dict = field(default_factory=dict, repr=False)

    def __setstate__(self, state: dict) -> None:
        """Unpickled (a process pool's copy), its tables read-only again (`_frozen`)."""
        self.__dict__.update(state)
        for table in ("events", "requests"):
            if table in self.__dict__:
                self.__dict__[table] = _frozen(self.__dict__[table])

    @property
    def n_events(self) -> int:
        return int(self.summary[E.SM_EVENTS])

    @property
    def clock(self) -> int:
        return int(self.summary[E.SM_CLOCK])

    @property
    def final_free_kv_blocks(self) -> int:
        return int(self.summary[E.SM_FREE])

    @property
    def stop_reason(self) -> str:
        return E.STOP_NAMES[int(self.summary[E.SM_STOP])]

    def _describe(self) -> str:
        """What was replayed, from the trace and settings alone (nothing computed)."""
        return (f"{self.policy} on {self.trace.name!r} ({_metrics.counted(len(self.trace), 'request', ',')}), "
                f"free_kv_blocks="
                f"{self.free_kv_blocks:,}, aging_interval={self.aging_interval}, {self.n_events:,} steps, "
                f"clock {self.clock:,}, {self.stop_reason}")

    def __repr__(self) -> str:
        """One line; the generated repr printed every trace column and raw array (pages in a notebook)."""
        return f"<SimulationResult: {self._describe()}>"

    def __eq__(self, other) -> bool:
        """The same replay: equal traces (`Trace.__eq__`), policy name and settings (the aging interval only for
        "aging", the one policy whose replay it changes, as in `BatchResult.rows`), and equal raw results (the event
        log compared where both kept one); the generated comparison asked NumPy for the truth of a whole array
        and raised ValueError.  A result with an event log and one without are not equal."""
        if not isinstance(other, SimulationResult):
            return NotImplemented
        return self._same_outcome(other) and self.trace == other.trace

    __hash__ = None  # (mutable, as the generated class was)

    def _same_outcome(self, other: "SimulationResult") -> bool:
        """`__eq__` but for the traces (a `BatchResult` compares its traces once, not once per scenario)."""
        if (self.policy, self.free_kv_blocks, self.max_steps) != (other.policy, other.free_kv_blocks, other.max_steps):
            return False
        if self.policy == "aging" and self.aging_interval != other.aging_interval:
            return False
        if (self.event_log is None) != (other.event_log is None):
            return False
        arrays = [(self.request_state, other.request_state), (self.summary, other.summary)]
        if self.event_log is not None:
            arrays.append((self.event_log, other.event_log))
        return all(np.array_equal(a, b) for a, b in arrays)

    def _repr_html_(self) -> str:
        """Jupyter's display: the summary table (`metrics.summary_rows`), computed here only for a trace of at
        most `HTML_METRICS_MAX_REQUESTS` requests (else once `result.metrics` has been asked for)."""
        caption = f"SimulationResult: {self._describe()}"
        if "_kept_metrics" not in self.__dict__ and len(self.trace) > HTML_METRICS_MAX_REQUESTS:
            return _metrics.html_table(["metrics"], [["not computed yet: result.metrics computes them"]], caption)
        return _metrics.html_table(["metric", "value"], [list(r) for r in _metrics.summary_rows(self._kept_metrics)],
                                   caption)

    def _need_events(self) -> np.ndarray:
        if self.event_log is None:
            raise ValueError("this result kept no event log; run simulate(..., record_events=True), or for a "
                             "batch's result simulate_batch(..., record_events=True)")
        return self.event_log

    @cached_property
    def events(self) -> dict[str, np.ndarray]:
        """The event log as columns (SPEC section 4); ``preempted_request_id`` is 0 where ``has_victim`` is False."""
        ev = self._need_events()
        t = self.trace
        rows = ev[:, E.EV_ROW]
        victim = ev[:, E.EV_VICTIM_ROW]
        action = ev[:, E.EV_ACTION]
        return _frozen({
            "step": ev[:, E.EV_STEP],
            "request_id": t.request_id[rows],
            "phase": np.where(action == E.ACTION_PREFILL_TO_DECODE, "prefill", "decode"),
            "action": np.asarray(E.ACTION_NAMES)[action],
            "prompt_len": t.prompt_len[rows],
            "generated_len": ev[:, E.EV_GENERATED],
            "max_new_tokens": t.max_new_tokens[rows],
            "wait_steps": ev[:, E.EV_WAIT],
            "free_kv_blocks": ev[:, E.EV_FREE],
            "has_victim": victim != E.NO_ROW,
            "preempted_request_id": np.where(victim != E.NO_ROW, t.request_id[np.maximum(victim, 0)], 0),
            "deadline_missed": ev[:, E.EV_MISSED].astype(bool),
        })

    def timeline(self) -> list[dict]:
        """The event log as the seed's list of dicts (equal to `DecodeSchedulerSim.timeline`)."""
        ev = self.events
        out = []
        cols = [ev[c].tolist() for c in EVENT_COLUMNS[1:]]
        has_victim = ev["has_victim"].tolist()
        for i, values in enumerate(zip(*cols)):
            d = dict(zip(EVENT_COLUMNS[1:], values))
            if not has_victim[i]:
                d["preempted_request_id"] = None
            out.append(d)
        return out

    @cached_property
    def requests(self) -> dict[str, np.ndarray]:
        """One row per request: the trace columns plus the results of SPEC section 4.

        Step columns hold -1 where the event never happened; the derived `queue_wait`, `ttft`,
        `tpot` and `e2e` are float with NaN there; `deadline_met` is True/False for requests with a
        deadline (False if never finished) and False elsewhere, see `has_deadline`.
        """
        return _frozen(_metrics.request_table(self.trace, self.request_state, self.stop_reason))

    @cached_property
    def metrics(self) -> dict:
        """Aggregates of SPEC section 6 (in steps; see ``metrics["steps_per_second"]``): a copy of one's own, as
        `BatchResult.metrics` gives; the result's display (`_repr_html_`) and a batch's tables read the one kept,
        which an edit of this dict (a notebook flattening ``m["ttft"] = m["ttft"]["p50"]``) changed, or broke."""
        return copy.deepcopy(self._kept_metrics)

    @cached_property
    def _kept_metrics(self) -> dict:
        return _metrics.aggregate(self.trace, self.requests, self.n_events, self.clock)

    def write_events(self, path: str | os.PathLike) -> None:
        """Write the events table (docs/files.md) atomically: CSV for a ``.csv`` path or ``-``, Parquet
        for ``.parquet`` / ``.pq``; another name, or the file the trace was read from (or its
        ``.meta.json``), is a `UserError`."""
        from ._io import check_outputs, path_argument
        from .tables_io import write_events

        check_outputs([path_argument(path)], inputs=[self.trace.source])
        write_events(path, self._need_events(), self.trace)

    def write_requests(self, path: str | os.PathLike) -> None:
        """Write the requests table (docs/files.md) atomically, CSV or Parquet as `write_events`; the
        trace's own file (and its sidecar) is refused as a `write_events` path is."""
        from ._io import check_outputs, path_argument

        check_outputs([path_argument(path)], inputs=[self.trace.source])
        _metrics.write_request_table(path, self.requests)

    def to_pandas(self, table: str = "requests"):
        """The ``"requests"`` or ``"events"`` table as a pandas DataFrame (see `decodesched.frames`)."""
        from .frames import to_frame

        return to_frame(self, table)


def _frozen(table: dict) -> dict:
    """`table`'s columns as read-only views, as a checked trace's columns: a column of `events` or `requests` edited
    in place (``ev["step"] -= 1``) changed the result itself (most columns view its raw arrays), its ``==``, the
    files written and the metrics computed after; a batch's result, the batch.  NumPy now says "assignment
    destination is read-only"; ``.copy()`` gives an array of one's own.  (The raw arrays, ``event_log``,
    ``request_state`` and ``summary``, stay as the kernels wrote them.)"""
    return {name: _read_only(np.asarray(values)) for name, values in table.items()}
