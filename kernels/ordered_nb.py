"""Array-based ordered structures for the fast kernels (treaps with a min-blocks aggregate, rank trees,
binary heaps).

Nodes are trace rows; a row is in at most one treap and at most one heap at a time, so all treaps
share one node matrix ``nd`` (children, the aggregates ``minimum required_blocks`` and ``maximum
base priority`` of the subtree, the row's blocks, base and heap priority: one cache line per row),
and every treap is just a root index (-1 when empty).  Order is lexicographic on the rows of an
int64 key matrix ``gk`` (one row per trace row, in the cache line beside the row's node: see
`treap_nodes_nb`); a structure only ever holds rows whose keys keep their relative order while
they are in it (the fast kernel's groups guarantee this), so keys may drift as a whole.  Heap
priorities are a hash of the row: no random state.

Expected cost: O(log n) per insert, delete and first-fit query.  Everything is iterative (recursive
Numba calls pass every array again and cost microseconds); ``stack`` is caller-owned scratch for
the path, of length n + 64 (a treap's depth is O(log n) with overwhelming probability).
"""

import sys

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


@njit(cache=True, _nrt=False)
def key_less_nb(gk, a, b):
    """gk[a] < gk[b], lexicographically."""
    for k in range(gk.shape[1]):
        x = gk[a, k]
        y = gk[b, k]
        if x != y:
            return x < y
    return False


@intrinsic
def prefetch_nb(typingctx, arr, i):
    """Ask the CPU to start loading arr[i] into its caches (``llvm.prefetch``, for reading, high
    locality); no effect on results.  A kernel about to touch one cold row in many per-request arrays
    prefetches them all first, so their cache misses overlap instead of following one another."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        aryty, ity = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        ind = context.cast(builder, args[1], ity, types.intp)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [ind], wraparound=False)
        i32 = ir.IntType(32)
        byte_ptr = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, byte_ptr), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(arr, i), codegen


@intrinsic
def unlikely_nb(typingctx, cond):
    """`cond`, with the hint that it is rarely true (``llvm.expect``): LLVM then lays the code it
    guards out of the way of the hot path and places its register spills there.  No effect on results."""
    if not isinstance(cond, types.Boolean):
        return None

    def codegen(context, builder, signature, args):
        i1 = ir.IntType(1)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i1, [i1, i1]), "llvm.expect.i1")
        return builder.call(fn, [args[0], i1(0)])

    return types.boolean(cond), codegen


MADV_HUGEPAGE = 14  # Linux's madvise advice for transparent huge pages
HUGE_PAGE_BYTES = 2**21


@intrinsic
def advise_huge_pages_nb(typingctx, arr):
    """Ask Linux to back the 2 MiB-aligned part of arr's buffer with transparent huge pages
    (``madvise(MADV_HUGEPAGE)``; elsewhere, or for a buffer under 2 MiB, nothing).  Call it before the
    buffer is first written: pages already touched stay small.  No effect on results.  A structure of
    1 M rows spans 100+ MB: on 4 KiB pages nearly every cold row a walk touches also misses the TLB,
    on 2 MiB pages far fewer (numpy advises its own large arrays the same way; Numba does not).
    The node blocks use it, and the per-request state (`step_nb.new_requests_nb`: under aging with 1 M
    waiting, about 10% more events/s); arrays under 2 MiB (the Azure trace's) are left as they were."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, signature, args):
        if not sys.platform.startswith("linux"):
            return context.get_dummy_value()
        (aryty,) = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        i64 = ir.IntType(64)
        i32 = ir.IntType(32)
        byte_ptr = ir.IntType(8).as_pointer()
        start = builder.ptrtoint(ary.data, i64)
        end = builder.add(start, builder.mul(ary.nitems, ary.itemsize))
        mask = i64(~(HUGE_PAGE_BYTES - 1))
        lo = builder.and_(builder.add(start, i64(HUGE_PAGE_BYTES - 1)), mask)
        hi = builder.and_(end, mask)
        with builder.if_then(builder.icmp_unsigned("<", lo, hi)):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [byte_ptr, i64, i32]), "madvise")
            builder.call(fn, [builder.inttoptr(lo, byte_ptr), builder.sub(hi, lo), i32(MADV_HUGEPAGE)])
        return context.get_dummy_value()

    return types.void(arr), codegen


