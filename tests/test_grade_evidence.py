"""grader.evidence: altered locked/test cells, the canary cell, plain signs of cheating."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from decodesched.grader import evidence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks.attacks import minimal_notebook as _nb  # noqa: E402


def _write(path, nb):
    path.write_text(json.dumps(nb))
    return path


def test_altered_cells_detects_edited_tests_not_solutions():
    release = _nb()
    same = _nb(solution="anything the student wrote")
    assert evidence.altered_cells(same, release) == []
    edited = _nb()
    edited["cells"][2]["source"] = "pass\n"
    assert evidence.altered_cells(edited, release) == ["test_todo1_enqueue"]
    points = _nb()
    points["cells"][2]["metadata"]["nbgrader"]["points"] = 300
    assert evidence.altered_cells(points, release) == ["test_todo1_enqueue"]
    deleted = _nb()
    del deleted["cells"][2]
    assert evidence.altered_cells(deleted, release) == []  # nbgrader restores deleted graded cells
    dup = _nb(extra_cells=[json.loads(json.dumps(_nb()["cells"][2]))])
    assert evidence.altered_cells(dup, release) == ["test_todo1_enqueue"]


def test_canary_expectation_matches_plain_python(capsys):
    nonce = "n0nce"
    src = evidence.canary_cell(nonce)["source"]
    with pytest.raises(AssertionError, match=nonce):
        exec(compile(src, "<canary>", "exec"), {})
    assert capsys.readouterr().out.strip() == evidence._canary_expected(nonce)


def test_canary_ignores_names_the_student_rebound(capsys):
    # `for type in (...)` in a scratch cell, `str = ...`: honest rebinding in the kernel's namespace must not
    # read as altered builtins (the canary used to call them by name: "tampered").
    nonce = "n0nce"
    shadowed = {name: "shadowed" for name in ("print", "sorted", "len", "isinstance", "int", "type", "str", "abs",
                                               "__import__", "builtins")}
    with pytest.raises(AssertionError, match=nonce):
        exec(compile(evidence.canary_cell(nonce)["source"], "<canary>", "exec"), shadowed)
    assert capsys.readouterr().out.strip() == evidence._canary_expected(nonce)
    assert evidence.CANARY_BUILTINS not in shadowed  # it leaves no name behind


def test_canary_still_sees_altered_builtins(capsys, monkeypatch):
    import builtins

    nonce = "n0nce"
    code = compile(evidence.canary_cell(nonce)["source"], "<canary>", "exec")
    monkeypatch.setattr(builtins, "abs", lambda x: x)  # (pytest itself needs an honest isinstance meanwhile)
    try:
        exec(code, {})
    except AssertionError:
        pass
    finally:
        monkeypatch.undo()
    assert capsys.readouterr().out.strip() != evidence._canary_expected(nonce)


def test_the_gradebook_snapshot_never_follows_a_planted_link(tmp_path):
    # The kernel run's folder is the student's: a link named like the snapshot used to have root write the
    # gradebook wherever it pointed.
    import sqlite3

    run = tmp_path / "run"
    run.mkdir()
    db = run / "gradebook.db"
    sqlite3.connect(db).close()
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file")
    (run / "inspect.db").symlink_to(victim)
    evidence._inspect_gradebook_copy(db, "student", tmp_path)
    assert victim.read_text() == "someone else's file"


@pytest.mark.parametrize("code", [
    "import builtins\nbuiltins.isinstance = lambda o, t: True\n",
    "import builtins as b\nsetattr(b, 'len', None)\n",
    "__builtins__['print'] = None\n",
    "vars(__builtins__).update(x=1)\n",
    "get_ipython().ast_transformers.append(object())\n",
    "ip = get_ipython()\nip.input_transformers_post.append(lambda l: l)\n",
    "import sqlite3\nsqlite3.connect('../../gradebook.db')\n",
    "import glob\nglob.glob('/**/GradeBook.DB', recursive=True)\n",
    # a wrapped comparison used to be stripped as a shell escape, the cell not parsed, and nothing found
    "ok = (1\n      != 2)\nimport builtins\nbuiltins.len = None\n",
])
def test_static_evidence_flags_plain_cheats(code):
    assert evidence.static_evidence([code])


def test_static_evidence_accepts_honest_code():
    honest = (
        "%matplotlib inline\nfrom dataclasses import dataclass\nimport builtins\n"
        "x = builtins.len([1])\nclass DecodeSchedulerSim:\n    def step(self):\n        self.queue = sorted(self.queue)\n"
    )
    # the word alone, in prose, names no file: an honest docstring is no evidence
    prose = 'def schedule(queue):\n    """Fair to every request; nothing here touches the gradebook."""\n'
    assert evidence.static_evidence([honest, "def broken(:\n", prose]) == []


def _released():
    """The minimal notebook with nbgrader's checksums on its locked/test cells, as a release has them."""
    from nbformat import from_dict
    from nbgrader.utils import compute_checksum

    nb = _nb()
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader")
        if meta and (meta.get("grade") or meta.get("locked")):
            meta["checksum"] = compute_checksum(from_dict(cell))
    return nb


def test_whitespace_only_changes_and_identical_copies_are_restored_not_evidence():
    # Audit 6, finding 6: a trailing newline added to a test cell (an editor, a jupytext round trip) was
    # "altered" through nbgrader's checksum of the exact source; a duplicated test cell was "altered" too.
    release = _released()
    test_cell = json.loads(json.dumps(release["cells"][2]))
    gid = test_cell["metadata"]["nbgrader"]["grade_id"]
    spaced = json.loads(json.dumps(release))
    spaced["cells"][2]["source"] = "\n".join(ln + "  " for ln in test_cell["source"].split("\n")) + "\n\n"
    assert evidence.altered_cells(spaced, release) == [gid]  # as submitted: the checksum differs
    fixed, notes = evidence.restore_protected(spaced, release)
    assert evidence.altered_cells(fixed, release) == []
    assert fixed["cells"][2]["source"] == test_cell["source"] and len(notes) == 1 and gid in notes[0]
    assert spaced["cells"][2]["source"] != test_cell["source"]  # the submission itself is not changed

    dup = json.loads(json.dumps(release))
    dup["cells"].append(json.loads(json.dumps(test_cell)))
    fixed, notes = evidence.restore_protected(dup, release)
    assert len(fixed["cells"]) == len(release["cells"]) and evidence.altered_cells(fixed, release) == []
    assert "identical copies" in notes[0] and gid in notes[0]

    assert evidence.restore_protected(release, release) == (release, [])


def test_a_real_alteration_stays_evidence_after_restoring():
    release = _released()
    edited = json.loads(json.dumps(release))
    edited["cells"][2]["source"] = "pass\n"
    copy = json.loads(json.dumps(edited["cells"][2]))
    edited["cells"].append(copy)  # an altered copy as well
    fixed, _notes = evidence.restore_protected(edited, release)
    gid = release["cells"][2]["metadata"]["nbgrader"]["grade_id"]
    assert evidence.altered_cells(fixed, release) == [gid]
    half = json.loads(json.dumps(release))
    half["cells"].append(json.loads(json.dumps(edited["cells"][2])))  # the original, then an altered copy
    fixed, _notes = evidence.restore_protected(half, release)
    assert evidence.altered_cells(fixed, release) == [gid]
