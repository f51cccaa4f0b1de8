"""`decodesched report` on sweeps that are odd but legal: bounded figures however many traces the sweep has."""

from __future__ import annotations

import csv

from decodesched.cli import main
from decodesched.commands.report import EPILOG
from decodesched.report import MAX_PANEL_COLUMNS

COLUMNS = ["trace", "replicate", "policy", "kv_blocks", "aging_interval", "offered_load", "requests", "finished",
           "unfinished", "ttft_p50", "ttft_p99", "queue_wait_p99", "e2e_p99", "slo_attainment", "starvation",
           "fairness_jain", "preemptions"]


def _sweep(path, traces: int) -> None:
    """A sweep of `traces` traces whose files are nowhere (each its own family), load from the CSV."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for t in range(traces):
            for policy in ("fcfs", "aging"):
                for kv in (60, 120):
                    w.writerow([f"gone{t}", 0, policy, kv, 4 if policy == "aging" else "", 0.5 + t / 10, 20, 19, 1,
                                3 + t, 30 + t + kv / 60, 20, 90, 0.9, 40, 0.8, 2])


def test_a_sweep_of_many_traces_draws_a_bounded_number_of_panel_columns(tmp_path, capsys):
    """Before: one column of panels per trace, 4.6 inches each: 100 traces without sidecars drew for ten minutes,
    2,500 (a 100,000-row sweep) did not finish.  After: at most MAX_PANEL_COLUMNS columns, the rest named."""
    from PIL import Image

    traces = MAX_PANEL_COLUMNS + 8
    _sweep(tmp_path / "s.csv", traces)
    assert main(["report", str(tmp_path / "s.csv"), "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert f"first {MAX_PANEL_COLUMNS} of {traces} trace families" in err
    page = (tmp_path / "r" / "index.html").read_text()
    assert f"gone{traces - 1}" in page  # every trace still has its table row, and is named
    assert f"the first {MAX_PANEL_COLUMNS};" in EPILOG  # (--help says so, in words of its own)
    for name in ("latency_vs_load", "ttft_vs_capacity"):
        with Image.open(tmp_path / "r" / f"{name}.png") as img:
            assert img.width <= MAX_PANEL_COLUMNS * 4.6 * 100 + 50


def test_a_panel_with_no_value_to_draw_says_so(tmp_path, monkeypatch, capsys):
    """Before: a metric column whose cells are all nan drew empty panels with x ticks about 0 (-0.04..0.04),
    which look like data at load 0.  After: the panel says there is no value to draw; censored (inf) is not empty."""
    from decodesched import report

    _sweep(tmp_path / "s.csv", 2)
    rows = list(csv.reader((tmp_path / "s.csv").read_text().splitlines()))
    col, inf_col = COLUMNS.index("ttft_p50"), COLUMNS.index("e2e_p99")
    for r in rows[1:]:
        r[col], r[inf_col] = "nan", "inf"
    with open(tmp_path / "s.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    texts = {}
    save = report._save

    def spy(fig, out, plot):
        texts[plot.name] = [t.get_text() for ax in fig.axes for t in ax.texts]
        return save(fig, out, plot)

    monkeypatch.setattr(report, "_save", spy)
    assert main(["report", str(tmp_path / "s.csv"), "--out", str(tmp_path / "r")]) == 0
    capsys.readouterr()
    said = texts["latency_vs_load"]
    assert sum("no value of ttft_p50 to draw" in t for t in said) == 2  # one panel per trace (family)
    assert not any("e2e_p99 to draw" in t for t in said)
    assert any("inf (censored)" in t for t in said)
