"""A second, independent oracle of the metrics, and the figures that show them.

The oracle replays a trace with its own loop over the seed's class `DecodeSchedulerSim` (SPEC
section 3, written here again from the words), takes each request's steps from the seed's timeline
and computes every metric of docs/metrics.md in plain Python (exact `Fraction`s, NumPy's linear
percentile by hand, censored requests at +inf).  It is compared with what ``decodesched simulate``
prints and writes (the requests CSV and Parquet files read back by the csv module and pyarrow, not
the package's readers).  The figures: what they draw is read from the matplotlib figure itself.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from decodesched import DecodeSchedulerSim, load_trace, simulate
from decodesched import report as R
from decodesched.cli import main
from decodesched.commands import demo

from oracle import POLICIES, traces

INF = math.inf
COLUMNS = ("request_id", "arrival_step", "prompt_len", "max_new_tokens", "priority", "cache_hit",
           "required_blocks", "deadline_step", "preemptible")


# -- the oracle ----------------------------------------------------------------------------------

def oracle_replay(rows, policy, capacity, interval, max_steps):
    """SPEC section 3 over the seed's class: (events with their step, whether it ended stuck, the class)."""
    sim = DecodeSchedulerSim(policy=policy, free_kv_blocks=capacity, aging_interval=interval)
    pending = sorted(range(len(rows)), key=lambda i: (rows[i]["arrival_step"], i))
    events, ran = [], 0
    while max_steps is None or ran < max_steps:
        while pending and rows[pending[0]]["arrival_step"] <= sim.clock:
            row = rows[pending.pop(0)]
            sim.enqueue(**{k: row[k] for k in COLUMNS if k != "arrival_step"})
        clock, before = sim.clock, len(sim.timeline)
        if sim.step() is None:
            if not pending:
                return events, True, sim
            sim.clock = rows[pending[0]]["arrival_step"]
            continue
        assert len(sim.timeline) == before + 1
        events.append(dict(sim.timeline[-1], step=clock))
        ran += 1
    return events, False, sim


def percentile(values, q):
    """NumPy's linear percentile of `values` (exact numbers or +inf); +inf where it reads an inf."""
    v = sorted(values)
    h = Fraction(q, 100) * (len(v) - 1)
    lo, hi = math.floor(h), math.ceil(h)
    if v[hi] == INF:
        return INF
    return v[lo] + (v[hi] - v[lo]) * (h - lo)


def oracle(rows, policy, capacity, interval, max_steps):
    """(per-request dicts, aggregates) from docs/metrics.md's words."""
    events, stuck, sim = oracle_replay(rows, policy, capacity, interval, max_steps)
    final = {q.request_id: q for q in sim.queue}
    reqs = []
    for row in rows:
        mine = [e for e in events if e["request_id"] == row["request_id"]]
        prefill = [e["step"] for e in mine if e["action"] == "prefill_to_decode"]
        decode = [e["step"] for e in mine if e["action"] != "prefill_to_decode"]
        finish = [e["step"] for e in mine if e["action"] == "finish"]
        a, new, dl = row["arrival_step"], row["max_new_tokens"], row["deadline_step"]
        done = bool(finish)
        reqs.append({
            "first_step": prefill[0] if prefill else None,
            "first_token_step": decode[0] if decode else None,
            "finish_step": finish[0] if done else None,
            "queue_wait": prefill[0] - a if prefill else None,
            "ttft": decode[0] + 1 - a if decode else None,
            "e2e": finish[0] + 1 - a if done else None,
            "tpot": Fraction(finish[0] - decode[0], new - 1) if done and new > 1 else None,
            "deadline_met": None if dl is None else done and finish[0] + 1 <= dl,
            "done": done, "ran": bool(mine), "new": new, "priority": row["priority"],
            "tokens": len(decode), "wait": final[row["request_id"]].wait_steps if mine else None,
            "preemptions": sum(e["preempted_request_id"] == row["request_id"] for e in events),
            "unservable": stuck and not done,
        })
    return reqs, {"events": len(events), "clock": sim.clock, **group(reqs)}


def group(reqs):
    out = {}
    for name in ("queue_wait", "ttft", "e2e", "tpot"):
        counted = [r for r in reqs if name != "tpot" or r["new"] > 1]
        values = [INF if r[name] is None else r[name] for r in counted]
        out[name] = {p: percentile(values, q) if values else math.nan for p, q in (("p50", 50), ("p95", 95),
                                                                                    ("p99", 99))}
    ran = [r["wait"] for r in reqs if r["ran"]]
    dl = [r for r in reqs if r["deadline_met"] is not None]
    out.update(starvation=max(ran) if ran else math.nan, preemptions=sum(r["preemptions"] for r in reqs),
               with_deadline=len(dl), deadline_misses=sum(not r["deadline_met"] for r in dl),
               unservable=sum(r["unservable"] for r in reqs), unfinished=sum(not r["done"] for r in reqs))
    return out


