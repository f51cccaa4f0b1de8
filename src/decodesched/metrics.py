"""Per-request results and aggregate metrics (SPEC section 6), and their tables and files.

All latencies are in steps; when the trace has a time scale (``steps_per_second``) the summary
table and the flat rows also give seconds.  No aggregate improves by dropping requests (SPEC
section 9): a latency statistic counts every request that never reached the event (it did not
finish) at +inf, so a P99 is ``inf`` when more than 1% of the requests are censored (the flat rows
say how many in ``<latency>_censored``); starvation is the longest wait of a request that ran;
unservable and unfinished counts stand beside them.
"""

from __future__ import annotations

import math

import numpy as np

from .kernels import enums as E
from .trace import TRACE_COLUMNS, Trace

# A request's status word in the requests table: the kernel's, or UNSERVABLE for one left unfinished when nothing
# could run any more (docs/files.md).
UNSERVABLE = "unservable"
STATUS_WORDS = (*E.STATUS_NAMES, UNSERVABLE)

LATENCIES = ("queue_wait", "ttft", "tpot", "e2e")
PERCENTILES = (50, 95, 99)


def request_table(trace: Trace, state: np.ndarray, stop_reason: str) -> dict[str, np.ndarray]:
    """Trace columns + results, one entry per request, from a kernel's (n, RQ_NCOLS) state."""
    first = state[:, E.RQ_FIRST_STEP]
    first_token = state[:, E.RQ_FIRST_TOKEN_STEP]
    finish = state[:, E.RQ_FINISH_STEP]

    def since(step, plus):  # in int64, then float: a step beyond 2**53 is not exact in float64
        return np.where(step >= 0, (step + plus - trace.arrival_step).astype(np.float64), np.nan)

    new = trace.max_new_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where((finish >= 0) & (new > 1), (finish - first_token) / np.maximum(new - 1, 1), np.nan)
    status_code = state[:, E.RQ_STATUS]
    status = np.asarray(E.STATUS_NAMES, dtype=object)[status_code]
    unfinished = status_code != E.STATUS_FINISHED
    enqueued = state[:, E.RQ_ENQUEUED].astype(bool)
    unservable = unfinished & enqueued & (stop_reason == "stuck")
    status[unservable] = UNSERVABLE
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


def percentiles_censored(values: np.ndarray, censored: int, qs=PERCENTILES) -> list[float]:
    """Linear-interpolation percentiles of ``values`` (finite) plus `censored` values at +inf.

    A percentile whose interpolation reaches a censored value is +inf: it is not known, only that
    it is at least the largest finished value.  With nothing censored this is `numpy.percentile`.
    """
    v = np.sort(np.asarray(values, dtype=np.float64))
    return _floats(_percentiles(v, np.zeros(1, np.int64), np.array([v.size]), np.array([int(censored)]), qs)[:, 0])


def _percentiles(v: np.ndarray, first: np.ndarray, count: np.ndarray, censored: np.ndarray, qs=PERCENTILES):
    """`percentiles_censored` of many groups at once: group g's values are ``v[first[g]:first[g] + count[g]]``,
    sorted; returns a (len(qs), groups) array.  The arithmetic is `numpy.percentile`'s ("linear": the virtual
    index ``(n - 1) * q / 100`` and its `_lerp`) over the values padded with their maximum for the censored
    ones, so a group's figures are those `numpy.percentile` gives, bit for bit."""
    n = count + censored
    out = np.full((len(qs), len(n)), math.nan)
    some = count > 0
    out[:, (n > 0) & ~some] = math.inf
    if not some.any():
        return out
    f, k, m = first[some], count[some], n[some]
    for i, (q, quantile) in enumerate(zip(qs, np.true_divide(qs, 100))):
        at = (m - 1) * quantile
        above = at >= m - 1
        lo = np.where(above, m - 1, np.floor(at)).astype(np.int64)
        hi = np.where(above, m - 1, lo + 1)
        gamma = at - np.where(above, -1, lo)  # (as numpy's: its index above the bounds is -1)
        a, b = v[f + np.minimum(lo, k - 1)], v[f + np.minimum(hi, k - 1)]  # (censored ones padded with the max)
        diff = b - a
        got = np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)
        out[i, some] = np.where((m - 1) * q > (k - 1) * 100, math.inf, got)  # (integers: no rounding at the edge)
    return out


