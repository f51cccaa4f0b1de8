"""User-defined policies (SPEC section 8): the generic kernel equals the model with the same Policy,
the built-ins written as policies equal the built-in kernels, and a Policy is accepted and
validated wherever a policy name is.

SJF and least-laxity-first below use only the public API (``numba.njit`` and ``decodesched.Policy``).
"""

from __future__ import annotations

import textwrap

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import POLICIES, assert_matches_model, traces, write_sjf_module

from decodesched import DecodeSchedulerSim, Policy, grid, simulate, simulate_batch
from decodesched.errors import UserError
from decodesched.model import replay
from decodesched.policy import builtin, resolve_policy

NO_DEADLINE = 1 << 40


@numba.njit
def remaining_steps(r):
    return r.max_new_tokens - r.generated_len + (1 if r.phase == 0 else 0)


@numba.njit
def sjf_key(r, clock):
    return (remaining_steps(r), r.phase)


@numba.njit
def sjf_priority(r, clock):
    return -remaining_steps(r)  # a shorter job may preempt a longer one


@numba.njit
def llf_key(r, clock):
    laxity = r.deadline_step - clock - remaining_steps(r) if r.has_deadline else NO_DEADLINE
    return (laxity, -r.priority)


@numba.njit
def llf_priority(r, clock):
    return r.priority


SJF = Policy("sjf", key=sjf_key, effective_priority=sjf_priority)
LLF = Policy("least_laxity", key=llf_key, effective_priority=llf_priority)


@numba.njit
def state_key(r, clock):
    # every field of the view takes part, so a wrong field in the kernel's view shows up
    return (r.admitted, r.preemptions % 2, r.wait_steps // 3, r.cache_hit, r.preemptible, -r.arrival_step,
            r.prompt_len + r.generated_len, r.deadline_step - clock if r.has_deadline else -1)


@numba.njit
def state_priority(r, clock):
    return r.priority * 2 - r.preemptions + (r.wait_steps + clock) // 5


STATE = Policy("every_field", key=state_key, effective_priority=state_priority)


def as_user(name, interval=4):
    """Built-in `name` as a user policy: its functions, through the generic kernel's user path."""
    b = builtin(name, aging_interval=interval)
    return Policy(f"user_{name}_{interval}", key=b.key, effective_priority=b.effective_priority)


USER_BUILTINS = {(name, k): as_user(name, k) for name in POLICIES for k in (1, 2, 4)}


@st.composite
def wide_traces(draw, max_requests=14):
    """`oracle.traces` with priorities over wide ranges and, at times, a deadline on every request."""
    rows = draw(traces(max_requests=max_requests, max_len=6, max_arrival=14, max_blocks=7))
    mode = draw(st.sampled_from(["as drawn", "distinct", "sjf-like", "negative", "huge"]))
    for i, row in enumerate(rows):
        if mode == "distinct":
            row["priority"] = (i * 7919) % 1009 - 500
        elif mode == "sjf-like":
            row["priority"] = -row["max_new_tokens"]
        elif mode == "negative":
            row["priority"] = draw(st.integers(-10**6, -1))
        elif mode == "huge":
            row["priority"] = draw(st.integers(-2**40, 2**40))
    if draw(st.booleans()):
        for row in rows:
            if row["deadline_step"] is None:
                row["deadline_step"] = row["arrival_step"] + draw(st.integers(1, 20))
    return rows


capacities = st.one_of(st.integers(0, 12), st.just(10**12))
max_steps = st.one_of(st.none(), st.integers(0, 40))


@pytest.mark.parametrize("policy", [SJF, LLF, STATE], ids=lambda p: p.name)
@settings(max_examples=1200)
@given(rows=wide_traces(), capacity=capacities, limit=max_steps)
def test_custom_policy_equals_the_model_with_the_same_policy(policy, rows, capacity, limit):
    result = simulate(rows, policy, capacity, 4, limit)
    assert result.policy == policy.name
    assert_matches_model(result, rows, policy, capacity, 4, limit)


