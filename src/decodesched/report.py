"""`decodesched report`: PNG plots and one HTML page from a sweep's metrics CSV (and one scenario run).

Two sources, either or both:

- **a sweep** (the metrics CSV of ``decodesched sweep``, one row per scenario): latency P50/P99,
  deadline attainment, starvation and Jain fairness against **offered load**, per policy, and P99
  TTFT against KV capacity.  The offered load of each trace (its ``trace`` column) is, first match
  wins: ``loads={"name": 1.2}`` (``--loads name=1.2,..``); an ``offered_load`` column in the CSV;
  the ``load`` recorded in the trace's ``.meta.json`` sidecar (``decodesched trace convert --load``);
  else the load of the trace file itself, ``work_steps / (last arrival - first arrival)``.  The
  trace file is looked up as ``NAME``, ``NAME.csv`` or ``NAME.parquet`` beside the CSV, in the
  current directory, or in ``trace_dirs`` (``--trace-dir``).  Sweeps with several capacities or
  aging intervals are cut at one of each (``kv_blocks``, ``aging_interval``; default the lower median
  capacity and interval 4 when swept); rows of several traces at one load are averaged.
- **one trace** replayed here under each policy (``trace=``, ``policies``, ``kv_blocks``,
  ``aging_interval``): CDFs of queue wait, TTFT and e2e; starvation, preemptions and deadline
  attainment per priority class; KV blocks in use and queue length over time; a Gantt-style timeline
  of the first ``gantt_requests`` requests.

Units: steps, or seconds when every trace involved has a time scale (``steps_per_second`` from its
sidecar); each sweep row is converted with its own trace's scale.
"""

from __future__ import annotations

import csv
import html
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import UserError
from .metrics import offered_load

POLICY_ORDER = ("fixed_priority", "aging", "deadline", "fcfs")
_COLORS = {"fixed_priority": "#1f77b4", "aging": "#ff7f0e", "deadline": "#2ca02c", "fcfs": "#d62728"}
_MARKERS = {"fixed_priority": "o", "aging": "s", "deadline": "^", "fcfs": "D"}
_EXTRA_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
LATENCY_LABELS = {"queue_wait": "queue wait", "ttft": "TTFT", "e2e": "end-to-end latency", "tpot": "TPOT"}
LOAD_LABEL = "offered load (work steps per step)"


@dataclass
class Plot:
    """One rendered figure: its file (relative to the report folder), caption and axis labels."""

    name: str
    caption: str
    xlabels: list[str] = field(default_factory=list)
    ylabels: list[str] = field(default_factory=list)

    @property
    def file(self) -> str:
        return f"{self.name}.png"


def _color(policy: str, order: list[str]) -> str:
    if policy in _COLORS:
        return _COLORS[policy]
    return _EXTRA_COLORS[order.index(policy) % len(_EXTRA_COLORS)] if policy in order else "#333333"


def _sorted_policies(policies) -> list[str]:
    known = [p for p in POLICY_ORDER if p in policies]
    return known + sorted(p for p in set(policies) if p not in POLICY_ORDER)


def _figure(nrows: int = 1, ncols: int = 1, width: float = 6.4, height: float = 4.2, **kw):
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _save(fig, out: Path, plot: Plot) -> Plot:
    for ax in fig.axes:
        if ax.get_xlabel():
            plot.xlabels.append(ax.get_xlabel())
        if ax.get_ylabel():
            plot.ylabels.append(ax.get_ylabel())
    fig.savefig(out / plot.file, dpi=100)
    return plot


# ---------------------------------------------------------------------------------------- sweep


