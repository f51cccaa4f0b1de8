"""A fresh course for the grading tests and benchmarks: the repository's source notebook released by
the real `nbgrader generate_assignment`, as an instructor's `decodesched assignment build` starts."""

from __future__ import annotations

import os
import csv
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ASSIGNMENT = "decode_scheduling"
NOTEBOOK = "decode_scheduling.ipynb"


def tool_env() -> dict:
    """The environment for nbgrader and decodesched subprocesses: this interpreter's scripts first on PATH."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    return env


def build_course(root: Path) -> tuple[Path, Path]:
    """``root/course`` with its release generated; returns (course folder, released notebook)."""
    course = Path(root) / "course"
    course.mkdir()
    shutil.copy2(REPO / "assignments" / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(REPO / "assignments" / "source", course / "source")
    gen = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", ASSIGNMENT, "--force"],
                         cwd=course, capture_output=True, text=True, env=tool_env(), timeout=600)
    if gen.returncode != 0:
        raise RuntimeError(f"nbgrader generate_assignment failed: {gen.stderr[-2000:]}")
    return course, course / "release" / ASSIGNMENT / NOTEBOOK


def grade_folder(subs: Path, course: Path, out: Path, *extra: str) -> dict:
    """A real `decodesched grade` of the folder `subs` (``--jobs 2`` unless `extra` says, `extra` options; an option
    given twice is refused), which must exit 0:
    ``{"rows": grades.csv by student id, "out": out, "stderr": what it printed there, "stdout": its summary}``."""
    proc = subprocess.run([sys.executable, "-m", "decodesched.cli", "grade", str(subs), "--out", str(out), "--course",
                           str(course), *([] if "--jobs" in extra else ["--jobs", "2"]), "--no-progress", *extra],
                          capture_output=True, text=True, env=tool_env(), cwd=REPO, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(Path(out) / "grades.csv", newline="", encoding="utf-8") as fh:
        rows = {r["student_id"]: r for r in csv.DictReader(fh)}
    return {"rows": rows, "out": out, "stderr": proc.stderr, "stdout": proc.stdout}
