"""An independent check of every metric a result reports, against a reference written from SPEC
section 6 and docs/metrics.md, computed from the model's event log (`decodesched.model.replay`).

The reference is deliberately naive: Python ints and `fractions.Fraction` (exact), one request at
a time, percentiles by hand (NumPy's linear interpolation over the values with every censored
request at +inf).  It is compared with `result.requests`, `result.metrics` (overall and per
priority class), `metrics.flat_metrics` (the sweep row, seconds twins included), the summary table,
the sweep CSV and the requests files.
"""

from __future__ import annotations

import csv
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from decodesched import load_trace, simulate
from decodesched import metrics as M
from decodesched.batch import Scenario, simulate_batch, write_metrics_csv
from decodesched.model import replay
from decodesched.tables_io import read_table

from oracle import POLICIES, traces

INF = math.inf
NAN = math.nan


# -- the reference --------------------------------------------------------------------------------

def ref_requests(rows, policy, capacity, interval, max_steps):
    """Per request, from the model's events: (list of dicts, the model's replay)."""
    rep = replay(rows, policy=policy, free_kv_blocks=capacity, aging_interval=interval, max_steps=max_steps)
    by_id = {}
    for e in rep.events:
        by_id.setdefault(e["request_id"], []).append(e)
    out = []
    for i, row in enumerate(rows):
        evs = by_id.get(row["request_id"], [])
        state = rep.states.get(i)
        first = next((e["step"] for e in evs if e["action"] == "prefill_to_decode"), None)
        first_token = next((e["step"] for e in evs if e["action"] in ("decode_one_step", "finish")), None)
        finish = next((e["step"] for e in evs if e["action"] == "finish"), None)
        arrival, new, deadline = row["arrival_step"], row["max_new_tokens"], row["deadline_step"]
        finished = finish is not None
        assert finished == (state is not None and state.done)
        r = {
            "first_step": first, "first_token_step": first_token, "finish_step": finish,
            "finished": finished,
            "ran": first is not None,
            "wait_steps": state.wait_steps if state else 0,
            "preemptions": state.preemptions if state else 0,
            "generated_len": state.generated_len if state else 0,
            "queue_wait": first - arrival if first is not None else None,
            "ttft": first_token + 1 - arrival if first_token is not None else None,
            "e2e": finish + 1 - arrival if finished else None,
            "tpot": Fraction(finish - first_token, new - 1) if finished and new > 1 else None,
            "tpot_applies": new > 1,
            "has_deadline": deadline is not None,
            "deadline_met": deadline is not None and finished and finish + 1 <= deadline,
            "unservable": rep.stop == "stuck" and not finished,
            "priority": row["priority"],
            "work": 1 + new,
            "arrival": arrival,
        }
        out.append(r)
    return out, rep


def ref_percentile(values, q):
    """NumPy's default (linear) percentile of `values` (Fractions or +inf), exactly."""
    v = sorted(values)
    h = Fraction((len(v) - 1) * q, 100)
    lo, hi = math.floor(h), math.ceil(h)
    if v[hi] == INF:
        return INF
    return v[lo] + (v[hi] - v[lo]) * (h - lo)


def ref_stats(reqs, name):
    """count, censored, mean, p50, p95, p99, max of one latency, censored requests at +inf."""
    applies = [r for r in reqs if name != "tpot" or r["tpot_applies"]]
    known = [Fraction(r[name]) for r in applies if r[name] is not None]
    censored = sum(1 for r in applies if r[name] is None and not r["finished"])
    assert len(known) + censored == len(applies)  # a finished request always has every latency
    values = known + [INF] * censored
    if not values:
        return {"count": 0, "censored": 0, "mean": NAN, "p50": NAN, "p95": NAN, "p99": NAN, "max": NAN}
    return {
        "count": len(known), "censored": censored,
        "mean": INF if censored else sum(known) / len(known),
        "p50": ref_percentile(values, 50), "p95": ref_percentile(values, 95), "p99": ref_percentile(values, 99),
        "max": max(values),
    }


