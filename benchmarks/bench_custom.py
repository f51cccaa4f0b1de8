"""Custom-policy benchmark (SPEC section 8): a user Policy on the generic kernel vs the pure-Python
model with the same Policy, in one run.

On a backlogged trace (decodesched.synthetic.backlog_trace, about N requests waiting), for SJF and
least-laxity-first written with the public API, and for the built-in aging policy written as a user
policy: events per second of the model and of the kernel over the same first WINDOW steps, and
their ratio (the issue asks for >= 100x).  The model runs a Policy's Python functions, which for
`builtin("aging")` call a compiled helper per request and so are slower than the model's own
``"aging"``; that row is therefore also compared with the model under the name.  The built-in fast
kernel under aging is printed beside for scale.  Compile time (user policies compile once per
process) is measured apart.

    python benchmarks/bench_custom.py [--requests 2000] [--window 300] [--kv-blocks 40]
"""

from __future__ import annotations

import argparse
import time

import numba

import decodesched
from decodesched import Policy
from decodesched.model import replay
from decodesched.policy import builtin
from decodesched.synthetic import backlog_trace

NO_DEADLINE = 1 << 40


@numba.njit
def remaining_steps(r):
    return r.max_new_tokens - r.generated_len + (1 if r.phase == 0 else 0)


@numba.njit
def sjf_key(r, clock):
    return (remaining_steps(r), r.phase)


@numba.njit
def sjf_priority(r, clock):
    return -remaining_steps(r)


@numba.njit
def llf_key(r, clock):
    return (r.deadline_step - clock - remaining_steps(r) if r.has_deadline else NO_DEADLINE, -r.priority)


@numba.njit
def business_priority(r, clock):
    return r.priority


def policies():
    aging = builtin("aging", aging_interval=4)
    return [Policy("sjf", key=sjf_key, effective_priority=sjf_priority),
            Policy("least_laxity", key=llf_key, effective_priority=business_priority),
            Policy("aging_as_user", key=aging.key, effective_priority=aging.effective_priority)]


def model_rate(rows, policy, cap, window):
    start = time.perf_counter()
    ref = replay(rows, policy=policy, free_kv_blocks=cap, aging_interval=4, max_steps=window)
    return ref, len(ref.events) / (time.perf_counter() - start)


def rate(fn, min_seconds: float = 1.0) -> float:
    """Events per second of `fn` (returns its event count), repeated for at least `min_seconds`."""
    n_events, start = 0, time.perf_counter()
    while True:
        n_events += fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return n_events / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--window", type=int, default=300)
    ap.add_argument("--kv-blocks", type=int, default=40)
    args = ap.parse_args()
    trace = backlog_trace(args.requests, seed=0)
    rows = trace.rows()
    cap, window = args.kv_blocks, args.window
    print(f"backlogged trace: {len(trace)} requests arriving within {int(trace.arrival_step.max()) + 1} steps, "
          f"{cap} KV blocks, first {window} steps")
    print(f"{'policy':15s} {'compile s':>10s} {'model ev/s':>12s} {'kernel ev/s':>12s} {'kernel/model':>13s}")
    for policy in policies():
        start = time.perf_counter()
        decodesched.simulate(trace, policy, cap, 4, 10)  # compile outside the timing
        compile_s = time.perf_counter() - start
        ref, model = model_rate(rows, policy, cap, window)
        got = decodesched.simulate(trace, policy, cap, 4, window)
        assert got.timeline() == [{k: v for k, v in e.items() if k != "step"} for e in ref.events], policy.name
        kernel = rate(lambda: decodesched.simulate(trace, policy, cap, 4, window).n_events)
        print(f"{policy.name:15s} {compile_s:10.1f} {model:12,.0f} {kernel:12,.0f} {kernel / model:12,.0f}x")
        if policy.name == "aging_as_user":
            _, named = model_rate(rows, "aging", cap, window)
            print(f"{'  vs model aging':15s} {'':10s} {named:12,.0f} {kernel:12,.0f} {kernel / named:12,.0f}x"
                  "   (the model's own aging, no Policy)")
    decodesched.simulate(trace, "aging", cap, 4, 10)
    fast = rate(lambda: decodesched.simulate(trace, "aging", cap, 4, window).n_events)
    print(f"{'aging (fast)':15s} {'':10s} {'':12s} {fast:12,.0f}   (built-in fast kernel, for scale)")


if __name__ == "__main__":
    main()
