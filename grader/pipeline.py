"""The grade run: `decodesched grade SUBMISSIONS --out DIR`, one job per module.

For every submission, in parallel (``2 jobs`` worker threads, each driving sandboxed processes; ``jobs`` verdict
children and ``jobs`` kernel runs at a time, `Slots`):

1. **Intake** (`grader.notebook`): the submissions of the folder, each notebook parsed strictly.
2. **Evidence** (`grader.evidence`): locked or test cells altered, plain signs of cheating in the
   student's own code cells.
3. **Verdict** (`grader.verdict`; the score): the solution cell's source runs in a fresh
   ``python -I -S`` child under `grader.sandbox` (`grader.observe`); observations come back as
   strictly typed JSON and are judged in the grading process against the reference model
   (`grader.scenarios`, `grader.compare`, `grader.shrink`). Nothing the student's kernel does can
   change this number.
4. **nbgrader** (`grader.autograde`; workflow and evidence), overlapped with the verdict: real
   ``nbgrader autograde`` in a private course that holds only the release, with a canary cell.
5. **Status** (`grader.status`): one word from both runs; precedence invalid, tampered, memory,
   timeout, crashed, graded. Limits are CPU time (`grader.limits`), so a busy machine grades the same.
6. **Score**: always the verdict's, the points of the cells the verdict child passed. For
   ``timeout``/``crashed``/``memory`` that is what the child earned before it died; a tampered
   submission keeps only what its honest code earned in the verdict child.
7. **Outputs** (`grader.outputs`, `grader.feedback`), written only after every sandboxed process has
   ended: ``DIR/grades.csv`` (``student_id, score, max_score, status`` and one column per graded
   cell, sorted by student id; no cell starts a spreadsheet formula: `outputs.csv_cell`; a student of the course's
   roster who handed in nothing is a row ``missing``, 0 points: `missing_rows`),
   ``DIR/feedback/<student_id>.html`` (from verdict lines only: no
   hidden test source, no hidden tracebacks), and the instructor's gradebook (``COURSE/gradebook.db``),
   so ``nbgrader export`` agrees with grades.csv (written by the fork server, which has nbgrader
   imported already), all together (`_commit`). Regrading the same folder gives the same grades.csv; a folder
   of some students graded into an earlier --out keeps the others' rows (`earlier_rows`).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from decodesched._io import Progress, atomic_writer, folders_locked, from_interrupt, output_group, signals_held
from decodesched.errors import UserError

from . import spec
from .autograde import build_template, for_nbgrader, kernel_run, warm_server
from .course import Course, hand_graded, open_course, unsubmitted
from .evidence import altered_cells, restore_earlier_release, restore_protected, static_evidence
from .limits import Limits, load_factor
from .observe import package_paths
from .notebook import (InvalidSubmission, Submission, collect_submissions, find_solution, is_plain_id, load_notebook,
                       printable, student_code_cells, submissions_root, submitted_at)
from .feedback import feedback_html
from .resume import Resume
from .outputs import grades_csv_text, preload_gradebook, update_gradebook
from . import sandbox
from .sandbox import ForkServer
from .status import decide
from .verdict import verdict_for_source


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
    pictures: dict = field(default_factory=dict)  # grade_id -> verdict.schedule_picture of its first failure
    timestamp: str | None = None  # nbgrader's timestamp.txt of the submission (`notebook.submitted_at`)


@dataclass
class Options:
    timeout_s: float = 120.0
    memory_mb: int = 1024
    jobs: int = 0
    cell_timeout_s: float | None = None
    run_nbgrader: bool = True
    progress: bool | None = None
    regrade: bool = False  # take no kept grading of an earlier grading that stopped (`grader.resume`)
    marker_prefix: str = "grade-"  # sandbox marker of the kernel runs; grade() makes it unique per output folder

    def cell_timeout(self) -> int:
        """nbgrader's per-cell timeout (wall clock, its only kind): stretched by the measured load, so that
        an honest cell on a busy machine is never interrupted; runaway cells are stopped on CPU time."""
        base = self.cell_timeout_s or max(2.0, min(30.0, self.timeout_s / 3))
        return max(1, int(base * load_factor()))


def _zero_cells():
    return {c.grade_id: 0.0 for c in spec.CELLS}


@dataclass
class Slots:
    """What `--jobs N` bounds: N verdict children and N kernel runs at a time. `_grade_all` runs 2 N submissions at
    once, so that while one waits for a kernel slot (or for the fork server's warm-up, at the start) the verdict of
    another goes on: before, a thread whose verdict had ended held its slot idle until its kernel run was done."""
    verdict: threading.Semaphore
    kernel: threading.Semaphore

    @classmethod
    def of(cls, jobs: int) -> Slots:
        return cls(threading.Semaphore(jobs), threading.Semaphore(jobs))


def grade_one(sub: Submission, course: Course, template: cf.Future, workroot: Path, options: Options, limits: Limits,
              server=None, slots: Slots | None = None) -> Result:
    slots = slots or Slots.of(1)
    start = time.monotonic()
    base = dict(student_id=sub.student_id, max_score=float(spec.MAX_SCORE))
    if sub.problem:
        return Result(status="invalid", score=0.0, cells=_zero_cells(), lines={}, notes=[sub.problem], **base)
    try:
        nb = load_notebook(sub.path)
        source, found_notes = find_solution(nb)
    except InvalidSubmission as exc:
        return Result(status="invalid", score=0.0, cells=_zero_cells(), lines={}, notes=[str(exc)], **base)

    tampered = []
    # Whitespace-only changes and identical copies of locked/test cells are put back as released, for
    # nbgrader too (its checksums and its one-cell-per-grade_id rule); a real alteration stays evidence.
    nb, earlier = restore_earlier_release(nb, course.release, course.earlier)
    nb, formatted = restore_formatting(nb, course.release)
    nb, notes = restore_protected(nb, course.release)
    notes = found_notes + earlier + formatted + notes
    altered = altered_cells(nb, course.release)
    if altered:
        tampered.append("locked or test cells were altered: " + ", ".join(altered))
    tampered += static_evidence(student_code_cells(nb))

    # The kernel run mostly waits (nbgrader and kernel start-up), so it overlaps with the verdict.
    kernel = None
    if options.run_nbgrader:
        # what editors leave out or change and nbgrader cannot read, repaired in nbgrader's copy only
        nb_kernel, kernel_notes = for_nbgrader(nb, course.release)
        notes += kernel_notes
        kernel = cf.ThreadPoolExecutor(1, thread_name_prefix=f"kernel-{sub.student_id}")

        def run_kernel():
            tpl = template.result()
            with slots.kernel:
                return kernel_run(sub, nb_kernel, tpl, workroot, options.marker_prefix, limits, server)

        kernel_future = kernel.submit(run_kernel)
    try:
        with slots.verdict:
            verdict = verdict_for_source(source, limits=limits, hide=limits.hide)
    finally:
        rep = kernel_future.result() if kernel is not None else None
        if kernel is not None:
            kernel.shutdown()
    vstatus = verdict.status
    notes += [str(n) for n in (verdict.notes or [])]
    elsewhere = defined_in_other_cells(nb, getattr(verdict, "undefined", None) or [])
    if elsewhere:
        notes.append(ONLY_SOLUTION_NOTE.format(names=", ".join(f"`{n}`" for n in elsewhere)))
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
    status = decide(statuses)
    cells, lines = {}, {}
    for c in spec.CELLS:
        cv = verdict.cells.get(c.grade_id)
        score = float(cv.score) if cv is not None else 0.0
        cells[c.grade_id] = round(min(max(score, 0.0), float(c.points)), 4)
        lines[c.grade_id] = [str(x) for x in (cv.lines if cv is not None else [])]
    pictures = {k: v.picture for k, v in verdict.cells.items() if v.picture}
    return Result(status=status, score=round(sum(cells.values()), 4), cells=cells, lines=lines, notes=notes,
                  seconds=time.monotonic() - start, pictures=pictures, **base)


def _same_program(source: str, ref: str) -> bool:
    """Both parse to the same syntax tree: they differ only in what a code formatter changes (quotes, line breaks
    inside brackets, spaces, trailing commas are kept by the tree; comments are dropped)."""
    from .evidence import parse_cell

    tree, ref_tree = parse_cell(source), parse_cell(ref)
    return tree is not None and ref_tree is not None and list(_tree_items(tree)) == list(_tree_items(ref_tree))


def _tree_items(tree):
    """What ``ast.dump`` shows of a syntax tree (each node's class and its fields, no positions), item by item and
    without recursion: a test cell replaced by an expression nested 1,000 deep (Python runs it) made ``ast.dump``
    raise RecursionError in the grader, a traceback and `crashed` where the alteration is tamper evidence."""
    import ast

    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.AST):
            yield type(node).__name__
            stack.extend(reversed([getattr(node, f, None) for f in node._fields]))
        elif isinstance(node, list):
            yield ("list", len(node))
            stack.extend(reversed(node))
        else:
            yield (type(node).__name__, repr(node))


def restore_formatting(nb: dict, release: dict) -> tuple[dict, list[str]]:
    """The notebook with each locked/test code cell that is the release's program, formatted otherwise, given the
    release's exact source, and a note. "Format notebook" in VS Code or JupyterLab (black, ruff) reformats every
    code cell, locked ones included: ``'prefill'`` becomes ``"prefill"``, a long call is wrapped. The program is
    the same (one syntax tree), so it is no alteration; a changed program still is (`evidence.altered_cells`)."""
    from .evidence import _protected, _same_but_whitespace
    from .notebook import _cell_source, _nbgrader_meta, norm_source

    protected = _protected(release)
    cells, formatted, retyped = [], [], []
    for cell in nb["cells"]:
        gid = _nbgrader_meta(cell).get("grade_id")
        ref = protected.get(gid) if isinstance(gid, str) else None
        if ref is not None and ref.get("cell_type") == "code" and cell.get("cell_type") in ("markdown", "raw"):
            # Esc then M or R turned it into markdown or raw (nbgrader issue #1941); its text is the release's
            as_code = {k: v for k, v in cell.items() if k != "attachments"}
            as_code.update(cell_type="code", outputs=[], execution_count=None)
            if _same_but_whitespace(as_code, ref) or _same_program(_cell_source(cell), _cell_source(ref)):
                cell = as_code
                retyped.append(gid)
        if ref is not None and ref.get("cell_type") == "code":
            ref_src, src = _cell_source(ref), _cell_source(cell)
            as_released = {**cell, "source": ref_src}
            # (whitespace alone: `restore_protected`, with its own note)
            if (norm_source(src) != norm_source(ref_src) and _same_but_whitespace(as_released, ref)
                    and _same_program(src, ref_src)):
                if "checksum" in _nbgrader_meta(ref):
                    meta = {**_nbgrader_meta(cell), "checksum": _nbgrader_meta(ref)["checksum"]}
                    as_released["metadata"] = {**cell["metadata"], "nbgrader": meta}
                cell = as_released
                formatted.append(gid)
        cells.append(cell)
    notes = []
    if retyped:
        notes.append("these locked/test cells had been turned into markdown or raw cells (M or R in command mode?); "
                     "they were graded as the release's code cells: " + ", ".join(sorted(set(retyped))))
    if formatted:
        notes.append("only the formatting of these locked/test cells differed from the release (a code formatter?); "
                      "they were graded as released: " + ", ".join(sorted(set(formatted))))
    if not notes:
        return nb, []
    return {**nb, "cells": cells}, notes


ONLY_SOLUTION_NOTE = (
    "NameError: {names} is defined in another cell of your notebook, but the grader runs only the solution cell "
    f"({spec.SOLUTION_CELL}): everything the classes use must be defined in that cell / 评分只运行解答单元格，"
    "它用到的函数和变量都要定义在这个单元格里")


def defined_in_other_cells(nb: dict, names) -> list[str]:
    """Those of `names` that a code cell other than the solution cell defines at its top level (a def, a class,
    an assignment, an import): the student's kernel had them, the grader's run of the solution cell has not."""
    import ast

    from .evidence import parse_cell
    from .notebook import _cell_source, _nbgrader_meta

    wanted, found = set(names), set()
    if not wanted:
        return []
    for cell in nb["cells"]:
        if cell.get("cell_type") != "code" or _nbgrader_meta(cell).get("grade_id") == spec.SOLUTION_CELL:
            continue
        try:
            tree = parse_cell(_cell_source(cell))
        except InvalidSubmission:
            continue
        if tree is None:
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                found |= {(a.asname or a.name).split(".")[0] for a in node.names}
            else:
                for target in (node.targets if isinstance(node, ast.Assign) else
                               [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []):
                    found |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return sorted(wanted & found)


def default_hide(course: Course, submissions: Path, out_dir: Path) -> tuple:
    """Paths the untrusted code must not see, each a writable trap (writes there are tamper evidence):
    the course, the submissions, the output folder and this package (the reference model and the source
    notebook: installed with pip, they sit under ``sys.prefix``, which the sandbox binds back for Python,
    and a kernel run that could read them could hand them to its own verdict harness).  Everything else
    outside the system folders is covered anyway when running as root (`sandbox.covered_dirs`)."""
    hide = {course.root, Path(submissions).resolve(), Path(out_dir).resolve(), *map(Path, package_paths())}
    return tuple(sorted(str(p) for p in hide))


def marker_prefix(out_dir) -> str:
    """The sandbox-marker prefix of every kernel run that grades into `out_dir` (tests look for leftovers)."""
    return "grade-" + hashlib.sha256(str(Path(out_dir).resolve()).encode()).hexdigest()[:10] + "-"


# The private folder of a grading under `sandbox.scratch_root` (its students' work folders, the template course).
WORKROOT_PREFIX = "decodesched-grade-"


def grade(submissions, out_dir, *, course=None, options: Options | None = None, missing: list | None = None
          ) -> list[Result]:
    """Grade the folder `submissions` into `out_dir`: the results of its submissions; `missing`, when given, is
    extended with grades.csv's rows of the roster's students who handed in nothing (`missing_rows`)."""
    options = options or Options()
    options.marker_prefix = marker_prefix(out_dir)
    course_obj = open_course(course)
    if course_obj.roster is None:
        print(printable(f"decodesched grade: note: {course_obj.gradebook} is locked by another program (formgrader, "
                        "nbgrader); its roster is read again as the grades are written into it"), file=sys.stderr)
    skipped: list = []
    subs = _links_to_others(_linked_course_files(collect_submissions(submissions, skipped), course_obj.root),
                            submissions_root(Path(submissions)))
    out_dir = Path(out_dir)
    made_out_dir = not out_dir.exists()
    kept: list[Result] = []
    if not made_out_dir:
        check_outputs(out_dir, [s.student_id for s in subs])
        kept = earlier_rows(out_dir / "grades.csv", {s.student_id for s in subs})
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = options.jobs or os.cpu_count() or 1
    limits = Limits(cpu_s=options.timeout_s, memory_mb=options.memory_mb,
                    hide=default_hide(course_obj, Path(submissions), out_dir))
    keeper = Resume(out_dir, course_obj, options, limits, regrade=options.regrade,
                    enabled=sandbox.weak_isolation() is None)
    results: list[Result] = []
    for sub in subs:  # a grading that stopped kept these: they are not run again
        taken = keeper.take(sub)
        if taken is not None:
            taken.timestamp = submitted_at(sub)
            results.append(taken)
    if results:
        print(printable(f"decodesched grade: note: took the kept gradings of {len(results)} submission(s) from an "
                        f"earlier grading into {out_dir} that stopped; grading the other {len(subs) - len(results)} "
                        "(--regrade grades all of them again)"), file=sys.stderr)
        done = {r.student_id for r in results}
        subs = [s for s in subs if s.student_id not in done]
    sandbox.remove_stale_scratch(WORKROOT_PREFIX)  # (those of gradings killed by SIGKILL)
    workroot, owner = sandbox.private_scratch(WORKROOT_PREFIX)
    os.chmod(workroot, 0o711)  # private uids must reach their own folder, but list nothing
    rendered: dict = {}
    fb = out_dir / "feedback"
    made_fb = not fb.exists()
    try:
        try:
            _grade_all(subs, course_obj, workroot, options, limits, jobs, results, rendered, kept,
                       commit=lambda write_gradebook: _commit(out_dir, rendered, write_gradebook, results, kept,
                                                              roster_now(course_obj), keeper.forget), keeper=keeper)
        finally:
            sandbox.STOPPING.clear()  # every run of this grading has ended (the pools were shut down)
            os.close(owner)  # (the workroot is removed: `_grade_all`)
        results.sort(key=lambda r: r.student_id)
    except BaseException as exc:
        # a stopped grading leaves its kept gradings for a rerun (a failed one, and one stopped once its outputs
        # were committed, does not), and no empty folder of its own behind
        keeper.forget(everything=not from_interrupt(exc))
        for folder, made in ((fb, made_fb), (out_dir, made_out_dir)):
            if made:
                with contextlib.suppress(OSError):
                    folder.rmdir()
        raise
    if kept:
        names = _some_names(sorted(r.student_id for r in kept))
        print(printable(f"decodesched grade: note: {out_dir / 'grades.csv'} keeps the rows of {len(kept)} student(s) "
                        f"graded before and not in {submissions}: {names} (grade into a new --out for these "
                        "submissions alone)"), file=sys.stderr)
    absent = missing_rows(roster_now(course_obj), results, kept)
    if missing is not None:
        missing.extend(absent)
    if absent:
        print(printable(f"decodesched grade: note: {len(absent)} student(s) of the gradebook's roster handed in "
                        f"nothing in {submissions}: {_some_names([r.student_id for r in absent])} (rows `missing`, 0 "
                        "points, in grades.csv)"),
              file=sys.stderr)
    by_hand = hand_graded(course_obj.gradebook, (r.student_id for r in results))
    if by_hand:
        print(printable(f"decodesched grade: note: {len(by_hand)} student(s) have a score entered by hand in the "
                        "gradebook, kept there as nbgrader autograde keeps it (a manual score is marked for review): "
                        f"{_some_names(by_hand)} (nbgrader export gives the score entered by hand, grades.csv this "
                        "grading's)"),
              file=sys.stderr)
    for line in report_lines(skipped, results):
        print(f"decodesched grade: {line}", file=sys.stderr)
    return results


# The course's folders of notebooks that are no student's hand-in: nbgrader's source/ (the solution and hidden tests),
# release/, and autograded/ and feedback/ (other students' graded work).
COURSE_NOTEBOOKS = ("source", "release", "autograded", "feedback")


def _linked_course_files(subs: list[Submission], course_root: Path) -> list[Submission]:
    """`subs` with each one whose notebook is, through a symbolic link (of the file or of a folder above it), a
    file in the course's COURSE_NOTEBOOKS made an `invalid` row saying so: ``tar`` and ``unzip`` restore links, so a
    student's archive unpacked into the folder could hand in ``../../source/.../decode_scheduling.ipynb``, the
    instructor's solution, as the student's own. Links elsewhere (an instructor's folder of links to
    ``submitted/``) are followed as before."""
    roots = [Path(os.path.realpath(course_root / name)) for name in COURSE_NOTEBOOKS]
    out = []
    for sub in subs:
        real = Path(os.path.realpath(sub.path)) if sub.path is not None and not sub.problem else None
        inside = next((r for r in roots if real is not None and real.is_relative_to(r)
                       and not Path(os.path.abspath(sub.path)).is_relative_to(r)), None)
        if inside is not None:
            sub = Submission(sub.student_id, None, f"the notebook is a link to the course's own {inside.name}/ "
                             f"folder ({printable(str(real))}), not a file the student handed in")
        out.append(sub)
    return out


def _links_to_others(subs: list[Submission], root: Path) -> list[Submission]:
    """`subs` with each notebook that is not the student's own file made an `invalid` row saying so: one that a
    symbolic link inside the student's folder (`root`/<id>/, unpacked from the student's archive) takes out of
    that folder, and one that is, through a link, the very file of another student's submission
    (``erin.ipynb -> dave.ipynb``): it would be graded as the peer's work. A file that two or more submissions
    share is left to the one that reaches it without a link, if exactly one does. Links that are the student's
    entry itself (an instructor's folder of links to ``submitted/``) are followed as before."""
    ident: dict[str, tuple] = {}  # student id -> (device, inode) of the notebook
    out: dict[str, Submission] = {}
    for sub in subs:
        out[sub.student_id] = sub
        if sub.path is None or sub.problem:
            continue
        path = Path(os.path.abspath(sub.path))
        real = Path(os.path.realpath(path))
        entry = root / path.relative_to(os.path.abspath(root)).parts[0]
        if not real.is_relative_to(os.path.realpath(entry)):
            out[sub.student_id] = Submission(sub.student_id, None, f"the notebook is a link out of the student's "
                                             f"folder {entry.name}/ (to {printable(str(real))}), not a file the student handed in")
            continue
        with contextlib.suppress(OSError):
            st = os.stat(path)
            ident[sub.student_id] = (st.st_dev, st.st_ino)
    sharing: dict[tuple, list[str]] = {}
    for sid, key in ident.items():
        sharing.setdefault(key, []).append(sid)
    for group in (g for g in sharing.values() if len(g) > 1):
        own = [sid for sid in group if os.path.realpath(out[sid].path) == os.path.abspath(out[sid].path)]
        for sid in group:
            if own != [sid]:
                others = ", ".join(o for o in (own if len(own) == 1 else group) if o != sid)
                out[sid] = Submission(sid, None, f"the notebook is the file of {others}'s submission (a link or a "
                                      "second name of it), not a file the student handed in")
    return list(out.values())


def _some_names(names: list[str], shown: int = 10) -> str:
    """The first `shown` of `names` for a note, and how many more."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def report_lines(skipped: list, results: list) -> list[str]:
    """One line for the instructor per entry of the folder that was skipped, and per `invalid` row, with its
    reason (grades.csv has no reason column; a student id that is no plain name has no feedback page).
    Nothing of a name is printed raw: a newline, ESC or other character that is not printable is shown as its
    escape (`notebook.printable`), so a file name can neither forge a line nor send the terminal a sequence."""
    lines = [f"skipped {name}: {why}" for name, why in skipped]
    lines += [f"invalid {r.student_id}: {'; '.join(r.notes) or 'no reason given'}"
              for r in sorted(results, key=lambda r: r.student_id) if r.status == "invalid"]
    return [printable(line) for line in lines]


def page_name(student_id: str) -> str | None:
    """The feedback page's file name, for a plain student id (`notebook.is_plain_id`: at most 64 bytes, so the
    name fits the 255-byte limit); the others are named only in grades.csv and on stderr."""
    name = f"{student_id}.html"
    return name if is_plain_id(student_id) and len(name.encode("utf-8")) <= 255 else None


def check_outputs(out_dir: Path, student_ids) -> None:
    """Refuse, before any grading, an output folder that the outputs could not be written into at the end: one
    that is not writable, a ``feedback`` that is no folder, a ``grades.csv`` or page that is a folder or a
    device (`_io.output_target`). Raises `UserError` (one line, exit 2)."""
    from decodesched._io import output_target

    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise UserError(f"{out_dir}: cannot write into this folder; choose another --out")
    output_target(out_dir / "grades.csv")
    fb = out_dir / "feedback"
    if fb.exists() or fb.is_symlink():
        if not fb.is_dir():
            raise UserError(f"{fb}: exists and is not a folder; move it away or choose another --out")
        if not os.access(fb, os.W_OK | os.X_OK):
            raise UserError(f"{fb}: cannot write into this folder; choose another --out")
        for name in filter(None, map(page_name, student_ids)):
            output_target(fb / name)


def render_outputs(results: list, kept: list = (), roster=()) -> dict:
    """Every output file's text, made before anything is written (so a failure here writes nothing):
    ``{"feedback": [(file name, html), ...], "grades.csv": text}``, a page for each plain student id
    (`page_name`); grades.csv also has the `kept` rows of students graded before (`earlier_rows`) and a `missing`
    row for each student of the `roster` with neither (`missing_rows`)."""
    pages = [(page_name(r.student_id), feedback_html(r)) for r in sorted(results, key=lambda r: r.student_id)
             if page_name(r.student_id)]
    text = grades_csv_text([*results, *kept, *missing_rows(roster, results, kept)])
    for _name, page in pages:
        page.encode("utf-8")  # surrogates would fail only half-way through the writes
    text.encode("utf-8")
    return {"feedback": pages, "grades.csv": text}


def roster_now(course: Course) -> list[str]:
    """The course's roster (`course.unsubmitted`), read again where the gradebook was locked as the grading started
    (`Course.roster` None): the grades are about to be written into it, so it is free now or that write fails, one
    line and nothing written. Without this, a grades.csv lost its `missing` rows to a lock of a few seconds."""
    if course.roster is None:
        course.roster = unsubmitted(course.gradebook, if_locked=None)
    return course.roster or []


def missing_rows(roster, results, kept) -> list[Result]:
    """A row of status ``missing`` (0 points, no feedback page, nothing in the gradebook: `nbgrader export` lists
    them with 0 already) for each student of the course's roster (`course.unsubmitted`: the gradebook's students
    without a submission of the assignment) who is neither graded now nor kept from an earlier grades.csv."""
    from .status import MISSING

    have = {r.student_id for r in (*results, *kept)}
    return [Result(sid, MISSING, 0.0, float(spec.MAX_SCORE), _zero_cells(), {}, ["no submission"])
            for sid in sorted(roster) if sid not in have and is_plain_id(sid)]


def earlier_rows(path: Path, graded_ids) -> list[Result]:
    """The rows of an earlier grades.csv at `path` for students with a plain id who are not in `graded_ids`: a
    folder of one student regraded, or of a late submission graded alone, into the class's --out keeps everyone
    else's row (and page), as the gradebook keeps their grades. A grades.csv that is not one this command wrote
    (other columns, a score that is no finite number, a status it never writes, a student twice, a FIFO or one
    over 256 MiB) is a `UserError`: it is never overwritten unread."""
    import csv
    import io
    import math
    import stat as _stat

    from .status import MISSING, STATUSES

    if not path.is_file():
        return []
    header = ["student_id", "score", "max_score", "status", *spec.CELL_IDS]
    problem = f"{path}: not a grades.csv that `decodesched grade` wrote ({{}}); move it away or choose another --out"
    limit = 256 * 2**20
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # (a FIFO put there since is refused, never waited on)
        with os.fdopen(fd, "rb") as fh:
            if not _stat.S_ISREG(os.fstat(fd).st_mode):
                raise UserError(problem.format("not a regular file"))
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise UserError(problem.format("over 256 MiB"))
        rows = list(csv.reader(io.StringIO(data.decode("utf-8-sig"), newline="")))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(problem.format(exc.__class__.__name__)) from None
    if not rows or rows[0] != header:
        raise UserError(problem.format("other columns"))
    kept, seen = [], set()
    for n, row in enumerate(rows[1:], start=2):
        if not row or (len(row) == len(header) and (row[0] in graded_ids or not is_plain_id(row[0]))):
            continue
        try:
            if len(row) != len(header) or row[3] not in (*STATUSES, MISSING) or row[0] in seen:
                raise ValueError
            score, max_score, *cells = (float(x) for x in row[1:2] + row[2:3] + row[4:])
            if not all(map(math.isfinite, (score, max_score, *cells))):
                raise ValueError
        except ValueError:
            raise UserError(problem.format(f"line {n}")) from None
        seen.add(row[0])
        if row[3] == MISSING:  # (from the roster again, as it is now: `missing_rows`)
            continue
        kept.append(Result(row[0], row[3], score, max_score, dict(zip(spec.CELL_IDS, cells)), {}))
    return kept


def _commit(out_dir: Path, rendered: dict, write_gradebook, results: list = (), kept: list | None = None,
            roster=(), forget=None) -> None:
    """The outputs and the gradebook, together: the pages and grades.csv are written under temporary names, then
    `write_gradebook()` runs, then they are renamed into place. A Ctrl-C or SIGTERM in these seconds takes effect
    once all is written (`signals_held`): one between the gradebook and grades.csv left them disagreeing. With
    `kept` (`earlier_rows`, read before grading), grades.csv's other rows are read again here, with --out locked:
    another grading into the same --out since then (one student each, at once) keeps its rows too. `forget`
    (`Resume.forget`) removes the kept gradings once all is written, before a signal held back takes effect."""
    fb = out_dir / "feedback"
    with signals_held(), folders_locked([out_dir]):  # (against another grading's `_commit`)
        _remove_stale_temporaries(out_dir)
        if kept is not None:
            kept[:] = earlier_rows(out_dir / "grades.csv", {r.student_id for r in results})
            rendered["grades.csv"] = grades_csv_text([*results, *kept, *missing_rows(roster, results, kept)])
        fb.mkdir(exist_ok=True)
        with output_group():  # every page and grades.csv appear together, or none
            for name, text in rendered["feedback"]:
                with atomic_writer(fb / name) as fh:
                    fh.write(text)
            with atomic_writer(out_dir / "grades.csv") as fh:
                fh.write(rendered["grades.csv"])
            write_gradebook()  # a failure here (a locked gradebook) removes the files not yet in place
        if forget is not None:
            forget(everything=True)  # committed: the outputs hold these verdicts now


# A temporary file of `atomic_writer` beside an output: `_io.temp_prefix` of its name, then mkstemp's 8 characters.
_TEMPORARY = re.compile(r"\.(.{1,64})\.[a-z0-9_]{8}\.tmp", re.DOTALL)


def _remove_stale_temporaries(out_dir: Path) -> None:
    """Remove the temporary files of grades.csv and of the pages (feedback/ holds nothing else) that a grading killed
    in its `_commit` (SIGKILL, the OOM killer) left: hidden copies of students' pages that no rerun renamed or
    removed. Called under `_commit`'s lock of --out, so no other grading is writing one of them now."""
    for folder, ours in ((out_dir, {"grades.csv"}), (out_dir / "feedback", None)):
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                m = _TEMPORARY.fullmatch(entry.name)
                if m and (ours is None or m[1] in ours) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)


