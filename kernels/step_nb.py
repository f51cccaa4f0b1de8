"""The step every replay kernel shares: apply the chosen request's step, record it, write the final state.

A replay kernel decides which request a step runs (and its victim); what the step then does to
that request is the same in every kernel (SPEC section 2): `advance_nb` moves it one step (prefill
to decode, or one more token, maybe its last), `record_step_nb` checks its deadline and writes the
event row, and `write_state_nb` writes every request's final state and the summary once the replay
stops.  All three work on the replay's per-request state, one `Requests` named tuple of arrays
that every kernel allocates with `new_requests_nb`.  `advance_nb` and `record_step_nb` allocate
nothing and are compiled with ``_nrt=False`` (no reference counting of the arrays they receive), so
LLVM inlines them into the caller and a kernel pays nothing for sharing them.  (``inline="always"``,
Numba's IR inlining, cost the fast kernels 30-70% per step: measured on the Azure trace, fcfs
0.06 -> 0.21 s.)

A kernel calling these closes over a `stamp.source_stamp` that covers this file and `ordered_nb.py`,
whose huge-page advice `new_requests_nb` compiles in (Numba's cache key covers only the caller's own
file).
"""

from collections import namedtuple

import numpy as np
from numba import njit

from . import enums as E
from .ordered_nb import advise_huge_pages_nb

# Each request's state during a replay: one array of length n per field, in trace row order, with its
# initial value in `new_requests_nb` (Numba passes a named tuple as its fields: the grouping is free).
Requests = namedtuple("Requests", (
    "phase",             # PHASE_*
    "generated",         # tokens generated so far
    "chosen_count",      # steps it ran
    "enqueue_steps",     # steps that had run when it was enqueued
    "wait_final",        # its wait_steps once final (see `write_state_nb`), else -1
    "status",            # STATUS_*
    "preemptions",
    "admitted",          # holds its blocks
    "enqueued",          # arrived before the replay stopped
    "first_step",        # clock of its prefill step, or NEVER
    "first_token_step",  # clock of its first decode step, or NEVER
    "finish_step",       # clock of its finish step, or NEVER
))


# Not cached on its own: it calls a kernel of another file (see `stamp`); its callers' cache holds it.
@njit
def _filled(n, value, dtype):
    """An array of n `value`s, on 2 MiB pages where Linux offers them (advised before the first write)."""
    a = np.empty(n, dtype)
    advise_huge_pages_nb(a)
    a[:] = value
    return a


# Not cached on its own: it calls a kernel of another file (see `stamp`); its callers' cache holds it.
@njit
def new_requests_nb(n):
    """The `Requests` of n requests before the replay: waiting in prefill, nothing run.  With a large
    backlog a step's request is often cold, and it reads a row of most of these arrays: on 4 KiB
    pages nearly every one of them also misses the TLB (1 M rows: 8 MB an array)."""
    return Requests(
        phase=_filled(n, E.PHASE_PREFILL, np.int64),
        generated=_filled(n, 0, np.int64),
        chosen_count=_filled(n, 0, np.int64),
        enqueue_steps=_filled(n, 0, np.int64),
        wait_final=_filled(n, -1, np.int64),
        status=_filled(n, E.STATUS_WAITING, np.int64),
        preemptions=_filled(n, 0, np.int64),
        admitted=_filled(n, False, np.bool_),
        enqueued=_filled(n, False, np.bool_),
        first_step=_filled(n, E.NEVER, np.int64),
        first_token_step=_filled(n, E.NEVER, np.int64),
        finish_step=_filled(n, E.NEVER, np.int64),
    )


@njit(cache=True, _nrt=False)
def advance_nb(r, clock, req, max_new_tokens):
    """Run row r's step at `clock`: prefill -> decode, or one more token; return the ACTION_*.

    Only the row's phase, generated tokens and first-step clocks (in `req`) change here; on
    E.ACTION_FINISH the caller releases its blocks and marks it finished.
    """
    if req.phase[r] == E.PHASE_PREFILL:
        req.phase[r] = E.PHASE_DECODE
        req.first_step[r] = clock
        return E.ACTION_PREFILL_TO_DECODE
    req.generated[r] += 1
    if req.generated[r] == 1:
        req.first_token_step[r] = clock
    if req.generated[r] >= max_new_tokens[r]:
        return E.ACTION_FINISH
    return E.ACTION_DECODE_ONE_STEP


@njit(cache=True, _nrt=False)
def record_step_nb(events, steps, clock, r, action, req, max_new_tokens, deadline_step, has_deadline, wait, free,
                   victim):
    """Log step number `steps` (row r after `advance_nb`, its `wait` steps, `free` blocks after the step,
    the preempted row or NO_ROW) into ``events[steps]`` while the log has room.

    deadline_missed: the row has a deadline and ``clock + 1 + remaining tokens`` exceeds it.
    """
    if steps < events.shape[0]:
        missed = 0
        if has_deadline[r] and clock + 1 + max_new_tokens[r] - req.generated[r] > deadline_step[r]:
            missed = 1
        events[steps, E.EV_STEP] = clock
        events[steps, E.EV_ROW] = r
        events[steps, E.EV_ACTION] = action
        events[steps, E.EV_GENERATED] = req.generated[r]
        events[steps, E.EV_WAIT] = wait
        events[steps, E.EV_FREE] = free
        events[steps, E.EV_VICTIM_ROW] = victim
        events[steps, E.EV_MISSED] = missed


@njit(cache=True)
def write_state_nb(req_out, summary, steps, clock, free, stop, req):
    """Write the final per-request state (RQ_* columns, from `req`) and the summary of a replay.

    ``wait_steps`` may be lazy: ``steps run - enqueue_steps - chosen_count`` while ``wait_final`` is
    -1, frozen in ``wait_final`` (>= 0) at finish.  A kernel that counts waits eagerly counts them in
    ``wait_final`` from 0 at enqueue.
    """
    n = req_out.shape[0]
    for r in range(n):
        out = req_out[r]
        out[E.RQ_ENQUEUED] = 1 if req.enqueued[r] else 0
        out[E.RQ_PHASE] = req.phase[r]
        out[E.RQ_STATUS] = req.status[r] if req.enqueued[r] else E.STATUS_WAITING
        out[E.RQ_GENERATED] = req.generated[r]
        if not req.enqueued[r]:
            out[E.RQ_WAIT] = 0
        elif req.wait_final[r] >= 0:
            out[E.RQ_WAIT] = req.wait_final[r]
        else:
            out[E.RQ_WAIT] = steps - req.enqueue_steps[r] - req.chosen_count[r]
        out[E.RQ_PREEMPTIONS] = req.preemptions[r]
        out[E.RQ_ADMITTED] = 1 if req.admitted[r] else 0
        out[E.RQ_FIRST_STEP] = req.first_step[r]
        out[E.RQ_FIRST_TOKEN_STEP] = req.first_token_step[r]
        out[E.RQ_FINISH_STEP] = req.finish_step[r]
    summary[E.SM_EVENTS] = steps
    summary[E.SM_CLOCK] = clock
    summary[E.SM_FREE] = free
    summary[E.SM_STOP] = stop
