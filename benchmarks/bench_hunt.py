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

Usage: ``python benchmarks/bench_hunt.py [--n 20000] [--repeats 2]`` (about 2 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from decodesched import load_trace
from decodesched.engine import policy_code, trace_arrays
from decodesched.kernels import enums as E
from decodesched.kernels.fast_nb import replay_fast_nb

POLICIES = ("fixed_priority", "aging", "deadline", "fcfs")
UNLIMITED = 2**61 // 4


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


def ns_per_event(trace, policy, capacity, repeats, max_steps=-1, interval=4):
    args = trace_arrays(trace)
    best = float("inf")
    for _ in range(repeats):
        req_out = np.zeros((len(trace), E.RQ_NCOLS), np.int64)
        summary = np.zeros(E.SM_NCOLS, np.int64)
        t = time.process_time()
        replay_fast_nb(*args, policy_code(policy), capacity, interval, max_steps,
                       np.zeros((0, E.EV_NCOLS), np.int64), req_out, summary)
        best = min(best, time.process_time() - t)
    return best * 1e9 / max(int(summary[E.SM_EVENTS]), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000, help="requests of the stairs and crowd shapes")
    ap.add_argument("--m", type=int, default=4000, help="victims of the tight shape")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    warm = backlog(200, np.random.default_rng(9))
    for p in POLICIES:
        ns_per_event(warm, p, 64, 1)
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
