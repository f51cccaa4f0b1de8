"""A researcher's walk through docs/policies.md and docs/research.md: what a reasonable user passes
and what they should be told (one clear line saying what to do), found by writing policies of one's
own, replaying them against the model and sweeping and reporting them."""

import collections

import numba
import numpy as np
import pytest

import decodesched
from decodesched import Policy, model
from decodesched.errors import UserError
from decodesched.policy import resolve_policy

ROWS = {"request_id": [1, 2, 3, 4], "arrival_step": [0, 0, 1, 3], "prompt_len": [4, 2, 3, 5],
        "max_new_tokens": [3, 1, 2, 2], "priority": [0, 2, 1, 0], "cache_hit": [False, True, False, False],
        "required_blocks": [2, 2, 1, 3], "deadline_step": [None, 9, None, 20],
        "preemptible": [True, True, False, True]}


@numba.njit
def _key(r, clock):
    return (r.max_new_tokens - r.generated_len,)


@numba.njit
def _priority(r, clock):
    return r.priority


@numba.njit
def _bool_key(r, clock):
    return (r.phase == 0, r.prompt_len)


@numba.njit
def _float_key(r, clock):
    return (float(r.prompt_len),)


@numba.njit
def _float_priority(r, clock):
    return r.priority / 2


@numba.njit
def _varying_key(r, clock):
    if r.phase == 0:
        return (r.prompt_len,)
    return (r.prompt_len, r.generated_len)


@numba.njit
def _list_key(r, clock):
    return [r.prompt_len]


@numba.njit
def _int_key(r, clock):
    return r.prompt_len


WEIGHTS = [1, 2, 3]  # a global list: Numba cannot freeze it as a constant


@numba.njit
def _global_list_key(r, clock):
    return (WEIGHTS[r.priority % 3],)


def _plain_key(r, clock):
    return (r.prompt_len,)


# -- Policy(...): a function that is not compiled, and keys of the wrong type --------------------

def test_plain_python_function_is_told_to_add_njit():
    with pytest.raises(UserError, match=r"_plain_key is a plain Python function: put @numba.njit above its def"):
        Policy("p", key=_plain_key, effective_priority=_priority)


def test_lambda_is_told_how_to_compile_it():
    with pytest.raises(UserError, match=r"numba\.njit\(lambda r, clock: \.\.\.\)"):
        Policy("p", key=_key, effective_priority=lambda r, clock: r.priority)


def test_bool_key_element_names_the_element_and_the_fix():
    with pytest.raises(UserError, match=r"element 0 is a bool; turn it into 0/1 with int\(\.\.\.\)"):
        Policy("p", key=_bool_key, effective_priority=_priority)


def test_float_key_and_priority_name_the_float():
    with pytest.raises(UserError, match=r"got \(1\.0,\): element 0 is a float; compare integers only"):
        Policy("p", key=_float_key, effective_priority=_priority)
    with pytest.raises(UserError, match=r"must return an integer, got 0\.0: it is a float"):
        Policy("p", key=_key, effective_priority=_float_priority)


def test_key_of_varying_tuple_length_says_to_keep_one_shape():
    with pytest.raises(UserError, match=r"same length and element types \(pad the shorter ones"):
        Policy("p", key=_varying_key, effective_priority=_priority)


def test_list_and_bare_int_keys_say_to_return_a_tuple():
    with pytest.raises(UserError, match=r"got \[1\]: a list; return a tuple"):
        Policy("p", key=_list_key, effective_priority=_priority)
    with pytest.raises(UserError, match=r"got 1; return a tuple, \(x,\) for a one-element key"):
        Policy("p", key=_int_key, effective_priority=_priority)


def test_global_list_says_to_use_a_tuple_or_array():
    with pytest.raises(UserError, match=r"Numba cannot read a global list: make it a tuple or a NumPy array"):
        Policy("p", key=_global_list_key, effective_priority=_priority)


# -- module:attr with a wrong attribute lists the module's policies ------------------------------

def test_missing_attribute_lists_the_policies_of_the_module(tmp_path):
    f = tmp_path / "walk_policies.py"
    f.write_text("import numba\nfrom decodesched import Policy\n\n"
                 "@numba.njit\ndef k(r, clock):\n    return (r.prompt_len,)\n\n"
                 "@numba.njit\ndef p(r, clock):\n    return r.priority\n\n"
                 "SJF = Policy('sjf', key=k, effective_priority=p)\n"
                 "EDF = Policy('edf', key=k, effective_priority=p)\n")
    with pytest.raises(UserError, match=r"has no attribute 'sjf'; the policies there: EDF, SJF$"):
        resolve_policy(f"{f}:sjf")
    g = tmp_path / "walk_empty.py"
    g.write_text("X = 1\n")
    with pytest.raises(UserError, match=r"it defines no decodesched.Policy at its top level"):
        resolve_policy(f"{g}:SJF")


# -- the model takes what simulate takes --------------------------------------------------------

