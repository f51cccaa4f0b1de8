"""A third hostile newcomer: raw traces saved by other tools (quoted fields, a column twice, times with a zone),
inputs that are compressed or not UTF-8, an --out that names a folder, and option values the fuzz of
test_cli_fuzz.py does not draw (the options it leaves out, spelled as nan, 1e400, 0x10, 1_000, other scripts'
digits, empty)."""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import json
import os
import sys
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodesched import convert as cv
from decodesched.cli import main
from decodesched.trace import TRACE_COLUMNS

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:50.99,396,109\n"
TRACE = ",".join(TRACE_COLUMNS) + "\n1,0,4,3,0,false,2,,true\n2,1,2,2,2,true,2,8,true\n"
MOONCAKE = "".join(json.dumps({"timestamp": 1000 * i, "input_length": 50 + i, "output_length": 2, "hash_ids": [0, i]})
                   + "\n" for i in range(3))


def run(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: usage errors
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def convert(tmp_path, src, *options) -> tuple[int, str, str]:
    return run(["trace", "convert", str(src), *(options or ("--load", "1")), "--out", str(tmp_path / "out.csv")])


# ---------------------------------------------------------------- Azure CSVs saved by other tools


def test_an_azure_csv_with_its_fields_in_quotes_is_read_as_without(tmp_path):
    # docs/files.md: the CSV rules hold for every CSV reader, Azure's too; it split lines on commas, and
    # `"374"` (a spreadsheet's quoting) was "expected a whole number of tokens".
    quoted = tmp_path / "quoted.csv"
    quoted.write_text('"TIMESTAMP","ContextTokens","GeneratedTokens"\r\n'
                      '"2023-11-16 18:15:46.68","374","44"\r\n"2023-11-16 18:15:50.99","396","109"\r\n')
    plain = tmp_path / "plain.csv"
    plain.write_text(AZURE)
    a, b = cv.read_azure(quoted), cv.read_azure(plain)
    assert a.arrival_seconds.tolist() == b.arrival_seconds.tolist() == [0.0, pytest.approx(4.31)]
    assert a.prompt_tokens.tolist() == [374, 396] and a.output_tokens.tolist() == [44, 109]


def test_an_azure_csv_with_a_column_twice_is_refused(tmp_path):
    # The first ContextTokens was read and the second ignored without a word (the trace reader, the tables
    # and the sweep CSV all refuse a column twice).
    src = tmp_path / "az.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n"
                   "2023-11-16 18:15:46.68,374,44,1\n2023-11-16 18:15:50.99,396,109,2\n")
    code, _, err = convert(tmp_path, src)
    assert code == 2 and one_line(err).endswith("az.csv: duplicate column(s) ContextTokens")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["az.csv"]


def test_azure_times_with_and_without_a_zone_are_refused(tmp_path):
    # NumPy read `+05:00` as UTC and the others as UTC too (five hours apart), and warned on stderr.
    src = tmp_path / "az.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n\n"
                   "2023-11-16 18:15:50.99+05:00,396,109\n")
    code, _, err = convert(tmp_path, src)
    assert code == 2
    assert "line 4, column TIMESTAMP: '2023-11-16 18:15:50.99+05:00' has a time zone" in one_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["az.csv"]


def test_azure_times_that_all_have_a_zone_are_read_as_utc_without_a_warning(tmp_path):
    src = tmp_path / "az.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16T18:15:46.5Z,374,44\n"
                   "2023-11-16 20:15:50.5+02:00,396,109\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (NumPy: "no explicit representation of timezones")
        raw = cv.read_azure(src)
    assert raw.arrival_seconds.tolist() == [0.0, 4.0]


STAMPS = ["2023-11-16 18:15:46.68", "2023-11-16T18:15:47Z", "2023-11-16 18:15:48+05:00", "2023-11-16", "nan", "",
          '"2023-11-16 18:15:49.5"', "2023-11-16 18:15:4", "9999-12-31 23:59:59.999999999", "2023-11-16 18:15:50 "]
CELLS = ["374", '"44"', "0", "-1", "007", "1e3", " 9 ", "", "9" * 25, "\u0663", '"1,2"', '"unterminated']


