"""The fast engine equals the model on small versions of the shapes `benchmarks/bench_hunt.py` draws beyond the
victims: everyone at step 0 with 8, 9 (one more than `fast_nb.MAX_BUCKETS`: several classes per waiting
structure) or all-distinct priorities; arrivals within 10 steps; idle gaps of 10**9 steps; bimodal lengths;
prompts far larger than outputs and the reverse; deadlines all missed, all equal, all distinct; capacities of
1 block, exactly the largest request, one less, unlimited; max_steps cutting mid-run; and the Mooncake and
Azure code traces (their first rows) at loads 0.5 to 5.0."""

from pathlib import Path

import numpy as np
import pytest
from oracle import POLICIES, assert_matches_model

from decodesched import load_trace, simulate
from decodesched.convert import read_raw, to_trace
from decodesched.kernels.fast_nb import MAX_BUCKETS

DATA = Path(__file__).resolve().parent / "data"


def _check(trace, policy, capacity, interval=4, max_steps=None):
    result = simulate(trace, policy, capacity, interval, max_steps)
    assert_matches_model(result, trace.rows(), policy, capacity, interval, max_steps)


def _trace(rng, n, **over):
    """`columns` as a trace."""
    return load_trace(columns(rng, n, **over))


def columns(rng, n, max_tokens=29, **over):
    """n requests at offered load about 1 (1-`max_tokens` tokens), 3 classes, 1-8 blocks, half with a deadline;
    `over` replaces columns (``has_deadline`` too)."""
    new = over.pop("max_new_tokens", rng.integers(1, max_tokens + 1, n))
    arrival = over.pop("arrival_step", np.sort(rng.integers(0, int(new.sum() + n), n)))
    has_deadline = over.pop("has_deadline", rng.random(n) < 0.5)
    cols = {"request_id": rng.permutation(n) - n // 3, "arrival_step": arrival,
            "prompt_len": rng.integers(1, 500, n), "max_new_tokens": new, "priority": rng.integers(0, 3, n),
            "cache_hit": rng.random(n) < 0.3, "required_blocks": rng.integers(1, 9, n),
            "deadline_step": arrival + (1 + new) * rng.integers(2, 50, n), "preemptible": rng.random(n) < 0.9}
    cols.update(over)
    cols["deadline_step"] = np.ma.MaskedArray(cols["deadline_step"], mask=~np.asarray(has_deadline))
    return cols


def _shape(name, rng, n=70):
    new = rng.integers(1, 30, n)
    arrival = np.sort(rng.integers(0, int(new.sum() + n), n)) // 2
    every = {"arrival_step": arrival, "has_deadline": np.ones(n, bool)}
    return {
        "classes 8": lambda: _trace(rng, n, arrival_step=np.zeros(n, np.int64), priority=rng.integers(0, 8, n)),
        "classes 9": lambda: _trace(rng, n, arrival_step=np.zeros(n, np.int64),
                                    priority=rng.integers(0, MAX_BUCKETS + 1, n)),
        "classes distinct": lambda: _trace(rng, n, arrival_step=np.zeros(n, np.int64), priority=rng.permutation(n)),
        "burst": lambda: _trace(rng, n, arrival_step=np.sort(rng.integers(0, 10, n))),
        "idle gaps": lambda: _trace(rng, n, arrival_step=np.cumsum(rng.integers(0, 2, n) * 10**9) + np.arange(n)),
        "bimodal": lambda: _trace(rng, n, arrival_step=arrival, max_new_tokens=np.where(rng.random(n) < 0.05, 2000, 1)),
        "prompts >> outputs": lambda: _trace(rng, n, arrival_step=arrival // 10, max_new_tokens=rng.integers(1, 8, n),
                                             prompt_len=rng.integers(50_000, 100_000, n)),
        "outputs >> prompts": lambda: _trace(rng, n, max_new_tokens=rng.integers(100, 300, n),
                                             prompt_len=np.ones(n, np.int64)),
        "deadlines missed": lambda: _trace(rng, n, deadline_step=np.zeros(n, np.int64) + 1,
                                           **{**every, "arrival_step": np.zeros(n, np.int64)}),
        "deadlines equal": lambda: _trace(rng, n, deadline_step=np.full(n, int(arrival[-1]) + 50), **every),
        "deadlines distinct": lambda: _trace(rng, n, deadline_step=arrival[-1] + 1 + rng.permutation(n), **every),
    }[name]()


SHAPES = ("classes 8", "classes 9", "classes distinct", "burst", "idle gaps", "bimodal", "prompts >> outputs",
          "outputs >> prompts", "deadlines missed", "deadlines equal", "deadlines distinct")


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_hunted_shape_equals_the_model(shape, policy):
    """Each shape at a tight capacity, exactly its largest request (and one less) and unlimited, and cut by
    max_steps at a third of its work."""
    rng = np.random.default_rng(SHAPES.index(shape))
    trace = _shape(shape, rng)
    largest = int(trace.required_blocks.max())
    for capacity in (1, 12, largest - 1, largest, 2**61):
        _check(trace, policy, capacity, interval=int(rng.integers(1, 8)))
    _check(trace, policy, 12, max_steps=trace.work_steps // 3)


@pytest.mark.parametrize("name", ("mooncake_conversation_head60.jsonl", "azure_llm_2023_code_head60.csv"))
@pytest.mark.parametrize("load", (0.5, 2.0, 5.0))
def test_real_trace_heads_equal_the_model(name, load):
    """The first 60 rows of the Mooncake conversation and Azure code traces (`tests/data`, with their
    attribution; outputs cut to 30 tokens so the model stays quick), at 8 blocks, exactly the largest request
    and unlimited."""
    path = DATA / name
    trace = to_trace(read_raw(path), load=load, seed=0)
    cols = trace.columns()
    cols["max_new_tokens"] = np.minimum(cols["max_new_tokens"], 30)
    trace = load_trace(cols)
    for policy in POLICIES:
        for capacity in (8, int(trace.required_blocks.max()), 2**61):
            _check(trace, policy, capacity)
