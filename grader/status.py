"""The status of a graded submission: one word, and which one wins when several apply.

========  ==========================================================================================
graded    everything ran normally.
timeout   a CPU limit was hit (CPU time of all the run's processes together), in the verdict child or
          in the kernel (including a cell that nbgrader had to interrupt), or the generous wall-clock
          backstop of a run that made no progress (a submission that sleeps).
crashed   a process died: ``os._exit``, a segfault, a dead kernel, nbgrader aborting.
memory    the memory limit was hit (resident-memory watchdog, or MemoryError under the
          address-space limit).
tampered  evidence of cheating (see `grader.evidence`).
invalid   not a readable notebook, no (or more than one) solution cell, or a bad student id.
========  ==========================================================================================

grades.csv has one more word, for a row that is no submission: ``missing``, a student of the course's roster
(nbgrader's gradebook) who handed in nothing, with 0 points (`pipeline.missing_rows`).
"""

from __future__ import annotations

STATUSES = ("graded", "timeout", "crashed", "memory", "tampered", "invalid")
# When several apply, the first of these wins.
PRECEDENCE = ("invalid", "tampered", "memory", "timeout", "crashed", "graded")
MISSING = "missing"  # grades.csv only: a student of the roster without a submission
# the verdicts that do not depend on the machine (its load, an abort in the Jupyter stack, a grader error): a grading
# that stops keeps them for its rerun (`resume.py`)
KEPT = ("graded", "tampered")


def decide(statuses) -> str:
    """The one status of a submission from the statuses its runs reported (unknown words count as crashed)."""
    seen = {s if s in STATUSES else "crashed" for s in statuses}
    return next(s for s in PRECEDENCE if s in seen or s == "graded")
