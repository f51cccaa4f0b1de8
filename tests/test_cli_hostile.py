"""Outputs on a full disk: one line that names the file or folder (the OSError of a full disk, raised
while matplotlib saves a figure or the sweep appends to its checkpoint, names none), exit 2, nothing that
existed damaged, what was computed kept."""

from __future__ import annotations

import errno
import os

import pytest

from decodesched import convert as cv
from decodesched.batch import grid, simulate_batch, write_metrics_csv
from decodesched.cli import main
from decodesched.trace import load_trace


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    raw = cv.read_azure(cv.bundled_trace_path()).head(20)
    for load in (0.8, 1.2):
        cv.write_trace(cv.to_trace(raw, load=load), d / f"azure_load{load}.csv", {"options": {"load": load},
                                                                                  "source": "bundled"})
    traces = [load_trace(d / f"azure_load{load}.csv") for load in (0.8, 1.2)]
    write_metrics_csv(simulate_batch(traces, grid(traces, ["fcfs", "aging"], [60, 120], [4])).rows(),
                      d / "metrics.csv")
    return d


def test_a_report_on_a_full_disk_names_its_folder_and_leaves_it_as_it_was(sweep_dir, tmp_path, capsys, monkeypatch):
    from matplotlib.figure import Figure

    out = tmp_path / "rep"
    out.mkdir()
    (out / "index.html").write_text("the old page")
    monkeypatch.setattr(Figure, "savefig", _full_disk)
    assert main(["report", str(sweep_dir / "metrics.csv"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out}: cannot write the report (no space left on the device)" in err, err
    assert [p.name for p in out.iterdir()] == ["index.html"] and (out / "index.html").read_text() == "the old page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]  # no temporary folder left


def test_a_sweep_whose_checkpoint_fills_the_disk_names_it_and_keeps_what_was_saved(sweep_dir, tmp_path, capsys,
                                                                                   monkeypatch):
    from decodesched import checkpoint

    real_add, calls = checkpoint.Checkpoint.add, []

    def add_then_full(self, indices, rows):
        calls.append(len(rows))
        if len(calls) > 1:
            _full_disk()
        real_add(self, indices, rows)

    monkeypatch.setattr(checkpoint.Checkpoint, "add", add_then_full)
    out = tmp_path / "m.csv"
    args = ["sweep", str(sweep_dir / "azure_load0.8.csv"), "--policy", "fcfs,aging", "--kv-blocks",
            ",".join(str(k) for k in range(40, 200, 4)), "--chunk-size", "16", "--threads", "1", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{out}.partial.jsonl: cannot write the sweep's checkpoint (no space left on the device); " \
           f"{calls[0]} of 80 scenarios are saved in it" in err, err
    assert not out.exists()
    monkeypatch.setattr(checkpoint.Checkpoint, "add", real_add)  # room again: the rerun resumes and finishes
    assert main(args) == 0
    assert out.exists() and not (tmp_path / "m.csv.partial.jsonl").exists()
