"""Array-based ordered structures for the fast kernel: treaps with a min-blocks aggregate, binary heaps.

Nodes are trace rows; a row is in at most one treap and at most one heap at a time, so all treaps
share the child arrays ``lt, rt`` and the aggregate ``mb`` (minimum ``required_blocks`` in the
subtree), and every treap is just a root index (-1 when empty).  Order is lexicographic on the rows
of an int64 key matrix ``gk`` (one row per trace row); a structure only ever holds rows whose keys
keep their relative order while they are in it (the fast kernel's groups guarantee this), so keys
may drift as a whole.  ``tp`` holds each node's random heap priority (a hash of the row: no state).

Expected cost: O(log n) per insert, delete and first-fit query.  Everything is iterative (recursive
Numba calls pass every array again and cost microseconds); ``stack`` is caller-owned scratch for
the path, of length n + 64 (a treap's depth is O(log n) with overwhelming probability).
"""

import numpy as np
from numba import njit


@njit(cache=True)
def key_less_nb(gk, a, b):
    """gk[a] < gk[b], lexicographically."""
    for k in range(gk.shape[1]):
        x = gk[a, k]
        y = gk[b, k]
        if x != y:
            return x < y
    return False


@njit(cache=True)
def treap_priorities_nb(n):
    """Deterministic pseudo-random priorities (splitmix64 of the row)."""
    tp = np.empty(n, np.uint64)
    for i in range(n):
        z = np.uint64(i + 1) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        tp[i] = z ^ (z >> np.uint64(31))
    return tp


@njit(cache=True)
def _pull(t, lt, rt, mb, blocks):
    m = blocks[t]
    c = lt[t]
    if c >= 0 and mb[c] < m:
        m = mb[c]
    c = rt[t]
    if c >= 0 and mb[c] < m:
        m = mb[c]
    mb[t] = m


@njit(cache=True)
def _attach(parent, right_side, child, root, lt, rt):
    """Hang `child` under `parent` (or make it the root); return the root."""
    if parent < 0:
        return child
    if right_side:
        rt[parent] = child
    else:
        lt[parent] = child
    return root


@njit(cache=True)
def _pull_path(stack, lo, hi, lt, rt, mb, blocks):
    for i in range(hi - 1, lo - 1, -1):
        _pull(stack[i], lt, rt, mb, blocks)


@njit(cache=True)
def _split(t, x, base, stack, gk, lt, rt, mb, blocks):
    """Split treap t into (keys < gk[x], keys >= gk[x]), iteratively; return both roots."""
    lroot = -1
    rroot = -1
    lhook = -1
    rhook = -1
    k = base
    while t >= 0:
        stack[k] = t
        k += 1
        if key_less_nb(gk, t, x):
            if lhook < 0:
                lroot = t
            else:
                rt[lhook] = t
            lhook = t
            t = rt[t]
        else:
            if rhook < 0:
                rroot = t
            else:
                lt[rhook] = t
            rhook = t
            t = lt[t]
    if lhook >= 0:
        rt[lhook] = -1
    if rhook >= 0:
        lt[rhook] = -1
    _pull_path(stack, base, k, lt, rt, mb, blocks)
    return lroot, rroot


@njit(cache=True)
def _merge(a, b, base, stack, lt, rt, tp, mb, blocks):
    """Merge two treaps, every key of a before every key of b, iteratively; return the root."""
    if a < 0:
        return b
    if b < 0:
        return a
    root = -1
    hook = -1
    right_side = False
    k = base
    while a >= 0 and b >= 0:
        if tp[a] > tp[b]:
            root = _attach(hook, right_side, a, root, lt, rt)
            stack[k] = a
            k += 1
            hook = a
            right_side = True
            a = rt[a]
        else:
            root = _attach(hook, right_side, b, root, lt, rt)
            stack[k] = b
            k += 1
            hook = b
            right_side = False
            b = lt[b]
    rest = a if a >= 0 else b
    if right_side:
        rt[hook] = rest
    else:
        lt[hook] = rest
    _pull_path(stack, base, k, lt, rt, mb, blocks)
    return root


