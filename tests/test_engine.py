"""Every engine equals the model, event for event, on thousands of random traces (Hypothesis)."""

import csv

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import POLICIES, assert_matches_model, configs, traces, wide_configs

from decodesched import simulate
from decodesched.errors import UserError
from decodesched.trace import TRACE_COLUMNS

ENGINES = ("scan", "fast")


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=1500)
@given(rows=traces(), config=configs)
def test_engine_equals_model(engine, rows, config):
    policy, capacity, interval, max_steps = config
    result = simulate(rows, policy, capacity, interval, max_steps, engine=engine)
    assert_matches_model(result, rows, policy, capacity, interval, max_steps)


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=300)
@given(rows=traces(max_requests=30, max_len=8, max_arrival=40, max_blocks=10),
       config=st.tuples(st.sampled_from(POLICIES), st.integers(8, 30), st.integers(1, 7), st.none()))
def test_engine_equals_model_on_longer_busier_traces(engine, rows, config):
    policy, capacity, interval, max_steps = config
    result = simulate(rows, policy, capacity, interval, max_steps, engine=engine)
    assert_matches_model(result, rows, policy, capacity, interval, max_steps)


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=600)
@given(rows=traces(max_requests=20, max_blocks=8, wide_priorities=True), config=wide_configs)
def test_engine_equals_model_with_wide_priorities(engine, rows, config):
    """Every request its own priority, SJF (-max_new_tokens), +-2**53, negative; deadlines on every
    request in half the traces; capacities from none to unlimited."""
    policy, capacity, interval, max_steps = config
    result = simulate(rows, policy, capacity, interval, max_steps, engine=engine)
    assert_matches_model(result, rows, policy, capacity, interval, max_steps)


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=100)
@given(rows=traces(), config=configs)
def test_results_without_the_event_log_are_the_same(engine, rows, config):
    full = simulate(rows, *config, engine=engine)
    lean = simulate(rows, *config, engine=engine, record_events=False)
    assert lean.event_log is None and lean.n_events == full.n_events
    np.testing.assert_array_equal(lean.request_state, full.request_state)
    with pytest.raises(ValueError, match="no event log"):
        lean.timeline()


def row(rid, arrival=0, new=2, **kw):
    r = dict(request_id=rid, arrival_step=arrival, prompt_len=3, max_new_tokens=new, priority=0,
             cache_hit=False, required_blocks=1, deadline_step=None, preemptible=True)
    r.update(kw)
    return r


def test_per_request_metrics_follow_the_spec():
    # request 1 runs alone from step 0; request 2 arrives at 1 and waits behind it (same priority,
    # longer prompt), so its prefill is at step 1 (prefill first), then decodes after 1 finishes.
    r = simulate([row(1, new=2), row(2, arrival=1, new=3, prompt_len=9, deadline_step=6)], "fixed_priority", 10)
    req = r.requests
    steps = [(e["request_id"], e["action"]) for e in r.timeline()]
    assert steps[:2] == [(1, "prefill_to_decode"), (2, "prefill_to_decode")]
    first, first_token, finish = (req[c].tolist() for c in ("first_step", "first_token_step", "finish_step"))
    assert first == [0, 1] and first_token == [2, 4] and finish == [3, 6]
    assert req["queue_wait"].tolist() == [0, 0]
    assert req["ttft"].tolist() == [3, 4]  # first_token_step + 1 - arrival
    assert req["e2e"].tolist() == [4, 6]  # finish_step + 1 - arrival
    assert req["tpot"].tolist() == [1.0, 1.0]  # (finish - first_token) / (max_new_tokens - 1)
    assert req["deadline_met"].tolist() == [False, False]  # 6 + 1 > 6
    m = r.metrics
    assert m["deadline_misses"] == 1 and m["with_deadline"] == 1
    assert m["ttft"]["max"] == 4 and m["starvation"] == max(req["wait_steps"])


def test_unservable_requests_are_counted_not_dropped():
    r = simulate([row(1, required_blocks=50), row(2)], "aging", 10)
    assert r.stop_reason == "stuck"
    assert r.requests["status"].tolist() == ["unservable", "finished"]
    assert r.metrics["unservable"] == 1 and np.isnan(r.requests["ttft"][0])