# -- what the CLI prints and writes ----------------------------------------------------------------

def write_trace(path, rows, sps=None):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow(["" if r[k] is None else str(r[k]).lower() if isinstance(r[k], bool) else r[k]
                        for k in COLUMNS])
    if sps is not None:
        (path.parent / f"{path.name}.meta.json").write_text(json.dumps({"steps_per_second": sps}))


def printed(text):
    """The summary table's (label -> cell) of a one-policy `simulate` run."""
    rows = {}
    for line in text.splitlines()[2:]:
        label, _, cell = line.rstrip().rpartition("  ")
        rows[label.strip()] = cell.strip()
    return rows


def shown_as(cell, value, sps):
    if isinstance(value, float) and math.isnan(value):
        return cell == "-"
    if value == INF:
        return cell == "inf"
    x = float(value) / sps if sps else float(value)
    return math.isclose(float(cell), x, rel_tol=6e-3, abs_tol=6e-3)


def cell_value(cell):
    return None if cell == "" else Fraction(cell)


@settings(max_examples=40, derandomize=True, deadline=None)
@given(traces(max_requests=8, wide_priorities=True), st.sampled_from(POLICIES),
       st.one_of(st.integers(0, 8), st.just(2**61)), st.integers(1, 4), st.one_of(st.none(), st.integers(0, 30)),
       st.sampled_from([None, 0.25, 3.0]), st.sampled_from(["csv", "parquet"]))
def test_simulate_cli_equals_the_second_oracle(tmp_path_factory, rows, policy, capacity, interval,
                                               max_steps, sps, ext):
    if ext == "parquet":
        pq = pytest.importorskip("pyarrow.parquet")
    d = tmp_path_factory.mktemp("cli")
    write_trace(d / "t.csv", rows, sps)
    argv = ["simulate", str(d / "t.csv"), "--policy", policy, "--kv-blocks", str(capacity),
            "--aging-interval", str(interval), "--requests", str(d / f"r.{ext}")]
    if max_steps is not None:
        argv += ["--max-steps", str(max_steps)]
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        assert main(argv) == 0
    out = buf.getvalue()
    reqs, want = oracle(rows, policy, capacity, interval, max_steps)

    table = printed(out)
    unit = "s" if sps else "steps"
    for name in ("queue_wait", "ttft", "e2e"):
        for p in ("p50", "p95", "p99"):
            label = f"{name} {p.upper()} ({unit})"
            assert shown_as(table[label], want[name][p], sps), (label, table[label], want[name][p])
    assert shown_as(table[f"starvation, max wait ({unit})"], want["starvation"], sps)
    assert table["preemptions"] == str(want["preemptions"])
    assert table["deadline misses"] == f"{want['deadline_misses']} / {want['with_deadline']}"
    for key in ("unservable", "unfinished", "events"):
        assert table[key] == str(want[key]), key

    if ext == "csv":
        with open(d / "r.csv", newline="") as fh:
            back = list(csv.DictReader(fh))
        back = [{k: cell_value(v) if k not in ("status", "deadline_met", "cache_hit", "preemptible") else v
                 for k, v in r.items()} for r in back]
    else:
        back = pq.read_table(d / "r.parquet").to_pylist()
    assert len(back) == len(rows)
    for i, (got, r) in enumerate(zip(back, reqs)):
        for k in ("first_step", "first_token_step", "finish_step"):
            assert got[k] == r[k], (i, k, got[k], r[k])
        for k in ("queue_wait", "ttft", "e2e", "tpot"):
            g = got[k]
            if r[k] is None:
                assert g is None or (isinstance(g, float) and math.isnan(g)), (i, k, g)
            else:
                assert math.isclose(float(g), float(r[k]), rel_tol=1e-15), (i, k, g, r[k])
        met = got["deadline_met"]
        assert (met in ("", None)) == (r["deadline_met"] is None), (i, met)
        if r["deadline_met"] is not None:
            assert met in (r["deadline_met"], str(r["deadline_met"]).lower()), (i, met, r["deadline_met"])
        assert (got["status"] == "finished") == r["done"] and (got["status"] == "unservable") == r["unservable"]


