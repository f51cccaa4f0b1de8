"""Every engine equals the model on trace shapes the other differential tests rarely or never draw.

The shapes (`edge_trace`): priorities all distinct, shortest-job-first, negative, anywhere in +-2**53 or
at its very edges; deadlines on every request, at ``arrival + 1`` (overdue from the start), near the
1_000_000_000 sentinel or at 2**53; every request at one step, bursts, and gaps of 10**12 steps;
``max_new_tokens`` of 1 and of 2**40; prompts and blocks of 2**40; ids at the int64 edges.  The
configurations (`edge_configs`): capacities of 0, 1, exactly the servable rows' blocks (and one or two
fewer), 2**61 (unlimited); aging intervals of 1, 2, n / 4, n, 127-129 (block mode's start), the
trace's total work steps (where fast_nb switches aging to fixed_priority) and 2**62, 2**63 - 1; step
limits that cut a replay anywhere.  Engines: `simulate` fast and scan, the batch kernels with 1 and 2
threads, user policies compiled through `decodesched.Policy` (effective priorities at +-2**62), the
aging kernel at its mode switches and past `aging_nb.COLD_AT` requests, and the CUDA path under the
simulator.  2026-12-06, a campaign of these shapes outside pytest (about 45 minutes): 8,800 traces of
1-150 rows, 105 k fast and scan replays against the model, 20 k replays of aging layouts (block mode
switched every cycle, grouped mode at every interval) against scan, 17 k user-policy replays, 8,800
batches at 1 and 2 threads, 1,460 traces of 520-4,000 rows at the mode switches against scan, and
11 k CUDA-simulator scenarios (with and without the event log): no difference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest
from oracle import POLICIES, assert_matches_model

from decodesched import Policy, load_trace, simulate
from decodesched import batch as B
from decodesched.kernels import enums as E
from decodesched.kernels.aging_nb import BLOCK_MIN, COLD_AT, GROUPED_DIV
from decodesched.model import replay
from decodesched.trace import TraceError

UNLIMITED = 2**61
HUGE = 2**40  # the largest prompt_len, max_new_tokens and required_blocks a trace may hold
P53 = 2**53  # the largest |priority|, arrival_step and deadline_step


def edge_trace(rng, n=None) -> list[dict]:
    """A random trace of 1-40 rows (or `n`), each axis in a drawn shape (see the module docstring)."""
    n = int(rng.choice([1, 2, 3, 5, 8, 13, 21, 40])) if n is None else n
    new = [rng.integers(1, 2, n), rng.integers(1, 6, n), rng.integers(1, 30, n)][int(rng.integers(0, 3))]
    if rng.random() < 0.15:
        new[rng.integers(0, n)] = HUGE  # only a step limit ends it
    arrival = [np.zeros(n, np.int64), rng.choice(rng.integers(0, 30, 3), n), rng.integers(0, 4 * n + 1, n),
               rng.integers(0, 4, n) * 10**12 + rng.integers(0, 5, n)][int(rng.integers(0, 4))]
    priority = [rng.integers(-2, 3, n), rng.permutation(n) - n // 2, -np.minimum(new, 1000),
                -rng.integers(1, P53, n, endpoint=True), rng.integers(-P53, P53, n, endpoint=True),
                rng.choice([-P53, -P53 + 1, -1, 0, 1, P53 - 1, P53], n)][int(rng.integers(0, 6))]
    blocks = [np.ones(n, np.int64), rng.integers(1, 5, n), rng.integers(1, 20, n),
              rng.choice([1, 2, 3, HUGE], n, p=[0.4, 0.3, 0.2, 0.1])][int(rng.integers(0, 4))]
    if rng.random() < 0.3:
        edges = np.array([-(2**63), -(2**63) + 1, -1, 0, 1, 2**63 - 2, 2**63 - 1], np.int64)
        ids = rng.permutation(np.concatenate([edges, np.arange(-(2**62) + 3, 2**62, 2**55, dtype=np.int64)]))[:n]
    else:
        ids = rng.permutation(3 * n) - n
    # none, some, all, all overdue from the start, most near the sentinel (the others none), all at 2**53
    shape = int(rng.integers(0, 6))
    rows = []
    for i in range(n):
        a, w = int(arrival[i]), 1 + int(new[i])
        deadline = [None, a + int(rng.integers(1, 3 * min(w, 50) + 3)) if rng.random() < 0.5 else None,
                    a + int(rng.integers(1, 3 * min(w, 50) + 3)), a + 1,
                    a + int(rng.integers(999_999_980, 1_000_000_020)) if rng.random() < 0.6 else None, P53][shape]
        rows.append({"request_id": int(ids[i]), "arrival_step": a,
                     "prompt_len": HUGE if rng.random() < 0.03 else int(rng.integers(1, 9)),
                     "max_new_tokens": int(new[i]), "priority": int(priority[i]),
                     "cache_hit": bool(rng.random() < 0.3), "required_blocks": int(blocks[i]),
                     "deadline_step": deadline, "preemptible": bool(rng.random() < 0.8)})
    return rows


def edge_configs(rng, rows, k: int, policies=POLICIES) -> list[tuple]:
    """k configurations (policy, capacity, aging interval, max_steps) at the edges for `rows`."""
    servable = sum(r["required_blocks"] for r in rows if r["required_blocks"] < HUGE)
    work = sum(1 + r["max_new_tokens"] for r in rows)
    n = len(rows)
    caps = [0, 1, servable, max(servable - 1, 0), max(servable - 2, 0), UNLIMITED, int(rng.integers(0, servable + 2))]
    intervals = [1, 2, 3, max(1, n // 4), n, n + 1, BLOCK_MIN - 1, BLOCK_MIN, BLOCK_MIN + 1, work - 1, work, work + 1,
                 2**62, 2**63 - 1]
    limits = [int(rng.integers(0, 40)), int(rng.integers(1, 300))]
    if work < HUGE:
        limits += [None, None, work - 1]
    return [(str(rng.choice(policies)), int(rng.choice(caps)), int(rng.choice(intervals)),
             limits[int(rng.integers(0, len(limits)))]) for _ in range(k)]


def same_arrays(a, b, what="") -> None:
    """Two `SimulationResult`s (or batch results) hold the same event log, per-request state and summary."""
    for name in ("summary", "request_state", "event_log"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), (what, name)
        if x is not None:
            assert x.shape == y.shape and np.array_equal(x, y), (what, name, np.argwhere(x != y)[:3].tolist())


@pytest.mark.parametrize("engine", ("fast", "scan"))
def test_engines_equal_model_on_edge_shapes(engine):
    """A campaign of any size: ``DECODESCHED_HUNT_TRACES=50000 DECODESCHED_HUNT_SEED=7 pytest -k edge_shapes``."""
    rng = np.random.default_rng(int(os.environ.get("DECODESCHED_HUNT_SEED", "53001")))
    n_traces = int(os.environ.get("DECODESCHED_HUNT_TRACES", "300"))
    stops, preemptions = set(), 0
    for _ in range(n_traces):
        rows = edge_trace(rng)
        trace = load_trace(rows)
        for cfg in edge_configs(rng, rows, 3):
            result = simulate(trace, *cfg, engine=engine)
            assert_matches_model(result, rows, *cfg)
            stops.add(result.stop_reason)
            preemptions += int(result.request_state[:, E.RQ_PREEMPTIONS].sum())
    if n_traces >= 300:  # the shapes were drawn
        assert stops == {"drained", "stuck", "max_steps"} and preemptions > 100


@numba.njit
def _edge_key(r, clock):
    eff = r.priority * 512 + r.wait_steps
    return (r.phase, -eff, r.deadline_step - clock if r.has_deadline else np.int64(2**62))


@numba.njit
def _edge_priority(r, clock):
    return r.priority * 512 + r.wait_steps  # +-2**62 at the trace's priority bounds


@numba.njit
def _aging3_key(r, clock):
    eff = r.priority + r.wait_steps // 3
    return (np.int64(1_000_000_000), r.phase, 1 - r.cache_hit, -eff, r.prompt_len + r.generated_len)


@numba.njit
def _aging3_priority(r, clock):
    return r.priority + r.wait_steps // 3


def test_user_policies_at_int64_edges_equal_model():
    """A user policy whose effective priorities reach +-2**62 (the victim rule compares them), against the
    model calling the same functions; and the built-in aging at interval 3 written as a user policy,
    against the model's built-in aging."""
    edge = Policy("edge62", key=_edge_key, effective_priority=_edge_priority)
    aging3 = Policy("user_aging3", key=_aging3_key, effective_priority=_aging3_priority)
    rng = np.random.default_rng(53_002)
    at_edges = 0
    for _ in range(50):
        rows = edge_trace(rng)
        trace = load_trace(rows)
        at_edges += any(abs(r["priority"]) == P53 for r in rows)
        _, capacity, _, max_steps = edge_configs(rng, rows, 1)[0]
        assert_matches_model(simulate(trace, edge, capacity, 1, max_steps), rows, edge, capacity, 1, max_steps)
        assert_matches_model(simulate(trace, aging3, capacity, 3, max_steps), rows, "aging", capacity, 3, max_steps)
    assert at_edges > 3  # effective priorities of +-2**62 were compared


