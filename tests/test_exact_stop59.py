"""User policies stay exact after their functions are set by hand (stop 59's exactness red team, room K).

`Policy(...)` refuses functions whose replay would differ from the model's (a uint64 effective priority, which
Numba mixes with the kernel's int64 ones into a float; a float or bool key; a plain function the model cannot call),
but ``policy.key = f`` and ``policy.effective_priority = f`` took anything, unchecked: the kernel then ran what the
constructor refuses, silently away from the model, or failed deep inside the model (``'function' object has no
attribute 'py_func'``).  On a built-in policy the model ran the function set while the built-in kernels ignored it.
Now a function set by hand is checked as `Policy` checks it, a refused one leaves the policy as it was, and a
built-in's functions and any policy's name cannot be set.

Also here: Ctrl-C during a batch of user-policy scenarios returns at once, as it does for the built-ins; a policy
whose Python version (the model's) returns a float where its compiled version returns an integer (``2 ** -1``) is
refused, when it is made (on the sample request) and by the model (on any other), instead of the two disagreeing.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import numba
import numpy as np
import pytest
from oracle import assert_matches_model

from decodesched import Policy, simulate
from decodesched.errors import UserError
from decodesched.model import replay
from decodesched.policy import builtin

# Row 0 (priority 0) is admitted first; row 1 (priority 1) arrives at step 1 and needs row 0's block: under an
# effective priority of 2**62 + priority it preempts row 0 (2**62 < 2**62 + 1), unless the values are rounded.
PREEMPTING = {"request_id": [10, 11], "arrival_step": [0, 1], "prompt_len": [2, 2], "max_new_tokens": [3, 3],
              "priority": [0, 1], "cache_hit": [False, False], "required_blocks": [1, 1],
              "deadline_step": [None, None], "preemptible": [True, True]}
ROWS = [dict(zip(PREEMPTING, values)) for values in zip(*PREEMPTING.values())]


@numba.njit
def latest_first(r, clock):
    return (-r.arrival_step,)


@numba.njit
def high(r, clock):
    return np.int64(2**62) + r.priority


@numba.njit
def high_unsigned(r, clock):
    return np.uint64(2**62) + np.uint64(r.priority)


@numba.njit
def half(r, clock):
    return (r.priority * 0.5,)


@numba.njit
def is_prefill(r, clock):
    return (r.phase == 0,)


@pytest.fixture(scope="module")
def built():
    return Policy("latest59", key=latest_first, effective_priority=high)


@pytest.fixture
def policy(built):
    """One policy for the module (its kernel compiles once), put back as it was after each test."""
    yield built
    original = {"name": "latest59", "key": latest_first, "effective_priority": high}
    if any(getattr(built, attr) is not value for attr, value in original.items()):
        for attr, value in [*original.items(), ("_kernel", None)]:
            object.__setattr__(built, attr, value)


def test_a_uint64_effective_priority_set_by_hand_is_refused_and_the_replay_stays_exact(policy):
    with pytest.raises(UserError, match=r"^policy 'latest59': effective_priority\(r, clock\) returns an unsigned"):
        policy.effective_priority = high_unsigned
    assert policy.effective_priority is high
    result = simulate(PREEMPTING, policy, free_kv_blocks=1)
    assert_matches_model(result, ROWS, policy, 1, 4, None)
    assert result.timeline()[1]["preempted_request_id"] == 10


@pytest.mark.parametrize(("function", "message"), [
    (half, r"key\(r, clock\) must return a tuple of integers, got \(0\.0,\): element 0 is a float"),
    (is_prefill, r"key\(r, clock\) must return a tuple of integers, got \(True,\): element 0 is a bool"),
    (lambda r, clock: (r.phase,), r"key must be a @numba.njit function of \(r, clock\), got function \(a plain lambda"),
    (5, r"key must be a @numba.njit function of \(r, clock\), got int"),
])
def test_a_key_set_by_hand_is_checked_as_the_constructor_checks_it(policy, function, message):
    """A float key ran silently in the kernel (and in the model, as floats); a plain function or a number compiled
    into a kernel error, and the model failed with AttributeError ('py_func')."""
    fingerprint = policy.fingerprint()
    with pytest.raises(UserError, match=r"^policy 'latest59': " + message):
        policy.key = function
    assert policy.key is latest_first and policy.fingerprint() == fingerprint
    assert_matches_model(simulate(PREEMPTING, policy, free_kv_blocks=1), ROWS, policy, 1, 4, None)


@pytest.mark.parametrize("attr", ["key", "effective_priority"])
def test_a_builtin_policys_functions_cannot_be_set(attr):
    """The built-in kernels never call a built-in Policy's functions, while the model called the one set by hand:
    ``builtin("fcfs").key = latest_first`` gave the model latest-first and the kernel first-come-first-served."""
    policy = builtin("fcfs")
    before = getattr(policy, attr)
    with pytest.raises(UserError, match=rf"^policy 'fcfs': its {attr} cannot be set"):
        setattr(policy, attr, latest_first if attr == "key" else high)
    assert getattr(policy, attr) is before
    assert_matches_model(simulate(PREEMPTING, policy, free_kv_blocks=1), ROWS, "fcfs", 1, 4, None)


@pytest.mark.parametrize("name", ["aging", "other", ""])
def test_a_policy_cannot_be_renamed(policy, name):
    """A name set by hand skipped `Policy`'s checks (a built-in's name, an empty one): results and tables know a
    policy by its name."""
    with pytest.raises(UserError, match=r"^policy 'latest59': its name cannot be set"):
        policy.name = name
    assert policy.name == "latest59" and simulate(PREEMPTING, policy, free_kv_blocks=1).policy == "latest59"


# A batch of user-policy scenarios that never end by themselves (one request of 2**40 tokens), interrupted.
ENDLESS_BATCH = r"""
import sys, time, numba
from decodesched import Policy, grid, load_trace, simulate_batch

