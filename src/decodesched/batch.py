"""Batches of scenarios: many (trace, policy, capacity, aging interval) replays in one parallel call.

The public entry points are `Scenario`, `grid` and `simulate_batch`; `BatchResult` gives each
scenario back as a `SimulationResult` (`result(i)`) or as one flat row of metrics (`rows()`), and
`write_metrics_csv` writes those rows.  Every scenario's result is identical to `simulate` run on
it alone, for any thread count and either backend.

>>> trace = {"request_id": [1, 2], "arrival_step": [0, 0], "prompt_len": [4, 2],
...          "max_new_tokens": [3, 1], "priority": [0, 5], "cache_hit": [False, True],
...          "required_blocks": [2, 2], "deadline_step": [None, 9], "preemptible": [True, True]}
>>> batch = simulate_batch([trace], grid(1, ["fixed_priority", "fcfs"], [2, 4], [4]))
>>> [(s.policy, s.free_kv_blocks) for s in batch.scenarios]
[('fixed_priority', 2), ('fixed_priority', 4), ('fcfs', 2), ('fcfs', 4)]
>>> [row["finished"] for row in batch.rows()]
[2, 2, 2, 2]

Stable surface (other modules, e.g. `decodesched.distributed`, build on it): ``Scenario(trace,
policy, free_kv_blocks, aging_interval, max_steps=None, replicate=0)``, ``grid(traces, policies,
kv_blocks, aging_intervals, max_steps=None, replicates=1)``, ``replicate_traces(traces, n, rules)``,
``simulate_batch(traces, scenarios, *, record_events=False, threads=None, backend="cpu",
engine="fast", progress=False)``, ``BatchResult.result(i)``,
``BatchResult.rows()``, ``ROW_KEYS``, ``row_columns(rows)`` and ``write_metrics_csv(rows, path)``.
A scenario's policy is a built-in name or a `decodesched.Policy` (`policy_name`, `uses_aging_interval`).
"""

from __future__ import annotations

import copy
import csv
import itertools
import math
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import metrics as _metrics
from ._io import Progress, atomic_writer
from .engine import (ENGINES, SimulationResult, check_config, check_flag, check_setting, event_capacity,
                     event_log_buffer, integral_hint, plain_value, policy_code, refuse_beyond_memory, replay_kernel,
                     trace_arrays, zeros_within_memory)
from .errors import UserError
from .kernels import enums as E
from .model import is_integer
from .policy import Policy, check_distinct, in_jupyter, policy_name, replay_interval
from .trace import Trace, load_trace, show

BACKENDS = ("cpu", "cuda")
# The scenario columns of a metrics row, then its trace's load and time scale, then `metrics.FLAT_COLUMNS`
# (with seconds twins and per-class columns after them, see `metrics.flat_metrics` and `row_columns`).
SCENARIO_KEYS = ("trace", "replicate", "policy", "kv_blocks", "aging_interval")
TRACE_KEYS = ("offered_load", "steps_per_second")
HTML_ROWS = 20  # the scenarios a notebook shows of a longer batch: its first and last ten
ROW_KEYS = SCENARIO_KEYS + TRACE_KEYS + _metrics.FLAT_COLUMNS
# The seeded rules of `decodesched.convert.to_trace` that a replicate redraws.
SEEDED_OPTIONS = ("priority_classes", "priority_weights", "deadline_fraction", "slo_factor", "protected_classes")


def uses_aging_interval(policy) -> bool:
    """Whether a replay's result depends on the aging interval: the built-in "aging" does, the other
    built-ins do not, a `decodesched.Policy` says so in ``uses_aging_interval``."""
    return policy == "aging" if isinstance(policy, str) else bool(getattr(policy, "uses_aging_interval", False))


@dataclass(frozen=True)
class Scenario:
    """One replay configuration: which trace (an index into the batch's traces) and the scheduler.

    ``max_steps`` None means no limit.  ``replicate`` only labels the row: which redraw of the
    trace's seeded classes and deadlines `Scenario.trace` points at (see `replicate_traces`).
    ``aging_interval`` None (the default) becomes the interval the policy carries, else 4; a policy
    that carries one and another given is a `UserError` (`decodesched.policy.replay_interval`).
    """

    trace: int
    policy: str | Policy  # a built-in name or a decodesched.Policy
    free_kv_blocks: int
    aging_interval: int | None = None
    max_steps: int | None = None
    replicate: int = 0

    def __post_init__(self):
        object.__setattr__(self, "aging_interval", replay_interval(self.policy, self.aging_interval))


class ScenarioError(UserError):
    """A scenario's replay failed (a user policy's function raised, or its kernel did not compile): the policy's own
    line, as `simulate` gives it, with the scenario it failed in (`index` in the batch, `where`: its trace, capacity
    and interval) for a sweep's runner to name (`in_sweep`), where the batch that ran it was one chunk.  It pickles
    (a Dask worker sends it)."""

    def __init__(self, reason: str, index: int, where: str):
        self.reason, self.index, self.where = reason, int(index), where
        super().__init__(self._line(self.index))

    def __reduce__(self):
        return type(self), (self.reason, self.index, self.where)

    def _line(self, index: int) -> str:
        return f"scenario {index} ({self.where}): {self.reason}"

    def in_sweep(self, index: int) -> UserError:
        """The line a sweep gives: ``scenario INDEX (trace, capacity, interval): <the policy's line>``, INDEX the
        scenario's in the sweep (the batch's own line names its index in the batch, one chunk of the sweep)."""
        return UserError(self._line(index))


