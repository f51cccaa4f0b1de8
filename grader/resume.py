"""Kept gradings: a grading that stops (Ctrl-C, SIGTERM, a reboot, a gradebook locked at the end) is resumed.

Every submission's finished grading (its `pipeline.Result`, all that `render_outputs`, `_commit` and the gradebook
need) is written as it finishes to ``DIR/.decodesched/done/<key>.json`` (a temporary file renamed into place), and a
rerun into the same ``--out DIR`` takes a kept grading whose key matches instead of running the submission again:
the outputs are those of a grading that was never stopped (they are still committed all together, `_commit`).

The key (`Resume.key`) is a SHA-256 of all a verdict depends on: the student id and the submission's bytes, the
release and the earlier releases (`course.Course`), the limits and options that change a verdict (CPU and memory
limits, the per-cell timeout as given, the paths hidden from the sandbox), who grades (root, isolation), the
Python and nbgrader versions, and every file of the grader's own code (the package: the checks, the hidden tests,
the reference model), so a new grader version never takes an old verdict.

Only ``graded`` and ``tampered`` are kept (`status.KEPT`): ``timeout``, ``memory`` and ``crashed`` depend on the
machine (its load, an abort in the Jupyter stack, a grader error) and are graded again; ``invalid`` costs nothing to
grade again. A file is taken only if it verifies: a regular file (no link) owned by this user with one name, in
folders of this user's that no one else can write, of this format, naming its own key and the student, with the
SHA-256 of its content, and values of the right types; anything else is ignored and the submission graded again.
Students cannot write DIR (the sandbox hides it); where submissions run with the grader's own access to files
(`sandbox.weak_isolation`) nothing is kept or taken, as their code could plant a file. After a commit the files of
that grading are removed (the outputs hold its verdicts now); ``--regrade`` takes none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import stat
import sys
import tempfile
from pathlib import Path

from . import spec
from .status import KEPT

FORMAT = "decodesched-kept-1"
FOLDER = Path(".decodesched") / "done"
_MAX_BYTES = 64 * 2**20


def code_digest() -> str:
    """SHA-256 of every file of the grader's own code: the `decodesched` package with the grader, the kernels
    and the assignment (`package_digest`: caches left out)."""
    import decodesched
    import decodesched.assignments
    import decodesched.grader
    import decodesched.kernels
    from decodesched.checkpoint import package_digest

    return package_digest((decodesched, decodesched.grader, decodesched.kernels, decodesched.assignments),
                          every_file=True)


def _nbgrader_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nbgrader")
    except PackageNotFoundError:
        return None


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(",", ":"), default=str).encode()


def _owned_private_folder(path: Path) -> bool:
    """`path` is a folder (no link) of this user's that no other user can write into."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


