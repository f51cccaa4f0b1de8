"""`decodesched report`: PNG plots and one HTML page from a sweep's metrics CSV (and one scenario run).

Two sources, either or both:

- **a sweep** (the metrics CSV of ``decodesched sweep``, one row per scenario).  Nothing is averaged
  across traces: traces are grouped into **families** (the traces converted from one source file,
  by their ``.meta.json``; else each trace is its own family), every figure has one column of panels
  per family (the first ``MAX_PANEL_COLUMNS``; the page names the rest), with offered load on the x
  axis (one point per trace) and one line per policy.  Where
  a sweep has replicates (``--replicates``), a point is their median and its bar their min..max.
  Figures: latency P50/P99 and the unfinished count against load; deadline attainment; starvation
  and fairness; P99 TTFT of each priority class; P99 TTFT and unfinished count against KV capacity
  (one panel per trace); for each policy swept over several aging intervals, the top and bottom
  classes' P99 TTFT, starvation and preemptions against the interval.  Tables (one row per trace): P99 TTFT with deadline attainment and
  unfinished count per policy, and the top class's P99 TTFT.  The offered load of each trace is,
  first match wins: ``loads={"name": 1.2}`` (``--loads name=1.2,..``); the ``offered_load`` column;
  the ``load`` in the trace's ``.meta.json``; else the load of the trace file itself.  The trace
  file is looked up as ``NAME``, ``NAME.csv`` or ``NAME.parquet`` beside the CSV, in the current
  directory, or in ``trace_dirs`` (``--trace-dir``).  Sweeps with several capacities or aging
  intervals are cut at one of each (``kv_blocks``, ``aging_interval``; default the lower median
  capacity and interval 4 when swept; the interval cuts only policies that use it).
- **one trace** replayed here under each policy (``trace=``, ``policies``, ``kv_blocks``,
  ``aging_interval``): CDFs of queue wait, TTFT and e2e (log x where they span decades, with a tail
  zoom); starvation, preemptions and deadline attainment per priority class; KV blocks in use and
  queue length over time; a Gantt-style timeline of the first ``gantt_requests`` requests.

Honest statistics (SPEC section 9): a latency statistic counts requests that never finished as +inf
(censored; the sweep CSV then holds ``inf``); a censored point, or one with a censored replicate, is drawn
as a triangle at the top edge of its panel, and the unfinished count stands beside every latency figure and
table.  A CDF counts every request, so it ends below 1 when some never finished.  One colour per policy
(`decodesched.palette`).  Units: steps, or seconds when every trace involved has a time scale
(``steps_per_second``); each sweep row is converted with its own trace's scale.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import html
import math
import os
import re
import shutil
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._io import (META_SUFFIX, _describe, _same_file, input_file, input_label, meta_path, not_text, output_folder,
                  output_target, path_argument, replace_together, temp_prefix)
from .errors import UserError
from .metrics import MAX_CLASS_COLUMNS, counted, name_text, offered_load, share_text, significant
from .model import is_integer
from .palette import POLICY_ORDER, policy_colors, policy_marker, policy_style, sorted_policies
from .tables_io import is_parquet
from .trace import INT64_MAX, MAX_INT_DIGITS, next_header, separator_hint, show

LATENCY_LABELS = {"queue_wait": "queue wait", "ttft": "TTFT", "e2e": "end-to-end latency", "tpot": "TPOT"}
LOAD_LABEL = "offered load (work steps per step)"
# Rows of the Gantt figure at most: about 22 px each, so 2,000 make a 44,000-pixel-tall image.
MAX_GANTT_REQUESTS = 2000
# Columns of panels in one sweep figure at most (trace families; traces in the capacity figure): 4.6 inches
# each, so a sweep of 100 traces without sidecars (each its own family) drew for ten minutes, and 143 or more
# pass Agg's 2**16-pixel width.  The rest are named in the page; the tables keep a row for every trace.
MAX_PANEL_COLUMNS = 12
CENSORED_NOTE = ("A triangle at a panel's top edge marks a censored value (inf: too many requests never "
                 "finished for the statistic to exist), also where only some replicates of a point are censored.")


@dataclass
class Plot:
    """One rendered figure: its file (relative to the report folder), caption, axis labels and legend."""

    name: str
    caption: str
    xlabels: list[str] = field(default_factory=list)
    ylabels: list[str] = field(default_factory=list)
    legend: list[str] = field(default_factory=list)

    @property
    def slug(self) -> str:
        """The name as a file name and HTML id: letters, digits, '_', '.', '-' kept, anything else (a
        policy's '/', quotes, '#', spaces) as '_', with a short hash of the name when one was replaced,
        so that two names never share a file."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.name).lstrip(".")[:80]
        if safe == self.name:
            return safe
        return f"{safe}_{hashlib.sha256(self.name.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"

    @property
    def file(self) -> str:
        return f"{self.slug}.png"


def import_matplotlib():
    """matplotlib, imported whatever MPLBACKEND says.  The figures are drawn on Agg canvases (no pyplot, no
    display), so the backend is never used; but a value matplotlib does not know (``MPLBACKEND=junk``, a name
    from another matplotlib version) failed its import with a traceback, after the whole replay.  The variable
    is set aside while matplotlib is imported, then applied as matplotlib's import does where it is a backend
    (a script's pyplot, later in the process, still gets it)."""
    if "matplotlib" in sys.modules:
        return sys.modules["matplotlib"]
    wanted = os.environ.pop("MPLBACKEND", None)
    try:
        import matplotlib
    finally:
        if wanted is not None:
            os.environ["MPLBACKEND"] = wanted
    if wanted:
        with contextlib.suppress(ValueError):  # (not a backend: left out, as unused here)
            matplotlib.rcParams["backend"] = wanted
    return matplotlib


def _plain_text():
    """Text drawn as given: a policy or trace name with '$' in it is not mathtext (which would draw
    '$x$' as math, and fail on '$\\sqrt$')."""
    return import_matplotlib().rc_context({"text.parse_math": False})


def _figure(nrows: int = 1, ncols: int = 1, width: float = 6.4, height: float = 4.2, **kw):
    import_matplotlib()
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _text_width(text: str, fontsize: float) -> float:
    """The width of one line of `text` drawn at `fontsize`, in points."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    return TextToPath().get_text_width_height_descent(text, FontProperties(size=fontsize), ismath=False)[0]


def _wrapped(text: str, fontsize: float, room: float) -> str:
    """`text` broken at spaces into lines of at most `room` points each, where the words allow."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and _text_width(f"{lines[-1]} {word}", fontsize) <= room:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return "\n".join(lines)


def _suptitle(fig, text: str, fontsize: float) -> None:
    """The figure's title, wrapped onto more lines where one would be wider than the figure (a sweep of
    one trace family draws a single column of panels, 4.6 inches: its one-line title was cut at both ends)."""
    fig.suptitle(_wrapped(text, fontsize, fig.get_figwidth() * 72 * 0.96), fontsize=fontsize)


def _legend(fig, ax) -> None:
    """The legend of `ax`'s lines (one per policy) below the figure's panels, in as many columns as fit its width,
    the figure made taller by its rows: inside the first panel, a sweep of ten policies had it cover that panel's
    lines and its censored note."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    entry = max(_text_width(label, 8) for label in labels) + 40  # points: the label, its line and the gaps
    columns = max(1, min(len(labels), int(fig.get_figwidth() * 72 * 0.95 // entry)))
    rows = -(-len(labels) // columns)
    fig.set_figheight(fig.get_figheight() + (rows * 14 + 14) / 72)
    fig.legend(handles, labels, loc="outside lower center", ncols=columns, fontsize=8)


def _count_axis(ax) -> None:
    """A y axis of counts: whole-number ticks, none below 0 (with every count 0 matplotlib centred the
    line in -0.04..0.04, ticks at -0.02 requests; with every count 1, in 0.95..1.05, ticks at 1.005)."""
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    lo, hi = ax.get_ylim()
    if hi < 1:
        ax.set_ylim(-0.05, 1)
    elif lo < 0 or math.floor(hi) <= math.ceil(lo):  # (below 0, or one whole number in view: from 0 then)
        ax.set_ylim(-0.05 * hi, hi)


def _plain_log_ticks(ax) -> None:
    """Log-axis tick labels as plain text (`100`, `1e+04`): matplotlib's default writes them as
    mathtext, which `_plain_text` turns off, so they would show as `$\\mathdefault{10^{2}}$`."""
    from matplotlib import ticker

    for axis in (ax.xaxis, ax.yaxis):
        for get, put in ((axis.get_major_formatter, axis.set_major_formatter),
                         (axis.get_minor_formatter, axis.set_minor_formatter)):
            f = get()
            if isinstance(f, ticker.LogFormatterSciNotation):
                # (the scale's base through its public transform; a formatter's own fields are private)
                put(ticker.LogFormatter(base=getattr(axis.get_transform(), "base", 10),
                                        labelOnlyBase=f.labelOnlyBase, minor_thresholds=f.minor_thresholds,
                                        linthresh=getattr(axis.get_transform(), "linthresh", None)))


def _save(fig, out: Path, plot: Plot) -> Plot:
    for ax in fig.axes:
        _plain_log_ticks(ax)
        if ax.get_xlabel():
            plot.xlabels.append(ax.get_xlabel())
        if ax.get_ylabel():
            plot.ylabels.append(ax.get_ylabel())
    for legend in [ax.get_legend() for ax in fig.axes] + fig.legends:
        if legend is not None:
            plot.legend += [t.get_text() for t in legend.get_texts() if t.get_text() not in plot.legend]
    with warnings.catch_warnings():  # (a long name in a title: the layout gives up, the figure is still drawn)
        warnings.filterwarnings("ignore", message="constrained_layout not applied")
        fig.savefig(out / plot.file, dpi=100)
    return plot


def _log_if_wide(ax, values, axis: str = "y", ratio: float = 50.0) -> bool:
    """Log scale on `axis` when the finite positive values span more than `ratio` (symmetric log,
    linear below the smallest positive value, when some values are 0, so that they stay visible)."""
    finite = [x for x in values if x is not None and math.isfinite(x)]
    v = np.asarray([x for x in finite if x > 0], dtype=float)
    if not (v.size and v.max() / v.min() > ratio):
        return False
    scale = ax.set_yscale if axis == "y" else ax.set_xscale
    if any(x <= 0 for x in finite):
        scale("symlog", linthresh=float(v.min()))
    else:
        scale("log")
    return True


# ---------------------------------------------------------------------------------------- sweep


METRIC_LIMIT = 2**63  # no count, step or second of a replay comes near it; larger values cannot be drawn
# A number cell: ASCII decimal, optional '-' and exponent (what `batch.write_metrics_csv` writes), or
# inf / nan in any letter case; not '4_0', '+7', '0x10' or other scripts' digits (docs/files.md).
# (One pattern: an integer by the trace readers' rule, `trace.parse_decimal`, or a decimal, or inf / nan.)
_NUMBER_CELL = re.compile(r"(-?[0-9]+)|-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|-?(inf|infinity|nan)",
                          re.ASCII | re.IGNORECASE)


def _parse_cell(text: str) -> int | float:
    """A number cell of the sweep CSV: an integer by the trace readers' rule (`trace.parse_decimal`: at
    most `trace.MAX_INT_DIGITS` digits, else it is read as a float), else a decimal or exponent number,
    ``inf`` or ``nan``; ValueError otherwise."""
    s = text.strip()
    m = _NUMBER_CELL.fullmatch(s)
    if m is None:
        raise ValueError(f"not a number: {text!r}")
    if m.group(1) is not None and len(s.lstrip("-").lstrip("0")) <= MAX_INT_DIGITS:
        return int(s)
    return float(s)


# The columns of a sweep CSV the report reads (`build_report` keeps only these in memory; every cell of
# every column is still checked): the scenario's key, the trace's load and time scale, and the metrics
# of the figures and tables (`_missing_columns` names the same ones).
REPORT_COLUMNS = re.compile(
    r"(trace|policy|replicate|kv_blocks|aging_interval|offered_load|steps_per_second"
    r"|ttft_p50|ttft_p99|queue_wait_p99|e2e_p99|unfinished|slo_attainment|starvation|fairness_jain|preemptions)"
    r"|(ttft_p99|slo_attainment|unfinished)_class-?[0-9]+", re.ASCII)


def read_sweep(path, columns=None) -> list[dict]:
    """The rows of a sweep metrics CSV: numbers as int/float (empty cells NaN, ``inf`` censored), text
    as str; a CSV without a ``replicate`` column gets replicate 0.  A ``.parquet`` / ``.pq`` name is
    read as Parquet (`decodesched.frames.to_parquet` of a batch or its rows), checked as the CSV is.

    `columns` (a compiled pattern, such as `REPORT_COLUMNS`): besides ``trace`` and ``policy``, only the
    columns whose whole name it matches are kept in the rows (every cell is checked all the same).
    Rows are parsed as they are read, so a large sweep is never held as text."""
    path = input_file(path, "sweep metrics CSV")
    if is_parquet(path):
        header, cells = _parquet_sweep(path)
        keep, names = _sweep_columns(path, header, columns)
        out = [_parse_row(path, i + 2, row, header, keep, names) for i, row in enumerate(cells)]
        if not out:
            raise UserError(f"{path}: the sweep has no rows")
        return out
    out = []
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:  # (with or without a byte-order mark)
            lines = csv.reader(fh)
            header = next_header(lines, path, UserError) or []  # (after Excel's ``sep=,``; another one is named)
            keep, names = _sweep_columns(path, header, columns)
            reader = csv.DictReader(fh, header)  # (the records after the header: its line numbers count from it)
            for row in reader:
                out.append(_parse_row(path, lines.line_num + reader.line_num, row, header, keep, names))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise UserError(not_text(path, exc)) from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({_describe(exc)})") from None
    except csv.Error as exc:
        raise UserError(f"{path}: not a CSV file ({exc})") from None
    if not out:
        raise UserError(f"{path}: the sweep has no rows")
    return out


def _sweep_columns(path, header: list, columns) -> tuple[set, dict]:
    """Check a sweep's header; return the columns to keep and the dict that shares name strings."""
    missing = [c for c in ("trace", "policy", "kv_blocks", "aging_interval") if c not in header]
    if missing:
        raise UserError(f"{path}: not a sweep metrics CSV (no column {', '.join(missing)})"
                        f"{separator_hint(header, 'a sweep metrics CSV')}")
    dup = [c for c, n in Counter(header).items() if n > 1]  # (a row would keep only the last one's cell)
    if dup:
        raise UserError(f"{path}: duplicate column(s) {', '.join(dup)}")
    return {k for k in header if columns is None or columns.fullmatch(k)}, {}