# Columns of the node matrix ``nd`` (int64, shape (n, ND_NCOLS)).
ND_LEFT = 0
ND_RIGHT = 1
ND_MINB = 2    # min blocks in the subtree
ND_BLOCKS = 3  # the row's own required_blocks
ND_PRIO = 4    # the node's heap priority
ND_BASE = 5    # a static part of the row's priority (aging), 0 elsewhere
ND_MAXBASE = 6  # max ND_BASE in the subtree
ND_NCOLS = 8   # 64 bytes, one spare
KEY_NCOLS = 8  # at most this many key columns sit beside each node
ROW_BYTES = 8 * (ND_NCOLS + KEY_NCOLS)


@njit(cache=True)
def treap_nodes_nb(blocks, key_cols):
    """A fresh node matrix and a zeroed key matrix of `key_cols` columns, row i of both in one aligned
    128-byte block (a descent reads a node and compares its key: two adjacent cache lines, which the
    hardware fetches together), on 2 MiB pages where Linux offers them (`advise_huge_pages_nb`: with
    1 M rows waiting, 128 MB that every walk reaches into at scattered rows; marginal events/s with
    1 M waiting 1.1-1.6x, same-run A/B).  No children; deterministic pseudo-random heap priorities
    (splitmix64 of the row)."""
    n = blocks.shape[0]
    width = ND_NCOLS + KEY_NCOLS
    flat = np.empty((n + 1) * width, np.int64)
    advise_huge_pages_nb(flat)  # before the first write
    flat[:] = 0
    addr = np.int64(flat.ctypes.data % ROW_BYTES)
    skip = ((ROW_BYTES - addr) % ROW_BYTES) // 8  # int64s to the first 128-byte boundary
    block = flat[skip:skip + n * width].reshape((n, width))
    nd = block[:, :ND_NCOLS]
    kk = block[:, ND_NCOLS:ND_NCOLS + key_cols]
    for i in range(n):
        z = np.uint64(i + 1) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
        nd[i, ND_LEFT] = -1
        nd[i, ND_RIGHT] = -1
        nd[i, ND_MINB] = blocks[i]
        nd[i, ND_BLOCKS] = blocks[i]
        nd[i, ND_PRIO] = np.int64(z >> np.uint64(1))
        nd[i, ND_BASE] = 0
        nd[i, ND_MAXBASE] = 0
    return nd, kk


@njit(cache=True, _nrt=False)
def _pull(t, nd):
    m = nd[t, ND_BLOCKS]
    b = nd[t, ND_BASE]
    c = nd[t, ND_LEFT]
    if c >= 0:
        if nd[c, ND_MINB] < m:
            m = nd[c, ND_MINB]
        if nd[c, ND_MAXBASE] > b:
            b = nd[c, ND_MAXBASE]
    c = nd[t, ND_RIGHT]
    if c >= 0:
        if nd[c, ND_MINB] < m:
            m = nd[c, ND_MINB]
        if nd[c, ND_MAXBASE] > b:
            b = nd[c, ND_MAXBASE]
    nd[t, ND_MINB] = m
    nd[t, ND_MAXBASE] = b


@njit(cache=True, _nrt=False)
def _attach(parent, right_side, child, root, nd):
    """Hang `child` under `parent` (or make it the root); return the root."""
    if parent < 0:
        return child
    if right_side:
        nd[parent, ND_RIGHT] = child
    else:
        nd[parent, ND_LEFT] = child
    return root


@njit(cache=True, _nrt=False)
def _pull_path(stack, lo, hi, nd):
    for i in range(hi - 1, lo - 1, -1):
        _pull(stack[i], nd)


