"""The figures a user reads: Jain's fairness index of classes served alike, as the API, the summary table and
the sweep CSV give it.

(The metrics themselves are recomputed from the model's event log in tests/test_metrics_audit.py and
tests/test_metrics_stop59.py; this file covers what they compare only to 1e-12.)
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from decodesched import load_trace, simulate
from decodesched import metrics as M
from decodesched.batch import Scenario, simulate_batch, write_metrics_csv

from oracle import POLICIES


def copies(block, classes, order_seed):
    """`block` (rows of one priority class) repeated for `classes` classes, each copy far enough after the
    previous one to be served alone, its ids in the block's order (so served alike) and its rows shuffled."""
    span = sum(1 + r["max_new_tokens"] for r in block) + max(r["arrival_step"] for r in block) + 1
    rng = np.random.default_rng(order_seed)
    rows = []
    for c in range(classes):
        copy = [dict(r, request_id=r["request_id"] + 1000 * c, arrival_step=r["arrival_step"] + span * c,
                     priority=c - 1) for r in block]
        rows += [copy[i] for i in rng.permutation(len(copy))]
    return rows


def request(rid, arrival, new, blocks=1):
    return dict(request_id=rid, arrival_step=arrival, prompt_len=1, max_new_tokens=new, priority=0,
                cache_hit=False, required_blocks=blocks, deadline_step=None, preemptible=True)


blocks_of_requests = st.lists(st.tuples(st.integers(0, 4), st.integers(1, 6), st.integers(1, 3)),
                              min_size=1, max_size=6).map(
    lambda xs: [request(i, a, n, b) for i, (a, n, b) in enumerate(xs)])


@settings(max_examples=40, derandomize=True, deadline=None)
@given(blocks_of_requests, st.integers(2, 9), st.sampled_from(POLICIES), st.sampled_from([3, 6, 2**61]),
       st.integers(0, 2**32))
def test_classes_served_alike_are_exactly_fair(block, classes, policy, capacity, order_seed):
    """Classes whose requests are served alike have bit-equal mean service shares and a Jain index of exactly
    1 (printed "1"), whatever the rows' order; the float sums read 0.9999999999999999 or 1.0000000000000002."""
    result = simulate(copies(block, classes, order_seed), policy, capacity, 4)
    m = result.metrics
    shares = {c["mean_service_share"] for c in m["per_class"].values()}
    assert len(m["per_class"]) == classes and len(shares) == 1, shares
    assert m["fairness_jain"] == 1.0
    assert dict(M.summary_rows(m))["fairness (Jain, classes)"] == "1"


def test_the_summary_table_and_sweep_csv_say_exactly_fair(tmp_path):
    """Three classes of three one-token requests each, arriving together: each class's mean share is
    (2/4 + 2/5 + 2/6) / 3, and the table read "fairness (Jain, classes)  0.9999999999999999"."""
    rows = [request(3 * c + k, 20 * c, 1) for c in range(3) for k in range(3)]
    for r in rows:
        r["priority"] = r["request_id"] // 3
    trace = load_trace(rows)
    assert simulate(trace, "fcfs", 10, 4).metrics["fairness_jain"] == 1.0
    batch = simulate_batch([trace], [Scenario(0, "fcfs", 10, 4)])
    write_metrics_csv(batch.rows(), tmp_path / "m.csv")
    with open(tmp_path / "m.csv", newline="") as fh:
        assert next(csv.DictReader(fh))["fairness_jain"] in ("1", "1.0")


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=40), st.integers(1, 50))
def test_jain_index_is_between_one_over_n_and_one(x, n):
    """Jain's index lies in [1/n, 1] (1/n: one class has everything), and n equal shares give exactly 1."""
    x = np.asarray(x)
    j = M.jain_index(x)
    if not np.any(x):
        assert math.isnan(j)
        return
    assert 1 / x.size - 1e-12 <= j <= 1.0
    assert M.jain_index(np.full(n, x.max())) == 1.0


def test_jain_index_of_near_equal_shares_is_at_most_one():
    """Shares a few ulps apart: the rounded sums give (sum x)^2 / (n sum x^2) = 1.0000000000000002."""
    assert M.jain_index(np.array([0.9999999999999993, 0.9999999999999998, 1.0, 0.9999999999999998])) <= 1.0


@pytest.mark.parametrize("x", [[1.0, 0.0, 0.0, 0.0], [0.25, 0.0]])
def test_jain_index_of_one_class_taking_all_is_one_over_n(x):
    assert M.jain_index(np.asarray(x)) == 1 / len(x)


# -- the report's tables ---------------------------------------------------------------------------