@settings(max_examples=1500)
@given(rows=wide_traces(), capacity=capacities, name=st.sampled_from(POLICIES), interval=st.sampled_from([1, 2, 4]),
       limit=max_steps)
def test_builtins_as_user_policies_equal_the_builtin_kernels_and_the_model(rows, capacity, name, interval, limit):
    user = simulate(rows, USER_BUILTINS[name, interval], capacity, interval, limit)
    fast = simulate(rows, name, capacity, interval, limit)
    assert user.timeline() == fast.timeline()
    np.testing.assert_array_equal(user.event_log, fast.event_log)
    np.testing.assert_array_equal(user.request_state, fast.request_state)
    np.testing.assert_array_equal(user.summary, fast.summary)
    assert_matches_model(user, rows, name, capacity, interval, limit)


@settings(max_examples=300)
@given(rows=wide_traces(), capacity=capacities, name=st.sampled_from(POLICIES), interval=st.integers(1, 5))
def test_builtin_policy_objects_run_as_their_names(rows, capacity, name, interval):
    policy = builtin(name)  # carries no interval: aging takes the replay's, as the name does
    assert policy.name == name and policy.uses_aging_interval == (name == "aging")
    for engine in ("fast", "scan"):
        got = simulate(rows, policy, capacity, interval, engine=engine)
        want = simulate(rows, name, capacity, interval, engine=engine)
        np.testing.assert_array_equal(got.event_log, want.event_log)
        np.testing.assert_array_equal(got.request_state, want.request_state)
    model = replay(rows, policy=policy, free_kv_blocks=capacity, aging_interval=interval)
    assert model.events == replay(rows, policy=name, free_kv_blocks=capacity, aging_interval=interval).events


def test_sjf_and_least_laxity_order_as_written():
    rows = [dict(request_id=i, arrival_step=0, prompt_len=2, max_new_tokens=new, priority=0, cache_hit=False,
                 required_blocks=1, deadline_step=deadline, preemptible=True)
            for i, (new, deadline) in enumerate([(5, 40), (1, None), (3, 9)])]
    sjf = simulate(rows, SJF, 10).timeline()
    assert [e["request_id"] for e in sjf[:3]] == [1, 1, 2]  # the shortest job runs to its end first
    llf = simulate(rows, LLF, 10).timeline()
    assert llf[0]["request_id"] == 2  # laxity 9 - 0 - 4 = 5 beats 40 - 0 - 6 and no deadline


def test_custom_effective_priority_drives_preemption():
    # one block: the long job holds it; the short job has the higher effective priority (-remaining)
    rows = [dict(request_id=1, arrival_step=0, prompt_len=2, max_new_tokens=6, priority=0, cache_hit=False,
                 required_blocks=1, deadline_step=None, preemptible=True),
            dict(request_id=2, arrival_step=2, prompt_len=2, max_new_tokens=1, priority=0, cache_hit=False,
                 required_blocks=1, deadline_step=None, preemptible=True)]
    events = simulate(rows, SJF, 1).timeline()
    assert events[2]["request_id"] == 2 and events[2]["preempted_request_id"] == 1
    model = replay(rows, policy=SJF, free_kv_blocks=1).events
    assert events == [{k: v for k, v in e.items() if k != "step"} for e in model]


