"""The fast kernel against a reference copy of the kernels, same run: CPU seconds per warm replay and ratio.

The reference is a directory holding another version's ``kernels/`` files, imported as a package
under its own name (so both compile and cache separately), e.g. the last commit before a change::

    mkdir -p /tmp/ref/refkernels && for f in $(git ls-tree --name-only a9986be kernels/); do
        git show a9986be:$f > /tmp/ref/refkernels/$(basename $f); done
    python benchmarks/bench_ref.py /tmp/ref/refkernels [--capacities 2000 8000 16000] [--repeats 5]

Trace: the bundled Azure 2023 conversation trace at load ``--load``, in one of `bench_shapes`'s
shapes (``--shape``; default the conversion's 3 priority classes).  Each cell is ``time.process_time`` of one replay (event log recorded), best of
``--repeats``, reference and current alternating (which goes first alternates too); the summaries
must agree.  Ratio = current / reference (> 1: slower), of the best times and, steadier on a machine
whose speed drifts during the run, the median of the ratios of the pairs run back to back.  Noise on
a busy machine: about +-2% (a copy against itself); on a day when the machine's speed drifts, single
runs of a change worth a few per cent disagree in sign, and only paired medians over many repeats
(``--repeats 10`` or more) settle it.

With ``--waiting N`` the trace is instead `bench_scale`'s backlog of about N requests waiting
(``waiting_trace``, 16 KV blocks) and a cell is the marginal events/s as in bench_scale section 2
(an 11M-step run minus a 1M-step run): ratio = reference / current rate (> 1: slower), so that
large backlogs can be compared before and after a change in the same run.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench_scale import WINDOW, run, user_time, waiting_trace
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
    ap.add_argument("--waiting", type=int, metavar="N", help="bench_scale's backlog of about N waiting instead")
    ap.add_argument("--aging-interval", type=int, default=4, metavar="K", help="aging's interval on the Azure trace")
    a = ap.parse_args()
    if a.repeats < 1 or a.aging_interval < 1 or (a.waiting is not None and a.waiting < 1):
        ap.error("--repeats, --aging-interval and --waiting take a positive count")
    if not (a.ref / "fast_nb.py").is_file() or not a.ref.resolve().name.isidentifier():
        ap.error(f"{a.ref}: not a directory of kernel files named like a Python package (see the usage above)")
    sys.path.insert(0, str(a.ref.resolve().parent))
    ref = importlib.import_module(a.ref.resolve().name + ".fast_nb").replay_fast_nb
    if a.waiting is None:
        azure(a, ref)
    else:
        waiting(a, ref)


def _replay(kernel, args, code, capacity, max_steps, events, k=4):
    """One replay at aging interval k: (CPU seconds, summary)."""
    req_out = np.zeros((args[0].shape[0], E.RQ_NCOLS), np.int64)
    summary = np.zeros(E.SM_NCOLS, np.int64)
    t = time.process_time()
    kernel(*args, code, capacity, k, max_steps, events, req_out, summary)
    return time.process_time() - t, summary


def _paired(measure, repeats):
    """`measure(i)` -> (value, summary) for kernel i (0: the reference, 1: the current one), `repeats`
    times, which one goes first alternating; returns both lists of values.  The summaries must agree."""
    values = ([], [])
    for r in range(repeats):
        out = {}
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            out[i] = measure(i)
            values[i].append(out[i][0])
        if not np.array_equal(out[0][1], out[1][1]):
            raise SystemExit("the summaries differ")
    return values


def _ratios(a, b):
    """Median of the pairwise ratios a / b."""
    return statistics.median(x / y for x, y in zip(a, b))


def azure(a, ref) -> None:
    trace = shaped(read_azure(bundled_trace_path()), a.shape, a.load)
    args = trace_arrays(trace)
    events = np.zeros((trace.work_steps, E.EV_NCOLS), np.int64)
    kernels = (ref, replay_fast_nb)
    for kernel in kernels:  # compile / load from cache
        _replay(kernel, args, 0, 100, -1, events)
    print(f"Azure 2023 trace, load {a.load}, {a.shape}, aging interval {a.aging_interval}: CPU s per replay, "
          f"best of {a.repeats}")
    print(f"{'policy':<16}{'blocks':>7}{'ref':>9}{'current':>9}{'ratio':>7}{'paired':>8}")
    for capacity in a.capacities:
        for policy in a.policies:
            code = policy_code(policy)
            t_ref, t_new = _paired(lambda i: _replay(kernels[i], args, code, capacity, -1, events, a.aging_interval),
                                   a.repeats)
            print(f"{policy:<16}{capacity:>7}{min(t_ref):>9.4f}{min(t_new):>9.4f}{min(t_new) / min(t_ref):>7.3f}"
                  f"{_ratios(t_new, t_ref):>8.3f}", flush=True)


def waiting(a, ref) -> None:
    kernels = (ref, replay_fast_nb)
    print(f"about {a.waiting:,} requests waiting, 16 KV blocks: marginal M events/s over {WINDOW:,} steps, "
          f"median of {a.repeats}")
    print(f"{'policy':<16}{'ref':>9}{'current':>9}{'paired':>8}")
    for policy in a.policies:
        trace = waiting_trace(a.waiting, WINDOW, policy)
        for kernel in kernels:
            run(kernel, trace, policy, 16, 10, record=False)

        def rate(i):
            n1, t1, _ = run(kernels[i], trace, policy, 16, WINDOW // 10, record=False, clock=user_time)
            summary = np.zeros(E.SM_NCOLS, np.int64)
            n2, t2, _ = run(kernels[i], trace, policy, 16, WINDOW + WINDOW // 10, record=False,
                            clock=user_time, summary=summary)
            return (n2 - n1) / max(t2 - t1, 1e-9), summary

        r_ref, r_new = _paired(rate, a.repeats)
        print(f"{policy:<16}{statistics.median(r_ref) / 1e6:>9.2f}{statistics.median(r_new) / 1e6:>9.2f}"
              f"{_ratios(r_ref, r_new):>8.3f}", flush=True)


if __name__ == "__main__":
    main()
