"""Synthetic traces for tests and benchmarks: seeded, with a controllable backlog.

>>> t = backlog_trace(100, seed=1)
>>> len(t), int(t.arrival_step.max()) < 100
(100, True)
"""

from __future__ import annotations

import numpy as np

from .errors import UserError
from .model import is_integer
from .trace import MAX_LENGTH, MAX_STEP, Trace, load_trace, show


def _whole(value, what: str, low: int, high: int) -> int:
    """`value` as an int from `low` to `high`; UserError naming `what` otherwise (a bool, 2.5, "5")."""
    if not is_integer(value) or not low <= value <= high:
        top = f"2**{high.bit_length() - 1}" if high & (high - 1) == 0 else f"2**{high.bit_length()} - 1"
        raise UserError(f"backlog_trace: {what} must be a whole number from {low} to {top}, got {show(value)}")
    return int(value)


def _fraction(value, what: str) -> float:
    """`value` as a float from 0 to 1; UserError naming `what` otherwise (NaN, None, 1.5)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not 0 <= value <= 1:
        raise UserError(f"backlog_trace: {what} must be a number from 0 to 1, got {show(value)}")
    return float(value)


def backlog_trace(n_requests: int, *, seed: int = 0, arrival_span: int | None = None, max_prompt: int = 64,
                  max_new_tokens: int = 32, priorities: int = 3, deadline_fraction: float = 0.5,
                  max_blocks: int = 8, non_preemptible_fraction: float = 0.1, cache_fraction: float = 0.3) -> Trace:
    """`n_requests` requests that arrive within `arrival_span` steps (default: n/10), far faster than
    they can be served, so almost all of them wait: a backlog of about `n_requests`.

    Lengths, priorities, cache hits, deadlines (``arrival + 2..4 x the request's own work``) and
    preemptibility are drawn from a seeded `numpy.random.Generator`.  Counts and maxima are whole numbers
    (``n_requests``, the maxima and ``priorities`` at least 1, ``arrival_span`` at least 0: 0 and 1 both put
    every arrival at step 0), fractions from 0 to 1; `UserError` (a ValueError) names any other argument.
    """
    n_requests = _whole(n_requests, "n_requests", 1, MAX_STEP)
    seed = _whole(seed, "seed", 0, 2**128 - 1)
    arrival_span = None if arrival_span is None else _whole(arrival_span, "arrival_span", 0, MAX_STEP)
    max_prompt, max_new_tokens, max_blocks = (_whole(v, k, 1, MAX_LENGTH) for k, v in (
        ("max_prompt", max_prompt), ("max_new_tokens", max_new_tokens), ("max_blocks", max_blocks)))
    priorities = _whole(priorities, "priorities", 1, MAX_STEP)
    deadline_fraction, non_preemptible_fraction, cache_fraction = (_fraction(v, k) for k, v in (
        ("deadline_fraction", deadline_fraction), ("non_preemptible_fraction", non_preemptible_fraction),
        ("cache_fraction", cache_fraction)))
    rng = np.random.default_rng(seed)
    span = max(1, n_requests // 10) if arrival_span is None else max(1, arrival_span)
    arrival = np.sort(rng.integers(0, span, n_requests))
    new = rng.integers(1, max_new_tokens + 1, n_requests)
    work = 1 + new
    has_deadline = rng.random(n_requests) < deadline_fraction
    deadline = arrival + work * rng.integers(2, 5, n_requests)
    return load_trace(
        {
            "request_id": rng.permutation(n_requests).astype(np.int64) * 7 - 3 * n_requests,
            "arrival_step": arrival,
            "prompt_len": rng.integers(1, max_prompt + 1, n_requests),
            "max_new_tokens": new,
            "priority": rng.integers(0, priorities, n_requests),
            "cache_hit": rng.random(n_requests) < cache_fraction,
            "required_blocks": rng.integers(1, max_blocks + 1, n_requests),
            "deadline_step": [int(d) if h else None for d, h in zip(deadline, has_deadline)],
            "preemptible": rng.random(n_requests) >= non_preemptible_fraction,
        },
        name=f"backlog{n_requests}",
    )
