"""A CSV trace is read whole (`trace._plain_csv`, `trace._text_column`: the usual file split by `str` methods and
converted by C-level maps, 1 M rows in about 4 s where cell by cell took 17 s) or record by record and cell by
cell (`_csv_records`: whole by the csv module's reader, `_csv_whole`, else `_csv_loop`; `_from_columns`): all must
give the same trace, or the same one-line error, for any text.

The property draws near-valid files: every cell from the spellings the readers take and the ones they refuse
(signs, digit separators, other scripts' digits, tabs, words, blanks, long fields), blank lines and rows of blank
cells, quotes, CRLF and lone CR line ends, rows of another width, a BOM."""

import numpy as np
from hypothesis import given, settings, strategies as st

from decodesched import TraceError, load_trace
from decodesched import trace as tr
from decodesched.trace import MAX_FIELD, TRACE_COLUMNS

INTS = ["0", "1", "7", "42", "-3", " 12 ", "007", "-0", "9223372036854775807", "9223372036854775808",
        "-9223372036854775808", "1" * 19, "0" * 25 + "5", "+4", "1_0", "٣", "1.0", "1e3", "\t5", "1 2", "1-", "--1",
        "-", "", "   ", "x", "true"]
BOOLS = ["true", "false", "TRUE", "False", " true ", "1", "0", "yes", "", "2", "tru"]
DEADLINES = ["", " ", "100000", "99999999", "5", "-1", "+9", "x"]


def _cell(column: str):
    pool = BOOLS if column in ("cache_hit", "preemptible") else DEADLINES if column == "deadline_step" else INTS
    return st.one_of(st.sampled_from(pool), st.sampled_from(pool).map(lambda x: f'"{x}"'),
                     st.just("9" * (MAX_FIELD + 1)))


@st.composite
def _files(draw):
    header = list(TRACE_COLUMNS)
    if draw(st.booleans()):
        header = draw(st.permutations(header))
    rows = []
    for i in range(draw(st.integers(0, 6))):
        good = {"request_id": str(i), "arrival_step": str(i), "prompt_len": "3", "max_new_tokens": "2",
                "priority": "1", "cache_hit": "false", "required_blocks": "1", "deadline_step": "", "preemptible": "true"}
        for c in header:
            if draw(st.integers(0, 5)) == 0:
                good[c] = draw(_cell(c))
        row = ",".join(good[c] for c in header)
        kind = draw(st.integers(0, 12))
        if kind == 0:
            row = ""  # a blank line
        elif kind == 1:
            row = "," * (len(header) - 1)  # a row of blank cells
        elif kind == 2:
            row += ",9"  # another width
        elif kind == 3:
            row = row.replace(",", ',"\n"', 1)  # a quoted field over two lines
        rows.append(row)
    end = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    text = end.join([",".join(header), *rows]) + draw(st.sampled_from(["", end]))
    return draw(st.sampled_from(["", "\ufeff", "\n"])) + text


def _read(path):
    try:
        t = load_trace(path)
    except TraceError as exc:
        return str(exc)
    return {k: (np.asarray(v).tolist(), np.ma.getmaskarray(v).tolist()) for k, v in t.columns().items()}


