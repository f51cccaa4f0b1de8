"""A B+tree of rows with a min-blocks / max-base aggregate, for the aging kernel's large waiting halves.

A treap of `ordered_nb` is a node per trace row, so a descent through a structure of a million
rows reads a million-row array at scattered rows: a cache miss per level in the lower half of the
tree.  Here the entries live in the nodes, in key order, up to B to a node: a descent reads a few
nodes, rows next to each other in key order share a node, and the first rows of a structure (where
the aging kernel takes its requests) stay in the same few nodes.

Every node is a row of the int64 matrix ``bk`` (shape (n_nodes, BT_WIDTH), 64-byte aligned):

* columns BT_KP, BT_KT, BT_KI (B each): the entries' keys, field by field (a search reads one or two
  cache lines): a leaf entry's key is its row's (packed cache rank and -base, total_len,
  request_id); an internal entry's is a lower bound of its child's keys, above every key of the
  children before it (except for the first entry: only a lower bound);
* from BT_PAY, three columns per entry, entry by entry (a walk reads them in order): blocks (a leaf)
  or the subtree's minimum blocks (internal), base or the subtree's maximum base, the row or the
  child node (`bt_pay`);
* BT_CNT: the node's number of entries.

A descent takes the last child whose bound is at most the key (the first child if none).  ``meta``
holds the next never-used node (BM_BUMP) and the free list's length (BM_NFREE), its nodes in
``meta[BM_FREE:]``.  A structure is a root node and a height (0: the root is a leaf; root -1:
empty).  Every node but a root holds at least B / 2 entries (an internal root at least 2), except
the last leaf: a last leaf that is full when a row is appended to it stays full and a new last leaf
takes the row (rows inserted in key order fill their leaves).  So a structure of n rows has at most
n / (B / 2) + 1 leaves and (leaves + 1) / (B / 2 - 1) + height internal nodes.

Keys are unique (request ids are), so a key finds its row.  Cost of an insert or a delete: O(log_B n)
nodes read, O(B log_B n) instructions (entries move by ``llvm.memmove``).  Nothing allocates: the
caller sizes the pool (`bt_nodes_nb`) and passes a ``path`` of 2 * (height + 1) entries (node and
entry index per level; 64 is enough for any height int64 can count).
"""

from collections import namedtuple

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .ordered_nb import advise_huge_pages_nb

BT_B = 16  # entries per node
BT_KP = 0
BT_KT = BT_B
BT_KI = 2 * BT_B
BT_PAY = 3 * BT_B
BT_CNT = 6 * BT_B
BT_WIDTH = 6 * BT_B + 8  # 832 bytes: 13 cache lines
# Offsets within an entry's payload (see `bt_pay`).
PAY_BLOCKS = 0
PAY_BASE = 1
PAY_ROW = 2

# meta: the next never-used node, the free list's length, then the free list.
BM_BUMP = 0
BM_NFREE = 1
BM_FREE = 2

BIG = 2**62

# A pool of nodes: the node matrix and its allocator's state.
BTree = namedtuple("BTree", ("bk", "meta"))


# Not cached on its own: it calls a kernel of another file (see `stamp`); its callers' cache holds it.
@njit
def bt_nodes_nb(n_nodes):
    """A `BTree` pool of n_nodes nodes (64-byte aligned, on huge pages where Linux offers them; a node's
    memory is first written when it is first used)."""
    flat = np.empty((n_nodes + 1) * BT_WIDTH, np.int64)
    advise_huge_pages_nb(flat)
    addr = np.int64(flat.ctypes.data % 64)
    skip = ((64 - addr) % 64) // 8
    bk = flat[skip:skip + n_nodes * BT_WIDTH].reshape((n_nodes, BT_WIDTH))
    return BTree(bk=bk, meta=np.zeros(BM_FREE + n_nodes, np.int64))


@njit(cache=True, _nrt=False, inline="always")
def bt_pay(e):
    """The column of entry e's payload (blocks; base at +PAY_BASE, row or child at +PAY_ROW)."""
    return BT_PAY + 3 * e


@njit(cache=True, _nrt=False, inline="always")
def _alloc(t):
    meta = t.meta
    if meta[BM_NFREE] > 0:
        meta[BM_NFREE] -= 1
        return meta[BM_FREE + meta[BM_NFREE]]
    x = meta[BM_BUMP]
    meta[BM_BUMP] = x + 1
    return x


