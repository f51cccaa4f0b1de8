"""`decodesched simulate --events` on the bundled Azure conversation trace (converted at load 1.0):
seconds beyond the same command without ``--events``, for CSV and Parquet, and each command's peak RSS.
Wall seconds are the target's measure; CPU seconds (user + system) are printed beside them because
on a busy machine they move less than wall time.

Targets (issue 11): CSV <= 3 s, Parquet <= 1.5 s beyond the plain run, peak RSS <= 1 GB.
Every figure comes from this run (best of --repeat), so a busy machine shifts them together.

    python benchmarks/bench_event_log.py [--policy aging] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAUNCH = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
          "u = resource.getrusage(resource.RUSAGE_CHILDREN); print(p.returncode, u.ru_maxrss, u.ru_utime + u.ru_stime)")


def run(cmd: list[str]) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS in MB) of one command, measured from a small launcher process."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", LAUNCH, *cmd], capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - start
    rc, rss_kb, cpu = out.stdout.split()
    if rc != "0":
        raise SystemExit(f"{' '.join(cmd)} failed ({rc}): {out.stderr}")
    return seconds, float(cpu), int(rss_kb) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="aging")
    ap.add_argument("--kv-blocks", default="4000")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cli = [sys.executable, "-m", "decodesched.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "azure_load1.0.csv"
        subprocess.run([*cli, "trace", "convert", "bundled", "--load", "1.0", "--out", str(trace)], check=True,
                       stdout=subprocess.DEVNULL)
        base = [*cli, "simulate", str(trace), "--policy", args.policy, "--kv-blocks", args.kv_blocks]
        run(base)  # load (or compile) the kernel once, outside the timings
        variants = {"no --events": [], "--events ev.csv": ["--events", str(Path(tmp) / "ev.csv")],
                    "--events ev.parquet": ["--events", str(Path(tmp) / "ev.parquet")]}
        best: dict[str, tuple[float, float, float]] = {}
        for _ in range(args.repeat):
            for name, extra in variants.items():  # interleaved, so that load changes hit all alike
                now = run(base + extra)
                old = best.get(name, now)
                best[name] = (min(now[0], old[0]), min(now[1], old[1]), max(now[2], old[2]))
        sizes = {name: os.path.getsize(extra[1]) / 1e6 for name, extra in variants.items() if extra}
    plain, plain_cpu, _ = best["no --events"]
    print(f"Azure 2023 conversation trace at load 1.0, policy {args.policy}, {args.kv_blocks} KV blocks, "
          f"best of {args.repeat}")
    print(f"{'command':22s} {'seconds':>8s} {'beyond plain':>13s} {'CPU s':>6s} {'CPU beyond':>11s} "
          f"{'peak RSS MB':>12s} {'file MB':>8s}")
    for name, (s, cpu, rss) in best.items():
        beyond = "" if name == "no --events" else f"{s - plain:+.2f} s"
        cpu_beyond = "" if name == "no --events" else f"{cpu - plain_cpu:+.2f} s"
        size = f"{sizes[name]:.0f}" if name in sizes else ""
        print(f"{name:22s} {s:8.2f} {beyond:>13s} {cpu:6.2f} {cpu_beyond:>11s} {rss:12.0f} {size:>8s}")


if __name__ == "__main__":
    main()