@settings(max_examples=80, deadline=None)
@given(header=st.sampled_from(["TIMESTAMP,ContextTokens,GeneratedTokens",
                               '"TIMESTAMP","ContextTokens","GeneratedTokens"',
                               "GeneratedTokens,TIMESTAMP,ContextTokens,Extra", "TIMESTAMP,ContextTokens,ContextTokens",
                               "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens"]),
       rows=st.lists(st.tuples(st.sampled_from(STAMPS), st.sampled_from(CELLS), st.sampled_from(CELLS),
                               st.sampled_from(["", ",x", ",", "\x00"])), min_size=0, max_size=5),
       newline=st.sampled_from(["\n", "\r\n", "\n\n"]))
def test_azure_bytes_are_a_trace_or_one_line(tmp_path_factory, header, rows, newline):
    d = tmp_path_factory.mktemp("azure")
    src = d / "az.csv"
    src.write_text(newline.join([header] + [",".join(row[:3]) + row[3] for row in rows]) + newline)
    before = src.read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, _, err = convert(d, src, "--steps-per-second", "2")
    assert code in (0, 2), err
    if code == 2:
        one_line(err)
        assert sorted(p.name for p in d.iterdir()) == ["az.csv"]
    else:
        assert run(["trace", "inspect", str(d / "out.csv")])[0] == 0
    assert src.read_bytes() == before


def _pipe(text: str) -> tuple[str, int]:
    """A `<(cat file)` path: /dev/fd/N, the read end of a pipe that holds `text` (and is closed for writing)."""
    read, write = os.pipe()
    os.write(write, text.encode())
    os.close(write)
    return f"/dev/fd/{read}", read


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd")
def test_convert_from_a_pipe_asks_for_the_format_instead_of_eating_its_start(tmp_path):
    # `trace convert <(cat az.csv) --load 1 --out o.csv` read the pipe's start to tell its format, then read the
    # rest as the file: "/dev/fd/63: empty file (expected the header TIMESTAMP,...)".
    path, fd = _pipe(AZURE)
    try:
        code, _, err = run(["trace", "convert", path, "--load", "1", "--out", str(tmp_path / "o.csv")])
    finally:
        os.close(fd)
    assert code == 2 and one_line(err).endswith(f"{path}: cannot tell a pipe's trace format without using up its "
                                                 f"start; give --format azure|mooncake")
    path, fd = _pipe(AZURE)
    try:  # (and with the format given, the pipe converts)
        code, out, err = run(["trace", "convert", path, "--format", "azure", "--load", "1",
                              "--out", str(tmp_path / "o.csv")])
    finally:
        os.close(fd)
    assert code == 0 and "(2 requests" in out, err


# ---------------------------------------------------------------- inputs that are not UTF-8 text


@pytest.mark.parametrize("command, name, body", [
    (["trace", "inspect"], "trace.csv.gz", TRACE),
    (["simulate", "{src}", "--policy", "fcfs", "--kv-blocks", "9"], "trace.csv", TRACE),
    (["trace", "convert"], "az.csv.gz", AZURE),
    (["trace", "convert"], "az.csv", AZURE),
    (["trace", "convert"], "m.jsonl", MOONCAKE),
])
def test_a_gzip_compressed_input_says_to_decompress_it(tmp_path, command, name, body):
    # "not a UTF-8 text file (invalid start byte)", and for convert "cannot tell the trace format ... give
    # --format azure|mooncake", which then said the same as the former.
    src = tmp_path / name
    src.write_bytes(gzip.compress(body.encode()))
    argv = [a.format(src=src) for a in command] if "{src}" in command else [*command, str(src)]
    if command == ["trace", "convert"]:
        argv += ["--load", "1", "--out", str(tmp_path / "out.csv")]
    code, _, err = run(argv)
    assert code == 2 and one_line(err).endswith(f"{src}: is gzip-compressed; decompress it first (gunzip -k)")
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


@pytest.mark.parametrize("name, body", [("trace.csv", TRACE), ("az.csv", AZURE), ("m.jsonl", MOONCAKE)])
def test_a_utf16_input_says_to_save_it_as_utf8(tmp_path, name, body):
    src = tmp_path / name
    src.write_bytes(body.encode("utf-16"))  # (Windows PowerShell 5's Out-File)
    argv = ["trace", "inspect", str(src)] if name == "trace.csv" else \
        ["trace", "convert", str(src), "--load", "1", "--out", str(tmp_path / "out.csv")]
    code, _, err = run(argv)
    assert code == 2 and one_line(err).endswith(f"{src}: is UTF-16 text; save it as UTF-8")


