"""How the replay engines scale with the backlog, in one run, as rates and ratios.

1. A 3,000-request backlogged trace (`decodesched.synthetic.backlog_trace`): events per second of
   the fast kernel, the scan kernel and the pure-Python model (the model on its first `--model-steps`
   steps only), and the ratios between them.
2. Events per second of the fast kernel with about 1k, 10k, 100k and 1M requests waiting (all arrive
   at step 0, few fit): measured as (events of a long run - events of a short run) / (difference of
   their user CPU times, see `user_time`), so the setup of inserting the backlog is not counted; the
   ratio to the 1k rate is printed, of the best rates and paired (each round runs every N back to back;
   the median of the rounds' ratios).
   Below them, the preemptions per 1,000 events (the schedule's own work, which grows with N under
   aging) and a fit of nanoseconds per event = a + b * preemptions per event over N with its residuals:
   whether the same work costs more with a larger backlog.
3. The full Azure 2023 conversation trace (19,366 requests) at offered loads 0.8, 1.0 and 1.5, per
   policy, warm (compiled, loaded from cache), with the event log: the whole `simulate` call.

Usage (takes a few minutes on 2 cores; ``--quick`` skips the 1M backlog)::

    python benchmarks/bench_scale.py [--kv-blocks 4000] [--model-steps 40] [--quick] [--rounds 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np

import decodesched
from decodesched.convert import bundled_trace_path, read_azure, to_trace
from decodesched.engine import policy_code, trace_arrays
from decodesched.kernels import enums as E
from decodesched.kernels.fast_nb import replay_fast_nb
from decodesched.kernels.scan_nb import replay_scan_nb
from decodesched.model import replay
from decodesched.synthetic import backlog_trace

POLICIES = decodesched.engine.POLICIES
WINDOW = 10_000_000  # steps of section 2's marginal rate


def user_time() -> float:
    """This process's user CPU seconds: section 2's clock.  Its system time is left out: with 1 M
    requests the set-up first touches hundreds of MB of fresh pages, and the kernel's work on them
    (zeroing, compaction for the huge pages the kernels ask for) varies from run to run: the 1 M
    backlog's 1 M-step run took 0.43 s of CPU time alone and 1.8-2.9 s after the smaller backlogs'
    runs, which the difference of two runs does not cancel (a 1 M rate read up to 5x too high, or
    negative).  The replay loop itself runs in user time."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def run(kernel, trace, policy, capacity, max_steps=-1, record=True, interval=4, clock=time.perf_counter,
        summary=None):
    """Run a kernel directly; return (events run, seconds of `clock`, preemptions).  The kernel's summary
    goes to `summary` when given."""
    n_events = 0
    if record:
        n_events = trace.work_steps if max_steps < 0 else min(trace.work_steps, max_steps)
    events = np.zeros((n_events, E.EV_NCOLS), np.int64)
    req_out = np.zeros((len(trace), E.RQ_NCOLS), np.int64)
    if summary is None:
        summary = np.zeros(E.SM_NCOLS, np.int64)
    t = clock()
    kernel(*trace_arrays(trace), policy_code(policy), capacity, interval, max_steps, events, req_out, summary)
    dt = clock() - t
    return int(summary[E.SM_EVENTS]), dt, int(req_out[:, E.RQ_PREEMPTIONS].sum())


def warm_up():
    t = time.perf_counter()
    small = backlog_trace(50, seed=0)
    for policy in POLICIES:
        run(replay_fast_nb, small, policy, 10)
        run(replay_scan_nb, small, policy, 10)
    print(f"warm-up (compile or load from the Numba cache): {time.perf_counter() - t:.1f} s")


def rows_of(trace):
    cols = ("request_id", "arrival_step", "prompt_len", "max_new_tokens", "priority", "cache_hit",
            "required_blocks", "preemptible")
    rows = []
    for i in range(len(trace)):
        row = {c: getattr(trace, c)[i].item() for c in cols}
        row["deadline_step"] = int(trace.deadline_step[i]) if trace.has_deadline[i] else None
        rows.append(row)
    return rows


