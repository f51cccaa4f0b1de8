"""Stop 57, a researcher's Python API: the model class given a float, NaN, bool or string where the seed means an
integer; `Trace.subset` given rows out of range; `Policy.uses_aging_interval` set by hand; a sweep's progress and a
policy's compile notice in Jupyter; results whose tables were edited in place; results and traces through pickle,
copy and a process pool; traces built from arrays that are not plain (strided, read-only, big-endian, edited after)."""

import copy
import math
import multiprocessing
import pickle
import sys
import types
from concurrent.futures import ProcessPoolExecutor

import numba
import numpy as np
import pytest
from hypothesis import given, strategies as st

from decodesched import DecodeSchedulerSim, Policy, grid, load_trace, simulate, simulate_batch
from decodesched import policy as policy_module
from decodesched.errors import UserError
from decodesched.policy import builtin
from test_research_stop56 import _key, _priority  # (an SJF policy's functions: one definition)
from test_research_walk import ROWS  # (the small trace with every field: one definition)

ENQUEUE = {"request_id": 1, "prompt_len": 3, "max_new_tokens": 2}
NOT_INTS = [float("nan"), float("inf"), -float("inf"), 3.0, 2.5, True, False, "3", None, [3], np.float64(3.0),
            np.array(3.0), np.bool_(True)]


def _one_line(exc_info, *words):
    text = str(exc_info.value)
    assert "\n" not in text and all(w in text for w in words), text


@pytest.mark.parametrize("value", NOT_INTS, ids=repr)
@pytest.mark.parametrize("name", ["request_id", "prompt_len", "max_new_tokens", "priority", "required_blocks"])
def test_the_model_refuses_what_is_no_integer_where_the_seed_means_one(name, value):
    sim = DecodeSchedulerSim(policy="aging", free_kv_blocks=4)
    with pytest.raises(UserError) as exc:  # (before: taken; prompt_len=nan ran, and showed in the events)
        sim.enqueue(**{**ENQUEUE, name: value})
    _one_line(exc, name, "must be an integer")
    assert sim.queue == [] and sim.run() == []


@pytest.mark.parametrize("value", [v for v in NOT_INTS if v is not None], ids=repr)
@pytest.mark.parametrize("name", ["free_kv_blocks", "aging_interval"])
def test_the_model_refuses_settings_that_are_no_integer(name, value):
    with pytest.raises(UserError) as exc:  # (before: free_kv_blocks=nan admitted nothing, inf everything)
        DecodeSchedulerSim(policy="aging", **{name: value})
    _one_line(exc, name, "must be an integer")


@pytest.mark.parametrize("value", [float("nan"), 4.0, True, "4"], ids=repr)
def test_the_model_refuses_a_deadline_or_step_limit_that_is_no_integer(value):
    sim = DecodeSchedulerSim(policy="deadline", free_kv_blocks=4)
    with pytest.raises(UserError) as exc:
        sim.enqueue(**ENQUEUE, deadline_step=value)
    _one_line(exc, "deadline_step", "integer or None")
    sim.enqueue(**ENQUEUE)
    with pytest.raises(UserError) as exc:  # (before: run(2.5) ran 3 steps, run(nan) none, without a word)
        sim.run(max_steps=value)
    _one_line(exc, "max_steps")
    assert sim.timeline == [] and sim.clock == 0


@pytest.mark.parametrize("value", ["no", 2, None, 0.0], ids=repr)
@pytest.mark.parametrize("name", ["cache_hit", "preemptible"])
def test_the_model_refuses_a_flag_that_is_no_true_or_false(name, value):
    sim = DecodeSchedulerSim(policy="aging", free_kv_blocks=4)
    with pytest.raises(UserError) as exc:  # (before: "no" was truthy, so preemptible="no" was preemptible)
        sim.enqueue(**ENQUEUE, **{name: value})
    _one_line(exc, name, "True or False")


@given(value=st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([np.int8(-3), np.uint64(2**63), np.int64(7)]),
                       st.booleans(), st.floats(), st.text(max_size=3), st.none()),
       name=st.sampled_from(["request_id", "prompt_len", "max_new_tokens", "priority", "required_blocks"]),
       flag=st.sampled_from([True, False, 1, 0, np.bool_(True)]))
def test_the_model_takes_an_integer_as_the_python_int_or_refuses_it_in_one_line(value, name, flag):
    sim = DecodeSchedulerSim(policy="aging", free_kv_blocks=2**70)
    try:
        sim.enqueue(**{**ENQUEUE, name: value}, cache_hit=flag)
    except ValueError as exc:
        assert "\n" not in str(exc) and (name in str(exc) or "positive" in str(exc)), exc
        assert sim.queue == []
        return
    assert isinstance(value, (int, np.integer)) and not isinstance(value, bool), value
    req = sim.queue[0]
    assert getattr(req, name) == int(value) and type(getattr(req, name)) is int and req.cache_hit is bool(flag)


