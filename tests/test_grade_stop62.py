"""The grader run by an instructor on a bad day (stop 62): text of a student's that UTF-8 cannot write (a lone
surrogate in an exception's message, as `raise ValueError("\\ud800")` makes) stopped the outputs of the whole class
with a traceback (UnicodeEncodeError: no grades.csv, no page, for anyone); and a grading killed by SIGKILL in its
commit left hidden temporary copies of grades.csv and of the students' pages in --out that no rerun removed; and a
notebook holding a lone surrogate (JSON's "\\ud800", which Jupyter never saves) was `crashed`, on every rerun, with
whatever score the checks gave, as nbgrader failed writing it: it is `invalid`, naming its cell.

The unit tests check each cause; one real `decodesched grade` (killed in its commit, then run again) checks what
an instructor sees."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from decodesched.grader import feedback, notebook, pipeline, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402
from grader_attacks.course import REPO, build_course, grade_folder, tool_env  # noqa: E402

# What a student's code can put into the page's text: markup, template syntax, a NUL, a lone surrogate.
HOSTILE = "<script>alert(1)</script></pre><img src=x onerror=alert(2)> {{7*7}} \ud800 \x00 \x1b[2J"


def _result(sid: str, text: str) -> pipeline.Result:
    cells = {c.grade_id: 0.0 for c in spec.CELLS}
    events = [{"step": 0, "request_id": 1, "action": text, "phase": text, "preempted_request_id": None}]
    return pipeline.Result(sid, "graded", 0.0, float(spec.MAX_SCORE), cells,
                           {c.grade_id: [f"FAIL got ValueError: {text}"] for c in spec.CELLS},
                           notes=[f"links or FIFOs planted in the checks' folder: {text}"],
                           pictures={"hidden_differential": {"expected": events, "got": events, "diff": text}})


def _no_markup_of_the_student(page: str) -> None:
    assert "<script" not in page and "<img" not in page and "</pre>" not in page and "\0" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;/pre&gt;&lt;img src=x onerror=alert(2)&gt; {{7*7}}" in page


def test_text_utf8_cannot_write_is_an_escape_on_the_page_and_the_outputs_are_rendered():
    rendered = pipeline.render_outputs([_result("eve", HOSTILE), _result("bob", "fine")])  # (raised for everyone)
    page = dict(rendered["feedback"])["eve.html"]
    page.encode("utf-8")
    _no_markup_of_the_student(page)
    assert "\\ud800 \\x00 \\x1b[2J" in page
    assert "fine" in dict(rendered["feedback"])["bob.html"]


def test_printable_text_of_any_script_is_shown_as_it_is():
    page = feedback.feedback_html(_result("amy", "期望 é\ttab\nline 🙂"))
    assert "期望 é\ttab\nline 🙂" in page


def _stale(folder: Path, name: str, body: str = "half") -> Path:
    path = folder / f".{name}.k3x_9a0q.tmp"
    path.write_text(body, encoding="utf-8")
    return path


def test_a_commit_removes_the_temporaries_a_killed_commit_left_and_nothing_else(tmp_path):
    fb = tmp_path / "feedback"
    fb.mkdir()
    stale = [_stale(tmp_path, "grades.csv"), _stale(fb, "zoe.html"), _stale(fb, "x" * 64)]
    others = [_stale(tmp_path, "notes.txt"), fb / ".keep", tmp_path / "grades.csv.k3x_9a0q.tmp"]
    for path in others[1:]:
        path.write_text("mine", encoding="utf-8")
    (tmp_path / ".grades.csv.abcdefgh.tmp").symlink_to(others[0])  # (a link is no temporary of ours)
    rendered = pipeline.render_outputs([_result("amy", "x")])
    pipeline._commit(tmp_path, rendered, lambda: None)
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in others) and (tmp_path / ".grades.csv.abcdefgh.tmp").is_symlink()
    assert (fb / "amy.html").is_file() and (tmp_path / "grades.csv").is_file()


def _lone_surrogate_notebook(release: dict, where: str) -> dict:
    nb = attacks._with_solution(release, attacks.reference_source())
    if where == "markdown":
        nb["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": "my notes \ud800 <b>"})
    elif where == "solution":
        cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
        cell["source"] += "\n# \udcff\n"
    else:
        nb["metadata"]["note"] = "\ud83d"  # (half of an emoji's pair)
    return nb


@pytest.mark.parametrize("where, cell", [("markdown", "cell 1 holds \\ud800"), ("solution", "holds \\udcff"),
                                         ("metadata", "its metadata holds \\ud83d")])
def test_a_notebook_holding_a_lone_surrogate_is_invalid_naming_where(tmp_path, where, cell):
    release = attacks.minimal_notebook()
    path = tmp_path / "sam.ipynb"
    path.write_text(json.dumps(_lone_surrogate_notebook(release, where)), encoding="ascii")
    with pytest.raises(notebook.InvalidSubmission, match="not a readable notebook") as raised:
        notebook.load_notebook(path)
    assert cell in str(raised.value)
    emoji = attacks.minimal_notebook(extra_cells=[{"cell_type": "markdown", "metadata": {"e": "\U0001F600"},
                                                   "source": "\U0001F600 \u00e9"}])
    path.write_text(json.dumps(emoji), encoding="ascii")  # ("\\ud83d\\ude00": a pair, an emoji)
    assert notebook.load_notebook(path)["cells"][-1]["source"] == "\U0001F600 \u00e9"


# --- what the instructor sees: a real grading killed in its commit, then run again ---------------------------------

_KILLED_IN_COMMIT = textwrap.dedent("""\
    import os, signal, sys
    from decodesched.grader import pipeline
    from decodesched.cli import main

    def killed(*args, **kwargs):  # the pages and grades.csv are written under temporary names: the power goes
        os.kill(os.getpid(), signal.SIGKILL)

    pipeline.update_gradebook = killed
    sys.exit(main(sys.argv[1:]))
