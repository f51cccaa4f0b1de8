"""The `decodesched` command line.

Each subcommand lives in its own module under `decodesched.commands` and exposes
``add_parser(subparsers)`` (which sets ``func`` on its parser) and a ``run(args) -> int``.
Bad input raises `UserError` (or `TraceError`): the command then prints one line and exits 2,
with no traceback.
"""

from __future__ import annotations

# Only what the interpreter has already loaded (the console script imports `re` itself): the command's
# modules, NumPy and Numba are imported inside `main`, where Ctrl-C ends the command with one line.
import os
import re
import sys


# Subcommand modules, in the order `--help` lists them; the actions of those that take one (their parsers'
# choices, tests/test_cli_stop57.py: known here before those modules are imported).
COMMANDS = ("simulate", "demo", "trace", "sweep", "warmup", "report", "assignment", "grade")
ACTIONS = {"trace": ("convert", "inspect"), "assignment": ("init", "build")}


def _prog_before_parsing(argv) -> str:
    """The name that a line printed before the arguments are parsed (a signal while the command's modules import)
    gives the command, as the parsed arguments would: ``decodesched trace convert`` where the first arguments name
    a subcommand (and its action), else ``decodesched``."""
    words = list(sys.argv[1:] if argv is None else argv)[:2]
    if not words or words[0] not in COMMANDS:
        return "decodesched"
    action = words[1] if len(words) > 1 and words[1] in ACTIONS.get(words[0], ()) else None
    return " ".join(filter(None, ("decodesched", words[0], action)))


