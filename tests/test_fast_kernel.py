"""The fast kernel equals the model event for event, and the scan kernel on long overloaded traces.

* thousands of small random traces (tests/oracle.py) against the pure-Python model, every policy;
* long backlogged random traces (tight capacity, preemptions, far deadlines, aging intervals from 1
  to 10**6) against the scan kernel, array for array (events, final request state, summary);
* a prefix of the real Azure 2023 conversation trace at offered load 1.5;
* the ordered structures (treap with min-blocks aggregate, heap) against sorted Python lists.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import POLICIES, assert_matches_model, configs, traces, wide_configs

from decodesched.engine import policy_code, simulate, trace_arrays
from decodesched.kernels import enums as E
from decodesched.kernels.aging_nb import (
    AK_PACKED,
    BIG_AT,
    BLOCKS_ALTERNATE,
    BLOCKS_ALWAYS,
    BLOCKS_COUNTED,
    BLOCKS_NEVER,
    BLOCKS_OFF_DEN,
    BLOCKS_OFF_NUM,
    BLOCKS_ON_DEN,
    BLOCKS_ON_NUM,
    COLD_AT,
    FRONT,
    GROUPED_ALL_SLOTS,
    GROUPED_DIV,
    GROUPED_RATIO,
    HM_CAP,
    HM_HOT,
    HM_LO,
    HM_N,
    SMALL_AT,
    SOURCE_STAMP,
    _adm_first,
    _adm_put,
    _adm_take,
    _compressed_priorities,
    _fluid_backlog,
    _front_add,
    _grouped_mode,
    _list_add,
    _list_live,
    _list_remove,
    _make_replay_aging,
    _new_admitted,
    _want_blocks,
    replay_aging_nb,
)
from decodesched.kernels.fast_nb import _heap_layout, _sort_stable, replay_fast_nb
from decodesched.kernels.ordered_nb import (
    RANK_OUT,
    heap_push_nb,
    heap_remove_nb,
    heap_sift_down_nb,
    pack_key_nb,
    pack_layout_nb,
    pk_less_nb,
    prefetch_nb,
    unlikely_nb,
    ND_BASE,
    ND_MAXBASE,
    rank_tree_first_fit_nb,
    rank_tree_first_runnable_nb,
    rank_tree_set_nb,
    treap_delete_nb,
    treap_first_fit_nb,
    treap_first_runnable_nb,
    treap_insert_nb,
    treap_nodes_nb,
)
from decodesched.kernels.scan_nb import replay_scan_nb
from decodesched.synthetic import backlog_trace
from decodesched.trace import load_trace

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def run_kernel(kernel, trace, policy, capacity, interval=4, max_steps=-1):
    n_events = trace.work_steps if max_steps < 0 else min(trace.work_steps, max_steps)
    events = np.zeros((n_events, E.EV_NCOLS), np.int64)
    req_out = np.zeros((len(trace), E.RQ_NCOLS), np.int64)
    summary = np.zeros(E.SM_NCOLS, np.int64)
    kernel(*trace_arrays(trace), policy_code(policy), capacity, interval, max_steps, events, req_out, summary)
    return events[: summary[E.SM_EVENTS]], req_out, summary


def assert_same_as_scan(trace, policy, capacity, interval=4, max_steps=-1):
    fast = run_kernel(replay_fast_nb, trace, policy, capacity, interval, max_steps)
    scan = run_kernel(replay_scan_nb, trace, policy, capacity, interval, max_steps)
    ev_f, ev_s = fast[0], scan[0]
    assert ev_f.shape == ev_s.shape, f"{policy}: {len(ev_f)} events, scan {len(ev_s)}"
    bad = np.nonzero((ev_f != ev_s).any(axis=1))[0]
    assert bad.size == 0, f"{policy}: first differing event {bad[0]}: fast {ev_f[bad[0]]} scan {ev_s[bad[0]]}"
    np.testing.assert_array_equal(fast[1], scan[1])
    np.testing.assert_array_equal(fast[2], scan[2])
    return fast


@pytest.mark.parametrize("policy", POLICIES)
def test_matches_model_on_small_random_traces(policy):
    @settings(max_examples=1000, **SETTINGS)
    @given(rows=traces(), cfg=configs)
    def check(rows, cfg):
        _, capacity, interval, max_steps = cfg
        result = simulate(rows, policy=policy, free_kv_blocks=capacity, aging_interval=interval,
                          max_steps=max_steps, engine="fast")
        assert_matches_model(result, rows, policy, capacity, interval, max_steps)

    check()


@settings(max_examples=300, **SETTINGS)
@given(rows=traces(max_requests=30, max_len=8, max_arrival=20, max_blocks=10),
       policy=st.sampled_from(POLICIES), capacity=st.integers(0, 25), interval=st.integers(1, 6))
def test_matches_model_on_busier_random_traces(rows, policy, capacity, interval):
    result = simulate(rows, policy=policy, free_kv_blocks=capacity, aging_interval=interval, engine="fast")
    assert_matches_model(result, rows, policy, capacity, interval, None)


@settings(max_examples=600, **SETTINGS)
@given(rows=traces(max_requests=30, max_len=8, max_arrival=20, max_blocks=10, wide_priorities=True),
       cfg=wide_configs)
def test_matches_model_with_wide_priorities(rows, cfg):
    """Priority shapes that make many classes (all distinct, SJF, +-2**53, negative), deadlines on
    every request in half the traces, capacities from none to unlimited."""
    policy, capacity, interval, max_steps = cfg
    result = simulate(rows, policy=policy, free_kv_blocks=capacity, aging_interval=interval,
                      max_steps=max_steps, engine="fast")
    assert_matches_model(result, rows, policy, capacity, interval, max_steps)


def reshaped(trace, shape, seed, all_deadlines):
    """`trace` with priorities in `shape` (and a deadline on every request if `all_deadlines`)."""
    rng = np.random.default_rng(seed)
    cols = trace.columns()
    n = len(trace)
    cols["priority"] = {
        "distinct": rng.permutation(n).astype(np.int64) - n // 2,
        "sjf": -trace.max_new_tokens,
        "wide": rng.integers(-(2**53), 2**53, n, endpoint=True),
    }[shape]
    if all_deadlines:
        cols["deadline_step"] = (trace.arrival_step + rng.integers(1, 40 * (2 + trace.max_new_tokens))).tolist()
    return load_trace(cols)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("shape,all_deadlines", [("distinct", False), ("sjf", True), ("wide", True)])
@pytest.mark.parametrize("capacity", [12, 40, 2**61])
def test_equals_scan_with_many_priorities(policy, shape, all_deadlines, capacity):
    """Bigger backlogged traces whose priorities make a class per request (or per length): the fast
    kernel's waiting structures span many classes, so their walks are not single descents."""
    trace = reshaped(backlog_trace(1200, seed=41, priorities=3, max_blocks=12, non_preemptible_fraction=0.1),
                     shape, 7, all_deadlines)
    _, req_out, summary = assert_same_as_scan(trace, policy, capacity, interval=3)
    assert summary[E.SM_STOP] == E.STOP_DRAINED
    if policy != "fcfs" and capacity < 100:
        assert req_out[:, E.RQ_PREEMPTIONS].sum() > 0  # preemption is exercised


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed,n,capacity", [(1, 300, 12), (2, 1000, 30), (3, 2000, 50)])
def test_equals_scan_on_overloaded_traces(policy, seed, n, capacity):
    trace = backlog_trace(n, seed=seed, priorities=4, max_blocks=12, non_preemptible_fraction=0.2)
    events, req_out, summary = assert_same_as_scan(trace, policy, capacity, interval=3)
    assert summary[E.SM_EVENTS] > n  # it ran the backlog, not a stub
    if policy != "fcfs":
        assert req_out[:, E.RQ_PREEMPTIONS].sum() > 0  # the traces do exercise preemption


