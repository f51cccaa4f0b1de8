"""What counts as a number and as a line in trace files: Azure times that are no whole date (a bare number NumPy reads
as a year), a leap second, a header repeated mid-file; JSON numbers that are whole only once rounded to a float, and
Mooncake times past exact milliseconds; the line of a byte that is not UTF-8, in every text reader."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

import decodesched
from decodesched import convert as cv
from decodesched.errors import UserError
from decodesched.tables_io import read_table
from test_files_stop60 import AZURE, MOONCAKE, converted

HEADER = ",".join(decodesched.trace.TRACE_COLUMNS)
ROWS = ["0,0,5,3,1,true,2,,true", "1,2,4,2,0,false,1,50,false", "2,2,4,2,0,false,1,,false"]


def azure_with_times(times: list[str]) -> bytes:
    """AZURE with its three TIMESTAMPs replaced by `times`."""
    head, *rows = AZURE.splitlines()
    return "\n".join([head, *(t + r[r.index(","):] for t, r in zip(times, rows))]).encode() + b"\n"


# ---------------------------------------------------------------- Azure times: a whole date first


@pytest.mark.parametrize("times", [["0", "1", "2"], ["12", "13", "14"], ["1700158546", "1700158547", "1700158548"],
                                   ["2023", "2024", "2025"], ["2023-11", "2023-11", "2023-12"],
                                   ["2023-11-16 18:15:46", "2023", "2023-11-16 18:15:47"]])
def test_an_azure_time_that_is_no_whole_date_is_refused_not_read_as_a_year(tmp_path, times):
    # Before: exit 0. NumPy read a bare number as a year and `2023-11` as November's first day: times in seconds
    # (0, 1, 2) or seconds since 1970 became arrivals a year apart (31,622,400 s), silently.
    code, err, _ = converted(tmp_path, "a.csv", azure_with_times(times))
    line = 2 + next(i for i, t in enumerate(times) if t.count("-") < 2)  # (the first without a whole date)
    assert code == 2 and f"line {line}, column TIMESTAMP: not a date and time: {times[line - 2]!r}" in err
    assert "such as 2023-11-16 18:15:46.68" in err


@pytest.mark.parametrize("times, steps", [
    (["2023-11-16", "2023-11-16", "2023-11-17"], [0, 0, 86_400_000]),
    (["+2023-11-16 18:15:46", "2023-11-16 18:15:47", "2023-11-16 18:15:48.5"], [0, 1000, 2500]),
    (["2023-11-16T18:15:46+05:30", "2023-11-16T18:15:47+05:30", "2023-11-16T13:00Z"], [0, 1000, 854_000])])
def test_azure_times_with_a_whole_date_still_read(tmp_path, times, steps):
    # (a guard, right before too: a date alone is its midnight; a sign before the year; zones read as UTC)
    code, err, got = converted(tmp_path, "a.csv", azure_with_times(times))
    assert code == 0, err
    assert got["arrival_step"] == steps


def test_a_leap_second_is_refused_saying_so(tmp_path):
    # Before: "not a date and time: '2016-12-31 23:59:60.5'", of a time that is one (NumPy's time has no leap seconds).
    code, err, _ = converted(tmp_path, "a.csv", azure_with_times(["2016-12-31 23:59:59", "2016-12-31 23:59:60.5",
                                                                   "2017-01-01 00:00:00"]))
    assert code == 2 and "line 3, column TIMESTAMP" in err and "a leap second" in err


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_two_azure_files_joined_whole_name_the_repeated_header(tmp_path, end):
    # Before: "line 5, column ContextTokens: expected a whole number of tokens, got 'ContextTokens'" (the canonical
    # trace reader names a repeated header as such).
    code, err, _ = converted(tmp_path, "a.csv", (AZURE + AZURE).replace("\n", end).encode())
    assert code == 2 and "line 5 repeats the header (two traces joined whole?)" in err


# ---------------------------------------------------------------- Mooncake: JSON numbers as written


def mooncake_with(field: str, text: str) -> bytes:
    """MOONCAKE with its second line's `field` written as the JSON number `text`."""
    lines = MOONCAKE.splitlines()
    rec = json.loads(lines[1])
    rec[field] = "@"
    lines[1] = json.dumps(rec).replace('"@"', text)
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("field", ["input_length", "output_length"])
@pytest.mark.parametrize("text", ["3.0000000000000001", "1e-400", "2.9999999999999999"])
def test_a_json_token_count_that_is_whole_only_once_rounded_is_refused(tmp_path, field, text):
    # Before: exit 0, read as the float nearest to it: 3.0000000000000001 tokens as 3, 1e-400 as 0.
    code, err, _ = converted(tmp_path, "m.jsonl", mooncake_with(field, text))
    assert code == 2 and f"line 2, field {field}: expected a whole number of tokens, got {text}" in err


@pytest.mark.parametrize("text", ["3.0", "3e0", "0.3E1", "30e-1"])
def test_a_json_token_count_written_as_a_whole_float_reads_as_the_integer(tmp_path, text):
    # (a guard, right before too)
    assert converted(tmp_path, "m.jsonl", mooncake_with("output_length", text))[2] == \
        converted(tmp_path, "plain.jsonl", MOONCAKE.encode())[2]


