"""`decodesched trace convert` (a real trace to the canonical CSV) and `decodesched trace inspect`."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .. import convert as cv
from .._io import check_outputs, check_writable, extension_said, input_file
from ..cli import float_arg, int_arg, positive_float_arg, seed_arg, shorten
from ..errors import UserError
from ..metrics import counted, name_text, offered_load
from ..trace import load_trace, parse_decimal, show

CONVERT_RULES = f"""\
conversion rules (seeded: the same source, options and --seed give the same trace):
  arrival_step    = floor(seconds after the first request * steps_per_second).
                    --load L picks steps_per_second = work_steps / (L * span_seconds), where
                    work_steps = sum over requests of (1 + max_new_tokens) and span_seconds is
                    first to last arrival: the offered load is work steps per step of wall time
                    (1.0 keeps the one-request-per-step server exactly busy on average).
  prompt_len      = input tokens (at least 1)
  max_new_tokens  = output tokens (0 tokens counts as 1: the model needs at least one)
  required_blocks = ceil((prompt_len + max_new_tokens) / --block-size)
  cache_hit       = azure: false (no prefix data). mooncake: the request's first
                    --cache-min-blocks (K >= 1) hash_ids were all seen in earlier requests (earlier by
                    timestamp, then by line, whatever the file's order; default 2:
                    every request of the Mooncake conversation trace shares block 0, so 1, the plain
                    "first block seen before", makes 99.99% hits; 2 gives 38.7%).
  priority        = drawn from --priority-classes with --priority-weights
                    (default {','.join(map(str, cv.DEFAULT_PRIORITY_CLASSES))} with \
{','.join(map(str, cv.DEFAULT_PRIORITY_WEIGHTS))}; larger runs first)
  deadline_step   = arrival_step + ceil(--slo-factor * (1 + max_new_tokens)) for a random
                    --deadline-fraction of the requests, else none
  preemptible     = false for --protected-classes (default: the largest class), else true
  request_id      = row order in the source (0, 1, ...)
  Draw order from numpy.random.default_rng(--seed): priorities, then deadline coin flips.
  Besides OUT, OUT.meta.json records steps_per_second, the source, the options and the seed.
