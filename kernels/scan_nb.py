"""The scan kernel: the readable baseline engine.

Every step it looks at every active request, exactly as the seed's reference does, so its cost per
step grows linearly with the backlog.  It is kept as the plain translation of the model that the
fast kernel (`fast_nb`) is tested against, and it is what the CUDA path runs per scenario.

All arrays are in trace row order; rows, never request ids, identify requests inside kernels.
"""

import numpy as np
from numba import njit

from .enums import (
    ACTION_DECODE_ONE_STEP,
    ACTION_FINISH,
    ACTION_PREFILL_TO_DECODE,
    EV_ACTION,
    EV_FREE,
    EV_GENERATED,
    EV_MISSED,
    EV_ROW,
    EV_STEP,
    EV_VICTIM_ROW,
    EV_WAIT,
    NEVER,
    NO_DEADLINE_SLACK,
    NO_ROW,
    PHASE_DECODE,
    PHASE_PREFILL,
    POLICY_AGING,
    POLICY_DEADLINE,
    POLICY_FCFS,
    RQ_ADMITTED,
    RQ_ENQUEUED,
    RQ_FINISH_STEP,
    RQ_FIRST_STEP,
    RQ_FIRST_TOKEN_STEP,
    RQ_GENERATED,
    RQ_PHASE,
    RQ_PREEMPTIONS,
    RQ_STATUS,
    RQ_WAIT,
    SM_CLOCK,
    SM_EVENTS,
    SM_FREE,
    SM_STOP,
    STATUS_FINISHED,
    STATUS_PREEMPTED,
    STATUS_RUNNING,
    STATUS_WAITING,
    STOP_DRAINED,
    STOP_MAX_STEPS,
    STOP_STUCK,
)


@njit(cache=True, inline="always")
def schedule_key_nb(r, policy, aging_interval, clock, request_id, prompt_len, max_new_tokens, priority,
                    cache_hit, deadline_step, has_deadline, phase, generated, wait, enqueue_clock):
    """The seed's sort key of row `r` as a 6-tuple of int64, smallest first.

    fcfs: ``(phase_rank, enqueue clock, request_id, 0, 0, 0)``; the others:
    ``(slack, phase_rank, cache_rank, -effective_priority, total_len, request_id)``.
    """
    if policy == POLICY_FCFS:
        return (np.int64(phase[r]), enqueue_clock[r], request_id[r], np.int64(0), np.int64(0), np.int64(0))
    slack = np.int64(NO_DEADLINE_SLACK)
    if policy == POLICY_DEADLINE and has_deadline[r]:
        remaining = max_new_tokens[r] - generated[r]
        if phase[r] == PHASE_PREFILL:
            remaining += 1
        slack = deadline_step[r] - clock - remaining
    eff = effective_priority_nb(r, policy, aging_interval, priority, wait)
    cache_rank = np.int64(0) if cache_hit[r] else np.int64(1)
    return (slack, np.int64(phase[r]), cache_rank, -eff, prompt_len[r] + generated[r], request_id[r])