@numba.njit
def key(r, clock):
    return (r.phase,)

@numba.njit
def priority(r, clock):
    return r.priority

policy = Policy("endless59", key=key, effective_priority=priority)
trace = load_trace({"request_id": [1], "arrival_step": [0], "prompt_len": [1], "max_new_tokens": [2**40],
                    "priority": [0], "cache_hit": [False], "required_blocks": [1], "deadline_step": [None],
                    "preemptible": [True]})
policy.compile()
print("ready", flush=True)
try:
    simulate_batch([trace], grid([trace], [policy], [1, 2], [4]), threads=int(sys.argv[1]))  # (hours)
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
print("then", simulate_batch([trace], grid([trace], [policy], [1], [4], max_steps=7)).result(0).clock, flush=True)
"""


def test_ctrl_c_in_a_batch_of_user_policies_returns_to_the_session():
    """Ctrl-C during `simulate_batch` (so a sweep) of user policies waited for the scenarios under way (with one
    thread the kernel held the interpreter; with two, as here, the thread pool's exit waited for its threads),
    minutes on a long trace, here forever; the built-in policies' batch returned at once.  Now both do (one code
    path for any thread count)."""
    p = subprocess.Popen([sys.executable, "-c", ENDLESS_BATCH, "2"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        time.sleep(2)  # (into the replays)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)  # (the batch alone takes hours)
    finally:
        p.kill()
        p.communicate()
    assert p.returncode == 0, err
    assert out.splitlines() == ["interrupted", "then 7"], out


@numba.njit
def power_key(r, clock):
    return (r.phase, (r.priority + 2) ** (r.phase - 1))  # (Python: 0.5 in prefill; compiled: 0)


@numba.njit
def power_later(r, clock):
    return (r.phase, 2 ** (r.priority + 1))  # (priority 0, as on the sample request: 2; -2: 0.5 in Python, 0 compiled)


def test_a_key_that_is_a_float_in_python_only_is_refused_when_made():
    """The compiled key returns integers; its Python version (the model's) gave 0.5 on the sample request, and
    `Policy` let it pass (its comment said the model would refuse it; the model sorted by 0.5 where the replay
    sorted by 0)."""
    with pytest.raises(UserError, match=r"^policy 'pow59': key\(r, clock\) gives \(0, 0\) compiled but \(0, 0\.5\) "
                                        r"in Python \(the model\) on a sample request: return integers in Python too"):
        Policy("pow59", key=power_key, effective_priority=high)


def test_the_model_refuses_a_float_its_policy_gives_in_python_on_a_later_request():
    """Past the sample request only the model can see it: it ran on, ordering by 0.5 where the replay ordered by 0,
    so the oracle and the replay disagreed without a word."""
    policy = Policy("pow59_later", key=power_later, effective_priority=high)
    rows = [dict(row, priority=-2) for row in ROWS]
    with pytest.raises(UserError, match=r"^policy 'pow59_later': key\(r, clock\) returned \(0, 0\.5\) in Python "
                                        r"\(the model\) for request 10 at clock 0, not a tuple of integers"):
        replay(rows, policy, free_kv_blocks=1)
