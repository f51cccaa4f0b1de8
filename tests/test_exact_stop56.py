"""Every engine equals the model on trace shapes the other differential tests do not draw (stop 56's red team).

The shapes (`stop56_trace`): arrivals at the very edge of the clock (2**53 - 5 and 2**53) or bursts 2**40 steps
apart; every priority at +2**53 or every one at -2**53 (one class at an edge), only the two edges, the edges and
their neighbours; required blocks of 2**20 beside 1-7 (with capacities of 2**40 and 2**40 - 1: exactly a request's
largest allowed need, one less); every request preemptible or none; every request a cache hit or none.  The step
limits (`_limits`) land exactly on a finish or a preemption of the full replay, one step after it, on the replay's
last step and one before.  Engines: `simulate` fast and scan with and without the event log, the aging kernel in
every layout (`test_fast_kernel.AGING_KERNELS`) against the scan kernel, the batch kernels with 1 and 2 threads
against `simulate`, and the CUDA path under the simulator against the CPU batch.

2026-12-06, a campaign of these shapes and wider ones outside pytest (about 48 CPU minutes; also huge
max_new_tokens of 2**35-2**40 cut by a step limit, intervals of n - 1, n, n + 1, 127-129, work - 1, work and 2**62):
8,842 traces of 1-60 rows, 245,590 fast and scan replays against the model (each again without the event log),
150,799 replays of the aging layouts against scan, 1,764 batches at 1 and 2 threads; 1,840 traces of 130-3,000
rows at aging's switches (block mode from 128, n / 4, the grouped-mode choice, n) with 7,360 real aging replays
(4,020 in grouped mode) and 11,435 layout replays against scan, 5,520 other policies' fast replays against scan;
19,452 CUDA-simulator scenarios against the CPU batch; 646 sweeps resumed whole from their checkpoint
(`checkpoint.run_local`) and 2 Dask ``"local"`` sweeps against `simulate_batch`'s rows: no difference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from oracle import POLICIES, assert_matches_model
from test_diff_hunt import same_arrays
from test_fast_kernel import AGING_KERNELS

from decodesched import batch as B
from decodesched import load_trace, simulate
from decodesched.engine import trace_arrays
from decodesched.kernels import enums as E
from decodesched.kernels.scan_nb import replay_scan_nb
from decodesched.model import replay

P53 = 2**53  # the largest |priority|, arrival_step and deadline_step
HUGE = 2**40  # the largest prompt_len, max_new_tokens and required_blocks
UNLIMITED = 2**61


def stop56_trace(rng) -> list[dict]:
    """A random trace of 1-40 rows, each axis in a drawn shape (see the module docstring)."""
    n = int(rng.choice([1, 2, 3, 4, 6, 9, 15, 25, 40]))
    new = [np.ones(n, np.int64), rng.integers(1, 3, n), rng.integers(1, 8, n), rng.choice([1, 2, 30], n)][
        int(rng.integers(0, 4))]
    arrival = [np.zeros(n, np.int64), np.arange(n, dtype=np.int64) * int(rng.integers(20, 80)),
               np.sort(rng.integers(0, 3, n)) * HUGE + rng.integers(0, 3, n), rng.choice([0, P53 - 5, P53], n),
               rng.integers(0, 2 * n + 1, n)][int(rng.integers(0, 5))]
    priority = [np.full(n, P53), np.full(n, -P53), rng.choice([-P53, P53], n),
                rng.choice([-P53, -P53 + 1, -1, 0, 1, P53 - 1, P53], n), np.zeros(n, np.int64),
                rng.permutation(n) - n // 2][int(rng.integers(0, 6))]
    blocks = [np.ones(n, np.int64), rng.integers(1, 4, n), rng.choice([1, 3, 7, 2**20], n),
              rng.choice([1, 2, HUGE], n)][int(rng.integers(0, 4))]
    preemptible = [np.ones(n, bool), np.zeros(n, bool), rng.random(n) < 0.7][int(rng.integers(0, 3))]
    cache_hit = [np.zeros(n, bool), np.ones(n, bool), rng.random(n) < 0.5][int(rng.integers(0, 3))]
    ids = rng.choice(np.array([-(2**63), 2**63 - 1, -1, 0, 1] + list(range(100, 100 + n)), np.int64), n,
                     replace=False)
    deadlines = int(rng.integers(0, 4))  # none, all overdue from the start, all at 2**53, some near
    rows = []
    for i in range(n):
        a = int(arrival[i])
        deadline = [None, a + 1, P53 if a < P53 else None,
                    a + int(rng.integers(1, 3 * int(new[i]) + 6)) if rng.random() < 0.5 else None][deadlines]
        if deadline is not None and deadline > P53:
            deadline = None
        rows.append({"request_id": int(ids[i]), "arrival_step": a, "prompt_len": int(rng.choice([1, 3, HUGE])),
                     "max_new_tokens": int(new[i]), "priority": int(priority[i]), "cache_hit": bool(cache_hit[i]),
                     "required_blocks": int(blocks[i]), "deadline_step": deadline,
                     "preemptible": bool(preemptible[i])})
    return rows


def stop56_config(rng, rows) -> tuple[str, int, int]:
    """(policy, capacity, aging interval) at the edges for `rows`."""
    blocks = [r["required_blocks"] for r in rows]
    n, work = len(rows), sum(1 + r["max_new_tokens"] for r in rows)
    caps = [0, 1, int(rng.choice(blocks)), max(int(rng.choice(blocks)) - 1, 0), max(blocks),
            sum(b for b in blocks if b < HUGE), HUGE, HUGE - 1, UNLIMITED]
    intervals = [1, 2, max(1, n - 1), n, n + 1, 127, 128, 129, max(1, work - 1), work, work + 1, 2**62, 2**63 - 1]
    return str(rng.choice(POLICIES)), int(rng.choice(caps)), int(rng.choice(intervals))


def _limits(events, rng) -> list:
    """Step limits at a finish or a preemption of the full replay `events` and one step after it, at its
    last step and one before, and none."""
    marks = [i for i, e in enumerate(events) if e["action"] == "finish" or e["preempted_request_id"] is not None]
    picked = [int(i) for i in rng.choice(marks, min(2, len(marks)), replace=False)] if marks else []
    return [None, 0, len(events), max(len(events) - 1, 0)] + [m + d for m in picked for d in (0, 1)]


def _run_aging(kernel, trace, capacity, interval, max_steps):
    n_events = trace.work_steps if max_steps < 0 else min(trace.work_steps, max_steps)
    events = np.zeros((n_events, E.EV_NCOLS), np.int64)
    req_out = np.zeros((len(trace), E.RQ_NCOLS), np.int64)
    summary = np.zeros(E.SM_NCOLS, np.int64)
    args = (*trace_arrays(trace), capacity, interval, max_steps, events, req_out, summary)
    if kernel is replay_scan_nb:
        kernel(*args[:11], E.POLICY_AGING, *args[11:])
    elif not kernel(*args):
        return None  # priorities beyond the aging kernel's keys: it wrote nothing (fast_nb then runs scan)
    return events[: summary[E.SM_EVENTS]], req_out, summary


@pytest.mark.parametrize("engine", ("fast", "scan"))
def test_engines_equal_model_at_step_limits_on_stop56_shapes(engine):
    rng = np.random.default_rng(56_001)
    stops, cut_at_mark = set(), 0
    for _ in range(400):
        rows = stop56_trace(rng)
        trace = load_trace(rows)
        policy, capacity, interval = stop56_config(rng, rows)
        full = replay(rows, policy, capacity, interval)
        for limit in _limits(full.events, rng):
            result = simulate(trace, policy, capacity, interval, limit, engine=engine)
            assert_matches_model(result, rows, policy, capacity, interval, limit)
            lean = simulate(trace, policy, capacity, interval, limit, engine=engine, record_events=False)
            assert np.array_equal(lean.request_state, result.request_state)
            assert (lean.clock, lean.final_free_kv_blocks, lean.stop_reason) == \
                (result.clock, result.final_free_kv_blocks, result.stop_reason)
            stops.add(result.stop_reason)
            cut_at_mark += limit is not None and 0 < limit < len(full.events)
    assert stops == {"drained", "stuck", "max_steps"} and cut_at_mark > 500


def test_every_aging_layout_equals_scan_on_stop56_shapes():
    rng = np.random.default_rng(56_002)
    compared, preemptions = 0, 0
    for _ in range(400):
        rows = stop56_trace(rng)
        trace = load_trace(rows)
        _, capacity, interval = stop56_config(rng, rows)
        limit = -1 if rng.random() < 0.6 else int(rng.integers(0, trace.work_steps + 1))
        want = _run_aging(replay_scan_nb, trace, capacity, interval, limit)
        preemptions += int(want[1][:, E.RQ_PREEMPTIONS].sum())
        for name, kernel in AGING_KERNELS.items():
            got = _run_aging(kernel, trace, capacity, interval, limit)
            if got is not None:
                compared += 1
                for g, w in zip(got, want):
                    np.testing.assert_array_equal(g, w, err_msg=f"{name}: capacity {capacity}, K {interval}")
    assert compared > 1500 and preemptions > 100  # (the shapes were replayed, with preemptions)


def _scenarios(rng, rows, k):
    """k batch scenarios for each trace of `rows`, half of them cut at a limit of the full replay (`_limits`)."""
    out = []
    for t, r in enumerate(rows):
        for _ in range(k):
            policy, capacity, interval = stop56_config(rng, r)
            limits = _limits(replay(r, policy, capacity, interval).events, rng)
            out.append(B.Scenario(t, policy, capacity, interval, limits[int(rng.integers(0, len(limits)))]))
    return out


def test_batches_with_one_and_two_threads_equal_simulate_on_stop56_shapes():
    rng = np.random.default_rng(56_003)
    for i in range(40):
        rows = [stop56_trace(rng) for _ in range(2)]
        traces = [load_trace(r) for r in rows]
        scenarios = _scenarios(rng, rows, 3)
        engine = "scan" if i % 3 == 0 else "fast"
        one = B.simulate_batch(traces, scenarios, record_events=True, threads=1, engine=engine)
        two = B.simulate_batch(traces, scenarios, record_events=True, threads=2, engine=engine)
        same_arrays(one, two, i)
        for s, sc in enumerate(scenarios):
            alone = simulate(traces[sc.trace], sc.policy, sc.free_kv_blocks, sc.aging_interval, sc.max_steps)
            same_arrays(two.result(s), alone, (i, s))


CUDASIM = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_exact_stop56 import _scenarios, stop56_trace
    from decodesched import batch as B, load_trace

    rng = np.random.default_rng(56_004)
    cases = 0
    for i in range(20):
        rows = [stop56_trace(rng) for _ in range(2)]
        traces = [load_trace(r) for r in rows]
        scenarios = _scenarios(rng, rows, 4)
        for record in (True, False):
            cpu = B.simulate_batch(traces, scenarios, record_events=record)
            gpu = B.simulate_batch(traces, scenarios, record_events=record, backend="cuda")
            for name in ("request_state", "summary", "event_log"):
                a, b = getattr(cpu, name), getattr(gpu, name)
                assert (a is None) == (b is None), name
                assert a is None or (a.shape == b.shape and np.array_equal(a, b)), (name, record, i)
            cases += 1
    print(json.dumps({"cases": cases}))
""")


def test_cuda_simulator_equals_cpu_batch_on_stop56_shapes():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", CUDASIM, os.path.dirname(__file__)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"cases": 40}