@pytest.mark.parametrize("interval", [1, 7, 64])
def test_aging_equals_scan_with_many_residues(interval):
    """Aging keeps one structure per residue of (enqueue step + times chosen) mod interval."""
    trace = backlog_trace(800, seed=9, priorities=5, max_blocks=10, non_preemptible_fraction=0.3)
    _, req_out, _ = assert_same_as_scan(trace, "aging", 25, interval=interval)
    assert req_out[:, E.RQ_PREEMPTIONS].sum() > 0


@pytest.mark.parametrize("interval", [65, 100, 1000, 3000])
def test_aging_equals_scan_with_long_intervals(interval):
    """Intervals above 64 run on the aging kernel too (it holds only the non-empty residues); 3000
    exceeds the number of slots, so residues collide in its residue -> slot table."""
    for seed, n, capacity in [(21, 800, 25), (22, 300, 12)]:
        trace = backlog_trace(n, seed=seed, priorities=5, max_blocks=10, non_preemptible_fraction=0.3)
        assert interval <= trace.work_steps  # a real aging replay, not the fixed_priority shortcut
        events, req_out, _ = assert_same_as_scan(trace, "aging", capacity, interval=interval)
        assert req_out[:, E.RQ_PREEMPTIONS].sum() > 0
        fixed = run_kernel(replay_scan_nb, trace, "fixed_priority", capacity)[0]
        assert fixed.shape != events.shape or (fixed != events).any()  # aging did change the schedule


def random_small_trace(rng):
    """A small random trace: up to 120 requests, arrivals bunched or spread, 1-5 priority classes,
    a random share of cache hits and of preemptible requests, blocks up to 15."""
    n = int(rng.integers(5, 120))
    return load_trace({
        "request_id": rng.permutation(n).astype(np.int64),
        "arrival_step": np.sort(rng.integers(0, int(rng.integers(1, 400)), n)),
        "prompt_len": rng.integers(1, 20, n),
        "max_new_tokens": rng.integers(1, int(rng.integers(2, 40)), n),
        "priority": rng.integers(0, int(rng.integers(1, 6)), n),
        "cache_hit": rng.random(n) < rng.random(),
        "required_blocks": rng.integers(1, int(rng.integers(2, 16)), n),
        "deadline_step": [None] * n,
        "preemptible": rng.random(n) < rng.random(),
    })


def test_aging_rise_certificates_equal_scan_on_many_random_traces():
    """A residue's rise of priorities keeps its cached answers when its certificate holds
    (`_cert_holds`): what can break one (free blocks grown, a victim joined or moved, the champion
    past a point's limit or back after another ran, a front grown) is rare at a given rise, so this
    replays 10,000 seeded random traces (each a fraction of a millisecond) against the scan kernel,
    every other one with parts in B+trees from 3 rows on (a slot per residue: the real kernel takes
    small traces in grouped mode, which has no certificates).  Intervals are 1-8 for two traces in
    three, where residues rise often, and 9-299 for the third, where a residue's rises are far apart
    and more can happen between them."""
    rng = np.random.default_rng(20261203)
    for i in range(10_000):
        trace = random_small_trace(rng)
        capacity = int(rng.integers(3, 40))
        interval = int(rng.integers(9, 300)) if i % 3 == 2 else int(rng.integers(1, 9))
        kernel = replay_aging_btree_nb if i % 2 else replay_aging_residues_nb
        fast = run_aging_kernel(trace, capacity, interval, kernel=kernel)
        scan = run_kernel(replay_scan_nb, trace, "aging", capacity, interval)
        for a, b in zip(fast, scan):
            np.testing.assert_array_equal(a, b, err_msg=f"capacity {capacity}, interval {interval}")


