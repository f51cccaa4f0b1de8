"""Batches of scenarios: each equals `simulate` run alone, for any thread count, order and engine."""

from __future__ import annotations

import csv
import math
import random

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import POLICIES, assert_matches_model, traces

import decodesched
from decodesched import batch as B
from decodesched.cli import main
from decodesched.engine import simulate
from decodesched.errors import UserError
from decodesched.trace import load_trace


def same_result(a, b) -> None:
    """Two SimulationResults hold the same event log, per-request state and summary."""
    assert np.array_equal(a.summary, b.summary), (a.summary, b.summary)
    assert np.array_equal(a.request_state, b.request_state)
    if a.event_log is None or b.event_log is None:
        assert a.event_log is None and b.event_log is None
    else:
        assert np.array_equal(a.event_log, b.event_log)


scenario_lists = st.lists(
    st.tuples(st.sampled_from(POLICIES), st.integers(0, 12), st.integers(1, 5),
              st.one_of(st.none(), st.integers(0, 40))),
    min_size=1, max_size=8)


@settings(max_examples=40)
@given(st.lists(traces(), min_size=1, max_size=3), scenario_lists, st.randoms(use_true_random=False))
def test_batch_equals_single_runs(rows_per_trace, configs, rnd):
    loaded = [load_trace(rows) for rows in rows_per_trace]
    scenarios = [B.Scenario(rnd.randrange(len(loaded)), p, c, k, m) for p, c, k, m in configs]
    batch = B.simulate_batch(loaded, scenarios, record_events=True, threads=2)
    assert len(batch) == len(scenarios)
    for i, sc in enumerate(scenarios):
        alone = simulate(loaded[sc.trace], sc.policy, sc.free_kv_blocks, sc.aging_interval, sc.max_steps)
        same_result(batch.result(i), alone)
    # And against the seed's model, directly, for the first scenario.
    sc = scenarios[0]
    assert_matches_model(batch.result(0), rows_per_trace[sc.trace], sc.policy, sc.free_kv_blocks, sc.aging_interval,
                         sc.max_steps)


def random_trace(rng: np.random.Generator, n: int, name: str) -> dict:
    arrival = np.sort(rng.integers(0, 3 * n, n))
    new = rng.integers(1, 12, n)
    has_deadline = rng.random(n) < 0.5
    deadline = [int(a + rng.integers(1, 4 * (t + 2))) if h else None for a, t, h in zip(arrival, new, has_deadline)]
    return load_trace({
        "request_id": rng.permutation(np.arange(-n, 4 * n))[:n],
        "arrival_step": arrival,
        "prompt_len": rng.integers(1, 50, n),
        "max_new_tokens": new,
        "priority": rng.integers(-1, 3, n),
        "cache_hit": rng.random(n) < 0.3,
        "required_blocks": rng.integers(1, 9, n),
        "deadline_step": deadline,
        "preemptible": rng.random(n) < 0.8,
    }, name=name)


@pytest.fixture(scope="module")
def workload():
    rng = np.random.default_rng(7)
    loaded = [random_trace(rng, 120, "a"), random_trace(rng, 60, "b")]
    scenarios = B.grid(loaded, POLICIES, [4, 10, 40], [1, 3])
    return loaded, scenarios


def test_threads_order_and_engine_do_not_change_results(workload):
    loaded, scenarios = workload
    one = B.simulate_batch(loaded, scenarios, record_events=True, threads=1)
    two = B.simulate_batch(loaded, scenarios, record_events=True, threads=2)
    assert one.threads == 1 and two.threads == 2
    perm = list(range(len(scenarios)))
    random.Random(3).shuffle(perm)
    shuffled = B.simulate_batch(loaded, [scenarios[i] for i in perm], record_events=True, threads=2,
                                progress=True)  # chunked: several kernel calls
    scan = B.simulate_batch(loaded, scenarios, record_events=True, threads=2, engine="scan")
    events_seen = 0
    for i in range(len(scenarios)):
        same_result(one.result(i), two.result(i))
        same_result(one.result(i), scan.result(i))
        same_result(one.result(perm[i]), shuffled.result(i))
        events_seen += one.result(i).n_events
    assert events_seen > 0


