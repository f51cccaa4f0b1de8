"""The fast kernel: the same replay as `scan_nb`, event for event, without scanning the backlog.

Same signature and output contract as `replay_scan_nb`.  The idea (SPEC section 2 read as a query):
the request a step runs is the first in key order that is *runnable*: admitted, or its blocks fit in
the free blocks, or one victim (admitted, preemptible, strictly lower effective priority, blocks at
least ``required_blocks - free``) exists.  Failing admission attempts have no side effects, so that
is all the model's walk does.

Structures (all allocated inside the call; nothing global, safe to run per scenario in ``prange``):

* **Groups.**  Keys are compared as rows of an int64 matrix ``gk`` whose order inside a group never
  changes while a request is not chosen: fixed_priority and fcfs have one group; deadline has two
  (with a deadline, keyed by ``deadline - remaining`` so that the shared ``- clock`` drops out;
  without one); aging has one group per residue ``(enqueue step + times chosen) mod aging_interval``
  (within a residue every effective priority rises at the same steps, see `aging_nb`).  Across
  groups the real key at the current clock decides (`_akey_less`), which is where a slack of
  1_000_000_000 or more ties with or sorts after "no deadline".
* **Waiting** (not admitted: prefill, or preempted) requests sit in one structure per (group,
  bucket of priority classes): every class its own bucket when there are at most MAX_BUCKETS (8)
  classes, else 8 contiguous ranges of classes holding about as many requests each (`_buckets`).  A
  request whose key cannot change while it waits sits in a segment tree over the static ranks of
  its structure's requests by that key (`_static_order`, `_waiting`), with subtree aggregates
  min ``required_blocks`` and max class: a request in prefill (its key holds nothing the replay
  changes), and under fcfs every waiting request (the enqueue clock is the arrival step: two trees,
  prefill then preempted).  A preempted request under fixed_priority or deadline sits in a treap
  keyed by the group key with the same aggregates; the structure's answer is the first of the two.
  A rank tree is far cheaper than a treap with a large backlog: its top levels stay cached and
  neighbouring ranks share cache lines, where a treap's 25 levels for 300 k rows are scattered rows
  (with 1 M waiting, an arrival's insert cost ~1.9 us, and fixed_priority ran at 0.5 of its 1 k
  rate).  A waiting request is
  runnable iff ``blocks <= free + M(class)``, where M(c) = max blocks among victims of a class below
  c is a non-decreasing step function given by its few records (the victims' prefix maxima by
  class, `_stairs`).  A structure's first runnable request is an in-order walk that skips every
  subtree with ``min blocks > free + M(max class)`` (`ordered_nb.treap_first_runnable_nb`): one
  pruned descent when the bucket is one class, and otherwise entering in vain only subtrees that
  straddle a step of M.  Each structure's answer is cached and walked again only when it was taken,
  stopped running, or runnability grew for some class of its bucket (free blocks grew, or a victim
  raised M there) (`_refresh_cands`; a bucket of one class is walked only when its one limit
  ``free + M(class)`` rose, in one descent without M's records; with one class per bucket that is a
  loop in the replay, as cheap as before the buckets); the best across structures is re-compared
  when an answer or
  the waiting membership changes, plus, under deadline while some real slack may still reach the
  sentinel, every step.
* **Admitted** requests (all in decode phase) sit in one binary heap per group: a decode step of an
  admitted request is a sift-down.  Each entry carries its row's key packed into one int64 where it
  fits (`_heap_layout`; the priority and request_id enter the key as ranks), so that rows of one
  priority taking turns (each step's row falls behind the next by its grown total_len: thousands of
  them with an unlimited capacity) sift by one comparison a level, not six columns of two rows.
* **Victims** (admitted, preemptible) sit in one treap per priority class ordered by
  ``(-required_blocks, request_id)``; a segment tree over classes holds each class's largest blocks,
  giving ``max victim blocks below a class`` and the seed's victim (lowest class that has one big
  enough, then its largest, then the smallest id) in O(log P).
* ``wait_steps`` is lazy: ``steps run - steps run at enqueue - times chosen``, frozen at finish.
  Requests needing more blocks than the capacity can never run; they enter no structure.

Cost per step (n = requests waiting, A = admitted, P = distinct priority values, G = groups <= 2,
B = buckets per group <= 8, k = records of M that a waiting row's test can tell apart, at most
STAIRS_MAX, past which M is read from the victims' segment tree, O(log P) a read: `_stairs`):
a decode step of an admitted request is O(1) when it stays first among the admitted (the usual
case) and O(log A) otherwise; an arrival costs O(log n) expected; a step that admits, preempts or
finishes also refreshes the cached query: O(k log P) for the records of M, O(log P) for the victim
structures, and a walk in each of the G * B structures whose answer may have moved: O(log n) when
its bucket is one class, O(k log n log k) in the worst case otherwise (the walks on the Azure trace
with every request its own priority: 0.3-0.4 s for 4.1 M steps, as with three classes).  Nothing
is linear in P or n.  Set-up sorts the priorities once (O(n log n)) and ranks the requests' static
keys (`_static_order`: a few radix passes per key column).

Constant factors matter as much: a Numba helper with branches or loops reference-counts every
array it receives on entry and exit (atomic operations: ~100 ns for a dozen arrays, more than a
whole decode step).  So the per-step path updates keys in place, and every helper that allocates
nothing is compiled with ``_nrt=False`` (no reference counting; a private but long-standing Numba
option).  Memory: about 40 int64 per request (the 128-byte node block, a dozen per-request arrays,
the rank trees: 2-8 per request).

**Policy aging** runs in `aging_nb.replay_aging_nb` (one group per residue of ``(enqueue step +
times chosen) mod aging_interval``, held only while non-empty; see there) for any interval, and
as fixed_priority when ``aging_interval`` exceeds the trace's total work steps (no wait can reach it).
"""

