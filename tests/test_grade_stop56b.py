"""Stop 56 (b): the grader scores what IPython and nbgrader would run.

* A solution cell whose first line is a cell magic was graded as if its body were Python: ``%%writefile x.py``,
  ``%%script false``, ``%%bash``, ``%%html``, ``%%timeit`` ... scored full marks, while IPython hands such a body
  to the magic as text (or runs it inside a function of its own: ``%%timeit``), so the classes are never defined
  and `nbgrader autograde` scores 0. Now only ``%%time``, ``%%capture`` and ``%%prun`` run the body, as in IPython
  (`harness.cell_magic`), and the feedback names the line.
* `decodesched grade` hung for ever after the last submission (`pipeline._commit` held an flock on --out while the
  renames of `output_group`, since 19bea4c, took one on the same folder through another descriptor).
* Honest students in ten other styles (`grader.solutions.honest_variants`), graded through `decodesched grade`,
  score what a real `nbgrader autograde` with the hidden tests gives the same notebook.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from decodesched.grader import harness
from decodesched.grader.solutions import honest_variants

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.course import ASSIGNMENT, build_course, grade_folder, tool_env  # noqa: E402

BODY = "class K:\n    pass\n"
MAGICS = ["%%writefile x.py", "%%file y.py", "%%script false", "%%bash", "%%sh", "%%html", "%%markdown", "%%javascript",
          "%%js", "%%latex", "%%python3", "%%timeit -n1 -r1", "%%nosuch", "%%time x", "%%capture --bogus",
          "%%capture", "%%capture out", "%%capture --no-stdout --no-display", "%%time", "%%time  ", "%%prun -q",
          "\n\n%%writefile z.py", "%%capture\n%%time", "%%time\n%%writefile w.py", "%%time\r"]
IPYTHON_RUN = '''
import json, sys
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
cells, defined = json.loads(sys.argv[1]), []
for cell in cells:
    ip.user_ns.pop("K", None)
    ip.run_cell(cell, store_history=False)
    defined.append("K" in ip.user_ns)
with open(sys.argv[2], "w") as fh:
    json.dump(defined, fh)
'''


def _ours(cell, name="K"):
    module = types.ModuleType("magic_solution")
    errors = harness.load_solution(cell, module.__dict__, 5.0)
    return name in module.__dict__, errors


def test_cell_magics_run_the_body_where_ipython_does(tmp_path):
    pytest.importorskip("IPython")
    cells = [m + "\n" + BODY for m in MAGICS]
    subprocess.run([sys.executable, "-c", IPYTHON_RUN, json.dumps(cells), str(tmp_path / "ipython.json")],
                   cwd=tmp_path, capture_output=True, text=True, timeout=300, check=True)
    theirs = json.loads((tmp_path / "ipython.json").read_text())
    assert dict(zip(MAGICS, [_ours(c)[0] for c in cells])) == dict(zip(MAGICS, theirs))
    assert theirs.count(True) == 8  # both kinds are covered


def test_a_cell_magic_that_keeps_the_body_from_running_is_named():
    defined, errors = _ours("%%writefile scheduler.py\n" + attacks.reference_source(), "RequestState")
    assert not defined and errors == ["the cell magic line %%writefile scheduler.py hands the rest of the cell to that "
                                      "magic instead of running it as Python (as IPython does), so nothing in it was "
                                      "defined: delete that line"]
    defined, errors = _ours("%%time\n" + attacks.reference_source() + "1 / 0\n", "RequestState")
    assert defined and len(errors) == 1 and "line 208 raised ZeroDivisionError" in errors[0]  # line numbers kept


@pytest.mark.parametrize("name", sorted({**honest_variants.CORRECT, **honest_variants.WRONG}))
def test_each_variant_is_the_reference_with_its_edits(name):
    module = types.ModuleType("variant")
    assert harness.load_solution(honest_variants.source(name), module.__dict__, 5.0) == []
    assert {"DecodeSchedulerSim", "RequestState"} <= set(module.__dict__)


COMMIT = '''
import sys
from pathlib import Path
from decodesched.grader import pipeline
out = Path(sys.argv[1])
out.mkdir()
pipeline._commit(out, {"feedback": [("alice.html", "<p>alice</p>"), ("bob.html", "<p>bob</p>")],
                       "grades.csv": "student_id,score\\nalice,1\\nbob,2\\n"}, lambda: None, kept=None)
print("committed")
'''


def test_the_outputs_are_committed_without_waiting_on_a_lock_of_our_own(tmp_path):
    """`_commit` held an flock on --out while `output_group`'s renames took another one on the same folder: every
    `decodesched grade` waited forever after its last submission (SIGTERM held back, only kill -9 ended it)."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", COMMIT, str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout == "committed\n", proc.stderr[-2000:]
    assert (out / "grades.csv").read_text() == "student_id,score\nalice,1\nbob,2\n"
    assert sorted(p.name for p in (out / "feedback").iterdir()) == ["alice.html", "bob.html"]


