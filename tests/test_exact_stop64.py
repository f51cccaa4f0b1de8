"""Every engine equals the model on degenerate traces and at step limits cut on every step (stop 64).

The traces (`stop64_trace`) are built, not drawn: every request arriving on one step (0, 2**40 or 2**53 - 200); one
request; required blocks exactly the capacity and one over it; one output token everywhere; bursts 2**40 steps
apart; ids sparse and in no order (descending, +-2**63 edges); deadlines all equal, all missed on arrival
(``arrival + 1``), or exactly at the finish step of a first replay and one before it (`_at_finish`); every request
preemptible or none.  Each replay is cut at every step limit from 0 to its length + 1, so that a limit lands on
every arrival, finish, preemption, aging tick and deadline of the full replay (`_marks` counts that it did).
Engines: `simulate` fast and scan (and their metrics, cut or not, and ``deadline_met`` against the log), every
aging layout against the scan kernel, the batch kernel at 1 and 2 Numba threads in a subprocess with traces of 1
to 120 rows, built-in and user policies and intervals of 1 to 2**63 - 1 in one call, and the CUDA path under the
simulator.  No engine differed from the model here, nor in a campaign outside pytest on the same builders
(2026-12-07, 15 CPU minutes: 23,275 replays at random cuts, capacities 0 to 2**61 and intervals to 2**63 - 1,
fast and scan, the user policy of `mixed_batch` among them; 2,216 CUDA-simulator batches of 9 scenarios against
the CPU batch); these tests stay as guards.
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import POLICIES, assert_matches_model
from test_exact_stop56 import _run_aging
from test_fast_kernel import AGING_KERNELS

from decodesched import Policy, load_trace, simulate
from decodesched import batch as B
from decodesched.kernels.scan_nb import replay_scan_nb
from decodesched.model import replay
from decodesched.policy import builtin

HUGE = 2**40
P53 = 2**53
SHAPES = ("burst", "one", "fit", "ones", "gaps", "ids", "big")
DEADLINES = ("none", "equal", "missed", "at_finish", "before_finish")
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def stop64_trace(shape: str, deadlines: str, preemptible: float, seed: int) -> tuple[list[dict], int]:
    """(rows, capacity): a trace of `shape` (module docstring) with `deadlines` and a share `preemptible` (0, 1 or
    between) of preemptible requests, and the capacity it was built around."""
    rng = np.random.default_rng(seed)
    n = {"one": 1, "big": 40}.get(shape, int(rng.integers(2, 11)))
    cap = int(rng.integers(1, 6))
    arrival = np.sort(rng.integers(0, 2 * n, n))
    new = rng.integers(1, 5, n)
    blocks = rng.integers(1, cap + 1, n)
    ids = np.arange(n, dtype=np.int64)
    if shape == "burst":
        arrival = np.full(n, [0, HUGE, P53 - 200][seed % 3])
    elif shape == "fit":
        blocks = rng.choice([cap, cap + 1, 1], n)
    elif shape == "ones":
        new = np.ones(n, np.int64)
    elif shape == "gaps":
        arrival = np.sort(rng.integers(0, 3, n)) * HUGE + rng.integers(0, 2, n)
    elif shape == "ids":
        ids = np.sort(rng.choice(np.array([-(2**63), 2**63 - 1, -7, 0, 3] + [int(x) for x in rng.integers(
            -(2**62), 2**62, n)], np.int64), n, replace=False))[::-1].copy()
    rows = [{"request_id": int(ids[i]), "arrival_step": int(arrival[i]), "prompt_len": int(rng.integers(1, 4)),
             "max_new_tokens": int(new[i]), "priority": int(rng.integers(-1, 3)), "cache_hit": bool(rng.random() < .4),
             "required_blocks": int(blocks[i]), "deadline_step": None,
             "preemptible": bool(rng.random() < preemptible)} for i in range(n)]
    if deadlines == "equal":
        last = max(r["arrival_step"] for r in rows)
        for r in rows:
            r["deadline_step"] = last + 1 + int(arrival.size)
    elif deadlines == "missed":
        for r in rows:
            r["deadline_step"] = r["arrival_step"] + 1
    elif deadlines in ("at_finish", "before_finish"):
        _at_finish(rows, cap, deadlines == "before_finish")
    return rows, cap


def _at_finish(rows, capacity, before: bool) -> None:
    """Each request's deadline at its finish step + 1 in a fixed_priority replay (met exactly), or `before` at
    the finish step itself (missed by one); a request that does not finish, or would need a deadline not after
    its arrival, keeps none."""
    finish = {}
    for e in replay(rows, "fixed_priority", capacity).events:
        if e["action"] == "finish":
            finish[e["request_id"]] = e["step"]
    for r in rows:
        step = finish.get(r["request_id"])
        if step is not None and step + 1 - before > r["arrival_step"]:
            r["deadline_step"] = step + 1 - before


def _marks(rows, events, interval) -> set:
    """What the steps of `events` (a full model replay) land on: a limit of i cuts the replay just before event
    i, which an arrival, finish, preemption, aging tick or deadline can sit at."""
    arrivals = {r["arrival_step"] for r in rows}
    deadlines = {r["deadline_step"] for r in rows if r["deadline_step"] is not None}
    out = set()
    for i, e in enumerate(events):
        out |= {"arrival"} if e["step"] in arrivals else set()
        out |= {"deadline"} if e["step"] + 1 in deadlines else set()
        out |= {"finish"} if e["action"] == "finish" else set()
        out |= {"preemption"} if e["preempted_request_id"] is not None else set()
        out |= {"aging tick"} if e["wait_steps"] and e["wait_steps"] % interval == 0 else set()
    return out


def _metrics(result) -> str:
    """A result's metrics as text (NaN equal to NaN)."""
    return json.dumps(result.metrics, sort_keys=True, default=repr)


