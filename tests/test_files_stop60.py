"""Trace files and their conversion, as other tools write them: Azure CSVs saved by pandas (`12.0` token counts),
times ending in ` UTC`, words NumPy reads as the clock's time, lone-CR line ends; Mooncake files read in bounded
memory; a trace's name through Arrow; `synthetic.backlog_trace`'s arguments; and file bytes, fuzzed."""

from __future__ import annotations

import gzip
import io
import json
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import decodesched
from decodesched import convert as cv
from decodesched.errors import UserError
from decodesched.synthetic import backlog_trace
from test_cli_hostile3 import one_line, run

AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
         "2023-11-16 18:15:50.9951690,396,109\n2023-11-16 18:15:51.0000000,0,0\n")
MOONCAKE = "".join(json.dumps(r) + "\n" for r in [
    {"timestamp": 3000, "input_length": 1500, "output_length": 7, "hash_ids": [0, 1, 2]},
    {"timestamp": 0, "input_length": 900, "output_length": 3, "hash_ids": [0, 1]},
    {"timestamp": 3000, "input_length": 600, "output_length": 1, "hash_ids": [0, 1, 5]},
])


def columns(trace) -> dict:
    return {k: v.tolist() for k, v in trace.columns().items()}


def converted(tmp_path, name: str, body: bytes) -> tuple[int, str, dict | None]:
    """`trace convert` of `body` saved as `name` in a folder of its own: (exit code, stderr, the trace's columns);
    exit 2 is one line and leaves nothing but the source."""
    d = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    (d / name).write_bytes(body)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, _, err = run(["trace", "convert", str(d / name), "--steps-per-second", "1000", "--out", str(d / "o.csv")])
    assert code in (0, 2), err
    if code == 2:
        one_line(err)
        assert [p.name for p in d.iterdir()] == [name]
        return code, err, None
    return code, err, columns(decodesched.load_trace(d / "o.csv"))


# ---------------------------------------------------------------- Azure CSVs as pandas and SQL exports write them


def test_an_azure_csv_saved_by_pandas_with_float_token_counts_converts_as_the_integer_one(tmp_path):
    # Before: "line 2, column ContextTokens: expected a whole number of tokens, got '374.0'" (a column with a gap,
    # or read as float, is saved as 374.0 by pandas).
    pd = pytest.importorskip("pandas")
    frame = pd.read_csv(io.StringIO(AZURE))
    frame[["ContextTokens", "GeneratedTokens"]] = frame[["ContextTokens", "GeneratedTokens"]].astype(float)
    frame.to_csv(tmp_path / "pandas.csv")  # (with its index column, as pandas writes by default)
    assert "374.0,44.0" in (tmp_path / "pandas.csv").read_text()
    assert converted(tmp_path, "pandas.csv", (tmp_path / "pandas.csv").read_bytes())[2] == \
        converted(tmp_path, "plain.csv", AZURE.encode())[2]
    assert cv.read_azure(tmp_path / "pandas.csv").prompt_tokens.tolist() == [374, 396, 0]


@pytest.mark.parametrize("count, column", [("374.5", "ContextTokens"), ("1e3", "ContextTokens"),
                                           ("44.01", "GeneratedTokens"), ("-3.0", "GeneratedTokens"),
                                           (".0", "GeneratedTokens")])
def test_a_token_count_that_is_no_whole_number_is_refused_naming_its_line_and_column(tmp_path, count, column):
    line, body = (3, AZURE.replace("396,109", f"{count},109")) if column == "ContextTokens" else \
        (2, AZURE.replace("374,44", f"374,{count}"))
    code, err, _ = converted(tmp_path, "a.csv", body.encode())
    assert code == 2 and f"line {line}, column {column}" in err


@pytest.mark.parametrize("zone", [" UTC", "UTC", " utc", " GMT", "Z", "+00:00"])
def test_azure_times_ending_in_utc_read_as_times_in_utc(tmp_path, zone):
    # Before: "not a date and time: '2023-11-16 18:15:46.6805900 UTC'" (as BigQuery and SQL exports write times).
    body = "\n".join(r if i == 0 else r.replace(",", zone + ",", 1) for i, r in enumerate(AZURE.splitlines())) + "\n"
    code, err, got = converted(tmp_path, "a.csv", body.encode())
    assert code == 0, err
    assert got == converted(tmp_path, "plain.csv", AZURE.encode())[2]


