"""The course folder: where the instructor's source notebook, release and gradebook live.

`resolve_root(arg)` is ``--course DIR`` when given, else the current directory when it holds
``nbgrader_config.py``, else an error that says to run ``decodesched assignment init``. Nothing is
ever written into the installed package.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from decodesched.errors import UserError

from . import spec
from .notebook import InvalidSubmission, load_notebook

@dataclass
class Course:
    root: Path
    release_nb_path: Path
    release: dict
    gradebook: Path
    earlier: list = field(default_factory=list)  # the releases built before this one (`earlier_releases`)
    # the gradebook's students without a submission (`unsubmitted`); None: the gradebook was locked, read it later
    roster: list | None = field(default_factory=list)


CONFIG = "nbgrader_config.py"
# Every release `assignment build` made, kept by content (`remember_release`): students who downloaded one before the
# instructor rebuilt it (a typo fixed in a test or the task) hand in its test and locked cells.
RELEASES = Path(".decodesched") / "releases"
# Held by `assignment build` (exclusively) while it replaces and checks the release, and by a grading (shared) while it
# reads the course (`build_locked`).
BUILD_LOCK = Path(".decodesched") / "build.lock"
INIT_HINT = "run `decodesched assignment init DIR` to make a course folder, then pass --course DIR or cd into it"

README = """\
# {assignment}: an nbgrader course folder made by `decodesched assignment init`

This folder is yours: nothing here belongs to the installed `decodesched` package, and nothing is
ever written back into that package. Run every command from this folder (it holds
`nbgrader_config.py`), or pass `--course {root}` from elsewhere.

    source/{assignment}/{notebook}   the instructor's notebook (solutions and hidden tests)
    nbgrader_config.py                nbgrader's settings for this course

1. `decodesched assignment build` runs `nbgrader generate_assignment {assignment}` and checks the
   release (solutions stripped, no hidden test left, every test cell failing without a solution).
   It writes `release/{assignment}/{notebook}` (hand this to students) and `gradebook.db`. After a fix
   to the source (a typo in a visible test or the task), `decodesched assignment build --force`: the
   releases built before are kept in `.decodesched/releases/`, so notebooks made from them still grade.
2. Collect submissions as `SUBMISSIONS/<student_id>.ipynb`, or in nbgrader's
   `submitted/<student_id>/{assignment}/{notebook}` tree.