@njit(cache=True, _nrt=False, inline="always")
def _free(t, x):
    meta = t.meta
    meta[BM_FREE + meta[BM_NFREE]] = x
    meta[BM_NFREE] += 1


@njit(cache=True, _nrt=False, inline="always")
def _key_lt(bk, x, e, p, k, i):
    """(p, k, i) < entry e of node x."""
    a = bk[x, BT_KP + e]
    if p != a:
        return p < a
    a = bk[x, BT_KT + e]
    if k != a:
        return k < a
    return i < bk[x, BT_KI + e]


@njit(cache=True, _nrt=False, inline="always")
def bt_child_at_nb(bk, x, p, k, i):
    """The entry of internal node x whose subtree holds key (p, k, i)'s place: the last whose bound is
    at most the key (0 if none)."""
    c = bk[x, BT_CNT]
    j = 0
    for e in range(1, c):
        if _key_lt(bk, x, e, p, k, i):
            break
        j = e
    return j


@njit(cache=True, _nrt=False, inline="always")
def bt_leaf_after_nb(bk, x, p, k, i):
    """The first entry of leaf x with a key above (p, k, i) (its count if none)."""
    c = bk[x, BT_CNT]
    for e in range(c):
        if _key_lt(bk, x, e, p, k, i):
            return e
    return c


@intrinsic
def _memmove_row(typingctx, arr, x, dst, src, n):
    """Move n int64s of row x of the C-contiguous matrix arr from column src to column dst (the ranges
    may overlap): one ``llvm.memmove``."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.dtype == types.int64):
        return None

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        row, d, s, cnt = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], signature.args[1:])]
        pd = cgutils.get_item_pointer(context, builder, aryty, ary, [row, d], wraparound=False)
        ps = cgutils.get_item_pointer(context, builder, aryty, ary, [row, s], wraparound=False)
        cgutils.raw_memmove(builder, pd, ps, cnt, 8)
        return context.get_dummy_value()

    return types.void(arr, x, dst, src, n), codegen


@intrinsic
def _memcpy_rows(typingctx, arr, x, a, y, b, n):
    """Copy n int64s from row x, column a of the C-contiguous matrix arr to row y, column b (another
    row): one ``llvm.memcpy``."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.dtype == types.int64):
        return None

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        sx, sa, dy, db, cnt = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], signature.args[1:])]
        ps = cgutils.get_item_pointer(context, builder, aryty, ary, [sx, sa], wraparound=False)
        pd = cgutils.get_item_pointer(context, builder, aryty, ary, [dy, db], wraparound=False)
        cgutils.raw_memcpy(builder, pd, ps, cnt, 8)
        return context.get_dummy_value()

    return types.void(arr, x, a, y, b, n), codegen


@njit(cache=True, _nrt=False, inline="always")
def _move(bk, src, lo, hi, dst, at):
    """Entries lo..hi-1 of node src to node dst from entry `at` on (another node, or `at` <= lo)."""
    n = hi - lo
    if n > 0:
        if src == dst:
            for f in (BT_KP, BT_KT, BT_KI):
                _memmove_row(bk, dst, f + at, f + lo, n)
            _memmove_row(bk, dst, bt_pay(at), bt_pay(lo), 3 * n)
        else:
            for f in (BT_KP, BT_KT, BT_KI):
                _memcpy_rows(bk, src, f + lo, dst, f + at, n)
            _memcpy_rows(bk, src, bt_pay(lo), dst, bt_pay(at), 3 * n)


@njit(cache=True, _nrt=False, inline="always")
def _shift_up(bk, x, lo, c, d):
    """Move entries lo..c-1 of node x d places up."""
    n = c - lo
    if n > 0:
        for f in (BT_KP, BT_KT, BT_KI):
            _memmove_row(bk, x, f + lo + d, f + lo, n)
        _memmove_row(bk, x, bt_pay(lo + d), bt_pay(lo), 3 * n)


@njit(cache=True, _nrt=False, inline="always")
def _put(bk, x, e, p, k, i, blocks, base, row):
    bk[x, BT_KP + e] = p
    bk[x, BT_KT + e] = k
    bk[x, BT_KI + e] = i
    q = bt_pay(e)
    bk[x, q + PAY_BLOCKS] = blocks
    bk[x, q + PAY_BASE] = base
    bk[x, q + PAY_ROW] = row


