"""More priority classes than waiting structures (`fast_nb.MAX_BUCKETS`): buckets of one class and of several
side by side.  `fast_nb._refresh_cands` walks a bucket of one class against one limit ``free + M(class)`` and
only when that limit rose; a bucket of several against M's records whenever runnability may have grown.  The
engine equals the model on such traces, every cand a refresh leaves is the first runnable row of its bucket,
and a bucket of one class whose limit did not rise is not walked again."""

import numpy as np
import pytest
from oracle import assert_matches_model

from decodesched import load_trace, simulate
from decodesched.kernels import enums as E
from decodesched.kernels.fast_nb import (
    GK_NCOLS,
    MAX_BUCKETS,
    QS_FREE_SEEN,
    QS_GROW_FROM,
    QS_MAX_BLOCKS,
    QS_N,
    Victims,
    _refresh_cands,
    _wait_add,
    _wait_remove,
    _waiting,
)
from decodesched.kernels.ordered_nb import ND_BASE, ND_MAXBASE, seg_prefix_max_nb, treap_nodes_nb


def _priorities(rng, n, kind):
    """Priorities giving buckets of one class beside buckets of several (`fast_nb._buckets` splits the classes
    into MAX_BUCKETS ranges of about as many rows each)."""
    if kind == "9":
        return rng.integers(0, MAX_BUCKETS + 1, n)
    if kind == "one large class":  # half the rows one class (a bucket of its own), the rest spread over 20
        return np.where(rng.random(n) < 0.5, 100, rng.integers(0, 20, n))
    if kind == "12 skewed":  # a few classes crowd out the rest: several buckets of one class, some of many
        return rng.choice(12, n, p=np.array([8, 1, 1, 1, 8, 8, 1, 1, 8, 1, 8, 1]) / 47)
    if kind == "64":
        return rng.integers(0, 64, n)
    return rng.permutation(n)  # all distinct


KINDS = ("9", "one large class", "12 skewed", "64", "distinct")