"""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("trace", help="convert real traces to the canonical CSV; inspect a trace",
                              description="Convert real LLM request traces (Azure 2023, Mooncake) and inspect traces.")
    sub = p.add_subparsers(dest="trace_command", metavar="ACTION")
    p.set_defaults(func=_no_action)

    c = sub.add_parser("convert", help="convert an Azure CSV or Mooncake JSONL to the canonical trace CSV",
                       description="Convert an Azure LLM inference 2023 CSV or a Mooncake JSONL trace to the "
                                   "canonical trace CSV.",
                       epilog=CONVERT_RULES, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("source", metavar="SRC", help="Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or Mooncake "
                                                 "JSONL; 'bundled' means the shipped Azure conversation trace")
    c.add_argument("--format", choices=cv.FORMATS, help="source format (default: from the extension or content; "
                                                        "a pipe, <(command), needs it)")
    scale = c.add_mutually_exclusive_group()
    scale.add_argument("--load", type=positive_float_arg, metavar="L",
                       help="target offered load (work steps per step), e.g. 1.0")
    scale.add_argument("--steps-per-second", type=positive_float_arg, metavar="S",
                       help="time scale: scheduler steps per second")
    c.add_argument("--block-size", type=int_arg, default=cv.DEFAULT_BLOCK_SIZE, metavar="N",
                   help="tokens per KV block (default %(default)s)")
    c.add_argument("--seed", type=seed_arg, default=0, help="seed of the priority/deadline draws (default %(default)s)")
    c.add_argument("--priority-classes", type=_int_list, default=cv.DEFAULT_PRIORITY_CLASSES, metavar="A,B,..",
                   help="priority values to draw from (default %s)" % ",".join(map(str, cv.DEFAULT_PRIORITY_CLASSES)))
    c.add_argument("--priority-weights", type=_float_list, default=None, metavar="W,W,..",
                   help="relative weight of each class (default %s for the default classes, else equal)"
                        % ",".join(map(str, cv.DEFAULT_PRIORITY_WEIGHTS)))
    c.add_argument("--deadline-fraction", type=float_arg, default=cv.DEFAULT_DEADLINE_FRACTION, metavar="F",
                   help="share of requests that get a deadline (default %(default)s)")
    c.add_argument("--slo-factor", type=positive_float_arg, default=cv.DEFAULT_SLO_FACTOR, metavar="X",
                   help="deadline budget in multiples of the request's own work steps (default %(default)s)")
    c.add_argument("--protected-classes", type=_int_list_or_none, default=None, metavar="A,B,..|none",
                   help="classes that cannot be preempted (default: the largest class; 'none' for no class)")
    c.add_argument("--cache-min-blocks", type=int_arg, default=cv.DEFAULT_CACHE_MIN_BLOCKS, metavar="K",
                   help="mooncake: a hit needs the first K hash_ids seen before, K >= 1 (default %(default)s)")
    c.add_argument("--requests", type=int_arg, default=None, metavar="N", help="convert only the first N requests to arrive")
    c.add_argument("--out", required=True, metavar="OUT.csv", help="the canonical trace CSV to write (a .csv name)")
    c.set_defaults(func=run_convert)

    i = sub.add_parser("inspect", help="print the shape of a trace (rows, span, lengths, offered load)",
                       description="Print a trace's shape: rows, span, lengths, cache hits, deadlines, "
                                   "priority classes and offered load (work steps per step of its span).")
    i.add_argument("trace", metavar="TRACE.csv", help="a canonical trace (CSV or Parquet)")
    i.set_defaults(func=run_inspect)


def _no_action(args) -> int:  # (as `decodesched assignment` alone: one line, not the help on stderr)
    raise UserError("say what to do: decodesched trace convert SRC (--load L | --steps-per-second S) --out OUT.csv "
                    "| inspect TRACE (see --help)")


def run(args) -> int:  # the module contract: dispatch to the chosen action
    return args.func(args)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(parse_decimal(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {show(text)}") from None
    if not vals:
        raise argparse.ArgumentTypeError("expected at least one number")
    return vals


def _int_list_or_none(text: str) -> tuple[int, ...]:
    return () if text.strip().lower() == "none" else _int_list(text)


def _float_list(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float_arg(x) for x in text.split(",") if x.strip())
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {show(text)}") from None
    if not vals:
        raise argparse.ArgumentTypeError("expected at least one number")
    return vals


def convert_options(args) -> dict:
    """The conversion options of parsed arguments, as `to_trace` keywords."""
    weights = args.priority_weights
    if weights is None and tuple(args.priority_classes) == tuple(cv.DEFAULT_PRIORITY_CLASSES):
        weights = cv.DEFAULT_PRIORITY_WEIGHTS
    return {
        "load": args.load,
        "steps_per_second": args.steps_per_second,
        "block_size": args.block_size,
        "seed": args.seed,
        "priority_classes": tuple(args.priority_classes),
        "priority_weights": None if weights is None else tuple(weights),
        "deadline_fraction": args.deadline_fraction,
        "slo_factor": args.slo_factor,
        "protected_classes": None if args.protected_classes is None else tuple(args.protected_classes),
    }


def run_convert(args) -> int:
    if args.load is None and args.steps_per_second is None:
        raise UserError("give one of --load L or --steps-per-second S")
    src = cv.bundled_trace_path() if args.source == "bundled" else Path(args.source)
    out = Path(args.out)
    if args.out.strip() and out.is_dir():  # (an empty name, Path's '.', is `check_outputs`'s to refuse)
        raise UserError(f"{out}: is a directory; --out names the CSV file to write")
    if src.exists() and out.exists() and out.resolve() == src.resolve():
        raise UserError(f"{out}: would overwrite the source trace; choose another --out")
    check_outputs([args.out, cv.meta_path(out)], [src])  # (the name as given: `x.csv/` names a folder)
    if out.suffix.lower() != ".csv":  # a .parquet name would be read back as Parquet, another as CSV
        raise UserError(f"{out}: --out names the canonical trace CSV, which ends in .csv; got {extension_said(out)}")
    if args.requests is not None and args.requests < 1:
        raise UserError(f"--requests must be >= 1, got {args.requests}")
    if args.cache_min_blocks < 1:  # (for an Azure source too, which has no hash_ids: the option is wrong either way)
        raise UserError(f"--cache-min-blocks must be >= 1, got {args.cache_min_blocks}")
    check_writable(out)  # a read-only folder names OUT, before the source is read
    if args.source != "bundled":
        input_file(args.source, "trace file")  # (the name as given: a URL is named so, not as Path's `https:/...`)
    fmt = args.format or cv.detect_format(src)
    if fmt == "mooncake":
        raw = cv.read_mooncake(src, cache_min_blocks=args.cache_min_blocks)
    else:
        raw = cv.read_raw(src, fmt)
    if args.requests is not None:
        raw = raw.head(args.requests)
    opts = convert_options(args)
    trace = cv.to_trace(raw, name=src.stem, **opts)
    meta = {
        "source": str(src),
        "format": fmt,
        "options": {**opts, "cache_min_blocks": args.cache_min_blocks if fmt == "mooncake" else None,
                    "requests": args.requests},
        "seed": args.seed,
        "work_steps": trace.work_steps,
    }
    side = cv.write_trace(trace, out, meta)
    print(f"wrote {name_text(str(out))} ({counted(len(trace), 'request', ',')}, {trace.steps_per_second:.6g} "
          f"steps/s, offered load {offered_load_text(trace)}) and {name_text(str(side))}")
    return 0


def _dist(a: np.ndarray) -> str:
    return (f"min {int(a.min())}  median {float(np.median(a)):g}  p99 {float(np.percentile(a, 99)):g}  "
            f"max {int(a.max())}")


def offered_load_text(trace) -> str:
    """`metrics.offered_load` as `trace convert` and `inspect` print it: unbounded where every request arrives at once
    (no span of arrivals; the metric divides by one step there)."""
    if trace.arrival_step.max() == trace.arrival_step.min():
        return "unbounded (every request arrives at once)"
    return f"{offered_load(trace):.3f}"


def inspect_lines(trace, meta: dict | None = None) -> list[str]:
    """The report of `decodesched trace inspect`, as lines."""
    n = len(trace)
    first, last = int(trace.arrival_step.min()), int(trace.arrival_step.max())
    span = last - first
    sps = trace.steps_per_second
    lines = [f"rows             {n}"]
    span_text = f"{span} steps (arrivals {first}..{last})"
    if sps:
        span_text += f" = {span / sps:.1f} s at {sps:.6g} steps/s"
    lines.append(f"span             {span_text}")
    lines.append(f"prompt_len       {_dist(trace.prompt_len)}")
    lines.append(f"max_new_tokens   {_dist(trace.max_new_tokens)}")
    lines.append(f"required_blocks  {_dist(trace.required_blocks)}  (sum {int(trace.required_blocks.sum())})")
    lines.append(f"cache hits       {trace.cache_hit.mean():.1%}")
    lines.append(f"deadlines        {trace.has_deadline.mean():.1%}")
    lines.append(f"preemptible      {trace.preemptible.mean():.1%}")
    classes, counts = np.unique(trace.priority, return_counts=True)
    shown = ", ".join(f"{int(c)}: {k} ({k / n:.1%})" for c, k in zip(classes[:10], counts[:10]))
    more = f", ... ({classes.size} classes)" if classes.size > 10 else ""
    lines.append(f"priority         {shown}{more}")
    work = trace.work_steps
    lines.append(f"work steps       {work}")
    lines.append(f"offered load     {offered_load_text(trace)} (work steps / span)")
    if meta:
        src = meta.get("source")
        if src:
            # (the sidecar's text, shown escaped on one line: a file from elsewhere may hold terminal escapes)
            shown = shorten(f"{src} ({meta.get('format', '?')}, seed {meta.get('seed', '?')})")
            lines.append(f"converted from   {shown}")
    return lines


def run_inspect(args) -> int:
    path = input_file(args.trace, "trace file")
    meta = cv.read_meta(path)
    trace = load_trace(path)
    print("\n".join(inspect_lines(trace, meta)))
    return 0