def _grade_all(subs, course_obj, workroot, options, limits, jobs, results: list, rendered: dict,
               kept: list = (), commit=None, keeper: Resume | None = None) -> None:
    """Grade every submission into `results` (which may hold kept gradings already), `jobs` at a time, each kept
    by `keeper` as it finishes; on an interrupt (Ctrl-C) the queued ones are cancelled and the runs under way
    stopped (`sandbox.STOPPING`) before it propagates. The outputs are rendered into `rendered` (`render_outputs`)
    before the gradebook is written: a failure leaves all as it was."""
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workroot, ignore_errors=True)
        # The fork server imports nbgrader while the template is built, and the verdicts start at once:
        # only the kernel runs wait for the template (`template` is a future).
        server = stack.enter_context(ForkServer(options.marker_prefix + "forkserver")) if options.run_nbgrader else None
        prep = stack.enter_context(cf.ThreadPoolExecutor(1, thread_name_prefix="template"))
        template = prep.submit(_template, course_obj, workroot, options.cell_timeout(), server) if options.run_nbgrader else None
        bar = stack.enter_context(Progress(len(subs), "grading", enabled=options.progress))
        pool = stack.enter_context(cf.ThreadPoolExecutor(2 * jobs))
        slots = Slots.of(jobs)
        futs = {pool.submit(_grade_safely, s, course_obj, template, workroot, options, limits, server, slots,
                            keeper): s for s in subs}
        try:
            if server is None:
                preload_gradebook()  # this thread only waits until the first result
            for fut in cf.as_completed(futs):
                results.append(fut.result())
                bar.advance()
        except BaseException:
            sandbox.STOPPING.set()
            for fut in futs:
                fut.cancel()
            if server is not None:
                server.abort()
            raise
        if template is not None and isinstance(template.exception(), UserError):
            raise template.exception()  # e.g. the gradebook lacks the assignment: no outputs at all
        rendered.update(render_outputs(results, kept, roster_now(course_obj)))

        def write_gradebook():  # every sandboxed run has ended
            update_gradebook(course_obj, results, server)

        if commit is None:
            write_gradebook()
        else:
            commit(write_gradebook)