SWEEP_COLUMNS = ["trace", "replicate", "policy", "kv_blocks", "aging_interval", "offered_load", "requests",
                 "finished", "unfinished", "ttft_p50", "ttft_p99", "queue_wait_p99", "e2e_p99", "slo_attainment",
                 "starvation", "fairness_jain", "preemptions"]


def table_cells(page):
    """The first table's cells of index.html, by (trace, policy), as text."""
    import html
    import re

    table = re.search(r"<table.*?</table>", page, re.S).group(0)
    rows = [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<t[dh]>(.*?)</t[dh]>", tr)]
            for tr in re.findall(r"<tr>(.*?)</tr>", table)]
    head = rows[0]
    return {(r[0], head[i]): r[i] for r in rows[1:] for i in range(2, len(head))}


CASES = {"t0": ((0, 1, 0, 3), "0.5 [0..3] unfinished"), "t1": ((0, 0, 2, 0), "0 [0..2] unfinished"),
         "t2": ((2, 2, 2, 2), "2 unfinished")}


def test_report_table_gives_the_unfinished_replicates_as_the_csv_has_them(tmp_path):
    """Replicates whose unfinished counts differ: the table read "0 unfinished" for a median of 0.5 (rounded),
    and nothing for a median of 0 though a replicate left 2 requests unfinished.  Now the count is given as the
    P99 beside it: the median, and [min..max] where the replicates differ."""
    from decodesched.cli import main

    with open(tmp_path / "s.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SWEEP_COLUMNS)
        for t, (unfinished, _) in CASES.items():
            for rep, unf in enumerate(unfinished):
                p99 = "inf" if unf else 40 + rep
                w.writerow([t, rep, "fcfs", 8, "", 0.5, 20, 20 - unf, unf, 3, p99, 20, p99, 0.9, 40, 0.8, 2])
        w.writerow(["near", 0, "fcfs", 8, "", 0.5, 20, 20, 0, 3, 9999.7, 20, 9999.7, 0.9, 40, 0.8, 2])
    assert main(["report", str(tmp_path / "s.csv"), "--out", str(tmp_path / "r")]) == 0
    cells = table_cells((tmp_path / "r" / "index.html").read_text())
    for t, (_, shown) in CASES.items():
        assert cells[(t, "fcfs")].endswith(f", {shown})"), (t, cells[(t, "fcfs")])
    assert cells[("near", "fcfs")] == "10000 (90%)"  # (P99 9,999.7 steps read "1e+04")


@pytest.mark.parametrize("seconds, shown", [(999.7, "1000"), (1192.4, "1192"), (99.97, "100"), (0.5, "0.5")])
def test_summary_in_seconds_never_has_an_exponent(seconds, shown):
    """The summary table in seconds (3 significant digits): an e2e of 999.7 s read "1e+03"."""
    row = request(1, 0, 2)  # (e2e 3 steps: its prefill and two tokens)
    m = simulate(load_trace([row], steps_per_second=3 / seconds), "fcfs", 4, 4).metrics
    assert dict(M.summary_rows(m))["e2e P50 (s)"] == shown


def test_report_marks_a_censored_replicate_behind_a_finite_median(tmp_path, monkeypatch):
    """Replicates whose P99 TTFT is 40, 42 and inf (one left requests unfinished): the median, 42, was drawn
    with no bar (its max is inf) and no triangle, as if every replicate had finished.  Now the point has its
    triangle at the top edge, in the load figures and in the aging interval figure alike."""
    from decodesched import report as R
    from decodesched.cli import main

    drawn = {}
    save = R._save
    monkeypatch.setattr(R, "_save", lambda fig, out, plot: (drawn.__setitem__(plot.name, fig), save(fig, out, plot))[1])
    with open(tmp_path / "s.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SWEEP_COLUMNS + ["ttft_p99_class0"])
        for interval in (2, 4):
            for rep, p99 in enumerate((40, 42, "inf")):
                unf = 1 if p99 == "inf" else 0
                w.writerow(["t", rep, "aging", 8, interval, 0.5, 20, 20 - unf, unf, 3, p99, 20, p99, 0.9, 40, 0.8, 2,
                            p99])
    assert main(["report", str(tmp_path / "s.csv"), "--out", str(tmp_path / "r")]) == 0

    def triangles(fig, label):
        ax = next(a for a in fig.axes if a.get_ylabel().startswith(label))
        return [line for line in ax.get_lines() if line.get_marker() == "^"]

    assert triangles(drawn["latency_vs_load"], "TTFT P99") and not triangles(drawn["latency_vs_load"], "TTFT P50")
    assert triangles(drawn["interval_aging"], "class 0: TTFT P99")
