"""`trace convert` on raw traces as real files come: Azure times far apart or past NumPy's nanosecond years, Azure
2024-shaped headers, Mooncake lines with a key twice, odd hash_ids, a JSON array; and raw bytes, fuzzed."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import given, strategies as st

from decodesched import convert as cv
from decodesched.errors import UserError
from decodesched.trace import load_trace
from test_cli_hostile3 import one_line, run

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def convert(d, name, body, *options) -> tuple[int, str, object]:
    """Convert `body` saved as `d/name`: (exit code, stderr, the trace written or None); a failure leaves no file."""
    src = d / name
    src.write_bytes(body if isinstance(body, bytes) else body.encode())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, _, err = run(["trace", "convert", str(src), *(options or ("--steps-per-second", "10")),
                            "--out", str(d / "out.csv")])
    assert code in (0, 2), err
    if code == 2:
        one_line(err)
        assert sorted(p.name for p in d.iterdir()) == [name]
        return code, err.strip(), None
    return code, err, load_trace(d / "out.csv")


def same(a, b) -> None:
    for col in ("request_id", "arrival_step", "prompt_len", "max_new_tokens", "priority", "cache_hit",
                "required_blocks", "deadline_step", "preemptible"):
        assert getattr(a, col).tolist() == getattr(b, col).tolist(), col


def azure(*rows, header=AZURE_HEADER) -> str:
    return "\n".join([header, *rows]) + "\n"


# ---------------------------------------------------------------- Azure times outside 1678-2262, or far apart


@pytest.mark.parametrize("early, late", [("2262-04-11 23:47:16.8", "2262-04-11 23:47:17.3"),
                                         ("1677-09-21 00:12:43.1", "1677-09-21 00:12:43.6"),
                                         ("9999-12-31 23:59:58.5", "9999-12-31 23:59:59.0"),
                                         ("0001-01-01 00:00:00.5", "0001-01-01 00:00:01.0")])
def test_azure_times_past_numpys_nanosecond_years_keep_their_order(tmp_path, early, late):
    # Nanoseconds since 1970 wrap silently past int64 outside 1678-2262: times that straddled the edge were
    # "RawTrace.arrival_seconds must hold finite numbers >= 0 (seconds)" (no line, no fix).
    code, err, t = convert(tmp_path, "a.csv", azure(f"{late},20,6", f"{early},10,5"))
    assert code == 0, err
    assert t.arrival_step.tolist() == [5, 0] and t.prompt_len.tolist() == [20, 10]


@pytest.mark.parametrize("early, late", [("1000-01-01 00:00:00", "2024-01-01 00:00:00"),
                                         ("1900-01-01 00:00:00", "2200-01-01 00:00:00"),
                                         ("1700-01-01 00:00:00", "2200-01-01 00:00:00")])
def test_azure_times_more_than_285_years_apart_are_refused_at_their_line(tmp_path, early, late):
    # 1000 and 2024 converted silently with the year 1000 request arriving 4.6e9 steps *after* the 2024 one; 1900
    # and 2200 (and 1700 and 2200) were the RawTrace message above.
    code, err, _ = convert(tmp_path, "a.csv", azure(f"{early},10,5", f"{late},20,6"), "--steps-per-second", "1")
    assert code == 2
    assert err.endswith(f"a.csv: line 3, column TIMESTAMP: '{late}' is more than 285 years after line 2's "
                        f"'{early}'; correct the times")


def test_arrivals_are_the_floor_of_the_exact_product_not_of_its_rounding(tmp_path):
    # 0.003 s * 1000 is 2.9999999999999996 in floating point: at one step per millisecond 1,482 of the first 200,000
    # Mooncake timestamps arrived a step early, and 7 of the shipped trace's 12,031 at --load 1.
    ms = list(range(0, 3000, 1)) + [3_599_997, 7]
    body = "".join(json.dumps({"timestamp": m, "input_length": 1, "output_length": 1}) + "\n" for m in ms)
    code, err, t = convert(tmp_path, "m.jsonl", body, "--steps-per-second", "1000")
    assert code == 0, err
    assert t.arrival_step.tolist() == ms
    (tmp_path / "az").mkdir()
    rows = [f"2024-05-10 00:00:{s // 1000:02d}.{s % 1000:03d}+00:00,1,1" for s in range(0, 60000, 7)]
    code, err, t = convert(tmp_path / "az", "a.csv", azure(*rows), "--steps-per-second", "1000")
    assert code == 0, err
    assert t.arrival_step.tolist() == list(range(0, 60000, 7))


# ---------------------------------------------------------------- Azure 2024 and files saved by other tools


def test_azure_2024_files_with_other_columns_or_order_are_detected_and_read_as_the_plain_one(tmp_path):
    # `.csv` files whose header did not start with TIMESTAMP were "cannot tell the trace format ...; give --format".
    rows = [("2024-05-10 00:00:00.009930+00:00", 374, 44), ("2024-05-10 00:00:02.409930+00:00", 10, 0),
            ("2024-05-10 00:00:01.009930+00:00", 33, 15)]
    (tmp_path / "p").mkdir()
    plain = convert(tmp_path / "p", "a.csv", azure(*(f"{t},{c},{g}" for t, c, g in rows)))[2]
    assert plain.arrival_step.tolist() == [0, 24, 10]
    shapes = {"index first": ("Idx,TIMESTAMP,ContextTokens,GeneratedTokens", "{i},{t},{c},{g}"),
              "reordered": ("GeneratedTokens,ContextTokens,TIMESTAMP", "{g},{c},{t}"),
              "quoted": ('"ContextTokens","TIMESTAMP","GeneratedTokens"', '{c},"{t}",{g}')}
    for k, (header, row) in enumerate(shapes.values()):
        d = tmp_path / str(k)
        d.mkdir()
        body = azure(*(row.format(i=i, t=t, c=c, g=g) for i, (t, c, g) in enumerate(rows)), header=header)
        code, err, t = convert(d, "a.csv", body.replace("\n", "\r\n"))
        assert code == 0 and cv.detect_format(d / "a.csv") == "azure", (header, err)
        same(t, plain)


# ---------------------------------------------------------------- Mooncake lines


LINE = {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0, 1]}
NEXT = {"timestamp": 2000, "input_length": 20, "output_length": 6, "hash_ids": [0, 1, 2]}


def mooncake(*lines) -> str:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)


def test_a_mooncake_field_given_twice_is_refused_not_the_last_one_kept(tmp_path):
    # json.loads keeps the last of a repeated key: input_length 99 was converted silently.
    code, err, _ = convert(tmp_path, "m.jsonl", mooncake(LINE, '{"timestamp": 1, "input_length": 10, '
                                                               '"input_length": 99, "output_length": 5}'))
    assert code == 2 and err.endswith("m.jsonl: line 2: field 'input_length' given twice; keep one")


@pytest.mark.parametrize("ids, shown", [("[true, 0]", "True"), ("[NaN, 1]", "nan"), ("[0.5]", "0.5"),
                                        ("[Infinity]", "inf"), ("[[0], 1]", "[0]"), ("[{}]", "{}")])
def test_hash_ids_that_are_no_block_ids_are_refused(tmp_path, ids, shown):
    # true was block 1 (True == 1: a hit on another request's block 1), NaN a block equal to nothing, both silently.
    code, err, _ = convert(tmp_path, "m.jsonl", mooncake(LINE, f'{{"timestamp": 1, "input_length": 3, '
                                                               f'"output_length": 1, "hash_ids": {ids}}}'))
    assert code == 2
    assert err.endswith(f"m.jsonl: line 2, field hash_ids: block ids must be whole numbers or strings, got {shown}")


@pytest.mark.parametrize("ids, shown", [("0", "0"), ("false", "False"), ('""', "''"), ("{}", "{}"), ('"0,1"', "'0,1'")])
def test_hash_ids_that_are_no_list_are_refused_even_when_empty_or_zero(tmp_path, ids, shown):
    # 0, false, "" and {} were read as no blocks (`or []`), where "0,1" was refused.
    code, err, _ = convert(tmp_path, "m.jsonl", mooncake(f'{{"timestamp": 1, "input_length": 3, '
                                                         f'"output_length": 1, "hash_ids": {ids}}}'))
    assert code == 2
    assert err.endswith(f"m.jsonl: line 1, field hash_ids: expected a list of block ids, got {shown}")


def test_mooncake_shapes_of_real_files_convert_as_the_clean_file(tmp_path):
    """Whole floats, strings as ids, null/absent/empty hash_ids, extra fields, another key order, CRLF, a BOM, blank
    lines: the same trace as the clean file (cache hits included)."""
    first = dict(LINE, hash_ids=[7, 8])
    (tmp_path / "clean").mkdir()
    clean = convert(tmp_path / "clean", "m.jsonl", mooncake(first, NEXT, dict(LINE, hash_ids=[]), NEXT),
                    "--load", "1", "--cache-min-blocks", "1")[2]
    assert clean.cache_hit.tolist() == [False, False, False, True]
    variants = [
        mooncake(dict(first, hash_ids=[7.0, 8]), dict(NEXT, input_length=20.0), dict(LINE, hash_ids=None),
                 NEXT),
        mooncake(first, '{"session": {"a": [1, {"b": 2}]}, "hash_ids": [0, 1, 2], "output_length": 6, '
                        '"input_length": 20, "timestamp": 2000, "extra": null}',
                 {k: v for k, v in LINE.items() if k != "hash_ids"}, NEXT),
        "\ufeff" + mooncake(first, NEXT, dict(LINE, hash_ids=[]), NEXT).replace("\n", "\r\n\r\n  \n"),
    ]
    for k, body in enumerate(variants):
        d = tmp_path / str(k)
        d.mkdir()
        code, err, t = convert(d, "m.jsonl", body, "--load", "1", "--cache-min-blocks", "1")
        assert code == 0, err
        same(t, clean)


@pytest.mark.parametrize("name", ["m.jsonl", "m.json", "m"])
@pytest.mark.parametrize("pretty", [False, True])
def test_a_json_array_file_is_refused_with_the_command_that_makes_it_json_lines(tmp_path, name, pretty):
    # It was "line 1: not JSON (Expecting value)", "line 1: expected a JSON object", or (no extension) "cannot tell
    # the trace format".
    body = json.dumps([LINE, NEXT], indent=2 if pretty else None) + "\n"
    code, err, _ = convert(tmp_path, name, body)
    stem = name.split(".")[0]
    assert code == 2 and err.endswith(f"{name}: line 1: a JSON array; the reader takes JSON lines, one object a line: "
                                      f"convert it first (jq -c '.[]' {name} > {stem}.lines.jsonl)")


# ---------------------------------------------------------------- raw bytes, fuzzed

GOOD = {"TIMESTAMP": ["2024-05-10 00:00:00.009930+00:00", "2024-05-10 00:00:03.5+00:00", "2024-05-10T00:00:01Z",
                      "2024-05-10 00:00:00 UTC"],
        "timestamp": ["0", "3000", "1500.5"], "hash_ids": ["[]", "[0, 1]", "[0, 1, 2]", "[1.0, 2]", '["a", 0]', "null"]}
BAD = {"TIMESTAMP": ["2023-11-16 18:15:46.6805900", "1969-12-31 23:59:59.123456789+00:00", "2262-04-11 23:47:16.9Z",
                     "1000-01-01T00:00:00Z", "", "NaT", "2024-05-10 00:00:00,5"],
       "hash_ids": ["[true]", "[NaN]", "[[0]]", "0", "{}"]}
COUNTS, BAD_COUNTS = ["374", "0", "12", " 7 ", "12.0"], ["-1", "12.5", "", "9" * 25, "1e3", "nan"]
JSON_COUNTS, BAD_JSON = ["0", "12", "12.0", "1e2"], ["-1", "0.5", "NaN", "Infinity", "1e400", '"3"', "true", "null",
                                                     "9" * 30, "[]", "{}"]


def cell(draw, column: str, json_value: bool) -> str:
    """Mostly a value a real file holds, sometimes one it should not."""
    good = GOOD.get(column, JSON_COUNTS if json_value else COUNTS)
    bad = BAD.get(column, BAD_JSON if json_value else BAD_COUNTS)
    return draw(st.sampled_from(bad if draw(st.integers(0, 9)) == 0 else good))


@st.composite
def raw_files(draw) -> tuple[str, bytes]:
    """An Azure CSV or Mooncake JSON lines file with the variants of real files (order, shapes, line ends, BOM)."""
    if draw(st.booleans()):
        header = draw(st.sampled_from([AZURE_HEADER, AZURE_HEADER, "Idx," + AZURE_HEADER,
                                       "GeneratedTokens,ContextTokens,TIMESTAMP",
                                       "TIMESTAMP,ContextTokens,ContextTokens"]))
        cols = header.split(",")
        rows = [",".join(cell(draw, c, False) for c in cols) for _ in range(draw(st.integers(0, 5)))]
        text = "\n".join([header, *rows]) + draw(st.sampled_from(["\n", ""]))
        name = "a.csv"
    else:
        keys = ["timestamp", "input_length", "output_length", "hash_ids"]
        lines = []
        for _ in range(draw(st.integers(0, 5))):
            order = draw(st.permutations(keys))
            if draw(st.integers(0, 9)) == 0:  # a field missing, or given twice
                order = order[1:] if draw(st.booleans()) else [*order, order[0]]
            body = ", ".join(f'"{k}": {cell(draw, k, True)}' for k in order)
            pre, post = draw(st.sampled_from([("{", "}")] * 8 + [("[{", "}]"), ("{", ""), ("", "")]))
            lines.append(pre + body + post)
        text = "\n".join(lines) + "\n"
        name = draw(st.sampled_from(["m.jsonl", "m.json"]))
    text = draw(st.sampled_from(["", "\ufeff"])) + text
    return name, text.replace("\n", draw(st.sampled_from(["\n", "\r\n", "\n\n"]))).encode()


@given(raw_files())
def test_raw_bytes_convert_to_a_trace_that_loads_and_inspects_or_exit_2_with_one_line(tmp_path_factory, file):
    d = tmp_path_factory.mktemp("raw")
    name, body = file
    code, err, t = convert(d, name, body)
    if code == 0:
        assert t.request_id.tolist() == list(range(len(t))) and t.arrival_step.min() == 0
        assert t.required_blocks.tolist() == (-(-(t.prompt_len + t.max_new_tokens) // 16)).tolist()
        if name != "a.csv":  # (every line an object, then: its timestamps order the arrivals, its lengths are kept)
            recs = [json.loads(x) for x in body.decode("utf-8-sig").splitlines() if x.strip()]
            ms = np.array([r["timestamp"] for r in recs], float)
            assert np.all(np.diff(t.arrival_step[np.argsort(ms, kind="stable")]) >= 0)
            assert t.prompt_len.tolist() == [max(int(r["input_length"]), 1) for r in recs]
            assert t.max_new_tokens.tolist() == [max(int(r["output_length"]), 1) for r in recs]
        code, out, err = run(["trace", "inspect", str(d / "out.csv")])
        assert code == 0 and out.startswith(f"rows             {len(t)}\n"), err


def test_a_time_scale_past_the_float_range_is_refused_without_a_warning():
    # Before: NumPy's "overflow encountered in multiply" (an error under -W error) came before the refusal.
    raw = cv.read_raw(cv.bundled_trace_path())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserError, match="give a smaller time scale"):
            cv.to_trace(raw, steps_per_second=1e306)
