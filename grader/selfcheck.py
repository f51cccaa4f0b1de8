"""Grader self-check: is the grader judging correctly?  (`decodesched grade --selfcheck`)

Three kinds of solution cells go through the same verdict path as real submissions (a notebook is
made from the release, its solution cell replaced, the cell read back by the pipeline's intake when
available, then `grader.verdict.verdict_for_source` in the sandbox):

* the reference solution (`grader/solutions/reference.py`) and the seed chapter's own reference
  (`grader/solutions/seed_reference.py`, a completed seed) must score full marks, status graded;
* the untouched release (the solution regions stripped by nbgrader's own ``ClearSolutions``) must
  score 0 on every graded cell;
* every one-bug mutant in `grader/mutants.py` must lose points, and every cell where it loses points
  must say why in a ``FAIL`` feedback line.

`run_selfcheck(jobs=None)` returns the table; `main()` prints it and returns 1 if a row is wrong.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import mutants, spec
from .limits import Limits
from .scenarios import build_scenarios
from .verdict import verdict_for_source

HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "solutions" / "reference.py"
SEED_REFERENCE = HERE / "solutions" / "seed_reference.py"


@dataclass
class Row:
    name: str
    expectation: str
    bug: str
    status: str = ""
    score: float = 0.0
    ok: bool = False
    detail: str = ""
    seconds: float = 0.0
    cells: dict = field(default_factory=dict)


@dataclass
class SelfcheckTable:
    rows: list[Row]
    seconds: float
    jobs: int

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def text(self) -> str:
        w = max(len(r.name) for r in self.rows)
        out = [f"{'solution':<{w}}  {'expect':<10} {'status':<9} {'score':>6}  verdict  detail"]
        for r in self.rows:
            out.append(f"{r.name:<{w}}  {r.expectation:<10} {r.status:<9} {r.score:6.2f}  "
                       f"{'ok' if r.ok else 'WRONG':<7}  {r.detail[:150]}")
        n_bad = sum(not r.ok for r in self.rows)
        out.append(f"{len(self.rows)} solutions checked in {self.seconds:.1f} s with {self.jobs} job(s): "
                   + ("all judged as expected" if not n_bad else f"{n_bad} misjudged"))
        return "\n".join(out)


def release_solution_source(reference: str | None = None) -> str:
    """The solution cell as the student receives it: nbgrader's ClearSolutions applied to the reference."""
    reference = REFERENCE.read_text(encoding="utf-8") if reference is None else reference
    try:
        import nbformat
        from nbgrader.preprocessors import ClearSolutions

        nb = nbformat.v4.new_notebook()
        cell = nbformat.v4.new_code_cell(reference)
        cell.metadata["nbgrader"] = {"grade": False, "grade_id": spec.SOLUTION_CELL, "locked": False,
                                     "schema_version": 3, "solution": True, "task": False}
        nb.cells = [cell]
        nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
        nb, _ = ClearSolutions().preprocess(nb, {})
        return nb.cells[0].source
    except ImportError:  # nbgrader is an optional dependency; the stub is the documented one
        pattern = re.compile(r"^( *)### BEGIN SOLUTION\n.*?^ *### END SOLUTION$", re.S | re.M)
        return pattern.sub(lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}raise NotImplementedError()", reference)


def _template_notebook() -> dict | None:
    release = spec.COURSE_ROOT / "release" / spec.ASSIGNMENT / spec.NOTEBOOK
    path = release if release.is_file() else spec.SOURCE_NOTEBOOK
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _through_intake(source: str, template: dict | None) -> str:
    """Put `source` into a notebook and read it back with the pipeline's intake (strict JSON checks)."""
    if template is None:
        return source
    try:
        from . import notebook as pipeline
    except ImportError:
        return source
    nb = copy.deepcopy(template)
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == spec.SOLUTION_CELL:
            cell["source"] = source
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dsched-selfcheck-") as tmp:
        path = Path(tmp) / "student.ipynb"
        path.write_text(json.dumps(nb), encoding="utf-8")
        return pipeline.find_solution(pipeline.load_notebook(path))[0]


def _judge_row(row: Row, source: str, limits: Limits) -> Row:
    start = time.monotonic()
    v = verdict_for_source(source, limits=limits)
    row.status, row.score = v.status, v.total
    row.cells = {k: c.score for k, c in v.cells.items()}
    row.seconds = time.monotonic() - start
    if row.expectation == "full":
        row.ok = v.status == "graded" and v.total == v.max_total
        row.detail = "full marks" if row.ok else "; ".join(
            f"{k}: {l}" for k, c in v.cells.items() if c.score < c.max_score for l in c.lines[:1])
    elif row.expectation == "zero":
        nonzero = [k for k, c in v.cells.items() if c.score > 0]
        row.ok = not nonzero and v.status == "graded"
        row.detail = "0 on every graded cell" if row.ok else f"points on {', '.join(nonzero) or '-'} (status {v.status})"
    else:
        lost = [(k, c) for k, c in v.cells.items() if c.score < c.max_score]
        explained = all(any(l.startswith("FAIL") for l in c.lines) for _, c in lost)
        row.ok = bool(lost) and explained and v.status == "graded" and v.total < v.max_total
        if not lost:
            row.detail = "NOT CAUGHT: full marks"
        else:
            k, c = lost[0]
            line = next((l for l in c.lines if l.startswith("FAIL")), "(no FAIL line)")
            if k == "hidden_differential":
                diff = next((l for l in c.lines if l.startswith("first difference")), "")
                line = f"{line}; {diff}" if diff else line
            row.detail = f"-{v.max_total - v.total:.2f} in {len(lost)} cell(s); {k}: {line}"
    return row


def run_selfcheck(jobs: int | None = None, *, limits: Limits | None = None) -> SelfcheckTable:
    start = time.monotonic()
    limits = limits or Limits(cpu_s=60.0, memory_mb=1024)
    template = _template_notebook()
    reference = REFERENCE.read_text(encoding="utf-8")
    items = [(Row("reference", "full", "the reference solution"), reference),
             (Row("release", "zero", "the untouched student release"), release_solution_source(reference))]
    if SEED_REFERENCE.is_file():
        items.insert(1, (Row("seed_reference", "full", "the seed chapter's own reference solution"),
                         SEED_REFERENCE.read_text(encoding="utf-8")))
    for mutant in mutants.MUTANTS:
        items.append((Row(mutant.name, "loses", mutant.bug), mutant.source(reference)))
    jobs = jobs or os.cpu_count() or 1
    build_scenarios()  # build (and cache) the scenarios once, before the threads start
    rows: list[Row] = []
    with cf.ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = [pool.submit(_judge_row, row, _through_intake(src, template), limits) for row, src in items]
        for fut in futs:
            rows.append(fut.result())
    return SelfcheckTable(rows=rows, seconds=time.monotonic() - start, jobs=jobs)


def main(course=None, jobs: int | None = None) -> int:
    """Print the self-check table; 0 when every solution is judged as expected, else 1."""
    table = run_selfcheck(jobs=jobs)
    print(table.text())
    return 0 if table.ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
