"""`decodesched report [RESULTS] --out DIR [--trace TRACE ...]`: PNG plots and an HTML page.

RESULTS is a sweep metrics CSV (``decodesched sweep --out``); with ``--trace`` the trace is also
replayed here under each ``--policy`` for the per-request figures.  See `decodesched.report`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..cli import int_arg, interval_arg, kv_blocks_arg, positive_float_arg
from ..engine import POLICIES
from ..errors import UserError
from ..metrics import counted, name_text
from ..policy import replay_interval, resolve_policy

EPILOG = """\
offered load of each sweep trace (first match wins): --loads NAME=L; an offered_load column in the
CSV; the "load" in the trace's .meta.json (decodesched trace convert --load); else the trace file's
own load, work steps / arrival span.  Trace files are looked up as NAME, NAME.csv or NAME.parquet
beside RESULTS, in the current folder, or in --trace-dir.  Units are seconds when every trace has a
time scale (steps_per_second in its .meta.json), else steps.  Traces are never averaged: each family
of traces (converted from one source file) gets its own column of panels (the first 12; the page names
the rest), each trace its own point or table row; replicates show as median with a min..max bar.
Latency statistics count requests that never finished at +inf (censored: a triangle at a panel's top
edge, "inf" in the tables), and the unfinished count stands beside every latency figure and table.
"""


def add_parser(sub) -> None:
    import argparse
    import textwrap

    p = sub.add_parser("report", help="plots and an HTML page from a sweep (and one replayed trace)",
                       description=textwrap.fill(  # (the raw formatter keeps the epilog's lines, not wrapping this)
                                   "Write PNG plots and DIR/index.html: latency, unfinished requests, deadline "
                                   "attainment, starvation, fairness and per-class TTFT against offered load (one "
                                   "panel column per trace family), TTFT against KV capacity and aging interval, "
                                   "from a sweep's metrics CSV; with --trace, "
                                   "latency CDFs, per-class starvation and preemptions, KV occupancy and queue "
                                   "length over time, and a Gantt-style timeline.", 100),
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="?", metavar="RESULTS", help="sweep metrics CSV (decodesched sweep --out)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the PNGs and index.html")
    p.add_argument("--trace", metavar="TRACE", help="also replay this trace for the per-request figures")
    p.add_argument("--policy", type=_names, default=None, metavar="P[,P..]",
                   help=f"policies to replay --trace with: built-in names or module:attr / path/to/file.py:attr "
                        f"naming a decodesched.Policy (default all: {', '.join(POLICIES)})")
    p.add_argument("--timeline-policy", default=None, metavar="P",
                   help="policy of the KV/queue and Gantt figures (default the first --policy)")
    p.add_argument("--kv-blocks", type=kv_blocks_arg, default=None, metavar="N",
                   help="capacity: the cut of the sweep figures and the replay of --trace (default: the "
                        "sweep's lower-median capacity)")
    p.add_argument("--aging-interval", type=interval_arg, default=None, metavar="K",
                   help="aging interval: the cut of the sweep figures (default: 4 where the sweep has it, else its "
                        "smallest) and the replay of --trace (default: the one a policy module:attr was built with, "
                        "else 4)")
    p.add_argument("--load", type=positive_float_arg, default=None, metavar="L",
                   help="show only the traces at this offered load in the P99-against-capacity figure (default all)")
    p.add_argument("--loads", type=_loads, default=None, metavar="NAME=L[,..]",
                   help="offered load of each sweep trace, by its name in the CSV")
    p.add_argument("--trace-dir", action="append", default=[], metavar="DIR",
                   help="where to look for the sweep's trace files (repeatable)")
    p.add_argument("--gantt-requests", type=int_arg, default=30, metavar="N",
                   help="requests shown in the Gantt timeline (default %(default)s)")
    p.set_defaults(func=run)


def _names(text: str) -> list[str]:
    import argparse

    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"empty item in {text!r}")
    return items


def _loads(text: str) -> dict[str, float]:
    import argparse

    out = {}
    for item in _names(text):
        name, sep, value = item.rpartition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"expected NAME=LOAD, got {item!r}")
        if name in out:  # (the last one counted, unsaid; a sweep's value or a policy given twice is refused)
            raise argparse.ArgumentTypeError(f"{name!r} is given twice in {text!r}; give each trace's load once")
        try:
            out[name] = positive_float_arg(value)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"a load must be a positive number, got {item!r}") from None
    return out


def _note(text: str) -> None:
    """A note on stderr, one line (what the report could not show; it still exits 0)."""
    from ..cli import shorten

    print(shorten(f"decodesched report: note: {text}"), file=sys.stderr)


def run(args) -> int:
    from ..report import build_report

    if args.results is None and args.trace is None:
        raise UserError("give a sweep metrics CSV (RESULTS), --trace TRACE, or both")
    for d in args.trace_dir or ():
        if not d.strip():  # (Path('') is the current folder: an unset variable)
            raise UserError(f"--trace-dir {d!r}: an empty folder name; give the folder of the sweep's traces")
        if not Path(d).is_dir():
            raise UserError(f"--trace-dir {d}: not a folder")
    for option, value in (("--policy", args.policy), ("--timeline-policy", args.timeline_policy)):
        if value is not None and args.trace is None:  # they choose the replays of --trace: alone, they do nothing
            raise UserError(f"{option} chooses the replays of --trace; give --trace TRACE too")
    if args.timeline_policy is not None and not args.timeline_policy.strip():
        raise UserError("--timeline-policy is empty; name a policy, or leave it out for the first --policy")
    policies = [resolve_policy(p) for p in args.policy] if args.policy else None  # names, or module:attr
    timeline = resolve_policy(args.timeline_policy.strip()) if args.timeline_policy else None
    for p in (policies or []) + ([timeline] if timeline else []):
        replay_interval(p, args.aging_interval, "--aging-interval")  # (named as the flag, not as the API's keyword)

    def before_replay():  # the scenarios of --trace replay on the fast kernel: say so if it must compile first
        from .._numba_cache import compile_notice
        from ..engine import replay_kernel

        compile_notice(replay_kernel("fast"), "the replay kernel")

    plots = build_report(args.out, results=args.results, trace=args.trace, policies=policies,
                         kv_blocks=args.kv_blocks, aging_interval=args.aging_interval, loads=args.loads,
                         trace_dirs=args.trace_dir, load=args.load, timeline_policy=timeline,
                         gantt_requests=args.gantt_requests, warn=_note, before_replay=before_replay)
    out = args.out.rstrip("/") or "/"  # (`--out report/`: report/index.html, not report//index.html)
    for p in plots:
        print(name_text(os.path.join(out, p.file)))
    print(f"wrote {counted(len(plots), 'plot')} and {name_text(os.path.join(out, 'index.html'))}")
    return 0