def test_the_model_still_takes_numpy_integers_and_flags_and_runs_as_with_python_ones():
    def run(cast, flag):
        sim = DecodeSchedulerSim(policy="aging", free_kv_blocks=cast(3), aging_interval=cast(2))
        for i, p in enumerate([0, 2, 1]):
            sim.enqueue(cast(i), cast(2), cast(2), priority=cast(p), cache_hit=flag(i == 1), required_blocks=cast(2),
                        deadline_step=cast(9), preemptible=flag(i != 2))
        return sim.run(max_steps=cast(50))

    assert run(np.int32, np.bool_) == run(int, bool) == run(np.int64, lambda b: int(b))


def test_a_subset_out_of_range_is_one_index_error_naming_the_size():
    trace = load_trace(ROWS)
    for rows in ([10], [0, -5], np.array([4])):
        with pytest.raises(IndexError) as exc:  # (before: NumPy's "index 10 is out of bounds for axis 0 with size 4")
            trace.subset(rows)
        _one_line(exc, "out of range", "4 rows", "0 to 3")
    assert trace.subset([3, -4]).request_id.tolist() == [4, 1]


@pytest.mark.parametrize("rows", [slice(None, None, 0), slice("a", None), [[0], [1, 2]]], ids=repr)
def test_a_subset_of_a_bad_slice_or_ragged_rows_is_one_index_error(rows):
    with pytest.raises(IndexError) as exc:  # (before: a ValueError or TypeError from NumPy)
        load_trace(ROWS).subset(rows)
    _one_line(exc, "rows must be")


def test_uses_aging_interval_is_derived_and_read_only():
    sjf = Policy("sjf57", key=_key, effective_priority=_priority)
    aging = builtin("aging")
    assert (sjf.uses_aging_interval, aging.uses_aging_interval, builtin("fcfs").uses_aging_interval) == (
        False, True, False)
    for p in (sjf, aging):
        with pytest.raises(AttributeError):  # (before: set by hand, a grid ran sjf once per interval)
            p.uses_aging_interval = not p.uses_aging_interval
    assert len(grid(1, [sjf, aging], [4], [1, 2, 3])) == 1 + 3
    assert pickle.loads(pickle.dumps(builtin("aging", 8))).uses_aging_interval


@pytest.fixture
def jupyter(monkeypatch):
    """A Jupyter kernel as decodesched sees one (IPython loaded, its shell with a kernel), whose displays are
    recorded; no kernel is started."""
    shown = []

    class Handle:
        def update(self, data, raw=False):
            shown.append(data["text/plain"])

    def display(data, raw=False, display_id=False):
        shown.append(data["text/plain"])
        return Handle()

    shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    monkeypatch.setitem(sys.modules, "IPython.display", types.SimpleNamespace(display=display))
    return shown


def test_progress_none_in_jupyter_is_quiet_and_true_the_bar_in_one_display(jupyter, capfd, monkeypatch):
    from decodesched._io import Progress

    from decodesched.batch import progress_bar

    monkeypatch.setattr(Progress, "LINE_SECONDS", 0.0)  # (a long sweep: a plain line due at every tenth)
    with progress_bar(10, "sweep", None) as bar:  # (as simulate_batch(progress=None) advances it, scenario by scenario)
        for _ in range(10):
            bar.advance()
    # (before: None under a kernel wrote "sweep: 1 of 10 done, 0 s" on stderr, shown as an error, every 30 s)
    assert capfd.readouterr() == ("", "") and jupyter == []
    simulate_batch([ROWS], grid(1, ["fcfs", "aging"], list(range(4, 14)), [1, 2]), progress=None)
    assert capfd.readouterr() == ("", "") and jupyter == []
    simulate_batch([ROWS], grid(1, ["fcfs", "aging"], [4, 5], [1, 2]), progress=True)
    assert capfd.readouterr() == ("", "") and jupyter[-1].startswith("sweep [") and "6/6" in jupyter[-1], jupyter


def test_progress_false_in_jupyter_shows_nothing(jupyter, capfd):
    simulate_batch([ROWS], grid(1, ["fcfs"], [4, 5], None), progress=False)
    assert capfd.readouterr() == ("", "") and jupyter == []


@numba.njit
def _key_notice(r, clock):
    return (r.prompt_len, r.max_new_tokens - r.generated_len)