def test_batches_with_one_and_two_threads_are_identical_on_edge_shapes():
    """The batch kernels (fast and scan) under prange: 1 or 2 threads give the same arrays, each
    scenario's equal to `simulate` alone (itself checked against the model above)."""
    rng = np.random.default_rng(53_003)
    for i in range(25):
        rows = [edge_trace(rng) for _ in range(2)]
        traces = [load_trace(r) for r in rows]
        scenarios = [B.Scenario(t, *cfg) for t in (0, 1) for cfg in edge_configs(rng, rows[t], 3)]
        engine = "scan" if i % 4 == 0 else "fast"
        one = B.simulate_batch(traces, scenarios, record_events=True, threads=1, engine=engine)
        two = B.simulate_batch(traces, scenarios, record_events=True, threads=2, engine=engine)
        assert np.array_equal(one.summary, two.summary) and np.array_equal(one.request_state, two.request_state)
        assert np.array_equal(one.event_log, two.event_log)
        for s, sc in enumerate(scenarios):
            alone = simulate(traces[sc.trace], sc.policy, sc.free_kv_blocks, sc.aging_interval, sc.max_steps)
            same_arrays(two.result(s), alone, (i, s))


def _backlog(rng, n, load, blocks_max=4):
    """n requests arriving at `load` (work per step), short ones, priorities in a drawn shape."""
    new = rng.integers(1, 6, n)
    arrival = np.sort((np.cumsum(1 + new) / load).astype(np.int64) + rng.integers(0, 5, n))
    return load_trace({
        "request_id": rng.permutation(n) - n // 3, "arrival_step": arrival, "prompt_len": rng.integers(1, 9, n),
        "max_new_tokens": new, "priority": rng.permutation(n) % 7 - 3, "cache_hit": rng.random(n) < 0.3,
        "required_blocks": rng.integers(1, blocks_max + 1, n),
        "deadline_step": [int(a + d) if d % 2 else None for a, d in zip(arrival, rng.integers(1, 200, n))],
        "preemptible": rng.random(n) < 0.9,
    })


