"""Trace loading and validation: every error names the row and the column, before anything runs."""

import numpy as np
import pytest

from decodesched import TraceError, load_trace
from decodesched.trace import BOOL_COLUMNS, TRACE_COLUMNS

HEADER = ",".join(TRACE_COLUMNS)
GOOD = ["1,0,4,2,0,false,1,,true", "-7,3,2,1,2,true,3,9,false"]


def write(tmp_path, lines, header=HEADER, name="t.csv"):
    p = tmp_path / name
    p.write_text("\n".join([header] + lines) + "\n" if header is not None else "\n".join(lines))
    return p


def test_reads_the_canonical_csv(tmp_path):
    t = load_trace(write(tmp_path, GOOD))
    assert t.request_id.tolist() == [1, -7]
    assert t.has_deadline.tolist() == [False, True] and t.deadline_step[1] == 9
    assert t.cache_hit.tolist() == [False, True] and t.preemptible.tolist() == [True, False]
    assert t.request_id.dtype == np.int64 and t.cache_hit.dtype == np.bool_
    assert t.arrival_order.tolist() == [0, 1]


def test_booleans_accept_one_and_zero(tmp_path):
    t = load_trace(write(tmp_path, ["1,0,4,2,0,1,1,,0"]))
    assert t.cache_hit[0] and not t.preemptible[0]


def test_csv_round_trip(tmp_path):
    t = load_trace(write(tmp_path, GOOD))
    t.to_csv(tmp_path / "out.csv")
    assert load_trace(tmp_path / "out.csv").rows() == t.rows()


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    t = load_trace(write(tmp_path, GOOD))
    cols = t.columns()
    table = pa.table({k: list(v) for k, v in cols.items()})
    pq.write_table(table, tmp_path / "t.parquet")
    assert load_trace(tmp_path / "t.parquet").rows() == t.rows()


@pytest.mark.parametrize(
    "lines, header, match",
    [
        ([], None, "empty file"),
        ([], HEADER, "empty"),
        (GOOD, HEADER.replace(",priority", ""), "missing column.*priority"),
        (GOOD, HEADER + ",color", "unexpected column.*color"),
        (["2023-11-16 18:15:46.6805900,374,44"], "TIMESTAMP,ContextTokens,GeneratedTokens",
         r"an Azure LLM trace, not a canonical trace: convert it first \(decodesched trace convert"),
        (['{"timestamp": 0, "input_length": 3, "output_length": 2, "hash_ids": [0]}'],
         '{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1]}',
         "Mooncake JSON lines, not a canonical trace: convert it first"),
        (["1,0,4,2.5,0,false,1,,true"], HEADER, r"row 1 \(line 2\), column max_new_tokens: expected an integer"),
        (["1,0,4,2,0,maybe,1,,true"], HEADER, "row 1.*column cache_hit"),
        (GOOD + ["1,5,4,2,0,false,1,,true"], HEADER, r"row 3.*request_id: duplicate request_id 1 \(also in row 1\)"),
        (["1,0,0,2,0,false,1,,true"], HEADER, "row 1.*prompt_len: must be positive"),
        (["1,0,4,0,0,false,1,,true"], HEADER, "max_new_tokens: must be positive"),
        (["1,0,4,2,0,false,0,,true"], HEADER, "required_blocks: must be positive"),
        (GOOD + ["3,-1,4,2,0,false,1,,true"], HEADER, "row 3.*arrival_step: must be >= 0"),
        (["1,5,4,2,0,false,1,5,true"], HEADER, "deadline_step: must be after its arrival_step; got 5"),
        (["1,0,4,2,,false,1,,true"], HEADER, "row 1.*priority: missing value"),
        (["1,0,4,2,0,false,1,true"], HEADER, "8 fields, expected 9"),
        (["99999999999999999999,0,4,2,0,false,1,,true"], HEADER, "does not fit in int64"),
    ],
)
def test_errors_name_row_and_column(tmp_path, lines, header, match):
    with pytest.raises(TraceError, match=match):
        load_trace(write(tmp_path, lines, header=header))