def _parquet_sweep(path) -> tuple[list, list[dict]]:
    """A Parquet sweep's column names and its rows as the CSV's cells (`batch.write_metrics_csv`'s)."""
    from ._io import read_parquet_table
    from .batch import _csv_value

    table = read_parquet_table(path)
    cells = [{k: str(_csv_value(v)) for k, v in row.items()} for row in table.to_pylist()]
    return table.column_names, cells


def _parse_row(path, lineno: int, row: dict, header: list, keep: set, names: dict) -> dict:
    if None in row or None in row.values():  # more or fewer cells than the header
        cells = len(header) + len(row.get(None, ())) - sum(v is None for v in row.values())
        raise UserError(f"{path}: line {lineno}: {cells} cells, the header has {len(header)}")
    parsed = {"replicate": 0}
    kv = None
    for k, v in row.items():
        if k in ("trace", "policy"):
            if not v:
                raise UserError(f"{path}: line {lineno}, column {k}: empty")
            parsed[k] = names.setdefault(v, v)
            continue
        if v is None or v == "":
            value = math.nan
        else:
            try:
                value = _parse_cell(v)
            except ValueError:
                raise UserError(f"{path}: line {lineno}, column {k}: not a number: {show(v)}") from None
            if math.isfinite(value) and abs(value) > METRIC_LIMIT:
                raise UserError(f"{path}: line {lineno}, column {k}: {show(v)} is beyond any metric of a "
                                "replay (at most 2**63)")
        if k in keep:
            parsed[k] = value
        if k == "kv_blocks":
            kv = value
    if not (isinstance(kv, int) and 0 <= kv <= INT64_MAX):  # (a sweep's capacities are int64)
        raise UserError(f"{path}: line {lineno}, column kv_blocks: not a whole number of blocks (0 to 2**63 - 1): "
                        f"{show(row['kv_blocks'])}")
    return parsed


