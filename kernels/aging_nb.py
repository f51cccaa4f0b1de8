"""The fast kernel for policy aging (called by `fast_nb.replay_fast_nb`; same arguments and outputs).

With ``a = enqueue step + times chosen`` (steps counted as steps that ran), ``rho = a mod K`` and
``base = priority - (a - rho) / K`` (K = aging_interval), a request's effective priority after S
steps is ``priority + (S - a) // K = base + (S - rho) // K``.  A request's a, rho and base change
only when it is chosen, so inside one residue rho every effective priority rises at the same
steps (when ``S mod K == rho``) and the order by ``(phase, cache, -base, total_len, id)`` is static
(column 0 of the key matrix holds the residue's slot, equal within a structure).  When a request is
chosen, a grows by one: it moves to the next residue (on a wrap to residue 0, its base drops by one):

* waiting requests sit in four *parts* per residue (`Parts`): prefill-phase cache hits, prefill
  misses, preempted (decode-phase) hits, preempted misses, the order in which they sort, so that
  inside a part the order is ``(-base, total_len, id)``.  A part is a treap while small and a
  B+tree (`btree_nb`: 16 keys per node, each entry with its subtree's min blocks and max base) from
  BIG_AT rows on, back to a treap below SMALL_AT: with a million rows waiting, a walk or an update
  then reads O(log_16 n) nodes of a few cache lines each instead of O(log n) scattered treap nodes;
  admitted ones (all in decode phase) are a residue's *hot* row (the last one chosen into it) and a
  binary heap of the others, all heaps in one pool (`Admitted`, `_adm_put`), but for the *champion*
  (below); a heap only takes the row a hot one displaces; the real key across residues is compared
  with the effective priority at the current step;
* victims (admitted, preemptible) are a matrix in ascending order of ``w = priority * K - a``, with
  prefix maxima of their blocks.  A request's effective priority is ``(S + w) // K``, monotone in
  w at every step, so this order only changes when a victim is chosen (its w drops by one: at most
  a swap), and ``M(e)`` = max blocks among victims with effective priority below e is a binary
  search for ``w < e * K - S`` (priorities are first compressed so that w fits: gaps that waiting
  can never bridge are cut, see `_compressed_priorities`), started from the last answer for the
  same point (`_victims_below`: at the step a residue's priorities rise the limit is the same each
  time, and the victims rarely move);
* the first runnable waiting request of a part is a pruned in-order walk (`_first_runnable`,
  `_bt_first_runnable`): a subtree is skipped when ``min blocks > free + M(max base + shift)``.
  The answer is cached, with a *front* of at most FRONT points (blocks, base) such that every row
  before the answer has at least a point's blocks and at most its base (`_front_add`).  Since M
  only grows with the priority and a residue shares one shift, no row before the answer can run
  while no point can, so the part is walked again only when a point may run (checked when free
  blocks grow, a victim joins, the residue's priorities rise or a row joins before the answer),
  from its first row, or when its answer was taken, from that answer's key on, keeping the front
  (`_part_taken`; no row after that key has a higher base, so that walk caps every subtree's max
  base at the answer's: with 1 M waiting such a walk reads about one node, not six).  Per slot,
  ``slow`` keeps the fewest blocks of a point over its parts, so that a rise of free blocks passes
  over the slots none of whose points may run at one read each (`_mark_may_run`), and so does a
  residue's rise of priorities (`_parts_may_change`).  At a rise, the residue's points' limits for
  the victims (``w < (base + shift) * K - steps``) are those of its last rise, so when no part was
  walked then, a *certificate* (`_cert_holds`) spares the re-read while nothing that could make a
  point run has happened since: no front changed, no victim joined or moved but the champion (not
  yet past a point's limit), free blocks no more than then (on the Azure trace at load 1.5, at
  half the steps).  A cached answer that stopped running (victims' priorities only rise, free
  blocks shrink) is found at the top of the tournament tree below and re-walked there.

Residues are held lazily: a residue has a *slot* (its parts, heap, cached answers and shift) only
while some row sits in it, found through a small open-addressing table ``residue -> slot``; the
slots with waiting rows are kept as a compact list.  So memory is O(min(K, n)) whatever K is; at
the end of step S only the residue ``S mod K`` (one table lookup) has its shift raised.

The request a step runs is the top of a tournament tree over the slots (leaf: the first of the
slot's cached waiting answer and its first admitted row, by the real key; a node keeps its row
beside one packed key, phase, cache rank and effective priority in one int64 (``AK_TREE``), so
nodes compare in one comparison, and an empty node is keyed ``TB_NONE``).  Only slots that
changed are re-evaluated (queued as dirty, with what changed: `_mark`): the residue whose shift
rose, those whose membership changed, and every waiting one when free blocks grow or a victim
joins; a slot whose admitted rows alone changed keeps its cached waiting answers.  Elsewhere
runnability only shrinks (free blocks shrink, victims' priorities rise), so a cached answer can
only come too early; the top is checked and, if it no longer runs, its part re-walked, until the
top runs.  A dirty slot whose leaf is the same row, with the same key and shift, keeps its path in
the tree.

The last step's request, while it stays admitted, is the *champion*: it sits in no slot, and the
step compares it with the top of the tree (`_champ_first`).  A request runs several steps running
in the usual case (on the Azure trace, 79% of the steps at load 1.0, 93% at 1.5), and while it does,
its effective priority stays (a grows with the steps) and only its total_len grows: its step
touches no slot, heap or leaf, where moving it to its next residue would dirty two slots a step.
When the top comes first, the champion goes back to its residue's slot before that step (its
residue and base from its a), so a victim search or a later step finds it there.

Cost per step: O(D (F log V + log R)) for D dirty slots (about 1 on a step of the champion: the
residue whose shift rose; after a finish, preemption or a preemptible admission also the non-empty
ones whose front may run, found by a scan of `slow` over all R of them, R <= min(K, requests in the
system)), F = FRONT and V = admitted preemptible requests (a victim joining or leaving costs O(V)
once; none are kept where the capacity holds every servable request at once: `_never_short`); O(log A) heap work when the champion goes back to its slot and displaces a hot row (A
admitted), O(log n) treap or B+tree work when the chosen request or its victim was waiting; and the
walks of parts whose front may run: O(log n) when the bound prunes well, but not bounded by it in
the worst case (a subtree can pass the bound without a runnable row).  With many non-empty residues
at heavy load, a finish lets the rows of hundreds of residues run until the next admission takes the
blocks back: each is walked when marked, and again when its answer, no longer running, reaches the
top of the tree (the Azure trace at load 1.5, 8,000 blocks, K = 100000: about 3,500 residues, 6.8
walks per step, 10-20 s; K = 4: 0.13 walks per step).  Hence grouped mode for long intervals, and
block mode for middle ones at heavy load.

**Grouped mode** (an interval of at least n, n requests, or of at least n / GROUPED_DIV unless the
trace's backlog makes its moves dear: `_grouped_mode`): with r = steps mod K and
q = steps // K, a row's effective priority is ``base + q - [rho > r]``, so the rows in slots split
into two groups of one shift each: slot ``ga`` holds those whose residue rose this cycle (rho <= r,
shift q), slot ``gb`` the others (shift q - 1), each in the same static order as a residue's slot.
At the end of a step the rows of the residue that rises (linked in a list per residue, found
through the table) move from gb to ga, keeping their base (`_rise_grouped`); when a cycle ends gb
is empty and the slots swap roles (ga keeps its shift as the new gb).  So a finish or a new victim
marks at most two slots, and a step walks at most eight parts, as under fixed_priority; the price
is one move per row per K steps: about (rows waiting) / K B+tree or treap moves a step, which is
why shorter intervals keep a slot per residue (on the Azure trace a slot per residue alone and
grouped mode cross between n / 19 and n / 8 at load 1.5, near n / 8 at load 1.0; with block mode
below it, the crossing moves to about n / 4: at n / 7.7 to n / 4 block mode took 0.45-0.97 of
grouped mode's time in every cell tried).  Above n / 4 the crossing depends on the trace: the moves
are about (requests in the system) / K a step, block mode's marks about 2 sqrt(K) per finish, so
between n / 4 and n the kernel estimates the backlog and the finishes from the trace alone (a fluid
queue: `_fluid_backlog`) and compares the two (at load 1.5, K = 5,000: block mode in 0.42-0.65 of
grouped mode's time; at load 1.0, 1.08-1.25; on backlogs of short requests, 1.4-3.0).
Every aging interval runs here (`fast_nb` replays an interval above the trace's total work steps as
fixed_priority, and on the scan kernel a trace whose priorities this kernel's int64 keys cannot hold:
`_compressed_priorities`).

**Block mode** (below grouped mode, from an interval of BLOCK_MIN on, when the counts below say):
the residues are cut into blocks of bw = max(2, isqrt(K)) consecutive ones (the last may be
shorter), and every waiting row is held twice: in its residue's slot as above, and in a part of its
block's slot (slot m_res + rho // bw after the residues' m_res; always a B+tree, since a row's
treap node can sit in one treap only).  A block's slot is valued at the shift of its residues that
have not risen this cycle (all of them, from the end of its last residue's rise to its first one's
next rise), and its parts, in the static order of that shift, answer for those rows; a residue
that rises goes `live` (`_set_live`: its slot's waiting rows answer for it) until its block's last
residue rises, when the block's shift rises by one and its residues' slots stop being live
(`_block_end`).  So the block holding steps mod K also still holds its risen residues' rows, one
below their effective priority.  That copy never decides a step: it runs at most when the row runs
in its live residue's slot, whose cached answer (which only comes too early) is at or before the
row at a higher priority; the tournament tree's top is at or before the copy, and the top taken
from a block's leaf is told by its residue's leaf (`tb`), so only a block's own cached answer is
re-walked as such.  A finish or a new victim then marks at most the blocks and the risen residues
of one block, about 2 sqrt(K) slots, not every residue whose front may run, and reads no other
slot for that (the list of slots with waiting rows keeps the live ones first: `_list_add`); the
price is that each residue's slot goes live at its rise (its cached answers and fronts, kept while
it was not live by the rows joining and leaving, read again then, as a rise reads them anyway) and
back at its block's end (its leaf set again): a leaf set again per residue with waiting rows per K
steps, against a re-read per marked residue per finish without blocks.  Which is cheaper
depends on the load as much as on K, so the kernel counts, over at least max(K, n) steps (a switch
rebuilds or frees the blocks' parts: O(n)), the residues' slots that finishes and new victims mark
(or would mark, in block mode, where the slots that are not live are counted from a window of them
taken in turn, so that a finish reads about 2 sqrt(K) + TALLY_WINDOW slots, not every residue's:
`_mark_may_run`) against those held, and turns block mode on above
BLOCKS_ON_NUM / BLOCKS_ON_DEN a slot a cycle and off below BLOCKS_OFF_NUM / BLOCKS_OFF_DEN
(`_want_blocks`; switches happen at a cycle's start, `_blocks_on`, `_blocks_off`).  On the Azure
trace at load 1.5 (3 classes, 8,000 blocks) the count is about 10 at K = 1,000 and block mode
replays in 2.6 s what took 6.6-7.1 s; at load 1.0 about 0.1-2, and it stays off.
"""

from collections import namedtuple

import numpy as np
from numba import njit

from . import enums as E
from .ordered_nb import (
    ND_BASE,
    ND_BLOCKS,
    ND_LEFT,
    ND_MAXBASE,
    ND_MINB,
    ND_RIGHT,
    prefetch_nb,
    treap_delete_nb,
    treap_insert_nb,
    treap_nodes_nb,
    treap_rows_nb,
    unlikely_nb,
)
from .btree_nb import (
    BT_CNT,
    PAY_BASE,
    PAY_BLOCKS,
    PAY_ROW,
    bt_child_at_nb,
    bt_delete_nb,
    bt_insert_nb,
    bt_leaf_after_nb,
    bt_nodes_nb,
    bt_pay,
    bt_rows_nb,
)
from .step_nb import advance_nb, new_requests_nb, record_step_nb, write_state_nb
from .stamp import source_stamp

SOURCE_STAMP = source_stamp("enums.py", "ordered_nb.py", "btree_nb.py", "step_nb.py")

# Points kept per residue to bound the rows before its cached answer (see `_front_add`).
FRONT = 12
# A part holds its rows in a treap while small and in a B+tree (`btree_nb`) from BIG_AT rows on, back
# in a treap below SMALL_AT (see `_wait_insert`; the tests build a kernel with smaller values).
BIG_AT = 64
SMALL_AT = 32
BIG = 2**62
# From this many requests on, a part's next answer is likely out of cache when it comes up (their rows
# and state, about 300 bytes each, outgrow the caches), so a new answer's successor is prefetched too.
COLD_AT = 1 << 16
# Grouped mode (see the module docstring) from an interval of 1 / GROUPED_DIV of the requests on: always
# from the requests' number or GROUPED_ALL_SLOTS on, and between the two unless the trace's backlog
# makes its moves dear, by GROUPED_RATIO (see `_grouped_mode`).
GROUPED_DIV = 4
GROUPED_ALL_SLOTS = 2**18
GROUPED_RATIO = 1.25
# Below that, blocks of residues (see the module docstring) may be used from an interval of BLOCK_MIN
# on, when the rule says (BLOCKS_*: never, by the cost counts of `_want_blocks`, always, every other
# cycle: the last two for the tests).
BLOCK_MIN = 128
BLOCKS_NEVER = 0
BLOCKS_COUNTED = 1
BLOCKS_ALWAYS = 2
BLOCKS_ALTERNATE = 3
# `_want_blocks`: block mode from (residues' slots made dirty) / (residues' slots) > ON_NUM / ON_DEN
# over the cycles since the last decision, back below OFF_NUM / OFF_DEN.
BLOCKS_ON_NUM = 3
BLOCKS_ON_DEN = 1
BLOCKS_OFF_NUM = 2
BLOCKS_OFF_DEN = 1
# ... counting the slots of the residues that are not live from this many of them a time, in turn
# (`_mark_may_run`).
TALLY_WINDOW = 64

