"""The aging kernel's B+tree (`kernels/btree_nb.py`) against a sorted Python list.

After every batch of random inserts and deletes the whole tree is checked: the entries in key order
equal the list's, every internal entry's aggregates (min blocks, max base) are its subtree's, every
bound is a lower bound of its subtree and above the keys of the children before it, every node but
the root and the last leaf is at least half full, the pool hands out exactly the nodes the tree
holds, and the node count stays within the bound the kernel sizes its pool by.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from decodesched.kernels.btree_nb import (
    BT_B,
    BT_CNT,
    BT_KI,
    BT_KP,
    BT_KT,
    BM_BUMP,
    BM_NFREE,
    PAY_BASE,
    PAY_BLOCKS,
    PAY_ROW,
    bt_delete_nb,
    bt_insert_nb,
    bt_nodes_nb,
    bt_pay,
    bt_rows_nb,
)


def _entries(bk, x):
    c = int(bk[x, BT_CNT])
    keys = [(int(bk[x, BT_KP + e]), int(bk[x, BT_KT + e]), int(bk[x, BT_KI + e])) for e in range(c)]
    pays = [tuple(int(bk[x, bt_pay(e) + f]) for f in (PAY_BLOCKS, PAY_BASE, PAY_ROW)) for e in range(c)]
    return keys, pays


def _check_node(bk, x, height, out, leaves, is_root):
    """Walk node x; append its leaf entries to `out`; return (min blocks, max base, first key, last
    key, nodes)."""
    keys, pays = _entries(bk, x)
    assert 0 < len(keys) <= BT_B, (x, len(keys))
    if height == 0:
        assert keys == sorted(keys) and len(set(keys)) == len(keys)
        leaves.append(len(keys))
        out.extend((k, p[2], p[0], p[1]) for k, p in zip(keys, pays))
        return min(p[0] for p in pays), max(p[1] for p in pays), keys[0], keys[-1], 1
    if not is_root:
        assert len(keys) >= BT_B // 2, ("internal node under half full", x, len(keys))
    else:
        assert len(keys) >= 2, "an internal root has at least two children"
    nodes = 1
    first = last = None
    for e, (bound, (minb, maxbase, child)) in enumerate(zip(keys, pays)):
        m, b, f, l, nn = _check_node(bk, child, height - 1, out, leaves, False)
        nodes += nn
        assert (minb, maxbase) == (m, b), ("aggregates", x, e)
        assert bound <= f, ("a bound above its subtree's first key", x, e)
        if e > 0:
            assert last < bound, ("a bound at or below the previous child's keys", x, e)
        first = f if first is None else first
        last = l
    return None if not pays else min(p[0] for p in pays), max(p[1] for p in pays), first, last, nodes


def check_tree(t, root, height, ref):
    """Assert the tree holds exactly `ref` ({key: (row, blocks, base)}) and every invariant; return its
    node count."""
    if root < 0:
        assert not ref and height == 0
        nodes = 0
    else:
        out, leaves = [], []
        *_, nodes = _check_node(t.bk, root, height, out, leaves, True)
        assert [(k, r, bl, bs) for k, r, bl, bs in out] == [(k, *v) for k, v in sorted(ref.items())]
        # every leaf but the last is at least half full (a root leaf may hold fewer)
        assert all(c >= BT_B // 2 for c in leaves[:-1]), leaves
        n = len(ref)
        assert nodes <= n / (BT_B // 2) + 1 + (n / (BT_B // 2) + 2) / (BT_B // 2 - 1) + height
    assert t.meta[BM_BUMP] - t.meta[BM_NFREE] == nodes  # the pool's nodes in use are the tree's
    return nodes


def _run(seed, n_ops, key_space, p_delete, appends=False):
    rng = random.Random(seed)
    t = bt_nodes_nb(n_ops + 64)
    path = np.zeros(64, np.int64)
    root, height = np.int64(-1), np.int64(0)
    ref = {}
    max_height = 0
    for op in range(n_ops):
        if ref and rng.random() < p_delete:
            keys = sorted(ref)
            key = keys[0] if rng.random() < 0.3 else rng.choice(keys)  # the kernel mostly takes the first
            root, height = bt_delete_nb(t, root, height, *key, path)
            del ref[key]
        else:
            while True:
                p = op if appends else rng.randrange(key_space)
                key = (p, rng.randrange(3), rng.randrange(-5, 5) * 1_000_003 + op)
                if key not in ref:
                    break
            blocks, base = rng.randrange(1, 9), rng.randrange(-100, 100)
            root, height = bt_insert_nb(t, root, height, *key, op, blocks, base, path)
            ref[key] = (op, blocks, base)
        max_height = max(max_height, int(height))
        if op % 61 == 0 or op == n_ops - 1:
            check_tree(t, root, height, ref)
    out = np.zeros(len(ref) + 1, np.int64)
    n = bt_rows_nb(t, root, height, out, np.zeros(64, np.int64))
    assert list(out[:n]) == [v[0] for _, v in sorted(ref.items())]
    assert t.meta[BM_BUMP] == t.meta[BM_NFREE], "bt_rows_nb frees every node"
    return max_height


@pytest.mark.parametrize("seed", range(6))
def test_btree_against_sorted_list(seed):
    heights = [
        _run(seed, 2500, 40, 0.45),          # many equal first key parts: ties on the later parts
        _run(seed + 100, 2500, 10**9, 0.3),  # grows to three levels
        _run(seed + 200, 3000, 10**9, 0.55),  # shrinks often: merges and redistributions
        _run(seed + 300, 1500, 10**9, 0.2, appends=True),  # keys in order: the last leaf stays full
    ]
    assert max(heights) >= 2


def test_btree_grows_and_shrinks_to_nothing():
    rng = random.Random(7)
    t = bt_nodes_nb(20_000)
    path = np.zeros(64, np.int64)
    root, height = np.int64(-1), np.int64(0)
    ref = {}
    for op in range(12_000):
        key = (rng.randrange(10**9), 0, op)
        blocks, base = rng.randrange(1, 9), rng.randrange(-50, 50)
        root, height = bt_insert_nb(t, root, height, *key, op, blocks, base, path)
        ref[key] = (op, blocks, base)
    assert height >= 3
    order = list(ref)
    rng.shuffle(order)
    for j, key in enumerate(order):
        root, height = bt_delete_nb(t, root, height, *key, path)
        del ref[key]
        if j % 997 == 0 or len(ref) < 40:
            check_tree(t, root, height, ref)
    assert root == -1 and height == 0
    assert t.meta[BM_BUMP] == t.meta[BM_NFREE]


def test_btree_appends_above_a_full_leaf_do_not_make_a_leaf_each():
    """Keys just above a full leaf, descending: only the last leaf may be split keeping it full, so
    these go through even splits and the node count keeps its bound."""
    t = bt_nodes_nb(5000)
    path = np.zeros(64, np.int64)
    root, height = np.int64(-1), np.int64(0)
    ref = {}
    for op in range(BT_B):
        key = (op * 10, 0, op)
        root, height = bt_insert_nb(t, root, height, *key, op, 1, 0, path)
        ref[key] = (op, 1, 0)
    for op in range(BT_B, 3000):
        key = (10**9 - op, 0, op)
        root, height = bt_insert_nb(t, root, height, *key, op, 1, 0, path)
        ref[key] = (op, 1, 0)
    check_tree(t, root, height, ref)


def test_deleting_a_missing_key_is_an_error():
    t = bt_nodes_nb(10)
    path = np.zeros(64, np.int64)
    root, height = bt_insert_nb(t, np.int64(-1), np.int64(0), 5, 0, 1, 0, 1, 0, path)
    with pytest.raises(AssertionError):
        bt_delete_nb(t, root, height, 6, 0, 1, path)
