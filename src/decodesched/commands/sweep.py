"""`decodesched sweep TRACE... --policy a,b --kv-blocks x,y --aging-interval i,j [--max-steps N]
[--threads N] [--backend cpu|cuda] [--engine fast|scan] [--dask ADDRESS] --out metrics.csv`.

The grid is the product of the lists (trace, policy, capacity, aging interval; the last varies
fastest); every scenario runs in one batch (`decodesched.batch.simulate_batch`), a progress bar
runs on stderr, a table with one row per scenario prints, and the CSV gets one row per scenario
(`batch.ROW_KEYS`: its trace, policy, capacity and aging interval, then the metrics of SPEC
section 6).  Bad input exits 2 with one line before anything runs, and no CSV is left behind.

``--dask ADDRESS`` hands the same traces and scenarios (max_steps included) to
``decodesched.distributed.run_sweep(traces, scenarios, ADDRESS, progress=None, threads=N)``, which
returns the rows (as `BatchResult.rows`); Dask is optional (``pip install 'decodesched[dask]'``).
"""

from __future__ import annotations

import importlib
import math
import os
import time
from pathlib import Path

from ..batch import BACKENDS, grid, simulate_batch, write_metrics_csv
from ..engine import ENGINES, POLICIES, check_config
from ..errors import UserError
from ..trace import load_trace

# Columns of the printed table: (header, row key).
TABLE_COLUMNS = (
    ("trace", "trace"),
    ("policy", "policy"),
    ("kv", "kv_blocks"),
    ("aging", "aging_interval"),
    ("done", "finished"),
    ("unserv", "unservable"),
    ("qwait P95", "queue_wait_p95"),
    ("ttft P95", "ttft_p95"),
    ("e2e P99", "e2e_p99"),
    ("starve", "starvation"),
    ("preempt", "preemptions"),
    ("dl miss", "deadline_miss_rate"),
)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="replay every (trace, policy, capacity, aging interval) combination in parallel",
        description="Replay the product of traces, policies, KV capacities and aging intervals as one "
        "parallel batch; print one row per scenario and write a metrics CSV (one row per scenario).",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE", help="canonical trace CSV(s) or .parquet")
    p.add_argument("--policy", required=True, type=_names, metavar="P[,P..]",
                   help=f"policies, comma-separated ({', '.join(POLICIES)})")
    p.add_argument("--kv-blocks", required=True, type=_ints, metavar="N[,N..]", help="free KV blocks, comma-separated")
    p.add_argument("--aging-interval", type=_ints, default=[4], metavar="K[,K..]",
                   help="aging intervals, comma-separated (default 4)")
    p.add_argument("--max-steps", type=int, default=None, metavar="N", help="stop each replay after N steps that ran")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads (default: all Numba threads)")
    p.add_argument("--backend", choices=BACKENDS, default="cpu", help="cpu (default) or cuda (one GPU thread per "
                                                                      "scenario)")
    p.add_argument("--engine", choices=ENGINES, default="fast", help="CPU kernel: fast (default) or the scan baseline")
    # For the RESEARCH helper's distributed sweeps (decodesched.distributed, optional dependency).
    p.add_argument("--dask", metavar="ADDRESS", default=None,
                   help="run on a Dask cluster (scheduler address, or 'local') via decodesched.distributed")
    p.add_argument("--chunk-size", type=int, default=64, metavar="N",
                   help="with --dask: scenarios per task (default %(default)s)")
    p.add_argument("--out", required=True, metavar="metrics.csv", help="the metrics CSV to write")
    p.set_defaults(func=run)


def _names(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise _arg_error(f"empty item in {text!r}")
    return items


def _ints(text: str) -> list[int]:
    out = []
    for x in _names(text):
        try:
            out.append(int(x))
        except ValueError:
            raise _arg_error(f"{x!r} is not an integer") from None
    return out


def _arg_error(msg: str):
    import argparse

    return argparse.ArgumentTypeError(msg)


def _check_out(out: str, traces: list[str]) -> None:
    from .._io import check_outputs

    check_outputs([out], traces)  # an input trace, its .meta.json sidecar, a device, FIFO or symlink loop
    path = Path(out)
    if any(os.path.abspath(out) == os.path.abspath(t) for t in traces):
        raise UserError(f"{out}: refusing to overwrite an input trace")
    if path.is_dir():
        raise UserError(f"{out}: is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"cannot write {out}: no such directory {parent}")


def run(args) -> int:
    _check_out(args.out, args.traces)
    # Validate the whole grid before loading anything heavy or running anything.
    for policy in args.policy:
        for blocks in args.kv_blocks:
            for interval in args.aging_interval:
                check_config(policy, blocks, interval, args.max_steps)
    traces = [load_trace(t) for t in args.traces]
    scenarios = grid(traces, args.policy, args.kv_blocks, args.aging_interval, args.max_steps)
    start = time.perf_counter()
    if args.dask is not None:
        rows = _run_dask(args, traces, scenarios)
        where = f"Dask at {args.dask}"
    else:
        batch = simulate_batch(traces, scenarios, threads=args.threads, backend=args.backend, engine=args.engine,
                               progress=None)
        rows = batch.rows()
        where = f"{args.backend}, {batch.threads} thread{'s' if batch.threads != 1 else ''}"
    elapsed = time.perf_counter() - start
    try:
        write_metrics_csv(rows, args.out)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        raise UserError(f"cannot write {args.out}: {exc}") from None
    print(format_rows(rows))
    print(f"{len(scenarios)} scenarios over {len(traces)} trace{'s' if len(traces) != 1 else ''} in "
          f"{elapsed:.2f} s ({where}); wrote {args.out}")
    return 0


def _run_dask(args, traces, scenarios):
    if args.backend != "cpu":
        raise UserError("--dask runs the CPU kernels on the workers; drop --backend cuda")
    try:
        distributed = importlib.import_module("decodesched.distributed")
    except ModuleNotFoundError as exc:
        if exc.name in ("decodesched.distributed", "dask", "distributed"):
            raise UserError("--dask needs the optional Dask support: pip install 'decodesched[dask]'") from None
        raise
    if args.engine != "fast":
        raise UserError("--dask runs the fast engine on the workers; drop --engine scan")
    # Finished chunks go to OUT.partial.jsonl, so a rerun of an interrupted sweep resumes from them.
    return distributed.run_sweep(traces, scenarios, args.dask, progress=None, threads=args.threads,
                                 chunk_size=args.chunk_size, checkpoint_path=args.out + ".partial.jsonl")


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        if v.is_integer():
            return str(int(v))
        return f"{v:.3f}" if abs(v) < 1 else f"{v:.1f}"
    return str(v)


def format_rows(rows: list[dict]) -> str:
    """The sweep table: one line per scenario with its key metrics."""
    heads = [h for h, _ in TABLE_COLUMNS]
    cells = [[_cell(r.get(k)) for _, k in TABLE_COLUMNS] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    text_cols = {0, 1}
    lines = ["  ".join(h.ljust(w) if i in text_cols else h.rjust(w) for i, (h, w) in enumerate(zip(heads, widths)))]
    for c in cells:
        lines.append("  ".join(x.ljust(w) if i in text_cols else x.rjust(w) for i, (x, w) in enumerate(zip(c, widths))))
    return "\n".join(lines)