def ref_group(reqs):
    finished = [r for r in reqs if r["finished"]]
    ran = [r for r in reqs if r["ran"]]
    dl = [r for r in reqs if r["has_deadline"]]
    misses = sum(1 for r in dl if not r["deadline_met"])
    out = {name: ref_stats(reqs, name) for name in ("queue_wait", "ttft", "tpot", "e2e")}
    out.update({
        "requests": len(reqs),
        "finished": len(finished),
        "unservable": sum(r["unservable"] for r in reqs),  # (SPEC 9: beside every latency figure, per class too)
        "unfinished": len(reqs) - len(finished),
        "starvation": max(r["wait_steps"] for r in ran) if ran else NAN,
        "preemptions": sum(r["preemptions"] for r in reqs),
        "with_deadline": len(dl),
        "deadline_misses": misses,
        "deadline_miss_rate": Fraction(misses, len(dl)) if dl else NAN,
        "slo_attainment": 1 - Fraction(misses, len(dl)) if dl else NAN,
        # docs/metrics.md: a class's mean service share, work / e2e per finished request, 0 for the others
        "mean_service_share": sum((Fraction(r["work"], r["e2e"]) for r in finished), Fraction(0)) / len(reqs),
    })
    return out


def ref_metrics(reqs, rep, sps):
    out = ref_group(reqs)
    classes = {p: ref_group([r for r in reqs if r["priority"] == p]) for p in sorted({r["priority"] for r in reqs})}
    tokens = sum(r["generated_len"] for r in reqs)
    first_arrival = min(r["arrival"] for r in reqs)
    shares = [c["mean_service_share"] for c in classes.values()]
    out.update({
        "events": len(rep.events),
        "clock": rep.clock,
        "tokens": tokens,
        "throughput_tokens_per_step": Fraction(tokens, max(rep.clock - first_arrival, 1)),
        "fairness_jain": sum(shares) ** 2 / (len(shares) * sum(x * x for x in shares)) if any(shares) else NAN,
        "steps_per_second": sps,
        "per_class": classes,
    })
    return out


# -- comparison -----------------------------------------------------------------------------------

def same(got, want, where):
    """`got` (the package's, float/int) equals the exact `want` (NaN equal to NaN; floats to 1e-12)."""
    if want is None:
        assert got is None, f"{where}: {got!r} != None"
        return
    if isinstance(want, float) and math.isnan(want):
        assert isinstance(got, float) and math.isnan(got), f"{where}: got {got!r}, want NaN"
        return
    assert got is not None and not (isinstance(got, float) and math.isnan(got)), f"{where}: got {got!r}, want {want}"
    if want == INF:
        assert got == INF, f"{where}: got {got!r}, want inf"
        return
    assert math.isclose(float(got), float(want), rel_tol=1e-12, abs_tol=1e-12), f"{where}: got {got!r}, want {want}"


def compare_group(got, want, where):
    for k, w in want.items():
        if k == "per_class":
            assert sorted(got[k]) == sorted(w), f"{where}: classes {sorted(got[k])} != {sorted(w)}"
            for p in w:
                compare_group(got[k][p], w[p], f"{where} class {p}")
        elif isinstance(w, dict):
            for stat, x in w.items():
                same(got[k][stat], x, f"{where} {k} {stat}")
        elif k == "steps_per_second":
            assert got[k] == w, f"{where}: steps_per_second {got[k]} != {w}"
        else:
            same(got[k], w, f"{where} {k}")


def compare_requests(result, reqs):
    got = result.requests
    for i, r in enumerate(reqs):
        for k in ("first_step", "first_token_step", "finish_step"):
            assert got[k][i] == (-1 if r[k] is None else r[k]), f"row {i} {k}"
        for k in ("queue_wait", "ttft", "e2e", "tpot"):
            same(float(got[k][i]), NAN if r[k] is None else r[k], f"row {i} {k}")
        for k in ("wait_steps", "preemptions", "generated_len"):
            assert got[k][i] == r[k], f"row {i} {k}: {got[k][i]} != {r[k]}"
        assert bool(got["deadline_met"][i]) == r["deadline_met"], f"row {i} deadline_met"
        assert bool(got["has_deadline"][i]) == r["has_deadline"], f"row {i} has_deadline"
        assert bool(got["unservable"][i]) == r["unservable"], f"row {i} unservable"
        assert (got["status"][i] == "finished") == r["finished"], f"row {i} status {got['status'][i]}"
        assert (got["status"][i] == "unservable") == r["unservable"], f"row {i} status {got['status'][i]}"