def test_the_compile_notice_in_jupyter_is_plain_output_not_stderr(jupyter, capfd, monkeypatch):
    policy = Policy("notice57", key=_key_notice, effective_priority=_priority)  # (a new kernel to compile)
    monkeypatch.setattr(policy_module, "COMPILE_NOTICE_S", 0.0)
    result = simulate(ROWS, policy, 4)
    out, err = capfd.readouterr()
    assert "compiling policy 'notice57'" in out and "compiling" not in err, (out, err)  # (before: on stderr)
    assert result.stop_reason == "drained"


def test_a_result_table_edited_in_place_is_refused_and_the_result_unchanged():
    result = simulate(ROWS, "aging", 4, record_events=True)
    same = simulate(ROWS, "aging", 4, record_events=True)
    edits = [lambda: result.events["step"].__isub__(1), lambda: result.requests["ttft"].__imul__(0),
             lambda: result.requests["first_step"].fill(0), lambda: result.events["wait_steps"].fill(0)]
    for edit in edits:  # (before: each went through; the event log, ==, the files and the metrics changed)
        with pytest.raises(ValueError, match="read-only"):
            edit()
    assert result == same and result.metrics == same.metrics
    mine = result.requests["ttft"].copy()
    mine *= 2  # (a copy is one's own)
    assert np.array_equal(mine, 2 * same.requests["ttft"], equal_nan=True)


def test_a_batch_result_table_edited_in_place_is_refused_and_the_batch_unchanged():
    batch = simulate_batch([ROWS], grid(1, ["fcfs", "aging"], [4], [1, 2]), record_events=True)
    for arr in (batch.result(0).requests["finish_step"], batch.result(1).events["step"]):
        with pytest.raises(ValueError, match="read-only"):  # (before: the batch's own arrays changed)
            arr[0] = 0
    assert batch.result(2) == simulate(ROWS, "aging", 4, aging_interval=2, record_events=True)


def _round_trip(obj):
    return pickle.loads(pickle.dumps(obj))


def _results_and_trace():
    trace = load_trace(ROWS, name="t57")
    result = simulate(trace, "deadline", 4, record_events=True)
    result.requests, result.events  # noqa: B018 - (cached: pickled with the result)
    batch = simulate_batch([trace], grid(1, ["aging", "fcfs"], [3, 4], [1, 2]), record_events=True)
    return trace, result, batch


def test_results_and_traces_pickle_and_copy_equal_and_read_only():
    trace, result, batch = _results_and_trace()
    for make in (_round_trip, copy.copy, copy.deepcopy):
        for obj in (trace, result, batch):
            assert make(obj) == obj
        got = make(result)
        assert got.timeline() == result.timeline() and got.metrics == result.metrics
        for arr in (got.events["step"], got.requests["e2e"], make(batch).result(0).requests["e2e"]):
            with pytest.raises(ValueError, match="read-only"):
                arr[0] = 0


def _replay_pickled(blob):
    """In a worker: the pickled (trace, result) replayed there as it was here."""
    trace, result = pickle.loads(blob)
    again = simulate(trace, result.policy, result.free_kv_blocks, record_events=True)
    return pickle.dumps((again == result, again.timeline(), result.metrics))


def test_a_trace_and_result_sent_through_a_process_pool_replay_the_same():
    trace, result, _ = _results_and_trace()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        same, timeline, metrics = pickle.loads(pool.submit(_replay_pickled, pickle.dumps((trace, result))).result())
    assert same and timeline == result.timeline() and str(metrics) == str(result.metrics)


def test_written_tables_read_back_equal(tmp_path):
    import csv

    result = simulate(load_trace(ROWS), "deadline", 4, record_events=True)
    result.write_events(tmp_path / "events.csv")
    result.write_requests(tmp_path / "requests.csv")
    with open(tmp_path / "events.csv", newline="") as fh:
        events = list(csv.DictReader(fh))
    want = [{k: "" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for k, v in e.items()}
            for e in result.timeline()]
    assert [{k: v for k, v in e.items() if k != "step"} for e in events] == want
    assert [int(e["step"]) for e in events] == result.events["step"].tolist()
    with open(tmp_path / "requests.csv", newline="") as fh:
        requests = list(csv.DictReader(fh))
    for name in ("request_id", "first_step", "finish_step", "preemptions"):
        assert [int(r[name]) for r in requests] == result.requests[name].tolist(), name
    for name in ("ttft", "e2e", "tpot"):
        got = [float(r[name]) if r[name] else math.nan for r in requests]
        assert np.array_equal(got, result.requests[name], equal_nan=True), name