def read_sweep(path) -> list[dict]:
    """The rows of a sweep metrics CSV: numbers as int/float (empty cells NaN), text as str."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            rows = list(reader)
            header = reader.fieldnames or []
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    missing = [c for c in ("trace", "policy", "kv_blocks", "aging_interval") if c not in header]
    if missing:
        raise UserError(f"{path}: not a sweep metrics CSV (no column {', '.join(missing)})")
    if not rows:
        raise UserError(f"{path}: the sweep has no rows")
    out = []
    for lineno, row in enumerate(rows, start=2):
        parsed = {}
        for k, v in row.items():
            if k in ("trace", "policy"):
                parsed[k] = v
                continue
            if v is None or v == "":
                parsed[k] = math.nan
                continue
            try:
                parsed[k] = int(v)
            except ValueError:
                try:
                    parsed[k] = float(v)
                except ValueError:
                    raise UserError(f"{path}: line {lineno}, column {k}: not a number: {v!r}") from None
        out.append(parsed)
    return out


@dataclass
class TraceInfo:
    load: float | None
    steps_per_second: float | None
    path: Path | None = None


def _find_trace_file(name: str, dirs: list[Path]) -> Path | None:
    for d in dirs:
        for candidate in (d / name, d / f"{name}.csv", d / f"{name}.parquet"):
            if candidate.is_file():
                return candidate
    return None


def _meta_load(meta: dict) -> float | None:
    """The target load a sidecar records (``options.load`` from ``trace convert``, or a top-level ``load``)."""
    options = meta.get("options") if isinstance(meta.get("options"), dict) else {}
    for value in (options.get("load"), meta.get("load")):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
            return float(value)
    return None


def trace_info(rows: list[dict], results_path=None, *, loads: dict | None = None, trace_dirs=()) -> dict[str, TraceInfo]:
    """Offered load and time scale of each trace named in the sweep rows (see the module docstring)."""
    from .convert import read_meta
    from .trace import load_trace

    loads = dict(loads or {})
    dirs = [Path(results_path).parent] if results_path else []
    dirs += [Path(".")] + [Path(d) for d in trace_dirs]
    info = {}
    for name in dict.fromkeys(r["trace"] for r in rows):
        column = [r.get("offered_load") for r in rows if r["trace"] == name]
        path = _find_trace_file(name, dirs)
        meta = read_meta(path) if path else None
        sps = meta.get("steps_per_second") if meta else None
        sps = float(sps) if isinstance(sps, (int, float)) and sps and sps > 0 else None
        load = None
        if name in loads:
            load = float(loads[name])
        elif column and isinstance(column[0], (int, float)) and not math.isnan(column[0]):
            load = float(column[0])
        elif meta and _meta_load(meta) is not None:
            load = _meta_load(meta)
        if path is not None and (load is None or sps is None):
            trace = load_trace(path)
            load = offered_load(trace) if load is None else load
            sps = trace.steps_per_second if sps is None else sps
        info[name] = TraceInfo(load, sps, path)
    return info


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


class SweepView:
    """The sweep rows cut at one capacity and aging interval, with each row's load and time scale."""

    def __init__(self, rows, info: dict[str, TraceInfo], kv_blocks=None, aging_interval=None):
        self.rows = rows
        self.info = info
        self.kv_blocks = _pick([r["kv_blocks"] for r in rows], kv_blocks, "capacity (kv_blocks)", _lower_median)
        self.aging_interval = _pick([r["aging_interval"] for r in rows], aging_interval, "aging interval",
                                    _default_interval)
        self.policies = _sorted_policies(r["policy"] for r in rows)
        self.seconds = all(i.steps_per_second for i in info.values())
        self.unit = "s" if self.seconds else "steps"
        self.has_loads = all(i.load is not None for i in info.values())

    def _keep(self, r) -> bool:
        return r["policy"] != "aging" or r["aging_interval"] == self.aging_interval

    def scale(self, r) -> float:
        return 1.0 / self.info[r["trace"]].steps_per_second if self.seconds else 1.0

    def by_load(self, policy: str, key: str, *, time: bool) -> tuple[np.ndarray, np.ndarray]:
        """Mean of `key` per offered load for `policy` at the chosen capacity."""
        groups: dict[float, list[float]] = {}
        seen = set()
        for r in self.rows:
            if r["policy"] != policy or r["kv_blocks"] != self.kv_blocks or not self._keep(r):
                continue
            if r["trace"] in seen:
                continue  # other policies ignore the aging interval: count each trace once
            seen.add(r["trace"])
            v = float(r.get(key, math.nan))
            groups.setdefault(self.info[r["trace"]].load, []).append(v * self.scale(r) if time else v)
        loads = np.array(sorted(groups), dtype=float)
        return loads, np.array([np.nanmean(groups[x]) if not np.all(np.isnan(groups[x])) else np.nan for x in loads])

    def by_capacity(self, policy: str, key: str, load: float) -> tuple[np.ndarray, np.ndarray]:
        groups: dict[int, list[float]] = {}
        seen = set()
        for r in self.rows:
            if r["policy"] != policy or self.info[r["trace"]].load != load or not self._keep(r):
                continue
            if (r["trace"], r["kv_blocks"]) in seen:
                continue
            seen.add((r["trace"], r["kv_blocks"]))
            groups.setdefault(r["kv_blocks"], []).append(float(r.get(key, math.nan)) * self.scale(r))
        caps = np.array(sorted(groups), dtype=float)
        return caps, np.array([np.nanmean(groups[c]) if not np.all(np.isnan(groups[c])) else np.nan for c in caps])


