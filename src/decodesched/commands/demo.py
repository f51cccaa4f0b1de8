"""`decodesched demo`: the bundled Azure conversation trace under every policy, side by side.

Converts the shipped Azure LLM inference 2023 conversation trace (CC-BY-4.0, Patel et al., ISCA 2024)
at an offered load where a backlog forms now and then, replays it under each policy with the same
KV capacity, prints a summary table and writes ``DIR/ttft_cdf.png`` and ``DIR/summary.csv``.
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .. import convert as cv
from .._io import _describe, output_folder
from ..cli import int_arg, interval_arg, kv_blocks_arg, positive_float_arg, seed_arg
from ..errors import UserError

# Full trace at load 0.8 with 2,000 KV blocks: policies differ clearly in tail TTFT, starvation and
# deadline misses, and the scan kernel replays all four in about 15 s on one core (a load of 0.95
# already takes ~100 s per policy: the backlog, and so the scan, grows sharply near 1.0).
DEFAULT_LOAD = 0.8
DEFAULT_KV_BLOCKS = 2000
DEMO_POLICIES = ("fcfs", "fixed_priority", "aging", "deadline")

SUMMARY_COLUMNS = (
    "policy", "unit", "requests", "finished",
    "queue_wait_p50", "queue_wait_p95", "queue_wait_p99",
    "ttft_p50", "ttft_p95", "ttft_p99",
    "e2e_p50", "e2e_p95", "e2e_p99",
    "starvation_max_wait", "preemptions", "deadline_misses", "with_deadline", "unservable", "unfinished",
    "events", "replay_seconds",
)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="replay the bundled Azure trace under every policy; table + TTFT CDF plot",
        description="Convert the bundled Azure LLM inference 2023 conversation trace (CC-BY-4.0; Patel et al., "
                    "ISCA 2024) at an offered load, replay it under each policy with the same KV capacity, print "
                    "the metrics side by side and write DIR/ttft_cdf.png (TTFT CDF per policy) and "
                    "DIR/summary.csv. Priorities, deadlines and preemptibility come from the seeded rules of "
                    "`decodesched trace convert` (see its --help).",
    )
    p.add_argument("--load", type=positive_float_arg, default=DEFAULT_LOAD, metavar="L",
                   help="offered load, work steps per step of wall time (default %(default)s; near 1.0 the "
                        "backlog, and the run time, grow sharply)")
    p.add_argument("--kv-blocks", type=kv_blocks_arg, default=DEFAULT_KV_BLOCKS, metavar="N",
                   help="free KV blocks (16 tokens each) at the start (default %(default)s)")
    p.add_argument("--requests", type=int_arg, default=None, metavar="N",
                   help="use only the first N requests of the trace to arrive (default: all 19,366)")
    p.add_argument("--aging-interval", type=interval_arg, default=4, metavar="K",
                   help="steps per aging level (default 4)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the priority/deadline rules (default %(default)s)")
    p.add_argument("--out", default="decodesched-demo", metavar="DIR",
                   help="folder for ttft_cdf.png and summary.csv (default ./%(default)s)")
    p.set_defaults(func=run)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def check_args(args) -> Path:
    """Validate everything before any work, so that bad input writes nothing."""
    if not (math.isfinite(args.load) and args.load > 0):
        raise UserError(f"--load must be a positive number, got {args.load}")
    if args.requests is not None and args.requests < 2:
        raise UserError(f"--requests must be at least 2 (a load needs a span of time), got {args.requests}")
    out = output_folder(args.out)
    anc = out
    while not anc.exists():  # the nearest existing ancestor must be a folder we can create in
        anc = anc.parent
    if not anc.is_dir():
        raise UserError(f"{out}: cannot create the folder ({anc} is not a folder)")
    try:  # a read-only file system or folder: say so before the work, not after (os.access lies to root)
        os.rmdir(tempfile.mkdtemp(prefix=".decodesched-probe-", dir=anc))
    except OSError as exc:
        raise UserError(f"{out}: cannot write in {anc} ({_describe(exc)})") from None
    if out.is_dir():  # a file of it that cannot be written (a folder, a FIFO) is said now, not after the replays
        from .._io import check_outputs

        check_outputs(output_files(out))
    return out


def output_files(out: Path) -> tuple[Path, Path]:
    """The demo's plot and summary in its folder `out`."""
    return out / "ttft_cdf.png", out / "summary.csv"


