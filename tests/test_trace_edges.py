"""Edge cases of load_trace: pandas' nullable columns and NA, odd column containers and dtypes, masked and
float32 deadlines, blank lines before a CSV header.  Every bad input is a TraceError naming where."""

import numpy as np
import pytest

from decodesched import TraceError, load_trace
from decodesched.trace import TRACE_COLUMNS

HEADER = ",".join(TRACE_COLUMNS)
LINES = ["1,0,4,3,0,false,2,,true", "2,0,2,2,5,true,3,10,true", "3,1,3,4,1,false,4,6,false",
         "-4,2,5,1,-2,false,1,,true"]


def base(**kw):
    cols = dict(request_id=[1, 2], arrival_step=[0, 3], prompt_len=[4, 2], max_new_tokens=[2, 1], priority=[0, 5],
                cache_hit=[False, True], required_blocks=[1, 1], deadline_step=[None, 9], preemptible=[True, True])
    return {**cols, **kw}


def csv_trace(tmp_path, text, name="t.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


# --- 1. pandas' nullable columns: NA (and NaT) is no deadline, a missing value elsewhere ------------------

def test_load_trace_reads_back_trace_frame(tmp_path):
    pytest.importorskip("pandas")
    from decodesched.frames import trace_frame

    t = load_trace(csv_trace(tmp_path, "\n".join([HEADER, *LINES]) + "\n"))
    frame = trace_frame(t)
    assert str(frame["deadline_step"].dtype) == "Int64" and frame["deadline_step"].isna().sum() == 2
    back = load_trace(frame)
    assert back.rows() == t.rows()
    assert back.has_deadline.tolist() == [False, True, True, False] and back.deadline_step.tolist() == [0, 10, 6, 0]


@pytest.mark.parametrize("deadline", ["Int64-NA", "object-NA", "object-NaT", "UInt8-NA", "Float32-NA", "series-NA"])
def test_pandas_na_and_nat_deadlines_are_no_deadline(deadline):
    pd = pytest.importorskip("pandas")
    column = {
        "Int64-NA": pd.array([None, 9], dtype="Int64"),
        "object-NA": pd.Series([pd.NA, 9], dtype=object),
        "object-NaT": [pd.NaT, 9],
        "UInt8-NA": pd.array([pd.NA, 9], dtype="UInt8"),
        "Float32-NA": pd.array([None, 9.0], dtype="Float32"),
        "series-NA": pd.Series([pd.NA, 9], dtype="Int64", index=[7, 3]),  # by position, not by label
    }[deadline]
    for source in (pd.DataFrame(base(deadline_step=column)), base(deadline_step=column)):
        t = load_trace(source)
        assert t.has_deadline.tolist() == [False, True] and t.deadline_step.tolist() == [0, 9]


@pytest.mark.parametrize("column, values", [
    ("prompt_len", ["Int64", [4, None]]),
    ("request_id", ["object", [1, "NA"]]),
    ("cache_hit", ["boolean", [True, None]]),
    ("preemptible", ["object", [True, "NaT"]]),
])
def test_pandas_na_in_a_required_column_is_a_missing_value(column, values):
    pd = pytest.importorskip("pandas")
    dtype, cells = values
    cells = [{"NA": pd.NA, "NaT": pd.NaT}.get(v, v) if isinstance(v, str) else v for v in cells]
    frame = pd.DataFrame(base(**{column: pd.array(cells, dtype=dtype)}))
    with pytest.raises(TraceError, match=rf"^<dataframe>: row 2, column {column}: missing value$"):
        load_trace(frame)
    with pytest.raises(TraceError, match=rf"^<rows>: row 2, column {column}: missing value$"):
        load_trace(frame.astype(object).to_dict("records"))


def test_nullable_columns_without_na_load_as_their_values():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(base(prompt_len=pd.array([4, 2], dtype="Int64"), priority=pd.array([0, 5], dtype="Int32"),
                              cache_hit=pd.array([False, True], dtype="boolean"),
                              preemptible=pd.array([True, False], dtype="boolean"),
                              deadline_step=pd.array([5, 9], dtype="Int64")))
    t = load_trace(frame)
    assert t.prompt_len.tolist() == [4, 2] and t.priority.tolist() == [0, 5]
    assert t.cache_hit.tolist() == [False, True] and t.preemptible.tolist() == [True, False]
    assert t.has_deadline.tolist() == [True, True] and t.deadline_step.tolist() == [5, 9]
    with pytest.raises(TraceError, match=r"^<dataframe>: row 2, column cache_hit: expected true/false \(or 1/0\)"):
        load_trace(frame.assign(cache_hit=pd.array([1, 2], dtype="Int64")))
    with pytest.raises(TraceError, match=r"^<dataframe>: row 1, column prompt_len: expected an integer, got True$"):
        load_trace(frame.assign(prompt_len=pd.array([True, False], dtype="boolean")))


# --- 2. odd containers and dtypes: a TraceError, never a raw AttributeError / TypeError ----------------------

@pytest.mark.parametrize("copies, words", [(2, "twice"), (3, "3 times")])
def test_a_duplicated_dataframe_column_is_named(copies, words):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(base())
    frame = pd.concat([frame] + [frame[["priority"]]] * (copies - 1), axis=1)
    with pytest.raises(TraceError, match=rf"^<dataframe>: column priority appears {words}$"):
        load_trace(frame)


@pytest.mark.parametrize("column, value, match", [
    ("arrival_step", np.array([0, 3], "timedelta64[s]"), "column arrival_step: expected integers, got timedelta64"),
    ("deadline_step", np.array([5, 9], "datetime64[s]"), "column deadline_step: expected integers, got datetime64"),
    ("cache_hit", np.array([0, 1], dtype="timedelta64[ns]"), "column cache_hit: expected true/false values, got time"),
    ("request_id", {1, 2}, "column request_id: expected a sequence of integers, got set"),
    ("preemptible", frozenset([True, False]), "column preemptible: expected a sequence of true/false values, got froz"),
    ("prompt_len", {0: 4, 1: 2}, "column prompt_len: expected a sequence of integers, got dict"),
    ("arrival_step", [np.timedelta64(0, "s"), 3], r"row 1, column arrival_step: expected an integer, got np\.timedel"),
])
def test_odd_columns_are_trace_errors(column, value, match):
    with pytest.raises(TraceError, match="^<arrays>.*" + match):
        load_trace(base(**{column: value}))


def test_pandas_date_and_duration_columns_are_trace_errors():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(base(arrival_step=pd.to_timedelta([0, 3], unit="s")))
    with pytest.raises(TraceError, match=r"^<dataframe>, column arrival_step: expected integers, got timedelta64"):
        load_trace(frame)
    frame = pd.DataFrame(base(deadline_step=pd.to_datetime(["2024-01-01", None])))
    with pytest.raises(TraceError, match=r"^<dataframe>, column deadline_step: expected integers, got datetime64"):
        load_trace(frame)


# --- 3. masked cells: no deadline, never blamed for another cell's error ------------------------------------

def test_a_masked_deadline_is_not_blamed_for_another_rows_overflow(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    cols = {k: v for k, v in base().items() if k != "deadline_step"}
    path = tmp_path / "u.parquet"
    pq.write_table(pa.table({**cols, "deadline_step": pa.array([None, 2**64 - 1], pa.uint64())}), path)
    with pytest.raises(TraceError, match=r"^\S*u\.parquet: row 2, column deadline_step: 18446744073709551615 does not "
                                         r"fit in int64$"):
        load_trace(path)
    masked = np.ma.MaskedArray(np.array([2**64 - 1, 2**64 - 1], np.uint64), mask=[True, False])
    with pytest.raises(TraceError, match=r"^<arrays>: row 2, column deadline_step: 18446744073709551615 does not fit"):
        load_trace(base(deadline_step=masked))


@pytest.mark.parametrize("deadline", [
    np.ma.masked_invalid(np.array([np.nan, 9.0])),
    np.ma.MaskedArray(np.array([1.5, 9.0], np.float32), mask=[True, False]),
    np.ma.MaskedArray(np.array([2**64 - 1, 9], np.uint64), mask=[True, False]),
    np.ma.MaskedArray(np.array([-3, 9], np.int8), mask=[True, False]),
])
def test_masked_deadlines_of_any_dtype_are_no_deadline(deadline):
    t = load_trace(base(deadline_step=deadline))
    assert t.has_deadline.tolist() == [False, True] and t.deadline_step.tolist() == [0, 9]


def test_a_masked_cell_in_a_required_column_is_a_missing_value():
    prompt = np.ma.MaskedArray(np.array([4.0, 2.0]), mask=[False, True])
    with pytest.raises(TraceError, match=r"^<arrays>: row 2, column prompt_len: missing value$"):
        load_trace(base(prompt_len=prompt))


# --- 4. NaN of any float dtype is no deadline -------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.longdouble])
def test_nan_deadlines_of_any_float_dtype_are_no_deadline(dtype):
    t = load_trace(base(deadline_step=np.array([np.nan, 9], dtype)))
    assert t.has_deadline.tolist() == [False, True] and t.deadline_step.tolist() == [0, 9]
    t = load_trace(base(deadline_step=[dtype("nan"), dtype(9)]))
    assert t.has_deadline.tolist() == [False, True] and t.deadline_step.tolist() == [0, 9]
    with pytest.raises(TraceError, match=r"^<arrays>: row 1, column priority: missing value$"):
        load_trace(base(priority=np.array([np.nan, 5], dtype)))


# --- 5. CSV: blank lines before the header are skipped too; a blank file is an empty file ---------------------

@pytest.mark.parametrize("before", ["\n", "\n\n", "  \n\t\n", "\r\n", ",,\n"])
def test_blank_lines_before_the_header_are_skipped(tmp_path, before):
    want = load_trace(csv_trace(tmp_path, "\n".join([HEADER, *LINES]) + "\n", "t.csv")).rows()
    assert load_trace(csv_trace(tmp_path, before + "\n".join([HEADER, *LINES]) + "\n", "b.csv")).rows() == want


def test_line_numbers_count_the_skipped_blank_lines(tmp_path):
    text = "\n\n" + HEADER + "\n" + LINES[0] + "\n\n" + "5,0,0,1,0,false,1,,true\n"  # the bad row is on line 6
    with pytest.raises(TraceError, match=r"^\S*b\.csv: row 2 \(line 6\), column prompt_len: must be positive; got 0$"):
        load_trace(csv_trace(tmp_path, text, "b.csv"))
    text = "\n" + HEADER + "\n" + "1,0,4,3,0,false,2,,maybe\n"
    with pytest.raises(TraceError, match=r"^\S*b\.csv: row 1 \(line 3\), column preemptible: expected true/false"):
        load_trace(csv_trace(tmp_path, text, "b.csv"))


@pytest.mark.parametrize("text", ["", "\n", "\n\n\n", "  \n \t \n", "\r\n\r\n", "\ufeff\n"])
def test_a_file_of_blank_lines_is_an_empty_file(tmp_path, text):
    with pytest.raises(TraceError, match=r"^\S*e\.csv: empty file \(expected the header request_id,arrival_step,"):
        load_trace(csv_trace(tmp_path, text, "e.csv"))


def test_the_cli_inspects_a_trace_with_a_blank_first_line(tmp_path, capsys):
    from decodesched.cli import main

    path = csv_trace(tmp_path, "\n" + "\n".join([HEADER, *LINES]) + "\n", "blank_first.csv")
    assert main(["trace", "inspect", str(path)]) in (0, None)
    assert "rows             4" in capsys.readouterr().out


def _two_requests():
    return load_trace(dict(request_id=[1, 2], arrival_step=[0, 6], prompt_len=[1, 1], max_new_tokens=[1, 1],
                           priority=[0, 0], cache_hit=[False, False], required_blocks=[1, 1],
                           deadline_step=[None, 9], preemptible=[True, True]))


def test_a_replaced_trace_replays_its_new_arrivals_not_the_old_order():
    """`dataclasses.replace` on a Trace once copied its cached arrival order: the replay enqueued the
    rows in the old order, and request 1 ran before it arrived."""
    import dataclasses

    import decodesched

    t = _two_requests()
    decodesched.simulate(t, "fcfs", 4)  # caches the arrival order
    moved = dataclasses.replace(t, arrival_step=np.array([6, 0]), deadline_step=np.array([0, 5]))
    fresh = load_trace(dict(moved.columns()))
    got, want = decodesched.simulate(moved, "fcfs", 4), decodesched.simulate(fresh, "fcfs", 4)
    assert got.timeline() == want.timeline()
    assert [e["request_id"] for e in got.timeline()] == [2, 2, 1, 1]


@pytest.mark.parametrize("change, match", [
    (dict(max_new_tokens=np.array([0, 1])), "row 1, column max_new_tokens: must be positive"),
    (dict(required_blocks=np.array([1, -5])), "row 2, column required_blocks"),
    (dict(priority=np.array([2**60, 0])), "column priority"),
    (dict(request_id=np.array([3, 3])), "duplicate request_id"),
    (dict(request_id=np.arange(10**5)), "columns have different lengths"),  # was a segmentation fault
    (dict(has_deadline=np.array([1, 0])), "has_deadline must be a boolean array"),
    (dict(deadline_step=np.array([0, 6]), has_deadline=np.array([False, True])), "must be after its arrival_step"),
    (dict(cache_hit=np.array([2, 0])), "column cache_hit"),
])
def test_a_trace_built_without_load_trace_is_checked_before_a_replay(change, match):
    import dataclasses

    import decodesched

    bad = dataclasses.replace(_two_requests(), **change)
    with pytest.raises(TraceError, match=match):
        decodesched.simulate(bad, "aging", 4)
    with pytest.raises(TraceError, match=match):
        decodesched.simulate_batch([bad], decodesched.grid(1, ["fcfs"], [4], [4]))


def test_a_checked_trace_is_not_checked_again_and_a_valid_replaced_one_is_equal():
    import dataclasses

    t = _two_requests()
    assert load_trace(t) is t and load_trace(t.subset([1, 0])) is not None
    again = load_trace(dataclasses.replace(t, name="renamed"))
    assert again is not t and again.name == "renamed" and load_trace(again) is again
    for name, col in t.columns().items():
        assert list(again.columns()[name]) == list(col), name


def test_a_subset_that_repeats_a_row_is_checked_again_even_by_a_negative_index():
    import decodesched

    t = _two_requests()
    assert load_trace(t.subset([0, 1])) is not None
    for rows in ([1, 1], [1, -1], [-2, 0]):
        with pytest.raises(TraceError, match="duplicate request_id"):
            decodesched.simulate(t.subset(rows), "fcfs", 4)


def test_a_subset_by_boolean_mask_takes_the_rows_where_it_is_true():
    """A mask was read as row indices 1 and 0: ``t.subset(t.priority > 0)`` gave rows [0, 1] of a
    two-row trace (both rows, silently), or repeated row 1 in a longer one.  Floats were truncated
    to indices; a 2-D index made a trace of 2-D columns (refused only when replayed)."""
    import decodesched

    t = load_trace(base())
    assert t.subset(t.priority > 0).request_id.tolist() == [2]
    assert t.subset(np.array([True, True])).request_id.tolist() == [1, 2]
    assert t.subset(np.zeros(2, bool)).request_id.tolist() == []
    assert t.subset([]).request_id.tolist() == [] and t.subset(range(2)).request_id.tolist() == [1, 2]
    assert t.subset(np.array([1, 0], np.uint8)).request_id.tolist() == [2, 1]
    assert decodesched.simulate(t.subset(t.priority > 0), "fcfs", 4).n_events == 2
    for rows, match in (([True], "one entry per row"), ([0.9, 1.2], "integer row indices"),
                        ([[0, 1]], "1-D sequence"), (0, "1-D sequence"),
                        (np.array([2**64 - 1], np.uint64), "integer row indices")):
        with pytest.raises(IndexError, match=match):
            t.subset(rows)


def test_a_loaded_trace_is_read_only_so_no_edit_reaches_the_kernels_unchecked():
    """Every replay trusts a checked trace. An edit in place used to skip the checks: a negative
    required_blocks segfaulted the fast kernel, a moved arrival left the cached order stale. Now the
    columns are read-only views; a changed trace is made with dataclasses.replace and checked again."""
    import dataclasses
    import pickle

    from decodesched import simulate
    from decodesched.engine import trace_arrays
    from decodesched.synthetic import backlog_trace

    t = backlog_trace(57, seed=99)
    for name in TRACE_COLUMNS + ("has_deadline",):
        with pytest.raises(ValueError, match="read-only"):
            getattr(t, name)[0] = getattr(t, name)[0]
    with pytest.raises(ValueError, match="read-only"):
        t.arrival_order[0] = 1
    before = simulate(t, "fixed_priority", 28, engine="fast").requests
    # the kernels get writable arrays (one Numba type, one compiled kernel), the trace's own, not copies
    from decodesched.kernels.fields import KERNEL_TRACE_ARGS

    for a, name in zip(trace_arrays(t), KERNEL_TRACE_ARGS):
        assert a.flags.writeable and np.shares_memory(a, t.arrival_order if name == "order" else getattr(t, name))
    bad = dataclasses.replace(t, required_blocks=np.where(np.arange(len(t)) == 43, -2**62, t.required_blocks))
    with pytest.raises(TraceError, match="row 44, column required_blocks: must be positive"):
        simulate(bad, "fixed_priority", 28, engine="fast")
    moved = dataclasses.replace(t, arrival_step=t.arrival_step[::-1].copy())
    assert _same(simulate(moved, "fixed_priority", 28, engine="fast").requests,
                 simulate(moved, "fixed_priority", 28, engine="scan").requests)
    t.arrival_order  # (cached, so pickled too)
    buffers = []
    for again in (pickle.loads(pickle.dumps(t)),  # read-only after unpickling too; replays the same
                  pickle.loads(pickle.dumps(t, protocol=5, buffer_callback=buffers.append), buffers=buffers)):
        with pytest.raises(ValueError, match="read-only"):
            again.priority[0] = 5
        with pytest.raises(ValueError, match="read-only"):
            again.arrival_order[0] = 1
        assert _same(simulate(again, "fixed_priority", 28, engine="fast").requests, before)
        # the kernels' arrays are the same each replay (protocol 5 unpickles read-only buffers: copied once)
        assert all(a is b for a, b in zip(trace_arrays(again), trace_arrays(again)))
    assert t.subset(np.arange(10)).priority.flags.writeable is False


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f") for k in a)


@pytest.mark.parametrize("extra, words", [
    ([f"x{i}" for i in range(5000)], "unexpected column(s) x0, x1, x2, x3, x4, ... (5000 in all)"),
    (["priority"] * 5000, "duplicate column(s) priority"),
    (["y" * 5000], "unexpected column(s) 'yyyyyyyyyyyyyyyyyyyyyyyyyyy"),
])
def test_a_header_of_thousands_of_columns_is_one_short_line(tmp_path, extra, words):
    # (the duplicates were counted in O(columns**2): 10**6 columns did not finish in a minute; every
    # extra column was listed in the message)
    path = tmp_path / "wide.csv"
    path.write_text(",".join(TRACE_COLUMNS + tuple(extra)) + "\n1,0,1,1,0,true,1,,true\n")
    with pytest.raises(TraceError) as err:
        load_trace(path)
    message = str(err.value)
    assert words in message and len(message) < 400 and "\n" not in message, message


@pytest.mark.parametrize("scale", [True, np.True_, "2", [1], 0, -1.0, float("nan"), float("inf")])
def test_a_time_scale_that_is_not_a_positive_number_is_refused(scale):
    rows = [dict(request_id=1, arrival_step=0, prompt_len=1, max_new_tokens=1, priority=0, cache_hit=False,
                 required_blocks=1, deadline_step=None, preemptible=True)]
    with pytest.raises(TraceError, match="steps_per_second must be a positive number"):
        load_trace(rows, steps_per_second=scale)
