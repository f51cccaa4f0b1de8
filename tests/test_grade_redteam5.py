"""Red team, round 5: what a hostile notebook could still do to the grading process itself (outside its sandbox).

* The kernel run's private gradebook copy is the student's to write (its code runs in that course), and the grader
  queried it, unbounded, for tamper evidence: a copy whose ``grade`` table was replaced by a view over a recursive
  query that never ends (plain SQL, no function: ``trusted_schema=OFF`` allows it) held the whole grading for ever,
  every other student with it. The queries now have a bound in SQLite's steps (`evidence.GRADEBOOK_QUERY_STEPS`); a
  copy that exceeds it is tamper evidence.
* A test cell replaced by an expression nested 1,000 levels deep (Python compiles and runs it) made ``ast.dump`` in
  `pipeline.restore_formatting` raise RecursionError: a traceback on stderr and a `crashed` row, where the alteration
  is tamper evidence. The syntax trees are now compared without recursion (`pipeline._tree_items`); so is
  ``builtins.__dict__.__dict__...`` 1,500 deep, which made `evidence.static_evidence` recurse.
* The grading process parsed every code cell of a notebook (up to 100 MiB) with ``ast.parse``, about 800 times a
  source's length in memory: a scratch cell of a few MiB took gigabytes, outside the sandbox's limits. A cell over
  `evidence.MAX_PARSED_CHARS` is not parsed there (it runs in the sandbox only).
* nbgrader's graded notebook is in the kernel run's folder, which the student's code can write (and can keep nbgrader
  from writing over): the grader parsed up to 64 MiB of it unbounded (1.5 GB for 64 MiB of ``[],``). It is now read
  under the intake's bound on JSON values (`notebook.too_many_values`).
"""

from __future__ import annotations

import copy
import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest

from decodesched.grader import autograde, evidence, pipeline, sandbox, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.attacks import minimal_notebook  # noqa: E402
from grader_attacks.course import REPO, build_course, tool_env  # noqa: E402

SANDBOX = pytest.mark.skipif(os.geteuid() != 0 and not sandbox.userns_available(),
                             reason="needs root or user namespaces")

# nbgrader's tables, with `grade` a view whose rows never end (NULLIF(x, x): NULL, but not known to be before it runs)
ENDLESS_GRADEBOOK = """
CREATE TABLE grade_cells (id VARCHAR(32) PRIMARY KEY, max_score FLOAT);
CREATE TABLE student (id VARCHAR(128) PRIMARY KEY);
CREATE VIEW grade AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c)
    SELECT NULLIF(x, x) AS manual_score, NULLIF(x, x) AS extra_credit, x AS cell_id, 0 AS auto_score FROM c;
"""
DEEP = "-" * 1500 + "1"  # compiles (CPython refuses from about 3,000); ast.dump recurses once per level


def _inspect_in_child(db: Path) -> list:
    """`evidence._inspect_gradebook_copy` in a child process, so that a query that never ends fails the test."""
    code = ("import json, sys\nfrom pathlib import Path\nfrom decodesched.grader import evidence\n"
            "print(json.dumps(evidence._inspect_gradebook_copy(Path(sys.argv[1]), 'alice', Path(sys.argv[1]).parent)))\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("reading the gradebook copy did not end")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_a_gradebook_copy_that_never_ends_is_tamper_evidence_not_a_hang(tmp_path):
    db = tmp_path / "gradebook.db"
    with sqlite3.connect(db) as con:
        con.executescript(ENDLESS_GRADEBOOK)
    con.close()
    assert _inspect_in_child(db) == [
        "the gradebook copy was altered: reading it did not end (its tables were replaced)"]


def test_a_gradebook_copy_with_many_rows_is_read_to_the_end(tmp_path):
    # the bound is far above what nbgrader writes: a copy of thousands of cells is still read, its scores found
    db = tmp_path / "gradebook.db"
    with sqlite3.connect(db) as con:
        con.executescript("CREATE TABLE grade_cells (id VARCHAR(32) PRIMARY KEY, max_score FLOAT);"
                          "CREATE TABLE student (id VARCHAR(128) PRIMARY KEY);"
                          "CREATE TABLE grade (id VARCHAR(32) PRIMARY KEY, cell_id VARCHAR(32), auto_score FLOAT,"
                          " manual_score FLOAT, extra_credit FLOAT);")
        con.executemany("INSERT INTO grade_cells VALUES (?, 1)", [(f"c{i}",) for i in range(5000)])
        con.executemany("INSERT INTO grade VALUES (?, ?, 1, NULL, NULL)", [(f"g{i}", f"c{i}") for i in range(5000)])
        con.execute("UPDATE grade SET manual_score = 1 WHERE id = 'g4999'")
        con.execute("INSERT INTO student VALUES ('alice')")
    con.close()
    assert _inspect_in_child(db) == ["1 manual score(s) or extra credit written into the gradebook"]


def _deep_test_cell(nb: dict) -> dict:
    nb = copy.deepcopy(nb)
    cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "test_todo1_enqueue")
    cell["source"] = f"x = {DEEP}\n"
    return nb