def test_aging_at_its_mode_switches_equals_scan():
    """Real aging kernel (`simulate` fast) against the scan kernel at the intervals where it changes
    layout: block mode from BLOCK_MIN, grouped mode from n / GROUPED_DIV (and by the backlog up to n),
    fixed_priority above the total work; tight, exact and unlimited capacities."""
    rng = np.random.default_rng(53_004)
    n = 4 * BLOCK_MIN + 40
    for load in (1.0, 3.0):
        trace = _backlog(rng, n, load)
        work, servable = trace.work_steps, int(trace.required_blocks.sum())
        quarter = -(-n // GROUPED_DIV)
        for k in (BLOCK_MIN - 1, BLOCK_MIN, BLOCK_MIN + 1, quarter - 1, quarter, quarter + 1, n - 1, n, n + 1,
                  work - 1, work, work + 1):
            for capacity in (1, 5, servable - 1, UNLIMITED):
                same_arrays(simulate(trace, "aging", capacity, k), simulate(trace, "aging", capacity, k, engine="scan"),
                            (load, k, capacity))


def test_just_past_cold_at_with_a_tiny_capacity_equals_scan():
    """COLD_AT + 1 requests (the aging kernel prefetches ahead from COLD_AT on) arriving at three times
    the work a step, and a capacity of 1 or 3 blocks: a backlog of thousands (its parts in B+trees),
    every admission a preemption or a wait; cut by a step limit where the scan kernel's cost would grow."""
    rng = np.random.default_rng(53_005)
    trace = _backlog(rng, COLD_AT + 1, 3.0, blocks_max=2)
    for capacity, k in ((1, 4), (3, 97)):
        fast = simulate(trace, "aging", capacity, k, 12_000, record_events=False)
        scan = simulate(trace, "aging", capacity, k, 12_000, record_events=False, engine="scan")
        same_arrays(fast, scan, (capacity, k))
        state = fast.request_state
        assert state[:, E.RQ_PREEMPTIONS].sum() > 0
        assert ((state[:, E.RQ_ENQUEUED] == 1) & (state[:, E.RQ_STATUS] != E.STATUS_FINISHED)).sum() > 1000


def test_a_step_limit_right_at_a_preemption_keeps_its_state():
    """Row 1 (priority 5) preempts row 0 at step 2; a replay cut after 1, 2, 3 steps holds what the
    model holds: blocks, statuses, preemptions and waits, on every engine."""
    rows = [{"request_id": -(2**63), "arrival_step": 0, "prompt_len": 1, "max_new_tokens": 3, "priority": 0,
             "cache_hit": False, "required_blocks": 2, "deadline_step": None, "preemptible": True},
            {"request_id": 2**63 - 1, "arrival_step": 2, "prompt_len": 1, "max_new_tokens": 1, "priority": 5,
             "cache_hit": False, "required_blocks": 2, "deadline_step": 3, "preemptible": True}]
    full = replay(rows, "fixed_priority", 2)
    assert full.events[2]["preempted_request_id"] == -(2**63)
    for engine in ("fast", "scan"):
        for limit in (1, 2, 3, 4):
            for policy in ("fixed_priority", "aging", "deadline"):
                assert_matches_model(simulate(rows, policy, 2, 1, limit, engine=engine), rows, policy, 2, 1, limit)


def test_a_deadline_at_its_arrival_is_refused_by_the_model_and_the_trace_alike():
    row = {"request_id": 1, "arrival_step": 4, "prompt_len": 1, "max_new_tokens": 1, "priority": 0,
           "cache_hit": False, "required_blocks": 1, "deadline_step": 4, "preemptible": True}
    with pytest.raises(TraceError, match="deadline_step"):
        load_trace([row])
    with pytest.raises(ValueError, match="deadline_step"):
        replay([row])


CUDASIM = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_diff_hunt import edge_configs, edge_trace
    from decodesched import batch as B, load_trace

    rng = np.random.default_rng(53_006)
    cases = 0
    for i in range(8):
        rows = [edge_trace(rng, int(rng.integers(4, 13))) for _ in range(2)]
        if i == 0:  # three victims of one priority, blocks 1, 2, 2: the victim order's tie-breaks decide
            rows[1] = [{"request_id": rid, "arrival_step": a, "prompt_len": 1, "max_new_tokens": 9, "priority": p,
                        "cache_hit": False, "required_blocks": b, "deadline_step": None, "preemptible": True}
                       for rid, a, p, b in ((5, 0, 0, 1), (9, 0, 0, 2), (7, 0, 0, 2), (1, 3, 5, 1))]
        traces = [load_trace(r) for r in rows]
        scenarios = [B.Scenario(t, *cfg) for t in (0, 1) for cfg in edge_configs(rng, rows[t], 4)]
        if i == 0:
            scenarios += [B.Scenario(1, policy, 5, 2) for policy in ("fixed_priority", "aging", "deadline", "fcfs")]
        for record in (True, False):
            cpu = B.simulate_batch(traces, scenarios, record_events=record)
            gpu = B.simulate_batch(traces, scenarios, record_events=record, backend="cuda")
            for name in ("request_state", "summary", "event_log"):
                a, b = getattr(cpu, name), getattr(gpu, name)
                assert (a is None) == (b is None), name
                assert a is None or (a.shape == b.shape and np.array_equal(a, b)), (name, record)
            cases += 1
    print(json.dumps({"cases": cases}))
""")


def test_cuda_simulator_equals_cpu_batch_on_edge_shapes():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", CUDASIM, os.path.dirname(__file__)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"cases": 16}