@njit(cache=True)
def replay_scan_nb(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit,
                   required_blocks, deadline_step, has_deadline, preemptible, order,
                   policy, free_kv_blocks, aging_interval, max_steps,
                   events, req_out, summary):
    """Replay one trace under one scheduler configuration (SPEC sections 2 and 3).

    Inputs, all of length n in trace row order: int64 ``request_id, arrival_step, prompt_len,
    max_new_tokens, priority, required_blocks, deadline_step``; bool ``cache_hit, has_deadline,
    preemptible``; ``order`` int64 (n,) = rows sorted by (arrival_step, row).  Scalars: ``policy``
    (POLICY_*), ``free_kv_blocks``, ``aging_interval`` (> 0), ``max_steps`` (-1 for no limit).

    Outputs (preallocated by the caller): ``events`` int64 (max_events, EV_NCOLS), one row per step
    while there is room (pass shape (0, EV_NCOLS) to keep no log); ``req_out`` int64 (n, RQ_NCOLS),
    the final state of every row; ``summary`` int64 (SM_NCOLS,).
    """
    n = request_id.shape[0]
    phase = np.zeros(n, np.int64)
    generated = np.zeros(n, np.int64)
    wait = np.zeros(n, np.int64)
    status = np.zeros(n, np.int64)
    preemptions = np.zeros(n, np.int64)
    admitted = np.zeros(n, np.bool_)
    enqueued = np.zeros(n, np.bool_)
    enqueue_clock = np.zeros(n, np.int64)
    first_step = np.full(n, NEVER, np.int64)
    first_token_step = np.full(n, NEVER, np.int64)
    finish_step = np.full(n, NEVER, np.int64)
    active = np.empty(n, np.int64)  # unfinished enqueued rows, in no particular order
    victims = np.empty(n, np.int64)  # scratch: admitted preemptible rows of this step
    victim_eff = np.empty(n, np.int64)  # their effective priorities
    sorted_eff = np.empty(n, np.int64)  # the same, ascending
    max_blocks_below = np.empty(n, np.int64)  # max blocks among the first k+1 of sorted_eff
    n_active = 0
    pos = 0
    clock = np.int64(0)
    free = np.int64(free_kv_blocks)
    steps = np.int64(0)
    max_events = events.shape[0]
    stop = STOP_DRAINED

    while True:
        if max_steps >= 0 and steps >= max_steps:
            stop = STOP_MAX_STEPS
            break
        while pos < n and arrival_step[order[pos]] <= clock:
            r = order[pos]
            enqueued[r] = True
            enqueue_clock[r] = clock
            active[n_active] = r
            n_active += 1
            pos += 1

        # Admitted, preemptible requests are the possible victims of this step. Sorted by effective
        # priority with a running max of their blocks, they tell in O(log m) whether a challenger has
        # a victim: the largest victim below its priority, plus the free blocks, must cover it.
        n_victims = 0
        for i in range(n_active):
            r = active[i]
            if admitted[r] and preemptible[r]:
                victims[n_victims] = r
                victim_eff[n_victims] = effective_priority_nb(r, policy, aging_interval, priority, wait)
                n_victims += 1
        if n_victims > 0:
            by_eff = np.argsort(victim_eff[:n_victims])
            running_max = np.int64(0)
            for k in range(n_victims):
                v = victims[by_eff[k]]
                sorted_eff[k] = victim_eff[by_eff[k]]
                running_max = max(running_max, required_blocks[v])
                max_blocks_below[k] = running_max

        # The first candidate in key order that can run: admitted, fits, or can preempt one victim.
        # Failed attempts change nothing in the seed, so this equals its walk over sorted candidates.
        best = NO_ROW
        best_key = (np.int64(0), np.int64(0), np.int64(0), np.int64(0), np.int64(0), np.int64(0))
        for i in range(n_active):
            r = active[i]
            key = schedule_key_nb(r, policy, aging_interval, clock, request_id, prompt_len, max_new_tokens,
                                  priority, cache_hit, deadline_step, has_deadline, phase, generated, wait,
                                  enqueue_clock)
            if best != NO_ROW and not key < best_key:
                continue
            if not admitted[r] and required_blocks[r] > free:
                eff = effective_priority_nb(r, policy, aging_interval, priority, wait)
                below = np.searchsorted(sorted_eff[:n_victims], eff)  # victims with a strictly lower priority
                if below == 0 or free + max_blocks_below[below - 1] < required_blocks[r]:
                    continue
            best = r
            best_key = key
        best_victim = NO_ROW
        if best != NO_ROW and not admitted[best] and required_blocks[best] > free:
            best_victim = find_victim_nb(best, victims, n_victims, free, policy, aging_interval, priority, wait,
                                         required_blocks, request_id)

        if best == NO_ROW:
            if pos < n:
                clock = arrival_step[order[pos]]  # idle gap: jump, nobody waits
                continue
            stop = STOP_DRAINED if n_active == 0 else STOP_STUCK
            break

        chosen = best
        if not admitted[chosen]:
            if best_victim != NO_ROW:
                admitted[best_victim] = False
                status[best_victim] = STATUS_PREEMPTED
                preemptions[best_victim] += 1
                free += required_blocks[best_victim]
            free -= required_blocks[chosen]
            admitted[chosen] = True
        status[chosen] = STATUS_RUNNING

        for i in range(n_active):
            r = active[i]
            if r != chosen:
                wait[r] += 1

        if phase[chosen] == PHASE_PREFILL:
            phase[chosen] = PHASE_DECODE
            action = ACTION_PREFILL_TO_DECODE
            first_step[chosen] = clock
        else:
            generated[chosen] += 1
            if generated[chosen] == 1:
                first_token_step[chosen] = clock
            if generated[chosen] >= max_new_tokens[chosen]:
                action = ACTION_FINISH
                free += required_blocks[chosen]
                admitted[chosen] = False
                status[chosen] = STATUS_FINISHED
                finish_step[chosen] = clock
                for i in range(n_active):
                    if active[i] == chosen:
                        active[i] = active[n_active - 1]
                        break
                n_active -= 1
            else:
                action = ACTION_DECODE_ONE_STEP

        missed = 0
        if has_deadline[chosen]:
            remaining = max_new_tokens[chosen] - generated[chosen]
            if clock + 1 + remaining > deadline_step[chosen]:
                missed = 1
        if steps < max_events:
            ev = events[steps]
            ev[EV_STEP] = clock
            ev[EV_ROW] = chosen
            ev[EV_ACTION] = action
            ev[EV_GENERATED] = generated[chosen]
            ev[EV_WAIT] = wait[chosen]
            ev[EV_FREE] = free
            ev[EV_VICTIM_ROW] = best_victim
            ev[EV_MISSED] = missed
        clock += 1
        steps += 1

    for r in range(n):
        out = req_out[r]
        out[RQ_ENQUEUED] = 1 if enqueued[r] else 0
        out[RQ_PHASE] = phase[r]
        out[RQ_STATUS] = status[r] if enqueued[r] else STATUS_WAITING
        out[RQ_GENERATED] = generated[r]
        out[RQ_WAIT] = wait[r]
        out[RQ_PREEMPTIONS] = preemptions[r]
        out[RQ_ADMITTED] = 1 if admitted[r] else 0
        out[RQ_FIRST_STEP] = first_step[r]
        out[RQ_FIRST_TOKEN_STEP] = first_token_step[r]
        out[RQ_FINISH_STEP] = finish_step[r]
    summary[SM_EVENTS] = steps
    summary[SM_CLOCK] = clock
    summary[SM_FREE] = free
    summary[SM_STOP] = stop


@njit(cache=True, inline="always")
def effective_priority_nb(r, policy, aging_interval, priority, wait):
    """Business priority, plus one level per `aging_interval` waited steps under aging."""
    if policy == POLICY_AGING:
        return priority[r] + wait[r] // aging_interval
    return priority[r]


@njit(cache=True)
def find_victim_nb(challenger, victims, n_victims, free, policy, aging_interval, priority, wait,
                   required_blocks, request_id):
    """The seed's single victim for `challenger`, or NO_ROW.

    Among admitted preemptible rows with strictly lower effective priority whose blocks, added to
    `free`, cover the challenger: the first in order (effective_priority, -required_blocks, request_id).
    """
    need = required_blocks[challenger]
    c_eff = effective_priority_nb(challenger, policy, aging_interval, priority, wait)
    best = NO_ROW
    best_eff = np.int64(0)
    for i in range(n_victims):
        v = victims[i]
        if free + required_blocks[v] < need:
            continue
        eff = effective_priority_nb(v, policy, aging_interval, priority, wait)
        if eff >= c_eff:
            continue
        if best == NO_ROW or (eff, -required_blocks[v], request_id[v]) < (
            best_eff, -required_blocks[best], request_id[best]
        ):
            best = v
            best_eff = eff
    return best