@settings(max_examples=300)
@given(_files())
def test_a_file_read_whole_is_the_file_read_cell_by_cell(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("csv") / "t.csv"
    path.write_bytes(text.encode())
    whole = _read(path)
    plain, column, records = tr._plain_csv, tr._text_column, tr._csv_whole
    tr._plain_csv, tr._text_column, tr._csv_whole = (lambda text, path: None), (lambda name, cells: None), \
        (lambda text, path: None)
    try:
        by_cell = _read(path)
    finally:
        tr._plain_csv, tr._text_column, tr._csv_whole = plain, column, records
    assert whole == by_cell


def test_the_usual_file_is_read_whole(tmp_path, monkeypatch):
    """The property above holds trivially if nothing takes the whole path: the usual file must."""
    path = tmp_path / "t.csv"
    path.write_text(",".join(TRACE_COLUMNS) + "\n" + "".join(
        f"{i},{i},3,2,{i % 3 - 1},{'true' if i % 2 else 'false'},1,{'' if i % 4 else 10 + i},true\n" for i in range(50)))
    monkeypatch.setattr(tr, "_csv_records", lambda text, path: (_ for _ in ()).throw(AssertionError("by record")))
    cells = []
    real = tr._parse_int
    monkeypatch.setattr(tr, "_parse_int", lambda *a: cells.append(a) or real(*a))
    t = load_trace(path)
    assert len(t) == 50 and not cells
    assert t.has_deadline.tolist() == [i % 4 == 0 for i in range(50)]
    assert t.priority.tolist() == [i % 3 - 1 for i in range(50)]


def test_a_quoted_file_with_blank_lines_is_read_whole(tmp_path, monkeypatch):
    """What a spreadsheet or `csv.QUOTE_NONNUMERIC` writes (quotes, CRLF, blank lines) takes `_csv_whole`: the csv
    module's reader in one call, 1 M rows in about 5 s where record by record took 15 s; its lines in the messages
    are the file's."""
    path = tmp_path / "t.csv"
    rows = [f'{i},{i},3,2,1,"{"TRUE" if i % 2 else "false"}",1,"{"" if i % 4 else 10 + i}","true"' for i in range(40)]
    rows[7:7] = ["", " , ,,,,,,,"]
    path.write_text("\r\n" + ",".join(f'"{c}"' for c in TRACE_COLUMNS) + "\r\n" + "\r\n".join(rows) + "\r\n")
    monkeypatch.setattr(tr, "_csv_loop", lambda text, path: (_ for _ in ()).throw(AssertionError("by record")))
    t = load_trace(path)
    assert t.request_id.tolist() == list(range(40)) and t.cache_hit.tolist() == [i % 2 == 1 for i in range(40)]
    assert t.has_deadline.tolist() == [i % 4 == 0 for i in range(40)]
    path.write_text(path.read_text().replace('9,9,3,2,1', '9,9,3,x,1'))
    try:
        load_trace(path)
    except TraceError as exc:  # row 10 is on line 14: a blank line before the header, two after row 7
        assert "row 10 (line 14), column max_new_tokens" in str(exc), exc
    else:
        raise AssertionError("a bad cell was read")


VALUES = [0, 1, 5, -2, 2**63 - 1, 2**63, True, False, None, 1.0, 2.5, "3", " 4 ", "true", "", np.int64(6), np.True_]


@settings(max_examples=300)
@given(st.data())
def test_columns_of_python_values_read_whole_are_read_cell_by_cell(data):
    """Lists (and object arrays) of one plain kind of value are converted whole (`trace._list_column`), 10 M
    Python ints in about 1 s where one by one took 10 s; any mix of kinds must give what the cells give one by one."""
    n = data.draw(st.integers(1, 5))
    cols = {"request_id": list(range(n)), "arrival_step": [0] * n, "prompt_len": [3] * n, "max_new_tokens": [2] * n,
            "priority": [1] * n, "cache_hit": [False] * n, "required_blocks": [1] * n, "deadline_step": [None] * n,
            "preemptible": [True] * n}
    for c in data.draw(st.lists(st.sampled_from(TRACE_COLUMNS), max_size=3)):
        cols[c] = data.draw(st.lists(st.sampled_from(VALUES), min_size=n, max_size=n))
        if data.draw(st.booleans()):
            cols[c] = np.array(cols[c] + [None], dtype=object)[:-1]  # (an object array, as pandas gives)
    whole = _read(cols)
    real = tr._list_column
    tr._list_column = lambda name, src: None
    try:
        by_cell = _read(cols)
    finally:
        tr._list_column = real
    assert whole == by_cell