def _policy_lines(ax, view: SweepView, key: str, *, time: bool, percent: bool = False) -> None:
    for p in view.policies:
        x, y = view.by_load(p, key, time=time)
        if percent:
            y = y * 100
        ax.plot(x, y, marker=_MARKERS.get(p, "o"), color=_color(p, view.policies), label=p)
    ax.grid(True, alpha=0.3)


def _cut(view: SweepView) -> str:
    return f"{view.kv_blocks} KV blocks, aging interval {view.aging_interval}"


def sweep_plots(rows, info, out: Path, *, kv_blocks=None, aging_interval=None, load=None) -> tuple[list[Plot], list[str]]:
    """Render the sweep figures into `out`; returns the plots and notes for the page."""
    view = SweepView(rows, info, kv_blocks, aging_interval)
    notes = [f"Sweep: {len(rows)} scenarios over {len(info)} trace(s), policies {', '.join(view.policies)}; "
             f"figures against load are cut at {_cut(view)}."]
    if not view.has_loads:
        unknown = [n for n, i in info.items() if i.load is None]
        notes.append(f"Offered load unknown for {', '.join(unknown)} (give --loads NAME=L or --trace-dir): "
                     "no figures against load.")
    plots = []
    u = view.unit
    if view.has_loads:
        notes.append(_best_table(view))
        fig, axes = _figure(3, 2, width=5.2, height=3.3, sharex=True)
        for i, metric in enumerate(("ttft", "queue_wait", "e2e")):
            for j, stat in enumerate(("p50", "p99")):
                ax = axes[i][j]
                _policy_lines(ax, view, f"{metric}_{stat}", time=True)
                ax.set_ylabel(f"{LATENCY_LABELS[metric]} {stat.upper()} ({u})")
                ax.set_title(f"{LATENCY_LABELS[metric]} {stat.upper()}", fontsize=10)
                if i == 2:
                    ax.set_xlabel(LOAD_LABEL)
        axes[0][0].legend(fontsize=8)
        fig.suptitle(f"Latency percentiles against offered load ({_cut(view)})")
        plots.append(_save(fig, out, Plot("latency_vs_load",
                                          f"P50 and P99 of TTFT, queue wait and end-to-end latency against offered "
                                          f"load, per policy ({_cut(view)}; {u}).")))

        fig, axes = _figure(1, 1)
        ax = axes[0][0]
        _policy_lines(ax, view, "slo_attainment", time=False, percent=True)
        ax.set_xlabel(LOAD_LABEL)
        ax.set_ylabel("deadline attainment (% of requests with a deadline)")
        ax.set_ylim(-3, 103)
        ax.legend(fontsize=8)
        ax.set_title(f"Deadline attainment against load ({_cut(view)})", fontsize=10)
        plots.append(_save(fig, out, Plot("deadline_vs_load",
                                          "Share of the requests with a deadline that finished by it, against "
                                          "offered load, per policy.")))

        fig, axes = _figure(1, 2, width=5.2)
        _policy_lines(axes[0][0], view, "starvation", time=True)
        axes[0][0].set_ylabel(f"starvation: max wait ({u})")
        _policy_lines(axes[0][1], view, "fairness_jain", time=False)
        axes[0][1].set_ylabel("Jain fairness across classes (1 = equal)")
        axes[0][1].set_ylim(0, 1.05)
        for ax in axes[0]:
            ax.set_xlabel(LOAD_LABEL)
        axes[0][0].legend(fontsize=8)
        fig.suptitle(f"Starvation and fairness against load ({_cut(view)})", fontsize=11)
        plots.append(_save(fig, out, Plot("fairness_vs_load",
                                          "Left: the longest any request waited (starvation). Right: Jain's index "
                                          "across priority classes of their mean service share.")))

        loads = sorted({i.load for i in info.values()})
        chosen = loads[-1]
        if load is not None:  # the sweep's load nearest to the one asked for, within 1%
            chosen = min(loads, key=lambda x: abs(x - load))
            if abs(chosen - load) > 0.01 * abs(load):
                raise UserError(f"the sweep has no load {load:g}; it has {', '.join(f'{x:g}' for x in loads)}")
        caps = sorted({r["kv_blocks"] for r in rows})
        if len(caps) > 1:
            fig, axes = _figure(1, 1)
            ax = axes[0][0]
            for p in view.policies:
                x, y = view.by_capacity(p, "ttft_p99", chosen)
                ax.plot(x, y, marker=_MARKERS.get(p, "o"), color=_color(p, view.policies), label=p)
            ax.set_xlabel("KV capacity (free KV blocks)")
            ax.set_ylabel(f"TTFT P99 ({u})")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
            ax.set_title(f"P99 TTFT against KV capacity at load {chosen:g}", fontsize=10)
            plots.append(_save(fig, out, Plot("ttft_vs_capacity",
                                              f"P99 TTFT against KV capacity at offered load {chosen:g}, per policy "
                                              f"(aging interval {view.aging_interval}). Percentiles are over "
                                              "finished requests: at small capacities the requests that never "
                                              "fit (unservable) drop out.")))
    return plots, notes


