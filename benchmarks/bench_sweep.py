"""Sweep benchmark (batch issue): thread scaling of a 256-scenario sweep, and cold vs warm start.

1. A 256-scenario grid (4 policies x 8 KV capacities x 8 aging intervals) over a prefix of the
   bundled Azure 2023 conversation trace, per-request results only, run with 1 and with 2 Numba
   threads, alternating, ``--repeats`` times each.  Prints every time, the best and median per
   thread count, and the speed-up (best over best, median over median).  The results of the two
   thread counts are checked identical.
2. Cold start: a fresh Python process with an empty ``NUMBA_CACHE_DIR``: ``import decodesched``
   then a first small `simulate_batch` result (compiling the kernels).  Warm start: the same in a
   new process with that cache now filled.  Also ``decodesched warmup`` cold and warm.

    python benchmarks/bench_sweep.py [--requests 500] [--load 1.0] [--engine fast|scan] [--repeats 3]
                                     [--skip-threads] [--skip-cold]

Thread scaling only means something on a quiet machine: each run prints how many cores other
processes kept busy meanwhile (Linux), and the speed-up is also given over the quiet runs only.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

from decodesched.batch import grid, simulate_batch
from decodesched.convert import bundled_trace_path, read_azure, to_trace

POLICIES = ("fixed_priority", "aging", "deadline", "fcfs")
AGING_INTERVALS = (1, 2, 4, 8, 16, 32, 64, 128)
QUIET = 0.1  # a run is "quiet" when other processes kept fewer cores than this busy


def sweep_inputs(n_requests: int, load: float):
    trace = to_trace(read_azure(bundled_trace_path()).head(n_requests), load=load, name=f"azure{n_requests}")
    largest = int(trace.required_blocks.max())
    # 8 capacities from "the largest request just fits" up by sqrt(2) steps (8 distinct values).
    capacities = [int(round(largest * 2 ** (k / 2))) for k in range(8)]
    return trace, capacities, grid(1, POLICIES, capacities, AGING_INTERVALS)


def _cpu_busy_seconds() -> float | None:
    """CPU-seconds all processes spent busy so far (Linux /proc/stat), or None elsewhere."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except OSError:  # pragma: no cover
        return None
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn) -> tuple[float, float]:
    """(wall seconds of fn(), cores that *other* processes kept busy meanwhile, on average)."""
    busy0, own0, start = _cpu_busy_seconds(), _own_cpu_seconds(), time.perf_counter()
    fn()
    wall = time.perf_counter() - start
    busy1, own1 = _cpu_busy_seconds(), _own_cpu_seconds()
    if busy0 is None:
        return wall, float("nan")
    return wall, max((busy1 - busy0) - (own1 - own0), 0.0) / wall


def thread_section(n_requests: int, load: float, repeats: int, engine: str) -> None:
    trace, capacities, scenarios = sweep_inputs(n_requests, load)
    print(f"\n== {len(scenarios)}-scenario sweep: {len(trace)} Azure requests at load {load} "
          f"({trace.work_steps} work steps), capacities {capacities}, aging {list(AGING_INTERVALS)}, "
          f"{engine} engine ==")
    simulate_batch([trace], scenarios[:2], threads=2, engine=engine)  # compile or load outside the timings
    times = {1: [], 2: []}
    quiet = {1: [], 2: []}
    results = {}
    for rep in range(repeats):
        for threads in (1, 2) if rep % 2 == 0 else (2, 1):
            def run(threads=threads):
                results[threads] = simulate_batch([trace], scenarios, threads=threads, engine=engine)

            wall, others = timed(run)
            times[threads].append(wall)
            if others < QUIET:
                quiet[threads].append(wall)
            print(f"  run {rep + 1}, {threads} thread{'s' if threads > 1 else ' '}: {wall:7.2f} s"
                  f"   (other processes kept {others:.2f} cores busy)")
    same = all(np.array_equal(getattr(results[1], a), getattr(results[2], a)) for a in ("request_state", "summary"))
    events = int(results[1].summary[:, 0].sum())
    print(f"  results identical for 1 and 2 threads: {same}; {events:,} events in all")
    for label, runs in (("all runs", times), (f"quiet runs (others < {QUIET} cores)", quiet)):
        if not runs[1] or not runs[2]:
            print(f"  {label}: none with both thread counts")
            continue
        best1, best2 = min(runs[1]), min(runs[2])
        med1, med2 = statistics.median(runs[1]), statistics.median(runs[2])
        print(f"  {label}: 1 thread best {best1:.2f} s median {med1:.2f} s; 2 threads best {best2:.2f} s "
              f"median {med2:.2f} s; speed-up {best1 / best2:.2f}x (best), {med1 / med2:.2f}x (median)")


