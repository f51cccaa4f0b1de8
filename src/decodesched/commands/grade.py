"""`decodesched grade SUBMISSIONS --out DIR`: autograde a folder of submissions, safely and in parallel.

See `decodesched.grader.pipeline` for what is run, the statuses and how scores are decided. The
course is ``--course DIR``, else the current directory when it holds ``nbgrader_config.py``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from ..errors import UserError


def _seconds(text: str) -> float:
    """Seconds from 1 to 3600, spelled as every number option is (`cli._decimal`: no `1_0`, `inf`, other digits)."""
    from ..cli import _decimal

    value = _decimal(text)
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}")
    if not math.isfinite(value) or not 1.0 <= value <= 3600.0:
        raise argparse.ArgumentTypeError(f"expected seconds between 1 and 3600, got {text!r}")
    return value


def _int_between(lo: int, hi: int, what: str):
    def parse(text: str) -> int:  # (spelled as in trace files: `trace.parse_decimal`, not `int`'s `1_0` or `٣`)
        from ..trace import parse_decimal

        try:
            value = parse_decimal(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number of {what}, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected {what} between {lo} and {hi}, got {text!r}")
        return value

    return parse


def add_parser(subparsers):
    p = subparsers.add_parser(
        "grade",
        help="autograde submissions with nbgrader, hidden tests judged outside the student's kernel",
        description="Grade a folder of <student_id>.ipynb files or nbgrader's submitted/<student>/<assignment>/ "
        "tree. Writes DIR/grades.csv, DIR/feedback/<student_id>.html and updates the course gradebook.",
    )
    p.add_argument("submissions", nargs="?", metavar="SUBMISSIONS", help="folder of submissions")
    p.add_argument("--out", metavar="DIR", help="output folder (grades.csv, feedback/)")
    p.add_argument("--course", metavar="DIR",
                   help="course folder (default: the current directory, when it holds nbgrader_config.py)")
    p.add_argument("--jobs", metavar="N", type=_int_between(0, 256, "jobs"), default=0,
                   help="submissions graded at once (default: all cores)")
    p.add_argument("--timeout", metavar="S", type=_seconds, default=120.0,
                   help="CPU seconds for each sandboxed run of a submission, all its processes together; "
                   "the wall clock is only a backstop that grows with the machine's load (default 120)")
    p.add_argument("--memory-mb", metavar="M", type=_int_between(64, 1 << 20, "MiB"), default=1024,
                   help="memory limit per submission in MiB (default 1024)")
    p.add_argument("--cell-timeout", metavar="S", type=_seconds, default=None,
                   help="nbgrader's per-cell timeout on a quiet machine (default timeout/3, at most 30)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (a bar on a terminal, else a line once both 10%% of the "
                        "submissions and 30 s have passed since the last)")
    p.add_argument("--regrade", action="store_true",
                   help="grade every submission again, taking none of the gradings that a stopped grading into "
                        "DIR kept (DIR/.decodesched/done/)")
    p.add_argument("--selfcheck", action="store_true",
                   help="grade the reference, the untouched release and the buggy-solution library; exit 1 if any "
                        "is misjudged")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    if args.selfcheck:
        from ..grader import selfcheck

        return int(selfcheck.main(course=args.course, jobs=args.jobs or None) or 0)
    if not args.submissions or not args.out:
        raise UserError("give SUBMISSIONS and --out DIR (or --selfcheck)")
    src = Path(args.submissions)
    if not src.is_dir():
        raise UserError(f"{src}: {'not a folder of submissions' if src.exists() else 'no such folder'}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder")
    if out.is_symlink() and not out.exists():
        raise UserError(f"{out}: a link to {os.readlink(out)}, which does not exist; make that folder or give "
                        "another --out")
    from ..grader import course, pipeline, sandbox

    course.require_nbgrader("decodesched grade")
    root = course.resolve_root(args.course)
    weak = sandbox.weak_isolation()  # after the arguments are checked: bad input stays one line
    if weak:
        print(f"decodesched grade: note: {weak}", file=sys.stderr)
    options = pipeline.Options(
        timeout_s=args.timeout, memory_mb=args.memory_mb, jobs=args.jobs or (os.cpu_count() or 1),
        cell_timeout_s=args.cell_timeout, progress=None if not args.no_progress else False, regrade=args.regrade,
    )
    missing: list = []  # (the roster's students who handed in nothing: grades.csv rows `missing`)
    results = pipeline.grade(src, out, course=root, options=options, missing=missing)
    counts = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    absent = f"; {len(missing)} missing (on the roster, no submission)" if missing else ""
    print(f"graded {len(results)} submission(s): {summary}{absent}; wrote {out / 'grades.csv'} and "
          f"{out / 'feedback'}/")
    return 0
