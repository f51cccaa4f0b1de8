"""The student release: made with real nbgrader, then checked before it may be handed out.

`build_release(course)` runs ``nbgrader generate_assignment decode_scheduling`` in the course
folder, then `check_release`: every solution region is stripped (the stub raises
``NotImplementedError``), no hidden test line survives, the solution cell keeps the seed's
interface, every graded cell of `grader.spec` is there with its points, ``nbgrader validate``
passes on the source and fails on every test cell of the release (``--invert`` passes), and the
release's solution cell scores 0 on every graded cell with the grader's own checks. Any failure
raises `UserError` and removes the release it just made (a release that leaks solutions or hidden
tests must not be handed out).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from decodesched.errors import UserError

from . import spec

SEED_METHODS = ("__init__", "enqueue", "_effective_priority", "_remaining_steps", "_schedule_key",
                "_ensure_capacity", "step", "run")
VALIDATE_OK = "Success! Your notebook passes all the tests."
INVERT_OK = "Success! The notebook does not pass any tests."


@dataclass
class BuildReport:
    course: Path
    release: Path
    checks: list[str] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # for the instructor, on stderr (`tests_not_graded_as_written`)


def _nbgrader_env() -> dict:
    env = dict(os.environ)
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")  # nbgrader calls `alembic` by name
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def _nbgrader(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "nbgrader", *args]
    try:
        return subprocess.run(cmd, cwd=cwd, env=_nbgrader_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise UserError(f"nbgrader {args[0]} did not finish within {timeout:g} s") from exc


# the last line of a Python traceback: ``package.module.SomeError: what went wrong``
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception)): (.+)$")


def _last_line(text: str) -> str:
    """What nbgrader's output says went wrong, in one line: the first exception it printed (its cause; nbgrader
    ends with "Please see the above traceback"), else its last error line, else its last line."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    for ln in lines:
        match = _EXCEPTION_LINE.match(ln)
        if match:
            return f"{match.group(1)}: {match.group(2)}"[:300]
    errors = [ln for ln in lines if "ERROR" in ln or "Error" in ln]
    return (errors[-1] if errors else (lines[-1] if lines else "no output"))[:300]


def _cells(nb: dict) -> dict[str, dict]:
    out = {}
    for cell in nb.get("cells", []):
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid:
            out[gid] = cell
    return out


