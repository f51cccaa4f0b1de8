"""Reading a large trace: seconds of `decodesched.load_trace` for typed columns against the same values
as Python lists, in one run.

NumPy columns (ints and bools typed, deadlines masked) and Parquet files whose integer and boolean
columns have no nulls are checked column-wise; Python lists of one plain kind (ints, bools, text)
and the usual CSV file are converted whole by C-level maps (`trace._list_column`, `trace._plain_csv`); a CSV
file with quotes or blank lines is split by the csv module's reader in one call first (`trace._csv_whole`);
anything else is checked value by value, so that an error names its row.  Trace: `bench_scale.waiting_trace`'s
shape with ``--rows`` requests (half with a deadline).

Then the replay's set-up: seconds of ``simulate(trace, policy, 16, max_steps=1)`` (checks, the
kernel's structures for every request, one step), warm, best of 3, per policy, with the requests
listed in the policy's key order (as `bench_scale` builds its backlogs) and shuffled (as a real trace
lists them; under aging each then lands at a random place of a B+tree).  Target: well under a second.

Usage::

    python benchmarks/bench_load.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path

import numpy as np

import decodesched
from bench_scale import waiting_trace
from decodesched.trace import TRACE_COLUMNS


def timed(source) -> tuple[float, decodesched.Trace]:
    t = time.perf_counter()
    trace = decodesched.load_trace(source)
    return time.perf_counter() - t, trace


def same(a: decodesched.Trace, b: decodesched.Trace) -> bool:
    return all(np.array_equal(getattr(a, c), getattr(b, c)) for c in TRACE_COLUMNS + ("has_deadline",))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    a = ap.parse_args()
    if a.rows < 1:
        ap.error("--rows takes a positive count")
    trace = waiting_trace(a.rows, 10, "fixed_priority")
    n = len(trace)
    arrays = {c: getattr(trace, c) for c in TRACE_COLUMNS if c != "deadline_step"}
    arrays["deadline_step"] = np.ma.MaskedArray(trace.deadline_step, mask=~trace.has_deadline)
    lists = {c: (v.tolist() if c != "deadline_step" else [None if m else int(d) for d, m in zip(v.data, v.mask)])
             for c, v in arrays.items()}
    print(f"load_trace of {n:,} requests: seconds, and the list path's seconds / this one's")
    base, want = timed(lists)
    rows = [("Python lists", base)]
    got_t, got = timed(arrays)
    assert same(got, want)
    rows.append(("NumPy columns", got_t))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        pa = None
    with tempfile.TemporaryDirectory() as tmp:
        if pa is not None:
            path = Path(tmp) / "t.parquet"
            pq.write_table(pa.table({c: pa.array(v) for c, v in lists.items()}), path)
            dt, got = timed(path)
            assert same(got, want)
            rows.append(("Parquet file", dt))
        path = Path(tmp) / "t.csv"
        want.to_csv(path)
        dt, got = timed(path)
        assert same(got, want)
        rows.append(("CSV file", dt))
        quoted = Path(tmp) / "q.csv"  # as a spreadsheet may write it: text quoted, CRLF, a blank line at the end
        with open(path, newline="") as src, open(quoted, "w", newline="") as out:
            csv.writer(out, quoting=csv.QUOTE_NONNUMERIC).writerows(
                [int(x) if x.lstrip("-").isdigit() else x for x in rec] for rec in csv.reader(src))
            out.write("\r\n")
        dt, got = timed(quoted)
        assert same(got, want)
        rows.append(("CSV file, quoted", dt))
    for label, dt in rows:
        print(f"  {label:<28}{dt:>8.2f} s{base / dt:>8.1f}x")
    section_setup(a.rows)


def section_setup(rows: int) -> None:
    print(f"\nset-up of a replay of {rows:,} requests arriving at step 0 (and a few more): seconds of "
          f"simulate(trace, policy, 16 KV blocks, max_steps=1), warm, best of 3")
    print(f"  {'policy':<16}{'key order':>10}{'shuffled':>10}")
    for policy in decodesched.engine.POLICIES:
        ordered = waiting_trace(rows, 10, policy)
        cols = ordered.columns()
        perm = np.random.default_rng(0).permutation(len(ordered))
        shuffled = decodesched.load_trace({c: v[perm] for c, v in cols.items()})
        cells = []
        for trace in (ordered, shuffled):
            decodesched.simulate(trace, policy, 16, max_steps=1)  # compiled or loaded before timing
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                decodesched.simulate(trace, policy, 16, max_steps=1)
                best = min(best, time.perf_counter() - t)
            cells.append(best)
        print(f"  {policy:<16}" + "".join(f"{c:>9.2f}s" for c in cells))


if __name__ == "__main__":
    main()