def test_aging_rise_certificate_counts_free_blocks_grown_since():
    """Found by the test above without the free-blocks condition of `_cert_holds` (shrunk): blocks
    freed between two rises of a residue let a row before its cached answer run at the second."""
    trace = load_trace({
        "request_id": [58, 103, 66, 100, 85, 110, 69, 97, 96, 16, 95, 54, 67, 10, 29, 4, 11, 80, 21, 86, 77, 87,
                       51, 104, 35, 22, 82, 93, 19],
        "arrival_step": [0, 0, 5, 5, 5, 5, 13, 13, 18, 24, 33, 33, 36, 37, 39, 42, 47, 48, 48, 49, 49, 53, 54, 54,
                         68, 68, 79, 79, 79],
        "prompt_len": [4, 1, 1, 1, 1, 4, 1, 1, 1, 13, 1, 5, 1, 3, 7, 8, 1, 16, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1],
        "max_new_tokens": [11, 1, 10, 8, 2, 2, 3, 1, 8, 5, 5, 5, 2, 2, 9, 7, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        "priority": [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 1, 1, 0, 0, 0],
        "cache_hit": [True] * 7 + [False] + [True] * 21,
        "required_blocks": [1, 1, 7, 4, 1, 1, 2, 5, 3, 3, 6, 3, 4, 4, 4, 1, 1, 5, 3, 2, 3, 6, 1, 3, 5, 3, 1, 1, 2],
        "deadline_step": [None] * 29,
        "preemptible": [bool(int(c)) for c in "10101111100110001111010111000"],
    })
    _, req_out, _ = assert_same_as_scan(trace, "aging", 31, interval=5)
    assert req_out[:, E.RQ_PREEMPTIONS].sum() > 0


@pytest.mark.parametrize("interval", [1, 3, 50])
def test_aging_equals_scan_with_many_priorities_and_sizes(interval):
    """Many priority values and block sizes: a residue's rows before its cached answer need more than
    FRONT points to describe, so fronts merge points and must stay bounds (a walk too few would show)."""
    for seed, capacity in [(31, 40), (32, 90)]:
        trace = backlog_trace(1500, seed=seed, priorities=40, max_blocks=36, non_preemptible_fraction=0.15,
                              cache_fraction=0.5)
        _, req_out, _ = assert_same_as_scan(trace, "aging", capacity, interval=interval)
        assert req_out[:, E.RQ_PREEMPTIONS].sum() > 0


def test_front_bounds_every_point_it_was_given():
    """`_front_add` keeps at most FRONT points, bases descending, and every point added is dominated
    by one of them (fewer or equal blocks, higher or equal base): the bound the aging kernel relies on."""
    rng = np.random.default_rng(5)
    for trial in range(300):
        fb = np.zeros((2, FRONT + 1), np.int64)
        fx = np.zeros((2, FRONT + 1), np.int64)
        fn = np.zeros(2, np.int64)
        spread = int(rng.integers(1, 60))
        points = [(int(rng.integers(1, spread + 1)), int(rng.integers(-spread, spread + 1)))
                  for _ in range(int(rng.integers(1, 40)))]
        for b, x in points:
            _front_add(1, b, x, fb, fx, fn)
        k = int(fn[1])
        assert 1 <= k <= FRONT and fn[0] == 0
        bases = fx[1, :k]
        assert (np.diff(bases) < 0).all()
        assert (np.diff(fb[1, :k]) < 0).all()  # no point dominates another
        for b, x in points:
            assert ((fb[1, :k] <= b) & (fx[1, :k] >= x)).any(), (trial, b, x)


def run_aging_kernel(trace, capacity, interval, max_steps=-1, kernel=replay_aging_nb):
    events = np.zeros((trace.work_steps, E.EV_NCOLS), np.int64)
    req_out = np.zeros((len(trace), E.RQ_NCOLS), np.int64)
    summary = np.zeros(E.SM_NCOLS, np.int64)
    arrays = trace_arrays(trace)
    kernel(*arrays, capacity, interval, max_steps, events, req_out, summary)
    return events[: summary[E.SM_EVENTS]], req_out, summary


# The aging kernel with every part of 3 rows or more in a B+tree (back in a treap below 2): small
# traces then exercise the B+tree walks and every change of structure, which the real thresholds
# (BIG_AT, SMALL_AT) leave to large backlogs.  One slot per residue at every interval, where the
# real kernel takes small traces in block mode from an interval of BLOCK_MIN on and in grouped mode
# from n / GROUPED_DIV on; the same in block mode from an interval of 2 on (blocks of 2 residues up
# to an interval of 8, the last block of one residue at odd ones); and in grouped mode at every
# interval.  All but the residues' kernel prefetch ahead at every size (the real one from COLD_AT rows).
replay_aging_btree_nb = _make_replay_aging(SOURCE_STAMP, 3, 2, 0, 2, BLOCKS_NEVER, 0)
replay_aging_residues_nb = _make_replay_aging(SOURCE_STAMP, BIG_AT, SMALL_AT, 0, 2, BLOCKS_NEVER)
replay_aging_blocks_nb = _make_replay_aging(SOURCE_STAMP, 3, 2, 0, 2, BLOCKS_ALWAYS, 0)
replay_aging_switching_nb = _make_replay_aging(SOURCE_STAMP, 3, 2, 0, 2, BLOCKS_ALTERNATE, 0)
replay_aging_grouped_nb = _make_replay_aging(SOURCE_STAMP, 3, 2, 2**62, 2, BLOCKS_NEVER, 0, math.inf)
AGING_KERNELS = {"residues": replay_aging_btree_nb, "blocks": replay_aging_blocks_nb,
                 "switching": replay_aging_switching_nb, "grouped": replay_aging_grouped_nb, "real": replay_aging_nb}


@settings(max_examples=300, **SETTINGS)
@given(rows=st.one_of(traces(max_requests=40, max_len=8, max_arrival=20, max_blocks=10),
                     traces(max_requests=40, max_len=8, max_arrival=20, max_blocks=10, wide_priorities=True)),
       capacity=st.integers(0, 25), interval=st.sampled_from([1, 2, 3, 4, 7, 10, 30, 64, 1000]),
       max_steps=st.one_of(st.none(), st.integers(0, 200)), mode=st.sampled_from(sorted(AGING_KERNELS)))
def test_aging_with_btree_parts_matches_scan_on_small_traces(rows, capacity, interval, max_steps, mode):
    trace = load_trace(rows)
    got = run_aging_kernel(trace, capacity, interval, -1 if max_steps is None else max_steps,
                           kernel=AGING_KERNELS[mode])
    want = run_kernel(replay_scan_nb, trace, "aging", capacity, interval, -1 if max_steps is None else max_steps)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_aging_block_part_emptied_just_before_its_split_answers_a_later_row():
    """Shrunk from the Azure trace at K = 4,500 (load 1.0, 2,000 blocks), where block mode chose a
    lower effective priority than the scan kernel: row 11, the only row of block 2's prefill part, is
    chosen at the step before block 2 splits, so its part keeps the taken key while the block is not
    live (as a split block's slot was, before `_block_end`), and nothing walks it again; row 16,
    arriving after the block is whole again with a key after row 11's, must still land before that
    part's (absent) answer.  Blocks of 3 residues at K = 10."""
    n = 17
    priority = [0] * n
    for i in (3, 11, 16):
        priority[i] = -1
    priority[9] = priority[10] = 1
    arrival = [0] * n
    arrival[11], arrival[16] = 6, 18
    trace = load_trace({
        "request_id": list(range(n)), "arrival_step": arrival, "prompt_len": [1] * n, "max_new_tokens": [1] * n,
        "priority": priority, "cache_hit": [i in (3, 5) for i in range(n)], "required_blocks": [1] * n,
        "deadline_step": [None] * n, "preemptible": [i != 14 for i in range(n)],
    })
    want = run_kernel(replay_scan_nb, trace, "aging", 26, 10)
    assert list(want[0][18:19, E.EV_ROW]) == [16]  # the new row's prefill comes first
    for kernel in (replay_aging_blocks_nb, replay_aging_switching_nb):
        got = run_aging_kernel(trace, 26, 10, kernel=kernel)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_aging_block_mode_equals_scan_on_many_random_traces_and_intervals():
    """Block mode with blocks of 2 to 14 residues (K from 2 to 200, a last block shorter at most of
    them), always on and switched every cycle, against the scan kernel on seeded random traces whose
    arrivals spread over hundreds of steps: blocks split and join again many times per trace (the
    test above was the first of two failures in 20,000 such traces before the fix)."""
    rng = np.random.default_rng(20261204)
    for i in range(3_000):
        trace = random_small_trace(rng)
        capacity, interval = int(rng.integers(3, 60)), int(rng.integers(2, 200))
        kernel = replay_aging_switching_nb if i % 2 else replay_aging_blocks_nb
        got = run_aging_kernel(trace, capacity, interval, kernel=kernel)
        want = run_kernel(replay_scan_nb, trace, "aging", capacity, interval)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w, err_msg=f"trace {i}, capacity {capacity}, interval {interval}")


def wide_random_trace(rng):
    """A random trace of 2-160 requests whose shape is drawn too: priorities in 1-5 classes, all
    distinct, shortest-job-first (``-max_new_tokens``), anywhere in +-2**53 or negative only, with
    the extremes +-2**53 mixed in; no deadlines, some, or one on every request; ids small or spread
    over +-2**62; arrivals bunched or spread; any share of cache hits and preemptible requests."""
    n = int(rng.integers(2, 160))
    new = rng.integers(1, int(rng.integers(2, 50)), n)
    shape = int(rng.integers(0, 5))
    if shape == 0:
        priority = rng.integers(0, int(rng.integers(1, 6)), n)
    elif shape == 1:
        priority = rng.permutation(n) - n // 2
    elif shape == 2:
        priority = -new
    elif shape == 3:
        priority = rng.integers(-(2**53), 2**53, n)
    else:
        priority = -rng.integers(1, 2**53, n)
    if rng.random() < 0.2:
        priority = np.where(rng.random(n) < 0.3, rng.choice([-(2**53), 2**53, 0], n), priority)
    arrival = np.sort(rng.integers(0, int(rng.integers(1, 600)), n))
    deadlines = int(rng.integers(0, 3))  # none, some, all
    deadline = [int(d) if deadlines == 2 or (deadlines == 1 and rng.random() < 0.5) else None
                for d in arrival + rng.integers(1, 400, n)]
    request_id = (rng.permutation(n).astype(np.int64) if rng.random() < 0.5
                  else rng.choice(np.arange(-(2**62), 2**62, 2**50, dtype=np.int64), n, replace=False))
    return load_trace({
        "request_id": request_id,
        "arrival_step": arrival,
        "prompt_len": rng.integers(1, 30, n),
        "max_new_tokens": new,
        "priority": priority,
        "cache_hit": rng.random(n) < rng.random(),
        "required_blocks": rng.integers(1, int(rng.integers(2, 20)), n),
        "deadline_step": deadline,
        "preemptible": rng.random(n) < rng.random(),
    })