def _src(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def _hidden_lines(source_nb: dict) -> list[str]:
    lines = []
    for cell in source_nb["cells"]:
        inside = False
        for ln in _src(cell).splitlines():
            if "BEGIN HIDDEN TESTS" in ln:
                inside = True
                continue
            if "END HIDDEN TESTS" in ln:
                inside = False
                continue
            if inside and ln.strip() and not ln.strip().startswith("#"):
                lines.append(ln.strip())
    return lines


def _solution_lines(source_nb: dict) -> list[str]:
    lines = []
    for cell in source_nb["cells"]:
        inside = False
        for ln in _src(cell).splitlines():
            if "BEGIN SOLUTION" in ln:
                inside = True
                continue
            if "END SOLUTION" in ln:
                inside = False
                continue
            if inside and len(ln.strip()) > 12 and not ln.strip().startswith("#"):
                lines.append(ln.strip())
    return lines


def _signatures(source: str) -> dict[str, str]:
    tree = ast.parse(source)
    sigs = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            sigs[node.name] = "class"
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    sigs[f"{node.name}.{item.name}"] = ast.unparse(item.args)
    return sigs


def check_release(source_nb: dict, release_nb: dict) -> list[str]:
    """Static checks of a release against its source; raises UserError on the first failure."""
    done = []
    rel_text = json.dumps(release_nb, ensure_ascii=False)
    if "BEGIN SOLUTION" in rel_text or "END SOLUTION" in rel_text:
        raise UserError("the release still contains a solution region marker")
    rel_cells = _cells(release_nb)
    if spec.SOLUTION_CELL not in rel_cells:
        raise UserError(f"the release has no solution cell {spec.SOLUTION_CELL!r}")
    sol = _src(rel_cells[spec.SOLUTION_CELL])
    src_sol = _src(_cells(source_nb)[spec.SOLUTION_CELL])
    # A solution line leaks when it shows up in the release, unless the seed's given code has it too.
    given = set()
    inside = False
    for ln in src_sol.splitlines():
        if "BEGIN SOLUTION" in ln:
            inside = True
        elif "END SOLUTION" in ln:
            inside = False
        elif not inside:
            given.add(ln.strip())
    release_lines = {ln.strip() for cell in release_nb["cells"] for ln in _src(cell).splitlines()}
    leaked = [ln for ln in _solution_lines(source_nb) if ln not in given and ln in release_lines]
    if leaked:
        raise UserError(f"solution code leaked into the release: {leaked[0]!r}")
    stubs = sol.count("raise NotImplementedError")
    if stubs < 4:
        raise UserError(f"the release's solution cell has {stubs} NotImplementedError stubs, expected one per TODO (4)")
    done.append(f"solutions stripped ({stubs} stubs raise NotImplementedError)")
    if "HIDDEN TESTS" in rel_text:
        raise UserError("the release still contains a hidden-test marker")
    visible = set()
    for cell in source_nb["cells"]:
        inside = False
        for ln in _src(cell).splitlines():
            if "BEGIN HIDDEN TESTS" in ln:
                inside = True
            elif "END HIDDEN TESTS" in ln:
                inside = False
            elif not inside:
                visible.add(ln.strip())
    for ln in _hidden_lines(source_nb):
        if ln not in visible and ln in release_lines:
            raise UserError(f"a hidden test line leaked into the release: {ln[:80]!r}")
    done.append(f"hidden tests absent ({len(_hidden_lines(source_nb))} hidden lines checked)")
    try:
        rel_sigs = _signatures(sol)
    except SyntaxError as exc:
        raise UserError(f"the release's solution cell is not valid Python: {exc.msg} (line {exc.lineno})") from exc
    src_sigs = _signatures(src_sol)
    for name in ("RequestState", "DecodeSchedulerSim") + tuple(f"DecodeSchedulerSim.{m}" for m in SEED_METHODS):
        if name not in rel_sigs or rel_sigs.get(name) != src_sigs.get(name):
            raise UserError(f"the release's solution cell changed the seed's interface at {name}")
    done.append("solution cell keeps the seed's interface (RequestState, DecodeSchedulerSim and its 8 methods)")
    for c in spec.CELLS:
        for label, nb_cells in (("source", _cells(source_nb)), ("release", rel_cells)):
            cell = nb_cells.get(c.grade_id)
            meta = (cell or {}).get("metadata", {}).get("nbgrader", {})
            if cell is None or not meta.get("grade") or meta.get("points") != c.points:
                raise UserError(f"the {label} notebook lacks graded cell {c.grade_id!r} worth {c.points} points")
    done.append(f"{len(spec.CELLS)} graded cells with {spec.MAX_SCORE} points, as grader/spec.py says")
    return done


def tests_not_graded_as_written(source_nb: dict) -> list[str]:
    """The graded test cells whose program (comments aside) differs from the package's template notebook: their
    points come from the grader's own checks (`grader.scenarios`, the visible cells' mirrors included), never from
    the notebook's code, so an edit there changes what students see and run, not their grade."""
    template = _cells(json.loads(spec.SOURCE_NOTEBOOK.read_text(encoding="utf-8")))
    mine = _cells(source_nb)
    changed = []
    for c in spec.CELLS:
        try:
            same = ast.dump(ast.parse(_src(mine[c.grade_id]))) == ast.dump(ast.parse(_src(template[c.grade_id])))
        except (KeyError, SyntaxError, ValueError):
            same = False
        if not same:
            changed.append(c.grade_id)
    return changed


def build_release(course=None, *, force: bool = False, judge_release: bool = True) -> BuildReport:
    start = time.monotonic()
    from .course import build_locked, require_nbgrader, resolve_root

    require_nbgrader("decodesched assignment build")
    course = resolve_root(course)
    with build_locked(course, exclusive=True):
        return _build(course, force, judge_release, start)


def _build(course: Path, force: bool, judge_release: bool, start: float) -> BuildReport:
    source = course / "source" / spec.ASSIGNMENT / spec.NOTEBOOK
    if not source.is_file():
        raise UserError(f"{source}: no source notebook")
    release_dir = course / "release" / spec.ASSIGNMENT
    release = release_dir / spec.NOTEBOOK
    previous = _previous_release(course)
    if release_dir.exists() and not force:
        raise UserError(f"{release_dir} exists; pass --force to rebuild it")
    try:
        source_nb = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{source}: unreadable notebook ({exc})") from exc

    ok = False
    # What nbgrader makes on a first build (its gradebook, the release/ folder): a build that fails removes them.
    made = [p for p in (course / "gradebook.db", course / "release") if not p.exists()]
    if release_dir.exists():  # kept aside until the new release has passed its checks
        release_dir.rename(previous)
    try:
        args = ["generate_assignment", spec.ASSIGNMENT] + (["--force"] if force else [])
        proc = _nbgrader(args, course)
        if proc.returncode != 0 or not release.is_file():
            raise UserError(f"nbgrader generate_assignment failed: {_last_line(proc.stdout + proc.stderr)}")
        report = BuildReport(course=course, release=release)
        report.checks.append("nbgrader generate_assignment made the release")
        release_nb = json.loads(release.read_text(encoding="utf-8"))
        report.checks.extend(check_release(source_nb, release_nb))

        proc = _nbgrader(["validate", str(source.relative_to(course))], course)
        if VALIDATE_OK not in proc.stdout + proc.stderr:
            raise UserError(f"nbgrader validate fails on the source notebook: {_last_line(proc.stdout + proc.stderr)}")
        report.checks.append("nbgrader validate passes on the source")
        proc = _nbgrader(["validate", "--invert", str(release.relative_to(course))], course)
        if INVERT_OK not in proc.stdout + proc.stderr:
            raise UserError("nbgrader validate --invert fails on the release: some test cell passes without a solution")
        report.checks.append("nbgrader validate --invert passes on the release (every test cell fails)")

        if judge_release:
            from .verdict import verdict_for_source

            verdict = verdict_for_source(_src(_cells(release_nb)[spec.SOLUTION_CELL]), shrink_failures=False)
            nonzero = [k for k, v in verdict.cells.items() if v.score > 0]
            if nonzero:
                raise UserError(f"the release's own solution cell scores points on {', '.join(nonzero)}")
            report.checks.append("the release's solution cell scores 0 on every graded cell (grader checks)")
        from .course import remember_release

        for made in (previous / spec.NOTEBOOK, release):  # the one students may hold, and the one they will get
            if made.is_file():
                remember_release(course, made)
        changed = tests_not_graded_as_written(source_nb)
        if changed:
            report.notes.append(
                f"these test cells differ from the template's: {', '.join(changed)}; `decodesched grade` scores every "
                "test cell with its own checks (grader/scenarios.py), never with the notebook's test code, so this "
                "edit changes what students see and run, not how they are graded")
        ok = True
        report.seconds = time.monotonic() - start
        return report
    finally:
        if not ok and release_dir.exists():
            shutil.rmtree(release_dir, ignore_errors=True)
        if previous.exists():
            if ok:
                shutil.rmtree(previous, ignore_errors=True)
            else:  # a rebuild that failed (or was interrupted) leaves the release it replaced
                previous.rename(release_dir)
        if not ok:
            _remove_made(made)


def _remove_made(paths: list[Path]) -> None:
    """Remove what a failed first build made (a folder only while empty): the course is left as it was."""
    for path in paths:
        with contextlib.suppress(OSError):
            path.rmdir() if path.is_dir() else path.unlink()


def _previous_release(course: Path) -> Path:
    """Where `build_release` keeps the release it is replacing; one that a killed build left there is put back
    first (or dropped, when a release was made after it)."""
    previous = course / "release" / f".{spec.ASSIGNMENT}.previous"
    if previous.exists():
        release_dir = course / "release" / spec.ASSIGNMENT
        if release_dir.exists():
            shutil.rmtree(previous)
        else:
            previous.rename(release_dir)
    return previous
