"""The Python API under garbage input (README "Python API", "Research workflows"; SPEC section 5).

Every public entry point is fed values of the wrong type, range, dtype or shape: floats where integers go
(1.0, 1.5, nan, inf, -0.0), bools, NumPy scalars of every dtype, huge integers, strings, None, lists, odd
arrays as trace columns, hand-built and replaced traces, odd policy and engine names.  The contract: a bad
value is a ValueError or TypeError of one line that names the argument; a value the docs allow gives the
model's result; nothing warns, crashes, wraps around or changes its input; 1 and 2 threads agree.
"""

import dataclasses
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import assert_matches_model, traces

import decodesched
from decodesched import DecodeSchedulerSim, Trace, TraceError, grid, load_trace, simulate, simulate_batch
from decodesched.batch import Scenario, replicate_traces
from decodesched.errors import UserError

FEW = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ROWS = [dict(request_id=7, arrival_step=0, prompt_len=3, max_new_tokens=2, priority=1, cache_hit=False,
             required_blocks=2, deadline_step=None, preemptible=True),
        dict(request_id=-3, arrival_step=0, prompt_len=1, max_new_tokens=3, priority=0, cache_hit=True,
             required_blocks=3, deadline_step=6, preemptible=True),
        dict(request_id=12, arrival_step=2, prompt_len=2, max_new_tokens=1, priority=3, cache_hit=False,
             required_blocks=2, deadline_step=5, preemptible=False)]
COLUMNS = {k: [r[k] for r in ROWS] for k in ROWS[0]}


def one_line(exc_info, *words):
    """The error is a ValueError or TypeError of one line that names each of `words`."""
    exc = exc_info.value
    assert isinstance(exc, (ValueError, TypeError)), repr(exc)
    text = str(exc)
    assert "\n" not in text and len(text) < 300, text
    for w in words:
        assert w in text, f"{w!r} not named in {text!r}"
    return text


def replaced(**kw):
    return dataclasses.replace(load_trace(COLUMNS), **kw)


# --- 1. the scheduler settings of simulate: any value, of any type -----------------------------------------

INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
ODD = [1.0, 1.5, math.nan, math.inf, -math.inf, -0.0, True, False, np.bool_(True), np.float16(2), np.float32(1.5),
       np.float64(3.0), 2**63, -(2**63) - 1, 2**200, -1, "4", " 4", None, [4], (4,), np.array(4), np.array([4]), 4j]
EDGES = [0, 1, 2, 3, 2**61, 2**61 + 1, 2**62, 2**63 - 1, np.uint64(2**64 - 1), np.int64(-1)]
RANGES = {"free_kv_blocks": (0, 2**61), "aging_interval": (1, 2**63 - 1), "max_steps": (0, math.inf)}
DEFAULTS = {"free_kv_blocks": 4, "aging_interval": 2, "max_steps": None}


def _valid(name, value) -> bool:
    if value is None:  # (no limit; the policy's own interval, else 4)
        return name in ("max_steps", "aging_interval")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return False
    low, high = RANGES[name]
    return low <= int(value) <= high


@FEW
@given(traces(max_requests=6), st.sampled_from(["fixed_priority", "aging", "deadline", "fcfs"]),
       st.sampled_from(sorted(RANGES)), st.one_of(st.sampled_from(ODD + EDGES), st.builds(
           lambda t, v: t(v), st.sampled_from(INTS), st.integers(0, 127))), st.sampled_from(["fast", "scan"]))
def test_a_setting_of_any_type_is_the_models_result_or_one_line_naming_it(rows, policy, name, value, engine):
    config = {**DEFAULTS, name: value}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if not _valid(name, value):
            with pytest.raises((ValueError, TypeError)) as exc:
                simulate(rows, policy, engine=engine, **config)
            one_line(exc, name)
            return
        result = simulate(rows, policy, engine=engine, **config)
    want = {k: None if v is None else int(v) for k, v in config.items()}
    want["aging_interval"] = 4 if want["aging_interval"] is None else want["aging_interval"]
    assert_matches_model(result, rows, policy, want["free_kv_blocks"], want["aging_interval"], want["max_steps"])


@pytest.mark.parametrize("policy", ["AGING", " aging", "aging ", "ag\u0131ng", "\u00e4ging", "", None, 1, b"aging",
                                    ["aging"], "fifo"])
