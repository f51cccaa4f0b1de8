"""The grade run: `decodesched grade SUBMISSIONS --out DIR`.

For every submission, in parallel (``jobs`` worker threads, each driving sandboxed processes):

1. **Intake.** SUBMISSIONS is a folder of ``<student_id>.ipynb`` files, or nbgrader's
   ``submitted/<student>/<assignment>/<assignment>.ipynb`` tree (SUBMISSIONS may be the course root
   holding ``submitted/`` or the ``submitted`` folder itself). The notebook is parsed as JSON with
   strict checks (size, nbformat 4, cells, exactly one code cell with grade_id
   ``scheduler_solution``); the student id must be a plain name.
2. **Verdict** (the score). The solution cell's source is run by `grader.checks.verdict_for_source`
   in a fresh ``python -I -S`` child under `grader.sandbox.run_isolated`; observations come back as
   strictly typed JSON and are judged here, in the grading process, against the reference model.
   Nothing the student's kernel does can change this number.
3. **nbgrader** (the workflow and evidence). Real ``nbgrader autograde`` runs on the submission in a
   private temporary course: a gradebook generated from the *release* notebook (so no hidden test
   source, no solutions, no other students), our ``nbgrader_config.py`` (``c.Execute.timeout`` per
   cell), and the submission with one extra *canary* cell appended. The whole nbgrader process and
   its kernel run under the sandbox (wall clock, CPU, memory; every process killed at the end, found
   by process group, private uid and an environment marker). Its results are used only as evidence.
4. **Status** (one word per submission), decided from both runs:

   ========  ==========================================================================================
   graded    everything ran normally.
   timeout   a wall-clock or CPU limit was hit, in the verdict child or in the kernel (including a
             cell that nbgrader had to interrupt).
   crashed   a process died: ``os._exit``, a segfault, a dead kernel, nbgrader aborting.
   memory    the memory limit was hit (resident-memory watchdog, or MemoryError under the
             address-space limit).
   tampered  evidence of cheating: results of the wrong type (objects that fake ``==``), locked or
             test cells altered (compared with the release notebook and nbgrader's checksums), the
             gradebook copy written by the student's code (manual scores, extra credit), files written
             into protected folders (the hidden output, submissions, course or repository folders are
             writable traps in the kernel's private mount namespace, as root), a canary cell
             whose failing ``assert`` passed or whose output was forged (assert-dropping input/AST
             transformers, patched ``builtins``), the verdict child reporting replaced builtins or
             forged output, or plain signs in the student's code cells (assigning to ``builtins``,
             registering IPython transformers, naming the gradebook file; see `static_evidence`).
   invalid   not a readable notebook, no (or more than one) solution cell, or a bad student id.
   ========  ==========================================================================================

   Precedence when several apply: invalid, tampered, memory, timeout, crashed, graded.
5. **Score.** Always the verdict's: the points of the cells the verdict child passed. For
   ``timeout``/``crashed``/``memory`` that is what the child earned before it died: the harness
   writes each scenario's observations as soon as they exist and ``checks`` runs the scenarios in
   groups, so a hang or crash loses only the points of the cells it could not finish. A cheat earns
   nothing extra: a tampered submission keeps only what its honest code earned in the verdict child,
   where fake objects count as wrong answers.
6. **Outputs**, written only after every sandboxed process has ended: ``DIR/grades.csv``
   (``student_id, score, max_score, status`` and one column per graded cell, sorted by student id),
   ``DIR/feedback/<student_id>.html`` (from verdict lines only: no hidden test source, no hidden
   tracebacks), and the instructor's gradebook (``COURSE/gradebook.db``): each graded cell's
   ``auto_score`` set to the verdict, ``manual_score`` cleared, so ``nbgrader export`` agrees with
   grades.csv. Regrading the same folder gives the same grades.csv.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import csv
import hashlib
import html
import io
import json
import os
import re
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from decodesched._io import Progress, atomic_writer
from decodesched.errors import UserError

from . import sandbox, spec

STATUSES = ("graded", "timeout", "crashed", "memory", "tampered", "invalid")
PRECEDENCE = ("invalid", "tampered", "memory", "timeout", "crashed", "graded")
STUDENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")
MAX_NOTEBOOK_BYTES = 20 * 1024 * 1024
MAX_AUTOGRADED_BYTES = 64 * 1024 * 1024
CANARY_TAG = "decodesched-grader-canary"


# ----------------------------------------------------------------------------- data
@dataclass
class Submission:
    student_id: str
    path: Path | None
    problem: str | None = None  # set when the entry is unusable (bad id, missing notebook)


@dataclass
class Result:
    student_id: str
    status: str
    score: float
    max_score: float
    cells: dict  # grade_id -> score
    lines: dict  # grade_id -> [feedback lines]
    notes: list = field(default_factory=list)  # status reasons, shown in the feedback
    seconds: float = 0.0


class InvalidSubmission(Exception):
    pass


@dataclass
class Options:
    timeout_s: float = 120.0
    memory_mb: int = 1024
    jobs: int = 0
    cell_timeout_s: float | None = None
    run_nbgrader: bool = True
    progress: bool | None = None
    marker_prefix: str = "grade-"  # sandbox marker of the kernel runs; grade() makes it unique per output folder

    def cell_timeout(self) -> int:
        if self.cell_timeout_s:
            return max(1, int(self.cell_timeout_s))
        return max(2, min(30, int(self.timeout_s / 3)))


# ----------------------------------------------------------------------------- intake
def collect_submissions(folder) -> list[Submission]:
    """The submissions in `folder`, in either layout, sorted by student id."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder of submissions")
    root = folder / "submitted" if (folder / "submitted").is_dir() else folder
    subs: dict[str, Submission] = {}
    flat = sorted(p for p in root.iterdir() if p.is_file() and p.suffix == ".ipynb")
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    for p in flat:
        sid = p.stem
        subs[sid] = Submission(sid, p, None if STUDENT_ID_RE.match(sid) else "the student id is not a plain name")
    for d in dirs:
        sid = d.name
        if sid in subs:
            subs[sid] = Submission(sid, None, "two submissions for the same student")
            continue
        nb = d / spec.ASSIGNMENT / spec.NOTEBOOK
        if not STUDENT_ID_RE.match(sid):
            subs[sid] = Submission(sid, None, "the student id is not a plain name")
        elif not nb.is_file():
            if not (d / spec.ASSIGNMENT).is_dir():
                continue  # a folder of something else (another assignment)
            subs[sid] = Submission(sid, None, f"no {spec.ASSIGNMENT}/{spec.NOTEBOOK} in the submission")
        else:
            subs[sid] = Submission(sid, nb)
    if not subs:
        raise UserError(f"{folder}: no submissions (expected <student_id>.ipynb files or submitted/<student>/{spec.ASSIGNMENT}/)")
    return [subs[k] for k in sorted(subs)]