def test_a_json_block_id_that_is_whole_only_once_rounded_is_refused(tmp_path):
    # Before: exit 0; block 1.0000000000000001 was block 1, a cache hit on a block no request had.
    code, err, _ = converted(tmp_path, "m.jsonl", mooncake_with("hash_ids", "[0, 1.0000000000000001]"))
    assert code == 2 and "line 2, field hash_ids" in err and "1.0000000000000001" in err


@pytest.mark.parametrize("ms", [2**53 + 1, -(2**53) - 2, 1.7e18])
def test_a_mooncake_time_past_exact_milliseconds_is_refused(tmp_path, ms):
    # Before: exit 0; a time in nanoseconds since 1970 (1.7e18) was rounded to 256 ms, 2**53 + 1 ms to 2**53 ms.
    code, err, _ = converted(tmp_path, "m.jsonl", mooncake_with("timestamp", json.dumps(ms)))
    assert code == 2 and "line 2, field timestamp" in err and "2**53" in err
    assert converted(tmp_path, "m.jsonl", mooncake_with("timestamp", str(2**53)))[0] == 0  # (the bound itself reads)


# ---------------------------------------------------------------- the line of a byte that is not UTF-8


def read_error(path, reader: str) -> str:
    """The one-line error of reading `path` with `reader`."""
    if reader in ("azure", "mooncake"):
        with pytest.raises(UserError) as exc:
            cv.read_raw(path, reader)
    elif reader == "trace":
        with pytest.raises(decodesched.TraceError) as exc:
            decodesched.load_trace(path)
    else:
        with pytest.raises(UserError) as exc:
            read_table(path)
    return str(exc.value)


def table_text(tmp_path) -> str:
    """An events table, as `simulate --events` writes it."""
    (tmp_path / "t.csv").write_text("\n".join([HEADER, *ROWS]) + "\n")
    decodesched.simulate(decodesched.load_trace(tmp_path / "t.csv"), policy="fcfs",
                         free_kv_blocks=4).write_events(tmp_path / "e.csv")
    return (tmp_path / "e.csv").read_text()


@settings(derandomize=True, max_examples=40, deadline=None)
@given(reader=st.sampled_from(["trace", "azure", "mooncake", "table"]), at=st.integers(0, 50),
       ends=st.lists(st.sampled_from(["\n", "\r\n", "\r"]), min_size=8, max_size=8),
       byte=st.sampled_from([b"\xe9", b"\xff", b"\xc3(", b"\x80"]))
def test_a_byte_that_is_not_utf8_is_named_by_its_line(tmp_path_factory, reader, at, ends, byte):
    # Before: "not a UTF-8 text file (invalid continuation byte)", whatever line of a million held the Latin-1 é.
    tmp = tmp_path_factory.mktemp("u")
    text = {"trace": "\n".join([HEADER, *ROWS]), "azure": AZURE, "mooncake": MOONCAKE,
            "table": table_text(tmp)}[reader]
    lines = text.splitlines()
    k = at % len(lines)  # the line to damage, from 0
    body = b"".join(line.encode() + (byte if i == k else b"") + ends[i % len(ends)].encode()
                    for i, line in enumerate(lines))
    path = tmp / ("t.jsonl" if reader == "mooncake" else "t.csv")
    path.write_bytes(body)
    err = read_error(path, reader)
    assert f"{path}: line {k + 1}: not a UTF-8 text file (" in err and f": 0x{byte[0]:02x}); save it as UTF-8" in err


def test_a_pipe_that_is_not_utf8_still_says_so(tmp_path):
    # (a guard: a pipe cannot be read again to find the line; the decoder's reason stays)
    import os
    import threading

    fifo = tmp_path / "p.csv"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(AZURE.encode() + b"caf\xe9,1,1\n",))
    writer.start()
    try:
        with pytest.raises(UserError, match=r"p\.csv: not a UTF-8 text file \(invalid continuation byte\)$"):
            cv.read_azure(fifo)
    finally:
        if writer.is_alive():  # (the reader never opened the pipe: open it, so the writer ends)
            with open(fifo, "rb") as fh:
                fh.read()
        writer.join()


# ---------------------------------------------------------------- the sidecar: one value a field


def test_a_sidecar_that_gives_its_time_scale_twice_is_refused_naming_the_field(tmp_path):
    # Before: the last steps_per_second was kept, silently (the Mooncake reader refuses a field given twice).
    (tmp_path / "t.csv").write_text("\n".join([HEADER, *ROWS]) + "\n")
    (tmp_path / "t.csv.meta.json").write_text('{"steps_per_second": 5, "steps_per_second": 1000}\n')
    with pytest.raises(decodesched.TraceError, match=r"t\.csv\.meta\.json: unreadable trace metadata \(field "
                                                     r"'steps_per_second' given twice; keep one\)$"):
        decodesched.load_trace(tmp_path / "t.csv")
    assert cv.read_meta(tmp_path / "t.csv") is None  # (unreadable, as the docstring says)
    (tmp_path / "t.csv.meta.json").write_text('{"steps_per_second": 1000}\n')
    assert decodesched.load_trace(tmp_path / "t.csv").steps_per_second == 1000.0
