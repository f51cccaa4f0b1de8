"""Tamper evidence: signs that a submission tried to change its grade rather than earn it.

* locked or test cells altered (compared with the release notebook and nbgrader's checksums);
* plain signs in the student's own code cells (assigning to ``builtins``, registering IPython
  transformers, naming the gradebook file), parsed, never run;
* the *canary* cell appended to the kernel's notebook: its failing ``assert`` must fail and its
  output must be what honest builtins print (assert-dropping transformers, patched builtins);
* the private gradebook copy written by the student's code (manual scores, extra credit).

Files written into protected folders and forged verdict output are found by `grader.sandbox` and
`grader.verdict`.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

from . import spec
from .harness import strip_magics
from .notebook import _cell_source, _nbgrader_meta, _plain_file, norm_source

CANARY_TAG = "decodesched-grader-canary"


def _protected(release: dict) -> dict:
    """The release's locked and test cells (not the solution cell), by grade_id."""
    protected = {}
    for cell in release["cells"]:
        meta = _nbgrader_meta(cell)
        gid = meta.get("grade_id")
        if isinstance(gid, str) and gid and gid != spec.SOLUTION_CELL and (meta.get("locked") or meta.get("grade")):
            protected[gid] = cell
    return protected


def _same_but_whitespace(cell: dict, ref: dict) -> bool:
    meta, rmeta = _nbgrader_meta(cell), _nbgrader_meta(ref)
    return (cell.get("cell_type") == ref.get("cell_type")
            and norm_source(_cell_source(cell)) == norm_source(_cell_source(ref))
            and bool(meta.get("grade")) == bool(rmeta.get("grade"))
            and meta.get("points") == rmeta.get("points")
            and all(bool(meta.get(k)) == bool(rmeta.get(k)) for k in ("locked", "solution", "task")))


def restore_protected(nb: dict, release: dict) -> tuple[dict, list[str]]:
    """The notebook as nbgrader should get it, and a note per change: a locked or test cell whose source
    differs from the release's only in whitespace (an editor that ends cells with a newline, a jupytext round
    trip) gets the release's exact source, and an identical copy of one (Jupyter's copy/paste or "duplicate
    cell" keeps the grading metadata) is dropped, the first one kept. Nothing the student wrote changes
    meaning; a real alteration is left as it is (tamper evidence: `altered_cells`)."""
    protected = _protected(release)
    cells, notes, seen, respaced, dropped = [], [], set(), [], []
    for cell in nb["cells"]:
        gid = _nbgrader_meta(cell).get("grade_id")
        if not isinstance(gid, str) or gid not in protected or not _same_but_whitespace(cell, protected[gid]):
            cells.append(cell)
            continue
        if gid in seen:
            dropped.append(gid)
            continue
        seen.add(gid)
        ref_src = _cell_source(protected[gid])
        if _cell_source(cell) != ref_src:
            cell = {**cell, "source": ref_src}
            if "checksum" in _nbgrader_meta(protected[gid]):
                meta = dict(cell.get("metadata") or {})
                meta["nbgrader"] = {**_nbgrader_meta(cell), "checksum": _nbgrader_meta(protected[gid])["checksum"]}
                cell["metadata"] = meta
            respaced.append(gid)
        cells.append(cell)
    if respaced:
        notes.append("only the whitespace of these locked/test cells differed from the release; they were graded "
                     "as released: " + ", ".join(sorted(set(respaced))))
    if dropped:
        notes.append("identical copies of these test cells were removed before grading (each is graded once): "
                     + ", ".join(sorted(set(dropped))))
    if not respaced and not dropped:
        return nb, []
    return {**nb, "cells": cells}, notes


