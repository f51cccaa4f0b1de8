"""User policies and the event log on the wide shapes of stop 56 (stop 57's exactness red team).

User policies (`decodesched.Policy`): keys mixing priority, -priority, aging by the wait, deadline slack, tokens,
arrival, request ids, the phase and constants at +-2**62 and -2**63; effective priorities up to +-2**62; and
user policies equal in meaning to `deadline` and `fcfs` (they must give the built-in's events exactly).  Every
engine that takes a user policy (`simulate` with and without the event log, `simulate_batch` with 1 and 2 threads,
mixed with built-ins and `policy.builtin` objects) against the model calling the same functions; the CUDA path runs
built-ins only (a `builtin(...)` object there equals its name, a user policy is refused in one line).  The event
log and the request table written as CSV and Parquet and read back equal the in-memory columns, with the writers'
chunks cut at 1, 2, 3 rows and at the table's length and one less (empty, one-row and chunk-crossing logs).

2026-12-06, a campaign of these outside pytest (about 26 CPU minutes): 12 random user policies drawn from the
documented fields (1-6 key fields of the ones above, 15 effective priorities, aging intervals 1 to 2**62) and the
four built-ins written as user policies, on `test_diff_hunt.edge_trace` and `test_exact_stop56.stop56_trace` traces
with their edge configurations and step limits on finishes and preemptions: 90,486 user-policy replays against the
model (each again without the event log; stopped max_steps 40,011, stuck 28,621, drained 21,854), 90,486 replays
of the built-ins as user policies against the model's built-in and the fast kernel (and `builtin(name)` against the
name), 6,832 batches (40,992 scenarios) at 1 and 2 threads against `simulate`, 6,202 batches with and without the
event log; 12,404 model replays of `builtin(name)` against the name, 3,037 of `builtin("aging", k)`; 1,368 results
written as both tables in CSV and Parquet with chunks of 1-3 rows and at the table's length (358 empty logs, 19 of
one row, 697 crossing a chunk boundary): no difference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from oracle import assert_matches_model, traces, wide_configs
from test_diff_hunt import edge_configs, edge_trace, same_arrays
from test_exact_stop56 import _limits, stop56_trace

from decodesched import Policy, load_trace, simulate
from decodesched import batch as B
from decodesched import tables_io as T
from decodesched.kernels import enums as E
from decodesched.model import replay
from decodesched.policy import builtin

NONE = 1_000_000_000  # the slack of a request without a deadline (docs/semantics.md)
K57 = 3  # the aging interval `_mix_key` and `_mix_priority` use


@numba.njit
def _mix_key(r, clock):
    slack = r.deadline_step - clock if r.has_deadline else np.int64(2**62)
    return (r.phase * np.int64(2**62), -(r.priority + r.wait_steps // K57), slack, r.max_new_tokens - r.generated_len,
            -r.arrival_step, r.request_id // 2, np.int64(-(2**63)))


@numba.njit
def _mix_priority(r, clock):
    return r.priority * 512 + r.wait_steps // K57 - r.preemptions  # +-2**62 at the trace's priority bounds


@numba.njit
def _deadline_key(r, clock):
    slack = np.int64(NONE)
    if r.has_deadline:
        slack = r.deadline_step - clock - (r.max_new_tokens - r.generated_len + 1 - r.phase)
    return (slack, r.phase, 1 - r.cache_hit, -r.priority, r.prompt_len + r.generated_len)


@numba.njit
def _business(r, clock):
    return r.priority


@numba.njit
def _fcfs_key(r, clock):
    return (r.phase, r.arrival_step)


MIX = Policy("mix57", key=_mix_key, effective_priority=_mix_priority)
AS_BUILTIN = {"deadline": Policy("user_deadline", key=_deadline_key, effective_priority=_business),
              "fcfs": Policy("user_fcfs", key=_fcfs_key, effective_priority=_business)}


def stop57_trace(rng) -> list[dict]:
    return edge_trace(rng) if rng.random() < 0.6 else stop56_trace(rng)


def stop57_configs(rng, rows, k: int) -> list[tuple]:
    """`edge_configs`, with about a third of the unlimited replays cut at a finish or a preemption of the full
    fcfs replay (or one step after it), and the unlimited replays of 2**40-token requests cut at 300 steps."""
    out = []
    work = sum(1 + r["max_new_tokens"] for r in rows)
    for policy, capacity, interval, limit in edge_configs(rng, rows, k):
        if limit is None and work > 5_000:
            limit = 300
        elif limit is None and rng.random() < 0.35:
            marks = _limits(replay(rows, "fcfs", capacity).events, rng)
            limit = marks[int(rng.integers(0, len(marks)))]
        out.append((policy, capacity, interval, limit))
    return out


def test_user_policies_equal_the_model_and_as_builtins_the_builtin():
    rng = np.random.default_rng(57_001)
    stops, preemptions = set(), 0
    for _ in range(120):
        rows = stop57_trace(rng)
        trace = load_trace(rows)
        for name, capacity, interval, limit in stop57_configs(rng, rows, 2):
            result = simulate(trace, MIX, capacity, interval, limit)
            assert_matches_model(result, rows, MIX, capacity, interval, limit)
            lean = simulate(trace, MIX, capacity, interval, limit, record_events=False)
            assert np.array_equal(lean.request_state, result.request_state)
            assert np.array_equal(lean.summary, result.summary)
            stops.add(result.stop_reason)
            preemptions += int(result.request_state[:, E.RQ_PREEMPTIONS].sum())
            name = ("deadline", "fcfs")[int(rng.integers(0, 2))]
            mine = simulate(trace, AS_BUILTIN[name], capacity, interval, limit)
            assert_matches_model(mine, rows, name, capacity, interval, limit)
            same_arrays(mine, simulate(trace, name, capacity, interval, limit), name)
    assert stops == {"drained", "stuck", "max_steps"} and preemptions > 20


@settings(max_examples=150)
@given(rows=traces(max_requests=20, max_blocks=8, wide_priorities=True), config=wide_configs)
def test_user_policies_equal_the_model_on_drawn_traces(rows, config):
    """Hypothesis' traces (priorities distinct, shortest-job-first, +-2**53 or negative; deadlines on every
    request in half of them), shrunk to a minimal one on a difference."""
    name, capacity, interval, limit = config
    trace = load_trace(rows)
    assert_matches_model(simulate(trace, MIX, capacity, interval, limit), rows, MIX, capacity, interval, limit)
    if name in AS_BUILTIN:
        mine = simulate(trace, AS_BUILTIN[name], capacity, interval, limit)
        assert_matches_model(mine, rows, name, capacity, interval, limit)


def test_batches_of_user_and_builtin_policies_equal_simulate_with_one_and_two_threads():
    rng = np.random.default_rng(57_002)
    choices = (MIX, AS_BUILTIN["deadline"], AS_BUILTIN["fcfs"], "aging", builtin("fixed_priority"), builtin("aging"),
               builtin("aging", 5))
    for i in range(12):
        rows = [stop57_trace(rng) for _ in range(2)]
        traces = [load_trace(r) for r in rows]
        scenarios = []
        for t in (0, 1):
            for _, capacity, interval, limit in stop57_configs(rng, rows[t], 3):
                policy = choices[int(rng.integers(0, len(choices)))]
                carried = getattr(policy, "aging_interval", None) is not None  # (another interval is refused)
                scenarios.append(B.Scenario(t, policy, capacity, None if carried else interval, limit))
        one = B.simulate_batch(traces, scenarios, record_events=True, threads=1)
        two = B.simulate_batch(traces, scenarios, record_events=True, threads=2)
        same_arrays(one, two, i)
        for s, sc in enumerate(scenarios):
            alone = simulate(traces[sc.trace], sc.policy, sc.free_kv_blocks, sc.aging_interval, sc.max_steps)
            same_arrays(two.result(s), alone, (i, s))


def _expected(result, table: str) -> dict:
    """The in-memory columns of `result`'s events or requests table as `tables_io.read_table` returns a file's."""
    src, schema = (result.events, T.EVENT_SCHEMA) if table == "events" else (result.requests, T.REQUEST_SCHEMA)
    out = {}
    for name, kind in schema:
        v = np.asarray(src[name])
        if name == "preempted_request_id":
            v = np.ma.MaskedArray(v.astype(np.int64), mask=~np.asarray(src["has_victim"]))
        elif name in ("deadline_step", "deadline_met"):
            missing = ~np.asarray(src["has_deadline"])
            v = np.ma.MaskedArray(np.where(missing, 0, v).astype(np.int64 if name == "deadline_step" else bool),
                                  mask=missing)
        elif name in ("first_step", "first_token_step", "finish_step"):
            v = np.ma.MaskedArray(np.where(v < 0, 0, v).astype(np.int64), mask=v < 0)
        elif kind == "str":
            v = v.astype(str)
        out[name] = v
    return out


def test_tables_written_and_read_back_equal_the_arrays_across_chunk_edges(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    rng = np.random.default_rng(57_003)
    shapes = {"empty": 0, "one": 0, "crossing": 0, "int64 edge ids": 0}
    for i in range(60):
        rows = stop57_trace(rng)
        trace = load_trace(rows)
        name, capacity, interval, limit = stop57_configs(rng, rows, 1)[0]
        limit = 1 if i % 10 == 5 else limit
        result = simulate(trace, MIX if i % 4 == 0 else name, capacity, interval, limit)
        n = result.n_events
        chunk = int(rng.choice([1, 2, 3, max(n, 1), max(n - 1, 1), max(len(trace) - 1, 1)]))
        monkeypatch.setattr(T, "CHUNK_ROWS", chunk)
        monkeypatch.setattr(T, "PARQUET_CHUNK_ROWS", chunk)
        for table, write in (("events", result.write_events), ("requests", result.write_requests)):
            want = _expected(result, table)
            for ext in ("csv", "parquet"):
                path = tmp_path / f"{table}.{ext}"
                write(path)
                got = T.read_table(path)
                bad = [c for c in want if not T.tables_equal({c: got[c]}, {c: want[c]})]
                assert list(got) == list(want) and not bad, (table, ext, chunk, bad, i)
        shapes["empty"] += n == 0
        shapes["one"] += n == 1
        shapes["crossing"] += n > chunk
        shapes["int64 edge ids"] += any(abs(r["request_id"]) >= 2**62 for r in rows)
    assert min(shapes.values()) > 0, shapes


def test_a_one_row_log_at_the_int64_edges_reads_back_exactly(tmp_path):
    """Request ids -2**63 and 2**63 - 1, arrivals and deadlines at 2**53, 2**61 free blocks: each cell at its
    column's edge, in a log of one row and of none."""
    pytest.importorskip("pyarrow")
    rows = [{"request_id": -(2**63), "arrival_step": 2**53, "prompt_len": 2**40, "max_new_tokens": 2**40,
             "priority": -(2**53), "cache_hit": True, "required_blocks": 2**40, "deadline_step": None,
             "preemptible": False},
            {"request_id": 2**63 - 1, "arrival_step": 2**53 - 1, "prompt_len": 1, "max_new_tokens": 1,
             "priority": 2**53, "cache_hit": False, "required_blocks": 1, "deadline_step": 2**53,
             "preemptible": True}]
    for policy, limit in ((MIX, 1), ("deadline", 1), ("fcfs", 0), (MIX, 3)):
        result = simulate(rows, policy, 2**61, None, limit)
        assert result.n_events == min(limit, 3)
        for table, write in (("events", result.write_events), ("requests", result.write_requests)):
            want = _expected(result, table)
            for ext in ("csv", "pq"):
                write(tmp_path / f"{table}.{ext}")
                assert T.tables_equal(T.read_table(tmp_path / f"{table}.{ext}"), want), (policy, table, ext)


