"""Stop 62, every command under concurrency: an output name checked at the start (`_io.check_outputs`) that became a
symbolic link to an input while the command ran (`ln -sf trace.csv metrics.csv` during a sweep) had the input
overwritten, exit 0; one that became a link to another output of the same command (`simulate --events e.csv
--requests r.csv`, e.csv -> r.csv) lost the events table, exit 0.  `report --help` said "(default 4)" of
--aging-interval, whose default is None (a sweep of intervals 2 and 8 was cut at 2).  A sweep stopped by SIGTERM
or SIGHUP said "interrupted", where every other command's line says "terminated (SIGTERM)" (docs/install.md)."""

from __future__ import annotations

import argparse
import re
import signal
from pathlib import Path

from decodesched._io import Terminated
from decodesched.cli import build_parser

import decodesched.commands.simulate as simulate_command
import decodesched.commands.sweep as sweep_command

from test_cli_hostile3 import TRACE, one_line, run


def _then_link(monkeypatch, module, name: str, link: Path, target: Path) -> None:
    """`module.name`, the command's work between its checks and its writes, followed by `link` -> `target`: another
    process replacing an output by a symbolic link while the command runs."""
    work = getattr(module, name)

    def work_then_link(*args, **kwargs):
        done = work(*args, **kwargs)
        link.unlink(missing_ok=True)
        link.symlink_to(target.name)
        return done

    monkeypatch.setattr(module, name, work_then_link)


def test_a_sweep_output_that_becomes_a_link_to_its_trace_leaves_the_trace_as_it_was(tmp_path, monkeypatch):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    out = tmp_path / "m.csv"
    _then_link(monkeypatch, sweep_command, "_run_local", out, trace)
    code, _, err = run(["sweep", str(trace), "--policy", "fcfs", "--kv-blocks", "4", "--out", str(out),
                        "--no-progress"])
    assert code == 2
    assert "m.csv: became an input of this command while the command ran" in one_line(err)
    assert trace.read_text() == TRACE
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_simulate_output_that_becomes_a_link_to_its_other_output_writes_neither(tmp_path, monkeypatch):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    events, requests = tmp_path / "e.csv", tmp_path / "r.csv"
    requests.write_text("kept\n")
    _then_link(monkeypatch, simulate_command, "simulate", events, requests)
    code, _, err = run(["simulate", str(trace), "--policy", "fcfs", "--kv-blocks", "4", "--events", str(events),
                        "--requests", str(requests)])
    assert code == 2
    assert "became the same file as another output" in one_line(err)
    assert requests.read_text() == "kept\n"  # (not the requests table under the events' name, nor the events)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.csv", "r.csv", "t.csv"]


def _options(parser, words=("decodesched",)):
    """(command words, argparse action, help text as printed) of every option and operand of every command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*words, name))
        elif action.help and action.help is not argparse.SUPPRESS:
            yield " ".join(words), action, action.help % {"default": action.default}


NUMBERS = r"-?\d+(?:\.\d+)?(?:,-?\d+(?:\.\d+)?)*"


def test_every_default_a_help_text_states_is_the_options_real_default():
    stated = 0
    for command, action, text in _options(build_parser()):
        real = list(action.default) if isinstance(action.default, (list, tuple)) else [action.default]
        for m in re.finditer(rf"\(default:? ({NUMBERS})[;)]", text):  # "(default 4)", "(default 0,1,2)"
            stated += 1
            assert real == [float(x) for x in m.group(1).split(",")], (command, action.option_strings, text)
        for m in re.finditer(r"(\w+) \(default\)", text):  # "fast (default) or the scan baseline"
            stated += 1
            assert action.default == m.group(1), (command, action.option_strings, text)
    assert stated >= 15  # (the pattern still finds the help texts' defaults)


def _stopped(*args, **kwargs):
    raise Terminated(signal.SIGTERM)


def test_a_sweep_stopped_by_sigterm_says_terminated_as_every_command_does(tmp_path, monkeypatch):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    argv = ["sweep", str(trace), "--policy", "fcfs", "--kv-blocks", "4", "--out", str(tmp_path / "m.csv"),
            "--no-progress"]
    monkeypatch.setattr(sweep_command, "_run_local", _stopped)  # (while the scenarios run)
    code, _, err = run(argv)
    assert (code, one_line(err)) == (143, "decodesched sweep: terminated (SIGTERM) before any scenario finished; "
                                          "nothing was saved")
    monkeypatch.undo()
    monkeypatch.setattr(sweep_command, "write_metrics_csv", _stopped)  # (while the CSV is written)
    code, _, err = run(argv)
    assert code == 143 and one_line(err).startswith("decodesched sweep: terminated (SIGTERM) while writing ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv.partial.jsonl", "t.csv"]
