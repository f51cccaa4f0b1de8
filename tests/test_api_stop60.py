"""A researcher's Python API, sweeps and reports: numbers printed as they are, checkpoints that resume whatever
integer type a setting came in, and metrics dicts that are the caller's own."""

from __future__ import annotations

import csv
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodesched import checkpoint as C
from decodesched.batch import Scenario, grid, simulate_batch
from decodesched.cli import main
from decodesched.commands.sweep import format_rows
from decodesched.engine import simulate
from decodesched import metrics as M
from decodesched.trace import load_trace

ROWS = {"request_id": [1, 2, 3, 4], "arrival_step": [0, 0, 1, 3], "prompt_len": [2, 3, 2, 2],
        "max_new_tokens": [3, 2, 4, 1], "priority": [0, 1, 0, 2], "cache_hit": [False, True, False, False],
        "required_blocks": [2, 1, 2, 1], "deadline_step": [6, None, 9, 8], "preemptible": [True] * 4}


# -- a share below all (or above none) never prints as all (or none) ---------------------------------------------


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.integers(2, 10**9).flatmap(lambda n: st.tuples(st.integers(1, n - 1), st.just(n))),
       st.sampled_from([(".0f", 100), (".1f", 100), (".2f", 1), (".3g", 1)]))
def test_a_share_strictly_between_none_and_all_never_prints_as_either(k_of_n, how):
    """A share is k of n (deadlines met of those with one), 0 < k < n."""
    (k, n), (spec, scale) = k_of_n, how
    v = k / n
    text = M.share_text(v, spec, scale)
    assert 0 < float(text) < scale, (v, spec, text)
    # (only as many digits more as that takes: within the rounding of the digits shown)
    digits = len(text.split(".")[1]) if "." in text else 0
    assert abs(float(text) - v * scale) <= 10.0 ** -digits * scale, (v, spec, text)


def test_exact_shares_print_as_before():
    assert [M.share_text(v, ".0f", 100) for v in (0.0, 0.5, 1.0)] == ["0", "50", "100"]
    assert M.share_text(0.25, ".2f") == "0.25" and M.share_text(0.5, ".3g") == "0.5"


