"""Stop 57, the CLI as a hostile newcomer: a signal while the command's modules import named no command, an option
the command does not take was refused as `decodesched:`'s, an output named only by an extension (`.csv`) was said
to have none, a URL given as an input was named with a slash lost (`https:/...`: no such file), and a trace with an
old Mac's lone CR line ends was read record by record by the csv module."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import decodesched.trace as trace_module
from decodesched import cli, load_trace
from decodesched._io import Terminated
from decodesched.errors import UserError
from decodesched.trace import TRACE_COLUMNS

from test_cli_hostile3 import TRACE, fuzz_inputs, one_line, run  # noqa: F401 (a fixture)

# ---------------------------------------------------------------- the command's name before its arguments are parsed


@pytest.mark.parametrize("argv, prog", [(["simulate", "t.csv"], "decodesched simulate"),
                                        (["trace", "convert", "bundled"], "decodesched trace convert"),
                                        (["trace", "nosuch"], "decodesched trace"),
                                        (["nosuch", "simulate"], "decodesched")])
@pytest.mark.parametrize("stop, status, said", [(KeyboardInterrupt(), 130, "interrupted"),
                                                (Terminated(15), 143, "terminated (SIGTERM)")])
def test_a_signal_while_the_commands_modules_import_names_the_command(monkeypatch, argv, prog, stop, status, said):
    # Before: "decodesched: interrupted" (and "decodesched: terminated (SIGTERM)") whatever the command.
    def importing():
        raise stop

    monkeypatch.setattr(cli, "build_parser", importing)
    code, out, err = run(argv)
    assert (code, out, err) == (status, "", f"{prog}: {said}\n")


_SIGTERM_AT_NUMPY = textwrap.dedent("""\
    import os, signal, sys

    class Hook:
        def find_spec(self, name, path=None, target=None):
            if name == "numpy":
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGTERM)
            return None

    sys.meta_path.insert(0, Hook())
    from decodesched.cli import main
    sys.exit(main())
