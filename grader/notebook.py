"""Intake: the submissions of a folder, and strict parsing of a notebook.

SUBMISSIONS is a folder of ``<student_id>.ipynb`` files, or nbgrader's
``submitted/<student>/<assignment>/<assignment>.ipynb`` tree (SUBMISSIONS may be the course root
holding ``submitted/`` or the ``submitted`` folder itself). A notebook is parsed as JSON with strict
checks (size, nbformat 4, cells, exactly one code cell with grade_id ``scheduler_solution``); the
student id must be a plain name. Anything else is ``invalid``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from decodesched.errors import UserError

from . import spec

# A letter or digit of any script, then letters, digits and ``_ . @ + -``: ``alice``, ``b.wang+1``, ``张三``.
# nbgrader takes any Unicode student id (it only strips whitespace). `id_problem` asks more of a plain id: at
# most MAX_ID_BYTES of UTF-8 (``<id>.html``, the kernel run's ``k-<id>-XXXXXXXX`` folder and nbgrader's
# paths must fit the 255-byte name limit), in NFC (an NFD name made on macOS, decomposed accents or Hangul
# Jamo, would be a second student who looks the same) and unchanged by NFKC, with no invisible filler
# (fullwidth ``ａｌｉｃｅ`` looks like ``alice``; U+3164 HANGUL FILLER shows as nothing).
STUDENT_ID_RE = re.compile(r"^[^\W_][\w.@+-]{0,63}\Z")
MAX_ID_BYTES = 64
# Default_Ignorable_Code_Point (Unicode's DerivedCoreProperties): shown as nothing. Those that are letters
# (the Hangul fillers) pass STUDENT_ID_RE; NFKC leaves U+115F and U+1160 as they are.
_IGNORABLE = ((0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
              (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
              (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
              (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))


# An honest notebook can be big with the outputs it was saved with (VS Code keeps 50 MB of a loop's prints); they are
# dropped as it is read (`load_notebook`; nbgrader clears them too). One over BIG_NOTEBOOK_BYTES is parsed while no
# other is, and only if it holds at most MAX_BIG_NOTEBOOK_ITEMS strings, objects and arrays (about 64 bytes each once
# parsed; 50 MB of prints: about a million lines): a big one costs the grading process about 0.5 GB at most, once.
MAX_NOTEBOOK_BYTES = 100 * 1024 * 1024
BIG_NOTEBOOK_BYTES = 16 * 1024 * 1024
MAX_BIG_NOTEBOOK_ITEMS = 3_000_000
# Objects and arrays nested in a notebook without its outputs: a saved one has about 10 (widget state in the metadata);
# nbgrader's recursive reading stopped on 960 ("RecursionError", the notebook `crashed`), the JSON reader on ~990.
MAX_NOTEBOOK_DEPTH = 100
_BIG_PARSE = threading.Lock()
_ARCHIVES = (".zip", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".7z", ".rar")


@dataclass
class Submission:
    student_id: str
    path: Path | None
    problem: str | None = None  # set when the entry is unusable (bad id, missing notebook)


class InvalidSubmission(Exception):
    pass


def printable(text: str) -> str:
    """`text` safe to print on a terminal: every character that is not printable (control characters such as a
    newline or ESC, format characters such as a bidi override, surrogates) becomes the escape that `repr`
    writes (``\\n``, ``\\x1b``, ``\\u202e``); printable text, backslashes included, stays as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def display_name(name: str) -> str:
    """A file name as text that can always be written (UTF-8) and printed: bytes that are not UTF-8 (a name made
    on Windows or an old Samba share, read here as surrogates) become ``\\xe9`` escapes, as elsewhere in the
    project, and characters that are not printable their `printable` escapes."""
    return printable(os.fsencode(name).decode("utf-8", "backslashreplace"))


def exact_name(name: str) -> str:
    """A file name shown so that two names never look the same: `display_name` with its own backslashes
    doubled (``\\xe9`` is the byte 0xE9, ``\\\\xe9`` a backslash, an x, an e and a 9)."""
    out = []
    for c in os.fsencode(name).decode("utf-8", "surrogateescape"):
        if c == "\\":
            out.append("\\\\")
        elif "\udc80" <= c <= "\udcff":
            out.append("\\x%02x" % (ord(c) - 0xDC00))
        else:
            out.append(printable(c))
    return "".join(out)