def ref_flat(want):
    """`metrics.flat_metrics` as docs/metrics.md describes it, from the reference metrics."""
    sps = want["steps_per_second"]
    row = {}

    def put(name, v, timed, suffix=""):
        row[f"{name}{suffix}"] = v
        if sps and timed:
            row[f"{name}_s{suffix}"] = v / sps if not (isinstance(v, float) and math.isnan(v)) else NAN

    for name in M.FLAT_COLUMNS:
        base, _, stat = name.rpartition("_")
        if base in M.LATENCIES:
            put(name, want[base][stat], stat != "censored")
        else:
            put(name, want[name], name == "starvation")
    for p in sorted(want["per_class"]):
        c = want["per_class"][p]
        for name in M.CLASS_COLUMNS:
            base, _, stat = name.rpartition("_")
            v = c[base][stat] if base in M.LATENCIES else c[name]
            put(name, v, base in M.LATENCIES or name == "starvation", f"_class{p}")
    return row


def compare_flat(got, want, where="flat"):
    assert list(got) == list(want), f"{where}: columns {list(got)} != {list(want)}"
    for k in want:
        same(got[k], want[k], f"{where} {k}")


def check(rows, config, sps=None):
    policy, capacity, interval, max_steps = config
    trace = load_trace(rows, steps_per_second=sps)
    result = simulate(trace, policy, capacity, interval, max_steps)
    reqs, rep = ref_requests(rows, policy, capacity, interval, max_steps)
    compare_requests(result, reqs)
    want = ref_metrics(reqs, rep, sps)
    compare_group(result.metrics, want, "metrics")
    compare_flat(M.flat_metrics(result.metrics), ref_flat(want))
    check_summary(result.metrics)
    return result, want


def check_summary(m):
    """The summary table shows the metrics it names (seconds with a time scale), `-` for NaN."""
    rows = dict(M.summary_rows(m))
    sps = m["steps_per_second"]
    unit = "s" if sps else "steps"

    def shown(label, v, timed=True):
        if isinstance(v, float) and math.isnan(v):
            assert rows[label] == "-", (label, rows[label])
            return
        text = rows[label]
        if v == INF:
            assert text == "inf", (label, text)
            return
        x = v / sps if sps and timed else v
        assert math.isclose(float(text), x, rel_tol=6e-3, abs_tol=6e-3), (label, text, x)

    for name in ("queue_wait", "ttft", "e2e"):
        for p in ("p50", "p95", "p99"):
            shown(f"{name} {p.upper()} ({unit})", m[name][p])
    shown(f"starvation, max wait ({unit})", float(m["starvation"]))
    assert rows["preemptions"] == str(m["preemptions"])
    assert rows["deadline misses"] == f"{m['deadline_misses']} / {m['with_deadline']}"
    assert rows["unservable"] == str(m["unservable"])
    assert rows["unfinished"] == str(m["unfinished"])
    assert rows["events"] == str(m["events"])
    shown("fairness (Jain, classes)", m["fairness_jain"], timed=False)


# -- the randomized comparison --------------------------------------------------------------------

capacities = st.one_of(st.integers(0, 12), st.just(2**61))
audit_configs = st.tuples(st.sampled_from(POLICIES), capacities, st.integers(1, 5),
                          st.one_of(st.none(), st.none(), st.integers(0, 40)))
time_scales = st.sampled_from([None, 2.0, 0.3])