def _deadline_met_as_logged(result) -> None:
    """A request's ``deadline_met`` is True exactly where its finish event is logged without ``deadline_missed``
    (SPEC sections 2 and 6 say it twice: ``finish_step + 1 <= deadline_step``)."""
    ev, req = result.events, result.requests
    logged = dict.fromkeys(req["request_id"].tolist(), False)
    for rid, action, missed in zip(ev["request_id"].tolist(), ev["action"].tolist(), ev["deadline_missed"].tolist()):
        if action == "finish":
            logged[rid] = not missed
    for rid, has, met in zip(req["request_id"].tolist(), req["has_deadline"].tolist(), req["deadline_met"].tolist()):
        assert met == (has and logged[rid]), rid


def _every_cut(rows, policy, capacity, interval) -> set:
    """Compare fast and scan with the model at every step limit; return what the cuts landed on."""
    trace = load_trace(rows)
    full = replay(rows, policy, capacity, interval)
    for limit in [None, *range(len(full.events) + 2)]:
        fast = simulate(trace, policy, capacity, interval, limit)
        assert_matches_model(fast, rows, policy, capacity, interval, limit)
        scan = simulate(trace, policy, capacity, interval, limit, engine="scan")
        assert _metrics(scan) == _metrics(fast)
        for name in ("event_log", "request_state", "summary"):
            np.testing.assert_array_equal(getattr(scan, name), getattr(fast, name), err_msg=name)
        lean = simulate(trace, policy, capacity, interval, limit, record_events=False)
        np.testing.assert_array_equal(lean.request_state, fast.request_state)
        assert _metrics(lean) == _metrics(fast)
        _deadline_met_as_logged(fast)
    return _marks(rows, full.events, interval)


