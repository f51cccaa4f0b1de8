"""The Python API as a researcher uses it: Arrow tables in, CSV traces out (stop 59)."""

import pytest
from hypothesis import given, settings, strategies as st

import decodesched
from decodesched import TraceError, load_trace, simulate
from decodesched.errors import UserError

pa = pytest.importorskip("pyarrow")
frames = pytest.importorskip("decodesched.frames")

COLUMNS = {
    "request_id": [1, 2, 3, 4],
    "arrival_step": [0, 0, 2, 3],
    "prompt_len": [3, 2, 4, 1],
    "max_new_tokens": [2, 3, 1, 2],
    "priority": [0, 2, 1, 0],
    "cache_hit": [False, True, False, True],
    "required_blocks": [2, 1, 2, 1],
    "deadline_step": [None, 9, None, 12],
    "preemptible": [True, False, True, True],
}


def one_line(exc, *words):
    text = str(exc.value)
    assert "\n" not in text
    for w in words:
        assert w in text, text


def test_a_trace_made_into_an_arrow_table_loads_back_with_its_time_scale():
    """`load_trace(frames.to_arrow(trace))` was "cannot read a trace from Table", though `to_arrow` stores the time
    scale for `load_trace` and `to_parquet` of the same table loaded back."""
    trace = load_trace(COLUMNS, steps_per_second=2.5)
    table = frames.to_arrow(trace)
    for arrow in (table, table.to_batches()[0]):
        back = load_trace(arrow)
        assert back == trace and back.steps_per_second == 2.5
        assert simulate(arrow, "deadline", 3) == simulate(trace, "deadline", 3)
    assert load_trace(table, steps_per_second=4.0).steps_per_second == 4.0  # (a time scale given wins)


def test_a_mapping_of_arrow_arrays_loads_as_their_values():
    """A mapping of pyarrow arrays was refused cell by cell: "expected an integer, got <pyarrow.Int64Scalar: 1>";
    booleans and nulls (no deadline) are read as a Parquet file's are."""
    want = load_trace(COLUMNS)
    arrays = {name: pa.array(values) for name, values in COLUMNS.items()}
    assert load_trace(arrays) == want
    chunked = {name: pa.chunked_array([values[:1], values[1:]], arrays[name].type) for name, values in COLUMNS.items()}
    assert load_trace(chunked) == want
    assert load_trace({**COLUMNS, "priority": pa.array([0.0, 2.0, 1.0, 0.0])}) == want  # (whole floats, as NumPy's)


@pytest.mark.parametrize("change, words", [
    (lambda t: t.append_column("priority", t.column("priority")), ["<arrow>: duplicate column(s) priority"]),
    (lambda t: t.set_column(4, "priority", pa.array([0, None, 1, 0])), ["row 2, column priority: missing value"]),
    (lambda t: t.set_column(4, "priority", pa.array(["0", "x", "1", "0"])), ["row 2, column priority", "'x'"]),
    (lambda t: t.set_column(5, "cache_hit", pa.array([0, 1, 2, 0])), ["row 3, column cache_hit", "got 2"]),
    (lambda t: t.drop_columns(["preemptible"]), ["missing column(s) preemptible"]),
    (lambda t: t.slice(0, 0), ["the trace is empty"]),
    (lambda t: t.replace_schema_metadata({b"decodesched.steps_per_second": b"-1"}),
     ["steps_per_second", "positive number", "'-1'"]),
])
def test_a_bad_arrow_table_is_one_trace_error_naming_it(change, words):
    table = change(frames.to_arrow(load_trace(COLUMNS)))
    with pytest.raises(TraceError) as exc:
        load_trace(table)
    one_line(exc, "<arrow>", *words)


@settings(derandomize=True, max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 9), st.integers(1, 5), st.integers(-3, 3),
                          st.booleans(), st.integers(1, 4), st.one_of(st.none(), st.integers(1, 40)), st.booleans()),
                min_size=1, max_size=12))
def test_an_arrow_table_replays_as_the_same_columns_given_as_lists(rows):
    cols = {name: [r[j] for r in rows] for j, name in enumerate(
        ["arrival_step", "prompt_len", "max_new_tokens", "priority", "cache_hit", "required_blocks", "deadline_step",
         "preemptible"])}
    cols["deadline_step"] = [None if d is None else a + d for a, d in zip(cols["arrival_step"], cols["deadline_step"])]
    cols = {"request_id": list(range(100, 100 + len(rows))), **cols}
    table = pa.table(cols)
    assert load_trace(table) == load_trace(cols)
    assert simulate(table, "aging", 5, 2) == simulate(cols, "aging", 5, 2)


@pytest.mark.parametrize("name", ["t.parquet", "T.PQ"])
def test_a_csv_trace_is_not_written_under_a_parquet_name(tmp_path, name):
    """`trace.to_csv("t.parquet")` wrote CSV text that `load_trace("t.parquet")` then refused ("not a readable
    Parquet file"); an older file of that name was replaced by it."""
    trace = load_trace(COLUMNS, steps_per_second=2.0)
    path = tmp_path / name
    frames.to_parquet(trace, tmp_path / "t.parquet")
    before = sorted(p.name for p in tmp_path.iterdir())
    old = (tmp_path / "t.parquet").read_bytes()
    with pytest.raises(UserError) as exc:
        trace.to_csv(path)
    one_line(exc, name, "to_parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "t.parquet").read_bytes() == old
    assert load_trace(tmp_path / "t.parquet") == load_trace(COLUMNS, steps_per_second=2.0, name="t")


def test_a_csv_trace_still_writes_and_reads_back(tmp_path):
    """Guards the ordinary case beside the refusal above (already right)."""
    trace = load_trace(COLUMNS)
    trace.to_csv(tmp_path / "t.csv")
    assert load_trace(tmp_path / "t.csv", name="trace") == trace
    assert decodesched.simulate(tmp_path / "t.csv", "fcfs", 3).n_events == simulate(trace, "fcfs", 3).n_events


def test_a_csv_trace_keeps_its_time_scale_and_never_takes_an_older_one(tmp_path):
    """`to_csv` wrote no sidecar: a trace with a time scale read back in steps only, and a trace written over a
    converted one read back with the old trace's time scale (and the reports with its source and seed)."""
    path = tmp_path / "t.csv"
    load_trace(COLUMNS, steps_per_second=20.0).to_csv(path)
    assert load_trace(path).steps_per_second == 20.0
    load_trace(COLUMNS, steps_per_second=0.5).to_csv(path)
    assert load_trace(path).steps_per_second == 0.5
    load_trace(COLUMNS).to_csv(path)
    assert load_trace(path).steps_per_second is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_a_failed_csv_write_leaves_the_older_pair(tmp_path):
    """The CSV and its sidecar are written together: a sidecar that cannot be written leaves the older CSV whole."""
    path = tmp_path / "t.csv"
    load_trace(COLUMNS).to_csv(path)
    old = path.read_bytes()
    (tmp_path / "t.csv.meta.json").mkdir()
    with pytest.raises(UserError) as exc:
        load_trace(dict(COLUMNS, priority=[5] * len(COLUMNS["priority"])), steps_per_second=3.0).to_csv(path)
    one_line(exc, "t.csv.meta.json")
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.csv.meta.json"]