def test_an_odd_policy_name_is_one_line_naming_the_policies(policy):
    for call in (lambda: simulate(COLUMNS, policy, 4), lambda: grid(1, [policy], [4], [2]),
                 lambda: simulate_batch([COLUMNS], [Scenario(0, policy, 4, 2)])):
        with pytest.raises((ValueError, TypeError)) as exc:
            call()
        one_line(exc, "policy", "fixed_priority, aging, deadline, fcfs")


@pytest.mark.parametrize("engine", ["FAST", "Scan", " fast", "cuda", None, 1])
def test_an_odd_engine_name_is_one_line_naming_the_engines(engine):
    for call in (lambda: simulate(COLUMNS, "aging", 4, engine=engine),
                 lambda: simulate_batch([COLUMNS], grid(1, ["aging"], [4], [2]), engine=engine)):
        with pytest.raises(UserError) as exc:
            call()
        one_line(exc, "engine", "fast, scan")


@pytest.mark.parametrize("threads", [0, -1, 10**6, 1.0, True, "2", 2**63])
def test_threads_out_of_range_is_one_line_naming_the_range(threads):
    with pytest.raises(UserError) as exc:
        simulate_batch([COLUMNS], grid(1, ["aging"], [4], [2]), threads=threads)
    one_line(exc, "threads", "from 1 to")


# --- 2. batches: each scenario as simulate alone, 1 and 2 threads identical -----------------------------------

@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(traces(max_requests=6, wide_priorities=True), min_size=1, max_size=3), st.data())
def test_one_and_two_threads_give_identical_results_equal_to_simulate_alone(rows, data):
    kv = data.draw(st.sampled_from([0, 1, 3, 2**61, np.uint64(2**61), np.int8(5)]))
    interval = data.draw(st.sampled_from([1, 3, 2**62, np.uint8(2)]))
    max_steps = data.draw(st.sampled_from([None, 0, 4, 2**200, np.uint64(2**64 - 1)]))
    engine = data.draw(st.sampled_from(["fast", "scan"]))
    intervals = [interval, 1] if interval != 1 else [1]  # (a value twice is refused)
    scenarios = grid(len(rows), ["fixed_priority", "aging", "deadline", "fcfs"], [kv, 2], intervals, max_steps)
    one, two = (simulate_batch(rows, scenarios, threads=n, record_events=True, engine=engine) for n in (1, 2))
    for i, sc in enumerate(scenarios):
        a, b = one.result(i), two.result(i)
        assert a.timeline() == b.timeline()
        assert np.array_equal(a.request_state, b.request_state) and np.array_equal(a.summary, b.summary)
        alone = simulate(rows[sc.trace], sc.policy, sc.free_kv_blocks, sc.aging_interval, sc.max_steps, engine=engine)
        assert alone.timeline() == a.timeline() and np.array_equal(alone.request_state, a.request_state)
    assert one.rows() == two.rows() or all(  # (NaN != NaN: compare the rows as text)
        repr(x) == repr(y) for x, y in zip(one.rows(), two.rows()))


# --- 3. trace columns of every container, dtype and shape ----------------------------------------------------

def _same_values(name):
    """Containers and dtypes that hold the column's own values: the trace loads as if given plain lists."""
    v = COLUMNS[name]
    if name in ("cache_hit", "preemptible"):
        ints = [int(x) for x in v]
        return [np.array(v), np.array(v)[::-1][::-1], np.array(v, dtype=object), [np.bool_(x) for x in v],
                np.array(ints, dtype=">i2"), np.array(ints, dtype=np.uint64), ["true" if x else "False" for x in v],
                tuple(v)]
    if name == "deadline_step":
        return [np.ma.MaskedArray([0 if x is None else x for x in v], mask=[x is None for x in v]),
                np.array([math.nan if x is None else x for x in v], dtype=np.float32), np.array(v, dtype=object),
                [None if x is None else str(x) for x in v], tuple(v)]
    out = [np.array(v, dtype=np.dtype(t).newbyteorder(">")) for t in (np.int16, np.int32, np.int64)]
    out += [np.array(v, dtype=t) for t in INTS if np.iinfo(t).min <= min(v) and max(v) <= np.iinfo(t).max]
    out += [np.repeat(np.array(v), 2)[::2], np.array(v, dtype=object), np.array(v, dtype=np.float16),
            [np.int8(x) for x in v], [float(x) for x in v], [str(x) for x in v], np.array([str(x) for x in v]),
            tuple(v)]
    return out