def test_folder_locks_are_reentrant_in_a_thread_and_exclude_another_thread(tmp_path):
    """`_io.folders_locked`: a thread that holds a folder's lock takes it again at once (the commit around the
    renames), another thread waits until it is released."""
    from decodesched._io import folders_locked

    seen = []

    def other():
        with folders_locked([tmp_path / "."]):
            seen.append("other")

    with folders_locked([tmp_path]):
        with folders_locked([tmp_path, tmp_path / "sub" / ".."]):  # (one folder by two names: locked once)
            seen.append("nested")
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(0.5)
        assert seen == ["nested"]  # (still waiting)
    thread.join(60)
    assert seen == ["nested", "other"]


def _plain_nbgrader(course: Path, subs: Path, root: Path) -> dict:
    """raw_score by student id of a real `nbgrader autograde` (hidden tests included: the course's source notebook)
    of the notebooks in `subs`, in a copy of `course` (as tests/grader_attacks/throughput.py does)."""
    plain = root / "plain"
    shutil.copytree(course, plain)
    for nb in sorted(subs.glob("*.ipynb")):
        (plain / "submitted" / nb.stem / ASSIGNMENT).mkdir(parents=True)
        shutil.copy2(nb, plain / "submitted" / nb.stem / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    env = tool_env()
    env["JUPYTER_RUNTIME_DIR"] = str(root / "runtime")
    for cmd in (["autograde", ASSIGNMENT], ["export", f"--to={root / 'plain.csv'}"]):
        proc = subprocess.run([sys.executable, "-m", "nbgrader", *cmd], cwd=plain, capture_output=True, text=True,
                              env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr[-2000:]
    with open(root / "plain.csv", newline="", encoding="utf-8") as fh:
        return {r["student_id"]: float(r["raw_score"]) for r in csv.DictReader(fh)}


@pytest.mark.slow
def test_magic_cells_and_honest_variants_score_what_nbgrader_gives(tmp_path):
    course, release_path = build_course(tmp_path)
    release = json.loads(release_path.read_text(encoding="utf-8"))
    subs = tmp_path / "subs"
    subs.mkdir()
    sources = {"m_writefile": "%%writefile scheduler.py\n" + attacks.reference_source(),
               "m_capture": "%%capture\n" + attacks.reference_source(),
               **{name: honest_variants.source(name) for name in honest_variants.CORRECT}}
    for name, source in sources.items():
        (subs / f"{name}.ipynb").write_text(json.dumps(attacks._with_solution(release, source)), encoding="utf-8")
    plain = _plain_nbgrader(course, subs, tmp_path)
    ours = grade_folder(subs, course, tmp_path / "out")["rows"]
    assert {sid: float(r["score"]) for sid, r in ours.items()} == plain
    assert plain == {**{name: 100.0 for name in sources}, "m_writefile": 0.0}
    page = (tmp_path / "out" / "feedback" / "m_writefile.html").read_text(encoding="utf-8")
    assert "%%writefile scheduler.py hands the rest of the cell to that magic" in page