@dataclass
class TraceInfo:
    load: float | None
    steps_per_second: float | None
    path: Path | None = None
    family: str | None = None


def _find_trace_file(name: str, dirs: list[Path], results_path=None) -> Path | None:
    """The first of NAME, NAME.csv, NAME.parquet in `dirs` that is a file, but the sweep's own results
    (a sweep of ``study.csv`` written to ``study.csv`` beside it is a natural choice)."""
    for d in dirs:
        for candidate in (d / name, d / f"{name}.csv", d / f"{name}.parquet"):
            if candidate.is_file() and not (results_path is not None and _same_file(candidate, Path(results_path))):
                return candidate
    return None


def _meta_load(meta: dict) -> float | None:
    """The target load a sidecar records (``options.load`` from ``trace convert``, or a top-level ``load``)."""
    options = meta.get("options") if isinstance(meta.get("options"), dict) else {}
    for value in (options.get("load"), meta.get("load")):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
            return float(value)
    return None


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 else None


def trace_info(rows: list[dict], results_path=None, *, loads: dict | None = None, trace_dirs=()) -> dict[str, TraceInfo]:
    """Offered load, time scale and family of each trace named in the sweep rows (see the module docstring)."""
    from .convert import read_meta
    from .trace import load_trace

    loads = dict(loads or {})
    names = list(dict.fromkeys(r["trace"] for r in rows))
    stray = [n for n in loads if n not in names]
    if stray:
        known = ", ".join(names)
        raise UserError(f"--loads names {stray[0]!r}, which is not a trace of the sweep "
                        f"({known if len(known) <= 120 else known[:119] + chr(0x2026)})")
    dirs = [Path(results_path).parent] if results_path else []
    dirs += [Path(".")] + [Path(d) for d in trace_dirs]
    info = {}
    first = {}  # each trace's first row
    for r in rows:
        first.setdefault(r["trace"], r)
    for name in names:
        path = _find_trace_file(name, dirs, results_path)
        meta = read_meta(path) if path else None
        sps = _number(first[name].get("steps_per_second")) or (_number(meta.get("steps_per_second")) if meta else None)
        load = float(loads[name]) if name in loads else _number(first[name].get("offered_load"))
        if load is None and meta:
            load = _meta_load(meta)
        if path is not None and (load is None or sps is None):
            trace = load_trace(path)
            load = offered_load(trace) if load is None else load
            sps = trace.steps_per_second if sps is None else sps
        source = meta.get("source") if meta else None
        family = Path(source).stem if isinstance(source, str) and source else None
        info[name] = TraceInfo(load, sps, path, family)
    return info


def families(info: dict[str, TraceInfo]) -> dict[str, list[str]]:
    """Trace names by family, each family's traces by load.  Traces from one source file form a
    family when their loads differ (a line over load); otherwise each trace is its own family."""
    groups: dict[str, list[str]] = {}
    for name, i in info.items():
        groups.setdefault(i.family or name, []).append(name)
    out: dict[str, list[str]] = {}
    for fam, names in groups.items():
        loads = [info[n].load for n in names]
        if len(names) > 1 and (None in loads or len(set(loads)) < len(loads)):
            out.update({n: [n] for n in names})
        else:
            out[fam] = sorted(names, key=lambda n: (info[n].load or 0.0, n))
    return out


def _pick(values, wanted, what: str, default):
    values = sorted(set(values))
    if wanted is None:
        return default(values)
    if wanted not in values:
        raise UserError(f"the sweep has no {what} {wanted}; it has {', '.join(map(str, values))}")
    return wanted


def _lower_median(values):
    return values[(len(values) - 1) // 2]


def _default_interval(values):
    return 4 if 4 in values else values[0]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


class SweepView:
    """The sweep rows cut at one capacity and aging interval, with each trace's load, time scale and family."""

    def __init__(self, rows, info: dict[str, TraceInfo], kv_blocks=None, aging_interval=None):
        self.rows = rows
        self.info = info
        self.kv_blocks = _pick([r["kv_blocks"] for r in rows], kv_blocks, "capacity (kv_blocks)", _lower_median)
        intervals = [r["aging_interval"] for r in rows if _finite(r["aging_interval"])]
        self.aging_interval = (_pick(intervals, aging_interval, "aging interval", _default_interval)
                               if intervals or aging_interval is not None else None)
        self.policies = sorted_policies(r["policy"] for r in rows)
        self.colors = policy_colors(self.policies)
        self.seconds = all(i.steps_per_second for i in info.values())
        self.unit = "s" if self.seconds else "steps"
        self.has_loads = all(i.load is not None for i in info.values())
        self.families = families(info)
        self.replicates = len({r.get("replicate", 0) for r in rows})
        self.columns = set().union(*rows)
        self._groups: dict[tuple, list] = {}  # (policy, trace, kv_blocks) -> its rows, in CSV order
        for r in rows:
            self._groups.setdefault((r["policy"], r["trace"], r["kv_blocks"]), []).append(r)

    def group(self, policy: str, trace: str, kv_blocks) -> list:
        """The rows of (`policy`, `trace`, `kv_blocks`), in CSV order."""
        return self._groups.get((policy, trace, kv_blocks), [])

    def _keep(self, r) -> bool:
        return not _finite(r["aging_interval"]) or r["aging_interval"] == self.aging_interval

    def scale(self, r) -> float:
        return 1.0 / self.info[r["trace"]].steps_per_second if self.seconds else 1.0

    def values(self, policy: str, key: str, trace: str, *, time: bool, kv_blocks=None) -> list[float]:
        """`key` of every replicate of (`policy`, `trace`) at the cut (capacity `kv_blocks`, default the cut's)."""
        kv = self.kv_blocks if kv_blocks is None else kv_blocks
        seen, out = set(), []
        for r in self.group(policy, trace, kv):
            if not self._keep(r):
                continue
            if r.get("replicate", 0) in seen:
                continue  # an older CSV repeats interval-independent policies per interval
            seen.add(r.get("replicate", 0))
            v = float(r.get(key, math.nan))
            out.append(v * self.scale(r) if time else v)
        return out

    @staticmethod
    def _spread(values: list[float]) -> tuple[float, float, float]:
        """Median, min and max over replicates (NaN when none)."""
        v = np.asarray([x for x in values if not math.isnan(x)], dtype=float)
        if v.size == 0:
            return math.nan, math.nan, math.nan
        return float(np.median(v)), float(v.min()), float(v.max())

    def by_load(self, policy: str, key: str, family: str, *, time: bool):
        """(loads, median, min, max) over the traces of `family` for `policy` at the cut."""
        names = self.families[family]
        stats = [self._spread(self.values(policy, key, n, time=time)) for n in names]
        return (np.array([self.info[n].load for n in names], dtype=float),
                *(np.array(s, dtype=float) for s in zip(*stats)))

    def by_capacity(self, policy: str, key: str, trace: str, *, time: bool):
        """(capacities, median, min, max) for `policy` on `trace` (aging interval at the cut)."""
        caps = sorted({r["kv_blocks"] for r in self.rows if r["trace"] == trace})
        stats = [self._spread(self.values(policy, key, trace, time=time, kv_blocks=c)) for c in caps]
        return (np.array(caps, dtype=float), *(np.array(s, dtype=float) for s in zip(*stats)))


def _draw(ax, x, y, lo, hi, *, policy: str, view: SweepView, scale: float = 1.0) -> tuple[list[float], bool]:
    """One policy's line: finite points joined, replicate spread as bars, censored (inf) points as
    triangles at the top edge, as is a point whose median is finite but one of its replicates censored (its
    max is inf: no bar can reach it).  Returns the finite values (for the log-scale decision) and whether
    a point was censored."""
    y, lo, hi = y * scale, lo * scale, hi * scale
    color = view.colors[policy]
    finite = np.isfinite(y)
    ax.plot(x[finite], y[finite], marker=policy_marker(policy, view.policies), ls=policy_style(policy),
            color=color, label=policy, ms=5)
    spread = finite & np.isfinite(hi) & (hi > lo)
    if spread.any():
        ax.errorbar(x[spread], y[spread], yerr=[y[spread] - lo[spread], hi[spread] - y[spread]], fmt="none",
                    ecolor=color, elinewidth=1, capsize=3)
    return [float(v) for v in np.concatenate([y[finite], lo[spread], hi[spread]])], _censored_marks(ax, x, hi, color)


def _censored_marks(ax, x, y, color) -> bool:
    """Censored (inf) points of a line as triangles at the panel's top edge; whether there was one."""
    censored = np.isinf(y) & (y > 0)
    if censored.any():
        ax.plot(x[censored], np.full(censored.sum(), 0.97), ls="", marker="^", ms=8, color=color,
                transform=ax.get_xaxis_transform(), clip_on=False)
    return bool(censored.any())


def _panel(ax, view: SweepView, series, key: str, scale: float = 1.0) -> list[float]:
    """Every policy's line in one panel (`series(policy)` gives x, y, lo, hi) of metric column `key`; the
    policies with a censored point are named (their triangles may overlap).  Returns the finite values."""
    seen, names = [], []
    for p in view.policies:
        values, censored = _draw(ax, *series(p), policy=p, view=view, scale=scale)
        seen += values
        if censored:
            names.append(p)
    _censored_note(ax, names, view.policies, "policy")
    if not seen:
        ax.set_yticks([])
    _no_column(ax, view, key, empty=not seen and not names)
    return seen


def _censored_note(ax, names: list[str], lines: list[str], what: str) -> None:
    """Name the lines (of `lines`, each a `what`) with a censored point in the panel (their triangles may overlap),
    wrapped to the panel's width: on one line, the names of ten policies ran across the panels beside it."""
    if names:
        named = f"every {what}" if len(lines) > 1 and set(names) == set(lines) else ", ".join(names)
        room = ax.figure.get_figwidth() * 72 * ax.get_position().width * 0.94  # points, less a margin
        ax.text(0.02, 0.86, _wrapped("\u25b2 inf (censored): " + named, 7, room), transform=ax.transAxes,
                fontsize=7, va="top", color="0.25")


def _no_column(ax, view: SweepView, key: str, empty: bool) -> None:
    """A panel whose metric column the CSV lacks, or with nothing to draw (`empty`: every cell of it empty
    or nan), says so (instead of an empty panel, with axis ticks about 0, that looks like data)."""
    if key not in view.columns:
        text = f"no column {key} in the sweep CSV"
    elif empty:
        text = f"no value of {key} to draw: its cells here are empty or nan"
    else:
        return
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="0.35")
    ax.set_xticks([])