def test_model_replay_takes_a_trace_a_path_and_named_tuples(tmp_path):
    trace = decodesched.load_trace(ROWS)
    want = model.replay(trace.rows(), policy="aging", free_kv_blocks=4).events
    assert want == [{**e, "step": int(s)} for e, s in
                    zip(decodesched.simulate(trace, "aging", 4).timeline(),
                        decodesched.simulate(trace, "aging", 4).events["step"])]
    assert model.replay(trace, policy="aging", free_kv_blocks=4).events == want
    path = tmp_path / "t.csv"
    trace.to_csv(path)
    assert model.replay(str(path), policy="aging", free_kv_blocks=4).events == want
    assert model.replay(path, policy="aging", free_kv_blocks=4).events == want
    assert model.replay(ROWS, policy="aging", free_kv_blocks=4).events == want  # a mapping of columns
    Row = collections.namedtuple("Row", list(ROWS))
    assert model.replay([Row(**r) for r in trace.rows()], policy="aging", free_kv_blocks=4).events == want


def test_model_with_a_function_for_policy_names_policy():
    with pytest.raises(ValueError, match=r"policy must be one of .*, or a decodesched.Policy \(a function alone"):
        model.DecodeSchedulerSim(policy=_key)
    with pytest.raises(ValueError, match=r"or a decodesched.Policy"):
        model.replay(decodesched.load_trace(ROWS), policy=_plain_key)


# -- whole-number floats and numpy values in simulate and grid ----------------------------------

def test_integral_float_capacity_says_which_int_to_give():
    with pytest.raises(UserError, match=r"free_kv_blocks must be an integer, got 4000\.0 \(a float: give the int 40"):
        decodesched.simulate(ROWS, "aging", free_kv_blocks=4000.0)
    with pytest.raises(UserError, match=r"max_steps must be an integer or None, got 10\.0 \(a float: give the int 10"):
        decodesched.simulate(ROWS, "aging", free_kv_blocks=4, max_steps=10.0)


def test_grid_refuses_floats_when_it_is_made_not_when_the_batch_runs():
    with pytest.raises(UserError, match=r"grid: kv_blocks must hold integers, got 2000\.0 \(a float: give the int 20"):
        decodesched.grid(1, ["aging"], np.linspace(2000, 4000, 3), [4])
    with pytest.raises(UserError, match=r"grid: aging_intervals must hold integers, got 2\.5"):
        decodesched.grid(1, ["aging"], [4], [2.5])
    with pytest.raises(UserError, match=r"grid: kv_blocks must hold integers, got True"):
        decodesched.grid(1, ["aging"], [True], [4])
    scenarios = decodesched.grid(1, ["aging"], np.arange(2, 5), [np.int32(2)])  # NumPy integers are integers
    assert [s.free_kv_blocks for s in scenarios] == [2, 3, 4]


def test_batch_result_without_events_says_simulate_batch():
    trace = decodesched.load_trace(ROWS)
    batch = decodesched.simulate_batch([trace], decodesched.grid(1, ["fcfs"], [4], [4]), threads=1)
    with pytest.raises(ValueError, match=r"simulate_batch\(\.\.\., record_events=True\)"):
        batch.result(0).timeline()


# -- report: titles fit a one-family figure; count axes hold whole numbers ----------------------

def _sweep_rows():
    rows = []
    for load in (0.8, 1.2):
        for policy in ("aging", "fcfs"):
            rows.append({"trace": f"azure_llm_2023_conv_load{load}", "replicate": 0, "policy": policy,
                         "kv_blocks": 8000, "aging_interval": 4 if policy == "aging" else None,
                         "offered_load": load, "steps_per_second": 1000.0, "unfinished": 0,
                         "ttft_p50_s": load, "ttft_p99_s": 10 * load, "queue_wait_p99_s": load,
                         "e2e_p99_s": 20 * load})
    return rows


def test_report_titles_fit_a_single_column_figure(tmp_path, monkeypatch):
    from decodesched import report

    figures = []
    real_save = report._save

    def keep(fig, out, plot):
        figures.append(fig)
        return real_save(fig, out, plot)

    monkeypatch.setattr(report, "_save", keep)
    rows = _sweep_rows()
    results = tmp_path / "study.csv"
    results.write_text(",".join(rows[0]) + "\n" + "".join(
        ",".join("" if v is None else str(v) for v in r.values()) + "\n" for r in rows))
    report.build_report(tmp_path / "report", results=results, kv_blocks=8000)
    assert figures
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for fig in figures:
        if fig._suptitle is None:
            continue
        renderer = FigureCanvasAgg(fig).get_renderer()
        box = fig._suptitle.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (fig._suptitle.get_text(), box, fig.bbox.width)
        # and no count axis of unfinished requests has ticks below zero or between whole numbers
        for ax in fig.axes:
            if ax.get_ylabel() == "unfinished requests":
                ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
                assert ticks and all(t >= 0 and float(t).is_integer() for t in ticks), ticks