def grid(traces, policies: Sequence, kv_blocks: Sequence[int], aging_intervals: Sequence[int] | None,
         max_steps: int | None = None, replicates: int = 1) -> list[Scenario]:
    """Every combination, in the order trace, replicate, policy, capacity, aging interval (the last
    varies fastest); the aging interval varies only for policies whose result depends on it
    (`uses_aging_interval`), the others run once, at the first interval.  `aging_intervals` None is
    each policy's own interval (``builtin("aging", 8)``: 8), else 4; a policy that carries an interval
    and an axis that holds another is a `UserError` (give the name ``"aging"`` to vary it).

    `traces` is the number of traces or the traces themselves (only their count is used; a generator or
    other one-pass iterator is refused, as counting it would use it up).  With
    `replicates` N > 1, give `simulate_batch` the traces of ``replicate_traces(traces, N)``: scenario
    trace indices count N per trace.

    >>> [(s.trace, s.policy, s.free_kv_blocks, s.aging_interval) for s in grid(1, ["aging"], [8, 16], [2])]
    [(0, 'aging', 8, 2), (0, 'aging', 16, 2)]
    >>> len(grid(2, ["aging", "fcfs", "deadline"], [8, 16], [1, 2, 4]))  # 2 x 2 x (3 + 1 + 1)
    20
    """
    if isinstance(traces, (bool, np.bool_, float, np.floating)) or traces is None or (
            is_integer(traces) and traces < 0):
        raise UserError(f"grid: traces must be the number of traces (an integer >= 0) or the traces, "
                        f"got {show(traces)}")
    if isinstance(traces, Iterator):  # (counted here, it would be used up: simulate_batch would get no trace)
        raise UserError(f"grid: traces is a one-pass iterator ({type(traces).__name__}), which grid would use up "
                        "counting it; make it a list first (traces = list(...)) and give that list to grid and "
                        "simulate_batch")
    n_traces = int(traces) if is_integer(traces) else len(_as_list(traces))
    replicates = _check_replicates(replicates)
    policies, kv_blocks, intervals = (_grid_axis(name, v) for name, v in (
        ("policies", policies), ("kv_blocks", kv_blocks),
        ("aging_intervals", [None] if aging_intervals is None else aging_intervals)))
    if not intervals:
        raise UserError("grid needs at least one aging interval (or None: each policy's own)")
    # Each value as `simulate` takes it, refused now rather than when `simulate_batch` runs the grid.
    for name, setting, values in (("kv_blocks", "free_kv_blocks", kv_blocks),
                                  ("aging_intervals", "aging_interval", intervals)):
        for v in values:
            if v is None and name == "aging_intervals" and aging_intervals is None:
                continue
            if not is_integer(v):
                raise UserError(f"grid: {name} must hold integers, got {show(plain_value(v))}{integral_hint(v)}")
            check_setting(setting, v, f"grid: {name}")
    if max_steps is not None:
        check_setting("max_steps", max_steps, "grid: max_steps")
    for p in policies:
        try:
            policy_code(p)
        except UserError as exc:
            raise UserError(f"grid: {exc}") from None
    _check_grid_distinct(policies, kv_blocks, intervals)
    refuse_beyond_memory("the grid's scenarios",
                          grid_size(n_traces, policies, kv_blocks, intervals, replicates) * _SCENARIO_BYTES)
    for p in policies:
        for k in intervals if uses_aging_interval(p) else ():
            replay_interval(p, k, "the grid's aging interval")  # (one line now, not a Scenario's later)
    out = []
    for t, r, p, c in itertools.product(range(n_traces), range(replicates), policies, kv_blocks):
        for k in (intervals if uses_aging_interval(p) else intervals[:1]):
            out.append(Scenario(int(t) * replicates + r, p, c, k, max_steps, r))
    return out


def _check_grid_distinct(policies: list, kv_blocks: list, intervals: list) -> None:
    """Refuse a value given twice on one axis of `grid`, as ``decodesched sweep`` does: it would only make
    rows that are the same scenario twice (a sweep's table, CSV and report know a scenario by these values).
    Refused rather than dropped, so that the scenarios are always the product of the axes as given."""
    try:
        check_distinct(policies)
    except UserError as exc:
        raise UserError(f"grid: {exc}") from None
    for name, values in (("kv_blocks", kv_blocks), ("aging_intervals", intervals)):
        twice = [v for v, n in Counter(values).items() if n > 1]
        if twice:
            raise UserError(f"grid: {name} holds {show(plain_value(twice[0]))} twice; give each value once")


def _check_replicates(replicates) -> int:
    """`replicates` as a Python int (a NumPy int8 would wrap around in the trace indices); a UserError unless
    it is a positive integer."""
    if not is_integer(replicates) or replicates < 1:
        raise UserError(f"replicates must be a positive integer, got {show(replicates)}")
    return int(replicates)


def grid_size(n_traces: int, policies: Sequence, kv_blocks: Sequence, aging_intervals: Sequence,
              replicates: int = 1) -> int:
    """How many scenarios `grid` makes of these axes (without making them)."""
    per_trace = sum(len(aging_intervals) if uses_aging_interval(p) else 1 for p in policies) * len(kv_blocks)
    return int(n_traces) * int(replicates) * per_trace


def check_sweep_fits(n_scenarios: int) -> None:
    """Refuse a sweep whose result rows (one dict of metrics per scenario) cannot fit in memory."""
    refuse_beyond_memory(f"the result rows of {_metrics.counted(n_scenarios, 'scenario')}",
                         n_scenarios * _RESULT_ROW_BYTES)


# What a Trace (its object and ten arrays), one of its rows (ten columns and the arrival order), one
# Scenario and one scenario's result row (`BatchResult.rows`: a dict of ~100 metrics) take, at least.
_TRACE_BYTES = 2048
_TRACE_ROW_BYTES = 80
_SCENARIO_BYTES = 200
_RESULT_ROW_BYTES = 8192


