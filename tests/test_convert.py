"""Real-trace conversion: the documented rules, seeded determinism, and the CLI's error contract."""

from __future__ import annotations

import json
from pathlib import Path
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import decodesched
from decodesched import convert as cv
from decodesched.cli import main
from decodesched.errors import UserError

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def cli(argv) -> int:
    """The CLI's exit code, whether argparse exits or main returns."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def write_azure(path, rows):
    path.write_text(AZURE_HEADER + "".join(f"{t},{p},{g}\n" for t, p, g in rows), encoding="utf-8")
    return path


def write_mooncake(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def azure_small(tmp_path):
    return write_azure(tmp_path / "az.csv", [
        ("2023-11-16 18:15:46.6805900", 374, 44),
        ("2023-11-16 18:15:47.1805900", 10, 0),  # 0.5 s later; an output of 0 tokens
        ("2023-11-16 18:15:50.6805900", 33, 15),  # 4.0 s after the first
    ])


# ---------------------------------------------------------------- reading


def test_azure_timestamps_are_seconds_after_the_first(azure_small):
    raw = cv.read_azure(azure_small)
    assert raw.arrival_seconds.tolist() == pytest.approx([0.0, 0.5, 4.0], abs=1e-9)
    assert raw.prompt_tokens.tolist() == [374, 10, 33]
    assert raw.output_tokens.tolist() == [44, 0, 15]
    assert raw.cache_hit is None


def test_azure_timestamps_keep_sub_microsecond_digits_and_cross_midnight(tmp_path):
    p = write_azure(tmp_path / "a.csv", [("2023-11-16 23:59:59.9999999", 1, 1), ("2023-11-17 00:00:00.0000001", 1, 1)])
    assert cv.read_azure(p).arrival_seconds[1] == pytest.approx(2e-7, abs=1e-12)


def test_mooncake_cache_hit_is_first_block_seen_in_an_earlier_request(tmp_path):
    p = write_mooncake(tmp_path / "m.jsonl", [
        {"timestamp": 1000, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]},
        {"timestamp": 1000, "input_length": 10, "output_length": 2, "hash_ids": [1, 3]},  # 1 seen: hit
        {"timestamp": 2500, "input_length": 10, "output_length": 2, "hash_ids": [3, 9]},  # 3 seen (not first): hit
        {"timestamp": 2500, "input_length": 10, "output_length": 2, "hash_ids": [9, 1]},  # 9 seen only in the line above
        {"timestamp": 4000, "input_length": 10, "output_length": 2, "hash_ids": [7, 1]},  # 7 new: miss
        {"timestamp": 4000, "input_length": 10, "output_length": 2, "hash_ids": []},  # no blocks: miss
        {"timestamp": 5000, "input_length": 10, "output_length": 2, "hash_ids": [7]},  # 7 seen: hit
    ])
    raw = cv.read_mooncake(p, cache_min_blocks=1)
    assert raw.cache_hit.tolist() == [False, True, True, True, False, False, True]
    assert raw.arrival_seconds.tolist() == pytest.approx([0, 0, 1.5, 1.5, 3.0, 3.0, 4.0])
    # the default: the first 2 blocks must both have been seen
    assert cv.read_mooncake(p).cache_hit.tolist() == cv.read_mooncake(p, cache_min_blocks=2).cache_hit.tolist()
    assert cv.read_mooncake(p, cache_min_blocks=2).cache_hit.tolist() == [False, False, False, True, False, False, False]


def test_a_request_does_not_hit_on_its_own_blocks(tmp_path):
    p = write_mooncake(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [4, 4]},
    ])
    assert cv.read_mooncake(p, cache_min_blocks=2).cache_hit.tolist() == [False]


def test_mooncake_cache_hits_follow_arrival_not_file_order(tmp_path, capsys):
    """"Earlier" is earlier arrival (timestamp, then line for equal ones): in a file whose timestamps are
    not sorted, the request that arrives first cannot hit on a prefix that only arrives later.  The
    rows stay in file order."""
    p = write_mooncake(tmp_path / "m.jsonl", [
        {"timestamp": 3000, "input_length": 10, "output_length": 3, "hash_ids": [0, 1]},  # arrives second: hit
        {"timestamp": 0, "input_length": 20, "output_length": 5, "hash_ids": [0, 1]},  # arrives first: miss
        {"timestamp": 3000, "input_length": 30, "output_length": 3, "hash_ids": [5]},  # ties with line 1: after it
        {"timestamp": 3000, "input_length": 40, "output_length": 3, "hash_ids": [5, 0]},  # 5 from the line above
    ])
    raw = cv.read_mooncake(p, cache_min_blocks=1)
    assert raw.cache_hit.tolist() == [True, False, False, True]
    assert raw.prompt_tokens.tolist() == [10, 20, 30, 40] and raw.arrival_seconds.tolist() == [3, 0, 3, 3]
    assert cv.read_mooncake(p, cache_min_blocks=2).cache_hit.tolist() == [True, False, False, True]
    out = tmp_path / "m.csv"
    assert main(["trace", "convert", str(p), "--load", "1", "--cache-min-blocks", "1", "--out", str(out)]) == 0
    t = decodesched.load_trace(out)
    assert t.request_id.tolist() == [0, 1, 2, 3] and t.cache_hit.tolist() == [True, False, False, True]


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(0, 4), st.lists(st.integers(0, 3), max_size=3)), min_size=1, max_size=8),
       data=st.data())
def test_a_prefix_of_requests_hits_as_a_file_of_just_those_lines(tmp_path, rows, data):
    """`--requests N` keeps the first N requests to arrive: their hits are those of a file holding only
    their lines (the rows dropped arrive later, so no kept request hit on them), in file order."""
    lines = [{"timestamp": ts * 1000, "input_length": 10 + i, "output_length": 2, "hash_ids": ids}
             for i, (ts, ids) in enumerate(rows)]
    n = data.draw(st.integers(1, len(lines)))
    raw = cv.read_mooncake(write_mooncake(tmp_path / "all.jsonl", lines), cache_min_blocks=1).head(n)
    order = sorted(range(len(lines)), key=lambda i: (lines[i]["timestamp"], i))
    kept = sorted(order[:n])
    alone = cv.read_mooncake(write_mooncake(tmp_path / "kept.jsonl", [lines[i] for i in kept]), cache_min_blocks=1)
    assert raw.prompt_tokens.tolist() == [10 + i for i in kept]
    assert raw.cache_hit.tolist() == alone.cache_hit.tolist()
    assert raw.arrival_seconds.tolist() == alone.arrival_seconds.tolist()


def _line_order_hits(path, k):
    """The hits by file order (the rule before arrival order), for files whose timestamps are sorted."""
    seen, hits = set(), []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            blocks = json.loads(line).get("hash_ids") or []
            hits.append(len(blocks[:k]) == k and all(b in seen for b in blocks[:k]))
            seen.update(blocks)
    return hits


def test_mooncake_files_with_sorted_timestamps_keep_their_hits(tmp_path):
    """In a sorted file arrival order is file order (ties included), so the hits are those of the line
    rule: the shared Mooncake trace, which is sorted, converts exactly as before."""
    rng = np.random.default_rng(3)
    stamps = np.sort(rng.integers(0, 20, 200)) * 500
    p = write_mooncake(tmp_path / "sorted.jsonl", [
        {"timestamp": int(t), "input_length": 5, "output_length": 1, "hash_ids": rng.integers(0, 8, 3).tolist()}
        for t in stamps])
    paths = [p]
    shared = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "mooncake_conversation.jsonl"
    if shared.is_file():
        paths.append(shared)
    for path in paths:
        for k in (1, 2, 3):
            assert cv.read_mooncake(path, cache_min_blocks=k).cache_hit.tolist() == _line_order_hits(path, k)


@pytest.mark.parametrize("body, words", [
    ("", "no requests"),
    ("not json\n", "line 1"),
    ('{"timestamp": 0, "input_length": 3}\n', "output_length"),
    ('{"timestamp": 0, "input_length": -3, "output_length": 1}\n', "negative"),
    ('{"timestamp": 0, "input_length": 2.5, "output_length": 1}\n', "input_length"),
])
def test_bad_mooncake_files_are_user_errors(tmp_path, body, words):
    p = tmp_path / "m.jsonl"
    p.write_text(body)
    with pytest.raises(UserError, match=words):
        cv.read_mooncake(p)


@pytest.mark.parametrize("body, words", [
    ("", "empty"),
    ("a,b,c\n1,2,3\n", "missing column"),
    (AZURE_HEADER, "no requests"),
    (AZURE_HEADER + "yesterday,1,2\n", "line 2, column TIMESTAMP"),
    (AZURE_HEADER + "2023-11-16 18:15:46,x,2\n", "line 2, column ContextTokens"),
    (AZURE_HEADER + "2023-11-16 18:15:46,1\n", "line 2"),
])
def test_bad_azure_files_are_user_errors(tmp_path, body, words):
    p = tmp_path / "a.csv"
    p.write_text(body)
    with pytest.raises(UserError, match=words):
        cv.read_azure(p)


def test_format_detection(tmp_path, azure_small):
    assert cv.detect_format(azure_small) == "azure"
    assert cv.detect_format(tmp_path / "x.jsonl") == "mooncake"
    p = tmp_path / "noext"
    p.write_text('{"timestamp": 0}\n')
    assert cv.detect_format(p) == "mooncake"
    q = tmp_path / "junk.txt"
    q.write_text("hello\n")
    with pytest.raises(UserError, match="format"):
        cv.detect_format(q)


# ---------------------------------------------------------------- conversion rules


def raw_of(seconds, prompts, outputs, hits=None):
    return cv.RawTrace(np.asarray(seconds, float), np.asarray(prompts, np.int64), np.asarray(outputs, np.int64),
                       None if hits is None else np.asarray(hits, bool))


def test_load_sets_the_time_scale_so_work_over_span_is_the_load(azure_small):
    raw = cv.read_azure(azure_small)
    work = 3 + 44 + 1 + 15  # one prefill step each, plus the tokens (0 counted as 1)
    for load in (0.5, 1.0, 3.0):
        t = cv.to_trace(raw, load=load)
        assert t.steps_per_second == pytest.approx(work / (load * 4.0))
        assert t.work_steps == work
        span = int(t.arrival_step.max() - t.arrival_step.min())
        assert abs(span - 4.0 * t.steps_per_second) < 1  # flooring loses less than one step
        assert t.arrival_step.tolist() == [math.floor(s * t.steps_per_second) for s in (0.0, 0.5, 4.0)]


def test_steps_per_second_floors_arrivals():
    t = cv.to_trace(raw_of([0.0, 0.26, 0.99, 2.5], [1, 1, 1, 1], [1, 1, 1, 1]), steps_per_second=4)
    assert t.arrival_step.tolist() == [0, 1, 3, 10]
    assert t.steps_per_second == 4


def test_lengths_and_block_ceiling():
    raw = raw_of([0, 1, 2, 3], [0, 15, 16, 17], [0, 1, 16, 16])
    t = cv.to_trace(raw, steps_per_second=1, block_size=16)
    assert t.prompt_len.tolist() == [1, 15, 16, 17]
    assert t.max_new_tokens.tolist() == [1, 1, 16, 16]
    assert t.required_blocks.tolist() == [1, 1, 2, 3]  # ceil(2/16), ceil(16/16), ceil(32/16), ceil(33/16)
    assert cv.to_trace(raw, steps_per_second=1, block_size=1).required_blocks.tolist() == [2, 16, 32, 33]
    assert t.request_id.tolist() == [0, 1, 2, 3]


def big_raw(n=400):
    rng = np.random.default_rng(5)
    return raw_of(np.sort(rng.random(n) * 100), rng.integers(1, 3000, n), rng.integers(0, 500, n))


def test_same_seed_same_trace_and_other_seed_other_classes():
    raw = big_raw()
    a = cv.to_trace(raw, load=1.0, seed=7)
    b = cv.to_trace(raw, load=1.0, seed=7)
    c = cv.to_trace(raw, load=1.0, seed=8)
    for col in ("arrival_step", "priority", "deadline_step", "has_deadline", "preemptible", "required_blocks"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert not np.array_equal(a.priority, c.priority)
    assert not np.array_equal(a.has_deadline, c.has_deadline)
    assert np.array_equal(a.arrival_step, c.arrival_step)  # the seed draws only the documented rules


def test_priority_weights_deadlines_and_preemptibility_follow_the_options():
    raw = big_raw(3000)
    t = cv.to_trace(raw, load=1.0, priority_classes=(0, 5), priority_weights=(0.75, 0.25),
                    deadline_fraction=0.2, slo_factor=3)
    assert set(np.unique(t.priority).tolist()) == {0, 5}
    assert (t.priority == 5).mean() == pytest.approx(0.25, abs=0.04)
    assert t.has_deadline.mean() == pytest.approx(0.2, abs=0.04)
    d = t.has_deadline
    expect = t.arrival_step[d] + np.ceil(3 * (1 + t.max_new_tokens[d]))
    assert np.array_equal(t.deadline_step[d], expect)
    assert np.array_equal(t.preemptible, t.priority != 5)  # the top class is protected by default
    none = cv.to_trace(raw, load=1.0, deadline_fraction=0.0, protected_classes=())
    assert not none.has_deadline.any() and none.preemptible.all()
    assert cv.to_trace(raw, load=1.0, deadline_fraction=1.0).has_deadline.all()
    only_low = cv.to_trace(raw, load=1.0, protected_classes=(0,))
    assert np.array_equal(only_low.preemptible, only_low.priority != 0)
    with pytest.raises(UserError, match="--protected-classes 7 is not one of --priority-classes 0,1,2"):
        cv.to_trace(raw, load=1.0, protected_classes=(0, 7))  # a typo would protect nothing


def test_mooncake_hits_carry_into_the_trace():
    t = cv.to_trace(raw_of([0, 1], [5, 5], [1, 1], hits=[False, True]), steps_per_second=1)
    assert t.cache_hit.tolist() == [False, True]
    assert not cv.to_trace(raw_of([0, 1], [5, 5], [1, 1]), steps_per_second=1).cache_hit.any()


@pytest.mark.parametrize("kwargs, words", [
    ({}, "exactly one"),
    ({"load": 1.0, "steps_per_second": 2.0}, "exactly one"),
    ({"load": 0.0}, "positive"),
    ({"load": -1.0}, "positive"),
    ({"load": float("nan")}, "positive"),
    ({"steps_per_second": 0.0}, "positive"),
    ({"load": 1.0, "block_size": 0}, "block-size"),
    ({"load": 1.0, "priority_weights": (1.0,)}, "one weight per class"),
    ({"load": 1.0, "priority_weights": (1.0, -1.0, 1.0)}, "non-negative"),
    ({"load": 1.0, "deadline_fraction": 1.5}, "between 0 and 1"),
    ({"load": 1.0, "slo_factor": 0}, "slo-factor"),
    ({"load": 1e-300}, "beyond 2.*53; give a larger load"),  # arrivals past the step range, not an int64 wrap
    ({"steps_per_second": 1e300}, "beyond 2.*53; give a smaller time scale"),
    ({"load": 1.0, "slo_factor": 1e300}, "slo-factor .* beyond 2.*53"),
])
def test_bad_options_are_user_errors(kwargs, words):
    with pytest.raises(UserError, match=words):
        cv.to_trace(big_raw(20), **kwargs)


def test_load_needs_a_span():
    with pytest.raises(UserError, match="same instant"):
        cv.to_trace(raw_of([0, 0], [1, 1], [1, 1]), load=1.0)


# ---------------------------------------------------------------- files and CLI


def test_bundled_trace_is_the_unchanged_azure_copy_with_its_licence():
    path = cv.bundled_trace_path()
    assert path.read_text(encoding="utf-8").startswith(AZURE_HEADER)
    lic = path.parent / "licenses"
    assert (lic / "AzurePublicDataset_LICENSE_CC-BY-4.0.txt").is_file()
    assert "Patel" in (path.parent / "README.md").read_text(encoding="utf-8")
    raw = cv.read_azure(path)
    assert len(raw) == 19366
    assert raw.arrival_seconds.max() == pytest.approx(3501.7, abs=0.1)


def test_cli_convert_writes_a_loadable_trace_and_sidecar(tmp_path, azure_small, capsys):
    out = tmp_path / "t.csv"
    assert main(["trace", "convert", str(azure_small), "--load", "2", "--seed", "3", "--out", str(out)]) == 0
    t = decodesched.load_trace(out)
    meta = json.loads((tmp_path / "t.csv.meta.json").read_text())
    assert meta["seed"] == 3 and meta["format"] == "azure" and meta["options"]["load"] == 2
    expect = cv.to_trace(cv.read_azure(azure_small), load=2, seed=3)
    assert meta["steps_per_second"] == pytest.approx(expect.steps_per_second)
    for col in ("arrival_step", "priority", "deadline_step", "has_deadline", "preemptible", "required_blocks"):
        assert np.array_equal(getattr(t, col), getattr(expect, col)), col
    assert decodesched.load_trace(out).steps_per_second == pytest.approx(expect.steps_per_second)
    big = 2**128 - 1  # NumPy's SeedSequence entropy: the CLI took 19 digits at most
    assert main(["trace", "convert", str(azure_small), "--load", "2", "--seed", str(big), "--out", str(out)]) == 0
    assert json.loads((tmp_path / "t.csv.meta.json").read_text())["seed"] == big
    assert np.array_equal(decodesched.load_trace(out).priority,
                          cv.to_trace(cv.read_azure(azure_small), load=2, seed=big).priority)


def test_cli_convert_mooncake_and_requests_prefix(tmp_path, capsys):
    src = write_mooncake(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]},
        {"timestamp": 3000, "input_length": 600, "output_length": 3, "hash_ids": [0, 2]},
        {"timestamp": 6000, "input_length": 600, "output_length": 3, "hash_ids": [5, 2]},
    ])
    out = tmp_path / "m.csv"
    assert main(["trace", "convert", str(src), "--steps-per-second", "2", "--requests", "2",
                 "--cache-min-blocks", "1", "--out", str(out)]) == 0
    t = decodesched.load_trace(out)
    assert t.cache_hit.tolist() == [False, True]
    assert t.arrival_step.tolist() == [0, 6]


def test_cli_inspect_prints_the_shape(tmp_path, azure_small, capsys):
    out = tmp_path / "t.csv"
    assert main(["trace", "convert", str(azure_small), "--load", "1.5", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["trace", "inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rows             3" in text
    assert " s at " in text  # seconds, from the sidecar
    load_line = next(line for line in text.splitlines() if line.startswith("offered load"))
    assert float(load_line.split()[2]) == pytest.approx(1.5, rel=0.05)
    (tmp_path / "t.csv.meta.json").unlink()
    assert main(["trace", "inspect", str(out)]) == 0
    assert " s at " not in capsys.readouterr().out


BAD_CONVERTS = [
    (["{missing}", "--load", "1"], "no such file"),
    (["{azure}", "--format", "mooncake", "--load", "1"], "line 1"),
    (["{azure}", "--format", "parquet", "--load", "1"], "invalid choice"),
    (["{azure}", "--load", "1", "--steps-per-second", "2"], "not allowed with"),
    (["{azure}"], "--load"),
    (["{azure}", "--load", "0"], "positive"),
    (["{azure}", "--load", "-2"], "positive"),
    (["{azure}", "--load", "x"], "--load: expected a positive number"),
    (["{azure}", "--load", "1", "--block-size", "0"], "block-size"),
    (["{azure}", "--load", "1e-300"], "beyond 2**53"),
    (["{azure}", "--load", "1", "--seed", str(2**128)], "--seed: expected a whole number from 0 to 2**128 - 1"),
    (["{azure}", "--load", "1", "--seed", "-1"], "--seed: expected a whole number from 0 to 2**128 - 1"),
    (["{azure}", "--load", "1", "--protected-classes", "7"], "--protected-classes 7 is not one of"),
]


@pytest.mark.parametrize("argv, words", BAD_CONVERTS)
def test_cli_bad_input_exits_2_with_one_line_and_no_file(tmp_path, azure_small, capsys, argv, words):
    out = tmp_path / "out.csv"
    argv = [a.format(missing=tmp_path / "nope.csv", azure=azure_small) for a in argv]
    rc = cli(["trace", "convert", *argv, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["az.csv"]  # nothing written, no temp files


def test_cli_inspect_bad_trace_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("request_id,arrival_step\n1,2\n")
    assert cli(["trace", "inspect", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing column" in err


def test_convert_help_documents_the_rules(capsys):
    assert cli(["trace", "convert", "--help"]) == 0
    text = capsys.readouterr().out
    for words in ("work_steps / (L * span_seconds)", "ceil((prompt_len + max_new_tokens) / --block-size)",
                  "--deadline-fraction", "--slo-factor", "--protected-classes", "seen in earlier requests",
                  "meta.json", "38.7%"):
        assert words in text, words


def test_mooncake_default_skips_the_shared_system_prompt_block(tmp_path):
    """Every conversation request shares block 0: the default (2 blocks) gives a realistic share."""
    path = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "mooncake_conversation.jsonl"
    if not path.is_file():
        pytest.skip("the shared Mooncake trace is not here")
    assert cv.read_mooncake(path, cache_min_blocks=1).cache_hit.mean() > 0.99
    share = cv.read_mooncake(path).cache_hit.mean()
    assert 0.3 < share < 0.5
    src = write_mooncake(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]},
        {"timestamp": 3000, "input_length": 600, "output_length": 3, "hash_ids": [0, 2]},
        {"timestamp": 6000, "input_length": 600, "output_length": 3, "hash_ids": [0, 2]},
    ])
    out = tmp_path / "m.csv"
    assert main(["trace", "convert", str(src), "--steps-per-second", "2", "--out", str(out)]) == 0
    assert decodesched.load_trace(out).cache_hit.tolist() == [False, False, True]
    assert cv.read_meta(out)["options"]["cache_min_blocks"] == 2


@pytest.mark.parametrize("name", ["t.parquet", "t.PQ", "t.json", "t"])
def test_convert_refuses_an_out_name_that_is_not_csv(tmp_path, capsys, name):
    """A .parquet name would hold CSV that every reader then takes for Parquet: refused, nothing written."""
    assert main(["trace", "convert", "bundled", "--load", "1", "--requests", "5", "--out", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ".csv" in err and name in err
    assert list(tmp_path.iterdir()) == []
    assert main(["trace", "convert", "bundled", "--load", "1", "--requests", "5", "--out", str(tmp_path / "T.CSV")]) == 0
    assert len(decodesched.load_trace(tmp_path / "T.CSV")) == 5