def restore_earlier_release(nb: dict, release: dict, earlier: list) -> tuple[dict, list[str]]:
    """The notebook with each locked or test cell that is, but for whitespace, the cell of an earlier release
    (`course.earlier_releases`: the instructor fixed a test or the task and rebuilt) given the current release's
    cell, as nbgrader's autograde overwrites test cells with the current version, and a note. A student who
    downloaded the release before the rebuild altered nothing (nor did one whose editor reformatted it or turned it
    into markdown: `_as_released`); a cell that no release ever had stays evidence."""
    protected = _protected(release)
    before = [_protected(old) for old in earlier]
    cells, replaced = [], []
    for cell in nb["cells"]:
        gid = _nbgrader_meta(cell).get("grade_id")
        ref = protected.get(gid) if isinstance(gid, str) else None
        if ref is not None and not _as_released(cell, ref) and any(
                old.get(gid) is not None and _as_released(cell, old[gid]) for old in before):
            typed = {k: ref[k] for k in ("cell_type", "outputs", "execution_count", "attachments") if k in ref}
            cell = {**{k: v for k, v in cell.items() if k not in ("outputs", "execution_count", "attachments")},
                    **typed, "source": _cell_source(ref),
                    "metadata": {**(cell.get("metadata") or {}), "nbgrader": dict(_nbgrader_meta(ref))}}
            replaced.append(gid)
        cells.append(cell)
    if not replaced:
        return nb, []
    return {**nb, "cells": cells}, [
        "these locked/test cells are as an earlier release had them (the instructor has since updated them); they "
        "were graded as the current release's: " + ", ".join(sorted(set(replaced)))]


def _as_released(cell: dict, ref: dict) -> bool:
    """Whether `cell` is the release's `ref` but for what `pipeline.restore_formatting` and `restore_protected`
    forgive (whitespace, a code formatter's rewrite, a code cell turned into markdown or raw)."""
    from .pipeline import restore_formatting

    return _same_but_whitespace(restore_formatting({"cells": [cell]}, {"cells": [ref]})[0]["cells"][0], ref)


def altered_cells(nb: dict, release: dict) -> list[str]:
    """Locked and test cells of the release that the submission changed (tamper evidence).

    A cell deleted by mistake is not evidence (nbgrader puts graded cells back); a cell that is
    present with other source, another type, or other grading metadata is.
    """
    protected = _protected(release)
    seen: dict[str, int] = {}
    altered = []
    for cell in nb["cells"]:
        meta = _nbgrader_meta(cell)
        gid = meta.get("grade_id")
        if not isinstance(gid, str) or gid not in protected:
            continue
        seen[gid] = seen.get(gid, 0) + 1
        ref = protected[gid]
        rmeta = _nbgrader_meta(ref)
        same = _same_but_whitespace(cell, ref)
        if same and "checksum" in meta:
            # nbgrader's own check: the stored checksum must match the cell as submitted
            with contextlib.suppress(Exception):
                same = nbgrader_checksum(cell) == rmeta.get("checksum", meta["checksum"])
        if not same:
            altered.append(gid)
    altered += [g for g, n in seen.items() if n > 1]  # copies that were not identical (identical ones: dropped)
    return sorted(set(altered))


def nbgrader_checksum(cell: dict) -> str:
    """nbgrader's ``utils.compute_checksum(nbformat.from_dict(cell))``, raising where it raises (a source kept as
    a list of lines, a missing grade_id), without importing nbgrader: that costs the grading process seconds of
    CPU (nbformat, jsonschema), and it holds up a Ctrl-C until it is done."""
    import hashlib

    meta = cell["metadata"]
    nb = meta["nbgrader"] if "nbgrader" in meta else None
    grade = nb.get("grade", False) if nb is not None else False
    solution = nb.get("solution", False) if nb is not None else False
    locked = False if nb is None or solution else True if grade else nb.get("locked", False)
    m = hashlib.md5()
    for part in (cell["source"], cell["cell_type"], str(grade), str(solution), str(locked), nb["grade_id"]):
        m.update(part.encode("utf-8"))  # (what is not text raises, as in nbgrader's `to_bytes`)
    if grade:
        m.update(str(float(nb["points"])).encode("utf-8"))
    return m.hexdigest()


