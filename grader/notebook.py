"""Intake: the submissions of a folder, and strict parsing of a notebook.

SUBMISSIONS is a folder of ``<student_id>.ipynb`` files, or nbgrader's
``submitted/<student>/<assignment>/<assignment>.ipynb`` tree (SUBMISSIONS may be the course root
holding ``submitted/`` or the ``submitted`` folder itself). A notebook is parsed as JSON with strict
checks (size, nbformat 4, cells, exactly one code cell with grade_id ``scheduler_solution``); the
student id must be a plain name. Anything else is ``invalid``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from decodesched.errors import UserError

from . import spec

# A letter or digit of any script, then letters, digits and ``_ . @ + -`` (64 at most): ``alice``, ``b.wang+1``,
# ``张三``. nbgrader takes any Unicode student id (it only strips whitespace); a name in NFC (as typed) is plain,
# one in NFD (macOS's decomposed accents) is not (its combining marks are no letters).
STUDENT_ID_RE = re.compile(r"^[^\W_][\w.@+-]{0,63}\Z")


MAX_NOTEBOOK_BYTES = 20 * 1024 * 1024
_ARCHIVES = (".zip", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".7z", ".rar")


@dataclass
class Submission:
    student_id: str
    path: Path | None
    problem: str | None = None  # set when the entry is unusable (bad id, missing notebook)


class InvalidSubmission(Exception):
    pass


def display_name(name: str) -> str:
    """A file name as text that can always be written (UTF-8): bytes that are not UTF-8 (a name made on Windows or
    an old Samba share, read here as surrogates) become ``\\xe9`` escapes, as elsewhere in the project."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _plain_id(name: str) -> tuple[str, str | None]:
    """(the student id of a file or folder name, why it is not a plain name, or None)."""
    sid = display_name(name)
    if sid != name:
        return sid, "the student id is not a plain name (the file name is not UTF-8)"
    if not STUDENT_ID_RE.match(sid):
        return sid, ("the student id is not a plain name (letters and digits of any script, then also "
                     "_ . @ + -; 64 characters at most)")
    return sid, None


def collect_submissions(folder, skipped: list | None = None) -> list[Submission]:
    """The submissions in `folder`, in either layout, sorted by student id.

    Entries that are no submission are left out; each is appended to `skipped` as ``(name, reason)`` (names
    as `display_name`), except hidden ones (``.DS_Store``, ``.ipynb_checkpoints``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder of submissions")
    from .course import CONFIG

    root = folder / "submitted" if (folder / "submitted").is_dir() else folder
    if root == folder and (folder / CONFIG).is_file():  # its source/ and release/ are no students
        raise UserError(f"{folder}: a course folder without a submitted/ folder; give the folder that holds the "
                        "submissions")
    subs: dict[str, Submission] = {}
    entries = sorted(root.iterdir())
    flat = [p for p in entries if p.suffix == ".ipynb" and not p.is_dir()]
    dirs = [p for p in entries if p.is_dir() and not p.name.startswith(".")]
    if skipped is not None:
        skipped += [(display_name(p.name), "not a .ipynb notebook" + (" (unpack an archive into the folder first)"
                                                                      if p.suffix.lower() in _ARCHIVES else ""))
                    for p in entries if not p.name.startswith(".") and p not in flat and p not in dirs]
    for p in flat:
        sid, problem = _plain_id(p.stem)
        if problem:
            subs[sid] = Submission(sid, p, problem)
        elif not p.is_file():  # listed, never opened: reading a FIFO would wait for ever
            subs[sid] = Submission(sid, None, "not a regular file (a FIFO, a device or a broken link)")
        else:
            subs[sid] = Submission(sid, p)
    for d in dirs:
        sid, problem = _plain_id(d.name)
        if sid in subs:
            subs[sid] = Submission(sid, None, "two submissions for the same student")
            continue
        nb = d / spec.ASSIGNMENT / spec.NOTEBOOK
        if problem:
            subs[sid] = Submission(sid, None, problem)
        elif not (d / spec.ASSIGNMENT).is_dir():
            if skipped is not None:  # a folder of something else (another assignment)
                skipped.append((sid + "/", f"a folder without {spec.ASSIGNMENT}/ inside"))
        elif not nb.is_file():
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
    import stat as _stat

    try:
        # Opened without waiting and checked on the open file: a FIFO or device put in a notebook's
        # place after the folder was listed is refused, never read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InvalidSubmission(f"cannot read the notebook: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not _stat.S_ISREG(st.st_mode):
            raise InvalidSubmission("not a regular file (a FIFO, a device or a broken link)")
        if st.st_size > MAX_NOTEBOOK_BYTES:
            raise InvalidSubmission(f"the notebook is {st.st_size / 2**20:.0f} MiB "
                                    f"(limit {MAX_NOTEBOOK_BYTES / 2**20:.0f} MiB)")
        data = fh.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise InvalidSubmission(f"the notebook grew past {MAX_NOTEBOOK_BYTES / 2**20:.0f} MiB while it was read")
    try:
        nb = json.loads(data.decode("utf-8"))
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


def _safe_source(cell) -> str:
    try:
        return _cell_source(cell)
    except InvalidSubmission:
        return ""


def _safe_text(t) -> str:
    if isinstance(t, list):
        return "".join(x for x in t if isinstance(x, str))
    return t if isinstance(t, str) else ""


def _plain_file(path: Path, max_bytes: int) -> bool:
    """A regular file (not a link, FIFO or device the student planted), not too big, under a real folder."""
    import stat as _stat

    try:
        st = os.lstat(path)
        parent_real = os.path.realpath(path.parent) == os.path.abspath(path.parent)
    except OSError:
        return False
    return _stat.S_ISREG(st.st_mode) and st.st_size <= max_bytes and parent_real