def test_every_kernel_layout_equals_scan_on_wide_random_traces(tmp_path):
    """Every aging layout (the real kernel; B+tree parts from 3 rows; a slot per residue; block mode
    always on and switched every cycle; grouped mode) and the other policies' fast kernel, against the
    scan kernel on traces whose shape is drawn too (`wide_random_trace`), capacities from 0 to
    unlimited, intervals 1 to 5,000, and a step limit on some.  A campaign of any size:
    ``DECODESCHED_WIDE_TRACES=900000 DECODESCHED_WIDE_SEED=777001 pytest -k wide_random`` (2026-12-05:
    896,608 traces with that seed, no difference; a failing trace is saved as a CSV)."""
    rng = np.random.default_rng(int(os.environ.get("DECODESCHED_WIDE_SEED", "20261205")))
    aging = [replay_aging_nb, replay_aging_btree_nb, replay_aging_residues_nb, replay_aging_blocks_nb,
             replay_aging_switching_nb, replay_aging_grouped_nb]
    for i in range(int(os.environ.get("DECODESCHED_WIDE_TRACES", "1500"))):
        trace = wide_random_trace(rng)
        capacity = int(rng.choice([int(rng.integers(0, 8)), int(rng.integers(8, 60)), 10**6]))
        interval = int(rng.choice([int(rng.integers(1, 9)), int(rng.integers(9, 300)), int(rng.integers(300, 5000))]))
        max_steps = -1 if rng.random() < 0.8 else int(rng.integers(0, 200))
        runs = [(f"aging layout {j}", "aging", kernel) for j, kernel in enumerate(aging)]
        runs += [(policy, policy, None) for policy in ("fixed_priority", "deadline", "fcfs")]
        for what, policy, kernel in runs:
            want = run_kernel(replay_scan_nb, trace, policy, capacity, interval, max_steps)
            if kernel is None:
                got = run_kernel(replay_fast_nb, trace, policy, capacity, interval, max_steps)
            else:
                got = run_aging_kernel(trace, capacity, interval, max_steps, kernel=kernel)
            if not all(np.array_equal(g, w) for g, w in zip(got, want)):
                trace.to_csv(tmp_path / "wide_failure.csv")
                pytest.fail(f"trace {i}: {what} differs from scan (capacity {capacity}, interval {interval}, "
                            f"max_steps {max_steps}); the trace is in {tmp_path / 'wide_failure.csv'}")


@pytest.mark.parametrize("interval", [1, 4, 64, 1000])
def test_aging_with_btree_parts_equals_scan_on_backlogs(interval):
    """Deep B+trees (hundreds of rows a part) with many priorities, sizes and cache ranks, with a slot
    per residue and in grouped mode (where each residue's rows move between two slots' B+trees)."""
    for seed, n, capacity in [(41, 1500, 40), (42, 900, 12)]:
        trace = backlog_trace(n, seed=seed, priorities=40, max_blocks=36, non_preemptible_fraction=0.15,
                              cache_fraction=0.5)
        want = run_kernel(replay_scan_nb, trace, "aging", capacity, interval)
        for kernel in (replay_aging_btree_nb, replay_aging_blocks_nb, replay_aging_switching_nb,
                       replay_aging_grouped_nb):
            got = run_aging_kernel(trace, capacity, interval, kernel=kernel)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
        assert want[1][:, E.RQ_PREEMPTIONS].sum() > 0


def test_aging_block_mode_on_the_azure_trace_at_heavy_load_equals_slots_per_residue():
    """The bundled Azure trace at load 1.5 with K = 1,000: here the real kernel's counts (about 10
    residues' slots made dirty a slot a cycle, see `_want_blocks`) take it into block mode for most
    of the replay (most of its 205 decisions, counted with an instrumented copy), switching in and
    out: 4 M events equal to the kernel that keeps a slot per residue throughout."""
    from decodesched.convert import bundled_trace_path, read_azure, to_trace

    trace = to_trace(read_azure(bundled_trace_path()), load=1.5, seed=0)
    got = run_aging_kernel(trace, 8000, 1000)
    want = run_aging_kernel(trace, 8000, 1000, kernel=replay_aging_residues_nb)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert want[1][:, E.RQ_PREEMPTIONS].sum() > 1000


@settings(max_examples=200, **SETTINGS)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "remove", "live"]), st.integers(0, 11), st.booleans()),
                    max_size=80))
def test_waiting_slot_list_keeps_the_live_slots_first(ops):
    """`_list_add`, `_list_remove` and `_list_live` against a set and a dict: the list holds exactly the
    slots added and not removed, each at its place in lpos, and its first lst[-1] are the live ones
    (the ones `_mark_may_run` marks without passing over the others)."""
    m = 12
    lst = np.zeros(m + 1, np.int64)
    lpos = np.full(m, -1, np.int64)
    live = {}
    cnt = 0
    for op, s, on in ops:
        if op == "add" and s not in live:
            cnt = _list_add(lst, lpos, cnt, s, on)
            live[s] = on
        elif op == "remove" and s in live:
            cnt = _list_remove(lst, lpos, cnt, s)
            del live[s]
        elif op == "live" and s in live and live[s] != on:
            _list_live(lst, lpos, s, on)
            live[s] = on
        assert cnt == len(live) and sorted(lst[:cnt].tolist()) == sorted(live)
        assert all(lpos[x] == i for i, x in enumerate(lst[:cnt])) and (lpos >= 0).sum() == cnt
        assert sorted(lst[:lst[-1]].tolist()) == sorted(x for x, v in live.items() if v)


