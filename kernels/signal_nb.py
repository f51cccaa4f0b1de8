"""A signal handler in machine code, for the blocks where a kernel holds the interpreter.

Python's own handler only sets a flag that the interpreter reads between bytecodes, so while a Numba
kernel runs (minutes, for a long replay) Ctrl-C would do nothing until it returns.
`decodesched._io.immediate_interrupt` points SIGINT (and SIGTERM, SIGHUP where the CLI unwinds on
them) at `exit_on_signal_nb` instead: one line on stderr, as the CLI writes for an interrupt it
catches, and exit status 128 + the signal, with nothing but async-signal-safe calls (write, _exit).
"""

import signal

import numpy as np
from numba import cfunc, types

_write = types.ExternalFunction("write", types.intp(types.intc, types.voidptr, types.uintp))
_exit = types.ExternalFunction("_exit", types.void(types.intc))


def _line(text: str) -> np.ndarray:
    return np.frombuffer(f"decodesched: {text}\n".encode(), np.uint8).copy()


SIGINT, SIGTERM, SIGHUP = (int(getattr(signal, name, -1)) for name in ("SIGINT", "SIGTERM", "SIGHUP"))
INTERRUPTED = _line("interrupted")
TERMINATED = _line("terminated (SIGTERM)")
HUNG_UP = _line("terminated (SIGHUP)")


@cfunc(types.void(types.intc), cache=True)
def exit_on_signal_nb(signum):
    if signum == SIGTERM:
        _write(2, TERMINATED.ctypes.data, TERMINATED.size)
    elif signum == SIGHUP:
        _write(2, HUNG_UP.ctypes.data, HUNG_UP.size)
    else:
        _write(2, INTERRUPTED.ctypes.data, INTERRUPTED.size)
    _exit(128 + signum)