def _missing_columns(view: SweepView, plots: list[Plot], classes: list[int]) -> str | None:
    """One sentence naming the metric columns the figures and tables of this report read but the CSV
    lacks, and where that leaves blanks ("-" cells, empty panels); None when every one is there."""
    uses: dict[str, list[str]] = {}
    figures = {
        "latency_vs_load": ("ttft_p50", "ttft_p99", "queue_wait_p99", "e2e_p99", "unfinished"),
        "deadline_vs_load": ("slo_attainment",),
        "fairness_vs_load": ("starvation", "fairness_jain"),
        "ttft_vs_capacity": ("ttft_p99", "unfinished"),
    }
    for plot in plots:
        keys = figures.get(plot.name, ())
        if plot.name.startswith("interval_"):
            keys = tuple(dict.fromkeys(f"ttft_p99_class{c}" for c in (classes[-1], classes[0]))) + (
                "starvation", "preemptions")
        for key in keys:
            uses.setdefault(key, []).append(plot.file)
    for key in ("ttft_p99", "slo_attainment", "unfinished"):
        uses.setdefault(key, []).append("the table of P99 TTFT")
    if classes:
        c = classes[-1]
        for key in (f"ttft_p99_class{c}", f"slo_attainment_class{c}", f"unfinished_class{c}"):
            uses.setdefault(key, []).append(f"the table of class {c}")
    missing = [k for k in uses if k not in view.columns]
    if not missing:
        return None
    return ("The sweep CSV has no column " + "; no column ".join(f"{k} (left empty: {', '.join(uses[k])})"
                                                                 for k in missing) + ".")


def _cut(view: SweepView) -> str:
    if view.aging_interval is None:
        return f"{view.kv_blocks} KV blocks"
    return f"{view.kv_blocks} KV blocks, aging interval {view.aging_interval}"


def _family_title(view: SweepView, family: str) -> str:
    names = view.families[family]
    if len(names) == 1:
        source = view.info[names[0]].family
        return names[0] if source in (None, names[0]) else f"{names[0]} (from {source})"
    return f"{family} ({len(names)} traces)"


def _load_figure(view: SweepView, out: Path, name: str, caption: str, panels, *, title: str) -> Plot:
    """A grid of panels: one row per (key, label, time, percent) of `panels`, one column per family,
    load on x, one line per policy."""
    fams = list(view.families)[:MAX_PANEL_COLUMNS]
    fig, axes = _figure(len(panels), len(fams), width=4.6, height=2.7 if len(panels) > 1 else 4.0)
    for j, fam in enumerate(fams):
        for i, (key, label, time, percent) in enumerate(panels):
            ax = axes[i][j]
            seen = _panel(ax, view, lambda p: view.by_load(p, key, fam, time=time), key, 100.0 if percent else 1.0)
            if percent:
                ax.set_ylim(-3, 103)
            elif key not in ("unfinished", "fairness_jain"):
                _log_if_wide(ax, seen)
            if key == "unfinished":
                _count_axis(ax)
            if key == "fairness_jain":
                ax.set_ylim(0, 1.05)
            ax.grid(True, alpha=0.3)
            if j == 0:
                ax.set_ylabel(label)
            if i == 0:
                ax.set_title(_family_title(view, fam), fontsize=10)
            if i == len(panels) - 1:
                ax.set_xlabel(LOAD_LABEL)
    _legend(fig, axes[0][0])
    spread = " Points are medians over replicates, bars their min..max." if view.replicates > 1 else ""
    _suptitle(fig, f"{title} ({_cut(view)})", fontsize=11)
    return _save(fig, out, Plot(name, f"{caption} One column per trace family; never averaged across "
                                      f"traces.{spread} ({_cut(view)}; {view.unit}.) {CENSORED_NOTE}"))