@njit(cache=True, _nrt=False)
def _split(t, x, base, stack, kk, nd):
    """Split treap t into (keys < kk[x], keys >= kk[x]), iteratively; return both roots."""
    lroot = -1
    rroot = -1
    lhook = -1
    rhook = -1
    k = base
    while t >= 0:
        stack[k] = t
        k += 1
        if key_less_nb(kk, t, x):
            if lhook < 0:
                lroot = t
            else:
                nd[lhook, ND_RIGHT] = t
            lhook = t
            t = nd[t, ND_RIGHT]
        else:
            if rhook < 0:
                rroot = t
            else:
                nd[rhook, ND_LEFT] = t
            rhook = t
            t = nd[t, ND_LEFT]
    if lhook >= 0:
        nd[lhook, ND_RIGHT] = -1
    if rhook >= 0:
        nd[rhook, ND_LEFT] = -1
    _pull_path(stack, base, k, nd)
    return lroot, rroot


@njit(cache=True, _nrt=False)
def _merge(a, b, base, stack, nd):
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
        if nd[a, ND_PRIO] > nd[b, ND_PRIO]:
            root = _attach(hook, right_side, a, root, nd)
            stack[k] = a
            k += 1
            hook = a
            right_side = True
            a = nd[a, ND_RIGHT]
        else:
            root = _attach(hook, right_side, b, root, nd)
            stack[k] = b
            k += 1
            hook = b
            right_side = False
            b = nd[b, ND_LEFT]
    rest = a if a >= 0 else b
    if right_side:
        nd[hook, ND_RIGHT] = rest
    else:
        nd[hook, ND_LEFT] = rest
    _pull_path(stack, base, k, nd)
    return root


@njit(cache=True, _nrt=False)
def treap_insert_nb(t, x, stack, kk, nd):
    """Insert row x into treap t (ordered by the rows of kk); return the new root.
    `stack`: scratch of length >= the depth."""
    root = t
    parent = -1
    right_side = False
    sp = 0
    px = nd[x, ND_PRIO]
    while t >= 0 and nd[t, ND_PRIO] > px:
        stack[sp] = t
        sp += 1
        parent = t
        right_side = not key_less_nb(kk, x, t)
        t = nd[t, ND_RIGHT] if right_side else nd[t, ND_LEFT]
    a, b = _split(t, x, sp, stack, kk, nd)
    nd[x, ND_LEFT] = a
    nd[x, ND_RIGHT] = b
    _pull(x, nd)
    root = _attach(parent, right_side, x, root, nd)
    # The subtrees on the path only gained x: widen their aggregates (no child to read).
    blocks = nd[x, ND_BLOCKS]
    base = nd[x, ND_BASE]
    for i in range(sp):
        t = stack[i]
        if nd[t, ND_MINB] > blocks:
            nd[t, ND_MINB] = blocks
        if nd[t, ND_MAXBASE] < base:
            nd[t, ND_MAXBASE] = base
    return root


@njit(cache=True, _nrt=False)
def treap_delete_nb(t, x, stack, kk, nd):
    """Remove row x (which must be in treap t); return the new root."""
    root = t
    parent = -1
    right_side = False
    sp = 0
    while t != x:
        stack[sp] = t
        sp += 1
        parent = t
        right_side = not key_less_nb(kk, x, t)
        t = nd[t, ND_RIGHT] if right_side else nd[t, ND_LEFT]
    m = _merge(nd[x, ND_LEFT], nd[x, ND_RIGHT], sp, stack, nd)
    nd[x, ND_LEFT] = -1
    nd[x, ND_RIGHT] = -1
    root = _attach(parent, right_side, m, root, nd)
    # The subtrees on the path only lost x: recompute upwards until one keeps its aggregates (then
    # so do all above it).
    for i in range(sp - 1, -1, -1):
        t = stack[i]
        minb = nd[t, ND_MINB]
        maxbase = nd[t, ND_MAXBASE]
        _pull(t, nd)
        if nd[t, ND_MINB] == minb and nd[t, ND_MAXBASE] == maxbase:
            break
    return root


