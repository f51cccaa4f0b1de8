"""Red team of stop 55's new code: grading over a term (earlier releases kept in the course, grades.csv rows kept
in --out), the trace CSV read whole, and the compiled Ctrl-C handler."""

from __future__ import annotations

import json
import os
import threading

import pytest

from decodesched import trace as tr
from decodesched.errors import UserError
from decodesched.grader import course, evidence, pipeline, spec
from test_grade_term import OPTIONS, _flat, _rows, offline  # noqa: F401 - (offline: the fixture)


# ---- .decodesched/releases: what an instructor's folder may hold ----

def _releases(tmp_path):
    folder = tmp_path / course.RELEASES
    folder.mkdir(parents=True)
    current = tmp_path / "release.ipynb"
    current.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []}))
    return folder, current


def test_a_fifo_among_the_kept_releases_is_skipped_not_waited_on(tmp_path):
    folder, current = _releases(tmp_path)
    os.mkfifo(folder / "0123456789abcdef.ipynb")
    found = []
    reader = threading.Thread(target=lambda: found.append(course.earlier_releases(tmp_path, current)), daemon=True)
    reader.start()
    reader.join(20)
    hung = reader.is_alive()
    if hung:  # (a writer lets the blocked open return, so that no thread is left behind)
        os.close(os.open(folder / "0123456789abcdef.ipynb", os.O_WRONLY | os.O_NONBLOCK))
        reader.join(20)
    assert not hung and found == [[]]  # before: open() waited for a writer for ever: every grading hung


@pytest.mark.parametrize("cells", [[1, "x"], [{"metadata": {"nbgrader": {"grade_id": ["t"], "locked": True}}}],
                                   [{"cell_type": "code", "source": "x",
                                     "metadata": {"nbgrader": {"grade_id": {"a": 1}, "grade": True}}}]])
def test_junk_among_the_kept_releases_is_no_crash_of_every_student(tmp_path, cells):
    folder, current = _releases(tmp_path)
    (folder / "junk.ipynb").write_text(json.dumps({"nbformat": 4, "metadata": {}, "cells": cells}))
    earlier = course.earlier_releases(tmp_path, current)
    nb = {"cells": [{"cell_type": "code", "source": "x", "metadata": {"nbgrader": {"grade_id": "t", "locked": True}}}]}
    # before: AttributeError or TypeError out of `_protected`, so grade_one failed and every student was `crashed`
    assert evidence.restore_earlier_release(nb, {"cells": cells if isinstance(cells[0], dict) else []}, earlier) == \
        (nb, [])


def _test_cell(source, cell_type="code", gid="test_a"):
    cell = {"cell_type": cell_type, "source": source,
            "metadata": {"nbgrader": {"grade_id": gid, "grade": True, "points": 2, "locked": True}}}
    return {**cell, "outputs": [], "execution_count": None} if cell_type == "code" else {**cell, "attachments": {}}


@pytest.mark.parametrize("cell", [_test_cell('expect_equal("a", 1)\n'),  # VS Code's "Format notebook" (black)
                                  _test_cell("expect_equal('a', 1)\n", "markdown")])  # Esc then M
def test_an_earlier_releases_cell_formatted_or_retyped_by_the_editor_is_no_tampering(cell):
    """As `pipeline.restore_formatting` forgives on the current release's cells; before: `tampered`."""
    release = {"cells": [_test_cell("expect_equal('b', 1)\n")]}
    earlier = [{"cells": [_test_cell("expect_equal('a', 1)\n")]}]
    nb, notes = evidence.restore_earlier_release({"cells": [cell]}, release, earlier)
    nb, more = pipeline.restore_formatting(nb, release)
    assert evidence.altered_cells(nb, release) == [] and "as an earlier release had them" in notes[0] and not more
    (graded,) = nb["cells"]
    assert graded["source"] == "expect_equal('b', 1)\n" and graded["cell_type"] == "code"
    assert graded["outputs"] == [] and "attachments" not in graded  # (a code cell nbformat takes)
    # a cell no release had is still evidence
    nb, notes = evidence.restore_earlier_release({"cells": [_test_cell("pass\n")]}, release, earlier)
    assert evidence.altered_cells(nb, release) == ["test_a"] and notes == []


# ---- grades.csv in an --out graded before ----

