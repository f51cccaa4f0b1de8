"""Policies of the user's own at the edges (stop 63): a function that can return None on some path, a name that
begins or ends with a space, NumPy integers that overflow in Python, and keys of 0 and 12 elements, of mixed
integer widths and read from the clock, which every engine replays as the model does.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from decodesched import Policy, grid, simulate, simulate_batch
from decodesched.errors import UserError
from decodesched.model import replay

# Requests that all take both phases (so that a path taken only in decode is met), arrive over time, preempt and
# miss deadlines; priorities near +-2**53 (a trace's bounds) too.
TRACE = {"request_id": [5, -3, 9, 0, 2, -7, 11, 4],
         "arrival_step": [0, 0, 1, 2, 2, 4, 6, 9],
         "prompt_len": [4, 2, 6, 1, 3, 5, 2, 7],
         "max_new_tokens": [3, 2, 4, 1, 5, 2, 3, 2],
         "priority": [0, 2**53, -2**53, 1, 5, -2, 3, 2**53 - 1],
         "cache_hit": [False, True, False, True, False, True, False, False],
         "required_blocks": [2, 3, 1, 4, 2, 1, 3, 2],
         "deadline_step": [None, 8, 5, None, 20, 9, None, 14],
         "preemptible": [True, True, False, True, True, True, False, True]}


def _rows(trace):
    return [dict(zip(trace, values)) for values in zip(*trace.values())]


def _model(policy, capacity):
    """The model's events for TRACE, as `SimulationResult.timeline` gives them (without their step)."""
    events = replay(_rows(TRACE), policy=policy, free_kv_blocks=capacity).events
    return [{k: v for k, v in e.items() if k != "step"} for e in events]


@numba.njit
def by_phase(r, clock):
    return (r.phase,)


@numba.njit
def business(r, clock):
    return r.priority


@numba.njit
def none_in_decode(r, clock):
    if r.phase == 1:
        return None
    return r.priority


@numba.njit
def no_else(r, clock):  # (an if/elif without else: Numba adds `return None` after it)
    if r.phase == 0:
        return r.priority
    elif r.phase == 1:
        return -r.priority


@numba.njit
def key_none_in_decode(r, clock):
    if r.phase == 1:
        return None
    return (r.prompt_len,)


@numba.njit
def key_element_none_in_decode(r, clock):
    length = None if r.phase == 1 else r.prompt_len
    return (r.phase, length)


@pytest.mark.parametrize("key, priority, what", [(by_phase, none_in_decode, "effective_priority"),
                                                 (by_phase, no_else, "effective_priority"),
                                                 (key_none_in_decode, business, "key"),
                                                 (key_element_none_in_decode, business, "key")])
def test_a_function_that_can_return_none_is_refused_when_the_policy_is_made(key, priority, what):
    """The sample request (prefill) takes the path that returns an integer; before, the Policy was made, and its
    replay failed at the first decode request: for a priority as a kernel that "does not compile" with Numba's
    words about OptionalType and NumPy dtypes, for a key with a TypeError "expected UniTuple, got None"."""
    with pytest.raises(UserError, match=f"'optional': {what}\\(r, clock\\) can return None .*make every path") as info:
        Policy("optional", key=key, effective_priority=priority)
    assert "\n" not in str(info.value)


def test_a_function_that_can_return_none_set_by_hand_is_refused_and_changes_nothing():
    policy = Policy("by-phase", key=by_phase, effective_priority=business)
    with pytest.raises(UserError, match="can return None"):
        policy.effective_priority = none_in_decode
    assert policy.effective_priority is business


@pytest.mark.parametrize("name", ["fcfs ", " aging", "sjf ", "  two  "])
def test_a_name_with_a_space_at_either_end_is_refused(name):
    """Tables and the report print names padded or as they are: "fcfs " stood in the sweep table as the built-in
    fcfs beside it, and "sjf " as "sjf"."""
    with pytest.raises(UserError, match="begins or ends with a space") as info:
        Policy(name, key=by_phase, effective_priority=business)
    assert "\n" not in str(info.value)