# Runnability of a waiting row (the fast kernels' query): blocks <= free + M(its class), where the
# staircase M(c) = max blocks among victims of a class below c is non-decreasing in c, given by its
# records (class st_c[j], blocks st_b[j]), j < k, both increasing.

@njit(cache=True, _nrt=False)
def seg_prefix_max_nb(seg, size, j):
    """The max of leaves [0, j) of the max segment tree `seg` of `size` leaves (at size + i), or 0."""
    res = np.int64(0)
    lo = size
    hi = j + size
    while lo < hi:
        if lo & 1:
            if seg[lo] > res:
                res = seg[lo]
            lo += 1
        if hi & 1:
            hi -= 1
            if seg[hi] > res:
                res = seg[hi]
        lo >>= 1
        hi >>= 1
    return res


@njit(cache=True, _nrt=False)
def stair_at_nb(c, st_c, st_b, k):
    """M(c): the blocks of the last record of a class below c, or 0.  With k < 0 there are too many
    records to write at every change (see `fast_nb._stairs`): `st_c` is then the victims' max segment
    tree of -k leaves (each class's largest victim blocks) and M(c) the max of its leaves below c."""
    if k < 0:
        return seg_prefix_max_nb(st_c, -k, c)
    lo = 0
    hi = k
    while lo < hi:
        mid = (lo + hi) >> 1
        if st_c[mid] < c:
            lo = mid + 1
        else:
            hi = mid
    return st_b[lo - 1] if lo > 0 else np.int64(0)


@njit(cache=True, _nrt=False)
def treap_first_fit_nb(t, limit, nd):
    """The first row in key order with blocks <= limit, or -1 (a pruned left-first descent)."""
    if t < 0 or nd[t, ND_MINB] > limit:
        return -1
    while True:
        c = nd[t, ND_LEFT]
        if c >= 0 and nd[c, ND_MINB] <= limit:
            t = c
        elif nd[t, ND_BLOCKS] <= limit:
            return t
        else:
            t = nd[t, ND_RIGHT]


@njit(cache=True, _nrt=False)
def treap_first_runnable_nb(root, free, nd, stack, st_c, st_b, k):
    """The first row in key order of treap `root` with blocks <= free + M(its class ND_BASE), or -1.

    An in-order walk that skips a subtree when even its highest class cannot cover its smallest
    blocks (``min blocks > free + M(max class)``; M is non-decreasing).  With one class in the treap
    that test is exact and the walk is one descent; otherwise only subtrees that straddle a step of
    M can be entered in vain.  `stack`: scratch of length >= the depth.  With no records (k = 0,
    M = 0) it is `treap_first_fit_nb` with limit `free`.
    """
    if k == 0:
        return treap_first_fit_nb(root, free, nd)
    sp = 0
    t = root
    while True:
        while t >= 0 and nd[t, ND_MINB] <= free + stair_at_nb(nd[t, ND_MAXBASE], st_c, st_b, k):
            stack[sp] = t
            sp += 1
            t = nd[t, ND_LEFT]
        if sp == 0:
            return -1
        sp -= 1
        t = stack[sp]
        if nd[t, ND_BLOCKS] <= free + stair_at_nb(nd[t, ND_BASE], st_c, st_b, k):
            return t
        t = nd[t, ND_RIGHT]


@njit(cache=True, _nrt=False)
def treap_rows_nb(t, out, stack, nd):
    """Write the rows of treap t in key order into `out`; return their number.  `stack`: room for
    the treap's depth."""
    n = 0
    sp = 0
    while True:
        while t >= 0:
            stack[sp] = t
            sp += 1
            t = nd[t, ND_LEFT]
        if sp == 0:
            return n
        sp -= 1
        t = stack[sp]
        out[n] = t
        n += 1
        t = nd[t, ND_RIGHT]


