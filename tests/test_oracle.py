"""The differential helper itself: it must reject results that differ from the model in any way."""

import pytest
from oracle import assert_matches_model

from decodesched import simulate
from decodesched.kernels import enums as E

ROWS = [
    dict(request_id=1, arrival_step=0, prompt_len=3, max_new_tokens=3, priority=0, cache_hit=False,
         required_blocks=2, deadline_step=None, preemptible=True),
    dict(request_id=2, arrival_step=1, prompt_len=2, max_new_tokens=2, priority=1, cache_hit=True,
         required_blocks=2, deadline_step=4, preemptible=True),
    dict(request_id=3, arrival_step=9, prompt_len=2, max_new_tokens=1, priority=0, cache_hit=False,
         required_blocks=1, deadline_step=None, preemptible=False),
]
CONFIG = ("fixed_priority", 2, 4, None)


def fresh():
    return simulate(ROWS, *CONFIG, engine="scan")


def test_accepts_the_exact_result():
    assert_matches_model(fresh(), ROWS, *CONFIG)


@pytest.mark.parametrize("column", [E.EV_STEP, E.EV_ROW, E.EV_ACTION, E.EV_GENERATED, E.EV_WAIT, E.EV_FREE,
                                    E.EV_VICTIM_ROW, E.EV_MISSED])
def test_rejects_any_changed_event_field(column):
    r = fresh()
    r.event_log[1, column] ^= 1
    with pytest.raises(AssertionError):
        assert_matches_model(r, ROWS, *CONFIG)


def test_rejects_a_missing_event():
    r = fresh()
    r.event_log = r.event_log[:-1]
    with pytest.raises(AssertionError):
        assert_matches_model(r, ROWS, *CONFIG)


@pytest.mark.parametrize("column", [E.RQ_GENERATED, E.RQ_WAIT, E.RQ_PREEMPTIONS, E.RQ_STATUS])
def test_rejects_a_changed_final_state(column):
    r = fresh()
    r.request_state[0, column] = (r.request_state[0, column] + 1) % 4
    with pytest.raises(AssertionError):
        assert_matches_model(r, ROWS, *CONFIG)


def test_rejects_wrong_clock_capacity_or_stop():
    for col in (E.SM_CLOCK, E.SM_FREE, E.SM_STOP):
        r = fresh()
        r.summary[col] += 1
        with pytest.raises(AssertionError):
            assert_matches_model(r, ROWS, *CONFIG)


def test_rejects_another_policy():
    rows = [dict(ROWS[0], priority=5), dict(ROWS[1], arrival_step=0, cache_hit=False, deadline_step=3)]
    r = simulate(rows, "deadline", 4, 4, engine="scan")
    assert_matches_model(r, rows, "deadline", 4, 4, None)
    with pytest.raises(AssertionError):
        assert_matches_model(r, rows, "fixed_priority", 4, 4, None)
