"""`decodesched simulate TRACE --policy P --kv-blocks N [--aging-interval K] [--max-steps N]
[--events PATH] [--requests PATH] [--engine fast|scan]`: replay one trace, print a summary table."""

from __future__ import annotations

import contextlib
import sys
import time

from ..cli import interval_arg, kv_blocks_arg, steps_arg
from ..engine import ENGINES, POLICIES, simulate
from ..metrics import counted, format_table, name_text
from ..policy import replay_interval, resolve_policy
from ..trace import load_trace


def add_parser(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a trace under one policy and capacity",
        description="Replay a canonical trace CSV (or Parquet) under one policy and KV capacity, print "
        "P50/P95/P99 of queue wait, TTFT and e2e, starvation, preemptions, deadline misses and unservable "
        "requests, and optionally write the events and per-request tables (docs/files.md).",
    )
    p.add_argument("trace", metavar="TRACE", help="canonical trace CSV or .parquet")
    p.add_argument("--policy", required=True, metavar="P", type=str.strip,  # (as sweep reads its list)
                   help=f"a built-in policy ({', '.join(POLICIES)}) or module:attr / path/to/file.py:attr naming "
                   "a decodesched.Policy")
    p.add_argument("--kv-blocks", type=kv_blocks_arg, required=True, metavar="N", help="free KV blocks at the start")
    p.add_argument("--aging-interval", type=interval_arg, default=None, metavar="K",
                   help="steps per priority level (default: the one a policy module:attr was built with, else 4)")
    p.add_argument("--max-steps", type=steps_arg, default=None, metavar="N", help="stop after N steps that ran")
    p.add_argument("--events", metavar="PATH", help="write the event log here: a .csv, or a .parquet / .pq name "
                   "(needs the data extra); - for standard output")
    p.add_argument("--requests", metavar="PATH", help="write the per-request table here (.csv, .parquet / .pq, or - "
                   "for standard output)")
    p.add_argument("--engine", choices=ENGINES, default="fast", help="fast (default) or the scan baseline")
    p.set_defaults(func=run)


def run(args) -> int:
    from .._io import STDOUT, check_outputs, check_writable, immediate_interrupt, input_label, output_group
    from .._numba_cache import compile_notice, early_compile_notice
    from ..tables_io import check_table_output

    check_outputs([args.events, args.requests], [args.trace])
    for path in (args.events, args.requests):
        if path is not None:
            check_table_output(path)  # another extension, or Parquet without pyarrow, is refused before the replay
            check_writable(path)  # and a folder that takes no file (read-only), not after it
    trace = load_trace(args.trace, name=input_label(args.trace))  # (`<(cmd)`: a "pipe", not "63")
    policy = resolve_policy(args.policy)
    interval = replay_interval(policy, args.aging_interval, "--aging-interval")  # (refused before any compile)
    if not isinstance(policy, str):
        with contextlib.redirect_stdout(sys.stderr):  # (what the policy prints: standard output may be a table)
            policy.compile()  # a user policy's kernel, with its own notice, before the replay is timed
    else:
        what = f"the {args.engine} replay kernel"
        early_compile_notice(f"{args.engine}_nb", f"replay_{args.engine}_nb", what)  # before Numba is imported
        from ..engine import replay_kernel

        compile_notice(replay_kernel(args.engine), what)
    start = time.perf_counter()
    with immediate_interrupt(), contextlib.redirect_stdout(sys.stderr):
        result = simulate(trace, policy, args.kv_blocks, interval, args.max_steps,
                          record_events=args.events is not None, engine=args.engine)
    elapsed = time.perf_counter() - start
    with output_group():  # both files or neither
        if args.events:
            result.write_events(args.events)
        if args.requests:
            result.write_requests(args.requests)
    out = sys.stderr if STDOUT in (args.events, args.requests) else sys.stdout  # keep a streamed table clean
    aging = policy == "aging" if isinstance(policy, str) else policy.uses_aging_interval
    interval = f", aging interval {result.aging_interval}" if aging else ""  # (the others ignore it)
    print(f"{name_text(trace.name)}: {counted(len(trace), 'request')}, policy {result.policy}, "
          f"{counted(args.kv_blocks, 'KV block')}{interval}; {counted(result.n_events, 'step')} in {elapsed:.2f} s "
          f"({result.stop_reason})", file=out)
    print(format_table({result.policy: result.metrics}), file=out)
    return 0