def sweep_plots(rows, info, out: Path, *, kv_blocks=None, aging_interval=None, load=None,
                warn=None) -> tuple[list[Plot], list[str]]:
    """Render the sweep figures into `out`; returns the plots and notes for the page.  `warn(text)`
    (when given) also gets the note on metric columns the CSV lacks (`_missing_columns`)."""
    view = SweepView(rows, info, kv_blocks, aging_interval)
    fams = "; ".join(f"{_family_title(view, f)}: {', '.join(n)}" for f, n in view.families.items())
    notes = [f"Sweep: {counted(len(rows), 'scenario')} over {counted(len(info), 'trace')} ({fams}), policies "
             f"{', '.join(view.policies)}"
             f"{f', {view.replicates} replicates' if view.replicates > 1 else ''}; "
             f"figures against load are cut at {_cut(view)}."]
    if not view.has_loads:
        unknown = [n for n, i in info.items() if i.load is None]
        notes.append(f"Offered load unknown for {', '.join(unknown)} (give --loads NAME=L or --trace-dir): "
                     "no figures against load.")
        return [], notes
    u = view.unit
    notes.append(_tables(view))
    if len(view.families) > MAX_PANEL_COLUMNS:
        left = list(view.families)[MAX_PANEL_COLUMNS:]
        notes.append(f"The figures against load show the first {MAX_PANEL_COLUMNS} of {len(view.families)} "
                     f"trace families (one column each); the tables above have every trace. Left out of the "
                     f"figures: {_named(left)}.")
        if warn is not None:
            warn(f"the figures show the first {MAX_PANEL_COLUMNS} of {len(view.families)} trace families; "
                 "the tables in index.html have every trace")
    plots = []
    panels = [(f"{m}_{s}", f"{LATENCY_LABELS[m]} {s.upper()} ({u})", True, False)
              for m, s in (("ttft", "p50"), ("ttft", "p99"), ("queue_wait", "p99"), ("e2e", "p99"))]
    panels.append(("unfinished", "unfinished requests", False, False))
    plots.append(_load_figure(view, out, "latency_vs_load", "P50 and P99 of TTFT, P99 of queue wait and "
                              "end-to-end latency, and the requests that never finished, against offered load, "
                              "per policy.", panels, title="Latency against offered load"))
    plots.append(_load_figure(view, out, "deadline_vs_load", "Share of the requests with a deadline that "
                              "finished by it, against offered load, per policy.",
                              [("slo_attainment", "deadline attainment (% of requests with a deadline)", False,
                                True)], title="Deadline attainment against load"))
    plots.append(_load_figure(view, out, "fairness_vs_load", "Top: the longest wait of any request that ran "
                              "(starvation). Bottom: Jain's index across priority classes of their mean service "
                              "share (an unfinished request counts 0).",
                              [("starvation", f"starvation: max wait ({u})", True, False),
                               ("fairness_jain", "Jain fairness across classes (1 = equal)", False, False)],
                              title="Starvation and fairness against load"))
    classes = _classes(rows)
    if classes:
        panels = [(f"ttft_p99_class{c}", f"class {c}: TTFT P99 ({u})", True, False) for c in reversed(classes)]
        plots.append(_load_figure(view, out, "class_ttft_vs_load", "P99 TTFT of each priority class (larger "
                                  "runs first; top row the highest class), against offered load, per policy.",
                                  panels, title="Per-class TTFT P99 against load"))

    if classes:
        for p in view.policies:
            if len({r["aging_interval"] for r in rows if r["policy"] == p and _finite(r["aging_interval"])}) > 1:
                plots.append(_interval_figure(view, out, p, classes))

    caps = sorted({r["kv_blocks"] for r in rows})
    if len(caps) > 1:
        names = [n for names in view.families.values() for n in names]
        if load is not None:  # the traces at the load asked for, within 1%
            names = [n for n in names if abs(info[n].load - load) <= 0.01 * abs(load)]
            if not names:
                loads = sorted({i.load for i in info.values()})
                raise UserError(f"the sweep has no load {load:g}; it has {', '.join(f'{x:g}' for x in loads)}")
        if len(names) > MAX_PANEL_COLUMNS:
            notes.append(f"The KV capacity figure shows the first {MAX_PANEL_COLUMNS} of {len(names)} traces; "
                         f"left out: {_named(names[MAX_PANEL_COLUMNS:])}.")
        plots.append(_capacity_figure(view, out, names[:MAX_PANEL_COLUMNS]))
    missing = _missing_columns(view, plots, classes)
    if missing is not None:
        notes.insert(1, missing)
        if warn is not None:
            warn(missing)
    return plots, notes


def _classes(rows) -> list[int]:
    found = {int(m.group(1)) for k in rows[0] if (m := re.fullmatch(r"ttft_p99_class(-?\d+)", k))}
    return sorted(found)


def _named(names: list[str], most: int = 50) -> str:
    """`names` for a note of the page: the first `most`, then how many more."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _interval_figure(view: SweepView, out: Path, policy: str, classes: list[int]) -> Plot:
    """What the aging interval trades, for one policy that uses it: per family (columns), the top and
    bottom classes' P99 TTFT, starvation and preemptions against the interval, one line per trace."""
    from matplotlib import colormaps

    fams = list(view.families)[:MAX_PANEL_COLUMNS]
    rows = [(f"ttft_p99_class{c}", f"class {c}: TTFT P99 ({view.unit})", True) for c in (classes[-1], classes[0])]
    rows = list(dict.fromkeys(rows)) + [("starvation", f"starvation: max wait ({view.unit})", True),
                                        ("preemptions", "preemptions", False)]
    intervals = sorted({r["aging_interval"] for r in view.rows if r["policy"] == policy and _finite(r["aging_interval"])})
    fig, axes = _figure(len(rows), len(fams), width=4.6, height=2.6)
    for j, fam in enumerate(fams):
        names = view.families[fam]
        shades = colormaps["viridis"](np.linspace(0.0, 0.85, len(names)))
        for i, (key, label, time) in enumerate(rows):
            ax = axes[i][j]
            seen, censored = [], []
            for name, shade in zip(names, shades):
                spreads = []
                for k in intervals:
                    vals = [float(r.get(key, math.nan)) * (view.scale(r) if time else 1.0)
                            for r in view.group(policy, name, view.kv_blocks) if r["aging_interval"] == k]
                    spreads.append(view._spread(vals))
                x = np.asarray(intervals, dtype=float)
                y, _, top = np.asarray(spreads, dtype=float).T
                ok = np.isfinite(y)
                ax.plot(x[ok], y[ok], marker="o", ms=4, color=shade,
                        label=f"load {view.info[name].load:g}" if len(names) > 1 else name)
                if _censored_marks(ax, x, top, shade):  # (a censored replicate too, where the median is finite)
                    censored.append(name)
                seen += y[ok].tolist()
            _censored_note(ax, censored, names, "trace")
            if not seen:
                ax.set_yticks([])
            _no_column(ax, view, key, empty=not seen and not censored)
            if key == "preemptions":
                _count_axis(ax)
            else:
                _log_if_wide(ax, seen)
            if len(intervals) > 1 and intervals[-1] / max(intervals[0], 1) >= 8:
                ax.set_xscale("log", base=2)
            ax.grid(True, alpha=0.3)
            if j == 0:
                ax.set_ylabel(label)
            if i == 0:
                ax.set_title(_family_title(view, fam), fontsize=10)
                ax.legend(fontsize=7, loc="best")
            if i == len(rows) - 1:
                ax.set_xlabel(f"aging interval of {policy} (steps)")
    _suptitle(fig, f"What the aging interval trades: {policy} at {view.kv_blocks} KV blocks", fontsize=11)
    return _save(fig, out, Plot(f"interval_{policy}",
                                f"{policy} at {view.kv_blocks} KV blocks: P99 TTFT of the top and bottom classes, "
                                "starvation and preemptions against the aging interval, one line per trace (by "
                                "load); medians over replicates. " + CENSORED_NOTE))


def _capacity_figure(view: SweepView, out: Path, names: list[str]) -> Plot:
    fig, axes = _figure(2, len(names), width=4.6, height=2.9)
    interval = "" if view.aging_interval is None else f", aging interval {view.aging_interval}"
    for j, name in enumerate(names):
        for i, (key, label, time) in enumerate((("ttft_p99", f"TTFT P99 ({view.unit})", True),
                                                ("unfinished", "unfinished requests", False))):
            ax = axes[i][j]
            seen = _panel(ax, view, lambda p: view.by_capacity(p, key, name, time=time), key)
            if time:
                _log_if_wide(ax, seen)
            else:
                _count_axis(ax)
            caps = [float(r["kv_blocks"]) for r in view.rows if r["trace"] == name]
            _log_if_wide(ax, caps, axis="x", ratio=20)
            ax.grid(True, alpha=0.3)
            if j == 0:
                ax.set_ylabel(label)
            if i == 0:
                ax.set_title(f"{name} (load {view.info[name].load:g})", fontsize=10)
            else:
                ax.set_xlabel("KV capacity (free KV blocks)")
    _legend(fig, axes[0][0])
    _suptitle(fig, f"P99 TTFT and unfinished requests against KV capacity{interval}", fontsize=11)
    return _save(fig, out, Plot("ttft_vs_capacity",
                                f"P99 TTFT against KV capacity, one panel per trace, per policy{interval}, with "
                                f"the requests that never finished below it (unservable ones included: a "
                                f"smaller capacity cannot look better by dropping them). {CENSORED_NOTE}"))


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "-"
    return significant(v, 4)  # (12,345 steps as "12345", not "1.235e+04"; inf)