def test_a_name_with_a_space_inside_is_kept():
    assert Policy("sjf v2", key=by_phase, effective_priority=business).name == "sjf v2"


# Guards (already right when checked): keys at the edges of their shape and type replay as the model in `simulate`
# and on a batch's threads.

@numba.njit
def empty_key(r, clock):  # (the order is the request ids')
    return ()


@numba.njit
def waited_with_clock(r, clock):  # (time-dependent: the request that has been in the system longest)
    return clock - r.arrival_step + r.wait_steps % 3


@numba.njit
def _rank(r):
    return r.deadline_step - r.prompt_len if r.has_deadline else np.int64(2**62)


@numba.njit
def every_field(r, clock):  # 12 elements of mixed widths, every field of r, a helper
    return (np.int8(r.phase), np.uint64(r.cache_hit), np.int32(r.admitted), _rank(r), -r.priority // 2,
            np.uint16(r.preemptions), r.max_new_tokens - r.generated_len, r.wait_steps, (clock * 7 + r.request_id) % 5,
            r.has_deadline * r.preemptible, np.int64(r.arrival_step),
            np.int16(r.phase + 2) * np.int16(r.preemptions + 3))  # (NumPy int16 inside int16: as compiled)


@numba.njit
def negated(r, clock):
    return -r.priority


@pytest.mark.parametrize("key, priority", [(empty_key, waited_with_clock), (every_field, negated)])
def test_keys_at_the_edges_replay_as_the_model_in_every_engine(key, priority):
    policy = Policy(f"edge-{key.__name__}", key=key, effective_priority=priority)
    model = _model(policy, 5)
    assert simulate(TRACE, policy, 5).timeline() == model
    batch = simulate_batch([TRACE], grid([TRACE], [policy], [5], None), record_events=True, threads=2)
    assert batch.result(0).timeline() == model


# NumPy integers in a policy's Python version (the model's) wrap at their own width or refuse a cast, where compiled
# code computes small integers in int64 and wraps casts: before, the model and the replay disagreed without an error.

@numba.njit
def int32_product(r, clock):  # (1 ** 9 fits int32: the sample request agrees; prompt_len 3 does not)
    return (np.int32(r.prompt_len) * np.int32(1_000_000_000),)


@numba.njit
def int16_sum(r, clock):
    return np.int16(r.max_new_tokens) * np.int16(r.prompt_len) * np.int16(5000)


@numba.njit
def uint32_cast(r, clock):  # (priority 0 on the sample request; -2 in the trace)
    return (np.uint32(r.priority),)


@pytest.mark.parametrize("key, priority, what", [(int32_product, business, "key"),
                                                 (by_phase, int16_sum, "effective_priority"),
                                                 (uint32_cast, business, "key")])
def test_a_numpy_overflow_in_the_python_version_is_one_line_from_the_model(key, priority, what, capfd):
    policy = Policy(f"numpy-{what}", key=key, effective_priority=priority)
    with pytest.raises(UserError, match=f"'numpy-{what}': {what}\\(r, clock\\) overflowed a NumPy integer in Python "
                                        "\\(the model\\) for request -?[0-9]+ at clock [0-9]+ ") as info:
        replay(_rows(TRACE), policy=policy, free_kv_blocks=6)
    assert "\n" not in str(info.value)
    assert capfd.readouterr().err == ""  # (NumPy's RuntimeWarning is not printed)


@numba.njit
def int8_on_the_sample(r, clock):  # (1 * 127 * 2 = 254: past int8 in Python, not compiled)
    return (np.int8(r.prompt_len) * np.int8(127) * np.int8(2),)


def test_a_numpy_overflow_on_the_sample_request_is_refused_when_the_policy_is_made(capfd):
    """Before, NumPy's RuntimeWarning landed on stderr and the line blamed random numbers or state kept."""
    with pytest.raises(UserError, match="'int8': key\\(r, clock\\) overflowed a NumPy integer in Python "
                                        "\\(the model\\) on a sample request") as info:
        Policy("int8", key=int8_on_the_sample, effective_priority=business)
    assert "\n" not in str(info.value)
    assert capfd.readouterr().err == ""
