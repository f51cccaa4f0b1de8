"""`decodesched sweep TRACE... --policy a,b --kv-blocks x,y --aging-interval i,j [--replicates N]
[--max-steps N] [--threads N] [--backend cpu|cuda] [--engine fast|scan] [--dask ADDRESS] --out metrics.csv`.

The grid (`decodesched.batch.grid`) is trace x replicate x policy x capacity x aging interval, the
interval varying only for policies whose result depends on it (built-in: aging).  A policy is a
built-in name or ``module:attr`` naming a `decodesched.Policy`; rows know a policy by its name, so a
name given twice, or two different policies of one name, is refused (`policy.check_distinct`).
A trace file named twice is replayed twice (its rows labelled ``name#0``, ``name#1``); so is a stream
(``/dev/stdin /dev/stdin``), read once (`_load_traces`).
``--replicates N`` replays each
trace N times: replicate 0 as it is, replicate r with its priority classes, deadlines and
preemptibility redrawn by the seeded rules of ``trace convert`` at seed ``seed + r`` (seed and rules
from the trace's ``.meta.json``, else the defaults; `batch.replicate_traces`).

The scenarios run in chunks (`decodesched.checkpoint.run_local`; ``--chunk-size``), each saved to
``OUT.partial.jsonl`` (`checkpoint.checkpoint_path_for`: a short hidden name where that one would be
too long) as it finishes: Ctrl-C stops within a second and keeps them, and rerunning the same
command resumes; while a sweep runs, another with the same ``--out`` is refused (`checkpoint.held`).
The checkpoint is removed only once the CSV is written: a write that fails (a full
disk, a closed pipe, Ctrl-C) keeps every scenario for the rerun.  ``--out -`` (standard output) keeps
no checkpoint: there is no file to name it after (``... --out - | head`` would leave ``-.partial.jsonl``
in the current folder), so a stopped run starts afresh.  A table with one row per scenario
prints (on stderr when the CSV goes to standard output, ``--out -``), and the CSV gets one row per
scenario (`batch.row_columns`: scenario, offered load and time scale, the metrics of docs/metrics.md
with seconds twins ``<metric>_s``, and per-class ``<metric>_class<P>``).  Bad input exits 2 with one
line before anything runs, and no CSV is left behind.

``--dask ADDRESS`` hands the same traces and scenarios to ``decodesched.distributed.run_sweep``,
which writes the same checkpoint; Dask is optional (``pip install 'decodesched[dask]'``).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
import time
from pathlib import Path

from .._io import input_label
from ..batch import BACKENDS, check_sweep_fits, convert_rules, grid, grid_size, replicate_traces, write_metrics_csv
from ..cli import int_arg, interval_arg, kv_blocks_arg, steps_arg
from ..engine import ENGINES, POLICIES, check_config
from ..errors import UserError
from ..metrics import counted, name_text, share_text
from ..policy import check_distinct, replay_interval, resolve_policy
from ..trace import load_trace, show

# Columns of the printed table: (header, row key).
TABLE_COLUMNS = (
    ("trace", "trace"),
    ("policy", "policy"),
    ("rep", "replicate"),
    ("kv", "kv_blocks"),
    ("aging", "aging_interval"),
    ("done", "finished"),
    ("unfin", "unfinished"),
    ("unserv", "unservable"),
    ("qwait P95", "queue_wait_p95"),
    ("ttft P95", "ttft_p95"),
    ("e2e P99", "e2e_p99"),
    ("starve", "starvation"),
    ("preempt", "preemptions"),
    ("dl miss rate", "deadline_miss_rate"),
)
TIME_KEYS = ("queue_wait_p95", "ttft_p95", "e2e_p99", "starvation")  # shown with their unit, (s) or (steps)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="replay every (trace, policy, capacity, aging interval) combination in parallel",
        description="Replay the product of traces, policies, KV capacities and aging intervals as one "
        "parallel batch; print one row per scenario and write a metrics CSV (one row per scenario).",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE", help="canonical trace CSV(s) or .parquet")
    p.add_argument("--policy", required=True, type=_names, metavar="P[,P..]",
                   help=f"policies, comma-separated ({', '.join(POLICIES)}, or module:attr of a decodesched.Policy)")
    p.add_argument("--kv-blocks", required=True, type=_int_list(kv_blocks_arg), metavar="N[,N..]",
                   help="free KV blocks, comma-separated")
    p.add_argument("--aging-interval", type=_int_list(interval_arg), default=None, metavar="K[,K..]",
                   help="aging intervals, comma-separated (default: the one a policy module:attr was built with, "
                        "else 4)")
    p.add_argument("--replicates", type=int_arg, default=1, metavar="N",
                   help="replay each trace N times, redrawing its seeded classes and deadlines (default 1)")
    p.add_argument("--max-steps", type=steps_arg, default=None, metavar="N",
                   help="stop each replay after N steps that ran")
    p.add_argument("--threads", type=int_arg, default=None, metavar="N",
                   help="CPU threads (default: all Numba threads)")
    p.add_argument("--backend", choices=BACKENDS, default="cpu", help="cpu (default) or cuda (one GPU thread per "
                                                                      "scenario)")
    p.add_argument("--engine", choices=ENGINES, default="fast", help="CPU kernel: fast (default) or the scan baseline")
    # For the RESEARCH helper's distributed sweeps (decodesched.distributed, optional dependency).
    p.add_argument("--dask", metavar="ADDRESS", default=None,
                   help="run on a Dask cluster (scheduler address, or 'local') via decodesched.distributed")
    p.add_argument("--chunk-size", type=int_arg, default=None, metavar="N",
                   help="scenarios per chunk, each checkpointed as it finishes (default: with --dask 64, "
                        "else 4 per thread, at least 16)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (by default a bar on a terminal, else a line once both 10%% of the "
                        "scenarios and 30 s have passed since the last)")
    p.add_argument("--out", required=True, metavar="metrics.csv",
                   help="the metrics CSV to write (a .csv name; its finished scenarios are kept in "
                        "metrics.csv.partial.jsonl until it is written, so that a rerun resumes), or - for "
                        "standard output (no checkpoint: a stopped run starts afresh)")
    p.set_defaults(func=run)


def _names(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise _arg_error(f"empty item in {text!r}")
    return items


def _int_list(item):
    """An option type: comma-separated distinct values, each parsed by `item` (an int option type)."""
    def parse(text: str) -> list[int]:
        out, seen = [], set()
        for x in _names(text):
            value = item(x)
            if value in seen:  # (the same scenario twice: two identical rows, as a policy given twice would be)
                raise _arg_error(f"{value} is given twice in {show(text)}; give each value once")
            seen.add(value)
            out.append(value)
        return out

    return parse


def _arg_error(msg: str):
    import argparse

    return argparse.ArgumentTypeError(msg)


def _check_out(out: str, traces: list[str]) -> None:
    from .._io import check_outputs, check_writable, extension_said

    check_outputs([out], traces)  # an input trace, its .meta.json sidecar, a device, FIFO or symlink loop
    path = Path(out)
    if any(os.path.abspath(out) == os.path.abspath(t) for t in traces):
        raise UserError(f"{out}: refusing to overwrite an input trace")
    if path.is_dir():
        raise UserError(f"{out}: is a directory")
    if out != "-" and path.suffix.lower() != ".csv":  # `report` and every reader take a .parquet name for Parquet
        raise UserError(f"{out}: --out names the metrics CSV, which ends in .csv (or - for standard output); "
                        f"got {extension_said(out)}")
    check_writable(out)  # (its folder: the checkpoint is written there first, and would be the one named)


def run(args) -> int:
    _check_out(args.out, args.traces)
    if args.replicates < 1:
        raise UserError(f"--replicates must be at least 1, got {args.replicates}")
    if args.chunk_size is not None and args.chunk_size < 1:
        raise UserError(f"--chunk-size must be at least 1, got {args.chunk_size}")
    if args.threads is not None:
        if args.dask is None:
            from ..batch import _check_threads

            try:
                _check_threads(args.threads)
            except UserError as exc:  # (its line names the API's keyword, "threads must ...": name the flag)
                raise UserError(f"--{exc}") from None
        elif args.threads < 1:  # (the workers' Numba may allow more threads than this machine's)
            raise UserError(f"--threads must be at least 1, got {args.threads}")
    if args.dask is None:  # (this machine's threads run it: a threading layer that cannot load, said first)
        from .._numba_cache import start_threads

        start_threads()
    policies = [resolve_policy(p) for p in args.policy]
    check_distinct(policies)  # rows are known by the policy's name: one name, one policy, once
    # Validate the whole grid before loading anything heavy or running anything.
    for policy in policies:
        for blocks in args.kv_blocks:
            for interval in args.aging_interval or [None]:
                check_config(policy, blocks, replay_interval(policy, interval, "--aging-interval"), args.max_steps)
    check_sweep_fits(grid_size(len(args.traces), policies, args.kv_blocks, args.aging_interval or [None],
                               args.replicates))
    traces = _load_traces(args.traces)
    if args.replicates > 1:
        from ..convert import read_meta

        traces = replicate_traces(traces, args.replicates, [convert_rules(read_meta(t)) for t in args.traces])
    scenarios = grid(len(args.traces), policies, args.kv_blocks, args.aging_interval, args.max_steps,
                     args.replicates)
    from ..checkpoint import checkpoint_path_for, held

    checkpoint = None if args.out == "-" else checkpoint_path_for(args.out)  # (standard output: none)
    with held(checkpoint):  # (one sweep at a time writes it, until its CSV is written and the checkpoint removed)
        return _sweep(args, traces, scenarios, checkpoint)


def _saved(traces, scenarios, checkpoint) -> int:
    """How many scenarios of this sweep its checkpoint holds (0 without one)."""
    from ..checkpoint import read_checkpoint, sweep_key

    return len(read_checkpoint(checkpoint, sweep_key(traces, scenarios), len(scenarios))) if checkpoint else 0


def _sweep(args, traces, scenarios, checkpoint) -> int:
    from ..checkpoint import finish, of_another_sweep, sweep_key

    resumed = _saved(traces, scenarios, checkpoint)  # (the last line says so: its seconds are those of the rest)
    if checkpoint is not None and of_another_sweep(checkpoint, sweep_key(traces, scenarios)):  # (a typo in the grid)
        print(f"decodesched sweep: {checkpoint} holds the scenarios of another sweep (other traces or settings, or "
              "another decodesched), which this one does not resume; it is replaced once this sweep's first chunk is "
              "saved (Ctrl-C before that keeps it)", file=sys.stderr)
    start = time.perf_counter()
    try:
        if args.dask is not None:
            rows = _run_dask(args, traces, scenarios, checkpoint)
            where = f"Dask at {args.dask}"
        else:
            with contextlib.redirect_stdout(sys.stderr):  # (what a user policy prints: --out - is the CSV)
                rows, where = _run_local(args, traces, scenarios, checkpoint)
    except KeyboardInterrupt as exc:
        from .._io import interrupt_said, interrupt_status

        saved, said = _saved(traces, scenarios, checkpoint), interrupt_said(exc)
        if saved:
            print(f"decodesched sweep: {said}; {saved} of {len(scenarios)} scenarios are saved in {checkpoint}, "
                  "rerun the same command to resume", file=sys.stderr)
        elif checkpoint is None:
            print(f"decodesched sweep: {said}; nothing was saved (--out - keeps no checkpoint)", file=sys.stderr)
        else:
            print(f"decodesched sweep: {said} before any scenario finished; nothing was saved", file=sys.stderr)
        return interrupt_status(exc)
    except OSError as exc:  # writing the checkpoint (a full disk: the error names no file)
        if isinstance(exc, UserError) or checkpoint is None or (  # (`./out.csv`: the name as Path spells it)
                exc.filename is not None and Path(os.fsdecode(exc.filename)) != Path(checkpoint)):
            raise
        from .._io import _describe

        saved = _saved(traces, scenarios, checkpoint)
        kept = f"{saved} of {len(scenarios)} scenarios are saved in it, rerun the same command to resume" if saved \
            else "no scenario was saved"
        raise UserError(f"{checkpoint}: cannot write the sweep's checkpoint ({_describe(exc)}); {kept}") from None
    elapsed = time.perf_counter() - start
    # The checkpoint goes only once the CSV is in place: a failed write keeps every scenario.
    try:
        write_metrics_csv(rows, args.out)
    except KeyboardInterrupt as exc:
        from .._io import interrupt_said, interrupt_status

        print(f"decodesched sweep: {interrupt_said(exc)} while writing {_where(args.out)}; "
              f"{_kept(checkpoint, args.out)}", file=sys.stderr)
        return interrupt_status(exc)
    except (UserError, OSError) as exc:
        from .._io import _describe

        what = str(exc) if isinstance(exc, UserError) else f"{_where(args.out)}: cannot write ({_describe(exc)})"
        raise UserError(f"{what}; {_kept(checkpoint, args.out)}") from None
    finish(checkpoint)
    table = sys.stderr if args.out == "-" else sys.stdout  # standard output holds the CSV alone
    print(format_rows(rows), file=table)
    print(f"{counted(len(scenarios), 'scenario')} over {counted(len(args.traces), 'trace')}"
          f"{f' x {args.replicates} replicates' if args.replicates > 1 else ''} in {elapsed:.2f} s ({where}"
          f"{f'; {resumed} resumed from the checkpoint' if resumed else ''}); wrote {name_text(args.out)}", file=table)
    return 0


def _load_traces(paths: list[str]) -> list:
    """The traces named on the command line; a stream named twice (``/dev/stdin /dev/stdin``) is read once
    and replayed twice, as a file named twice is: a second reading would find it empty."""
    import stat

    streams: dict[tuple[int, int], object] = {}
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            st = None  # (load_trace says what is wrong with it)
        key = None if st is None or stat.S_ISREG(st.st_mode) else (st.st_dev, st.st_ino)
        if key is not None and key in streams:
            out.append(streams[key])
            continue
        out.append(load_trace(path, name=input_label(path)))  # (`<(cmd)` is a "pipe", not "63")
        if key is not None:
            streams[key] = out[-1]
    return out


def _where(out: str) -> str:
    return "standard output" if out == "-" else out


def _kept(checkpoint: str | None, out: str) -> str:
    """What a failed write of the CSV leaves: the finished scenarios in the checkpoint, for the rerun."""
    from ..checkpoint import is_checkpoint

    if checkpoint is None or not is_checkpoint(checkpoint):
        return "nothing was saved"
    return f"the scenarios are saved in {checkpoint}: rerun the same command to write {_where(out)} from them"


def _progress(args) -> bool | None:
    """The runners' `progress`: None (a bar on a terminal, else a line now and then), or False."""
    return False if args.no_progress else None