class Resume:
    """The kept gradings of one grading into `out_dir` (`enabled` False: none taken, none kept)."""

    def __init__(self, out_dir: Path, course, options, limits, *, regrade: bool = False, enabled: bool = True):
        self.folder = Path(out_dir) / FOLDER
        self.regrade = regrade
        self.enabled = enabled
        self.written: set[Path] = set()  # this grading's own files (kept, or taken), removed after its commit
        self.made = [p for p in (self.folder.parent, self.folder) if not p.exists() and not p.is_symlink()]
        if not enabled:
            return
        from .sandbox import weak_isolation

        context = {
            "format": FORMAT, "code": code_digest(), "python": sys.version, "nbgrader": _nbgrader_version(),
            "release": course.release, "earlier": course.earlier, "euid": os.geteuid(), "weak": weak_isolation(),
            "limits": dataclasses.asdict(limits), "timeout_s": options.timeout_s, "memory_mb": options.memory_mb,
            "cell_timeout_s": options.cell_timeout_s, "run_nbgrader": options.run_nbgrader,
        }
        self.context = hashlib.sha256(_canonical(context)).hexdigest()

    def key(self, sub) -> str | None:
        """The key of `sub`'s grading, None for a submission that is never kept (an unusable entry)."""
        if not self.enabled or sub.problem or sub.path is None:
            return None
        digest = hashlib.sha256()
        try:  # (a FIFO or device handed in is never waited on: it is `invalid`, never kept)
            fd = os.open(sub.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            while chunk := os.read(fd, 1 << 20):
                digest.update(chunk)
        except OSError:
            return None
        finally:
            os.close(fd)
        return hashlib.sha256(_canonical([self.context, sub.student_id, digest.hexdigest()])).hexdigest()

    def take(self, sub):
        """The kept grading of `sub` whose key matches, verified, as a `pipeline.Result`; else None."""
        key = self.key(sub)
        if key is None or self.regrade or not all(map(_owned_private_folder, (self.folder.parent, self.folder))):
            return None
        path = self.folder / f"{key}.json"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
                return None
            data = os.read(fd, _MAX_BYTES + 1)  # (one read: a kept file is far smaller)
        except OSError:
            return None
        finally:
            os.close(fd)
        result = _load(data, key, sub.student_id) if len(data) <= _MAX_BYTES else None
        if result is not None:
            self.written.add(path)
        return result

    def keep(self, sub, result, before: str | None) -> None:
        """Write `result` as `sub`'s kept grading: only a status that does not depend on the machine, only if the
        submission's key is still `before` (its key as its grading began: a file edited or replaced while it was
        graded would be kept under the new bytes' key with the old bytes' verdict, and a rerun would take it), and
        only if it reads back as the same outputs (its feedback page byte for byte). Never fails the grading."""
        from .feedback import feedback_html

        key = self.key(sub)
        if key is None or key != before or result.status not in KEPT:
            return
        try:
            fields = {k: v for k, v in dataclasses.asdict(result).items() if k != "timestamp"}
            body = json.dumps(fields, ensure_ascii=True)  # (key order kept: the page is drawn from these dicts)
            text = json.dumps({"format": FORMAT, "key": key, "sha256": hashlib.sha256(body.encode()).hexdigest(),
                               "result": fields}, ensure_ascii=True)
        except (TypeError, ValueError, RecursionError):  # not plain JSON: graded again on a rerun
            return
        again = _load(text.encode(), key, sub.student_id)
        if again is None or feedback_html(again) != feedback_html(result) or _row(again) != _row(result):
            return
        with contextlib.suppress(OSError):
            for folder in (self.folder.parent, self.folder):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(folder, 0o700)
            if not all(map(_owned_private_folder, (self.folder.parent, self.folder))):
                return
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.folder)
            try:
                with os.fdopen(fd, "w", encoding="ascii") as fh:
                    fh.write(text)
                os.replace(tmp, self.folder / f"{key}.json")  # (a link planted there is replaced, not followed)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self.written.add(self.folder / f"{key}.json")

    def forget(self, everything: bool = False) -> None:
        """Remove this grading's files (after its commit), or none of them (`everything` False, after a stop:
        a rerun takes them); then the folders this grading made, where empty, and the kept folder if empty."""
        if everything:
            for path in self.written:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        for folder in (self.folder, self.folder.parent):
            if everything or folder in self.made:
                with contextlib.suppress(OSError):
                    folder.rmdir()  # (only where empty: another grading into DIR may be keeping its own)


def _row(r) -> tuple:
    """What grades.csv and the gradebook take from a result."""
    return (r.student_id, r.status, r.score, r.max_score, [(c, r.cells[c]) for c in spec.CELL_IDS])


def _is_lines(value) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def _load(data: bytes, key: str, student_id: str):
    """The `pipeline.Result` of a kept file's bytes, or None when anything in it does not verify."""
    from .pipeline import Result

    try:
        doc = json.loads(data.decode("ascii"))
        fields = doc["result"]
        body = json.dumps(fields, ensure_ascii=True)
        if (doc.get("format") != FORMAT or doc.get("key") != key
                or doc.get("sha256") != hashlib.sha256(body.encode()).hexdigest()):
            return None
        numbers = [fields["score"], fields["max_score"], fields["seconds"], *fields["cells"].values()]
        if (fields["student_id"] != student_id or fields["status"] not in KEPT
                or sorted(fields["cells"]) != sorted(spec.CELL_IDS)
                or not all(type(x) in (int, float) and math.isfinite(x) for x in numbers)
                or not isinstance(fields["lines"], dict) or not all(map(_is_lines, fields["lines"].values()))
                or not _is_lines(fields["notes"]) or not isinstance(fields["pictures"], dict)
                or set(fields) != {f.name for f in dataclasses.fields(Result)} - {"timestamp"}):
            return None
        return Result(**{**fields, **{k: float(fields[k]) for k in ("score", "max_score", "seconds")},
                         "cells": {c: float(v) for c, v in fields["cells"].items()}})
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