# Columns of the aging key matrix: the residue's slot, phase and cache rank (``2 * phase + rank``),
# cache rank, -base, total_len, request_id.
AK_SLOT = 0
AK_PHASE_CACHE = 1
AK_CACHE = 2
AK_NEG_BASE = 3
AK_TOTAL_LEN = 4
AK_ID = 5
AK_PACKED = 6  # cache rank and -base in one int64, for the admitted heaps (see `_set_aging_key`)
AK_TREE = 7  # phase, cache rank and -base in one int64, for the tournament tree (see `_set_aging_key`)
AK_NCOLS = 8
CACHE_BIT = 2**62

# Columns of a part's taken-answer key (see `_part_taken`).
RK_PACKED = 0
RK_TOTAL_LEN = 1
RK_ID = 2
RK_BASE = 3  # its base: no row after it has a higher one
RK_NCOLS = 4

# Columns of the heap table (see `_adm_put`).
HM_LO = 0
HM_CAP = 1
HM_N = 2
HM_HOT = 3
HM_NCOLS = 4

# The waiting rows of the slots by part: part PARTS * s + c holds slot s's waiting rows whose phase and
# cache rank are c = 2 * phase + rank (AK_PHASE_CACHE): prefill hits, prefill misses, preempted
# (decode-phase) hits, preempted misses, the order in which they sort.  One entry per part:
PARTS = 4
Parts = namedtuple("Parts", (
    "root",   # its treap's root (or B+tree's root node), -1 when empty
    "cand",   # its first runnable row when last walked, -1 for none
    "fb",     # its front (see `_front_add`): points (fb[q, i], fx[q, i]), i < fn[q], bounding the rows
    "fx",     # before cand (all rows when cand is -1); the part is walked again only when a point may
    "fn",     # run, or when its answer was taken
    "fj",     # per point, the guess for `_victims_below`
    "rk",     # the key of its answer, once it was taken (`_part_taken`), and whether it was
    "taken",
    "size",   # its rows
    "big",    # whether they are in a B+tree (root: its root node, of `height` levels above the leaves)
    "height",
    "nxt",    # B+tree parts: the row after its last answer in the answer's leaf (-1: none), a prefetch hint
))


@njit(cache=True)
def _new_parts(m):
    """The `Parts` of m empty slots."""
    n = PARTS * m
    return Parts(
        root=np.full(n, -1, np.int64),
        cand=np.full(n, -1, np.int64),
        fb=np.zeros((n, FRONT + 1), np.int64),
        fx=np.zeros((n, FRONT + 1), np.int64),
        fn=np.zeros(n, np.int64),
        fj=np.zeros((n, FRONT + 1), np.int64),
        rk=np.zeros((n, RK_NCOLS), np.int64),
        taken=np.zeros(n, np.bool_),
        size=np.zeros(n, np.int64),
        big=np.zeros(n, np.bool_),
        height=np.zeros(n, np.int64),
        nxt=np.full(n, -1, np.int64),
    )


# The admitted rows of the slots (see `_adm_put`): a pool of heaps, a table with a row per slot
# (columns HM_*) and one more for the pool, each row's place in its heap, scratch for repacking.
Admitted = namedtuple("Admitted", ("pool", "meta", "pos", "tmp"))


@njit(cache=True)
def _new_admitted(n, m):
    """The `Admitted` of m empty slots, for n rows: a pool of 4 places per row."""
    meta = np.zeros((m + 1, HM_NCOLS), np.int64)
    meta[:m, HM_HOT] = -1
    meta[m, HM_CAP] = 4 * n + 4
    return Admitted(pool=np.empty(4 * n + 4, np.int64), meta=meta, pos=np.full(n, -1, np.int64),
                    tmp=np.empty(4 * n + 4, np.int64))


# Flags of a dirty slot (see `_mark`): its leaf may be out of date; its waiting rows' answers may be
# (waiting rows joined or left, or more of them may run); its leaf's key or shift changed; its
# residue's priorities rose (its answers may change too, unless its certificate holds: `_cert_holds`).
DIRTY_LEAF = 1
DIRTY_WAIT = 2
DIRTY_KEY = 4
DIRTY_RISE = 8

# Columns of a slot's certificate (see `_cert_holds`), as it was taken: the free blocks, the highest
# limit of a point that the champion was not below (`_cert_lcrit`; -BIG: none, or the champion cannot
# make a point run; BIG: not computed yet), the victims' version (-1: no certificate), the champion,
# its w, and the last part whose front the certificate covers.
CT_FREE = 0
CT_LCRIT = 1
CT_VER = 2
CT_CHAMP = 3
CT_W = 4
CT_PART = 5
CT_NCOLS = 6

# Columns of the victim matrix (see `_victims_add`).
VC_W = 0
VC_ROW = 1
VC_BLOCKS = 2
VC_PMAX = 3
VC_NCOLS = 4


# The fields of a node i of the tournament tree ``tb`` (see `_tree_set`), at ``TB_NCOLS * i``: a 1-D
# array, so that a node's place is a shift (a 2-D one's row stride is a multiplication), and a node's
# two children share 32 bytes.
TB_ROW = 0
TB_KEY = 1
TB_NCOLS = 2
# A tree key's phase and cache rank, above 62 bits of -effective priority (see `_set_aging_key`).
TREE_BIT = 2**62
TREE_LOW = TREE_BIT - 1
TB_NONE = 2**63 - 1  # the key of an empty node


@njit(cache=True, _nrt=False, inline="always")
def _real_less(ka, ra, kb, rb, gk):
    """Row ra before row rb by the real key at the current step, of any residues: their tree keys
    (phase, cache rank and -effective priority: ka, kb), then total_len and request_id from gk."""
    if ka != kb:
        return ka < kb
    if gk[ra, AK_TOTAL_LEN] != gk[rb, AK_TOTAL_LEN]:
        return gk[ra, AK_TOTAL_LEN] < gk[rb, AK_TOTAL_LEN]
    return gk[ra, AK_ID] < gk[rb, AK_ID]


@njit(cache=True, _nrt=False, inline="always")
def _champ_first(c, c_key, t, tb, gk):
    """Whether the champion c (tree key c_key) comes before the top t of the tournament tree (-1:
    there is none)."""
    return t < 0 or _real_less(c_key, c, tb[TB_NCOLS + TB_KEY], t, gk)


@njit(cache=True, _nrt=False, inline="always")
def _slot_less(gk, a, b):
    """Row a before row b, both of one slot (column 0 equal): `key_less_nb` unrolled, with phase,
    cache rank and -base packed (AK_TREE)."""
    if gk[a, AK_TREE] != gk[b, AK_TREE]:
        return gk[a, AK_TREE] < gk[b, AK_TREE]
    if gk[a, AK_TOTAL_LEN] != gk[b, AK_TOTAL_LEN]:
        return gk[a, AK_TOTAL_LEN] < gk[b, AK_TOTAL_LEN]
    return gk[a, AK_ID] < gk[b, AK_ID]


@njit(cache=True, _nrt=False, inline="always")
def _room_any(free, n_v, vic):
    """The room at any priority: free blocks plus the largest victim's (M never exceeds that)."""
    return free + (vic[n_v - 1, VC_PMAX] if n_v > 0 else 0)


@njit(cache=True, _nrt=False, inline="always")
def _fits(b, e, free, n_v, vic, steps, k):
    """Whether b blocks fit in the free blocks plus those of one victim with effective priority < e:
    ``b <= free + M(e)``, M(e) = max blocks among such victims (0 if none), the victims with
    ``(steps + w) // K < e``, that is ``w < e * K - steps``: a prefix of the victim matrix.  It is
    only searched when b lies between free and free + the largest victim's blocks."""
    if b <= free:
        return True
    if n_v == 0 or b > free + vic[n_v - 1, VC_PMAX]:
        return False
    j = _victims_search(e * k - steps, n_v, vic)
    return j > 0 and b <= free + vic[j - 1, VC_PMAX]


@njit(cache=True, _nrt=False, inline="always")
def _victims_search(lim, n_v, vic):
    """The number of victims with ``w < lim`` (a prefix of the victim matrix): a binary search."""
    lo = 0
    hi = n_v
    while lo < hi:
        mid = (lo + hi) >> 1
        if vic[mid, VC_W] < lim:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, _nrt=False, inline="always")
def _front_add(s, b, x, fb, fx, fn):
    """Add the point (blocks b, base x) to slot s's front: points (fb[s, i], fx[s, i]), i < fn[s],
    bases descending, such that every row before the slot's cached answer has blocks >= fb and base
    <= fx of some point.  A row with fewer blocks and a higher base runs whenever the row does (M
    only grows with the priority, and the residue shares one shift), so dominated points are dropped
    (the blocks then descend with the bases); past FRONT points the two with the closest bases merge
    into (fewer blocks, higher base)."""
    n = fn[s]
    # The points with base >= x are a prefix; the last of them has the fewest blocks.
    j = n
    while j > 0 and fx[s, j - 1] < x:
        j -= 1
    if j > 0 and fb[s, j - 1] <= b:
        return  # dominated
    # The points the new one dominates (base <= x, blocks >= b) are a run starting at lo.
    lo = j - 1 if j > 0 and fx[s, j - 1] == x else j
    hi = lo
    while hi < n and fb[s, hi] >= b:
        hi += 1
    # Replace fx/fb[lo:hi] by the new point.
    shift = 1 - (hi - lo)
    if shift > 0:
        for i in range(n - 1, hi - 1, -1):
            fx[s, i + 1] = fx[s, i]
            fb[s, i + 1] = fb[s, i]
    elif shift < 0:
        for i in range(hi, n):
            fx[s, i + shift] = fx[s, i]
            fb[s, i + shift] = fb[s, i]
    fx[s, lo] = x
    fb[s, lo] = b
    k = n + shift
    if k > FRONT:
        j = 0
        for i in range(1, k - 1):
            if fx[s, i] - fx[s, i + 1] < fx[s, j] - fx[s, j + 1]:
                j = i
        fb[s, j] = fb[s, j + 1]
        for i in range(j + 1, k - 1):
            fx[s, i] = fx[s, i + 1]
            fb[s, i] = fb[s, i + 1]
        k -= 1
    fn[s] = k


@njit(cache=True, _nrt=False, inline="always")
def _victims_below(lim, n_v, vic, j):
    """`_victims_search` from the guess j: checked in O(1), searched only when wrong."""
    if j > n_v:
        j = n_v
    if (j == 0 or vic[j - 1, VC_W] < lim) and (j == n_v or vic[j, VC_W] >= lim):
        return j
    return _victims_search(lim, n_v, vic)


@njit(cache=True, _nrt=False, inline="always")
def _front_may_run(s, free, shift, h, n_v, vic, steps, k):
    """Whether a row before slot s's cached answer may run now.  Point i
    runs when its blocks fit in free + M(its base + shift), the prefix maxima of the victims with
    ``w < (base + shift) * K - steps``; fj[s, i] keeps that prefix's length from the last check as
    the guess for the next (at the step when a residue's priorities rise the limit is the same
    each time, ``base * K - rho``, and the victims rarely move)."""
    fb = h.fb
    fx = h.fx
    fj = h.fj
    n = h.fn[s]
    # The last point has the fewest blocks (see `_front_add`): it alone decides when it fits in the
    # free blocks, or not even with the largest victim's.
    last = fb[s, n - 1] if n > 0 else np.int64(0)
    top = _room_any(free, n_v, vic)
    if n == 0 or last > top:
        return False
    if last <= free:
        return True
    for i in range(n):
        b = fb[s, i]
        if b > top:
            continue  # not even with the largest victim
        j = _victims_below((fx[s, i] + shift) * k - steps, n_v, vic, fj[s, i])
        fj[s, i] = j
        room = free + (vic[j - 1, VC_PMAX] if j > 0 else 0)
        if b <= room:
            return True
        # The later points have lower bases (M no larger) and at least the last one's blocks: when
        # even those leave the room, none of them fits.
        if last > room:
            return False
    return False


@njit(cache=True, _nrt=False, inline="always")
def _after_taken(gk, t, rk, q):
    """Row t of part q after the part's taken answer, whose key `_part_taken` kept in rk[q]: cache rank
    and -base (packed), total_len, request_id (the phase is the part's)."""
    if gk[t, AK_PACKED] != rk[q, RK_PACKED]:
        return gk[t, AK_PACKED] > rk[q, RK_PACKED]
    if gk[t, AK_TOTAL_LEN] != rk[q, RK_TOTAL_LEN]:
        return gk[t, AK_TOTAL_LEN] > rk[q, RK_TOTAL_LEN]
    return gk[t, AK_ID] > rk[q, RK_ID]


