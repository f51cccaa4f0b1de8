"""Files saved by spreadsheets and tools near ours (room F, stop 61): Excel's `sep=,` first line, other separators."""

from __future__ import annotations

import re

import pytest

import decodesched
from decodesched.convert import detect_format, read_azure
from decodesched.errors import UserError
from decodesched.tables_io import read_table, tables_equal
from decodesched.trace import TRACE_COLUMNS

HEADER = ",".join(TRACE_COLUMNS)
ROWS = ["1,0,3,2,0,TRUE,1,,TRUE", "2,1,4,1,1,false,1,9,false"]
AZURE = ["TIMESTAMP,ContextTokens,GeneratedTokens", "2024-05-10 00:00:00.0087160+00:00,10,5",
         "2024-05-10 00:00:01.5087160+00:00,12,7"]


def _write(path, lines, end="\r\n", bom=True):
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + end.join(lines).encode() + end.encode())
    return path


@pytest.mark.parametrize("sep_line", ["sep=,", '"sep=,"', "SEP=,"])
@pytest.mark.parametrize("quoted", [False, True])
def test_excel_sep_line_is_skipped_in_a_trace(tmp_path, sep_line, quoted):
    """Excel's `sep=,` line before the header (it names the separator) was read as the header: every column
    'missing', 'found sep=, '''; the trace reads as without it, and errors name the file's own lines."""
    rows = [r.replace("TRUE", '"TRUE"') for r in ROWS] if quoted else ROWS  # (quotes: the csv-module readers)
    plain = decodesched.load_trace(_write(tmp_path / "plain.csv", [HEADER, *rows]))
    excel = decodesched.load_trace(_write(tmp_path / "plain2.csv", [sep_line, "", HEADER, *rows]))
    assert excel.rows() == plain.rows()
    bad = _write(tmp_path / "bad.csv", [sep_line, HEADER, ROWS[0], ROWS[1].replace("false,1,9", "false,x,9")])
    with pytest.raises(decodesched.TraceError, match=r"row 2 \(line 4\), column required_blocks"):
        decodesched.load_trace(bad)


@pytest.mark.parametrize("sep", [";", "\t", "|"])
def test_excel_sep_line_naming_another_separator_is_refused_saying_so(tmp_path, sep):
    lines = [f"sep={sep}", HEADER.replace(",", sep), *(r.replace(",", sep) for r in ROWS)]
    with pytest.raises(decodesched.TraceError, match=re.escape(f"{'sep=' + sep!r}, says the fields are separated by {sep!r}; a CSV here")):
        decodesched.load_trace(_write(tmp_path / "semi.csv", lines))


def test_azure_with_excel_sep_line_converts(tmp_path):
    """`trace convert` could not tell the format ('give --format'), and with --format azure it was 'missing
    column(s) TIMESTAMP, ...'."""
    plain = read_azure(_write(tmp_path / "a.csv", AZURE))
    src = _write(tmp_path / "b.csv", ["sep=,", *AZURE])
    assert detect_format(src) == "azure"
    excel = read_azure(src)
    assert excel.arrival_seconds.tolist() == plain.arrival_seconds.tolist() == [0.0, 1.5]
    assert excel.prompt_tokens.tolist() == plain.prompt_tokens.tolist()
    bad = _write(tmp_path / "c.csv", ["sep=,", *AZURE[:2], AZURE[2].replace(",12,", ",x,")])
    with pytest.raises(UserError, match="line 4, column ContextTokens"):
        read_azure(bad)


def test_azure_other_separator_is_named(tmp_path):
    semi = [line.replace(",", ";") for line in AZURE]
    with pytest.raises(UserError, match="separated by ';'; an Azure CSV is separated by commas"):
        read_azure(_write(tmp_path / "a.csv", semi))
    src = _write(tmp_path / "b.csv", ["sep=;", *semi])
    for read in (detect_format, read_azure):
        with pytest.raises(UserError, match="separated by ';'; a CSV here is separated by commas"):
            read(src)


