"""What the project writes, read back: converted traces against an independent reading of the raw file (arrivals
exact at a step's edge), sweep metrics CSV cells in positional notation, and traces and tables through the project's
readers and plain `csv`, byte-identical when written again."""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decodesched import convert as cv
from decodesched.batch import Scenario, simulate_batch, write_metrics_csv
from decodesched.engine import simulate
from decodesched.errors import UserError
from decodesched.tables_io import EVENT_SCHEMA, REQUEST_SCHEMA, read_table
from decodesched.trace import TRACE_COLUMNS, load_trace

EXPONENT = re.compile(r"[0-9][eE][-+]?[0-9]")
EPOCH = datetime.datetime(2023, 11, 16, tzinfo=datetime.timezone.utc)


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "decodesched", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


# -- an independent reading of the raw sources ------------------------------------------------------------------------

def _azure_ns(text: str) -> int:
    """Nanoseconds since 1970 of an Azure TIMESTAMP ``YYYY-MM-DD HH:MM:SS.fffffffff`` (UTC), by hand."""
    date, clock = text.split(" ")
    whole, _, frac = clock.partition(".")
    day = datetime.datetime.fromisoformat(f"{date}T{whole}+00:00")
    return int(day.timestamp()) * 10**9 + int((frac + "0" * 9)[:9])


def _independent_azure(path: Path, steps_per_second: str | None, block_size: int = 16, load: str | None = None):
    """(arrival_step, prompt_len, max_new_tokens, required_blocks) by docs/files.md's rules, in exact fractions."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    ns = [_azure_ns(r["TIMESTAMP"]) for r in rows]
    prompt = [max(int(r["ContextTokens"]), 1) for r in rows]
    new = [max(int(r["GeneratedTokens"]), 1) for r in rows]
    work = sum(1 + m for m in new)
    rate = Fraction(steps_per_second) if load is None else work / (Fraction(load) * Fraction(max(ns) - min(ns), 10**9))
    arrival = [math.floor(Fraction(t - min(ns), 10**9) * rate) for t in ns]
    blocks = [-(-(p + m) // block_size) for p, m in zip(prompt, new)]
    return arrival, prompt, new, blocks


def _edge_offsets(rng, span_s: int, steps_per_second: str, n: int) -> list[int]:
    """Nanosecond offsets within `span_s` seconds, each within 2 ns of a step's edge (before, on or after it)."""
    rate = Fraction(steps_per_second)
    edges = rng.integers(1, int(span_s * rate), size=n)
    return [0] + [max(0, math.floor(Fraction(int(k)) / rate * 10**9) + int(d))
                  for k, d in zip(edges, rng.integers(-2, 3, size=n))]


def _write_azure(path: Path, offsets_ns: list[int], rng) -> None:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    base = int(EPOCH.timestamp()) * 10**9
    for off, p, g in zip(offsets_ns, rng.integers(0, 3000, len(offsets_ns)), rng.integers(0, 900, len(offsets_ns))):
        sec, frac = divmod(base + off, 10**9)
        lines.append(f"{datetime.datetime.fromtimestamp(sec, datetime.timezone.utc):%Y-%m-%d %H:%M:%S}.{frac:09d},"
                     f"{p},{g}")
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("span_days,steps_per_second,load", [
    (30, "1e6", None), (40, "1000", None), (2, "1e9", None), (3, "0.3", None), (1, "1173.145976153503", None),
    (1, "1000", "0.7"), (40, "1e6", "1.4")])
def test_azure_arrivals_are_the_exact_floor_of_the_written_times_even_a_nanosecond_before_a_step(
        tmp_path, span_days, steps_per_second, load):
    # Found: 30 days into an Azure trace at a step per microsecond, 50 of 200 requests written 1-2 ns before a step's
    # edge were put at that step: the float product was "within 8 ulps of a whole number", which 2 ns is there.
    # (With --load the last request arrives at work / load exactly, where that is whole: the edges fall elsewhere.)
    rng = np.random.default_rng(span_days)
    src = tmp_path / "azure.csv"
    _write_azure(src, _edge_offsets(rng, span_days * 86400, steps_per_second, 200), rng)
    arrival, prompt, new, blocks = _independent_azure(src, steps_per_second, load=load)
    raw = cv.read_azure(src)
    t = cv.to_trace(raw, load=float(load)) if load else cv.to_trace(raw, steps_per_second=float(steps_per_second))
    assert t.arrival_step.tolist() == arrival
    assert (t.prompt_len.tolist(), t.max_new_tokens.tolist(), t.required_blocks.tolist()) == (prompt, new, blocks)


