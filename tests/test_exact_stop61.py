"""Every engine equals the model at the edges of a replay's settings (stop 61's exactness hunt, room K).

The traces (`k_traces`, Hypothesis, derandomized, so a difference shrinks to a minimal trace): arrivals all at 0,
all at one step (3, 2**40 or 2**53 - 40), 2**40 steps apart, bursts 2**40 apart or close together; priorities
in small classes, at +-2**53 only, all at +2**53, the edges and their neighbours, or at -2**52, 0, 2**52;
deadlines none, at ``arrival + 1`` (every request that waits misses), within its work, with a slack that crosses
the "no deadline" constant 1_000_000_000 while it waits or across a 2**40 gap, or mixed; ids at the int64
edges.  The configurations (`k_configs`): every policy and a user `Policy` (earliest deadline first with an
aged priority, `EDF`); capacities 0, 1, exactly one request's need (the least, the largest and one less),
all the blocks, unlimited (2**61), so that prompts beyond the capacity (unservable) are mixed in; aging
intervals 1, 2, n, n + 1 and 2**63 - 1.

The step limits: every one from 0 to one past the full replay's length, so that a cut lands exactly on each
admission, preemption, finish and deadline miss and one step after it (`fast` and `scan`, with and without
the event log).  Batches mix policies, capacities and traces of different loads in one call, each scenario
equal to the model's replay of it alone, the same under ``NUMBA_NUM_THREADS=1`` and ``2`` (subprocesses) and
from the CUDA path under Numba's simulator.  Values just past the documented limits are refused, naming them.

2026-12-07, a campaign of these shapes outside pytest (about 30 CPU minutes), each against the model: 3,972
traces of 1-16 rows at every step limit (126,714 fast and scan replays); 368 traces of 20-400 rows at drawn
limits (5,152 replays, most under deadline); 23,208 scenarios in batches of 8 with the user policy at 1 and 2
threads; 28,139 user-policy replays with and without the event log, alone and in a batch; 65,716 request tables
(`assert_request_table`); 24,792 CUDA-simulator scenarios; and 6,371 fast against scan replays of 50-3,000 rows
with deadlines crossing the constant: no difference, and these tests stay as guards.  The one difference found:
a user policy whose Python version returns a value past int64 (``r.priority * 1024`` at priority 2**53), which
the compiled replay wraps around, so model and replay disagreed without a word; the model now refuses it.
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

from decodesched import Policy, load_trace, simulate
from decodesched import batch as B
from decodesched.errors import UserError
from decodesched.model import replay
from decodesched.trace import TraceError

P53 = 2**53  # the largest |priority|, arrival_step and deadline_step
HUGE = 2**40
UNLIMITED = 2**61
NO_DEADLINE = 1_000_000_000
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@numba.njit
def _edf_key(r, clock):
    slack = r.deadline_step - clock if r.has_deadline == 1 else 2**62
    return (slack, r.phase, -r.priority)


@numba.njit
def _aged3(r, clock):
    return r.priority + r.wait_steps // 3


EDF = Policy("edf61", key=_edf_key, effective_priority=_aged3)
ALL_POLICIES = (*POLICIES, EDF)


def _arrivals(draw, n: int) -> list[int]:
    shape = draw(st.sampled_from(["zero", "equal", "gaps", "bursts", "dense"]))
    if shape == "zero":
        return [0] * n
    if shape == "equal":
        return [draw(st.sampled_from([3, HUGE, P53 - 40]))] * n
    if shape == "gaps":
        return [i * HUGE for i in range(n)]
    if shape == "bursts":
        return sorted(draw(st.integers(0, 2)) * HUGE + draw(st.integers(0, 3)) for _ in range(n))
    return [draw(st.integers(0, 2 * n + 1)) for _ in range(n)]


def _priorities(draw, n: int) -> list[int]:
    shape = draw(st.sampled_from(["classes", "edges", "top", "near", "halves"]))
    values = {"classes": st.integers(-2, 2), "edges": st.sampled_from([-P53, P53]), "top": st.just(P53),
              "near": st.sampled_from([-P53, -P53 + 1, 0, P53 - 1, P53]),
              "halves": st.sampled_from([-P53 // 2, 0, P53 // 2])}[shape]
    return [draw(values) for _ in range(n)]


def _deadline(draw, shape: str, arrival: int, work: int, n: int) -> int | None:
    if shape == "mixed":
        shape = draw(st.sampled_from(["none", "near", "near"]))
    if shape == "none":
        return None
    if shape == "overdue":
        deadline = arrival + 1
    elif shape == "near":
        deadline = arrival + draw(st.integers(1, 2 * work + 4))
    elif shape == "crossing":  # slack crosses the "no deadline" constant while the request waits
        deadline = arrival + NO_DEADLINE + draw(st.integers(-3, 2 * n + 6))
    else:  # "gap": ... or across a 2**40-step idle gap
        deadline = arrival + NO_DEADLINE + draw(st.sampled_from([-HUGE, 0, HUGE])) + draw(st.integers(-3, 3))
    return deadline if arrival < deadline <= P53 else None


@st.composite
def k_traces(draw, max_requests: int = 10) -> list[dict]:
    """A trace of 1-`max_requests` rows, each axis in a drawn shape (see the module docstring)."""
    n = draw(st.integers(1, max_requests))
    arrivals, priorities = _arrivals(draw, n), _priorities(draw, n)
    blocks = draw(st.sampled_from([st.just(1), st.integers(1, 4), st.sampled_from([1, 2, 9])]))
    deadlines = draw(st.sampled_from(["none", "overdue", "near", "crossing", "gap", "mixed"]))
    ids = draw(st.lists(st.sampled_from([-(2**63), 2**63 - 1, -1, 0, 1, *range(50, 50 + n)]), min_size=n,
                        max_size=n, unique=True))
    rows = []
    for i in range(n):
        new = draw(st.integers(1, 5))
        rows.append({"request_id": ids[i], "arrival_step": arrivals[i], "prompt_len": draw(st.integers(1, 3)),
                     "max_new_tokens": new, "priority": priorities[i], "cache_hit": draw(st.booleans()),
                     "required_blocks": draw(blocks),
                     "deadline_step": _deadline(draw, deadlines, arrivals[i], 1 + new, n),
                     "preemptible": draw(st.sampled_from([True, True, True, False]))})
    return rows


@st.composite
def k_configs(draw, rows: list[dict], policies=ALL_POLICIES) -> tuple:
    """(policy, capacity, aging interval) at the edges for `rows` (see the module docstring)."""
    need = [r["required_blocks"] for r in rows]
    capacity = draw(st.sampled_from(sorted({0, 1, min(need), max(need), max(need) - 1, sum(need), UNLIMITED})))
    interval = draw(st.sampled_from(sorted({1, 2, len(rows), len(rows) + 1, 2**63 - 1})))
    return draw(st.sampled_from(policies)), capacity, interval


def _marks(events) -> dict:
    """Which kinds of event the full replay has (where a step limit can land)."""
    return {"admission": any(e["action"] == "prefill_to_decode" for e in events),
            "preemption": any(e["preempted_request_id"] is not None for e in events),
            "finish": any(e["action"] == "finish" for e in events),
            "miss": any(e["deadline_missed"] for e in events)}


def assert_request_table(result, rows, ref) -> None:
    """`result`'s per-request steps and status are those of the model's replay `ref` (its events and states):
    the first prefill, first decode and finish step (-1 where none), the derived queue wait and whether the
    deadline was met; unservable exactly for the unfinished requests of a replay that got stuck, waiting for
    those that never arrived."""
    index = {r["request_id"]: i for i, r in enumerate(rows)}
    steps = {c: [-1] * len(rows) for c in ("first_step", "first_token_step", "finish_step")}
    for e in ref.events:
        i = index[e["request_id"]]
        column = "first_step" if e["action"] == "prefill_to_decode" else "first_token_step"
        steps[column][i] = steps[column][i] if steps[column][i] >= 0 else e["step"]
        steps["finish_step"][i] = e["step"] if e["action"] == "finish" else steps["finish_step"][i]
    req = result.requests
    for column, want in steps.items():
        assert req[column].tolist() == want, column
    for i, row in enumerate(rows):
        first, finish, deadline = steps["first_step"][i], steps["finish_step"][i], row["deadline_step"]
        assert np.isnan(req["queue_wait"][i]) if first < 0 else req["queue_wait"][i] == first - row["arrival_step"]
        assert req["deadline_met"][i] == (deadline is not None and 0 <= finish < deadline), i
        state = ref.states.get(i)
        status = "waiting" if state is None else state.status
        stuck = ref.stop == "stuck" and status != "finished"
        assert req["status"][i] == ("unservable" if stuck else status), i


@settings(max_examples=70, **SETTINGS)
@given(data=st.data(), rows=k_traces())
def test_every_step_limit_equals_the_model_on_both_engines(data, rows):
    policy, capacity, interval = data.draw(k_configs(rows, POLICIES))
    trace = load_trace(rows)
    full = replay(rows, policy, capacity, interval)
    for limit in [None, *range(len(full.events) + 2)]:
        for engine in ("fast", "scan"):
            result = simulate(trace, policy, capacity, interval, limit, engine=engine)
            assert_matches_model(result, rows, policy, capacity, interval, limit)
        lean = simulate(trace, policy, capacity, interval, limit, record_events=False)
        assert np.array_equal(lean.request_state, result.request_state)
        assert np.array_equal(lean.summary, result.summary)
        assert_request_table(lean, rows, replay(rows, policy, capacity, interval, limit))


def test_the_drawn_shapes_reach_every_edge():
    """The strategy above is not vacuous: its traces have preemptions, deadline misses, unservable requests,
    idle gaps of 2**40 steps and every stop reason, at priorities of +-2**53."""
    seen = set()

    @settings(max_examples=70, **SETTINGS)
    @given(data=st.data(), rows=k_traces())
    def collect(data, rows):
        policy, capacity, interval = data.draw(k_configs(rows, POLICIES))
        full = replay(rows, policy, capacity, interval)
        seen.update(k for k, v in _marks(full.events).items() if v)
        seen.add(full.stop)
        seen.update({"p53"} if any(abs(r["priority"]) == P53 for r in rows) else set())
        seen.update({"gap"} if full.clock > HUGE else set())

    collect()
    assert seen >= {"admission", "preemption", "finish", "miss", "drained", "stuck", "p53", "gap"}, seen


@settings(max_examples=25, **SETTINGS)
@given(data=st.data(), rows=k_traces())
def test_a_user_policy_equals_the_model_at_every_step_limit(data, rows):
    _, capacity, interval = data.draw(k_configs(rows))
    trace = load_trace(rows)
    full = replay(rows, EDF, capacity, interval)
    for limit in [None, *range(len(full.events) + 2)]:
        assert_matches_model(simulate(trace, EDF, capacity, interval, limit), rows, EDF, capacity, interval, limit)


@st.composite
def k_batches(draw) -> tuple[list[list[dict]], list[B.Scenario]]:
    """Three traces (light and heavy loads) and eight scenarios mixing policies, capacities and step limits."""
    rows = [draw(k_traces(max_requests=m)) for m in (3, 8, 14)]
    scenarios = []
    for _ in range(8):
        t = draw(st.integers(0, 2))
        policy, capacity, interval = draw(k_configs(rows[t]))
        limit = draw(st.one_of(st.none(), st.integers(0, sum(1 + r["max_new_tokens"] for r in rows[t]) + 1)))
        scenarios.append(B.Scenario(t, policy, capacity, interval, limit))
    return rows, scenarios


@settings(max_examples=20, **SETTINGS)
@given(batch=k_batches())
def test_a_mixed_batch_equals_each_scenarios_model_replay(batch):
    rows, scenarios = batch
    traces = [load_trace(r) for r in rows]
    for engine, threads in (("fast", 2), ("scan", 1)):
        result = B.simulate_batch(traces, scenarios, record_events=True, threads=min(threads, numba.get_num_threads()),
                                  engine=engine)
        for i, sc in enumerate(scenarios):
            assert_matches_model(result.result(i), rows[sc.trace], sc.policy, sc.free_kv_blocks, sc.aging_interval,
                                 sc.max_steps)


# One fixed batch, replayed in a fresh process (NUMBA_NUM_THREADS set before Numba starts, or the CUDA
# simulator): its arrays, as JSON, must be those of this process's replay, itself checked against the model.
BATCH = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_exact_stop61 import fixed_batch
    from decodesched import batch as B

    traces, scenarios = fixed_batch()
    out = {}
    for record in (True, False):
        r = B.simulate_batch(traces, scenarios, record_events=record, backend=sys.argv[2])
        out[str(record)] = [a.tolist() for a in (r.request_state, r.summary) + ((r.event_log,) if record else ())]
    print(json.dumps(out))
""")