def test_extreme_ids_and_values_stay_exact():
    big = 2**53
    rows = [row(-(2**63), priority=big, new=3, required_blocks=2, deadline_step=big),
            row(2**63 - 1, priority=-big, new=2, required_blocks=2),
            row(0, arrival=2, priority=big, new=1, required_blocks=3, deadline_step=3)]
    for policy in POLICIES:
        for engine in ENGINES:
            r = simulate(rows, policy, 3, 1, engine=engine)
            assert_matches_model(r, rows, policy, 3, 1, None)


@pytest.mark.parametrize("kwargs, match", [
    (dict(policy="sjf"), "unknown policy"),
    (dict(free_kv_blocks=-1), "free_kv_blocks"),
    (dict(free_kv_blocks=2.5), "integer"),
    (dict(aging_interval=0), "aging_interval"),
    (dict(aging_interval=2**63), r"aging_interval must be <= 2\*\*63 - 1, got 9223372036854775808$"),
    (dict(policy="fixed_priority", aging_interval=10**30), r"aging_interval must be <= 2\*\*63 - 1"),
    (dict(aging_interval=np.uint64(2**63)), r"aging_interval must be <= 2\*\*63 - 1"),
    (dict(aging_interval="4" * 5000), r"must be an integer, got '4444.*\(5002 chars\)$"),
    (dict(max_steps=-2), "max_steps"),
    (dict(engine="gpu"), "unknown engine"),
    (dict(record_events="no"), r"record_events must be True or False, got 'no'$"),
    (dict(record_events=None), r"record_events must be True or False, got None$"),
])
def test_bad_configuration_is_refused(kwargs, match):
    with pytest.raises(UserError, match=match):
        simulate([row(1)], **kwargs)


def test_an_aging_interval_no_wait_reaches_is_fixed_priority():
    """Found by a fuzz of `simulate`'s arguments: an interval past int64 reached the kernel (as a new
    uint64 specialization, or an overflow); up to 2**63 - 1 it runs, and no request waits that long."""
    rows = [row(1, new=3, priority=0), row(2, arrival=1, new=2, priority=1, required_blocks=3)]
    for engine in ENGINES:
        got = simulate(rows, "aging", 3, aging_interval=2**63 - 1, engine=engine)
        want = simulate(rows, "fixed_priority", 3, engine=engine)
        assert got.timeline() == want.timeline() and got.aging_interval == 2**63 - 1


def test_a_step_limit_beyond_int64_is_no_limit():
    rows = [row(1, new=3), row(2, arrival=1, new=2)]
    for engine in ENGINES:
        r = simulate(rows, "aging", 4, max_steps=2**70, engine=engine)
        assert r.n_events == simulate(rows, "aging", 4, engine=engine).n_events == 7


def test_csv_files_follow_the_schemas(tmp_path):
    r = simulate([row(5, new=2, required_blocks=2), row(-3, arrival=1, new=1, priority=4, required_blocks=2,
                                                        deadline_step=4)], "fixed_priority", 2)
    r.write_events(tmp_path / "ev.csv")
    r.write_requests(tmp_path / "rq.csv")
    with open(tmp_path / "ev.csv") as fh:
        ev = list(csv.DictReader(fh))
    assert list(ev[0]) == ["step", "request_id", "phase", "action", "prompt_len", "generated_len",
                           "max_new_tokens", "wait_steps", "free_kv_blocks", "preempted_request_id",
                           "deadline_missed"]
    preempting = [e for e in ev if e["preempted_request_id"]]
    assert preempting and preempting[0]["request_id"] == "-3" and preempting[0]["preempted_request_id"] == "5"
    assert {e["deadline_missed"] for e in ev} <= {"true", "false"}
    assert [int(e["step"]) for e in ev] == r.events["step"].tolist()
    with open(tmp_path / "rq.csv") as fh:
        rq = list(csv.DictReader(fh))
    assert list(rq[0])[: len(TRACE_COLUMNS)] == list(TRACE_COLUMNS)
    assert list(rq[0])[len(TRACE_COLUMNS):] == ["first_step", "first_token_step", "finish_step", "wait_steps",
                                                "preemptions", "status", "queue_wait", "ttft", "tpot", "e2e",
                                                "deadline_met"]
    by_id = {x["request_id"]: x for x in rq}
    assert by_id["5"]["preemptions"] == "1" and by_id["5"]["deadline_met"] == ""
    assert by_id["-3"]["deadline_met"] in ("true", "false") and by_id["-3"]["tpot"] == ""
