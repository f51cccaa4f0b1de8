"""The engines equal the model where a kernel changes its layout or path on its own counts (2026-12-07), on traces
built to sit on and next to each threshold rather than drawn at random:

* aging (`kernels/aging_nb.py`): residue slots alone below BLOCK_MIN (K = 127) and block mode from it (128, 129),
  switched on, off and on again by the kernel's own marks (`_want_blocks`) over one replay; block widths isqrt(K)
  at a square and next to it (143, 144, 145: a last block of one residue); grouped mode from n / GROUPED_DIV on,
  where `_grouped_mode`'s backlog ratio says, at n - 1, n and n + 1; parts turned from treaps into B+trees and back
  (BIG_AT, SMALL_AT) in residue and grouped mode; an interval at the trace's work and one past it (replayed as
  fixed_priority);
* the fast kernel (`kernels/fast_nb.py`): 8 and 9 priority classes (MAX_BUCKETS: a bucket per class, then ranges)
  and victims whose blocks rise with their class, so that the records of M number STAIRS_MAX - 1 to STAIRS_MAX + 1;
* the batch kernel (prange) with scenarios on both sides of the aging thresholds in one call, at 1 and 2 threads.

Which path a replay takes is not visible from outside; the traces were checked to take it by running the kernels
in pure Python (NUMBA_DISABLE_JIT) with `_want_blocks`, `_blocks_on`, `_blocks_off`, `_to_btree` and `_to_treap`
counted (the counts are in the builders' docstrings); `_grouped_mode` itself is asserted here.  The model replays
the traces where block mode switches (K = 128) and around the grouped crossing (133, 134); the scan kernel (the
model's equal in every other test file) stands in for it at the other intervals and cuts."""

import math

import numpy as np
import pytest
from oracle import assert_matches_model

from decodesched import Scenario, load_trace, simulate, simulate_batch
from decodesched.engine import trace_arrays
from decodesched.kernels import aging_nb, fast_nb


def _same(a, b):
    """Two results hold the same event log, per-request state and summary."""
    assert np.array_equal(a.event_log, b.event_log), "event logs differ"
    assert np.array_equal(a.request_state, b.request_state), "per-request states differ"
    assert np.array_equal(a.summary, b.summary), "summaries differ"


def _trace(rng, arrival, new, priority, blocks, preemptible=0.9, deadlines=0.0):
    n = len(arrival)
    deadline = [int(a + 3 * w) if rng.random() < deadlines else None for a, w in zip(arrival, new)]
    return load_trace({"request_id": rng.permutation(n).astype(np.int64) * 5 - 3 * n, "arrival_step": arrival,
                       "prompt_len": rng.integers(1, 4, n), "max_new_tokens": new, "priority": priority,
                       "cache_hit": rng.random(n) < 0.3, "required_blocks": blocks, "deadline_step": deadline,
                       "preemptible": rng.random(n) < preemptible})


def _on_off():
    """630 requests at a capacity of 3 blocks: 600 of 1-2 tokens, about one an arrival step (finishes mark every
    residue several times a cycle: block mode goes on at K = 128), then 30 of 150-299 tokens from step 300 to
    1,200 (a finish every few cycles: it goes off).  Counted at K = 128 and 129: `_blocks_on` and `_blocks_off`
    twice each; at 145 once each.  Grouped from K = 200 on (`_grouped_mode`'s ratio, above n / 4 = 158)."""
    rng = np.random.default_rng(0)
    arrival = np.concatenate([np.sort(rng.integers(0, 600, 600)), np.sort(rng.integers(300, 1200, 30))])
    new = np.concatenate([rng.integers(1, 3, 600), rng.integers(150, 300, 30)])
    n = len(arrival)
    return load_trace({"request_id": np.arange(n, dtype=np.int64), "arrival_step": arrival,
                       "prompt_len": rng.integers(1, 4, n), "max_new_tokens": new,
                       "priority": rng.integers(0, 3, n), "cache_hit": rng.random(n) < 0.3,
                       "required_blocks": rng.integers(1, 3, n), "deadline_step": [None] * n,
                       "preemptible": rng.random(n) < 0.9}), 3