def test_a_test_cell_nested_too_deep_for_ast_dump_is_an_alteration_not_a_crash():
    release = minimal_notebook()
    nb = _deep_test_cell(release)
    assert pipeline.restore_formatting(nb, release) == (nb, [])
    assert evidence.altered_cells(nb, release) == ["test_todo1_enqueue"]
    # the release's own program, as deep and formatted otherwise, is still the release's (and given its source)
    release = _deep_test_cell(release)
    spaced = copy.deepcopy(release)
    cell = next(c for c in spaced["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "test_todo1_enqueue")
    cell["source"] = f"x = ({DEEP})\n"
    fixed, notes = pipeline.restore_formatting(spaced, release)
    assert fixed["cells"] == release["cells"] and "test_todo1_enqueue" in notes[0]


def test_builtins_reached_through_a_deep_chain_is_evidence_not_a_crash():
    # `builtins.__dict__.__dict__...x = 1`, 1,500 deep (Python compiles it): the check recursed, RecursionError
    chain = "import builtins\nbuiltins" + ".__dict__" * 1500 + ".x = 1\n"
    assert evidence.static_evidence([chain]) == ["the code assigns to builtins"]
    assert evidence.static_evidence([chain.replace("builtins" + ".__dict__", "other.__dict__", 1)]) == []


@pytest.mark.parametrize("a, b, same", [
    ("x = 'a'\n", 'x = "a"\n', True),
    ("f(a,\n  b,)\n", "f(a, b)  # wrapped\n", True),
    ("x = 1\n", "x = 1.0\n", False),
    ("x = 1\n", "x = True\n", False),
    ("a.b(c)\n", "a.c(b)\n", False),
    ("x = [1, 2]\n", "x = [1, [2]]\n", False),
    ("def f(a, b=1): pass\n", "def f(a=1, b): pass\n", False),  # (the second does not parse)
])
def test_the_syntax_trees_compare_as_ast_dump_compares_them(a, b, same):
    # (already right before the change: guards that the comparison without recursion is the one ast.dump made)
    assert pipeline._same_program(a, b) is same


def test_a_huge_code_cell_is_not_parsed_by_the_grading_process():
    # a scratch cell of 2 MiB of `1` lines: ast.parse took 1.6 GB of the grader's own memory (a notebook may hold
    # 100 MiB), outside the sandbox's limits
    # (the peak as /proc's VmHWM, this process's own: getrusage's ru_maxrss keeps the high-water mark of the image
    # that exec replaced, which with vfork is the test process's, over 500 MB late in a full run)
    code = ("from decodesched.grader import evidence\nbig = '1\\n' * (1 << 20)\n"
            "assert evidence.parse_cell(big) is None and evidence.static_evidence(['import builtins', big]) == []\n"
            "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout) < 500_000, proc.stdout  # KiB: the interpreter, NumPy's import and the text
    # up to the bound a cell is parsed (its static evidence read), one character more it is not
    fits = "import builtins\nbuiltins.len = None\n"
    fits += "#" * (evidence.MAX_PARSED_CHARS - len(fits))
    assert evidence.static_evidence([fits]) == ["the code assigns to builtins"]
    assert evidence.parse_cell(fits + "#") is None


def test_a_graded_notebook_of_millions_of_values_is_not_parsed_by_the_grading_process(tmp_path, monkeypatch):
    # the kernel run's course is the student's folder: its code can write nbgrader's graded notebook there (and keep
    # nbgrader from writing over it: a read-only folder); the grader parsed up to 64 MiB of it, whatever it held, and
    # 64 MiB of `[],` took 1.5 GB of the grading process's memory (the intake refuses such a submitted notebook)
    course = tmp_path / "k-alice"
    graded = course / "autograded" / "alice" / spec.ASSIGNMENT / spec.NOTEBOOK
    graded.parent.mkdir(parents=True)
    graded.write_bytes(b'{"cells": [' + b"[]," * 6_000_000 + b'[]], "nbformat": 4}')  # 17 MiB
    failed = sandbox.Outcome(returncode=1, timed_out=False, memory_exceeded=False, signal=None, stdout=b"",
                             stderr=b"PermissionError: [Errno 13] Permission denied\n", wall_s=1.0)
    monkeypatch.setattr(autograde, "_autograde_once", lambda *a: (course, "0" * 32, failed))
    monkeypatch.setattr(autograde, "_tamper_evidence", lambda *a: [])
    tracemalloc.start()
    try:
        rep = autograde.kernel_run(SimpleNamespace(student_id="alice"), {}, tmp_path, tmp_path, "m-", None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * 2**20, peak  # the file's bytes, read once
    assert rep.status == "crashed" and "PermissionError" in rep.notes[0]


# --- what the instructor sees: one `decodesched grade` run -----------------------------------------------------

# In the kernel only (the verdict harness has no gradebook): the gradebook copy replaced by one whose `grade` never
# ends, written beside it and renamed over it (nbgrader's open connection keeps the old file)
SWAP_GRADEBOOK = f'''
import os as _os, sqlite3 as _sqlite3
def _swap():
    d = _os.getcwd()
    while d != "/":
        target = _os.path.join(d, "gradebook" + "." + "db")
        if _os.path.isfile(target):
            con = _sqlite3.connect(target + "-x")
            con.executescript({ENDLESS_GRADEBOOK!r})
            con.commit()
            con.close()
            _os.replace(target + "-x", target)
            return
        d = _os.path.dirname(d)
if {attacks.IN_KERNEL}:
    _swap()
'''


def _grade(subs: Path, course: Path, out: Path, timeout: float = 420) -> dict:
    """`decodesched grade` of `subs` (exit 0), stopped with its whole process group when it runs past `timeout`."""
    proc = subprocess.Popen([sys.executable, "-m", "decodesched.cli", "grade", str(subs), "--out", str(out),
                             "--course", str(course), "--jobs", "2", "--no-progress", "--timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tool_env(), cwd=REPO,
                            start_new_session=True)
    try:
        _stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # (the endless query held SIGTERM's stop as well)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        pytest.fail(f"the grading did not end in {timeout} s")
    assert proc.returncode == 0, stderr[-3000:]
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        return {"rows": {r["student_id"]: r for r in csv.DictReader(fh)}, "stderr": stderr}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    pytest.importorskip("nbgrader")
    base = tmp_path_factory.mktemp("redteam5")
    course, release_path = build_course(base)
    release = json.loads(release_path.read_text(encoding="utf-8"))
    honest = attacks.honest_source()
    nbs = {"swaps_gradebook": attacks._with_solution(release, honest.rstrip() + "\n\n" + SWAP_GRADEBOOK.strip() + "\n"),
           # a test cell replaced by a deep expression, and builtins reached through a deep chain in the solution
           "deep_code": _deep_test_cell(attacks._with_solution(release, honest.rstrip() + "\n\nimport builtins\n"
                                                               "builtins" + ".__dict__" * 1500 + ".x = 1\n")),
           "honest_buggy": attacks._with_solution(release, honest)}
    subs = base / "subs"
    subs.mkdir()
    for sid, nb in nbs.items():
        (subs / f"{sid}.ipynb").write_text(json.dumps(nb, indent=1), encoding="utf-8")
    out = base / "out"
    return _grade(subs, course, out) | {"out": out}


@SANDBOX
@pytest.mark.slow
def test_hostile_gradebooks_and_deep_cells_are_tamper_evidence_and_the_grading_ends(graded):
    rows, err = graded["rows"], graded["stderr"]
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    honest = float(rows["honest_buggy"]["score"])
    assert rows["honest_buggy"]["status"] == "graded" and honest < spec.MAX_SCORE
    for sid, why in (("swaps_gradebook", "the gradebook copy was altered: reading it did not end"),
                     ("deep_code", "locked or test cells were altered: test_todo1_enqueue"),
                     ("deep_code", "the code assigns to builtins")):
        page = (graded["out"] / "feedback" / f"{sid}.html").read_text(encoding="utf-8")
        assert rows[sid]["status"] == "tampered", (sid, page[-2000:])
        assert why in page, (sid, page[-2000:])
    assert float(rows["swaps_gradebook"]["score"]) == honest  # its verdict is its honest code's


def test_the_gradebook_snapshot_lives_in_the_gradings_workroot(tmp_path, monkeypatch):
    """The snapshot's folder was `dsched-inspect-*` in /dev/shm itself: a grading killed by SIGKILL while it read
    the copy left it there for good. Now it is made in the folder given (the grading's workroot, which the next
    grading removes when no process holds its lock) and removed after."""
    seen = []
    monkeypatch.setattr(evidence, "_query_gradebook", lambda db, snap, sid: seen.append(snap) or [])
    db = tmp_path / "run" / "gradebook.db"
    db.parent.mkdir()
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE grade (x)")
    con.close()
    work = tmp_path / "workroot"
    work.mkdir()
    assert evidence._inspect_gradebook_copy(db, "alice", work) == []
    assert len(seen) == 1 and seen[0].parent.parent == work and seen[0].parent.name.startswith("inspect-")
    assert list(work.iterdir()) == []
