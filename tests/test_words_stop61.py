"""The words a user reads across commands: counts in the singular for one, a failed scenario of a batch named with
the settings its policy reads, a trace name that holds a newline shown on one line, and a sweep CSV that Excel
saved with its ``sep=,`` line read by `report`."""

from __future__ import annotations

import pytest

from decodesched import batch as B
from decodesched import cli
from decodesched import convert as cv
from decodesched.policy import resolve_policy
from decodesched.report import read_sweep
from decodesched.trace import load_trace

FAILING_POLICY = """
import numba
from decodesched import Policy

@numba.njit
def key(r, clock):
    if clock > 5:
        raise ValueError("clock past 5")
    return (r.phase, r.max_new_tokens - r.generated_len)

@numba.njit
def priority(r, clock):
    return r.priority

MINE = Policy("fails_late", key=key, effective_priority=priority)
"""


def _trace(path, requests: int):
    cv.to_trace(cv.read_azure(cv.bundled_trace_path()).head(requests), steps_per_second=50.0,
                name=path.stem).to_csv(path)
    return path


def _main(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_one_request_and_one_kv_block_are_said_in_the_singular(tmp_path, capsys):
    """Before: "one: 1 requests, policy fcfs, 1 KV blocks; 1 steps ..."."""
    one = _trace(tmp_path / "one.csv", 1)
    code, out, err = _main(capsys, "simulate", one, "--policy", "fcfs", "--kv-blocks", 1)
    assert code == 0, err
    title = out.splitlines()[0]
    assert title.startswith("one: 1 request, policy fcfs, 1 KV block; ") and " 1 steps " not in title
    code, out, err = _main(capsys, "simulate", one, "--policy", "fcfs", "--kv-blocks", 2)
    assert code == 0 and out.startswith("one: 1 request, policy fcfs, 2 KV blocks; ")
    # (convert said it right before; it now says it with the same helper)
    code, out, err = _main(capsys, "trace", "convert", "bundled", "--steps-per-second", 10, "--requests", 1,
                           "--out", tmp_path / "c.csv")
    assert code == 0, err
    assert "(1 request, " in out


def test_a_sweep_of_one_scenario_says_one_scenario(tmp_path, capsys):
    """Before: "1 scenarios over 1 trace in ..."."""
    two = _trace(tmp_path / "two.csv", 2)
    code, out, err = _main(capsys, "sweep", two, "--policy", "fcfs", "--kv-blocks", 60, "--threads", 1,
                           "--no-progress", "--out", tmp_path / "m.csv")
    assert code == 0, err
    assert out.splitlines()[-1].startswith("1 scenario over 1 trace in ") and "cpu, 1 thread)" in out


def test_a_batch_names_the_scenario_a_user_policy_failed_in_without_an_interval_it_ignores(tmp_path):
    """Before: `simulate_batch` raised "policy 'fails_late' raised ValueError ..." naming no scenario; a sweep's line
    named it, with an "aging_interval 4" that a user policy ignores."""
    (tmp_path / "fails_late.py").write_text(FAILING_POLICY)
    bad = resolve_policy(f"{tmp_path / 'fails_late.py'}:MINE")
    traces = [load_trace(_trace(tmp_path / "az.csv", 24))]
    scenarios = B.grid(traces, ["fcfs", bad], [60, 200], [4], max_steps=500)
    with pytest.raises(B.ScenarioError) as info:
        B.simulate_batch(traces, scenarios, threads=1)
    message = str(info.value)
    index = info.value.index
    assert scenarios[index].policy is bad and "\n" not in message
    assert message.startswith(f"scenario {index} (trace 'az', free_kv_blocks {scenarios[index].free_kv_blocks}, "
                              "max_steps 500): policy 'fails_late' raised ValueError")
    assert "aging_interval" not in message
    assert str(info.value.in_sweep(7)).startswith(f"scenario 7 (trace 'az', free_kv_blocks "
                                                  f"{scenarios[index].free_kv_blocks}, max_steps 500): policy ")


def test_a_trace_name_with_a_newline_is_shown_on_one_line(tmp_path, capsys):
    """Before: simulate's title, the sweep's table and the "wrote" lines of sweep and trace convert printed a name
    from a file name raw, across two lines."""
    path = _trace(tmp_path / "a\nb.csv", 3)
    code, out, err = _main(capsys, "simulate", path, "--policy", "fcfs", "--kv-blocks", 60)
    assert code == 0, err
    assert out.splitlines()[0].startswith("'a\\nb': 3 requests, policy fcfs, 60 KV blocks; ")
    code, out, err = _main(capsys, "sweep", path, "--policy", "fcfs", "--kv-blocks", 60, "--threads", 1,
                           "--no-progress", "--out", tmp_path / "m\n.csv")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 3 and lines[1].startswith("'a\\nb'  fcfs ") and lines[2].endswith("m\\n.csv'")
    assert (tmp_path / "m\n.csv").is_file()
    code, out, err = _main(capsys, "trace", "convert", "bundled", "--steps-per-second", 10, "--requests", 2,
                           "--out", tmp_path / "c\nd.csv")
    assert code == 0, err
    assert out.count("\n") == 1 and out.startswith("wrote '") and "c\\nd.csv.meta.json'\n" in out


def _sweep_csv(tmp_path, capsys):
    out = tmp_path / "m.csv"
    code, _, err = _main(capsys, "sweep", _trace(tmp_path / "az.csv", 6), "--policy", "fcfs,deadline",
                         "--kv-blocks", 60, "--threads", 1, "--no-progress", "--out", out)
    assert code == 0, err
    return out


def test_report_reads_a_sweep_csv_that_excel_saved_with_its_separator_line(tmp_path, capsys):
    """Before: a first line ``sep=,`` was the header: "not a sweep metrics CSV (no column trace, policy, ...)"."""
    plain = _sweep_csv(tmp_path, capsys)
    excel = tmp_path / "excel.csv"
    excel.write_text("sep=,\n" + plain.read_text())
    assert str(read_sweep(excel)) == str(read_sweep(plain))
    # a bad row is still named by its line in the file
    lines = plain.read_text().splitlines()
    excel.write_text("\n".join(["sep=,", *lines[:2], lines[2] + ",1"]) + "\n")
    code, out, err = _main(capsys, "report", excel, "--out", tmp_path / "r")
    assert code == 2 and err.count("\n") == 1
    assert "line 4: " in err and "cells, the header has" in err


def test_report_names_another_separator_in_one_line(tmp_path, capsys):
    """Before: "sep=;" was read as the header: "not a sweep metrics CSV (no column trace, policy, ...)"."""
    plain = _sweep_csv(tmp_path, capsys)
    semi = tmp_path / "semi.csv"
    semi.write_text("sep=;\n" + plain.read_text().replace(",", ";"))
    code, out, err = _main(capsys, "report", semi, "--out", tmp_path / "r")
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "r").exists()
    assert "separated by ';'" in err and "no column" not in err
    semi.write_text(plain.read_text().replace(",", ";"))  # (without the line: its header is one column)
    code, out, err = _main(capsys, "report", semi, "--out", tmp_path / "r")
    assert code == 2 and err.count("\n") == 1
    assert err.rstrip().endswith("(its header is one column separated by ';'; a sweep metrics CSV is separated by "
                                 "commas)")


def test_the_demo_says_one_kv_block_and_names_its_folder_on_one_line(tmp_path, capsys):
    """Before: "... 2 requests, offered load 0.8, 1 KV blocks" and "wrote d<newline>x/ttft_cdf.png ..." across
    lines."""
    code, out, err = _main(capsys, "demo", "--requests", 2, "--kv-blocks", 1, "--out", tmp_path / "d\nx")
    assert code == 0, err
    assert "1 KV block, aging interval 4" in err and "1 KV blocks" not in out + err
    lines = out.splitlines()
    assert lines[0].startswith("Azure LLM 2023 conversation trace: 2 requests, offered load 0.8, 1 KV block; ")
    assert lines[-1].startswith("wrote '") and lines[-1].count("d\\nx/") == 2


def test_replicate_rules_name_a_trace_with_a_newline_on_one_line(tmp_path):
    """Before: "trace a<newline>b: its replicate rules ..." printed the name raw, across two lines."""
    trace = load_trace(_trace(tmp_path / "a\nb.csv", 3))
    with pytest.raises(B.UserError) as info:
        B.replicate_traces([trace], 2, [{"seed": -1}])
    assert str(info.value).startswith("trace 'a\\nb': its replicate rules ") and "\n" not in str(info.value)