def _backlog():
    """520 requests of 1-12 tokens within 20 steps at a capacity of 3 blocks: a backlog of about n / 2 whose
    `_grouped_mode` ratio puts grouped mode at K = 134, above n / 4 = 130 (at 133 block mode goes on by its
    counts); its parts pass BIG_AT rows and fall back below SMALL_AT: at K = 2 (residue mode) 7 times, at 134
    (grouped) 42, in B+trees of two levels."""
    rng = np.random.default_rng(1)
    n = 520
    return _trace(rng, np.sort(rng.integers(0, 20, n)), rng.integers(1, 13, n), rng.integers(0, 3, n),
                  rng.integers(1, 3, n)), 3


def _grouped(trace, capacity, k):
    a = dict(zip(("request_id", "arrival_step", "prompt_len", "max_new_tokens", "priority", "cache_hit",
                  "required_blocks", "deadline_step", "has_deadline", "preemptible", "order"), trace_arrays(trace)))
    return aging_nb._grouped_mode(k, len(trace), a["arrival_step"], a["max_new_tokens"], a["required_blocks"],
                                  capacity, a["order"], aging_nb.GROUPED_DIV, aging_nb.GROUPED_RATIO)


@pytest.fixture(scope="module")
def on_off():
    return _on_off()


@pytest.fixture(scope="module")
def backlog():
    return _backlog()


def test_the_traces_sit_where_the_kernel_switches(on_off, backlog):
    """The thresholds the traces were built for are the kernel's (a change of a constant moves them)."""
    assert aging_nb.BLOCK_MIN == 128 and aging_nb.GROUPED_DIV == 4
    assert [math.isqrt(k) for k in (143, 144, 145)] == [11, 12, 12]  # 145: a last block of one residue
    trace, cap = on_off
    assert [_grouped(trace, cap, k) for k in (157, 158, 199, 200, 630)] == [False] * 3 + [True] * 2
    trace, cap = backlog
    assert [_grouped(trace, cap, k) for k in (129, 130, 133, 134, 519, 520)] == [False] * 3 + [True] * 3
    assert aging_nb.BIG_AT == 64 and aging_nb.SMALL_AT == 32


def test_block_mode_on_off_and_on_again_equals_the_model(on_off):
    """K = 128 (BLOCK_MIN): on, off, on and off again by the kernel's counts; the scan kernel at 127 and 129."""
    trace, cap = on_off
    result = simulate(trace, "aging", cap, 128)
    assert_matches_model(result, list(trace.rows()), "aging", cap, 128, None)
    _same(result, simulate(trace, "aging", cap, 128, engine="scan"))


@pytest.mark.parametrize("k", [133, 134])
def test_grouped_ratio_crossing_and_btree_parts_equal_the_model(backlog, k):
    trace, cap = backlog
    result = simulate(trace, "aging", cap, k)
    assert_matches_model(result, list(trace.rows()), "aging", cap, k, None)