@njit(cache=True, _nrt=False)
def bt_agg_nb(bk, x):
    """(min blocks, max base) over node x's entries."""
    m = np.int64(BIG)
    b = np.int64(-BIG)
    for e in range(bk[x, BT_CNT]):
        q = bt_pay(e)
        if bk[x, q + PAY_BLOCKS] < m:
            m = bk[x, q + PAY_BLOCKS]
        if bk[x, q + PAY_BASE] > b:
            b = bk[x, q + PAY_BASE]
    return m, b


@njit(cache=True, _nrt=False, inline="always")
def _set_child(bk, parent, j, x):
    """Entry j of `parent` describes node x: its bound (x's first key or bound), aggregates and node."""
    m, b = bt_agg_nb(bk, x)
    _put(bk, parent, j, bk[x, BT_KP], bk[x, BT_KT], bk[x, BT_KI], m, b, x)


@njit(cache=True, _nrt=False, inline="always")
def _set_agg(bk, parent, j, x):
    """Entry j of `parent` takes node x's aggregates; returns whether they changed."""
    m, b = bt_agg_nb(bk, x)
    q = bt_pay(j)
    if bk[parent, q + PAY_BLOCKS] == m and bk[parent, q + PAY_BASE] == b:
        return False
    bk[parent, q + PAY_BLOCKS] = m
    bk[parent, q + PAY_BASE] = b
    return True


@njit(cache=True, _nrt=False, inline="always")
def _place(bk, x, pos, lvl, p, k, i, blocks, base, row):
    """Open entry `pos` of node x (not full) and fill it: with the leaf entry (key, blocks, base, row) at
    lvl 0, with child node `row` above."""
    c = bk[x, BT_CNT]
    _shift_up(bk, x, pos, c, 1)
    bk[x, BT_CNT] = c + 1
    if lvl == 0:
        _put(bk, x, pos, p, k, i, blocks, base, row)
    else:
        _set_child(bk, x, pos, row)


@njit(cache=True, _nrt=False)
def bt_insert_nb(t, root, height, p, k, i, row, blocks, base, path):
    """Insert the entry (key (p, k, i), row, blocks, base); return the new (root, height)."""
    bk = t.bk
    if root < 0:
        x = _alloc(t)
        _put(bk, x, 0, p, k, i, blocks, base, row)
        bk[x, BT_CNT] = 1
        return x, np.int64(0)
    x = root
    last = True  # on the path to the last leaf
    for lvl in range(height, 0, -1):
        j = bt_child_at_nb(bk, x, p, k, i)
        path[2 * lvl] = x
        path[2 * lvl + 1] = j
        last = last and j == bk[x, BT_CNT] - 1
        if j == 0 and _key_lt(bk, x, 0, p, k, i):  # keep every bound a lower bound of its subtree
            bk[x, BT_KP] = p
            bk[x, BT_KT] = k
            bk[x, BT_KI] = i
        q = bt_pay(j)
        if bk[x, q + PAY_BLOCKS] > blocks:  # the subtree only gains the entry (a split below recomputes)
            bk[x, q + PAY_BLOCKS] = blocks
        if bk[x, q + PAY_BASE] < base:
            bk[x, q + PAY_BASE] = base
        x = bk[x, q + PAY_ROW]
    pos = bt_leaf_after_nb(bk, x, p, k, i)
    # Place the entry at `pos` of node x; when x is full it splits, and its new right sibling y is the
    # entry to place in the parent, one level up (at lvl > 0 `row` holds the new child).
    lvl = 0
    while True:
        if bk[x, BT_CNT] < BT_B:
            _place(bk, x, pos, lvl, p, k, i, blocks, base, row)
            return root, height
        y = _alloc(t)
        keep = BT_B if pos == BT_B and lvl == 0 and last else BT_B // 2
        _move(bk, x, keep, BT_B, y, 0)
        bk[x, BT_CNT] = keep
        bk[y, BT_CNT] = BT_B - keep
        tgt = x
        if pos > keep or keep == BT_B:
            tgt = y
            pos -= keep
        _place(bk, tgt, pos, lvl, p, k, i, blocks, base, row)
        lvl += 1
        if lvl > height:
            r = _alloc(t)
            bk[r, BT_CNT] = 2
            _set_child(bk, r, 0, x)
            _set_child(bk, r, 1, y)
            return r, height + 1
        parent = path[2 * lvl]
        j = path[2 * lvl + 1]
        _set_agg(bk, parent, j, x)  # x lost entries to y
        x = parent
        pos = j + 1
        row = y


