"""`decodesched report` on a large sweep: the CSV is read row by row and only the columns the figures and
tables use are kept, so memory stays near the file's size (it was about 20 times it: a 56 MB sweep took
1.2 GB), and the report is the same one, byte for byte."""

from __future__ import annotations

import csv
import re
import tracemalloc

import pytest

from decodesched import convert as cv
from decodesched import report
from decodesched.batch import grid, simulate_batch, write_metrics_csv
from decodesched.cli import main
from decodesched.errors import UserError
from decodesched.report import REPORT_COLUMNS, build_report, read_sweep
from decodesched.trace import load_trace

POLICIES = ["fixed_priority", "aging", "deadline", "fcfs"]


@pytest.fixture(scope="module")
def big_sweep(tmp_path_factory):
    """Three converted traces (with sidecars) and their sweep over 60 capacities: 900 rows, ~140 columns."""
    d = tmp_path_factory.mktemp("big_sweep")
    raw = cv.read_azure(cv.bundled_trace_path()).head(20)
    paths = []
    for load in (0.7, 1.0, 1.4):
        paths.append(d / f"azure_load{load}.csv")
        cv.write_trace(cv.to_trace(raw, load=load), paths[-1], {"options": {"load": load}, "source": "bundled"})
    traces = [load_trace(p) for p in paths]
    batch = simulate_batch(traces, grid(traces, POLICIES, list(range(40, 640, 10)), [2, 4]))
    write_metrics_csv(batch.rows(), d / "metrics.csv")
    return d


def test_reading_a_sweep_for_the_report_holds_little_more_than_the_file(big_sweep):
    path = big_sweep / "metrics.csv"
    size = path.stat().st_size
    assert size > 500_000
    tracemalloc.start()
    try:
        rows = read_sweep(path, REPORT_COLUMNS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(rows) == 900
    assert peak < 4 * size, f"{peak / size:.1f} times the CSV's size"  # (it was 20 times)
    full = read_sweep(path)  # every column, for the callers that want them
    assert len(full[0]) > len(rows[0]) and all(r.items() <= f.items() for r, f in zip(rows, full)
                                               if not any(v != v for v in r.values()))


def test_the_report_from_the_kept_columns_is_the_report_from_every_column(big_sweep, tmp_path, monkeypatch):
    """Guards `REPORT_COLUMNS`: a figure or table reading a column it does not keep would say 'no column'."""
    build_report(tmp_path / "kept", results=big_sweep / "metrics.csv", warn=pytest.fail)
    monkeypatch.setattr(report, "REPORT_COLUMNS", re.compile(r".*", re.S))
    build_report(tmp_path / "all", results=big_sweep / "metrics.csv", warn=pytest.fail)
    kept = sorted(p.name for p in (tmp_path / "kept").iterdir())
    assert kept == sorted(p.name for p in (tmp_path / "all").iterdir()) and "index.html" in kept
    for name in kept:
        assert (tmp_path / "kept" / name).read_bytes() == (tmp_path / "all" / name).read_bytes(), name


@pytest.mark.parametrize("column, cell", [("tpot_p99", "x1"), ("events", "1e300"), ("e2e_max_s", "4_0")])
def test_a_bad_cell_in_a_column_the_report_does_not_keep_is_still_refused(big_sweep, tmp_path, capsys, column, cell):
    rows = list(csv.reader((big_sweep / "metrics.csv").read_text().splitlines()))
    assert not REPORT_COLUMNS.fullmatch(column)
    rows[700][rows[0].index(column)] = cell
    bad = tmp_path / "metrics.csv"
    with open(bad, "w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)
    for f in big_sweep.iterdir():
        if f.name.startswith("azure_load"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    with pytest.raises(UserError, match=f"line 701, column {column}: "):
        read_sweep(bad, REPORT_COLUMNS)
    assert main(["report", str(bad), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"line 701, column {column}" in err
    assert not (tmp_path / "rep").exists()