@pytest.mark.parametrize("policy", ["deadline", "aging"])
def test_events_and_requests_read_back_equal_from_csv_and_parquet(tmp_path, policy):
    pytest.importorskip("pyarrow")
    from decodesched.tables_io import read_table, tables_equal

    result = simulate(load_trace(ROWS), policy, 3, record_events=True)
    for table, write in (("events", result.write_events), ("requests", result.write_requests)):
        write(tmp_path / f"{table}.csv")
        write(tmp_path / f"{table}.parquet")
        got = read_table(tmp_path / f"{table}.csv")
        assert tables_equal(got, read_table(tmp_path / f"{table}.parquet")), table
        mine = getattr(result, table)
        for name, values in got.items():
            want = mine[name] if name in mine else None
            if want is None or want.dtype == object:  # (deadline_step, preempted_request_id: None where absent)
                continue
            given = ~np.ma.getmaskarray(values)  # (a blank cell: no victim, no deadline, never happened)
            assert np.array_equal(np.ma.getdata(values)[given], want[given], equal_nan=want.dtype.kind == "f"), name
            assert given.any() or table == "events", name


def test_batch_rows_written_as_csv_read_back_equal(tmp_path):
    from decodesched.batch import write_metrics_csv
    from decodesched.report import read_sweep

    batch = simulate_batch([load_trace(ROWS, name="t57")], grid(1, ["aging", "fcfs"], [3, 4], [1, 2]))
    write_metrics_csv(batch.rows(), tmp_path / "sweep.csv")
    back = read_sweep(tmp_path / "sweep.csv")
    assert len(back) == len(batch) == 6
    for got, want in zip(back, batch.rows()):
        for key, value in want.items():  # (exactly: a float is written as its shortest repr, read back the same)
            if isinstance(value, float) and math.isnan(value):
                assert got[key] is None or math.isnan(got[key]), key
            else:
                assert got[key] == value, (key, got[key], value)


def _odd_arrays(kind):
    """ROWS as NumPy columns of one odd kind (deadline_step as a masked array)."""
    cols = {c: np.asarray(v) for c, v in ROWS.items() if c != "deadline_step"}
    deadline = np.ma.MaskedArray([0 if d is None else d for d in ROWS["deadline_step"]],
                                 mask=[d is None for d in ROWS["deadline_step"]])
    cols["deadline_step"] = deadline
    out = {}
    for c, a in cols.items():
        if kind == "strided":
            wide = np.zeros(2 * len(a), a.dtype) if not np.ma.isMaskedArray(a) else np.ma.zeros(2 * len(a), a.dtype)
            wide[::2] = a
            a = wide[::2]
        elif kind == "read-only":
            a = a.copy()
            a.flags.writeable = False
        elif kind == "big-endian" and a.dtype.kind in "iu":
            a = a.astype(a.dtype.newbyteorder(">"))
        out[c] = a
    return out


@pytest.mark.parametrize("kind", ["strided", "read-only", "big-endian"])
def test_a_trace_of_odd_arrays_is_the_trace_of_plain_ones_and_keeps_no_view_of_them(kind):
    want = simulate(ROWS, "deadline", 4, record_events=True)
    cols = _odd_arrays(kind)
    trace = load_trace(cols)
    result = simulate(trace, "deadline", 4, record_events=True)
    assert trace == load_trace(ROWS) and result.timeline() == want.timeline()
    for a in cols.values():  # the caller's arrays, edited after: the trace and the result must not change
        if a.flags.writeable:
            a[:] = a[::-1].copy()
    assert trace == load_trace(ROWS) and simulate(trace, "deadline", 4, record_events=True) == result


def _garbage():
    """Values a notebook hands where a number, name or flag goes: wrong types, NumPy scalars and 0-d arrays, bools,
    huge and negative integers, NaN, empty sequences, pandas objects (when pandas is installed)."""
    values = [np.int8(-1), np.uint64(2**64 - 1), np.float32(4), np.array(4), np.array([4]), np.bool_(True), 2**100,
              -(2**70), float("nan"), -1, 0, True, [], (), {}, "", "4", b"4", None, object(), {4}, [[4]]]
    pd = sys.modules.get("pandas") or pytest.importorskip("pandas")
    values += [pd.Series([4, 5]), pd.DataFrame({"a": [4]}), pd.NA, pd.Series([], dtype=float), pd.Index([4])]
    return st.sampled_from(values) | st.integers(-(2**66), 2**66) | st.floats(allow_nan=True)


_TRACE = None