def _spread_text(view: SweepView, med: float, lo: float, hi: float) -> str:
    """A table cell's figure: the median, and with replicates that differ their ``[min..max]``."""
    text = _fmt(med)
    if view.replicates > 1 and not math.isnan(med) and hi > lo:
        text += f" [{_fmt(lo)}..{_fmt(hi)}]"
    return text


def _tables(view: SweepView) -> str:
    """HTML tables, one row per trace: each policy's P99 TTFT (attainment, unfinished), best in bold;
    then the same for the top priority class."""
    classes = _classes(view.rows)
    parts = [_table(view, "ttft_p99", "slo_attainment", "unfinished",
                    f"P99 TTFT ({view.unit}), deadline attainment and unfinished requests at {_cut(view)}; "
                    "the lowest P99 per trace in bold")]
    if classes:
        c = classes[-1]
        parts.append(_table(view, f"ttft_p99_class{c}", f"slo_attainment_class{c}", f"unfinished_class{c}",
                            f"Priority class {c} (the top class): its P99 TTFT ({view.unit}), deadline "
                            f"attainment and unfinished requests at {_cut(view)}; the lowest P99 in bold"))
    return "".join(parts)


def _table(view: SweepView, key: str, share: str, count: str, caption: str) -> str:
    spread = "; with replicates: median [min..max]" if view.replicates > 1 else ""
    head = "".join(f"<th>{html.escape(p)}</th>" for p in view.policies)
    lines = [f"<table border=1 cellpadding=4 style='border-collapse:collapse'><caption>{html.escape(caption)}"
             f"{spread}</caption><tr><th>trace</th><th>offered load</th>{head}</tr>"]
    for names in view.families.values():
        for name in names:
            cells = {}
            for p in view.policies:
                med, lo, hi = view._spread(view.values(p, key, name, time=True))
                att = view._spread(view.values(p, share, name, time=False))[0]
                unf = view._spread(view.values(p, count, name, time=False))
                # (the unfinished count as the P99: a median of 0.5 is not "0", nor one of 0 with a replicate's 3 none)
                extra = [f"{share_text(att, '.0f', 100)}%" if not math.isnan(att) else None,
                         f"{_spread_text(view, *unf)} unfinished" if unf[2] > 0 else None]
                extra = ", ".join(e for e in extra if e)
                cells[p] = (med, _spread_text(view, med, lo, hi) + (f" ({extra})" if extra else ""))
            finite = [v for v, _ in cells.values() if not math.isnan(v)]
            best = min(finite) if finite else None
            row = "".join(f"<td><b>{html.escape(t)}</b></td>" if best is not None and v == best and math.isfinite(v)
                          else f"<td>{html.escape(t)}</td>" for v, t in (cells[p] for p in view.policies))
            lines.append(f"<tr><td>{html.escape(name)}</td><td>{view.info[name].load:g}</td>{row}</tr>")
    return "".join(lines) + "</table>"


# ------------------------------------------------------------------------------------ scenario


def _unit(trace) -> tuple[float, str]:
    sps = trace.steps_per_second
    return (1.0 / sps, "s") if sps else (1.0, "steps")


def scenario_plots(trace, out: Path, *, policies, kv_blocks: int, aging_interval: int | None = None,
                   timeline_policy: str | None = None, gantt_requests: int = 30) -> tuple[list[Plot], list[str]]:
    """Replay `trace` under each policy and render the per-request figures into `out` (`aging_interval`
    None: each policy's own, else 4, as `simulate` takes it)."""
    from .batch import uses_aging_interval
    from .engine import simulate
    from .metrics import format_table

    from .policy import DEFAULT_AGING_INTERVAL, policy_name

    by_name = {}  # built-in names and user Policies, keyed by the name the figures show
    for p in policies:
        by_name.setdefault(policy_name(p), p)
    policies = list(by_name)
    results = {p: simulate(trace, policy=by_name[p], free_kv_blocks=kv_blocks, aging_interval=aging_interval)
               for p in policies}
    trace = results[policies[0]].trace
    scale, u = _unit(trace)
    order = sorted_policies(policies)
    colors = policy_colors(order)
    plots = []
    shown = aging_interval if aging_interval is not None else next(
        (results[p].aging_interval for p in policies if uses_aging_interval(by_name[p])), DEFAULT_AGING_INTERVAL)
    cfg = (f"{name_text(trace.name)}, {counted(len(trace), 'request')}, {counted(kv_blocks, 'KV block')}, aging "
           f"interval {shown}")
    notes = [f"Scenario: {cfg}.", "<pre>" + html.escape(format_table({p: results[p].metrics for p in order}))
             + "</pre>"]
    plots.append(_cdf_plot(results, order, colors, out, scale, u, cfg))

    classes = sorted(int(c) for c in np.unique(trace.priority))
    if len(classes) <= MAX_CLASS_COLUMNS:
        plots.append(_per_class_plot(results, order, colors, out, scale, u, cfg, classes))
    else:  # (a bar per distinct priority: thousands for shortest job first's -max_new_tokens)
        notes.append(f"No per-class figure: the trace has {len(classes)} distinct priorities, more than "
                     f"{MAX_CLASS_COLUMNS} classes (the sweep's metrics rows leave out per-class columns then too).")

    tp = policy_name(timeline_policy) if timeline_policy is not None else policies[0]
    if tp not in results:
        results[tp] = simulate(trace, policy=timeline_policy, free_kv_blocks=kv_blocks, aging_interval=aging_interval)
    r = results[tp]
    plots.append(_occupancy_plot(r, out, kv_blocks, scale, u))
    plots.append(_gantt_plot(r, out, gantt_requests, scale, u))
    return plots, notes


def _per_class_plot(results: dict, order: list[str], colors: dict, out: Path, scale: float, u: str, cfg: str,
                    classes: list[int]) -> Plot:
    from matplotlib.ticker import MaxNLocator

    fig, axes = _figure(1, 3, width=4.6, height=3.8)
    width = 0.8 / len(order)
    xs = np.arange(len(classes))
    panels = (("starvation", f"starvation: max wait ({u})", scale),
              ("preemptions", "preemptions (victim count)", 1.0),
              ("slo_attainment", "deadline attainment (%)", 100.0))
    for ax, (key, label, mult) in zip(axes[0], panels):
        for k, p in enumerate(order):
            per = results[p].metrics["per_class"]
            vals = np.array([float(per[c][key]) * mult for c in classes])
            at = xs + (k - (len(order) - 1) / 2) * width
            ax.bar(at, np.nan_to_num(vals), width, color=colors[p], label=p)
            for x in at[np.isnan(vals)]:  # (no value is not 0: no request of the class ran, or had a deadline)
                ax.text(x, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=7, color=colors[p])
        ax.set_xticks(xs, [str(c) for c in classes])
        ax.set_xlabel("priority class (larger runs first)")
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
        # (waits and counts: all 0 or n/a is not an axis about 0, with negative values or fractional victims)
        ax.set_ylim(0, max(ax.get_ylim()[1], 1) if key == "preemptions" else None)
        if key == "preemptions":
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0][2].set_ylim(0, 105)
    _legend(fig, axes[0][0])
    _suptitle(fig, f"Per priority class ({cfg})", fontsize=10)
    return _save(fig, out, Plot("per_class", "Per priority class: starvation (the longest wait of a request that "
                                             "ran), preemptions suffered, and deadline attainment, per policy; "
                                             "n/a where no request of the class ran (starvation) or had a "
                                             "deadline (attainment)."))


