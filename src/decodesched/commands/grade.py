"""`decodesched grade SUBMISSIONS --out DIR`: autograde a folder of submissions, safely and in parallel.

See `decodesched.grader.pipeline` for what is run, the statuses and how scores are decided.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError


def add_parser(subparsers):
    p = subparsers.add_parser(
        "grade",
        help="autograde submissions with nbgrader, hidden tests judged outside the student's kernel",
        description="Grade a folder of <student_id>.ipynb files or nbgrader's submitted/<student>/<assignment>/ "
        "tree. Writes DIR/grades.csv, DIR/feedback/<student_id>.html and updates the course gradebook.",
    )
    p.add_argument("submissions", nargs="?", help="folder of submissions")
    p.add_argument("--out", help="output folder (grades.csv, feedback/)")
    p.add_argument("--course", help="nbgrader course root (default: the assignments/ folder of this checkout)")
    p.add_argument("--jobs", type=int, default=0, help="submissions graded at once (default: all cores)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="wall-clock and CPU limit in seconds for each sandboxed run of a submission (default 120)")
    p.add_argument("--memory-mb", type=int, default=1024, help="memory limit per submission in MiB (default 1024)")
    p.add_argument("--cell-timeout", type=float, default=None, help="nbgrader's per-cell timeout (default timeout/3, at most 30)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--selfcheck", action="store_true",
                   help="grade the reference, the untouched release and the buggy-solution library; exit 1 if any is misjudged")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    if args.selfcheck:
        from ..grader import selfcheck

        return int(selfcheck.main(course=args.course, jobs=args.jobs or None) or 0)
    if not args.submissions or not args.out:
        raise UserError("give SUBMISSIONS and --out DIR (or --selfcheck)")
    if args.jobs < 0:
        raise UserError("--jobs must be >= 0")
    if not 0 < args.timeout < float("inf") or args.memory_mb < 64:  # `not 0 <` also refuses nan
        raise UserError("--timeout must be > 0 and --memory-mb >= 64")
    src = Path(args.submissions)
    if not src.is_dir():
        raise UserError(f"{src}: no such folder")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder")
    from ..grader import pipeline

    options = pipeline.Options(
        timeout_s=args.timeout, memory_mb=args.memory_mb, jobs=args.jobs or (os.cpu_count() or 1),
        cell_timeout_s=args.cell_timeout, progress=None if not args.no_progress else False,
    )
    results = pipeline.grade(src, out, course=args.course, options=options)
    counts = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    print(f"graded {len(results)} submission(s): {summary}; wrote {out / 'grades.csv'} and {out / 'feedback'}/")
    return 0
