"""grader.status: the statuses, their precedence, one decision (the only definition of each)."""

from __future__ import annotations

from decodesched.grader import pipeline, status


def test_status_precedence_is_documented_order():
    assert status.PRECEDENCE == ("invalid", "tampered", "memory", "timeout", "crashed", "graded")
    assert set(status.PRECEDENCE) == set(status.STATUSES)
    for word in status.STATUSES:
        assert word in status.__doc__


def test_decide_takes_the_first_by_precedence():
    assert status.decide([]) == "graded"
    assert status.decide(["graded", "timeout"]) == "timeout"
    assert status.decide(["crashed", "timeout", "memory"]) == "memory"
    assert status.decide(["tampered", "invalid"]) == "invalid"
    assert status.decide(["graded", "something odd"]) == "crashed"


def test_statuses_are_defined_once():
    import decodesched.grader as pkg
    from pathlib import Path

    defining = [p.name for p in Path(pkg.__file__).parent.glob("*.py")
                if "STATUSES = (" in p.read_text() or "PRECEDENCE = (" in p.read_text()]
    assert defining == ["status.py"]
    assert pipeline.decide is status.decide