@numba.njit
def wrapping_key(r, clock):
    # int64 wraps for prompt_len 2 (to -2**63, so -2) and comes back inside int64; Python ints do not (2).  (A
    # value returned past int64 the model refuses: tests/test_exact_stop61.py.)
    return (r.prompt_len * 2**62 // (2**62 + r.cache_hit),)  # (a divisor known when run: not folded away)


def test_the_model_calls_the_python_versions():
    policy = Policy("wrapping", key=wrapping_key, effective_priority=llf_priority)
    sim = DecodeSchedulerSim(policy=policy, free_kv_blocks=4)
    sim.enqueue(request_id=7, prompt_len=2, max_new_tokens=1)
    sim.enqueue(request_id=8, prompt_len=1, max_new_tokens=1)
    assert sim.step()["request_id"] == 8  # Python: 1 < 2
    rows = [dict(request_id=rid, arrival_step=0, prompt_len=p, max_new_tokens=1, priority=0, cache_hit=False,
                 required_blocks=1, deadline_step=None, preemptible=True) for rid, p in ((7, 2), (8, 1))]
    assert simulate(rows, policy, 4).timeline()[0]["request_id"] == 7  # compiled: -2 < 1


def test_batch_accepts_policies_and_equals_simulate():
    rows = [dict(request_id=i, arrival_step=i % 5, prompt_len=1 + i % 4, max_new_tokens=1 + (i * 3) % 5,
                 priority=i % 3, cache_hit=i % 2 == 0, required_blocks=1 + i % 3,
                 deadline_step=(i % 5) + 8 if i % 2 else None, preemptible=i % 4 != 0) for i in range(25)]
    policies = ["aging", SJF, builtin("fcfs"), LLF]
    scenarios = grid(1, policies, [3, 8], [1, 3])
    for threads in (1, 2):
        batch = simulate_batch([rows], scenarios, record_events=True, threads=threads)
        for i, sc in enumerate(scenarios):
            got = batch.result(i)
            want = simulate(rows, sc.policy, sc.free_kv_blocks, sc.aging_interval)
            assert got.policy == want.policy == str(sc.policy)
            np.testing.assert_array_equal(got.event_log, want.event_log)
            np.testing.assert_array_equal(got.request_state, want.request_state)
    with pytest.raises(UserError, match="backend 'cuda' runs the built-in policies only"):
        simulate_batch([rows], grid(1, [SJF], [3], [4]), backend="cuda")


@numba.njit
def float_key(r, clock):
    return (r.priority * 0.5,)


@numba.njit
def tuple_priority(r, clock):
    return (r.priority,)


@numba.njit
def three_args(r, clock, extra):
    return (r.priority,)


def plain_key(r, clock):
    return (r.priority,)


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="", key=sjf_key, effective_priority=sjf_priority), "non-empty name"),
    (dict(name=3, key=sjf_key, effective_priority=sjf_priority), "non-empty name"),
    (dict(name="aging", key=sjf_key, effective_priority=sjf_priority), "is a built-in's"),
    (dict(name="p", key=plain_key, effective_priority=sjf_priority), "key must be a @numba.njit function"),
    (dict(name="p", key=sjf_key, effective_priority=None), "effective_priority must be a @numba.njit"),
    (dict(name="p", key=three_args, effective_priority=sjf_priority), r"takes 3 argument"),
    (dict(name="p", key=float_key, effective_priority=sjf_priority), "must return a tuple of integers"),
    (dict(name="p", key=sjf_key, effective_priority=tuple_priority), "must return an integer"),
])
def test_policy_is_validated_at_construction(kwargs, message):
    with pytest.raises(UserError, match=message) as info:
        Policy(kwargs.pop("name"), **kwargs)
    assert "\n" not in str(info.value)


def test_a_key_that_does_not_compile_is_one_clear_line():
    @numba.njit
    def broken(r, clock):
        return (r.no_such_field,)

    with pytest.raises(UserError, match="'broken_policy': key\\(r, clock\\) failed on a sample request") as info:
        Policy("broken_policy", key=broken, effective_priority=sjf_priority)
    assert "\n" not in str(info.value)