@pytest.mark.parametrize("shape", SHAPES[:-1])
def test_every_cut_of_every_degenerate_shape_equals_the_model(shape):
    seen = set()
    for d, deadlines in enumerate(DEADLINES):
        for p, preemptible in enumerate((0.0, 1.0)):
            seed = 64_000 + 10 * d + p
            rows, cap = stop64_trace(shape, deadlines, preemptible, seed)
            policy = POLICIES[(2 * d + p + len(shape)) % len(POLICIES)]
            seen |= _every_cut(rows, policy, cap + (shape == "fit" and d % 2), 1 + seed % 3)
    wanted = {"arrival", "finish", "deadline"} | ({"preemption", "aging tick"} if shape != "one" else set())
    assert wanted <= seen, wanted - seen


@pytest.mark.parametrize("shape", SHAPES)
def test_a_deadline_at_the_finish_step_is_met_and_one_before_it_missed(shape):
    """Deadlines set from a fixed_priority replay's finish steps (`_at_finish`), replayed again under it: met exactly
    (finish step + 1) on every request, missed by one (the finish step) on every request, in the log and the table."""
    for before in (False, True):
        rows, cap = stop64_trace(shape, "before_finish" if before else "at_finish", 1.0, 7)
        result = simulate(rows, "fixed_priority", cap)
        assert_matches_model(result, rows, "fixed_priority", cap, 4, None)
        has = result.requests["has_deadline"]
        assert has.any() and result.requests["deadline_met"][has].tolist() == [not before] * int(has.sum())
        finished = result.events["action"] == "finish"
        assert result.events["deadline_missed"][finished].tolist() == [before] * int(finished.sum())


@settings(max_examples=40, **SETTINGS)
@given(shape=st.sampled_from(SHAPES), deadlines=st.sampled_from(DEADLINES), preemptible=st.sampled_from([0., 1., .6]),
       seed=st.integers(0, 2**32), capacity=st.sampled_from(["cap", "over", 0, 2**61]),
       interval=st.sampled_from([1, 2, 3, 2**63 - 1]), limit=st.one_of(st.none(), st.integers(0, 60)))
def test_every_aging_layout_equals_scan_on_degenerate_shapes(shape, deadlines, preemptible, seed, capacity, interval,
                                                          limit):
    rows, cap = stop64_trace(shape, deadlines, preemptible, seed)
    capacity = {"cap": cap, "over": cap + 1}.get(capacity, capacity)
    trace = load_trace(rows)
    limit = -1 if limit is None else limit
    want = _run_aging(replay_scan_nb, trace, capacity, interval, limit)
    for name, kernel in AGING_KERNELS.items():
        got = _run_aging(kernel, trace, capacity, interval, limit)
        if got is not None:
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w, err_msg=name)


def test_one_output_token_and_zero_are_told_apart():
    """One token everywhere replays; zero is refused naming the row and column, in the trace and in the model."""
    rows, cap = stop64_trace("ones", "none", 1.0, 1)
    assert_matches_model(simulate(rows, "fcfs", cap), rows, "fcfs", cap, 4, None)
    rows[1]["max_new_tokens"] = 0
    with pytest.raises(ValueError, match="max_new_tokens"):
        load_trace(rows)
    with pytest.raises(ValueError, match="max_new_tokens"):
        replay(rows, "fcfs", cap)


@numba.njit
def _lifo_key(r, clock):
    return (r.phase, -r.arrival_step, r.prompt_len)


@numba.njit
def _aged(r, clock):
    return r.priority + r.wait_steps // 2


LIFO = Policy("lifo64", key=_lifo_key, effective_priority=_aged)