def run(args) -> int:
    from .._io import immediate_interrupt
    from .._numba_cache import compile_notice, early_compile_notice

    out = check_args(args)
    t0 = time.perf_counter()
    early_compile_notice("fast_nb", "replay_fast_nb", "the replay kernel")  # before Numba is imported
    from ..engine import replay_kernel, simulate
    from ..metrics import counted, format_table, name_text
    from .warmup import TINY_TRACE

    if compile_notice(replay_kernel("fast"), "the replay kernel"):
        with immediate_interrupt():  # compile now, on a tiny trace, so that no policy's time includes it
            simulate(TINY_TRACE, "aging", 2, 2, record_events=False)
        _say(f"demo: compiled in {time.perf_counter() - t0:.0f} s (cached for later runs)")
    src = cv.bundled_trace_path()
    raw = cv.read_azure(src)  # (well under a second; a bad --load is one line with nothing before it)
    if args.requests is not None:
        raw = raw.head(args.requests)
    trace = cv.to_trace(raw, load=args.load, seed=args.seed, name="azure_llm_2023_conv")
    sps = trace.steps_per_second
    span_s = float(raw.arrival_seconds.max())
    _say(f"demo: {src.name} at offered load {args.load:g}: {counted(len(trace), 'request')} over {span_s:.0f} s at "
         f"{sps:.4g} steps/s ({counted(trace.work_steps, 'work step')}); {counted(args.kv_blocks, 'KV block')}, "
         f"aging interval {args.aging_interval}")

    results, seconds = {}, {}
    for k, policy in enumerate(DEMO_POLICIES, start=1):
        t = time.perf_counter()
        with immediate_interrupt():
            results[policy] = simulate(trace, policy=policy, free_kv_blocks=args.kv_blocks,
                                       aging_interval=args.aging_interval, record_events=False)
        seconds[policy] = time.perf_counter() - t
        _say(f"demo: [{k}/{len(DEMO_POLICIES)}] {policy}: {counted(results[policy].n_events, 'step')} "
             f"in {seconds[policy]:.1f} s")

    metrics = {p: r.metrics for p, r in results.items()}
    title = (f"Azure LLM 2023 conversation trace: {counted(len(trace), 'request')}, offered load {args.load:g}, "
             f"{counted(args.kv_blocks, 'KV block')}")
    png = render_ttft_cdf({p: r.requests["ttft"] for p, r in results.items()}, sps, title)
    summary = summary_csv(metrics, seconds, sps)

    from .._io import atomic_writer, check_outputs, folders_made, output_group

    png_path, csv_path = output_files(out)
    with folders_made([out]):  # (the folders this run made go again if it fails)
        check_outputs([png_path, csv_path])
        with output_group():  # both files or neither
            with atomic_writer(png_path, "wb") as fh:
                fh.write(png)
            with atomic_writer(csv_path) as fh:
                fh.write(summary)

    print(title + (f"; times in seconds ({sps:.4g} steps/s)" if sps else "; times in steps"))
    print(format_table(metrics))
    print(f"\nwrote {name_text(str(png_path))} and {name_text(str(csv_path))} in {time.perf_counter() - t0:.1f} s")
    return 0


