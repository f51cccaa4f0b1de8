"""The CUDA batch path under Numba's CUDA simulator: bit-identical to the CPU batch.

The simulator must be switched on before Numba is imported, so the checks run in a subprocess
with ``NUMBA_ENABLE_CUDASIM=1`` in its environment.  The simulator interprets every GPU thread
in Python, so the cases are small (a few scenarios, under 30 requests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from numba import cuda
    from decodesched.batch import Scenario, grid, simulate_batch
    from decodesched.trace import load_trace

    assert cuda.simulator_enabled if hasattr(cuda, "simulator_enabled") else True

    def random_trace(rng, n, name):
        arrival = rng.integers(0, 2 * n, n)  # unsorted: arrival order differs from row order
        new = rng.integers(1, 6, n)
        has_deadline = rng.random(n) < 0.5
        far = rng.random(n) < 0.2  # slack near the 1_000_000_000 sentinel
        deadline = [int(a + (rng.integers(999_999_990, 1_000_000_012) if f else rng.integers(1, 3 * (t + 2))))
                    if h else None for a, t, h, f in zip(arrival, new, has_deadline, far)]
        ids = rng.permutation(np.arange(-2**40, -2**40 + 10 * n))[:n]  # large negative ids too
        return load_trace({
            "request_id": ids, "arrival_step": arrival, "prompt_len": rng.integers(1, 6, n),
            "max_new_tokens": new, "priority": rng.integers(-2, 3, n), "cache_hit": rng.random(n) < 0.4,
            "required_blocks": rng.integers(1, 7, n), "deadline_step": deadline,
            "preemptible": rng.random(n) < 0.75,
        }, name=name)

    report = {"cases": 0, "events": 0, "preemptions": 0, "stops": set()}
    for seed in range(int(sys.argv[1])):
        rng = np.random.default_rng(seed)
        traces = [random_trace(rng, int(rng.integers(1, 28)), "a"), random_trace(rng, int(rng.integers(1, 12)), "b")]
        scenarios = grid(traces, ["fixed_priority", "aging", "deadline", "fcfs"], [int(rng.integers(0, 4)), 9],
                         [int(rng.integers(1, 4))])
        scenarios.append(Scenario(0, "aging", 6, 2, int(rng.integers(0, 15))))  # stopped by max_steps
        for record in (True, False):
            cpu = simulate_batch(traces, scenarios, record_events=record)
            gpu = simulate_batch(traces, scenarios, record_events=record, backend="cuda")
            for name in ("request_state", "summary", "event_log"):
                a, b = getattr(cpu, name), getattr(gpu, name)
                if a is None or b is None:
                    assert a is None and b is None, name
                    continue
                assert a.dtype == b.dtype and a.shape == b.shape, (name, a.shape, b.shape)
                assert np.array_equal(a, b), (seed, record, name, np.argwhere(a != b)[:5].tolist())
            report["cases"] += 1
        report["events"] += int(cpu.summary[:, 0].sum())
        report["preemptions"] += int(cpu.request_state[:, 5].sum())
        report["stops"].update(int(s) for s in cpu.summary[:, 3])
    report["stops"] = sorted(report["stops"])
    print(json.dumps(report))
    """
)


def run_simulated(n_seeds: int) -> dict:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(n_seeds)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cuda_simulator_matches_cpu_bit_for_bit():
    report = run_simulated(12)
    assert report["cases"] == 24
    # The cases exercised the interesting paths (else the comparison above proves little).
    assert report["events"] > 500
    assert report["preemptions"] > 0
    assert report["stops"] == [0, 1, 2]  # drained, stuck (unservable), max_steps


def test_cuda_backend_under_simulator_via_cli(tmp_path):
    """`decodesched sweep --backend cuda` writes the same CSV as the CPU backend."""
    trace = tmp_path / "t.csv"
    trace.write_text("request_id,arrival_step,prompt_len,max_new_tokens,priority,cache_hit,required_blocks,"
                     "deadline_step,preemptible\n"
                     "1,0,3,2,0,false,2,,true\n2,0,1,3,1,true,2,9,true\n3,4,2,1,2,false,3,8,false\n"
                     "4,9,2,2,0,false,1,,true\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    outs = []
    for backend in ("cpu", "cuda"):
        out = tmp_path / f"{backend}.csv"
        proc = subprocess.run([sys.executable, "-m", "decodesched.cli", "sweep", str(trace), "--policy",
                               "aging,deadline", "--kv-blocks", "2,4", "--backend", backend, "--out", str(out)],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        outs.append(out.read_text())
    assert outs[0] == outs[1]
    assert len(outs[0].splitlines()) == 1 + 4


PTX_SCRIPT = textwrap.dedent(
    """
    import sys
    from numba import cuda, types
    from numba.cuda.cudadrv import nvvm
    if not nvvm.is_available():
        print("SKIP no libNVVM"); sys.exit(0)
    import numba.cuda.dispatcher as dispatcher
    if not hasattr(dispatcher, "get_current_device"):
        print("SKIP numba internals changed"); sys.exit(0)

    class Hopper:  # device functions ask the current device for its compute capability
        compute_capability = (9, 0)

    dispatcher.get_current_device = lambda: Hopper()
    from decodesched.kernels import cuda_nb

    i64, b1, i64_2 = types.int64[::1], types.boolean[::1], types.int64[:, ::1]
    sig = (i64,) * 5 + (b1, i64, i64, b1, b1, i64, i64) + (i64,) * 7 + (i64_2,) * 3 + (i64,) * 3
    ptx, restype = cuda.compile_ptx(cuda_nb.replay_batch_cuda_kernel.py_func, sig, cc=(9, 0))
    assert ".entry" in ptx and "st.global" in ptx
    print("OK", len(ptx))
    """
)


def test_cuda_kernel_compiles_for_a_real_gpu():
    """The simulator runs device code as Python; this compiles it with the real CUDA target (to PTX,
    no GPU needed where libNVVM is installed), so typing or lowering errors show up without a GPU."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, "-c", PTX_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if proc.stdout.startswith("SKIP"):
        pytest.skip(proc.stdout.strip())
    assert proc.stdout.startswith("OK")