""")


def _hidden_temporaries(out: Path) -> list[str]:
    return sorted(p.name for p in out.rglob(".*.tmp"))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("stop62")
    course, release_path = build_course(base)
    release = json.loads(release_path.read_text(encoding="utf-8"))
    reference = attacks.reference_source()
    raising = reference.replace(
        "    def enqueue(self, request_id: int,",
        f"    def enqueue(self, *args, **kwargs):\n        raise ValueError({HOSTILE!r} + 'A' * 100_000)\n\n"
        "    def _unused(self, request_id: int,", 1)
    assert raising != reference
    subs = base / "subs"
    subs.mkdir()
    (subs / "eve.ipynb").write_text(json.dumps(attacks._with_solution(release, raising)), encoding="utf-8")
    (subs / "bob.ipynb").write_text(json.dumps(attacks._with_solution(release, reference)), encoding="utf-8")
    (subs / "sam.ipynb").write_text(json.dumps(_lone_surrogate_notebook(release, "markdown")), encoding="ascii")
    out = base / "out"
    killed = subprocess.run([sys.executable, "-c", _KILLED_IN_COMMIT, "grade", str(subs), "--out", str(out),
                             "--course", str(course), "--jobs", "2", "--no-progress", "--timeout", "60"],
                            capture_output=True, text=True, env=tool_env(), cwd=REPO, timeout=1500)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    left = _hidden_temporaries(out)
    again = grade_folder(subs, course, out, "--timeout", "60")
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        again["ids"] = [row[0] for row in csv.reader(fh)][1:]
    return {**again, "left": left}


@pytest.mark.slow
def test_a_students_unwritable_exception_text_is_escaped_and_the_class_is_graded(graded):
    rows, out = graded["rows"], graded["out"]
    assert (rows["bob"]["status"], float(rows["bob"]["score"])) == ("graded", spec.MAX_SCORE)
    assert (rows["eve"]["status"], float(rows["eve"]["score"])) == ("graded", 0.0)
    page = (out / "feedback" / "eve.html").read_text(encoding="utf-8")  # (strict: it is UTF-8 throughout)
    _no_markup_of_the_student(page)
    assert "\\ud800 \\x00 \\x1b[2J" in page
    assert max(map(len, page.splitlines())) < 20_000  # (the 100 000 characters of the message are cut)
    assert "Traceback" not in graded["stderr"]


@pytest.mark.slow
def test_a_grading_killed_in_its_commit_is_rerun_with_no_temporary_left_and_each_student_once(graded):
    assert any(re.fullmatch(r"\.eve\.html\..{8}\.tmp", n) for n in graded["left"]), graded["left"]  # (as killed)
    assert _hidden_temporaries(graded["out"]) == []
    assert sorted(graded["ids"]) == ["bob", "eve", "sam"]
    assert not (graded["out"] / ".decodesched").exists()
    assert "took the kept gradings of 2 submission(s)" in graded["stderr"]
    assert sorted(os.listdir(graded["out"] / "feedback")) == ["bob.html", "eve.html", "sam.html"]


@pytest.mark.slow
def test_a_notebook_holding_a_lone_surrogate_is_one_invalid_row_saying_where(graded):
    assert (graded["rows"]["sam"]["status"], float(graded["rows"]["sam"]["score"])) == ("invalid", 0.0)
    assert "invalid sam: not a readable notebook (cell 1 holds \\ud800: half of a UTF-16 pair" in graded["stderr"]