@njit(cache=True, _nrt=False, inline="always")
def _part_taken(q, r, gk, h):
    """Part q's cached answer r was chosen (and left the part): the next answer comes after its key,
    kept in rk[q] (r's own key changes as it runs on)."""
    h.rk[q, RK_PACKED] = gk[r, AK_PACKED]
    h.rk[q, RK_TOTAL_LEN] = gk[r, AK_TOTAL_LEN]
    h.rk[q, RK_ID] = gk[r, AK_ID]
    h.rk[q, RK_BASE] = -gk[r, AK_NEG_BASE]
    h.taken[q] = True
    h.cand[q] = -1


@njit(cache=True, _nrt=False)
def _first_runnable(s, root, free, shift, nd, gk, stack, n_v, vic, steps, k, fb, fx, fn, rk, after):
    """The first row in treap order with blocks <= free + M(base + shift): a pruned in-order walk
    that adds the rows it passes to slot s's front (all rows if none runs).  It rebuilds the front
    from the first row, or with `after` keeps it and walks only the rows after the taken answer's
    key rk[s] (the caller has checked that no point of the front may run: the rows before the key
    still cannot), whose bases are at most the answer's: a subtree's maximum base is capped there
    (a subtree on the path to the key may hold rows before it with higher bases, which the front
    already bounds).  (Given the arrays of `Parts` it reads, not the tuple: it is not inlined, and
    a call passes every array of a tuple.)"""
    t = root
    sp = 0
    cap = np.int64(BIG)
    if after:
        cap = rk[s, RK_BASE]
        # Down to the first row after the key: a row after it stays on the path (its left subtree may
        # hold more such rows), a row before it is passed with its left subtree.
        while t >= 0:
            if not _after_taken(gk, t, rk, s):
                t = nd[t, ND_RIGHT]
            else:
                mb = min(nd[t, ND_MAXBASE], cap)
                if not _fits(nd[t, ND_MINB], mb + shift, free, n_v, vic, steps, k):
                    _front_add(s, nd[t, ND_MINB], mb, fb, fx, fn)
                    t = -1  # nothing in this subtree after the key can run
                else:
                    stack[sp] = t
                    sp += 1
                    t = nd[t, ND_LEFT]
    else:
        fn[s] = 0
    while True:
        while t >= 0:
            mb = min(nd[t, ND_MAXBASE], cap)
            if not _fits(nd[t, ND_MINB], mb + shift, free, n_v, vic, steps, k):
                _front_add(s, nd[t, ND_MINB], mb, fb, fx, fn)
                break  # nothing in this subtree can run
            stack[sp] = t
            sp += 1
            t = nd[t, ND_LEFT]
        if sp == 0:
            return -1
        sp -= 1
        t = stack[sp]
        if _fits(nd[t, ND_BLOCKS], nd[t, ND_BASE] + shift, free, n_v, vic, steps, k):
            return t
        _front_add(s, nd[t, ND_BLOCKS], nd[t, ND_BASE], fb, fx, fn)
        t = nd[t, ND_RIGHT]


# Not cached on its own: it calls kernels of another file (see `stamp`); its callers' cache holds it.
@njit(_nrt=False)
def _bt_first_runnable(s, root, height, free, shift, bk, stack, n_v, vic, steps, k, fb, fx, fn, rk, nxt, after):
    """`_first_runnable` for a part held in a B+tree (root node `root`, `height` levels above the
    leaves): a pruned in-order walk over the nodes' entries, a child skipped (its aggregates added to
    the front) when ``min blocks > free + M(max base + shift)``.  With `after`, each node on the path
    to the taken answer's key starts at that key's place, and bases are capped at the answer's, as
    in `_first_runnable` (a child there that is skipped may also hold rows before the key: the front
    already bounds those).  Entries in a row often share a base (a leaf's rows are in key order), so
    the room ``free + M(base + shift)`` is computed once per base."""
    if not after:
        fn[s] = 0
    top = _room_any(free, n_v, vic)
    last_base = np.int64(-BIG)
    room = np.int64(0)
    cap = rk[s, RK_BASE] if after else np.int64(BIG)
    x = root
    lvl = height
    j = 0
    sp = 0
    on_path = after
    while True:
        c = bk[x, BT_CNT]
        if on_path:
            if lvl == 0:
                j = bt_leaf_after_nb(bk, x, rk[s, RK_PACKED], rk[s, RK_TOTAL_LEN], rk[s, RK_ID])
            else:
                j = bt_child_at_nb(bk, x, rk[s, RK_PACKED], rk[s, RK_TOTAL_LEN], rk[s, RK_ID])
        down = False
        while j < c:
            q = bt_pay(j)
            b = bk[x, q + PAY_BLOCKS]
            base = min(bk[x, q + PAY_BASE], cap)
            if b <= free:
                fits = True
            elif b > top:
                fits = False
            else:
                if base != last_base:
                    last_base = base
                    room = free
                    m = _victims_search((base + shift) * k - steps, n_v, vic)
                    if m > 0:
                        room += vic[m - 1, VC_PMAX]
                fits = b <= room
            if fits:
                if lvl == 0:
                    nxt[s] = bk[x, bt_pay(j + 1) + PAY_ROW] if j + 1 < c else -1
                    return bk[x, q + PAY_ROW]
                stack[2 * sp] = x
                stack[2 * sp + 1] = j + 1
                sp += 1
                x = bk[x, q + PAY_ROW]
                lvl -= 1
                j = 0
                down = True
                break
            _front_add(s, b, base, fb, fx, fn)
            on_path = False
            j += 1
        if down:
            continue
        on_path = False
        if sp == 0:
            return -1
        sp -= 1
        x = stack[2 * sp]
        j = stack[2 * sp + 1]
        lvl += 1


@njit(cache=True, _nrt=False, inline="always")
def _walk(q, h, free, shift, nd, gk, stack, n_v, vic, steps, k, bt, after):
    """Part q's first runnable row by a walk (`_first_runnable` or `_bt_first_runnable`)."""
    if h.big[q]:
        return _bt_first_runnable(q, h.root[q], h.height[q], free, shift, bt.bk, stack, n_v, vic, steps, k, h.fb,
                                  h.fx, h.fn, h.rk, h.nxt, after)
    return _first_runnable(q, h.root[q], free, shift, nd, gk, stack, n_v, vic, steps, k, h.fb, h.fx, h.fn, h.rk,
                           after)


@njit(cache=True, _nrt=False, inline="always")
def _part_answer(q, h, free, shift, nd, gk, stack, n_v, vic, steps, k, bt):
    """Part q's first runnable row, walking it again only when a row before its cached answer may run
    (from its first row) or its answer was taken (from there); returns (row, whether it walked)."""
    walked = False
    if h.root[q] < 0:
        h.cand[q] = -1
        h.fn[q] = 0
        h.taken[q] = False
    elif _front_may_run(q, free, shift, h, n_v, vic, steps, k):
        h.cand[q] = _walk(q, h, free, shift, nd, gk, stack, n_v, vic, steps, k, bt, False)
        h.taken[q] = False
        walked = True
    elif h.taken[q]:
        h.cand[q] = _walk(q, h, free, shift, nd, gk, stack, n_v, vic, steps, k, bt, True)
        h.taken[q] = False
        walked = True
    return h.cand[q], walked


@njit(cache=True, _nrt=False)
def _cert_lcrit(sl, q_end, fn, fx, shift, steps, k, wce):
    """The highest limit ``(base + shift) * K - steps`` of a front point (of `Parts` fn, fx) of slot
    sl's parts up to q_end that is at most wce (-BIG: none): the champion, at w = wce, is not among
    that point's victims yet, and joins them once its w falls below the limit (a front's limits
    descend with its bases)."""
    lcrit = np.int64(-BIG)
    for q in range(PARTS * sl, q_end + 1):
        for i in range(fn[q]):
            lim = (fx[q, i] + shift) * k - steps
            if lim <= wce:
                lcrit = max(lcrit, lim)
                break
    return lcrit


@njit(cache=True, _nrt=False, inline="always")
def _cert_holds(sl, ct, vver, champ, free, vic, v_pos, fn, fx, shift, steps, k):
    """Whether slot sl's certificate shows that no row before its parts' cached answers runs at this
    rise of its residue's priorities, so that their answers stand.  It was taken at an earlier rise
    where no part was walked (no point of their fronts ran): at every rise a point's limit
    ``(base + shift) * K - steps`` is the same, and since then its fronts stayed (a walk, a row
    joining before an answer or an answer taken drops it); with no victim joined and none but the
    champion moved (`vver`), the same champion not yet below a limit it was not below then (CT_LCRIT),
    each point's M is at most what it was (victims leaving, or others' priorities rising, only lower
    it), and with free blocks no more than then, no point runs now either.  CT_LCRIT is found at the
    first check that needs it (a rise's limits are those of the rise that took the certificate):
    with a large backlog most certificates fail before that.  (`Parts` holds only per-part state; a
    certificate is per slot, in ``ct``, columns CT_*; fn, fx: the fronts of `Parts`.)"""
    if ct[sl, CT_VER] != vver or ct[sl, CT_CHAMP] != champ or free > ct[sl, CT_FREE]:
        return False
    if ct[sl, CT_LCRIT] == -BIG:
        return True
    if ct[sl, CT_LCRIT] == BIG:
        ct[sl, CT_LCRIT] = _cert_lcrit(sl, ct[sl, CT_PART], fn, fx, shift, steps, k, ct[sl, CT_W])
    return vic[v_pos[champ], VC_W] >= ct[sl, CT_LCRIT]


# Not cached on its own: it calls kernels of another file (see `stamp`); its callers' cache holds it.
@njit(_nrt=False)
def _to_btree(q, h, stack, gk, nd, bt, path, conv):
    """Part q's rows from its treap into a B+tree (in key order: each fills the last leaf)."""
    n = treap_rows_nb(h.root[q], conv, stack, nd)
    root = np.int64(-1)
    height = np.int64(0)
    for i in range(n):
        r = conv[i]
        root, height = bt_insert_nb(bt, root, height, gk[r, AK_PACKED], gk[r, AK_TOTAL_LEN], gk[r, AK_ID], r,
                                    nd[r, ND_BLOCKS], nd[r, ND_BASE], path)
    h.root[q] = root
    h.height[q] = height
    h.big[q] = True


# Not cached on its own: it calls kernels of another file (see `stamp`); its callers' cache holds it.
@njit(_nrt=False)
def _to_treap(q, h, stack, gk, nd, bt, path, conv):
    """Part q's rows from its B+tree (whose nodes it frees) into a treap."""
    n = bt_rows_nb(bt, h.root[q], h.height[q], conv, path)
    root = -1
    for i in range(n):
        root = treap_insert_nb(root, conv[i], stack, gk, nd)
    h.root[q] = root
    h.height[q] = 0
    h.big[q] = False


# Not cached on its own: it calls kernels of another file (see `stamp`); its callers' cache holds it.
@njit(_nrt=False)
def _wait_remove(q, r, h, stack, gk, nd, bt, path, conv, small_at):
    """Row r leaves part q's waiting rows."""
    if h.big[q]:
        root, height = bt_delete_nb(bt, h.root[q], h.height[q], gk[r, AK_PACKED], gk[r, AK_TOTAL_LEN], gk[r, AK_ID],
                                    path)
        h.root[q] = root
        h.height[q] = height
    else:
        h.root[q] = treap_delete_nb(h.root[q], r, stack, gk, nd)
    h.size[q] -= 1
    if h.big[q] and h.size[q] < small_at:
        _to_treap(q, h, stack, gk, nd, bt, path, conv)


# Not cached on its own: it calls kernels of another file (see `stamp`); its callers' cache holds it.
@njit(_nrt=False)
def _wait_insert(q, r, h, stack, gk, nd, blocks, bt, path, conv, big_at):
    """Row r joins part q's waiting rows; returns whether it lands before the cached answer (or the
    taken one's key: a row after it is met by the walk from there).  Into an empty part it lands
    before: a part that is not live (see `live`) keeps its taken key when its last row leaves, and
    nothing would walk it from there."""
    if h.root[q] < 0:
        h.cand[q] = -1
        h.taken[q] = False
        h.fn[q] = 0
    if h.big[q]:
        root, height = bt_insert_nb(bt, h.root[q], h.height[q], gk[r, AK_PACKED], gk[r, AK_TOTAL_LEN], gk[r, AK_ID],
                                    r, blocks, nd[r, ND_BASE], path)
        h.root[q] = root
        h.height[q] = height
    else:
        h.root[q] = treap_insert_nb(h.root[q], r, stack, gk, nd)
    h.size[q] += 1
    if not h.big[q] and h.size[q] >= big_at:
        _to_btree(q, h, stack, gk, nd, bt, path, conv)
    if h.taken[q]:
        before = not _after_taken(gk, r, h.rk, q)
    else:
        before = h.cand[q] < 0 or _slot_less(gk, r, h.cand[q])
    if before:
        _front_add(q, blocks, nd[r, ND_BASE], h.fb, h.fx, h.fn)
    return before