def section_backlog_3000(capacity: int, model_steps: int) -> None:
    trace = backlog_trace(3000, seed=0, arrival_span=1)
    print(f"\n== 1. backlogged trace: 3,000 requests arriving at step 0, {capacity} KV blocks; "
          f"model on its first {model_steps} steps ==")
    print(f"{'policy':<15}{'fast ev/s':>14}{'scan ev/s':>12}{'model ev/s':>12}{'fast/scan':>11}{'fast/model':>12}"
          f"{'scan/model':>12}")
    rows = rows_of(trace)
    for policy in POLICIES:
        n_f, t_f, _ = min((run(replay_fast_nb, trace, policy, capacity) for _ in range(3)), key=lambda x: x[1])
        n_s, t_s, _ = run(replay_scan_nb, trace, policy, capacity)
        t = time.perf_counter()
        ref = replay(rows, policy=policy, free_kv_blocks=capacity, aging_interval=4, max_steps=model_steps)
        t_m = time.perf_counter() - t
        fast, scan, model = n_f / t_f, n_s / t_s, len(ref.events) / t_m
        print(f"{policy:<15}{fast:>14,.0f}{scan:>12,.0f}{model:>12,.0f}{fast / scan:>11.1f}{fast / model:>12,.0f}"
              f"{scan / model:>12,.0f}")


def waiting_trace(n: int, window: int, policy: str, seed: int = 0):
    """n requests at step 0, then a steady stream at offered load 1.0 for `window` steps, so about n
    wait all along; 1-400 tokens (about 200 steps per request, as in the Azure trace), 1-8 blocks,
    three priority classes, half with a deadline.  With 16 KV blocks only a few run at a time."""
    rng = np.random.default_rng(seed)
    mean_work = 1 + 200.5
    extra = int(1.1 * window / mean_work)
    total = n + extra
    arrival = np.concatenate([np.zeros(n, np.int64), np.sort(rng.integers(1, window, extra))])
    new = rng.integers(1, 401, total)
    has_deadline = rng.random(total) < 0.5
    deadline = arrival + (1 + new) * rng.integers(2, 50, total) + n * 200
    prompt = rng.integers(1, 500, total)
    cache_hit = rng.random(total) < 0.3
    request_id = rng.permutation(total).astype(np.int64)
    # The backlog at step 0 is listed in the policy's key order, so that building it (the setup, which
    # the rate excludes) is quick and its timing noise small; the stream arrives in random order.
    if policy == "fcfs":
        head = np.argsort(request_id[:n])
    else:
        slack_order = np.where(has_deadline[:n], deadline[:n] - new[:n], 0) if policy == "deadline" else 0
        head = np.lexsort((request_id[:n], prompt[:n], ~cache_hit[:n], slack_order + np.zeros(n, np.int64),
                           ~has_deadline[:n] if policy == "deadline" else np.zeros(n, bool)))
    for col in (prompt, cache_hit, request_id, new, has_deadline, deadline):
        col[:n] = col[:n][head]
    return decodesched.load_trace({
        "request_id": request_id,
        "arrival_step": arrival,
        "prompt_len": prompt,
        "max_new_tokens": new,
        "priority": rng.integers(0, 3, total),
        "cache_hit": cache_hit,
        "required_blocks": rng.integers(1, 9, total),
        "deadline_step": [int(d) if h else None for d, h in zip(deadline, has_deadline)],
        "preemptible": rng.random(total) < 0.9,
    })