def test_at_a_load_the_last_request_arrives_at_the_work_over_the_load():
    # (verified right before: a guard that exact arrivals take the scale a load gives as the exact quotient)
    raw = cv.read_raw(cv.bundled_trace_path()).head(20)  # (1694 work steps)
    for load in (0.7, 1.0, 1.4, 0.5):
        t = cv.to_trace(raw, load=load)
        assert int(t.arrival_step.max()) == math.floor(Fraction(t.work_steps) / Fraction(repr(load)))


def test_the_converted_csv_read_back_by_hand_is_the_independent_reading(tmp_path):
    rng = np.random.default_rng(7)
    src = tmp_path / "azure.csv"
    _write_azure(src, _edge_offsets(rng, 30 * 86400, "1e6", 150), rng)
    out = tmp_path / "-conv é.csv"
    r = _cli("trace", "convert", str(src), "--steps-per-second", "1e6", "--block-size", "7", "--out", str(out))
    assert r.returncode == 0, r.stderr
    with open(out, newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == list(TRACE_COLUMNS)
    got = {c: [row[i] for row in rows[1:]] for i, c in enumerate(rows[0])}
    arrival, prompt, new, blocks = _independent_azure(src, "1e6", block_size=7)
    assert got["request_id"] == [str(i) for i in range(len(arrival))]
    assert [got[c] for c in ("arrival_step", "prompt_len", "max_new_tokens", "required_blocks")] == \
        [[str(v) for v in col] for col in (arrival, prompt, new, blocks)]
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    assert meta["steps_per_second"] == 1e6 and meta["requests"] == len(arrival)
    assert load_trace(out).arrival_step.tolist() == arrival


def test_mooncake_arrivals_are_the_exact_floor_of_the_written_milliseconds(tmp_path):
    # Found: 801274465.999999 ms at 1e7 steps per second, 0.01 step before an edge, was put at that step (the float
    # product was within 8 ulps of it); and fractional ms less the first, divided in floats, lost their decimals.
    rng = np.random.default_rng(3)
    stamps = ["0"] + [f"{int(k)}.{int(f):03d}" for k, f in zip(rng.integers(0, 10**9, 300), rng.integers(0, 1000, 300))]
    stamps += [str(int(k)) for k in rng.integers(0, 10**9, 100)]
    stamps += [f"{int(k)}.999999" for k in rng.integers(10**8, 10**9, 100)]  # (a microsecond before a step's edge)
    src = tmp_path / "mooncake.jsonl"
    src.write_text("".join(f'{{"timestamp": {s}, "input_length": 5, "output_length": 2, "hash_ids": [1]}}\n'
                           for s in stamps))
    for rate in ("1000", "1", "0.3", "1e6", "1e7", "7"):
        ms = [Fraction(s) for s in stamps]
        want = [math.floor((m - min(ms)) / 1000 * Fraction(rate)) for m in ms]
        t = cv.to_trace(cv.read_mooncake(src), steps_per_second=float(rate))
        assert t.arrival_step.tolist() == want, rate


# -- the sweep metrics CSV ---------------------------------------------------------------------------------------------

def test_sweep_metrics_cells_are_never_written_with_an_exponent_and_read_back_as_the_same_floats(tmp_path):
    # Found: at a step per nanosecond the seconds twins were `2e-09`, `1.41e-07` (repr's notation), and a sparse
    # trace's offered_load and throughput too, where docs/files.md promises the shortest decimal.
    raw = cv.read_raw(cv.bundled_trace_path()).head(60)
    t = cv.to_trace(raw, steps_per_second=1e9, name="ns")
    batch = simulate_batch([t], [Scenario(0, "fcfs", 200), Scenario(0, "aging", 50)])
    out = tmp_path / "metrics.csv"
    write_metrics_csv(batch.rows(), out)
    with open(out, newline="") as fh:
        rows = list(csv.DictReader(fh))
    small = 0
    for want, got in zip(batch.rows(), rows):
        for k, v in want.items():
            cell = got[k]
            assert not EXPONENT.search(cell), (k, cell)
            if isinstance(v, float) and math.isfinite(v):
                assert float(cell) == v, (k, cell, v)
                small += 0 < abs(v) < 1e-4
    assert small  # (the cells that repr wrote with an exponent)


# -- traces: write, read, write again ----------------------------------------------------------------------------------

I64 = st.integers(-2**63, 2**63 - 1)


@st.composite
def extreme_traces(draw):
    n = draw(st.sampled_from([1, 3, 40, 2500]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ids = np.unique(np.concatenate([[draw(I64), -2**63, 2**63 - 1, -1, 0], rng.integers(-2**63, 2**63 - 1, n,
                                                                                       dtype=np.int64)]))
    ids = rng.permutation(ids)[:n]
    base = draw(st.sampled_from([0, 2**40, 2**52]))
    arrival = base + rng.integers(0, 2**20, n)
    deadlines = draw(st.sampled_from(["all", "none", "some"]))
    has = np.full(n, deadlines == "all") if deadlines != "some" else rng.random(n) < 0.5
    deadline = np.where(has, np.minimum(arrival + rng.integers(1, 2**30, n), 2**53), 0)
    bound = draw(st.sampled_from([3, 2**53]))
    return {
        "request_id": ids, "arrival_step": arrival, "prompt_len": rng.integers(1, 2**30, n),
        "max_new_tokens": rng.integers(1, 4, n), "priority": rng.integers(-bound, bound + 1, n),
        "cache_hit": rng.random(n) < 0.5, "required_blocks": rng.integers(1, 2**30, n),
        "deadline_step": [int(d) if h else None for d, h in zip(deadline, has)], "preemptible": rng.random(n) < 0.5,
    }


def _plain_trace_csv(path: Path) -> tuple[list[str], dict]:
    with open(path, newline="", encoding="ascii") as fh:
        rows = list(csv.reader(fh))
    return rows[0], {c: [row[i] for row in rows[1:]] for i, c in enumerate(rows[0])}


@settings(derandomize=True, max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cols=extreme_traces(), scale=st.sampled_from([None, 1e-300, 3.5e6, 1e300]))
def test_a_trace_written_reads_back_equal_by_the_project_and_by_hand_and_writes_the_same_bytes(tmp_path, cols, scale):
    # (verified right: a guard of the round trip)
    t = load_trace(cols, steps_per_second=scale, name="first")
    a, b = tmp_path / "a trace é.csv", tmp_path / "-b.csv"
    t.to_csv(a)
    back = load_trace(a)
    assert back.steps_per_second == scale and back.name == "a trace é"
    for c in TRACE_COLUMNS:
        assert np.array_equal(getattr(back, c), getattr(t, c)), c
    assert np.array_equal(back.has_deadline, t.has_deadline)
    header, got = _plain_trace_csv(a)
    assert header == list(TRACE_COLUMNS)
    for c in ("request_id", "arrival_step", "prompt_len", "max_new_tokens", "priority", "required_blocks"):
        assert got[c] == [str(int(v)) for v in getattr(t, c)], c
    assert got["deadline_step"] == [str(int(d)) if h else "" for d, h in zip(t.deadline_step, t.has_deadline)]
    assert got["cache_hit"] == ["true" if v else "false" for v in t.cache_hit]
    back.to_csv(b)
    assert b.read_bytes() == a.read_bytes()
    assert Path(f"{b}.meta.json").exists() == (scale is not None)
    if scale is not None:
        assert json.loads(Path(f"{b}.meta.json").read_text())["steps_per_second"] == scale


def _plain_table(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="", encoding="ascii") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


@settings(derandomize=True, max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cols=extreme_traces(), policy=st.sampled_from(["fcfs", "fixed_priority", "aging", "deadline"]),
       blocks=st.integers(2**30, 2**31))
def test_event_and_request_tables_read_back_by_hand_as_the_result(tmp_path, cols, policy, blocks):
    # (verified right: a guard of the round trip, with ids at the int64 limits and deadlines on all, some or none)
    cols = {k: v[:40] for k, v in cols.items()}
    r = simulate(load_trace(cols), policy, free_kv_blocks=blocks)
    ev, rq = tmp_path / "ev é.csv", tmp_path / "-rq.csv"
    r.write_events(ev)
    r.write_requests(rq)
    header, rows = _plain_table(ev)
    assert header == [name for name, _ in EVENT_SCHEMA]
    assert len(rows) == r.n_events
    ids = {int(x) for x in r.trace.request_id}
    assert all(int(row[1]) in ids and row[2] in ("prefill", "decode") for row in rows)
    header, rows = _plain_table(rq)
    assert header == [name for name, _ in REQUEST_SCHEMA]
    req = r.requests
    for j, (name, kind) in enumerate(REQUEST_SCHEMA):
        cells = [row[j] for row in rows]
        assert not any(EXPONENT.search(x) for x in cells), name
        if kind.startswith("float"):
            assert np.array_equal([float(x) if x else math.nan for x in cells], req[name], equal_nan=True), name
        elif name == "request_id":
            assert cells == [str(int(v)) for v in req[name]]
    for path, write, schema in ((ev, r.write_events, EVENT_SCHEMA), (rq, r.write_requests, REQUEST_SCHEMA)):
        assert list(read_table(path)) == [name for name, _ in schema]
        write(tmp_path / "again.csv")
        assert (tmp_path / "again.csv").read_bytes() == path.read_bytes()


# -- where the files go ------------------------------------------------------------------------------------------------

def test_convert_writes_to_odd_names_with_the_umask_and_again_over_the_same_content(tmp_path):
    # (verified right: names with spaces, accents and a leading dash; modes from the umask; a rewrite keeps the mode)
    old = os.umask(0o077)
    try:
        r = _cli("trace", "convert", "bundled", "--load", "1", "--requests", "300", "--out", "-a b é.csv",
                 cwd=tmp_path)
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "-a b é.csv"
    side = Path(f"{out}.meta.json")
    assert (out.stat().st_mode & 0o777, side.stat().st_mode & 0o777) == (0o600, 0o600)
    first, first_side = out.read_bytes(), side.read_bytes()
    out.chmod(0o640)
    r = _cli("trace", "convert", "bundled", "--load", "1", "--requests", "300", "--out", "./-a b é.csv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == first and side.read_bytes() == first_side and out.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name, side.name]


_TO_STDOUT = """
import sys
from decodesched.trace import load_trace
t = load_trace({"request_id": [5, -7], "arrival_step": [0, 3], "prompt_len": [1, 2], "max_new_tokens": [1, 1],
                "priority": [0, 1], "cache_hit": [True, False], "required_blocks": [1, 1], "deadline_step": [None, 9],
                "preemptible": [True, True]}, steps_per_second=float(sys.argv[1]) if len(sys.argv) > 1 else None)
t.to_csv("-")
"""


def test_to_csv_to_standard_output_writes_the_csv_alone_and_leaves_a_sidecar_named_dash_alone(tmp_path):
    # Found: `trace.to_csv("-")` printed the CSV and also wrote `-.meta.json` into the current folder (and, for a
    # trace without a time scale, deleted a file of that name).
    r = subprocess.run([sys.executable, "-c", _TO_STDOUT, "2.5"], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "t.csv").write_text(r.stdout)
    assert load_trace(tmp_path / "t.csv").request_id.tolist() == [5, -7]
    mine = tmp_path / "-.meta.json"
    mine.write_text('{"mine": true}\n')
    r = subprocess.run([sys.executable, "-c", _TO_STDOUT], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and r.stdout == (tmp_path / "t.csv").read_text()
    assert mine.read_text() == '{"mine": true}\n'


def test_write_trace_to_a_dash_is_refused_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t = cv.to_trace(cv.RawTrace(np.array([0.0, 1.0]), np.array([3, 4]), np.array([1, 2]), None),
                    steps_per_second=10)
    with pytest.raises(UserError, match="^-: write_trace writes a file and its sidecar"):
        cv.write_trace(t, "-", {})
    assert list(tmp_path.iterdir()) == []
