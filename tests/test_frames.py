"""Results as pandas DataFrames, Arrow tables and Parquet files (`decodesched.frames`)."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pq = pytest.importorskip("pyarrow.parquet")

import decodesched  # noqa: E402
from decodesched import frames  # noqa: E402
from decodesched.batch import ROW_KEYS, grid, row_columns, simulate_batch  # noqa: E402
from decodesched.errors import UserError  # noqa: E402

TRACE = {  # a low-priority request that gets preempted, one that can never fit, one with a deadline
    "request_id": [10, 11, 12, 13],
    "arrival_step": [0, 2, 3, 3],
    "prompt_len": [4, 2, 3, 1],
    "max_new_tokens": [5, 2, 1, 3],
    "priority": [0, 5, 1, 2],
    "cache_hit": [False, True, False, False],
    "required_blocks": [3, 3, 9, 1],
    "deadline_step": [None, None, None, 40],
    "preemptible": [True, True, True, False],
}


@pytest.fixture(scope="module")
def result():
    return decodesched.simulate(TRACE, policy="fixed_priority", free_kv_blocks=4)


def test_requests_frame_matches_the_result(result):
    df = frames.requests_frame(result)
    req = result.requests
    assert len(df) == len(TRACE["request_id"])
    assert df["request_id"].tolist() == TRACE["request_id"]
    for col in ("first_step", "first_token_step", "finish_step"):
        raw = req[col]
        assert df[col].dtype == "Int64"
        assert df[col].isna().tolist() == (raw < 0).tolist()
        assert df[col].dropna().tolist() == raw[raw >= 0].tolist()
    assert df["deadline_step"].isna().tolist() == [d is None for d in TRACE["deadline_step"]]
    assert df["deadline_step"].dropna().tolist() == [40]
    assert df["status"].tolist() == req["status"].tolist()
    assert "unservable" in df["status"].tolist()  # the request needing 9 of 4 blocks
    np.testing.assert_array_equal(df["ttft"].to_numpy(), req["ttft"])
    assert result.to_pandas().equals(df)


def test_events_frame_matches_the_timeline(result):
    df = frames.events_frame(result)
    timeline = result.timeline()
    assert len(df) == len(timeline) == result.n_events
    assert list(df.columns)[0] == "step"
    assert any(e["preempted_request_id"] is not None for e in timeline)  # the trace does preempt
    for (_, row), event in zip(df.iterrows(), timeline):
        for key, value in event.items():
            if value is None:
                assert row[key] is pd.NA
            else:
                assert row[key] == value
    assert result.to_pandas("events").equals(df)


def test_metrics_frame_of_a_batch():
    batch = simulate_batch([TRACE], grid(1, ["fcfs", "aging"], [4, 20], [2]))
    df = frames.metrics_frame(batch)
    assert list(df.columns) == row_columns(batch.rows()) and list(df.columns)[:len(ROW_KEYS)] == list(ROW_KEYS)
    assert len(df) == 4
    assert df["policy"].tolist() == ["fcfs", "fcfs", "aging", "aging"]
    assert frames.to_frame(batch).equals(df)
    assert frames.metrics_frame(batch.rows()).equals(df)
    assert batch.to_pandas().equals(df)


def test_parquet_round_trips(result, tmp_path):
    frames.to_parquet(result, tmp_path / "requests.parquet")
    back = pd.read_parquet(tmp_path / "requests.parquet")
    assert back["request_id"].tolist() == TRACE["request_id"]
    assert back["finish_step"].isna().tolist() == (result.requests["finish_step"] < 0).tolist()

    frames.to_parquet(result, tmp_path / "events.parquet", table="events")
    assert len(pq.read_table(tmp_path / "events.parquet")) == result.n_events

    # a trace written as Parquet is read back by load_trace, and replays identically
    frames.to_parquet(result.trace, tmp_path / "trace.parquet")
    again = decodesched.simulate(tmp_path / "trace.parquet", policy="fixed_priority", free_kv_blocks=4)
    assert again.timeline() == result.timeline()

    table = frames.to_arrow(simulate_batch([TRACE], grid(1, ["deadline"], [6], [4])))
    assert table.column_names[:len(ROW_KEYS)] == list(ROW_KEYS) and table.num_rows == 1
    assert "ttft_p99_class5" in table.column_names  # per-class columns of the trace's classes


def test_errors(result, tmp_path, monkeypatch):
    with pytest.raises(UserError, match="unknown table"):
        frames.to_frame(result, "nope")
    for wrong in ("trace.csv", 3, None, [1, 2]):  # was a pandas ValueError or a TypeError from inside
        with pytest.raises(UserError, match="expected"):
            frames.to_frame(wrong)
    with pytest.raises(FileNotFoundError):
        frames.to_parquet(result, tmp_path / "no_dir" / "x.parquet")
    assert not (tmp_path / "no_dir").exists()
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(UserError, match=r"pip install 'decodesched\[data\]'"):
        frames.requests_frame(result)
    with pytest.raises(UserError, match=r"pip install 'decodesched\[data\]'"):
        result.to_pandas()


def test_a_result_as_parquet_never_replaces_its_trace(tmp_path):
    path = tmp_path / "t.parquet"
    frames.to_parquet(decodesched.load_trace(TRACE), path)  # a trace written as Parquet ...
    before = path.read_bytes()
    run = decodesched.simulate(path, "aging", 4)  # ... replayed, and its result aimed at it
    for table in ("requests", "events"):
        with pytest.raises(UserError, match="refusing to overwrite it"):
            frames.to_parquet(run, path, table)
    assert path.read_bytes() == before
    frames.to_parquet(decodesched.load_trace(path), path)  # a trace may rewrite its own file


@pytest.mark.parametrize("name", ["t.csv", "t.json", "t", "-"])
def test_parquet_is_written_under_a_parquet_name_only(tmp_path, name):
    """Every reader takes a name's extension for its format: Parquet bytes under a .csv name would
    turn a CSV (the trace's own source, say) into a file nothing reads."""
    decodesched.load_trace(TRACE).to_csv(tmp_path / "t.csv")
    trace = decodesched.load_trace(tmp_path / "t.csv")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(UserError, match="a Parquet file is named .parquet or .pq"):
        frames.to_parquet(trace, name if name == "-" else tmp_path / name)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_nan_latency_stays_nan(result):
    df = frames.requests_frame(result)
    unservable = df["status"] == "unservable"
    assert all(math.isnan(v) for v in df.loc[unservable, "e2e"])


def test_parquet_keeps_the_time_scale(tmp_path):
    trace = decodesched.load_trace(TRACE, steps_per_second=12.5, name="scaled")
    frames.to_parquet(trace, tmp_path / "t.parquet")
    back = decodesched.load_trace(tmp_path / "t.parquet")
    assert back.steps_per_second == 12.5 and np.array_equal(back.arrival_step, trace.arrival_step)
    assert decodesched.load_trace(tmp_path / "t.parquet", steps_per_second=3.0).steps_per_second == 3.0
    frames.to_parquet(decodesched.load_trace(TRACE), tmp_path / "plain.parquet")  # no time scale: none stored
    assert decodesched.load_trace(tmp_path / "plain.parquet").steps_per_second is None
    # a requests table keeps its trace's scale as well
    r = decodesched.simulate(trace, free_kv_blocks=4)
    assert pq.read_table(tmp_path / "t.parquet").schema.metadata[frames.STEPS_PER_SECOND_KEY] == b"12.5"
    frames.to_parquet(r, tmp_path / "r.parquet")
    assert pq.read_table(tmp_path / "r.parquet").schema.metadata[frames.STEPS_PER_SECOND_KEY] == b"12.5"


def test_parquet_with_a_bad_time_scale_is_a_trace_error(tmp_path):
    table = frames.to_arrow(decodesched.load_trace(TRACE))
    pq.write_table(table.replace_schema_metadata({frames.STEPS_PER_SECOND_KEY: b"-1"}), tmp_path / "bad.parquet")
    with pytest.raises(decodesched.TraceError, match="steps_per_second"):
        decodesched.load_trace(tmp_path / "bad.parquet")
