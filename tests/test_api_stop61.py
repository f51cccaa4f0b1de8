"""A researcher's own policies that misbehave, and degenerate traces in reports: one clear line saying what was
wrong, and nothing on stderr that the project causes."""

from __future__ import annotations

import warnings

import numba
import numpy as np
import pytest

from decodesched import Policy
from decodesched.errors import UserError
from decodesched.report import build_report

# Two requests, neither of which fits in 4 KV blocks: nothing ever runs.
UNSERVABLE = {"request_id": [1, 2], "arrival_step": [0, 3], "prompt_len": [5, 5], "max_new_tokens": [3, 3],
              "priority": [0, 1], "cache_hit": [False, False], "required_blocks": [20, 20],
              "deadline_step": [None, 9], "preemptible": [True, True]}


@numba.njit
def _prompt_key(r, clock):
    return (r.prompt_len,)


@numba.njit
def _priority(r, clock):
    return r.priority


@numba.njit
def _random_key(r, clock):
    return (np.random.randint(0, 2**40),)  # (compiled and Python draw from two generators: equal 1 in 2**40)


@numba.njit
def _random_priority(r, clock):
    return np.random.randint(0, 2**40)


# -- a report of a trace in which no request finished: no matplotlib warning, panels that say why they are empty --


def test_a_report_of_a_trace_where_nothing_finishes_warns_nothing(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (matplotlib's "No artists with labels found to put in legend")
        plots = build_report(tmp_path / "rep", trace=UNSERVABLE, kv_blocks=4, policies=["fcfs", "aging"])
    cdf = {p.name: p for p in plots}["latency_cdf"]
    assert sorted(cdf.legend) == ["aging (2 unfinished)", "fcfs (2 unfinished)"]  # (every policy, what it left)
    assert (tmp_path / "rep" / "latency_cdf.png").stat().st_size > 0


def test_empty_panels_of_a_report_say_why_instead_of_showing_axes_about_0(tmp_path, monkeypatch):
    from decodesched import report

    texts, limits, save = {}, {}, report._save

    def keep_texts(fig, out, plot):
        texts[plot.name] = [t.get_text() for ax in fig.axes for t in ax.texts]
        limits[plot.name] = [ax.get_ylim() for ax in fig.axes]
        return save(fig, out, plot)

    monkeypatch.setattr(report, "_save", keep_texts)
    build_report(tmp_path / "rep", trace=UNSERVABLE, kv_blocks=4, policies=["fcfs"])
    assert texts["kv_queue_timeline"] == ["no step ran: no request fits in 4 KV blocks"] * 2
    assert {"no queue wait to draw: no request got that far", "no TTFT to draw: no request got that far",
            "no end-to-end latency to draw: no request got that far"} == set(texts["latency_cdf"])
    starvation, preemptions, attainment = limits["per_class"]  # (all n/a or 0: no negative waits, no 0.5 victims)
    assert starvation[0] == preemptions[0] == attainment[0] == 0 and preemptions[1] >= 1


# -- a function that does not give one value for one (r, clock) is not told to mind int64 --------------------------


@pytest.mark.parametrize("key, priority, what", [(_random_key, _priority, "key"),
                                                 (_prompt_key, _random_priority, "effective_priority")])
def test_a_non_deterministic_function_is_named_so_not_blamed_on_int64(key, priority, what):
    with pytest.raises(UserError) as err:
        Policy("dice", key=key, effective_priority=priority)
    text = str(err.value)
    assert text.startswith(f"policy 'dice': {what}(r, clock) gives ") and "\n" not in text
    assert "random" in text and "int64" not in text


@numba.njit
def _wrapping_key(r, clock):
    return (2**62 + r.prompt_len * 2**62,)


def test_a_value_past_int64_is_still_told_to_stay_inside_int64():
    """(Guards what was right before: the int64 hint stays where compiled integers did wrap around.)"""
    with pytest.raises(UserError, match="keep every value inside int64"):
        Policy("wraps", key=_wrapping_key, effective_priority=_priority)


# -- the one line says what is wrong with the function given, not with another kind of function ---------------------


@pytest.mark.parametrize("make, words", [
    (lambda: numba.vectorize(["int64(int64, int64)"])(lambda a, b: a), "got DUFunc"),
    (lambda: numba.cfunc("int64(int64, int64)")(lambda a, b: a), "got CFunc"),
])
def test_a_ufunc_or_cfunc_made_of_a_lambda_is_not_called_a_plain_lambda(make, words):
    with pytest.raises(UserError) as err:
        Policy("made", key=make(), effective_priority=_priority)
    assert words in str(err.value) and "plain lambda" not in str(err.value)


def test_a_plain_lambda_is_still_told_to_take_numba_njit():
    """(Guards what was right before.)"""
    with pytest.raises(UserError, match=r"a plain lambda: give numba\.njit\(lambda r, clock: \.\.\.\) as key"):
        Policy("plain", key=lambda r, clock: (r.phase,), effective_priority=_priority)


@numba.njit
def _misspelt_key(r, clock):
    return (r.prompt_length,)


def test_a_misspelt_field_of_r_lists_the_fields_there_are():
    from decodesched.policy import REQUEST_FIELDS

    with pytest.raises(UserError) as err:
        Policy("typo", key=_misspelt_key, effective_priority=_priority)
    text = str(err.value)
    assert "'prompt_length'" in text and "\n" not in text
    assert text.endswith("r's fields are " + ", ".join(REQUEST_FIELDS))


# -- a NumPy array a policy reads, changed in place after it compiled: refused, never replayed with the old values ----

TRACE = {"request_id": [1, 2, 3, 4], "arrival_step": [0, 0, 1, 2], "prompt_len": [5, 3, 4, 6],
         "max_new_tokens": [3, 4, 2, 3], "priority": [0, 1, 2, 3], "cache_hit": [False, True, False, False],
         "required_blocks": [2, 2, 3, 1], "deadline_step": [None, 20, 10, None],
         "preemptible": [True, True, False, True]}
_WEIGHTS = np.array([5, 1, 3, 2])


@numba.njit
def _weighted_key(r, clock):
    return (_WEIGHTS[r.priority % 4] * 10 + r.prompt_len,)


@numba.njit
def _weighted_priority(r, clock):
    return _WEIGHTS[r.priority % 4]


def _closing_over(weights):
    @numba.njit
    def key(r, clock):
        return (weights[r.priority % 4] * 10 + r.prompt_len,)

    @numba.njit
    def effective_priority(r, clock):
        return weights[r.priority % 4]

    return Policy("closure", key=key, effective_priority=effective_priority)


@pytest.mark.parametrize("how", ["global", "closure"])
def test_an_array_changed_in_place_after_compiling_is_caught_not_replayed_stale(how):
    from decodesched import model, simulate

    weights = _WEIGHTS if how == "global" else np.array([5, 1, 3, 2])
    policy = Policy("weights", key=_weighted_key, effective_priority=_weighted_priority) if how == "global" \
        else _closing_over(weights)
    before = simulate(TRACE, policy, free_kv_blocks=4).timeline()
    assert [{k: v for k, v in e.items() if k != "step"} for e in model.replay(TRACE, policy=policy,
                                                                            free_kv_blocks=4).events] == before
    kept = weights.copy()
    weights[:] = [1, 5, 2, 3]  # (the model, which calls the Python functions, now orders otherwise)
    try:
        name = "weights" if how == "closure" else "_WEIGHTS"
        with pytest.raises(UserError, match=f"key: .* was compiled with an earlier {name!r}"):
            simulate(TRACE, policy, free_kv_blocks=4)
    finally:
        weights[:] = kept
    assert simulate(TRACE, policy, free_kv_blocks=4).timeline() == before  # (as it was: it runs again)


def test_a_policy_file_whose_name_is_not_utf8_is_imported(tmp_path):
    # Before: `--policy "$(printf 'p\xff.py'):MINE"` said "importing p\udcff.py failed: UnicodeEncodeError" (the
    # module name hashed the path with str.encode).
    import os

    from decodesched.policy import resolve_policy

    path = tmp_path / os.fsdecode(b"p\xff.py")
    path.write_text("import numba\nfrom decodesched import Policy\n\n@numba.njit\ndef key(r, clock):\n"
                    "    return (r.prompt_len,)\n\n@numba.njit\ndef priority(r, clock):\n    return r.priority\n\n"
                    "MINE = Policy('mine61', key=key, effective_priority=priority)\n")
    policy = resolve_policy(f"{path}:MINE")
    assert policy.name == "mine61"
    assert resolve_policy(f"{path}:MINE") is policy  # (the module is loaded once, under one name)