@njit(cache=True, _nrt=False)
def treap_first_nb(t, nd):
    """The first row in key order, or -1."""
    if t < 0:
        return -1
    while nd[t, ND_LEFT] >= 0:
        t = nd[t, ND_LEFT]
    return t


# Rank trees: for rows whose order never changes (fcfs: by arrival step, then request_id), a segment
# tree over their static ranks, in heap layout at vals[base : base + 2 * size] (leaf i at size + i,
# value = the row's blocks while it is in, RANK_OUT otherwise; node = min of its leaves), with the
# max class of its leaves beside it in cls (a leaf out of the tree: class -1).  Its top levels stay in
# cache and neighbouring ranks share cache lines, where a treap's nodes are scattered.

RANK_OUT = 2**62


@njit(cache=True, _nrt=False)
def rank_tree_set_nb(vals, cls, base, size, i, value, c):
    """Set leaf i to (blocks `value`, class `c`) and update its ancestors (min blocks, max class),
    stopping where one keeps both.  A `cls` of length 1 keeps no classes (a tree of one class)."""
    j = size + i
    vals[base + j] = value
    if cls.shape[0] == 1:
        j >>= 1
        while j >= 1:
            a = vals[base + 2 * j]
            b = vals[base + 2 * j + 1]
            m = a if a < b else b
            if vals[base + j] == m:
                break
            vals[base + j] = m
            j >>= 1
        return
    cls[base + j] = c
    j >>= 1
    while j >= 1:
        a = vals[base + 2 * j]
        b = vals[base + 2 * j + 1]
        m = a if a < b else b
        a = cls[base + 2 * j]
        b = cls[base + 2 * j + 1]
        x = a if a > b else b
        if vals[base + j] == m and cls[base + j] == x:
            break
        vals[base + j] = m
        cls[base + j] = x
        j >>= 1


@njit(cache=True, _nrt=False)
def rank_tree_first_fit_nb(vals, base, size, limit):
    """The least rank whose value is <= limit, or -1."""
    if vals[base + 1] > limit:
        return -1
    j = 1
    while j < size:
        j = 2 * j if vals[base + 2 * j] <= limit else 2 * j + 1
    return j - size


@njit(cache=True, _nrt=False)
def rank_tree_first_runnable_nb(vals, cls, base, size, free, st_c, st_b, k):
    """The least rank with blocks <= free + M(its class), or -1: the walk of
    `treap_first_runnable_nb` over the tree's nodes (a leaf's test is exact); with k = 0,
    `rank_tree_first_fit_nb` with limit `free`."""
    if k == 0:
        return rank_tree_first_fit_nb(vals, base, size, free)
    j = 1
    while True:
        if vals[base + j] <= free + stair_at_nb(cls[base + j], st_c, st_b, k):
            if j >= size:
                return j - size
            j = 2 * j
            continue
        while j & 1:  # to the next subtree to the right: up past every right child
            j >>= 1
        if j == 0:
            return -1
        j += 1


@njit(cache=True)
def pack_layout_nb(lo, hi):
    """The packing into 62 bits of key columns whose values lie in [lo[k], hi[k]]: returns (drop,
    shift), one per column: column k adds ``((v - lo[k]) >> drop[k]) << shift[k]`` when shift[k] >= 0
    (columns with lo > hi are left out).  Columns are taken whole in order while they fit; the first
    that does not gives its high bits (monotone in v) and the ones after it are left out, so that
    equal packed keys say nothing of the columns left out, and a smaller one always means a smaller
    key."""
    m = lo.shape[0]
    drop = np.zeros(m, np.int64)
    shift = np.full(m, -1, np.int64)
    bits = np.zeros(m, np.int64)
    room = 62
    for k in range(m):
        if lo[k] > hi[k]:
            continue
        span = hi[k] - lo[k]
        b = 0
        while span > 0:
            b += 1
            span >>= 1
        shift[k] = 0
        if b <= room:
            bits[k] = b
            room -= b
        else:
            drop[k] = b - room
            bits[k] = room
            break
    low = 0
    for k in range(m - 1, -1, -1):
        if shift[k] >= 0:
            shift[k] = low
            low += bits[k]
    return drop, shift