def _best_table(view: SweepView) -> str:
    """An HTML table: per offered load, each policy's P99 TTFT and deadline attainment, best marked."""
    per = {p: (view.by_load(p, "ttft_p99", time=True), view.by_load(p, "slo_attainment", time=False))
           for p in view.policies}
    loads = sorted({float(x) for (xs, _), _ in per.values() for x in xs})
    head = "".join(f"<th>{html.escape(p)}</th>" for p in view.policies)
    lines = [f"<table border=1 cellpadding=4 style='border-collapse:collapse'><caption>P99 TTFT ({view.unit}) and "
             f"deadline attainment at {html.escape(_cut(view))}; the lowest P99 per load in bold</caption>"
             f"<tr><th>offered load</th>{head}</tr>"]
    for load in loads:
        cells = {}
        for p, ((xs, p99), (_, slo)) in per.items():
            i = np.flatnonzero(xs == load)
            cells[p] = (float(p99[i[0]]), float(slo[i[0]])) if i.size else (math.nan, math.nan)
        finite = [v[0] for v in cells.values() if not math.isnan(v[0])]
        best = min(finite) if finite else None
        row = []
        for p in view.policies:
            v, a = cells[p]
            text = "-" if math.isnan(v) else f"{v:.4g}" + ("" if math.isnan(a) else f" ({100 * a:.0f}%)")
            row.append(f"<td><b>{text}</b></td>" if best is not None and v == best else f"<td>{text}</td>")
        lines.append(f"<tr><td>{load:g}</td>{''.join(row)}</tr>")
    return "".join(lines) + "</table>"