def fixed_batch() -> tuple[list, list[B.Scenario]]:
    """Traces at the edges (every request at 0; bursts 2**40 apart with overdue deadlines; priorities at
    +-2**53 with one prompt beyond every capacity) and scenarios over them, built-in policies only (the CUDA
    path runs no other; a user policy in a batch is `test_a_mixed_batch_equals_each_scenarios_model_replay`'s)."""
    rows = [
        [{"request_id": i - 2, "arrival_step": 0, "prompt_len": 1 + i % 3, "max_new_tokens": 1 + i % 4,
          "priority": i % 3 - 1, "cache_hit": i % 2 == 0, "required_blocks": 1 + i % 2,
          "deadline_step": 3 + i if i % 2 else None, "preemptible": i != 2} for i in range(7)],
        [{"request_id": 2**63 - 1 - i, "arrival_step": (i // 3) * HUGE, "prompt_len": 2, "max_new_tokens": 2 + i % 2,
          "priority": (-1) ** i * P53, "cache_hit": False, "required_blocks": 1 + i % 3,
          "deadline_step": (i // 3) * HUGE + 1, "preemptible": True} for i in range(8)],
        [{"request_id": -(2**63) + i, "arrival_step": i, "prompt_len": 1, "max_new_tokens": 3,
          "priority": [P53, -P53, P53 - 1, -P53 + 1, 0][i], "cache_hit": i == 3, "required_blocks": [2, 1, 50, 2, 1][i],
          "deadline_step": i + NO_DEADLINE - 2 if i % 2 else None, "preemptible": i != 0} for i in range(5)],
    ]
    traces = [load_trace(r) for r in rows]
    scenarios = [B.Scenario(t, POLICIES[(t + k) % len(POLICIES)], capacity, interval, limit)
                 for t in range(3) for k, (capacity, interval, limit) in enumerate(
                     [(0, 1, None), (1, 2, None), (2, 2**63 - 1, 5), (3, 1, 4), (UNLIMITED, 7, None), (2, 1, 0)])]
    return traces, scenarios


def _batch_in_process(backend: str, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", BATCH, os.path.dirname(__file__), backend],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _expected(traces, scenarios) -> dict:
    out = {}
    for record in (True, False):
        r = B.simulate_batch(traces, scenarios, record_events=record)
        if record:
            rows = [t.rows() for t in traces]
            for i, sc in enumerate(scenarios):
                assert_matches_model(r.result(i), rows[sc.trace], sc.policy, sc.free_kv_blocks, sc.aging_interval,
                                     sc.max_steps)
        out[str(record)] = [a.tolist() for a in (r.request_state, r.summary) + ((r.event_log,) if record else ())]
    return out


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_fixed_batch_is_the_same_with_one_and_two_numba_threads(threads):
    traces, scenarios = fixed_batch()
    assert _batch_in_process("cpu", {"NUMBA_NUM_THREADS": threads}) == _expected(traces, scenarios)


def test_the_cuda_simulator_equals_the_model_on_a_fixed_batch():
    traces, scenarios = fixed_batch()
    assert _batch_in_process("cuda", {"NUMBA_ENABLE_CUDASIM": "1"}) == _expected(traces, scenarios)


ONE = {"request_id": [1], "arrival_step": [0], "prompt_len": [1], "max_new_tokens": [1], "priority": [0],
       "cache_hit": [False], "required_blocks": [1], "deadline_step": [None], "preemptible": [True]}


@pytest.mark.parametrize("column, value, message", [
    ("priority", P53 + 1, "column priority: must be within \\+-2\\*\\*53; got 9007199254740993"),
    ("priority", -P53 - 1, "column priority: must be within \\+-2\\*\\*53; got -9007199254740993"),
    ("priority", 2**63, "column priority: 9223372036854775808 does not fit in int64"),
    ("arrival_step", P53 + 1, "column arrival_step: must be <= 2\\*\\*53"),
    ("deadline_step", 0, "column deadline_step: must be after its arrival_step; got 0"),
])
def test_a_value_just_past_a_limit_is_refused_not_wrapped(column, value, message):
    with pytest.raises(TraceError, match=message):
        simulate({**ONE, column: [value]})


def test_a_duplicate_request_id_is_refused_by_the_trace_and_the_model():
    twice = {column: values * 2 for column, values in ONE.items()}
    with pytest.raises(TraceError, match="row 2, column request_id: duplicate request_id 1 \\(also in row 1\\)"):
        simulate(twice)
    with pytest.raises(ValueError, match="duplicate request_id: 1"):
        replay([dict(zip(ONE, values)) for values in zip(*twice.values())])


@pytest.mark.parametrize("setting, value, message", [
    ("aging_interval", 2**63, "aging_interval must be <= 2\\*\\*63 - 1"),
    ("free_kv_blocks", UNLIMITED + 1, "free_kv_blocks must be <= 2\\*\\*61"),
])
def test_a_setting_just_past_its_limit_is_refused_alone_and_in_a_batch(setting, value, message):
    config = {"policy": "aging", "free_kv_blocks": 1, "aging_interval": 1, setting: value}
    with pytest.raises(UserError, match=f"^{message}"):
        simulate(ONE, **config)
    with pytest.raises(UserError, match=f"^scenario 0: {message}"):
        B.simulate_batch([ONE], [B.Scenario(0, config["policy"], config["free_kv_blocks"], config["aging_interval"])])


def test_aging_at_the_largest_interval_and_priorities_never_wraps():
    """Priorities at +-2**53 aged at interval 1 over a 2**40-step gap and at the largest interval: the
    effective priorities stay exact (a wrap-around would let the -2**53 request preempt)."""
    rows = [{"request_id": 1, "arrival_step": 0, "prompt_len": 1, "max_new_tokens": 4, "priority": P53,
             "cache_hit": False, "required_blocks": 2, "deadline_step": None, "preemptible": True},
            {"request_id": 2, "arrival_step": 1, "prompt_len": 1, "max_new_tokens": 2, "priority": -P53,
             "cache_hit": True, "required_blocks": 2, "deadline_step": None, "preemptible": True},
            {"request_id": 3, "arrival_step": HUGE, "prompt_len": 1, "max_new_tokens": 1, "priority": P53,
             "cache_hit": False, "required_blocks": 1, "deadline_step": HUGE + 1, "preemptible": False}]
    trace = load_trace(rows)
    for interval in (1, 2, 3, 2**63 - 1):
        for engine in ("fast", "scan"):
            result = simulate(trace, "aging", 2, interval, engine=engine)
            assert_matches_model(result, rows, "aging", 2, interval, None)
            assert result.requests["preemptions"].tolist() == [0, 0, 0]


@numba.njit
def _scaled_key(r, clock):
    return (-(r.priority * 1024),)


@numba.njit
def _scaled_priority(r, clock):
    return r.priority * 1024


@numba.njit
def _unsigned_key(r, clock):
    return (np.uint64(r.priority) * np.uint64(1024),)


@numba.njit
def _priority(r, clock):
    return r.priority


PAST_INT64 = [{**dict(zip(ONE, values)), "request_id": rid, "arrival_step": arrival, "max_new_tokens": 3,
               "priority": priority} for values in zip(*ONE.values())
              for rid, arrival, priority in ((1, 0, -P53), (2, 1, P53))]


def test_the_model_refuses_a_policy_value_past_int64_where_the_replay_wraps_around():
    """``r.priority * 1024`` at priority -2**53 is 2**63 in Python, -2**63 compiled: the replay ran request 1 first
    where the model ran it last, and both answered without a word.  Now the model refuses the value (the docs'
    way to check a policy is to compare it with the model)."""
    scaled = Policy("scaled61", key=_scaled_key, effective_priority=_scaled_priority)
    with pytest.raises(UserError, match=r"^policy 'scaled61': key\(r, clock\) returned \(9223372036854775808,\) "
                                        r"in Python \(the model\) for request 1 at clock 0, past int64, where the "
                                        "compiled function wraps around"):
        replay(PAST_INT64, scaled, 1)


def test_a_numpy_unsigned_key_element_past_int64_stays_exact_in_the_model():
    """A NumPy integer wraps around in Python as compiled: a uint64 key element past 2**63 is no refusal."""
    unsigned = Policy("unsigned61", key=_unsigned_key, effective_priority=_priority)
    rows = [{**row, "priority": P53 - i} for i, row in enumerate(PAST_INT64)]  # keys of 2**63 and 2**63 - 1024
    assert_matches_model(simulate(rows, unsigned, 1), rows, unsigned, 1, 4, None)