@njit(cache=True, _nrt=False)
def pack_key_nb(gk, r, pk, h):
    """Row r's packed key by layout h: row h of `pk` holds the m = ``gk.shape[1]`` columns' lo, then
    their drop and their shift (see `pack_layout_nb`)."""
    m = gk.shape[1]
    x = np.int64(0)
    for k in range(m):
        if pk[h, 2 * m + k] >= 0:
            x |= ((gk[r, k] - pk[h, k]) >> pk[h, m + k]) << pk[h, 2 * m + k]
    return x


# Binary min-heaps over rows, one per slot of a 2-D array ``heap[h]`` with sizes ``hsize[h]`` and
# the position of every row in its heap in ``pos`` (rows are in at most one heap at a time).  Beside
# each row its heap holds a packed key ``hkey[h, i]`` (`pack_key_nb`: the row's key, or a prefix of
# it, in one int64): entries compare by it, and by their key matrix rows ``gk`` only on a tie.  Where
# the whole key fits, a comparison reads one int64 beside each entry, where it read up to six
# columns of two scattered rows: rows of one priority taking turns (thousands admitted at once) sift
# down a heap at every step.

@njit(cache=True, _nrt=False, inline="always")
def pk_less_nb(ka, a, kb, b, gk):
    """Row a (packed key ka) before row b (packed key kb)."""
    if ka != kb:
        return ka < kb
    return key_less_nb(gk, a, b)


@njit(cache=True, _nrt=False)
def heap_sift_up_nb(heap, hkey, hsize, pos, h, i, gk):
    x = heap[h, i]
    kx = hkey[h, i]
    while i > 0:
        p = (i - 1) >> 1
        y = heap[h, p]
        ky = hkey[h, p]
        if not pk_less_nb(kx, x, ky, y, gk):
            break
        heap[h, i] = y
        hkey[h, i] = ky
        pos[y] = i
        i = p
    heap[h, i] = x
    hkey[h, i] = kx
    pos[x] = i


@njit(cache=True, _nrt=False)
def heap_sift_down_nb(heap, hkey, hsize, pos, h, i, gk):
    n = hsize[h]
    x = heap[h, i]
    kx = hkey[h, i]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and pk_less_nb(hkey[h, c + 1], heap[h, c + 1], hkey[h, c], heap[h, c], gk):
            c += 1
        y = heap[h, c]
        ky = hkey[h, c]
        if not pk_less_nb(ky, y, kx, x, gk):
            break
        heap[h, i] = y
        hkey[h, i] = ky
        pos[y] = i
        i = c
    heap[h, i] = x
    hkey[h, i] = kx
    pos[x] = i


@njit(cache=True, _nrt=False)
def heap_push_nb(heap, hkey, hsize, pos, h, x, kx, gk):
    """Row x, with packed key kx, into heap h."""
    i = hsize[h]
    hsize[h] = i + 1
    heap[h, i] = x
    hkey[h, i] = kx
    pos[x] = i
    heap_sift_up_nb(heap, hkey, hsize, pos, h, i, gk)


@njit(cache=True, _nrt=False)
def heap_remove_nb(heap, hkey, hsize, pos, h, x, gk):
    i = pos[x]
    last = hsize[h] - 1
    hsize[h] = last
    pos[x] = -1
    if i == last:
        return
    y = heap[h, last]
    ky = hkey[h, last]
    heap[h, i] = y
    hkey[h, i] = ky
    pos[y] = i
    p = (i - 1) >> 1
    if i > 0 and pk_less_nb(ky, y, hkey[h, p], heap[h, p], gk):
        heap_sift_up_nb(heap, hkey, hsize, pos, h, i, gk)
    else:
        heap_sift_down_nb(heap, hkey, hsize, pos, h, i, gk)