def _trace(rng, n, kind, at_zero):
    new = rng.integers(1, 25, n)
    arrival = np.zeros(n, np.int64) if at_zero else np.sort(rng.integers(0, int(new.sum()) // 2 + 1, n))
    has_deadline = rng.random(n) < 0.6
    return load_trace({
        "request_id": rng.permutation(n) - n // 2, "arrival_step": arrival, "prompt_len": rng.integers(1, 300, n),
        "max_new_tokens": new, "priority": _priorities(rng, n, kind), "cache_hit": rng.random(n) < 0.3,
        "required_blocks": rng.integers(1, 9, n),
        "deadline_step": np.ma.MaskedArray(arrival + (1 + new) * rng.integers(1, 30, n), mask=~has_deadline),
        "preemptible": rng.random(n) < 0.85,
    })


@pytest.mark.parametrize("policy", ("fixed_priority", "deadline", "fcfs"))
@pytest.mark.parametrize("kind", KINDS)
def test_mixed_buckets_equal_the_model(kind, policy):
    """Everyone at step 0 and arrivals spread over the run, at capacities from 1 block to unlimited (aging has
    no buckets: `aging_nb`)."""
    for seed in range(2):
        rng = np.random.default_rng([KINDS.index(kind), seed])
        for at_zero in (True, False):
            trace = _trace(rng, 72, kind, at_zero)
            for capacity in (1, 8, 12, 20, 2**61):
                result = simulate(trace, policy, capacity)
                assert_matches_model(result, trace.rows(), policy, capacity, 4, None)


# `_refresh_cands` on its own: 3 buckets over 6 classes, {0, 1, 2} and {4, 5} of several, {3} of one; the rows
# in rank order in one rank tree per bucket (rows in prefill; the treap stays empty).
OF_CLASS = np.array([0, 0, 0, 1, 2, 2])
LO = np.array([0, 3, 4])
TOP = np.array([2, 3, 5])


class _Refresh:
    def __init__(self, pclass, blocks):
        n = pclass.shape[0]
        self.pclass = pclass.astype(np.int64)
        self.blocks = blocks.astype(np.int64)
        self.struct = OF_CLASS[self.pclass]
        self.nd, self.gk = treap_nodes_nb(self.blocks, GK_NCOLS)
        self.nd[:, ND_BASE] = self.pclass
        self.nd[:, ND_MAXBASE] = self.pclass
        self.gk[:, 1] = E.PHASE_PREFILL
        self.w = _waiting(np.arange(n), self.struct, 3, 1, True)
        size = 8
        self.v = Victims(root=np.full(6, -1, np.int64), key=np.zeros((n, 2), np.int64),
                         seg=np.zeros(2 * size, np.int64), size=size, st_c=np.empty(7, np.int64),
                         st_b=np.empty(7, np.int64))
        self.stack = np.empty(n + 64, np.int64)
        self.cand = np.full(3, -1, np.int64)
        self.stale = np.ones(3, np.bool_)
        self.limit = np.zeros(3, np.int64)
        self.qs = np.zeros(QS_N, np.int64)
        self.qs[QS_GROW_FROM] = 6
        self.qs[QS_MAX_BLOCKS] = self.blocks.max()
        self.inside = set()
        self.free = 0

    def m(self, c):
        return int(seg_prefix_max_nb(self.v.seg, self.v.size, c))

    def add(self, r):
        """Row r starts waiting (a preempted row: its bucket's cand is searched again)."""
        _wait_add(self.w, self.struct[r], r, self.stack, self.gk, self.nd)
        self.inside.add(r)
        self.stale[self.struct[r]] = True

    def take(self, s):
        """Bucket s's cand leaves the waiting rows (admitted)."""
        r = self.cand[s]
        _wait_remove(self.w, s, r, self.stack, self.gk, self.nd)
        self.inside.remove(r)
        self.stale[s] = True

    def set_victims(self, k, blocks):
        """Class k's largest victim now has `blocks` (0: none); a rise of M from class k + 1 on is marked."""
        if blocks > self.m(k + 1):
            self.qs[QS_GROW_FROM] = min(self.qs[QS_GROW_FROM], k + 1)
        self.v.seg[self.v.size + k] = blocks
        i = (self.v.size + k) // 2
        while i >= 1:
            self.v.seg[i] = max(self.v.seg[2 * i], self.v.seg[2 * i + 1])
            i //= 2

    def refresh(self):
        _refresh_cands(self.qs, self.free, self.v, 3, 6, LO, TOP, self.pclass, self.cand, self.stale, self.limit,
                       self.w, self.gk, self.nd, self.stack)

    def first_runnable(self, s):
        rows = sorted(r for r in self.inside if self.struct[r] == s)
        return next((r for r in rows if self.blocks[r] <= self.free + self.m(self.pclass[r])), -1)


def test_refresh_leaves_every_bucket_its_first_runnable_row():
    """Random changes as the replay makes them (free blocks up and down, victims joining and leaving, rows
    preempted into a bucket and cands taken), a refresh after each: every cand is its bucket's first row with
    blocks <= free + M(its class)."""
    rng = np.random.default_rng(11)
    n = 60
    state = _Refresh(rng.integers(0, 6, n), rng.integers(1, 13, n))
    for r in range(0, n, 2):
        state.add(r)
    state.free = 4
    for _ in range(3000):
        op = rng.integers(0, 4)
        if op == 0:
            state.free = int(max(0, state.free + rng.integers(-4, 5)))
        elif op == 1:
            state.set_victims(int(rng.integers(0, 6)), int(rng.integers(0, 13)))
        elif op == 2:
            out = [r for r in range(n) if r not in state.inside]
            if out:
                state.add(int(rng.choice(out)))
        else:
            taken = [s for s in range(3) if state.cand[s] >= 0]
            if taken:
                state.take(int(rng.choice(taken)))
        state.refresh()
        assert state.cand.tolist() == [state.first_runnable(s) for s in range(3)]


def test_one_class_bucket_is_not_walked_while_its_limit_does_not_rise():
    """Free blocks grow by 1 while M(3) falls by 2 (a preemption: the victim frees more than the challenger
    takes): bucket {3}'s limit ``free + M(3)`` fell, so nothing in it became runnable and its cand stays unwalked.
    Seen through a planted cand (a walk would give the earlier row): before buckets of one class kept a limit,
    growing free blocks walked every bucket again."""
    state = _Refresh(np.array([3, 3, 0]), np.array([6, 2, 1]))
    for r in range(3):
        state.add(r)
    state.free = 2
    state.set_victims(1, 5)  # M(3) = 5: limit 7, rows 0 and 1 both run
    state.refresh()
    assert state.cand.tolist() == [2, 0, -1]
    state.cand[1] = 1  # planted: runnable, but not the first
    state.free = 3
    state.set_victims(1, 3)  # limit 6: row 1 still runs, nothing new does
    state.refresh()
    assert state.cand.tolist() == [2, 1, -1]
    assert state.qs[QS_FREE_SEEN] == 3 and state.limit[1] == 6
    state.free = 4  # limit 7 > 6: walked again
    state.refresh()
    assert state.cand.tolist() == [2, 0, -1]