3. `decodesched grade SUBMISSIONS --out OUT` writes `OUT/grades.csv`, `OUT/feedback/<student_id>.html`
   (in Chinese and English, with a picture of the first failing schedule) and updates `gradebook.db`,
   so `nbgrader export` agrees with grades.csv. A folder of some students (one regraded, a late one)
   graded into the same OUT replaces their rows and keeps everyone else's. `decodesched grade
   --selfcheck` shows that the grader tells the reference from a library of one-bug solutions.
4. `nbgrader export` writes the gradebook's scores to `grades.csv` in this folder.

Do not run `nbgrader autograde` here yourself: it would run the hidden tests in the student's kernel,
warn that each hidden cell's checksum changed (the release holds only a probe there), and overwrite
the gradebook with its own scores, which then disagree with `OUT/grades.csv`. `decodesched grade`
runs nbgrader's autograde for you, sandboxed, in a private copy of the course.

You may edit the markdown and the visible tests of the source notebook; the hidden tests are judged
by the grader outside the student's kernel, and the graded cells and their points must stay as
`decodesched.grader.spec` lists them (`assignment build` checks this).
"""


NBGRADER_HINT = "pip install 'decodesched[grader]'"


def require_nbgrader(command: str) -> None:
    """A `UserError` before any work when nbgrader (the ``grader`` extra) is not installed: `command`
    would otherwise run its checks and fail at its first nbgrader step with a traceback."""
    import importlib.util

    if importlib.util.find_spec("nbgrader") is None:
        raise UserError(f"{command} needs nbgrader, which is not installed: {NBGRADER_HINT}")


def resolve_root(course=None, cwd=None) -> Path:
    """The course folder: `course` when given, else `cwd` (the current directory) when it holds
    ``nbgrader_config.py``; anything else is a `UserError` that says how to make one."""
    if course is not None:
        root = Path(course).expanduser().resolve()
        if not (root / CONFIG).is_file():
            raise UserError(f"{root}: not an nbgrader course folder (no {CONFIG}); {INIT_HINT}")
        return root
    here = Path(cwd or Path.cwd()).resolve()
    if (here / CONFIG).is_file():
        return here
    raise UserError(f"no course folder: {here} has no {CONFIG} and no --course was given; {INIT_HINT}")


def init_course(target) -> list[Path]:
    """Write a ready course into `target` (new or empty): the source notebook, nbgrader_config.py, a README.

    The files are copied from the package's own course template, which is only ever read.
    """
    from decodesched._io import atomic_writer, folders_made, output_group

    if not str(target).strip():
        raise UserError("the course folder's name is empty")
    root = Path(target).expanduser()
    if root.is_symlink() and not root.exists():
        raise UserError(f"{root}: a symbolic link to a missing path; give a new or empty folder")
    if root.exists() and not root.is_dir():
        raise UserError(f"{root}: exists and is not a folder")
    if root.is_dir() and any(root.iterdir()):
        raise UserError(f"{root}: not empty; give a new or empty folder")
    template = spec.COURSE_ROOT
    files = {CONFIG: (template / CONFIG).read_bytes(),
             f"source/{spec.ASSIGNMENT}/{spec.NOTEBOOK}": spec.SOURCE_NOTEBOOK.read_bytes()}
    written = []
    # Every file or none, and no folder left behind by a failure (a full disk, Ctrl-C): a rerun finds DIR as it was.
    with folders_made({(root / rel).parent for rel in files}), output_group():
        resolved = root.resolve()
        readme = README.format(assignment=spec.ASSIGNMENT, notebook=spec.NOTEBOOK, root=resolved)
        files["README.md"] = readme.encode("utf-8", "surrogateescape")  # (a folder name's bytes that are not UTF-8)
        for rel, data in files.items():
            with atomic_writer(root / rel, mode="wb") as fh:  # (an error names the folder as given)
                fh.write(data)
            written.append(resolved / rel)
    return written


def remember_release(root: Path, notebook: Path) -> None:
    """Keep a copy of the release `notebook` (one the students may have) under ``COURSE/.decodesched/releases/``,
    named by its content, so that its test and locked cells are known after a rebuild (`earlier_releases`)."""
    from decodesched._io import atomic_writer

    data = Path(notebook).read_bytes()
    target = Path(root) / RELEASES / f"{hashlib.sha256(data).hexdigest()[:16]}.ipynb"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_writer(target, mode="wb") as fh:
            fh.write(data)


def earlier_releases(root: Path, current: Path) -> list[dict]:
    """The releases `remember_release` kept, but for `current` (copies that are no notebook, `load_notebook`'s
    strict reading: a FIFO, a device, junk, are skipped: they only ever spare a student a note of tamper evidence)."""
    folder = Path(root) / RELEASES
    now = load_notebook(current)
    found = []
    for path in sorted(folder.glob("*.ipynb")) if folder.is_dir() else []:
        try:
            nb = load_notebook(path)
        except InvalidSubmission:
            continue
        if nb != now:
            found.append(nb)
    return found


def assignment_notebook(con):
    """The id of the assignment's notebook in nbgrader's gradebook (an open `sqlite3` connection), else None."""
    row = con.execute("SELECT notebook.id FROM notebook JOIN assignment ON notebook.assignment_id = assignment.id "
                      "WHERE notebook.name = ? AND assignment.name = ?",
                      (spec.NOTEBOOK[: -len(".ipynb")], spec.ASSIGNMENT)).fetchone()
    return row[0] if row else None


def unsubmitted(gradebook: Path, if_locked=()) -> list[str]:
    """The course's roster (the students of nbgrader's gradebook: `nbgrader db student add` or `import`) who have no
    submission of the assignment in it, sorted: grades.csv lists them as ``missing`` (`pipeline.missing_rows`), as
    `nbgrader export` lists them with 0 points. Read with plain SQL (nbgrader is not imported here), before any
    grading: a gradebook without the assignment (made again by `nbgrader db student import` after the build) or
    one that is no gradebook is a `UserError`, not a failure once every submission is graded; a locked one
    (another program writing it for over SQLite's 5 s), `if_locked` (`open_course`: None, and the roster is read
    again as the grades are written, `pipeline.roster_now`)."""
    import sqlite3
    from urllib.request import pathname2url

    rebuild = "run `decodesched assignment build --force` in its course folder"  # (the line names the folder once)
    try:
        con = sqlite3.connect(f"file:{pathname2url(str(gradebook))}?mode=ro", uri=True)
        try:
            if assignment_notebook(con) is None:
                raise UserError(f"{gradebook}: the assignment {spec.ASSIGNMENT} is not in the gradebook; {rebuild}")
            rows = con.execute("SELECT id FROM student WHERE id NOT IN (SELECT s.student_id FROM submitted_assignment "
                               "AS s JOIN assignment AS a ON s.assignment_id = a.id WHERE a.name = ?)",
                               (spec.ASSIGNMENT,)).fetchall()
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        if "locked" in str(exc):  # (the template's copy checks the assignment; the write at the end says so)
            return list(if_locked) if if_locked is not None else None
        why = str(exc)[:100]
        raise UserError(f"{gradebook}: not a readable nbgrader gradebook ({why}); move it away and {rebuild}") from None
    return sorted({r[0] for r in rows if isinstance(r[0], str)})


def hand_graded(gradebook: Path, students) -> list[str]:
    """Those of `students` with a score or extra credit of the assignment entered by hand in the gradebook
    (formgrader), sorted: a grading keeps them there, as nbgrader's autograde does (`outputs.write_gradebook`), so
    `nbgrader export` gives the score entered by hand where grades.csv gives this grading's. Plain SQL; none where
    the gradebook cannot be read."""
    import sqlite3
    from urllib.request import pathname2url

    students = set(students)
    try:
        con = sqlite3.connect(f"file:{pathname2url(str(gradebook))}?mode=ro", uri=True)
        try:
            rows = con.execute(
                "SELECT DISTINCT s.student_id FROM grade AS g JOIN submitted_notebook AS n ON g.notebook_id = n.id "
                "JOIN submitted_assignment AS s ON n.assignment_id = s.id JOIN assignment AS a ON s.assignment_id = "
                "a.id WHERE a.name = ? AND (g.manual_score IS NOT NULL OR g.extra_credit IS NOT NULL)",
                (spec.ASSIGNMENT,)).fetchall()
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return []
    return sorted(r[0] for r in rows if r[0] in students)


@contextlib.contextmanager
def build_locked(root: Path, *, exclusive: bool, wait_s: float = 10.0):
    """The course's BUILD_LOCK (an flock) for the block: `assignment build` holds it exclusively while it moves the
    release aside, makes a new one and checks it (a minute), a grading shares it while it reads the release, the
    earlier releases and the roster (`open_course`). A grading started during a build read no release ("the
    assignment is not built") or the new one before its checks, and two builds at once each put the other's release
    aside and removed it. A grading finding a build under way is a `UserError` at once; a build waits `wait_s` for
    the others (a grading reads for a moment) before it is one. The build makes the lock file; a grading writes
    nothing into the course and reads one without it (built before it was made, or read-only here) unlocked."""
    import fcntl

    path = Path(root) / BUILD_LOCK
    try:
        if exclusive:
            path.parent.mkdir(exist_ok=True)
        fd = os.open(path, (os.O_RDWR | os.O_CREAT if exclusive else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        fd = None
    try:
        deadline = time.monotonic() + (wait_s if exclusive else 0.0)
        while fd is not None:
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    what = ("another `decodesched assignment build` of this course (or a grading reading it) is under "
                            "way; build once it has finished" if exclusive else
                            "`decodesched assignment build` is rebuilding this course's release; grade once it has "
                            "finished")
                    raise UserError(f"{root}: {what}") from None
                time.sleep(0.1)
            except OSError:  # a file system without flock: as before
                break
        yield
    finally:
        if fd is not None:
            os.close(fd)


def open_course(course_root=None) -> Course:
    """The built course (release and gradebook present) at `resolve_root(course_root)`, read under its build lock
    (`build_locked`): the release, the earlier releases and the roster of one build."""
    root = resolve_root(course_root)
    with build_locked(root, exclusive=False):
        return _read_course(root)


def _read_course(root: Path) -> Course:
    release = root / "release" / spec.ASSIGNMENT / spec.NOTEBOOK
    gradebook = root / "gradebook.db"
    if not (root / "nbgrader_config.py").is_file():
        raise UserError(f"{root}: not an nbgrader course (no nbgrader_config.py); {INIT_HINT}")
    if not release.is_file() or not gradebook.is_file():
        raise UserError(f"{root}: the assignment is not built; run `decodesched assignment build --course {root}` first")
    try:
        rel = load_notebook(release)
    except InvalidSubmission as exc:
        raise UserError(f"{release}: {exc}") from None
    return Course(root, release, rel, gradebook, earlier_releases(root, release),
                  unsubmitted(gradebook, if_locked=None))