def _cdf_plot(results: dict, order: list[str], colors: dict, out: Path, scale: float, u: str, cfg: str) -> Plot:
    """CDFs of queue wait, TTFT and e2e: the whole distribution (log x where it spans decades) above,
    the slowest 5% below.  Every request counts, so a curve ends below 1 when some never finished."""
    metrics = ("queue_wait", "ttft", "e2e")
    fig, axes = _figure(2, 3, width=4.6, height=3.0)
    for j, metric in enumerate(metrics):
        values, logs = {}, False
        for p in order:
            v = np.asarray(results[p].requests[metric], dtype=float)
            values[p] = (np.sort(v[~np.isnan(v)]) * scale, v.size)
        pooled = np.concatenate([v for v, _ in values.values()]) if values else np.zeros(0)
        for i, ax in enumerate((axes[0][j], axes[1][j])):
            for p in order:
                v, n = values[p]
                missing = n - v.size
                label = f"{p} ({missing} unfinished)" if missing else p
                # (a policy under which no request finished has no curve, but keeps its legend entry)
                ax.step(*(cdf_steps(v, n) if v.size else ([], [])), where="post", color=colors[p],
                        ls=policy_style(p), lw=1.4, label=label)
            if i == 0:
                logs = _log_if_wide(ax, pooled, axis="x")
                ax.set_ylim(0, 1.02)
                ax.set_title(f"{LATENCY_LABELS[metric]}{' (log x)' if logs else ''}", fontsize=10)
            else:
                if logs:
                    ax.set_xscale("log")
                ax.set_ylim(0.95, 1.002)
                tail = [v[min(max(int(math.floor(0.95 * n)) - 1, 0), v.size - 1)] for v, n in values.values()
                        if v.size and math.floor(0.95 * n) <= v.size]
                top = max((float(v[-1]) for v, _ in values.values() if v.size), default=0.0)
                if tail and top > min(tail) > 0:
                    ax.set_xlim(min(tail) * (0.8 if logs else 0.98), top * (1.25 if logs else 1.02))
                ax.axhline(0.99, color="0.5", lw=0.8, ls=":")
                ax.set_xlabel(f"{LATENCY_LABELS[metric]} ({u})")
            if not pooled.size:  # (not an empty panel with ticks about 0, which looks like data)
                ax.text(0.5, 0.5, f"no {LATENCY_LABELS[metric]} to draw: no request got that far",
                        transform=ax.transAxes, ha="center", va="center", fontsize=8, color="0.35")
                ax.set_xticks([])
            ax.set_ylabel("fraction of requests ≤ x" if i == 0 else "tail: slowest 5%")
            ax.grid(True, which="major", alpha=0.3)
    _legend(fig, axes[0][0])
    _suptitle(fig, f"Latency CDFs per policy ({cfg})", fontsize=10)
    return _save(fig, out, Plot("latency_cdf",
                                f"CDFs of queue wait, TTFT and end-to-end latency per policy ({u}; log x where "
                                "the values span decades); below, the slowest 5% (dotted: P99). Every request "
                                "counts: a curve that ends below 1 has requests that never finished (the legend "
                                "says how many)."))