@st.composite
def shaped_traces(draw):
    """oracle.traces, with extra shapes: every request with max_new_tokens 1, or with no deadline, a
    single request, or arrivals shifted to just below 2**53."""
    rows = draw(traces(max_requests=10, wide_priorities=draw(st.booleans())))
    shape = draw(st.sampled_from(["as drawn", "as drawn", "one token", "no deadlines", "single", "late"]))
    if shape == "one token":
        rows = [dict(r, max_new_tokens=1, deadline_step=None if r["deadline_step"] is None
                     else max(r["deadline_step"], r["arrival_step"] + 1)) for r in rows]
    elif shape == "no deadlines":
        rows = [dict(r, deadline_step=None) for r in rows]
    elif shape == "single":
        rows = rows[:1]
    elif shape == "late":  # steps near the largest arrival_step, 2**53, where float64 stops being exact
        late = 2**53 - 16
        rows = [dict(r, arrival_step=r["arrival_step"] + late,
                     deadline_step=None if r["deadline_step"] is None or r["deadline_step"] + late > 2**53
                     else r["deadline_step"] + late) for r in rows]
    return rows


@settings(max_examples=300, derandomize=True, deadline=None)
@given(shaped_traces(), audit_configs, time_scales)
def test_metrics_equal_reference(rows, config, sps):
    check(rows, config, sps)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(traces(max_requests=8, max_blocks=4), st.sampled_from(POLICIES), time_scales)
def test_all_unservable(rows, policy, sps):
    """Capacity below every request's blocks: nothing runs, everything is unservable and censored."""
    rows = [dict(r, required_blocks=r["required_blocks"] + 4) for r in rows]
    result, want = check(rows, (policy, 4, 3, None), sps)
    m = result.metrics
    assert m["unservable"] == m["unfinished"] == m["requests"] == len(rows) and m["events"] == 0
    assert math.isnan(m["starvation"]) and math.isnan(m["fairness_jain"])
    for name in ("queue_wait", "ttft", "e2e"):
        assert m[name]["censored"] == len(rows) and m[name]["p50"] == INF


# -- edges ----------------------------------------------------------------------------------------

def one(**kw):
    row = {"request_id": 1, "arrival_step": 0, "prompt_len": 1, "max_new_tokens": 2, "priority": 0,
           "cache_hit": False, "required_blocks": 1, "deadline_step": None, "preemptible": True}
    row.update(kw)
    return row


def test_single_request_one_token():
    result, _ = check([one(max_new_tokens=1, deadline_step=3)], ("fixed_priority", 1, 4, None))
    m = result.metrics
    assert m["tpot"]["count"] == m["tpot"]["censored"] == 0 and math.isnan(m["tpot"]["p50"])
    assert m["e2e"]["p99"] == 2 and m["slo_attainment"] == 1.0


def test_latencies_exact_at_large_arrival_steps():
    """Arrival steps near 2**53 (allowed): a latency is a small difference of large step numbers and
    must be exact.  Taken in float64, the steps are rounded first (2**53 + 1 is not a float64)."""
    big = 2**53
    rows = [one(arrival_step=big, max_new_tokens=2), one(request_id=2, arrival_step=big, max_new_tokens=3, prompt_len=2)]
    result, _ = check(rows, ("fixed_priority", 10, 4, None))
    assert result.requests["queue_wait"].tolist() == [0.0, 1.0]
    assert result.requests["ttft"].tolist() == [3.0, 5.0]
    assert result.requests["e2e"].tolist() == [4.0, 7.0]


# -- files: the sweep CSV and the requests table ---------------------------------------------------

def csv_cell(v) -> str:
    """A metrics value as docs/metrics.md says the sweep CSV shows it: empty for NaN, inf, a number."""
    if isinstance(v, float) and math.isnan(v):
        return ""
    return "inf" if v == INF else v


@settings(max_examples=15, derandomize=True, deadline=None)
@given(st.lists(traces(max_requests=8, wide_priorities=True), min_size=2, max_size=3), audit_configs,
       st.lists(time_scales, min_size=3, max_size=3))