""")


def test_a_real_sigterm_while_numpy_imports_names_the_command(tmp_path):
    script = tmp_path / "hook.py"
    script.write_text(_SIGTERM_AT_NUMPY)
    done = subprocess.run([sys.executable, str(script), "simulate", str(tmp_path / "none.csv"), "--policy", "fcfs",
                           "--kv-blocks", "4"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert (done.returncode, done.stderr, done.stdout) == (143, "decodesched simulate: terminated (SIGTERM)\n", "")


def test_the_actions_known_before_parsing_are_the_parsers():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, actions in cli.ACTIONS.items():
        sub = next(a for a in commands[name]._actions if isinstance(a, argparse._SubParsersAction))
        assert tuple(sub.choices) == actions
    assert tuple(commands) == cli.COMMANDS


# ---------------------------------------------------------------- arguments the command does not take


@pytest.mark.parametrize("extra, words", [(["--bogus"], "decodesched simulate: error: unrecognized arguments: --bogus"),
                                          (["--", "--events", "x.csv"],
                                           "decodesched simulate: error: unrecognized arguments: -- --events x.csv")])
def test_an_unknown_argument_is_refused_in_the_commands_name(tmp_path, extra, words):
    # Before: "decodesched: error: unrecognized arguments: ..." (argparse's top-level parser's name).
    (tmp_path / "t.csv").write_text(TRACE)
    code, out, err = run(["simulate", str(tmp_path / "t.csv"), "--policy", "fcfs", "--kv-blocks", "4", *extra])
    assert (code, out, one_line(err)) == (2, "", f"{words} (see --help)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_an_unknown_argument_of_an_action_names_the_action(tmp_path):
    (tmp_path / "t.csv").write_text(TRACE)
    code, out, err = run(["trace", "inspect", str(tmp_path / "t.csv"), "extra"])
    assert (code, out, one_line(err)) == (2, "", "decodesched trace inspect: error: unrecognized arguments: extra "
                                                 "(see --help)")
    code, _, err = run(["--bogus"])
    assert (code, one_line(err)) == (2, "decodesched: error: unrecognized arguments: --bogus (see --help)")


# ---------------------------------------------------------------- an output named only by an extension


def _outputs(tmp_path, name: str) -> dict[str, list[str]]:
    t = str(tmp_path / "t.csv")
    return {"simulate --events": ["simulate", t, "--policy", "fcfs", "--kv-blocks", "4", "--events", name],
            "simulate --requests": ["simulate", t, "--policy", "fcfs", "--kv-blocks", "4", "--requests", name],
            "sweep --out": ["sweep", t, "--policy", "fcfs", "--kv-blocks", "4", "--threads", "1", "--out", name],
            "trace convert --out": ["trace", "convert", "bundled", "--load", "1", "--out", name]}


@pytest.mark.parametrize("name", [".csv", ".CSV", ".parquet", "sub/.csv"])
@pytest.mark.parametrize("output", ["simulate --events", "simulate --requests", "sweep --out", "trace convert --out"])
def test_an_output_name_that_is_only_an_extension_is_refused_as_such(tmp_path, monkeypatch, name, output):
    # Before: "... got no extension" for `.csv`, which reads as the very extension asked for.
    (tmp_path / "t.csv").write_text(TRACE)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    code, out, err = run(_outputs(tmp_path, name)[output])
    line = one_line(err)
    assert code == 2 and out == "" and line.endswith("alone, with no name before it"), line
    assert f"got '{name.split('/')[-1]}' alone" in line
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["sub", "t.csv"]


def test_to_parquet_refuses_a_name_that_is_only_an_extension(tmp_path):
    from decodesched.frames import to_parquet

    (tmp_path / "t.csv").write_text(TRACE)
    with pytest.raises(UserError, match=r"got '\.parquet' alone, with no name before it"):
        to_parquet(load_trace(tmp_path / "t.csv"), str(tmp_path / ".parquet"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_a_name_with_no_extension_is_still_said_so(tmp_path):
    (tmp_path / "t.csv").write_text(TRACE)
    code, _, err = run(_outputs(tmp_path, str(tmp_path / "events"))["simulate --events"])
    assert code == 2 and one_line(err).endswith("got no extension")


# ---------------------------------------------------------------- a folder name that names none (demo, report)


@pytest.mark.parametrize("text, why", [("", ""), ("  ", ""), ("out\0x", " (it holds a NUL character)")])
def test_a_folder_name_that_names_none_is_one_helper(text, why):
    from decodesched._io import folder_name  # (demo's check, and report's to be: written once)

    with pytest.raises(UserError) as caught:
        folder_name(text)
    assert str(caught.value) == f"{text!r}: not a folder name{why}"
    assert folder_name("report/") == "report/"


@pytest.mark.parametrize("there", ["a file", "a broken link"])
def test_demo_and_report_refuse_what_is_at_their_out_folder_in_the_same_words(tmp_path, there):
    # Before: report said "exists and is not a folder" and demo "...; --out names a folder" (`_io.output_folder`)
    (tmp_path / "t.csv").write_text(TRACE)
    out = tmp_path / "out"
    if there == "a file":
        out.write_text("keep me")
    else:
        out.symlink_to(tmp_path / "nowhere")
    said = {}
    for command in (["demo", "--out", str(out)], ["report", "--trace", str(tmp_path / "t.csv"), "--out", str(out)]):
        code, _, err = run(command)
        assert code == 2, err
        said[command[0]] = one_line(err).split(": error: ", 1)[1]
    assert said["demo"] == said["report"], said
    assert said["demo"].endswith("; --out names a folder"), said
    assert out.is_symlink() or out.read_text() == "keep me"


# ---------------------------------------------------------------- an input named as a URL


@pytest.mark.parametrize("url", ["https://example.com/t.csv", "s3://bucket/t.parquet", "file:///tmp/t.csv"])
@pytest.mark.parametrize("command", ["simulate", "sweep", "inspect", "convert"])
def test_an_input_given_as_a_url_is_named_as_given_with_the_fix(tmp_path, url, command):
    # Before: "https:/example.com/t.csv: no such file" (pathlib drops a slash of '//').
    argv = {"simulate": ["simulate", url, "--policy", "fcfs", "--kv-blocks", "4"],
            "sweep": ["sweep", url, "--policy", "fcfs", "--kv-blocks", "4", "--out", str(tmp_path / "m.csv")],
            "inspect": ["trace", "inspect", url],
            "convert": ["trace", "convert", url, "--load", "1", "--out", str(tmp_path / "o.csv")]}[command]
    code, out, err = run(argv)
    assert (code, out) == (2, "")
    fix = "download it first (curl -LO URL) and give the file's path"
    assert one_line(err).endswith(f": error: {url}: is a URL; {fix}")
    assert list(tmp_path.iterdir()) == []


def test_a_missing_file_is_still_no_such_file(tmp_path):
    code, _, err = run(["trace", "inspect", str(tmp_path / "none.csv")])
    assert (code, one_line(err)) == (2, f"decodesched trace inspect: error: {tmp_path / 'none.csv'}: no such file")


# ---------------------------------------------------------------- an empty name (`--opt=`, an unset variable)


@pytest.mark.parametrize("argv, said", [
    (["simulate", "", "--policy", "fcfs", "--kv-blocks", "4"], "decodesched simulate: error: '': an empty file name; "
                                                                 "give the trace file's path"),
    (["trace", "inspect", " "], "decodesched trace inspect: error: ' ': an empty file name; give the trace file's "
                                "path"),
    (["report", "--trace=", "--out", "{out}"], "decodesched report: error: '': an empty file name; give the trace "
                                                "file's path"),
    (["trace", "convert", "bundled", "--load", "1", "--out="], "decodesched trace convert: error: '': an empty file "
                                                               "name"),
    (["report", "{metrics}", "--out", "{out}", "--trace-dir="],
     "decodesched report: error: --trace-dir '': an empty folder name; give the folder of the sweep's traces")])
def test_an_empty_name_is_refused_as_empty_not_read_as_the_current_folder(request, tmp_path, monkeypatch, argv, said):
    # Before: ".: is a directory, not a trace file" (Path('') is '.'), "--out names the CSV file to write", and
    # `report --trace-dir=` looked for the sweep's traces in the current folder (and wrote its report, exit 0).
    monkeypatch.chdir(tmp_path)
    metrics = request.getfixturevalue("fuzz_inputs") / "m.csv"  # (a sweep's, test_cli_hostile3.py)
    code, out, err = run([a.format(out=tmp_path / "r", metrics=metrics) for a in argv])
    assert (code, out, one_line(err)) == (2, "", said)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- lone CR line ends take the plain reader


@pytest.mark.parametrize("ends", ["\r", "\r\n", "mixed"])
def test_a_trace_with_lone_cr_line_ends_is_read_without_the_csv_module(tmp_path, monkeypatch, ends):
    # Before: a lone CR sent the whole file to `_csv_records` (the csv module: twice as slow at 10**6 rows).
    rows = [",".join(TRACE_COLUMNS)] + [f"{i},{i},{1 + i % 5},2,{i % 3},{str(i % 2 == 0).lower()},2,,true"
                                        for i in range(50)]
    seps = {"\r": ["\r"], "\r\n": ["\r\n"], "mixed": ["\r", "\r\n", "\n"]}[ends]
    text = "".join(row + seps[i % len(seps)] for i, row in enumerate(rows))
    (tmp_path / "cr.csv").write_bytes(text.encode())
    (tmp_path / "lf.csv").write_text("\n".join(rows) + "\n")
    expected = load_trace(tmp_path / "lf.csv")

    def csv_module(*args):
        raise AssertionError("read by the csv module")

    monkeypatch.setattr(trace_module, "_csv_records", csv_module)
    got = load_trace(tmp_path / "cr.csv")
    for name in TRACE_COLUMNS:
        assert np.array_equal(np.ma.getdata(getattr(got, name)), np.ma.getdata(getattr(expected, name))), name


# ---------------------------------------------------------------- valid CSV spelled as other tools write it

_ROWS = [["1", "0", "4", "3", "0", "false", "2", "", "true"], ["2", "1", "2", "2", "-2", "TRUE", "2", "8", "1"],
         ["-9223372036854775808", "1", "3", "1", "1", "0", "9", "", "False"], ["-0", "5", "6", "2", "-0", "true", "1",
                                                                            "30", "true"]]


@settings(max_examples=40)
@given(order=st.permutations(range(len(TRACE_COLUMNS))), ends=st.lists(st.sampled_from(["\n", "\r\n", "\r"]),
                                                                        min_size=5, max_size=5),
       quoted=st.booleans(), padded=st.booleans(), bom=st.booleans())
def test_a_valid_trace_in_any_column_order_quotes_and_line_ends_reads_as_the_canonical_one(order, ends, quoted, padded,
                                                                                          bom):
    def line(cells):
        cells = [f" {c} " if padded else c for c in (cells[i] for i in order)]
        return ",".join(f'"{c}"' if quoted else c for c in cells)

    text = ("\ufeff" if bom else "") + "".join(line(r) + end for r, end in zip([list(TRACE_COLUMNS), *_ROWS], ends))
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "t.csv").write_bytes(text.encode())
        (Path(d) / "c.csv").write_text("\n".join([",".join(TRACE_COLUMNS)] + [",".join(r) for r in _ROWS]) + "\n")
        got, want = load_trace(Path(d) / "t.csv"), load_trace(Path(d) / "c.csv")
    for name in TRACE_COLUMNS:
        assert np.array_equal(np.ma.getdata(getattr(got, name)), np.ma.getdata(getattr(want, name))), name
        assert np.array_equal(np.ma.getmaskarray(getattr(got, name)), np.ma.getmaskarray(getattr(want, name))), name