def test_an_empty_raw_trace_is_called_empty(tmp_path):
    # It was "cannot tell the trace format ...; give --format azure|mooncake".
    src = tmp_path / "az.csv"
    src.write_bytes(b"\xef\xbb\xbf\n \n")
    code, _, err = convert(tmp_path, src)
    assert code == 2 and f"{src}: empty file" in one_line(err)


def test_a_trace_header_with_a_trailing_comma_names_the_empty_column(tmp_path):
    # "unexpected column(s)  (allowed: ...)": the unnamed column was shown as nothing at all.
    src = tmp_path / "t.csv"
    src.write_text(TRACE.replace("\n", ",\n"))
    code, _, err = run(["trace", "inspect", str(src)])
    assert code == 2 and "t.csv: unexpected column(s) '' (allowed: request_id," in one_line(err)


def test_a_parquet_trace_with_a_column_twice_names_the_column(tmp_path):
    # "not a readable Parquet file (Multiple matches for FieldRef.Name(priority) in request_id: int64 ...
    # __fragment_index: int32 ...": pyarrow's words and the whole schema, cut off (docs/files.md: a column name
    # given twice is an error naming the column).
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [line.split(",") for line in TRACE.splitlines()[1:]]
    columns = [pa.array([r[j] for r in rows]) for j in range(len(TRACE_COLUMNS))]
    src = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_arrays(columns + [columns[4]], names=[*TRACE_COLUMNS, "priority"]), src)
    code, _, err = run(["trace", "inspect", str(src)])
    assert code == 2 and one_line(err).endswith("t.parquet: duplicate column(s) priority")


# ---------------------------------------------------------------- a trace's .meta.json sidecar


@pytest.mark.parametrize("command", [["trace", "inspect", "{t}"],
                                     ["simulate", "{t}", "--policy", "fcfs", "--kv-blocks", "9"],
                                     ["sweep", "{t}", "--policy", "fcfs", "--kv-blocks", "9", "--out", "-"]])
