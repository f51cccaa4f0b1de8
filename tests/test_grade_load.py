"""Steady under load: the same folder graded as the machine is and with every core kept busy gives
the same grades.csv (statuses and scores), because every limit that decides a status is CPU time.

The folder holds what a busy machine used to misjudge: the reference, a one-bug solution (its
failing trace is shrunk), an honest solution whose cell spends a second of CPU while loading, and
one whose cell loops forever (a CPU timeout in the verdict and a cell nbgrader must interrupt).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402

from decodesched.grader import mutants, spec  # noqa: E402

pytestmark = pytest.mark.slow


def _env():
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    return env


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "decodesched.cli", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=1200)


def _busy_loops(n: int):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
            for _ in range(n)]


def test_busy_machine_gives_identical_grades(tmp_path):
    course = tmp_path / "course"
    assert _cli("assignment", "init", str(course), cwd=tmp_path).returncode == 0
    built = _cli("assignment", "build", cwd=course)  # the current directory is the course
    assert built.returncode == 0, built.stderr[-2000:]
    release = json.loads((course / "release" / spec.ASSIGNMENT / spec.NOTEBOOK).read_text())
    ref = attacks.reference_source()
    sources = {
        "reference": ref,
        "one_bug": mutants.MUTANTS[0].source(),
        "slow_loader": "_spent = 0\nfor _i in range(3_000_000):\n    _spent += _i\n" + ref,
        "loops_forever": ref + "\nwhile True:\n    pass\n",
    }
    subs = tmp_path / "subs"
    subs.mkdir()
    for name, src in sources.items():
        (subs / f"{name}.ipynb").write_text(json.dumps(attacks._with_solution(release, src)))
    args = ("grade", str(subs), "--jobs", "2", "--timeout", "30", "--cell-timeout", "4", "--no-progress")

    quiet = _cli(*args, "--out", str(tmp_path / "quiet"), cwd=course)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    loops = _busy_loops(2 * (os.cpu_count() or 1))
    try:
        busy = _cli(*args, "--out", str(tmp_path / "busy"), cwd=course)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert busy.returncode == 0, busy.stderr[-2000:]
    a = (tmp_path / "quiet" / "grades.csv").read_text()
    b = (tmp_path / "busy" / "grades.csv").read_text()
    assert a == b
    status = {line.split(",")[0]: line.split(",")[3] for line in a.splitlines()[1:]}
    assert status == {"reference": "graded", "one_bug": "graded", "slow_loader": "graded", "loops_forever": "timeout"}
    assert ",100,100,graded" in a.splitlines()[3]  # the reference (sorted third) scores full marks