def section_waiting(sizes, policies, window: int, rounds: int) -> None:
    print(f"\n== 2. fast kernel, events/s with N requests waiting: all arrive at step 0, 16 KV blocks, no event "
          f"log,\n   more arriving at load 1.0; rate = {window:,} steps / (user CPU time of a "
          f"{window + window // 10:,}-step run - user CPU time of a {window // 10:,}-step run, which cancels the "
          f"setup; CPU time because the machine is shared, user time because the set-up's system time varies, "
          f"see `user_time`),"
          f"\n   best of {rounds} rounds, a round running every N back to back; last/first of the best rates, and "
          f"'paired': the median\n   over rounds of each round's own last/first (the machine's speed drifts over "
          f"minutes, less within a round) ==")
    print("   (below each rate: preemptions per 1,000 of those events, the schedule's own work, which the policy and"
          "\n   N decide: under aging a large backlog keeps preempting; then ns per event fitted as a + b * preemptions"
          "\n   per event over N: small residuals mean the same work costs the same at every N)")
    print(f"{'policy':<15}" + "".join(f"{f'N={n:,}':>14}" for n in sizes) + f"{'last/first':>12}{'paired':>8}")
    for policy in policies:
        traces = [waiting_trace(n, window, policy) for n in sizes]
        times = [([], []) for _ in sizes]  # per N, the short and the long runs' CPU times, one per round
        events = [0 for _ in sizes]
        churn = [0.0 for _ in sizes]
        run(replay_fast_nb, traces[0], policy, 16, 1000, record=False)  # compiled or loaded before any timing
        for _ in range(rounds):
            for i, trace in enumerate(traces):
                n1, t1, p1 = run(replay_fast_nb, trace, policy, 16, window // 10, record=False, clock=user_time)
                n2, t2, p2 = run(replay_fast_nb, trace, policy, 16, window + window // 10, record=False,
                                 clock=user_time)
                times[i][0].append(t1)
                times[i][1].append(t2)
                events[i] = n2 - n1
                churn[i] = 1000 * (p2 - p1) / max(n2 - n1, 1)
        best = [e / max(min(long) - min(short), 1e-9) for e, (short, long) in zip(events, times)]
        # A round's own ratio; a round whose long run took no longer than its short one (setup noise larger
        # than the window's work, possible for the fastest policies) has none.
        ratios = [(events[-1] / (tl - ts)) / (events[0] / (fl - fs))
                  for fs, fl, ts, tl in zip(*times[0], *times[-1]) if fl > fs and tl > ts]
        paired = f"{statistics.median(ratios):.2f}" if ratios else "-"
        print(f"{policy:<15}" + "".join(f"{r:>14,.0f}" for r in best) + f"{best[-1] / best[0]:>12.2f}{paired:>8}")
        print(f"{'':<15}" + "".join(f"{c:>14.1f}" for c in churn))
        print(cost_model(best, churn))


def cost_model(rates, churn) -> str:
    """A line on whether the cost per operation depends on N: the least-squares fit of nanoseconds per
    event = a + b * preemptions per event over the backlogs, with each backlog's residual.  Small residuals
    say that the rate moves only with the schedule's own work (an N-independent cost per step and per
    preemption); large ones, that the same work costs more at some N (cache misses, deeper structures).
    Without a spread of preemptions over N (within 2x) there is nothing to fit."""
    ns = 1e9 / np.asarray(rates)
    per_event = np.asarray(churn) / 1000
    if per_event.min() <= 0 or per_event.max() < 2 * per_event.min():
        return (f"{'':<15}   (preemptions per event within 2x over N: events/s compare equal work; "
                f"{ns[0]:.0f} -> {ns[-1]:.0f} ns per event)")
    design = np.column_stack([np.ones_like(per_event), per_event])
    (a, b), *_ = np.linalg.lstsq(design, ns, rcond=None)
    residual = ns / (design @ (a, b)) - 1
    return (f"{'':<15}   fit over N: {a:.0f} ns per event + {b:,.0f} ns per preemption; residuals "
            + ", ".join(f"{r:+.0%}" for r in residual))


def section_azure(loads, capacity: int) -> None:
    raw = read_azure(bundled_trace_path())
    print(f"\n== 3. Azure 2023 conversation trace ({len(raw):,} requests), {capacity} KV blocks, fast engine, "
          f"warm, whole simulate() call with the event log, best of 2 ==")
    print(f"{'load':>5} {'policy':<15}{'events':>11}{'seconds':>9}{'ev/s':>13}{'max wait':>10}{'preempt.':>10}")
    for load in loads:
        trace = to_trace(raw, load=load, seed=0)
        for policy in POLICIES:
            dt = float("inf")
            for _ in range(2):  # best of two: the first run also pays for fresh memory
                t = time.perf_counter()
                result = decodesched.simulate(trace, policy, capacity, 4, engine="fast")
                dt = min(dt, time.perf_counter() - t)
            state = result.request_state
            print(f"{load:>5} {policy:<15}{result.n_events:>11,}{dt:>9.3f}{result.n_events / dt:>13,.0f}"
                  f"{int(state[:, E.RQ_WAIT].max()):>10,}{int(state[:, E.RQ_PREEMPTIONS].sum()):>10,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-blocks", type=int, default=4000, help="capacity for the Azure trace")
    parser.add_argument("--backlog-kv-blocks", type=int, default=40, help="capacity for the 3,000 trace")
    parser.add_argument("--model-steps", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="skip the 1M backlog")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of section 2 (each runs every N once)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds takes a positive count")
    warm_up()
    section_backlog_3000(args.backlog_kv_blocks, args.model_steps)
    sizes = [1_000, 10_000, 100_000] + ([] if args.quick else [1_000_000])
    section_waiting(sizes, list(POLICIES), WINDOW, args.rounds)
    section_azure([0.8, 1.0, 1.5], args.kv_blocks)


if __name__ == "__main__":
    main()