# ------------------------------------------------------------------------------------ scenario


def _unit(trace) -> tuple[float, str]:
    sps = trace.steps_per_second
    return (1.0 / sps, "s") if sps else (1.0, "steps")


def scenario_plots(trace, out: Path, *, policies, kv_blocks: int, aging_interval: int = 4,
                   timeline_policy: str | None = None, gantt_requests: int = 30) -> tuple[list[Plot], list[str]]:
    """Replay `trace` under each policy and render the per-request figures into `out`."""
    from .engine import simulate
    from .metrics import format_table

    policies = list(policies)
    results = {p: simulate(trace, policy=p, free_kv_blocks=kv_blocks, aging_interval=aging_interval)
               for p in policies}
    trace = results[policies[0]].trace
    scale, u = _unit(trace)
    order = _sorted_policies(policies)
    plots = []
    cfg = f"{trace.name}, {len(trace)} requests, {kv_blocks} KV blocks, aging interval {aging_interval}"
    notes = [f"Scenario: {cfg}.", "<pre>" + html.escape(format_table({p: r.metrics for p, r in results.items()}))
             + "</pre>"]

    # CDFs: unfinished requests count as never reaching the value, so a curve may end below 1.
    fig, axes = _figure(1, 3, width=4.6, height=3.8)
    for ax, metric in zip(axes[0], ("queue_wait", "ttft", "e2e")):
        for p in order:
            v = np.asarray(results[p].requests[metric], dtype=float)
            n = v.size
            v = np.sort(v[~np.isnan(v)]) * scale
            ax.step(np.concatenate([[0.0], v]), np.arange(v.size + 1) / n, where="post",
                    color=_color(p, order), label=p)
        ax.set_xlabel(f"{LATENCY_LABELS[metric]} ({u})")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Latency CDFs per policy ({cfg})", fontsize=10)
    plots.append(_save(fig, out, Plot("latency_cdf",
                                      f"CDFs of queue wait, TTFT and end-to-end latency per policy ({u}); a curve "
                                      "that ends below 1 has requests that never finished.")))

    from matplotlib.ticker import MaxNLocator

    classes = sorted(int(c) for c in np.unique(trace.priority))
    fig, axes = _figure(1, 3, width=4.6, height=3.8)
    width = 0.8 / len(order)
    xs = np.arange(len(classes))
    panels = (("starvation", f"starvation: max wait ({u})", scale),
              ("preemptions", "preemptions (victim count)", 1.0),
              ("slo_attainment", "deadline attainment (%)", 100.0))
    for ax, (key, label, mult) in zip(axes[0], panels):
        for k, p in enumerate(order):
            per = results[p].metrics["per_class"]
            vals = [float(per[c][key]) * mult for c in classes]
            ax.bar(xs + (k - (len(order) - 1) / 2) * width, np.nan_to_num(vals), width, color=_color(p, order),
                   label=p)
        ax.set_xticks(xs, [str(c) for c in classes])
        ax.set_xlabel("priority class (larger runs first)")
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
        if key == "preemptions":
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0][2].set_ylim(0, 105)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Per priority class ({cfg})", fontsize=10)
    plots.append(_save(fig, out, Plot("per_class",
                                      "Per priority class: starvation (the longest wait of any request), preemptions "
                                      "suffered, and deadline attainment, per policy.")))

    tp = timeline_policy or policies[0]
    if tp not in results:
        results[tp] = simulate(trace, policy=tp, free_kv_blocks=kv_blocks, aging_interval=aging_interval)
    r = results[tp]
    plots.append(_occupancy_plot(r, out, kv_blocks, scale, u))
    plots.append(_gantt_plot(r, out, gantt_requests, scale, u))
    return plots, notes


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
    fig.suptitle(f"KV occupancy and queue length over time ({r.policy}, {r.trace.name})", fontsize=10)
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
    end = 0
    for y, row in enumerate(rows):
        rid = trace.request_id[row]
        arrival = int(trace.arrival_step[row])
        mine = ev_rid == rid
        steps = ev_step[mine]
        last = int(req["finish_step"][row]) if req["finish_step"][row] >= 0 else (int(steps[-1]) if steps.size else arrival)
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
    ax.set_xlim(0, end * scale * 1.02)
    ax.set_ylabel("request id (in arrival order)")
    ax.set_xlabel(f"time ({u})")
    handles = [Patch(color="#dddddd", label="in system, not running")]
    handles += [Patch(color=color[c], label=f"running, priority {c}") for c in classes]
    handles += [Line2D([], [], ls="", marker="|", color="black", label="prefill step"),
                Line2D([], [], ls="", marker="x", color="#d62728", label="preempted"),
                Line2D([], [], ls="", marker=">", color="#555555", label="deadline")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    shown = f"the first {len(rows)} of {len(trace)} requests" if len(rows) < len(trace) else f"all {len(trace)} requests"
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
        parts.append("<ul>" + "".join(f'<li><a href="#{p.name}">{html.escape(p.name)}</a></li>' for p in plots) + "</ul>")
    for p in plots:
        parts.append(f'<figure id="{p.name}"><a href="{p.file}"><img src="{p.file}" alt="{html.escape(p.caption)}">'
                     f"</a><figcaption>{html.escape(p.caption)}</figcaption></figure>")
    parts.append("</body></html>")
    (out / "index.html").write_text("\n".join(parts) + "\n", encoding="utf-8")


def build_report(out_dir, *, results=None, trace=None, policies=None, kv_blocks=None, aging_interval=None,
                 loads=None, trace_dirs=(), load=None, timeline_policy=None, gantt_requests: int = 30) -> list[Plot]:
    """Write the PNGs and ``index.html`` into `out_dir` (created, or its files replaced); return the plots.

    All figures are rendered into a temporary folder first, so a failure leaves `out_dir` as it was.
    """
    if results is None and trace is None:
        raise UserError("give a sweep metrics CSV, a --trace, or both")
    if gantt_requests < 1:
        raise UserError(f"--gantt-requests must be at least 1, got {gantt_requests}")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir}: exists and is not a folder")
    parent = out_dir.parent if str(out_dir.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"cannot write {out_dir}: no such directory {parent}")
    rows = read_sweep(results) if results is not None else None
    loaded = None
    if trace is not None:
        from .trace import load_trace

        loaded = load_trace(trace)
        policies = list(policies or POLICY_ORDER)
        from .engine import check_config

        for p in policies + ([timeline_policy] if timeline_policy else []):
            check_config(p, 0, 1, None)
    scenario_kv = kv_blocks
    if loaded is not None and scenario_kv is None:
        if rows is None:
            raise UserError("--trace needs --kv-blocks (the capacity to replay it with)")
        scenario_kv = _lower_median(sorted({r["kv_blocks"] for r in rows}))
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=parent))
    try:
        plots, notes = [], []
        if rows is not None:
            info = trace_info(rows, results, loads=loads, trace_dirs=trace_dirs)
            p, n = sweep_plots(rows, info, tmp, kv_blocks=kv_blocks, aging_interval=aging_interval, load=load)
            plots += p
            notes += n
        if loaded is not None:
            p, n = scenario_plots(loaded, tmp, policies=policies, kv_blocks=scenario_kv,
                                  aging_interval=aging_interval if aging_interval is not None else 4,
                                  timeline_policy=timeline_policy, gantt_requests=gantt_requests)
            plots += p
            notes += n
        write_html(tmp, plots, notes, "decodesched report")
        out_dir.mkdir(exist_ok=True)
        for f in sorted(tmp.iterdir()):
            os.replace(f, out_dir / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return plots