def _run_local(args, traces, scenarios, checkpoint):
    import numba

    from ..batch import _check_threads, _cpu_kernel, _user_policy
    from ..checkpoint import DEFAULT_LOCAL_CHUNK, run_local

    threads = _check_threads(args.threads) or numba.get_num_threads()
    chunk = args.chunk_size or max(DEFAULT_LOCAL_CHUNK, 4 * threads)
    if args.backend == "cpu" and not all(_user_policy(sc.policy) for sc in scenarios):
        from .._numba_cache import compile_notice

        compile_notice(_cpu_kernel(args.engine), "the batch replay kernel")  # (built-in policies run there)
    rows = run_local(traces, scenarios, chunk_size=chunk, checkpoint_path=checkpoint, threads=threads,
                     engine=args.engine, backend=args.backend, progress=_progress(args), keep_checkpoint=True)
    return rows, "cuda" if args.backend == "cuda" else f"cpu, {counted(threads, 'thread')}"


def _run_dask(args, traces, scenarios, checkpoint):
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
    return distributed.run_sweep(traces, scenarios, args.dask, progress=_progress(args), threads=args.threads,
                                 chunk_size=args.chunk_size or distributed.DEFAULT_CHUNK_SIZE,
                                 checkpoint_path=checkpoint, keep_checkpoint=True, quiet=True)


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        if v.is_integer():
            return str(int(v))
        # (3 places wrote one step at 5,000 steps/s, 0.0002 s, "0.000"; a miss rate of 0.9996 is not "1")
        return share_text(v, ".3g") if abs(v) < 1 else f"{v:.1f}"
    return str(v)