def _sweep_csv(path, attainment: float, p99: float = 30) -> None:
    columns = ["trace", "replicate", "policy", "kv_blocks", "aging_interval", "offered_load", "requests", "finished",
               "unfinished", "ttft_p50", "ttft_p99", "queue_wait_p99", "e2e_p99", "slo_attainment", "starvation",
               "fairness_jain", "preemptions"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for policy in ("fcfs", "deadline"):
            w.writerow(["gone", 0, policy, 60, "", 0.9, 1000, 1000, 0, 3, p99, 20, 90, attainment, 40, 0.8, 2])


def test_the_report_table_never_shows_attainment_below_all_as_100_percent(tmp_path):
    """Before: `{100 * att:.0f}%` showed 996 of 1,000 deadlines met as "(100%)", which reads as all met; 0.4% met
    as "(0%)", none.  After: "(99.6%)" and "(0.4%)"; exactly all is still "(100%)"."""
    for attainment, want in ((0.996, "(99.6%)"), (0.004, "(0.4%)"), (1.0, "(100%)")):
        _sweep_csv(tmp_path / "s.csv", attainment)
        assert main(["report", str(tmp_path / "s.csv"), "--out", str(tmp_path / "r")]) == 0
        page = (tmp_path / "r" / "index.html").read_text()
        assert page.count(want) == 2, (attainment, want)


def test_the_report_table_prints_a_p99_of_many_steps_in_full(tmp_path):
    """Before: `.4g` showed a P99 TTFT of 123,456 steps as "1.235e+05" (and 12,345 as "1.234e+04")."""
    for p99 in (123456, 12345):
        _sweep_csv(tmp_path / "s.csv", 0.5, p99)
        assert main(["report", str(tmp_path / "s.csv"), "--out", str(tmp_path / "r")]) == 0
        assert (tmp_path / "r" / "index.html").read_text().count(f"{p99} (50%)") == 2


def test_the_summary_never_shows_fairness_below_1_as_1():
    """Before: Jain fairness 0.996 (classes not served equally) printed "1.00", which reads as perfectly fair."""
    m = simulate(ROWS, "fcfs", 4).metrics
    for v, want in ((0.996, "0.996"), (0.9999, "0.9999"), (0.5, "0.50"), (1.0, "1"), (math.nan, "-")):
        m["fairness_jain"] = v
        assert dict(M.summary_rows(m))["fairness (Jain, classes)"] == want


def test_the_sweep_table_never_shows_a_miss_rate_below_1_as_1():
    """Before: `.3g` printed a deadline miss rate of 0.9996 (4 in 10,000 met) as "1": every deadline missed."""
    rows = [{"trace": "t", "policy": "fcfs", "deadline_miss_rate": v} for v in (0.9996, 1.0, 0.00004)]
    cells = [line.split()[-1] for line in format_rows(rows).splitlines()[1:]]
    assert cells == ["0.9996", "1", "4e-05"]


# -- a checkpoint keys each setting as the replay takes it ----------------------------------------------------------


@pytest.mark.parametrize("first, again", [(np.int64(5), 5), (5, np.int32(5)), (2**61, 2**70)])
def test_a_sweep_resumes_whatever_integer_type_max_steps_came_in(tmp_path, first, again):
    """Before: the key hashed `repr(max_steps)`, so `np.int64(5)` (a value from a NumPy computation) and `5` keyed
    different sweeps and a resumed run computed every row again; and so did two limits beyond any replay."""
    traces = [load_trace(ROWS)]
    ck = tmp_path / "m.csv.partial.jsonl"
    rows = C.run_local(traces, grid(1, ["fcfs", "aging"], [4, 6], [2], max_steps=first), chunk_size=1,
                       checkpoint_path=ck, keep_checkpoint=True)
    resumed = grid(1, ["fcfs", "aging"], [4, 6], [2], max_steps=again)
    assert C.sweep_key(traces, resumed) == C.sweep_key(traces, grid(1, ["fcfs", "aging"], [4, 6], [2],
                                                                     max_steps=first))
    saved = C.read_checkpoint(ck, C.sweep_key(traces, resumed), len(resumed))
    assert str([saved[i] for i in range(len(resumed))]) == str(rows)  # (str: NaN == NaN)


def test_the_key_still_tells_different_settings_apart():
    traces = [load_trace(ROWS)]
    keys = {C.sweep_key(traces, [Scenario(0, "fcfs", kv, None, steps)]) for kv in (4, 5) for steps in (None, 3, 4)}
    assert len(keys) == 6
    assert C.sweep_key(traces, [Scenario(0, np.str_("fcfs"), 4)]) == C.sweep_key(traces, [Scenario(0, "fcfs", 4)])


# -- a result's metrics are the caller's own ------------------------------------------------------------------------


def test_editing_a_results_metrics_changes_nothing_the_result_shows():
    """Before: `result.metrics` was the dict the result kept: flattening it in a notebook (`m["ttft"] =
    m["ttft"]["p50"]`) made the result's display raise TypeError ('float' object is not subscriptable)."""
    result = simulate(ROWS, "fcfs", 4)
    shown = result._repr_html_()
    mine = result.metrics
    mine["ttft"] = mine["ttft"]["p50"]
    mine.pop("per_class")
    assert result.metrics is mine  # (the caller's dict stays theirs: computed once, not copied each access)
    assert result._repr_html_() == shown
    batch = simulate_batch([ROWS], grid(1, ["fcfs"], [4], [2]))
    assert str(batch.metrics(0)) == str(simulate(ROWS, "fcfs", 4).metrics)


def test_the_summary_prints_seconds_beyond_1000_in_full():
    """Before: `.3g` printed a P99 of 2,295 s as "2.3e+03" and 1,192 s as "1.19e+03" beside "803" in one column
    (the Azure trace at load 1.2): exponent notation, and 2,295 read as 2,300.  After: "2295", "1192"."""
    m = simulate(load_trace(ROWS, steps_per_second=0.001), "fcfs", 4).metrics  # (1 step is 1,000 s)
    rows = dict(M.summary_rows(m))
    for name in ("queue_wait", "ttft", "e2e"):
        for p in ("p50", "p95", "p99"):
            text, want = rows[f"{name} {p.upper()} (s)"], m[name][p] * 1000
            assert "e" not in text and (want < 1000 or text == f"{want:.0f}"), (name, p, text, want)
    assert rows["starvation, max wait (s)"] == f"{m['starvation'] * 1000:.0f}"


def test_a_results_settings_are_plain_python_values_whatever_came_in():
    """Before: `result.max_steps` kept a NumPy int given to `simulate` or `grid` (`json.dumps` of a result's settings
    raised TypeError), where `free_kv_blocks` and `aging_interval` were made Python ints."""
    import json

    one = simulate(ROWS, "fcfs", np.int64(4), aging_interval=np.int16(2), max_steps=np.int64(3))
    batch = simulate_batch([ROWS], grid(1, ["fcfs"], [np.int64(4)], [np.int64(2)], max_steps=np.uint8(3)))
    for r in (one, batch.result(0)):
        settings_ = (r.free_kv_blocks, r.aging_interval, r.max_steps)
        assert [type(v) for v in settings_] == [int, int, int] and json.dumps(settings_) == "[4, 2, 3]"


def test_a_resumed_sweep_says_how_many_scenarios_it_took_from_its_checkpoint(tmp_path, monkeypatch, capsys):
    """Before: a rerun after Ctrl-C printed "8 scenarios over 1 trace in 6.61 s", as if it had run all 8 in that
    time, and nothing said it resumed.  After: the last line says how many it took from the checkpoint."""
    from decodesched import batch as B

    load_trace(ROWS).to_csv(tmp_path / "t.csv")
    argv = ["sweep", str(tmp_path / "t.csv"), "--policy", "fcfs,aging", "--kv-blocks", "4,6", "--aging-interval", "2",
            "--chunk-size", "1", "--out", str(tmp_path / "m.csv")]
    real, calls = B.simulate_batch, []

    def stopping(*a, **k):  # Ctrl-C in the third chunk
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(B, "simulate_batch", stopping)
    assert main(argv) == 130
    monkeypatch.setattr(B, "simulate_batch", real)
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"\(cpu, \d+ threads?; 2 resumed from the checkpoint\); wrote", out.splitlines()[-1])
    assert main(argv) == 0  # (a fresh sweep says nothing of it)
    assert "resumed from" not in "".join(capsys.readouterr())
