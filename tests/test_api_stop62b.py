"""The public API fed NumPy times where integers go (SPEC section 5; README "Python API").

NumPy counts ``np.timedelta64`` as an integer (a subclass of ``np.signedinteger``, so a `numbers.Integral`):
``simulate(trace, free_kv_blocks=np.timedelta64(4))`` ran as 4 blocks, and ``np.timedelta64(4, "D")`` (four
days) raised int()'s own TypeError naming no argument.  Every integer argument now refuses it in one line that
names the argument and shows the value as given.
"""

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decodesched import DecodeSchedulerSim, Scenario, TraceError, grid, load_trace, simulate, simulate_batch
from decodesched.errors import UserError
from decodesched.policy import builtin

COLUMNS = dict(request_id=[7, -3], arrival_step=[0, 1], prompt_len=[3, 1], max_new_tokens=[2, 3], priority=[1, 0],
               cache_hit=[False, True], required_blocks=[2, 3], deadline_step=[None, 6], preemptible=[True, True])
TIMES = st.one_of(
    st.integers(0, 6).map(np.timedelta64), st.tuples(st.integers(0, 6), st.sampled_from(["D", "s", "ns"])).map(
        lambda a: np.timedelta64(*a)))
FEW = settings(max_examples=25, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _one_line(exc_info, name: str, value) -> None:
    text = str(exc_info.value)
    assert isinstance(exc_info.value, UserError) and "\n" not in text and len(text) < 300, text
    assert name in text and repr(value) in text, text


def _calls(value):
    """Each public integer argument given `value`: (the argument's name, a call)."""
    one = [Scenario(0, "aging", 4, 2)]
    yield "free_kv_blocks", lambda: simulate(COLUMNS, "aging", value)
    yield "aging_interval", lambda: simulate(COLUMNS, "aging", 4, value)
    yield "max_steps", lambda: simulate(COLUMNS, "aging", 4, 2, value)
    yield "free_kv_blocks", lambda: DecodeSchedulerSim("aging", value)
    yield "aging_interval", lambda: DecodeSchedulerSim("aging", 4, value)
    yield "max_steps", lambda: DecodeSchedulerSim("aging", 4).run(max_steps=value)
    for field in ("request_id", "prompt_len", "max_new_tokens", "priority", "required_blocks", "deadline_step"):
        yield field, lambda field=field: DecodeSchedulerSim("aging", 4).enqueue(**{
            "request_id": 1, "prompt_len": 2, field: value})
    for field in ("cache_hit", "preemptible"):
        yield field, lambda field=field: DecodeSchedulerSim("aging", 4).enqueue(1, 2, **{field: value})
    yield "kv_blocks", lambda: grid(1, ["aging"], [value], [2])
    yield "aging_intervals", lambda: grid(1, ["aging"], [4], [value])
    yield "free_kv_blocks", lambda: simulate_batch([COLUMNS], [Scenario(0, "aging", value, 2)])
    yield "trace index", lambda: simulate_batch([COLUMNS], [Scenario(value, "aging", 4, 2)])
    yield "threads", lambda: simulate_batch([COLUMNS], one, threads=value)
    yield "index", lambda: simulate_batch([COLUMNS], one).result(value)
    yield "aging_interval", lambda: builtin("aging", value)


@FEW
@given(TIMES)
def test_a_numpy_timedelta_is_no_integer_anywhere_and_is_named_as_given(value):
    for name, call in _calls(value):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises((TypeError, ValueError)) as exc:
                call()
        if name == "index":  # (BatchResult.result: a TypeError, as a list's index)
            assert "\n" not in str(exc.value) and repr(value) in str(exc.value), str(exc.value)
        else:
            _one_line(exc, name, value)


def test_the_integers_a_timedelta_holds_still_run_as_the_model():
    """Guard: the NumPy integers the check still takes give the model's result (verified right before the fix)."""
    want = simulate(COLUMNS, "aging", 4, 2).timeline()
    for cast in (np.int8, np.uint64, np.int64):
        assert simulate(COLUMNS, "aging", cast(4), cast(2)).timeline() == want
        sim = DecodeSchedulerSim("aging", cast(4), cast(2))
        sim.enqueue(cast(7), cast(3), cast(2), cache_hit=cast(0))
        assert sim.run(max_steps=cast(5))[-1]["action"] == "finish"


@FEW
@given(TIMES.filter(lambda t: int(t.astype("int64")) in (0, 1)))
def test_a_trace_takes_no_numpy_timedelta_as_a_flag_or_a_time_scale(value):
    for column in ("cache_hit", "preemptible"):
        with pytest.raises(TraceError) as exc:
            load_trace({**COLUMNS, column: [value, True]})
        assert column in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    with pytest.raises(TraceError) as exc:
        load_trace(COLUMNS, steps_per_second=value + np.timedelta64(1))
    assert "steps_per_second" in str(exc.value), str(exc.value)


def test_a_trace_still_takes_numpy_integer_flags_and_time_scales():
    """Guard (verified right before the fix): NumPy 0/1 flags and integer time scales load as their values."""
    t = load_trace({**COLUMNS, "cache_hit": [np.uint8(0), np.int64(1)]}, steps_per_second=np.int16(3))
    assert t.cache_hit.tolist() == [False, True] and t.steps_per_second == 3.0


def test_the_other_integer_options_refuse_a_numpy_timedelta_too(tmp_path):
    """The converter's seed and block size, a synthetic backlog's size, a report's Gantt rows and a sweep's chunk
    size had their own `(int, np.integer)` checks, which take `np.timedelta64(4)` as 4: they use `is_integer` now."""
    from decodesched import checkpoint, convert, report, synthetic

    raw = convert.RawTrace(np.array([0.0, 1.0, 2.0]), np.array([10, 20, 5]), np.array([3, 1, 7]), None)
    value = np.timedelta64(4)
    calls = [("seed", lambda: convert.to_trace(raw, load=1.0, seed=value)),
             ("block-size", lambda: convert.to_trace(raw, load=1.0, block_size=value)),
             ("n_requests", lambda: synthetic.backlog_trace(value)),
             ("gantt-requests", lambda: report.build_report(tmp_path / "r", trace=COLUMNS, gantt_requests=value)),
             ("chunk size", lambda: checkpoint.prepare([COLUMNS], [Scenario(0, "fcfs", 4)], value, None, None))]
    for name, call in calls:
        with pytest.raises(UserError) as info:
            call()
        assert name in str(info.value) and "\n" not in str(info.value), (name, str(info.value))
    assert not (tmp_path / "r").exists()
