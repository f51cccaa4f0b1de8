"""Trace loading and validation: every error names the row and the column, before anything runs."""

import numpy as np
import pytest

from decodesched import TraceError, load_trace
from decodesched.trace import TRACE_COLUMNS

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


def test_extreme_ids_are_fine_but_overflowing_values_are_refused():
    base = dict(arrival_step=0, prompt_len=1, max_new_tokens=1, priority=0, cache_hit=False,
                required_blocks=1, deadline_step=None, preemptible=True)
    t = load_trace([dict(base, request_id=-(2**63)), dict(base, request_id=2**63 - 1)])
    assert t.request_id.tolist() == [-(2**63), 2**63 - 1]
    with pytest.raises(TraceError, match="prompt_len: must be <= 2\\*\\*40"):
        load_trace([dict(base, request_id=1, prompt_len=2**41)])
    with pytest.raises(TraceError, match="priority"):
        load_trace([dict(base, request_id=1, priority=-(2**60))])


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
