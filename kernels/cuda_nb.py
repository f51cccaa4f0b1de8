"""The CUDA batch path: one GPU thread per scenario, running the scan algorithm of `scan_nb`.

Same inputs and outputs as `batch_nb.replay_batch_nb` (bit-identical results), minus the lanes:
every scenario gets its own thread.  Device code uses scalars only (no tuples, no allocation), so
the per-scenario state lives in global memory: the scenario's own rows of ``req_out`` hold phase,
status, tokens, waits, preemptions, admission and first/finish steps while it runs (they are its
final state when it stops), and three int64 scratch arrays laid out as ``req_out``'s rows (a
scenario's own rows ``req_start[s]:req_start[s + 1]``, one per request of its trace) hold the active
list, the victim list and each request's enqueue clock: the GPU memory a batch takes grows with its
scenarios' trace lengths, never with the number of scenarios times the longest trace.

Runs under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` set before Numba is imported), which
is how CI tests it; it is slow there (every thread is interpreted Python).
"""

import warnings

import numpy as np
from numba import cuda
from numba.core.errors import NumbaPerformanceWarning

from . import enums as E

THREADS_PER_BLOCK = 64
SCRATCH_ARRAYS = 3  # active, victims, enqueue_clock


@cuda.jit(device=True)
def key_less_cuda(a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5):
    """(a0..a5) < (b0..b5), lexicographically (tuple comparison without tuples)."""
    if a0 != b0:
        return a0 < b0
    if a1 != b1:
        return a1 < b1
    if a2 != b2:
        return a2 < b2
    if a3 != b3:
        return a3 < b3
    if a4 != b4:
        return a4 < b4
    return a5 < b5


@cuda.jit(device=True)
def effective_priority_cuda(priority, wait, policy, aging_interval):
    if policy == E.POLICY_AGING:
        return priority + wait // aging_interval
    return priority


@cuda.jit(device=True)
def find_victim_cuda(need, c_eff, victims, n_victims, free, policy, aging_interval, a, priority,
                     required_blocks, request_id, req_out, base):
    """`scan_nb.find_victim_nb` for the scenario whose rows start at `base`: the single victim row, or E.NO_ROW."""
    best = E.NO_ROW
    best_eff = 0
    for i in range(n_victims):
        v = victims[base + i]
        if free + required_blocks[a + v] < need:
            continue
        eff = effective_priority_cuda(priority[a + v], req_out[base + v, E.RQ_WAIT], policy, aging_interval)
        if eff >= c_eff:
            continue
        if best == E.NO_ROW or key_less_cuda(eff, -required_blocks[a + v], request_id[a + v], 0, 0, 0,
                                           best_eff, -required_blocks[a + best], request_id[a + best], 0, 0, 0):
            best = v
            best_eff = eff
    return best