@pytest.mark.parametrize("on", [False, True])
def test_block_mode_rule_switches_with_a_margin(on):
    """Block mode comes on above BLOCKS_ON_NUM / BLOCKS_ON_DEN residues' slots made dirty per slot
    held and cycle, and goes off below BLOCKS_OFF_NUM / BLOCKS_OFF_DEN, a lower ratio: between the
    two the mode stays, so counts near one threshold do not switch it (and rebuild the blocks) at
    every decision."""
    r_sum = 1000
    up = r_sum * BLOCKS_ON_NUM // BLOCKS_ON_DEN
    down = r_sum * BLOCKS_OFF_NUM // BLOCKS_OFF_DEN
    assert down < up
    assert _want_blocks(BLOCKS_COUNTED, on, up + 1, r_sum)
    assert not _want_blocks(BLOCKS_COUNTED, on, down - 1, r_sum)
    assert _want_blocks(BLOCKS_COUNTED, on, (up + down) // 2, r_sum) == on
    assert _want_blocks(BLOCKS_ALWAYS, on, 0, r_sum)
    assert _want_blocks(BLOCKS_ALTERNATE, on, 0, r_sum) != on
    assert not _want_blocks(BLOCKS_COUNTED, False, 0, 0)


@pytest.mark.parametrize("interval", [10**6, 2**40 + 3])
def test_aging_kernel_itself_with_huge_intervals_equals_scan(interval):
    """The aging kernel called directly (not through the fixed_priority shortcut) with intervals far
    above the trace's work: in grouped mode, as the real kernel runs them, and with every residue its
    own slot, colliding in the table; memory as for small K."""
    trace = backlog_trace(600, seed=23, priorities=5, max_blocks=10, non_preemptible_fraction=0.3)
    want = run_kernel(replay_scan_nb, trace, "aging", 20, interval)
    for kernel in (replay_aging_nb, replay_aging_btree_nb):
        got = run_aging_kernel(trace, 20, interval, kernel=kernel)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    assert want[1][:, E.RQ_PREEMPTIONS].sum() > 0


@settings(max_examples=300, **SETTINGS)
@given(rows=traces(max_requests=30, max_len=8, max_arrival=20, max_blocks=10),
       capacity=st.integers(0, 25), interval=st.sampled_from([6, 9, 17, 33, 64, 65, 100, 1000, 10**6]),
       max_steps=st.one_of(st.none(), st.integers(0, 200)))
def test_aging_with_long_intervals_matches_model(rows, capacity, interval, max_steps):
    result = simulate(rows, policy="aging", free_kv_blocks=capacity, aging_interval=interval, max_steps=max_steps,
                      engine="fast")
    assert_matches_model(result, rows, "aging", capacity, interval, max_steps)


@settings(max_examples=300, **SETTINGS)
@given(prio=st.lists(st.one_of(st.integers(-2**53, 2**53), st.integers(-5, 5)), min_size=1, max_size=12),
       tokens=st.lists(st.integers(1, 40), min_size=12, max_size=12), interval=st.integers(1, 2**62),
       data=st.data())
def test_compressed_priorities_keep_every_effective_priority_comparison(prio, tokens, interval, data):
    """Any two requests with any waits the trace allows (at most its work) compare the same way,
    equality included, under the aging kernel's compressed priorities and interval."""
    priority = np.array(prio, np.int64)
    max_new = np.array(tokens[:len(prio)], np.int64)
    work = int((1 + max_new).sum())
    k, comp, w, fits = _compressed_priorities(priority, max_new, np.int64(interval))
    assert fits and 1 <= k <= interval and int(comp.max()) * int(k) < 2**62 and w == work
    assert int(comp.max()) + 2 * (work // int(k)) + 2 < 2**62  # the tree keys' low part (`_set_aging_key`)
    waits = data.draw(st.lists(st.integers(0, work), min_size=len(prio), max_size=len(prio)))
    for a in range(len(prio)):
        for b in range(len(prio)):
            real = prio[a] + waits[a] // interval - prio[b] - waits[b] // interval
            mine = int(comp[a]) + waits[a] // int(k) - int(comp[b]) - waits[b] // int(k)
            assert (real > 0) == (mine > 0) and (real == 0) == (mine == 0)


def test_a_trace_beyond_the_aging_kernels_keys_replays_exactly_on_every_path():
    """1,449 requests of 2**40 tokens with distinct priorities spread over +-2**53, at an interval no
    wait reaches the end of: valid, but priority x interval leaves int64 in the aging kernel.  The fast
    engine replays it on the scan kernel instead (it raised ValueError, and a batch lost the error and
    gave an empty scenario), the same in a batch on any number of threads."""
    import decodesched

    n = 1449
    trace = load_trace(dict(request_id=np.arange(n), arrival_step=np.zeros(n, np.int64),
                            prompt_len=np.ones(n, np.int64), max_new_tokens=np.full(n, 2**40),
                            priority=-2**53 + np.arange(n) * 2**40, cache_hit=np.zeros(n, bool),
                            required_blocks=np.ones(n, np.int64), deadline_step=[None] * n,
                            preemptible=np.ones(n, bool)))
    k = trace.work_steps
    assert not _compressed_priorities(trace.priority, trace.max_new_tokens, np.int64(k))[3]
    want = run_kernel(replay_scan_nb, trace, "aging", 4, k, max_steps=5)
    got = run_kernel(replay_fast_nb, trace, "aging", 4, k, max_steps=5)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert want[2][E.SM_EVENTS] == 5
    scenarios = decodesched.grid(1, ["fcfs", "aging"], [4], [k], max_steps=5)
    for threads in (1, 2):
        batch = decodesched.simulate_batch([trace], scenarios, threads=threads, record_events=True)
        r = batch.result(1)
        assert r.n_events == 5 and r.stop_reason == "max_steps"
        assert r.timeline() == decodesched.simulate(trace, "aging", 4, k, max_steps=5).timeline()


@settings(max_examples=200, **SETTINGS)
@given(rows=traces(max_requests=30, max_len=8, max_arrival=20, max_blocks=10),
       capacity=st.integers(0, 25), interval=st.integers(1, 400))
def test_aging_kernel_directly_matches_scan_on_small_traces(rows, capacity, interval):
    """Any interval, also above the trace's work (no shortcut): the residue slots come and go."""
    trace = load_trace(rows)
    got = run_aging_kernel(trace, capacity, interval)
    want = run_kernel(replay_scan_nb, trace, "aging", capacity, interval)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_equals_scan_with_far_deadlines_and_oversized_requests():
    """Deadlines whose slack crosses the 1_000_000_000 sentinel during the replay, requests that can
    never fit (more blocks than the capacity), negative ids and one priority per request."""
    rng = np.random.default_rng(7)
    n = 600
    arrival = np.sort(rng.integers(0, 300, n))
    new = rng.integers(1, 6, n)
    has_deadline = rng.random(n) < 0.6
    offset = np.where(rng.random(n) < 0.5, rng.integers(999_999_700, 1_000_000_300, n), rng.integers(2, 40, n))
    trace = load_trace({
        "request_id": rng.permutation(n).astype(np.int64) - n // 2,
        "arrival_step": arrival,
        "prompt_len": rng.integers(1, 20, n),
        "max_new_tokens": new,
        "priority": rng.permutation(n) if n else [],
        "cache_hit": rng.random(n) < 0.3,
        "required_blocks": rng.integers(1, 14, n),
        "deadline_step": [int(a + o) if h else None for a, o, h in zip(arrival, offset, has_deadline)],
        "preemptible": rng.random(n) < 0.8,
    })
    for policy in POLICIES:
        _, req_out, summary = assert_same_as_scan(trace, policy, 12, interval=2)
        assert summary[E.SM_STOP] == E.STOP_STUCK  # the oversized requests are reported, not dropped


def test_max_steps_and_no_event_log_agree_with_scan():
    trace = backlog_trace(500, seed=11)
    for policy in POLICIES:
        assert_same_as_scan(trace, policy, 20, max_steps=777)
        fast = np.zeros((0, E.EV_NCOLS), np.int64), np.zeros((len(trace), E.RQ_NCOLS), np.int64)
        summary = np.zeros(E.SM_NCOLS, np.int64)
        replay_fast_nb(*trace_arrays(trace), policy_code(policy), 20, 4, -1, fast[0], fast[1], summary)
        _, req_out, want = run_kernel(replay_scan_nb, trace, policy, 20)
        np.testing.assert_array_equal(fast[1], req_out)
        np.testing.assert_array_equal(summary, want)


def test_equals_scan_on_azure_prefix_at_load_1_5():
    from decodesched.convert import bundled_trace_path, read_azure, to_trace

    raw = read_azure(bundled_trace_path()).head(500)
    trace = to_trace(raw, load=1.5, seed=0)
    for policy in POLICIES:
        _, req_out, summary = assert_same_as_scan(trace, policy, 400)
        assert summary[E.SM_STOP] == E.STOP_DRAINED


def test_equals_scan_with_a_backlog_on_huge_pages():
    # 70,000 rows: the node and key block (128 bytes a row) spans 2 MiB pages (`huge_full_nb`), and
    # aging prefetches a new answer's successor (from COLD_AT rows on)
    trace = backlog_trace(70_000, seed=5, arrival_span=300)
    assert len(trace) >= COLD_AT
    for policy in ("fixed_priority", "deadline", "fcfs", "aging"):
        assert_same_as_scan(trace, policy, 24, max_steps=400)


def test_nodes_on_huge_pages_start_empty():
    blocks = np.arange(3 * 2**20 // 16, dtype=np.int64) % 7 + 1  # a 3 MiB node block: advised to huge pages
    nd, gk = treap_nodes_nb(blocks, 6)
    assert not gk.any() and (nd[:, :2] == -1).all() and (nd[:, 2] == blocks).all() and (nd[:, 3] == blocks).all()
    assert nd.ctypes.data % 128 == 0 and gk.ctypes.data == nd.ctypes.data + 64


def test_sort_stable_is_a_stable_argsort():
    rng = np.random.default_rng(8)
    for n, lo, hi in ((0, 0, 1), (1, 5, 6), (1_000, -5, 5), (50_000, -(2**62), 2**62), (5_000, 0, 300)):
        key = rng.integers(lo, hi, n, dtype=np.int64)
        key[: n // 3] = np.iinfo(np.int64).min if n > 10 else key[: n // 3]  # both ends of int64
        key[n // 3: n // 2] = np.iinfo(np.int64).max if n > 10 else key[n // 3: n // 2]
        idx = rng.permutation(n).astype(np.int64)
        np.testing.assert_array_equal(_sort_stable(idx, key), idx[np.argsort(key[idx], kind="stable")])


# The ordered structures on their own.

def test_treap_against_sorted_list():
    rng = np.random.default_rng(3)
    n = 400
    blocks = rng.integers(1, 30, n)
    nd, gk = treap_nodes_nb(blocks, 6)
    assert not gk.any() and gk.shape == (n, 6)
    assert nd.ctypes.data % 128 == 0 and gk.ctypes.data == nd.ctypes.data + 64  # a node and its key: one block
    gk[:, 1] = rng.integers(0, 5, n)
    gk[:, 5] = rng.permutation(n)
    stack = np.empty(n + 64, np.int64)
    root = -1
    inside: set[int] = set()
    for _ in range(3000):
        root = _toggle(root, int(rng.integers(0, n)), inside, stack, gk, nd)
        limit = int(rng.integers(0, 32))
        in_order = sorted(inside, key=lambda r: tuple(gk[r]))
        want = next((r for r in in_order if blocks[r] <= limit), -1)
        assert treap_first_fit_nb(root, limit, nd) == want


def _toggle(root, x, inside, stack, gk, nd):
    """Insert row x into the treap, or delete it if it is there (`inside` mirrors the members)."""
    if x in inside:
        inside.remove(x)
        return treap_delete_nb(root, x, stack, gk, nd)
    inside.add(x)
    return treap_insert_nb(root, x, stack, gk, nd)


def random_stairs(rng, n_classes):
    """A random staircase M (records of increasing class and blocks) and M as a Python function."""
    k = int(rng.integers(0, 5))
    st_c = np.sort(rng.choice(n_classes, size=min(k, n_classes), replace=False)).astype(np.int64)
    st_b = np.cumsum(rng.integers(1, 10, st_c.size)).astype(np.int64)

    def m(c):
        return max([int(b) for cc, b in zip(st_c, st_b) if cc < c], default=0)

    return np.append(st_c, 0), np.append(st_b, 0), st_c.size, m


def test_treap_first_runnable_against_sorted_list():
    """The staircase walk: the first row in key order with blocks <= free + M(its class), where the
    classes (ND_BASE) are interleaved with the key order, so subtrees straddle steps of M."""
    rng = np.random.default_rng(4)
    n = 300
    blocks = rng.integers(1, 40, n)
    cls = rng.integers(0, 50, n)
    nd, gk = treap_nodes_nb(blocks, 2)
    nd[:, ND_BASE] = cls
    nd[:, ND_MAXBASE] = cls
    gk[:, 0] = rng.integers(0, 20, n)
    gk[:, 1] = rng.permutation(n)
    stack = np.empty(n + 64, np.int64)
    root = -1
    inside: set[int] = set()
    for _ in range(2000):
        root = _toggle(root, int(rng.integers(0, n)), inside, stack, gk, nd)
        st_c, st_b, k, m = random_stairs(rng, 50)
        free = int(rng.integers(0, 25))
        in_order = sorted(inside, key=lambda r: tuple(gk[r]))
        want = next((r for r in in_order if blocks[r] <= free + m(cls[r])), -1)
        assert treap_first_runnable_nb(root, free, nd, stack, st_c, st_b, k) == want


def test_rank_tree_against_sorted_list():
    """fcfs's waiting structure: min blocks (and max class) over static ranks; first fit = least rank
    that fits; first runnable = least rank with blocks <= limit + M(its class)."""
    rng = np.random.default_rng(6)
    for n, base in [(1, 0), (5, 3), (300, 17)]:
        size = 1
        while size < n:
            size *= 2
        vals = np.full(base + 2 * size + 5, RANK_OUT, np.int64)  # other trees may sit around it
        cls_of = np.full(base + 2 * size + 5, -1, np.int64)
        no_cls = np.full(1, -1, np.int64)  # a tree of one class keeps none
        blocks = rng.integers(1, 30, n)
        classes = rng.integers(0, 20, n)
        single = np.full(base + 2 * size + 5, RANK_OUT, np.int64)
        inside: set[int] = set()
        for _ in range(2000):
            i = int(rng.integers(0, n))
            if i in inside:
                rank_tree_set_nb(vals, cls_of, base, size, i, RANK_OUT, -1)
                rank_tree_set_nb(single, no_cls, base, size, i, RANK_OUT, -1)
                inside.remove(i)
            else:
                rank_tree_set_nb(vals, cls_of, base, size, i, blocks[i], classes[i])
                rank_tree_set_nb(single, no_cls, base, size, i, blocks[i], 0)
                inside.add(i)
            limit = int(rng.integers(0, 32))
            want = min((i for i in inside if blocks[i] <= limit), default=-1)
            assert rank_tree_first_fit_nb(vals, base, size, limit) == want
            assert rank_tree_first_fit_nb(single, base, size, limit) == want
            st_c, st_b, k, m = random_stairs(rng, 20)
            want = min((i for i in inside if blocks[i] <= limit + m(classes[i])), default=-1)
            assert rank_tree_first_runnable_nb(vals, cls_of, base, size, limit, st_c, st_b, k) == want
        assert (vals[:base] == RANK_OUT).all() and (vals[base + 2 * size:] == RANK_OUT).all()
        assert (cls_of[:base] == -1).all() and (cls_of[base + 2 * size:] == -1).all()


def test_prefetch_is_only_a_hint():
    """`prefetch_nb` compiles for the per-request arrays' dtypes, changes nothing and refuses what it
    cannot address."""
    from numba import njit
    from numba.core.errors import TypingError

    @njit
    def touch(flags, counts, i):
        prefetch_nb(flags, i)
        prefetch_nb(counts, np.int32(i))
        return counts[i] + (1 if flags[i] else 0)

    flags = np.array([True, False, True])
    counts = np.array([5, 6, 7], np.int64)
    assert [touch(flags, counts, i) for i in range(3)] == [6, 6, 8]
    assert flags.tolist() == [True, False, True] and counts.tolist() == [5, 6, 7]

    @njit
    def touch_matrix(m):
        prefetch_nb(m, 0)

    with pytest.raises(TypingError):
        touch_matrix(np.zeros((2, 2)))


def test_unlikely_is_only_a_hint():
    """`unlikely_nb` gives back its condition (in a branch and as a value) and refuses a non-boolean."""
    from numba import njit
    from numba.core.errors import TypingError

    @njit
    def count_odd(xs):
        c = 0
        for x in xs:
            if unlikely_nb(x % 2 == 1):
                c += 1
        return c, unlikely_nb(c > 2)

    assert count_odd(np.arange(7)) == (3, True) and count_odd(np.arange(4)) == (2, False)

    @njit
    def not_a_condition(x):
        return unlikely_nb(x)

    with pytest.raises(TypingError):
        not_a_condition(3)


@pytest.mark.parametrize("wide", [False, True])
def test_heap_against_sorted_list(wide):
    """The admitted rows' heap with packed keys: its top is the smallest key after every push, removal
    and key growth, and every entry's position and packed key are right, whether the whole key fits
    the packing or a wide column leaves the later ones to the key matrix (ties on the packed key)."""
    rng = np.random.default_rng(4)
    n = 300
    gk = np.zeros((n, 6), np.int64)
    gk[:, 0] = rng.choice([0, 2**58], n) if wide else rng.integers(0, 3, n)
    gk[:, 4] = rng.integers(0, 50, n)
    gk[:, 5] = np.arange(n)
    lo = np.zeros(6, np.int64)
    hi = np.zeros(6, np.int64)
    hi[0] = gk[:, 0].max()
    hi[4] = 50 + 3 * 3000
    hi[5] = n - 1
    drop, shift = pack_layout_nb(lo, hi)
    assert (shift[5] < 0) == wide  # the request_id's rank is packed only when there is room
    pk = np.concatenate([lo, drop, shift]).reshape(1, 18)
    heap = np.empty((1, n), np.int64)
    hkey = np.empty((1, n), np.int64)
    hsize = np.zeros(1, np.int64)
    pos = np.full(n, -1, np.int64)
    inside: set[int] = set()
    for _ in range(3000):
        x = int(rng.integers(0, n))
        op = rng.integers(0, 3)
        if x in inside and op == 0:
            heap_remove_nb(heap, hkey, hsize, pos, 0, x, gk)
            inside.remove(x)
        elif x not in inside:
            heap_push_nb(heap, hkey, hsize, pos, 0, x, pack_key_nb(gk, x, pk, 0), gk)
            inside.add(x)
        elif hsize[0] > 0:  # the top's key grows, as a decode step does
            top = heap[0, 0]
            gk[top, 4] += int(rng.integers(1, 4))
            hkey[0, 0] = pack_key_nb(gk, top, pk, 0)
            heap_sift_down_nb(heap, hkey, hsize, pos, 0, 0, gk)
        if inside:
            assert heap[0, 0] == min(inside, key=lambda r: tuple(gk[r]))
        assert all(heap[0, pos[r]] == r and hkey[0, pos[r]] == pack_key_nb(gk, r, pk, 0) for r in inside)


@settings(max_examples=300, **SETTINGS)
@given(st.data())
def test_packed_keys_order_like_the_key_matrix(data):
    """A packed key never contradicts the key order, for columns of any width (the first that does not
    fit gives its high bits, the later ones are left out) or left out: a smaller packed key is a
    smaller key, equal keys pack equal, and packed key then key matrix is the key order."""
    m = 4
    lo = np.array(data.draw(st.lists(st.integers(-2**54, 2**54), min_size=m, max_size=m)), np.int64)
    span = data.draw(st.lists(st.sampled_from([-1, 0, 1, 7, 2**20, 2**40, 2**54]), min_size=m, max_size=m))
    hi = lo + np.array(span, np.int64)
    drop, shift = pack_layout_nb(lo, hi)
    assert all(shift[k] < 0 for k in range(m) if span[k] < 0)
    pk = np.concatenate([lo, drop, shift]).reshape(1, 3 * m)
    rows = data.draw(st.lists(st.tuples(*(st.integers(0, max(v, 0)) for v in span)), min_size=2, max_size=12))
    gk = np.array(rows, np.int64) + np.where(np.array(span) < 0, 0, lo)
    keys = [pack_key_nb(gk, r, pk, 0) for r in range(len(rows))]
    assert all(0 <= k < 2**62 for k in keys)
    for a in range(len(rows)):
        for b in range(len(rows)):
            if keys[a] < keys[b]:
                assert tuple(gk[a]) < tuple(gk[b])
            if tuple(gk[a]) == tuple(gk[b]):
                assert keys[a] == keys[b]
            assert pk_less_nb(keys[a], a, keys[b], b, gk) == (tuple(gk[a]) < tuple(gk[b]))


@st.composite
def crowded_traces(draw):
    """Traces whose requests are nearly all admitted at once (the capacity is drawn from their total
    blocks up), in one or two priority classes, so that the admitted rows of a class take turns and
    the heaps sift at most steps; with prompts near 2**40 and deadlines near 2**53 in some, so that
    the packed keys are cut short (a total_len or a deadline - remaining that does not fit)."""
    rows = draw(traces(max_requests=30, max_len=8, max_arrival=6, max_blocks=4))
    long_prompts = draw(st.booleans())
    far_deadlines = draw(st.booleans())
    for row in rows:
        row["priority"] = draw(st.integers(0, 1))
        if long_prompts and draw(st.booleans()):
            row["prompt_len"] = 2**40 - draw(st.integers(0, 8))
        if far_deadlines and row["deadline_step"] is not None and draw(st.booleans()):
            row["deadline_step"] = 2**53 - draw(st.integers(0, 8))
    capacity = draw(st.integers(sum(r["required_blocks"] for r in rows) // 2, 200))
    return rows, capacity


@settings(max_examples=400, **SETTINGS)
@given(case=crowded_traces(), policy=st.sampled_from(["fixed_priority", "deadline", "fcfs"]))
def test_matches_model_with_many_admitted_rows_taking_turns(case, policy):
    rows, capacity = case
    result = simulate(rows, policy=policy, free_kv_blocks=capacity, engine="fast")
    assert_matches_model(result, rows, policy, capacity, 4, None)


def test_packed_keys_cut_short_still_order_the_heap():
    """Prompts near 2**40 and deadlines 2**53 apart leave no room for the whole key in the deadline
    group: its total_len is cut short (every sift packs the key again) and the request_id's rank left
    out (ties go to the key matrix); every admitted row still takes its turn as in the model."""
    rows = [{"request_id": 10 * i, "arrival_step": i % 3, "prompt_len": 2**40 - i % 5 if i % 2 else 1 + i % 4,
             "max_new_tokens": 1 + i % 7, "priority": i % 2, "cache_hit": i % 3 == 0, "required_blocks": 1,
             "deadline_step": (2**53 - i if i % 4 else 5 + i) if i % 3 else None, "preemptible": True}
            for i in range(40)]
    trace = load_trace(rows)
    group = trace.has_deadline.astype(np.int64)
    pk = _heap_layout(E.POLICY_DEADLINE, 2, group, 2, trace.prompt_len, trace.max_new_tokens, trace.deadline_step)
    drop, shift, step = pk[:, 6:12], pk[:, 12:18], pk[:, 18]
    assert step[1] == -1 and drop[1, 0] == 0 and drop[1, 4] > 0 and shift[1, 5] < 0  # total_len's high bits
    assert step[0] > 0 and shift[0, 5] >= 0  # without deadlines the whole key fits
    for policy in ("deadline", "fixed_priority"):
        assert_matches_model(simulate(rows, policy=policy, free_kv_blocks=40, engine="fast"), rows, policy, 40, 4,
                             None)


@pytest.mark.parametrize("slots", [1, 3, 40])
def test_aging_slot_heaps_against_sorted_lists(slots):
    """The admitted rows of the aging kernel's slots (a hot row and a heap each, all heaps in one pool
    of 4 places per row that fills up and is repacked): every slot's first row is its smallest key
    after every put and take, and no row is lost or doubled, whichever rows leave."""
    rng = np.random.default_rng(slots)
    n = 120
    gk = np.zeros((n, 7), np.int64)
    gk[:, AK_PACKED] = rng.integers(0, 4, n) * 2**62 + rng.integers(0, 3, n)
    gk[:, 4] = rng.integers(0, 6, n)
    gk[:, 5] = rng.permutation(n)
    adm = _new_admitted(n, slots)
    adm.pool[:] = -7
    hp, hmeta, hpos = adm.pool, adm.meta, adm.pos
    where = {}  # row -> slot
    repacks = 0
    for i in range(6000):
        x = int(rng.integers(0, n))
        top = hmeta[slots, HM_LO]
        if x in where and rng.random() < 0.5:
            s = where.pop(x)
            first = _adm_take(s, x, adm, gk)
        elif x not in where:
            # rows crowd into one slot after another, so that many heaps once grew large
            s = (i // 200) % slots if rng.random() < 0.8 else int(rng.integers(0, slots))
            gk[x, 4] += 1  # chosen again: one more token
            where[x] = s
            first = _adm_put(s, x, adm, gk)
        else:
            continue
        repacks += hmeta[slots, HM_LO] < top
        rows = sorted((r for r, t in where.items() if t == s), key=lambda r: (gk[r, AK_PACKED], gk[r, 4], gk[r, 5]))
        assert first == (rows[0] if rows else -1) == _adm_first(s, adm, gk)
        for t in range(slots):
            held = [hmeta[t, HM_HOT]] if hmeta[t, HM_HOT] >= 0 else []
            lo, size = hmeta[t, HM_LO], hmeta[t, HM_N]
            held += list(hp[lo:lo + size])
            assert sorted(held) == sorted(r for r, u in where.items() if u == t)
            assert all(hp[lo + hpos[r]] == r for r in hp[lo:lo + size])
            assert size <= hmeta[t, HM_CAP] and lo + hmeta[t, HM_CAP] <= hmeta[slots, HM_LO]
    assert repacks > 0 or slots < 40


def test_fluid_backlog_is_the_mean_number_of_requests_in_the_system():
    """`_fluid_backlog`: n requests arriving at once hold n / 2 on average; requests far apart, one
    at a time, 1 / 2; requests that can never be admitted count for nothing; and on random traces it
    is the mean over the busy steps of the work waiting, stepped one step at a time, divided by the
    mean work of a request (the second value)."""
    n = 10
    order = np.arange(n)
    ones = np.ones(n, np.int64)
    new = np.full(n, 9, np.int64)
    assert _fluid_backlog(np.zeros(n, np.int64), new, ones, 5, order) == pytest.approx((n / 2, 10))
    assert _fluid_backlog(100 * order, new, ones, 5, order) == pytest.approx((0.5, 10))
    big = ones.copy()
    big[4:] = 6
    new[:4] = 3
    assert _fluid_backlog(np.zeros(n, np.int64), new, big, 5, order) == pytest.approx((4 / 2, 4))
    assert _fluid_backlog(np.zeros(n, np.int64), new, big, 0, order) == (0.0, 0.0)
    rng = np.random.default_rng(11)
    for _ in range(20):
        m = int(rng.integers(1, 200))
        arrival = np.sort(rng.integers(0, int(rng.integers(1, 20_000)), m))
        new = rng.integers(1, 300, m)
        work, backlog, area, t = 1 + new, 0, 0, 0
        for a, x in zip(arrival, work):
            while t < a:  # one step at a time: the work waiting after each step
                t += 1
                backlog = max(0, backlog - 1)
                area += backlog
            backlog += int(x)
        area += backlog * (backlog - 1) // 2
        want = area / work.sum() / work.mean()
        got, mean_work = _fluid_backlog(arrival, new, np.ones(m, np.int64), 1, np.arange(m))
        assert got == pytest.approx(want, rel=0.02, abs=0.6) and mean_work == pytest.approx(work.mean())


def test_grouped_mode_is_taken_from_n_over_4_unless_the_backlog_makes_its_moves_dear():
    """No grouped mode below n / GROUPED_DIV, always from n (or GROUPED_ALL_SLOTS) on, and between
    them only while backlog * work / K**1.5 is under GROUPED_RATIO; a replay equals the scan kernel's
    in either mode."""
    n = 40
    order = np.arange(n)
    ones = np.ones(n, np.int64)
    new = np.full(n, 9, np.int64)
    at_once, apart = np.zeros(n, np.int64), 100 * order  # backlogs n / 2 and 1 / 2, work 10

    def mode(k, arrival, div=GROUPED_DIV, m=n):
        return _grouped_mode(k, m, arrival, new, ones, 5, order, div, GROUPED_RATIO)

    assert not mode(n // GROUPED_DIV - 1, apart) and not mode(10**9, apart, div=0)
    assert mode(n, at_once) and mode(n, apart) and mode(GROUPED_ALL_SLOTS, at_once, m=4 * GROUPED_ALL_SLOTS)
    k = n // 3
    assert 0.5 * 10 < GROUPED_RATIO * k**1.5 < n / 2 * 10
    assert mode(k, apart) and not mode(k, at_once)
    for arrival in (at_once, apart):
        rows = [{"request_id": i, "arrival_step": int(arrival[i]), "prompt_len": 1 + i % 4,
                 "max_new_tokens": 9, "priority": i % 3, "cache_hit": i % 2 == 0, "required_blocks": 1 + i % 3,
                 "deadline_step": None, "preemptible": i % 5 != 0} for i in range(n)]
        assert_same_as_scan(load_trace(rows), "aging", 5, interval=k)


def test_aging_with_an_interval_no_wait_reaches_equals_scan():
    """The fast kernel replays aging as fixed_priority when aging_interval exceeds all work steps."""
    trace = backlog_trace(300, seed=5)
    fast = assert_same_as_scan(trace, "aging", 12, interval=trace.work_steps + 1)
    fixed = run_kernel(replay_scan_nb, trace, "fixed_priority", 12)
    np.testing.assert_array_equal(fast[0], fixed[0])
    # and one step below the bound is still a real aging replay, equal to the scan's
    assert_same_as_scan(trace, "aging", 12, interval=trace.work_steps)


def test_every_replay_kernel_takes_the_trace_fields_in_their_one_order():
    """kernels/fields.py defines the trace arrays once: the replay kernels' leading parameters, the
    batch kernels' and the arrays `engine.trace_arrays` passes all follow it."""
    import inspect

    from decodesched.kernels import batch_nb
    from decodesched.kernels.fields import KERNEL_TRACE_ARGS
    from decodesched.trace import TRACE_COLUMNS

    n = len(KERNEL_TRACE_ARGS)
    for kernel in (replay_fast_nb, replay_scan_nb, replay_aging_nb, batch_nb.replay_batch_nb,
                   batch_nb.replay_batch_scan_nb):
        assert tuple(inspect.signature(kernel.py_func).parameters)[:n] == KERNEL_TRACE_ARGS, kernel
    tail = tuple(inspect.signature(replay_scan_nb.py_func).parameters)[n:]
    assert tail == ("policy", "free_kv_blocks", "aging_interval", "max_steps", "events", "req_out", "summary")
    trace = backlog_trace(20, seed=1)
    arrays = trace_arrays(trace)
    # the trace's own arrays (the writable ones its read-only columns view), not copies
    assert len(arrays) == n and arrays[-1] is trace.arrival_order.base and arrays[0] is trace.request_id.base
    assert set(TRACE_COLUMNS) < set(KERNEL_TRACE_ARGS)