FIRST_RESULT = textwrap.dedent(
    """
    import time
    t0 = time.perf_counter()
    import decodesched
    t1 = time.perf_counter()
    rows = {"request_id": list(range(40)), "arrival_step": [i // 2 for i in range(40)],
            "prompt_len": [5] * 40, "max_new_tokens": [1 + i % 7 for i in range(40)],
            "priority": [i % 3 for i in range(40)], "cache_hit": [i % 2 == 0 for i in range(40)],
            "required_blocks": [1 + i % 4 for i in range(40)], "deadline_step": [None] * 40,
            "preemptible": [True] * 40}
    batch = decodesched.simulate_batch(rows, decodesched.grid(1, ["aging", "fcfs"], [6], [2]))
    assert batch.rows()[0]["requests"] == 40
    t2 = time.perf_counter()
    print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
    """
)


def timed_process(argv, env) -> tuple[float, str, float]:
    """(wall seconds, stdout, cores other processes kept busy) of a child process."""
    out = {}

    def run():
        out["proc"] = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)

    busy0 = _cpu_busy_seconds()
    child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, _ = timed(run)
    busy1 = _cpu_busy_seconds()
    child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = (child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime)
    others = float("nan") if busy0 is None else max((busy1 - busy0) - child, 0.0) / wall
    proc = out["proc"]
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed:\n{proc.stderr}")
    return wall, proc.stdout, others


def cold_section() -> None:
    print("\n== cold start (empty NUMBA_CACHE_DIR) vs warm start (cache filled); times in s ==")
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        print(f"  {'':34s} {'import':>8s} {'first result':>13s} {'process wall':>13s} {'others busy':>12s}")
        for label in ("cold: import -> first sweep result", "warm: import -> first sweep result"):
            wall, out, others = timed_process([sys.executable, "-c", FIRST_RESULT], env)
            imp, first = (float(x) for x in out.split())
            print(f"  {label:34s} {imp:8.2f} {first:13.2f} {wall:13.2f} {others:9.2f} cores")
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("cold: decodesched warmup", "warm: decodesched warmup"):
            wall, out, others = timed_process([sys.executable, "-m", "decodesched.cli", "warmup"], env)
            print(f"  {label:34s} {'':8s} {'':13s} {wall:13.2f} {others:9.2f} cores")
            print(textwrap.indent(out.rstrip(), "      "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=500, help="Azure prefix length (default %(default)s)")
    ap.add_argument("--load", type=float, default=1.0, help="offered load of the converted trace (default 1.0)")
    ap.add_argument("--engine", choices=("fast", "scan"), default="fast", help="kernel per scenario (default fast)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per thread count (default 3)")
    ap.add_argument("--skip-threads", action="store_true")
    ap.add_argument("--skip-cold", action="store_true")
    args = ap.parse_args()
    import numba

    print(f"numba {numba.__version__}, threading layer {numba.config.THREADING_LAYER}, "
          f"{numba.config.NUMBA_NUM_THREADS} threads available, {os.cpu_count()} CPUs")
    if not args.skip_threads:
        thread_section(args.requests, args.load, args.repeats, args.engine)
    if not args.skip_cold:
        cold_section()


if __name__ == "__main__":
    main()