def id_problem(sid: str) -> str | None:
    """Why `sid` is no plain student id (see STUDENT_ID_RE), or None."""
    if not STUDENT_ID_RE.match(sid):
        return ("the student id is not a plain name (letters and digits of any script, then also _ . @ + -; "
                f"{MAX_ID_BYTES} bytes of UTF-8 at most)")
    size = len(sid.encode("utf-8"))
    if size > MAX_ID_BYTES:
        return (f"the student id is too long ({size} bytes of UTF-8, {MAX_ID_BYTES} at most: the file names "
                "made from it must fit)")
    if not unicodedata.is_normalized("NFC", sid):
        return ("the student id is not in Unicode NFC (decomposed accents or Hangul, as macOS writes names): "
                "it would be a second student who looks the same; rename it as typed")
    if unicodedata.normalize("NFKC", sid) != sid or any(lo <= ord(c) <= hi for c in sid for lo, hi in _IGNORABLE):
        return ("the student id has look-alike or invisible characters (fullwidth letters, compatibility forms, "
                "fillers): rename it in plain letters")
    return None


def is_plain_id(sid: str) -> bool:
    return id_problem(sid) is None


def _plain_id(name: str) -> tuple[str, str | None]:
    """(the student id of a file or folder name, why it is not a plain name, or None)."""
    sid = display_name(name)
    if sid != name:
        why = ("is not UTF-8" if os.fsencode(name).decode("utf-8", "replace") != name
               else "has characters that are not printable")
        return sid, f"the student id is not a plain name (the file name {why})"
    return sid, id_problem(sid)


def submissions_root(folder: Path) -> Path:
    """The folder whose entries are the students' (`folder` itself, or nbgrader's ``submitted/`` in it)."""
    return folder / "submitted" if (folder / "submitted").is_dir() else folder