def _latency_stats(values: np.ndarray, pending: np.ndarray, seg: np.ndarray, groups: int) -> list[dict]:
    """Per group (`seg`: each row's group, ascending): mean, percentiles and max of `values` where known (not
    NaN), plus the `pending` requests (those that never reached the event before the replay ended) counted at
    +inf (censored), so no statistic improves by dropping requests.  ``count``: the known values; ``censored``:
    the pending ones."""
    known = ~np.isnan(values)
    count = np.bincount(seg[known], minlength=groups)
    censored = np.bincount(seg[pending & ~known], minlength=groups)
    v = values[known]
    v = v[np.lexsort((v, seg[known]))]  # (by group, then value)
    first = np.cumsum(count) - count
    pct = _percentiles(v, first, count, censored)
    some = count > 0
    mean = np.full(groups, math.nan)
    top = np.full(groups, math.nan)
    if some.any():
        mean[some] = np.add.reduceat(v, first[some]) / count[some]
        top[some] = v[first[some] + count[some] - 1]
    mean[censored > 0] = top[censored > 0] = math.inf
    return [{"count": k, "censored": c, "mean": a, "p50": p50, "p95": p95, "p99": p99, "max": b}
            for k, c, a, p50, p95, p99, b in zip(count.tolist(), censored.tolist(), *map(_floats, (mean, *pct, top)))]


def _floats(values: np.ndarray) -> list[float]:
    """`values` as Python floats, every NaN the one `math.nan` (so that two equal metrics dicts compare equal: a dict
    compares values by identity first, and NaN equals nothing)."""
    return [math.nan if x != x else x for x in values.tolist()]


def offered_load(trace: Trace) -> float:
    """Work steps (one prefill plus one per token, summed) per step of the arrival span."""
    span = int(trace.arrival_step.max() - trace.arrival_step.min())
    return float(trace.work_steps / max(span, 1))