def test_cli_convert_excel_saved_azure(tmp_path, capsys):
    from decodesched.cli import main

    src = _write(tmp_path / "az.csv", ["sep=,", *AZURE])
    assert main(["trace", "convert", str(src), "--out", str(tmp_path / "t.csv"), "--load", "1"]) == 0
    assert decodesched.load_trace(tmp_path / "t.csv").prompt_len.tolist() == [10, 12]
    semi = _write(tmp_path / "semi.csv", ["sep=;", *(line.replace(",", ";") for line in AZURE)])
    assert main(["trace", "convert", str(semi), "--out", str(tmp_path / "u.csv"), "--load", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "separated by ';'" in err
    assert not (tmp_path / "u.csv").exists()


def _events(tmp_path):
    r = decodesched.simulate({"request_id": [1, 2], "arrival_step": [0, 0], "prompt_len": [3, 3],
                              "max_new_tokens": [2, 1], "priority": [0, 1], "cache_hit": [False, False],
                              "required_blocks": [1, 1], "deadline_step": [None, 9], "preemptible": [True, True]},
                             free_kv_blocks=4)
    r.write_events(tmp_path / "ev.csv")
    return (tmp_path / "ev.csv").read_text().splitlines()


def test_table_with_excel_sep_line_reads(tmp_path):
    lines = _events(tmp_path)
    excel = read_table(_write(tmp_path / "x.csv", ["sep=,", *lines]))
    assert tables_equal(excel, read_table(tmp_path / "ev.csv"))


def test_table_other_separator_is_named(tmp_path):
    semi = [line.replace(",", ";") for line in _events(tmp_path)]
    with pytest.raises(UserError, match="separated by ';'; a table CSV is separated by commas"):
        read_table(_write(tmp_path / "x.csv", semi))
    with pytest.raises(UserError, match="separated by ';'; a CSV here is separated by commas"):
        read_table(_write(tmp_path / "y.csv", ["sep=;", *semi]))


def _requests(tmp_path):
    r = decodesched.simulate({"request_id": [1, 2, 3], "arrival_step": [0, 0, 50], "prompt_len": [3, 3, 2],
                              "max_new_tokens": [2, 1, 3], "priority": [0, 1, -4], "cache_hit": [False, False, True],
                              "required_blocks": [1, 1, 9], "deadline_step": [None, 9, 60],
                              "preemptible": [True, True, False]}, free_kv_blocks=4)
    r.write_requests(tmp_path / "rq.csv")
    r.write_requests(tmp_path / "rq.parquet")
    r.write_events(tmp_path / "ev.csv")
    return read_table(tmp_path / "rq.csv")


def _rewrite(src, dst, change):
    """`src` (a Parquet table) written to `dst` with `change(name, column)` for each column (None drops it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    cols = {n: change(n, table.column(n)) for n in table.column_names}
    pq.write_table(pa.table({n: c for n, c in cols.items() if c is not None}), dst)
    return dst


@pytest.mark.parametrize("which", ["rq", "ev"])
def test_parquet_tables_written_by_pandas_read_back(tmp_path, which):
    """`pd.read_csv(out.csv).to_parquet(...)`: an integer column with a gap becomes double (NaN), a latency column
    of whole numbers int64, text as categories (dictionary-encoded) or large strings: each was refused ('expected
    integers; got double', 'expected floating-point numbers; got int64', 'expected strings; got dictionary<...>')."""
    pd = pytest.importorskip("pandas")
    _requests(tmp_path)
    csv_path = tmp_path / f"{which}.csv"
    want = read_table(csv_path)
    for backend in ("numpy_nullable", None):
        frame = pd.read_csv(csv_path, **({"dtype_backend": backend} if backend else {}))
        text = [c for c in frame.columns if frame[c].dtype == object or str(frame[c].dtype).startswith("str")]
        for variant in (frame, frame.astype({c: "category" for c in text})):
            variant.to_parquet(tmp_path / "pd.parquet")
            assert tables_equal(read_table(tmp_path / "pd.parquet"), want)


def test_parquet_table_columns_in_another_order_or_of_other_types(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    want = _requests(tmp_path)
    table = pq.read_table(tmp_path / "rq.parquet")
    pq.write_table(table.select(table.column_names[::-1]), tmp_path / "rev.parquet")
    assert tables_equal(read_table(tmp_path / "rev.parquet"), want)
    assert list(read_table(tmp_path / "rev.parquet")) == list(want)
    big = _rewrite(tmp_path / "rq.parquet", tmp_path / "u.parquet",
                   lambda n, c: c.cast(pa.uint64()) if n == "prompt_len" else
                   c.cast(pa.large_string()).dictionary_encode() if n == "status" else c)
    assert tables_equal(read_table(big), want)


@pytest.mark.parametrize("column, values, message", [
    ("prompt_len", "uint64max", "column prompt_len, row 2: expected an integer that fits in int64, got 18446744073709551615"),
    ("prompt_len", [3.0, 3.5, 2.0], r"column prompt_len, row 2: expected a whole number within \+-2\*\*53"),
    ("prompt_len", [3.0, 2.0**53 + 2, 2.0], r"column prompt_len, row 2: expected a whole number within \+-2\*\*53"),
    ("prompt_len", [3.0, float("nan"), 2.0], r"column prompt_len, row 2: expected a whole number within"),
    ("prompt_len", [3.0, None, 2.0], "column prompt_len: expected integers, none missing; got double with 1 missing"),
    ("phase", None, r"not an events or requests table \(as a requests table: missing status\)"),
    ("status", ["finished", None, "finished"], "column status: expected strings, none missing; got string with 1 "
                                               "missing"),  # (was "row 2, column status: not one of ...: 'None'")
])
def test_parquet_table_values_that_do_not_fit_are_named(tmp_path, column, values, message):
    import pyarrow as pa

    _requests(tmp_path)
    if values == "uint64max":
        arr = pa.array([3, 2**64 - 1, 2], pa.uint64())
    elif column == "status":
        arr = pa.array(values, pa.string())
    else:
        arr = None if values is None else pa.array(values, pa.float64(), from_pandas=False)
    col = "status" if column == "phase" else column
    bad = _rewrite(tmp_path / "rq.parquet", tmp_path / "bad.parquet", lambda n, c: arr if n == col else c)
    with pytest.raises(UserError, match=message):
        read_table(bad)


def test_parquet_table_nan_in_a_nullable_integer_column_is_missing(tmp_path):
    import pyarrow as pa

    want = _requests(tmp_path)
    steps = want["first_token_step"]
    floats = pa.array([float("nan") if m else float(v) for v, m in zip(steps.data, steps.mask)], pa.float64())
    assert floats.null_count == 0 and steps.mask.any()
    path = _rewrite(tmp_path / "rq.parquet", tmp_path / "nan.parquet",
                    lambda n, c: floats if n == "first_token_step" else c)
    assert tables_equal(read_table(path), want)


def test_csv_table_columns_in_another_order(tmp_path):
    want = _requests(tmp_path)
    lines = [line.split(",") for line in (tmp_path / "rq.csv").read_text().splitlines()]
    order = list(range(len(lines[0])))[::-1]
    (tmp_path / "rev.csv").write_text("\n".join(",".join(r[i] for i in order) for r in lines) + "\n")
    got = read_table(tmp_path / "rev.csv")
    assert list(got) == list(want) and tables_equal(got, want)
    lines[0][-1] = "x"
    (tmp_path / "x.csv").write_text("\n".join(",".join(r) for r in lines) + "\n")
    with pytest.raises(UserError, match=r"\(as a requests table: missing deadline_met; unexpected x\)"):
        read_table(tmp_path / "x.csv")


@pytest.mark.parametrize("arrow_type", ["timestamp[ns, tz=UTC]", "date32", "duration[s]"])
def test_arrow_and_parquet_dates_are_refused_whole_naming_the_column(tmp_path, arrow_type):
    """A timestamp column was read cell by cell: "row 1, column arrival_step: expected an integer, got
    Timestamp('1970-01-01 00:00:\u2026 tz='UTC') (47 chars)"; as NumPy's dates, it is refused whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    typ = {"timestamp[ns, tz=UTC]": pa.timestamp("ns", tz="UTC"), "date32": pa.date32(),
           "duration[s]": pa.duration("s")}[arrow_type]
    rows = decodesched.load_trace(_write(tmp_path / "t.csv", [HEADER, *ROWS])).columns()
    cols = {n: pa.array(v.tolist()) for n, v in rows.items()}
    cols["arrival_step"] = pa.array([0, 1], pa.int32() if arrow_type == "date32" else pa.int64()).cast(typ)
    table = pa.table(cols)
    pq.write_table(table, tmp_path / "t.parquet")
    for src, where in ((table, "<arrow>"), (tmp_path / "t.parquet", str(tmp_path / "t.parquet"))):
        with pytest.raises(decodesched.TraceError, match=re.escape(f"{where}, column arrival_step: expected "
                                                                   "integers, got ")):
            decodesched.load_trace(src)


def test_convert_refuses_a_canonical_trace_and_parquet_saying_so(tmp_path):
    """`trace convert trace.csv` said 'cannot tell the trace format ... give --format azure|mooncake', which cannot
    help; a Parquet file said the same, or 'not a UTF-8 text file (invalid start byte)' with --format."""
    from decodesched.convert import read_raw
    from decodesched.frames import to_parquet

    trace = decodesched.load_trace(_write(tmp_path / "t.csv", [HEADER, *ROWS]))
    with pytest.raises(UserError, match="already a canonical trace, nothing to convert"):
        read_raw(tmp_path / "t.csv")
    to_parquet(trace, tmp_path / "t.parquet")
    for fmt in (None, "azure", "mooncake"):
        with pytest.raises(UserError, match="a Parquet file; trace convert reads an Azure CSV or Mooncake JSON lines"):
            read_raw(tmp_path / "t.parquet", fmt)
    (tmp_path / "p.csv").write_bytes((tmp_path / "t.parquet").read_bytes())  # (Parquet under a text name)
    for read in (decodesched.load_trace, read_table, read_raw):
        with pytest.raises(UserError, match="p.csv: is a Parquet file, not text"):
            read(tmp_path / "p.csv")


@pytest.mark.parametrize("name", ["", "  "])
def test_to_parquet_names_an_empty_file_name(tmp_path, monkeypatch, name):
    """`frames.to_parquet(trace, "")` said ": a Parquet file is named .parquet or .pq; got no extension" (the name
    it names is empty); every other writer says "'': an empty file name"."""
    from decodesched.frames import to_parquet

    monkeypatch.chdir(tmp_path)
    trace = decodesched.load_trace(_write(tmp_path / "t.csv", [HEADER, *ROWS]))
    with pytest.raises(UserError, match=f"^{re.escape(repr(name))}: an empty file name"):
        to_parquet(trace, name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_an_azure_trace_with_timestamp_not_first_is_named_as_azure_by_load_trace(tmp_path):
    """`trace convert` takes an Azure header in any order (Azure 2024, other tools), but `load_trace` and `trace
    inspect` named only one whose first column is TIMESTAMP, else 'missing column(s) request_id, ...; found ...'."""
    src = _write(tmp_path / "az.csv", ["ContextTokens,TIMESTAMP,GeneratedTokens", "10,2024-05-10 00:00:00+00:00,5"])
    assert detect_format(src) == "azure"
    with pytest.raises(decodesched.TraceError, match="an Azure LLM trace, not a canonical trace: convert it first"):
        decodesched.load_trace(src)


def test_convert_line_for_one_request_arriving_at_once(tmp_path, capsys):
    """`trace convert` of requests that all arrive at one instant printed '(1 requests, ..., offered load inf)'
    where `trace inspect` says 'unbounded (every request arrives at once)'."""
    from decodesched.cli import main

    src = _write(tmp_path / "az.csv", AZURE[:2])
    assert main(["trace", "convert", str(src), "--out", str(tmp_path / "t.csv"), "--steps-per-second", "10"]) == 0
    out = capsys.readouterr().out
    assert "(1 request, 10 steps/s, offered load unbounded (every request arrives at once))" in out
    assert main(["trace", "inspect", str(tmp_path / "t.csv")]) == 0
    assert "offered load     unbounded (every request arrives at once)" in capsys.readouterr().out