def summary_csv(metrics: dict, seconds: dict, steps_per_second: float | None) -> str:
    """One row per policy; latencies in seconds when the trace has a time scale, else steps."""
    scale = steps_per_second or 1.0
    unit = "s" if steps_per_second else "steps"
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SUMMARY_COLUMNS)
    for policy, m in metrics.items():
        lat = [_num(m[name][p] / scale) for name in ("queue_wait", "ttft", "e2e") for p in ("p50", "p95", "p99")]
        w.writerow([policy, unit, m["requests"], m["finished"], *lat, _num(m["starvation"] / scale),
                    m["preemptions"], m["deadline_misses"], m["with_deadline"], m["unservable"], m["unfinished"],
                    m["events"], round(seconds[policy], 3)])
    return buf.getvalue()


def _num(v: float):
    return "" if v is None or math.isnan(v) else round(float(v), 6)


def render_ttft_cdf(ttft: dict[str, np.ndarray], steps_per_second: float | None, title: str) -> bytes:
    """PNG bytes of the empirical CDF of TTFT per policy (unfinished requests never reach the curve's top).

    Uses matplotlib's object API with the Agg canvas, so no global backend is changed.
    """
    from ..report import cdf_steps, import_matplotlib

    import_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ..metrics import percentiles_censored, significant
    from ..palette import policy_colors, policy_style

    scale = steps_per_second or 1.0
    unit = "seconds" if steps_per_second else "steps"
    short = "s" if steps_per_second else "steps"
    fig = Figure(figsize=(11, 4.8), dpi=110)
    FigureCanvasAgg(fig)
    ax_all, ax_tail = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    styles = {p: (c, policy_style(p)) for p, c in policy_colors(ttft).items()}  # as in every figure
    lo, hi, tail_lo = math.inf, 0.0, math.inf
    plotted = 0
    for policy, values in ttft.items():
        v = np.sort(values[~np.isnan(values)]) / scale
        if v.size == 0:
            continue
        # (the P99 of every request, those without a first token censored at +inf, as in the table: SPEC 9)
        p99 = percentiles_censored(v, values.size - v.size, (99,))[0]
        color, ls = styles.get(policy, (None, "-"))
        plotted += 1
        for ax in (ax_all, ax_tail):
            ax.step(*cdf_steps(v, values.size), where="post", color=color, linestyle=ls, linewidth=1.6,
                    label=f"{policy} (P99 {significant(p99, 3)} {short})")
        if np.any(v > 0):
            lo = min(lo, float(v[v > 0].min()))
        hi = max(hi, float(v.max()))
        k = max(int(math.floor(0.95 * values.size)) - 1, 0)  # the curve enters the tail panel here
        if k < v.size and v[k] > 0:
            tail_lo = min(tail_lo, float(v[k]))
    log = hi > 0 and math.isfinite(lo) and hi / lo > 50
    for ax in (ax_all, ax_tail):
        if log:
            ax.set_xscale("log")
        ax.set_xlabel(f"time to first token ({unit}{', log scale' if log else ''})")
        ax.grid(True, which="major", alpha=0.3)
        ax.axhline(0.99, color="0.5", linewidth=0.8, linestyle=":")
    ax_all.set_ylabel("fraction of requests with TTFT \u2264 x")
    ax_all.set_ylim(0, 1.02)
    ax_all.set_title("TTFT CDF per policy", fontsize=10)
    if plotted:
        ax_all.legend(loc="upper left", fontsize=9, title="policy", title_fontsize=9)
    else:  # no request of any policy got its first token (e.g. capacity below every request's blocks)
        ax_all.text(0.5, 0.5, "no request got a first token", transform=ax_all.transAxes, ha="center")
    ax_tail.set_ylim(0.95, 1.002)
    if math.isfinite(tail_lo) and hi > tail_lo:
        ax_tail.set_xlim(tail_lo * (0.7 if log else 0.95), hi * (1.3 if log else 1.02))
    ax_tail.set_title("the tail: slowest 5% (dotted line: P99)", fontsize=10)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