def test_a_utc_word_on_some_times_only_is_refused_as_any_mix_of_zones(tmp_path):
    body = AZURE.replace(".6805900,", ".6805900 UTC,")
    code, err, _ = converted(tmp_path, "a.csv", body.encode())
    assert code == 2 and "line 3, column TIMESTAMP" in err and "time zone" in err


@pytest.mark.parametrize("word", ["now", "today", "Today", " now "])
def test_words_numpy_reads_as_the_clock_are_not_times(tmp_path, word):
    # Before: NumPy read "now" and "today" as the current time: exit 0 and a trace that changed with every run
    # (here, 54 years of span).
    code, err, _ = converted(tmp_path, "a.csv", AZURE.replace("2023-11-16 18:15:50.9951690", word).encode())
    assert code == 2 and "line 3, column TIMESTAMP: not a date and time" in err


# ---------------------------------------------------------------- line ends, BOMs: the same trace


@pytest.mark.parametrize("name, body", [("a.csv", AZURE), ("a.data", AZURE), ("m.jsonl", MOONCAKE),
                                        ("m.data", MOONCAKE)])
@pytest.mark.parametrize("end", ["\r", "\r\n"])
def test_a_raw_trace_with_old_mac_or_windows_line_ends_converts_as_with_newlines(tmp_path, name, body, end):
    # Before: an Azure CSV whose lines end in a lone CR (docs/files.md: accepted) was "unreadable CSV (new-line
    # character seen in unquoted field ...)", without the file's name: `detect_format` split its first line at
    # LF only and handed the whole file to the csv module; `convert.detect_format` raised csv.Error itself.
    plain = converted(tmp_path, name, body.encode())
    assert plain[0] == 0
    code, err, got = converted(tmp_path, name, ("\ufeff" + body.replace("\n", end)).encode())
    assert code == 0 and got == plain[2], err
    if not name.endswith("jsonl"):
        (tmp_path / "cr").write_bytes(body.replace("\n", end).encode())
        assert cv.detect_format(tmp_path / "cr") == ("azure" if body is AZURE else "mooncake")


# ---------------------------------------------------------------- Mooncake: bounded memory, the same hits


def _arrival_order_hits(lines: list[dict], k: int) -> list[bool]:
    """The rule, written plainly: in arrival order (timestamp, then line), a request hits when its first k blocks
    were all seen in requests before it."""
    seen: set = set()
    hits = [False] * len(lines)
    for i in sorted(range(len(lines)), key=lambda i: (lines[i]["timestamp"], i)):
        head = lines[i].get("hash_ids") or []
        hits[i] = len(head) >= k and all(b in seen for b in head[:k])
        seen.update(head)
    return hits


def test_a_mooncake_file_is_read_in_memory_that_grows_with_its_distinct_blocks_not_its_lines(tmp_path):
    # Before: every line's hash_ids list was kept until the end (about 1.2 GB per million conversation lines):
    # here 2,000 lines of the same 300 blocks held 27 MB; now each block id is kept once.
    ids = list(range(10**6, 10**6 + 300))
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 2000 - i, "input_length": 9, "output_length": 2,
                                        "hash_ids": ids}) + "\n" for i in range(2000)))
    tracemalloc.start()
    try:
        raw = cv.read_mooncake(path, cache_min_blocks=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5e6, peak
    assert raw.cache_hit.tolist() == [True] * 1999 + [False]  # (the last line arrives first)


@settings(derandomize=True, max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.sampled_from([0, 1, 2, 3, "2", 2.0]), max_size=4)),
                min_size=1, max_size=10), st.integers(1, 3))
