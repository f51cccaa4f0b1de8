"""The CUDA batch path, stop 59: exact on the shapes `test_cuda_sim.py` leaves out, GPU memory that grows with the
batch's rows (not its scenarios times its longest trace), a batch beyond the GPU's free memory refused in one line,
and one clear line where there is no GPU, also when NUMBA_ENABLE_CUDASIM is set in a way Numba did not take.

Numba's simulator must be switched on before Numba is imported, so each check runs in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(__file__)
TRACE = ("request_id,arrival_step,prompt_len,max_new_tokens,priority,cache_hit,required_blocks,deadline_step,"
         "preemptible\n1,0,3,2,0,false,2,,true\n2,0,1,3,1,true,2,9,true\n3,4,2,1,2,false,3,8,false\n")


def run_script(script: str, *args: str, simulator: str | None = "1", timeout: int = 300) -> dict:
    """Run `script` in a fresh Python (NUMBA_ENABLE_CUDASIM as given, None: unset); its last stdout line as JSON."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    if simulator is not None:
        env["NUMBA_ENABLE_CUDASIM"] = simulator
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), HERE, *args], env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out.get("skip"):
        pytest.skip(out["skip"])
    return out


EXACT = """
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from oracle import assert_matches_model
    from decodesched import batch as B, load_trace

    BIG = 2**53
    rng = np.random.default_rng(59_001)

    def rows_of(n, every_deadline, wide):
        ids = rng.permutation(np.arange(-3 * n, 3 * n))[:n]
        rows = []
        for i in range(n):
            arrival, new = int(rng.integers(0, 2 * n)), int(rng.integers(1, 5))
            near = rng.random() < 0.2  # slack at the 1_000_000_000 sentinel
            deadline = arrival + int(rng.integers(999_999_998, 1_000_000_003) if near else rng.integers(1, 4 * new + 8))
            rows.append({"request_id": int(ids[i]), "arrival_step": arrival, "prompt_len": int(rng.integers(1, 5)),
                         "max_new_tokens": new,
                         "priority": int(rng.choice([-BIG, -BIG + 1, 0, 1, BIG - 1, BIG])) if wide
                         else int(rng.integers(-2, 3)),
                         "cache_hit": bool(rng.random() < 0.4), "required_blocks": int(rng.integers(1, 5)),
                         "deadline_step": deadline if every_deadline or rng.random() < 0.5 else None,
                         "preemptible": bool(rng.random() < 0.8)})
        return rows

    # one request; 30 with a deadline each and priorities at +-2**53; 3; 12 mixed: lengths far apart in one batch
    rows = [rows_of(1, True, False), rows_of(30, True, True), rows_of(3, False, False), rows_of(12, False, True)]
    traces = [load_trace(r) for r in rows]
    variants = (("fixed_priority", 4), ("deadline", 4), ("fcfs", 4), ("aging", 1), ("aging", 2), ("aging", 2**40))
    scenarios = [B.Scenario(t, policy, capacity, interval, max_steps) for t in range(len(traces))
                 for policy, interval in variants for capacity in (0, 1, 3, 2**61) for max_steps in (None, 0, 5)]
    scenarios = scenarios[:-5]  # 283: not a multiple of the block size
    events = 0
    for record in (True, False):
        cpu = B.simulate_batch(traces, scenarios, record_events=record)
        gpu = B.simulate_batch(traces, scenarios, record_events=record, backend="cuda")
        for name in ("request_state", "summary", "event_log"):
            a, b = getattr(cpu, name), getattr(gpu, name)
            assert (a is None) == (b is None), name
            assert a is None or (a.shape == b.shape and np.array_equal(a, b)), (name, record)
    for i, sc in enumerate(scenarios):  # (gpu: the last, without events) against the model, events and all
        alone = B.simulate_batch(traces, [sc], record_events=True, backend="cuda")  # one scenario: one thread
        assert_matches_model(alone.result(0), rows[sc.trace], sc.policy, sc.free_kv_blocks, sc.aging_interval,
                             sc.max_steps)
        assert np.array_equal(alone.result(0).requests["wait_steps"], gpu.result(i).requests["wait_steps"]), i
        events += len(alone.result(0).events)
    # however the scenarios are ordered or grouped: each trace's scenarios alone, in reverse order
    full = B.simulate_batch(traces, scenarios, record_events=True, backend="cuda")
    for t, trace in enumerate(traces):
        picked = [i for i, sc in enumerate(scenarios) if sc.trace == t][::-1]
        part = B.simulate_batch([trace], [B.Scenario(0, scenarios[i].policy, scenarios[i].free_kv_blocks,
                                                     scenarios[i].aging_interval, scenarios[i].max_steps)
                                          for i in picked], record_events=True, backend="cuda")
        for j, i in enumerate(picked):
            assert part.result(j) == full.result(i), (t, i)
    empty = int((full.summary[:, 0] == 0).sum())  # scenarios whose event log is empty (max_steps 0, capacity 0)
    print(json.dumps({"scenarios": len(scenarios), "events": events, "empty": empty,
                      "stops": sorted(set(full.summary[:, 3].tolist()))}))
"""


