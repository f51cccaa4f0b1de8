"""What a student's notebook makes nbgrader's kernel run report (stop 62b): a correct solution beside a cell of the
student's own that raises TimeoutError (a socket's, a future's) or KeyboardInterrupt was `timeout`, with the note
"a cell ran past the per-cell time limit and was interrupted", though no cell ran past any limit: the kernel run
took any error of those names for nbgrader's interrupt. Only nbgrader's own error for a cell it interrupted
(`autograde.CELL_TIMEOUT_ENAME`, set in the private course's config) is that limit; a cell that sleeps past
``--cell-timeout`` is still `timeout`."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from decodesched.grader import spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.course import build_course, grade_folder  # noqa: E402

INTERRUPTED = "per-cell time limit and was interrupted"


def _with_cell(nb: dict, source: str) -> dict:
    nb = copy.deepcopy(nb)
    nb["cells"].append({"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                        "source": source})
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("stop62b")
    course, release_path = build_course(base)
    good = attacks._with_solution(json.loads(release_path.read_text(encoding="utf-8")), attacks.reference_source())
    subs = base / "subs"
    subs.mkdir()
    cells = {"tia": 'raise TimeoutError("the demo server timed out")',
             "kim": "from concurrent.futures import Future\nFuture().result(timeout=0.1)",  # (TimeoutError)
             "ken": "raise KeyboardInterrupt",
             "sid": "import time\ntime.sleep(60)"}
    for sid, source in cells.items():
        (subs / f"{sid}.ipynb").write_text(json.dumps(_with_cell(good, source)), encoding="utf-8")
    got = grade_folder(subs, course, base / "out", "--cell-timeout", "3", "--timeout", "60")
    got["pages"] = {sid: (base / "out" / "feedback" / f"{sid}.html").read_text(encoding="utf-8") for sid in cells}
    return got


@pytest.mark.slow
@pytest.mark.parametrize("sid", ["tia", "kim", "ken"])
def test_a_students_own_timeout_error_is_no_time_limit(graded, sid):
    row = graded["rows"][sid]
    assert (row["status"], float(row["score"])) == ("graded", spec.MAX_SCORE)
    assert INTERRUPTED not in graded["pages"][sid]


@pytest.mark.slow
def test_a_cell_past_the_per_cell_limit_is_still_a_timeout(graded):
    row = graded["rows"]["sid"]
    assert (row["status"], float(row["score"])) == ("timeout", spec.MAX_SCORE)
    assert INTERRUPTED in graded["pages"]["sid"]