def test_a_policy_that_raises_during_the_replay_is_one_clear_line(tmp_path, capsys):
    """The sample request passes, then the key raises on a later step: simulate, a threaded batch and the
    command all say which policy raised what, and where; the API keeps the original as __cause__."""
    from decodesched.cli import main

    (tmp_path / "raising.py").write_text(textwrap.dedent("""
        import numba
        from decodesched import Policy

        @numba.njit
        def key(r, clock):
            if r.generated_len >= 2:
                raise ValueError("no third token")
            return (r.prompt_len,)

        @numba.njit
        def priority(r, clock):
            return r.priority

        RAISES = Policy("raises_late", key=key, effective_priority=priority)
    """))
    policy = resolve_policy(f"{tmp_path / 'raising.py'}:RAISES")
    rows = [dict(request_id=i, arrival_step=0, prompt_len=1, max_new_tokens=m, priority=0, cache_hit=False,
                 required_blocks=1, deadline_step=None, preemptible=True) for i, m in enumerate([1, 5])]
    message = (r"^policy 'raises_late' raised ValueError during the replay: no third token "
               r"\(raising.py, line 8, in key\)$")
    with pytest.raises(UserError, match=message) as info:
        simulate(rows, policy, free_kv_blocks=2)
    assert isinstance(info.value.__cause__, ValueError)
    short = [dict(r, max_new_tokens=2) for r in rows]
    assert len(simulate(short, policy, free_kv_blocks=2).events["step"]) == 6  # never reaches the raise
    in_batch = r"^scenario [23] \(trace 'trace', free_kv_blocks [12]\): " + message[1:]  # (which of the batch)
    for threads in (1, 2):
        with pytest.raises(UserError, match=in_batch):
            simulate_batch([rows], grid([rows], ["fcfs", policy], [1, 2], [4]), threads=threads)
    path = tmp_path / "t.csv"
    path.write_text("request_id,arrival_step,prompt_len,max_new_tokens,priority,cache_hit,required_blocks,"
                    "deadline_step,preemptible\n0,0,1,1,0,false,1,,true\n1,0,1,5,0,false,1,,true\n")
    capsys.readouterr()
    out = tmp_path / "events.csv"
    assert main(["simulate", str(path), "--policy", f"{tmp_path / 'raising.py'}:RAISES", "--kv-blocks", "2",
                 "--events", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "compiling policy" not in line]
    assert len(err) == 1 and "raised ValueError during the replay: no third token (raising.py" in err[0]
    assert not out.exists()


def test_a_division_by_zero_in_a_policy_names_no_line_of_decodesched(tmp_path):
    """Numba reports no line for an integer division by zero in compiled code: the message then names
    none, rather than the line of decodesched that called the kernel."""
    (tmp_path / "dividing.py").write_text(textwrap.dedent("""
        import numba
        from decodesched import Policy

        @numba.njit
        def key(r, clock):
            return (1 // (r.generated_len - 2),)

        @numba.njit
        def priority(r, clock):
            return r.priority

        DIVIDES = Policy("divides_late", key=key, effective_priority=priority)
    """))
    policy = resolve_policy(f"{tmp_path / 'dividing.py'}:DIVIDES")
    rows = [dict(request_id=0, arrival_step=0, prompt_len=1, max_new_tokens=5, priority=0, cache_hit=False,
                 required_blocks=1, deadline_step=None, preemptible=True)]
    for _ in range(2):  # the first call compiles, the second runs the compiled kernel
        with pytest.raises(UserError) as info:
            simulate(rows, policy, free_kv_blocks=2)
        assert str(info.value) == ("policy 'divides_late' raised ZeroDivisionError during the replay: "
                                   "integer division by zero")
        assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_the_compile_notice_is_printed_once_per_policy(capsys):
    from decodesched.policy import _CompileNotice

    notice = _CompileNotice(lambda: None, "slow_to_compile")
    for _ in range(3):
        notice._notice()
    assert capsys.readouterr().err.count("compiling policy 'slow_to_compile'") == 1


def test_resolve_policy(tmp_path, monkeypatch):
    for name in POLICIES:
        assert resolve_policy(name) is name
    assert resolve_policy(SJF) is SJF
    (tmp_path / "my_policies.py").write_text(textwrap.dedent("""
        import numba
        from decodesched import Policy

        @numba.njit
        def key(r, clock):
            return (r.prompt_len,)

        @numba.njit
        def priority(r, clock):
            return r.priority

        SHORT_PROMPT = Policy("short_prompt", key=key, effective_priority=priority)
        NOT_A_POLICY = 42
    """))
    from_file = resolve_policy(f"{tmp_path / 'my_policies.py'}:SHORT_PROMPT")
    assert isinstance(from_file, Policy) and from_file.name == "short_prompt"
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_policy("my_policies:SHORT_PROMPT").name == "short_prompt"
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "broken.py").write_text("def (\n")
    for spec, message in [
        ("sjf", "unknown policy 'sjf'"),
        ("my_policies:NOT_A_POLICY", "is of type int, not a decodesched.Policy"),
        ("my_policies:MISSING", "has no attribute 'MISSING'"),
        ("no_such_module_xyz:P", "cannot import no_such_module_xyz"),
        (f"{tmp_path / 'absent.py'}:P", "no such file"),
        (":P", "unknown policy"),
        (f"{tmp_path / 'exits.py'}:P", r"importing .*exits.py called sys.exit\(3\)"),  # was: the process exited 3
        (f"{tmp_path / 'broken.py'}:P", r"importing .*broken.py failed: SyntaxError"),
    ]:
        with pytest.raises(UserError, match=message) as info:
            resolve_policy(spec)
        assert "\n" not in str(info.value)


