"""The fast engine equals the model on small versions of trace shapes that the random traces rarely draw:
many admitted victims whose blocks rise with their priority (every victim a record of the staircase M,
past `fast_nb.STAIRS_MAX`), under an unlimited and a tight capacity, with waiting rows above and below
them; prefill-dominated backlogs (one token each); everyone at step 0; a capacity at the blocks of every
servable row, where the aging kernel keeps no victims."""

import numpy as np
import pytest
from oracle import POLICIES, assert_matches_model

from decodesched import load_trace, simulate
from decodesched.kernels.fast_nb import STAIRS_MAX

UNLIMITED = 2**61


def _check(cols, policy, capacity, interval=3, max_steps=None):
    trace = load_trace(cols)
    result = simulate(trace, policy, capacity, interval, max_steps)
    assert_matches_model(result, trace.rows(), policy, capacity, interval, max_steps)


def _cols(rng, n, **over):
    new = rng.integers(1, 6, n)
    cols = {
        "request_id": [int(x) for x in rng.permutation(n) - n // 3],
        "arrival_step": [0] * n,
        "prompt_len": [int(x) for x in rng.integers(1, 9, n)],
        "max_new_tokens": [int(x) for x in new],
        "priority": [int(x) for x in rng.integers(0, 3, n)],
        "cache_hit": [bool(x) for x in rng.random(n) < 0.3],
        "required_blocks": [int(x) for x in rng.integers(1, 5, n)],
        "deadline_step": [int(2 + d) if h else None for d, h in zip(rng.integers(0, 60, n), rng.random(n) < 0.5)],
        "preemptible": [bool(x) for x in rng.random(n) < 0.9],
    }
    cols.update(over)
    return cols


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(3))
def test_victims_rising_with_priority_under_an_unlimited_capacity(policy, seed):
    """Everyone at step 0, one priority each, blocks rising with it: every admitted victim a record."""
    rng = np.random.default_rng(seed)
    n = 2 * STAIRS_MAX + 10
    prio = rng.permutation(n)
    _check(_cols(rng, n, priority=[int(p) for p in prio], required_blocks=[int(p) + 1 for p in prio]),
           policy, UNLIMITED)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("slack", (0, 3, 40))
def test_victims_rising_with_priority_fill_a_tight_capacity(policy, seed, slack):
    """m long victims of rising class and blocks fill the capacity but for `slack`; a stream of short
    requests of the top class (and some below every victim, some that need a victim's blocks) arrives
    above them: more records than STAIRS_MAX, so the walks read M from the victims' segment tree."""
    rng = np.random.default_rng(seed)
    m = STAIRS_MAX + 8
    k = 50
    n = m + k
    vb = list(range(1, m + 1))
    capacity = sum(vb) + slack
    stream_prio = rng.choice([m + 5, -1, m // 2], k, p=[0.6, 0.2, 0.2])
    cols = _cols(rng, n)
    cols["priority"] = list(range(m)) + [int(p) for p in stream_prio]
    cols["required_blocks"] = vb + [int(b) for b in rng.integers(1, m + 3, k)]
    cols["max_new_tokens"] = [int(x) for x in rng.integers(20, 40, m)] + [int(x) for x in rng.integers(1, 4, k)]
    cols["arrival_step"] = [0] * m + [int(a) for a in np.sort(m + rng.integers(0, 3 * k, k))]
    cols["deadline_step"] = [a + int(d) if d % 2 else None
                             for a, d in zip(cols["arrival_step"], rng.integers(1, 200, n))]
    cols["preemptible"] = [True] * m + [bool(x) for x in rng.random(k) < 0.5]
    _check(cols, policy, capacity, interval=int(rng.integers(1, 9)))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("capacity", (1, 7, 30))
def test_prefill_dominated_backlog_of_many_classes(policy, capacity):
    """One token each, all at step 0, one priority each: every step admits or finishes."""
    rng = np.random.default_rng(capacity)
    n = 90
    _check(_cols(rng, n, max_new_tokens=[1] * n, priority=[int(p) for p in rng.permutation(n) * 7 - 300],
                 required_blocks=[int(b) for b in rng.integers(1, capacity + 2, n)]), policy, capacity)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("short_by", (0, 1, 3))
def test_capacity_at_the_servable_rows_blocks(policy, seed, short_by):
    """A capacity of exactly the blocks of every servable row (the aging kernel then keeps no victims:
    nobody ever waits for blocks), and one or three blocks fewer (a preemption becomes possible), with
    unservable rows mixed in, arrivals spread and the aging interval drawn."""
    rng = np.random.default_rng(100 + seed)
    n = 70
    cols = _cols(rng, n, arrival_step=[int(a) for a in np.sort(rng.integers(0, 40, n))])
    cols["deadline_step"] = [None if d is None else a + d for a, d in zip(cols["arrival_step"], cols["deadline_step"])]
    blocks = cols["required_blocks"]
    servable = sum(blocks[: n - 5])
    cols["required_blocks"] = blocks[: n - 5] + [servable + 1 + i for i in range(5)]  # never fit
    _check(cols, policy, servable - short_by, interval=int(rng.integers(1, 12)))