_AST_LOCK = threading.Lock()
# The longest cell the grading process parses. ast.parse takes about 800 times a source's length in memory (1 MiB of
# ``1`` lines: 820 MB), and a notebook may hold 100 MiB: one scratch cell of a few MiB took gigabytes from the grader,
# outside every limit of the sandbox (honest cells: a few KiB; the reference solution, 10 KiB). A longer cell runs
# only in the sandbox, whose limits bound it; its static evidence is not read (its effects still are).
MAX_PARSED_CHARS = 256 * 1024


def parse_cell(source: str):
    """A code cell's syntax tree, magics at statement starts made `pass` as the harness and IPython do
    (`harness.strip_magics`), or None when it does not parse or is over `MAX_PARSED_CHARS` long."""
    import ast

    if len(source) > MAX_PARSED_CHARS:
        return None
    try:
        with _AST_LOCK:  # CPython 3.11's ast.parse is not thread-safe ("recursion depth mismatch")
            return ast.parse(strip_magics(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


_GRADEBOOK_FILE = re.compile(r"gradebook\.(db|sqlite)", re.IGNORECASE)
_TRANSFORMER_ATTRS = {"ast_transformers", "input_transformers_post", "input_transformers_cleanup",
                      "input_transformer_manager", "input_splitter", "register_magic_function"}


def static_evidence(sources) -> list[str]:
    """Plain signs of cheating in the student's own code cells (parsed, never run).

    Assigning to attributes of ``builtins``, registering IPython input/AST transformers, or naming
    the gradebook file (``gradebook.db``; the word alone, in a docstring, is no sign) has no place in a
    scheduler. Obfuscated variants are not caught here; they are caught by their effects (canary,
    gradebook copy, strict verdict types) or earn nothing.
    """
    import ast

    found = set()
    for source in sources:
        tree = parse_cell(source)
        if tree is None:
            continue
        names = {"builtins", "__builtins__"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.asname or a.name for a in node.names if a.name == "builtins"}

        def is_builtins(expr) -> bool:
            # (a loop: ``builtins.__dict__.__dict__...`` 1,500 deep compiles, and recursion here raised RecursionError)
            while True:
                if isinstance(expr, ast.Name):
                    return expr.id in names
                if isinstance(expr, ast.Attribute) and expr.attr == "__dict__":
                    expr = expr.value
                elif (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "vars"
                      and expr.args):
                    expr = expr.args[0]
                else:
                    return False

        for node in ast.walk(tree):
            targets = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                if isinstance(t, (ast.Attribute, ast.Subscript)) and is_builtins(t.value):
                    found.add("the code assigns to builtins")
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and node.args and is_builtins(node.args[0]):
                    found.add("the code assigns to builtins")
                if isinstance(f, ast.Attribute) and f.attr in ("update", "__setitem__", "setdefault", "pop") and is_builtins(f.value):
                    found.add("the code assigns to builtins")
            if isinstance(node, ast.Attribute) and node.attr in _TRANSFORMER_ATTRS:
                found.add("the code registers IPython input or AST transformers")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _GRADEBOOK_FILE.search(node.value):
                found.add("the code looks for the nbgrader gradebook")
    return sorted(found)


CANARY_BUILTINS = "_decodesched_canary_builtins"


def canary_cell(nonce: str) -> dict:
    """The canary, run last in the student's kernel. It reaches every builtin through the `builtins` module
    (an ``import`` looks up ``__import__`` in the real builtins, never in the namespace), so a name the
    student's cells rebound (``for type in ...``, ``str = ...``) cannot make it fail: only builtins that were
    really altered, or asserts that no longer fail, change what it prints."""
    b = CANARY_BUILTINS
    src = (
        f"# {CANARY_TAG}: checks that asserts, comparisons and builtins still work in this kernel\n"
        f"import builtins as {b}\n"
        f"{b}.print({nonce!r}, 1 == 2, [3, 1, 2] == [3, 1, 2], {b}.sorted([3, 1, 2]), {b}.len('abc'), "
        f"{b}.isinstance(1, {b}.int), {b}.isinstance('a', {b}.int), {b}.type(True).__name__, {b}.str(7), "
        f"{b}.abs(-2))\n"
        f"del {b}\n"
        f"assert 1 == 2, {nonce!r}\n"
    )
    return {"cell_type": "code", "execution_count": None, "id": "decodesched-canary", "metadata": {},
            "outputs": [], "source": src}


def _canary_expected(nonce: str) -> str:
    return f"{nonce} False True [1, 2, 3] 3 True False bool 7 2"


def cell_outputs(cell) -> list[dict]:
    """A notebook cell's outputs that are objects; none where the cell or its ``outputs`` has another shape."""
    outputs = cell.get("outputs") if isinstance(cell, dict) else None
    return [o for o in outputs if isinstance(o, dict)] if isinstance(outputs, list) else []


def _error_outputs(nb) -> list[tuple[int, dict]]:
    cells = nb.get("cells") if isinstance(nb, dict) else None
    return [(i, o) for i, cell in enumerate(cells if isinstance(cells, list) else [])
            for o in cell_outputs(cell) if o.get("output_type") == "error"]


def _inspect_gradebook_copy(db: Path, student_id: str, scratch: Path) -> list[str]:
    """Evidence that code other than nbgrader wrote to the private gradebook copy.  The snapshot it reads goes to a
    new folder of the grader's own in `scratch` (the grading's workroot: a grading killed by SIGKILL leaves it there,
    for the next grading to remove with the workroot)."""
    if not _plain_file(db, 256 * 1024 * 1024):
        return ["the gradebook copy was deleted or replaced"]
    # The run's folder is the student's, and a link planted there under the snapshot's name would have root write
    # the gradebook wherever it points.
    with tempfile.TemporaryDirectory(prefix="inspect-", dir=scratch) as private:
        return _query_gradebook(db, Path(private) / "inspect.db", student_id)


# What the queries of a gradebook copy may cost, in SQLite's virtual-machine steps (a copy of 5,000 graded cells takes
# about 100,000; nbgrader's copy of one student's run, a few dozen rows): the student's code can write the copy, and a
# table replaced by a view that never ends (a recursive query) held the whole grading for ever, SIGTERM's stop too
GRADEBOOK_QUERY_STEPS = 10_000_000
_STEPS_PER_CALL = 10_000


def _query_gradebook(db: Path, snap: Path, student_id: str) -> list[str]:
    evidence = []
    calls = [0]

    def spent() -> bool:  # a true answer interrupts the running query (sqlite3.OperationalError)
        calls[0] += 1
        return calls[0] * _STEPS_PER_CALL > GRADEBOOK_QUERY_STEPS

    try:
        shutil.copyfile(db, snap)
        con = sqlite3.connect(f"file:{snap}?mode=ro", uri=True)
        try:
            con.set_progress_handler(spent, _STEPS_PER_CALL)
            con.execute("PRAGMA trusted_schema=OFF")
            n = con.execute("SELECT count(*) FROM grade WHERE manual_score IS NOT NULL "
                            "OR (extra_credit IS NOT NULL AND extra_credit != 0)").fetchone()[0]
            if n:
                evidence.append(f"{n} manual score(s) or extra credit written into the gradebook")
            over = con.execute(
                "SELECT count(*) FROM grade JOIN grade_cells ON grade.cell_id = grade_cells.id "
                "WHERE grade.auto_score > grade_cells.max_score").fetchone()[0]
            if over:
                evidence.append(f"{over} score(s) above the cell's points in the gradebook")
            others = [r[0] for r in con.execute("SELECT id FROM student") if r[0] != student_id]
            if others:
                evidence.append("other students were added to the gradebook")
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        if calls[0] * _STEPS_PER_CALL > GRADEBOOK_QUERY_STEPS:
            evidence.append("the gradebook copy was altered: reading it did not end (its tables were replaced)")
        else:
            evidence.append(f"the gradebook copy was damaged ({exc.__class__.__name__})")
    return evidence