def cdf_steps(values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of the sorted finite `values` out of `n` requests (those without a value count, so
    it ends below 1), as points for ``ax.step(x, y, where="post")``: it starts at 0 on the first value, so that
    a single value is a visible rise and not a lone point, which `step` draws as nothing."""
    return np.r_[values[:1], values], np.arange(values.size + 1) / n


def _thin(n: int, limit: int = 20000) -> slice:
    return slice(None, None, max(1, math.ceil(n / limit)))


def _occupancy_plot(r, out: Path, kv_blocks: int, scale: float, u: str) -> Plot:
    from matplotlib.ticker import MaxNLocator

    ev = r.events
    step = np.asarray(ev["step"], dtype=np.int64)
    used = kv_blocks - np.asarray(ev["free_kv_blocks"], dtype=np.int64)
    req = r.requests
    arrivals = np.sort(req["arrival_step"])
    finish = req["finish_step"]
    finishes = np.sort(finish[finish >= 0])
    # candidates at a step: arrived by then and not finished before it; one of them runs
    waiting = np.searchsorted(arrivals, step, "right") - np.searchsorted(finishes, step, "left") - 1
    sl = _thin(step.size)
    fig, axes = _figure(2, 1, width=9.0, height=2.9, sharex=True)
    ax = axes[0][0]
    ax.step(step[sl] * scale, used[sl], where="post", color="#1f77b4", lw=0.9)
    ax.axhline(kv_blocks, color="#555555", ls="--", lw=0.8, label=f"capacity {kv_blocks}")
    ax.set_ylabel("KV blocks in use")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(True, alpha=0.3)
    ax = axes[1][0]
    ax.step(step[sl] * scale, waiting[sl], where="post", color="#d62728", lw=0.9)
    ax.set_ylabel("queue length (requests waiting)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"time ({u})")
    ax.grid(True, alpha=0.3)
    if step.size:  # (the steps that ran, not 0 onwards: a trace may start late, at 10**15)
        ax.set_xlim(step[0] * scale, (step[-1] + 1) * scale)
    else:  # (not axes about 0, a negative time and queue length, which look like data)
        for a in (axes[0][0], ax):
            a.text(0.5, 0.5, f"no step ran: no request fits in {kv_blocks} KV blocks", transform=a.transAxes,
                   ha="center", va="center", fontsize=8, color="0.35")
        axes[0][0].set_ylim(0, kv_blocks * 1.1 + 1)  # (none in use, the capacity above)
        ax.set_xticks([])
        ax.set_yticks([])
    _suptitle(fig, f"KV occupancy and queue length over time ({r.policy}, {name_text(r.trace.name)})", fontsize=10)
    return _save(fig, out, Plot("kv_queue_timeline",
                                f"KV blocks held after each step, and requests arrived but unfinished and not "
                                f"running, under {r.policy} (idle gaps are flat)."))


def _gantt_plot(r, out: Path, n_requests: int, scale: float, u: str) -> Plot:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    trace = r.trace
    rows = trace.arrival_order[:n_requests] if hasattr(trace, "arrival_order") else np.arange(min(n_requests, len(trace)))
    rows = np.asarray(rows)[: n_requests]
    ev = r.events
    ev_rid = np.asarray(ev["request_id"])
    ev_step = np.asarray(ev["step"], dtype=np.int64)
    ev_phase = np.asarray(ev["phase"])
    req = r.requests
    classes = sorted(int(c) for c in np.unique(trace.priority[rows]))
    cmap = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")
    color = {c: cmap[i % len(cmap)] for i, c in enumerate(classes)}
    fig, axes = _figure(1, 1, width=10.0, height=max(3.0, 0.22 * len(rows) + 1.5))
    ax = axes[0][0]
    victims = np.asarray(ev["preempted_request_id"])[np.asarray(ev["has_victim"])]
    victim_steps = ev_step[np.asarray(ev["has_victim"])]
    start = int(trace.arrival_step[rows].min()) if rows.size else 0
    end = start
    for y, row in enumerate(rows):
        rid = trace.request_id[row]
        arrival = int(trace.arrival_step[row])
        mine = ev_rid == rid
        steps = ev_step[mine]
        # (unfinished: in the system until the replay ended, not until it last ran, nor a step if it never ran)
        last = int(req["finish_step"][row]) if req["finish_step"][row] >= 0 else max(int(r.clock) - 1, arrival)
        end = max(end, last + 1)
        ax.broken_barh([(arrival * scale, (last + 1 - arrival) * scale)], (y - 0.3, 0.6), color="#dddddd")
        if steps.size:
            breaks = np.flatnonzero(np.diff(steps) != 1) + 1
            segs = [(s[0] * scale, (s[-1] + 1 - s[0]) * scale) for s in np.split(steps, breaks)]
            ax.broken_barh(segs, (y - 0.3, 0.6), color=color[int(trace.priority[row])])
            prefill = steps[ev_phase[mine] == "prefill"]
            ax.plot(prefill * scale, np.full(prefill.size, y), "|", color="black", ms=7)
        for s in victim_steps[victims == rid]:
            ax.plot(s * scale, y, "x", color="#d62728", ms=6, mew=1.5)
        if trace.has_deadline[row]:
            ax.plot(trace.deadline_step[row] * scale, y, marker=">", color="#555555", ms=4)
    ax.set_yticks(range(len(rows)), [str(trace.request_id[i]) for i in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(start * scale, (end + 0.02 * (end - start)) * scale)  # (from the first arrival shown, not 0)
    ax.set_ylabel("request id (in arrival order)")
    ax.set_xlabel(f"time ({u})")
    handles = [Patch(color="#dddddd", label="in system, not running")]
    handles += [Patch(color=color[c], label=f"running, priority {c}") for c in classes]
    handles += [Line2D([], [], ls="", marker="|", color="black", label="prefill step"),
                Line2D([], [], ls="", marker="x", color="#d62728", label="preempted"),
                Line2D([], [], ls="", marker=">", color="#555555", label="deadline")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    shown = f"the first {len(rows)} of {len(trace)} requests" if len(rows) < len(trace) \
        else f"all {counted(len(trace), 'request')}"
    ax.set_title(f"Timeline under {r.policy}: {shown}", fontsize=10)
    return _save(fig, out, Plot("gantt",
                                f"Gantt-style timeline under {r.policy} of {shown} (by arrival): grey from "
                                f"arrival to finish, coloured while it runs, by priority class."))


# ------------------------------------------------------------------------------------- the page


def write_html(out: Path, plots: list[Plot], notes: list[str], title: str) -> None:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
        "figure{margin:2em 0}img{max-width:100%;border:1px solid #ddd}figcaption{color:#444;margin-top:.4em}"
        "pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:12px}</style>",
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for note in notes:
        parts.append(note if note.startswith("<") else f"<p>{html.escape(note)}</p>")  # "<": built as HTML here
    if plots:
        parts.append("<ul>" + "".join(f'<li><a href="#{p.slug}">{html.escape(p.name)}</a></li>' for p in plots) + "</ul>")
    for p in plots:  # (slug and file are made of safe characters only)
        parts.append(f'<figure id="{p.slug}"><a href="{p.file}"><img src="{p.file}" alt="{html.escape(p.caption)}">'
                     f"</a><figcaption>{html.escape(p.caption)}</figcaption></figure>")
    parts.append("</body></html>")
    (out / "index.html").write_text("\n".join(parts) + "\n", encoding="utf-8")


# The files a report may write into its folder (besides ``interval_<policy>.png``, one per policy).
REPORT_FILES = ("index.html", "latency_vs_load.png", "deadline_vs_load.png", "fairness_vs_load.png",
                "class_ttft_vs_load.png", "ttft_vs_capacity.png", "latency_cdf.png", "per_class.png",
                "kv_queue_timeline.png", "gantt.png")


def _refuse_inputs_among_outputs(out_dir: Path, inputs) -> None:
    """Refuse (UserError), before any work, an input (the results, a trace or its sidecar) that is one of
    the files the report would replace in `out_dir`: that name itself, a link to the input, a hard link; and
    such a file that cannot be replaced (a folder, a FIFO, a device), refused only after the replays before."""
    if not out_dir.is_dir():
        return
    inputs = [Path(p) for p in inputs if p is not None]
    try:
        names = list(REPORT_FILES) + sorted(n for n in (e.name for e in out_dir.iterdir())
                                            if n.startswith("interval_") and n.endswith(".png"))
    except OSError:
        return
    for name in names:
        out = out_dir / name
        if not (out.is_symlink() or out.exists()):
            continue
        output_target(out)
        for inp in inputs:
            if _same_file(out, inp):
                what = "the metadata sidecar of an input" if inp.name.endswith(META_SUFFIX) else \
                    "an input of this command"
                also = "" if out == inp else f" ({inp})"
                raise UserError(f"{out}: is {what}{also}; refusing to overwrite it (give --out another folder)")


def build_report(out_dir, *, results=None, trace=None, policies=None, kv_blocks=None, aging_interval=None,
                 loads=None, trace_dirs=(), load=None, timeline_policy=None, gantt_requests: int = 30,
                 warn=None, before_replay=None) -> list[Plot]:
    """Write the PNGs and ``index.html`` into `out_dir` (created, or its files replaced); return the plots.

    All figures are rendered into a temporary folder first, so a failure leaves `out_dir` as it was.
    An input (the results, the trace, a sweep trace found beside the results, or a sidecar) that is
    one of the files the report writes is refused before any work.  `warn(text)`: called with the
    note on metric columns the CSV lacks (their panels and table cells are left empty).
    `before_replay()`: called once every input has been checked, before `trace` is replayed (the CLI's
    note that a kernel must compile first).
    """
    if results is None and trace is None:
        raise UserError("give a sweep metrics CSV, a --trace, or both")
    if (not is_integer(gantt_requests)
            or not 1 <= gantt_requests <= MAX_GANTT_REQUESTS):
        raise UserError(f"--gantt-requests must be from 1 to {MAX_GANTT_REQUESTS} (a row each), "
                        f"got {show(gantt_requests)}")
    if isinstance(policies, (str, bytes)) or (policies is not None and not isinstance(policies, Iterable)):
        raise UserError(f"policies must be a list of policies (e.g. ['aging']), got {show(policies)}")
    text = os.fspath(path_argument(out_dir, "out_dir"))
    if results is not None and not isinstance(results, (str, bytes, os.PathLike)) and (
            hasattr(results, "rows") or isinstance(results, (list, tuple)) or hasattr(results, "columns")):
        raise TypeError(f"results must be the path of a sweep's metrics CSV, got {type(results).__name__}: write its "
                        "rows first, decodesched.batch.write_metrics_csv(batch.rows(), 'sweep.csv')")
    if results is not None:
        path_argument(results, "results")
    out_dir = output_folder(text)
    parent = out_dir.parent if str(out_dir.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{out_dir}: no such directory {parent}")
    path = trace if isinstance(trace, (str, os.PathLike)) else None  # (a Trace, or columns, has no file)
    _refuse_inputs_among_outputs(out_dir, [results, path, meta_path(path) if path is not None else None])
    rows = read_sweep(results, REPORT_COLUMNS) if results is not None else None
    info = None
    if rows is not None:
        info = trace_info(rows, results, loads=loads, trace_dirs=trace_dirs)
        found = [i.path for i in info.values() if i.path is not None]
        _refuse_inputs_among_outputs(out_dir, found + [meta_path(p) for p in found])
    loaded = None
    if trace is not None:
        from .trace import load_trace

        loaded = load_trace(trace, name=input_label(trace))  # (`<(cmd)`: a "pipe", not "63")
        policies = list(policies or POLICY_ORDER)
        from .policy import check_distinct

        check_distinct(policies)  # the figures know a policy by its name
        if timeline_policy is not None:
            check_distinct(policies + [timeline_policy], repeats=True)
        from .engine import check_config
        from .policy import replay_interval

        for p in policies + ([timeline_policy] if timeline_policy else []):
            check_config(p, 0, replay_interval(p, aging_interval), None)
    scenario_kv = kv_blocks
    if loaded is not None and scenario_kv is None:
        if rows is None:
            raise UserError("--trace needs --kv-blocks (the capacity to replay it with)")
        scenario_kv = _lower_median(sorted({r["kv_blocks"] for r in rows}))
    home = out_dir if out_dir.is_dir() else parent  # (on out_dir's file system: it may be a mount point)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out_dir.name), dir=home))
    except OSError as exc:
        raise UserError(f"{out_dir}: cannot write in {home} ({_describe(exc)})") from None
    try:
        plots, notes = [], []
        with _plain_text():
            if rows is not None:
                p, n = sweep_plots(rows, info, tmp, kv_blocks=kv_blocks, aging_interval=aging_interval, load=load,
                                   warn=warn)
                plots += p
                notes += n
            if loaded is not None:
                if before_replay is not None:
                    before_replay()
                p, n = scenario_plots(loaded, tmp, policies=policies, kv_blocks=scenario_kv,
                                      aging_interval=aging_interval,
                                      timeline_policy=timeline_policy, gantt_requests=gantt_requests)
                plots += p
                notes += n
        write_html(tmp, plots, notes, "decodesched report")
        out_dir.mkdir(exist_ok=True)
        replace_together([(f, out_dir / f.name) for f in sorted(tmp.iterdir())])
    except OSError as exc:  # a full disk while a figure is saved (matplotlib's error names no file): say where
        if isinstance(exc, UserError) or (exc.filename is not None and Path(exc.filename).parent != tmp):
            raise
        raise UserError(f"{out_dir}: cannot write the report ({_describe(exc)}); nothing in it was changed") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return plots
