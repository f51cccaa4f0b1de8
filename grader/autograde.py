"""Real ``nbgrader autograde`` of one submission, as workflow and evidence (never the score).

It runs in a private temporary course: a gradebook generated from the *release* notebook (so no
hidden test source, no solutions, no other students), our ``nbgrader_config.py``
(``c.Execute.timeout`` per cell), and the submission with one extra canary cell appended
(`grader.evidence`). The whole nbgrader process and its kernel run under the sandbox (CPU time of
the process tree, memory, wall-clock backstop; every process killed at the end).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sqlite3
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from decodesched.errors import UserError

from . import sandbox, spec
from .course import Course, assignment_notebook, build_locked
from .evidence import CANARY_TAG, _canary_expected, _error_outputs, _inspect_gradebook_copy, canary_cell, cell_outputs
from .limits import Limits
from .notebook import (MAX_BIG_NOTEBOOK_ITEMS, Submission, _cell_source, _nbgrader_meta, _plain_file, _safe_source,
                       _safe_text, big_parse, printable, too_many_values)

MAX_AUTOGRADED_BYTES = 64 * 1024 * 1024


def _nbgrader_argv(*args) -> list[str]:
    return [sys.executable, "-m", "nbgrader", *args]


NBGRADER_CONFIG = """\
c = get_config()
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = "decodesched"
c.Execute.timeout = {cell_timeout}
c.Execute.interrupt_on_timeout = True
c.Execute.startup_timeout = 60
c.Execute.raise_on_iopub_timeout = False
c.Execute.error_on_timeout = {{"ename": {ename!r}, "evalue": "", "traceback": [{ename!r}]}}
"""
# The error nbgrader records for a cell it interrupted at the per-cell time limit (`c.Execute.error_on_timeout`
# above): the only sign of that limit in the graded notebook. A student's own cell that raises TimeoutError (a
# socket's, a future's) or KeyboardInterrupt ran past no limit: it was `timeout` with a correct solution.
CELL_TIMEOUT_ENAME = "CellTimeoutError"


def build_template(course: Course, workroot: Path, cell_timeout: int) -> Path:
    """A private course whose gradebook holds only the release (no hidden tests, no students).

    It starts from a copy of the instructor's gradebook (made by `nbgrader generate_assignment`),
    removes every student, and replaces every stored cell source with the release version, so the
    hidden tests that nbgrader keeps in the gradebook never reach a student's kernel. The copy is made under the
    course's build lock (`course.build_locked`): a build started since the course was read stops the grading with
    one line, never a copy of a gradebook its nbgrader is writing.
    """
    tpl = workroot / "template"
    (tpl / "source" / spec.ASSIGNMENT).mkdir(parents=True)
    config = NBGRADER_CONFIG.format(root=".", cell_timeout=cell_timeout, ename=CELL_TIMEOUT_ENAME)
    (tpl / "nbgrader_config.py").write_text(config)
    db = tpl / "gradebook.db"
    with build_locked(course.root, exclusive=False):  # (not while `assignment build` rewrites it)
        shutil.copyfile(course.gradebook, db)
    release_cells = {}
    for cell in course.release["cells"]:
        gid = _nbgrader_meta(cell).get("grade_id")
        if isinstance(gid, str):
            release_cells[gid] = cell
    # Plain SQL on nbgrader's schema (importing nbgrader here cost seconds at the start of every run).
    con = sqlite3.connect(db)
    try:
        notebook_id = assignment_notebook(con)  # (checked before grading too: `course.unsubmitted`)
        if notebook_id is None:
            raise UserError(f"{course.gradebook}: the assignment {spec.ASSIGNMENT} is not in the gradebook; "
                            "run `decodesched assignment build` first")
        for table in ("comment", "grade", "submitted_notebook", "submitted_assignment", "student"):
            con.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed table names
        for cell_id, name, of_notebook in con.execute("SELECT id, name, notebook_id FROM source_cell").fetchall():
            rel = release_cells.get(name) if of_notebook == notebook_id else None  # other assignments: blanked
            checksum = _nbgrader_meta(rel).get("checksum") if rel is not None else None
            con.execute("UPDATE source_cell SET source = ?, checksum = COALESCE(?, checksum) WHERE id = ?",
                        (_cell_source(rel) if rel is not None else "", checksum, cell_id))
        con.commit()
        con.execute("VACUUM")  # no deleted hidden-test text left in free pages
    except sqlite3.DatabaseError as exc:
        raise UserError(f"{course.gradebook}: not a readable nbgrader gradebook ({exc})") from None
    finally:
        con.close()
    return tpl


def warm_server(server: sandbox.ForkServer, course: Course, template: Path, workroot: Path) -> bool:
    """Let the fork server pre-initialise nbgrader with one autograde of the release notebook in a copy
    of `template` (nothing executed: `grader.forkserver._warm`), so each kernel run forks it ready."""
    warm = Path(tempfile.mkdtemp(prefix="warm-", dir=workroot))
    try:
        shutil.copy2(template / "nbgrader_config.py", warm / "nbgrader_config.py")
        shutil.copy2(template / "gradebook.db", warm / "gradebook.db")
        (warm / "source" / spec.ASSIGNMENT).mkdir(parents=True)
        subdir = warm / "submitted" / "warmup" / spec.ASSIGNMENT
        subdir.mkdir(parents=True)
        shutil.copy2(course.release_nb_path, subdir / spec.NOTEBOOK)
        return server.warm(warm, spec.ASSIGNMENT, "warmup")
    except OSError:
        return False
    finally:
        shutil.rmtree(warm, ignore_errors=True)


_CELL_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # nbformat 4.5's schema for a cell's id
# The keys nbformat 4.5's schema allows (it refuses any other: "Additional properties are not allowed"), and the
# shape it asks of the metadata it names; nbgrader stops the whole run on a notebook that fails it.
_NB_KEYS = {"metadata", "nbformat", "nbformat_minor", "cells"}
_CELL_KEYS = {"code": {"id", "cell_type", "metadata", "source", "outputs", "execution_count"},
              "markdown": {"id", "cell_type", "metadata", "source"}, "raw": {"id", "cell_type", "metadata", "source"}}


def _tags(v) -> bool:
    return (isinstance(v, list) and all(isinstance(t, str) and t and "," not in t for t in v)
            and len(set(v)) == len(v))


_NB_META = {"orig_nbformat": lambda v: type(v) is int and v >= 1, "title": lambda v: isinstance(v, str),
            "authors": lambda v: isinstance(v, list)}
_CELL_META = {"jupyter": lambda v: isinstance(v, dict), "collapsed": lambda v: type(v) is bool,
              "execution": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
              "scrolled": lambda v: type(v) is bool or v == "auto", "name": lambda v: isinstance(v, str) and
              re.search(r"^.+$", v) is not None, "tags": _tags, "format": lambda v: isinstance(v, str)}


def _schema_fit(meta: dict, rules: dict, dropped: set) -> dict:
    """`meta` without the keys of `rules` whose value the schema refuses; their names are added to `dropped`."""
    bad = {k for k, ok in rules.items() if k in meta and not ok(meta[k])}
    dropped |= bad
    return {k: v for k, v in meta.items() if k not in bad} if bad else meta


def for_nbgrader(nb: dict, release: dict) -> tuple[dict, list[str]]:
    """The copy of a submission that nbgrader autograde gets, and a note per repair. nbgrader stops the whole run
    (and the submission would read `crashed`) on what editors and students' habits leave: a notebook without
    ``nbformat_minor``, a cell without ``metadata``, a code cell without ``outputs`` (jupytext, hand-made and
    converted notebooks), a cell id that nbformat's schema refuses (a space in it, over 64 characters), a cell
    carrying nbgrader metadata the release does not have (copied from another assignment's notebook: "Cell ... does
    not exist in the database", then "the nbgrader metadata may be corrupted"), and grading metadata of a released
    cell that lost a key, has another ``schema_version`` ("nbgrader update") or other flags or points ("Inconsistent
    checksums" for a test cell made a solution cell: the copy gets the release's), and what nbformat's schema refuses
    (a key a notebook or cell has not, ``prompt_number``; ``kernelspec``, ``tags`` or ``collapsed`` of another shape:
    "NotebookValidationError: 'python3' is not of type 'object'"); cells' attachments are left out. What the student
    wrote, the cells' sources, stays as it is; the evidence was taken from the notebook as submitted
    (`grader.evidence`); only this copy is repaired."""
    release_meta = {}
    for cell in release.get("cells", []):
        meta = _nbgrader_meta(cell)
        if isinstance(meta.get("grade_id"), str):
            release_meta[meta["grade_id"]] = meta
    minor = release.get("nbformat_minor")
    dropped: set = set()  # keys nbformat's schema refuses, left out of this copy
    meta = nb["metadata"] if isinstance(nb.get("metadata"), dict) else {}
    # the kernel is the release's (nbgrader's OverwriteKernelspec puts it back, after the schema check) and the
    # language is what that kernel runs: a student's `kernelspec` of another shape stopped nbgrader ("crashed")
    meta = {**{k: v for k, v in meta.items() if k not in ("kernelspec", "language_info")},
            **{k: v for k, v in (release.get("metadata") or {}).items() if k in ("kernelspec", "language_info")}}
    out = {k: v for k, v in nb.items() if k in _NB_KEYS}
    dropped |= set(nb) - _NB_KEYS
    out.update(nbformat=4, metadata=_schema_fit(meta, _NB_META, dropped))
    if type(out.get("nbformat_minor")) is not int or out["nbformat_minor"] < 0:
        out["nbformat_minor"] = minor if type(minor) is int else 5
    cells, unknown, repaired, seen, renamed = [], [], [], set(), 0
    release_types = {_nbgrader_meta(c).get("grade_id"): c.get("cell_type") for c in release.get("cells", [])}
    for cell in nb["cells"]:
        cell = dict(cell)
        meta = dict(cell["metadata"]) if isinstance(cell.get("metadata"), dict) else {}
        gid = _nbgrader_meta(cell).get("grade_id")
        if isinstance(gid, str) and gid not in seen and release_types.get(gid, cell["cell_type"]) != cell["cell_type"]:
            cell["cell_type"] = release_types[gid]  # turned into markdown or raw by a key press: as nbgrader does
            cell.pop("attachments", None)
        if "id" in cell and not (isinstance(cell["id"], str) and _CELL_ID.fullmatch(cell["id"])):
            cell["id"] = f"decodesched-{len(cells)}"  # one such id and nbformat refuses the whole notebook
            renamed += 1
        # a markdown cell's pasted images: nothing runs them, and 64 MiB of them made nbgrader's graded copy too big
        # to write ("File too large": `crashed`); a code cell has none in the schema
        cell.pop("attachments", None)
        dropped |= set(cell) - _CELL_KEYS[cell["cell_type"]] - {"outputs", "execution_count"}
        cell = {k: v for k, v in cell.items() if k in _CELL_KEYS[cell["cell_type"]] | {"outputs", "execution_count"}}
        meta = _schema_fit(meta, _CELL_META, dropped)
        if cell["cell_type"] == "code":
            if not isinstance(cell.get("outputs"), list):
                cell["outputs"] = []
            count = cell.get("execution_count")
            if "execution_count" not in cell or not (count is None or (type(count) is int and count >= 0)):
                cell["execution_count"] = None
        else:
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
        if "nbgrader" in meta:
            nbg = meta["nbgrader"] if isinstance(meta["nbgrader"], dict) else {}
            gid = nbg.get("grade_id")
            if isinstance(gid, str) and gid in seen:
                # a copy of a cell (duplicate cell, copy/paste): nbgrader refuses a grade_id twice ("Duplicate
                # grade id"); the solution's identical copy was graded once (`notebook.find_solution`), a test
                # cell's copy that differs is tamper evidence (`evidence.altered_cells`)
                del meta["nbgrader"]
            elif not isinstance(gid, str) or gid not in release_meta:
                # no cell of the release: nbgrader cannot place it, so it runs as the student's own cell
                del meta["nbgrader"]
                if gid is not None or nbg.get("grade") or nbg.get("solution") or nbg.get("locked"):
                    unknown.append(printable(str(gid))[:64])
            else:
                # the release's grading metadata, flags and points included: nbgrader puts back only some (a
                # test cell made a solution, the solution cell made a graded one, stopped it: `crashed`); its
                # checksum is the release's too (nbgrader's `OverwriteCells` writes it), the student's is kept
                ref = release_meta[gid]
                fixed = {**{k: v for k, v in ref.items() if k != "checksum"},
                         **{k: nbg[k] for k in ("checksum",) if k in nbg}}
                if fixed != nbg:
                    repaired.append(gid)
                meta["nbgrader"] = fixed
                seen.add(gid)
        cell["metadata"] = meta
        cells.append(cell)
    out["cells"] = cells
    notes = []
    if unknown:
        notes.append("cells with nbgrader metadata that the release does not have (copied from another notebook?) "
                     "ran as ordinary cells: grade_id " + ", ".join(sorted(set(unknown))))
    if repaired:
        notes.append("the nbgrader metadata of these cells differed from the release's (a key lost, another schema "
                     "version, a flag or points changed); nbgrader got the release's: "
                     + ", ".join(sorted(set(repaired))))
    if renamed:
        notes.append(f"{renamed} cell id(s) nbformat does not accept (1-64 letters, digits, - or _) were renamed in "
                     "nbgrader's copy")
    if dropped:
        notes.append("keys that nbformat's schema refuses (or of a shape it refuses) were left out of nbgrader's copy: "
                     + ", ".join(sorted(printable(str(k))[:64] for k in dropped)[:10]))
    return out, notes


@dataclass
class KernelReport:
    status: str = "graded"  # graded/timeout/crashed/memory
    tampered: list = field(default_factory=list)
    notes: list = field(default_factory=list)


def _autograde_once(sub: Submission, nb: dict, template: Path, workroot: Path, marker_prefix: str, limits: Limits,
                    server: sandbox.ForkServer | None):
    """One `nbgrader autograde` of `sub` (with a fresh canary) in a fresh private course, under the sandbox:
    (its private course folder, the canary's nonce, the sandbox's `Outcome`)."""
    course = Path(tempfile.mkdtemp(prefix=f"k-{sub.student_id}-", dir=workroot))
    shutil.copy2(template / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copy2(template / "gradebook.db", course / "gradebook.db")
    (course / "source" / spec.ASSIGNMENT).mkdir(parents=True)
    subdir = course / "submitted" / sub.student_id / spec.ASSIGNMENT
    subdir.mkdir(parents=True)
    nonce = uuid.uuid4().hex
    nb2 = json.loads(json.dumps(nb))
    nb2["cells"].append(canary_cell(nonce))
    (subdir / spec.NOTEBOOK).write_text(json.dumps(nb2))
    marker = f"{marker_prefix}{sub.student_id}-{nonce[:8]}"
    out = sandbox.run_isolated(
        _nbgrader_argv("autograde", spec.ASSIGNMENT, f"--student={sub.student_id}", "--force", "--log-level=WARN"),
        cwd=course, **{**limits.kwargs(), "max_output_bytes": 200_000}, address_space=False, marker=marker,
        server=server,
    )
    return course, nonce, out


def _kernel_died(err: str) -> bool:
    return "DeadKernel" in err or "Kernel died" in err


# the last line of a Python traceback, ``package.module.SomeError: what went wrong``
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)): (.+)$")


def _last_line(err: str) -> str:
    """What nbgrader's stderr says went wrong, in one line: the last exception it printed (nbgrader itself ends
    with "Please see the above traceback for details"), else its last line."""
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    for ln in reversed(lines):
        match = _EXCEPTION_LINE.match(ln)
        if match:
            return f"{match.group(1)}: {match.group(2)}"[:160]
    return lines[-1][:160] if lines else "nothing on stderr"


def kernel_run(sub: Submission, nb: dict, template: Path, workroot: Path, marker_prefix: str, limits: Limits,
               server: sandbox.ForkServer | None = None) -> KernelReport:
    """Real `nbgrader autograde` of one submission in a private course, under the sandbox (forked by
    `server`, a pre-started nbgrader, when given).

    When nbgrader's own process is ended by a signal that none of our limits sent, while its kernel
    was alive (seen rarely under load: an abort inside nbgrader's Jupyter stack), the submission is
    autograded once more in a fresh private course and that run's outcome stands; tamper evidence
    from the first run is kept.
    """
    rep = KernelReport()
    course, nonce, out = _autograde_once(sub, nb, template, workroot, marker_prefix, limits, server)
    err = out.stderr.decode("utf-8", "replace")
    if out.signal is not None and not (out.memory_exceeded or out.timed_out or _kernel_died(err)):
        rep.notes.append(f"kernel: nbgrader's process was ended by signal {out.signal} ({_last_line(err)}); "
                         "autograded again in a fresh run")
        rep.tampered += _tamper_evidence(out, course, sub)
        shutil.rmtree(course, ignore_errors=True)
        course, nonce, out = _autograde_once(sub, nb, template, workroot, marker_prefix, limits, server)
        err = out.stderr.decode("utf-8", "replace")
    if out.memory_exceeded:
        rep.status = "memory"
        rep.notes.append("kernel: " + "; ".join(out.notes or ["memory limit"]))
    elif out.timed_out:
        rep.status = "timeout"
        rep.notes.append("kernel: " + "; ".join(out.notes or ["time limit"]))
    elif out.signal is not None or out.returncode != 0:
        if "Timeout waiting for execute reply" in err or "CellTimeoutError" in err:
            # nbgrader gave up on a cell it could not interrupt (a loop in compiled code): a time limit,
            # whichever of nbgrader's give-up and our CPU limit comes first on this machine
            rep.status = "timeout"
            rep.notes.append("kernel: a cell ran past the per-cell time limit and could not be interrupted")
        else:
            rep.status = "crashed"
            why = "the kernel died" if _kernel_died(err) else "nbgrader autograde failed"
            rep.notes.append(f"kernel: {why} (exit {out.returncode}, signal {out.signal}: {_last_line(err)})")
    if out.leftovers_killed:
        rep.notes.append("kernel: leftover processes killed after the run")  # (how many: the run's timing)
    graded_nb = course / "autograded" / sub.student_id / spec.ASSIGNMENT / spec.NOTEBOOK
    executed, unread = None, "kernel: nbgrader wrote no graded notebook"
    if _plain_file(graded_nb, MAX_AUTOGRADED_BYTES):
        with contextlib.suppress(ValueError, UnicodeDecodeError, RecursionError, OSError):
            data = graded_nb.read_bytes()
            # the file is in the run's folder, the student's code can write it (and keep nbgrader from writing it):
            # 64 MiB of `[],` parsed took the grading process 1.5 GB
            items = too_many_values(data)
            if items:
                unread = (f"kernel: the graded notebook holds up to {items:,} JSON values (outputs?), over the "
                          f"{MAX_BIG_NOTEBOOK_ITEMS:,} read; it was not read")
            else:
                with big_parse(data):
                    executed = json.loads(data.decode("utf-8"))
                if not isinstance(executed, dict) or not isinstance(executed.get("cells"), list):
                    executed = None
    if executed is not None and rep.status == "graded":
        errors = _error_outputs(executed)
        names = {str(o.get("ename")) for _, o in errors}
        if "MemoryError" in names:
            rep.status = "memory"
            rep.notes.append("kernel: a cell ran out of memory")
        elif CELL_TIMEOUT_ENAME in names:
            rep.status = "timeout"
            rep.notes.append("kernel: a cell ran past the per-cell time limit and was interrupted")
        elif names & {"DeadKernelError"}:
            rep.status = "crashed"
            rep.notes.append("kernel: the kernel died")
        # The canary: the last cell must have printed the expected line and failed its assert.
        canary = [c for c in executed["cells"] if isinstance(c, dict) and CANARY_TAG in _safe_source(c)]
        if canary and rep.status == "graded":
            outs = cell_outputs(canary[-1])
            text = "".join(_safe_text(o.get("text")) for o in outs if o.get("output_type") == "stream")
            errs = [o for o in outs if o.get("output_type") == "error"]
            if _canary_expected(nonce) not in text:
                rep.tampered.append("the kernel's builtins or comparisons were altered (canary output forged)")
            if not errs or errs[0].get("ename") != "AssertionError" or nonce not in str(errs[0].get("evalue")):
                rep.tampered.append("a failing assert passed in the kernel (asserts were dropped or rewritten)")
        elif not canary and rep.status == "graded":
            rep.tampered.append("the canary cell was removed from the executed notebook")
    elif executed is None and rep.status == "graded":
        rep.status = "crashed"
        rep.notes.append(unread)
    rep.tampered += [t for t in _tamper_evidence(out, course, sub) if t not in rep.tampered]
    shutil.rmtree(course, ignore_errors=True)
    return rep


def _tamper_evidence(out: sandbox.Outcome, course: Path, sub: Submission) -> list:
    """What one autograde run left as tamper evidence: writes into protected folders, and (for a run
    that was not stopped by a limit) a private gradebook changed beyond what nbgrader writes."""
    found = []
    if out.protected_writes:
        found.append("wrote into protected folders: " + ", ".join(out.protected_writes[:3]))
    if not out.memory_exceeded and not out.timed_out:
        found += _inspect_gradebook_copy(course / "gradebook.db", sub.student_id, course.parent)  # (workroot)
    return found
