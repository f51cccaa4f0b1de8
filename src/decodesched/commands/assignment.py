"""`decodesched assignment init|build`: a course folder of one's own, and its checked student release.

    decodesched assignment init DIR
    decodesched assignment build [--course DIR] [--force]

``init`` writes a ready course into DIR (new or empty): the source notebook, ``nbgrader_config.py``
and a README for the instructor. ``build`` runs ``nbgrader generate_assignment`` in the course folder
(``--course DIR``, else the current directory when it holds ``nbgrader_config.py``) and checks the
release (`decodesched.grader.release`). Nothing is ever written into the installed package.
"""

from __future__ import annotations

import shlex
import sys

from ..errors import UserError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("assignment", help="make a course folder; build and check the student release",
                              description="A course folder of one's own (init), and its checked student release "
                              "(build).")  # (not this module's docstring: ``python -OO`` drops it)
    sub = p.add_subparsers(dest="assignment_command", metavar="ACTION")
    i = sub.add_parser("init", help="write a ready course folder (source notebook, nbgrader_config.py, README)",
                       description="Write a ready nbgrader course into DIR (new or empty): the source notebook, "
                       "nbgrader_config.py and a README for the instructor.")
    i.add_argument("dir", metavar="DIR", help="the course folder to make (new or empty)")
    b = sub.add_parser("build", help="run nbgrader generate_assignment and check the release",
                       description="Run nbgrader generate_assignment in the course folder and check the release "
                       "(solutions stripped, no hidden test, nbgrader validate, scores 0); a build that fails "
                       "leaves the release as it was (none, or the one --force would replace).")
    b.add_argument("--course", metavar="DIR", default=None,
                   help="course folder (default: the current directory, when it holds nbgrader_config.py)")
    b.add_argument("--force", action="store_true", help="overwrite an existing release")
    p.set_defaults(func=run)


def run(args) -> int:
    command = getattr(args, "assignment_command", None)
    if command == "init":
        from ..grader.course import init_course

        written = init_course(args.dir)
        root = written[0].parent
        print(f"course folder: {root} ({len(written)} files); next: cd {shlex.quote(str(root))} && "
              "decodesched assignment build")
        return 0
    if command == "build":
        from ..grader.release import build_release

        report = build_release(args.course, force=args.force)
        for line in report.checks:
            print(f"ok  {line}")
        print(f"release: {report.release} ({report.seconds:.1f} s)")
        for line in report.notes:
            print(f"decodesched assignment build: note: {line}", file=sys.stderr)
        return 0
    raise UserError("say what to do: decodesched assignment init DIR | build [--course DIR] [--force]")
