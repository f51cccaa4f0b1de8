"""Sweeps that must not lose work or mix it up, found by the fifth audit: a torn checkpoint line, a
failed final write, the CSV on standard output, thread counts, and long output names.  Each test
runs the command or the runner and checks the files it leaves, not only a message."""

from __future__ import annotations

import csv
import io
import json

import pytest

from decodesched import batch as B
from decodesched import checkpoint as C
from decodesched.cli import main
from decodesched.errors import OutputError
from decodesched.trace import TRACE_COLUMNS, load_trace

TRACE_CSV = ",".join(TRACE_COLUMNS) + """
1,0,4,3,0,false,2,,true
2,0,2,2,5,true,3,10,true
3,1,3,4,1,false,4,6,false
-4,2,5,1,-2,false,1,,true
"""
GRID = ["--policy", "fcfs,aging", "--kv-blocks", "3,4,6", "--aging-interval", "1,4", "--threads", "1"]
N_SCENARIOS = 2 * 3 + 3  # (aging: 2 intervals) + fcfs, at 3 capacities, on one trace
SIMULATE_BATCH = B.simulate_batch


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(TRACE_CSV)
    return path


def _stop_after(monkeypatch, n: int) -> list:
    """`simulate_batch` raises KeyboardInterrupt (Ctrl-C) at its call number n + 1; returns the call log."""
    calls = []

    def stopping(*a, **k):
        calls.append(1)
        if len(calls) > n:
            raise KeyboardInterrupt
        return SIMULATE_BATCH(*a, **k)

    monkeypatch.setattr(B, "simulate_batch", stopping)
    return calls