def test_mooncake_hits_follow_the_arrival_order_rule_in_any_file_order(tmp_path_factory, rows, k):
    # (A guard of the streamed reader: it passed before too.)
    lines = [{"timestamp": 1000 * t, "input_length": 5, "output_length": 1, "hash_ids": ids} for t, ids in rows]
    path = tmp_path_factory.mktemp("m") / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    plain = [{**r, "hash_ids": [int(b) if isinstance(b, float) else b for b in r["hash_ids"]]} for r in lines]
    assert cv.read_mooncake(path, cache_min_blocks=k).cache_hit.tolist() == _arrival_order_hits(plain, k)


# ---------------------------------------------------------------- a trace's name through Arrow


def test_a_trace_keeps_its_name_and_time_scale_through_an_arrow_table_or_record_batch(tmp_path):
    pytest.importorskip("pyarrow")
    from decodesched import frames

    # Before: `load_trace(frames.to_arrow(trace))` was named "trace" (the time scale alone travelled).
    t = decodesched.load_trace(backlog_trace(40, seed=2), name="Azure conv, load 1.2", steps_per_second=0.3)
    table = frames.to_arrow(t)
    assert decodesched.load_trace(table) == t
    assert decodesched.load_trace(table.to_batches()[0]) == t
    assert decodesched.load_trace(table, name="other").name == "other"
    untimed = decodesched.load_trace(backlog_trace(5, seed=1))
    assert decodesched.load_trace(frames.to_arrow(untimed)) == untimed
    for path in (tmp_path / "t.parquet", tmp_path / "t.csv"):  # (a file's trace: the file's name, its columns, scale)
        frames.to_parquet(t, path) if path.suffix == ".parquet" else t.to_csv(path)
        back = decodesched.load_trace(path)
        assert back.name == "t" and decodesched.load_trace(back, name=t.name) == t


# ---------------------------------------------------------------- synthetic.backlog_trace's arguments


@pytest.mark.parametrize("args, kwargs, words", [
    ((-1,), {}, "n_requests"), ((0,), {}, "n_requests"), ((5.5,), {}, "n_requests"), (("5",), {}, "n_requests"),
    ((True,), {}, "n_requests"), ((5,), {"seed": -1}, "seed"), ((5,), {"seed": "x"}, "seed"),
    ((5,), {"max_new_tokens": 0}, "max_new_tokens"), ((5,), {"max_prompt": 0}, "max_prompt"),
    ((5,), {"max_blocks": 2**41}, "max_blocks"), ((5,), {"priorities": 0}, "priorities"),
    ((5,), {"arrival_span": -3}, "arrival_span"), ((5,), {"deadline_fraction": float("nan")}, "deadline_fraction"),
    ((5,), {"deadline_fraction": 2}, "deadline_fraction"), ((5,), {"cache_fraction": None}, "cache_fraction"),
    ((5,), {"non_preemptible_fraction": -0.1}, "non_preemptible_fraction"),
])
def test_backlog_trace_names_a_bad_argument(args, kwargs, words):
    # Before: NumPy's "low >= high", "negative dimensions are not allowed", "expected non-negative integer", or a
    # TypeError from inside; a NaN or 2 as a fraction was taken silently.
    with pytest.raises(UserError, match=rf"^backlog_trace: {words} must be "):
        backlog_trace(*args, **kwargs)


def test_backlog_trace_takes_numpy_numbers_and_keeps_its_draws():
    t = backlog_trace(np.int32(50), seed=np.uint8(4), deadline_fraction=np.float32(0.5), cache_fraction=1)
    assert t == backlog_trace(50, seed=4, cache_fraction=1.0) and t.cache_hit.all()
    assert backlog_trace(7, arrival_span=0).arrival_step.tolist() == [0] * 7


# ---------------------------------------------------------------- file bytes, fuzzed


CANONICAL = ("request_id,arrival_step,prompt_len,max_new_tokens,priority,cache_hit,required_blocks,deadline_step,"
             "preemptible\n3,0,40,4,1,true,3,,false\n-9,2,14,2,0,false,1,90,true\n4,2,1,1,2,TRUE,1,3,1\n")


def good(name: str) -> bytes:
    return {"a.csv": AZURE, "m.jsonl": MOONCAKE, "t.csv": CANONICAL}[name].encode()


