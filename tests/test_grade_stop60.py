"""The grader against hostile students and a tired instructor (stop 60): a link to a peer's notebook is no hand-in
(it was graded as the student's own: the peer's score), the feedback of a stub left in place names its TODO (it said
only "NotImplementedError"), and the folders of verdict runs that a grading killed by SIGKILL left in /dev/shm are
removed by the next one (they had no owner lock: nothing ever removed them).

The unit tests check each cause; one `decodesched grade` run (slow) checks what an instructor sees."""

from __future__ import annotations

import copy
import json
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from decodesched.grader import harness, notebook, pipeline, selfcheck, spec, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.attacks import minimal_notebook as _nb  # noqa: E402
from grader_attacks.course import build_course, grade_folder  # noqa: E402

NB = spec.NOTEBOOK
A = spec.ASSIGNMENT


def _write(path: Path, nb: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def _checked(folder: Path) -> dict:
    subs = notebook.collect_submissions(folder)
    return {s.student_id: s for s in pipeline._links_to_others(subs, notebook.submissions_root(folder))}


# --- a link to a peer's notebook ----------------------------------------------------------------------------------

def test_a_link_to_a_peers_notebook_is_no_hand_in(tmp_path):
    subs = tmp_path / "subs"
    _write(subs / "dave.ipynb", _nb())
    (subs / "erin.ipynb").symlink_to("dave.ipynb")  # unpacked from erin's archive
    _write(subs / "dan" / A / NB, _nb())
    (subs / "frank" / A).mkdir(parents=True)
    (subs / "frank" / A / NB).symlink_to(Path("..", "..", "dave.ipynb"))
    (subs / "gina").mkdir()
    (subs / "gina" / A).symlink_to(subs / "dan" / A)  # a folder link into a peer's folder
    _write(subs / "hal" / A / "v2.ipynb", _nb())
    (subs / "hal" / A / NB).symlink_to("v2.ipynb")  # a link inside the student's own folder
    outside = _write(tmp_path / "elsewhere" / "x.ipynb", _nb())
    (subs / "ivy" / A).mkdir(parents=True)
    (subs / "ivy" / A / NB).symlink_to(outside)  # out of her folder: never read
    (subs / "jo.ipynb").symlink_to(outside)  # two entry links to one file: neither is the student's own
    (subs / "kim.ipynb").symlink_to(outside)
    got = _checked(subs)
    for sid in ("dave", "dan", "hal"):
        assert got[sid].problem is None and got[sid].path is not None, sid
    assert got["erin"].path is None and got["erin"].problem.startswith("the notebook is the file of dave's submission")
    assert got["jo"].problem.startswith("the notebook is the file of kim's submission")
    assert got["kim"].problem.startswith("the notebook is the file of jo's submission")
    for sid, entry in (("frank", "frank/"), ("gina", "gina/"), ("ivy", "ivy/")):
        assert got[sid].path is None and got[sid].problem.startswith(
            f"the notebook is a link out of the student's folder {entry}"), (sid, got[sid].problem)


def test_an_instructors_folder_of_links_to_submitted_is_graded_as_before(tmp_path):
    tree = tmp_path / "course" / "submitted"
    for sid in ("alice", "bob"):
        _write(tree / sid / A / NB, _nb())
    links = tmp_path / "regrade"
    links.mkdir()
    (links / "alice.ipynb").symlink_to(tree / "alice" / A / NB)
    (links / "bob").symlink_to(tree / "bob")  # the student's folder itself
    got = _checked(links)
    assert all(got[sid].problem is None and got[sid].path for sid in ("alice", "bob"))
    assert all(s.problem is None for s in _checked(tmp_path / "course").values())


# --- the TODO of a stub left in place ------------------------------------------------------------------------------

def _solution_blocks(source: str) -> list[str]:
    return re.findall(r"^ *### BEGIN SOLUTION\n.*?^ *### END SOLUTION$", source, re.S | re.M)


def test_the_feedback_of_a_stub_left_in_place_names_its_todo():
    reference = selfcheck.REFERENCE.read_text(encoding="utf-8")
    blocks = _solution_blocks(reference)
    assert len(blocks) == 4
    stub = "# YOUR CODE HERE\n        raise NotImplementedError()"
    source = reference.replace(blocks[2], "        " + stub)  # TODO 3 (`_ensure_capacity`) only is not done
    assert source != reference
    v = verdict.verdict_for_source(source, shrink_failures=False)
    text = json.dumps([c.lines for c in v.cells.values()], ensure_ascii=False)
    assert "NotImplementedError (raised in _ensure_capacity, TODO 3)" in text, text[:3000]
    assert "TODO 1)" not in text and "TODO 4)" not in text


def test_an_error_names_the_solutions_innermost_function_and_a_forged_traceback_is_ignored():
    ns: dict = {}
    exec(compile("class Fake(Exception):\n    __traceback__ = property(lambda self: 1 / 0)\n"
                 "def helper():\n    raise KeyError('k')\n"
                 "def step():\n    helper()\n"
                 "def forged():\n    raise Fake('f')\n", harness.SOLUTION_FILE, "exec"), ns)
    for call, where in ((ns["step"], "helper"), (ns["forged"], "forged")):
        try:
            call()
        except Exception as exc:  # noqa: BLE001
            assert harness._error(exc)["in"] == where
    assert "in" not in harness._error(ValueError("not the solution's"))


# --- a grading killed by SIGKILL -----------------------------------------------------------------------------------

_KILLED_IN_A_RUN = textwrap.dedent("""\
    import os, signal
    from decodesched.grader import observe

    def killed(argv, cwd, *a, **k):  # the grading is killed while a verdict run's folder exists
        open(os.path.join(cwd, "left.json"), "w").close()
        print(cwd, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    observe._run_sandboxed = killed
    observe.run_harness("x = 1\\n", [])
""")
_NEXT_RUN = textwrap.dedent("""\
    from decodesched.grader import observe
    observe.run_harness("x = 1\\n", [])
""")


def test_a_verdict_runs_folder_left_by_a_killed_grading_is_removed_by_the_next():
    done = subprocess.run([sys.executable, "-c", _KILLED_IN_A_RUN], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    left = Path(done.stdout.strip())
    assert (left / "left.json").is_file()
    nxt = subprocess.run([sys.executable, "-c", _NEXT_RUN], capture_output=True, text=True, timeout=300)
    assert nxt.returncode == 0, nxt.stderr[-2000:]
    assert not left.exists() and not left.parent.exists()  # (it was /dev/shm/dsched-verdict-...: left for good)


# --- what the instructor sees: one `decodesched grade` run -----------------------------------------------------

@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("stop60")
    course, release_path = build_course(base)
    release = json.loads(release_path.read_text(encoding="utf-8"))
    correct = attacks._with_solution(release, attacks.reference_source())
    subs = base / "subs"
    _write(subs / "dave.ipynb", correct)
    (subs / "erin.ipynb").symlink_to("dave.ipynb")
    (subs / "frank" / A).mkdir(parents=True)
    (subs / "frank" / A / NB).symlink_to(Path("..", "..", "dave.ipynb"))
    _write(subs / "Alice.ipynb", correct)
    _write(subs / "alice.ipynb", release)  # the release as it was handed out: every TODO a stub
    old = copy.deepcopy(correct)  # nbformat 4.0, as an old Jupyter saved it: no cell ids
    old["nbformat_minor"] = 0
    for cell in old["cells"]:
        cell.pop("id", None)
    _write(subs / "olga.ipynb", old)
    return grade_folder(subs, course, base / "out", "--timeout", "60")


@pytest.mark.slow
def test_a_peers_notebook_by_link_earns_nothing_and_each_student_is_graded_as_handed_in(graded):
    rows, out = graded["rows"], graded["out"]
    assert (rows["dave"]["status"], float(rows["dave"]["score"])) == ("graded", spec.MAX_SCORE)
    for sid in ("erin", "frank"):
        assert (rows[sid]["status"], float(rows[sid]["score"])) == ("invalid", 0.0), sid
    assert "invalid erin: the notebook is the file of dave's submission" in graded["stderr"]
    assert "invalid frank: the notebook is a link out of the student's folder frank/" in graded["stderr"]
    # ids that differ only by case: two rows, two pages, neither overwrites the other
    assert (rows["Alice"]["status"], float(rows["Alice"]["score"])) == ("graded", spec.MAX_SCORE)
    assert float(rows["alice"]["score"]) == 0.0
    stub_page = (out / "feedback" / "alice.html").read_text(encoding="utf-8")
    assert "raised in enqueue, TODO 1" in stub_page
    assert "raised in enqueue" not in (out / "feedback" / "Alice.html").read_text(encoding="utf-8")
    assert (rows["olga"]["status"], float(rows["olga"]["score"])) == ("graded", spec.MAX_SCORE)
    assert "Traceback" not in graded["stderr"]
