"""The fast kernel against a reference copy of the kernels, same run: CPU seconds per warm replay and ratio.

The reference is a directory holding another version's ``kernels/`` files, imported as a package
under its own name (so both compile and cache separately), e.g. the last commit before a change::

    mkdir -p /tmp/ref/refkernels && for f in $(git ls-tree --name-only a9986be kernels/); do
        git show a9986be:$f > /tmp/ref/refkernels/$(basename $f); done
    python benchmarks/bench_ref.py /tmp/ref/refkernels [--capacities 2000 8000 16000] [--repeats 5]

Trace: the bundled Azure 2023 conversation trace at load ``--load``, in one of `bench_shapes`'s
shapes (``--shape``; default the conversion's 3 priority classes).  Each cell is ``time.process_time`` of one replay (event log recorded), best of
``--repeats``, reference and current alternating; the summaries must agree.  Ratio = current /
reference (> 1: slower).  Noise on a busy machine: about +-2% (a copy against itself).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import numpy as np

from bench_shapes import SHAPES, shaped
from decodesched.convert import bundled_trace_path, read_azure
from decodesched.engine import policy_code, trace_arrays
from decodesched.kernels import enums as E
from decodesched.kernels.fast_nb import replay_fast_nb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref", type=Path, help="directory holding the reference kernels' files")
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--capacities", type=int, nargs="+", default=[8000])
    ap.add_argument("--policies", nargs="+", default=["fixed_priority", "deadline", "fcfs"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shape", default="3 classes", choices=SHAPES, help="as in bench_shapes.py")
    a = ap.parse_args()
    sys.path.insert(0, str(a.ref.resolve().parent))
    ref = importlib.import_module(a.ref.resolve().name + ".fast_nb").replay_fast_nb

    trace = shaped(read_azure(bundled_trace_path()), a.shape, a.load)
    args = trace_arrays(trace)
    events = np.zeros((trace.work_steps, E.EV_NCOLS), np.int64)

    def run(kernel, code, capacity):
        req_out = np.zeros((args[0].shape[0], E.RQ_NCOLS), np.int64)
        summary = np.zeros(E.SM_NCOLS, np.int64)
        t = time.process_time()
        kernel(*args, code, capacity, 4, -1, events, req_out, summary)
        return time.process_time() - t, summary

    for kernel in (ref, replay_fast_nb):  # compile / load from cache
        run(kernel, 0, 100)
    print(f"Azure 2023 trace, load {a.load}, {a.shape}: CPU s per replay, best of {a.repeats}")
    print(f"{'policy':<16}{'blocks':>7}{'ref':>9}{'current':>9}{'ratio':>7}")
    for capacity in a.capacities:
        for policy in a.policies:
            code = policy_code(policy)
            t_ref, t_new = [], []
            for _ in range(a.repeats):
                dt, s_ref = run(ref, code, capacity)
                t_ref.append(dt)
                dt, s_new = run(replay_fast_nb, code, capacity)
                t_new.append(dt)
            if not np.array_equal(s_ref, s_new):
                raise SystemExit(f"{policy} at {capacity}: the summaries differ")
            print(f"{policy:<16}{capacity:>7}{min(t_ref):>9.4f}{min(t_new):>9.4f}{min(t_new) / min(t_ref):>7.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
