"""An audit of user policies as a researcher writes them: the built-ins written by hand from
docs/policies.md equal the built-in kernels and the model on wide traces; careless or hostile
functions are one `UserError` line; a notebook that re-runs a helper's cell is caught instead of
replaying stale compiled code; a Policy copies as itself; `Trace.subset` takes a slice."""

from __future__ import annotations

import copy
import dataclasses
import functools
import pickle
import textwrap

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import assert_matches_model, traces

from decodesched import Policy, Scenario, load_trace, simulate
from decodesched.errors import UserError

NONE = 1_000_000_000


def handwritten(name: str, interval: int = 4) -> Policy:
    """Built-in `name` written as a user would from docs/semantics.md and the fields of docs/policies.md."""
    k = interval

    @numba.njit
    def remaining(r):
        return r.max_new_tokens - r.generated_len + (1 if r.phase == 0 else 0)

    @numba.njit
    def business(r, clock):
        return r.priority

    @numba.njit
    def aged(r, clock):
        return r.priority + r.wait_steps // k

    @numba.njit
    def fcfs_key(r, clock):
        return (r.phase, r.arrival_step)  # arrival_step is the enqueue clock

    @numba.njit
    def fixed_key(r, clock):
        return (r.phase, 1 - r.cache_hit, -r.priority, r.prompt_len + r.generated_len)

    @numba.njit
    def aging_key(r, clock):
        return (NONE, r.phase, 1 - r.cache_hit, -aged(r, clock), r.prompt_len + r.generated_len)

    @numba.njit
    def deadline_key(r, clock):
        slack = r.deadline_step - clock - remaining(r) if r.has_deadline else NONE
        return (slack, r.phase, 1 - r.cache_hit, -r.priority, r.prompt_len + r.generated_len)

    key = {"fcfs": fcfs_key, "fixed_priority": fixed_key, "aging": aging_key, "deadline": deadline_key}[name]
    return Policy(f"my_{name}_{interval}", key=key, effective_priority=aged if name == "aging" else business)


CASES = [("fcfs", 4), ("fixed_priority", 4), ("deadline", 4), ("aging", 1), ("aging", 3), ("aging", 2**62)]
HANDWRITTEN = {case: handwritten(*case) for case in CASES}


@settings(max_examples=500)
@given(rows=traces(max_requests=12, wide_priorities=True), case=st.sampled_from(CASES),
       capacity=st.one_of(st.integers(0, 12), st.just(2**61)), limit=st.one_of(st.none(), st.integers(0, 40)))
def test_builtins_written_by_hand_equal_the_builtin_kernels_and_the_model(rows, case, capacity, limit):
    """Priorities distinct, SJF-like, negative or anywhere in +-2**53, at times a deadline on every request,
    ids large and negative; capacities from none to unlimited; aging intervals up to 2**62."""
    name, interval = case
    got = simulate(rows, HANDWRITTEN[case], capacity, interval, limit)
    want = simulate(rows, name, capacity, interval, limit)
    assert got.timeline() == want.timeline()
    np.testing.assert_array_equal(got.request_state, want.request_state)
    np.testing.assert_array_equal(got.summary, want.summary)
    assert_matches_model(got, rows, HANDWRITTEN[case], capacity, interval, limit)


@numba.njit
def priority(r, clock):
    return r.priority


@numba.njit
def lengths_differ(r, clock):
    if r.phase == 0:
        return (r.priority,)
    return (r.priority, r.phase)


@numba.njit
def booleans(r, clock):
    return (r.phase == 0, r.priority)


@numba.njit
def past_int64(r, clock):
    return (r.priority + 2**64,)


@numba.njit("UniTuple(int64, 1)(int64, int64)")
def other_signature(r, clock):
    return (r,)


@numba.cfunc("int64(int64, int64)")
def a_cfunc(r, clock):
    return r


@numba.vectorize(["int64(int64, int64)"])
def a_ufunc(r, clock):
    return r


@numba.njit
def three(r, clock, extra):
    return (r.priority + extra,)


@numba.njit
def is_positive(r, clock):
    return r.priority > 0


@numba.njit
def _plain_key(r, clock):
    return (r.priority,)


@pytest.mark.parametrize("key, effective_priority, message", [
    (lengths_differ, priority, "failed on a sample request: Can't unify return type"),
    (booleans, priority, "must return a tuple of integers, got"),
    (past_int64, priority, "failed on a sample request: Int value is too large"),
    (other_signature, priority, "failed on a sample request: No matching definition"),
    (a_cfunc, priority, "key must be a @numba.njit function of \\(r, clock\\), got CFunc"),
    (a_ufunc, priority, "key must be a @numba.njit function of \\(r, clock\\), got DUFunc"),
    (lambda r, clock: (r.priority,), priority, "key must be a @numba.njit function"),
    (functools.partial(three, extra=1), priority, "key must be a @numba.njit function of \\(r, clock\\), got partial"),
    (booleans.py_func, priority, "key must be a @numba.njit function"),
    (_plain_key, is_positive, "effective_priority\\(r, clock\\) must return an integer, got"),
])
def test_careless_functions_are_one_line(key, effective_priority, message):
    with pytest.raises(UserError, match=message) as info:
        Policy("careless", key=key, effective_priority=effective_priority)
    assert "\n" not in str(info.value)


