"""A seeded Hypothesis fuzz of every subcommand: random option values and random or garbled input files
(BOM, CRLF, NUL, binary, gzip, huge fields and integers, truncated JSON).  Whatever the input:

- the exit status is 0 or 2;
- on 2, stderr is exactly one line of at most 300 characters (long values shortened);
- no warning line is printed;
- no file is left behind on failure, no temporary file ever, and every input is byte-identical after.

The CLI runs in-process (`cli.main`), so that the fuzz stays fast; a few subprocess cases check the real
exit codes and stderr of the console script.  Bounded: a few dozen examples per command."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodesched.cli import main
from decodesched.trace import TRACE_COLUMNS

TRACE_ROWS = ["1,0,4,3,0,false,2,,true", "2,1,2,2,2,true,2,8,true", "3,1,3,1,1,false,9,,false",
              "4,5,6,2,-1,TRUE,1,30,1"]
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:15:{10 + i:02d}.5000000,{100 + 7 * i},{1 + i % 5}\n" for i in range(12))
MOONCAKE = "".join(json.dumps({"timestamp": 1000 * i, "input_length": 50 + i, "output_length": 1 + i % 4,
                               "hash_ids": [0, i]}) + "\n" for i in range(10))
SWEEP_HEADER = ("trace,policy,kv_blocks,aging_interval,requests,finished,ttft_p50,ttft_p99,queue_wait_p50,"
                "queue_wait_p99,e2e_p50,e2e_p99,starvation,preemptions,deadline_misses,fairness_jain")


def valid_trace() -> str:
    return ",".join(TRACE_COLUMNS) + "\n" + "\n".join(TRACE_ROWS) + "\n"


def garble(text: str, how: str, data) -> bytes:
    raw = text.encode()
    if how == "asis":
        return raw
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how == "crlf":
        return raw.replace(b"\n", b"\r\n")
    if how == "nul":
        at = data.draw(st.integers(0, len(raw)))
        return raw[:at] + b"\x00" + raw[at:]
    if how == "binary":
        return data.draw(st.binary(min_size=1, max_size=300))
    if how == "gzip":
        return gzip.compress(raw)
    if how == "truncated":
        return raw[: data.draw(st.integers(0, max(len(raw) - 1, 0)))]
    if how == "huge_field":
        lines = text.splitlines()
        cells = lines[-1].split(",")
        cells[data.draw(st.integers(0, len(cells) - 1))] = "9" * data.draw(st.sampled_from([5000, 200_000]))
        return ("\n".join(lines[:-1] + [",".join(cells)]) + "\n").encode()
    if how == "huge_json_int":
        return raw + (json.dumps({"timestamp": 1, "input_length": 1, "output_length": 1})
                      .replace('"output_length": 1', '"output_length": ' + "7" * 5000) + "\n").encode()
    if how == "spellings":
        word = data.draw(st.sampled_from(["yes", "no", "t", "+20", "1_000", "\u0663", " 4 ", "0x10", "1e3", "-0",
                                          "9999999999999999999", "-9223372036854775809"]))  # 19 digits, past int64
        lines = text.splitlines()
        cells = lines[-1].split(",")
        cells[data.draw(st.integers(0, len(cells) - 1))] = word
        return ("\n".join(lines[:-1] + [",".join(cells)]) + "\n").encode()
    if how in ("short_row", "long_row"):  # a cell missing or one too many (a quoted comma, a lost one)
        lines = text.splitlines()
        cells = lines[-1].split(",")
        at = data.draw(st.integers(0, len(cells) - 1))
        cells[at:at + 1] = [] if how == "short_row" else [cells[at], "1"]
        return ("\n".join(lines[:-1] + [",".join(cells)]) + "\n").encode()
    raise AssertionError(how)


GARBLES = ["asis", "asis", "bom", "crlf", "nul", "binary", "gzip", "truncated", "huge_field", "spellings",
           "short_row", "long_row"]
WEIRD_INTS = ["0", "-1", "+20", "1_000", "\u0663", "99999999999999999999999", "nan", "x", "", "4" * 400]
WEIRD_FLOATS = ["0", "-1", "nan", "inf", "1e309", "x", "", "1e-300"]


def value(good: list[str], weird: list[str]):
    """Mostly a valid value (so that runs get past option parsing), sometimes a weird one."""
    return st.one_of(st.sampled_from(good), st.sampled_from(good), st.sampled_from(good), st.sampled_from(weird))


INTS = value(["1", "2", "3", "4", "9"], WEIRD_INTS)
FLOATS = value(["0.5", "1", "1.5", "2"], WEIRD_FLOATS)


def snapshot(folder: Path) -> dict[str, bytes | None]:
    out = {}
    for p in sorted(folder.rglob("*")):
        out[str(p.relative_to(folder))] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


def run_in_process(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: --help, usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def check(folder: Path, argv: list[str], inputs: list[Path]):
    before = snapshot(folder)
    with contextlib.chdir(folder):  # relative outputs ("-" as a folder name, say) land in the sandbox too
        code, out, err = run_in_process(argv)
    after = snapshot(folder)
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1, (argv, err)
        assert len(lines[0]) <= 300 and "Traceback" not in err, (argv, err)
        assert after == before, (argv, "files changed on failure", set(after) ^ set(before))
    assert not [ln for ln in err.splitlines() if "Warning" in ln or "warning:" in ln.lower()], (argv, err)
    for p in inputs:
        key = str(p.relative_to(folder))
        assert after.get(key) == before.get(key), (argv, f"input {key} changed")
    assert not [k for k in after if k.endswith(".tmp")], (argv, "temporary file left")
    return code


@contextlib.contextmanager
def workdir():
    with tempfile.TemporaryDirectory(prefix="fuzz-") as d:
        yield Path(d)


def write(folder: Path, name: str, content: bytes) -> Path:
    p = folder / name
    p.write_bytes(content)
    return p


def output_path(data, folder: Path, inputs: list[Path], default: str) -> str:
    choice = data.draw(st.sampled_from(["new"] * 6 + ["input", "sidecar", "folder", "missing_dir", "dash"]))
    if choice == "input" and inputs:
        return str(inputs[0])
    if choice == "sidecar" and inputs:
        return str(inputs[0]) + ".meta.json"
    if choice == "folder":
        return str(folder)
    if choice == "missing_dir":
        return str(folder / "no" / default)
    if choice == "dash":
        return "-"
    return str(folder / default)


FUZZ = settings(max_examples=int(os.environ.get("DECODESCHED_FUZZ_EXAMPLES", "100")), deadline=None)


@FUZZ
@given(st.data())
def test_simulate(data):
    with workdir() as d:
        trace = write(d, "trace.csv", garble(valid_trace(), data.draw(st.sampled_from(GARBLES)), data))
        if data.draw(st.booleans()):
            write(d, "trace.csv.meta.json", garble('{"steps_per_second": 2.5}', data.draw(
                st.sampled_from(["asis", "truncated", "binary", "bom"])), data))
        argv = ["simulate", str(trace), "--policy",
                data.draw(st.sampled_from(["fcfs", "aging", "deadline", "fixed_priority", "bogus"])),
                "--kv-blocks", data.draw(value(["4", "9", "100"], WEIRD_INTS))]
        if data.draw(st.booleans()):
            argv += ["--aging-interval", data.draw(INTS)]
        if data.draw(st.booleans()):
            argv += ["--max-steps", data.draw(INTS)]
        inputs = [trace, d / "trace.csv.meta.json"]
        if data.draw(st.booleans()):
            argv += ["--events", output_path(data, d, inputs, "ev." + data.draw(st.sampled_from(["csv", "parquet"])))]
        if data.draw(st.booleans()):
            argv += ["--requests", output_path(data, d, inputs, "rq.csv")]
        check(d, argv, inputs)


@FUZZ
@given(st.data())
def test_trace_convert_and_inspect(data):
    with workdir() as d:
        kind = data.draw(st.sampled_from(["azure", "mooncake"]))
        how = data.draw(st.sampled_from(GARBLES + ["huge_json_int"] if kind == "mooncake" else GARBLES))
        src = write(d, "src." + data.draw(st.sampled_from(["csv", "jsonl", "txt"])),
                    garble(AZURE if kind == "azure" else MOONCAKE, how, data))
        argv = ["trace", "convert", str(src)]
        if data.draw(st.booleans()):
            argv += ["--load", data.draw(FLOATS)]
        else:
            argv += ["--steps-per-second", data.draw(FLOATS)]
        for opt, values in (("--seed", INTS), ("--block-size", INTS), ("--requests", INTS),
                            ("--deadline-fraction", value(["0", "0.5", "1"], WEIRD_FLOATS)), ("--slo-factor", FLOATS),
                            ("--priority-classes", value(["0,1,2"], ["1", "", "a,b", "1,1", "+1,2"])),
                            ("--priority-weights", value(["1,1,1", "3,2,1"], ["0,0,0", "nan,1,1", "1"])),
                            ("--format", st.sampled_from(["azure", "mooncake"]))):
            if data.draw(st.integers(0, 3)) == 0:
                argv += [opt, data.draw(values)]
        out = output_path(data, d, [src], "out.csv")
        argv += ["--out", out]
        if check(d, argv, [src]) == 0 and Path(out).is_file():
            check(d, ["trace", "inspect", out], [Path(out)])
        check(d, ["trace", "inspect", str(src)], [src])


@settings(FUZZ, max_examples=max(FUZZ.max_examples // 2, 5))
@given(st.data())
def test_sweep_and_report(data):
    with workdir() as d:
        trace = write(d, "trace.csv", garble(valid_trace(), data.draw(st.sampled_from(GARBLES)), data))
        out = output_path(data, d, [trace], "metrics.csv")
        argv = ["sweep", str(trace), "--policy", data.draw(value(["aging", "fcfs,deadline"], ["x", ""])),
                "--kv-blocks", data.draw(value(["4", "2,9"], ["-1", "x", "1_0"])),
                "--aging-interval", data.draw(value(["2", "1,3"], ["0", "nan"])), "--out", out]
        if data.draw(st.booleans()):
            argv += ["--threads", data.draw(INTS)]
        code = check(d, argv, [trace])
        if code == 0 and out != "-" and Path(out).is_file():
            results = Path(out)
        else:
            body = SWEEP_HEADER + "\n" + f"{trace},aging,4,2,4,4,1,2,0,1,3,4,1,0,0,1.0\n"
            results = write(d, "m.csv", garble(body, data.draw(st.sampled_from(GARBLES)), data))
        argv = ["report", str(results), "--out", output_path(data, d, [results], "report")]
        if data.draw(st.booleans()):
            argv += ["--kv-blocks", data.draw(INTS)]
        if data.draw(st.booleans()):
            argv += ["--load", data.draw(FLOATS)]
        check(d, argv, [results, trace])


@settings(FUZZ, max_examples=max(FUZZ.max_examples // 4, 5))
@given(st.data())
def test_demo_arguments(data):
    with workdir() as d:
        argv = ["demo", "--requests", data.draw(value(["2", "30"], ["1", "-3", "x", "+5"])),
                "--out", output_path(data, d, [], "demo-out")]
        for opt, values in (("--load", FLOATS), ("--kv-blocks", value(["100", "2000"], WEIRD_INTS)),
                            ("--aging-interval", INTS), ("--seed", INTS)):
            if data.draw(st.booleans()):
                argv += [opt, data.draw(values)]
        check(d, argv, [])


@settings(FUZZ, max_examples=max(FUZZ.max_examples // 4, 5))
@given(st.data())
def test_warmup_assignment_and_grade_arguments(data):
    with workdir() as d:
        subs = d / "subs"
        subs.mkdir()
        nb = write(subs, "s1.ipynb", garble('{"cells": [], "metadata": {}, "nbformat": 4}',
                                            data.draw(st.sampled_from(["asis", "truncated", "binary", "bom"])), data))
        course = d / "course"
        course.mkdir()
        argv = data.draw(st.sampled_from([
            ["warmup", "--bogus"],
            ["assignment"],
            ["assignment", "build", "--course", str(course)],
            ["assignment", "build", "--course", str(nb)],
            ["grade"],
            ["grade", str(subs), "--out", str(d / "g"), "--course", str(course)],
            ["grade", str(nb), "--out", str(d / "g")],
        ]))
        if argv[0] == "grade" and len(argv) > 1:
            for opt, values in (("--timeout", FLOATS), ("--jobs", INTS), ("--memory-mb", value(["512"], WEIRD_INTS))):
                if data.draw(st.booleans()):
                    argv += [opt, data.draw(values)]
        check(d, argv, [nb])


@pytest.mark.parametrize("argv, words", [
    (["simulate", "{trace}", "--policy", "aging", "--kv-blocks", "1_000"], "whole number"),
    (["simulate", "{huge}", "--policy", "aging", "--kv-blocks", "4"], "a field longer than"),
    (["trace", "convert", "{mooncake}", "--load", "1", "--out", "{out}"], "too long"),
    (["trace", "convert", "bundled", "--load", "1", "--seed", "-1", "--out", "{out}"], "--seed"),
    (["grade", "{dir}", "--out", "{out}", "--timeout", "nan"], "error"),
])
def test_real_exit_codes_and_one_line(tmp_path, argv, words):
    (tmp_path / "trace.csv").write_text(valid_trace())
    (tmp_path / "huge.csv").write_text(",".join(TRACE_COLUMNS) + "\n1,0,4,3,0,false,2,," + "t" * 10_000_000 + "\n")
    (tmp_path / "m.jsonl").write_text(MOONCAKE + '{"timestamp": 1, "input_length": ' + "9" * 5000 + "}\n")
    subs = {"trace": tmp_path / "trace.csv", "huge": tmp_path / "huge.csv", "mooncake": tmp_path / "m.jsonl",
            "out": tmp_path / "out.csv", "dir": tmp_path}
    argv = [a.format(**subs) for a in argv]
    before = snapshot(tmp_path)
    p = subprocess.run([sys.executable, "-m", "decodesched.cli", *argv], capture_output=True, text=True,
                       timeout=600, env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"})
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 300 and words in lines[0], p.stderr
    assert snapshot(tmp_path) == before