def test_a_torn_checkpoint_line_is_cut_so_later_resumes_see_their_chunks(trace, tmp_path, monkeypatch):
    """A run killed while writing a chunk leaves a torn last line.  The resumed run appended its records
    right after that fragment (no newline), so every chunk it saved was unreadable to the next resume."""
    traces = [load_trace(trace)]
    scenarios = B.grid(1, ["fcfs", "aging"], [3, 4, 6], [1, 4])
    key = C.sweep_key(traces, scenarios)
    want = B.simulate_batch(traces, scenarios).rows()
    ck = tmp_path / "m.csv.partial.jsonl"
    _stop_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        C.run_local(traces, scenarios, chunk_size=1, checkpoint_path=ck)
    assert len(C.read_checkpoint(ck, key, len(scenarios))) == 2
    last = ck.read_text().splitlines(True)[-1]
    with open(ck, "a") as fh:  # killed while writing its next chunk
        fh.write(last[: len(last) // 2])
    _stop_after(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        C.run_local(traces, scenarios, chunk_size=1, checkpoint_path=ck)
    assert len(C.read_checkpoint(ck, key, len(scenarios))) == 5  # 2 + the 3 this run saved
    assert all(json.loads(line) for line in ck.read_text().splitlines())  # no fragment left in the file
    # a torn line that is whole JSON but lacks its newline: kept, and the next record starts a line
    text = ck.read_text()
    ck.write_text(text[:-1])
    calls = _stop_after(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        C.run_local(traces, scenarios, chunk_size=1, checkpoint_path=ck)
    assert len(calls) == 2 and len(C.read_checkpoint(ck, key, len(scenarios))) == 6
    calls = _stop_after(monkeypatch, 99)
    rows = C.run_local(traces, scenarios, chunk_size=1, checkpoint_path=ck)
    assert len(calls) == len(scenarios) - 6 and not ck.exists()
    assert json.dumps(rows) == json.dumps(want)  # (NaN-safe equality)


def test_a_failed_csv_write_keeps_the_checkpoint_for_the_rerun(trace, tmp_path, monkeypatch, capsys):
    """The checkpoint was removed before the CSV was written: a full disk, a closed pipe or Ctrl-C at
    the final write lost every scenario.  Now the rerun only writes the CSV."""
    from decodesched.commands import sweep as S

    monkeypatch.chdir(tmp_path)  # (short names: the whole line fits in an error line)
    trace = trace.name
    out = tmp_path / "m.csv"
    ck = "m.csv.partial.jsonl"
    real_write = S.write_metrics_csv

    def disk_full(rows, path):
        raise OutputError(f"{path}: cannot write (no space left on the device)")

    monkeypatch.setattr(S, "write_metrics_csv", disk_full)
    assert main(["sweep", str(trace), *GRID, "--out", "m.csv"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no space left" in err and ck in err and "rerun the same command" in err
    key = json.loads((tmp_path / ck).read_text().splitlines()[0])["sweep"]
    assert not out.exists() and len(C.read_checkpoint(ck, key, N_SCENARIOS)) == N_SCENARIOS

    def interrupted(rows, path):
        raise KeyboardInterrupt

    monkeypatch.setattr(S, "write_metrics_csv", interrupted)
    calls = _stop_after(monkeypatch, 99)
    assert main(["sweep", str(trace), *GRID, "--out", "m.csv"]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted while writing" in err and ck in err
    assert not calls and (tmp_path / ck).exists() and not out.exists()  # nothing computed again, nothing lost

    monkeypatch.setattr(S, "write_metrics_csv", real_write)
    assert main(["sweep", str(trace), *GRID, "--out", "m.csv"]) == 0
    assert not calls and not (tmp_path / ck).exists()  # the rerun only wrote the CSV, then removed the checkpoint
    monkeypatch.setattr(B, "simulate_batch", SIMULATE_BATCH)
    assert main(["sweep", str(trace), *GRID, "--out", str(tmp_path / "clean.csv")]) == 0
    assert out.read_bytes() == (tmp_path / "clean.csv").read_bytes()


def test_sweep_to_standard_output_writes_the_csv_alone(trace, tmp_path, capsys):
    """``--out -``: the summary table and the 'wrote -' line went to stdout after the CSV."""
    assert main(["sweep", str(trace), *GRID, "--out", str(tmp_path / "m.csv")]) == 0
    table = capsys.readouterr().out
    assert main(["sweep", str(trace), *GRID, "--out", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out == (tmp_path / "m.csv").read_text()
    assert len(list(csv.reader(io.StringIO(captured.out)))) == N_SCENARIOS + 1
    assert captured.err.splitlines()[:-1] == table.splitlines()[:-1] and "wrote -" in captured.err
    assert not (tmp_path / "-.partial.jsonl").exists()


@pytest.mark.parametrize("threads", ["0", "-1"])
@pytest.mark.parametrize("dask", [[], ["--dask", "local"], ["--dask", "tcp://127.0.0.1:9"]])
def test_threads_below_one_are_refused_with_or_without_dask(trace, tmp_path, capsys, monkeypatch, threads, dask):
    """``--threads 0`` was refused locally, but taken with --dask (the workers clamped it to 1)."""
    calls = _stop_after(monkeypatch, 99)
    argv = ["sweep", str(trace), "--policy", "fcfs", "--kv-blocks", "4", "--threads", threads, *dask]
    assert main([*argv, "--out", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "threads" in err and threads in err
    assert not calls and not (tmp_path / "x.csv").exists()


def test_an_output_name_of_255_bytes_gets_a_short_checkpoint_name(trace, tmp_path, monkeypatch, capsys):
    """docs/files.md allows names of 255 bytes; the checkpoint, OUT.partial.jsonl, is 14 bytes longer,
    and the sweep failed with "<OUT>.partial.jsonl: file name too long"."""
    out = tmp_path / ("m" * 251 + ".csv")
    ck = C.checkpoint_path_for(str(out))
    assert ck != str(out) + ".partial.jsonl" and len(ck.rsplit("/", 1)[1].encode()) < 80
    assert ck.startswith(str(tmp_path) + "/.") and ck == C.checkpoint_path_for(str(out))  # same for every run
    assert C.checkpoint_path_for(str(tmp_path / "m.csv")) == str(tmp_path / "m.csv") + ".partial.jsonl"
    calls = _stop_after(monkeypatch, 1)
    argv = ["sweep", str(trace), *GRID, "--chunk-size", "2", "--out", str(out)]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "2 of 9 scenarios are saved in " + ck in err and err.count("\n") == 1
    calls = _stop_after(monkeypatch, 99)
    assert main(argv) == 0
    assert len(calls) == 4 and out.is_file()  # resumed: 7 scenarios left in chunks of 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["t.csv", out.name])  # no checkpoint left


def test_checkpoint_rows_equal_a_clean_run_after_two_tears(trace, tmp_path, monkeypatch):
    """Stopped, torn and resumed twice (a time-limited batch job), the sweep's CSV equals a clean run's."""
    out = tmp_path / "m.csv"
    ck = tmp_path / "m.csv.partial.jsonl"
    argv = ["sweep", str(trace), *GRID, "--chunk-size", "1", "--out", str(out)]
    for stop in (2, 3):
        _stop_after(monkeypatch, stop)
        assert main(argv) == 130
        last = ck.read_text().splitlines(True)[-1]
        with open(ck, "a") as fh:
            fh.write(last[: len(last) // 3])
    calls = _stop_after(monkeypatch, 99)
    assert main(argv) == 0
    assert len(calls) == N_SCENARIOS - 5
    monkeypatch.undo()
    assert main(["sweep", str(trace), *GRID, "--out", str(tmp_path / "clean.csv")]) == 0
    assert out.read_bytes() == (tmp_path / "clean.csv").read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".jsonl")]
