"""End to end, honest and imperfect students (audit 6): a file name that is not UTF-8, a Chinese student id, a
zip handed in, whitespace-only changes and an identical copy of a test cell, a helper in its own cell, an
import the grader does not provide. One `decodesched grade` run of the documented command."""

from __future__ import annotations

import copy
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from decodesched.grader import spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks.course import build_course, tool_env as _env  # noqa: E402
from grader_attacks import attacks  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
EFF = "        return req.priority + (req.wait_steps // self.aging_interval if self.policy == 'aging' else 0)\n"
HELPER = ("def effective_priority(req, policy, aging_interval):\n"
          "    return req.priority + (req.wait_steps // aging_interval if policy == 'aging' else 0)\n")


def _gid(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("honest_e2e")
    course, release_path = build_course(base)
    release = json.loads(release_path.read_text(encoding="utf-8"))
    ref = attacks.reference_source()
    correct = attacks._with_solution(release, ref)
    subs = base / "subs"
    subs.mkdir()
    nbs = {"correct": correct, "张三": correct}
    spaced = copy.deepcopy(correct)  # an editor that ends every cell with a newline
    test1 = next(c for c in spaced["cells"] if _gid(c) == "test_todo1_enqueue")
    test1["source"] = "".join(test1["source"]) + "\n"
    nbs["trailing_newline"] = spaced
    dup = copy.deepcopy(correct)  # Jupyter's "duplicate cell" on a test cell
    at = next(i for i, c in enumerate(dup["cells"]) if _gid(c) == "test_todo3_capacity")
    dup["cells"].insert(at + 1, copy.deepcopy(dup["cells"][at]))
    nbs["duplicated_test"] = dup
    helper = attacks._with_solution(release, ref.replace(
        EFF, "        return effective_priority(req, self.policy, self.aging_interval)\n"))
    at = next(i for i, c in enumerate(helper["cells"]) if _gid(c) == spec.SOLUTION_CELL)
    helper["cells"].insert(at, {"cell_type": "code", "execution_count": None, "id": "helper-cell", "metadata": {},
                                "outputs": [], "source": HELPER})
    nbs["helper_cell"] = helper
    nbs["imports_numba"] = attacks._with_solution(release, "import numba\n" + ref.replace(
        EFF, "        return int(numba.njit(lambda p, w, a: p + w // a)(req.priority, req.wait_steps, "
             "self.aging_interval)) if self.policy == 'aging' else req.priority\n"))
    for name, nb in nbs.items():
        (subs / f"{name}.ipynb").write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    latin1 = os.path.join(os.fsencode(subs), b"\xe9l\xe8ve.ipynb")
    with open(latin1, "w", encoding="utf-8") as fh:
        json.dump(correct, fh)
    (subs / "m11_zipped.zip").write_bytes(b"PK\x03\x04")
    out = base / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "decodesched.cli", "grade", str(subs), "--out", str(out), "--course", str(course),
         "--jobs", "2", "--timeout", "60", "--no-progress"],
        capture_output=True, text=True, env=_env(), cwd=REPO, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        rows = {r["student_id"]: r for r in csv.DictReader(fh)}
    return {"rows": rows, "out": out, "stderr": proc.stderr, "stdout": proc.stdout}


def _page(graded, sid):
    return (graded["out"] / "feedback" / f"{sid}.html").read_text(encoding="utf-8")


def test_a_name_that_is_not_utf8_is_one_invalid_row_and_everyone_else_is_graded(graded):
    rows = graded["rows"]
    assert rows["\\xe9l\\xe8ve"]["status"] == "invalid" and rows["\\xe9l\\xe8ve"]["score"] == "0"
    assert rows["correct"]["status"] == "graded" and float(rows["correct"]["score"]) == spec.MAX_SCORE
    assert "invalid \\xe9l\\xe8ve: the student id is not a plain name" in graded["stderr"]
    assert "skipped m11_zipped.zip: not a .ipynb notebook" in graded["stderr"]
    assert "m11_zipped" not in rows


def test_a_chinese_student_id_is_a_student(graded):
    row = graded["rows"]["张三"]
    assert row["status"] == "graded" and float(row["score"]) == spec.MAX_SCORE
    assert _page(graded, "张三")


@pytest.mark.parametrize("sid, note", [("trailing_newline", "only the whitespace"),
                                       ("duplicated_test", "identical copies")])
def test_whitespace_and_identical_copies_of_test_cells_are_not_tampering(graded, sid, note):
    row = graded["rows"][sid]
    assert row["status"] == "graded" and float(row["score"]) == spec.MAX_SCORE, row
    assert note in _page(graded, sid)


def test_a_helper_in_another_cell_and_a_missing_module_are_said_plainly(graded):
    page = _page(graded, "helper_cell")
    assert "is defined in another cell of your notebook" in page and "effective_priority" in page
    assert "NameError: name &#x27;effective_priority&#x27; is not defined" in page and "None None" not in page
    page = _page(graded, "imports_numba")
    assert "standard library and NumPy only; `import numba` failed" in page