@cuda.jit(cache=True)
def replay_batch_cuda_kernel(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit,
                             required_blocks, deadline_step, has_deadline, preemptible, order, trace_start,
                             sc_trace, sc_policy, sc_capacity, sc_interval, sc_max_steps,
                             req_start, event_start, events, req_out, summary,
                             active, victims, enqueue_clock):
    """One scenario per thread; arrays as in `batch_nb.replay_batch_nb` (no lanes) plus scratch.

    Scratch: ``active``, ``victims``, ``enqueue_clock`` int64, one element per row of ``req_out``.
    """
    s = cuda.grid(1)
    if s >= sc_trace.shape[0]:
        return
    t = sc_trace[s]
    a = trace_start[t]
    n = trace_start[t + 1] - a
    policy = sc_policy[s]
    aging_interval = sc_interval[s]
    max_steps = sc_max_steps[s]
    base = req_start[s]
    ev_base = event_start[s]
    max_events = event_start[s + 1] - ev_base

    for r in range(n):
        for c in range(E.RQ_NCOLS):
            req_out[base + r, c] = 0
        req_out[base + r, E.RQ_PHASE] = E.PHASE_PREFILL
        req_out[base + r, E.RQ_STATUS] = E.STATUS_WAITING
        req_out[base + r, E.RQ_FIRST_STEP] = E.NEVER
        req_out[base + r, E.RQ_FIRST_TOKEN_STEP] = E.NEVER
        req_out[base + r, E.RQ_FINISH_STEP] = E.NEVER

    n_active = 0
    pos = 0
    clock = 0
    free = sc_capacity[s]
    steps = 0
    stop = E.STOP_DRAINED

    while True:
        if max_steps >= 0 and steps >= max_steps:
            stop = E.STOP_MAX_STEPS
            break
        while pos < n and arrival_step[a + order[a + pos]] <= clock:
            r = order[a + pos]
            req_out[base + r, E.RQ_ENQUEUED] = 1
            enqueue_clock[base + r] = clock
            active[base + n_active] = r
            n_active += 1
            pos += 1

        n_victims = 0
        max_victim_blocks = 0
        for i in range(n_active):
            r = active[base + i]
            if req_out[base + r, E.RQ_ADMITTED] != 0 and preemptible[a + r]:
                victims[base + n_victims] = r
                n_victims += 1
                if required_blocks[a + r] > max_victim_blocks:
                    max_victim_blocks = required_blocks[a + r]

        best = E.NO_ROW
        best_victim = E.NO_ROW
        b0 = 0
        b1 = 0
        b2 = 0
        b3 = 0
        b4 = 0
        b5 = 0
        for i in range(n_active):
            r = active[base + i]
            phase = req_out[base + r, E.RQ_PHASE]
            generated = req_out[base + r, E.RQ_GENERATED]
            wait = req_out[base + r, E.RQ_WAIT]
            if policy == E.POLICY_FCFS:
                k0 = phase
                k1 = enqueue_clock[base + r]
                k2 = request_id[a + r]
                k3 = 0
                k4 = 0
                k5 = 0
            else:
                k0 = E.NO_DEADLINE_SLACK
                if policy == E.POLICY_DEADLINE and has_deadline[a + r]:
                    remaining = max_new_tokens[a + r] - generated
                    if phase == E.PHASE_PREFILL:
                        remaining += 1
                    k0 = deadline_step[a + r] - clock - remaining
                k1 = phase
                k2 = 0 if cache_hit[a + r] else 1
                k3 = -effective_priority_cuda(priority[a + r], wait, policy, aging_interval)
                k4 = prompt_len[a + r] + generated
                k5 = request_id[a + r]
            if best != E.NO_ROW and not key_less_cuda(k0, k1, k2, k3, k4, k5, b0, b1, b2, b3, b4, b5):
                continue
            victim = E.NO_ROW
            need = required_blocks[a + r]
            if req_out[base + r, E.RQ_ADMITTED] == 0 and need > free:
                if need > free + max_victim_blocks:
                    continue
                c_eff = effective_priority_cuda(priority[a + r], wait, policy, aging_interval)
                victim = find_victim_cuda(need, c_eff, victims, n_victims, free, policy, aging_interval, a,
                                          priority, required_blocks, request_id, req_out, base)
                if victim == E.NO_ROW:
                    continue
            best = r
            best_victim = victim
            b0 = k0
            b1 = k1
            b2 = k2
            b3 = k3
            b4 = k4
            b5 = k5

        if best == E.NO_ROW:
            if pos < n:
                clock = arrival_step[a + order[a + pos]]
                continue
            stop = E.STOP_DRAINED if n_active == 0 else E.STOP_STUCK
            break

        chosen = best
        if req_out[base + chosen, E.RQ_ADMITTED] == 0:
            if best_victim != E.NO_ROW:
                req_out[base + best_victim, E.RQ_ADMITTED] = 0
                req_out[base + best_victim, E.RQ_STATUS] = E.STATUS_PREEMPTED
                req_out[base + best_victim, E.RQ_PREEMPTIONS] += 1
                free += required_blocks[a + best_victim]
            free -= required_blocks[a + chosen]
            req_out[base + chosen, E.RQ_ADMITTED] = 1
        req_out[base + chosen, E.RQ_STATUS] = E.STATUS_RUNNING

        for i in range(n_active):
            r = active[base + i]
            if r != chosen:
                req_out[base + r, E.RQ_WAIT] += 1

        if req_out[base + chosen, E.RQ_PHASE] == E.PHASE_PREFILL:
            req_out[base + chosen, E.RQ_PHASE] = E.PHASE_DECODE
            action = E.ACTION_PREFILL_TO_DECODE
            req_out[base + chosen, E.RQ_FIRST_STEP] = clock
        else:
            req_out[base + chosen, E.RQ_GENERATED] += 1
            generated = req_out[base + chosen, E.RQ_GENERATED]
            if generated == 1:
                req_out[base + chosen, E.RQ_FIRST_TOKEN_STEP] = clock
            if generated >= max_new_tokens[a + chosen]:
                action = E.ACTION_FINISH
                free += required_blocks[a + chosen]
                req_out[base + chosen, E.RQ_ADMITTED] = 0
                req_out[base + chosen, E.RQ_STATUS] = E.STATUS_FINISHED
                req_out[base + chosen, E.RQ_FINISH_STEP] = clock
                for i in range(n_active):
                    if active[base + i] == chosen:
                        active[base + i] = active[base + n_active - 1]
                        break
                n_active -= 1
            else:
                action = E.ACTION_DECODE_ONE_STEP

        generated = req_out[base + chosen, E.RQ_GENERATED]
        missed = 0
        if has_deadline[a + chosen]:
            if clock + 1 + (max_new_tokens[a + chosen] - generated) > deadline_step[a + chosen]:
                missed = 1
        if steps < max_events:
            e = ev_base + steps
            events[e, E.EV_STEP] = clock
            events[e, E.EV_ROW] = chosen
            events[e, E.EV_ACTION] = action
            events[e, E.EV_GENERATED] = generated
            events[e, E.EV_WAIT] = req_out[base + chosen, E.RQ_WAIT]
            events[e, E.EV_FREE] = free
            events[e, E.EV_VICTIM_ROW] = best_victim
            events[e, E.EV_MISSED] = missed
        clock += 1
        steps += 1

    summary[s, E.SM_EVENTS] = steps
    summary[s, E.SM_CLOCK] = clock
    summary[s, E.SM_FREE] = free
    summary[s, E.SM_STOP] = stop