@njit(cache=True, _nrt=False)
def _set_aging_key(r, cycles, slot, gk, nd, phase, cache_hit, priority, top, koff, total_len, request_id):
    """Row r's key when ``a = enqueue step + times chosen = cycles * K + rho`` (its residue rho's
    structures live in `slot`, held in column 0): base = priority - cycles.
    Column AK_PACKED orders (cache rank, -base) as one int64: ``top - base`` lies in [0, 2**62) for
    every base (at most the top compressed priority, `top`, and at least ``-work // k - 1``; see
    `_compressed_priorities`).  Column AK_TREE orders (phase and cache rank, -base) as one int64, the
    first in [-2, 2) times TREE_BIT, the second plus `koff`; minus a shift it is the tournament tree's
    key, whose low part ``koff - effective priority`` lies in [0, TREE_BIT) for every effective
    priority (in [-work // k - 1, top + work // k]) and `koff` = top + work // k + 1 (see
    `_compressed_priorities`).  Neither is reached by `key_less_nb`: the request ids before them differ."""
    base = priority - cycles
    rank = 0 if cache_hit else 1
    gk[r, AK_SLOT] = slot
    gk[r, AK_PHASE_CACHE] = 2 * phase + rank
    gk[r, AK_CACHE] = rank
    gk[r, AK_NEG_BASE] = -base
    gk[r, AK_PACKED] = rank * CACHE_BIT + (top - base)
    gk[r, AK_TREE] = (2 * phase + rank - 2) * TREE_BIT + (koff - base)
    gk[r, AK_TOTAL_LEN] = total_len
    gk[r, AK_ID] = request_id
    nd[r, ND_BASE] = base
    nd[r, ND_MAXBASE] = base


@njit(cache=True)
def _compressed_priorities(priority, max_new_tokens, aging_interval):
    """(K, priorities, W, fits) that give every request the same effective priority order and ties as the
    trace's at every step, with ``priority * K`` far inside int64.  No wait exceeds the trace's work
    (one step per prefill and per token), W: an interval above W is W + 1 (no one's priority ever
    rises), and a gap between consecutive distinct priorities above ``W // K`` (which waiting can
    never bridge) is cut to ``W // K + 1``.  Priorities start at 0.  `fits` is False when even so
    ``priority * K`` would leave int64 (a trace of valid but absurd size: about n W > 2**61, such as
    1,449 requests of 2**40 tokens each with distinct priorities): this kernel cannot replay it."""
    n = priority.shape[0]
    work = np.int64(0)
    for i in range(n):
        work += 1 + max_new_tokens[i]
    k = min(aging_interval, work + 1)
    gap = work // k + 1
    out = np.empty(n, np.int64)
    if n == 0:
        return k, out, work, True
    idx = np.argsort(priority, kind="mergesort")
    c = np.int64(0)
    prev = priority[idx[0]]
    for j in range(n):
        p = priority[idx[j]]
        if p != prev:
            d = p - prev  # wraps to <= 0 only for a difference of 2**63 or more
            c += gap if d <= 0 or d > gap else d
            prev = p
        out[idx[j]] = c
    # (also keeps the tree keys' low part below 2**62: `_set_aging_key`)
    return k, out, work, c <= (2**62 - 2 * work - 4) // k


@njit(cache=True)
def _fluid_backlog(arrival_step, max_new_tokens, required_blocks, capacity, order):
    """(backlog, work): the mean number of requests in the system over the steps that run, as a fluid
    queue sees it, and the mean work of a request.  The work waiting (a step per prefill and per token)
    grows by a request's work at its arrival and falls by one a step; its mean over the busy steps,
    divided by the mean work, is the backlog (all n at once: n / 2).  Requests that can never be
    admitted (more blocks than the capacity) are left out.  On the Azure trace at loads 1.0, 1.25 and
    1.5 it gives 439, 2,273 and 3,497 where a replay holds 514, 2,845 and 3,940 on average."""
    w = 0.0  # work waiting
    area = 0.0  # of w over the steps
    total = 0.0
    count = 0
    t = np.int64(0)
    for i in range(order.shape[0]):
        r = order[i]
        if required_blocks[r] > capacity:
            continue
        g = float(arrival_step[r] - t)
        d = min(w, g)
        area += d * w - d * d / 2
        w -= d
        t = arrival_step[r]
        x = 1.0 + max_new_tokens[r]
        w += x
        total += x
        count += 1
    area += w * w / 2
    if count == 0:
        return 0.0, 0.0
    return area * count / (total * total), total / count