def test_a_sidecar_nested_thousands_deep_is_one_line(tmp_path, command):
    # RecursionError, with its traceback, from every command that reads a trace.
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    (tmp_path / "t.csv.meta.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    code, out, err = run([a.format(t=trace) for a in command])
    assert code == 2 and one_line(err).endswith("t.csv.meta.json: unreadable trace metadata (nested too deep)")
    assert out == ""


@pytest.mark.parametrize("body, words", [
    ('{"steps_per_second": true}', "steps_per_second must be a positive number, got True"),  # (was 1 step/s)
    ('{"steps_per_second": "2"}', "steps_per_second must be a positive number, got '2'"),
    ('{"steps_per_second": 1' + "0" * 400 + "}", "steps_per_second must be a positive number, got 1000"),  # Overflow
    ("{}", "trace metadata without steps_per_second"),  # (was "unreadable trace metadata ('steps_per_second')")
    ("[1, 2]", "trace metadata without steps_per_second"),  # ("list indices must be integers or slices, not str")
])
def test_a_sidecar_time_scale_is_a_json_number(tmp_path, body, words):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    (tmp_path / "t.csv.meta.json").write_text(body)
    code, _, err = run(["trace", "inspect", str(trace)])
    assert code == 2 and words in one_line(err)


def test_inspect_shows_the_sidecars_text_escaped_on_one_line(tmp_path):
    # The sidecar's "source" and "format" were printed as they were: a trace from elsewhere could clear the
    # screen, retitle the terminal or print lines of its own.
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    (tmp_path / "t.csv.meta.json").write_text(json.dumps(
        {"steps_per_second": 2, "source": "\x1b[2J\x1b[31mred\nfake line", "format": "\x1b]0;title\x07"}))
    code, out, _ = run(["trace", "inspect", str(trace)])
    assert code == 0 and "\x1b" not in out and "\x07" not in out
    assert out.splitlines()[-1] == "converted from   \\x1b[2J\\x1b[31mred fake line (\\x1b]0;title\\x07, seed ?)"


# ---------------------------------------------------------------- outputs


def test_convert_out_that_ends_in_a_slash_is_refused_not_written_without_it(tmp_path):
    # `--out o.csv/` wrote o.csv and o.csv.meta.json (the other commands refuse a name that ends in /).
    src = tmp_path / "az.csv"
    src.write_text(AZURE)
    code, _, err = run(["trace", "convert", str(src), "--load", "1", "--out", f"{tmp_path}/o.csv/"])
    assert code == 2 and "o.csv/: names a folder (it ends in /); give a file name" in one_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["az.csv"]


@pytest.mark.parametrize("option, values", [("--kv-blocks", "9,12,009"), ("--aging-interval", "1,2,1")])
def test_a_sweep_value_given_twice_is_refused_as_a_policy_given_twice_is(tmp_path, option, values):
    # `--kv-blocks 9,12,009` replayed 9 twice and wrote two identical rows (`--policy fcfs,fcfs` is refused).
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    out = tmp_path / "m.csv"
    argv = ["sweep", str(trace), "--policy", "aging", "--kv-blocks", "9", "--threads", "1", "--out", str(out),
            option, values]
    code, _, err = run(argv)
    twice = "9" if option == "--kv-blocks" else "1"
    assert code == 2
    assert f"argument {option}: {twice} is given twice in '{values}'; give each value once" in one_line(err)
    assert not out.exists()


def test_warmup_cuda_without_a_gpu_says_so_first_and_names_its_own_option(monkeypatch):
    # It compiled (or loaded) every CPU kernel first, printing them, then ended on "use --backend cpu", an option
    # warmup does not have.
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    from numba import cuda

    if cuda.is_available():
        pytest.skip("a GPU is present")
    code, out, err = run(["warmup", "--cuda"])
    assert code == 2 and out == ""
    line = one_line(err)
    assert "--cuda needs an NVIDIA GPU" in line and "leave out --cuda" in line and "--backend" not in line


class _FullStdout:
    """Standard output on a full disk: unbuffered (``python -u``, PYTHONUNBUFFERED), its writes fail; buffered,
    its flush does."""

    def __init__(self, unbuffered: bool, error=OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))):
        self.unbuffered, self.error, self.buffer = unbuffered, error, self

    def write(self, data):
        if self.unbuffered:
            raise self.error
        return len(data)

    def flush(self):
        if not self.unbuffered:
            raise self.error

    def fileno(self):
        raise OSError("no descriptor")


@pytest.mark.parametrize("unbuffered", [True, False])
@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["sweep", "--help"], ["trace", "convert", "--help"]])
def test_help_and_version_into_a_full_disk_exit_2_naming_standard_output(monkeypatch, capsys, argv, unbuffered):
    # Unbuffered, argparse passed over the failed write (its _print_message drops OSError): exit 0, no text.
    monkeypatch.setattr(sys, "stdout", _FullStdout(unbuffered))
    with contextlib.suppress(SystemExit):
        assert main(argv) == 2
    assert one_line(capsys.readouterr().err).endswith(
        "error: standard output: cannot write (no space left on the device)")


def test_help_into_a_closed_pipe_is_the_closed_pipe_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", _FullStdout(True, BrokenPipeError(errno.EPIPE, "Broken pipe")))
    assert main(["simulate", "--help"]) == 2
    assert one_line(capsys.readouterr().err).endswith("error: standard output: the reader closed the pipe")


def test_a_commands_output_into_a_full_disk_names_standard_output(tmp_path, monkeypatch, capsys):
    # "decodesched trace inspect: error: no space left on the device": which file?
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    monkeypatch.setattr(sys, "stdout", _FullStdout(False))
    assert main(["trace", "inspect", str(trace)]) == 2
    assert one_line(capsys.readouterr().err) == \
        "decodesched trace inspect: error: standard output: cannot write (no space left on the device)"


# ---------------------------------------------------------------- option values test_cli_fuzz.py does not draw

WEIRD = ["nan", "inf", "-inf", "1e400", "-0", "0x10", "1_000", "9" * 30, "", "\u0661\u0662", "\uff11", " 7 ", "+5",
         "1e3", "7.0", "-", "--", "0", "-1", "x,", ",", "1,,2", "a=b", "=1"]
