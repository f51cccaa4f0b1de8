"""The `decodesched` command line.

Each subcommand lives in its own module under `decodesched.commands` and exposes
``add_parser(subparsers)`` (which sets ``func`` on its parser) and a ``run(args) -> int``.
Bad input raises `UserError` (or `TraceError`): the command then prints one line and exits 2,
with no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import UserError

# Subcommand modules, in the order `--help` lists them.
COMMANDS = ("simulate", "demo", "trace", "sweep", "warmup", "report", "assignment", "grade")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints the usage block too by default)
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="decodesched", description="Fast, exact LLM decode-scheduling simulator and course unit.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"decodesched {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f".commands.{name}", __package__)
        except ModuleNotFoundError as exc:
            if exc.name == f"{__package__}.commands.{name}":
                continue  # a subcommand that is not built yet
            raise
        module.add_parser(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"decodesched {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"decodesched {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