@st.composite
def mangled(draw) -> tuple[str, bytes, bool]:
    """A good raw trace or canonical trace, its bytes damaged as files are: cut short, NUL or odd bytes, a BOM,
    other line ends, gzip'd under the same name, a column twice, a huge number, empty; and whether only a BOM
    and other line ends were added, which change nothing."""
    name = draw(st.sampled_from(["a.csv", "m.jsonl", "t.csv"]))
    body = good(name)
    hows = draw(st.lists(st.sampled_from(["cut", "insert", "bom", "ends", "gzip", "twice", "huge", "empty", "word"]),
                         min_size=1, max_size=3))
    for how in hows:
        at = draw(st.integers(0, len(body)))
        if how == "cut":
            body = body[:at]
        elif how == "insert":
            body = body[:at] + draw(st.sampled_from([b"\0", b"\xff", b"\xef\xbb\xbf", b"\r", b",", b'"', b"{", b" "]))\
                + body[at:]
        elif how == "bom":
            body = b"\xef\xbb\xbf" + body
        elif how == "ends":
            body = body.replace(b"\n", draw(st.sampled_from([b"\r\n", b"\r", b"\n\n"])))
        elif how == "gzip":
            body = gzip.compress(body)
        elif how == "twice":
            head, _, rest = body.partition(b"\n")
            body = head + b"," + head.split(b",")[-1] + b"\n" + rest
        elif how == "huge":
            body = body.replace(b"4", draw(st.sampled_from([b"9" * 30, b"1e400", b"-4", b"4.0", b"4.5"])), 1)
        elif how == "word":
            body = body.replace(b"2023-11-16 18:15:50.9951690", draw(st.sampled_from([b"now", b"NaT", b""])))
        else:
            body = b""
    return name, body, set(hows) <= {"bom", "ends"} and hows.count("bom") <= 1


@settings(derandomize=True, max_examples=120)
@given(mangled())
def test_damaged_trace_files_convert_or_inspect_or_exit_2_with_one_line_and_leave_nothing(tmp_path_factory, file):
    # Before: an Azure CSV with lone-CR line ends (harmless: the same trace) was refused, without the file's name.
    d = tmp_path_factory.mktemp("f")
    name, body, harmless = file
    if name == "t.csv":
        code, out, err = inspected(d, name, body)
        assert code in (0, 2), err
        if code == 2:
            one_line(err)
        else:
            assert out.startswith("rows ") and not err
        assert (code, out) == inspected(d, "good.csv", good(name))[:2] or not harmless
        return
    code, err, got = converted(d, name, body)
    if code == 0:
        assert got["request_id"] == list(range(len(got["request_id"]))) and min(got["arrival_step"]) == 0
    assert (code, got) == converted(d, name, good(name))[::2] or not harmless, err


def inspected(d, name: str, body: bytes) -> tuple[int, str, str]:
    (d / name).write_bytes(body)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return run(["trace", "inspect", str(d / name)])


# ---------------------------------------------------------------- events and requests tables with a NUL byte


@pytest.mark.parametrize("column, cell", [("request_id", "3\0"), ("queue_wait", "0\0"), ("status", "finished\0"),
                                          ("status", "fini\0shed"), ("deadline_met", "true\0"), ("ttft", "\0")])
def test_a_nul_byte_in_a_table_cell_is_refused_naming_its_line_and_column(tmp_path, column, cell):
    # Before: NumPy's text arrays drop trailing NULs, so `3\0` read as 3, `finished\0` as finished, silently; and
    # a NUL inside a word was kept.
    from decodesched.tables_io import read_table

    trace = decodesched.load_trace(backlog_trace(6, seed=4))
    decodesched.simulate(trace, "fcfs", free_kv_blocks=64).write_requests(tmp_path / "r.csv")
    lines = (tmp_path / "r.csv").read_text().splitlines()
    header = lines[0].split(",")
    row = lines[3].split(",")
    row[header.index(column)] = cell
    lines[3] = ",".join(row)
    (tmp_path / "r.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=rf"r\.csv: line 4, column {column}: a NUL byte"):
        read_table(tmp_path / "r.csv")
