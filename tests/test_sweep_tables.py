"""Sweep tables that answer questions: honest (censored) statistics, per-class, load and seconds
columns, the de-duplicated grid, replicates, and local sweeps that checkpoint and resume."""

from __future__ import annotations

import csv
import math
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import decodesched
from decodesched import batch as B
from decodesched import checkpoint as C
from decodesched import convert as cv
from decodesched import metrics as M
from decodesched.cli import main
from decodesched.errors import UserError
from decodesched.trace import TRACE_COLUMNS

TRACE_CSV = ",".join(TRACE_COLUMNS) + """
1,0,4,3,0,false,2,,true
2,0,2,2,5,true,3,10,true
3,1,3,4,1,false,4,6,false
-4,2,5,1,-2,false,1,,true
"""


def nan_equal(a, b) -> bool:
    def norm(rows):
        return [{k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows]
    return norm(a) == norm(b)


@given(st.lists(st.integers(0, 50), max_size=30), st.integers(0, 5), st.integers(0, 30))
def test_censored_percentiles_are_upper_envelopes_of_every_completion(values, censored, extra):
    """Whatever the censored requests would have taken (at least the largest finished value), the true
    percentile is at most the censored one, and equal to it whenever the censored one is finite."""
    got = M.percentiles_censored(np.array(values, float), censored)
    if not values and not censored:
        assert all(math.isnan(g) for g in got)
        return
    top = max(values, default=0)
    for fill in (top, top + extra):
        full = np.percentile(np.array(values + [fill] * censored, float), M.PERCENTILES)
        for g, f in zip(got, full):
            assert f <= g
            if math.isfinite(g):
                assert g == f
    if censored == 0:
        assert got == pytest.approx(np.percentile(values, M.PERCENTILES).tolist())


TRACE = {  # request 3 needs 6 blocks: unservable below 6; request 4 arrives late and waits
    "request_id": [1, 2, 3, 4], "arrival_step": [0, 0, 0, 1], "prompt_len": [3, 2, 2, 2],
    "max_new_tokens": [2, 3, 1, 2], "priority": [0, 1, 1, 0], "cache_hit": [False, False, False, False],
    "required_blocks": [2, 2, 6, 2], "deadline_step": [None, 30, 30, None], "preemptible": [True] * 4,
}


def test_no_statistic_improves_by_dropping_requests():
    small = decodesched.simulate(TRACE, policy="fcfs", free_kv_blocks=4).metrics
    large = decodesched.simulate(TRACE, policy="fcfs", free_kv_blocks=8).metrics
    assert small["unservable"] == 1 and large["unfinished"] == 0
    for name in ("queue_wait", "ttft", "e2e"):
        assert small[name]["p99"] == math.inf and small[name]["max"] == math.inf and small[name]["mean"] == math.inf
        assert small[name]["censored"] == 1 and math.isfinite(large[name]["p99"])
        assert small[name]["p99"] >= large[name]["p99"]
    assert small["per_class"][1]["ttft"]["p50"] == math.inf  # one of its two requests never ran
    assert math.isfinite(small["per_class"][0]["ttft"]["p99"])
    # starvation: the longest wait of a request that ran, not of one that never could
    req = decodesched.simulate(TRACE, policy="fcfs", free_kv_blocks=4).requests
    ran = req["first_step"] >= 0
    assert small["starvation"] == req["wait_steps"][ran].max()
    # fairness: a class whose request never finished got no service for it
    assert small["per_class"][1]["mean_service_share"] < large["per_class"][1]["mean_service_share"]


def test_rows_carry_load_seconds_and_per_class_columns():
    trace = decodesched.load_trace(TRACE, steps_per_second=4.0, name="t")
    plain = decodesched.load_trace(TRACE, name="u")
    batch = B.simulate_batch([trace, plain], B.grid(2, ["aging", "fcfs"], [4, 8], [1, 2]))
    rows = batch.rows()
    assert len(rows) == 2 * 2 * (2 + 1)
    for i, row in enumerate(rows):
        sc = batch.scenarios[i]
        m = batch.metrics(i)
        assert row["offered_load"] == M.offered_load(batch.traces[sc.trace])
        assert (row["aging_interval"] == sc.aging_interval) if sc.policy == "aging" else math.isnan(row["aging_interval"])
        for p, per in m["per_class"].items():
            assert row[f"ttft_p99_class{p}"] == per["ttft"]["p99"]
            assert row[f"queue_wait_p50_class{p}"] == per["queue_wait"]["p50"]
            assert row[f"starvation_class{p}"] == per["starvation"] or math.isnan(per["starvation"])
            assert row[f"slo_attainment_class{p}"] == per["slo_attainment"] or math.isnan(per["slo_attainment"])
            assert row[f"preemptions_class{p}"] == per["preemptions"]
        if sc.trace == 0:
            assert row["steps_per_second"] == 4.0
            assert row["e2e_p50_s"] == row["e2e_p50"] / 4.0 and row["ttft_p50_s_class0"] == row["ttft_p50_class0"] / 4
        else:
            assert math.isnan(row["steps_per_second"]) and "e2e_p50_s" not in row
    cols = B.row_columns(rows)
    assert cols.index("e2e_p50_s") == cols.index("e2e_p50") + 1  # seconds beside steps
    assert cols[-1].endswith("_class1")


def converted(seed: int):
    raw = cv.read_azure(cv.bundled_trace_path()).head(300)
    return raw, cv.to_trace(raw, load=1.2, seed=seed, name="azure")


def test_replicates_redraw_the_seeded_classes_and_deadlines():
    raw, trace = converted(5)
    reps = B.replicate_traces([trace], 3, [{"seed": 5}])
    assert reps[0] is trace
    for r, rep in enumerate(reps[1:], start=1):
        want = cv.to_trace(raw, load=1.2, seed=5 + r)  # the same as converting with the next seed
        for col in ("priority", "deadline_step", "has_deadline", "preemptible"):
            assert np.array_equal(getattr(rep, col), getattr(want, col)), col
        for col in ("request_id", "arrival_step", "prompt_len", "max_new_tokens", "required_blocks", "cache_hit"):
            assert np.array_equal(getattr(rep, col), getattr(trace, col)), col
        assert rep.steps_per_second == trace.steps_per_second and rep.name == trace.name
    assert not np.array_equal(reps[1].priority, reps[2].priority)
    rules = B.convert_rules({"seed": 3, "options": {"priority_classes": [4, 7], "priority_weights": None,
                                                   "deadline_fraction": 1.0, "slo_factor": 2.0, "load": 1.0}})
    assert rules == {"priority_classes": [4, 7], "priority_weights": None, "deadline_fraction": 1.0,
                     "slo_factor": 2.0, "seed": 3}
    other = B.replicate_traces([trace], 2, [rules])[1]
    assert set(other.priority.tolist()) <= {4, 7} and other.has_deadline.all()


def test_cli_sweep_replicates_and_the_twenty_row_grid(tmp_path, capsys):
    raw, _ = converted(0)
    paths = []
    for load in (0.8, 1.2):
        p = tmp_path / f"azure{load}.csv"
        cv.write_trace(cv.to_trace(raw.head(60), load=load, seed=0), p, {"seed": 0, "options": {}})
        paths.append(str(p))
    out = tmp_path / "m.csv"
    assert main(["sweep", *paths, "--policy", "fcfs,aging,deadline", "--kv-blocks", "20,60",
                 "--aging-interval", "1,2,4", "--threads", "1", "--out", str(out)]) == 0
    with open(out, newline="") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 20
    assert {r["trace"] for r in table} == {"azure0.8", "azure1.2"}
    assert all(r["offered_load"] and r["steps_per_second"] and "ttft_p99_class2" in r for r in table)
    assert not (tmp_path / "m.csv.partial.jsonl").exists()
    assert main(["sweep", paths[0], "--policy", "fcfs", "--kv-blocks", "60", "--replicates", "3",
                 "--out", str(out)]) == 0
    with open(out, newline="") as fh:
        table = list(csv.DictReader(fh))
    assert [(r["trace"], r["replicate"]) for r in table] == [("azure0.8", str(r)) for r in range(3)]
    assert len({r["ttft_p99_class2"] for r in table}) > 1  # the redrawn classes give other class results
    capsys.readouterr()
    assert main(["sweep", paths[0], "--policy", "fcfs", "--kv-blocks", "60", "--replicates", "0",
                 "--out", str(out)]) == 2
    assert "--replicates" in capsys.readouterr().err


@pytest.mark.parametrize("options, message", [
    ({"priority_classes": 0}, "--priority-classes must be a list of numbers, got 0"),
    ({"priority_classes": [0, "a"]}, "--priority-classes must be whole numbers within +-2**53, got 'a'"),
    ({"priority_classes": [0, 2**70]}, "--priority-classes must be whole numbers within +-2**53"),
    ({"priority_weights": {"a": 1}}, "--priority-weights must be a list of numbers"),
    ({"priority_weights": [1, None, 1]}, "--priority-weights must be numbers, got None"),
    ({"deadline_fraction": [0.5]}, "--deadline-fraction must be between 0 and 1, got [0.5]"),
    ({"slo_factor": "20"}, "--slo-factor must be a positive number, got '20'"),
    ({"slo_factor": 10**400}, "--slo-factor must be a positive number"),
    ({"protected_classes": [True]}, "--protected-classes must be whole numbers within +-2**53, got True"),
    ({"seed": "x"}, "the seed must be a whole number >= 0, got 'x'"),
])
def test_a_garbled_sidecar_is_refused_in_one_line_by_sweep_replicates(tmp_path, capsys, options, message):
    """Found by a fuzz of `.meta.json` values: options of the wrong type reached NumPy as tracebacks."""
    raw, _ = converted(0)
    path = tmp_path / "azure.csv"
    meta = {"seed": options.pop("seed", 0), "options": options}
    cv.write_trace(cv.to_trace(raw.head(40), load=1.0, seed=0), path, meta)
    out = tmp_path / "m.csv"
    assert main(["sweep", str(path), "--policy", "fcfs", "--kv-blocks", "60", "--replicates", "2",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "replicate rules" in err and err.count("\n") == 1
    assert not out.exists()


@pytest.fixture(scope="module")
def sweep():
    _, trace = converted(1)
    traces = [trace, trace.subset(np.arange(120))]
    return traces, B.grid(traces, ["fixed_priority", "aging", "deadline", "fcfs"], [40, 200, 800], [1, 4])


def test_local_sweep_equals_one_batch_and_resumes_after_an_interrupt(sweep, tmp_path, monkeypatch):
    traces, scenarios = sweep
    want = B.simulate_batch(traces, scenarios).rows()
    assert nan_equal(C.run_local(traces, scenarios, chunk_size=5), want)

    ck = tmp_path / "m.csv.partial.jsonl"
    real = B.simulate_batch
    calls = []
    interrupt = [3]  # Ctrl-C during the third chunk of the first run

    def flaky(traces, chunk, **kw):
        calls.append(len(chunk))
        if len(calls) == interrupt[0]:
            raise KeyboardInterrupt
        return real(traces, chunk, **kw)

    monkeypatch.setattr(B, "simulate_batch", flaky)
    with pytest.raises(KeyboardInterrupt):
        C.run_local(traces, scenarios, chunk_size=5, checkpoint_path=ck)
    saved = C.read_checkpoint(ck, C.sweep_key(traces, scenarios), len(scenarios))
    assert len(saved) == 10  # the two finished chunks
    assert nan_equal([saved[i] for i in sorted(saved)], [want[i] for i in sorted(saved)])
    calls.clear()
    interrupt[0] = 0
    rows = C.run_local(traces, scenarios, chunk_size=5, checkpoint_path=ck)
    assert sum(calls) == len(scenarios) - 10  # only what was missing ran
    assert nan_equal(rows, want) and not ck.exists()
    # a checkpoint of another sweep is not reused, and a run that stops before its first chunk
    # finished leaves it as it was (a checkpoint file is opened with the first finished chunk)
    other = C.Checkpoint(ck, "another sweep", len(scenarios), {})
    other.add([0], [dict(want[0], finished=-1)])
    other.close()
    before = ck.read_bytes()
    calls.clear()
    interrupt[0] = 1
    with pytest.raises(KeyboardInterrupt):
        C.run_local(traces, scenarios, chunk_size=5, checkpoint_path=ck)
    assert ck.read_bytes() == before
    calls.clear()
    interrupt[0] = 0
    assert nan_equal(C.run_local(traces, scenarios, chunk_size=50, checkpoint_path=ck), want)
    assert sum(calls) == len(scenarios) and not ck.exists()
    # nor does such a run leave a file where there was none
    interrupt[0] = 1
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        C.run_local(traces, scenarios, chunk_size=5, checkpoint_path=ck)
    assert not ck.exists()


@pytest.mark.parametrize("occupant", ["folder", "file", "link", "dangling link"])
def test_a_checkpoint_path_held_by_something_else_is_refused_before_any_work(sweep, tmp_path, monkeypatch, occupant):
    """The sweep replaces and then removes its checkpoint: where another file, a folder or a link
    sits at that path, it stops before the first chunk and leaves them as they were."""
    traces, scenarios = sweep
    ck = tmp_path / "m.csv.partial.jsonl"
    precious = tmp_path / "precious.csv"
    precious.write_text("keep me\n")
    if occupant == "folder":
        ck.mkdir()
    elif occupant == "file":
        ck.write_text("request_id,arrival_step\n")
    else:
        ck.symlink_to(precious if occupant == "link" else tmp_path / "nowhere")
    calls = []
    monkeypatch.setattr(B, "simulate_batch", lambda *a, **k: calls.append(1))
    with pytest.raises(UserError, match="the sweep keeps its checkpoint here"):
        C.run_local(traces, scenarios, chunk_size=5, checkpoint_path=ck)
    assert not calls and precious.read_text() == "keep me\n"
    assert ck.is_symlink() or ck.exists()
    if occupant == "file":
        assert ck.read_text() == "request_id,arrival_step\n"


def test_sweep_cli_keeps_an_input_or_a_linked_file_at_its_checkpoint_path(tmp_path, capsys):
    """`sweep X.partial.jsonl --out X`: the input trace is the checkpoint path; and a link there to
    another file: both refused with one line, exit 2, nothing written."""
    trace = tmp_path / "m.csv.partial.jsonl"
    trace.write_text(TRACE_CSV)
    assert main(["sweep", str(trace), "--policy", "aging", "--kv-blocks", "3", "--out", str(tmp_path / "m.csv")]) == 2
    assert "the sweep keeps its checkpoint here" in capsys.readouterr().err
    assert trace.read_text() == TRACE_CSV and not (tmp_path / "m.csv").exists()
    src = tmp_path / "t.csv"
    src.write_text(TRACE_CSV)
    precious = tmp_path / "precious.csv"
    precious.write_text(TRACE_CSV)
    (tmp_path / "r.csv.partial.jsonl").symlink_to(precious)
    assert main(["sweep", str(src), "--policy", "aging", "--kv-blocks", "3", "--out", str(tmp_path / "r.csv")]) == 2
    assert precious.read_text() == TRACE_CSV and not (tmp_path / "r.csv").exists()


def test_checkpoint_keeps_censored_and_missing_values(tmp_path):
    ck = tmp_path / "c.jsonl"
    rows = [{"trace": "t", "ttft_p99": math.inf, "starvation": math.nan, "finished": 3}]
    c = C.Checkpoint(ck, "k", 1, {})
    c.add([0], rows)
    c.close()
    with open(ck, "a") as fh:
        fh.write('{"indices": [0], "rows": [')  # a torn last line is ignored
    back = C.read_checkpoint(ck, "k", 1)[0]
    assert back["ttft_p99"] == math.inf and math.isnan(back["starvation"]) and back["finished"] == 3


@pytest.mark.slow
def test_ctrl_c_stops_a_local_sweep_and_keeps_finished_chunks(tmp_path):
    trace_path = tmp_path / "azure.csv"
    assert main(["trace", "convert", "bundled", "--load", "1.2", "--out", str(trace_path)]) == 0
    out = tmp_path / "m.csv"
    partial = tmp_path / "m.csv.partial.jsonl"
    caps = ",".join(str(c) for c in range(2000, 2000 + 200 * 40, 200))  # far more work than the wait below
    proc = subprocess.Popen(
        [sys.executable, "-m", "decodesched.cli", "sweep", str(trace_path), "--policy", "aging,fcfs",
         "--kv-blocks", caps, "--aging-interval", "1,2,4", "--chunk-size", "2", "--threads", "1", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):  # until the first chunk is saved
            if partial.exists() and len(partial.read_text().splitlines()) >= 2 or proc.poll() is not None:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "rerun the same command to resume" in err and "Traceback" not in err
    assert not out.exists() and len(partial.read_text().splitlines()) >= 2


def test_grid_asks_a_policy_object_whether_the_interval_matters():
    """A `decodesched.Policy` varies the interval only if it uses it (the built-in aging as a Policy)."""
    import numba

    from decodesched import Policy
    from decodesched.policy import builtin

    @numba.njit
    def shortest(r, clock):
        return (r.phase, r.max_new_tokens - r.generated_len)

    @numba.njit
    def business(r, clock):
        return r.priority

    sjf, aged = Policy("sjf", key=shortest, effective_priority=business), builtin("aging")
    sc = B.grid(1, [sjf, aged, "fcfs"], [8], [1, 2, 4])  # ("aging" and aged too: the same policy twice, refused)
    assert [(B.policy_name(s.policy), s.aging_interval) for s in sc] == [
        ("sjf", 1), ("aging", 1), ("aging", 2), ("aging", 4), ("fcfs", 1)]
    assert [s.aging_interval for s in B.grid(1, ["aging"], [8], [1, 2, 4])] == [1, 2, 4]
    assert [B.uses_aging_interval(p) for p in ("aging", "fcfs", "deadline", "fixed_priority", sjf, aged)] == [
        True, False, False, False, False, True]
    other = Policy("other", key=shortest, effective_priority=business)
    assert C.sweep_key([], sc) != C.sweep_key([], B.grid(1, [other, aged, "fcfs"], [8], [1, 2, 4]))


def test_a_sweep_resumed_after_a_policy_was_edited_starts_afresh(tmp_path):
    """The checkpoint's key named a user policy by its module and name only: a sweep interrupted,
    its policy's function edited (same name), and run again kept the old function's rows."""
    from decodesched.policy import resolve_policy
    from oracle import write_sjf_module

    first = resolve_policy(f"{write_sjf_module(tmp_path / 'a.py', 'sjf')}:SJF")
    same = resolve_policy(f"{write_sjf_module(tmp_path / 'b.py', 'sjf')}:SJF")
    edited_path = write_sjf_module(tmp_path / "c.py", "sjf")
    edited_path.write_text(edited_path.read_text().replace("r.max_new_tokens - r.generated_len", "-r.prompt_len"))
    edited = resolve_policy(f"{edited_path}:SJF")
    key = [C.sweep_key([], [B.Scenario(0, p, 8)]) for p in (first, same, edited)]
    assert key[0] == key[1] != key[2]  # the same code in another file is the same policy
