"""Nothing on stderr but what a command means to say, under PYTHONWARNINGS=error too, and the same files on a busy
machine.  (The CUDA path runs under Numba's simulator, which is switched on before Numba is imported: subprocesses.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, *args: str, env_changes: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "NUMBA_DISABLE_JIT")}
    env.update({"PYTHONWARNINGS": "error", **(env_changes or {})})
    return subprocess.run([sys.executable, "-X", "dev", "-c", textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd)


def _tiny_trace(path: Path, n: int = 12) -> Path:
    rows = ["request_id,arrival_step,prompt_len,max_new_tokens,priority,cache_hit,required_blocks,deadline_step,"
            "preemptible"]
    rows += [f"{i},{i // 3},{1 + i % 4},{1 + i % 3},{i % 3 - 1},{str(i % 2 == 0).lower()},{1 + i % 5},"
             f"{'' if i % 2 else i // 3 + 9},{str(i % 4 != 0).lower()}" for i in range(n)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------- the GPU launch of a small sweep

# Numba's GPU dispatcher (numba.cuda.dispatcher._LaunchConfiguration) warns at every launch of a grid under 128
# blocks; the simulator's launch does not, so the kernel here stands in for the GPU's, warning as it does.
GPU_LAUNCH = """
    import json, sys, warnings
    import numpy as np
    from numba.core.errors import NumbaPerformanceWarning
    from decodesched.kernels import cuda_nb
    from decodesched import grid, load_trace, simulate_batch

    simulated = cuda_nb.replay_batch_cuda_kernel

    class GpuKernel:
        def __getitem__(self, config):
            blocks = config[0]
            if blocks < 128:
                warnings.warn(NumbaPerformanceWarning(f"Grid size {blocks} will likely result in GPU "
                                                      "under-utilization due to low occupancy."))
            return simulated[config]

    cuda_nb.replay_batch_cuda_kernel = GpuKernel()
    trace = load_trace(sys.argv[1])
    scenarios = grid([trace], ["aging", "deadline"], [3, 8], [2])
    cpu = simulate_batch([trace], scenarios, record_events=True)
    gpu = simulate_batch([trace], scenarios, record_events=True, backend="cuda")
    print(json.dumps([bool(np.array_equal(getattr(cpu, n), getattr(gpu, n)))
                      for n in ("request_state", "summary", "event_log")]))
"""


def test_a_small_cuda_sweep_launches_without_numbas_grid_size_warning(tmp_path):
    # Before: "NumbaPerformanceWarning: Grid size 1 will likely result in GPU under-utilization" on stderr at every
    # GPU sweep of fewer than 128 x 64 scenarios, and a traceback (exit 1) under PYTHONWARNINGS=error.
    done = _python(GPU_LAUNCH, str(_tiny_trace(tmp_path / "t.csv")), env_changes={"NUMBA_ENABLE_CUDASIM": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""
    assert json.loads(done.stdout) == [True, True, True]


def test_numbas_gpu_launch_does_warn_for_a_small_grid():
    # Guards the stand-in above (already true before the fix): Numba's own GPU launch warns so for a small grid.
    done = _python("""
        from numba.cuda import dispatcher
        dispatcher._LaunchConfiguration(None, (1, 1, 1), (64, 1, 1), 0, 0)
    """)
    if "Grid size 1" not in done.stderr:
        pytest.skip(f"this Numba's GPU dispatcher cannot be loaded here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 1 and "NumbaPerformanceWarning: Grid size 1 will likely result" in done.stderr


# ---------------------------------------------------------------- the CLI on a busy machine (guards)


def _cli(argv, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "NUMBA_DISABLE_JIT",
                                                           "NUMBA_NUM_THREADS")}
    env["PYTHONWARNINGS"] = "error"
    return subprocess.run([sys.executable, "-m", "decodesched", *argv], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)


def _outputs(folder: Path, busy: bool) -> dict:
    folder.mkdir()
    trace = _tiny_trace(folder / "t.csv", 40)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4 if busy else 0)]
    try:
        runs = [_cli(["simulate", trace.name, "--policy", "aging", "--kv-blocks", "9", "--events", "e.csv",
                      "--requests", "r.csv"], folder),
                _cli(["sweep", trace.name, "--policy", "aging,fcfs,deadline", "--kv-blocks", "6,9",
                      "--out", "m.csv"], folder),
                _cli(["report", "m.csv", "--out", "rep", "--kv-blocks", "9"], folder)]
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    for done in runs:
        noise = [line for line in done.stderr.splitlines() if not line.startswith("decodesched: compiling ")]
        assert done.returncode == 0 and noise == [], done.stderr[-3000:]
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_simulate_sweep_and_report_write_the_same_bytes_on_a_busy_machine(tmp_path):
    # Guard (already true before the fix): the same files byte for byte, nothing on stderr under PYTHONWARNINGS=error.
    quiet = _outputs(tmp_path / "quiet", busy=False)
    busy = _outputs(tmp_path / "busy", busy=True)
    assert {"e.csv", "r.csv", "m.csv", "rep/index.html"} <= set(quiet)
    assert busy == quiet