TRACE_ARG, AZURE_ARG, SWEEP_ARG = "{trace}", "{azure}", "{metrics}"
# (command with its other arguments valid, the options it leaves to test_cli_fuzz.py left out)
OPTIONS = {
    "sweep": (["sweep", TRACE_ARG, "--policy", "fcfs", "--kv-blocks", "9", "--threads", "1", "--out", "{out}.csv"],
              ["--replicates", "--max-steps", "--chunk-size", "--backend", "--engine", "--dask", "--aging-interval"]),
    "convert": (["trace", "convert", AZURE_ARG, "--load", "1", "--out", "{out}.csv"],
                ["--protected-classes", "--cache-min-blocks", "--format", "--block-size", "--requests", "--seed"]),
    "simulate": (["simulate", TRACE_ARG, "--policy", "aging", "--kv-blocks", "9"], ["--engine", "--max-steps"]),
    "report": (["report", SWEEP_ARG, "--out", "{out}"],
               ["--gantt-requests", "--aging-interval", "--loads", "--timeline-policy", "--policy", "--trace-dir"]),
    "grade": (["grade", "{subs}", "--out", "{out}", "--no-progress"], ["--cell-timeout"]),
}


@pytest.fixture(scope="module")
def fuzz_inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("args")
    (d / "t.csv").write_text(TRACE)
    (d / "az.csv").write_text(AZURE)
    (d / "subs").mkdir()
    code, _, err = run(["sweep", str(d / "t.csv"), "--policy", "fcfs,aging", "--kv-blocks", "5,9", "--threads", "1",
                        "--out", str(d / "m.csv")])
    assert code == 0, err
    return d


def _files(folder) -> dict:
    return {str(p): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


@settings(max_examples=60, deadline=None)
@given(command=st.sampled_from(sorted(OPTIONS)), data=st.data())
def test_option_values_are_a_result_or_one_line(fuzz_inputs, tmp_path_factory, command, data):
    base, options = OPTIONS[command]
    option = data.draw(st.sampled_from(options))
    value = data.draw(st.sampled_from(WEIRD))
    spelled = [f"{option}={value}"] if data.draw(st.booleans()) else [option, value]
    if data.draw(st.booleans()):  # an option given twice: the last one counts
        spelled = [option, data.draw(st.sampled_from(WEIRD))] + spelled
    out = tmp_path_factory.mktemp("out") / "o"
    names = {"trace": fuzz_inputs / "t.csv", "azure": fuzz_inputs / "az.csv", "metrics": fuzz_inputs / "m.csv",
             "subs": fuzz_inputs / "subs", "out": out}
    argv = [a.format(**names) for a in base] + spelled
    if option in ("--timeline-policy", "--policy") and command == "report":
        argv += ["--trace", str(names["trace"])]
    before = _files(fuzz_inputs)
    code, _, err = run(argv)
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        one_line(err)
        assert not list(out.parent.iterdir()), argv  # nothing written
    assert "warning" not in err.lower(), (argv, err)
    assert _files(fuzz_inputs) == before, argv


# ---------------------------------------------------------------- a converted trace written through a link

def test_a_trace_converted_through_a_link_has_one_sidecar_that_both_names_read(tmp_path):
    """`--out link.csv` writes the link's target (docs/files.md); its sidecar went beside the link, so the
    target kept its old sidecar, and the target read back at the old time scale."""
    from decodesched import load_trace

    src = tmp_path / "az.csv"
    src.write_text(AZURE)
    (tmp_path / "data").mkdir()
    target = tmp_path / "data" / "t.csv"
    assert run(["trace", "convert", str(src), "--steps-per-second", "2", "--out", str(target)])[0] == 0
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    code, _, err = run(["trace", "convert", str(src), "--steps-per-second", "5", "--out", str(link)])
    assert code == 0, err
    assert link.is_symlink() and not (tmp_path / "link.csv.meta.json").exists()
    assert load_trace(target).steps_per_second == load_trace(link).steps_per_second == 5
    assert cv.read_meta(link) == cv.read_meta(target)
    code, _, err = run(["simulate", str(link), "--policy", "fcfs", "--kv-blocks", "9", "--requests",
                        str(target) + ".meta.json"])
    assert code == 2 and "sidecar" in one_line(err)  # (the sidecar of the input, reached through the link)
