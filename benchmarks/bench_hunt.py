"""Trace shapes the other benchmarks do not draw, each against a plain shape of the same size, same run.

Every cell is ns per event of the fast kernel (process time of a warm replay without the event log, best
of ``--repeats``, divided by the steps that ran); the ratio is to the cell's control.  Shapes:

* ``stairs``: everyone at step 0, one priority each, blocks rising with the priority, unlimited capacity
  (every admitted victim a record of the staircase M; control: random 1-8 blocks).
* ``tight``: m long victims of rising class and blocks fill the capacity but 8 blocks; 20,000 short
  top-class requests stream in above them (control: every victim 3 blocks).  Every admission and finish
  needs M's records: before `fast_nb._stairs` stopped at STAIRS_MAX, O(m log P) each.
* ``crowd``: everyone at step 0, 3 classes, unlimited capacity, so all n are admitted at once; n against
  n / 8 (aging's victim matrix costs O(V) per join, leave and choice: ns per event grows with n).
* ``tokens1``: a backlog of n at step 0 with one token each (every step admits or finishes), all-distinct
  priorities, 64 blocks; n against n / 10.

Further sections (``--sections``; each cell set-up ns per request / marginal ns per event, the replay's
time less that of the same call with ``max_steps=0``, so that a run of few events is not read as slow steps;
the ratio is the marginal cost's):

* ``real``: the Mooncake conversation and Azure 2023 code traces (``--traces``, default ``../shared/traces``)
  converted at loads 0.5, 2.0, 3.0 and 5.0, at 1, 8 and 50 blocks, exactly the largest request and 10**9;
  control: the bundled Azure conversation trace at load 1.0, 8,000 blocks.
* ``synthetic``: n requests at load about 1 (1-400 tokens, 3 classes, 1-8 blocks, 64 blocks) against the
  same reshaped: all arrivals in 10 steps, idle gaps of 10**9 steps, bimodal lengths (1 token, 0.1% 100k),
  prompts of 50k-100k tokens and outputs of 1-7 (and a control of small prompts and the same outputs: the
  cost is the short outputs', not the prompts'), outputs of 500-1,500, deadlines all missed / all equal /
  all distinct, capacities 1, 8, 50, 10**9 and max_steps cutting mid-run.
* ``classes``: everyone at step 0 (1-40 tokens, 64 blocks) with 3, 8, 9, 64 and n distinct priorities,
  at n and 10 n; ratio to 3 classes, and preemptions per 1,000 events (the schedule's own work).  From 9
  classes on a waiting structure holds several (`fast_nb._buckets`), and under deadline the schedule
  preempts more with more classes.
* ``setup``: seconds of ``simulate(trace, policy, 64, max_steps=1)`` for 10 n requests in several shapes
  (the checks, the kernel's structures, one step; target "well under a second" for 1 M), then the CLI
  (``decodesched simulate FILE --max-steps 1``) on the same trace as Parquet and CSV, and on 20 rows.
* ``batch``: `simulate_batch` of many scenarios at 1 and 2 threads against the kernel called in a loop
  (CPU seconds, wall seconds and the 2-thread speed-up; every sampled result checked equal).
* ``more`` (2026-12-07): every built-in policy, aging at intervals 1, 2, 3, 4, 7, 64, 1,000, n (the trace's
  requests) and 2**40, and two user policies (on their scan kernel, O(backlog) a step: at n / 10 requests, n / 5
  for the 50 n shapes, against their own control of that size), on: 50 n requests at one step; bursts of n / 20
  at one step between idle gaps of 10**7 steps; 3 requests of 10**7 tokens among 50 n of one token; half the
  requests never servable; round robin by preemption (one priority, 4 blocks each, all preemptible, load 1.5);
  classes in runs of n / 4 arrivals against alternating at every arrival; deadlines one step after arrival (so
  past at the first step: the trace format needs ``deadline_step > arrival_step``) at load 1.5 and everyone at
  step 0; a capacity of exactly the sum of all blocks and one less.  Each cell marginal ns per event and the
  ratio to its control (the same size at load about 1, 64 blocks; 1-8 or 1 tokens for the 50 n shapes), with
  preemptions per 1,000 events below (the schedule's own work); then `simulate_batch` over 64 scenarios of 10 to
  10 n requests and of 4 requests of 10**7 tokens (wall seconds at 1 and 2 threads, the kernel's CPU seconds in
  a loop).

Usage: ``python benchmarks/bench_hunt.py [--n 20000] [--repeats 2] [--sections victims real ...]`` (the
victims section about 2 minutes on 2 busy cores, every section about 10; ``--n 100000 --sections setup``
gives the set-up of 1 M requests, about 5 minutes, most of it the CLI reading the CSV).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from numba import njit

from decodesched import Policy, Scenario, load_trace, simulate, simulate_batch
from decodesched.convert import bundled_trace_path, read_raw, to_trace
from decodesched.engine import policy_code, trace_arrays
from decodesched.kernels import enums as E
from decodesched.kernels.fast_nb import replay_fast_nb

POLICIES = ("fixed_priority", "aging", "deadline", "fcfs")
UNLIMITED = 2**61 // 4
FEW = 10_000  # events under which a marginal cost is not printed
SECTIONS = ("victims", "real", "synthetic", "classes", "setup", "batch", "more")
SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def _trace(cols, has_deadline):
    cols["deadline_step"] = [int(d) if h else None for d, h in zip(cols["deadline_step"], has_deadline)]
    return load_trace(cols)


def backlog(n, rng, blocks=None, priority=None, new=None):
    new = rng.integers(1, 401, n) if new is None else new
    return _trace({
        "request_id": rng.permutation(n).astype(np.int64), "arrival_step": np.zeros(n, np.int64),
        "prompt_len": rng.integers(1, 500, n), "max_new_tokens": new,
        "priority": rng.integers(0, 3, n) if priority is None else priority,
        "cache_hit": rng.random(n) < 0.3, "required_blocks": rng.integers(1, 9, n) if blocks is None else blocks,
        "deadline_step": (1 + new) * rng.integers(2, 50, n), "preemptible": rng.random(n) < 0.9,
    }, rng.random(n) < 0.5)


def tight(m, rising, rng, n_stream=20000):
    vb = np.arange(1, m + 1, dtype=np.int64) if rising else np.full(m, 3, np.int64)
    arrival = np.concatenate([np.zeros(m, np.int64), m + np.sort(rng.integers(0, 4 * n_stream, n_stream))])
    n = m + n_stream
    trace = _trace({
        "request_id": np.arange(n, dtype=np.int64), "arrival_step": arrival, "prompt_len": rng.integers(1, 500, n),
        "max_new_tokens": np.concatenate([np.full(m, 10**6, np.int64), rng.integers(1, 5, n_stream)]),
        "priority": np.concatenate([np.arange(m, dtype=np.int64), np.full(n_stream, m + 10, np.int64)]),
        "cache_hit": np.zeros(n, bool), "required_blocks": np.concatenate([vb, rng.integers(1, 9, n_stream)]),
        "deadline_step": arrival + 10, "preemptible": np.ones(n, bool),
    }, np.zeros(n, bool))
    return trace, int(vb.sum()) + 8, int(arrival[-1]) + 10  # stop at the stream's end


def replay_time(trace, policy, capacity, repeats, max_steps=-1, interval=4):
    """Best process time of `repeats` warm replays without the event log: (seconds, events, preemptions).
    `policy`: a built-in name (the fast kernel) or a user `Policy` (its own scan kernel)."""
    args = trace_arrays(trace)
    kernel = replay_fast_nb if isinstance(policy, str) else policy.kernel()
    best = float("inf")
    for _ in range(repeats):
        req_out = np.zeros((len(trace), E.RQ_NCOLS), np.int64)
        summary = np.zeros(E.SM_NCOLS, np.int64)
        t = time.process_time()
        kernel(*args, policy_code(policy), capacity, interval, max_steps,
               np.zeros((0, E.EV_NCOLS), np.int64), req_out, summary)
        best = min(best, time.process_time() - t)
    return best, int(summary[E.SM_EVENTS]), int(req_out[:, E.RQ_PREEMPTIONS].sum())


def ns_per_event(trace, policy, capacity, repeats, max_steps=-1, interval=4):
    best, events, _ = replay_time(trace, policy, capacity, repeats, max_steps, interval)
    return best * 1e9 / max(events, 1)


def marginal(trace, policy, capacity, repeats, max_steps=-1, interval=4):
    """(set-up ns per request, marginal ns per event, preemptions per 1,000 events, events): the replay's time
    less that of the same call stopped before its first step."""
    setup = replay_time(trace, policy, capacity, repeats, 0, interval)[0]
    t, events, pre = replay_time(trace, policy, capacity, repeats, max_steps, interval)
    return setup * 1e9 / len(trace), (t - setup) * 1e9 / max(events, 1), 1000 * pre / max(events, 1), events


def spread(n, rng, **over):
    """n requests at offered load about 1 (1-400 tokens), 3 classes, 1-8 blocks, half with a deadline;
    `over` replaces columns (``has_deadline`` too)."""
    new = over.pop("max_new_tokens", rng.integers(1, 401, n))
    arrival = over.pop("arrival_step", np.sort(rng.integers(0, int(new.sum() + n), n)))
    cols = {"request_id": rng.permutation(n).astype(np.int64), "arrival_step": arrival,
            "prompt_len": rng.integers(1, 500, n), "max_new_tokens": new, "priority": rng.integers(0, 3, n),
            "cache_hit": rng.random(n) < 0.3, "required_blocks": rng.integers(1, 9, n),
            "deadline_step": arrival + (1 + new) * rng.integers(2, 50, n), "preemptible": rng.random(n) < 0.9}
    has_deadline = over.pop("has_deadline", rng.random(n) < 0.5)
    cols.update(over)
    return _trace(cols, has_deadline)


def marginal_row(label, cells, control):
    """One line of `marginal` cells: set-up ns / marginal ns (ratio to the control's marginal ns); under
    FEW events (requests that cannot fit the capacity) the events instead: their time is noise."""
    out = "".join(f"{su:6.0f}/{me:6.0f}{me / c[1]:6.2f}x  " if ev >= FEW else f"{su:6.0f}/{ev:>6,} events  "
                  for (su, me, _, ev), c in zip(cells, control))
    print(f"{label:34s}{out}", flush=True)


def header(width=22) -> None:
    print(f"{'':34s}" + "".join(f"{p:<{width}s}" for p in POLICIES))


def section_real(a) -> None:
    print("\nreal traces: set-up ns per request / marginal ns per event (ratio to the bundled Azure "
          "conversation trace at load 1.0, 8,000 blocks)")
    control = [marginal(to_trace(read_raw(bundled_trace_path()), load=1.0, seed=0), p, 8000, a.repeats)
               for p in POLICIES]
    header()
    marginal_row("control", control, control)
    for name in ("mooncake_conversation.jsonl", "azure_llm_2023_code.csv"):
        path = a.traces / name
        if not path.is_file():
            print(f"{path}: not found (--traces DIR), skipped")
            continue
        raw = read_raw(path)
        for load in (0.5, 2.0, 3.0, 5.0):
            trace = to_trace(raw, load=load, seed=0)
            largest = int(trace.required_blocks.max())
            for cap in (1, 8, 50, largest, 10**9):
                marginal_row(f"{name[:8]} load {load}, {cap if cap < 10**9 else '10**9'} blocks",
                             [marginal(trace, p, cap, a.repeats) for p in POLICIES], control)


def section_synthetic(a) -> None:
    n = a.n
    rng = np.random.default_rng(1)
    arr = np.sort(rng.integers(0, 200 * n, n))
    every = {"has_deadline": np.ones(n, bool), "arrival_step": arr}
    short = rng.integers(1, 8, n)
    shapes = {
        "arrivals within 10 steps": (spread(n, rng, arrival_step=np.sort(rng.integers(0, 10, n))), 64),
        "idle gaps of 10**9 steps": (spread(n, rng, arrival_step=np.cumsum(rng.integers(0, 2, n) * 10**9)
                                            + np.arange(n)), 64),
        "bimodal: 1 token, 0.1% 100k": (spread(n, rng, max_new_tokens=np.where(rng.random(n) < 0.001, 100_000, 1)),
                                         64),
        "prompts 50k-100k, outputs 1-7": (spread(n, rng, prompt_len=rng.integers(50_000, 100_000, n),
                                                 max_new_tokens=short), 64),
        "prompts 1-499, outputs 1-7": (spread(n, rng, max_new_tokens=short), 64),
        "prompt 1, outputs 500-1,500": (spread(n, rng, prompt_len=np.ones(n, np.int64),
                                               max_new_tokens=rng.integers(500, 1500, n)), 64),
        "deadlines all missed": (spread(n, rng, deadline_step=arr + 1, **every), 64),
        "deadlines all equal": (spread(n, rng, deadline_step=np.full(n, int(arr[-1]) + 1), **every), 64),
        "deadlines all distinct": (spread(n, rng, deadline_step=arr[-1] + 1 + rng.permutation(n), **every), 64),
        "1 block": (spread(n, rng), 1),
        "8 blocks (the largest request)": (spread(n, rng), 8),
        "50 blocks": (spread(n, rng), 50),
        "10**9 blocks": (spread(n, rng), 10**9),
        "max_steps cutting at a third": (spread(n, rng), 64, 200 * n // 3),
    }
    print(f"\nsynthetic shapes of {n:,} requests: set-up ns per request / marginal ns per event (ratio to "
          "the same size at load about 1, 64 blocks)")
    control = [marginal(spread(n, rng), p, 64, a.repeats) for p in POLICIES]
    header()
    marginal_row("control", control, control)
    for label, (trace, cap, *limit) in shapes.items():
        marginal_row(label, [marginal(trace, p, cap, a.repeats, *limit) for p in POLICIES], control)


def section_classes(a) -> None:
    print("\neveryone at step 0, 1-40 tokens, 64 blocks, by priority classes: marginal ns per event (ratio "
          "to 3 classes), preemptions per 1,000 events")
    header(23)
    for n in (a.n, 10 * a.n):
        rng = np.random.default_rng(n)
        new = rng.integers(1, 41, n)
        base = None
        for label, prio in (("3", rng.integers(0, 3, n)), ("8", rng.integers(0, 8, n)), ("9", rng.integers(0, 9, n)),
                            ("64", rng.integers(0, 64, n)), ("distinct", rng.permutation(n).astype(np.int64))):
            trace = spread(n, rng, max_new_tokens=new, arrival_step=np.zeros(n, np.int64), priority=prio)
            cells = [marginal(trace, p, 64, a.repeats) for p in POLICIES]
            base = base or cells
            out = "".join(f"{me:7.0f}{me / b[1]:6.2f}x{pre:6.0f}p  " for (_, me, pre, _), b in zip(cells, base))
            print(f"{f'n={n:,}, {label} classes':34s}{out}", flush=True)


def section_setup(a) -> None:
    n = 10 * a.n
    rng = np.random.default_rng(2)
    arr = np.sort(rng.integers(0, 200 * n, n))
    new = rng.integers(1, 401, n)
    shapes = {
        "load about 1, 3 classes": spread(n, rng),
        "all at step 0": spread(n, rng, arrival_step=np.zeros(n, np.int64)),
        "distinct priorities": spread(n, rng, priority=rng.permutation(n).astype(np.int64)),
        "priorities within +-2**53": spread(n, rng, priority=rng.integers(-2**53, 2**53, n)),
        "SJF priorities": spread(n, rng, max_new_tokens=new, priority=-new),
        "deadlines all distinct": spread(n, rng, arrival_step=arr, deadline_step=arr[-1] + 1 + rng.permutation(n),
                                         has_deadline=np.ones(n, bool)),
    }
    print(f"\nset-up of {n:,} requests: seconds of simulate(trace, policy, 64, max_steps=1, record_events=False), "
          "warm, best of 2 (wall clock: CPU seconds in brackets)")
    for label, trace in shapes.items():
        cells = []
        for p in POLICIES:
            best = (float("inf"), 0.0)
            for _ in range(2):
                t, c = time.perf_counter(), time.process_time()
                simulate(trace, p, 64, max_steps=1, record_events=False)
                best = min(best, (time.perf_counter() - t, time.process_time() - c))
            cells.append(f"{best[0]:7.2f} s ({best[1]:4.2f})")
        print(f"{label:34s}" + "".join(f"{c:>22s}" for c in cells), flush=True)
    print("the command line, decodesched simulate FILE --policy P --kv-blocks 64 --max-steps 1: wall seconds")
    with tempfile.TemporaryDirectory() as tmp:
        files = {"20 rows, CSV": Path(tmp) / "small.csv", f"{n:,} rows, CSV": Path(tmp) / "t.csv"}
        spread(20, rng).to_csv(files["20 rows, CSV"])
        big = shapes["load about 1, 3 classes"]
        big.to_csv(files[f"{n:,} rows, CSV"])
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq

            cols = {c: pa.array(v) for c, v in big.columns().items() if c != "deadline_step"}
            cols["deadline_step"] = pa.array(big.deadline_step, mask=~big.has_deadline)
            files[f"{n:,} rows, Parquet"] = Path(tmp) / "t.parquet"
            pq.write_table(pa.table(cols), files[f"{n:,} rows, Parquet"])
        except ImportError:
            print("  (no pyarrow: Parquet skipped; pip install 'decodesched[data]')")
        cli = [sys.executable, "-m", "decodesched", "simulate"]
        for label, path in files.items():
            cells = []
            for p in POLICIES:
                t = time.perf_counter()
                subprocess.run(cli + [str(path), "--policy", p, "--kv-blocks", "64", "--max-steps", "1"],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                cells.append(f"{time.perf_counter() - t:7.2f} s")
            print(f"{label:34s}" + "".join(f"{c:>22s}" for c in cells), flush=True)


def section_batch(a) -> None:
    print("\nsimulate_batch against the kernel in a loop: CPU seconds (ratio), wall seconds; 2 threads' speed-up")
    for n, n_sc in ((20, 4000), (2000, 400), (a.n, 16)):
        rng = np.random.default_rng(n)
        traces = [spread(n, rng) for _ in range(4)]
        scenarios = [Scenario(i % 4, POLICIES[i // 4 % 4], 8 + i % 57) for i in range(n_sc)]
        simulate_batch(traces, scenarios[:8], threads=1)
        t, c = time.perf_counter(), time.process_time()
        loop = [replay_time(traces[s.trace], s.policy, s.free_kv_blocks, 1) for s in scenarios]
        loop_t, loop_c = time.perf_counter() - t, time.process_time() - c
        cells, walls = [], []
        for threads in (1, 2):
            t, c = time.perf_counter(), time.process_time()
            batch = simulate_batch(traces, scenarios, threads=threads)
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            walls.append(wall)
            for i in range(0, n_sc, max(1, n_sc // 20)):
                assert batch.result(i).n_events == loop[i][1], f"scenario {i}: the batch differs from the kernel"
            cells.append(f"{threads} thread{'s' * (threads > 1)} {cpu:6.2f} s ({cpu / loop_c:4.2f}x) {wall:6.2f} s")
        print(f"  {n_sc:,} scenarios of {n:,} requests: loop {loop_c:6.2f} s {loop_t:6.2f} s | " + " | ".join(cells)
              + f" | speed-up {walls[0] / walls[1]:4.2f}x", flush=True)


@njit
def _sjf_key(r, clock):
    return (r.phase, r.max_new_tokens - r.generated_len)


@njit
def _business(r, clock):
    return r.priority


@njit
def _oldest_key(r, clock):
    return (-r.priority, r.arrival_step)


USER_POLICIES = (Policy("sjf", key=_sjf_key, effective_priority=_business),
                 Policy("oldest", key=_oldest_key, effective_priority=_business))


def _more_shapes(n, rng):
    """The `more` section's shapes: label -> (make(size) -> (trace, capacity), control make, size factor)."""
    def sized(size, **over):
        return spread(size, rng, **over)

    def zeros(size):
        return np.zeros(size, np.int64)

    def plain(size):
        return sized(size), 64

    def few_tokens(size):
        return sized(size, max_new_tokens=rng.integers(1, 9, size)), 64

    def one_token(size):
        return sized(size, max_new_tokens=np.ones(size, np.int64)), 64

    def giants(size):
        new = np.ones(size, np.int64)
        new[rng.choice(size, 3, replace=False)] = 10**7
        return sized(size, max_new_tokens=new), 64

    def bursts(size):
        burst = max(1, size // 20)
        return sized(size, arrival_step=np.arange(size) // burst * 10**7), 64

    def unservable(size):
        return sized(size, required_blocks=np.where(rng.random(size) < 0.5, rng.integers(65, 10**9, size),
                                                    rng.integers(1, 9, size))), 64

    def round_robin(size):
        new = rng.integers(1, 401, size)
        return sized(size, max_new_tokens=new, arrival_step=np.sort(rng.integers(0, int(new.sum()) * 2 // 3, size)),
                     priority=zeros(size), required_blocks=np.full(size, 4), preemptible=np.ones(size, bool),
                     has_deadline=np.zeros(size, bool)), 64

    def deadline_next(size):
        new = rng.integers(1, 401, size)
        arrival = np.sort(rng.integers(0, int(new.sum()) * 2 // 3, size))
        return sized(size, max_new_tokens=new, arrival_step=arrival, deadline_step=arrival + 1,
                     has_deadline=np.ones(size, bool)), 64

    def capacity(short_by, at_zero=False):
        def make(size):
            trace = sized(size, arrival_step=zeros(size)) if at_zero else sized(size)
            return trace, int(trace.required_blocks.sum()) - short_by
        return make

    return {
        "50n at one step, 1-8 tokens": (lambda size: (sized(size, arrival_step=zeros(size),
                                                           max_new_tokens=rng.integers(1, 9, size)), 64),
                                        few_tokens, 50),
        "3 of 10**7 tokens among 50n of 1": (giants, one_token, 50),
        "bursts of n/20, gaps of 10**7": (bursts, plain, 1),
        "half never servable": (unservable, plain, 1),
        "round robin: 1 class, 4 blocks": (round_robin, plain, 1),
        "classes in runs of n/4": (lambda size: (sized(size, priority=4 * np.arange(size) // size), 64), plain, 1),
        "class alternating every arrival": (lambda size: (sized(size, priority=np.arange(size) % 2), 64), plain, 1),
        "deadline = arrival + 1, load 1.5": (deadline_next, plain, 1),
        "all at 0, deadline step 1": (lambda size: (sized(size, arrival_step=zeros(size),
                                                         deadline_step=np.ones(size, np.int64),
                                                         has_deadline=np.ones(size, bool)), 64), plain, 1),
        "capacity = sum of blocks": (capacity(0), plain, 1),
        "capacity = sum of blocks - 1": (capacity(1), plain, 1),
        "all at 0, capacity = sum - 1": (capacity(1, True), plain, 1),
    }


def _variants(size):
    """(label, policy, interval): every built-in policy and aging interval of the `more` section."""
    return ([("fixed", "fixed_priority", 4)] + [(f"a{k}", "aging", k) for k in (1, 2, 3, 4, 7, 64, 1000)]
            + [("a=n", "aging", size), ("a2^40", "aging", 2**40), ("deadline", "deadline", 4), ("fcfs", "fcfs", 4)])


def section_more(a) -> None:
    n = a.n
    print(f"\nshapes not hunted before, n = {n:,}: marginal ns per event, ratio to the control (user policies at "
          "n / 10 requests against their own control)")
    user = [(p.name, p, 4) for p in USER_POLICIES]
    print(f"{'':34s}" + "".join(f"{lab:>11s}" for lab, _, _ in _variants(n) + user))
    rng = np.random.default_rng(7)
    controls = {}
    for label, (make, control, factor) in _more_shapes(n, rng).items():
        cells, pre = [], []
        for size, runs in ((factor * n, _variants(factor * n)), (max(n // 10 * min(factor, 2), 10), user)):
            trace, cap = make(size)
            if (control, size) not in controls:
                ctrace, ccap = control(size)
                controls[control, size] = {lab: marginal(ctrace, p, ccap, a.repeats, interval=k)
                                           for lab, p, k in runs}
            for lab, p, k in runs:
                _, me, pr, ev = marginal(trace, p, cap, a.repeats, interval=k)
                c = controls[control, size][lab]
                ratio = f"{me / c[1]:5.1f}x" if c[1] > 0 and c[3] >= FEW else "    ?"  # a control of few events
                cells.append(f"{me:5.0f}{ratio}" if ev >= FEW else f"{ev:>9,}ev")
                pre.append(f"{pr:5.0f}/{c[2]:<4.0f}")
        print(f"{label:34s}" + "".join(f"{c:>11s}" for c in cells), flush=True)
        print(f"{'  preemptions/1k events (control)':34s}" + "".join(f"{c:>11s}" for c in pre), flush=True)
    _more_batch(a)


def _more_batch(a) -> None:
    """64 scenarios of very different sizes: simulate_batch's wall seconds at 1 and 2 threads, against the
    kernel's CPU seconds in a loop (the largest scenario alone bounds the 2-thread time from below)."""
    rng = np.random.default_rng(8)
    sizes = np.unique(np.geomspace(10, 10 * a.n, 16).astype(int))
    traces = [spread(int(s), rng) for s in sizes] + [spread(4, rng, max_new_tokens=np.full(4, 10**7))]
    scenarios = [Scenario(i % len(traces), POLICIES[i // len(traces) % 4], 64, 4) for i in range(64)]
    simulate_batch(traces, scenarios[:4], threads=1)
    loop = [replay_time(traces[s.trace], s.policy, s.free_kv_blocks, 1, interval=s.aging_interval)[0]
            for s in scenarios]
    walls, cpus = [], []
    for threads in (1, 2):
        t, c = time.perf_counter(), time.process_time()
        simulate_batch(traces, scenarios, threads=threads)
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    print(f"  simulate_batch, 64 scenarios of 10 to {int(sizes[-1]):,} requests (3 of 4 requests of 10**7 tokens): "
          f"loop {sum(loop):6.2f} s CPU (largest {max(loop):5.2f} s); 1 thread {walls[0]:6.2f} s wall "
          f"({cpus[0]:6.2f} CPU), 2 threads {walls[1]:6.2f} s ({cpus[1]:6.2f}): speed-up {walls[0] / walls[1]:4.2f}x "
          "(wall: on a busy machine read the CPU seconds)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000, help="requests of the stairs and crowd shapes")
    ap.add_argument("--m", type=int, default=4000, help="victims of the tight shape")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    ap.add_argument("--traces", type=Path, default=SHARED_TRACES, help="folder of the Mooncake and Azure code traces")
    a = ap.parse_args()
    warm = backlog(200, np.random.default_rng(9))
    for p in POLICIES:
        ns_per_event(warm, p, 64, 1)
    if "victims" in a.sections:
        section_victims(a)
    for name in SECTIONS[1:]:
        if name in a.sections:
            globals()[f"section_{name}"](a)


def section_victims(a) -> None:
    print(f"{'shape':34s}" + "".join(f"{p:>22s}" for p in POLICIES))

    def row(label, shape, control, policies=POLICIES):
        cells = []
        for p in POLICIES:
            if p not in policies:
                cells.append(f"{'-':>22s}")
                continue
            x = ns_per_event(shape[0], p, shape[1], a.repeats, *shape[2:])
            c = ns_per_event(control[0], p, control[1], a.repeats, *control[2:])
            cells.append(f"{x:8.0f} ns {x / c:6.2f}x  ")
        print(f"{label:34s}" + "".join(f"{s:>22s}" for s in cells), flush=True)

    rng = np.random.default_rng(0)
    n = a.n
    prio = rng.permutation(n).astype(np.int64)
    row(f"stairs n={n:,} vs random blocks", (backlog(n, rng, blocks=prio + 1, priority=prio), UNLIMITED),
        (backlog(n, rng, priority=prio), UNLIMITED), ("fixed_priority", "deadline", "fcfs"))
    row(f"tight m={a.m:,} rising vs equal", tight(a.m, True, rng), tight(a.m, False, rng))
    row(f"crowd n={n:,} vs n/8", (backlog(n, rng), UNLIMITED), (backlog(n // 8, rng), UNLIMITED))
    big = 10 * n
    row(f"tokens1 n={big:,} vs n/10", (backlog(big, rng, priority=rng.permutation(big), new=np.ones(big, np.int64)),
                                       64), (backlog(big // 10, rng, priority=rng.permutation(big // 10),
                                                     new=np.ones(big // 10, np.int64)), 64))


if __name__ == "__main__":
    main()
