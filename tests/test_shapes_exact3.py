"""The engines equal the model on small versions of the shapes `benchmarks/bench_hunt.py --sections more` draws
(2026-12-07): everyone at one step; bursts between idle gaps of 10**7 steps; a few long requests among many of
one token; half the requests never servable; round robin by preemption (one priority, equal blocks, all
preemptible); priority classes in long runs of arrivals or alternating at every one; deadlines one step after
arrival (past at the first step); a capacity of exactly the sum of all blocks and one less.  Every built-in
policy, aging at intervals 1 to 2**40 (near the trace's size too: grouped mode), and two user policies, whose
scan kernel never keys a row that can never run; larger copies against the scan kernel (B+tree parts, block
and grouped mode in reach); and the CUDA batch kernel under Numba's simulator."""

import json
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest
from oracle import assert_matches_model
from test_shapes_exact2 import columns

from decodesched import Policy, load_trace, simulate

N = 48


@numba.njit
def _sjf_key(r, clock):
    return (r.phase, r.max_new_tokens - r.generated_len)


@numba.njit
def _business(r, clock):
    return r.priority


@numba.njit
def _oldest_key(r, clock):
    return (-r.priority, r.arrival_step)


@numba.njit
def _servable_key(r, clock):
    if r.request_id < 0:  # (the test's rows that need more blocks than exist)
        raise ValueError("the key was evaluated for a row that can never run")
    return _sjf_key(r, clock)


USER = {"sjf": Policy("sjf", key=_sjf_key, effective_priority=_business),
        "oldest": Policy("oldest", key=_oldest_key, effective_priority=_business)}


def _cols(rng, n, **over):
    """`test_shapes_exact2.columns` of 1-12 tokens."""
    return columns(rng, n, max_tokens=12, **over)