@njit(cache=True)
def _grouped_mode(k, n, arrival_step, max_new_tokens, required_blocks, capacity, order, grouped_div, grouped_ratio):
    """Whether interval k replays in grouped mode: never below n / grouped_div (nor for 0), always from
    n or GROUPED_ALL_SLOTS on (slots for at most that many residues), and between them while
    ``backlog * work / k**1.5`` (`_fluid_backlog`) is under grouped_ratio.  Grouped mode moves each
    request in the system once a cycle, about backlog / k moves a step; block mode's cost per step
    follows the finishes, one per `work` steps, each marking about 2 sqrt(k) slots: the ratio of the
    two.  Measured (block mode's time / grouped mode's, best of 2, in one process), by that ratio: on
    the Azure conversation trace (loads 1.0-3.0, 3 classes, SJF, all-distinct priorities, 2,000 and
    16,000 blocks, k from n / 3.9 to n / 1.1) 0.26: 1.08-1.25 (all-distinct 0.60-0.74), 0.40-0.60:
    0.96-1.54, 0.67-1.04: 0.55-1.09, 1.36-2.1: 0.41-0.73; Mooncake (loads 1.0-3.0) 0.02-0.26:
    0.93-1.41, 1.03-1.12: 0.51-0.69, 1.58-7.9: 0.20-0.49; the Azure code trace (requests of 29 steps
    on average, loads 1.0-1.5) 0.11-0.55: 1.19-2.30; synthetic backlogs of short requests
    (`backlog_trace`, 20,000 requests of 33 or 129 steps on average) 0.27-0.90: 1.43-2.98 (grouped
    mode far ahead), 1.37-1.49: 0.49-1.04, 3.5: 0.32-0.60."""
    if grouped_div <= 0 or k < -(-n // grouped_div):
        return False
    if k >= n or k >= GROUPED_ALL_SLOTS:
        return True
    backlog, work = _fluid_backlog(arrival_step, max_new_tokens, required_blocks, capacity, order)
    return backlog * work < grouped_ratio * k ** 1.5


# Residues are mapped to slots (only non-empty residues hold one: at most min(K, n) at a time) by an
# open-addressing hash table with linear probing on ``rho & mask`` (the identity when K fits).

@njit(cache=True, _nrt=False, inline="always")
def _table_find(rho, hkey, mask):
    """The table's place of residue rho, or the free place where it would go."""
    i = rho & mask
    while hkey[i] != -1 and hkey[i] != rho:
        i = (i + 1) & mask
    return i


@njit(cache=True, _nrt=False, inline="always")
def _slot_lookup(rho, hkey, hval, mask):
    """The slot of residue rho (grouped mode: the first row of its list), or -1."""
    i = _table_find(rho, hkey, mask)
    return hval[i] if hkey[i] == rho else -1


@njit(cache=True, _nrt=False)
def _slot_acquire(rho, steps, k, hkey, hval, mask, free_slots, n_free, s_rho, sh, h, adm, afirst, slow, live,
                  sp_lo, sp_hi):
    """The slot of residue rho, a fresh one (empty, shift (steps - rho) // K) if it has none, its
    waiting rows live when rho is in [sp_lo, sp_hi] (see `live`); returns (slot, n_free)."""
    i = _table_find(rho, hkey, mask)
    if hkey[i] == rho:
        return hval[i], n_free
    n_free -= 1
    s = free_slots[n_free]
    hkey[i] = rho
    hval[i] = s
    s_rho[s] = rho
    sh[s] = (steps - rho) // k
    live[s] = sp_lo <= rho and rho <= sp_hi
    for q in range(PARTS * s, PARTS * s + PARTS):
        h.root[q] = -1
        h.cand[q] = -1
        h.fn[q] = 0
        h.taken[q] = False
        h.size[q] = 0
        h.big[q] = False
        h.height[q] = 0
    slow[s] = BIG
    adm.meta[s, HM_N] = 0  # its heap keeps its room
    adm.meta[s, HM_HOT] = -1
    afirst[s] = -1
    return s, n_free


@njit(cache=True, _nrt=False)
def _table_delete(rho, hkey, hval, mask):
    """Delete residue rho (present) from the table (backward shift)."""
    i = _table_find(rho, hkey, mask)
    j = i
    while True:
        j = (j + 1) & mask
        if hkey[j] == -1:
            break
        home = hkey[j] & mask
        # the entry at j may move to i unless its home lies cyclically in (i, j]
        if i <= j:
            inside = i < home and home <= j
        else:
            inside = home > i or home <= j
        if not inside:
            hkey[i] = hkey[j]
            hval[i] = hval[j]
            i = j
    hkey[i] = -1


@njit(cache=True, _nrt=False)
def _slot_release(s, s_rho, hkey, hval, mask, free_slots, n_free):
    """Give back slot s (both its treaps empty): delete its residue from the table."""
    _table_delete(s_rho[s], hkey, hval, mask)
    free_slots[n_free] = s
    return n_free + 1


# In grouped mode (see `replay_aging_nb`) the table maps a residue to the first of its rows that sit
# in a slot, linked through rnext / rprev.

@njit(cache=True, _nrt=False)
def _res_add(rho, r, hkey, hval, mask, rnext, rprev):
    """Row r (of residue rho) joins its residue's list."""
    i = _table_find(rho, hkey, mask)
    rprev[r] = -1
    if hkey[i] == -1:
        hkey[i] = rho
        rnext[r] = -1
    else:
        x = hval[i]
        rnext[r] = x
        rprev[x] = r
    hval[i] = r


@njit(cache=True, _nrt=False)
def _res_remove(rho, r, hkey, hval, mask, rnext, rprev):
    """Row r (of residue rho) leaves its residue's list."""
    p = rprev[r]
    x = rnext[r]
    if x >= 0:
        rprev[x] = p
    if p >= 0:
        rnext[p] = x
    elif x >= 0:
        hval[_table_find(rho, hkey, mask)] = x
    else:
        _table_delete(rho, hkey, hval, mask)


@njit(cache=True, _nrt=False)
def _tree_set(tb, size, s, row, gk, sh):
    """Slot s's leaf of the tournament tree (the first of its cached rows, -1 for none) and its path.
    A node holds its row with the first two parts of the row's real key at the current step (phase
    and cache rank, -effective priority ``= -base - sh[slot]``) as one int64 (``gk[row, AK_TREE] -
    sh[slot]``, see `_set_aging_key`), so that rows of any residues compare without their slots'
    shifts; total_len and request_id break ties.  A node's key is the same as its leaf's, and a slot
    whose shift rose sets its leaf again (DIRTY_KEY).  The path stops at the first node that keeps its
    row and key: the nodes above it depend on nothing else that changed (with K = 1,000 at heavy load
    a finish re-sets hundreds of leaves, most of them far from the top)."""
    i = s + size
    tb[TB_NCOLS * i + TB_ROW] = row
    tb[TB_NCOLS * i + TB_KEY] = gk[row, AK_TREE] - sh[s] if row >= 0 else TB_NONE
    i >>= 1
    while i >= 1:
        a = TB_NCOLS * 2 * i
        b = a + TB_NCOLS
        # The winner as arithmetic, not a branch (which child wins is as good as random); an empty
        # node's key, TB_NONE, loses to every row's, and two empty ones may give either.
        ka = tb[a + TB_KEY]
        kb = tb[b + TB_KEY]
        less = ka < kb
        if ka == kb and ka != TB_NONE:
            less = _real_less(ka, tb[a + TB_ROW], kb, tb[b + TB_ROW], gk)
        w = b - TB_NCOLS * np.int64(less)
        j = TB_NCOLS * i
        if tb[j + TB_ROW] == tb[w + TB_ROW] and tb[j + TB_KEY] == tb[w + TB_KEY]:
            return  # this node keeps its value: so do the ones above it
        tb[j + TB_ROW] = tb[w + TB_ROW]
        tb[j + TB_KEY] = tb[w + TB_KEY]
        i >>= 1


@njit(cache=True, _nrt=False, inline="always")
def _mark(s, flags, dirty, in_dirty, n_d):
    """Queue slot s as dirty (once), with `flags` (DIRTY_*) added to its own."""
    if in_dirty[s] == 0:
        dirty[n_d] = s
        n_d += 1
    in_dirty[s] |= flags
    return n_d


@njit(cache=True, _nrt=False, inline="always")
def _empty(s, h):
    """Whether slot s has no waiting rows."""
    for q in range(PARTS * s, PARTS * s + PARTS):
        if h.root[q] >= 0:
            return False
    return True


@njit(cache=True, _nrt=False)
def _front_low(q, h):
    """The fewest blocks among part q's front points, BIG when it has none."""
    n = h.fn[q]
    if n == 0:
        return np.int64(BIG)
    return h.fb[q, n - 1]  # bases descending, so blocks descending too


# The admitted rows of a slot (all in decode phase, in `Admitted` ``adm``) are its *hot* row
# meta[s, HM_HOT] (the last one chosen into it, or -1) and a binary heap by `_adm_less` of the others:
# the heap's place in ``pool`` starts at meta[s, HM_LO], with room for meta[s, HM_CAP] rows,
# meta[s, HM_N] of them used, and pos[row] is a row's place in its heap.  The last row of meta holds
# the pool's first unused place (HM_LO) and its size (HM_CAP).  A heap that is full moves to the end of the pool with
# twice the room; a full pool is first repacked (`_adm_grow`).  A chosen row leaves its slot as the
# champion and comes back as its residue's hot row when another row is chosen (a heap holds the row it
# displaces: O(log A) with A admitted rows).

@njit(cache=True, _nrt=False, inline="always")
def _adm_less(gk, a, b):
    """Admitted row a before admitted row b of the same slot (phase and slot equal): cache rank and
    -base (packed), total_len, request_id."""
    if gk[a, AK_PACKED] != gk[b, AK_PACKED]:
        return gk[a, AK_PACKED] < gk[b, AK_PACKED]
    if gk[a, AK_TOTAL_LEN] != gk[b, AK_TOTAL_LEN]:
        return gk[a, AK_TOTAL_LEN] < gk[b, AK_TOTAL_LEN]
    return gk[a, AK_ID] < gk[b, AK_ID]


@njit(cache=True, _nrt=False, inline="always")
def _adm_up(hp, lo, hpos, i, x, gk):
    """Put row x at place i of the heap at lo, or above it while it sorts before its parent."""
    while i > 0:
        p = (i - 1) >> 1
        y = hp[lo + p]
        if not _adm_less(gk, x, y):
            break
        hp[lo + i] = y
        hpos[y] = i
        i = p
    hp[lo + i] = x
    hpos[x] = i


@njit(cache=True, _nrt=False, inline="always")
def _adm_first(s, adm, gk):
    """Slot s's first admitted row (-1 if it has none): its hot row or its heap's top."""
    h = adm.meta[s, HM_HOT]
    if adm.meta[s, HM_N] == 0:
        return h
    r = adm.pool[adm.meta[s, HM_LO]]
    return h if h >= 0 and _adm_less(gk, h, r) else r


@njit(cache=True, _nrt=False, inline="always")
def _adm_take(s, x, adm, gk):
    """Admitted row x leaves slot s; returns the slot's first admitted row (-1 if none is left)."""
    hp = adm.pool
    hmeta = adm.meta
    hpos = adm.pos
    if hmeta[s, HM_HOT] == x:
        hmeta[s, HM_HOT] = -1
        return _adm_first(s, adm, gk)
    lo = hmeta[s, HM_LO]
    n = hmeta[s, HM_N] - 1
    hmeta[s, HM_N] = n
    i = hpos[x]
    hpos[x] = -1
    if i < n:
        # Bottom-up: the hole sinks to a leaf along the smaller children (one comparison a level),
        # where the last row goes in and rises (rarely far: it was a leaf).
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            y = hp[lo + c]
            if c + 1 < n:
                z = hp[lo + c + 1]
                if _adm_less(gk, z, y):
                    c += 1
                    y = z
            hp[lo + i] = y
            hpos[y] = i
            i = c
        _adm_up(hp, lo, hpos, i, hp[lo + n], gk)
    return _adm_first(s, adm, gk)


@njit(cache=True, _nrt=False)
def _adm_grow(s, adm):
    """Give slot s's full heap twice its room at the end of the pool.  When the pool has no room
    left, every heap is first repacked (through `tmp`) with room for twice its rows: the pool holds
    4 places per row, so a repack leaves at least half of it free and costs O(1) per push."""
    hp = adm.pool
    hmeta = adm.meta
    tmp = adm.tmp
    m = hmeta.shape[0] - 1
    cap = max(2, 2 * hmeta[s, HM_CAP])
    if hmeta[m, HM_LO] + cap > hmeta[m, HM_CAP]:
        top = 0
        for t in range(m):
            lo = hmeta[t, HM_LO]
            for j in range(hmeta[t, HM_N]):
                tmp[top + j] = hp[lo + j]
            hmeta[t, HM_LO] = top
            hmeta[t, HM_CAP] = 2 * hmeta[t, HM_N]
            top += hmeta[t, HM_CAP]
        for j in range(top):
            hp[j] = tmp[j]
        hmeta[m, HM_LO] = top
        if hmeta[s, HM_N] < hmeta[s, HM_CAP]:
            return
    lo = hmeta[s, HM_LO]
    new = hmeta[m, HM_LO]
    for j in range(hmeta[s, HM_N]):
        hp[new + j] = hp[lo + j]
    hmeta[s, HM_LO] = new
    hmeta[s, HM_CAP] = cap
    hmeta[m, HM_LO] = new + cap


@njit(cache=True, _nrt=False, inline="always")
def _adm_put(s, x, adm, gk):
    """Row x, just chosen, joins slot s as its hot row; the row it displaces joins the heap.
    Returns the slot's first admitted row."""
    hmeta = adm.meta
    h = hmeta[s, HM_HOT]
    hmeta[s, HM_HOT] = x
    if h >= 0:
        n = hmeta[s, HM_N]
        if n == hmeta[s, HM_CAP]:
            _adm_grow(s, adm)
        hmeta[s, HM_N] = n + 1
        _adm_up(adm.pool, hmeta[s, HM_LO], adm.pos, n, h, gk)
    return _adm_first(s, adm, gk)


# The victims (admitted preemptible rows) are the rows of the matrix ``vic`` (columns VC_*) in
# ascending order of ``w = priority * K - a`` (priorities compressed, see `_compressed_priorities`),
# with ``v_pos[row]`` the row's place.  A victim's effective priority is ``(steps + w) // K``, so
# the order holds at every step; it changes only when a victim is chosen (its w drops by one),
# joins or leaves.  VC_PMAX holds the prefix maxima of the blocks.

@njit(cache=True, _nrt=False)
def _victims_pmax(vic, lo, hi):
    """Recompute the prefix maxima of the blocks on rows lo..hi - 1."""
    best = vic[lo - 1, VC_PMAX] if lo > 0 else np.int64(0)
    for i in range(lo, hi):
        if vic[i, VC_BLOCKS] > best:
            best = vic[i, VC_BLOCKS]
        vic[i, VC_PMAX] = best


@njit(cache=True, _nrt=False, inline="always")
def _victims_move(vic, v_pos, src, dst):
    vic[dst, VC_W] = vic[src, VC_W]
    vic[dst, VC_ROW] = vic[src, VC_ROW]
    vic[dst, VC_BLOCKS] = vic[src, VC_BLOCKS]
    v_pos[vic[dst, VC_ROW]] = dst


@njit(cache=True, _nrt=False)
def _victims_add(vic, v_pos, n_v, row, w, blocks):
    """Row joins the victims (after those of equal w); returns the new count."""
    i = n_v
    while i > 0 and vic[i - 1, VC_W] > w:
        _victims_move(vic, v_pos, i - 1, i)
        i -= 1
    vic[i, VC_W] = w
    vic[i, VC_ROW] = row
    vic[i, VC_BLOCKS] = blocks
    v_pos[row] = i
    _victims_pmax(vic, i, n_v + 1)
    return n_v + 1


@njit(cache=True, _nrt=False)
def _victims_drop(vic, v_pos, n_v, row):
    """Row leaves the victims; returns the new count."""
    i = v_pos[row]
    v_pos[row] = -1
    for j in range(i, n_v - 1):
        _victims_move(vic, v_pos, j + 1, j)
    _victims_pmax(vic, i, n_v - 1)
    return n_v - 1


@njit(cache=True, _nrt=False, inline="always")
def _victims_chosen(vic, v_pos, row):
    """Victim `row` was chosen: its w drops by one, before the victims of its old w (swapped with
    the first of them: the order among equal w does not matter)."""
    i = v_pos[row]
    w = vic[i, VC_W]
    vic[i, VC_W] = w - 1
    if i > 0 and vic[i - 1, VC_W] == w:
        j = i - 1
        while j > 0 and vic[j - 1, VC_W] == w:
            j -= 1
        other = vic[j, VC_ROW]
        ob = vic[j, VC_BLOCKS]
        vic[j, VC_W] = w - 1
        vic[j, VC_ROW] = row
        vic[j, VC_BLOCKS] = vic[i, VC_BLOCKS]
        v_pos[row] = j
        vic[i, VC_W] = w
        vic[i, VC_ROW] = other
        vic[i, VC_BLOCKS] = ob
        v_pos[other] = i
        _victims_pmax(vic, j, i + 1)


@njit(cache=True, _nrt=False)
def _mark_may_run(free, n_v, vic, wlist, n_w, slow, dirty, in_dirty, n_d, live, m_res, tally, counted):
    """Free blocks grew or a victim joined: mark the live slots with waiting rows where a front point
    may run now (the first wlist[-1] of the list).  A point with more blocks than free + the largest
    victim's blocks cannot (M never exceeds that), which spares the residues whose waiting rows are
    all too big (slow[s]: the fewest blocks of a point of slot s's fronts, see `_slot_low`).  When
    `counted`, tally[0] counts the residues' slots such a point makes dirty, or would if they were
    live (see `_want_blocks`): for the ones that are not (block mode), from TALLY_WINDOW of them
    taken in turn (tally[1]: where the next window starts), scaled to their number."""
    top = _room_any(free, n_v, vic)
    if not counted:
        for i in range(n_w):
            sl = wlist[i]
            if slow[sl] <= top:
                n_d = _mark(sl, DIRTY_WAIT, dirty, in_dirty, n_d)
        return n_d
    n_live = wlist[-1]
    for i in range(n_live):
        sl = wlist[i]
        if slow[sl] <= top:
            if sl < m_res:
                tally[0] += 1
            n_d = _mark(sl, DIRTY_WAIT, dirty, in_dirty, n_d)
    n_o = n_w - n_live
    if n_o > 0:
        c = min(TALLY_WINDOW, n_o)
        j = tally[1] % n_o
        hits = 0
        for _ in range(c):
            sl = wlist[n_live + j]
            if sl < m_res and slow[sl] <= top:
                hits += 1
            j += 1
            if j == n_o:
                j = 0
        tally[1] = j
        tally[0] += (hits * n_o + c // 2) // c
    return n_d


@njit(cache=True, _nrt=False, inline="always")
def _parts_may_change(sl, h, slow, free, n_v, vic):
    """Whether the answer of a part of slot sl may change (`_part_answer`): an answer of it was taken,
    or a point of its front may run.  None can with more blocks than free + the largest victim's, and
    slow[sl] is at most the fewest blocks of a point (see `_slot_low`): on many steps the residue whose
    priorities rose has waiting rows that are all too big, and its parts are not read.  (A part whose
    last row left has no cached answer: that row was its taken answer.)"""
    if slow[sl] <= _room_any(free, n_v, vic):
        return True
    for q in range(PARTS * sl, PARTS * sl + PARTS):
        if h.taken[q]:
            return True
    return False


@njit(cache=True, _nrt=False, inline="always")
def _slot_low(sl, h, slow):
    """Keep slow[sl], the fewest blocks of a point of slot sl's fronts (BIG: none), after they changed."""
    low = _front_low(PARTS * sl, h)
    for q in range(PARTS * sl + 1, PARTS * sl + PARTS):
        b = _front_low(q, h)
        if b < low:
            low = b
    slow[sl] = low


# Not cached on its own: it calls a kernel of another file (see `stamp`); its callers' cache holds it.
@njit(_nrt=False, inline="always")
def _prefetch_request(r, req, max_new_tokens, preemptible, cache_hit, priority, prompt_len, request_id,
                      has_deadline, deadline_step):
    """Start the misses in waiting row r's per-request arrays together: with a large backlog a row
    that becomes its slot's answer (and then the step's request) is often cold."""
    prefetch_nb(req.status, r)
    prefetch_nb(req.chosen_count, r)
    prefetch_nb(req.phase, r)
    prefetch_nb(req.generated, r)
    prefetch_nb(max_new_tokens, r)
    prefetch_nb(preemptible, r)
    prefetch_nb(req.enqueue_steps, r)
    prefetch_nb(cache_hit, r)
    prefetch_nb(priority, r)
    prefetch_nb(prompt_len, r)
    prefetch_nb(request_id, r)
    prefetch_nb(has_deadline, r)
    prefetch_nb(deadline_step, r)


# The slots with waiting rows are a list (`wlist`, `wpos`: each slot's place in it or -1, n_w of
# them) with the live ones (see `live`) first: its last entry, lst[-1], counts them.  So a rise of
# free blocks marks the live ones without passing over the others (in block mode, most residues).

@njit(cache=True, _nrt=False)
def _list_add(lst, lpos, cnt, s, on):
    """Slot s (live: on) joins the list of cnt slots; returns cnt + 1."""
    j = cnt
    if on:
        j = lst[-1]
        lst[-1] = j + 1
        if j < cnt:  # the first slot that is not live moves to the end
            x = lst[j]
            lst[cnt] = x
            lpos[x] = cnt
    lst[j] = s
    lpos[s] = j
    return cnt + 1


@njit(cache=True, _nrt=False)
def _list_remove(lst, lpos, cnt, s):
    """Slot s leaves the list of cnt slots; returns cnt - 1."""
    i = lpos[s]
    n_live = lst[-1]
    if i < n_live:  # the last live slot fills its place, and the hole moves to the boundary
        n_live -= 1
        lst[-1] = n_live
        if i != n_live:
            x = lst[n_live]
            lst[i] = x
            lpos[x] = i
        i = n_live
    cnt -= 1
    if i != cnt:
        last = lst[cnt]
        lst[i] = last
        lpos[last] = i
    lpos[s] = -1
    return cnt


@njit(cache=True, _nrt=False)
def _list_live(lst, lpos, s, on):
    """Slot s of the list goes live (on) or stops: it swaps with the first slot that is not live,
    or with the last live one."""
    i = lpos[s]
    n_live = lst[-1]
    j = n_live if on else n_live - 1
    lst[-1] = n_live + 1 if on else n_live - 1
    x = lst[j]
    lst[i] = x
    lpos[x] = i
    lst[j] = s
    lpos[s] = j


# Not cached on its own: it calls kernels of another file (see `stamp`); its callers' cache holds it.
@njit(_nrt=False)
def _rise_grouped(x, ga, gb, admitted, h, adm, afirst, gk, nd, stack, bt, path, conv, big_at, small_at, wlist, wpos,
                  n_w, slow, ct, dirty, in_dirty, n_d, rnext):
    """Grouped mode: the rows of a residue, from x on its list, rose by one: each moves from slot gb
    (not risen this cycle) to slot ga (risen), keeping its base; returns (n_d, n_w).  A moving row
    that was its part's cached answer is taken from there (the rows before it still cannot run);
    one that lands before the answer in ga joins that part's front, as an arrival does."""
    while x >= 0:
        if admitted[x]:
            afirst[gb] = _adm_take(gb, x, adm, gk)
            gk[x, AK_SLOT] = ga
            afirst[ga] = _adm_put(ga, x, adm, gk)
            n_d = _mark(gb, DIRTY_LEAF, dirty, in_dirty, n_d)
            n_d = _mark(ga, DIRTY_LEAF, dirty, in_dirty, n_d)
        else:
            pc = gk[x, AK_PHASE_CACHE]
            q = PARTS * gb + pc
            if h.cand[q] == x:
                _part_taken(q, x, gk, h)
            _wait_remove(q, x, h, stack, gk, nd, bt, path, conv, small_at)
            if _empty(gb, h):
                n_w = _list_remove(wlist, wpos, n_w, gb)
            ct[gb, CT_VER] = -1
            n_d = _mark(gb, DIRTY_WAIT, dirty, in_dirty, n_d)
            gk[x, AK_SLOT] = ga
            if wpos[ga] < 0:
                n_w = _list_add(wlist, wpos, n_w, ga, True)
            b = nd[x, ND_BLOCKS]
            if _wait_insert(PARTS * ga + pc, x, h, stack, gk, nd, b, bt, path, conv, big_at):
                slow[ga] = min(slow[ga], b)
                ct[ga, CT_VER] = -1
                n_d = _mark(ga, DIRTY_WAIT, dirty, in_dirty, n_d)
        x = rnext[x]
    return n_d, n_w


# Not cached on its own: it calls kernels of another file (see `stamp`); its callers' cache holds it.
@njit(_nrt=False, inline="always")
def _join_waiting(sl, r, b, h, stack, gk, nd, bt, path, conv, big_at, live, wlist, wpos, n_w, slow, ct, dirty,
                  in_dirty, n_d):
    """Row r (b blocks) joins the waiting part of slot sl for its phase and cache rank; returns (n_d, n_w).
    Only a live slot (see `live`) is marked: the others' answers are read when they go live."""
    if unlikely_nb(wpos[sl] < 0):  # (a slot with no waiting rows: rare under a backlog)
        n_w = _list_add(wlist, wpos, n_w, sl, live[sl])
    if _wait_insert(PARTS * sl + gk[r, AK_PHASE_CACHE], r, h, stack, gk, nd, b, bt, path, conv, big_at):
        slow[sl] = min(slow[sl], b)
        ct[sl, CT_VER] = -1  # its front grew
        if live[sl]:
            n_d = _mark(sl, DIRTY_WAIT, dirty, in_dirty, n_d)
    return n_d, n_w


# Not cached on its own: it calls kernels of another file (see `stamp`); its callers' cache holds it.
@njit(_nrt=False, inline="always")
def _leave_waiting(sl, r, answered, h, stack, gk, nd, bt, path, conv, small_at, live, wlist, wpos, n_w, ct, dirty,
                   in_dirty, n_d):
    """Waiting row r, chosen, leaves its part of slot sl; returns (n_d, n_w).  When `answered` (its
    residue's live slot) it was the part's cached answer: the next one comes after it.  Another slot
    (a residue's slot that is not live, a block's) may have cached another answer, before or after r
    in its order (rows before an answer only ever leave)."""
    q = PARTS * sl + gk[r, AK_PHASE_CACHE]
    _wait_remove(q, r, h, stack, gk, nd, bt, path, conv, small_at)
    if unlikely_nb(_empty(sl, h)):
        n_w = _list_remove(wlist, wpos, n_w, sl)
    if answered or h.cand[q] == r:
        _part_taken(q, r, gk, h)
    ct[sl, CT_VER] = -1
    if live[sl]:
        n_d = _mark(sl, DIRTY_WAIT, dirty, in_dirty, n_d)
    return n_d, n_w


@njit(cache=True, _nrt=False)
def _set_live(sl, on, h, live, ct, wlist, wpos, dirty, in_dirty, n_d):
    """Slot sl's waiting rows start (on) or stop answering for their residues; returns n_d.  A slot
    going live is checked from its cached answers and fronts, kept while it was not (rows joining
    and leaving keep them), without the certificate of a rise it did not see."""
    if live[sl] != on and wpos[sl] >= 0:
        _list_live(wlist, wpos, sl, on)
    live[sl] = on
    ct[sl, CT_VER] = -1
    if not _empty(sl, h):  # (else its leaf stays: its first admitted row)
        n_d = _mark(sl, (DIRTY_WAIT | DIRTY_LEAF) if on else DIRTY_LEAF, dirty, in_dirty, n_d)
    return n_d


@njit(cache=True, _nrt=False, inline="always")
def _at_block_end(rmod, bw, k):
    """Whether residue rmod is the last of its block (see `_block_end`)."""
    return rmod % bw == bw - 1 or rmod == k - 1


@njit(cache=True, _nrt=False)
def _block_end(rmod, k, bw, m_res, hkey, hval, mask, h, live, sh, ct, wlist, wpos, dirty, in_dirty, n_d):
    """Block mode, at the end of a step, residue rmod, the last of its block, rose: every residue of the
    block has risen, so the block's slot has one shift again (one more) and its residues' slots, live
    since their rise, stop being live.  Returns n_d."""
    lo = rmod - rmod % bw
    bs = m_res + rmod // bw
    sh[bs] += 1
    n_d = _mark(bs, DIRTY_RISE | DIRTY_KEY, dirty, in_dirty, n_d)
    for rho in range(lo, rmod):
        s = _slot_lookup(rho, hkey, hval, mask)
        if s >= 0:
            n_d = _set_live(s, False, h, live, ct, wlist, wpos, dirty, in_dirty, n_d)
    return n_d


@njit(cache=True, _nrt=False)
def _reset_parts(sl, h):
    """Slot sl's parts, empty (a block's stay B+trees: `big` is kept)."""
    for q in range(PARTS * sl, PARTS * sl + PARTS):
        h.root[q] = -1
        h.height[q] = 0
        h.size[q] = 0
        h.cand[q] = -1
        h.fn[q] = 0
        h.taken[q] = False


# Not cached on its own: it calls kernels of another file (see `stamp`); its callers' cache holds it.
@njit(_nrt=False)
def _blocks_on(n, sdiv, bw, n_blocks, m_res, hkey, hval, mask, s_rho, req, required_blocks, capacity, h, gk, nd,
               stack, bt, path, free, n_v, vic, steps, k, live, sh, slow, ct, wlist, wpos, n_w, dirty, in_dirty, n_d):
    """Into block mode at the start of a cycle (steps % K == 0: residue 0 risen, no other): every
    waiting row joins its block's part, each walked afresh at the shift of the residues not risen;
    the residues' slots but residue 0's stop being live.  Returns (n_d, n_w)."""
    for b in range(n_blocks):
        bs = m_res + b
        _reset_parts(bs, h)
        sh[bs] = sdiv - 1
        live[bs] = True
        ct[bs, CT_VER] = -1
    for r in range(n):
        waiting = req.enqueued[r] and not req.admitted[r] and req.status[r] != E.STATUS_FINISHED
        if waiting and required_blocks[r] <= capacity:
            q = PARTS * (m_res + s_rho[gk[r, AK_SLOT]] // bw) + gk[r, AK_PHASE_CACHE]
            root, height = bt_insert_nb(bt, h.root[q], h.height[q], gk[r, AK_PACKED], gk[r, AK_TOTAL_LEN],
                                        gk[r, AK_ID], r, nd[r, ND_BLOCKS], nd[r, ND_BASE], path)
            h.root[q] = root
            h.height[q] = height
            h.size[q] += 1
    for b in range(n_blocks):
        bs = m_res + b
        for q in range(PARTS * bs, PARTS * bs + PARTS):
            if h.root[q] >= 0:
                h.cand[q] = _walk(q, h, free, sh[bs], nd, gk, stack, n_v, vic, steps, k, bt, False)
        _slot_low(bs, h, slow)
        if not _empty(bs, h):
            n_w = _list_add(wlist, wpos, n_w, bs, live[bs])
            n_d = _mark(bs, DIRTY_LEAF | DIRTY_KEY, dirty, in_dirty, n_d)
    for s in range(m_res):
        if s_rho[s] >= 1 and _slot_lookup(s_rho[s], hkey, hval, mask) == s:
            n_d = _set_live(s, False, h, live, ct, wlist, wpos, dirty, in_dirty, n_d)
    return n_d, n_w


# Not cached on its own: it calls kernels of another file (see `stamp`); its callers' cache holds it.
@njit(_nrt=False)
def _blocks_off(n_blocks, m_res, hkey, hval, mask, s_rho, h, bt, path, stack, live, wlist, wpos, n_w, ct, dirty,
                in_dirty, n_d):
    """Out of block mode: the blocks' parts are emptied (their nodes freed), every residue's slot is
    live.  Returns (n_d, n_w)."""
    for b in range(n_blocks):
        bs = m_res + b
        for q in range(PARTS * bs, PARTS * bs + PARTS):
            if h.root[q] >= 0:
                bt_rows_nb(bt, h.root[q], h.height[q], stack, path)
        _reset_parts(bs, h)
        if wpos[bs] >= 0:
            n_w = _list_remove(wlist, wpos, n_w, bs)
        live[bs] = False
        n_d = _mark(bs, DIRTY_LEAF, dirty, in_dirty, n_d)
    for s in range(m_res):
        if not live[s]:
            if _slot_lookup(s_rho[s], hkey, hval, mask) == s:
                n_d = _set_live(s, True, h, live, ct, wlist, wpos, dirty, in_dirty, n_d)
            else:
                live[s] = True
    return n_d, n_w


@njit(cache=True, _nrt=False)
def _want_blocks(rule, on, tally, r_sum):
    """Whether the next cycles run in block mode, by `rule` (BLOCKS_*), from the cycles since the last
    decision: tally, the residues' slots that finishes and new victims made dirty (or would have, in
    block mode: see `_mark_may_run`), against r_sum, the residues' slots held at each cycle's start.
    A block mode cycle turned every residue's slot with waiting rows live and back (two re-reads a
    slot; since `_block_end`, a re-read at its rise, done then anyway, and a leaf set again), a cycle
    of slots per residue re-reads every slot made dirty: blocks from half as many again of the latter
    (3 a slot; with 4, the Azure trace at K = 256, load 1.5 took 1.10-1.18x as long, paired), until
    they are fewer than the former (2 a slot).  Counts between the two keep the
    mode, so that a load near one threshold does not rebuild the blocks at every decision."""
    if rule == BLOCKS_ALWAYS:
        return True
    if rule == BLOCKS_ALTERNATE:
        return not on
    if on:
        return tally * BLOCKS_OFF_DEN >= r_sum * BLOCKS_OFF_NUM
    return tally * BLOCKS_ON_DEN > r_sum * BLOCKS_ON_NUM


# Not cached on its own: it calls kernels of another file (see `stamp`); its caller's cache holds it.
# Without NRT, so that the helpers inlined into the loop carry no reference counting.
@njit(_nrt=False)
def _replay_loop(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit, required_blocks,
                 deadline_step, has_deadline, preemptible, order, free_kv_blocks, max_steps, events, k, top, koff,
                 req, nd, gk, stack, hkey, hval, mask, free_slots, n_free, s_rho, h, adm, afirst, sh, wlist, wpos, tb,
                 t_leaves, dirty, in_dirty, vic, v_pos, bt, path, conv, big_at, small_at, slow, ct, grouped, rnext,
                 rprev, blockable, block_rule, bw, n_blocks, m_res, live, cold, tally):
    """The replay loop of `replay_aging_nb` over its state (`req`: the per-request state, `h`: the
    waiting parts, `adm`: the admitted rows; in grouped mode, rnext / rprev: the residues' lists; with
    `blockable`, block mode may go on; with `cold`, a new answer's successor is prefetched too, see
    COLD_AT); returns (steps, clock, free, stop)."""
    cand = h.cand
    n = request_id.shape[0]
    n_w = 0
    n_d = 0
    n_v = 0
    pos = 0
    clock = np.int64(0)
    free = np.int64(free_kv_blocks)
    capacity = np.int64(free_kv_blocks)
    steps = np.int64(0)
    rmod = np.int64(0)  # steps % K
    sdiv = np.int64(0)  # steps // K
    unfinished = 0
    stop = E.STOP_DRAINED
    limit = max_steps if max_steps >= 0 else BIG
    next_arrival = arrival_step[order[0]] if n > 0 else BIG  # of row order[pos]
    # The champion: the last step's request while it stays admitted, in no slot (see `_champ_first`),
    # with its tree key (see `_tree_set`: phase, cache rank and -effective priority), whose priority part,
    # c_low, stays while it runs every step.
    champ = E.NO_ROW
    c_key = np.int64(0)
    c_low = np.int64(0)
    # Bumped when a victim joins or one other than the champion moves (see `_cert_holds`).
    vver = np.int64(0)
    # Grouped mode: slot ga holds the rows whose residue rose this cycle, gb the others.
    ga = 0
    gb = 1
    # Block mode (blk): the residues whose slots' waiting rows are live (see `live`): in block mode
    # those of steps % K's block up to it (none at a block's end), all otherwise; the counts for
    # `_want_blocks` since its last decision.
    blk = False
    sp_lo = np.int64(0)
    sp_hi = np.int64(BIG)
    r_sum = np.int64(0)
    last_dec = np.int64(0)
    dwell = max(k, np.int64(n))  # steps between decisions (switching costs O(n))
    if blockable and block_rule == BLOCKS_ALWAYS:
        blk = True
        sp_hi = 0
        n_d, n_w = _blocks_on(n, sdiv, bw, n_blocks, m_res, hkey, hval, mask, s_rho, req, required_blocks, capacity,
                              h, gk, nd, stack, bt, path, free, n_v, vic, steps, k, live, sh, slow, ct, wlist, wpos,
                              n_w, dirty, in_dirty, n_d)

    while True:
        if steps >= limit:
            stop = E.STOP_MAX_STEPS
            break
        while pos < n and next_arrival <= clock:
            r = order[pos]
            pos += 1
            if pos < n:
                next_arrival = arrival_step[order[pos]]
            req.enqueued[r] = True
            req.enqueue_steps[r] = steps
            unfinished += 1
            if required_blocks[r] > capacity:
                continue  # can never be admitted
            if grouped:
                sl = ga  # its residue, rmod, rose at the end of the last step
                _res_add(rmod, r, hkey, hval, mask, rnext, rprev)
            else:
                sl, n_free = _slot_acquire(rmod, steps, k, hkey, hval, mask, free_slots, n_free, s_rho, sh,
                                           h, adm, afirst, slow, live, sp_lo, sp_hi)
            _set_aging_key(r, sdiv, sl, gk, nd, E.PHASE_PREFILL, cache_hit[r], priority[r], top, koff, prompt_len[r],
                           request_id[r])
            n_d, n_w = _join_waiting(sl, r, required_blocks[r], h, stack, gk, nd, bt, path, conv, big_at, live,
                                     wlist, wpos, n_w, slow, ct, dirty, in_dirty, n_d)
            if blockable and blk:
                n_d, n_w = _join_waiting(m_res + rmod // bw, r, required_blocks[r], h, stack, gk, nd, bt, path,
                                         conv, big_at, live, wlist, wpos, n_w, slow, ct, dirty, in_dirty, n_d)

        for i in range(n_d):
            sl = dirty[i]
            flags = in_dirty[sl]
            in_dirty[sl] = 0
            # a part only matters when no row of the parts before it runs
            c = E.NO_ROW
            if blockable and not live[sl]:
                pass  # its waiting rows answer in their block's slot: its leaf is its first admitted row
            elif (flags & (DIRTY_WAIT | DIRTY_RISE) and _parts_may_change(sl, h, slow, free, n_v, vic)
                    and (flags & DIRTY_WAIT
                         or not _cert_holds(sl, ct, vver, champ, free, vic, v_pos, h.fn, h.fx, sh[sl], steps, k))):
                walked = False
                q = PARTS * sl
                while q < PARTS * sl + PARTS:
                    c, w_q = _part_answer(q, h, free, sh[sl], nd, gk, stack, n_v, vic, steps, k, bt)
                    walked |= w_q
                    if c != E.NO_ROW:
                        break
                    q += 1
                if walked:
                    ct[sl, CT_VER] = -1
                elif flags & DIRTY_RISE:  # no point of the fronts up to part q runs at this rise
                    # (once free blocks are no more than now, a champion that does not fit with the
                    # fewest blocks of a point makes no point run when it joins the point's victims)
                    ct[sl, CT_LCRIT] = -BIG
                    if champ != E.NO_ROW and preemptible[champ] and slow[sl] <= free + nd[champ, ND_BLOCKS]:
                        ct[sl, CT_LCRIT] = BIG
                        ct[sl, CT_W] = vic[v_pos[champ], VC_W]
                        ct[sl, CT_PART] = min(q, PARTS * sl + PARTS - 1)
                    ct[sl, CT_FREE] = free
                    ct[sl, CT_VER] = vver
                    ct[sl, CT_CHAMP] = champ
                _slot_low(sl, h, slow)
                # A new waiting answer may be the step's request a few steps on: start its misses now,
                # while the tree compares its key, rather than when it is chosen.
                if c != E.NO_ROW and c != tb[TB_NCOLS * (t_leaves + sl) + TB_ROW]:
                    _prefetch_request(c, req, max_new_tokens, preemptible, cache_hit, priority, prompt_len,
                                      request_id, has_deadline, deadline_step)
                    nx = h.nxt[q] if cold and q < PARTS * sl + PARTS else -1
                    if nx >= 0:  # and the row after it in its leaf, likely the part's next answer
                        prefetch_nb(nd[nx], 0)
                        prefetch_nb(gk[nx], 0)
                        _prefetch_request(nx, req, max_new_tokens, preemptible, cache_hit, priority, prompt_len,
                                          request_id, has_deadline, deadline_step)
            else:  # only its admitted rows changed, or no part's answer can change: the cached answers stand
                for q in range(PARTS * sl, PARTS * sl + PARTS):
                    c = cand[q]
                    if c != E.NO_ROW:
                        break
            f = afirst[sl]
            if c == E.NO_ROW or (f != E.NO_ROW and _slot_less(gk, f, c)):
                c = f
            if c != tb[TB_NCOLS * (t_leaves + sl) + TB_ROW] or flags & DIRTY_KEY:
                _tree_set(tb, t_leaves, sl, c, gk, sh)
        n_d = 0
        # The top of the tree, once it runs, is the step's request (see `tb`), unless the champion
        # comes first: the top is at or before every other row that runs (a cached answer that stopped
        # running only comes too early), so then the champion is.
        while True:
            chosen = tb[TB_NCOLS + TB_ROW]
            if champ != E.NO_ROW and _champ_first(champ, c_key, chosen, tb, gk):
                chosen = champ
                break
            if chosen == E.NO_ROW:
                break
            if req.admitted[chosen]:
                break
            _prefetch_request(chosen, req, max_new_tokens, preemptible, cache_hit, priority, prompt_len, request_id,
                              has_deadline, deadline_step)
            sl = gk[chosen, AK_SLOT]
            if blockable and (not live[sl] or tb[TB_NCOLS * (t_leaves + sl) + TB_ROW] != chosen):
                sl = m_res + s_rho[sl] // bw  # its block's slot
            shift = sh[sl]
            # (its blocks read from its node, which shares a 128-byte block with the key the tree compared)
            if _fits(nd[chosen, ND_BLOCKS], nd[chosen, ND_BASE] + shift, free, n_v, vic, steps, k):
                break
            # It is its part's cached answer, and no point of the part's front runs (the dirty slots were
            # just checked, and nothing else can make one run): the rows before it still cannot, so the
            # walk goes on after it as after a taken answer, with it in the front.
            q = PARTS * sl + gk[chosen, AK_PHASE_CACHE]
            _part_taken(q, chosen, gk, h)
            _front_add(q, nd[chosen, ND_BLOCKS], nd[chosen, ND_BASE], h.fb, h.fx, h.fn)
            c = _walk(q, h, free, shift, nd, gk, stack, n_v, vic, steps, k, bt, True)
            h.taken[q] = False
            cand[q] = c
            ct[sl, CT_VER] = -1
            while c == E.NO_ROW and q + 1 < PARTS * sl + PARTS:
                q += 1
                c = _part_answer(q, h, free, shift, nd, gk, stack, n_v, vic, steps, k, bt)[0]
            _slot_low(sl, h, slow)
            f = afirst[sl]
            if c == E.NO_ROW or (f != E.NO_ROW and _slot_less(gk, f, c)):
                c = f
            _tree_set(tb, t_leaves, sl, c, gk, sh)

        if chosen == E.NO_ROW:
            if pos < n:
                clock = next_arrival  # idle gap: jump, nobody waits
                continue
            stop = E.STOP_DRAINED if unfinished == 0 else E.STOP_STUCK
            break

        if champ != E.NO_ROW and chosen != champ:
            # The champion lost: back into its residue's slot as that slot's hot row, its key brought
            # up to date (its a, so its residue and base, changed at every step it ran).
            a = req.enqueue_steps[champ] + req.chosen_count[champ]
            rho = a % k
            if grouped:
                sl = ga if rho <= rmod else gb
                _res_add(rho, champ, hkey, hval, mask, rnext, rprev)
            else:
                sl, n_free = _slot_acquire(rho, steps, k, hkey, hval, mask, free_slots, n_free, s_rho, sh, h, adm,
                                           afirst, slow, live, sp_lo, sp_hi)
            _set_aging_key(champ, a // k, sl, gk, nd, E.PHASE_DECODE, cache_hit[champ], priority[champ], top, koff,
                           prompt_len[champ] + req.generated[champ], request_id[champ])
            afirst[sl] = _adm_put(sl, champ, adm, gk)
            n_d = _mark(sl, DIRTY_LEAF | DIRTY_KEY, dirty, in_dirty, n_d)
            champ = E.NO_ROW

        victim = E.NO_ROW
        was_admitted = req.admitted[chosen]
        in_slot = chosen != champ  # (the champion is in none)
        s_old = gk[chosen, AK_SLOT]
        if in_slot:
            c_low = tb[TB_NCOLS + TB_KEY] & TREE_LOW  # koff - its effective priority, kept while it is champion
            if grouped:
                _res_remove((req.enqueue_steps[chosen] + req.chosen_count[chosen]) % k, chosen, hkey, hval, mask,
                            rnext, rprev)
        if was_admitted:
            if in_slot:
                afirst[s_old] = _adm_take(s_old, chosen, adm, gk)
                n_d = _mark(s_old, DIRTY_LEAF, dirty, in_dirty, n_d)
        else:
            need = nd[chosen, ND_BLOCKS]
            if need > free:
                e_c = -gk[chosen, AK_NEG_BASE] + sh[s_old]
                best_e = np.int64(0)
                best_b = np.int64(0)
                # The seed's victim: lowest effective priority, then most blocks, then smallest id,
                # among victims below the challenger that free enough blocks (their blocks read from
                # the victim matrix: a victim's own row is only read on a tie).
                for i in range(n_v):
                    e_v = (steps + vic[i, VC_W]) // k
                    if e_v >= e_c or (victim != E.NO_ROW and e_v > best_e):
                        break
                    b = vic[i, VC_BLOCKS]
                    if free + b < need:
                        continue
                    v = vic[i, VC_ROW]
                    if victim == E.NO_ROW or b > best_b or (b == best_b and request_id[v] < request_id[victim]):
                        victim = v
                        best_e = e_v
                        best_b = b
                if victim == E.NO_ROW:
                    raise AssertionError("aging kernel: the chosen request has no victim")
                prefetch_nb(req.preemptions, victim)  # counted at the end of the step, when it has arrived
                req.admitted[victim] = False
                req.status[victim] = E.STATUS_PREEMPTED
                free += best_b
                rv = gk[victim, AK_SLOT]  # its slot keeps a row throughout: out of its heap, into a treap
                afirst[rv] = _adm_take(rv, victim, adm, gk)
                n_d, n_w = _join_waiting(rv, victim, best_b, h, stack, gk, nd, bt, path, conv, big_at, live, wlist,
                                         wpos, n_w, slow, ct, dirty, in_dirty, n_d)
                n_d = _mark(rv, DIRTY_WAIT, dirty, in_dirty, n_d)
                if blockable and blk:
                    n_d, n_w = _join_waiting(m_res + s_rho[rv] // bw, victim, best_b, h, stack, gk, nd, bt, path,
                                             conv, big_at, live, wlist, wpos, n_w, slow, ct, dirty, in_dirty, n_d)
                n_v = _victims_drop(vic, v_pos, n_v, victim)
                # free blocks grew by the victim's blocks
                n_d = _mark_may_run(free, n_v, vic, wlist, n_w, slow, dirty, in_dirty, n_d, live, m_res, tally,
                                    blockable)
            # The chosen request was its residue's cached answer when that slot is live, else its block's:
            # the next one comes after it (a block's copy of a risen residue's row need not be its answer).
            n_d, n_w = _leave_waiting(s_old, chosen, live[s_old], h, stack, gk, nd, bt, path, conv, small_at, live,
                                      wlist, wpos, n_w, ct, dirty, in_dirty, n_d)
            if blockable and blk:  # (a block's parts stay in B+trees)
                n_d, n_w = _leave_waiting(m_res + s_rho[s_old] // bw, chosen, False, h, stack, gk, nd, bt, path, conv,
                                          0, live, wlist, wpos, n_w, ct, dirty, in_dirty, n_d)
            free -= need
            req.admitted[chosen] = True
            if preemptible[chosen]:
                w = priority[chosen] * k - req.enqueue_steps[chosen] - req.chosen_count[chosen]
                n_v = _victims_add(vic, v_pos, n_v, chosen, w, need)
                vver += 1
                # a new victim: more may run
                n_d = _mark_may_run(free, n_v, vic, wlist, n_w, slow, dirty, in_dirty, n_d, live, m_res, tally,
                                    blockable)
        req.status[chosen] = E.STATUS_RUNNING
        req.chosen_count[chosen] += 1

        action = advance_nb(chosen, clock, req, max_new_tokens)
        if action == E.ACTION_FINISH:
            free += nd[chosen, ND_BLOCKS]
            req.admitted[chosen] = False
            req.status[chosen] = E.STATUS_FINISHED
            req.finish_step[chosen] = clock
            unfinished -= 1
            req.wait_final[chosen] = steps + 1 - req.enqueue_steps[chosen] - req.chosen_count[chosen]
            if preemptible[chosen]:
                n_v = _victims_drop(vic, v_pos, n_v, chosen)
            # free blocks grew
            n_d = _mark_may_run(free, n_v, vic, wlist, n_w, slow, dirty, in_dirty, n_d, live, m_res, tally,
                                blockable)
            champ = E.NO_ROW
        else:
            # It is the champion now (or still): its a is one more, so its residue moves on, but its
            # effective priority stays (one more step run, one more chosen); in decode phase, one
            # token longer (total_len: the only part of its key it keeps in gk while it is champion).
            if in_slot:
                champ = chosen
                c_key = (2 * E.PHASE_DECODE + gk[chosen, AK_CACHE] - 2) * TREE_BIT + c_low
            gk[chosen, AK_TOTAL_LEN] = prompt_len[chosen] + req.generated[chosen]
            if preemptible[chosen]:  # a victim: its w is one lower
                _victims_chosen(vic, v_pos, chosen)
                if in_slot:  # (the champion's own moves are in its slots' certificates)
                    vver += 1
        if in_slot and not grouped and wpos[s_old] < 0 and afirst[s_old] < 0:
            n_free = _slot_release(s_old, s_rho, hkey, hval, mask, free_slots, n_free)
            ct[s_old, CT_VER] = -1

        if victim != E.NO_ROW:
            req.preemptions[victim] += 1
        record_step_nb(events, steps, clock, chosen, action, req, max_new_tokens, deadline_step, has_deadline,
                       steps + 1 - req.enqueue_steps[chosen] - req.chosen_count[chosen], free, victim)
        clock += 1
        steps += 1
        rmod += 1
        if rmod == k:
            rmod = 0
            sdiv += 1
        # Residue steps % K: every effective priority in it rises by one (the chosen request's,
        # now in another residue, stays), so more of it may run.  An empty residue holds no slot.
        rs = _slot_lookup(rmod, hkey, hval, mask)
        if grouped:
            if rmod == 0:  # a new cycle: every row has risen (gb is empty) and now none has
                ga, gb = gb, ga
                sh[ga] = sdiv  # (gb's shift, sdiv - 1, is what it was as ga)
                n_d = _mark(ga, DIRTY_LEAF | DIRTY_KEY, dirty, in_dirty, n_d)
            if rs >= 0:  # (the first row of the residue's list)
                n_d, n_w = _rise_grouped(rs, ga, gb, req.admitted, h, adm, afirst, gk, nd, stack, bt, path, conv,
                                         big_at, small_at, wlist, wpos, n_w, slow, ct, dirty, in_dirty, n_d, rnext)
        elif rs >= 0:
            sh[rs] += 1
            # more of its waiting rows may run, and its leaf compares differently now
            n_d = _mark(rs, DIRTY_RISE | DIRTY_KEY, dirty, in_dirty, n_d)
        # (The turns and the decisions below are rare steps: marked so (`unlikely_nb`), LLVM keeps their
        # code and register spills off the common step, which a swap never executed there, in
        # `_set_live`, otherwise made 20% slower at K = 4,800, load 1.0, 2,000 blocks.)
        if blockable and blk:
            sp_hi = rmod
            if unlikely_nb(_at_block_end(rmod, bw, k)):
                n_d = _block_end(rmod, k, bw, m_res, hkey, hval, mask, h, live, sh, ct, wlist, wpos, dirty, in_dirty,
                                 n_d)
                sp_lo = rmod + 1 if rmod + 1 < k else 0
                sp_hi = -1
            elif rs >= 0 and unlikely_nb(not live[rs]):
                n_d = _set_live(rs, True, h, live, ct, wlist, wpos, dirty, in_dirty, n_d)
        if blockable and unlikely_nb(rmod == 0):
            r_sum += m_res - n_free
            if steps - last_dec >= (k if block_rule == BLOCKS_ALTERNATE else dwell):
                want = _want_blocks(block_rule, blk, tally[0], r_sum)
                tally[0] = 0
                r_sum = 0
                last_dec = steps
                if want and not blk:
                    n_d, n_w = _blocks_on(n, sdiv, bw, n_blocks, m_res, hkey, hval, mask, s_rho, req,
                                          required_blocks, capacity, h, gk, nd, stack, bt, path, free, n_v, vic,
                                          steps, k, live, sh, slow, ct, wlist, wpos, n_w, dirty, in_dirty, n_d)
                    sp_lo = 0
                    sp_hi = 0
                elif blk and not want:
                    n_d, n_w = _blocks_off(n_blocks, m_res, hkey, hval, mask, s_rho, h, bt, path, stack, live,
                                           wlist, wpos, n_w, ct, dirty, in_dirty, n_d)
                    sp_lo = 0
                    sp_hi = BIG
                blk = want

    return steps, clock, free, stop


@njit(cache=True, _nrt=False)
def _never_short(required_blocks, capacity):
    """Whether the blocks of every request that fits the capacity at all fit in it together: then free
    blocks never fall below a waiting request's (an unservable one never runs either way)."""
    total = np.int64(0)
    for r in range(required_blocks.shape[0]):
        b = required_blocks[r]
        if b <= capacity:
            total += b  # (at most twice the capacity before it stops: no overflow)
            if total > capacity:
                return False
    return True


def _make_replay_aging(stamp, big_at, small_at, grouped_div, block_min, block_rule, cold_at=COLD_AT,
                       grouped_ratio=GROUPED_RATIO):
    """`replay_aging_nb`, closing over `stamp` so that an edit of a kernel it calls compiles it afresh,
    with parts in B+trees from `big_at` rows on and back in treaps below `small_at` (1 < small_at <
    big_at), in grouped mode as `_grouped_mode` says for `grouped_div` and `grouped_ratio`, else with
    blocks of residues from an interval of `block_min` (at least 2) on, as `block_rule` (BLOCKS_*)
    says, prefetching ahead from `cold_at` requests on (BIG_AT, SMALL_AT, GROUPED_DIV, BLOCK_MIN,
    BLOCKS_COUNTED, COLD_AT and GROUPED_RATIO but in the tests)."""
    @njit(cache=True)
    def replay_aging_nb(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit,
                        required_blocks, deadline_step, has_deadline, preemptible, order,
                        free_kv_blocks, aging_interval, max_steps, events, req_out, summary):
        """Replay one trace under policy aging; arguments and outputs as `replay_scan_nb` (no policy).
        Returns False, having written nothing, for a trace whose priorities this kernel cannot hold
        (`_compressed_priorities`), else True."""
        if stamp < 0:  # never: the stamp only keys the Numba cache (see `source_stamp`)
            return False
        n = request_id.shape[0]
        k, cprio, work, fits = _compressed_priorities(priority, max_new_tokens, np.int64(aging_interval))
        if not fits:
            return False
        req = new_requests_nb(n)
        # The rows that join the victims when admitted: none where no request ever waits for blocks, so
        # none is ever preempted (the victim matrix costs O(V) a change, and an unlimited capacity
        # admits thousands at once).
        victims_of = np.zeros(n, np.bool_)
        if not _never_short(required_blocks, free_kv_blocks):
            victims_of[:] = preemptible

        top = cprio.max() if n > 0 else np.int64(0)
        koff = top + work // k + 1  # (see `_set_aging_key`)
        nd, gk = treap_nodes_nb(required_blocks, AK_NCOLS)
        stack = np.empty(n + 64, np.int64)
        # Per-slot structures: a slot is held by a non-empty residue (a live row sits in its residue's
        # slot), so at most min(K, n) are in use; sized by that, not by K.  In grouped mode, two.
        m_res = min(k, np.int64(n) + 1)
        grouped = _grouped_mode(k, np.int64(n), arrival_step, max_new_tokens, required_blocks, free_kv_blocks, order,
                                grouped_div, grouped_ratio)
        blocked = not grouped and k >= block_min and block_rule != BLOCKS_NEVER  # (may go into block mode)
        # Block mode: residues in blocks of bw, a slot per block after the m_res of the residues.
        bw = max(np.int64(2), np.int64(np.sqrt(k))) if blocked else np.int64(1)
        n_blocks = -(-k // bw) if blocked else np.int64(0)
        m = np.int64(2) if grouped else m_res + n_blocks
        t_size = 2
        while t_size < 2 * m_res:
            t_size *= 2
        mask = np.int64(t_size - 1)
        hkey = np.full(t_size, -1, np.int64)  # residue -> slot table (grouped: -> its list's first row)
        hval = np.zeros(t_size, np.int64)
        rnext = np.empty(n if grouped else 0, np.int64)
        rprev = np.empty(n if grouped else 0, np.int64)
        m_free = np.int64(2) if grouped else m_res  # the slots residues take
        free_slots = np.empty(m_free, np.int64)
        for i in range(m_free):
            free_slots[i] = m_free - 1 - i
        n_free = m_free
        s_rho = np.zeros(m, np.int64)
        # The waiting rows by part, each with its treap, cached answer and front (see `Parts`).
        h = _new_parts(m)
        h.big[PARTS * m_res:] = blocked  # a block's parts are B+trees at every size
        # The admitted rows, a heap per slot in one pool (see `_adm_put`), and each slot's first.
        adm = _new_admitted(n, m)
        afirst = np.full(m, -1, np.int64)
        sh = np.zeros(m, np.int64)  # sh[slot] = (steps - rho) // K: its residue's shift, kept per step
        if grouped:
            sh[1] = -1  # slot 1 holds the rows whose residue has not risen yet (none at step 0)
        # Whether a slot's waiting rows answer for their residues: in block mode, every block's slot, and
        # a residue's slot from its rise to its block's end (see `_block_end`); every slot otherwise.
        live = np.ones(m, np.bool_)
        live[m_free:] = False
        # The slots with waiting rows, as a compact list, live ones first (see `_list_add`).
        wlist = np.empty(m + 1, np.int64)
        wlist[m] = 0
        wpos = np.full(m, -1, np.int64)
        # A tournament tree over slots: leaf = the first of the slot's cached waiting answer and its first
        # admitted row; internal nodes by the real key.  Slots whose leaf may be out of date are queued
        # in `dirty`.  A cached answer of a slot that is not dirty may have stopped being runnable (free
        # blocks shrank, victims' priorities rose: runnability only shrinks there), never the reverse,
        # so it only comes too early: the top is checked and its slot re-walked until it runs.
        t_leaves = 1
        while t_leaves < m:
            t_leaves *= 2
        tb = np.full(TB_NCOLS * 2 * t_leaves, -1, np.int64)
        tb[TB_KEY::TB_NCOLS] = TB_NONE
        # A dirty slot's path is recomputed when its leaf changes, or when its leaf's key or shift
        # changed (DIRTY_KEY); otherwise (free blocks or victims changed) the comparisons stand.
        dirty = np.empty(m, np.int64)
        in_dirty = np.zeros(m, np.int64)  # DIRTY_* flags
        slow = np.full(m, BIG, np.int64)  # per slot, the fewest blocks of a point of its fronts
        ct = np.full((m, CT_NCOLS), -1, np.int64)  # per slot, its certificate (see `_cert_holds`)
        # Victims in ascending order of w (see `_victims_add`).
        vic = np.empty((n + 1, VC_NCOLS), np.int64)
        v_pos = np.full(n, -1, np.int64)
        # The B+trees of the large parts: a part of s >= small_at rows has at most s / (B / 2) + 1 leaves
        # and fewer internal nodes than leaves, so all of them at most n / 4 + 2 n / small_at nodes (only
        # those used are ever written); a descent's path; room for a part's rows while it changes
        # structure.
        # A block's parts hold every waiting row again, in parts of any size (see the pool's bounds in
        # `btree_nb`: at most n / 8 + P leaves and n / 56 + P (2 / 7 + height) internal nodes, P parts).
        n_nodes = n // 4 + 2 * (n // small_at) + 64
        if blocked:
            n_nodes += n // 4 + 10 * PARTS * n_blocks + 64
        bt = bt_nodes_nb(n_nodes)
        path = np.zeros(64, np.int64)
        conv = np.empty(big_at + small_at + 1, np.int64)

        state = (request_id, arrival_step, prompt_len, max_new_tokens, cprio, cache_hit, required_blocks,
                 deadline_step, has_deadline, victims_of, order, free_kv_blocks, max_steps, events, k, top, koff, req,
                 nd, gk, stack, hkey, hval, mask, free_slots, n_free, s_rho, h, adm, afirst, sh, wlist, wpos, tb,
                 t_leaves, dirty, in_dirty, vic, v_pos, bt, path, conv, big_at, small_at, slow, ct, grouped, rnext,
                 rprev, blocked, block_rule, bw, n_blocks, m_res, live, n >= cold_at, np.zeros(2, np.int64))
        steps, clock, free, stop = _replay_loop(*state)
        write_state_nb(req_out, summary, steps, clock, free, stop, req)
        return True

    return replay_aging_nb


replay_aging_nb = _make_replay_aging(SOURCE_STAMP, BIG_AT, SMALL_AT, GROUPED_DIV, BLOCK_MIN, BLOCKS_COUNTED)
