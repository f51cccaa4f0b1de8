"""The scan kernel: the generic engine, correct for any policy (SPEC sections 2, 3 and 8).

Every step it looks at every active request, as the seed's reference does, so its cost per step
grows linearly with the backlog.  It is the readable translation of the model that the fast
kernel (`fast_nb`) is tested against, and the engine of user-defined policies
(`decodesched.Policy`).

A policy is two functions of ``(r, clock)``: the sort key (a tuple of integers; the kernel appends
``request_id``) and the effective priority (the victim rule and the victim order).  ``r`` is a
`RequestView`: one request's state as a named tuple of int64.  The body of `replay_scan_nb` calls
the module globals ``_key_nb`` and ``_eff_nb`` with ``(r, clock, policy, aging_interval)``; here
they are the built-in policies (`builtin_key_nb`, `builtin_effective_priority_nb`, selected by the
policy code), so `replay_scan_nb` is cached.  `make_replay_kernel` compiles the same body with
those two names bound to a user's functions: Numba cannot cache a kernel that takes or closes
over other compiled functions, so a user policy compiles once per process.

The per-request state (`step_nb.Requests`), the step's end (advance, deadline check, event row) and
the final write-out are `step_nb`'s, shared with the other kernels; `replay_scan_nb` closes over a
source stamp of that file (`stamp`).  Waits are counted eagerly here, in ``wait_final``.

Per step: the admitted preemptible rows (possible victims) are sorted by effective priority with
a running maximum of their blocks, which tells in O(log m) whether a challenger has a victim;
then one pass over the active rows keeps the smallest key among those that can run.  A row that needs
more blocks than exist never runs: it is never active (it only waits), so it costs nothing a step, where
it was keyed at every step to the end of the replay (docs/performance.md, "Shapes outside the table").

All arrays are in trace row order; rows, never request ids, identify requests inside kernels.
"""

from collections import namedtuple
from types import FunctionType

import numpy as np
from numba import njit

from . import enums as E
from .stamp import source_stamp
from .step_nb import advance_nb, new_requests_nb, record_step_nb, write_state_nb

SOURCE_STAMP = source_stamp("enums.py", "ordered_nb.py", "step_nb.py")

# One request's state as a policy sees it (SPEC section 8); flags are 0/1, deadline_step is 0 when
# has_deadline is 0, arrival_step is the clock at which the request was enqueued.
REQUEST_FIELDS = ("request_id", "arrival_step", "prompt_len", "max_new_tokens", "generated_len", "phase",
                  "priority", "cache_hit", "wait_steps", "deadline_step", "has_deadline", "preemptible",
                  "preemptions", "admitted")
RequestView = namedtuple("RequestView", REQUEST_FIELDS)


@njit(cache=True)
def builtin_effective_priority_nb(r, clock, policy, aging_interval):
    """Business priority, plus one level per `aging_interval` waited steps under aging."""
    if policy == E.POLICY_AGING:
        return r.priority + r.wait_steps // aging_interval
    return r.priority


@njit(cache=True)
def builtin_key_nb(r, clock, policy, aging_interval):
    """The seed's sort key without its final ``request_id``, as a 5-tuple of int64.

    fcfs: ``(phase_rank, enqueue clock, 0, 0, 0)``; the others:
    ``(slack, phase_rank, cache_rank, -effective_priority, total_len)``.
    """
    zero = np.int64(0)
    if policy == E.POLICY_FCFS:
        return (r.phase, r.arrival_step, zero, zero, zero)
    slack = np.int64(E.NO_DEADLINE_SLACK)
    if policy == E.POLICY_DEADLINE and r.has_deadline:
        remaining = r.max_new_tokens - r.generated_len
        if r.phase == E.PHASE_PREFILL:
            remaining += 1
        slack = r.deadline_step - clock - remaining
    eff = builtin_effective_priority_nb(r, clock, policy, aging_interval)
    return (slack, r.phase, np.int64(1) - r.cache_hit, -eff, r.prompt_len + r.generated_len)


# The policy functions `replay_scan_nb` calls; `make_replay_kernel` rebinds them.
_key_nb = builtin_key_nb
_eff_nb = builtin_effective_priority_nb


