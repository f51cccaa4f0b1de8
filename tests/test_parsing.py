"""What the readers accept, exactly as docs/files.md says: a UTF-8 BOM; booleans true/false (any letter
case) or 1/0; integers as ASCII digits with an optional '-'; spaces around a field.  Everything else is
refused with one line naming the row and column."""

from __future__ import annotations

import json

import pytest

from decodesched import convert as cv
from decodesched.trace import TRACE_COLUMNS, TraceError, load_trace

HEADER = ",".join(TRACE_COLUMNS)


def write(tmp_path, text: str, prefix: bytes = b"", name="t.csv"):
    p = tmp_path / name
    p.write_bytes(prefix + text.encode())
    return p


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_bom_and_crlf_are_accepted(tmp_path, newline):
    body = newline.join([HEADER, "1,0,4,3,0,false,2,,true", "2,1,2,2,2,TRUE,2,8,0"]) + newline
    t = load_trace(write(tmp_path, body, b"\xef\xbb\xbf"))
    assert t.request_id.tolist() == [1, 2] and t.cache_hit.tolist() == [False, True]
    assert t.preemptible.tolist() == [True, False]


@pytest.mark.parametrize("cell, value", [("7", 7), (" 7 ", 7), ("-7", -7), ("007", 7), ("-0", 0)])
def test_accepted_integer_spellings(tmp_path, cell, value):
    t = load_trace(write(tmp_path, f"{HEADER}\n1,0,4,3,{cell},false,2,,true\n"))
    assert t.priority.tolist() == [value]


@pytest.mark.parametrize("cell", ["+20", "1_000", "\u0663", "\uff17", "0x10", "1e3", "7.0", "1 000", "--1", "",
                                  "9" * 30])
def test_refused_integer_spellings(tmp_path, cell):
    with pytest.raises(TraceError, match="row 1 .*column priority"):
        load_trace(write(tmp_path, f"{HEADER}\n1,0,4,3,{cell},false,2,,true\n"))


@pytest.mark.parametrize("cell, value", [("true", True), ("False", False), ("TRUE", True), ("1", True), ("0", False)])
def test_accepted_boolean_spellings(tmp_path, cell, value):
    t = load_trace(write(tmp_path, f"{HEADER}\n1,0,4,3,0,{cell},2,,true\n"))
    assert t.cache_hit.tolist() == [value]


@pytest.mark.parametrize("cell", ["yes", "no", "t", "f", "on", "2", "-1", "tru"])
def test_refused_boolean_spellings(tmp_path, cell):
    with pytest.raises(TraceError, match="column cache_hit: expected true/false"):
        load_trace(write(tmp_path, f"{HEADER}\n1,0,4,3,0,{cell},2,,true\n"))


def test_huge_fields_are_named_briefly(tmp_path):
    for size in (5000, 200_000):
        with pytest.raises(TraceError) as info:
            load_trace(write(tmp_path, f"{HEADER}\n1,0,4,3,0,false,2,{'9' * size},true\n"))
        assert len(str(info.value)) < 200 and "line 2" in str(info.value)


def test_azure_with_a_bom_is_detected_and_read(tmp_path):
    body = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,3\n2023-11-16 18:15:47.68,20,1\n"
    p = write(tmp_path, body, b"\xef\xbb\xbf", name="a.csv")
    assert cv.detect_format(p) == "azure"
    raw = cv.read_azure(p)
    assert raw.prompt_tokens.tolist() == [10, 20]
    bad = write(tmp_path, body.replace(",3\n", ",+3\n"), name="b.csv")
    with pytest.raises(cv.UserError, match="line 2, column GeneratedTokens"):
        cv.read_azure(bad)


def test_mooncake_bom_and_overlong_integers(tmp_path):
    line = json.dumps({"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1]})
    p = write(tmp_path, line + "\n", b"\xef\xbb\xbf", name="m.jsonl")
    assert cv.read_mooncake(p).prompt_tokens.tolist() == [5]
    big = write(tmp_path, line + '\n{"timestamp": 1, "input_length": ' + "9" * 5000 + ', "output_length": 1}\n',
                name="big.jsonl")
    with pytest.raises(cv.UserError, match="line 2") as info:
        cv.read_mooncake(big)
    assert len(str(info.value)) < 200
    huge_ts = write(tmp_path, '{"timestamp": 1' + "0" * 400 + ', "input_length": 1, "output_length": 1}\n',
                    name="ts.jsonl")
    with pytest.raises(cv.UserError, match="field timestamp"):
        cv.read_mooncake(huge_ts)


@pytest.mark.parametrize("seed", [-1, 2**128, True])
def test_bad_seed_is_refused(seed):
    raw = cv.RawTrace(*(__import__("numpy").array(x) for x in ([0.0, 1.0], [3, 4], [1, 2])), None)
    with pytest.raises(cv.UserError, match="--seed"):
        cv.to_trace(raw, load=1.0, seed=seed)