def test_model_rejects_what_it_rejected_before():
    with pytest.raises(ValueError, match="policy must be one of"):
        DecodeSchedulerSim(policy="sjf")
    with pytest.raises(ValueError, match="aging_interval > 0"):
        DecodeSchedulerSim(policy=SJF, aging_interval=0)


def test_simulate_command_runs_a_policy_from_a_file(tmp_path, capsys):
    """`decodesched simulate --policy path.py:attr` replays the user's Policy: its event log equals
    the Python API's, and a bad spec is one line with exit 2."""
    from decodesched.cli import main
    from decodesched.tables_io import read_table

    write_sjf_module(tmp_path / "pol.py", "file_sjf")
    rng = np.random.default_rng(7)
    n = 40
    trace = {"request_id": np.arange(n), "arrival_step": np.sort(rng.integers(0, 30, n)),
             "prompt_len": rng.integers(1, 9, n), "max_new_tokens": rng.integers(1, 9, n),
             "priority": rng.integers(-2, 3, n), "cache_hit": rng.integers(0, 2, n).astype(bool),
             "required_blocks": rng.integers(1, 5, n), "deadline_step": [None] * n, "preemptible": [True] * n}
    from decodesched import load_trace

    path = tmp_path / "t.csv"
    lines = ["request_id,arrival_step,prompt_len,max_new_tokens,priority,cache_hit,required_blocks,deadline_step,"
             "preemptible"]
    for i in range(n):
        lines.append(",".join(str(int(trace[c][i])) for c in ("request_id", "arrival_step", "prompt_len",
                                                               "max_new_tokens", "priority"))
                     + f",{'true' if trace['cache_hit'][i] else 'false'},{int(trace['required_blocks'][i])},,true")
    path.write_text("\n".join(lines) + "\n")
    spec = f"{tmp_path / 'pol.py'}:SJF"
    events = tmp_path / "events.csv"
    assert main(["simulate", str(path), "--policy", spec, "--kv-blocks", "6", "--events", str(events)]) == 0
    assert "file_sjf" in capsys.readouterr().out
    expected = simulate(load_trace(path), resolve_policy(spec), free_kv_blocks=6).events
    got = read_table(events)
    for column in ("step", "request_id", "action", "wait_steps", "free_kv_blocks"):
        assert np.array_equal(np.asarray(got[column]), np.asarray(expected[column])), column
    assert main(["simulate", str(path), "--policy", f"{tmp_path / 'pol.py'}:key", "--kv-blocks", "6"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a decodesched.Policy" in err[0]