CUDASIM = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_exact_stop57 import MIX, stop57_configs, stop57_trace
    from decodesched import batch as B, load_trace
    from decodesched.errors import UserError
    from decodesched.policy import builtin

    rng = np.random.default_rng(57_004)
    names = ("fixed_priority", "aging", "deadline", "fcfs")
    cases = 0
    for i in range(4):
        rows = [stop57_trace(rng) for _ in range(2)]
        traces = [load_trace(r) for r in rows]
        configs = [(t, cfg) for t in (0, 1) for cfg in stop57_configs(rng, rows[t], 3)]
        by_name = [B.Scenario(t, *cfg) for t, cfg in configs]
        as_objects = [B.Scenario(t, builtin(cfg[0]), *cfg[1:]) for t, cfg in configs]
        cpu = B.simulate_batch(traces, by_name, record_events=True)
        gpu = B.simulate_batch(traces, as_objects, record_events=True, backend="cuda")
        for name in ("request_state", "summary", "event_log"):
            assert np.array_equal(getattr(cpu, name), getattr(gpu, name)), (name, i)
        cases += 1
    try:
        B.simulate_batch(traces, [B.Scenario(0, MIX, 4, 4)], backend="cuda")
    except UserError as exc:
        refused = str(exc)
    print(json.dumps({"cases": cases, "refused": refused}))
""")


def test_cuda_simulator_runs_builtin_objects_as_their_names_and_refuses_a_user_policy():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", CUDASIM, os.path.dirname(__file__)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cases"] == 4 and "policy 'mix57' needs backend 'cpu'" in out["refused"]

