"""The fast kernel on reshaped Azure traces: seconds per replay for every policy x shape x capacity x load.

Trace: the bundled Azure 2023 conversation trace (19,366 requests), converted at offered loads 1.0
and 1.5 (`decodesched.convert.to_trace`, seed 0).  Shapes:

* ``3 classes``: the default conversion (priorities 0/1/2 weighted 0.6/0.3/0.1, half with a
  deadline, class 2, about 10% of the requests, not preemptible);
* ``SJF``: the same with ``priority = -max_new_tokens`` (shortest job first, ~600 values);
* ``distinct``: every request its own priority (a seeded permutation of 0..n-1);
* ``deadlines``: 3 classes with a deadline on every request, 10% protected.

Each cell is the warm replay (compiled, kernel called directly, event log recorded into a
preallocated buffer), best of ``--repeats``.  A cell whose first ``--probe`` steps project beyond
``--cap`` seconds is not run to the end: it prints ``~`` and the projection (probe time x work steps
/ probe steps), so a slow kernel still finishes the table in minutes.  The last line gives the
slowest cell and the number of cells at or under the 0.5 s target.

The target is set at aging's default interval, 4; ``--aging-interval K`` runs the table at another
(below K = n / 4, aging's cost grows with the number of non-empty residues, up to min(K, requests
waiting), or with about sqrt(K) blocks of them; from there on, grouped mode's requests in the
system / K moves a step, when the kernel expects them to be cheaper: see `kernels/aging_nb.py`).
``--source`` reshapes another raw trace the same way (an Azure 2023 CSV, or a Mooncake JSONL such
as the Mooncake conversation trace, whose cache hits come from its hash ids).

Usage (a few minutes on 2 busy cores)::

    python benchmarks/bench_shapes.py [--capacities 2000 8000 16000] [--loads 1.0 1.5] [--cap 5]
                                      [--aging-interval 4] [--source RAW_TRACE [--format F]]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

import decodesched
from decodesched.convert import FORMATS, bundled_trace_path, read_raw, to_trace
from decodesched.engine import POLICIES, policy_code, trace_arrays
from decodesched.errors import UserError
from decodesched.kernels import enums as E
from decodesched.kernels.fast_nb import replay_fast_nb

SHAPES = ("3 classes", "SJF", "distinct", "deadlines")
TARGET = 0.5


def shaped(raw, shape: str, load: float):
    if shape == "deadlines":
        return to_trace(raw, load=load, seed=0, deadline_fraction=1.0)
    trace = to_trace(raw, load=load, seed=0)
    if shape == "3 classes":
        return trace
    cols = trace.columns()
    if shape == "SJF":
        cols["priority"] = -trace.max_new_tokens
    else:
        cols["priority"] = np.random.default_rng(1).permutation(len(trace)).astype(np.int64)
    return decodesched.load_trace(cols, steps_per_second=trace.steps_per_second)


def replay(args, code, capacity, max_steps, events, interval=4):
    req_out = np.zeros((args[0].shape[0], E.RQ_NCOLS), np.int64)
    summary = np.zeros(E.SM_NCOLS, np.int64)
    t = time.perf_counter()
    replay_fast_nb(*args, code, capacity, interval, max_steps, events, req_out, summary)
    return int(summary[E.SM_EVENTS]), time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacities", type=int, nargs="+", default=[2000, 8000, 16000])
    ap.add_argument("--loads", type=float, nargs="+", default=[1.0, 1.5])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--probe", type=int, default=50_000, help="steps of the probe run")
    ap.add_argument("--cap", type=float, default=5.0, help="projected seconds above which a cell is estimated")
    ap.add_argument("--aging-interval", type=int, default=4, metavar="K", help="aging's interval (default 4)")
    ap.add_argument("--source", metavar="PATH", help="another raw trace to reshape: an Azure 2023 CSV or a "
                    "Mooncake JSONL (default: the bundled Azure conversation trace)")
    ap.add_argument("--format", choices=FORMATS, help="--source's format (default: from its extension or content)")
    a = ap.parse_args()
    if a.aging_interval < 1:
        ap.error("--aging-interval takes a positive count")
    if min(a.capacities) < 0 or not all(0 < x < math.inf for x in a.loads) or a.repeats < 1 or a.probe < 1:
        ap.error("--capacities take counts >= 0, --loads positive numbers, --repeats and --probe positive counts")

    try:
        raw = read_raw(a.source or bundled_trace_path(), a.format)
    except (UserError, OSError) as exc:
        ap.error(str(exc))
    traces = {(s, load): shaped(raw, s, load) for s in a.shapes for load in a.loads}
    work = max(t.work_steps for t in traces.values())
    events = np.empty((work, E.EV_NCOLS), np.int64)
    events.fill(0)  # one buffer, its pages touched here: np.zeros maps them lazily, in the first timed replay
    t = traces[(a.shapes[0], a.loads[0])]
    replay(trace_arrays(t.subset(np.arange(50))), 0, 100, -1, events)  # compile / load from cache

    name = Path(a.source).name if a.source else "Azure 2023 conversation trace"
    print(f"{name} ({len(raw):,} requests), fast kernel, warm, event log recorded, "
          f"seconds per replay (best of {a.repeats}; ~ = projected from a {a.probe:,}-step probe), "
          f"aging interval {a.aging_interval}")
    width = max(11, 1 + max(map(len, a.policies)))
    bw = 1 + max(6, max(len(f"{c:,}") for c in a.capacities))  # room for every capacity, 1e8 included
    head = f"{'shape':<11}{'load':>5}{'blocks':>{bw}}" + "".join(f"{p:>{width}}" for p in a.policies)
    print(head)
    worst, n_ok, n_cells = 0.0, 0, 0
    for shape in a.shapes:
        for load in a.loads:
            trace = traces[(shape, load)]
            args = trace_arrays(trace)
            for capacity in a.capacities:
                line = f"{shape:<11}{load:>5}{capacity:>{bw},}"
                for policy in a.policies:
                    code = policy_code(policy)
                    n_probe, t_probe = replay(args, code, capacity, a.probe, events, a.aging_interval)
                    projected = t_probe * trace.work_steps / max(n_probe, 1)
                    if n_probe >= a.probe and projected > a.cap:
                        cell, dt = f"~{projected:.1f}", projected
                    else:
                        dt = min(replay(args, code, capacity, -1, events, a.aging_interval)[1]
                                 for _ in range(a.repeats))
                        cell = f"{dt:.3f}"
                    worst = max(worst, dt)
                    n_cells += 1
                    n_ok += dt <= TARGET
                    line += f"{cell:>{width}}"
                print(line, flush=True)
    print(f"slowest cell {worst:.3f} s; {n_ok}/{n_cells} cells <= {TARGET} s")


if __name__ == "__main__":
    main()
