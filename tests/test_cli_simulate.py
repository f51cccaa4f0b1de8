"""`decodesched simulate`: the summary table, the files, and bad input (exit 2, one line, no partial file)."""

import csv
import subprocess
import sys

import pytest

from decodesched.cli import main
from decodesched.trace import TRACE_COLUMNS

TRACE = [
    "1,0,4,3,0,false,2,,true",
    "2,1,2,2,2,true,2,8,true",
    "3,1,3,1,1,false,9,,true",  # needs more blocks than exist: unservable
]


@pytest.fixture
def trace_csv(tmp_path):
    p = tmp_path / "trace.csv"
    p.write_text(",".join(TRACE_COLUMNS) + "\n" + "\n".join(TRACE) + "\n")
    return p


def test_prints_a_summary_and_writes_both_files(trace_csv, tmp_path, capsys):
    ev, rq = tmp_path / "ev.csv", tmp_path / "rq.csv"
    code = main(["simulate", str(trace_csv), "--policy", "deadline", "--kv-blocks", "4", "--aging-interval", "2",
                 "--events", str(ev), "--requests", str(rq)])
    out = capsys.readouterr().out
    assert code == 0
    for label in ("queue_wait P50", "ttft P95", "e2e P99", "starvation", "preemptions", "deadline misses",
                  "unservable"):
        assert label in out
    assert "stuck" in out  # request 3 could never run
    with open(ev) as fh:
        events = list(csv.DictReader(fh))
    assert len(events) == (1 + 3) + (1 + 2)
    with open(rq) as fh:
        requests = {r["request_id"]: r for r in csv.DictReader(fh)}
    assert requests["3"]["status"] == "unservable" and requests["3"]["first_step"] == ""


def test_max_steps(trace_csv, tmp_path):
    ev = tmp_path / "ev.csv"
    assert main(["simulate", str(trace_csv), "--policy", "aging", "--kv-blocks", "4", "--aging-interval", "1",
                 "--max-steps", "2", "--events", str(ev)]) == 0
    assert len(ev.read_text().splitlines()) == 1 + 2


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "decodesched.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize("extra, match", [
    (["--kv-blocks", "-1"], "argument --kv-blocks: must be from 0 to 2**61, got -1"),
    (["--kv-blocks", str(2**61 + 1)], f"argument --kv-blocks: must be from 0 to 2**61, got {2**61 + 1}"),
    (["--kv-blocks", "4", "--aging-interval", "0"], "argument --aging-interval: must be from 1 to 2**63 - 1, got 0"),
    (["--kv-blocks", "4", "--max-steps", "-3"], "argument --max-steps: must be >= 0, got -3"),
    (["--kv-blocks", "four"], "expected a whole number, got 'four'"),
    (["--kv-blocks", "1" + "0" * 22], "expected a whole number of at most 19 digits"),
])
def test_bad_options_exit_2_with_one_line(trace_csv, tmp_path, extra, match):
    out = tmp_path / "ev.csv"
    p = run_cli("simulate", str(trace_csv), "--policy", "fixed_priority", *extra, "--events", str(out))
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and match in p.stderr
    assert "Traceback" not in p.stderr and not out.exists()


@pytest.mark.parametrize("args, flag", [
    (["sweep", "{trace}", "--policy", "aging", "--kv-blocks", "4,-1", "--out", "{out}"], "--kv-blocks"),
    (["sweep", "{trace}", "--policy", "aging", "--kv-blocks", "4", "--aging-interval", "8,0", "--out", "{out}"],
     "--aging-interval"),
    (["sweep", "{trace}", "--policy", "aging", "--kv-blocks", "4", "--max-steps", "-1", "--out", "{out}"],
     "--max-steps"),
    (["report", "{trace}", "--out", "{out}", "--kv-blocks", "-5"], "--kv-blocks"),
    (["report", "{trace}", "--out", "{out}", "--aging-interval", "-5"], "--aging-interval"),
])
def test_a_value_out_of_range_is_refused_naming_the_flag(trace_csv, tmp_path, args, flag):
    # These read "free_kv_blocks must be >= 0" (the Python API's keyword) after the trace was loaded: every
    # command now refuses them while parsing, in argparse's words for the flag (as demo did in its own).
    out = tmp_path / "out"
    p = run_cli(*[a.format(trace=trace_csv, out=out) for a in args])
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert f"argument {flag}: must be " in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()


def test_dash_as_the_trace_says_standard_input_is_not_read(tmp_path, monkeypatch):
    # `-` is standard output's word for an output; as the trace it read as a missing file named "-".
    monkeypatch.chdir(tmp_path)  # (no file named "-" there)
    p = run_cli("simulate", "-", "--policy", "fcfs", "--kv-blocks", "4")
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "standard input is not read here" in p.stderr


def test_bad_trace_exits_2_naming_row_and_column(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(",".join(TRACE_COLUMNS) + "\n" + "1,0,4,3,0,false,2,,true\n2,0,4,x,0,false,2,,true\n")
    out = tmp_path / "rq.csv"
    p = run_cli("simulate", str(bad), "--policy", "fcfs", "--kv-blocks", "4", "--requests", str(out))
    assert p.returncode == 2 and "row 2 (line 3), column max_new_tokens" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not out.exists()


def test_control_characters_in_a_name_are_escaped_in_the_error(tmp_path):
    # A terminal acts on ESC and CR: a hostile file name must not rewrite the line or the screen.
    name = tmp_path / "t\x1b[2J\rx.csv"
    p = run_cli("simulate", str(name), "--policy", "fcfs", "--kv-blocks", "4")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "\x1b" not in p.stderr and "\r" not in p.stderr
    assert "t\\x1b[2J x.csv: no such file" in p.stderr  # (CR is whitespace: one space, as a newline)


def test_unwritable_output_leaves_nothing(trace_csv, tmp_path):
    p = run_cli("simulate", str(trace_csv), "--policy", "fcfs", "--kv-blocks", "4",
                "--events", str(tmp_path / "missing-dir" / "ev.csv"))
    assert p.returncode == 2 and "no such directory" in p.stderr
    assert not (tmp_path / "missing-dir").exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["trace.csv"]
