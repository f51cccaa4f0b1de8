"""The batch kernels: many scenarios (trace, policy, capacity, aging interval) in one parallel call.

Each scenario is one call of a single-scenario replay kernel (same signature as `replay_scan_nb`)
on its own slices of the inputs and outputs, so scenarios never share state and the results do not
depend on the thread count or on the order in which scenarios run.

Scheduling: ``prange`` with Numba's OpenMP layer splits its iterations into contiguous, equal
blocks per thread whatever ``set_parallel_chunksize`` says (measured), and replay costs differ by
orders of magnitude between scenarios (the fast aging kernel's cost grows with the aging
interval), so a static split leaves one thread idle.  The kernels therefore run ``prange`` over
``n_workers`` workers that take the next scenario from a shared queue with an atomic counter
(dynamic scheduling), and count finished scenarios in another, which a progress bar can read
while the kernel runs (the kernels release the GIL).

Caching: Numba's cache key covers only the cached function's own file, so an edit to a kernel it
calls (`scan_nb`, `fast_nb`, `ordered_nb`, `enums`) would leave a stale batch kernel in the cache.
The batch kernels therefore close over ``SOURCE_STAMP``, a hash of those files: Numba puts closure
values into its cache key, so any edit there compiles the batch kernels afresh.
"""

from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .fast_nb import replay_fast_nb
from .scan_nb import replay_scan_nb
from .stamp import KERNELS, source_stamp

# every kernel source the batch kernels may call: kernels/*.py but this file and the CUDA one
SOURCE_STAMP = source_stamp(*sorted(p.name for p in KERNELS.glob("*.py") if p.name not in ("batch_nb.py", "cuda_nb.py")))


@intrinsic
def atomic_add_nb(typingctx, array, index, value):
    """``old = array[index]; array[index] += value`` as one atomic step; returns ``old``.

    ``array`` int64 1-D, C-contiguous.  Lets parallel workers share a queue position.
    """
    if not (isinstance(array, types.Array) and array.dtype == types.int64 and array.ndim == 1):
        return None
    sig = types.int64(array, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        ary = context.make_array(array_type)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, array_type, ary, [args[1]])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")

    return sig, codegen


# counters[NEXT]: position in run_order of the next scenario to start; counters[DONE]: finished.
NEXT = 0
DONE = 1


def _make_batch_kernels(stamp):
    """The two batch kernels, closing over `stamp` (see the module docstring)."""

    @njit(parallel=True, nogil=True, cache=True)
    def replay_batch_scan_nb(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit,
                             required_blocks, deadline_step, has_deadline, preemptible, order, trace_start,
                             sc_trace, sc_policy, sc_capacity, sc_interval, sc_max_steps,
                             run_order, counters, n_workers, req_start, event_start,
                             events, req_out, summary):
        """Run scenarios in parallel, each with the scan kernel (`scan_nb.replay_scan_nb`).

        Traces, concatenated (T traces, N rows in all): the 11 trace arrays of `replay_scan_nb`,
        each of length N, where ``order`` holds row indices *local to each trace*; ``trace_start``
        int64 (T + 1,): trace t is rows ``trace_start[t]:trace_start[t + 1]``.

        Scenarios (S of them), int64 (S,) each: ``sc_trace`` (trace index), ``sc_policy``
        (POLICY_*), ``sc_capacity`` (free_kv_blocks), ``sc_interval`` (aging_interval > 0),
        ``sc_max_steps`` (-1 for no limit).

        Work queue: ``run_order`` int64 (M,): the scenarios to run, in the order they are started
        (M <= S: a call may run a subset); ``counters`` int64 (2,), zero on entry: ``NEXT`` and
        ``DONE`` (finished scenarios, readable from another thread while this runs);
        ``n_workers``: parallel workers (usually the thread count).

        Outputs (preallocated): ``req_start`` int64 (S + 1,) and ``req_out`` int64 (R, RQ_NCOLS):
        scenario s writes rows ``req_start[s]:req_start[s + 1]`` (its trace's length);
        ``event_start`` int64 (S + 1,) and ``events`` int64 (E, EV_NCOLS): scenario s logs into
        rows ``event_start[s]:event_start[s + 1]`` (an empty range keeps no log); ``summary`` int64
        (S, SM_NCOLS).
        """
        if stamp < 0:  # never true; the closure ties the cache entry to the callees' sources
            return
        for _ in prange(n_workers):
            while True:
                k = atomic_add_nb(counters, NEXT, 1)
                if k >= run_order.shape[0]:
                    break
                s = run_order[k]
                t = sc_trace[s]
                a = trace_start[t]
                b = trace_start[t + 1]
                replay_scan_nb(request_id[a:b], arrival_step[a:b], prompt_len[a:b], max_new_tokens[a:b],
                               priority[a:b], cache_hit[a:b], required_blocks[a:b], deadline_step[a:b],
                               has_deadline[a:b], preemptible[a:b], order[a:b],
                               sc_policy[s], sc_capacity[s], sc_interval[s], sc_max_steps[s],
                               events[event_start[s]:event_start[s + 1]], req_out[req_start[s]:req_start[s + 1]],
                               summary[s])
                atomic_add_nb(counters, DONE, 1)

    @njit(parallel=True, nogil=True, cache=True)
    def replay_batch_nb(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit,
                        required_blocks, deadline_step, has_deadline, preemptible, order, trace_start,
                        sc_trace, sc_policy, sc_capacity, sc_interval, sc_max_steps,
                        run_order, counters, n_workers, req_start, event_start,
                        events, req_out, summary):
        """`replay_batch_scan_nb` with the fast kernel (`fast_nb.replay_fast_nb`); the same arrays."""
        if stamp < 0:  # never true; the closure ties the cache entry to the callees' sources
            return
        for _ in prange(n_workers):
            while True:
                k = atomic_add_nb(counters, NEXT, 1)
                if k >= run_order.shape[0]:
                    break
                s = run_order[k]
                t = sc_trace[s]
                a = trace_start[t]
                b = trace_start[t + 1]
                replay_fast_nb(request_id[a:b], arrival_step[a:b], prompt_len[a:b], max_new_tokens[a:b],
                               priority[a:b], cache_hit[a:b], required_blocks[a:b], deadline_step[a:b],
                               has_deadline[a:b], preemptible[a:b], order[a:b],
                               sc_policy[s], sc_capacity[s], sc_interval[s], sc_max_steps[s],
                               events[event_start[s]:event_start[s + 1]], req_out[req_start[s]:req_start[s + 1]],
                               summary[s])
                atomic_add_nb(counters, DONE, 1)

    return replay_batch_scan_nb, replay_batch_nb


# replay_batch_nb: the fast kernel per scenario; replay_batch_scan_nb: the scan kernel.
replay_batch_scan_nb, replay_batch_nb = _make_batch_kernels(SOURCE_STAMP)
