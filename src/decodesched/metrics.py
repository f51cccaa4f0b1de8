"""Per-request results and aggregate metrics (SPEC section 6), and their tables and files.

All latencies are in steps; when the trace has a time scale (``steps_per_second``) the summary
table also shows seconds.
"""

from __future__ import annotations

import math

import numpy as np

from .kernels import enums as E
from .trace import TRACE_COLUMNS, Trace

LATENCIES = ("queue_wait", "ttft", "tpot", "e2e")
PERCENTILES = (50, 95, 99)


def request_table(trace: Trace, state: np.ndarray, stop_reason: str) -> dict[str, np.ndarray]:
    """Trace columns + results, one entry per request, from a kernel's (n, RQ_NCOLS) state."""
    first = state[:, E.RQ_FIRST_STEP]
    first_token = state[:, E.RQ_FIRST_TOKEN_STEP]
    finish = state[:, E.RQ_FINISH_STEP]
    arrival = trace.arrival_step.astype(np.float64)

    def since(step, plus):
        return np.where(step >= 0, step + plus - arrival, np.nan)

    new = trace.max_new_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where((finish >= 0) & (new > 1), (finish - first_token) / np.maximum(new - 1, 1), np.nan)
    status_code = state[:, E.RQ_STATUS]
    status = np.asarray(E.STATUS_NAMES, dtype=object)[status_code]
    unfinished = status_code != E.STATUS_FINISHED
    enqueued = state[:, E.RQ_ENQUEUED].astype(bool)
    unservable = unfinished & enqueued & (stop_reason == "stuck")
    status[unservable] = "unservable"
    out = {c: v for c, v in trace.columns().items()}
    out.update(
        {
            "has_deadline": trace.has_deadline,
            "first_step": first,
            "first_token_step": first_token,
            "finish_step": finish,
            "wait_steps": state[:, E.RQ_WAIT],
            "preemptions": state[:, E.RQ_PREEMPTIONS],
            "status": status.astype(str),
            "queue_wait": since(first, 0),
            "ttft": since(first_token, 1),
            "tpot": tpot,
            "e2e": since(finish, 1),
            "deadline_met": trace.has_deadline & (finish >= 0) & (finish + 1 <= trace.deadline_step),
            "generated_len": state[:, E.RQ_GENERATED],
            "unservable": unservable,
        }
    )
    return out


def _stats(values: np.ndarray) -> dict[str, float]:
    v = values[~np.isnan(values)] if values.dtype.kind == "f" else values
    if v.size == 0:
        return {"count": 0, "mean": math.nan, "p50": math.nan, "p95": math.nan, "p99": math.nan, "max": math.nan}
    pct = np.percentile(v, PERCENTILES)
    return {
        "count": int(v.size),
        "mean": float(v.mean()),
        "p50": float(pct[0]),
        "p95": float(pct[1]),
        "p99": float(pct[2]),
        "max": float(v.max()),
    }


