"""Engine benchmark (engine issue): the pure-Python model vs the kernels, in one run.

1. A 2,000-request backlogged trace (decodesched.synthetic.backlog_trace): events per second of the model,
   the scan kernel and the fast kernel over the same first WINDOW steps (where the backlog is largest),
   and their ratios.  The kernels repeat the window until at least 1 s has passed.
2. The full Azure 2023 conversation trace at offered load 0.8, per policy, with the event log:
   warm time, and cold time (a fresh process with an empty Numba cache: import, compile, first result).

    python benchmarks/bench_engine.py [--window 1500] [--load 0.8] [--skip-cold]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import decodesched
from decodesched.convert import bundled_trace_path, read_azure, to_trace
from decodesched.model import replay
from decodesched.synthetic import backlog_trace

POLICIES = ("fixed_priority", "aging", "deadline", "fcfs")


def events_per_second(fn, min_seconds: float = 1.0) -> tuple[float, int]:
    n_events, runs, start = 0, 0, time.perf_counter()
    while True:
        n_events += fn()
        runs += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return n_events / elapsed, runs


def backlog_section(window: int) -> None:
    trace = backlog_trace(2000, seed=0)
    rows = trace.rows()
    capacity = 40
    print(f"\n== backlogged trace: {len(trace)} requests arriving within {int(trace.arrival_step.max()) + 1} steps, "
          f"{capacity} KV blocks, first {window} steps ==")
    print(f"{'policy':15s} {'model ev/s':>12s} {'scan ev/s':>12s} {'fast ev/s':>12s} {'scan/model':>11s} {'fast/model':>11s}")
    for policy in POLICIES:
        for engine in ("scan", "fast"):  # compile outside the timings
            decodesched.simulate(trace, policy, capacity, 4, 10, engine=engine)
        start = time.perf_counter()
        ref = replay(rows, policy=policy, free_kv_blocks=capacity, aging_interval=4, max_steps=window)
        model_eps = len(ref.events) / (time.perf_counter() - start)
        rates = {}
        for engine in ("scan", "fast"):
            rates[engine], _ = events_per_second(
                lambda: decodesched.simulate(trace, policy, capacity, 4, window, engine=engine).n_events)
        print(f"{policy:15s} {model_eps:12,.0f} {rates['scan']:12,.0f} {rates['fast']:12,.0f} "
              f"{rates['scan'] / model_eps:10,.0f}x {rates['fast'] / model_eps:10,.0f}x")


def azure_trace(load: float):
    return to_trace(read_azure(bundled_trace_path()), load=load, seed=0)


def azure_section(load: float, capacity: int, cold: bool) -> None:
    trace = azure_trace(load)
    print(f"\n== Azure 2023 conversation trace: {len(trace)} requests, load {load}, {capacity} KV blocks, "
          f"event log kept ==")
    print(f"{'policy':15s} {'events':>10s} {'warm s':>8s} {'warm ev/s':>12s} {'cold s':>8s}")
    for policy in POLICIES:
        decodesched.simulate(trace.subset(range(50)), policy, capacity)  # compile / load from cache
        start = time.perf_counter()
        result = decodesched.simulate(trace, policy, capacity, 4)
        warm = time.perf_counter() - start
        cold_s = cold_start(load, capacity, policy) if cold else float("nan")
        print(f"{policy:15s} {result.n_events:10,d} {warm:8.2f} {result.n_events / warm:12,.0f} {cold_s:8.2f}")


def cold_start(load: float, capacity: int, policy: str) -> float:
    """Seconds from a fresh interpreter (empty Numba cache) to the first full result."""
    code = (
        "import time; t=time.perf_counter(); import decodesched;"
        "from decodesched.convert import bundled_trace_path, read_azure, to_trace;"
        f"tr=to_trace(read_azure(bundled_trace_path()), load={load}, seed=0);"
        f"decodesched.simulate(tr, {policy!r}, {capacity}, 4); print(time.perf_counter()-t)"
    )
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=int, default=1500, help="steps of the backlogged trace to time")
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--kv-blocks", type=int, default=4000)
    parser.add_argument("--skip-cold", action="store_true", help="skip the cold-start subprocesses")
    args = parser.parse_args()
    backlog_section(args.window)
    azure_section(args.load, args.kv_blocks, not args.skip_cold)


if __name__ == "__main__":
    main()