def _cell_source(cell) -> str:
    src = cell.get("source", "")
    if isinstance(src, list):
        if not all(type(s) is str for s in src):
            raise InvalidSubmission("a cell's source is not text")
        return "".join(src)
    if type(src) is not str:
        raise InvalidSubmission("a cell's source is not text")
    return src


def _nbgrader_meta(cell) -> dict:
    meta = cell.get("metadata")
    if not isinstance(meta, dict):
        return {}
    nbg = meta.get("nbgrader")
    return nbg if isinstance(nbg, dict) else {}


def load_notebook(path: Path) -> dict:
    """Parse a notebook with strict checks; raise InvalidSubmission with a reason."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InvalidSubmission(f"cannot read the notebook: {exc.strerror}") from None
    if size > MAX_NOTEBOOK_BYTES:
        raise InvalidSubmission(f"the notebook is {size / 2**20:.0f} MiB (limit {MAX_NOTEBOOK_BYTES / 2**20:.0f} MiB)")
    try:
        nb = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidSubmission("not a readable notebook (invalid JSON)") from None
    if not isinstance(nb, dict) or nb.get("nbformat") != 4 or not isinstance(nb.get("cells"), list):
        raise InvalidSubmission("not a Jupyter notebook in nbformat 4")
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            raise InvalidSubmission("a cell is malformed")
        _cell_source(cell)
    return nb


def solution_source(nb: dict) -> str:
    sols = [c for c in nb["cells"] if _nbgrader_meta(c).get("grade_id") == spec.SOLUTION_CELL]
    if not sols:
        raise InvalidSubmission(f"no solution cell (the code cell with grade_id '{spec.SOLUTION_CELL}')")
    if len(sols) > 1:
        raise InvalidSubmission(f"{len(sols)} cells claim to be the solution cell '{spec.SOLUTION_CELL}'")
    if sols[0].get("cell_type") != "code":
        raise InvalidSubmission("the solution cell is not a code cell")
    return _cell_source(sols[0])


def _norm(src: str) -> str:
    return "\n".join(line.rstrip() for line in src.replace("\r\n", "\n").strip().split("\n"))


def altered_cells(nb: dict, release: dict) -> list[str]:
    """Locked and test cells of the release that the submission changed (tamper evidence).

    A cell deleted by mistake is not evidence (nbgrader puts graded cells back); a cell that is
    present with other source, another type, or other grading metadata is.
    """
    try:
        from nbgrader.utils import compute_checksum
        from nbformat import from_dict
    except ImportError:  # pragma: no cover - nbgrader is a grader dependency
        compute_checksum = None
    protected = {}
    for cell in release["cells"]:
        meta = _nbgrader_meta(cell)
        gid = meta.get("grade_id")
        if gid and gid != spec.SOLUTION_CELL and (meta.get("locked") or meta.get("grade")):
            protected[gid] = cell
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
        same = (
            cell.get("cell_type") == ref.get("cell_type")
            and _norm(_cell_source(cell)) == _norm(_cell_source(ref))
            and bool(meta.get("grade")) == bool(rmeta.get("grade"))
            and meta.get("points") == rmeta.get("points")
            and bool(meta.get("locked")) == bool(rmeta.get("locked"))
        )
        if same and compute_checksum is not None and "checksum" in meta:
            # nbgrader's own check: the stored checksum must match the cell as submitted
            with contextlib.suppress(Exception):
                same = compute_checksum(from_dict(cell)) == rmeta.get("checksum", meta["checksum"])
        if not same:
            altered.append(gid)
    altered += [g for g, n in seen.items() if n > 1 and g not in altered]
    return sorted(altered)


_AST_LOCK = threading.Lock()
_TRANSFORMER_ATTRS = {"ast_transformers", "input_transformers_post", "input_transformers_cleanup",
                      "input_transformer_manager", "input_splitter", "register_magic_function"}


def static_evidence(sources) -> list[str]:
    """Plain signs of cheating in the student's own code cells (parsed, never run).

    Assigning to attributes of ``builtins``, registering IPython input/AST transformers, or naming
    the gradebook file has no place in a scheduler. Obfuscated variants are not caught here; they
    are caught by their effects (canary, gradebook copy, strict verdict types) or earn nothing.
    """
    import ast

    found = set()
    for source in sources:
        text = "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))
        try:
            with _AST_LOCK:  # CPython 3.11's ast.parse is not thread-safe ("recursion depth mismatch")
                tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        names = {"builtins", "__builtins__"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.asname or a.name for a in node.names if a.name == "builtins"}

        def is_builtins(expr) -> bool:
            if isinstance(expr, ast.Name) and expr.id in names:
                return True
            if isinstance(expr, ast.Attribute) and expr.attr == "__dict__":
                return is_builtins(expr.value)
            if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "vars" and expr.args:
                return is_builtins(expr.args[0])
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
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "gradebook" in node.value.lower():
                found.add("the code looks for the nbgrader gradebook")
    return sorted(found)


def student_code_cells(nb: dict) -> list[str]:
    """Sources of the code cells the student wrote: the solution cell and cells without grading metadata."""
    out = []
    for cell in nb["cells"]:
        meta = _nbgrader_meta(cell)
        if cell.get("cell_type") != "code":
            continue
        if meta.get("grade_id") == spec.SOLUTION_CELL or not (meta.get("grade") or meta.get("locked")):
            out.append(_cell_source(cell))
    return out


# ----------------------------------------------------------------------------- the course
@dataclass
class Course:
    root: Path
    release_nb_path: Path
    release: dict
    gradebook: Path


def open_course(course_root) -> Course:
    root = Path(course_root or spec.COURSE_ROOT).resolve()
    release = root / "release" / spec.ASSIGNMENT / spec.NOTEBOOK
    gradebook = root / "gradebook.db"
    if not (root / "nbgrader_config.py").is_file():
        raise UserError(f"{root}: not an nbgrader course (no nbgrader_config.py)")
    if not release.is_file() or not gradebook.is_file():
        raise UserError(f"{root}: the assignment is not built; run `decodesched assignment build --course {root}` first")
    try:
        rel = load_notebook(release)
    except InvalidSubmission as exc:
        raise UserError(f"{release}: {exc}") from None
    return Course(root, release, rel, gradebook)


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
"""