def _grid_axis(name: str, values) -> list:
    """One axis of `grid` as a list: a sequence of values, not one value (nor a string, whose
    characters would each become a scenario)."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable) or getattr(values, "ndim", 1) == 0:
        raise UserError(f"grid: {name} must be a list of values (e.g. [{show(values)}]), got {show(values)}")
    return list(values)


def replicate_traces(traces, replicates: int, rules: Sequence[dict | None] | None = None) -> list[Trace]:
    """Each trace `replicates` times, in order (trace 0's replicates first): replicate 0 is the trace
    itself, replicate r > 0 redraws its priority classes, deadlines and preemptibility by the seeded
    rules of `decodesched.convert.to_trace` with seed ``seed + r``; arrivals, lengths, blocks, cache
    hits, ids and time scale are kept.

    `rules`, one per trace (or None): ``seed`` and the `SEEDED_OPTIONS` it was converted with (a
    converted trace's ``.meta.json`` holds them; `convert_rules` reads them); missing keys take
    `to_trace`'s defaults (seed 0).

    >>> t = load_trace({"request_id": [1, 2, 3], "arrival_step": [0, 1, 2], "prompt_len": [4, 2, 2],
    ...     "max_new_tokens": [3, 1, 2], "priority": [0, 0, 0], "cache_hit": [False, True, False],
    ...     "required_blocks": [2, 2, 1], "deadline_step": [None, 9, None], "preemptible": [True, True, True]})
    >>> a, b = replicate_traces([t], 2)
    >>> a is t, b.arrival_step.tolist() == t.arrival_step.tolist(), set(b.priority.tolist()) <= {0, 1, 2}
    (True, True, True)
    """
    from .convert import RawTrace, to_trace

    traces = [load_trace(t) for t in _as_list(traces)]
    replicates = _check_replicates(replicates)
    rules = list(rules) if rules is not None else [None] * len(traces)
    if len(rules) != len(traces):
        raise UserError(f"replicate_traces needs one rules entry per trace ({len(traces)}), got {len(rules)}")
    refuse_beyond_memory(f"{_metrics.counted(replicates, 'replicate')} of {_metrics.counted(len(traces), 'trace')}",
                          replicates * sum(_TRACE_BYTES + len(t) * _TRACE_ROW_BYTES for t in traces))
    out = []
    for trace, rule in zip(traces, rules):
        if rule is not None and not isinstance(rule, Mapping):
            raise UserError(f"replicate_traces: each rules entry is a dict (or None), got {show(rule)}")
        rule = dict(rule or {})
        options = {k: rule[k] for k in SEEDED_OPTIONS if k in rule}
        seed = rule.get("seed") or 0
        if not is_integer(seed) or seed < 0:
            raise UserError(f"trace {trace.name!r}: its replicate rules (a converted trace's .meta.json "
                            f"options): the seed must be a whole number >= 0, got {show(seed)}")
        out.append(trace)
        # whole steps as seconds at 1 step per second: to_trace's floor gives the same arrival steps
        raw = RawTrace(trace.arrival_step.astype(np.float64), trace.prompt_len, trace.max_new_tokens, trace.cache_hit)
        for r in range(1, replicates):
            try:
                drawn = to_trace(raw, steps_per_second=1.0, seed=int(seed) + r, **options)
            except UserError as exc:  # (rules read from a sidecar name the CLI's options)
                raise UserError(f"trace {trace.name!r}: its replicate rules (a converted trace's .meta.json "
                                f"options): {exc}") from None
            deadline = drawn.deadline_step.astype(object)
            deadline[~drawn.has_deadline] = None
            cols = dict(trace.columns())
            cols.update(priority=drawn.priority, deadline_step=deadline, preemptible=drawn.preemptible)
            out.append(load_trace(cols, steps_per_second=trace.steps_per_second, name=trace.name))
    return out


def convert_rules(meta: dict | None) -> dict | None:
    """The seed and seeded options a converted trace's sidecar (`decodesched.convert.read_meta`)
    records, as `replicate_traces` rules (None without a sidecar)."""
    if not meta:
        return None
    options = meta.get("options") if isinstance(meta.get("options"), dict) else {}
    rule = {k: options[k] for k in SEEDED_OPTIONS if k in options}
    rule["seed"] = meta.get("seed", options.get("seed", 0))
    return rule


def _as_list(traces) -> list:
    """A single trace (Trace, path, mapping of columns, DataFrame, list of row dicts) or a list of them."""
    if isinstance(traces, (Trace, str, os.PathLike, Mapping)) or hasattr(traces, "columns"):
        return [traces]
    if isinstance(traces, (list, tuple)) and traces and isinstance(traces[0], Mapping) and np.isscalar(
            traces[0].get("request_id", [])):
        return [traces]  # one trace given as row dicts
    try:
        return list(traces)
    except TypeError:  # (None, a number)
        raise UserError(f"traces must be a trace or a list of traces, got {show(traces)}") from None


def scenario_list(scenarios) -> list:
    """`scenarios` as a list; a UserError for one Scenario alone, or anything that is not a sequence of them."""
    if isinstance(scenarios, Scenario):
        raise UserError("scenarios must be a list of Scenario, got one Scenario (give [scenario])")
    if (isinstance(scenarios, (str, bytes, Mapping)) or not isinstance(scenarios, Iterable)
            or getattr(scenarios, "ndim", 1) == 0):  # (a 0-d array is Iterable, but "iteration over a 0-d array")
        raise UserError(f"scenarios must be a list of Scenario (decodesched.grid makes one), got {show(scenarios)}")
    return list(scenarios)


@dataclass
class BatchResult:
    """The outcome of `simulate_batch`: raw kernel arrays for every scenario, sliced on demand.

    ``request_state`` int64 (sum of the scenarios' trace lengths, RQ_NCOLS): scenario i owns rows
    ``req_start[i]:req_start[i + 1]``; ``event_log`` int64 (.., EV_NCOLS) likewise with
    ``event_start`` (None when events were not recorded); ``summary`` int64 (n_scenarios, SM_NCOLS).
    """

    traces: list[Trace]
    scenarios: list[Scenario]
    request_state: np.ndarray
    req_start: np.ndarray
    summary: np.ndarray
    event_log: np.ndarray | None
    event_start: np.ndarray | None
    backend: str = "cpu"
    threads: int = 1
    seconds: float = 0.0
    _metrics: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.scenarios)

    def __repr__(self) -> str:
        """One line; the generated repr printed every trace, every scenario and the raw arrays."""
        policies = ", ".join(dict.fromkeys(policy_name(sc.policy) for sc in self.scenarios))
        n, t, labels = len(self.scenarios), len(self.traces), self.trace_labels()
        names = ", ".join(map(_metrics.name_text, labels if t <= 3 else [*labels[:2], "...", labels[-1]]))
        return (f"<BatchResult: {_metrics.counted(n, 'scenario')} on {_metrics.counted(t, 'trace')} "
                f"({names}), policies {policies}; {self.backend}, {_metrics.counted(self.threads, 'thread')}, "
                f"{self.seconds:.1f} s>")

    def __eq__(self, other) -> bool:
        """Every scenario's result equal (`SimulationResult.__eq__`) and labelled alike (replicate, trace name), the
        batch's traces equal; how it ran (backend, threads, seconds) does not count.  The generated comparison asked
        NumPy for the truth of a whole array and raised ValueError."""
        if not isinstance(other, BatchResult):
            return NotImplemented
        if len(self) != len(other) or len(self.traces) != len(other.traces) or self.traces != other.traces:
            return False
        if [(sc.trace, sc.replicate) for sc in self.scenarios] != [(sc.trace, sc.replicate) for sc in other.scenarios]:
            return False
        return all(self.result(i)._same_outcome(other.result(i)) for i in range(len(self)))  # (traces compared above)

    __hash__ = None  # (mutable, as the generated class was)

    def _repr_html_(self) -> str:
        """Jupyter's display: a row per scenario (the first and last `HTML_ROWS` // 2 of a longer batch) with
        what the replay returned; no metrics are computed here (`to_pandas()` has them)."""
        labels = self.trace_labels()
        shown = range(len(self)) if len(self) <= HTML_ROWS else [*range(HTML_ROWS // 2),
                                                                  *range(len(self) - HTML_ROWS // 2, len(self))]
        header = ["", *SCENARIO_KEYS, "steps", "clock", "stop_reason"]
        rows = []
        for i in shown:
            sc, sm = self.scenarios[i], self.summary[i]
            interval = int(sc.aging_interval) if uses_aging_interval(sc.policy) else ""
            rows.append([i, labels[sc.trace], int(sc.replicate), policy_name(sc.policy), int(sc.free_kv_blocks),
                         interval, int(sm[E.SM_EVENTS]), int(sm[E.SM_CLOCK]), E.STOP_NAMES[int(sm[E.SM_STOP])]])
            if len(shown) < len(self) and i == HTML_ROWS // 2 - 1:
                rows.append(["..."] * len(header))
        return _metrics.html_table(header, rows,
                                   repr(self)[1:-1] + "; batch.to_pandas() for the metrics")

    def result(self, i: int) -> SimulationResult:
        """Scenario `i` as a `SimulationResult` (equal to `simulate` run on it alone); a negative `i`
        counts from the end, as in a list."""
        i = self._index(i)
        sc = self.scenarios[i]
        state = self.request_state[self.req_start[i]:self.req_start[i + 1]]
        summary = self.summary[i]
        events = None
        if self.event_log is not None:
            a = int(self.event_start[i])
            events = self.event_log[a:a + int(summary[E.SM_EVENTS])]
        return SimulationResult(self.traces[sc.trace], policy_name(sc.policy), int(sc.free_kv_blocks),
                                int(sc.aging_interval), plain_value(sc.max_steps), events, state, summary)

    def _index(self, i) -> int:
        """`i` as a scenario index from 0, or a TypeError or IndexError that says what the batch holds."""
        n = len(self.scenarios)
        if not is_integer(i):
            raise TypeError(f"a scenario is picked by its index, an integer; got {show(i)}")
        if not -n <= i < n:
            raise IndexError(f"scenario {int(i)} is out of range: the batch has {n} (0 to {n - 1})")
        return int(i) % n

    def metrics(self, i: int) -> dict:
        """The aggregate metrics of scenario `i` (SPEC section 6), computed once; a copy of one's own each call: the
        batch's `rows`, `to_pandas` and written tables read the one kept, which an edit of the dict given out (a
        notebook flattening ``m["ttft"] = m["ttft"]["p50"]``) changed, or broke."""
        return copy.deepcopy(self._kept_metrics(i))

    def _kept_metrics(self, i: int) -> dict:
        i = self._index(i)
        if i not in self._metrics:
            self._metrics[i] = self.result(i)._kept_metrics
        return self._metrics[i]

    def trace_labels(self) -> list[str]:
        """A name per trace (see the module function `trace_labels`)."""
        return trace_labels(self.traces, self.scenarios)

    def rows(self) -> list[dict]:
        """One dict per scenario: `SCENARIO_KEYS` (``aging_interval`` NaN for a policy that does not
        use it), `TRACE_KEYS` (``steps_per_second`` NaN without a time scale), then
        `metrics.flat_metrics` (per-class and seconds columns included)."""
        labels = self.trace_labels()
        loads = [_metrics.offered_load(t) for t in self.traces]
        out = []
        for i, sc in enumerate(self.scenarios):
            trace = self.traces[sc.trace]
            row = {"trace": labels[sc.trace], "replicate": int(sc.replicate), "policy": policy_name(sc.policy),
                   "kv_blocks": int(sc.free_kv_blocks),
                   "aging_interval": int(sc.aging_interval) if uses_aging_interval(sc.policy) else math.nan,
                   "offered_load": loads[sc.trace],
                   "steps_per_second": float(trace.steps_per_second) if trace.steps_per_second else math.nan}
            row.update(_metrics.flat_metrics(self._kept_metrics(i)))
            out.append(row)
        return out

    def to_pandas(self):
        """`rows` as a pandas DataFrame, one row per scenario (see `decodesched.frames`)."""
        from .frames import metrics_frame

        return metrics_frame(self)


def trace_labels(traces: Sequence[Trace], scenarios: Sequence[Scenario]) -> list[str]:
    """A name per trace, made unique with ``#index`` where names repeat among the traces of one
    replicate (the replicates of a trace share its name; a trace's replicate is that of the first
    scenario that uses it).  An index is skipped where ``name#index`` is another trace's own name
    (``t.csv t.csv t#0.csv``: ``t#1``, ``t#2``, ``t#0``), so that no two traces share a label."""
    rep = {}
    for sc in scenarios:
        rep.setdefault(sc.trace, sc.replicate)
    keys = [(t.name, rep.get(i, 0)) for i, t in enumerate(traces)]
    count, after = Counter(keys), Counter()
    taken = {key for key in keys if count[key] == 1}  # (label, replicate) of the names kept as they are
    labels = []
    for name, r in keys:
        label = name
        while count[name, r] > 1 and (label == name or (label, r) in taken):
            label = f"{name}#{after[name, r]}"
            after[name, r] += 1
        taken.add((label, r))
        labels.append(label)
    return labels


def _check_threads(threads) -> int | None:
    if threads is None:
        return None
    import numba

    limit = numba.config.NUMBA_NUM_THREADS
    if not is_integer(threads) or not 1 <= threads <= limit:
        raise UserError(f"threads must be an integer from 1 to {limit} (NUMBA_NUM_THREADS), got {show(threads)}")
    return int(threads)


def _check_backend(backend: str) -> None:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise UserError(f"unknown backend {show(backend)}; choose one of {', '.join(BACKENDS)}")
    if backend == "cuda":
        try:
            from numba import cuda
        except Exception as exc:  # pragma: no cover - numba without its cuda package
            raise UserError(f"backend 'cuda' needs numba.cuda, which failed to import: {exc}") from None
        # (asked of numba.cuda as imported, not of the environment: Numba reads NUMBA_ENABLE_CUDASIM once, at its own
        # import, as an integer; its simulator is always available)
        if not cuda.is_available():
            raise UserError("backend 'cuda' needs an NVIDIA GPU with a working CUDA driver, and none was found "
                            f"({_simulator_hint()})")


def _simulator_hint(instead: str = "use --backend cpu") -> str:
    """What to do without a GPU: `instead` or Numba's simulator, whose variable, where it is set but was not taken (a
    value Numba does not read as an integer, or set after Numba was imported), is said to be so."""
    value = os.environ.get("NUMBA_ENABLE_CUDASIM", "")
    if value.strip() not in ("", "0"):
        return (f"NUMBA_ENABLE_CUDASIM={show(value)} did not switch Numba's simulator on: it takes 1, set before "
                f"Python starts; or {instead}")
    return (f"{instead}, or set NUMBA_ENABLE_CUDASIM=1 before starting Python to run the CUDA code in Numba's "
            "slow simulator")


def check_scenarios(scenarios: Sequence[Scenario], n_traces: int) -> list[tuple[int, int, int, int, int]]:
    """Validate every scenario, and that no two different policies share a name (`policy.check_distinct`); return
    (trace index, policy code, capacity, interval, max_steps or -1) each."""
    out = []
    for i, sc in enumerate(scenarios):
        if not isinstance(sc, Scenario):
            raise UserError(f"scenario {i}: expected a Scenario, got {type(sc).__name__}")
        t = sc.trace
        if not is_integer(t) or not 0 <= t < n_traces:
            raise UserError(f"scenario {i}: trace index {show(t)} is not one of 0..{n_traces - 1}")
        rep = sc.replicate  # (only a label, but `BatchResult.rows` writes it as an integer)
        if not is_integer(rep) or rep < 0:
            raise UserError(f"scenario {i}: replicate must be a whole number >= 0, got {show(rep)}")
        try:
            out.append((int(t), *check_config(sc.policy, sc.free_kv_blocks, sc.aging_interval, sc.max_steps)))
        except UserError as exc:
            raise UserError(f"scenario {i}: {exc}") from None
    # rows know a policy by its name: two different policies of one name could not be told apart
    check_distinct({id(sc.policy): sc.policy for sc in scenarios}.values(), repeats=True)
    return out


def simulate_batch(traces, scenarios: Sequence[Scenario], *, record_events: bool = False, threads: int | None = None,
                   backend: str = "cpu", engine: str = "fast", progress: bool | None = False) -> BatchResult:
    """Replay every scenario in parallel; return a `BatchResult`.

    `traces`: a list of anything `load_trace` accepts (or a single one); each `Scenario.trace` is an
    index into it.  Every scenario is validated (`engine.check_config`) before anything runs.
    ``record_events=False`` (the default) keeps only per-request results and metrics, so a sweep
    over a long trace fits in memory; with True each scenario keeps its event log too.
    `threads`: Numba threads for this call (default: Numba's current setting); restored after.
    `backend`: ``"cpu"`` (``prange`` over scenarios) or ``"cuda"`` (one GPU thread per scenario,
    always the scan algorithm; `engine` is then ignored).  `progress`: a bar on stderr (None: on a
    terminal, else a plain line now and then, `decodesched._io.Progress`), advanced as scenarios finish; in
    Jupyter, True draws it in one output that each redraw replaces, and None draws nothing (`progress_bar`).
    CPU workers take scenarios from a shared queue (dynamic scheduling), so uneven scenarios still keep
    every thread busy.
    """
    traces = [load_trace(t) for t in _as_list(traces)]
    if not traces:
        raise UserError("simulate_batch needs at least one trace")
    scenarios = scenario_list(scenarios)
    if not scenarios:
        raise UserError("simulate_batch needs at least one scenario")
    if not isinstance(engine, str) or engine not in ENGINES:
        raise UserError(f"unknown engine {show(engine)}; choose one of {', '.join(ENGINES)}")
    if isinstance(backend, str) and backend == "cuda":
        user = next((sc.policy for sc in scenarios if _user_policy(getattr(sc, "policy", None))), None)
        if user is not None:
            raise UserError(f"backend 'cuda' runs the built-in policies only; policy {user.name!r} needs backend 'cpu'")
    _check_backend(backend)
    threads = _check_threads(threads)
    record_events = check_flag("record_events", record_events)
    progress = check_flag("progress", progress, none=True)
    n_sc = len(scenarios)
    configs = np.array(check_scenarios(scenarios, len(traces)), np.int64).reshape(n_sc, 5)
    sc_trace, sc_policy, sc_capacity, sc_interval, sc_max_steps = (np.ascontiguousarray(c) for c in configs.T)
    custom = np.array([_user_policy(sc.policy) for sc in scenarios], np.bool_)

    lengths = np.array([len(t) for t in traces], np.int64)
    trace_start = np.zeros(len(traces) + 1, np.int64)
    trace_start[1:] = np.cumsum(lengths)
    cols = [np.concatenate(c) for c in zip(*(trace_arrays(t) for t in traces))]
    req_start = np.zeros(n_sc + 1, np.int64)
    req_start[1:] = np.cumsum(lengths[sc_trace])
    req_out = zeros_within_memory(f"the per-request results of {_metrics.counted(n_sc, 'scenario')} "
                                  f"({_metrics.counted(int(req_start[-1]), 'row')})", int(req_start[-1]), E.RQ_NCOLS)
    caps = [event_capacity(traces[t], int(m)) for t, m in zip(sc_trace.tolist(), sc_max_steps.tolist())] \
        if record_events else [0]
    # Sized from the exact (Python int) total first: a log beyond memory is refused there, before the
    # int64 offsets below could wrap around (and hand a scenario an empty or foreign slice).
    events = event_log_buffer(sum(caps))
    event_start = np.zeros(n_sc + 1, np.int64)
    if record_events:
        event_start[1:] = np.cumsum(caps)
    summary = np.zeros((n_sc, E.SM_NCOLS), np.int64)
    summary[:, E.SM_STOP] = -1  # every replay writes its stop reason last: none left here means it failed
    arrays = (*cols, trace_start, sc_trace, sc_policy, sc_capacity, sc_interval, sc_max_steps)

    run_order = _run_order(traces, sc_trace, sc_policy, sc_interval, sc_max_steps)

    import numba

    previous = numba.get_num_threads()
    start = time.perf_counter()
    try:
        if threads is not None:
            numba.set_num_threads(threads)
        used = numba.get_num_threads()
        with progress_bar(n_sc, "sweep", progress) as bar:
            if backend == "cuda":
                _run_cuda((*arrays, req_start, event_start, events, req_out, summary))
                bar.advance(n_sc)
            else:
                builtin_order, threaded = run_order[~custom[run_order]], run_order[custom[run_order]]
                if builtin_order.size:
                    counters = np.zeros(2, np.int64)
                    call = (*arrays, builtin_order, counters, used, req_start, event_start, events, req_out, summary)
                    if not _run_cpu(_cpu_kernel(engine), call, used, counters, bar):
                        threaded = run_order
                _run_threads(traces, scenarios, threaded, engine, arrays, used, req_start, event_start, events,
                             req_out, summary, bar)
    finally:
        numba.set_num_threads(previous)
    seconds = time.perf_counter() - start
    lost = np.flatnonzero(summary[:, E.SM_STOP] < 0)
    if lost.size:  # an exception inside a parallel region is lost, not raised: never report its zeros
        raise RuntimeError(f"scenario {int(lost[0])}: the replay ended without a result (an internal error, "
                           "please report it with the trace)")
    return BatchResult(traces, scenarios, req_out, req_start, summary, events if record_events else None,
                       event_start if record_events else None, backend, used if backend == "cpu" else 1, seconds)


class _DisplayStream:
    """What `Progress` writes, shown in one Jupyter display that each redraw replaces: a notebook keeps every
    redraw written to stderr as one more output (thousands of lines for a sweep of a few minutes)."""

    def __init__(self):
        self.handle = None

    def write(self, text: str) -> None:
        text = text.strip("\r\n")
        if not text:
            return
        from IPython.display import display

        if self.handle is None:
            self.handle = display({"text/plain": text}, raw=True, display_id=True)
        else:
            self.handle.update({"text/plain": text}, raw=True)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def progress_bar(total: int, label: str, enabled: bool | None) -> Progress:
    """A `Progress` bar.  Under a Jupyter kernel, asked for (`enabled` True) it is drawn in one display updated in
    place rather than on stderr (`_DisplayStream`), and None (a bar on a terminal, plain lines in a log) draws
    nothing: a notebook is neither, it showed those lines on stderr, as an error, about every half minute."""
    if in_jupyter():
        return Progress(total, label, enabled=True, stream=_DisplayStream()) if enabled else Progress(0, enabled=False)
    return Progress(total, label, enabled=enabled)


def _user_policy(policy) -> bool:
    return isinstance(policy, Policy) and not policy.is_builtin


def _run_cuda(call: tuple) -> None:
    """Run the CUDA batch kernel on `call` (`kernels.cuda_nb.replay_batch_cuda`'s arguments); a batch whose arrays
    cannot fit in the GPU's free memory is refused first (UserError), rather than failing in a CUDA allocation."""
    from numba import cuda

    from .kernels.cuda_nb import device_bytes, replay_batch_cuda

    need, free = device_bytes(*call), _gpu_free_bytes(cuda.current_context())
    if free is not None and need > free:
        raise UserError(f"backend 'cuda' needs {need / 2**30:.3g} GiB of GPU memory for this batch, and the GPU has "
                        f"{free / 2**30:.3g} GiB free; run fewer scenarios at a time (sweep: --chunk-size), record "
                        "fewer events, or use backend 'cpu'")
    replay_batch_cuda(*call)


def _gpu_free_bytes(context) -> int | None:
    """The free memory of a numba.cuda context, once the arrays Numba only queued for release are released; None
    where its memory manager cannot say (a pool allocator plugin).  (The simulator says infinity.)"""
    pending = getattr(getattr(context, "memory_manager", None), "deallocations", None)  # (none in the simulator)
    if pending is not None:
        pending.clear()
    try:
        return context.get_memory_info().free
    except NotImplementedError:
        return None


def _cpu_kernel(engine: str):
    from .kernels import batch_nb

    return batch_nb.replay_batch_scan_nb if engine == "scan" else batch_nb.replay_batch_nb


# Held while a batch kernel of this process runs its parallel region under a threading layer that takes one at a
# time (see `_parallel_lock`); released by the helper thread when the kernel ends, also after Ctrl-C.
_workqueue_busy = threading.Lock()
_forked_after_gnu_openmp = []  # [True] in a process forked after its parent had started Numba's GNU OpenMP layer


def _note_fork() -> None:
    """(In a forked child.)  GNU OpenMP's threads do not survive fork(): Numba ends the child (SIGTERM, "Terminating:
    fork() called from a process already using GNU OpenMP") at its first parallel region when the parent had
    started that layer, and a `multiprocessing` pool then waits forever for the task the worker took."""
    parallel = sys.modules.get("numba.np.ufunc.parallel")
    omp = sys.modules.get("numba.np.ufunc.omppool")
    started = parallel is not None and getattr(parallel, "_is_initialized", False)  # (Numba's own flag, read only)
    if started and getattr(omp, "openmp_vendor", None) == "GNU" and sys.modules["numba"].threading_layer() == "omp":
        _forked_after_gnu_openmp[:] = [True]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_note_fork)


def _parallel_lock():
    """A lock, taken, to hold while a batch kernel runs its parallel region; None where none can start now: in a
    process forked from a parent using GNU OpenMP (`_note_fork`), or under Numba's "workqueue" layer while one runs
    (from another thread, or left running by Ctrl-C), which aborts the whole process ("Numba workqueue threading
    layer is terminating: Concurrent access has been detected").  The layer is known once `numba.get_num_threads`
    has started it."""
    import numba

    if _forked_after_gnu_openmp:
        return None
    lock = _workqueue_busy if numba.threading_layer() == "workqueue" else threading.Lock()
    return lock if lock.acquire(blocking=False) else None


def _run_cpu(kernel, call, threads: int, counters: np.ndarray, bar: Progress) -> bool:
    """Run the batch kernel in a helper thread (`_io.interruptible`), redrawing the bar from the kernel's count
    of finished scenarios, so Ctrl-C acts at once: the kernel's workers then take no new scenario, those already
    running finish in the background, and KeyboardInterrupt reaches the caller.  Returns False, having run
    nothing, where no parallel region can start (`_parallel_lock`): the caller runs the scenarios on threads."""
    import numba

    from ._io import interruptible
    from .kernels.batch_nb import DONE, NEXT

    lock = _parallel_lock()
    if lock is None:
        return False

    def work():
        try:
            numba.set_num_threads(threads)  # Numba's thread count is per calling thread
            kernel(*call)
        finally:
            lock.release()

    def stop():
        counters[NEXT] = 1 << 62  # past every queue position: no worker starts another scenario

    interruptible(work, tick=lambda: bar.advance(int(counters[DONE]) - bar.done), on_interrupt=stop,
                  name="decodesched-batch")
    bar.advance(int(counters[DONE]) - bar.done)
    return True


def estimated_cost(traces: Sequence[Trace], scenarios: Sequence[Scenario]) -> np.ndarray:
    """Each scenario's estimated run time, in arbitrary units: steps times requests of its trace."""
    sc_trace = np.array([s.trace for s in scenarios], np.int64)
    sc_max_steps = np.array([-1 if s.max_steps is None else s.max_steps for s in scenarios], np.int64)
    return _cost(traces, sc_trace, sc_max_steps)


def _cost(traces, sc_trace, sc_max_steps) -> np.ndarray:
    lengths = np.array([len(t) for t in traces], np.float64)[sc_trace]
    work = np.array([t.work_steps for t in traces], np.float64)[sc_trace]
    return np.where(sc_max_steps >= 0, np.minimum(work, sc_max_steps), work) * lengths


def _settings(traces, sc: Scenario) -> str:
    """A scenario's trace and the settings its policy reads, as a failed scenario's line names them (the aging
    interval only for a policy that uses it)."""
    said = [f"trace {traces[sc.trace].name!r}", f"free_kv_blocks {sc.free_kv_blocks}"]
    if sc.policy.uses_aging_interval:
        said.append(f"aging_interval {sc.aging_interval}")
    if sc.max_steps is not None:
        said.append(f"max_steps {sc.max_steps}")
    return ", ".join(said)


def _run_threads(traces, scenarios, order, engine: str, arrays, threads: int, req_start, event_start, events, req_out,
                 summary, bar: Progress) -> None:
    """Run the scenarios `order`, each with its single-scenario kernel (`engine.replay_kernel`: a user policy's own),
    on `threads` workers (the kernels release the GIL) that take the next scenario from a shared queue; every
    scenario has its own output slices.  The workers run behind `_io.interruptible`, as the built-in batch kernel
    does, so Ctrl-C acts at once: no worker starts another scenario, those under way finish in the background (they
    ran to their end first, the whole batch with a thread pool, whose threads Python also waits for at exit).  A
    scenario that fails is raised once every worker stopped: the first of them in `order`, whatever the thread
    count.  (User policies always run here; built-in ones where the batch kernel cannot, see `_run_cpu`.)"""
    from ._io import interruptible

    *cols, trace_start, sc_trace, sc_policy, sc_capacity, sc_interval, sc_max_steps = arrays
    # each policy's kernel once, before any scenario runs (compiled, and checked against its code)
    kernels = {id(scenarios[s].policy): replay_kernel(engine, scenarios[s].policy) for s in order.tolist()}
    queue = iter(enumerate(order.tolist()))
    lock = threading.Lock()
    stopped = threading.Event()
    finished = [0]
    failures: list[tuple[int, BaseException]] = []

    def one(s):
        a, b = trace_start[sc_trace[s]], trace_start[sc_trace[s] + 1]
        try:
            kernels[id(scenarios[s].policy)](*(c[a:b] for c in cols), sc_policy[s], sc_capacity[s], sc_interval[s],
                                             sc_max_steps[s], events[event_start[s]:event_start[s + 1]],
                                             req_out[req_start[s]:req_start[s + 1]], summary[s])
        except UserError as exc:  # (the policy raised: which of the scenarios, `ScenarioError`)
            raise ScenarioError(str(exc), s, _settings(traces, scenarios[s])) from exc.__cause__

    def worker():
        while not stopped.is_set():
            with lock:
                position, s = next(queue, (None, None))
            if s is None:
                return
            try:
                one(s)
            except BaseException as exc:  # noqa: BLE001 - raised by `work`, in the caller's thread
                with lock:
                    failures.append((position, exc))
                continue
            with lock:
                finished[0] += 1

    def work():
        workers = [threading.Thread(target=worker, name="decodesched-policy", daemon=True)
                   for _ in range(max(1, min(threads, len(order))))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if failures:
            raise min(failures, key=lambda f: f[0])[1]

    start = bar.done
    interruptible(work, tick=lambda: bar.advance(start + finished[0] - bar.done), on_interrupt=stopped.set,
                  name="decodesched-policy")
    bar.advance(start + finished[0] - bar.done)


def _run_order(traces, sc_trace, sc_policy, sc_interval, sc_max_steps) -> np.ndarray:
    """Scenario indices in the order workers take them: the probably slowest first, so that the
    last scenarios to finish are short ones (the order never changes results).

    Estimated cost: steps times requests of the scenario's trace; ties: aging before the other
    policies and longer aging intervals first (the fast aging kernel keeps one structure per
    residue class of the interval), then input order.
    """
    aging_rank = np.where(sc_policy == E.POLICY_AGING, sc_interval, 0)
    cost = _cost(traces, sc_trace, sc_max_steps)
    return np.lexsort((np.arange(len(sc_trace)), -aging_rank, -cost)).astype(np.int64)


def _csv_value(v):
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        # (exact: the shortest decimal that reads back as the same float; rounded to 6 places, a Jain index of
        # 0.99999975 read "1", perfectly fair, and an SLO attainment of 1 - 1/2,000,000 "1"; in positional
        # notation, never an exponent: repr writes a time of 2 ns in seconds as "2e-09")
        return int(v) if v.is_integer() else np.format_float_positional(v, unique=True, trim="-")
    return v


def row_columns(rows: Sequence[dict]) -> list[str]:
    """The columns of metrics rows, in order: `ROW_KEYS`, each time column followed by its seconds
    twin where any row has one, then per priority class (ascending) its `metrics.CLASS_COLUMNS`,
    then any other keys in first-seen order."""
    keys = dict.fromkeys(k for r in rows for k in r)
    cols = list(SCENARIO_KEYS + TRACE_KEYS)
    cols += [k for name in _metrics.FLAT_COLUMNS for k in (name, f"{name}_s") if k == name or k in keys]
    classes = sorted({int(m.group(1)) for k in keys if (m := re.search(r"_class(-?\d+)$", k))})
    cols += [k for p in classes for name in _metrics.CLASS_COLUMNS
             for k in (f"{name}_class{p}", f"{name}_s_class{p}") if k in keys]
    known = set(cols)
    return cols + [k for k in keys if k not in known]


def write_metrics_csv(rows: Sequence[dict], path) -> None:
    """Write metrics rows (`BatchResult.rows`) as CSV atomically: the `row_columns`, empty for NaN and
    missing values, ``inf`` for a censored statistic."""
    columns = row_columns(rows)
    with atomic_writer(path) as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(columns)
        for row in rows:
            w.writerow([_csv_value(row.get(k)) for k in columns])