@njit(cache=True, _nrt=False)
def bt_delete_nb(t, root, height, p, k, i, path):
    """Remove the entry with key (p, k, i), which must be there; return the new (root, height)."""
    bk = t.bk
    x = root
    for lvl in range(height, 0, -1):
        j = bt_child_at_nb(bk, x, p, k, i)
        path[2 * lvl] = x
        path[2 * lvl + 1] = j
        x = bk[x, bt_pay(j) + PAY_ROW]
    c = bk[x, BT_CNT]
    pos = 0
    while pos < c and not (bk[x, BT_KP + pos] == p and bk[x, BT_KT + pos] == k and bk[x, BT_KI + pos] == i):
        pos += 1
    if pos == c:
        raise AssertionError("bt_delete_nb: no such key")
    _move(bk, x, pos + 1, c, x, pos)
    bk[x, BT_CNT] = c - 1
    for lvl in range(1, height + 1):
        parent = path[2 * lvl]
        j = path[2 * lvl + 1]
        if bk[x, BT_CNT] >= BT_B // 2:
            if not _set_agg(bk, parent, j, x):
                return root, height  # nothing above changes
            x = parent
            continue
        # x is under half full: merge it with a sibling, or share their entries evenly.
        lj = j - 1 if j > 0 else j
        left = bk[parent, bt_pay(lj) + PAY_ROW]
        right = bk[parent, bt_pay(lj + 1) + PAY_ROW]
        nl = bk[left, BT_CNT]
        nr = bk[right, BT_CNT]
        pc = bk[parent, BT_CNT]
        if nl + nr <= BT_B:
            _move(bk, right, 0, nr, left, nl)
            bk[left, BT_CNT] = nl + nr
            _free(t, right)
            _move(bk, parent, lj + 2, pc, parent, lj + 1)
            bk[parent, BT_CNT] = pc - 1
            _set_agg(bk, parent, lj, left)
        else:
            half = (nl + nr) // 2
            if nl > half:  # left's last entries go to the front of right
                d = nl - half
                _shift_up(bk, right, 0, nr, d)
                _move(bk, left, half, nl, right, 0)
                bk[right, BT_CNT] = nr + d
            else:  # right's first entries go to the end of left
                d = half - nl
                _move(bk, right, 0, d, left, nl)
                _move(bk, right, d, nr, right, 0)
                bk[right, BT_CNT] = nr - d
            bk[left, BT_CNT] = half
            _set_child(bk, parent, lj, left)
            _set_child(bk, parent, lj + 1, right)
        x = parent
    # An internal root with one child gives way to it; an empty leaf root leaves nothing.
    while height > 0 and bk[root, BT_CNT] == 1:
        child = bk[root, bt_pay(0) + PAY_ROW]
        _free(t, root)
        root = child
        height -= 1
    if height == 0 and bk[root, BT_CNT] == 0:
        _free(t, root)
        return np.int64(-1), np.int64(0)
    return root, height


@njit(cache=True, _nrt=False)
def bt_rows_nb(t, root, height, out, stack):
    """Write the rows in key order into `out` and free every node; return their number.  `stack`: at
    least 2 * (height + 1) entries."""
    bk = t.bk
    n = 0
    if root < 0:
        return n
    sp = 0
    x = root
    lvl = height
    j = 0
    while True:
        c = bk[x, BT_CNT]
        if lvl == 0:
            for e in range(c):
                out[n] = bk[x, bt_pay(e) + PAY_ROW]
                n += 1
        elif j < c:
            stack[2 * sp] = x
            stack[2 * sp + 1] = j + 1
            sp += 1
            x = bk[x, bt_pay(j) + PAY_ROW]
            lvl -= 1
            j = 0
            continue
        _free(t, x)
        if sp == 0:
            return n
        sp -= 1
        x = stack[2 * sp]
        j = stack[2 * sp + 1]
        lvl += 1