def test_neighbouring_intervals_equal_the_scan_kernel(on_off, backlog):
    """BLOCK_MIN, block widths at and next to squares, n / 4 and n on both sides, on both traces."""
    for trace, cap in (on_off, backlog):
        n = len(trace)
        q = -(-n // 4)
        for k in sorted({2, 3, 4, 127, 128, 129, 143, 144, 145, 168, 169, 170, q - 1, q, q + 1, n - 1, n, n + 1}):
            _same(simulate(trace, "aging", cap, k), simulate(trace, "aging", cap, k, engine="scan"))


def test_cuts_at_the_mode_decisions_equal_the_scan_kernel(on_off, backlog):
    """max_steps at, before and after the cycle starts where block mode is decided (every max(K, n) steps, at
    steps % K == 0): the cut replay is the scan kernel's and a prefix of the whole one."""
    for trace, cap in (on_off, backlog):
        n = len(trace)
        for k in (2, 128, 133, 134, 145):
            whole = simulate(trace, "aging", cap, k)
            first = -(-max(k, n) // k) * k  # the first decision
            for cut in sorted({1, k - 1, k, k + 1, first - 1, first, first + 1, 2 * first, 2 * first + 1}):
                result = simulate(trace, "aging", cap, k, cut)
                _same(result, simulate(trace, "aging", cap, k, cut, engine="scan"))
                assert np.array_equal(result.event_log, whole.event_log[:cut])


def test_interval_at_the_trace_work_equals_the_model():
    """fast_nb replays an interval above the work as fixed_priority; at the work itself, the aging kernel."""
    rng = np.random.default_rng(2)
    n = 40
    new = rng.integers(1, 6, n)
    trace = _trace(rng, np.sort(rng.integers(0, 8, n)), new, rng.integers(0, 3, n), rng.integers(1, 4, n),
                   deadlines=0.3)
    work = int((1 + new).sum())
    rows = list(trace.rows())
    for k in (work // 2, work - 1, work, work + 1):
        assert_matches_model(simulate(trace, "aging", 4, k), rows, "aging", 4, k, None)


def _stairs(holders):
    """`holders` long requests of priorities 0.. with blocks 1.. (admitted first, filling the capacity exactly:
    victims whose prefix maxima of blocks by class give `holders` records of M), then 30 short ones one class
    above them needing 1 to `holders` blocks, which preempt them (but under deadline: deadlines run first)."""
    rng = np.random.default_rng(holders)
    arrival = np.concatenate([np.zeros(holders, np.int64), np.sort(rng.integers(holders + 2, holders + 80, 30))])
    new = np.concatenate([np.full(holders, 60), rng.integers(1, 4, 30)])
    priority = np.concatenate([np.arange(holders), np.full(30, holders)])
    blocks = np.concatenate([np.arange(1, holders + 1), rng.integers(1, holders + 1, 30)])
    trace = _trace(rng, arrival, new, priority, blocks, preemptible=1.0, deadlines=0.5)
    return trace, holders * (holders + 1) // 2


@pytest.mark.parametrize("holders", [7, 8, fast_nb.STAIRS_MAX - 1, fast_nb.STAIRS_MAX, fast_nb.STAIRS_MAX + 1])
def test_buckets_and_stairs_at_their_limits_equal_the_model(holders):
    """Classes: holders + 1 (8 and 9 around MAX_BUCKETS = 8); records of M: holders (around STAIRS_MAX = 32)."""
    assert fast_nb.MAX_BUCKETS == 8
    trace, cap = _stairs(holders)
    rows = list(trace.rows())
    for policy in ("fixed_priority", "deadline", "aging"):
        result = simulate(trace, policy, cap, 7)
        assert policy == "deadline" or result.requests["preemptions"].sum() > 0  # (deadlines run first there)
        assert_matches_model(result, rows, policy, cap, 7, None)
        _same(result, simulate(trace, policy, cap, 7, engine="scan"))


def test_batch_across_the_thresholds_at_one_and_two_threads(on_off, backlog):
    """One prange batch holding scenarios on both sides of each threshold equals the replays one at a time."""
    traces = [on_off[0], backlog[0]]
    scenarios = [Scenario(0, "aging", on_off[1], k) for k in (127, 128, 158, 199, 200, 630)]
    scenarios += [Scenario(1, "aging", backlog[1], k) for k in (2, 129, 133, 134, 520)]
    scenarios += [Scenario(1, "fixed_priority", backlog[1]), Scenario(0, "deadline", on_off[1])]
    one = simulate_batch(traces, scenarios, record_events=True, threads=1)
    two = simulate_batch(traces, scenarios, record_events=True, threads=2)
    for i, sc in enumerate(scenarios):
        alone = simulate(traces[sc.trace], sc.policy, sc.free_kv_blocks, sc.aging_interval)
        _same(one.result(i), alone)
        _same(two.result(i), alone)