HEADER = "student_id,score,max_score,status," + ",".join(spec.CELL_IDS)


def _row(sid, score="50", status="graded", cell="1"):
    return ",".join([sid, score, str(spec.MAX_SCORE), status, *[cell] * len(spec.CELL_IDS)])


@pytest.mark.parametrize("rows", [[_row("alice"), _row("alice")],  # a row pasted twice in a spreadsheet
                                  [_row("alice", score="nan")], [_row("alice", score="inf")],
                                  [_row("alice", cell="-1e999")], [_row("alice", status="=HYPERLINK(1)")],
                                  [_row("alice", status="excellent")]])
def test_a_grades_csv_row_the_grader_never_writes_is_refused_not_copied_on(tmp_path, offline, rows):  # noqa: F811
    out = tmp_path / "out"
    out.mkdir()
    text = "\r\n".join([HEADER, *rows]) + "\r\n"
    (out / "grades.csv").write_bytes(b"\xef\xbb\xbf" + text.encode())
    # before: kept as they were: alice twice in the new table, a score of nan or inf, a formula as her status
    with pytest.raises(UserError, match=r"not a grades.csv that `decodesched grade` wrote \(line [23]\)"):
        pipeline.grade(_flat(tmp_path / "class", "bob"), out, options=pipeline.Options(**OPTIONS))
    assert (out / "grades.csv").read_bytes() == b"\xef\xbb\xbf" + text.encode() and offline["gradebook"] == []


def test_a_spreadsheets_bom_and_crlf_are_read(tmp_path, offline):  # noqa: F811
    out = tmp_path / "out"
    out.mkdir()
    blank = "," * (len(spec.CELL_IDS) + 3)  # (a spreadsheet's empty row)
    (out / "grades.csv").write_bytes(b"\xef\xbb\xbf" + "\r\n".join([HEADER, _row("alice", "37.5"), blank]).encode())
    pipeline.grade(_flat(tmp_path / "class", "bob"), out, options=pipeline.Options(**OPTIONS))
    assert {s: r["score"] for s, r in _rows(out).items()} == {"alice": "37.5", "bob": "50"}


def test_two_gradings_into_one_out_at_once_keep_each_others_rows(tmp_path, offline, monkeypatch):  # noqa: F811
    """Two instructors (or two terminals) grade one late student each into the class's --out at once: each read
    grades.csv before grading and wrote it after, so the later one put back the other's student's old row while
    the gradebook had the new grade."""
    out = tmp_path / "out"
    pipeline.grade(_flat(tmp_path / "class", "alice", "bob", "carol"), out, options=pipeline.Options(**OPTIONS))
    offline["scores"].update(alice=100, bob=90)
    fake = pipeline.grade_one

    def bob_graded_meanwhile(sub, *args, **kwargs):
        if sub.student_id == "alice":  # alice's grading is under way when bob's starts and ends
            pipeline.grade(_flat(tmp_path / "bob_only", "bob"), out, options=pipeline.Options(**OPTIONS))
        return fake(sub, *args, **kwargs)

    monkeypatch.setattr(pipeline, "grade_one", bob_graded_meanwhile)
    pipeline.grade(_flat(tmp_path / "alice_only", "alice"), out, options=pipeline.Options(**OPTIONS))
    assert offline["gradebook"][-2:] == [{"bob": 90.0}, {"alice": 100.0}]
    # before: bob 50 (alice's grading put back the row it had read before bob's was written)
    assert {s: r["score"] for s, r in _rows(out).items()} == {"alice": "100", "bob": "90", "carol": "50"}


# ---- Ctrl-C, SIGTERM and SIGHUP inside `immediate_interrupt` (the compiled handler of kernels/signal_nb.py) ----

def _signalled(body: str, ignore_sigint: bool = False):
    """(exit status, stderr) of a Python that runs `body` (a compiled kernel stands for the time it holds the
    interpreter: the signal is sent from the block, where only the compiled handler can act at once)."""
    import subprocess
    import sys
    import textwrap

    code = "import os, signal, time\n" + ("signal.signal(signal.SIGINT, signal.SIG_IGN)\n" if ignore_sigint else "")
    code += "from decodesched._io import immediate_interrupt, terminate_like_interrupt\n" + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stderr