@njit(cache=True, inline="always")
def request_view_nb(r, request_id, enqueue_clock, prompt_len, max_new_tokens, priority, cache_hit,
                    deadline_step, has_deadline, preemptible, req):
    """Row `r`'s state (its replay state in `req`, waits counted eagerly) as a `RequestView` of int64."""
    one = np.int64(1)
    zero = np.int64(0)
    return RequestView(request_id[r], enqueue_clock[r], prompt_len[r], max_new_tokens[r], req.generated[r],
                       req.phase[r], priority[r], one if cache_hit[r] else zero, req.wait_final[r],
                       deadline_step[r] if has_deadline[r] else zero, one if has_deadline[r] else zero,
                       one if preemptible[r] else zero, req.preemptions[r], one if req.admitted[r] else zero)


def _make_replay_scan(stamp):
    """`replay_scan_nb`, closing over `stamp` so that an edit of a kernel it calls compiles it afresh."""

    @njit(cache=True, nogil=True)  # (run from a helper thread: `decodesched._io.interruptible`)
    def replay_scan_nb(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit,
                       required_blocks, deadline_step, has_deadline, preemptible, order,
                       policy, free_kv_blocks, aging_interval, max_steps,
                       events, req_out, summary):
        """Replay one trace under one scheduler configuration (SPEC sections 2, 3 and 8).

        Inputs, all of length n in trace row order: int64 ``request_id, arrival_step, prompt_len,
        max_new_tokens, priority, required_blocks, deadline_step``; bool ``cache_hit, has_deadline,
        preemptible``; ``order`` int64 (n,) = rows sorted by (arrival_step, row).  Scalars: ``policy``
        (POLICY_*; passed on to the policy functions, which a user policy ignores), ``free_kv_blocks``,
        ``aging_interval`` (> 0), ``max_steps`` (-1 for no limit).

        Outputs (preallocated by the caller): ``events`` int64 (max_events, EV_NCOLS), one row per step
        while there is room (pass shape (0, EV_NCOLS) to keep no log); ``req_out`` int64 (n, RQ_NCOLS),
        the final state of every row; ``summary`` int64 (SM_NCOLS,).
        """
        if stamp < 0:  # never: the stamp only keys the Numba cache (see `source_stamp`)
            return
        n = request_id.shape[0]
        req = new_requests_nb(n)
        wait = req.wait_final  # counted eagerly from enqueue, so always final
        enqueue_clock = np.zeros(n, np.int64)
        active = np.empty(n, np.int64)  # unfinished enqueued rows that can run, in no particular order
        # rows needing more blocks than exist (free never exceeds free_kv_blocks): they wait every step from
        # their enqueue, so `wait` holds the steps run at the enqueue until the end
        never = np.empty(n, np.int64)
        n_never = 0
        victims = np.empty(n, np.int64)  # scratch: admitted preemptible rows of this step
        victim_eff = np.empty(n, np.int64)  # their effective priorities
        sorted_eff = np.empty(n, np.int64)  # the same, ascending
        max_blocks_below = np.empty(n, np.int64)  # max blocks among the first k+1 of sorted_eff
        n_active = 0
        pos = 0
        clock = np.int64(0)
        free = np.int64(free_kv_blocks)
        steps = np.int64(0)
        stop = E.STOP_DRAINED

        while True:
            if max_steps >= 0 and steps >= max_steps:
                stop = E.STOP_MAX_STEPS
                break
            while pos < n and arrival_step[order[pos]] <= clock:
                r = order[pos]
                req.enqueued[r] = True
                enqueue_clock[r] = clock
                pos += 1
                if required_blocks[r] > free_kv_blocks:
                    wait[r] = steps
                    never[n_never] = r
                    n_never += 1
                    continue
                wait[r] = 0
                active[n_active] = r
                n_active += 1

            # The possible victims of this step, sorted by effective priority, with a running max of
            # their blocks: the largest victim below a challenger's priority, plus the free blocks,
            # must cover the challenger.
            n_victims = 0
            for i in range(n_active):
                r = active[i]
                if req.admitted[r] and preemptible[r]:
                    view = request_view_nb(r, request_id, enqueue_clock, prompt_len, max_new_tokens, priority, cache_hit,
                                           deadline_step, has_deadline, preemptible, req)
                    victims[n_victims] = r
                    victim_eff[n_victims] = _eff_nb(view, clock, policy, aging_interval)
                    n_victims += 1
            if n_victims > 0:
                by_eff = np.argsort(victim_eff[:n_victims])
                running_max = np.int64(0)
                for k in range(n_victims):
                    sorted_eff[k] = victim_eff[by_eff[k]]
                    running_max = max(running_max, required_blocks[victims[by_eff[k]]])
                    max_blocks_below[k] = running_max

            # The first candidate in key order that can run: admitted, fits, or can preempt one victim.
            # Failed attempts change nothing in the seed, so this equals its walk over sorted candidates.
            best = E.NO_ROW
            best_eff = np.int64(0)
            if n_active > 0:
                r = active[0]
                view = request_view_nb(r, request_id, enqueue_clock, prompt_len, max_new_tokens, priority, cache_hit,
                                       deadline_step, has_deadline, preemptible, req)
                best_key = _key_nb(view, clock, policy, aging_interval) + (request_id[r],)
                for i in range(n_active):
                    r = active[i]
                    view = request_view_nb(r, request_id, enqueue_clock, prompt_len, max_new_tokens, priority,
                                           cache_hit, deadline_step, has_deadline, preemptible, req)
                    key = _key_nb(view, clock, policy, aging_interval) + (request_id[r],)
                    if best != E.NO_ROW and not key < best_key:
                        continue
                    eff = np.int64(0)
                    if not req.admitted[r] and required_blocks[r] > free:
                        eff = _eff_nb(view, clock, policy, aging_interval)
                        below = np.searchsorted(sorted_eff[:n_victims], eff)  # victims strictly below
                        if below == 0 or free + max_blocks_below[below - 1] < required_blocks[r]:
                            continue
                    best = r
                    best_key = key
                    best_eff = eff

            if best == E.NO_ROW:
                if pos < n:
                    clock = arrival_step[order[pos]]  # idle gap: jump, nobody waits
                    continue
                stop = E.STOP_DRAINED if n_active + n_never == 0 else E.STOP_STUCK
                break

            chosen = best
            victim = E.NO_ROW
            if not req.admitted[chosen]:
                if required_blocks[chosen] > free:
                    victim = find_victim_nb(required_blocks[chosen], best_eff, victims, victim_eff, n_victims, free,
                                            required_blocks, request_id)
                    req.admitted[victim] = False
                    req.status[victim] = E.STATUS_PREEMPTED
                    req.preemptions[victim] += 1
                    free += required_blocks[victim]
                free -= required_blocks[chosen]
                req.admitted[chosen] = True
            req.status[chosen] = E.STATUS_RUNNING

            for i in range(n_active):
                r = active[i]
                if r != chosen:
                    wait[r] += 1

            action = advance_nb(chosen, clock, req, max_new_tokens)
            if action == E.ACTION_FINISH:
                free += required_blocks[chosen]
                req.admitted[chosen] = False
                req.status[chosen] = E.STATUS_FINISHED
                req.finish_step[chosen] = clock
                for i in range(n_active):
                    if active[i] == chosen:
                        active[i] = active[n_active - 1]
                        break
                n_active -= 1
            record_step_nb(events, steps, clock, chosen, action, req, max_new_tokens, deadline_step, has_deadline,
                           wait[chosen], free, victim)
            clock += 1
            steps += 1

        for i in range(n_never):
            wait[never[i]] = steps - wait[never[i]]
        write_state_nb(req_out, summary, steps, clock, free, stop, req)

    return replay_scan_nb


