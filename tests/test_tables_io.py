"""The events and requests tables on disk (`decodesched.tables_io`): the vectorised CSV writer equals a
plain `csv` rendering of the same values, chunk boundaries change nothing, CSV and Parquet read back to
equal tables, and both equal the in-memory result."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import decodesched
from decodesched import tables_io
from decodesched.errors import UserError
from decodesched.trace import TRACE_COLUMNS

pa = pytest.importorskip("pyarrow")

INT64 = st.integers(-(2**63), 2**63 - 1)


def reference_csv(cols: list[tables_io.Col]) -> str:
    """What csv.writer makes of the same values, by the documented spelling."""

    def cell(c, i):
        if c.missing is not None and c.missing[i]:
            return ""
        v = c.values[i]
        if c.kind == "str":
            return c.vocab[int(v)]
        if c.kind.startswith("bool"):
            return "true" if v else "false"
        if c.kind == "float?":
            f = float(v)
            return str(int(f)) if f.is_integer() and abs(f) < 2.0**63 else str(np.float64(f))
        return str(int(v))

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    n = cols[0].values.shape[0]
    for i in range(n):
        w.writerow([cell(c, i) for c in cols])
    return buf.getvalue()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(INT64, st.booleans(), st.booleans(), st.integers(0, 2),
                          st.floats(allow_nan=True, allow_infinity=False, width=64)), min_size=0, max_size=40))
def test_vectorised_csv_equals_a_plain_rendering(rows):
    ints = np.array([r[0] for r in rows], dtype=np.int64)
    miss = np.array([r[1] for r in rows], dtype=bool)
    flags = np.array([r[2] for r in rows], dtype=bool)
    codes = np.array([r[3] for r in rows], dtype=np.int64)
    floats = np.array([r[4] for r in rows], dtype=np.float64)
    cols = [tables_io.Col("int", ints), tables_io.Col("int?", ints, miss), tables_io.Col("bool", flags),
            tables_io.Col("bool?", flags, miss), tables_io.Col("str", codes, vocab=("a", "decode", "")),
            tables_io.Col("float?", floats, np.isnan(floats))]
    assert tables_io.format_csv_rows(cols).tobytes().decode() == reference_csv(cols)


def test_integer_spelling_at_the_limb_boundaries():
    """The digit loop works in uint32 limbs of 10**9 (the top limb can hold ten digits): every
    boundary of that split, both signs, and the int64 extremes, alone and mixed in one column."""
    edges = [0, 1, 9, 10, 10**9 - 1, 10**9, 10**9 + 1, 2**32 - 1, 2**32, 4 * 10**9, 10**10, 10**18 - 1,
             10**18, 10**18 + 7, 2**62, 2**63 - 1]
    values = sorted({sign * v for v in edges for sign in (1, -1)} | {-(2**63)})
    for column in [values, *([v] for v in values), [0, 2**32 - 1], [5, 10**18]]:
        ints = np.array(column, dtype=np.int64)
        cols = [tables_io.Col("int", ints), tables_io.Col("float?", ints.astype(np.float64),
                                                           np.zeros(len(ints), bool))]
        assert tables_io.format_csv_rows(cols).tobytes().decode() == reference_csv(cols)


def make_trace(n: int, seed: int):
    rng = np.random.default_rng(seed)
    deadline = [None if rng.random() < 0.5 else int(a) + int(rng.integers(2, 40))
                for a in rng.integers(0, 30, n)]
    arrival = rng.integers(0, 30, n)
    deadline = [None if d is None else max(d, int(a) + 1) for d, a in zip(deadline, arrival)]
    return decodesched.load_trace({
        "request_id": rng.choice(np.arange(-(2**62), 2**62, 2**52, dtype=np.int64), n, replace=False),
        "arrival_step": arrival, "prompt_len": rng.integers(1, 9, n), "max_new_tokens": rng.integers(1, 7, n),
        "priority": rng.integers(-3, 4, n), "cache_hit": rng.random(n) < 0.3,
        "required_blocks": rng.integers(1, 5, n), "deadline_step": deadline, "preemptible": rng.random(n) < 0.8,
    })


@pytest.mark.parametrize("chunk", [1, 7, 1 << 16])
def test_csv_and_parquet_round_trip_to_equal_tables(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(tables_io, "CHUNK_ROWS", chunk)
    monkeypatch.setattr(tables_io, "PARQUET_CHUNK_ROWS", chunk)
    result = decodesched.simulate(make_trace(40, chunk), "aging", free_kv_blocks=8, aging_interval=2)
    for table, write in (("events", result.write_events), ("requests", result.write_requests)):
        write(tmp_path / f"{table}.csv")
        write(tmp_path / f"{table}.parquet")
        a = tables_io.read_table(tmp_path / f"{table}.csv")
        b = tables_io.read_table(tmp_path / f"{table}.parquet")
        assert tables_io.tables_equal(a, b), table
    ev = tables_io.read_table(tmp_path / "events.csv")
    mem = result.events
    for name, _ in tables_io.EVENT_SCHEMA:
        if name == "preempted_request_id":
            assert np.array_equal(np.ma.getmaskarray(ev[name]), ~mem["has_victim"])
            assert np.array_equal(ev[name].filled(0), mem[name])
        else:
            assert np.array_equal(ev[name], mem[name]), name
    rq = tables_io.read_table(tmp_path / "requests.parquet")
    req = result.requests
    for name in ("queue_wait", "ttft", "tpot", "e2e"):
        assert np.array_equal(rq[name], req[name], equal_nan=True), name
    assert np.array_equal(rq["deadline_step"].mask, ~req["has_deadline"])
    assert rq["status"].tolist() == req["status"].tolist()


def test_parquet_is_the_plain_documented_schema(tmp_path, monkeypatch):
    """Strings go to the writer as dictionary arrays and integers delta-encoded, but a reader sees
    plain int64 / bool / string / double columns (no dictionary type: pandas gives no categories),
    nullable exactly where documented, in row groups of at most PARQUET_CHUNK_ROWS rows; an empty
    log (max_steps=0) is a valid file too."""
    pq = pytest.importorskip("pyarrow.parquet")
    monkeypatch.setattr(tables_io, "PARQUET_CHUNK_ROWS", 16)
    result = decodesched.simulate(make_trace(40, 3), "aging", free_kv_blocks=8, aging_interval=2)
    typ = {"int": pa.int64(), "int?": pa.int64(), "bool": pa.bool_(), "bool?": pa.bool_(),
           "float?": pa.float64(), "str": pa.string()}
    empty = decodesched.simulate(make_trace(5, 3), "fcfs", free_kv_blocks=8, max_steps=0)
    for path, write, schema, n in (
            (tmp_path / "ev.parquet", result.write_events, tables_io.EVENT_SCHEMA, result.n_events),
            (tmp_path / "rq.pq", result.write_requests, tables_io.REQUEST_SCHEMA, 40),
            (tmp_path / "empty.parquet", empty.write_events, tables_io.EVENT_SCHEMA, 0)):
        write(path)
        f = pq.ParquetFile(path)
        assert f.schema_arrow == pa.schema([pa.field(c, typ[k], nullable=k.endswith("?")) for c, k in schema])
        assert f.metadata.num_rows == n
        assert f.metadata.num_row_groups == max(1, -(-n // 16))
        frame = f.read().to_pandas()
        assert not any(str(t) == "category" for t in frame.dtypes)
    empty.write_events(tmp_path / "empty.csv")
    back = tables_io.read_table(tmp_path / "empty.parquet")
    assert tables_io.tables_equal(back, tables_io.read_table(tmp_path / "empty.csv"))
    assert list(back) == [c for c, _ in tables_io.EVENT_SCHEMA] and all(len(v) == 0 for v in back.values())


def test_csv_text_is_the_documented_spelling(tmp_path):
    t = decodesched.load_trace({"request_id": [-3, 8], "arrival_step": [0, 0], "prompt_len": [2, 2],
                                "max_new_tokens": [1, 4], "priority": [0, 1], "cache_hit": [False, True],
                                "required_blocks": [1, 1], "deadline_step": [None, 3], "preemptible": [True, False]})
    r = decodesched.simulate(t, "deadline", free_kv_blocks=1)
    r.write_events(tmp_path / "ev.csv")
    r.write_requests(tmp_path / "rq.csv")
    with open(tmp_path / "ev.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == [n for n, _ in tables_io.EVENT_SCHEMA]
    assert {r["deadline_missed"] for r in rows} <= {"true", "false"}
    assert all(r["preempted_request_id"] == "" or int(r["preempted_request_id"]) in (-3, 8) for r in rows)
    with open(tmp_path / "rq.csv") as fh:
        req = {r["request_id"]: r for r in csv.DictReader(fh)}
    assert req["-3"]["deadline_step"] == "" and req["-3"]["deadline_met"] == "" and req["-3"]["tpot"] == ""
    assert req["8"]["deadline_step"] == "3" and req["8"]["cache_hit"] == "true"
    assert math.isclose(float(req["8"]["tpot"]), r.requests["tpot"][1])


def test_parquet_without_pyarrow_is_one_line(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    r = decodesched.simulate(make_trace(5, 1), "fcfs", free_kv_blocks=8)
    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(UserError, match=r"decodesched\[data\]"):
        r.write_events(tmp_path / "ev.parquet")
    assert list(tmp_path.iterdir()) == []


def test_reader_refuses_other_tables(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(",".join(TRACE_COLUMNS) + "\n")
    with pytest.raises(UserError, match="not an events or requests table"):
        tables_io.read_table(p)


def _small_tables(tmp_path):
    trace = {"request_id": [1, 2], "arrival_step": [0, 1], "prompt_len": [3, 2], "max_new_tokens": [2, 1],
             "priority": [0, 1], "cache_hit": [False, True], "required_blocks": [1, 1], "deadline_step": [None, 9],
             "preemptible": [True, False]}
    result = decodesched.simulate(trace, "aging", 2)
    result.write_events(tmp_path / "ev.csv")
    result.write_requests(tmp_path / "rq.csv")
    result.write_requests(tmp_path / "rq.parquet")
    return tmp_path / "ev.csv", tmp_path / "rq.csv", tmp_path / "rq.parquet"


@pytest.mark.parametrize("which, column, cell, message", [
    (0, "step", "1e5", "column step: not a whole number: '1e5'"),
    (0, "step", "9999999999999999999", "column step: not a whole number"),  # past int64
    (0, "step", "", "column step: not a whole number: ''"),  # not nullable
    (0, "deadline_missed", "maybe", "column deadline_missed: not a true/false: 'maybe'"),
    (1, "deadline_step", "soon", "column deadline_step: not a whole number or empty: 'soon'"),
    (1, "ttft", "fast", "column ttft: not a number or empty: 'fast'"),
])
def test_reader_names_the_cell_that_does_not_fit(tmp_path, which, column, cell, message):
    """Found by mutating written tables: a bad cell was a NumPy ValueError (or read as false)."""
    path = _small_tables(tmp_path)[which]
    lines = path.read_text().splitlines()
    col = lines[0].split(",").index(column)
    cells = lines[2].split(",")
    cells[col] = cell
    lines[2] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match="line 3, " + message):
        tables_io.read_table(path)


def test_reader_refuses_undecodable_and_mistyped_files(tmp_path):
    import pyarrow.parquet as pq

    ev, rq, rq_pq = _small_tables(tmp_path)
    ev.write_bytes(ev.read_bytes()[:40] + b"\xff\xfe\n")
    with pytest.raises(UserError, match="not a UTF-8 text file"):
        tables_io.read_table(ev)
    table = pq.read_table(rq_pq)
    for name, typ, words in [("priority", pa.string(), "expected integers, none missing; got string"),
                             ("cache_hit", pa.int64(), "expected booleans, none missing; got int64")]:
        i = table.schema.get_field_index(name)
        pq.write_table(table.set_column(i, name, table.column(name).cast(typ)), rq_pq)
        with pytest.raises(UserError, match=f"column {name}: {words}"):
            tables_io.read_table(rq_pq)
    pq.write_table(table.set_column(table.schema.get_field_index("priority"), "priority",
                                    table.column("priority").cast(pa.int32())), rq_pq)
    assert tables_io.tables_equal(tables_io.read_table(rq_pq), tables_io.read_table(rq))  # int32 is an integer
    rq_pq.write_bytes(b"PAR1 not really PAR1")
    with pytest.raises(UserError, match="not a readable Parquet file"):
        tables_io.read_table(rq_pq)