def test_sweep_csv_equals_metrics(tmp_path_factory, trace_rows, config, scales):
    """Every cell of the sweep CSV is the `result.metrics` value of its scenario run alone; a class
    absent from a trace, and the seconds twins of a trace without a time scale, are empty."""
    policy, capacity, interval, max_steps = config
    loaded = [load_trace(rows, steps_per_second=s) for rows, s in zip(trace_rows, scales)]
    scenarios = [Scenario(t, policy, capacity, interval, max_steps) for t in range(len(loaded))]
    batch = simulate_batch(loaded, scenarios)
    path = tmp_path_factory.mktemp("sweep") / "metrics.csv"
    write_metrics_csv(batch.rows(), path)
    with open(path, newline="") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == len(scenarios)
    for t, (rows, line) in enumerate(zip(trace_rows, table)):
        alone = simulate(loaded[t], policy, capacity, interval, max_steps)
        flat = M.flat_metrics(alone.metrics)
        reqs, rep = ref_requests(rows, policy, capacity, interval, max_steps)
        compare_flat(flat, ref_flat(ref_metrics(reqs, rep, scales[t])))
        for k, cell in line.items():
            if k in flat:
                want = csv_cell(flat[k])
                if isinstance(want, str):
                    assert cell == want, (t, k, cell, want)
                else:  # (docs/files.md: every number reads back as the float it is)
                    assert float(cell) == want, (t, k, cell, want)
            elif "_class" in k or k.endswith("_s"):
                assert cell == "", f"trace {t}: {k} = {cell!r} for a class or time scale it does not have"


@pytest.mark.parametrize("ext", ["csv", "parquet"])
@settings(max_examples=20, derandomize=True, deadline=None)
@given(rows=shaped_traces(), config=audit_configs)
def test_requests_file_round_trip(tmp_path_factory, ext, rows, config):
    """`write_requests` then `read_table` gives back `result.requests` (SPEC section 4 columns):
    empty cells exactly where a value does not exist (a step never reached, no deadline)."""
    if ext == "parquet":
        pytest.importorskip("pyarrow")
    policy, capacity, interval, max_steps = config
    result = simulate(load_trace(rows), policy, capacity, interval, max_steps)
    path = tmp_path_factory.mktemp("req") / f"requests.{ext}"
    result.write_requests(path)
    back = read_table(path)
    req = result.requests
    assert list(back) == list(M.REQUEST_CSV_COLUMNS)
    for k in M.REQUEST_CSV_COLUMNS:
        got = back[k]
        if k == "deadline_step":
            assert np.array_equal(np.ma.getmaskarray(got), ~req["has_deadline"])
            assert np.ma.filled(got, 0).tolist() == [0 if d is None else d for d in req[k]]
        elif k in ("first_step", "first_token_step", "finish_step"):
            assert np.array_equal(np.ma.getmaskarray(got), req[k] < 0), k
            assert np.array_equal(np.ma.filled(got, -1), req[k]), k
        elif k == "deadline_met":
            assert np.array_equal(np.ma.getmaskarray(got), ~req["has_deadline"])
            assert np.array_equal(np.ma.filled(got, False), req[k])
        elif k in ("queue_wait", "ttft", "tpot", "e2e"):
            assert np.array_equal(got, req[k], equal_nan=True), (k, got, req[k])
        else:
            assert np.asarray(got).tolist() == np.asarray(req[k]).tolist(), k


def test_the_sweep_csv_writes_a_near_perfect_fairness_as_it_is(tmp_path):
    # (cells were rounded to 6 decimal places: a Jain index of 0.99999975 read "1", perfectly fair)
    rows = [dict(request_id=1, arrival_step=0, prompt_len=1, max_new_tokens=1, priority=0, cache_hit=False,
                 required_blocks=1, deadline_step=2, preemptible=True),
            dict(request_id=2, arrival_step=1, prompt_len=1, max_new_tokens=998, priority=1, cache_hit=False,
                 required_blocks=1, deadline_step=None, preemptible=True)]
    trace = load_trace(rows)
    batch = simulate_batch([trace], [Scenario(0, "deadline", 10, 4)])
    fairness = batch.rows()[0]["fairness_jain"]
    assert 0.9999 < fairness < 1
    write_metrics_csv(batch.rows(), tmp_path / "m.csv")
    with open(tmp_path / "m.csv", newline="") as fh:
        assert float(next(csv.DictReader(fh))["fairness_jain"]) == fairness
