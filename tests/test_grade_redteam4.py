"""Red team, round 4: what a solution could still make the verdict harness say about it.

* The harness named an exception by its class's ``__name__`` only, and the judge compares an error by that
  name: a class of the solution's own called ``ValueError`` (not a subclass of the builtin, so the notebook's
  own ``except ValueError`` does not catch it) passed every check that expects a ValueError (100 points for the
  reference with that class, where the checks of TODO 1's input errors should fail), and one called
  ``MemoryError`` turned a failed check into the status "memory" with no memory limit anywhere near.
  `harness._error` now names such a class "ValueError (not the builtin)". (Left alone: the nbgrader kernel run
  still reports "memory" for an error output named MemoryError, as it reports "timeout" for a TimeoutError: its
  status comes from the student's own kernel; the score never does.)
"""

from __future__ import annotations

import builtins
import os
import sys
from pathlib import Path

import pytest

from decodesched.grader import harness, limits, sandbox, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402

SANDBOX = pytest.mark.skipif(os.geteuid() != 0 and not sandbox.userns_available(),
                             reason="needs root or user namespaces")


class ValueError(Exception):  # noqa: A001 - the attack: a class named like the builtin, not derived from it
    pass


class MemoryError(Exception):  # noqa: A001
    pass


class _RealSubclass(builtins.ValueError):
    pass


def test_an_exception_named_like_a_builtin_is_not_reported_as_the_builtin():
    assert harness._error(ValueError("x")) == {"raised": "ValueError (not the builtin)", "msg": "x"}
    assert harness._error(MemoryError())["raised"] == "MemoryError (not the builtin)"
    # the builtins and their subclasses read as before
    assert harness._error(builtins.ValueError("x")) == {"raised": "ValueError", "msg": "x"}
    assert harness._error(_RealSubclass("y"))["raised"] == "ValueError"
    assert harness._error(builtins.KeyError("k"))["raised"] == "KeyError"
    assert harness._error(builtins.MemoryError())["raised"] == "MemoryError"


FAKE_VALUE_ERROR = "class ValueError(Exception):\n    pass\n\n\n" + attacks.reference_source()


@SANDBOX
def test_a_fake_value_error_does_not_pass_the_input_error_checks():
    v = verdict.verdict_for_source(FAKE_VALUE_ERROR, limits=limits.Limits(cpu_s=30), shrink_failures=False)
    assert v.cells["hidden_input_errors"].score == 0.0, v.cells["hidden_input_errors"]
    assert v.status == "graded" and v.total < 100, (v.status, v.total)
    assert any("ValueError (not the builtin)" in line for line in v.cells["hidden_input_errors"].lines)


RAISES_AT_5 = attacks.honest_source() + """
class MemoryError(Exception):
    pass
_st = DecodeSchedulerSim.step

def _s(self):
    if self.clock == 5:
        raise ERROR("at 5")
    return _st(self)
DecodeSchedulerSim.step = _s
"""


@SANDBOX
def test_a_fake_memory_error_is_a_failed_check_not_the_memory_status():
    small = limits.Limits(cpu_s=30)
    fake = verdict.verdict_for_source(RAISES_AT_5.replace("ERROR", "MemoryError"), limits=small,
                                      shrink_failures=False)
    plain = verdict.verdict_for_source(RAISES_AT_5.replace("ERROR", "RuntimeError"), limits=small,
                                       shrink_failures=False)
    assert plain.status == "graded" and plain.total < 100
    assert (fake.status, fake.total) == (plain.status, plain.total), (fake.status, fake.notes[:1])