def _shape(name, rng, n=N):
    """(columns, capacity) of shape `name` with n requests."""
    new = rng.integers(1, 13, n)
    load15 = np.sort(rng.integers(0, int(new.sum()) * 2 // 3, n))  # offered load about 1.5
    zeros = np.zeros(n, np.int64)
    if name == "one step":
        return _cols(rng, n, arrival_step=zeros), 12
    if name == "long among 1-token":
        new = np.ones(n, np.int64)
        new[rng.choice(n, 3, replace=False)] = 6 * n
        return _cols(rng, n, max_new_tokens=new, arrival_step=np.sort(rng.integers(0, 400, n))), 12
    if name == "bursts":
        return _cols(rng, n, arrival_step=np.arange(n) // 8 * 10**7), 12
    if name == "half unservable":
        return _cols(rng, n, required_blocks=np.where(rng.random(n) < 0.5, rng.integers(13, 10**9, n),
                                                      rng.integers(1, 9, n))), 12
    if name == "round robin":
        return _cols(rng, n, max_new_tokens=new, arrival_step=load15, priority=zeros, required_blocks=np.full(n, 4),
                     preemptible=np.ones(n, bool), has_deadline=np.zeros(n, bool)), 12
    if name == "class runs":
        return _cols(rng, n, priority=4 * np.arange(n) // n), 12
    if name == "class alternating":
        return _cols(rng, n, priority=np.arange(n) % 2), 12
    if name == "deadline next step":
        return _cols(rng, n, max_new_tokens=new, arrival_step=load15, deadline_step=load15 + 1,
                     has_deadline=np.ones(n, bool)), 12
    if name == "deadline 1, all at 0":
        return _cols(rng, n, arrival_step=zeros, deadline_step=zeros + 1, has_deadline=np.ones(n, bool)), 12
    cols = _cols(rng, n, arrival_step=zeros) if name.startswith("all at 0") else _cols(rng, n, arrival_step=load15)
    return cols, int(np.sum(cols["required_blocks"])) - name.endswith("- 1")


SHAPES = ("one step", "long among 1-token", "bursts", "half unservable", "round robin", "class runs",
          "class alternating", "deadline next step", "deadline 1, all at 0", "capacity = sum",
          "capacity = sum - 1", "all at 0, capacity = sum - 1")


def _variants(n):
    """(policy, interval): every built-in policy, aging at the hunted intervals, the user policies."""
    return ([("fixed_priority", 4), ("deadline", 4), ("fcfs", 4)]
            + [("aging", k) for k in (1, 2, 3, 4, 7, 64, 1000, n // 4, n - 1, n, 2**40)]
            + [(p, 4) for p in USER.values()])


@pytest.mark.parametrize("shape", SHAPES)
def test_unhunted_shape_equals_the_model(shape):
    """Each shape under every policy variant, whole and cut by max_steps at a third of its work."""
    rng = np.random.default_rng(SHAPES.index(shape))
    cols, capacity = _shape(shape, rng)
    trace = load_trace(cols)
    rows = trace.rows()
    for policy, interval in _variants(len(trace)):
        for max_steps in (None, trace.work_steps // 3):
            result = simulate(trace, policy, capacity, interval, max_steps)
            assert_matches_model(result, rows, policy, capacity, interval, max_steps)


@pytest.mark.parametrize("shape", ("one step", "round robin", "class alternating", "deadline next step",
                                   "all at 0, capacity = sum - 1"))
def test_larger_copies_equal_the_scan_kernel(shape):
    """700 requests (a part past the B+tree threshold; block mode possible from an interval of 128 up to n / 4;
    grouped mode from n / 4): the fast kernel's requests table and summary equal the scan kernel's."""
    rng = np.random.default_rng(100 + len(shape))
    cols, capacity = _shape(shape, rng, n=700)
    trace = load_trace(cols)
    for policy, interval in [("fixed_priority", 4), ("deadline", 4), ("fcfs", 4)] + [
            ("aging", k) for k in (1, 3, 7, 130, 175, 400, 699, 2**40)]:
        fast = simulate(trace, policy, capacity, interval, record_events=False)
        scan = simulate(trace, policy, capacity, interval, record_events=False, engine="scan")
        for column in ("first_step", "finish_step", "wait_steps", "preemptions", "status"):
            assert np.array_equal(fast.requests[column], scan.requests[column]), (policy, interval, column)
        assert (fast.n_events, fast.clock, fast.stop_reason) == (scan.n_events, scan.clock, scan.stop_reason)


def test_a_user_policy_never_keys_rows_that_can_never_run():
    """Rows needing more blocks than exist never run: the scan kernel (a user policy's) keeps them out of its
    walk, whose cost per step was linear in them for the rest of the replay (half the rows unservable: 10-13x
    the time per event at 2,000 requests).  Its key raises on them; the replay still equals the model's (their
    waits, the stop on them)."""
    rng = np.random.default_rng(5)
    n = 120
    never = rng.random(n) < 0.5
    cols = _cols(rng, n, required_blocks=np.where(never, rng.integers(13, 10**6, n), rng.integers(1, 9, n)))
    cols["request_id"] = np.where(never, -1 - np.arange(n), np.arange(n))
    trace = load_trace(cols)
    policy = Policy("sjf-servable", key=_servable_key, effective_priority=_business)
    for max_steps in (None, 40):
        result = simulate(trace, policy, 12, max_steps=max_steps)
        assert_matches_model(result, trace.rows(), USER["sjf"], 12, 4, max_steps)
    assert result.stop_reason == "max_steps" and simulate(trace, policy, 12).stop_reason == "stuck"


CUDA_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_shapes_exact3 import SHAPES, _shape
    from decodesched import Scenario, load_trace, simulate_batch

    traces, scenarios = [], []
    for i, shape in enumerate(SHAPES):
        cols, capacity = _shape(shape, np.random.default_rng(i), n=14)
        traces.append(load_trace(cols))
        for policy, interval in (("fixed_priority", 4), ("deadline", 4), ("fcfs", 4), ("aging", 1), ("aging", 3)):
            scenarios.append(Scenario(i, policy, capacity, interval))
    cpu = simulate_batch(traces, scenarios, record_events=True)
    gpu = simulate_batch(traces, scenarios, record_events=True, backend="cuda")
    same = {name: bool(np.array_equal(getattr(cpu, name), getattr(gpu, name)))
            for name in ("request_state", "summary", "event_log")}
    print(json.dumps({"same": same, "scenarios": len(scenarios), "events": int(cpu.summary[:, 0].sum())}))
    """
)


def test_cuda_simulator_equals_the_cpu_batch_on_every_shape():
    """The CUDA batch kernel (the scan algorithm for every policy) under Numba's simulator: 14 requests of each
    shape, five policy variants each."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", CUDA_SCRIPT, os.path.dirname(__file__)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["same"] == {"request_state": True, "summary": True, "event_log": True}
    assert report["scenarios"] == 5 * len(SHAPES) and report["events"] > 500