def jain_index(x: np.ndarray) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): exactly 1 when all equal, 1/n when one takes all.

    Taken over x / max(x) (equal shares are then exactly 1) with correctly rounded sums, and never above 1
    (Cauchy-Schwarz): float sums of equal shares read 0.9999999999999999 or 1.0000000000000002."""
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    if x.size == 0 or not np.any(x):
        return math.nan
    x = x / x.max()
    return min(math.fsum(x) ** 2 / (x.size * math.fsum(x * x)), 1.0)


def _groups(req: dict, rows: np.ndarray, seg: np.ndarray) -> list[dict]:
    """The aggregates of each group of requests: group g is the rows ``rows[seg == g]`` (`seg` ascending, every
    group present), all computed at once (a trace whose priorities are all distinct has as many classes as
    requests)."""
    groups = int(seg[-1]) + 1 if len(seg) else 0
    col = {name: req[name][rows] for name in (*LATENCIES, "has_deadline", "deadline_met", "status", "max_new_tokens",
                                              "first_step", "wait_steps", "unservable", "preemptions")}
    finished = col["status"] == "finished"
    unfinished = ~finished
    has_deadline = col["has_deadline"].astype(bool)
    met = has_deadline & col["deadline_met"].astype(bool)
    work = (col["max_new_tokens"] + 1).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        service_share = np.where(finished, work / col["e2e"], 0.0)  # an unfinished request got no finished service
    applies_tpot = col["max_new_tokens"] > 1  # TPOT exists only for requests of 2+ tokens
    stats = {name: _latency_stats(col[name], unfinished & applies_tpot if name == "tpot" else unfinished, seg, groups)
             for name in LATENCIES}

    def per_group(mask):
        return np.bincount(seg[mask], minlength=groups).tolist()

    size = np.bincount(seg, minlength=groups)
    starts = np.cumsum(size) - size
    ran = col["first_step"] >= 0
    longest = np.maximum.reduceat(np.where(ran, col["wait_steps"], -1), starts).tolist() if groups else []
    # (each group's shares summed in ascending order: groups served alike get bit-equal means, so Jain's index is 1)
    in_order = service_share[np.lexsort((service_share, seg))]
    share = (np.add.reduceat(in_order, starts) / size).tolist() if groups else []
    preempted = np.add.reduceat(col["preemptions"].astype(np.int64), starts).tolist() if groups else []
    out = []
    for g, (n, n_finished, n_unservable, n_deadline, n_met) in enumerate(zip(
            size.tolist(), per_group(finished), per_group(col["unservable"].astype(bool)), per_group(has_deadline),
            per_group(met))):
        row = {name: stats[name][g] for name in LATENCIES}
        row.update({
            "requests": n,
            "finished": n_finished,
            "unservable": n_unservable,
            "unfinished": n - n_finished,
            "starvation": longest[g] if longest[g] >= 0 else math.nan,
            "preemptions": preempted[g],
            "with_deadline": n_deadline,
            "deadline_misses": n_deadline - n_met,
            "deadline_miss_rate": (n_deadline - n_met) / n_deadline if n_deadline else math.nan,
            "slo_attainment": n_met / n_deadline if n_deadline else math.nan,
            "mean_service_share": share[g],
        })
        out.append(row)
    return out


def aggregate(trace: Trace, req: dict, n_events: int, clock: int) -> dict:
    """SPEC section 6 aggregates, overall and per priority class.

    ``fairness_jain`` is Jain's index across priority classes of each class's mean service share
    (a finished request's work steps, 1 + max_new_tokens, divided by its e2e; 0 for a request that
    did not finish): 1.0 when every class is served alike.  Latency statistics count a request that
    never reached the event at +inf (`_stats`); ``starvation`` is the longest wait of a request that
    ran at least one step.
    """
    n = len(trace)
    out = _groups(req, np.arange(n), np.zeros(n, np.int64))[0]
    # every class at once, from one sort (a class at a time cost ~0.8 ms each: 15 s for a trace whose priorities
    # are all distinct, such as shortest job first's -max_new_tokens, where the replay takes 0.1 s)
    order = np.argsort(trace.priority, kind="stable")
    values, seg = np.unique(trace.priority[order], return_inverse=True)
    classes = dict(zip(values.tolist(), _groups(req, order, seg.astype(np.int64))))
    span = max(int(clock) - int(trace.arrival_step.min()), 1)
    out.update(
        {
            "events": int(n_events),
            "clock": int(clock),
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
    """The requests table of docs/files.md (by the path's extension: `tables_io.table_format`); empty
    cells where a value does not exist."""
    from .tables_io import write_requests

    write_requests(path, req)


def significant(v: float, digits: int) -> str:
    """`v` to `digits` significant digits, but in full where that would take an exponent: 1,192 s is "1192", not
    "1.19e+03", and 999.7 s (3 digits) "1000", not "1e+03"."""
    text = f"{v:.{digits}g}"
    return f"{v:.0f}" if "e+" in text else text


def _fmt(v: float, scale: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if scale:  # (3 digits, as steps from 100 on)
        return significant(v / scale, 3)
    text = f"{v:.2f}"  # (99.996 rounds to 100: printed as 100 is, not "100.00")
    return f"{v:.0f}" if abs(float(text)) >= 100 or float(v).is_integer() else text


def name_text(name: str) -> str:
    """A name (a trace's, a file's) as a table, title or "wrote" line shows it, on one line: as it is, or where it
    holds a newline or another character a terminal would act on, its repr (quoted and escaped, as the error lines
    name it; never shortened)."""
    return name if name.isprintable() else repr(name)


def counted(n: int, noun: str, spec: str = "") -> str:
    """A count and its noun, plural unless it is one: ``1 request``, ``2 requests``; `spec` formats the count
    (``","``: ``1,000 requests``)."""
    return f"{n:{spec}} {noun}{'' if n == 1 else 's'}"


def share_text(v: float, spec: str = ".2f", scale: float = 1.0) -> str:
    """A share `v` (0 to 1; times `scale`, 100 for a percentage) in format `spec` (".2f", ".0f", ".3g"), with
    more digits where `spec` would round a share strictly between 0 and 1 to none or to all: attainment
    0.996 is "99.6" percent, not "100" (read: every deadline met), Jain's 0.996 "0.996", not "1.00"."""
    kind, digits, x = spec[-1], int(spec[1:-1]), v * scale
    text = f"{x:.{digits}{kind}}"
    while 0 < x < scale and float(text) in (0.0, float(scale)):
        digits += 1
        text = f"{x:.{digits}{kind}}"
    return text


def _share(v: float) -> str:
    """A share in the summary table: "-" for none (NaN), "1" for exactly 1, else `share_text`."""
    if math.isnan(v):
        return "-"
    return _fmt(v, None) if float(v).is_integer() else share_text(v)


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
        ("fairness (Jain, classes)", _share(metrics["fairness_jain"])),
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


def html_table(header: list[str], rows: list[list], caption: str = "") -> str:
    """A plain HTML table (Jupyter's ``_repr_html_`` of the result classes), every cell escaped."""
    from html import escape

    def line(cells, tag):
        return "<tr>" + "".join(f"<{tag}>{escape(str(c))}</{tag}>" for c in cells) + "</tr>"

    head = f"<caption>{escape(caption)}</caption>" if caption else ""
    body = "".join(line(r, "td") for r in rows)
    return f"<table>{head}<thead>{line(header, 'th')}</thead><tbody>{body}</tbody></table>"


FLAT_COLUMNS = (
    ("requests", "finished", "unservable", "unfinished", "events", "clock", "tokens",
     "throughput_tokens_per_step", "preemptions", "starvation", "with_deadline", "deadline_misses",
     "deadline_miss_rate", "slo_attainment", "fairness_jain")
    + tuple(f"{name}_{stat}" for name in LATENCIES for stat in ("mean", "p50", "p95", "p99", "max", "censored"))
)
# Columns in steps: each gets a twin in seconds, ``<name>_s``, when the trace has a time scale.
TIME_COLUMNS = frozenset(("starvation",) + tuple(c for c in FLAT_COLUMNS if c.rpartition("_")[0] in LATENCIES
                                               and not c.endswith("_censored")))
# Per priority class P, column ``<name>_class<P>`` (and ``<name>_s_class<P>`` for time columns), for a
# trace of at most MAX_CLASS_COLUMNS classes: priorities that are not a few classes (all distinct, or
# -max_new_tokens for shortest job first) would make a column per request (325,000 for Mooncake's).
MAX_CLASS_COLUMNS = 32
CLASS_COLUMNS = ("requests", "finished", "unservable", "unfinished", "queue_wait_p50", "queue_wait_p95",
                 "queue_wait_p99", "ttft_p50", "ttft_p95", "ttft_p99", "e2e_p50", "e2e_p95", "e2e_p99", "starvation",
                 "preemptions", "with_deadline", "slo_attainment")


def _value(metrics: dict, name: str):
    base, _, stat = name.rpartition("_")
    return metrics[base][stat] if base in LATENCIES else metrics[name]


def _with_seconds(names, metrics: dict, sps: float | None, suffix: str = "") -> dict:
    row = {}
    for name in names:
        v = _value(metrics, name)
        row[f"{name}{suffix}"] = v
        if sps and name in TIME_COLUMNS:
            row[f"{name}_s{suffix}"] = v / sps
    return row


def flat_metrics(metrics: dict) -> dict:
    """One flat row of scalars, e.g. for a sweep's metrics CSV: the `FLAT_COLUMNS` (each time column
    followed by its seconds twin ``<name>_s`` when ``metrics["steps_per_second"]`` is set), then per
    priority class P (ascending) the `CLASS_COLUMNS` as ``<name>_class<P>`` (``<name>_s_class<P>``),
    for a trace of at most `MAX_CLASS_COLUMNS` classes (``metrics["per_class"]`` has them all)."""
    sps = metrics.get("steps_per_second")
    row = _with_seconds(FLAT_COLUMNS, metrics, sps)
    if len(metrics["per_class"]) > MAX_CLASS_COLUMNS:
        return row
    for p in sorted(metrics["per_class"]):
        row.update(_with_seconds(CLASS_COLUMNS, metrics["per_class"][p], sps, f"_class{p}"))
    return row
