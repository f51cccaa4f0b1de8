"""grader.limits: CPU budgets, and a wall-clock backstop that only grows with the measured load."""

from __future__ import annotations

from decodesched.grader import limits


def test_backstop_is_generous_and_scales_with_load():
    assert limits.load_factor() >= 1.0
    quiet = limits.wall_backstop(10, factor=1.0)
    assert quiet == limits.WALL_SLACK_S + 10 * limits.WALL_FACTOR
    assert limits.wall_backstop(10, factor=4.0) > 3 * quiet - 3 * limits.WALL_SLACK_S
    assert limits.wall_backstop(10) >= quiet


def test_sandbox_arguments_are_the_quiet_backstop_and_the_cpu_budget():
    lim = limits.Limits(cpu_s=12, memory_mb=256, hide=("/x",))
    kw = lim.kwargs()
    assert kw["cpu_s"] == 12 and kw["memory_mb"] == 256 and kw["hide"] == ("/x",)
    assert kw["timeout_s"] == limits.wall_backstop(12, factor=1.0)  # the sandbox stretches it by load itself


def test_limits_are_defined_once():
    from pathlib import Path

    import decodesched.grader as pkg

    assert [p.name for p in Path(pkg.__file__).parent.glob("*.py") if "class Limits" in p.read_text()] == ["limits.py"]