from collections import namedtuple

import numpy as np
from numba import njit

from . import enums as E
from .ordered_nb import (
    RANK_OUT,
    ND_BASE,
    ND_BLOCKS,
    ND_MAXBASE,
    heap_push_nb,
    heap_remove_nb,
    heap_sift_down_nb,
    advise_huge_pages_nb,
    key_less_nb,
    pack_key_nb,
    pack_layout_nb,
    prefetch_nb,
    rank_tree_first_fit_nb,
    rank_tree_first_runnable_nb,
    rank_tree_set_nb,
    seg_prefix_max_nb,
    stair_at_nb,
    treap_delete_nb,
    treap_first_fit_nb,
    treap_first_nb,
    treap_first_runnable_nb,
    treap_insert_nb,
    treap_nodes_nb,
    unlikely_nb,
)
from .step_nb import advance_nb, new_requests_nb, record_step_nb, write_state_nb
from .stamp import source_stamp
from .aging_nb import replay_aging_nb
from .scan_nb import replay_scan_nb

SOURCE_STAMP = source_stamp("enums.py", "ordered_nb.py", "btree_nb.py", "step_nb.py", "aging_nb.py", "scan_nb.py")

GK_NCOLS = 6
PK_STEP = 3 * GK_NCOLS  # the column of `_heap_layout`'s rows after the layout
MAX_BUCKETS = 8  # waiting structures per group (see `_buckets`)
STAIRS_MAX = 32  # records of M written at a change; past them the walks read the segment tree (`_stairs`)

# The waiting rows of every structure s (group * n_buckets + bucket): a treap and `n_h` rank trees
# each (see `_wait_add`; built empty by `_waiting`).
Waiting = namedtuple("Waiting", (
    "n_h",    # rank trees per structure
    "root",   # each structure's treap root (-1: empty)
    "rank",   # each row's rank among its structure's rows in their static order
    "rows",   # the rows by structure and rank: structure s's from rows[start[s]]
    "start",  # (n_struct + 1 entries)
    "size",   # each structure's tree size (a power of two)
    "base",   # tree h of structure s at vals[base[n_h * s + h]:]
    "vals",   # the trees' blocks (RANK_OUT: no row)
    "cls",    # their classes (-1: no row) when a bucket holds several classes, else length 1
))

# The victims (admitted, preemptible rows; see `_victims_add`).
Victims = namedtuple("Victims", (
    "root",   # a treap per priority class, ordered by `key`
    "key",    # each row's victim order: (-required_blocks, request_id)
    "seg",    # a max segment tree over the classes: each class's largest blocks (0: none)
    "size",   # its leaves (a power of two)
    "st_c",   # the records of the staircase M (see `_stairs`): classes
    "st_b",   # and blocks
))


@njit(cache=True, _nrt=False)
def _set_key(r, policy, gk, req, enqueue_clock, request_id, id_rank, prompt_len, max_new_tokens, pclass,
             cache_hit, deadline_step, has_deadline):
    """Write row r's group key (`req`: the replay state): its sort key with the parts shared by its whole
    group left out, the priority and request_id as their ranks (the same order in fewer bits: see
    `_heap_layout`)."""
    if policy == E.POLICY_FCFS:
        gk[r, 0] = 0
        gk[r, 1] = req.phase[r]
        gk[r, 2] = enqueue_clock[r]
        gk[r, 3] = request_id[r]
        gk[r, 4] = 0
        gk[r, 5] = 0
        return
    d = np.int64(0)
    if policy == E.POLICY_DEADLINE and has_deadline[r]:
        remaining = max_new_tokens[r] - req.generated[r]
        if req.phase[r] == E.PHASE_PREFILL:
            remaining += 1
        d = deadline_step[r] - remaining  # slack = d - clock
    gk[r, 0] = d
    gk[r, 1] = req.phase[r]
    gk[r, 2] = 0 if cache_hit[r] else 1
    gk[r, 3] = -pclass[r]
    gk[r, 4] = prompt_len[r] + req.generated[r]
    gk[r, 5] = id_rank[r]