def test_cuda_simulator_equals_cpu_batch_and_model_on_stop59_shapes():
    """Guard (verified already right before this stop's changes, and kept so after the kernel's scratch moved to
    the batch's rows): the shapes the brief names, bit for bit against the CPU batch and event for event against
    the model; any order or grouping of the scenarios gives each the same result."""
    out = run_script(EXACT)
    assert out["scenarios"] == 283 and out["events"] > 1000 and out["empty"] > 50
    assert out["stops"] == [0, 1, 2]  # drained, stuck (unservable), max_steps


MEMORY = """
    import json, sys
    import numpy as np
    from numba import cuda
    from decodesched import batch as B, load_trace

    taken = [0]
    for name in ("to_device", "device_array"):  # every GPU allocation of the CUDA path goes through these two
        def counted(*args, _real=getattr(cuda, name), **kwargs):
            array = _real(*args, **kwargs)
            taken[0] += array.nbytes
            return array
        setattr(cuda, name, counted)

    n = 200
    long = load_trace({"request_id": list(range(n)), "arrival_step": [0] * n, "prompt_len": [1] * n,
                       "max_new_tokens": [1] * n, "priority": [0] * n, "cache_hit": [False] * n,
                       "required_blocks": [1] * n, "deadline_step": [None] * n, "preemptible": [True] * n})
    short = long.subset([0])
    few = [B.Scenario(0, "fcfs", 4, max_steps=20), B.Scenario(0, "aging", 4, max_steps=20)]
    many = few + [B.Scenario(1, "aging", 1 + k % 4, 1 + k // 4) for k in range(130)]
    used = []
    for scenarios in (few, many):
        taken[0] = 0
        batch = B.simulate_batch([long, short], scenarios, backend="cuda")
        cpu = B.simulate_batch([long, short], scenarios)
        assert np.array_equal(batch.request_state, cpu.request_state)
        used.append(taken[0])
    print(json.dumps({"per_added_scenario": (used[1] - used[0]) / (len(many) - len(few))}))
"""


def test_gpu_memory_grows_with_the_batch_rows_not_with_scenarios_times_the_longest_trace():
    """The kernel's three scratch arrays were (scenarios, longest trace): 130 one-request scenarios beside a trace of
    200 took 4.8 kB more GPU memory each (a long trace in a big sweep: all of the GPU's memory, and a CUDA error)."""
    out = run_script(MEMORY)
    assert out["per_added_scenario"] < 1024