def _bad_values(name):
    """Containers, shapes and cells no column takes (NaN and None are no deadline: a good deadline cell)."""
    v = list(COLUMNS[name])
    cells = [1.5, math.inf, 2**63, -(2**63) - 1, 2**200, "x", "1.0", b"1", [1], 1 + 0j, np.float64(0.5)]
    cells += [2, -1] if name in ("cache_hit", "preemptible") else [True, np.bool_(False)]
    cells += [] if name == "deadline_step" else [None, math.nan]
    out = [v[:1] + [c] + v[2:] for c in cells]
    out += [np.array(v[:2]), np.array([v]), np.array(v[0]), None, "123", 5, set(v), {0: v[0]}, iter(v)]
    return out


@FEW
@given(st.sampled_from(list(COLUMNS)), st.data())
def test_a_column_of_any_container_loads_as_its_values_or_is_one_line_naming_it(name, data):
    good = load_trace(COLUMNS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = data.draw(st.sampled_from(_same_values(name)))
        t = load_trace({**COLUMNS, name: value})
        for c in COLUMNS:
            assert list(t.columns()[c]) == list(good.columns()[c]), c
        bad = data.draw(st.sampled_from(_bad_values(name)))
        with pytest.raises(TraceError) as exc:
            load_trace({**COLUMNS, name: bad})
        one_line(exc, name)


@FEW
@given(st.sampled_from([*COLUMNS, "has_deadline"]), st.data())
def test_a_replaced_column_replays_as_its_values_or_is_one_line_naming_it(name, data):
    good = load_trace(COLUMNS)
    want = simulate(good, "deadline", 4).timeline()
    own = getattr(good, name)
    same = [own.tolist(), own.copy(), np.repeat(own, 2)[::2], own.astype(own.dtype.newbyteorder(">"))]
    if name not in ("has_deadline", "deadline_step"):
        same += _same_values(name)
    bad = _bad_values(name) if name != "has_deadline" else [
        np.array([0, 1, 1]), [0, 1, 1], np.array([False, True]), np.array([[False, True, True]]), None, "x"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert simulate(dataclasses.replace(good, **{name: data.draw(st.sampled_from(same))}),
                        "deadline", 4).timeline() == want
        with pytest.raises(TraceError) as exc:
            simulate(dataclasses.replace(good, **{name: data.draw(st.sampled_from(bad))}), "deadline", 4)
        one_line(exc, name)


@pytest.mark.parametrize("empty", [{k: [] for k in COLUMNS}, {k: np.array([], np.int64) for k in COLUMNS}, [], {}])
def test_an_empty_trace_is_one_line_everywhere(empty):
    for call in (lambda: load_trace(empty), lambda: simulate(empty, "aging", 4),
                 lambda: simulate_batch([empty], grid(1, ["aging"], [4], [2])),
                 lambda: simulate(load_trace(COLUMNS).subset([]), "aging", 4)):
        with pytest.raises(TraceError) as exc:
            call()
        one_line(exc)


def test_loading_and_replaying_change_no_input():
    cols = {k: np.array(v) if k != "deadline_step" else np.array(v, dtype=object) for k, v in COLUMNS.items()}
    lists = {k: list(v) for k, v in COLUMNS.items()}
    before = {k: (v.copy(), v.flags.writeable) for k, v in cols.items()}
    scenarios = grid(2, ["aging", "deadline"], [2, 5], [1, 3])
    kept = list(scenarios)
    simulate(cols, "aging", 4)
    simulate_batch([cols, lists], scenarios, threads=2)
    replicate_traces([cols], 2)
    for k, (copy, writeable) in before.items():
        assert cols[k].flags.writeable == writeable and list(cols[k]) == list(copy), k
    assert lists == COLUMNS and scenarios == kept


# --- 4. the fixes: each test failed before its fix ------------------------------------------------------------

@pytest.mark.parametrize("scale", [2**2000, -(2**2000)])
def test_a_time_scale_past_any_float_is_one_line_not_an_overflow(scale):
    """Was OverflowError ('int too large to convert to float'), from load_trace and from a replaced trace."""
    for call in (lambda: load_trace(COLUMNS, steps_per_second=scale),
                 lambda: simulate(replaced(steps_per_second=scale), "aging", 4)):
        with pytest.raises(TraceError) as exc:
            call()
        one_line(exc, "steps_per_second", "positive number")


def test_a_time_scale_is_kept_as_a_float():
    """A NumPy float16 time scale was kept as float16."""
    t = load_trace(COLUMNS, steps_per_second=np.float16(2.5))
    assert type(t.steps_per_second) is float and t.steps_per_second == 2.5


@pytest.mark.parametrize("name", [0, 1, b"x", ["a"], 1.5])
def test_a_trace_name_that_is_no_string_is_one_line(name):
    """A name of 0 became "trace", one of 1 or b"x" was kept and went into the tables' trace column."""
    for call in (lambda: load_trace(COLUMNS, name=name), lambda: simulate(replaced(name=name), "fcfs", 4),
                 lambda: simulate_batch([replaced(name=name)], grid(1, ["fcfs"], [4], [2]))):
        with pytest.raises(TraceError) as exc:
            call()
        one_line(exc, "name must be a string")
    assert simulate(replaced(name=np.str_("mine")), "fcfs", 4).trace.name == "mine"


def test_columns_of_different_lengths_name_the_short_one():
    """Was '<arrays>: columns have different lengths ([2, 3])', naming no column."""
    with pytest.raises(TraceError) as exc:
        load_trace({**COLUMNS, "priority": [1, 2]})
    one_line(exc, "priority has 2 values", "the others 3")


def _by_hand(**kw):
    """A Trace built with its constructor from lists (no load_trace)."""
    cols = {k: v for k, v in COLUMNS.items() if k != "deadline_step"}
    deadline = [0 if d is None else d for d in COLUMNS["deadline_step"]]
    has = [d is not None for d in COLUMNS["deadline_step"]]
    return Trace(**{**cols, "deadline_step": deadline, "has_deadline": has, **kw})


def test_a_trace_built_by_hand_from_lists_has_a_length_rows_and_a_csv(tmp_path):
    """len(), rows() and to_csv() raised AttributeError ('list' object has no attribute 'shape')."""
    t = _by_hand()
    assert len(t) == 3 and t.rows() == load_trace(COLUMNS).rows()
    t.to_csv(tmp_path / "t.csv")
    assert load_trace(tmp_path / "t.csv").rows() == t.rows()
    assert simulate(t.subset([2, 0]), "deadline", 4).timeline() == simulate(
        load_trace(COLUMNS).subset([2, 0]), "deadline", 4).timeline()


def test_a_trace_built_by_hand_with_a_short_column_is_refused_even_in_a_subset():
    """A subset of the rows every column has made a valid trace of mismatched columns, which replayed."""
    t = _by_hand(priority=[1, 0])
    for call in (lambda: t.subset([0, 1]), lambda: simulate(t, "aging", 4), t.rows):
        with pytest.raises(TraceError) as exc:
            call()
        one_line(exc, "priority has 2 values")


def test_an_invalid_replaced_trace_is_not_written_to_csv(tmp_path):
    """to_csv wrote a trace that load_trace then refused (a prompt_len of -1)."""
    with pytest.raises(TraceError) as exc:
        replaced(prompt_len=np.array([-1, 2, 3])).to_csv(tmp_path / "t.csv")
    one_line(exc, "prompt_len", "must be positive")
    assert not (tmp_path / "t.csv").exists()


def test_a_deadline_marked_but_missing_in_a_hand_built_trace_is_refused():
    """has_deadline True over a None or NaN deadline was silently no deadline."""
    for missing in (None, math.nan):
        t = _by_hand(deadline_step=[0, 6, missing], has_deadline=[False, True, True])
        with pytest.raises(TraceError) as exc:
            simulate(t, "deadline", 4)
        one_line(exc, "row 3", "deadline_step", "missing value")


def test_a_two_dimensional_deadline_column_is_named_not_has_deadline():
    """Was 'has_deadline must be a boolean array as long as deadline_step' for a 2-D deadline_step."""
    with pytest.raises(TraceError) as exc:
        simulate(replaced(deadline_step=np.zeros((1, 3), np.int64)), "deadline", 4)
    one_line(exc, "column deadline_step", "1-D")


def test_a_file_name_with_a_nul_character_is_one_line(tmp_path):
    """Was ValueError('embedded null byte'), naming no file, from every reader and writer."""
    bad = str(tmp_path / "a\0b.csv")
    result = simulate(COLUMNS, "aging", 4)
    for call in (lambda: load_trace(bad), lambda: simulate(bad), lambda: result.write_events(bad),
                 lambda: result.write_requests(bad), lambda: load_trace(COLUMNS).to_csv(bad),
                 lambda: decodesched.checkpoint.run_local([COLUMNS], grid(1, ["aging"], [4], [2]),
                                                          checkpoint_path=bad + ".jsonl")):
        with pytest.raises(UserError) as exc:
            call()
        one_line(exc, "NUL character", "a\\x00b.csv")


@pytest.mark.parametrize("path", [None, 1, b"x.csv", ["x.csv"]])
def test_an_output_that_is_no_file_name_is_one_line_naming_the_argument(path):
    """Was TypeError('expected str, bytes or os.PathLike object, not NoneType'), from deep inside."""
    result = simulate(COLUMNS, "aging", 4)
    for call, name in ((lambda: result.write_events(path), "path"), (lambda: result.write_requests(path), "path"),
                       (lambda: load_trace(COLUMNS).to_csv(path), "path"),
                       (lambda: decodesched.checkpoint.run_local([COLUMNS], grid(1, ["aging"], [4], [2]),
                                                                 checkpoint_path=path or 1), "checkpoint_path")):
        with pytest.raises(TypeError) as exc:
            call()
        one_line(exc, f"{name} must be a path")


@pytest.mark.parametrize("args, words", [
    ((1, ["AGING"], [4], [2]), ["grid: unknown policy 'AGING'"]),
    ((1, ["aging"], [-1], [2]), ["grid: kv_blocks must be >= 0, got -1"]),
    ((1, ["aging"], [2**61 + 1], [2]), ["grid: kv_blocks must be <= 2**61"]),
    ((1, ["fcfs"], [4], [0]), ["grid: aging_intervals must be > 0, got 0"]),
    ((1, ["aging"], [4], [2**63]), ["grid: aging_intervals must be <= 2**63 - 1"]),
    ((1, ["aging"], [4], [2], -1), ["grid: max_steps must be >= 0"]),
    ((1, ["aging"], [4], [2], 1.5), ["grid: max_steps must be an integer or None, got 1.5"]),
    ((-1, ["aging"], [4], [2]), ["grid: traces must be", "got -1"]),
    ((1.0, ["aging"], [4], [2]), ["grid: traces must be", "got 1.0"]),
    ((True, ["aging"], [4], [2]), ["grid: traces must be", "got True"]),
    ((None, ["aging"], [4], [2]), ["grid: traces must be", "got None"]),
])
def test_grid_refuses_what_simulate_would_refuse_when_it_is_called(args, words):
    """The grid made these scenarios (or a TypeError: 'float' object is not iterable); only simulate_batch
    refused them, later, as 'scenario 0: ...'."""
    with pytest.raises(UserError) as exc:
        grid(*args)
    one_line(exc, *words)


@pytest.mark.parametrize("scenarios, traces_, words", [
    (None, [COLUMNS], ["scenarios must be a list of Scenario", "got None"]),
    (Scenario(0, "aging", 4, 2), [COLUMNS], ["one Scenario", "[scenario]"]),
    (5, [COLUMNS], ["scenarios must be a list of Scenario", "got 5"]),
    ([Scenario(0, "aging", 4, 2)], None, ["traces must be a trace or a list of traces", "got None"]),
    ([Scenario(0, "aging", 4, 2)], 3, ["traces must be a trace or a list of traces", "got 3"]),
])
def test_simulate_batch_names_scenarios_or_traces_that_are_no_list(scenarios, traces_, words):
    """Was TypeError: "'NoneType' object is not iterable" ("'Scenario' object ..."), naming no argument."""
    for call in (lambda: simulate_batch(traces_, scenarios),
                 lambda: decodesched.checkpoint.run_local(traces_, scenarios)):
        with pytest.raises(UserError) as exc:
            call()
        one_line(exc, *words)


def test_replicates_as_a_small_numpy_integer_do_not_wrap_the_trace_indices():
    """grid(300 traces, replicates=np.uint8(2)) computed the indices in uint8: trace 128's wrapped around to 0
    (a RuntimeWarning, then the wrong trace replayed); replicate_traces(.., np.int8(2)) raised OverflowError."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scenarios = grid(300, ["fcfs"], [4], [2], replicates=np.uint8(2))
        assert [s.trace for s in scenarios] == list(range(600))
        assert len(replicate_traces([COLUMNS], np.int8(2))) == 2


@pytest.mark.parametrize("rule", ["x", 1, ["seed", 1]])
def test_replicate_rules_that_are_no_dict_are_one_line(rule):
    """Was ValueError('dictionary update sequence element #0 ...') or TypeError("'int' object is not iterable")."""
    with pytest.raises(UserError) as exc:
        replicate_traces([COLUMNS], 2, [rule])
    one_line(exc, "replicate_traces: each rules entry is a dict")


class _Checked(Exception):
    """Raised by `before_replay`: every input of the report was accepted."""


def test_a_report_takes_a_loaded_trace_as_it_takes_a_path(tmp_path):
    """build_report(trace=Trace) raised TypeError('expected str, bytes or os.PathLike object, not Trace')."""
    from decodesched.report import build_report

    def before_replay():
        raise _Checked

    (tmp_path / "out").mkdir()  # (an existing folder: its files are checked against the inputs)
    for trace in (load_trace(COLUMNS), COLUMNS):
        with pytest.raises(_Checked):
            build_report(tmp_path / "out", trace=trace, kv_blocks=4, before_replay=before_replay)


@pytest.mark.parametrize("kw, words", [
    (dict(gantt_requests=1.5), ["--gantt-requests must be from 1 to 2000", "got 1.5"]),
    (dict(gantt_requests=None), ["--gantt-requests", "got None"]),
    (dict(gantt_requests="3"), ["--gantt-requests", "got '3'"]),
    (dict(gantt_requests=True), ["--gantt-requests", "got True"]),
    (dict(policies="aging"), ["policies must be a list of policies", "got 'aging'"]),
])
def test_report_options_of_the_wrong_type_are_one_line(tmp_path, kw, words):
    """gantt_requests 1.5 was a TypeError from a slice, None or "3" one from a comparison, True was taken as 1;
    policies="aging" read as the policies 'a', 'g', ...: "policy 'g' is given twice"."""
    from decodesched.report import build_report

    with pytest.raises(UserError) as exc:
        build_report(tmp_path / "out", trace=COLUMNS, kv_blocks=4, **kw)
    one_line(exc, *words)
    assert not (tmp_path / "out").exists()


def test_the_model_takes_numpy_integers_as_the_numbers_they_hold():
    """An int8 priority of 127 that waited one step under aging wrapped around to -128 in the model (a
    RuntimeWarning, then another schedule than simulate's and than the model's with Python ints)."""
    def run(cast):
        sim = DecodeSchedulerSim("aging", cast(1), aging_interval=cast(1))
        sim.enqueue(cast(1), cast(1), cast(3), priority=cast(127), required_blocks=cast(1))
        sim.enqueue(cast(2), cast(1), cast(3), priority=cast(126), cache_hit=True, required_blocks=cast(1))
        return sim.run(20)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = run(int)
        for t in (np.int8, np.uint8, np.int16, np.int64, np.uint64):
            assert run(t) == plain, t.__name__
    rows = [dict(request_id=1, arrival_step=0, prompt_len=1, max_new_tokens=3, priority=127, cache_hit=False,
                 required_blocks=1, deadline_step=None, preemptible=True),
            dict(request_id=2, arrival_step=0, prompt_len=1, max_new_tokens=3, priority=126, cache_hit=True,
                 required_blocks=1, deadline_step=None, preemptible=True)]
    assert simulate(rows, "aging", 1, 1).timeline() == plain


def test_a_name_or_time_scale_given_with_a_loaded_trace_is_applied_not_ignored():
    """load_trace(trace, name=..., steps_per_second=...) returned the trace unchanged: no seconds, old name."""
    t = load_trace(COLUMNS)
    named = load_trace(t, name="mine", steps_per_second=np.float16(2))
    assert (named.name, named.steps_per_second, t.name, t.steps_per_second) == ("mine", 2.0, "trace", None)
    assert simulate(named, "fcfs", 4).metrics["steps_per_second"] == 2.0 and load_trace(t) is t
    for kw, words in ((dict(steps_per_second=0), "steps_per_second must be a positive number"),
                      (dict(name=3), "name must be a string")):
        with pytest.raises(TraceError) as exc:
            load_trace(t, **kw)
        one_line(exc, words)


def test_traces_compare_by_their_columns_time_scale_and_name():
    """trace == other raised ValueError ('The truth value of an array with more than one element is ambiguous')."""
    t = load_trace(COLUMNS)
    assert t == load_trace(COLUMNS) and t == _by_hand() and t != 1
    assert t != replaced(name="other") and t != replaced(priority=np.array([1, 0, 2]))
    assert t != load_trace(t, steps_per_second=2)


def test_a_replaced_deadline_column_with_none_or_python_ints_is_checked_not_a_crash():
    """dataclasses.replace(trace, deadline_step=[None, 6, 8]) (or an object array) raised AttributeError
    ("'NoneType' object has no attribute 'item'") while its message was being written."""
    for deadline, words in (([4, None, 5], ["row 1", "4 on a row whose has_deadline is False"]),
                            (np.array([7, 6, 5], dtype=object), ["row 1", "7 on a row whose has_deadline is False"]),
                            ([None, None, 5], ["row 2", "missing value on a row whose has_deadline is True"])):
        with pytest.raises(TraceError) as exc:
            simulate(replaced(deadline_step=deadline), "deadline", 4)
        one_line(exc, "column deadline_step", *words)
    later = replaced(deadline_step=[None, 6, 8])  # (None where has_deadline is False: no deadline, as it was)
    assert simulate(later, "deadline", 4).timeline() == simulate({**COLUMNS, "deadline_step": [None, 6, 8]},
                                                                 "deadline", 4).timeline()


def _raw(seconds=(0.0, 1.0, 2.0), prompt=(10, 20, 5), output=(3, 0, 7), hit=None):
    from decodesched.convert import RawTrace

    return RawTrace(np.array(seconds), np.array(prompt), np.array(output), hit)


@pytest.mark.parametrize("kw, words", [
    (dict(load=True), ["--load must be a positive number", "got True"]),
    (dict(load=2**2000), ["--load must be a positive number"]),
    (dict(steps_per_second=2**2000), ["--steps-per-second must be a positive number"]),
    (dict(steps_per_second=np.bool_(True)), ["--steps-per-second must be a positive number", "got True"]),
])
def test_a_conversion_scale_that_is_a_bool_or_past_any_float_is_one_line(kw, words):
    """load=True converted at load 1; 2**2000 raised OverflowError ('int too large to convert to float')."""
    from decodesched.convert import to_trace

    with pytest.raises(UserError) as exc:
        to_trace(_raw(), **kw)
    one_line(exc, *words)


def test_a_conversion_takes_numpy_scales_and_any_block_size():
    """load=np.float16(1) was refused as no number; block_size=2**63 raised OverflowError (C long)."""
    from decodesched.convert import to_trace

    assert to_trace(_raw(), load=np.float16(1)) == to_trace(_raw(), load=1.0)
    huge = to_trace(_raw(), load=1, block_size=2**63)
    assert huge.required_blocks.tolist() == [1, 1, 1]
    assert huge == dataclasses.replace(to_trace(_raw(), load=1, block_size=2**41), name=huge.name)


@pytest.mark.parametrize("raw, words", [
    (dict(prompt=(10, 2.5, 5)), ["RawTrace.prompt_tokens must hold whole numbers"]),
    (dict(prompt=(10, -1, 5)), ["RawTrace.prompt_tokens must hold whole numbers from 0 to 2**40"]),
    (dict(output=(3, 2**41, 7)), ["RawTrace.output_tokens must hold whole numbers from 0 to 2**40"]),
    (dict(seconds=(0.0, math.nan, 2.0)), ["RawTrace.arrival_seconds must hold finite numbers >= 0"]),
    (dict(output=(3, 0)), ["RawTrace.output_tokens: expected a 1-D array of 3 values"]),
    (dict(hit=np.array([1, 0, 1])), ["RawTrace.cache_hit must hold true/false values"]),
    (dict(seconds=5.0), ["RawTrace.arrival_seconds: expected a 1-D array, got one of shape ()"]),
])
def test_a_raw_trace_built_by_hand_is_checked_before_its_conversion(raw, words):
    """A prompt of 2.5 tokens became 2 and one of -1 became 1 (silently); a NaN arrival said the load was out
    of range ('it gives nan steps per second'); an int cache_hit column was taken as it came."""
    from decodesched.convert import to_trace

    with pytest.raises(UserError) as exc:
        to_trace(_raw(**raw), load=1)
    one_line(exc, *words)


def test_a_raw_trace_of_lists_converts_as_one_of_arrays():
    """len(RawTrace of lists) raised AttributeError ('list' object has no attribute 'shape')."""
    from decodesched.convert import RawTrace, to_trace

    lists = RawTrace([0.0, 1.0, 2.0], [10, 20, 5], [3, 0, 7], [True, False, True])
    assert to_trace(lists, load=1) == to_trace(_raw(hit=np.array([True, False, True])), load=1)


def test_a_report_folder_that_is_empty_or_no_path_is_one_line(tmp_path, monkeypatch):
    """out_dir "" was the current folder (whose index.html and figures the report replaces); None, 1 or a NUL
    character were TypeError/ValueError from pathlib, naming no argument; so was results=1."""
    from decodesched.report import build_report

    (tmp_path / "in").mkdir()
    (tmp_path / "cwd").mkdir()
    load_trace(COLUMNS).to_csv(tmp_path / "in" / "t.csv")
    monkeypatch.chdir(tmp_path / "cwd")
    for out, words in (("", ["'': not a folder name"]), (" ", ["not a folder name"]),
                       ("a\0b", ["NUL character"]), (None, ["out_dir must be a path", "got None"]),
                       (1, ["out_dir must be a path", "got 1"])):
        with pytest.raises((UserError, TypeError)) as exc:
            build_report(out, trace=tmp_path / "in" / "t.csv", kv_blocks=4)
        one_line(exc, *words)
    with pytest.raises(TypeError) as exc:
        build_report(tmp_path / "out", results=1)
    one_line(exc, "results must be a path")
    assert list((tmp_path / "cwd").iterdir()) == [] and not (tmp_path / "out").exists()


def test_a_local_sweep_in_chunks_of_a_small_numpy_integer_runs_every_scenario():
    """run_local(.., chunk_size=np.int8(100)) over 300 scenarios computed the chunk bounds in int8: 100 + 100
    overflowed (a RuntimeWarning, then OverflowError 'Python integer 200 out of bounds for int8')."""
    from decodesched.checkpoint import run_local

    scenarios = grid(1, ["fcfs"], list(range(1, 301)), [2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = run_local([COLUMNS], scenarios, chunk_size=np.int8(100))
    assert rows == run_local([COLUMNS], scenarios, chunk_size=300)


@pytest.mark.parametrize("kw, words", [
    (dict(keep_checkpoint="no"), ["keep_checkpoint must be True or False", "got 'no'"]),
    (dict(keep_checkpoint=None), ["keep_checkpoint must be True or False", "got None"]),
    (dict(retries=-1), ["retries must be an integer >= 0", "got -1"]),
    (dict(retries=1.5), ["retries must be an integer >= 0", "got 1.5"]),
    (dict(quiet="yes"), ["quiet must be True or False", "got 'yes'"]),
])
def test_sweep_runner_flags_and_retries_are_checked_before_any_work(kw, words):
    """keep_checkpoint="no" kept the checkpoint (a string is truthy); retries=-1 or 1.5 and quiet="yes" went to
    Dask unchecked."""
    from decodesched import distributed
    from decodesched.checkpoint import run_local

    pytest.importorskip("distributed")
    calls = [lambda: distributed.run_sweep([COLUMNS], grid(1, ["aging"], [4], [2]), "tcp://127.0.0.1:1", **kw)]
    if "keep_checkpoint" in kw:
        calls.append(lambda: run_local([COLUMNS], grid(1, ["aging"], [4], [2]), **kw))
    for call in calls:
        with pytest.raises(UserError) as exc:
            call()
        one_line(exc, *words)


@pytest.mark.parametrize("deadline", [[None, [1], 5], {5, None, 6}, [None, 6, np.array([5, 5])]])
def test_a_replaced_deadline_column_of_odd_cells_is_one_line_naming_it(deadline):
    """A list among the deadlines raised NumPy's ValueError ('setting an array element with a sequence ...
    inhomogeneous shape'); a set was taken for a 0-d array."""
    with pytest.raises(TraceError) as exc:
        simulate(replaced(deadline_step=deadline), "deadline", 4)
    one_line(exc, "column deadline_step")
