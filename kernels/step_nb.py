"""The step every replay kernel shares: apply the chosen request's step, record it, write the final state.

A replay kernel decides which request a step runs (and its victim); what the step then does to
that request is the same in every kernel (SPEC section 2): `advance_nb` moves it one step (prefill
to decode, or one more token, maybe its last), `record_step_nb` checks its deadline and writes the
event row, and `write_state_nb` writes every request's final state and the summary once the replay
stops.  The first two allocate nothing and are compiled with ``_nrt=False`` (no reference counting
of the arrays they receive), so LLVM inlines them into the caller and a kernel pays nothing for
sharing them.  (``inline="always"``, Numba's IR inlining, cost the fast kernels 30-70% per step:
measured on the Azure trace, fcfs 0.06 -> 0.21 s.)

A kernel calling these closes over a `stamp.source_stamp` that covers this file (Numba's cache key
covers only the caller's own file).
"""

from numba import njit

from . import enums as E


@njit(cache=True, _nrt=False)
def advance_nb(r, clock, phase, generated, max_new_tokens, first_step, first_token_step):
    """Run row r's step at `clock`: prefill -> decode, or one more token; return the ACTION_*.

    Only the row's phase, generated tokens and first-step clocks change here; on E.ACTION_FINISH the
    caller releases its blocks and marks it finished.
    """
    if phase[r] == E.PHASE_PREFILL:
        phase[r] = E.PHASE_DECODE
        first_step[r] = clock
        return E.ACTION_PREFILL_TO_DECODE
    generated[r] += 1
    if generated[r] == 1:
        first_token_step[r] = clock
    if generated[r] >= max_new_tokens[r]:
        return E.ACTION_FINISH
    return E.ACTION_DECODE_ONE_STEP


@njit(cache=True, _nrt=False)
def record_step_nb(events, steps, clock, r, action, generated, max_new_tokens, deadline_step, has_deadline,
                   wait, free, victim):
    """Log step number `steps` (row r after `advance_nb`, its `wait` steps, `free` blocks after the step,
    the preempted row or NO_ROW) into ``events[steps]`` while the log has room.

    deadline_missed: the row has a deadline and ``clock + 1 + remaining tokens`` exceeds it.
    """
    if steps < events.shape[0]:
        missed = 0
        if has_deadline[r] and clock + 1 + max_new_tokens[r] - generated[r] > deadline_step[r]:
            missed = 1
        events[steps, E.EV_STEP] = clock
        events[steps, E.EV_ROW] = r
        events[steps, E.EV_ACTION] = action
        events[steps, E.EV_GENERATED] = generated[r]
        events[steps, E.EV_WAIT] = wait
        events[steps, E.EV_FREE] = free
        events[steps, E.EV_VICTIM_ROW] = victim
        events[steps, E.EV_MISSED] = missed


@njit(cache=True)
def write_state_nb(req_out, summary, steps, clock, free, stop, enqueued, phase, status, generated,
                   wait_final, enqueue_steps, chosen_count, preemptions, admitted, first_step,
                   first_token_step, finish_step):
    """Write the final per-request state (RQ_* columns) and the summary of a replay.

    ``wait_steps`` may be lazy: ``steps run - steps run at enqueue - times chosen`` while unfinished,
    frozen in ``wait_final`` (>= 0) at finish.  A kernel that counts waits eagerly passes them as
    ``wait_final``.
    """
    n = req_out.shape[0]
    for r in range(n):
        out = req_out[r]
        out[E.RQ_ENQUEUED] = 1 if enqueued[r] else 0
        out[E.RQ_PHASE] = phase[r]
        out[E.RQ_STATUS] = status[r] if enqueued[r] else E.STATUS_WAITING
        out[E.RQ_GENERATED] = generated[r]
        if not enqueued[r]:
            out[E.RQ_WAIT] = 0
        elif wait_final[r] >= 0:
            out[E.RQ_WAIT] = wait_final[r]
        else:
            out[E.RQ_WAIT] = steps - enqueue_steps[r] - chosen_count[r]
        out[E.RQ_PREEMPTIONS] = preemptions[r]
        out[E.RQ_ADMITTED] = 1 if admitted[r] else 0
        out[E.RQ_FIRST_STEP] = first_step[r]
        out[E.RQ_FIRST_TOKEN_STEP] = first_token_step[r]
        out[E.RQ_FINISH_STEP] = finish_step[r]
    summary[E.SM_EVENTS] = steps
    summary[E.SM_CLOCK] = clock
    summary[E.SM_FREE] = free
    summary[E.SM_STOP] = stop