def test_threads_setting_is_restored(workload):
    loaded, scenarios = workload
    before = numba.get_num_threads()
    B.simulate_batch(loaded, scenarios[:3], threads=1)
    assert numba.get_num_threads() == before
    with pytest.raises(UserError, match="threads"):
        B.simulate_batch(loaded, scenarios[:3], threads=0)
    with pytest.raises(UserError, match="threads"):
        B.simulate_batch(loaded, scenarios[:3], threads=numba.config.NUMBA_NUM_THREADS + 1)
    assert numba.get_num_threads() == before


def test_per_request_mode_keeps_requests_and_metrics_only(workload):
    loaded, scenarios = workload
    full = B.simulate_batch(loaded, scenarios, record_events=True)
    lean = B.simulate_batch(loaded, scenarios)  # record_events=False is the default
    assert lean.event_log is None
    for i in range(len(scenarios)):
        r = lean.result(i)
        assert r.event_log is None
        assert np.array_equal(r.request_state, full.result(i).request_state)
        assert r.metrics["events"] == full.result(i).metrics["events"]
        with pytest.raises(ValueError, match="no event log"):
            r.timeline()
    assert lean.rows() == full.rows() or _rows_equal_nan(lean.rows(), full.rows())


def _rows_equal_nan(a, b) -> bool:
    def norm(rows):
        return [{k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows]
    return norm(a) == norm(b)


def test_grid_order_and_validation():
    sc = B.grid(2, ["aging", "fcfs"], [1, 2], [3, 4])
    assert len(sc) == 2 * 2 * (2 + 1)  # fcfs does not depend on the interval: it runs once
    assert [(s.trace, s.policy, s.free_kv_blocks, s.aging_interval) for s in sc[:3]] == [
        (0, "aging", 1, 3), (0, "aging", 1, 4), (0, "aging", 2, 3)]
    assert sc[-1] == B.Scenario(1, "fcfs", 2, 3)
    # the sweep of the issue: 2 traces x 3 policies (one of them aging) x 2 capacities x 3 intervals
    assert len(B.grid(2, ["fcfs", "aging", "deadline"], [8, 16], [1, 2, 4])) == 20
    for policies in (["aging"], ["fcfs", "aging"], ["deadline", "fixed_priority", "fcfs"]):
        got = B.grid(1, policies, [8], [1, 2, 4])
        assert len(got) == sum(3 if p == "aging" else 1 for p in policies)
        assert [s.policy for s in got] == [p for p in policies for _ in range(3 if p == "aging" else 1)]
    reps = B.grid(2, ["fcfs"], [8], [4], replicates=3)
    assert [(s.trace, s.replicate) for s in reps] == [(0, 0), (1, 1), (2, 2), (3, 0), (4, 1), (5, 2)]
    with pytest.raises(UserError, match="replicates"):
        B.grid(1, ["fcfs"], [8], [4], replicates=0)
    # one value, or a string, where a list belongs: named (a string made a scenario per character)
    for args, name in (((1, ["aging"], 4, [4]), "kv_blocks"), ((1, "aging", [4], [4]), "policies"),
                       ((1, ["aging"], [4], 4), "aging_intervals"), ((1, ["aging"], [4], "4"), "aging_intervals")):
        with pytest.raises(UserError, match=f"grid: {name} must be a list of values"):
            B.grid(*args)
    assert len(B.grid(1, ("aging", "fcfs"), range(1, 3), np.array([2, 3]))) == 6
    # a grid or replicates beyond this machine's memory are refused before anything is built
    with pytest.raises(UserError, match="the grid's scenarios would take at least .* GiB, more than this machine"):
        B.grid(1, ["aging"], [4], [4], replicates=10**12)
    rows1 = [{"request_id": 1, "arrival_step": 0, "prompt_len": 1, "max_new_tokens": 1, "priority": 0,
              "cache_hit": False, "required_blocks": 1, "deadline_step": None, "preemptible": True}]
    with pytest.raises(UserError, match="1000000000000 replicates of 1 trace would take"):
        B.replicate_traces([rows1], 10**12)
    rows = [{"request_id": 1, "arrival_step": 0, "prompt_len": 1, "max_new_tokens": 1, "priority": 0,
             "cache_hit": False, "required_blocks": 1, "deadline_step": None, "preemptible": True}]
    with pytest.raises(UserError, match="scenario 1: unknown policy"):
        B.simulate_batch(rows, [B.Scenario(0, "aging", 1), B.Scenario(0, "lifo", 1)])
    with pytest.raises(UserError, match="scenario 0: aging_interval"):
        B.simulate_batch(rows, [B.Scenario(0, "aging", 1, 0)])
    with pytest.raises(UserError, match="trace index 1"):
        B.simulate_batch(rows, [B.Scenario(1, "aging", 1)])
    with pytest.raises(UserError, match="scenario 0: max_steps"):
        B.simulate_batch(rows, [B.Scenario(0, "aging", 1, 4, -1)])
    with pytest.raises(UserError, match="backend"):
        B.simulate_batch(rows, [B.Scenario(0, "aging", 1)], backend="tpu")
    with pytest.raises(UserError, match="record_events must be True or False, got 'no'"):
        B.simulate_batch(rows, [B.Scenario(0, "aging", 1)], record_events="no")
    with pytest.raises(UserError, match="progress must be True or False or None, got 'off'"):
        B.simulate_batch(rows, [B.Scenario(0, "aging", 1)], progress="off")
    assert B.simulate_batch(rows, [B.Scenario(0, "aging", 1)], record_events=np.bool_(True)).event_log is not None
    # A single trace given as row dicts is one trace, not a list of traces.
    assert len(decodesched.simulate_batch(rows, [B.Scenario(0, "aging", 1)]).traces) == 1


ROW = {"request_id": 1, "arrival_step": 0, "prompt_len": 2, "max_new_tokens": 2, "priority": 0, "cache_hit": False,
       "required_blocks": 1, "deadline_step": None, "preemptible": True}


@pytest.mark.parametrize("memory", ["known", "unknown"])
def test_event_logs_whose_offsets_pass_int64_are_refused_not_wrapped(monkeypatch, memory):
    """Scenarios whose worst-case event logs sum past 2**63 rows (capacity 0 makes them stop at once):
    the int64 offsets wrapped around, so the scenario between them got a slice outside the log and an
    empty timeline beside its 3 events, with no error (or NumPy's "negative dimensions").  A real case:
    a trace of 2**21 rows of 2**40 - 1 tokens (2**61 work steps), 4 scenarios at capacity 0, one on a
    small trace, 4 more at capacity 0.  Here `event_capacity` says 2**61 for the big ones."""
    caps = iter([2**61] * 4 + [3] + [2**61] * 4)
    monkeypatch.setattr(B, "event_capacity", lambda trace, max_steps: next(caps))
    if memory == "unknown":
        monkeypatch.setattr(decodesched.engine, "_memory_bytes", lambda: None)
    scenarios = [B.Scenario(0, "fcfs", 0)] * 4 + [B.Scenario(0, "fcfs", 5)] + [B.Scenario(0, "fcfs", 0)] * 4
    with pytest.raises(UserError, match="the event log of 18446744073709551619 rows would take at least"):
        B.simulate_batch([[ROW]], scenarios, record_events=True, threads=1)


def test_results_beyond_memory_are_one_clear_line(monkeypatch):
    """The per-request results of every scenario (80 bytes per request and scenario) beyond this machine's
    memory: a raw NumPy MemoryError before (a 100,000-row trace x 400,000 capacities asked 2.91 TiB)."""
    scenarios = B.grid(1, ["fcfs"], list(range(1, 101)), [4])
    monkeypatch.setattr(decodesched.engine, "_memory_bytes", lambda: 10_000)
    with pytest.raises(UserError, match=r"the per-request results of 100 scenarios \(200 rows\) would take at least"):
        B.simulate_batch([[ROW, dict(ROW, request_id=2)]], scenarios)
    monkeypatch.setattr(decodesched.engine, "_memory_bytes", lambda: 10**9)
    assert len(B.simulate_batch([[ROW, dict(ROW, request_id=2)]], scenarios)) == 100


def test_a_scenario_replicate_that_is_no_whole_number_is_refused_before_the_run():
    """`Scenario.replicate` only labels a row, but `BatchResult.rows` writes it with int(): "x" or None
    raised a raw ValueError/TypeError there, after the whole batch ran, and 1.5 became 1."""
    for rep in ("x", None, 1.5, -1, True):
        with pytest.raises(UserError, match="scenario 0: replicate must be a whole number >= 0"):
            B.simulate_batch([[ROW]], [B.Scenario(0, "fcfs", 4, replicate=rep)])
    assert B.simulate_batch([[ROW]], [B.Scenario(0, "fcfs", 4, replicate=np.int64(2))]).rows()[0]["replicate"] == 2


def test_cuda_backend_without_gpu_is_a_clear_error(monkeypatch):
    from numba import cuda

    if cuda.is_available():
        pytest.skip("a GPU is present")
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    rows = [{"request_id": 1, "arrival_step": 0, "prompt_len": 1, "max_new_tokens": 1, "priority": 0,
             "cache_hit": False, "required_blocks": 1, "deadline_step": None, "preemptible": True}]
    with pytest.raises(UserError, match="needs an NVIDIA GPU"):
        B.simulate_batch(rows, [B.Scenario(0, "aging", 1)], backend="cuda")


def test_run_order_starts_the_probably_slowest_first():
    big = load_trace({"request_id": [1, 2], "arrival_step": [0, 0], "prompt_len": [1, 1], "max_new_tokens": [5, 5],
                      "priority": [0, 0], "cache_hit": [False, False], "required_blocks": [1, 1],
                      "deadline_step": [None, None], "preemptible": [True, True]})
    small = big.subset([0])
    sc = [B.Scenario(1, "fcfs", 1), B.Scenario(0, "fcfs", 1), B.Scenario(0, "aging", 1, 2),
          B.Scenario(0, "aging", 1, 8), B.Scenario(0, "fcfs", 1, 4, 2)]
    codes = [B.check_config(s.policy, s.free_kv_blocks, s.aging_interval, s.max_steps) for s in sc]
    cols = [np.array(c, np.int64) for c in zip(*codes)]
    order = B._run_order([big, small], np.array([s.trace for s in sc]), cols[0], cols[2], cols[3])
    assert order.tolist() == [3, 2, 1, 0, 4]


def test_metrics_csv_rows_and_columns(workload, tmp_path):
    loaded, scenarios = workload
    result = B.simulate_batch(loaded, scenarios)
    rows = result.rows()
    assert list(rows[0])[:len(B.ROW_KEYS)] == list(B.ROW_KEYS)
    path = tmp_path / "m.csv"
    B.write_metrics_csv(rows, path)
    with open(path, newline="") as fh:
        table = list(csv.DictReader(fh))
    assert list(table[0]) == B.row_columns(rows)
    # per-class columns of every class of both traces (classes -1..2), after the overall ones
    assert [c for c in table[0] if c.startswith("ttft_p99_class")] == [f"ttft_p99_class{p}" for p in (-1, 0, 1, 2)]
    assert len(table) == len(scenarios)
    for got, sc, row in zip(table, scenarios, rows):
        assert got["trace"] == loaded[sc.trace].name
        interval = str(sc.aging_interval) if sc.policy == "aging" else ""  # blank where it does not matter
        assert (got["policy"], int(got["kv_blocks"]), got["aging_interval"]) == (sc.policy, sc.free_kv_blocks,
                                                                                interval)
        assert int(got["finished"]) == row["finished"] == int((result.result(scenarios.index(sc)).requests["status"]
                                                                == "finished").sum())
        for key in ("ttft_p95", "slo_attainment"):
            want = row[key]
            assert (got[key] == "") if math.isnan(want) else math.isclose(float(got[key]), want, rel_tol=1e-5,
                                                                          abs_tol=1e-6)


@pytest.fixture()
def trace_csv(tmp_path):
    rng = np.random.default_rng(11)
    path = tmp_path / "t.csv"
    random_trace(rng, 40, "t").to_csv(path)
    return path


def test_cli_sweep_writes_one_row_per_scenario(trace_csv, tmp_path, capsys):
    out = tmp_path / "metrics.csv"
    code = main(["sweep", str(trace_csv), str(trace_csv), "--policy", "aging,fcfs", "--kv-blocks", "5,20",
                 "--aging-interval", "1,4", "--threads", "1", "--out", str(out)])
    assert code == 0
    with open(out, newline="") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 2 * 2 * (2 + 1)  # fcfs runs once, not once per aging interval
    assert {r["trace"] for r in table} == {"t#0", "t#1"}  # the same file twice: names made unique
    printed = capsys.readouterr().out
    assert "12 scenarios over 2 traces" in printed
    assert len([line for line in printed.splitlines() if line.startswith("t#")]) == 12


def exit_code(argv) -> int:
    """`main`'s exit status, also when argparse exits through SystemExit."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--policy", "aging,lifo", "--kv-blocks", "4"], "unknown policy"),
        (["--policy", "aging", "--kv-blocks", "4,x"], "--kv-blocks: expected a whole number, got 'x'"),
        (["--policy", "aging", "--kv-blocks", "-1"], "--kv-blocks: must be from 0 to 2**61, got -1"),
        (["--policy", "aging", "--kv-blocks", "4", "--aging-interval", "0"], "--aging-interval: must be from 1"),
        (["--policy", "aging", "--kv-blocks", "4", "--threads", "0"], "threads"),
        (["--policy", "aging", "--kv-blocks", "4", "--max-steps", "-2"], "--max-steps: must be >= 0, got -2"),
    ],
)
def test_cli_sweep_bad_input_exits_2_without_csv(trace_csv, tmp_path, capsys, extra, message):
    out = tmp_path / "metrics.csv"
    assert exit_code(["sweep", str(trace_csv), *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.glob(".metrics.csv*")) == []


def test_cli_sweep_missing_trace_or_directory_exits_2(trace_csv, tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "nope.csv"), "--policy", "aging", "--kv-blocks", "4",
                 "--out", str(tmp_path / "m.csv")]) == 2
    assert main(["sweep", str(trace_csv), "--policy", "aging", "--kv-blocks", "4",
                 "--out", str(tmp_path / "no" / "m.csv")]) == 2
    assert main(["sweep", str(trace_csv), "--policy", "aging", "--kv-blocks", "4", "--out", str(trace_csv)]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "no such directory" in err and "overwrite" in err
    assert not (tmp_path / "m.csv").exists()


def test_cli_sweep_cuda_without_gpu_exits_2(trace_csv, tmp_path, capsys, monkeypatch):
    from numba import cuda

    if cuda.is_available():
        pytest.skip("a GPU is present")
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    out = tmp_path / "m.csv"
    assert main(["sweep", str(trace_csv), "--policy", "aging", "--kv-blocks", "4", "--backend", "cuda",
                 "--out", str(out)]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err
    assert not out.exists()


def test_cli_warmup(capsys):
    assert main(["warmup"]) == 0
    out = capsys.readouterr().out
    assert "replay_batch_nb" in out and "replay_scan_nb" in out and "warmup done" in out


@settings(max_examples=60, deadline=None, derandomize=True)
@given(names=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=12),
       reps=st.lists(st.integers(0, 2), max_size=12))
def test_trace_labels_number_the_repeated_names_in_order(names, reps):
    import dataclasses

    base = load_trace({"request_id": [1], "arrival_step": [0], "prompt_len": [1], "max_new_tokens": [1],
                       "priority": [0], "cache_hit": [False], "required_blocks": [1], "deadline_step": [None],
                       "preemptible": [True]})
    traces = [dataclasses.replace(base, name=n) for n in names]
    scenarios = [B.Scenario(i, "fcfs", 1, 4, replicate=r) for i, r in enumerate(reps[:len(names)])]
    keys = [(n, reps[i] if i < len(reps) else 0) for i, n in enumerate(names)]
    expected = []
    for i, key in enumerate(keys):  # the definition: "#k" for the k-th of its (name, replicate), when it repeats
        same = [j for j, k in enumerate(keys) if k == key]
        expected.append(f"{key[0]}#{same.index(i)}" if len(same) > 1 else key[0])
    assert B.trace_labels(traces, scenarios) == expected
    # (in linear time: `sweep --replicates 100000` labels 100,000 traces)
    assert B.trace_labels([base] * 100_000, [])[-1] == "trace#99999"