def collect_submissions(folder, skipped: list | None = None) -> list[Submission]:
    """The submissions in `folder`, in either layout, sorted by student id.

    Entries that are no submission are left out; each is appended to `skipped` as ``(name, reason)`` (names
    as `display_name`), except hidden ones (``.DS_Store``, ``.ipynb_checkpoints``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder of submissions")
    from .course import CONFIG

    root = submissions_root(folder)
    if root == folder and (folder / CONFIG).is_file():  # its source/ and release/ are no students
        raise UserError(f"{folder}: a course folder without a submitted/ folder; give the folder that holds the "
                        "submissions")
    subs: dict[str, Submission] = {}
    entries = sorted(root.iterdir())
    # hidden files are no submissions: macOS leaves ``._alice.ipynb`` beside each file it copies to a share
    # ``.IPYNB``: a notebook saved on Windows or from a zip made there is a notebook all the same
    flat = [p for p in entries if p.suffix.lower() == ".ipynb" and not p.is_dir() and not p.name.startswith(".")]
    dirs = [p for p in entries if p.is_dir() and not p.name.startswith(".")]
    if skipped is not None:
        skipped += [(display_name(p.name), "not a .ipynb notebook" + (" (unpack an archive into the folder first)"
                                                                      if p.suffix.lower() in _ARCHIVES else ""))
                    for p in entries if not p.name.startswith(".") and p not in flat and p not in dirs]
    entries_of: dict[str, list[str]] = {}  # student id -> the entries that gave it (`exact_name`)
    elsewhere: dict[str, int] = {}  # folders found in student folders without the assignment -> how many had each

    def put(sub: Submission, entry: str) -> None:
        """Record `sub`; a second entry with the same student id (``alice.ipynb`` and ``alice/``; two names that
        display alike, such as the byte 0xE9 and a literal ``\\xe9``) makes one invalid row naming them all:
        no submission silently replaces another."""
        sid = sub.student_id
        entries_of.setdefault(sid, []).append(entry)
        if len(entries_of[sid]) == 1:
            subs[sid] = sub
        else:
            subs[sid] = Submission(sid, None, "two submissions for the same student id: "
                                   + ", ".join(entries_of[sid]) + "; keep one and grade again")

    for p in flat:
        sid, problem = _plain_id(p.stem)
        if problem:
            put(Submission(sid, p, problem), exact_name(p.name))
        elif not p.is_file():  # listed, never opened: reading a FIFO would wait for ever
            put(Submission(sid, None, "not a regular file (a FIFO, a device or a broken link)"), exact_name(p.name))
        else:
            put(Submission(sid, p), exact_name(p.name))
    for d in dirs:
        sid, problem = _plain_id(d.name)
        nb = d / spec.ASSIGNMENT / spec.NOTEBOOK
        if problem:
            put(Submission(sid, None, problem), exact_name(d.name) + "/")
        elif not (d / spec.ASSIGNMENT).is_dir() and d.suffix.lower() == ".ipynb":
            # ``alice.ipynb/`` in place of the file (a folder unpacked from a zip named like it): alice's row, invalid
            stem_id, stem_problem = _plain_id(d.stem)
            put(Submission(stem_id, None, stem_problem or f"{display_name(d.name)} is a folder, not a notebook file"),
                exact_name(d.name) + "/")
        elif not (d / spec.ASSIGNMENT).is_dir():
            if skipped is not None:  # a folder of something else (another assignment)
                skipped.append((sid + "/", f"a folder without {spec.ASSIGNMENT}/ inside"))
            with contextlib.suppress(OSError):
                for inner in sorted(d.iterdir())[:100]:
                    if inner.is_dir() and not inner.name.startswith("."):
                        elsewhere[display_name(inner.name)] = elsewhere.get(display_name(inner.name), 0) + 1
        elif nb.is_dir():  # (a notebook unpacked as a folder, a zip's folder named like the file)
            put(Submission(sid, None, f"{spec.ASSIGNMENT}/{spec.NOTEBOOK} in the submission is a folder, not a "
                           "notebook file"), exact_name(d.name) + "/")
        elif not nb.is_file():
            put(Submission(sid, None, f"no {spec.ASSIGNMENT}/{spec.NOTEBOOK} in the submission"
                           + _other_notebooks(d / spec.ASSIGNMENT)), exact_name(d.name) + "/")
        else:
            put(Submission(sid, nb), exact_name(d.name) + "/")
    if not subs:
        # a submitted/ tree of another assignment (`grade` given the wrong folder): say what its folders hold
        held = sorted(elsewhere, key=lambda k: (-elsewhere[k], k))[:3]
        found = ("; the student folders hold " + ", ".join(f"{k}/ ({elsewhere[k]} folder(s))" for k in held)
                 + f", not {spec.ASSIGNMENT}/, this course's assignment") if held else ""
        raise UserError(f"{display_name(str(folder))}: no submissions (expected <student_id>.ipynb files or "
                        f"submitted/<student>/{spec.ASSIGNMENT}/){found}")
    return [subs[k] for k in sorted(subs)]


def _other_notebooks(folder: Path) -> str:
    """A hint naming the notebooks that are in an assignment folder under another name (a browser's
    ``decode_scheduling (1).ipynb``, a copy in a subfolder), or ""."""
    try:
        found = sorted(p.relative_to(folder).as_posix() for pattern in ("*", "*/*") for p in folder.glob(pattern)
                       if p.suffix.lower() == ".ipynb" and not p.is_dir() and not any(
                           part.startswith(".") for part in p.relative_to(folder).parts))
    except OSError:
        return ""
    if not found:
        return ""
    names = ", ".join(display_name(n) for n in found[:3]) + (", ..." if len(found) > 3 else "")
    return f" (it holds {names}: rename the notebook to {spec.ASSIGNMENT}/{spec.NOTEBOOK})"


def _decode(data: bytes) -> str:
    """The notebook's text. JSON is UTF-8, but editors on Windows write a byte-order mark (Notepad: UTF-8 with a
    BOM; PowerShell 5's ``>`` and ``Out-File``: UTF-16): the content is the student's all the same, and nbgrader
    gets it re-encoded (`grader.autograde`). Raises InvalidSubmission for text in no Unicode encoding."""
    try:
        return data.decode(json.detect_encoding(data))  # utf-8-sig, utf-16, utf-32: the BOM is dropped
    except (UnicodeDecodeError, LookupError):
        raise InvalidSubmission("not a readable notebook (invalid JSON: the file is not UTF-8 text)") from None


_CONFLICT = re.compile(r"^(<{7}|>{7})( |$)", re.MULTILINE)


def _json_problem(text: str, exc: ValueError) -> str:
    """Why `text` is no JSON, in one line an instructor can act on."""
    if not text.strip():
        return "not a readable notebook: the file is empty" + (" (0 bytes)" if not text else " (only whitespace)")
    if _CONFLICT.search(text):
        return ("not a readable notebook (invalid JSON: it holds git merge-conflict markers, <<<<<<< and >>>>>>>; "
                "resolve the conflict and hand it in again)")
    where = f" at line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
    what = f": {exc.msg}" if isinstance(exc, json.JSONDecodeError) else ""
    return f"not a readable notebook (invalid JSON{where}{what})"


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
            raise _too_big(f"{st.st_size / 2**20:.0f} MiB (limit {MAX_NOTEBOOK_BYTES / 2**20:.0f} MiB")
        data = fh.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise InvalidSubmission(f"the notebook grew past {MAX_NOTEBOOK_BYTES / 2**20:.0f} MiB while it was read")
    items = too_many_values(data)
    if items:
        raise _too_big(f"{len(data) / 2**20:.0f} MiB of up to {items:,} JSON values "
                       f"(limit {MAX_BIG_NOTEBOOK_ITEMS:,} above {BIG_NOTEBOOK_BYTES / 2**20:.0f} MiB")
    with big_parse(data):
        nb = _parse(data)
        del data
        return _checked(nb)


def too_many_values(data: bytes) -> int:
    """For JSON over BIG_NOTEBOOK_BYTES, an upper bound on the values parsing it makes (every quote, brace and bracket,
    in strings too) where that is over MAX_BIG_NOTEBOOK_ITEMS; else 0 (it may be parsed)."""
    if len(data) <= BIG_NOTEBOOK_BYTES:
        return 0
    items = data.count(b'"') // 2 + data.count(b"{") + data.count(b"[")
    return items if items > MAX_BIG_NOTEBOOK_ITEMS else 0


def big_parse(data: bytes):
    """Held while JSON over BIG_NOTEBOOK_BYTES is parsed: one such parse at a time in the grading process."""
    return _BIG_PARSE if len(data) > BIG_NOTEBOOK_BYTES else contextlib.nullcontext()


def _too_big(size: str) -> InvalidSubmission:
    return InvalidSubmission(f"the notebook is {size}; mostly outputs? clear them, "
                             "`jupyter nbconvert --clear-output --inplace`, and grade again)")


def _checked(nb) -> dict:
    """`nb` if it is a notebook in nbformat 4 with well-formed cells, without the outputs it was saved with."""
    if isinstance(nb, dict) and type(nb.get("nbformat")) is int and 1 <= nb["nbformat"] <= 3:
        raise InvalidSubmission(f"not a Jupyter notebook in nbformat 4 (it is nbformat {nb['nbformat']}, an old "
                                "Jupyter format: open it in a current Jupyter and save it again)")
    if not isinstance(nb, dict) or nb.get("nbformat") != 4 or not isinstance(nb.get("cells"), list):
        raise InvalidSubmission("not a Jupyter notebook in nbformat 4")
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            raise InvalidSubmission("a cell is malformed")
        _cell_source(cell)
        if isinstance(cell.get("outputs"), list):
            cell["outputs"] = []  # what a past run printed: never graded, and nbgrader clears it as well
    from .observe import _too_deep

    if _too_deep(nb, MAX_NOTEBOOK_DEPTH):
        raise InvalidSubmission(_TOO_DEEP)
    lone = _lone_surrogate(nb)
    if lone:
        raise InvalidSubmission(f"not a readable notebook ({lone}: half of a UTF-16 pair, no Unicode text; a "
                                "generated or damaged file, not one Jupyter saved, and nbgrader cannot write it)")
    return nb


def _lone_surrogate(nb: dict) -> str | None:
    """Where `nb` (its outputs dropped) holds a lone surrogate, and which (``cell 3 holds \\ud800``), else None. JSON
    can write one (``"\\ud800"``) but UTF-8 cannot: nbgrader's autograde failed writing the notebook (a correct
    solution was `crashed`, graded again on every rerun), and the checks' process could not compile its cell."""
    parts = [(f"cell {i}", cell) for i, cell in enumerate(nb["cells"], start=1)]
    for where, part in [*parts, ("its metadata", {k: v for k, v in nb.items() if k != "cells"})]:
        try:
            json.dumps(part, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"{where} holds {printable(exc.object[exc.start])}"
    return None


_TOO_DEEP = (f"not a readable notebook (its JSON is nested too deep: over {MAX_NOTEBOOK_DEPTH} levels without "
             "its outputs; a generated or damaged file, not one Jupyter saved)")


# The first bytes of the compressed files and archives a notebook is handed in as (a browser's download of a
# `.ipynb.gz`, a zip renamed): what they are, never "invalid JSON" ("the file is not UTF-8 text" said a gzip file).
_PACKED = ((b"\x1f\x8b", "a gzip file"), (b"PK\x03\x04", "a zip archive"), (b"BZh", "a bzip2 file"),
           (b"\xfd7zXZ\x00", "an xz file"), (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
           (b"Rar!\x1a\x07", "a RAR archive"))


def _packed(data: bytes) -> str | None:
    """What compressed file or archive `data` is (see _PACKED; a tar archive by its ``ustar`` mark), or None."""
    if data[257:262] == b"ustar":
        return "a tar archive"
    return next((what for magic, what in _PACKED if data.startswith(magic)), None)


def _parse(data: bytes):
    """The JSON of a notebook file's bytes, or InvalidSubmission saying where it breaks (or what packed file it is:
    asked only of bytes that are no JSON, so no notebook is ever taken for one)."""
    try:
        return _parse_json(data)
    except InvalidSubmission:
        packed = _packed(data)
        if not packed:
            raise
    raise InvalidSubmission(f"not a readable notebook (the file is {packed}, not a notebook's JSON: unpack it and "
                            "hand in the .ipynb inside)")


def _parse_json(data: bytes):
    text = _decode(data)
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidSubmission(_TOO_DEEP) from None
    except ValueError as exc:
        raise InvalidSubmission(_json_problem(text, exc)) from None


def solution_source(nb: dict) -> str:
    return find_solution(nb)[0]


# The classes the solution cell defines (the seed's interface, kept by `grader.release.check_release`).
SOLUTION_CLASSES = ("RequestState", "DecodeSchedulerSim")


def norm_source(src: str) -> str:
    """A cell's source but for line endings (CRLF, CR) and whitespace at the ends of lines and of the cell."""
    return "\n".join(line.rstrip() for line in src.replace("\r\n", "\n").replace("\r", "\n").strip().split("\n"))


def _defines_solution_classes(source: str) -> bool:
    import ast

    from .evidence import parse_cell

    tree = parse_cell(source)
    names = {node.name for node in tree.body if isinstance(node, ast.ClassDef)} if tree is not None else set()
    return all(name in names for name in SOLUTION_CLASSES)


def find_solution(nb: dict) -> tuple[str, list[str]]:
    """(the solution cell's source, notes for the feedback); InvalidSubmission when there is none to grade.

    What an editor does to the cell is no reason to grade nothing: a copy of it made with Jupyter's "duplicate
    cell" or copy/paste (which keeps the grading metadata) that is the same code is graded once, and a solution
    cell that lost its nbgrader metadata (the student deleted the cell and typed a new one; an editor that drops
    metadata) is the one code cell without grading metadata that defines both classes. Copies that differ, or
    several such cells, stay `invalid`: which one the student means is theirs to say."""
    sols = [c for c in nb["cells"] if _nbgrader_meta(c).get("grade_id") == spec.SOLUTION_CELL]
    notes: list[str] = []
    if not sols:
        found = [c for c in nb["cells"] if c.get("cell_type") == "code" and not _nbgrader_meta(c).get("grade_id")
                 and _defines_solution_classes(_cell_source(c))]
        if not found:
            raise InvalidSubmission(f"no solution cell (the code cell with grade_id '{spec.SOLUTION_CELL}', "
                                    f"and no other code cell defines {' and '.join(SOLUTION_CLASSES)})")
        if any(norm_source(_cell_source(c)) != norm_source(_cell_source(found[0])) for c in found[1:]):
            raise InvalidSubmission(f"no solution cell (the code cell with grade_id '{spec.SOLUTION_CELL}'), and "
                                    f"{len(found)} different code cells define {' and '.join(SOLUTION_CLASSES)}: "
                                    "keep one and grade again")
        notes.append(f"the solution cell had lost its nbgrader metadata (grade_id {spec.SOLUTION_CELL}); the code cell "
                     f"that defines {' and '.join(SOLUTION_CLASSES)} was graded as the solution / 解答单元格丢失了 "
                     "nbgrader 元数据，已按定义了这两个类的代码单元格评分")
        return _cell_source(found[0]), notes
    if sols[0].get("cell_type") != "code":
        # Esc then M or R in Jupyter turns a cell into markdown or raw; its text is the code as typed, and nbgrader
        # itself turns the cell back (OverwriteCells), so plain nbgrader grades it as code too
        notes.append(f"the solution cell had been turned into a {sols[0].get('cell_type')} cell (M or R in command "
                     "mode?); it was graded as code, as nbgrader turns it back / 解答单元格被改成了非代码单元格，"
                     "已按代码评分")
    if len(sols) > 1:
        if any(norm_source(_cell_source(c)) != norm_source(_cell_source(sols[0])) for c in sols[1:]):
            raise InvalidSubmission(f"{len(sols)} cells claim to be the solution cell '{spec.SOLUTION_CELL}' and "
                                    "their code differs (a copy made with duplicate cell or copy/paste?): keep one "
                                    "and grade again")
        notes.append(f"{len(sols)} identical copies of the solution cell (duplicate cell or copy/paste); it was "
                     "graded once / 解答单元格有相同的副本，只评分一次")
    return _cell_source(sols[0]), notes


def student_code_cells(nb: dict) -> list[str]:
    """Sources of the code cells the student wrote: the solution cell and cells without grading metadata."""
    out = []
    for cell in nb["cells"]:
        meta = _nbgrader_meta(cell)
        if cell.get("cell_type") != "code" and meta.get("grade_id") != spec.SOLUTION_CELL:  # graded as code
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


def submitted_at(sub: Submission) -> str | None:
    """The text of nbgrader's ``timestamp.txt`` beside a submission of the ``submitted/<student>/{assignment}/``
    tree (`nbgrader collect` and the exchange write it: when the student submitted), for the gradebook, where
    ``nbgrader export`` shows it with the due date; none for a flat folder, or a file that is no short text."""
    import stat as _stat

    path = sub.path
    if path is None or path.parent.name != spec.ASSIGNMENT or path.parent.parent.name != sub.student_id:
        return None
    stamp = path.parent / "timestamp.txt"
    try:
        st = os.lstat(stamp)
        if not _stat.S_ISREG(st.st_mode) or st.st_size > 200:
            return None
        text = stamp.read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text.isprintable() and text else None


def _plain_file(path: Path, max_bytes: int) -> bool:
    """A regular file (not a link, FIFO or device the student planted), not too big, under a real folder."""
    import stat as _stat

    try:
        st = os.lstat(path)
        parent_real = os.path.realpath(path.parent) == os.path.abspath(path.parent)
    except OSError:
        return False
    return _stat.S_ISREG(st.st_mode) and st.st_size <= max_bytes and parent_real