@njit(cache=True)
def treap_insert_nb(t, x, stack, gk, lt, rt, tp, mb, blocks):
    """Insert row x into treap t; return the new root.  `stack`: scratch of length >= depth."""
    root = t
    parent = -1
    right_side = False
    sp = 0
    while t >= 0 and tp[t] > tp[x]:
        stack[sp] = t
        sp += 1
        parent = t
        right_side = not key_less_nb(gk, x, t)
        t = rt[t] if right_side else lt[t]
    a, b = _split(t, x, sp, stack, gk, lt, rt, mb, blocks)
    lt[x] = a
    rt[x] = b
    _pull(x, lt, rt, mb, blocks)
    root = _attach(parent, right_side, x, root, lt, rt)
    _pull_path(stack, 0, sp, lt, rt, mb, blocks)
    return root


@njit(cache=True)
def treap_delete_nb(t, x, stack, gk, lt, rt, tp, mb, blocks):
    """Remove row x (which must be in treap t); return the new root."""
    root = t
    parent = -1
    right_side = False
    sp = 0
    while t != x:
        stack[sp] = t
        sp += 1
        parent = t
        right_side = not key_less_nb(gk, x, t)
        t = rt[t] if right_side else lt[t]
    m = _merge(lt[x], rt[x], sp, stack, lt, rt, tp, mb, blocks)
    lt[x] = -1
    rt[x] = -1
    root = _attach(parent, right_side, m, root, lt, rt)
    _pull_path(stack, 0, sp, lt, rt, mb, blocks)
    return root


@njit(cache=True)
def treap_first_fit_nb(t, limit, lt, rt, mb, blocks):
    """The first row in key order with blocks <= limit, or -1 (a pruned left-first descent)."""
    if t < 0 or mb[t] > limit:
        return -1
    while True:
        c = lt[t]
        if c >= 0 and mb[c] <= limit:
            t = c
        elif blocks[t] <= limit:
            return t
        else:
            t = rt[t]


@njit(cache=True)
def treap_first_nb(t, lt):
    """The first row in key order, or -1."""
    if t < 0:
        return -1
    while lt[t] >= 0:
        t = lt[t]
    return t


# Binary min-heaps over rows, one per slot of a 2-D array ``heap[h]`` with sizes ``hsize[h]`` and
# the position of every row in its heap in ``pos`` (rows are in at most one heap at a time).

@njit(cache=True)
def heap_sift_up_nb(heap, hsize, pos, h, i, gk):
    x = heap[h, i]
    while i > 0:
        p = (i - 1) >> 1
        y = heap[h, p]
        if not key_less_nb(gk, x, y):
            break
        heap[h, i] = y
        pos[y] = i
        i = p
    heap[h, i] = x
    pos[x] = i


@njit(cache=True)
def heap_sift_down_nb(heap, hsize, pos, h, i, gk):
    n = hsize[h]
    x = heap[h, i]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and key_less_nb(gk, heap[h, c + 1], heap[h, c]):
            c += 1
        y = heap[h, c]
        if not key_less_nb(gk, y, x):
            break
        heap[h, i] = y
        pos[y] = i
        i = c
    heap[h, i] = x
    pos[x] = i


@njit(cache=True)
def heap_push_nb(heap, hsize, pos, h, x, gk):
    i = hsize[h]
    hsize[h] = i + 1
    heap[h, i] = x
    pos[x] = i
    heap_sift_up_nb(heap, hsize, pos, h, i, gk)


@njit(cache=True)
def heap_remove_nb(heap, hsize, pos, h, x, gk):
    i = pos[x]
    last = hsize[h] - 1
    hsize[h] = last
    pos[x] = -1
    if i == last:
        return
    y = heap[h, last]
    heap[h, i] = y
    pos[y] = i
    if i > 0 and key_less_nb(gk, y, heap[h, (i - 1) >> 1]):
        heap_sift_up_nb(heap, hsize, pos, h, i, gk)
    else:
        heap_sift_down_nb(heap, hsize, pos, h, i, gk)
