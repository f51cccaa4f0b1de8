"""Synthetic traces for tests and benchmarks: seeded, with a controllable backlog.

>>> t = backlog_trace(100, seed=1)
>>> len(t), int(t.arrival_step.max()) < 100
(100, True)
"""

from __future__ import annotations

import numpy as np

from .trace import Trace, load_trace


def backlog_trace(n_requests: int, *, seed: int = 0, arrival_span: int | None = None, max_prompt: int = 64,
                  max_new_tokens: int = 32, priorities: int = 3, deadline_fraction: float = 0.5,
                  max_blocks: int = 8, non_preemptible_fraction: float = 0.1, cache_fraction: float = 0.3) -> Trace:
    """`n_requests` requests that arrive within `arrival_span` steps (default: n/10), far faster than
    they can be served, so almost all of them wait: a backlog of about `n_requests`.

    Lengths, priorities, cache hits, deadlines (``arrival + 2..4 x the request's own work``) and
    preemptibility are drawn from a seeded `numpy.random.Generator`.
    """
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