def _calls(trace):
    batch = grid(1, ["aging"], [4], [1])
    return {
        "simulate free_kv_blocks": lambda g: simulate(trace, "aging", g),
        "simulate aging_interval": lambda g: simulate(trace, "aging", 4, aging_interval=g),
        "simulate max_steps": lambda g: simulate(trace, "aging", 4, max_steps=g),
        "simulate record_events": lambda g: simulate(trace, "aging", 4, record_events=g),
        "simulate policy": lambda g: simulate(trace, g, 4),
        "simulate engine": lambda g: simulate(trace, "aging", 4, engine=g),
        "grid traces": lambda g: grid(g, ["aging"], [4], [1]),
        "grid policies": lambda g: grid(1, g, [4], [1]),
        "grid kv_blocks": lambda g: grid(1, ["aging"], g, [1]),
        "grid aging_intervals": lambda g: grid(1, ["aging"], [4], g),
        "simulate_batch threads": lambda g: simulate_batch([trace], batch, threads=g),
        "simulate_batch progress": lambda g: simulate_batch([trace], batch, progress=g),
        "simulate_batch backend": lambda g: simulate_batch([trace], batch, backend=g),
        "simulate_batch engine": lambda g: simulate_batch([trace], batch, engine=g),
        "simulate_batch record_events": lambda g: simulate_batch([trace], batch, record_events=g),
        "load_trace name": lambda g: load_trace(ROWS, name=g),
        "load_trace steps_per_second": lambda g: load_trace(ROWS, steps_per_second=g),
        "Policy name": lambda g: Policy(g, key=_key, effective_priority=_priority),
        "DecodeSchedulerSim policy": lambda g: DecodeSchedulerSim(g),
        "DecodeSchedulerSim free_kv_blocks": lambda g: DecodeSchedulerSim("aging", g),
        "enqueue priority": lambda g: DecodeSchedulerSim("aging").enqueue(1, 2, priority=g),
        "BatchResult.result": lambda g: simulate_batch([trace], batch).result(g),
        "simulate_batch scenarios": lambda g: simulate_batch([trace], g),
    }


@given(value=_garbage(), call=st.sampled_from(sorted(_calls(None))))
def test_every_public_call_given_garbage_works_or_says_so_in_one_line(value, call):
    global _TRACE
    _TRACE = _TRACE or load_trace(ROWS)
    try:
        _calls(_TRACE)[call](value)
    except (UserError, IndexError) as exc:  # (IndexError: an index out of range, as a list says it)
        assert "\n" not in str(exc) and str(exc), (call, value, exc)
    except ValueError as exc:  # (the model's value checks are the seed's, plain ValueErrors)
        assert "DecodeSchedulerSim" in call or "enqueue" in call, (call, value, exc)
        assert "\n" not in str(exc) and "/" in str(exc), (call, value, exc)  # (its bilingual one line)
    except TypeError as exc:  # (only a scenario index, as a list's: "a scenario is picked by its index")
        assert call == "BatchResult.result" and "\n" not in str(exc), (call, value, exc)


@pytest.mark.parametrize("call", ["simulate engine", "simulate_batch backend", "simulate_batch engine",
                                  "DecodeSchedulerSim policy", "simulate free_kv_blocks", "load_trace name",
                                  "Policy name", "simulate_batch threads"])
def test_a_pandas_series_where_one_value_goes_is_one_line_naming_it(call):
    pd = pytest.importorskip("pandas")
    # (before: "The truth value of a Series is ambiguous", or the Series' repr over three lines)
    with pytest.raises(ValueError) as exc:
        _calls(load_trace(ROWS))[call](pd.Series([4, 5]))
    _one_line(exc, "dtype: int64")


@pytest.mark.parametrize("call", ["grid kv_blocks", "grid policies", "grid aging_intervals",
                                  "simulate_batch scenarios"])
def test_a_zero_dimensional_array_where_a_list_goes_is_one_line_naming_it(call):
    with pytest.raises(UserError) as exc:  # (before: NumPy's TypeError "iteration over a 0-d array")
        _calls(load_trace(ROWS))[call](np.array(4))
    _one_line(exc, "must be a list", "array(4)")


def test_a_batch_metrics_dict_edited_by_the_caller_changes_nothing_in_the_batch():
    batch = simulate_batch([ROWS], grid(1, ["fcfs", "aging"], [4], [1]))
    rows = batch.rows()
    mine = batch.metrics(0)
    mine["ttft"] = mine["ttft"]["p50"]  # (a notebook flattening the dict for a table)
    mine.pop("per_class")
    # (before: the batch kept the edited dict: rows() raised TypeError, or wrote the edit into the sweep table)
    assert str(batch.rows()) == str(rows) and str(batch.metrics(0)) == str(simulate(ROWS, "fcfs", 4).metrics)