def _interrupted_early(signum, frame):
    """SIGINT (or SIGTERM, SIGHUP) while the console script is still importing this module or calling `main` (before
    `main` can catch KeyboardInterrupt): one line and exit 128 + the signal, not Python's traceback (nor, for
    SIGTERM, an end with no line)."""
    import signal

    said = "interrupted" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"
    try:
        sys.stderr.write(f"{_prog_before_parsing(None)}: {said}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    raise SystemExit(128 + signum)


# Taken while at their start: SIGINT at Python's handler, the others (`_io.UNWINDING_SIGNALS`) at their default.
_EARLY_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def _run_as_command() -> bool:
    """Whether this process is the `decodesched` command (pip's console script, or ``python -m``)."""
    if __name__ == "__main__":
        return True
    path = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    name, folder = os.path.basename(path), os.path.basename(os.path.dirname(path))
    return name in ("decodesched", "decodesched-script.py", "decodesched-script.pyw") or \
        (name == "__main__.py" and folder.lower() in ("decodesched", "decodesched.exe"))  # (-m; pip's Windows launcher)


def _install_early_interrupt() -> None:
    import signal

    try:
        for name in _EARLY_SIGNALS:
            sig = getattr(signal, name, None)
            default = signal.default_int_handler if name == "SIGINT" else signal.SIG_DFL
            if sig is not None and signal.getsignal(sig) is default:  # (not someone else's, nor ignored)
                signal.signal(sig, _interrupted_early)
    except (ValueError, OSError):  # not the main thread
        pass


def _end_early_interrupt() -> None:
    """From here on Ctrl-C raises KeyboardInterrupt again (the commands and `immediate_interrupt` expect it), and
    SIGTERM and SIGHUP are at their default until `_io.terminate_like_interrupt` takes them."""
    import signal

    try:
        for name in _EARLY_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None and signal.getsignal(sig) is _interrupted_early:
                signal.signal(sig, signal.default_int_handler if name == "SIGINT" else signal.SIG_DFL)
    except (ValueError, OSError):
        pass


if _run_as_command():
    _install_early_interrupt()

from .errors import UserError  # noqa: E402


def _parser_class():
    import argparse

    class _Once(argparse._StoreAction):
        """argparse's store, except that an option given a second time is refused: argparse kept the last one unsaid
        (``sweep --policy fcfs --policy aging`` swept aging alone), where a value given twice inside one option is
        refused too."""

        namespace = None  # the one the option was stored into (each parse makes its own)

        def __call__(self, parser, namespace, values, option_string=None):
            if self.option_strings and namespace is self.namespace:
                parser.error(f"argument {'/'.join(self.option_strings)}: given more than once; give it once"
                             + (", with its values comma-separated" if "," in (self.metavar or "") else ""))
            self.namespace = namespace
            super().__call__(parser, namespace, values, option_string)

    class _Parser(argparse.ArgumentParser):
        _intermixing = False

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for name in (None, "store"):
                self.register("action", name, _Once)

        def parse_known_args(self, args=None, namespace=None):
            """argparse's, except that a command whose operand takes many values (``sweep TRACE...``) takes them
            among its options too, as GNU tools do: ``sweep a.csv --policy fcfs b.csv`` said "unrecognized
            arguments: b.csv".  After ``--`` every word is an operand, as before."""
            many = any(action.nargs in ("+", "*") for action in self._get_positional_actions())
            if self._intermixing or not many or "--" in (sys.argv[1:] if args is None else args):
                return super().parse_known_args(args, namespace)
            self._intermixing = True  # (argparse's intermixed parse calls this method for its two passes)
            try:
                return self.parse_known_intermixed_args(args, namespace)
            finally:
                self._intermixing = False

        def error(self, message):  # one line, exit 2 (argparse prints the usage block too by default)
            usage_error(self.prog, message)

        def _print_message(self, message, file=None):
            """As argparse's, but a write that fails is not passed over: ``--help`` or ``--version`` into a full
            disk or a closed pipe (under ``python -u``, where no buffer holds the text until the flush) exited 0;
            and into a closed standard output (`file` None: argparse's ``sys.stdout``) it went to stderr, exit 0."""
            if message:
                if file is None:
                    from ._io import CLOSED_STDOUT

                    raise UserError(CLOSED_STDOUT)
                try:
                    file.write(message)
                except AttributeError:  # (no stream at all)
                    pass
                except OSError as exc:
                    raise _stdout_failed(exc) if file is sys.stdout else exc from None

    return _Parser


def usage_error(prog: str, message: str):
    """A usage error's one line on stderr, then exit 2 (SystemExit, as argparse's own)."""
    try:
        sys.stderr.write(shorten(f"{prog}: error: {message} (see --help)") + "\n")
    except (OSError, ValueError, AttributeError):
        pass
    raise SystemExit(2)


def build_parser():
    """The command line's `argparse.ArgumentParser` (importing every subcommand's module)."""
    import importlib

    _Parser = _parser_class()
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


def int_arg(text: str) -> int:
    """An integer option value, spelled as in trace files: ASCII digits with an optional '-'."""
    import argparse

    from .trace import MAX_INT_DIGITS, parse_decimal

    try:
        return parse_decimal(text)
    except ValueError as exc:
        why = f" of at most {MAX_INT_DIGITS} digits" if str(exc) == "too many digits" else ""
        raise argparse.ArgumentTypeError(f"expected a whole number{why}, got {shorten(repr(text), 60)}") from None


def _int_in(text: str, lo: int, hi: int | None) -> int:
    """`int_arg` that also refuses values outside lo..hi (hi None: no upper bound), so that argparse's one
    line names the flag ("argument --kv-blocks: must be >= 0, got -1"), not the API's keyword."""
    import argparse

    value = int_arg(text)
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"from {lo} to {_POWERS.get(hi, hi)}"
        raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
    return value


_POWERS = {2**61: "2**61", 2**63 - 1: "2**63 - 1"}  # bounds written as `engine.check_config` writes them


def kv_blocks_arg(text: str) -> int:
    """A KV capacity option: 0 to `trace.MAX_TOTAL` blocks, the range `engine.check_config` takes."""
    from .trace import MAX_TOTAL

    return _int_in(text, 0, MAX_TOTAL)


def interval_arg(text: str) -> int:
    """An aging interval option: 1 to 2**63 - 1 steps, the range `engine.check_config` takes."""
    from .trace import INT64_MAX

    return _int_in(text, 1, INT64_MAX)


def steps_arg(text: str) -> int:
    """A step count option (--max-steps): 0 or more."""
    return _int_in(text, 0, None)


_DECIMAL = r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?"


def _decimal(text: str) -> float:
    """`text` as a number in ASCII decimal or exponent notation; NaN for anything else (inf, nan, digit
    separators or other scripts' digits, which `float` would take)."""
    import math

    s = text.strip()
    return float(s) if re.fullmatch(_DECIMAL, s, re.ASCII) else math.nan


def float_arg(text: str) -> float:
    """A finite number option value, in ASCII decimal or exponent notation (see `_decimal`)."""
    import argparse
    import math

    value = _decimal(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a number, got {shorten(repr(text), 60)}")
    return value


def positive_float_arg(text: str) -> float:
    """A positive, finite number option value, in ASCII decimal or exponent notation (see `_decimal`)."""
    import argparse
    import math

    value = _decimal(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {shorten(repr(text), 60)}")
    return value


def seed_arg(text: str) -> int:
    """A seed option: a whole number from 0 to 2**128 - 1 (NumPy's `SeedSequence` entropy is 128 bits)."""
    import argparse

    s = text.strip()
    if not (s.isascii() and s.isdigit() and len(s.lstrip("0")) <= 39 and int(s) < 2**128):
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to 2**128 - 1, got {shorten(repr(text), 60)}")
    return int(s)


MAX_MESSAGE = 300  # characters of an error line; longer values are shortened in the middle


def shorten(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` on one line, at most `limit` characters (the middle replaced by an ellipsis): runs of
    whitespace (newlines and carriage returns too) become one space, and the other characters a
    terminal would act on (ESC of an escape sequence, in a file name or a cell) Python escapes."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(str(text).split()))
    if len(text) <= limit:
        return text
    keep = limit - 1
    return text[: keep * 2 // 3] + "\u2026" + text[len(text) - (keep - keep * 2 // 3):]


def _os_message(exc: OSError) -> str:
    from ._io import _describe

    if exc.filename is None and isinstance(exc, FileNotFoundError):  # (`os.getcwd`'s, in a removed folder)
        try:
            os.getcwd()
        except FileNotFoundError:
            return "the current folder no longer exists (it was removed); cd to one that does"
    where = exc.filename if exc.filename is not None else ""
    if exc.filename2 is not None:
        where = f"{where} -> {exc.filename2}"
    return f"{where}: {_describe(exc)}" if where else _describe(exc)


def _stdout_failed(exc: OSError) -> OSError:
    """`_io.stdout_error`: a failed write to standard output as the error to raise."""
    from ._io import stdout_error

    return stdout_error(exc)


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except OSError as exc:
        raise _stdout_failed(exc) from None


def _silence(stream) -> None:
    """After a closed pipe: point `stream` (stdout, or stderr too) at /dev/null so that the exit flush
    does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def main(argv=None) -> int:
    """Run one command; bad input and OS errors print one line on stderr and return 2; Ctrl-C (even
    while the command's modules are still being imported) one line and 130.

    Library warnings (numpy, matplotlib, Numba) are not shown unless Python was asked for them
    (``-W`` or ``PYTHONWARNINGS``)."""
    signals, devnull, record_before, stdout_before, protected_before = _SignalRecord(), None, None, None, None
    try:
        _end_early_interrupt()
        import warnings

        from . import _io
        from ._io import terminate_like_interrupt

        record_before, _io.signal_record = _io.signal_record, signals.interrupt  # (`_io.stop_if_signalled`)
        protected_before, _io.protected_inputs = _io.protected_inputs, []  # (this command's: `_io.check_outputs`)
        _unraisable_interrupt_dropped.before.append(sys.unraisablehook)
        sys.unraisablehook = _unraisable_interrupt_dropped
        devnull = _closed_stderr_to_devnull()
        _lenient_text_streams()
        if sys.stdout is not None:
            stdout_before = sys.stdout
            sys.stdout = _io.NamedStdout(sys.stdout)
        with warnings.catch_warnings(), terminate_like_interrupt():
            if not sys.warnoptions:
                warnings.simplefilter("ignore")
            return _main(argv)
    except KeyboardInterrupt as exc:  # (before or after `_main`'s own handler: importing, unwinding)
        return _interrupted(_prog_before_parsing(argv), exc)
    except Exception as exc:
        from ._io import from_interrupt

        if from_interrupt(exc):  # Ctrl-C that Python wrapped on its way out
            return _interrupted(_prog_before_parsing(argv), KeyboardInterrupt())
        signum = signals.interrupt()
        if signum is not None:  # a signal that C code replaced (NumPy importing datetime: "PyCapsule_Import ...")
            from ._io import Terminated

            stop = Terminated(signum) if signum != signals.SIGINT else KeyboardInterrupt()
            return _interrupted(_prog_before_parsing(argv), stop)
        raise
    finally:
        if "decodesched._io" in sys.modules:
            sys.modules["decodesched._io"].signal_record = record_before
            sys.modules["decodesched._io"].protected_inputs = protected_before
            if isinstance(sys.stdout, sys.modules["decodesched._io"].NamedStdout):  # (else it was replaced meanwhile)
                sys.stdout = stdout_before
        if _unraisable_interrupt_dropped.before:
            hook = _unraisable_interrupt_dropped.before.pop()
            if sys.unraisablehook is _unraisable_interrupt_dropped:  # (else someone set theirs meanwhile: it stays)
                sys.unraisablehook = hook
        signals.close()
        if devnull is not None and sys.stderr is devnull:  # (None again for the caller, as it was)
            sys.stderr = None
            devnull.close()


def _unraisable_interrupt_dropped(unraisable) -> None:
    """`sys.unraisablehook` while a command runs: a Ctrl-C (or SIGTERM, SIGHUP) raised in a callback of C code (Numba's
    compiler calls back through ctypes) cannot propagate, and Python printed it with a traceback and went on; it is
    acted on at the command's next step instead (`_io.stop_if_signalled`, from the signal's record).  Anything else
    goes to the hook that was there before."""
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        (_unraisable_interrupt_dropped.before or [sys.__unraisablehook__])[-1](unraisable)


_unraisable_interrupt_dropped.before = []  # the hooks it replaced, innermost last (`main` may be called in `main`)


class _SignalRecord:
    """The signals that reached a Python handler while the command ran, as the interpreter's C-level handler records
    them (`signal.set_wakeup_fd`): a KeyboardInterrupt raised inside C code can come out as another exception with no
    trace of it (NumPy's extension imports `datetime` through ``PyCapsule_Import``, which replaces the interrupt by an
    ImportError), and the record tells such an exception from a bug.  Records nothing outside the main thread or where
    another wakeup fd is set (an event loop's); a child forked without exec records nothing into it."""

    write_fd = -1  # the wakeup fd while one is recording

    def __init__(self):
        import signal

        self.SIGINT, self.fds = signal.SIGINT, None
        try:
            fds = os.pipe()
        except OSError:
            return
        try:
            for fd in fds:
                os.set_blocking(fd, False)
            old = signal.set_wakeup_fd(fds[1], warn_on_full_buffer=False)
        except (ValueError, OSError):  # not the main thread
            old = None
        if old != -1:
            if old is not None:
                signal.set_wakeup_fd(old)
            for fd in fds:
                os.close(fd)
            return
        self.fds, _SignalRecord.write_fd = fds, fds[1]

    def interrupt(self):
        """The first recorded SIGINT, or signal of `_io.UNWINDING_SIGNALS`, as its number; None if none came."""
        import signal

        from ._io import _unwinding

        got = b""
        try:
            while self.fds is not None and (chunk := os.read(self.fds[0], 4096)):
                got += chunk
        except OSError:  # (none left: BlockingIOError)
            pass
        wanted = {int(self.SIGINT), *map(int, _unwinding(signal))}
        return next((signal.Signals(n) for n in got if n in wanted), None)

    def close(self):
        if self.fds is not None:
            _SignalRecord.stop()
            for fd in self.fds:
                os.close(fd)
            self.fds = None

    @staticmethod
    def stop():
        import signal

        if _SignalRecord.write_fd != -1:
            try:
                old = signal.set_wakeup_fd(-1)
                if old != _SignalRecord.write_fd:  # (someone set theirs meanwhile: theirs stays)
                    signal.set_wakeup_fd(old)
            except ValueError:  # (not the main thread)
                pass
            _SignalRecord.write_fd = -1


os.register_at_fork(after_in_child=_SignalRecord.stop)


def _interrupted(prog: str, exc: KeyboardInterrupt) -> int:
    """One line for Ctrl-C (or SIGTERM, SIGHUP: `_io.Terminated`) and its exit status, 128 + the signal."""
    signum = getattr(exc, "signum", None)
    try:
        print(f"{prog}: {exc if signum else 'interrupted'}", file=sys.stderr)
    except (OSError, ValueError):
        _silence(sys.stderr)
    return 128 + signum if signum else 130


def _closed_stderr_to_devnull():
    """Started with standard error closed (``cmd 2>&-``): its lines go nowhere, as under ``2>/dev/null``.  Python's
    ``sys.stderr`` is None then, and ``print(..., file=None)`` writes to standard output: the summary table of
    ``simulate --events -`` or ``sweep --out -`` went into the table on standard output, exit 0.  Returns the stream
    put in its place (`main` puts None back), or None.  A closed descriptor 2 becomes /dev/null, so that no file the
    command opens takes its number, where compiled code writes (the interrupt line of a replay)."""
    if sys.stderr is not None:
        return None
    try:
        try:
            os.fstat(2)
        except OSError:
            fd = os.open(os.devnull, os.O_WRONLY)
            if fd != 2:
                os.dup2(fd, 2)
                os.close(fd)
        sys.stderr = open(os.devnull, "w", encoding="utf-8")
    except OSError:
        return None
    return sys.stderr


def _lenient_text_streams() -> None:
    """A file name that is not valid UTF-8 (its bytes kept as surrogates) is printed escaped, where a
    strict UTF-8 stdout or stderr (a UTF-8 locale, PYTHONIOENCODING) would raise in the middle of the
    output.  Streams that already take them (the C locale's surrogateescape) are left as they are."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _main(argv) -> int:
    import csv

    prog = _prog_before_parsing(argv)  # (the subcommand's words once parsed)

    def fail(message: str, status: int = 2) -> int:
        try:
            if sys.stdout is not None:
                sys.stdout.flush()
        except (OSError, ValueError):
            _silence(sys.stdout)
        try:
            print(shorten(f"{prog}: error: {message}"), file=sys.stderr)
        except (OSError, ValueError):  # stderr went into the same closed pipe: the status says it
            _silence(sys.stderr)
        return status

    try:
        from ._numba_cache import check_environment

        check_environment()  # (before the commands' modules import Numba)
        parser = build_parser()
        try:
            args, extra = parser.parse_known_args(argv)
        except SystemExit as exc:  # --help or --version printed on stdout, or a usage error on stderr
            if exc.code == 0 and sys.stdout is not None:
                _flush_stdout()  # (its failure is handled below, not by the exit's flush: status 120)
            raise
        if getattr(args, "command", None):
            action = getattr(args, f"{args.command}_command", None)  # `trace convert`, `assignment build`
            prog = f"decodesched {args.command}" + (f" {action}" if action else "")
        if extra:  # (named by the subcommand that took the others, not by `decodesched` as `parse_args` does)
            usage_error(prog, f"unrecognized arguments: {' '.join(extra)}")
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        if sys.stdout is None:  # started with it closed (`cmd >&-`): print() would drop every line unseen
            from ._io import CLOSED_STDOUT

            return fail(CLOSED_STDOUT)
        status = int(args.func(args) or 0)
        _flush_stdout()  # what it printed, written while a failure is still the command's
        return status
    except UserError as exc:
        return fail(str(exc))
    except BrokenPipeError:
        _silence(sys.stdout)
        from ._io import CLOSED_PIPE

        return fail(CLOSED_PIPE)
    except OSError as exc:
        return fail(_os_message(exc))
    except csv.Error as exc:
        return fail(f"unreadable CSV ({exc})")
    except ValueError as exc:
        if not re.search(_INT_ERRORS, str(exc)):
            raise
        return fail(str(exc))
    except (AttributeError, NotImplementedError):  # a kernel run as plain Python (a command that asks no notice)
        from ._numba_cache import JIT_DISABLED, require_jit

        try:
            require_jit()
        except UserError:
            return fail(JIT_DISABLED)
        raise
    except KeyboardInterrupt as exc:
        return _interrupted(prog, exc)


# ValueErrors that are bad input, not bugs: Python's integer-parsing limits.
_INT_ERRORS = r"invalid literal for int|Exceeds the limit \(\d+ digits\)|integer string conversion"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