def test_sigterm_in_a_replay_under_nohup_with_sigint_ignored_ends_it_at_once():
    """`nohup decodesched simulate ... &` starts with SIGINT ignored: the block was a no-op then, so a `kill` (SIGTERM)
    waited for the whole replay (Python's handler runs only when the kernel returns)."""
    rc, err = _signalled("""
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        with terminate_like_interrupt(), immediate_interrupt():
            os.kill(os.getpid(), signal.SIGINT)  # (ignored, as nohup and `&` ask)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
    """, ignore_sigint=True)
    assert (rc, err) == (143, "decodesched: terminated (SIGTERM)\n")  # before: a Terminated traceback
    rc, err = _signalled("""
        with terminate_like_interrupt():
            with immediate_interrupt():
                pass
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # (left as it was)
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            except KeyboardInterrupt as exc:
                print("unwound", type(exc).__name__, file=__import__("sys").stderr)
    """, ignore_sigint=True)
    assert (rc, err) == (0, "unwound Terminated\n")


def test_a_block_inside_another_leaves_the_outer_one_immediate():
    """The inner block put Python's handlers back on leaving, while the outer one (a replay) still ran."""
    rc, err = _signalled("""
        with immediate_interrupt():
            with immediate_interrupt():
                pass
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
    """)
    assert (rc, err) == (130, "decodesched: interrupted\n")  # before: a KeyboardInterrupt traceback


def test_python_handlers_are_back_after_each_block_and_a_custom_one_is_left_alone():
    rc, err = _signalled("""
        import sys
        for _ in range(2):  # a second replay after the first
            with immediate_interrupt():
                pass
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(30)
            except KeyboardInterrupt:
                print("KeyboardInterrupt", file=sys.stderr)
        seen = []
        signal.signal(signal.SIGINT, lambda s, f: seen.append(s))  # as a notebook's kernel sets its own
        with immediate_interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        print(seen == [signal.SIGINT], signal.getsignal(signal.SIGINT).__name__, file=sys.stderr)
    """)
    assert (rc, err) == (0, "KeyboardInterrupt\nKeyboardInterrupt\nTrue <lambda>\n")


# ---- the trace CSV read whole (`trace._csv_whole`) against record by record (`_csv_loop`) ----

_ROW = "1,1,3,2,1,false,1,,true"
_CSV_CASES = {  # inputs tests/test_trace_csv_whole.py's property does not draw
    "a NUL byte in a cell": _ROW.replace(",3,", ",3\0,"), "a quoted lone CR": _ROW.replace(",3,", ',"3\r",'),
    "a quoted NUL": _ROW.replace(",3,", ',"\0",'), "the header again": ",".join(tr.TRACE_COLUMNS) + "\n" + _ROW,
    "blank rows of tabs, spaces, NBSP and quotes": "\t\n \t \n\u00a0\n\"\"\n" + ",".join(['" "'] * 9) + "\n" + _ROW,
    "a field of exactly MAX_FIELD": _ROW.replace(",3,", ',"' + "3" * tr.MAX_FIELD + '",'),
    "a field of MAX_FIELD + 1": _ROW.replace(",3,", ',"' + "3" * (tr.MAX_FIELD + 1) + '",'),
    "a blank line past the csv module's field limit": " " * 140_000 + "\n" + _ROW,
    "10^5 blank lines": "\n" * 100_000 + _ROW,
    "vertical tab, form feed, U+2028": _ROW.replace(",3,", ",3\x0b\x0c\u2028,"),
    "text after a closing quote": _ROW.replace(",3,", ',"3"x,'), "a BOM after a blank line": "\n\ufeff" + _ROW,
}


@pytest.mark.parametrize("body", _CSV_CASES.values(), ids=_CSV_CASES.keys())
def test_a_csv_trace_read_whole_is_read_as_record_by_record(tmp_path, monkeypatch, body):
    from test_trace_csv_whole import _read

    path = tmp_path / "t.csv"
    path.write_bytes((",".join(tr.TRACE_COLUMNS) + "\n" + body + "\n").encode())
    whole = _read(path)
    monkeypatch.setattr(tr, "_plain_csv", lambda text, path: None)
    monkeypatch.setattr(tr, "_csv_whole", lambda text, path: None)
    monkeypatch.setattr(tr, "_text_column", lambda name, cells: None)
    assert whole == _read(path)
