"""The events and requests readers refuse a word column's unknown word (stop 60): `read_table` read a status
`bogus` or an action `jump` as it was, where every other column's cell is checked; now one line naming the line
(CSV) or row (Parquet) and the column, and the words a writer writes come from the one list (`tables_io.WORDS`)."""

from __future__ import annotations

import csv

import pytest

import decodesched
from decodesched.errors import UserError
from decodesched.tables_io import WORDS, read_table

pq = pytest.importorskip("pyarrow.parquet")

TRACE = {"request_id": [1, 2, 3], "arrival_step": [0, 0, 1], "prompt_len": [4, 2, 3], "max_new_tokens": [3, 2, 2],
         "priority": [0, 5, 1], "cache_hit": [False, True, False], "required_blocks": [2, 1, 2],
         "deadline_step": [None, 4, 9], "preemptible": [True, True, False]}


@pytest.fixture(scope="module")
def result():
    return decodesched.simulate(decodesched.load_trace(TRACE), policy="fixed_priority", free_kv_blocks=3)


def _rewrite_cell(path, column: str, row: int, value: str) -> None:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    rows[1 + row][rows[0].index(column)] = value
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows(rows)


@pytest.mark.parametrize("table, column", [("events", "phase"), ("events", "action"), ("requests", "status")])
def test_every_word_a_writer_writes_is_read_back_and_another_is_refused_naming_its_place(tmp_path, result,
                                                                                         table, column):
    path = tmp_path / f"{table}.csv"
    getattr(result, f"write_{table}")(path)
    written = read_table(path)[column]
    assert set(written) <= set(WORDS[column]) and len(written) >= 2
    for bad in ("bogus", "", "Finished", WORDS[column][0] + " x"):
        _rewrite_cell(path, column, 1, bad)
        with pytest.raises(UserError) as err:
            read_table(path)
        assert f"line 3, column {column}: not one of {', '.join(WORDS[column])}" in str(err.value)
        assert "\n" not in str(err.value)


def test_a_parquet_table_with_an_unknown_word_is_refused_naming_its_row(tmp_path, result):
    path = tmp_path / "requests.parquet"
    result.write_requests(path)
    table = pq.read_table(path)
    status = table.column("status").to_pylist()
    assert read_table(path)["status"].tolist() == status
    status[2] = "lost"
    i = table.column_names.index("status")
    pq.write_table(table.set_column(i, "status", __import__("pyarrow").array(status)), path)
    with pytest.raises(UserError, match=r"row 3, column status: not one of waiting, running, preempted, finished, unservable"):
        read_table(path)