def _template(course, workroot, cell_timeout, server) -> Path:
    """The private release course of the kernel runs, and the fork server warmed with it."""
    tpl = build_template(course, workroot, cell_timeout)
    warm_server(server, course, tpl, workroot)
    return tpl


def _grade_safely(sub, course, template, workroot, options, limits, server, slots=None, keeper=None) -> Result:
    """One student's failure never stops the run: an unexpected grader error is reported as crashed. A grading
    that ended while this one is not being stopped is kept for a rerun (`grader.resume`)."""
    try:
        before = keeper.key(sub) if keeper is not None else None  # (kept only if the file is the same after)
        result = grade_one(sub, course, template, workroot, options, limits, server, slots)
        result.timestamp = submitted_at(sub)
        if keeper is not None and not sandbox.STOPPING.is_set():  # (a run the stop ended is no verdict)
            keeper.keep(sub, result, before)
        return result
    except UserError:
        raise  # the course, not this student (a gradebook without the assignment): one line, the grading stops
    except Exception as exc:  # noqa: BLE001
        if sandbox.STOPPING.is_set():  # the grading is being stopped (its fork server too): nothing of it is kept
            return Result(sub.student_id, "crashed", 0.0, float(spec.MAX_SCORE), _zero_cells(), {}, [str(exc)])
        import traceback

        print(f"decodesched grade: internal error while grading {printable(sub.student_id)}:\n{traceback.format_exc()}",
              file=sys.stderr)
        return Result(sub.student_id, "crashed", 0.0, float(spec.MAX_SCORE), _zero_cells(), {},
                      [f"grader error: {exc.__class__.__name__}: {exc}"])