def jain_index(x: np.ndarray) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one takes all."""
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    if x.size == 0 or not np.any(x):
        return math.nan
    return float(x.sum() ** 2 / (x.size * (x * x).sum()))


def _group(req: dict, mask: np.ndarray) -> dict:
    has_deadline = req["has_deadline"][mask]
    met = req["deadline_met"][mask]
    n_deadline = int(has_deadline.sum())
    finished = req["status"][mask] == "finished"
    work = (req["max_new_tokens"][mask] + 1).astype(np.float64)
    e2e = req["e2e"][mask]
    with np.errstate(invalid="ignore", divide="ignore"):
        service_share = np.where(finished, work / e2e, np.nan)
    out = {name: _stats(req[name][mask]) for name in LATENCIES}
    out.update(
        {
            "requests": int(mask.sum()),
            "finished": int(finished.sum()),
            "starvation": int(req["wait_steps"][mask].max()) if mask.any() else 0,
            "preemptions": int(req["preemptions"][mask].sum()),
            "with_deadline": n_deadline,
            "deadline_misses": int(n_deadline - met.sum()),
            "deadline_miss_rate": float((n_deadline - met.sum()) / n_deadline) if n_deadline else math.nan,
            "slo_attainment": float(met.sum() / n_deadline) if n_deadline else math.nan,
            "mean_service_share": float(np.nanmean(service_share)) if finished.any() else math.nan,
        }
    )
    return out


def aggregate(trace: Trace, req: dict, n_events: int, clock: int) -> dict:
    """SPEC section 6 aggregates, overall and per priority class.

    ``fairness_jain`` is Jain's index across priority classes of each class's mean service share
    (a finished request's work steps, 1 + max_new_tokens, divided by its e2e): 1.0 when every class
    is served alike.
    """
    everyone = np.ones(len(trace), dtype=bool)
    out = _group(req, everyone)
    classes = {}
    for p in np.unique(trace.priority):
        classes[int(p)] = _group(req, trace.priority == p)
    span = max(int(clock) - int(trace.arrival_step.min()), 1)
    out.update(
        {
            "events": int(n_events),
            "clock": int(clock),
            "unservable": int(req["unservable"].sum()),
            "unfinished": int((req["status"] != "finished").sum()),
            "tokens": int(req["generated_len"].sum()),
            "throughput_tokens_per_step": float(req["generated_len"].sum() / span),
            "fairness_jain": jain_index(np.array([c["mean_service_share"] for c in classes.values()])),
            "steps_per_second": trace.steps_per_second,
            "per_class": classes,
        }
    )
    return out


REQUEST_CSV_COLUMNS = TRACE_COLUMNS + (
    "first_step",
    "first_token_step",
    "finish_step",
    "wait_steps",
    "preemptions",
    "status",
    "queue_wait",
    "ttft",
    "tpot",
    "e2e",
    "deadline_met",
)


def write_request_table(path, req: dict) -> None:
    """The requests table of SPEC section 4 (CSV, or Parquet for a ``.parquet`` path); empty cells
    where a value does not exist."""
    from .tables_io import write_requests

    write_requests(path, req)


def _fmt(v: float, scale: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if scale:
        return f"{v / scale:.3g}"
    return f"{v:.0f}" if abs(v) >= 100 or float(v).is_integer() else f"{v:.2f}"


def summary_rows(metrics: dict) -> list[tuple[str, str]]:
    """(label, value) rows of the summary table for one result (seconds when a time scale exists)."""
    sps = metrics.get("steps_per_second")
    unit = "s" if sps else "steps"
    rows = []
    for name in ("queue_wait", "ttft", "e2e"):
        for p in ("p50", "p95", "p99"):
            rows.append((f"{name} {p.upper()} ({unit})", _fmt(metrics[name][p], sps)))
    rows += [
        (f"starvation, max wait ({unit})", _fmt(float(metrics["starvation"]), sps)),
        ("preemptions", str(metrics["preemptions"])),
        ("deadline misses", f"{metrics['deadline_misses']} / {metrics['with_deadline']}"),
        ("unservable", str(metrics["unservable"])),
        ("unfinished", str(metrics["unfinished"])),
        ("fairness (Jain, classes)", _fmt(metrics["fairness_jain"], None) if not math.isnan(metrics["fairness_jain"]) else "-"),
        ("events", str(metrics["events"])),
    ]
    return rows


def format_table(columns: dict[str, dict]) -> str:
    """Side-by-side summary: one column per labelled metrics dict (e.g. per policy)."""
    labels = list(columns)
    rows = [summary_rows(m) for m in columns.values()]
    names = [r[0] for r in rows[0]]
    w0 = max(len(n) for n in names)
    widths = [max(len(lbl), *(len(r[i][1]) for i in range(len(names)))) for lbl, r in zip(labels, rows)]
    lines = ["  ".join([" " * w0] + [lbl.rjust(w) for lbl, w in zip(labels, widths)])]
    for i, name in enumerate(names):
        lines.append("  ".join([name.ljust(w0)] + [r[i][1].rjust(w) for r, w in zip(rows, widths)]))
    return "\n".join(lines)


FLAT_COLUMNS = (
    ("requests", "finished", "unservable", "unfinished", "events", "clock", "tokens",
     "throughput_tokens_per_step", "preemptions", "starvation", "with_deadline", "deadline_misses",
     "deadline_miss_rate", "slo_attainment", "fairness_jain")
    + tuple(f"{name}_{stat}" for name in LATENCIES for stat in ("mean", "p50", "p95", "p99", "max"))
)


def flat_metrics(metrics: dict) -> dict:
    """One flat row of scalars (the columns of `FLAT_COLUMNS`), e.g. for a sweep's metrics CSV."""
    row = {}
    for name in FLAT_COLUMNS:
        base, _, stat = name.rpartition("_")
        if base in LATENCIES:
            row[name] = metrics[base][stat]
        else:
            row[name] = metrics[name]
    return row