# Not cached on its own: it calls kernels of another file (see `stamp`); its callers' cache holds it.
@njit
def _heap_layout(policy, n_groups, group, n_classes, prompt_len, max_new_tokens, deadline_step):
    """The layouts of the admitted rows' packed keys (`ordered_nb.heap_push_nb`, `pack_layout_nb`), one
    per group: row g holds lo, drop and shift of every key column (`pack_key_nb`), then at PK_STEP
    what a decode step adds to a packed key (total_len, and the deadline group's column 0, grow by
    one), or -1 where a column it moves is cut short (pack again).  From bounds on every value
    `_set_key` and the replay give an admitted row's key: the deadline group's ``deadline -
    remaining`` from ``deadline - max_new_tokens - 1`` up to the deadline, the phase, the cache rank,
    the class rank, total_len up to ``prompt_len + max_new_tokens``, the request_id's rank (the Azure
    trace's keys take 33 bits, 54-56 with a deadline).  fcfs packs nothing: its admitted rows' keys never
    change."""
    m = GK_NCOLS
    pk = np.zeros((n_groups, PK_STEP + 1), np.int64)
    pk[:, 2 * m:3 * m] = -1  # no column packed
    n = group.shape[0]
    if policy == E.POLICY_FCFS or n == 0:
        return pk
    lo = np.zeros(m, np.int64)
    hi = np.zeros(m, np.int64)
    lo[1] = min(E.PHASE_PREFILL, E.PHASE_DECODE)
    hi[1] = max(E.PHASE_PREFILL, E.PHASE_DECODE)
    hi[2] = 1
    lo[3] = -(n_classes - 1)
    lo[4] = prompt_len.min()
    hi[4] = (prompt_len + max_new_tokens).max()
    hi[5] = n - 1
    for g in range(n_groups):  # they differ in column 0 only: 0 but in the deadline group
        lo[0] = 0
        hi[0] = 0
        if policy == E.POLICY_DEADLINE and g == 1:  # group 1: the rows with a deadline
            lo[0] = np.int64(2**62)
            hi[0] = -np.int64(2**62)
            for r in range(n):
                if group[r] == 1:
                    lo[0] = min(lo[0], deadline_step[r] - max_new_tokens[r] - 1)
                    hi[0] = max(hi[0], deadline_step[r])
        drop, shift = pack_layout_nb(lo, hi)
        pk[g, :m] = lo
        pk[g, m:2 * m] = drop
        pk[g, 2 * m:3 * m] = shift
        for k in (0, 4):
            if shift[k] >= 0 and lo[k] < hi[k]:
                if drop[k] > 0:
                    pk[g, PK_STEP] = -1
                    break
                pk[g, PK_STEP] += np.int64(1) << shift[k]
    return pk


# Not cached on its own: it calls kernels of another file (see `stamp`); its callers' cache holds it.
@njit(_nrt=False)
def _fresh_top(heap, hkey, hsize, g, gk, pk, hcc, chosen_count):
    """Pack heap g's top row's key again before the heap changes.  Only a heap's top runs, and a step
    whose row stays on top leaves its packed key as it was (a decode step is ~25 ns: writing the key
    at each cost up to 5%), packed when the row had been chosen ``hcc[row]`` times; every
    other row in a heap has its key's."""
    if hsize[g] > 0:
        top = heap[g, 0]
        hkey[g, 0] = pack_key_nb(gk, top, pk, g)
        hcc[top] = chosen_count[top]


# Not cached on its own: it calls kernels of another file (see `stamp`); its callers' cache holds it.
@njit(_nrt=False)
def _akey_less(a, b, gk, deadline_policy, has_deadline, clock):
    """The real sort key of a before that of b at `clock` (rows of any groups)."""
    if deadline_policy:
        sa = gk[a, 0] - clock if has_deadline[a] else np.int64(E.NO_DEADLINE_SLACK)
        sb = gk[b, 0] - clock if has_deadline[b] else np.int64(E.NO_DEADLINE_SLACK)
        if sa != sb:
            return sa < sb
        for k in range(1, GK_NCOLS):
            if gk[a, k] != gk[b, k]:
                return gk[a, k] < gk[b, k]
        return False
    return key_less_nb(gk, a, b)


# The staircase M(c) = max blocks among victims of a class below c, a non-decreasing step function of
# c: its records (class st_c[j], blocks st_b[j]), both increasing, are the victims' prefix maxima.

@njit(cache=True, _nrt=False)
def _stairs(seg, size, st_c, st_b, top, enough):
    """Write the records of M from the victims' segment tree that a waiting row's test can tell from
    the others; return their number.  Only M(c) for classes c <= `top` (the highest waiting class) is
    read, so records from class `top` on are left out; and a row's test ``blocks <= free + M(c)``
    holds for every row once M reaches `enough` (the largest blocks of a servable row less free), so
    the records after the first that reaches it are left out too (M then stays at that record's
    blocks, the same answers).  So the count is not the victims' when they are many (thousands of
    admitted victims of rising classes and blocks, an unlimited capacity: every one was a record, and
    each admission and finish wrote them all).  Past STAIRS_MAX records it stops and returns -1: the
    walks then read M from the segment tree (`ordered_nb.stair_at_nb` with k < 0), O(log P) a read,
    rather than this writing O(k log P) at each change (thousands of victims of rising classes and
    blocks filling a tight capacity, a stream of short requests above them: 18 us a step with 4,000)."""
    k = 0
    if enough <= 0:
        return k  # every row fits in the free blocks alone: M does not matter
    need = np.int64(1)
    while True:
        c = _seg_first_ge(seg, size, need)
        if c < 0 or c >= top:
            return k
        if k == STAIRS_MAX:
            return -1
        b = seg[size + c]
        st_c[k] = c
        st_b[k] = b
        k += 1
        if b >= enough:
            return k
        need = b + 1