def test_arrays_and_row_dicts():
    cols = {c: [] for c in TRACE_COLUMNS}
    for rid in (3, 1):
        for c, v in zip(TRACE_COLUMNS, (rid, 2, 4, 2, 0, False, 1, None, True)):
            cols[c].append(v)
    t = load_trace(cols)
    assert load_trace(t.rows()).rows() == t.rows()
    cols["prompt_len"][1] = -4
    with pytest.raises(TraceError, match="row 2, column prompt_len"):
        load_trace(cols)
    # a column that is not a 1-D sequence is named, not reported as a length mismatch or a TypeError
    for bad, words in ((None, "got None"), (5, "got 5"), ("01", "got '01'"),
                       (np.array([[3, 1]]), r"got an array of shape \(1, 2\)")):
        with pytest.raises(TraceError, match=f"column preemptible: expected a 1-D column of values, {words}"):
            load_trace(dict(cols, preemptible=bad))


def test_rows_that_are_not_mappings_are_named():
    row = {c: v for c, v in zip(TRACE_COLUMNS, (3, 2, 4, 2, 0, False, 1, None, True))}
    for bad in (1, None, [3, 2], "row"):
        with pytest.raises(TraceError, match=r"<rows>: row 2: expected a mapping of column values, got "):
            load_trace([row, bad])


def test_extreme_ids_are_fine_but_overflowing_values_are_refused():
    base = dict(arrival_step=0, prompt_len=1, max_new_tokens=1, priority=0, cache_hit=False,
                required_blocks=1, deadline_step=None, preemptible=True)
    t = load_trace([dict(base, request_id=-(2**63)), dict(base, request_id=2**63 - 1)])
    assert t.request_id.tolist() == [-(2**63), 2**63 - 1]
    with pytest.raises(TraceError, match="prompt_len: must be <= 2\\*\\*40"):
        load_trace([dict(base, request_id=1, prompt_len=2**41)])
    with pytest.raises(TraceError, match="priority"):
        load_trace([dict(base, request_id=1, priority=-(2**60))])
    # int64's least value has no absolute value in int64: it must be refused too (it was accepted once)
    for priority in (-(2**63), -(2**53) - 1, 2**53 + 1, 2**63 - 1):
        with pytest.raises(TraceError, match=r"row 1, column priority: must be within \+-2\*\*53"):
            load_trace([dict(base, request_id=1, priority=priority)])
        with pytest.raises(TraceError, match=r"row 1, column priority: must be within \+-2\*\*53"):
            load_trace({k: np.array([v], np.int64) for k, v in dict(base, request_id=1, priority=priority).items()
                        if k != "deadline_step"} | {"deadline_step": [None]})
    t = load_trace([dict(base, request_id=1, priority=-(2**53)), dict(base, request_id=2, priority=2**53)])
    assert t.priority.tolist() == [-(2**53), 2**53]


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="directory"):
        load_trace(tmp_path)


def test_time_scale_from_the_sidecar(tmp_path):
    p = write(tmp_path, GOOD)
    (tmp_path / "t.csv.meta.json").write_text('{"steps_per_second": 12.5}')
    assert load_trace(p).steps_per_second == 12.5
    (tmp_path / "t.csv.meta.json").write_text('{"steps_per_second": -1}')
    with pytest.raises(TraceError, match="steps_per_second"):
        load_trace(p)


def _typed_columns(rows):
    """The same trace as plain NumPy columns (ints and bools typed, deadlines masked) and as lists."""
    lists = {c: [r[c] for r in rows] for c in TRACE_COLUMNS}
    arrays = {c: np.array(v, dtype=bool if c in BOOL_COLUMNS else np.int64)
              for c, v in lists.items() if c != "deadline_step"}
    deadline = lists["deadline_step"]
    arrays["deadline_step"] = np.ma.MaskedArray([0 if d is None else d for d in deadline],
                                                mask=[d is None for d in deadline])
    return arrays, lists


def _write_parquet(lists, path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({c: pa.array(v) for c, v in lists.items()}), path)
    return path