@numba.njit(parallel=True)
def parallel_key(r, clock):
    total = 0
    for i in numba.prange(r.prompt_len + 1):
        total += i
    return (total, r.phase)


@numba.njit(parallel=True)
def parallel_sum(n):
    total = 0
    for i in numba.prange(n):
        total += i
    return total


@numba.njit
def calls_parallel(r, clock):
    return (parallel_sum(r.prompt_len + 1),)


@numba.njit(parallel=True)
def parallel_flag_only(r, clock):
    return r.priority


@pytest.mark.filterwarnings("ignore::numba.NumbaPerformanceWarning")
@pytest.mark.parametrize("key, effective_priority, what", [
    (parallel_key, priority, "key"),
    (calls_parallel, priority, "key"),
    (_plain_key, parallel_flag_only, "effective_priority"),
])
def test_a_parallel_region_is_refused(key, effective_priority, what):
    """A parfor inside a policy function, run from a batch's threads under Numba's workqueue threading
    layer, aborts the whole process ("Concurrent access has been detected", SIGABRT)."""
    with pytest.raises(UserError, match=f"'par': {what}\\(r, clock\\) uses parallel=True") as info:
        Policy("par", key=key, effective_priority=effective_priority)
    assert "\n" not in str(info.value)


ROWS = [dict(request_id=i, arrival_step=0, prompt_len=1 + i % 4, max_new_tokens=1 + (i * 3) % 5, priority=i % 3,
             cache_hit=False, required_blocks=1, deadline_step=None, preemptible=True) for i in range(6)]


def test_a_policy_copies_as_itself_and_a_notebook_policy_still_does_not_pickle():
    cell = {"__name__": "__main__"}
    exec(textwrap.dedent("""
        import numba
        from decodesched import Policy

        @numba.njit
        def key(r, clock):
            return (r.max_new_tokens,)

        @numba.njit
        def eff(r, clock):
            return r.priority

        P = Policy("in_a_notebook", key=key, effective_priority=eff)
    """), cell)
    policy = cell["P"]
    assert copy.copy(policy) is policy and copy.deepcopy(policy) is policy
    scenario = Scenario(0, policy, 4, 4)
    assert dataclasses.asdict(scenario)["policy"] is policy
    assert copy.deepcopy([scenario])[0].policy is policy
    with pytest.raises(TypeError, match="cannot be sent to another process"):
        pickle.dumps(policy)


NOTEBOOK = """
import numba
import numpy as np
from decodesched import Policy

SCALE = 1
TABLE = np.array([3, 1, 2])

@numba.njit
def leaf(r):
    return r.max_new_tokens * SCALE

@numba.njit
def helper(r):
    return leaf(r) + TABLE[0]

@numba.njit
def key(r, clock):
    return (helper(r),)

@numba.njit
def eff(r, clock):
    return r.priority

P = Policy("notebook", key=key, effective_priority=eff)
"""


def test_a_notebook_cell_run_again_after_compiling_is_caught_not_replayed_stale():
    """Numba froze `SCALE` into `leaf` when the Policy compiled; the model's `.py_func` reads the new one.
    Replaying the old Policy, or building a new one from the old functions, would silently differ from the
    model: each is one line naming the function to define again. Re-running a cell with the same values
    or code is no change; defining the functions again gives the new schedule, equal to the model."""
    cell = {"__name__": "audit_notebook"}  # (a module without a file, as a notebook's; pytest's __main__ has one)
    exec(NOTEBOOK, cell)
    old = cell["P"]
    before = simulate(ROWS, old, 10).timeline()
    exec("TABLE = np.array([3, 1, 2])\nSCALE = 1", cell)  # the same values, new objects
    exec("@numba.njit\ndef helper(r):\n    return leaf(r) + TABLE[0]\n", cell)  # the same code again
    assert simulate(ROWS, old, 10).timeline() == before
    exec("SCALE = -1", cell)
    message = ("^policy 'notebook': key: leaf was compiled with an earlier 'SCALE' than the one defined now .*: "
               "define leaf and the functions that call it again$")
    with pytest.raises(UserError, match=message):
        simulate(ROWS, old, 10)
    with pytest.raises(UserError, match=message):
        exec('Policy("notebook", key=key, effective_priority=eff)', cell)
    exec(NOTEBOOK.replace("SCALE = 1", "SCALE = -1"), cell)
    new = cell["P"]
    result = simulate(ROWS, new, 10)
    assert result.timeline() != before
    assert_matches_model(result, ROWS, new, 10, 4, None)


def test_trace_subset_takes_a_slice_as_numpy_does():
    trace = load_trace(ROWS)
    for rows in (slice(1, 4), slice(None, None, -2), slice(10, 20)):
        assert trace.subset(rows).request_id.tolist() == trace.request_id[rows].tolist()
    assert simulate(trace.subset(slice(0, 3)), "fcfs", 4).timeline() == simulate(ROWS[:3], "fcfs", 4).timeline()