replay_scan_nb = _make_replay_scan(SOURCE_STAMP)


@njit(cache=True)
def find_victim_nb(need, challenger_eff, victims, victim_eff, n_victims, free, required_blocks, request_id):
    """The seed's single victim for a challenger needing `need` blocks, or E.NO_ROW.

    Among the `n_victims` admitted preemptible rows `victims` (effective priorities `victim_eff`)
    with effective priority strictly below `challenger_eff` whose blocks, added to `free`, cover
    `need`: the first in order (effective_priority, -required_blocks, request_id).
    """
    best = E.NO_ROW
    best_eff = np.int64(0)
    for i in range(n_victims):
        v = victims[i]
        eff = victim_eff[i]
        if free + required_blocks[v] < need or eff >= challenger_eff:
            continue
        if best == E.NO_ROW or (eff, -required_blocks[v], request_id[v]) < (
            best_eff, -required_blocks[best], request_id[best]
        ):
            best = v
            best_eff = eff
    return best


def make_replay_kernel(key, effective_priority):
    """`replay_scan_nb` with its policy functions bound to `key` and `effective_priority`, both
    compiled functions of ``(r, clock, policy, aging_interval)`` (see the module docstring).

    Not cached (Numba cannot cache it); ``nogil=True`` so that threads can run scenarios at once.
    """
    py = replay_scan_nb.py_func
    namespace = dict(py.__globals__, _key_nb=key, _eff_nb=effective_priority)
    fn = FunctionType(py.__code__, namespace, "replay_policy_nb", py.__defaults__, py.__closure__)
    fn.__qualname__ = "replay_policy_nb"
    fn.__doc__ = py.__doc__
    return njit(nogil=True)(fn)
