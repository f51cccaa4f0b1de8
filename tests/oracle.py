"""Test helpers: random traces (Hypothesis) and the comparison of an engine with the model.

`assert_matches_model` is the differential check every engine goes through; its own tests are in
tests/test_oracle.py (a helper that accepts anything would make every differential test vacuous).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from decodesched import load_trace
from decodesched.model import replay

POLICIES = ("fixed_priority", "aging", "deadline", "fcfs")


@st.composite
def traces(draw, max_requests: int = 12, max_len: int = 5, max_arrival: int = 12, id_range: int = 2**63 - 1,
           max_blocks: int = 6, wide_priorities: bool = False):
    """Small random traces that hit the edges: equal keys, tight deadlines, large or negative ids,
    requests needing more blocks than exist, non-preemptible requests, bursts and idle gaps.

    `wide_priorities`: priorities drawn per trace in one of the shapes that stress the fast kernels'
    priority classes (every request its own; shortest job first, ``-max_new_tokens``; anywhere in
    +-2**53; negative only), and in half of the traces a deadline on every request."""
    n = draw(st.integers(1, max_requests))
    shape = draw(st.sampled_from(["distinct", "sjf", "wide", "negative"])) if wide_priorities else "classes"
    all_deadlines = wide_priorities and draw(st.booleans())
    distinct = draw(st.permutations(range(n))) if shape == "distinct" else None
    small_ids = draw(st.booleans())
    if small_ids:
        ids = draw(st.lists(st.integers(-5, 5 + 2 * max_requests), min_size=n, max_size=n, unique=True))
    else:
        ids = draw(st.lists(st.integers(-id_range - 1, id_range), min_size=n, max_size=n, unique=True))
    rows = []
    for i, rid in enumerate(ids):
        arrival = draw(st.integers(0, max_arrival))
        new = draw(st.integers(1, max_len))
        if shape == "classes":
            priority = draw(st.integers(-2, 3))
        elif shape == "distinct":
            priority = distinct[i] - n // 2
        elif shape == "sjf":
            priority = -new
        elif shape == "wide":
            priority = draw(st.one_of(st.integers(-(2**53), 2**53), st.sampled_from([-(2**53), 2**53, 0])))
        else:
            priority = draw(st.integers(-(2**53), -1))
        has_deadline = all_deadlines or draw(st.booleans())
        if has_deadline:
            far = draw(st.sampled_from([False, False, False, True]))
            if far:  # slack near the sentinel 1_000_000_000: ties with, or sorts after, "no deadline"
                deadline = arrival + draw(st.integers(999_999_990, 1_000_000_012))
            else:
                deadline = arrival + draw(st.integers(1, 3 * (new + 2)))
        else:
            deadline = None
        rows.append(
            {
                "request_id": rid,
                "arrival_step": arrival,
                "prompt_len": draw(st.integers(1, max_len)),
                "max_new_tokens": new,
                "priority": priority,
                "cache_hit": draw(st.booleans()),
                "required_blocks": draw(st.integers(1, max_blocks)),
                "deadline_step": deadline,
                "preemptible": draw(st.sampled_from([True, True, True, False])),
            }
        )
    return rows


configs = st.tuples(
    st.sampled_from(POLICIES),
    st.integers(0, 12),  # free_kv_blocks: from none to ample
    st.integers(1, 5),  # aging_interval
    st.one_of(st.none(), st.integers(0, 40)),  # max_steps
)
# The same with capacities from none to unlimited (2**61, the largest allowed).
wide_configs = st.tuples(
    st.sampled_from(POLICIES),
    st.one_of(st.integers(0, 12), st.just(2**61)),
    st.integers(1, 5),
    st.one_of(st.none(), st.integers(0, 40)),
)


def model_outcome(rows, policy, capacity, interval, max_steps):
    return replay(rows, policy=policy, free_kv_blocks=capacity, aging_interval=interval, max_steps=max_steps)


def assert_matches_model(result, rows, policy, capacity, interval, max_steps):
    """Every event and every final per-request state of `result` equals the model's replay."""
    ref = model_outcome(rows, policy, capacity, interval, max_steps)
    got = result.timeline()
    want = [{k: v for k, v in e.items() if k != "step"} for e in ref.events]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"event {i} (step {ref.events[i]['step']}): engine {g} != model {w}"
    assert len(got) == len(want), f"engine ran {len(got)} events, model {len(want)}"
    steps = result.events["step"].tolist()
    assert steps == [e["step"] for e in ref.events], "event clocks differ"
    req = result.requests
    for row in range(len(rows)):
        state = ref.states.get(row)
        if state is None:  # never arrived before the replay stopped
            assert req["first_step"][row] == -1 and req["wait_steps"][row] == 0, f"row {row} ran before arriving"
            continue
        got_state = (
            int(req["generated_len"][row]),
            int(req["wait_steps"][row]),
            int(req["preemptions"][row]),
            str(req["status"][row]).replace("unservable", state.status),
        )
        want_state = (state.generated_len, state.wait_steps, state.preemptions, state.status)
        assert got_state == want_state, f"row {row}: engine {got_state} != model {want_state}"
    assert result.final_free_kv_blocks == ref.free_kv_blocks
    assert result.clock == ref.clock
    assert result.stop_reason == ref.stop


def as_trace(rows):
    return load_trace(rows)


__all__ = ["traces", "configs", "wide_configs", "assert_matches_model", "as_trace", "POLICIES", "np"]


SJF_MODULE = '''
import numba
from decodesched import Policy

@numba.njit
def key(r, clock):
    return (r.phase, r.max_new_tokens - r.generated_len)

@numba.njit
def priority(r, clock):
    return r.priority

SJF = Policy({name!r}, key=key, effective_priority=priority)
'''


def write_sjf_module(path, name: str):
    """Write a policy module (a file) whose top-level ``SJF`` is a user Policy called `name`: what a
    user gives as ``path/to/file.py:SJF``."""
    path.write_text(SJF_MODULE.format(name=name))
    return path
