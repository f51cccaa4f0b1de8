"""Inputs a newcomer gets slightly wrong, each answered by a line that says what is wrong (stop 57):
a trace header of another separator, in upper case or with a second byte-order mark; a policy named by a
path that is no .py file; a policy name with spaces around it (as `sweep`'s lists already read it); a
table name for `to_pandas` that is no string."""

from __future__ import annotations

import re

import pytest

from decodesched import convert as cv
from decodesched import load_trace, simulate
from decodesched.errors import UserError
from decodesched.trace import TRACE_COLUMNS

from test_cli_hostile3 import TRACE, one_line, run

ROW = "1,0,4,3,0,false,2,,true\n"


@pytest.mark.parametrize("sep, header, said", [
    (";", ";".join(TRACE_COLUMNS), "(its header is one column separated by ';'; a trace CSV is separated by commas)"),
    ("\t", "\t".join(TRACE_COLUMNS), "(its header is one column separated by tabs; a trace CSV is separated by "
                                    "commas)"),
    (",", ",".join(TRACE_COLUMNS).upper(), "found REQUEST_ID, ARRIVAL_STEP, PROMPT_LEN, MAX_NEW_TOKENS, PRIORITY, ... "
                                           "(9 in all) (the names are lower case)"),
    (",", "\ufeff" + ",".join(TRACE_COLUMNS), "missing column(s) request_id; found '\\ufeffrequest_id' (a "
                                              "byte-order mark, or a tab, in a name)"),
    (",", "a,b", "; found a, b"),
])
def test_a_header_that_lacks_columns_says_what_it_holds_instead(tmp_path, sep, header, said):
    # Before: "missing column(s) request_id, ..." alone, whatever the header held.
    path = tmp_path / "t.csv"
    path.write_text("\ufeff" + header + "\n" + ROW.replace(",", sep), encoding="utf-8")  # (one BOM is read as such)
    with pytest.raises(UserError) as info:
        load_trace(path)
    assert said in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_a_good_header_still_loads(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(TRACE)
    assert len(load_trace(path)) == 2


@pytest.mark.parametrize("spec", ["./x.csv:attr", ".mod:X", "pkg/mod:X"])
def test_a_policy_named_by_a_path_that_is_no_py_file_says_so(tmp_path, spec):
    # Before: "importing ./x.csv failed: TypeError: the 'package' argument is required to perform a relative import"
    (tmp_path / "t.csv").write_text(TRACE)
    code, _, err = run(["simulate", str(tmp_path / "t.csv"), "--policy", spec, "--kv-blocks", "9"])
    assert code == 2
    line = one_line(err)
    assert "is neither a module name nor a .py file; give module:attr or path/to/file.py:attr" in line, line
    assert "package" not in line


def test_simulate_reads_a_policy_name_with_spaces_around_it_as_sweep_does(tmp_path):
    # Before: "unknown policy ' fcfs '", where `sweep --policy 'fcfs, aging'` read the same name
    (tmp_path / "t.csv").write_text(TRACE)
    spaced = run(["simulate", str(tmp_path / "t.csv"), "--policy", " fcfs ", "--kv-blocks", "9"])
    plain = run(["simulate", str(tmp_path / "t.csv"), "--policy", "fcfs", "--kv-blocks", "9"])
    untimed = [re.sub(r" in [0-9.]+ s", "", out) for out in (spaced[1], plain[1])]  # (the summary's time)
    assert spaced[0] == 0 and untimed[0] == untimed[1] and "fcfs" in untimed[0], spaced[2]


def test_to_pandas_with_a_table_that_is_no_string_is_one_line():
    pd = pytest.importorskip("pandas")
    result = simulate(cv.to_trace(cv.read_azure(cv.bundled_trace_path()).head(8), load=1.0), "fcfs", 100)
    # Before: "The truth value of a Series is ambiguous" (ValueError) / "boolean value of NA is ambiguous"
    for table in (pd.Series([1, 2]), pd.NA, 3):
        with pytest.raises(UserError, match="unknown table .*; choose requests or events") as info:
            result.to_pandas(table)
        assert "\n" not in str(info.value)
    assert len(result.to_pandas()) == len(result.to_pandas("requests")) == 8
