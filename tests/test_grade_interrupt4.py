"""Stopping `decodesched grade` (Ctrl-C, SIGTERM): one line and 128 + the signal, no traceback from any thread,
outputs absent or whole, and a rerun grades as an uninterrupted run."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from decodesched.grader import observe, pipeline, sandbox

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.course import build_course, tool_env  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def test_a_harness_session_asked_to_start_while_the_grading_stops_raises_interrupted_in_the_caller(monkeypatch):
    """The session's own thread used to raise `sandbox.Interrupted`, and Python printed its traceback."""
    seen = []
    monkeypatch.setattr(threading, "excepthook", seen.append)
    sandbox.STOPPING.set()
    try:
        with pytest.raises(sandbox.Interrupted):
            observe.run_harness(attacks.reference_source(), [{"id": "a", "ops": []}], serve=True)
    finally:
        sandbox.STOPPING.clear()
    assert seen == []


SOURCE = REPO / "assignments" / "source" / "decode_scheduling" / "decode_scheduling.ipynb"


def test_the_grading_process_never_imports_nbgrader_to_check_a_cell():
    """`evidence.altered_cells` imported nbgrader (and nbformat, jsonschema) for its checksum: seconds of CPU
    in the grading process, and a Ctrl-C waited for that import to finish."""
    code = """
import json, sys
from decodesched.grader import evidence
nb = json.load(open(sys.argv[1]))
for cell in nb["cells"]:
    if "nbgrader" in cell["metadata"]:
        cell["source"] = "".join(cell["source"])
        cell["metadata"]["nbgrader"]["checksum"] = "not this cell's"
assert evidence.altered_cells(nb, nb) == sorted(evidence._protected(nb)) != []
print(sorted(m for m in sys.modules if m.split('.')[0] in ('nbgrader', 'nbformat', 'jsonschema')))
"""
    out = subprocess.run([sys.executable, "-c", code, str(SOURCE)], capture_output=True, text=True, cwd=REPO)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr[-3000:]


def test_the_checksum_is_nbgrader_s_and_fails_where_nbgrader_s_fails():
    from nbformat import from_dict
    from nbgrader.utils import compute_checksum

    from decodesched.grader.evidence import nbgrader_checksum

    cells = [c for c in json.loads(SOURCE.read_text())["cells"] if "nbgrader" in c.get("metadata", {})]
    assert cells
    variants = []
    for c in cells:
        meta = c["metadata"]["nbgrader"]
        joined = {**c, "source": "".join(c["source"]) if isinstance(c["source"], list) else c["source"]}
        variants += [c, joined, {**joined, "cell_type": "raw"}, {**joined, "metadata": {}}]
        for change in ({"grade": not meta.get("grade")}, {"solution": True}, {"locked": "yes"}, {"points": "2"},
                       {"points": "x"}, {"grade_id": 3}, {"grade": 1, "solution": 0}):
            variants.append({**joined, "metadata": {**c["metadata"], "nbgrader": {**meta, **change}}})
        variants.append({**joined, "metadata": {"nbgrader": {k: v for k, v in meta.items() if k != "grade_id"}}})
    ok = 0
    for cell in variants:
        try:
            want = compute_checksum(from_dict(cell))
        except Exception:  # noqa: BLE001 - where nbgrader's fails, ours fails too (altered_cells suppresses both)
            with pytest.raises(Exception):
                nbgrader_checksum(cell)
            continue
        assert nbgrader_checksum(cell) == want, cell
        ok += 1
    assert ok > len(cells)


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _grade(subs: Path, out: Path, course: Path, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "decodesched.cli", "grade", str(subs), "--out", str(out), "--course", str(course),
         "--jobs", "2", "--timeout", "30", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tool_env(), cwd=REPO, **popen)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A course, three honest submissions and their grades from an uninterrupted run."""
    root = tmp_path_factory.mktemp("interrupt4")
    course, release = build_course(root)
    rel = json.loads(release.read_text())
    subs = root / "subs"
    subs.mkdir()
    for name, source in [("st_reference", attacks.reference_source()), ("st_buggy", attacks.honest_source()),
                         ("st_again", attacks.reference_source())]:
        (subs / f"{name}.ipynb").write_text(json.dumps(attacks._with_solution(rel, source)))
    p = _grade(subs, root / "full", course)
    out, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-3000:]
    return root, course, subs, _tree(root / "full")


def _stop(subs: Path, out: Path, course: Path, signum: int, when: str) -> tuple[int, str]:
    """Start a grading into `out`, send `signum` once its sandboxed process `when` is alive ("forkserver": the
    grading has begun, the first submissions are being read; "st_": a student's kernel run, with the verdicts
    under way, as they overlap), and return its exit status and stderr."""
    p = _grade(subs, out, course)
    try:
        deadline = time.monotonic() + 600
        while not sandbox.find_sandboxed(pipeline.marker_prefix(out) + when):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1][-3000:]
            time.sleep(0.02)
        p.send_signal(signum)
        _, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, err


@pytest.mark.slow
@pytest.mark.parametrize("when", ["forkserver", "st_"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_grading_says_one_line_and_leaves_no_output(graded, tmp_path, signum, when):
    root, course, subs, full = graded
    out = tmp_path / "out"
    rc, err = _stop(subs, out, course, signum, when)
    word = "interrupted" if signum == signal.SIGINT else "terminated (SIGTERM)"
    assert (rc, err.strip()) == (128 + signum, f"decodesched grade: {word}"), err[-3000:]
    # no output; only a submission that finished before the stop (on a busy machine) is kept for a rerun
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*")) if out.exists() else []
    assert all(name.startswith(".decodesched") for name in left), left  # (grader/resume.py)
    assert sandbox.find_sandboxed(pipeline.marker_prefix(out)) == []


@pytest.mark.slow
def test_a_stopped_grading_keeps_the_earlier_outputs_and_a_rerun_grades_in_full(graded, tmp_path):
    root, course, subs, full = graded
    shutil.copytree(root / "full", tmp_path / "old")
    rc, err = _stop(subs, tmp_path / "old", course, signal.SIGTERM, "st_")
    assert (rc, err.strip()) == (128 + signal.SIGTERM, "decodesched grade: terminated (SIGTERM)"), err[-3000:]
    assert _tree(tmp_path / "old") == full
    p = _grade(subs, tmp_path / "new", course)
    _, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-3000:]
    assert _tree(tmp_path / "new") == full
