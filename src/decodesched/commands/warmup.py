"""`decodesched warmup`: compile every kernel (or load it from Numba's cache) on a tiny trace.

Run it once after installing (or after changing the Numba version): later runs then start in
well under a second instead of compiling for several seconds per kernel.  Prints, per kernel,
whether it was compiled or loaded from the cache, and how long that took.
"""

from __future__ import annotations

import time

TINY_TRACE = {
    "request_id": [1, 2, 3],
    "arrival_step": [0, 0, 2],
    "prompt_len": [4, 2, 3],
    "max_new_tokens": [2, 1, 2],
    "priority": [0, 1, 0],
    "cache_hit": [False, True, False],
    "required_blocks": [1, 2, 1],
    "deadline_step": [None, 6, None],
    "preemptible": [True, True, False],
}


def add_parser(sub) -> None:
    p = sub.add_parser("warmup", help="compile (or load from cache) every kernel, with timings",
                       description="Compile every Numba kernel on a tiny trace, or load it from Numba's on-disk "
                       "cache, and print what was done and how long each took.")
    p.add_argument("--cuda", action="store_true", help="also compile the CUDA kernel (needs a GPU or "
                                                       "NUMBA_ENABLE_CUDASIM=1)")
    p.set_defaults(func=run)


def _compiled(kernels) -> str:
    """What a compile did: cached it, or not (a cache folder that took no file, with its notice: a full disk)."""
    from .._numba_cache import in_cache

    return "compiled (now cached)" if all(map(in_cache, kernels)) else "compiled (not cached)"


def _what(dispatchers, before: dict) -> str:
    """'compiled', 'loaded from cache', or 'already loaded', from the dispatchers' cache counters."""
    hits = sum(sum(d.stats.cache_hits.values()) for d in dispatchers) - before["hits"]
    misses = sum(sum(d.stats.cache_misses.values()) for d in dispatchers) - before["misses"]
    if misses:
        return _compiled(dispatchers)
    if hits:
        return "loaded from cache"
    return "already loaded"


def _counters(dispatchers) -> dict:
    return {"hits": sum(sum(d.stats.cache_hits.values()) for d in dispatchers),
            "misses": sum(sum(d.stats.cache_misses.values()) for d in dispatchers)}


def tasks(cuda: bool = False):
    """(label, dispatchers, thunk) for every kernel the package runs, in dependency order."""
    from .. import batch, engine
    from ..kernels import batch_nb, fast_nb, scan_nb
    from ..trace import load_trace

    trace = load_trace(TINY_TRACE, name="warmup")
    scenarios = batch.grid(1, ["fixed_priority", "aging"], [2], [2])
    out = [("scan kernel (replay_scan_nb)", [scan_nb.replay_scan_nb, scan_nb.find_victim_nb],
            lambda: engine.simulate(trace, "aging", 2, 2, engine="scan"))]
    out.append(("fast kernel (replay_fast_nb)", [fast_nb.replay_fast_nb],
                lambda: engine.simulate(trace, "aging", 2, 2, engine="fast")))
    out.append(("batch kernel (replay_batch_nb)", [batch_nb.replay_batch_nb],
                lambda: batch.simulate_batch([trace], scenarios, engine="fast")))
    out.append(("batch scan kernel (replay_batch_scan_nb)", [batch_nb.replay_batch_scan_nb],
                lambda: batch.simulate_batch([trace], scenarios, engine="scan")))
    out.append(("signal handler (exit_on_signal_nb)", [], _signal_handler))
    if cuda:
        def run_cuda():
            batch.simulate_batch([trace], scenarios, backend="cuda")

        out.append(("CUDA kernel (replay_batch_cuda_kernel)", [], run_cuda))
    return out


def _signal_handler() -> str:
    """Compile or load `kernels.signal_nb` (a C function, compiled when its module is imported: the CLI's replays
    use it for Ctrl-C) and say which."""
    import sys

    fresh = "decodesched.kernels.signal_nb" not in sys.modules
    from ..kernels.signal_nb import exit_on_signal_nb

    if not fresh:
        return "already loaded"
    return "loaded from cache" if exit_on_signal_nb.cache_hits else _compiled([exit_on_signal_nb])


def cache_location() -> str:
    """Where the replay kernels' compiled code is cached (see `decodesched._numba_cache`)."""
    from .._numba_locators import _NowhereLocator, _ReadOnlyLocator
    from ..kernels.fast_nb import replay_fast_nb

    cache = getattr(replay_fast_nb, "_cache", None)
    locator = getattr(getattr(cache, "_impl", None), "locator", None)
    if locator is None:
        return "nowhere (caching is off)"
    where = locator.get_cache_path()
    if isinstance(locator, _NowhereLocator):
        return "nowhere (no writable folder; set NUMBA_CACHE_DIR)"
    if isinstance(locator, _ReadOnlyLocator):
        return f"{where} (shipped, read-only: loaded, never written)"
    return where


def run(args) -> int:
    from .._numba_cache import require_jit, start_threads

    require_jit()
    start_threads()  # (the batch kernels run on Numba's threads)
    import numba

    if args.cuda:  # no GPU: said before the CPU kernels compile for minutes, and with warmup's own option
        from ..batch import _check_backend, _simulator_hint
        from ..errors import UserError

        try:
            _check_backend("cuda")
        except UserError:
            raise UserError("--cuda needs an NVIDIA GPU with a working CUDA driver, and none was found "
                            f"({_simulator_hint('leave out --cuda')})") from None
    print(f"Numba {numba.__version__}, cache in {cache_location()}")
    total = time.perf_counter()
    for label, dispatchers, thunk in tasks(args.cuda):
        before = _counters(dispatchers)
        start = time.perf_counter()
        said = thunk()
        seconds = time.perf_counter() - start
        if isinstance(said, str):
            what = said
        elif dispatchers:
            what = _what(dispatchers, before)
        else:
            what = "ran in the simulator" if numba.config.ENABLE_CUDASIM else "compiled"  # (as Numba read it)
        print(f"  {label:42s} {what:22s} {seconds:7.2f} s")
    print(f"warmup done in {time.perf_counter() - total:.2f} s")
    return 0