def _rows(n, seed):
    rng = np.random.default_rng(seed)
    return [{"request_id": int(i), "arrival_step": int(rng.integers(0, 50)), "prompt_len": int(rng.integers(1, 9)),
             "max_new_tokens": int(rng.integers(1, 9)), "priority": int(rng.integers(-2**53, 2**53)),
             "cache_hit": bool(rng.random() < 0.5), "required_blocks": int(rng.integers(1, 5)),
             "deadline_step": None if rng.random() < 0.5 else int(rng.integers(60, 2**53)),
             "preemptible": bool(rng.random() < 0.5)} for i in rng.permutation(n)]


@pytest.mark.parametrize("seed", range(5))
def test_typed_columns_read_as_their_values_one_by_one(tmp_path, seed):
    """NumPy columns (checked column-wise) and Parquet files (typed, with null deadlines) give the
    trace the same values give as Python lists (checked one by one)."""
    arrays, lists = _typed_columns(_rows(300, seed))
    want = load_trace(lists).rows()
    assert load_trace(arrays).rows() == want
    assert load_trace({**arrays, "deadline_step": lists["deadline_step"]}).rows() == want
    pq = pytest.importorskip("pyarrow.parquet")
    path = _write_parquet(lists, tmp_path / "t.parquet")
    schema = pq.read_schema(path)
    assert str(schema.field("priority").type) == "int64" and str(schema.field("cache_hit").type) == "bool"
    assert pq.read_table(path).column("deadline_step").null_count > 0
    assert load_trace(path).rows() == want


@pytest.mark.parametrize("column, value, match", [
    ("priority", np.array([2**63, 1], np.uint64), "row 1, column priority: 9223372036854775808 does not fit in int64"),
    ("prompt_len", np.array([True, True]), "row 1, column prompt_len: expected an integer"),
    ("prompt_len", np.array([[1, 2], [3, 4]]), r"column prompt_len: expected a 1-D column of values, got an array of "
                                               r"shape \(2, 2\)"),
    ("cache_hit", np.array([1, 2]), "row 2, column cache_hit: expected true/false"),
    ("deadline_step", np.ma.MaskedArray([1.5, 0.0], mask=[False, True]), "row 1, column deadline_step"),
    ("required_blocks", np.array([1, 0], np.int8), "row 2, column required_blocks: must be positive"),
    # found by a fuzz of load_trace: a deadline past int64 ended in an OverflowError
    ("deadline_step", np.array([2**64 - 1, 5], np.uint64), "row 1, column deadline_step: 18446744073709551615 does "
                                                            "not fit in int64"),
    ("deadline_step", [None, 10**30], "row 2, column deadline_step: 1000000000000000000000000000000 does not fit"),
    ("priority", [1, -(10**4000)], r"row 2, column priority: -1000.*\(4002 chars\) does not fit in int64"),
    ("priority", [1, 10**5000], r"row 2, column priority: an integer of 16610 bits does not fit in int64"),
])
def test_typed_columns_are_checked_like_values(column, value, match):
    arrays, _ = _typed_columns(_rows(2, 0))
    with pytest.raises(TraceError, match=match):
        load_trace({**arrays, column: value})


def test_parquet_nulls_outside_deadlines_are_missing_values(tmp_path):
    _, lists = _typed_columns(_rows(3, 1))
    lists["prompt_len"][1] = None
    with pytest.raises(TraceError, match="row 2, column prompt_len: missing value"):
        load_trace(_write_parquet(lists, tmp_path / "t.parquet"))


def test_parquet_columns_of_another_type_are_checked_value_by_value(tmp_path):
    """A boolean column where an integer belongs (or the reverse) is not taken as typed: its error shows
    the value as the file holds it."""
    _, lists = _typed_columns(_rows(2, 2))
    lists["prompt_len"] = [True, False]
    with pytest.raises(TraceError, match="row 1, column prompt_len: expected an integer, got True$"):
        load_trace(_write_parquet(lists, tmp_path / "t.parquet"))
    _, lists = _typed_columns(_rows(2, 2))
    lists["cache_hit"] = [1, 0]  # 1/0 stand for true/false
    assert load_trace(_write_parquet(lists, tmp_path / "t.parquet")).cache_hit.tolist() == [True, False]