def test_oracle_helpers_are_not_vacuous():
    """The oracle's percentile is NumPy's linear one, +inf where it reads a censored value; the replay
    stops stuck when nothing fits."""
    assert percentile([1, 2, 3, 4], 50) == Fraction(5, 2) == np.percentile([1, 2, 3, 4], 50)
    assert percentile([1, 2, INF], 50) == 2 and percentile([1, 2, INF], 51) == INF
    row = dict(request_id=1, arrival_step=3, prompt_len=1, max_new_tokens=2, priority=0, cache_hit=False,
               required_blocks=2, deadline_step=None, preemptible=True)
    events, stuck, sim = oracle_replay([row], "fcfs", 1, 4, None)
    assert (events, stuck, sim.clock) == ([], True, 3)
    reqs, m = oracle([row], "fcfs", 2, 4, None)
    assert (reqs[0]["ttft"], reqs[0]["e2e"], m["clock"], m["events"]) == (2, 3, 6, 3)
    assert not shown_as("5", 6, None) and shown_as("2", 6, 3.0) and not shown_as("inf", 6, None)


# -- the figures -----------------------------------------------------------------------------------

def one(**kw):
    row = dict(request_id=1, arrival_step=0, prompt_len=2, max_new_tokens=3, priority=0, cache_hit=False,
               required_blocks=1, deadline_step=None, preemptible=True)
    row.update(kw)
    return row


@pytest.fixture
def figures(monkeypatch):
    """Every report figure drawn in the test, by plot name (saved as usual)."""
    drawn = {}
    save = R._save

    def keep(fig, out, plot):
        drawn[plot.name] = fig
        return save(fig, out, plot)

    monkeypatch.setattr(R, "_save", keep)
    return drawn


def scenario(tmp_path, rows, kv_blocks, policies=("fcfs",)):
    R.build_report(tmp_path / "rep", trace=load_trace(rows), policies=list(policies), kv_blocks=kv_blocks)


def test_a_cdf_of_one_finished_request_is_drawn(tmp_path, figures):
    """One request of three finishes (the others need more blocks than exist): its CDF rises to 1/3
    at its TTFT.  (`step` of a single point drew nothing: the panel looked empty.)"""
    rows = [one(), one(request_id=2, required_blocks=5), one(request_id=3, required_blocks=5)]
    scenario(tmp_path, rows, kv_blocks=2)
    ttft = figures["latency_cdf"].axes[1]
    for line in ttft.get_lines():
        if line.get_label().startswith("fcfs"):
            x, y = line.get_data()
            assert np.asarray(y).min() == 0 and np.asarray(y).max() == pytest.approx(1 / 3)
            assert set(np.asarray(x).tolist()) == {2.0}  # prefill at 0, first token at 1: TTFT 2
            break
    else:
        raise AssertionError("no fcfs curve")


def test_gantt_and_occupancy_show_a_late_trace(tmp_path, figures):
    """A trace that starts at step 10**15: the timeline's x axis spans the replay, not 0..10**15,
    where 12 steps were a single vertical line."""
    late = 10**15
    rows = [one(arrival_step=late), one(request_id=2, arrival_step=late + 2, priority=1)]
    scenario(tmp_path, rows, kv_blocks=4)
    lo, hi = figures["gantt"].axes[0].get_xlim()
    assert late <= lo and hi - lo < 100, (lo, hi)
    lo, hi = figures["kv_queue_timeline"].axes[1].get_xlim()
    assert late <= lo and hi - lo < 100, (lo, hi)


def test_per_class_figure_marks_no_value_as_not_zero(tmp_path, figures):
    """Class 0 has a deadline and runs; class 1 has no deadline; class 2 never runs (its blocks do not
    fit).  Deadline attainment of class 1 and starvation of class 2 are not 0: they are marked n/a."""
    rows = [one(deadline_step=50), one(request_id=2, priority=1), one(request_id=3, priority=2, required_blocks=9)]
    scenario(tmp_path, rows, kv_blocks=2)
    starvation, _, attainment = figures["per_class"].axes

    def marked(ax):
        return sorted(round(t.get_position()[0]) for t in ax.texts if t.get_text() == "n/a")

    assert marked(starvation) == [2] and marked(attainment) == [1, 2]
    assert [p.get_height() for p in attainment.patches][:1] == [100.0]


