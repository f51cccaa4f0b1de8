"""Limits of the untrusted runs of one submission, counted in CPU time so that a busy machine does
not change a grade.

Every limit that decides a status is CPU time: ``RLIMIT_CPU`` per process and, in
`grader.sandbox`, the *sum* of the CPU time of every process of a run (the nbgrader process, its
kernel, whatever they start). The wall clock is only a backstop for runs that make no progress (a
submission that sleeps): `wall_backstop` gives a generous multiple of the CPU budget, and
`load_factor` stretches it further with the machine's measured load, so an honest run on a machine
with every core busy still finishes on CPU time, exactly as on a quiet one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

WALL_FACTOR = 3.0  # wall-clock backstop: this many times the CPU budget on a quiet machine ...
WALL_SLACK_S = 20.0  # ... plus this (start-up of interpreters and kernels is mostly waiting)


def load_factor() -> float:
    """How many runnable processes share each core right now (1.0 on a quiet machine)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover - no /proc/loadavg
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def wall_backstop(cpu_s: float, factor: float | None = None) -> float:
    """Wall-clock seconds after which a run with `cpu_s` of CPU budget is stopped anyway."""
    return WALL_SLACK_S + cpu_s * WALL_FACTOR * (load_factor() if factor is None else factor)


@dataclass(frozen=True)
class Limits:
    """Per-submission limits, from the grade command down to every sandboxed run.

    ``cpu_s`` is the CPU time of all processes of one run together; ``scenario_cpu_s`` the CPU time
    of one check in the verdict harness (loading the cell may use 1.5 times that per statement).
    ``hide`` lists paths the untrusted code must not see (root only; see `grader.sandbox`).
    """

    cpu_s: float = 60.0
    memory_mb: int = 1024
    scenario_cpu_s: float = 3.0
    max_output_bytes: int = 1_000_000
    hide: tuple = ()
    # After the first checks that time out (a hang), each later check gets this much CPU (an honest check of the
    # verdict takes a few milliseconds), and the checks that time out may use half of `cpu_s` in all: counted
    # from the fixed limits of the checks that timed out, never measured, so every regrade runs the same checks.
    short_scenario_cpu_s: float = 0.25
    timeout_share: float = 0.5

    def timeout_allowance_s(self) -> float:
        """Seconds that checks that time out may use in all (a sum of their fixed limits)."""
        return max(2 * self.scenario_cpu_s, self.cpu_s * self.timeout_share)

    def kwargs(self) -> dict:
        """Keyword arguments of `grader.sandbox.run_isolated` (whose watchdog stretches the quiet-machine
        backstop by the load it measures while the run lasts)."""
        return {"timeout_s": wall_backstop(self.cpu_s, factor=1.0), "cpu_s": self.cpu_s, "memory_mb": self.memory_mb,
                "max_output_bytes": self.max_output_bytes, "hide": self.hide}