def _timed(sps) -> bool:
    """Whether a row's trace has a time scale (no scale: None, or NaN in a row read back)."""
    return isinstance(sps, (int, float)) and math.isfinite(sps) and sps > 0


def format_rows(rows: list[dict]) -> str:
    """The sweep table: one line per scenario with its key metrics."""
    seconds = bool(rows) and all(_timed(r.get("steps_per_second")) for r in rows)  # else steps, as in the CSV
    unit = " (s)" if seconds else " (steps)"
    keys = [f"{k}_s" if seconds and k in TIME_KEYS else k for _, k in TABLE_COLUMNS]
    heads = [h + unit if k in TIME_KEYS else h for h, k in TABLE_COLUMNS]
    cells = [[_cell(r.get(k)) for k in keys] for r in rows]
    for c in cells:
        c[0] = name_text(c[0])  # (a trace's label, from its file name: one line per scenario)
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    text_cols = {0, 1}
    lines = ["  ".join(h.ljust(w) if i in text_cols else h.rjust(w) for i, (h, w) in enumerate(zip(heads, widths)))]
    for c in cells:
        lines.append("  ".join(x.ljust(w) if i in text_cols else x.rjust(w) for i, (x, w) in enumerate(zip(c, widths))))
    return "\n".join(lines)
