"""The batch kernels: many scenarios (trace, policy, capacity, aging interval) in one parallel call.

`make_batch_kernel(replay, stamp)` builds one for any single-scenario replay kernel with the common
signature; `replay_batch_nb` (fast kernel) and `replay_batch_scan_nb` (scan kernel) are two of them.

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
The batch kernels therefore close over a stamp (here ``SOURCE_STAMP``, a hash of those files): Numba
puts closure values into its cache key, so any edit there compiles the batch kernels afresh.
"""

import hashlib
from types import FunctionType

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


def make_batch_kernel(replay, stamp):
    """A parallel batch kernel that runs every scenario with `replay`, any single-scenario replay
    kernel (a Numba dispatcher) with the common signature (that of `scan_nb.replay_scan_nb`).

    `stamp` must change whenever a source `replay` depends on changes (`stamp.source_stamp` of its
    files).  Numba keys the cache on the kernel's bytecode and closure, and a dispatcher pickles
    differently in every process, so the closure holds only a tag (a hash of `stamp` and the
    replay's qualified name) and `replay` is the global ``_replay`` of the kernel's own copy of this
    module's globals: every kernel of this factory has its own, stable cache entry.
    """
    py = replay.py_func
    tag = int.from_bytes(hashlib.sha256(f"{stamp}:{py.__module__}.{py.__qualname__}".encode()).digest()[:7], "little")
    template = _batch_template(tag)
    scope = dict(template.__globals__, _replay=replay)
    fn = FunctionType(template.__code__, scope, template.__name__, template.__defaults__, template.__closure__)
    fn.__qualname__ = template.__qualname__
    fn.__doc__ = template.__doc__
    return njit(parallel=True, nogil=True, cache=True)(fn)


def _batch_template(tag):
    """The batch kernel's Python source, closing over `tag`; ``_replay`` is bound by `make_batch_kernel`."""

    def replay_batch(request_id, arrival_step, prompt_len, max_new_tokens, priority, cache_hit,
                     required_blocks, deadline_step, has_deadline, preemptible, order, trace_start,
                     sc_trace, sc_policy, sc_capacity, sc_interval, sc_max_steps,
                     run_order, counters, n_workers, req_start, event_start,
                     events, req_out, summary):
        """Run scenarios in parallel, each with the replay kernel given to `make_batch_kernel`.

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
        if tag < 0:  # never true; the closure ties the cache entry to the replay and its sources
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
                _replay(request_id[a:b], arrival_step[a:b], prompt_len[a:b], max_new_tokens[a:b],
                        priority[a:b], cache_hit[a:b], required_blocks[a:b], deadline_step[a:b],
                        has_deadline[a:b], preemptible[a:b], order[a:b],
                        sc_policy[s], sc_capacity[s], sc_interval[s], sc_max_steps[s],
                        events[event_start[s]:event_start[s + 1]], req_out[req_start[s]:req_start[s + 1]],
                        summary[s])
                atomic_add_nb(counters, DONE, 1)

    return replay_batch


# replay_batch_nb: the fast kernel per scenario; replay_batch_scan_nb: the scan kernel.
replay_batch_nb = make_batch_kernel(replay_fast_nb, SOURCE_STAMP)
replay_batch_scan_nb = make_batch_kernel(replay_scan_nb, SOURCE_STAMP)