REFUSED = """
    import json, os, sys
    from numba import cuda
    from numba.cuda.simulator.cudadrv import devices
    from decodesched import batch as B, load_trace
    from decodesched.cli import main
    from decodesched.errors import UserError

    devices.FakeCUDAContext.get_memory_info = lambda self: devices._MemoryInfo(free=64, total=2**34)
    copied = []
    real_to_device = cuda.to_device
    cuda.to_device = lambda *a, **k: copied.append(1) or real_to_device(*a, **k)
    trace = load_trace(sys.argv[2])
    try:
        B.simulate_batch([trace], B.grid(1, ["aging", "fcfs"], [2, 4], [1, 2]), backend="cuda")
        said = None
    except UserError as exc:
        said = str(exc)
    out = os.path.join(os.path.dirname(sys.argv[2]), "out.csv")
    code = main(["sweep", sys.argv[2], "--policy", "aging", "--kv-blocks", "4", "--backend", "cuda", "--out", out])
    print(json.dumps({"said": said, "copied": len(copied), "code": code, "written": os.path.exists(out)}))
"""


def test_a_batch_beyond_the_gpus_free_memory_is_refused_in_one_line_before_copying(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    out = run_script(REFUSED, str(trace))
    said = out["said"] or ""
    assert said.startswith("backend 'cuda' needs ") and "GiB of GPU memory" in said and "--chunk-size" in said
    assert out["copied"] == 0
    assert out["code"] == 2 and not out["written"]


NOT_TAKEN = """
    import json, os, sys
    from numba import cuda
    if cuda.is_available():
        print(json.dumps({"skip": "a GPU (or the simulator) is present"})); sys.exit(0)
    import decodesched.batch as B
    from decodesched.errors import UserError

    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # too late: numba.cuda was imported without its simulator
    try:
        B.simulate_batch([sys.argv[2]], [B.Scenario(0, "aging", 4)], backend="cuda")
        said = None
    except UserError as exc:
        said = str(exc)
    print(json.dumps({"said": said}))
"""


def test_cuda_without_a_gpu_when_the_simulator_variable_was_not_taken_is_one_clear_line(tmp_path):
    """NUMBA_ENABLE_CUDASIM set after Numba's import (a notebook cell), or to a value Numba does not read as an
    integer ("true"), left the real numba.cuda in place, but the backend check took the variable's word for the
    simulator: a CudaSupportError traceback from deep in numba.cuda (CLI: exit 1)."""
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    said = run_script(NOT_TAKEN, str(trace), simulator=None)["said"] or ""
    assert said.startswith("backend 'cuda' needs an NVIDIA GPU") and "NUMBA_ENABLE_CUDASIM='1' did not switch" in said

    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="true")
    out = tmp_path / "out.csv"
    proc = subprocess.run([sys.executable, "-m", "decodesched.cli", "sweep", str(trace), "--policy", "aging",
                           "--kv-blocks", "4", "--backend", "cuda", "--out", str(out)], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    if proc.returncode == 0:
        pytest.skip("a GPU is present")
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("decodesched sweep: error: backend 'cuda' needs an NVIDIA GPU"), last
    assert "NUMBA_ENABLE_CUDASIM='true' did not switch" in last and "CudaSupportError" not in proc.stderr
    assert not out.exists()

    proc = subprocess.run([sys.executable, "-m", "decodesched.cli", "warmup", "--cuda"], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    last = proc.stderr.strip()
    assert "\n" not in last and last.startswith("decodesched warmup: error: --cuda needs an NVIDIA GPU"), last
    assert "NUMBA_ENABLE_CUDASIM='true' did not switch" in last and "leave out --cuda" in last
    assert "--backend" not in last


def test_a_cuda_sweep_names_no_cpu_threads(tmp_path):
    """A sweep on the CUDA backend said "(cuda, 2 threads)": CPU threads play no part there."""
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = tmp_path / "out.csv"
    proc = subprocess.run([sys.executable, "-m", "decodesched.cli", "sweep", str(trace), "--policy", "fcfs",
                           "--kv-blocks", "4", "--backend", "cuda", "--threads", "2", "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(cuda)" in proc.stdout + proc.stderr and "thread" not in proc.stdout, proc.stdout
