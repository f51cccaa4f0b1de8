"""Option values and inputs at the edges of their ranges: every command answers exit 2 and one line
(naming the option), or does the work; never a traceback, never a half-done output."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import decodesched
from decodesched.cli import main
from decodesched.errors import UserError
from decodesched.trace import TRACE_COLUMNS

TRACE = ["1,0,4,3,0,false,2,,true", "2,0,2,2,5,true,3,10,true", "3,1,3,4,1,false,4,6,false",
         "-4,2,5,1,-2,false,1,,true"]
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n" \
        "2023-11-16 18:15:50.99,396,109\n2023-11-16 18:15:51.5,100,1\n"


@pytest.fixture
def trace_csv(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(",".join(TRACE_COLUMNS) + "\n" + "\n".join(TRACE) + "\n")
    return p


@pytest.fixture
def azure_csv(tmp_path):
    p = tmp_path / "az.csv"
    p.write_text(AZURE)
    return p


def run(args) -> int:
    """`main(args)`'s exit status (argparse's usage errors leave it through SystemExit)."""
    try:
        return main(args)
    except SystemExit as exc:
        return exc.code


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("load, why", [("1e308", "out of range"), ("1e-308", "out of range"),
                                       ("inf", "expected a positive number"), ("nan", "expected a positive number"),
                                       ("1_0", "expected a positive number"), ("\u0663", "expected a positive number"),
                                       ("-1", "expected a positive number"), ("0", "expected a positive number")])
def test_a_load_outside_what_a_trace_can_take_names_the_option(azure_csv, tmp_path, capsys, load, why):
    out = tmp_path / "cv.csv"
    assert run(["trace", "convert", str(azure_csv), "--load", load, "--out", str(out)]) == 2
    line = error_line(capsys)
    assert "--load" in line and why in line and "<arrays>" not in line
    assert not out.exists()


def test_huge_priority_weights_are_weights_like_any_other(azure_csv, tmp_path, capsys):
    """Their sum overflows to inf; their ratios are what count (here all equal)."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    assert run(["trace", "convert", str(azure_csv), "--load", "1", "--priority-weights", "1e308,1e308,1e308",
                 "--out", str(a)]) == 0
    assert run(["trace", "convert", str(azure_csv), "--load", "1", "--priority-weights", "1,1,1",
                 "--out", str(b)]) == 0
    assert a.read_text() == b.read_text()


@pytest.mark.parametrize("option, value", [("--kv-blocks", "1_000"), ("--kv-blocks", "\u0663"),
                                           ("--aging-interval", "4,1e3"), ("--replicates", "\u0662"),
                                           ("--max-steps", "1_0"), ("--chunk-size", "+ 3")])
def test_sweep_reads_whole_numbers_as_strictly_as_simulate(trace_csv, tmp_path, capsys, option, value):
    out = tmp_path / "s.csv"
    args = ["sweep", str(trace_csv), "--policy", "aging", "--kv-blocks", "5", "--out", str(out), option, value]
    assert run(args) == 2
    assert option in error_line(capsys) and not out.exists()


@pytest.mark.parametrize("load", ["inf", "nan", "-1", "1e999"])
def test_report_refuses_a_load_that_is_not_a_positive_number(trace_csv, tmp_path, capsys, load):
    sweep = tmp_path / "sw.csv"
    assert run(["sweep", str(trace_csv), "--policy", "aging", "--kv-blocks", "3,5", "--out", str(sweep)]) == 0
    capsys.readouterr()
    assert run(["report", str(sweep), "--out", str(tmp_path / "rep"), "--load", load]) == 2
    assert "--load" in error_line(capsys) and not (tmp_path / "rep").exists()


def test_an_event_log_larger_than_memory_is_refused_before_the_replay(tmp_path, capsys):
    """2**40 tokens to generate is within the trace limits; its log of 2**40 rows is not within any
    machine's memory: one line naming the ways out, in the API too."""
    p = tmp_path / "big.csv"
    p.write_text(",".join(TRACE_COLUMNS) + "\n1,0,4,1099511627776,0,false,2,,true\n")
    ev = tmp_path / "ev.csv"
    assert run(["simulate", str(p), "--policy", "fcfs", "--kv-blocks", "5", "--events", str(ev),
                 "--max-steps", "100000000000"]) == 2
    line = error_line(capsys)
    assert "event log" in line and "--max-steps" in line and not ev.exists()
    with pytest.raises(UserError, match="record_events=False"):
        decodesched.simulate(p, "fcfs", 5)
    with pytest.raises(UserError, match="record_events=False"):
        decodesched.simulate_batch([p], decodesched.grid([p], ["fcfs"], [5], [4]), record_events=True)
    r = decodesched.simulate(p, "fcfs", 5, max_steps=10)  # a short window of it is fine
    assert r.n_events == 10


def test_a_file_name_that_is_not_utf8_is_printed_escaped_on_a_strict_utf8_stdout(trace_csv, tmp_path):
    name = os.fsencode(tmp_path) + b"/bad\xff.csv"
    os.link(trace_csv, name)
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    for args in (["simulate", name, "--policy", "aging", "--kv-blocks", "5"],
                 ["sweep", name, "--policy", "aging", "--kv-blocks", "5", "--out", os.fsencode(tmp_path) + b"/s.csv"]):
        proc = subprocess.run([sys.executable, "-m", "decodesched.cli", *args], capture_output=True, env=env)
        assert proc.returncode == 0, proc.stderr
        assert b"bad\\xff" in proc.stdout and b"Traceback" not in proc.stderr
    assert "bad\\xff" in (tmp_path / "s.csv").read_text(encoding="utf-8")


def test_a_batch_result_is_picked_by_an_index_in_range(trace_csv):
    batch = decodesched.simulate_batch([trace_csv], decodesched.grid([trace_csv], ["aging", "fcfs"], [5], [4]))
    assert batch.result(-1).policy == "fcfs" and batch.result(np.int64(0)).policy == "aging"
    assert batch.result(-1).metrics == batch.result(1).metrics
    with pytest.raises(IndexError, match="the batch has 2"):
        batch.result(2)
    with pytest.raises(TypeError, match="an integer"):
        batch.result("0")


def test_a_sweep_beyond_memory_is_refused_at_once(trace_csv, tmp_path, capsys):
    """`--replicates 100000000` (a typo's worth of zeros) built replicates for minutes, then swapped or died;
    the grid's result rows alone would take hundreds of GiB: one line, exit 2, before anything is built."""
    out = tmp_path / "sw.csv"
    assert main(["sweep", str(trace_csv), "--policy", "aging", "--kv-blocks", "3", "--aging-interval", "4",
                 "--replicates", "100000000", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the result rows of 100000000 scenarios would take at least" in err and len(err.splitlines()) == 1
    assert not out.exists()
    assert decodesched.batch.grid_size(2, ["aging", "fcfs"], [1, 2], [3, 4], 3) == len(
        decodesched.grid(2, ["aging", "fcfs"], [1, 2], [3, 4], replicates=3))