def mixed_batch() -> tuple[list, list]:
    """Traces of 1, 10, 11 and 120 rows of the shapes above, and scenarios over them mixing policies (built-in names,
    built-in objects, a user policy), capacities from 0 to 2**61, intervals from 1 to 2**63 - 1, limits that cut
    or not."""
    rows = [stop64_trace("one", "missed", 1.0, 1)[0], stop64_trace("gaps", "equal", 1.0, 2)[0],
            stop64_trace("ids", "at_finish", 0.0, 3)[0]]
    big, _ = stop64_trace("big", "none", 0.7, 4)
    rows.append([{**r, "request_id": 1000 * k + r["request_id"], "arrival_step": r["arrival_step"] + 3 * k}
                 for k in range(3) for r in big])
    traces = [load_trace(r) for r in rows]
    policies = ("aging", "deadline", builtin("aging", 2), LIFO, "fcfs", builtin("fixed_priority"))
    scenarios = []
    for t in range(len(rows)):
        for k, (capacity, interval, limit) in enumerate([(0, 1, None), (2, 2**63 - 1, 7), (3, 1, None),
                                                         (2**61, 5, None), (4, 3, 40)]):
            policy = policies[(t + k) % len(policies)]
            carried = getattr(policy, "aging_interval", None) is not None
            scenarios.append(B.Scenario(t, policy, capacity, None if carried else interval, limit))
    return rows, traces, scenarios


def cuda_scenarios(scenarios) -> list:
    """The scenarios the CUDA simulator replays in a test's time: built-in policies (the CUDA path runs no other)
    on the traces of 1 to 12 rows (the simulator interprets every thread in Python)."""
    return [s for s in scenarios if isinstance(s.policy, str) and s.trace < 3]


BATCH = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from test_exact_stop64 import alone, cuda_scenarios, mixed_batch, outcome
    from decodesched import batch as B

    rows, traces, scenarios = mixed_batch()
    backend = sys.argv[2]
    if backend == "cuda":
        scenarios = cuda_scenarios(scenarios)
    out = {}
    for threads in (1, 2) if backend == "cpu" else (None,):
        for record in (True, False):
            r = B.simulate_batch(traces, scenarios, record_events=record, backend=backend, threads=threads)
            out[f"{threads} {record}"] = [outcome(r.result(i)) for i in range(len(scenarios))]
    if backend == "cpu":  # (here, where the user policy is compiled already: a compile takes 10-40 s)
        out["alone"] = alone(rows, traces, scenarios)
    print(json.dumps(out))
""")


def outcome(result) -> list:
    """A result's raw arrays and metrics as JSON values."""
    arrays = (result.request_state, result.summary) + (() if result.event_log is None else (result.event_log,))
    return [a.tolist() for a in arrays] + [_metrics(result)]


def alone(rows, traces, scenarios) -> dict:
    """Each scenario replayed by `simulate` (checked against the model), as `BATCH` prints a batch's."""
    out = {}
    for record in (True, False):
        out[str(record)] = []
        for sc in scenarios:
            result = simulate(traces[sc.trace], sc.policy, sc.free_kv_blocks, sc.aging_interval, sc.max_steps,
                              record_events=record)
            if record:
                assert_matches_model(result, rows[sc.trace], sc.policy, sc.free_kv_blocks, sc.aging_interval,
                                     sc.max_steps)
            out[str(record)].append(outcome(result))
    return out


def _batch(backend: str, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", BATCH, os.path.dirname(__file__), backend],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_batch_of_mixed_sizes_and_policies_equals_the_model_at_one_and_two_threads():
    got = _batch("cpu", {"NUMBA_NUM_THREADS": "2"})
    want = got.pop("alone")
    assert len(want["True"]) == len(mixed_batch()[2]) == 20
    assert got == {f"{threads} {record}": want[str(record)] for threads in (1, 2) for record in (True, False)}


def test_the_cuda_simulator_equals_the_model_on_the_mixed_batch():
    rows, traces, scenarios = mixed_batch()
    scenarios = cuda_scenarios(scenarios)
    assert len(scenarios) >= 6
    want = alone(rows, traces, scenarios)
    assert _batch("cuda", {"NUMBA_ENABLE_CUDASIM": "1"}) == {f"None {record}": want[str(record)]
                                                              for record in (True, False)}