def test_demo_cdf_label_p99_counts_requests_without_a_first_token(monkeypatch):
    """The demo's legend gives each policy's P99 TTFT: with 3 of 4 requests without a first token it
    is inf (censored), as in the printed table, not the P99 of the one finished request."""
    from matplotlib.figure import Figure

    drawn = []
    savefig = Figure.savefig

    def keep(fig, *args, **kw):
        drawn.append(fig)
        return savefig(fig, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", keep)
    result = simulate([one(), *(one(request_id=i, required_blocks=5) for i in (2, 3, 4))], "fcfs", 2)
    assert result.metrics["ttft"]["p99"] == INF
    demo.render_ttft_cdf({"fcfs": result.requests["ttft"]}, None, "t")
    ax = drawn[0].axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fcfs (P99 inf steps)"]
    (x, y), = [line.get_data() for line in ax.get_lines() if line.get_label().startswith("fcfs")]
    assert np.asarray(y).max() == 0.25 and np.asarray(y).min() == 0  # a visible rise to 1/4


def sweep_report(tmp_path, rows, capacities, intervals, policies=("aging", "fcfs")):
    """A sweep of one trace written as CSV, then its report."""
    from decodesched.batch import Scenario, simulate_batch, write_metrics_csv

    trace = load_trace(rows, name="t")
    batch = simulate_batch([trace], [Scenario(0, p, c, k) for p in policies for c in capacities for k in intervals])
    write_metrics_csv(batch.rows(), tmp_path / "sweep.csv")
    R.build_report(tmp_path / "rep", results=tmp_path / "sweep.csv")


def whole_ticks(ax):
    ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    return len(ticks) >= 2 and all(float(t).is_integer() and t >= 0 for t in ticks)


def test_unfinished_counts_all_equal_have_whole_ticks(tmp_path, figures):
    """Every policy leaves 1 request unfinished: the count axis shows 0 and 1, not 0.96 .. 1.05."""
    rows = [one(), one(request_id=2, arrival_step=3), one(request_id=3, required_blocks=9)]
    sweep_report(tmp_path, rows, [2], [4])
    unfinished = figures["latency_vs_load"].axes[-1]
    assert unfinished.get_ylabel() == "unfinished requests"
    assert whole_ticks(unfinished), unfinished.get_yticks()


def test_interval_figure_marks_censored_and_counts(tmp_path, figures):
    """Class 1's requests never run (too many blocks): its P99 TTFT is inf at every interval, drawn as
    triangles at the top edge (they were left out: an empty panel with ticks about 0); preemptions are
    counts with whole ticks."""
    rows = [one(), one(request_id=2, arrival_step=1), one(request_id=3, priority=1, required_blocks=9)]
    sweep_report(tmp_path, rows, [2], [1, 4])
    fig = figures["interval_aging"]
    top, _, _, preemptions = fig.axes
    assert top.get_ylabel().startswith("class 1: TTFT P99")
    marks = [line for line in top.get_lines() if line.get_marker() == "^"]
    assert marks and sorted(np.asarray(marks[0].get_xdata()).tolist()) == [1.0, 4.0]
    assert [t.get_text() for t in top.texts] == ["\u25b2 inf (censored): t"]  # (as in every sweep panel)
    assert whole_ticks(preemptions), preemptions.get_yticks()


def test_requests_frame_deadline_met_is_missing_without_a_deadline(tmp_path):
    """The frame (and its Parquet file) of the requests table says <NA> for a request without a deadline,
    as the requests file does (docs/files.md); it said False, a missed deadline."""
    pytest.importorskip("pandas")
    pq = pytest.importorskip("pyarrow.parquet")
    from decodesched import frames

    result = simulate([one(deadline_step=9), one(request_id=2), one(request_id=3, deadline_step=2)], "fcfs", 4)
    df = frames.requests_frame(result)
    assert df["deadline_met"].isna().tolist() == [False, True, False]
    assert df["deadline_met"].dropna().tolist() == [True, False]
    frames.to_parquet(result, tmp_path / "r.parquet")
    result.write_requests(tmp_path / "w.parquet")
    assert (pq.read_table(tmp_path / "r.parquet").column("deadline_met").to_pylist()
            == pq.read_table(tmp_path / "w.parquet").column("deadline_met").to_pylist() == [True, None, False])


def test_sweep_table_shows_a_small_time_as_it_is():
    """One step at 5,000 steps/s is 0.0002 s: the sweep table wrote it "0.000", a wait of nothing."""
    from decodesched.commands.sweep import format_rows

    rows = [{"trace": "t", "policy": "fcfs", "replicate": 0, "kv_blocks": 9, "aging_interval": math.nan,
             "steps_per_second": 5000.0, "queue_wait_p95_s": 0.0002, "ttft_p95_s": 0.00178, "deadline_miss_rate": 0.5}]
    line = format_rows(rows).splitlines()[1].split()
    assert "0.0002" in line and "0.00178" in line and "0.5" in line


def test_gantt_keeps_an_unfinished_request_in_the_system_to_the_end(tmp_path, figures):
    """Request 2 needs more blocks than exist: it waits from its arrival until the replay ends (clock 4,
    after request 1's four steps); its grey bar was one step long, as if it had left."""
    scenario(tmp_path, [one(), one(request_id=2, required_blocks=9)], kv_blocks=2)
    ax = figures["gantt"].axes[0]
    grey = [c for c in ax.collections if np.allclose(c.get_facecolor()[0][:3], (0xdd / 255,) * 3)]
    spans = sorted((round(p.vertices[:, 1].mean()), p.vertices[:, 0].min(), p.vertices[:, 0].max())
                   for c in grey for p in c.get_paths())
    assert spans == [(0, 0.0, 4.0), (1, 0.0, 4.0)], spans