@njit(cache=True)
def _buckets(pclass, n_classes):
    """The waiting structures' split of the priority classes: every class its own bucket when there are
    at most MAX_BUCKETS (then a structure's walk is one descent), else MAX_BUCKETS contiguous ranges of
    classes holding about as many rows each.  Returns each row's bucket, the number of buckets and
    each bucket's highest and lowest class (-1: empty)."""
    n = pclass.shape[0]
    counts = np.zeros(n_classes, np.int64)
    for r in range(n):
        counts[pclass[r]] += 1
    n_buckets = min(n_classes, MAX_BUCKETS)
    of_class = np.empty(n_classes, np.int64)
    cum = np.int64(0)
    for c in range(n_classes):
        of_class[c] = c if n_classes <= MAX_BUCKETS else min(n_buckets - 1, cum * n_buckets // max(n, 1))
        cum += counts[c]
    top = np.full(n_buckets, -1, np.int64)
    lo = np.full(n_buckets, -1, np.int64)
    for c in range(n_classes):
        top[of_class[c]] = c
        if lo[of_class[c]] < 0:
            lo[of_class[c]] = c
    bucket = np.empty(n, np.int64)
    for r in range(n):
        bucket[r] = of_class[pclass[r]]
    return bucket, n_buckets, top, lo


@njit(cache=True)
def _sort_stable(idx, key):
    """The rows `idx` sorted stably by ``key[row]`` (int64): an LSD radix sort over the bytes in which
    the keys differ (two or three passes for most columns; np.argsort's merge sort took 5x longer)."""
    n = idx.shape[0]
    cur = idx.copy()
    cur_u = np.empty(n, np.uint64)
    flip = np.uint64(1) << np.uint64(63)  # int64 order as unsigned order
    for i in range(n):
        cur_u[i] = np.uint64(key[idx[i]]) ^ flip
    if n == 0:
        return cur
    all_and = cur_u[0]
    all_or = cur_u[0]
    for i in range(n):
        all_and &= cur_u[i]
        all_or |= cur_u[i]
    differ = all_and ^ all_or
    out = np.empty_like(cur)
    out_u = np.empty_like(cur_u)
    count = np.empty(257, np.int64)
    byte = np.uint64(255)
    for shift in range(0, 64, 8):
        sh = np.uint64(shift)
        if (differ >> sh) & byte == 0:
            continue
        count[:] = 0
        for i in range(n):
            count[np.int64((cur_u[i] >> sh) & byte) + 1] += 1
        for j in range(256):
            count[j + 1] += count[j]
        for i in range(n):
            d = np.int64((cur_u[i] >> sh) & byte)
            j = count[d]
            count[d] = j + 1
            out[j] = cur[i]
            out_u[j] = cur_u[i]
        cur, out = out, cur
        cur_u, out_u = out_u, cur_u
    return cur


# Not cached on its own: it uses constants of another file (see `stamp`); its caller's cache holds it.
@njit
def _static_order(policy, by_id, arrival_step, prompt_len, max_new_tokens, pclass, cache_hit, deadline_step,
                  has_deadline):
    """Every row in the order of its static waiting key (`by_id`: the rows by request_id): under fcfs
    (arrival step, request_id), the key of every waiting row (the enqueue clock is the arrival step);
    otherwise the key of a row still in prefill (`_set_key` with nothing generated: only a preempted
    row's key depends on the replay)."""
    idx = by_id
    if policy == E.POLICY_FCFS:
        return _sort_stable(idx, arrival_step)
    idx = _sort_stable(idx, prompt_len)
    idx = _sort_stable(idx, -pclass)  # -priority
    idx = _sort_stable(idx, np.where(cache_hit, 0, 1))
    if policy == E.POLICY_DEADLINE:
        idx = _sort_stable(idx, np.where(has_deadline, deadline_step - max_new_tokens - 1, 0))
    return idx


# Not cached on its own: it uses kernels of another file (see `stamp`); its caller's cache holds it.
@njit
def _waiting(by_key, struct, n_struct, n_h, several):
    """The `Waiting` structures, empty: every row ranked among its structure's (``struct[row]``) rows
    in the order `by_key`, `n_h` rank trees per structure, their classes kept when a bucket holds
    `several`."""
    n = by_key.shape[0]
    start = np.zeros(n_struct + 1, np.int64)
    size = np.ones(n_struct, np.int64)
    base = np.zeros(n_h * n_struct, np.int64)
    rank = np.zeros(n, np.int64)
    rows = np.zeros(n, np.int64)
    for r in range(n):
        start[struct[r] + 1] += 1
    for s in range(n_struct):
        while size[s] < start[s + 1]:
            size[s] *= 2
        start[s + 1] += start[s]
    fill = start.copy()
    for r in by_key:
        s = struct[r]
        rank[r] = fill[s] - start[s]
        rows[fill[s]] = r
        fill[s] += 1
    for q in range(1, n_h * n_struct):
        base[q] = base[q - 1] + 2 * size[(q - 1) // n_h]
    total = base[n_h * n_struct - 1] + 2 * size[n_struct - 1]
    vals = np.empty(total, np.int64)
    advise_huge_pages_nb(vals)  # 25 MB with 1 M rows, walked at the rank of every arrival
    vals[:] = RANK_OUT
    return Waiting(n_h=n_h, root=np.full(n_struct, -1, np.int64), rank=rank, rows=rows, start=start, size=size,
                   base=base, vals=vals, cls=np.full(total if several else 1, -1, np.int64))


# The waiting rows of structure s (group * n_buckets + bucket): rows whose key is static sit in
# rank trees over the structure's rows' ranks by that key (`_static_order`; cache-friendlier than a
# treap: neighbouring ranks share cache lines and the top levels stay cached), the others in a
# treap.  Under fcfs every key is static: two trees, the prefill rows' then the preempted ones' (which
# sort after every prefill row), no treap (n_h = 2); otherwise one tree for the rows in prefill and
# a treap for the preempted ones (n_h = 1; under deadline the two interleave).  The tree of a row in
# phase h is h (rows of phase >= n_h: the treap).  Not cached on their own: they call kernels of
# another file (see `stamp`); their callers' cache holds them.

@njit(_nrt=False)
def _wait_add(w, s, r, stack, gk, nd):
    h = gk[r, 1]
    if h < w.n_h:
        rank_tree_set_nb(w.vals, w.cls, w.base[w.n_h * s + h], w.size[s], w.rank[r], nd[r, ND_BLOCKS], nd[r, ND_BASE])
    else:
        w.root[s] = treap_insert_nb(w.root[s], r, stack, gk, nd)


@njit(_nrt=False)
def _wait_remove(w, s, r, stack, gk, nd):
    h = gk[r, 1]
    if h < w.n_h:
        rank_tree_set_nb(w.vals, w.cls, w.base[w.n_h * s + h], w.size[s], w.rank[r], RANK_OUT, -1)
    else:
        w.root[s] = treap_delete_nb(w.root[s], r, stack, gk, nd)


@njit(_nrt=False)
def _wait_first_runnable(w, s, free, st_c, st_b, k, gk, nd, stack):
    """The first waiting row of structure s with blocks <= free + M(its class), or -1."""
    best = E.NO_ROW
    for h in range(w.n_h):  # a tree's rows sort before the next tree's
        i = rank_tree_first_runnable_nb(w.vals, w.cls, w.base[w.n_h * s + h], w.size[s], free, st_c, st_b, k)
        if i >= 0:
            best = w.rows[w.start[s] + i]
            break
    t = treap_first_runnable_nb(w.root[s], free, nd, stack, st_c, st_b, k)
    if t >= 0 and (best == E.NO_ROW or key_less_nb(gk, t, best)):
        best = t
    return best


@njit(_nrt=False)
def _wait_top_class(w, nd):
    """The highest class of a waiting row (several classes per bucket: the trees keep their classes),
    or -1: the roots' aggregates."""
    top = np.int64(-1)
    for s in range(w.root.shape[0]):
        for h in range(w.n_h):
            c = w.cls[w.base[w.n_h * s + h] + 1]
            if c > top:
                top = c
        t = w.root[s]
        if t >= 0 and nd[t, ND_MAXBASE] > top:
            top = nd[t, ND_MAXBASE]
    return top


# The cached query's state (several classes per bucket): the free blocks when the cands were found
# (QS_FREE_SEEN), the lowest class whose M grew since (QS_GROW_FROM; n_classes for none), and the
# largest blocks of a row that fits the capacity at all (QS_MAX_BLOCKS, see `_stairs`).
QS_FREE_SEEN = 0
QS_GROW_FROM = 1
QS_MAX_BLOCKS = 2
QS_N = 3


@njit(_nrt=False)
def _wait_first_fit(w, s, limit, gk, nd):
    """The first waiting row of structure s (one class) with blocks <= limit, or -1."""
    best = E.NO_ROW
    for h in range(w.n_h):
        i = rank_tree_first_fit_nb(w.vals, w.base[w.n_h * s + h], w.size[s], limit)
        if i >= 0:
            best = w.rows[w.start[s] + i]
            break
    t = treap_first_fit_nb(w.root[s], limit, nd)
    if t >= 0 and (best == E.NO_ROW or key_less_nb(gk, t, best)):
        best = t
    return best


@njit(cache=True, _nrt=False)
def _max_servable(required_blocks, capacity):
    """The largest blocks of a row that fits the capacity at all (0 if none)."""
    top = np.int64(0)
    for r in range(required_blocks.shape[0]):
        if top < required_blocks[r] <= capacity:
            top = required_blocks[r]
    return top


# Not cached on its own: it calls kernels of another file (see `stamp`); its caller's cache holds it.
@njit(_nrt=False)
def _refresh_cands(qs, free, v, n_buckets, n_classes, bucket_lo, bucket_top, pclass, cand, cand_stale, cand_limit, w,
                   gk, nd, stack):
    """Several classes per bucket: bring every structure's cand (its first runnable row) up to date
    after free blocks or victims changed.  Where runnability only shrank, a cand that still runs
    stays first (nothing before it ran before) and no cand stays none; the rest are walked again.
    Runnability grew for the classes from ``grow_from`` up (free blocks grew, or a victim raised M
    there).  A bucket of one class (most of them with a few more classes than buckets: 9 classes make
    one bucket of two) is checked and walked as in the replay's loop for one class per bucket: against
    one limit ``free + M(class)``, walked again only when it rose past ``cand_limit`` (the limit at the
    last refresh), in one pruned descent."""
    n_st = _stairs(v.seg, v.size, v.st_c, v.st_b, _wait_top_class(w, nd), qs[QS_MAX_BLOCKS] - free)
    st_c = v.st_c
    if n_st < 0:  # too many records: M from the segment tree (see `stair_at_nb`)
        st_c = v.seg
        n_st = -v.size
    grow_from = qs[QS_GROW_FROM]
    if free > qs[QS_FREE_SEEN]:
        grow_from = 0  # free blocks grew (a finish, or a preemption freeing more than it takes)
    for s in range(cand.shape[0]):
        c = cand[s]
        b = s % n_buckets
        if unlikely_nb(bucket_lo[b] == bucket_top[b]):  # one class: one limit (not in the table's shapes)
            limit = free + seg_prefix_max_nb(v.seg, v.size, bucket_top[b])
            if cand_stale[s] or limit > cand_limit[s] or (c != E.NO_ROW and nd[c, ND_BLOCKS] > limit):
                cand[s] = _wait_first_fit(w, s, limit, gk, nd)
                cand_stale[s] = False
            cand_limit[s] = limit
            continue
        if cand_stale[s] or bucket_top[b] >= grow_from or (
                c != E.NO_ROW and nd[c, ND_BLOCKS] > free + stair_at_nb(pclass[c], st_c, v.st_b, n_st)):
            cand[s] = _wait_first_runnable(w, s, free, st_c, v.st_b, n_st, gk, nd, stack)
            cand_stale[s] = False
    qs[QS_FREE_SEEN] = free
    qs[QS_GROW_FROM] = n_classes


# Row r of class k joins or leaves the victims.  Not cached on their own: they call kernels of another
# file (see `stamp`); their caller's cache holds them.

@njit(_nrt=False)
def _victims_add(v, k, r, stack, nd):
    v.root[k] = treap_insert_nb(v.root[k], r, stack, v.key, nd)
    _seg_set(v.seg, v.size, k, nd[treap_first_nb(v.root[k], nd), ND_BLOCKS])


@njit(_nrt=False)
def _victims_drop(v, k, r, stack, nd):
    v.root[k] = treap_delete_nb(v.root[k], r, stack, v.key, nd)
    top = treap_first_nb(v.root[k], nd)
    _seg_set(v.seg, v.size, k, nd[top, ND_BLOCKS] if top >= 0 else 0)


# A max segment tree over priority classes: leaf i = largest blocks among class i's victims (0: none).

@njit(cache=True, _nrt=False)
def _seg_set(seg, size, i, value):
    i += size
    seg[i] = value
    i >>= 1
    while i >= 1:
        a = seg[2 * i]
        b = seg[2 * i + 1]
        seg[i] = a if a > b else b
        i >>= 1


@njit(cache=True, _nrt=False)
def _seg_first_ge(seg, size, need):
    """The first leaf with value >= need, or -1."""
    if seg[1] < need:
        return -1
    i = 1
    while i < size:
        if seg[2 * i] >= need:
            i = 2 * i
        else:
            i = 2 * i + 1
    return i - size


def _make_replay_fast(stamp):
    """`replay_fast_nb`, closing over `stamp` so that an edit of a kernel it calls compiles it afresh."""

    @njit(cache=True, nogil=True)  # (run from a helper thread: `decodesched._io.interruptible`)
    def replay_fast_nb(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit,
                       required_blocks, deadline_step, has_deadline, preemptible, order,
                       policy, free_kv_blocks, aging_interval, max_steps,
                       events, req_out, summary):
        """Replay one trace under one configuration; arguments and outputs exactly as `replay_scan_nb`."""
        if stamp < 0:  # never: the stamp only keys the Numba cache (see `source_stamp`)
            return
        work = np.int64(0)
        for r in range(request_id.shape[0]):
            work += 1 + max_new_tokens[r]
        if policy == E.POLICY_AGING and aging_interval > work:
            # No request can wait aging_interval steps (a wait never exceeds the steps run), so the
            # effective priority is the business priority all along: exactly fixed_priority.
            policy = E.POLICY_FIXED_PRIORITY
        if policy == E.POLICY_AGING:
            if not replay_aging_nb(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit,
                                   required_blocks, deadline_step, has_deadline, preemptible, order,
                                   free_kv_blocks, aging_interval, max_steps, events, req_out, summary):
                # Priorities x interval beyond the aging kernel's int64 keys (a valid trace of absurd
                # size, see `aging_nb._compressed_priorities`): the scan replay, exact at any size.
                replay_scan_nb(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit,
                               required_blocks, deadline_step, has_deadline, preemptible, order,
                               policy, free_kv_blocks, aging_interval, max_steps, events, req_out, summary)
            return
        _replay_static(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit,
                       required_blocks, deadline_step, has_deadline, preemptible, order,
                       policy, free_kv_blocks, max_steps, events, req_out, summary)

    return replay_fast_nb


replay_fast_nb = _make_replay_fast(SOURCE_STAMP)


def _make_replay_static(stamp):
    """`_replay_static`, closing over `stamp` so that an edit of a kernel it calls compiles it afresh."""

    @njit(cache=True)
    def _replay_static(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit,
                       required_blocks, deadline_step, has_deadline, preemptible, order,
                       policy, free_kv_blocks, max_steps, events, req_out, summary):
        """fixed_priority, fcfs and deadline: effective priority = priority, so it never changes."""
        if stamp < 0:  # never: the stamp only keys the Numba cache (see `source_stamp`)
            return
        n = request_id.shape[0]
        deadline_policy = policy == E.POLICY_DEADLINE
        n_groups = 2 if deadline_policy else 1

        # Priority classes: 0 = the lowest priority.
        classes = np.unique(priority) if n > 0 else np.zeros(1, np.int64)
        n_classes = classes.shape[0]
        pclass = np.searchsorted(classes, priority)

        max_deadline = np.int64(-(2**62))
        if deadline_policy:
            for r in range(n):
                if has_deadline[r] and deadline_step[r] > max_deadline:
                    max_deadline = deadline_step[r]

        req = new_requests_nb(n)
        enqueue_clock = np.zeros(n, np.int64)
        group = np.zeros(n, np.int64)
        if deadline_policy:
            for r in range(n):
                if has_deadline[r]:
                    group[r] = 1

        vk = np.empty((n, 2), np.int64)
        for r in range(n):
            vk[r, 0] = -required_blocks[r]
            vk[r, 1] = request_id[r]
        seg_size = 1
        while seg_size < n_classes:
            seg_size *= 2
        v = Victims(root=np.full(n_classes, -1, np.int64), key=vk, seg=np.zeros(2 * seg_size, np.int64), size=seg_size,
                    st_c=np.empty(n_classes + 1, np.int64), st_b=np.empty(n_classes + 1, np.int64))
        nd, gk = treap_nodes_nb(required_blocks, GK_NCOLS)
        for r in range(n):  # a node's class, aggregated as the max class of its subtree
            nd[r, ND_BASE] = pclass[r]
            nd[r, ND_MAXBASE] = pclass[r]
        stack = np.empty(n + 64, np.int64)  # treap path scratch
        bucket, n_buckets, bucket_top, bucket_lo = _buckets(pclass, n_classes)
        n_struct = n_groups * n_buckets
        by_id = _sort_stable(np.arange(n), request_id)
        id_rank = np.empty(n, np.int64)
        id_rank[by_id] = np.arange(n)
        w = _waiting(_static_order(policy, by_id, arrival_step, prompt_len, max_new_tokens, pclass, cache_hit,
                                   deadline_step, has_deadline),
                     group * n_buckets + bucket, n_struct, 2 if policy == E.POLICY_FCFS else 1, n_classes > n_buckets)
        cand = np.full(n_struct, -1, np.int64)  # each structure's first runnable waiting row
        cand_stale = np.ones(n_struct, np.bool_)  # its cand was taken: search again
        single = n_classes <= MAX_BUCKETS  # one class per bucket
        cand_limit = np.zeros(n_struct, np.int64)  # the limit its cand was found at (see `_refresh_cands`)
        heap = np.empty((n_groups, max(n, 1)), np.int64)
        hkey = np.empty((n_groups, max(n, 1)), np.int64)  # the rows' packed keys (`heap_push_nb`)
        hsize = np.zeros(n_groups, np.int64)
        pk = _heap_layout(policy, n_groups, group, n_classes, prompt_len, max_new_tokens, deadline_step)
        hcc = np.zeros(n, np.int64)  # see `_fresh_top`
        hpos = np.full(n, -1, np.int64)

        pos = 0
        clock = np.int64(0)
        free = np.int64(free_kv_blocks)
        capacity = np.int64(free_kv_blocks)
        steps = np.int64(0)
        unfinished = 0
        stop = E.STOP_DRAINED
        wait_dirty = True
        qs = np.zeros(QS_N, np.int64)  # see `_refresh_cands`
        changed = True  # free blocks or victims changed since the cands were found
        qs[QS_FREE_SEEN] = free
        qs[QS_MAX_BLOCKS] = _max_servable(required_blocks, capacity)
        best_wait = E.NO_ROW

        while True:
            if max_steps >= 0 and steps >= max_steps:
                stop = E.STOP_MAX_STEPS
                break
            while pos < n and arrival_step[order[pos]] <= clock:
                r = order[pos]
                pos += 1
                req.enqueued[r] = True
                enqueue_clock[r] = clock
                req.enqueue_steps[r] = steps
                unfinished += 1
                if required_blocks[r] > capacity:
                    continue  # can never be admitted: free never exceeds the capacity
                _set_key(r, policy, gk, req, enqueue_clock, request_id, id_rank, prompt_len, max_new_tokens, pclass,
                         cache_hit, deadline_step, has_deadline)
                b = bucket[r]
                s = group[r] * n_buckets + b
                _wait_add(w, s, r, stack, gk, nd)
                fits = required_blocks[r] <= (cand_limit[s] if single
                                              else free + seg_prefix_max_nb(v.seg, v.size, pclass[r]))
                if fits and (cand[s] == E.NO_ROW or key_less_nb(gk, r, cand[s])):
                    cand[s] = r
                    wait_dirty = True

            # The first runnable waiting request (cached while free blocks, victims and waiters stay).
            if wait_dirty or (deadline_policy and clock + E.NO_DEADLINE_SLACK <= max_deadline):
                # (under deadline, while a real slack may still reach the sentinel, the groups' order
                # can change with the clock: compare every step)
                if changed and single:  # free blocks or victims changed: check the cands
                    for s in range(n_struct):
                        b = s % n_buckets
                        limit = free + seg_prefix_max_nb(v.seg, v.size, bucket_top[b])
                        c = cand[s]
                        # a lower limit keeps a cand that still fits (nothing before it fitted at the higher one)
                        if cand_stale[s] or limit > cand_limit[s] or (c != E.NO_ROW and nd[c, ND_BLOCKS] > limit):
                            cand[s] = _wait_first_fit(w, s, limit, gk, nd)
                            cand_stale[s] = False
                        cand_limit[s] = limit
                    changed = False
                elif changed:
                    _refresh_cands(qs, free, v, n_buckets, n_classes, bucket_lo, bucket_top, pclass, cand, cand_stale,
                                   cand_limit, w, gk, nd, stack)
                    changed = False
                best_wait = E.NO_ROW
                for s in range(n_struct):
                    c = cand[s]
                    if c != E.NO_ROW and (best_wait == E.NO_ROW or _akey_less(c, best_wait, gk, deadline_policy,
                                                                          has_deadline, clock)):
                        best_wait = c
                wait_dirty = False

            chosen = best_wait
            for g in range(n_groups):
                if hsize[g] > 0:
                    c = heap[g, 0]
                    if chosen == E.NO_ROW or _akey_less(c, chosen, gk, deadline_policy, has_deadline, clock):
                        chosen = c

            if chosen == E.NO_ROW:
                if pos < n:
                    clock = arrival_step[order[pos]]  # idle gap: jump, nobody waits
                    continue
                stop = E.STOP_DRAINED if unfinished == 0 else E.STOP_STUCK
                break

            # A waiting chosen row is often cold with a large backlog: start the misses in its
            # per-request arrays together (see `replay_aging_nb`), every array its admission reads
            # (under fcfs with 1 M waiting, preemptions admit a cold row every ~80 steps).
            if chosen == best_wait:
                prefetch_nb(req.status, chosen)
                prefetch_nb(req.chosen_count, chosen)
                prefetch_nb(req.phase, chosen)
                prefetch_nb(req.generated, chosen)
                prefetch_nb(max_new_tokens, chosen)
                prefetch_nb(req.enqueue_steps, chosen)
                prefetch_nb(has_deadline, chosen)
                prefetch_nb(deadline_step, chosen)
                prefetch_nb(preemptible, chosen)
                prefetch_nb(req.admitted, chosen)
                prefetch_nb(required_blocks, chosen)
                prefetch_nb(pclass, chosen)
                prefetch_nb(bucket, chosen)
                prefetch_nb(group, chosen)
                prefetch_nb(w.rank, chosen)
                prefetch_nb(req.first_step, chosen)
                prefetch_nb(hpos, chosen)
            victim = E.NO_ROW
            was_admitted = req.admitted[chosen]
            if not was_admitted:
                need = nd[chosen, ND_BLOCKS]
                if need > free:
                    k = _seg_first_ge(v.seg, v.size, need - free)
                    # the lowest class with a victim large enough; it is below the challenger's class
                    if k < 0 or k >= pclass[chosen]:
                        raise AssertionError("fast kernel: no victim below the challenger's class")
                    victim = treap_first_nb(v.root[k], nd)
                    req.admitted[victim] = False
                    req.status[victim] = E.STATUS_PREEMPTED
                    req.preemptions[victim] += 1
                    free += required_blocks[victim]
                    _victims_drop(v, k, victim, stack, nd)
                    _fresh_top(heap, hkey, hsize, group[victim], gk, pk, hcc, req.chosen_count)
                    heap_remove_nb(heap, hkey, hsize, hpos, group[victim], victim, gk)
                    b = bucket[victim]
                    s = group[victim] * n_buckets + b
                    _wait_add(w, s, victim, stack, gk, nd)
                    if not single:
                        cand_stale[s] = True
                    elif required_blocks[victim] <= cand_limit[s] and (cand[s] == E.NO_ROW
                                                                       or key_less_nb(gk, victim, cand[s])):
                        cand[s] = victim
                b = bucket[chosen]
                s = group[chosen] * n_buckets + b
                _wait_remove(w, s, chosen, stack, gk, nd)
                cand_stale[s] = True
                free -= need
                req.admitted[chosen] = True
                wait_dirty = True
                changed = True
            req.status[chosen] = E.STATUS_RUNNING
            req.chosen_count[chosen] += 1

            action = advance_nb(chosen, clock, req, max_new_tokens)

            if action == E.ACTION_FINISH:
                free += required_blocks[chosen]
                req.admitted[chosen] = False
                req.status[chosen] = E.STATUS_FINISHED
                req.finish_step[chosen] = clock
                unfinished -= 1
                req.wait_final[chosen] = steps + 1 - req.enqueue_steps[chosen] - req.chosen_count[chosen]
                if was_admitted:
                    _fresh_top(heap, hkey, hsize, group[chosen], gk, pk, hcc, req.chosen_count)
                    heap_remove_nb(heap, hkey, hsize, hpos, group[chosen], chosen, gk)
                    if preemptible[chosen]:
                        _victims_drop(v, pclass[chosen], chosen, stack, nd)
                wait_dirty = True
                changed = True
            else:
                # The chosen request's key after its step, updated in place (a call passing a dozen
                # arrays costs more than the rest of a decode step): prefill -> decode, one token more,
                # one remaining step less (so deadline - remaining grows by one).
                if action == E.ACTION_PREFILL_TO_DECODE:
                    gk[chosen, 1] = E.PHASE_DECODE
                elif policy != E.POLICY_FCFS:
                    gk[chosen, 4] += 1
                if deadline_policy and has_deadline[chosen]:
                    gk[chosen, 0] += 1
                if was_admitted:
                    if policy != E.POLICY_FCFS:  # an fcfs decode key never changes
                        g = group[chosen]
                        i = hpos[chosen]
                        c = 2 * i + 1
                        # sift down only when a child now comes first (usually the top stays on top)
                        if c < hsize[g] and (key_less_nb(gk, heap[g, c], chosen)
                                             or (c + 1 < hsize[g] and key_less_nb(gk, heap[g, c + 1], chosen))):
                            # its packed key: the one written some decode steps ago (`_fresh_top`), moved
                            step = pk[g, PK_STEP]
                            if step >= 0:
                                hkey[g, i] += (req.chosen_count[chosen] - hcc[chosen]) * step
                            else:
                                hkey[g, i] = pack_key_nb(gk, chosen, pk, g)
                            hcc[chosen] = req.chosen_count[chosen]
                            heap_sift_down_nb(heap, hkey, hsize, hpos, g, i, gk)
                else:
                    g = group[chosen]
                    _fresh_top(heap, hkey, hsize, g, gk, pk, hcc, req.chosen_count)
                    hcc[chosen] = req.chosen_count[chosen]
                    heap_push_nb(heap, hkey, hsize, hpos, g, chosen, pack_key_nb(gk, chosen, pk, g), gk)
                    if preemptible[chosen]:
                        k = pclass[chosen]
                        if not single and required_blocks[chosen] > seg_prefix_max_nb(v.seg, v.size, k + 1):
                            # a new largest victim below the classes above k: more of them may run
                            qs[QS_GROW_FROM] = min(qs[QS_GROW_FROM], k + 1)
                        _victims_add(v, k, chosen, stack, nd)

            record_step_nb(events, steps, clock, chosen, action, req, max_new_tokens, deadline_step, has_deadline,
                           steps + 1 - req.enqueue_steps[chosen] - req.chosen_count[chosen], free, victim)
            clock += 1
            steps += 1

        write_state_nb(req_out, summary, steps, clock, free, stop, req)

    return _replay_static


_replay_static = _make_replay_static(SOURCE_STAMP)