def build_template(course: Course, workroot: Path, options: Options) -> Path:
    """A private course whose gradebook holds only the release (no hidden tests, no students).

    It starts from a copy of the instructor's gradebook (made by `nbgrader generate_assignment`),
    removes every student, and replaces every stored cell source with the release version, so the
    hidden tests that nbgrader keeps in the gradebook never reach a student's kernel.
    """
    from nbgrader.api import Gradebook, MissingEntry

    tpl = workroot / "template"
    (tpl / "source" / spec.ASSIGNMENT).mkdir(parents=True)
    (tpl / "nbgrader_config.py").write_text(NBGRADER_CONFIG.format(root=".", cell_timeout=options.cell_timeout()))
    db = tpl / "gradebook.db"
    shutil.copyfile(course.gradebook, db)
    release_cells = {}
    for cell in course.release["cells"]:
        gid = _nbgrader_meta(cell).get("grade_id")
        if isinstance(gid, str):
            release_cells[gid] = cell
    notebook = spec.NOTEBOOK[: -len(".ipynb")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook(f"sqlite:///{db}") as gb:
            try:
                nb = gb.find_notebook(notebook, spec.ASSIGNMENT)
            except MissingEntry:
                raise UserError(f"{course.gradebook}: the assignment {spec.ASSIGNMENT} is not in the gradebook; "
                                "run `decodesched assignment build` first") from None
            for student in list(gb.students):
                gb.remove_student(student.id)
            for sc in nb.source_cells:
                rel = release_cells.get(sc.name)
                sc.source = _cell_source(rel) if rel is not None else ""
                if rel is not None and _nbgrader_meta(rel).get("checksum"):
                    sc.checksum = _nbgrader_meta(rel)["checksum"]
            gb.db.commit()
    con = sqlite3.connect(db)
    try:
        con.execute("VACUUM")  # no deleted hidden-test text left in free pages
    finally:
        con.close()
    return tpl


def canary_cell(nonce: str) -> dict:
    src = (
        f"# {CANARY_TAG}: checks that asserts, comparisons and builtins still work in this kernel\n"
        f"print({nonce!r}, 1 == 2, [3, 1, 2] == [3, 1, 2], sorted([3, 1, 2]), len('abc'), isinstance(1, int), "
        f"isinstance('a', int), type(True).__name__, str(7), abs(-2))\n"
        f"assert 1 == 2, {nonce!r}\n"
    )
    return {"cell_type": "code", "execution_count": None, "id": "decodesched-canary", "metadata": {},
            "outputs": [], "source": src}


def _canary_expected(nonce: str) -> str:
    return f"{nonce} False True [1, 2, 3] 3 True False bool 7 2"


# ----------------------------------------------------------------------------- one submission
@dataclass
class KernelReport:
    status: str = "graded"  # graded/timeout/crashed/memory
    tampered: list = field(default_factory=list)
    notes: list = field(default_factory=list)


def _error_outputs(nb) -> list[tuple[int, dict]]:
    out = []
    for i, cell in enumerate(nb.get("cells", [])):
        if not isinstance(cell, dict):
            continue
        for o in cell.get("outputs", []) or []:
            if isinstance(o, dict) and o.get("output_type") == "error":
                out.append((i, o))
    return out


def _inspect_gradebook_copy(db: Path, student_id: str) -> list[str]:
    """Evidence that code other than nbgrader wrote to the private gradebook copy."""
    evidence = []
    if not _plain_file(db, 256 * 1024 * 1024):
        return ["the gradebook copy was deleted or replaced"]
    snap = db.with_name("inspect.db")
    try:
        shutil.copyfile(db, snap)
        con = sqlite3.connect(f"file:{snap}?mode=ro", uri=True)
        try:
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
        evidence.append(f"the gradebook copy was damaged ({exc.__class__.__name__})")
    return evidence


def kernel_run(sub: Submission, nb: dict, template: Path, workroot: Path, options: Options, limits: sandbox.Limits) -> KernelReport:
    """Real `nbgrader autograde` of one submission in a private course, under the sandbox."""
    rep = KernelReport()
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
    marker = f"{options.marker_prefix}{sub.student_id}-{nonce[:8]}"
    out = sandbox.run_isolated(
        _nbgrader_argv("autograde", spec.ASSIGNMENT, f"--student={sub.student_id}", "--force", "--log-level=WARN"),
        cwd=course,
        timeout_s=limits.timeout_s,
        cpu_s=limits.cpu_s,
        memory_mb=limits.memory_mb,
        max_output_bytes=200_000,
        hide=limits.hide,
        address_space=False,
        marker=marker,
    )
    if out.memory_exceeded:
        rep.status = "memory"
        rep.notes.append("kernel: " + "; ".join(out.notes or ["memory limit"]))
    elif out.timed_out:
        rep.status = "timeout"
        rep.notes.append("kernel: " + "; ".join(out.notes or ["time limit"]))
    elif out.signal is not None or out.returncode != 0:
        rep.status = "crashed"
        err = out.stderr.decode("utf-8", "replace")
        why = "the kernel died" if ("DeadKernel" in err or "Kernel died" in err) else "nbgrader autograde failed"
        rep.notes.append(f"kernel: {why} (exit {out.returncode}, signal {out.signal})")
    if out.protected_writes:
        rep.tampered.append("wrote into protected folders: " + ", ".join(out.protected_writes[:3]))
    if out.leftovers_killed:
        rep.notes.append(f"kernel: {out.leftovers_killed} leftover process(es) killed after the run")
    graded_nb = course / "autograded" / sub.student_id / spec.ASSIGNMENT / spec.NOTEBOOK
    executed = None
    if _plain_file(graded_nb, MAX_AUTOGRADED_BYTES):
        with contextlib.suppress(ValueError, UnicodeDecodeError, RecursionError, OSError):
            executed = json.loads(graded_nb.read_bytes().decode("utf-8"))
            if not isinstance(executed, dict) or not isinstance(executed.get("cells"), list):
                executed = None
    if executed is not None and rep.status == "graded":
        errors = _error_outputs(executed)
        names = {str(o.get("ename")) for _, o in errors}
        if "MemoryError" in names:
            rep.status = "memory"
            rep.notes.append("kernel: a cell ran out of memory")
        elif names & {"KeyboardInterrupt", "CellTimeoutError", "TimeoutError"}:
            rep.status = "timeout"
            rep.notes.append("kernel: a cell ran past the per-cell time limit and was interrupted")
        elif names & {"DeadKernelError"}:
            rep.status = "crashed"
            rep.notes.append("kernel: the kernel died")
        # The canary: the last cell must have printed the expected line and failed its assert.
        canary = [c for c in executed["cells"] if isinstance(c, dict) and CANARY_TAG in _safe_source(c)]
        if canary and rep.status == "graded":
            outs = [o for o in canary[-1].get("outputs", []) or [] if isinstance(o, dict)]
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
        rep.notes.append("kernel: nbgrader wrote no graded notebook")
    if not out.memory_exceeded and not out.timed_out:
        rep.tampered += _inspect_gradebook_copy(course / "gradebook.db", sub.student_id)
    shutil.rmtree(course, ignore_errors=True)
    return rep


def _plain_file(path: Path, max_bytes: int) -> bool:
    """A regular file (not a link, FIFO or device the student planted), not too big, under a real folder."""
    import stat as _stat

    try:
        st = os.lstat(path)
        parent_real = os.path.realpath(path.parent) == os.path.abspath(path.parent)
    except OSError:
        return False
    return _stat.S_ISREG(st.st_mode) and st.st_size <= max_bytes and parent_real


def _safe_source(cell) -> str:
    try:
        return _cell_source(cell)
    except InvalidSubmission:
        return ""


def _safe_text(t) -> str:
    if isinstance(t, list):
        return "".join(x for x in t if isinstance(x, str))
    return t if isinstance(t, str) else ""


def _zero_cells():
    return {c.grade_id: 0.0 for c in spec.CELLS}


def grade_one(sub: Submission, course: Course, template: Path, workroot: Path, options: Options, limits: sandbox.Limits) -> Result:
    from . import checks

    start = time.monotonic()
    base = dict(student_id=sub.student_id, max_score=float(spec.MAX_SCORE))
    if sub.problem:
        return Result(status="invalid", score=0.0, cells=_zero_cells(), lines={}, notes=[sub.problem], **base)
    try:
        nb = load_notebook(sub.path)
        source = solution_source(nb)
    except InvalidSubmission as exc:
        return Result(status="invalid", score=0.0, cells=_zero_cells(), lines={}, notes=[str(exc)], **base)

    tampered, notes = [], []
    altered = altered_cells(nb, course.release)
    if altered:
        tampered.append("locked or test cells were altered: " + ", ".join(altered))
    tampered += static_evidence(student_code_cells(nb))

    # The kernel run mostly waits (nbgrader and kernel start-up), so it overlaps with the verdict.
    kernel = None
    if options.run_nbgrader:
        kernel = cf.ThreadPoolExecutor(1, thread_name_prefix=f"kernel-{sub.student_id}")
        kernel_future = kernel.submit(kernel_run, sub, nb, template, workroot, options, limits)
    try:
        verdict = checks.verdict_for_source(
            source, limits={"timeout_s": limits.timeout_s, "cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb},
            hide=limits.hide,
        )
    finally:
        rep = kernel_future.result() if kernel is not None else None
        if kernel is not None:
            kernel.shutdown()
    vstatus = verdict.status if verdict.status in STATUSES else "crashed"
    notes += [str(n) for n in (verdict.notes or [])]
    statuses = {vstatus}
    if vstatus == "tampered":
        tampered.append("the solution returned objects of the wrong type or forged its results")
        statuses.discard("tampered")
    if rep is not None:
        statuses.add(rep.status)
        tampered += rep.tampered
        notes += rep.notes
    if tampered:
        statuses.add("tampered")
        notes = [f"tamper evidence: {t}" for t in tampered] + notes
    status = next(s for s in PRECEDENCE if s in statuses or (s == "graded"))
    cells, lines = {}, {}
    for c in spec.CELLS:
        cv = verdict.cells.get(c.grade_id)
        score = float(cv.score) if cv is not None else 0.0
        cells[c.grade_id] = round(min(max(score, 0.0), float(c.points)), 4)
        lines[c.grade_id] = [str(x) for x in (cv.lines if cv is not None else [])]
    return Result(status=status, score=round(sum(cells.values()), 4), cells=cells, lines=lines, notes=notes,
                  seconds=time.monotonic() - start, **base)


# ----------------------------------------------------------------------------- outputs
def _fmt(x: float) -> str:
    return f"{x:g}"


def grades_csv_text(results: list[Result]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["student_id", "score", "max_score", "status", *spec.CELL_IDS])
    for r in sorted(results, key=lambda r: r.student_id):
        w.writerow([r.student_id, _fmt(r.score), _fmt(r.max_score), r.status, *(_fmt(r.cells[c]) for c in spec.CELL_IDS)])
    return buf.getvalue()


def feedback_html(r: Result) -> str:
    e = html.escape
    rows = []
    for c in spec.CELLS:
        lines = r.lines.get(c.grade_id) or []
        items = "".join(f"<li>{e(line)}</li>" for line in lines)
        kind = "hidden" if c.hidden else "visible"
        rows.append(
            f"<tr><td>{e(c.title)}</td><td>{e(c.todo)}</td><td>{kind}</td>"
            f"<td>{_fmt(r.cells[c.grade_id])} / {c.points}</td><td><ul>{items}</ul></td></tr>"
        )
    notes = "".join(f"<li>{e(n)}</li>" for n in r.notes)
    return (
        "<!DOCTYPE html>\n<html lang=\"zh\"><head><meta charset=\"utf-8\">"
        f"<title>{e(spec.ASSIGNMENT)} - {e(r.student_id)}</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top}</style>"
        "</head><body>\n"
        f"<h1>{e(spec.ASSIGNMENT)}: {e(r.student_id)}</h1>\n"
        f"<p>得分 Score: <b>{_fmt(r.score)} / {_fmt(r.max_score)}</b> &nbsp; 状态 Status: <b>{e(r.status)}</b></p>\n"
        + (f"<ul class=\"notes\">{notes}</ul>\n" if notes else "")
        + "<table><tr><th>测试 Test</th><th>TODO</th><th></th><th>分数 Points</th><th>反馈 Feedback</th></tr>\n"
        + "\n".join(rows)
        + "\n</table>\n</body></html>\n"
    )


def update_gradebook(course: Course, results: list[Result]) -> None:
    """Write the verdicts into the instructor's gradebook, so `nbgrader export` agrees."""
    from nbgrader.api import Gradebook, MissingEntry

    with warnings.catch_warnings(), Gradebook(f"sqlite:///{course.gradebook}") as gb:
        warnings.simplefilter("ignore")  # nbgrader's add_submission trips SQLAlchemy autoflush warnings
        gb.find_assignment(spec.ASSIGNMENT)
        for r in sorted(results, key=lambda r: r.student_id):
            if not STUDENT_ID_RE.match(r.student_id):
                continue
            gb.update_or_create_student(r.student_id)
            try:
                gb.find_submission(spec.ASSIGNMENT, r.student_id)
            except MissingEntry:
                gb.add_submission(spec.ASSIGNMENT, r.student_id)
            for c in spec.CELLS:
                try:
                    grade = gb.find_grade(c.grade_id, spec.NOTEBOOK[:-6], spec.ASSIGNMENT, r.student_id)
                except MissingEntry:
                    continue
                grade.auto_score = r.cells[c.grade_id]
                grade.manual_score = None
                grade.extra_credit = None
                grade.needs_manual_grade = False
            gb.db.commit()


# ----------------------------------------------------------------------------- the run
def default_hide(course: Course, submissions: Path, out_dir: Path) -> tuple:
    """Paths the untrusted code must not see, each a writable trap (writes there are tamper evidence):
    the course, the submissions and the output folder.  Everything else outside the system folders
    is covered anyway when running as root (`sandbox.covered_dirs`)."""
    hide = {course.root, Path(submissions).resolve(), Path(out_dir).resolve()}
    return tuple(sorted(str(p) for p in hide))


def marker_prefix(out_dir) -> str:
    """The sandbox-marker prefix of every kernel run that grades into `out_dir` (tests look for leftovers)."""
    return "grade-" + hashlib.sha256(str(Path(out_dir).resolve()).encode()).hexdigest()[:10] + "-"


def grade(submissions, out_dir, *, course=None, options: Options | None = None) -> list[Result]:
    options = options or Options()
    options.marker_prefix = marker_prefix(out_dir)
    course_obj = open_course(course)
    subs = collect_submissions(submissions)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = options.jobs or os.cpu_count() or 1
    limits = sandbox.Limits(
        timeout_s=options.timeout_s, cpu_s=options.timeout_s, memory_mb=options.memory_mb,
        hide=default_hide(course_obj, Path(submissions), out_dir),
    )
    workroot = Path(tempfile.mkdtemp(prefix="decodesched-grade-")).resolve()
    os.chmod(workroot, 0o711)  # private uids must reach their own folder, but list nothing
    results: list[Result] = []
    try:
        template = build_template(course_obj, workroot, options) if options.run_nbgrader else workroot
        with Progress(len(subs), "grading", enabled=options.progress) as bar, cf.ThreadPoolExecutor(jobs) as pool:
            futs = {pool.submit(_grade_safely, s, course_obj, template, workroot, options, limits): s for s in subs}
            for fut in cf.as_completed(futs):
                results.append(fut.result())
                bar.advance()
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    results.sort(key=lambda r: r.student_id)
    fb = out_dir / "feedback"
    fb.mkdir(exist_ok=True)
    for r in results:
        if STUDENT_ID_RE.match(r.student_id):
            with atomic_writer(fb / f"{r.student_id}.html") as fh:
                fh.write(feedback_html(r))
    update_gradebook(course_obj, results)
    with atomic_writer(out_dir / "grades.csv") as fh:
        fh.write(grades_csv_text(results))
    return results


def _grade_safely(sub, course, template, workroot, options, limits) -> Result:
    """One student's failure never stops the run: an unexpected grader error is reported as crashed."""
    try:
        return grade_one(sub, course, template, workroot, options, limits)
    except Exception as exc:  # noqa: BLE001
        import traceback

        print(f"decodesched grade: internal error while grading {sub.student_id}:\n{traceback.format_exc()}",
              file=sys.stderr)
        return Result(sub.student_id, "crashed", 0.0, float(spec.MAX_SCORE), _zero_cells(), {},
                      [f"grader error: {exc.__class__.__name__}: {exc}"])