def replay_batch_cuda(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit,
                      required_blocks, deadline_step, has_deadline, preemptible, order, trace_start,
                      sc_trace, sc_policy, sc_capacity, sc_interval, sc_max_steps,
                      req_start, event_start, events, req_out, summary):
    """Host side: copy to the GPU, launch one thread per scenario, copy ``events``, ``req_out`` and
    ``summary`` back in place.  Arrays as in `batch_nb.replay_batch_nb` (without the lanes); the GPU
    memory it takes is `device_bytes` of the same arguments."""
    n_sc = sc_trace.shape[0]
    inputs = [cuda.to_device(np.ascontiguousarray(x)) for x in (
        request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit, required_blocks, deadline_step,
        has_deadline, preemptible, order, trace_start, sc_trace, sc_policy, sc_capacity, sc_interval, sc_max_steps,
        req_start, event_start)]
    d_events = cuda.to_device(events if events.shape[0] else np.zeros(_log_shape(events), np.int64))
    d_req = cuda.device_array(req_out.shape, np.int64)
    d_summary = cuda.device_array(summary.shape, np.int64)
    scratch = [cuda.device_array(_scratch_rows(req_out), np.int64) for _ in range(SCRATCH_ARRAYS)]
    tpb = min(THREADS_PER_BLOCK, n_sc)
    blocks = (n_sc + tpb - 1) // tpb
    # One thread per scenario: a sweep of fewer than 128 x 64 scenarios is a grid under 128 blocks, which Numba's GPU
    # launch reports every time as a NumbaPerformanceWarning on stderr (a traceback under PYTHONWARNINGS=error).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Grid size", NumbaPerformanceWarning)
        replay_batch_cuda_kernel[blocks, tpb](*inputs, d_events, d_req, d_summary, *scratch)
    if events.shape[0]:
        d_events.copy_to_host(events)
    d_req.copy_to_host(req_out)
    d_summary.copy_to_host(summary)


def device_bytes(*args) -> int:
    """The GPU memory `replay_batch_cuda` takes for these arguments (the same ones, in its order)."""
    *inputs, events, req_out, summary = args
    log_rows, log_cols = _log_shape(events)
    scratch = SCRATCH_ARRAYS * _scratch_rows(req_out)
    outputs = 8 * (log_rows * log_cols + scratch) + req_out.nbytes + summary.nbytes
    return sum(np.asarray(x).nbytes for x in inputs) + outputs


def _log_shape(events) -> tuple[int, int]:
    """The device event log's shape: a zero-length device array cannot be indexed, so at least one (unused) row."""
    return max(events.shape[0], 1), events.shape[1]


def _scratch_rows(req_out) -> int:
    """Each scratch array's length: one element per row of ``req_out`` (at least one, as for the log)."""
    return max(req_out.shape[0], 1)
