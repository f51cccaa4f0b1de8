"""The model against the seed chapter's own reference solution, on random sequences of calls.

`decodesched.model.DecodeSchedulerSim` is the oracle of every engine and of the grader; the chapter's
reference solution (`grader/solutions/seed_reference.py`, as a student would paste it) is the normative
semantics. Seeded Hypothesis draws a configuration and a sequence of `enqueue` (valid and invalid:
duplicate ids, non-positive lengths, deadlines not after the clock), `step` and `run(k)` calls, and the
two must agree on every return value, every exception's class, the timeline, the clock, the free blocks
and each request's state, after every call. A difference shrinks to a minimal sequence.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from decodesched import model

SEED = Path(__file__).resolve().parents[1] / "grader" / "solutions" / "seed_reference.py"


def _seed_class():
    module = types.ModuleType("decodesched_seed_reference")
    sys.modules[module.__name__] = module  # (dataclasses looks its module up)
    exec(compile(SEED.read_text(encoding="utf-8"), str(SEED), "exec"), module.__dict__)
    return module.DecodeSchedulerSim


SeedSim = _seed_class()
FIELDS = [f.name for f in dataclasses.fields(model.RequestState) if f.name != "enqueue_clock"]

def _enqueue(length, blocks, ids):
    return st.tuples(st.just("enqueue"), st.fixed_dictionaries(
        {"request_id": ids, "prompt_len": length, "max_new_tokens": length},
        optional={"priority": st.one_of(st.integers(0, 4), st.sampled_from([-(2**53), -1, 2**53])),
                  "cache_hit": st.booleans(), "required_blocks": blocks,
                  "deadline_step": st.one_of(st.none(), st.integers(-1, 40)), "preemptible": st.booleans()}))


# Rounds of a few requests (mostly valid, contending for few blocks, so that preemption and its tie-breaks
# come up; some invalid) then a few steps: a later round's requests meet the earlier ones admitted.
valid = _enqueue(st.integers(1, 4), st.integers(1, 4), st.integers(-3, 12))
invalid = _enqueue(st.integers(-2, 6), st.integers(-1, 7), st.integers(-3, 3))
advance = st.one_of(st.just(("step", {})),
                    st.tuples(st.just("run"), st.fixed_dictionaries({"max_steps": st.integers(-1, 8)})))
rounds = st.lists(st.tuples(st.lists(st.one_of(valid, valid, valid, invalid), min_size=1, max_size=4),
                            st.lists(advance, min_size=1, max_size=3)), min_size=1, max_size=6)
calls = rounds.map(lambda rs: [call for enq, adv in rs for call in enq + adv])


def _call(sim, name, kwargs):
    try:
        return "ok", getattr(sim, name)(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the two must raise alike
        return "raised", type(exc).__name__


def _state(sim):
    return (sim.clock, sim.free_kv_blocks, list(sim.timeline),
            [tuple(getattr(r, f) for f in FIELDS) for r in sim.queue])


@settings(max_examples=2000, deadline=None, derandomize=True)
@given(policy=st.sampled_from(["fixed_priority", "aging", "deadline"]), capacity=st.integers(0, 8),
       interval=st.integers(1, 5), calls=calls)
def test_the_model_answers_every_call_as_the_seed_reference_does(policy, capacity, interval, calls):
    ours = model.DecodeSchedulerSim(policy=policy, free_kv_blocks=capacity, aging_interval=interval)
    seed = SeedSim(policy=policy, free_kv_blocks=capacity, aging_interval=interval)
    for i, (name, kwargs) in enumerate(calls):
        got, want = _call(ours, name, kwargs), _call(seed, name, kwargs)
        assert got == want, (i, name, kwargs)
        assert _state(ours) == _state(seed), (i, name, kwargs)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(kwargs=st.fixed_dictionaries({"policy": st.sampled_from(["fixed_priority", "aging", "deadline", "fifo", ""]),
                                     "free_kv_blocks": st.integers(-2, 3), "aging_interval": st.integers(-2, 3)}))
def test_a_bad_configuration_is_refused_alike(kwargs):
    def made(cls):
        try:
            cls(**kwargs)
            return "ok"
        except Exception as exc:  # noqa: BLE001
            return type(exc).__name__

    assert made(model.DecodeSchedulerSim) == made(SeedSim)
