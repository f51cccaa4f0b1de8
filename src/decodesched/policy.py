"""User-defined scheduling policies (SPEC section 8).

A `Policy` is a name and two ``@numba.njit`` functions of ``(r, clock)``, where ``r`` is a
`RequestView` (one request's state as a named tuple of integers):

* ``key(r, clock)``: a tuple of integers; candidates are walked smallest first by
  ``key(r, clock) + (r.request_id,)``;
* ``effective_priority(r, clock)``: an integer; a request may preempt one admitted, preemptible
  request of strictly lower effective priority, the first in order ``(effective_priority,
  -required_blocks, request_id)`` whose blocks are enough.

Everything else is SPEC section 2's step and section 3's trace replay.  A `Policy` is accepted
wherever a policy name is: `decodesched.simulate`, `simulate_batch`/`grid`, `DecodeSchedulerSim`
(which calls the functions' Python versions, ``.py_func``) and ``sweep --policy module:attr``.

>>> import numba
>>> from decodesched import Policy, simulate
>>> @numba.njit
... def shortest_first(r, clock):
...     return (r.phase, r.max_new_tokens - r.generated_len)
>>> @numba.njit
... def business(r, clock):
...     return r.priority
>>> sjf = Policy("sjf", key=shortest_first, effective_priority=business)
>>> trace = {"request_id": [1, 2], "arrival_step": [0, 0], "prompt_len": [4, 4], "max_new_tokens": [3, 1],
...          "priority": [0, 0], "cache_hit": [False, False], "required_blocks": [1, 1],
...          "deadline_step": [None, None], "preemptible": [True, True]}
>>> [e["request_id"] for e in simulate(trace, sjf, free_kv_blocks=4).timeline()]
[2, 1, 2, 1, 1, 1]

User policies run on the generic scan kernel (`decodesched.kernels.scan_nb`), compiled once per
process (Numba cannot cache a kernel built around other compiled functions); a compile that takes
more than a second says so on stderr.  The built-in policies are instances of the same form
(`builtin`); given as a `Policy`, a built-in runs exactly as its name does.

This module imports Numba only when a policy is built or run, so ``import decodesched`` stays light.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import threading
from pathlib import Path

from .errors import UserError
from .kernels.enums import POLICY_AGING, POLICY_NAMES
# (DEFAULT_AGING_INTERVAL: of a replay given none, of a policy that carries none)
from .model import DEFAULT_AGING_INTERVAL, NUMPY_OVERFLOW_HINT, is_integer

# The kernel's policy argument for a user policy (no built-in code; its functions ignore it).
CUSTOM_CODE = -1
# A compile taking longer than this many seconds prints a notice on stderr.
COMPILE_NOTICE_S = 1.0


def _request_view():
    """The named tuple a policy's functions get (`kernels.scan_nb.RequestView`, fields `REQUEST_FIELDS`)."""
    from .kernels.scan_nb import RequestView

    return RequestView


def __getattr__(name):
    if name == "RequestView":
        return _request_view()
    if name == "REQUEST_FIELDS":
        return _request_view()._fields
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _code_bytes(code) -> bytes:
    """What a function does, not where it is written: bytecode, names and constants (nested code too),
    without its file name and line numbers."""
    consts = b"".join(_code_bytes(c) if hasattr(c, "co_code") else _describe_value(c, 0, {}) for c in code.co_consts)
    return code.co_code + repr((code.co_names, code.co_varnames, code.co_freevars)).encode() + consts


# How deep `Policy.fingerprint` follows helpers (function -> helper -> ...) and how many objects it
# describes at most; past either bound an object is known by its qualified name only.
_FINGERPRINT_DEPTH = 12
_FINGERPRINT_OBJECTS = 5000
# Values hashed by `repr` (deterministic for these types: no address in it).
_PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes)


def _library_module(name) -> bool:
    """Whether the module called `name` is Python's own or an installed package (site-packages): its
    functions are known by their qualified names, not followed (they change with versions, not edits)."""
    if not isinstance(name, str) or not name:
        return True
    top = name.partition(".")[0]
    if top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ()):
        return True
    file = getattr(sys.modules.get(name), "__file__", None)
    if not file:  # (__main__ of a notebook, a module made in memory: the user's code)
        return False
    parts = Path(file).parts
    return "site-packages" in parts or "dist-packages" in parts


def _qualified(value) -> str:
    module = getattr(value, "__module__", None)
    if isinstance(module, str) and module.startswith(_FILE_MODULE_PREFIX):
        module = "<policy file>"  # (its private name holds a hash of the file's path)
    return f"{module}.{getattr(value, '__qualname__', getattr(value, '__name__', type(value).__qualname__))}"


def _code_names(code) -> list[str]:
    """The global and attribute names `code` and its nested code objects read, in order."""
    names = list(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            names += _code_names(c)
    return names


def _describe_value(value, depth: int, seen: dict[int, int]) -> bytes:
    """Deterministic bytes for what `value` contributes to compiled policy code (see `Policy.fingerprint`):
    the same for the same code and values in any process or file, different when code or values differ.
    Any object may sit in a module's globals: one whose attributes, repr or iteration raise is known by
    its type's name, and past `_FINGERPRINT_OBJECTS` objects described (containers that share parts
    are described once each) the rest are known by their types."""
    try:
        count = seen.get(-1, 0) + 1
        seen[-1] = count  # (ids are >= 0: the key -1 counts the objects described)
        if count > 4 * _FINGERPRINT_OBJECTS:
            return b"<more>"
        return _describe(value, depth, seen)
    except RecursionError:
        return b"<deep>"
    except Exception:  # noqa: BLE001 - a hostile __repr__, __getattr__, __iter__, __class__ ...
        try:
            return f"<{_qualified(type(value))}>".encode()
        except Exception:  # noqa: BLE001
            return b"<object>"


def _describe(value, depth: int, seen: dict[int, int]) -> bytes:
    if type(value) is int:
        return repr(("int", hex(value))).encode()  # (repr refuses ints of over 4,300 digits)
    if isinstance(value, _PLAIN_TYPES):
        return repr((type(value).__name__, value)).encode()
    if isinstance(value, (tuple, list, set, frozenset, dict)):
        if depth > 4 * _FINGERPRINT_DEPTH:  # (a container that holds itself)
            return b"<deep>"
        if id(value) in seen:  # (a part shared by several containers: described once)
            return f"<again {seen[id(value)]}>".encode()
        seen[id(value)] = len(seen)
        if isinstance(value, dict):
            items = sorted(_describe_value(k, depth + 1, seen) + b":" + _describe_value(v, depth + 1, seen)
                           for k, v in value.items())
        else:
            items = [_describe_value(v, depth + 1, seen) for v in value]
            if isinstance(value, (set, frozenset)):
                items.sort()  # (a set of str iterates in another order in each process)
        return (type(value).__name__ + "(").encode() + b",".join(items) + b")"
    import numpy as np

    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        head = repr(("ndarray", arr.dtype.str, arr.shape)).encode()
        return head + (hashlib.sha256(arr.tobytes()).digest() if arr.dtype != object else
                       _describe_value(arr.tolist(), depth, seen))
    if isinstance(value, np.generic):
        return repr(("numpy", value.dtype.str, value.item())).encode()
    import enum

    if isinstance(value, enum.Enum):
        return repr(("enum", _qualified(type(value)), value.name)).encode() + _describe_value(value.value, depth, seen)
    if id(value) in seen:  # a function met before (recursion, a helper shared by both functions)
        return f"<again {seen[id(value)]}>".encode()
    try:
        py = getattr(value, "py_func", None)  # a Numba dispatcher: its Python function and its options
        fn = py if py is not None else value
        code = getattr(fn, "__code__", None)
    except Exception:  # noqa: BLE001 - an object whose __getattr__ fails: known by its type below
        py, fn, code = None, value, None
    if code is not None and hasattr(code, "co_code"):
        if depth > _FINGERPRINT_DEPTH or len(seen) >= _FINGERPRINT_OBJECTS or (
                depth > 0 and _library_module(getattr(fn, "__module__", None))):
            return f"<function {_qualified(fn)}>".encode()
        seen[id(value)] = len(seen)
        parts = [b"function", str(getattr(fn, "__qualname__", "")).encode(), _code_bytes(code)]
        if py is not None:
            options = getattr(value, "targetoptions", None)
            parts.append(_describe_value(dict(options) if isinstance(options, dict) else None, depth + 1, seen))
        parts.append(_describe_value(getattr(fn, "__defaults__", None), depth + 1, seen))
        parts.append(_describe_value(getattr(fn, "__kwdefaults__", None), depth + 1, seen))
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                parts.append(b"<empty cell>")
                continue
            parts.append(_describe_value(contents, depth + 1, seen))
        parts += _describe_globals(code, getattr(fn, "__globals__", None) or {}, depth, seen)
        return b"(" + b"|".join(parts) + b")"
    import types

    if isinstance(value, types.ModuleType):
        name = value.__name__
        return f"<module {'<policy file>' if name.startswith(_FILE_MODULE_PREFIX) else name}>".encode()
    if isinstance(value, type):
        if issubclass(value, enum.Enum):  # (Numba compiles `Level.BOOST` as the member's value)
            members = [name.encode() + b"=" + _describe_value(m.value, depth + 1, seen)
                       for name, m in value.__members__.items()]
            return f"<enum {_qualified(value)}>(".encode() + b",".join(members) + b")"
        return f"<class {_qualified(value)}>".encode()
    try:
        text = repr(value) if type(value).__repr__ is not object.__repr__ else ""
    except Exception:  # noqa: BLE001 - any object may sit in a module's globals
        text = ""
    if not text or " at 0x" in text:  # (an address differs in every process)
        text = f"<{_qualified(type(value))}>"
    return text.encode()


def _describe_globals(code, globals_: dict, depth: int, seen: dict[int, int]) -> list[bytes]:
    """What the globals that `code` reads are: each by its name and value, and an attribute read from a
    module global (``helpers.step(r)``, ``np.int64``) by its value in that module, also through submodules
    (``pkg.sub.BOOST``: Numba freezes the value at the end of the chain as it does a global's)."""
    names = list(dict.fromkeys(_code_names(code)))
    modules = []
    parts = []
    import types

    for name in names:
        if name not in globals_:
            continue
        value = globals_[name]
        parts.append(name.encode() + b"=" + _describe_value(value, depth + 1, seen))
        if isinstance(value, types.ModuleType):
            modules.append(value)
    for module in modules:  # (grows with the submodules met: each module once)
        for name in names:
            if name in getattr(module, "__dict__", {}):
                value = module.__dict__[name]
                parts.append(_describe_value(module, depth + 1, seen) + f".{name}=".encode()
                             + _describe_value(value, depth + 1, seen))
                if isinstance(value, types.ModuleType) and not any(value is m for m in modules):
                    modules.append(value)
    return parts


class Policy:
    """A scheduling policy: ``Policy(name, key=..., effective_priority=...)``.

    `key` and `effective_priority` are ``@numba.njit`` functions of ``(r, clock)`` (see the module
    docstring); `name` names the policy in results and tables and may not be a built-in's.  Both
    functions are compiled and tried once on a sample request here, so that a wrong return type is
    reported now, as a `UserError` naming the policy.  ``aging_interval`` is the interval the policy
    carries (``builtin("aging", 8)``), which every replay of it runs at (`replay_interval`); None for a
    policy that takes the replay's (a user policy, whose functions hold their own constants).
    """

    __slots__ = ("name", "key", "effective_priority", "aging_interval", "_code", "_interval", "_kernel", "_lock",
                 "spec")

    def __init__(self, name: str, *, key, effective_priority):
        self._setup(name, key, effective_priority, builtin_code=None, interval=None)

    def _setup(self, name, key, effective_priority, builtin_code, interval):
        if not isinstance(name, str) or not name.strip():
            from .trace import show

            raise UserError(f"a Policy needs a non-empty name (str), got {show(name)}")
        if not name.isprintable():  # a newline or ESC would break the summary tables, which print it raw
            raise UserError(f"policy name {name!r} holds a character that is not printable (a control "
                            "character such as a newline, tab or escape); choose a name without one")
        if name != name.strip():  # ("fcfs " prints as the built-in fcfs in every table, and "sjf " as "sjf")
            raise UserError(f"policy name {name!r} begins or ends with a space, which no table shows; "
                            f"choose a name without one ({name.strip()!r})")
        if builtin_code is None and name in POLICY_NAMES:
            raise UserError(f"policy name {name!r} is a built-in's; choose another name "
                            f"(built-ins: {', '.join(POLICY_NAMES)}; decodesched.policy.builtin gives them as Policy)")
        if builtin_code is None:
            _check_user_functions(name, key, effective_priority)
        else:
            for what, fn in (("key", key), ("effective_priority", effective_priority)):
                _check_function(name, what, fn)
        self.name = name
        self.key = key
        self.effective_priority = effective_priority
        # the interval every replay of this policy runs at (`replay_interval`); None: the replay's
        self.aging_interval = None
        self._code = builtin_code
        self._interval = interval
        self._kernel = None
        self._lock = threading.Lock()
        self.spec = None  # "module:attr" or "path.py:attr" when `resolve_policy` imported it

    def __setattr__(self, attr, value):
        """A `key` or `effective_priority` set by hand is the one the next replay runs: the kernel compiled around the
        former one is dropped (it ran on, while `fingerprint`, and so a sweep's checkpoint, followed the new one).  It
        is checked first as `Policy(...)` checks it (a refused one leaves the policy as it was); a built-in's are
        its name's (the built-in kernels never call them), so setting one is refused, as is renaming a policy."""
        if attr in ("name", "key", "effective_priority") and getattr(self, "_lock", None) is not None:
            if attr == "name" or self._code is not None:
                raise UserError(f"policy {self.name!r}: its {attr} cannot be set (results know a policy by its name, "
                                "and a built-in's functions are its name's): make a Policy of your own, "
                                "Policy(name, key=..., effective_priority=...)")
            functions = {"key": self.key, "effective_priority": self.effective_priority, attr: value}
            _check_user_functions(self.name, functions["key"], functions["effective_priority"])
            with self._lock:
                object.__setattr__(self, attr, value)
                object.__setattr__(self, "_kernel", None)
            return
        object.__setattr__(self, attr, value)

    def __reduce__(self):
        """A Policy travels (to Dask workers, say) as what names it: a built-in as its name and interval,
        a user policy as the ``module:attr`` it was resolved from, or the importable module and
        attribute that hold it (a receiver that must run the sender's code checks it: `same_code`); compiled
        functions themselves do not pickle."""
        if self._code is not None:
            return builtin, (self.name, self.aging_interval)
        spec = self.spec or _importable_spec(self)
        if spec is None:
            raise TypeError(f"policy {self.name!r} cannot be sent to another process: define it at the top "
                            "level of an importable module (or a file) and give it as module:attr or "
                            "path/to/file.py:attr")
        return resolve_policy, (spec,)

    def __copy__(self) -> "Policy":
        """The policy itself, as for a function: `copy.copy`, `copy.deepcopy` and `dataclasses.asdict` of
        a `Scenario` keep it (`__reduce__` serves pickling only, which a notebook's policy refuses)."""
        return self

    def __deepcopy__(self, memo) -> "Policy":
        return self

    @property
    def uses_aging_interval(self) -> bool:
        """True for built-in ``aging`` only: a user policy's functions hold their own constants.  Read-only, derived
        (set by hand, a sweep ran a user policy once per interval, or built-in aging at one interval only)."""
        return self._code == POLICY_AGING

    @property
    def is_builtin(self) -> bool:
        """True for the built-in policies given as a Policy (`builtin`)."""
        return self._code is not None

    @property
    def code(self) -> int:
        """The kernel's policy code: the built-in's, or `CUSTOM_CODE`."""
        return CUSTOM_CODE if self._code is None else self._code

    def with_aging_interval(self, aging_interval: int) -> "Policy":
        """This policy for a replay with `aging_interval` (as `replay_interval` resolved it): itself, unless
        it `uses_aging_interval` at another interval."""
        if not self.uses_aging_interval or aging_interval == self._interval:
            return self
        return builtin(self.name, aging_interval=aging_interval)

    def kernel(self):
        """The replay kernel of this user policy (common replay signature), compiled on first use."""
        if self._code is not None:
            raise ValueError(f"built-in policy {self.name!r} runs on the built-in kernels")
        _check_not_stale(self.name, self.key, self.effective_priority)
        with self._lock:
            if self._kernel is None:
                from numba import njit

                from .kernels.scan_nb import make_replay_kernel

                key, eff = self.key, self.effective_priority

                @njit
                def kernel_key(r, clock, policy, aging_interval):
                    return key(r, clock)

                @njit
                def kernel_eff(r, clock, policy, aging_interval):
                    return eff(r, clock)

                self._kernel = _CompileNotice(make_replay_kernel(kernel_key, kernel_eff), self.name)
            return self._kernel

    def fingerprint(self) -> str:
        """A hash of what decides this policy's results: a built-in's name and interval, or a user
        policy's name and everything its two functions' compiled code depends on (`_describe_value`):
        their bytecode, constants and names, their closure values and defaults, and, through the
        globals they read, the module-level constants and the ``@njit`` helpers they call, with the
        helpers' own globals and closures in turn (Numba freezes all of these when it compiles).  So a
        sweep resumed after any of them was edited does not reuse rows of the old code, while the same
        code in another file gives the same fingerprint.  Functions of Python's own modules and of
        installed packages (site-packages) are known by their names, not followed."""
        h = hashlib.sha256(repr((self.name, self._code, self._interval)).encode())
        if self._code is None:
            seen: dict[int, int] = {}
            for fn in (self.key, self.effective_priority):
                h.update(_describe_value(fn, 0, seen))
        return h.hexdigest()

    def compile(self) -> None:
        """Compile this user policy's kernel now (one one-request replay), so that later timings are
        replay only; a built-in policy's kernels are cached and need nothing."""
        if self._code is None:
            from .engine import simulate

            simulate({"request_id": [0], "arrival_step": [0], "prompt_len": [1], "max_new_tokens": [1],
                      "priority": [0], "cache_hit": [False], "required_blocks": [1], "deadline_step": [None],
                      "preemptible": [True]}, self, free_kv_blocks=1)

    def __repr__(self) -> str:
        return f"Policy({self.name!r})"

    def __str__(self) -> str:
        return self.name


def _check_user_functions(name: str, key, effective_priority) -> None:
    """Every check of a user policy's two functions (`Policy`'s docstring): both ``@numba.njit`` functions of
    ``(r, clock)``, without recursion, compiling and returning what they must on a sample request, as their
    Python versions do there, and not compiled with stale globals; else one `UserError` naming the policy."""
    for what, fn in (("key", key), ("effective_priority", effective_priority)):
        _check_function(name, what, fn)
    _check_user_code(name, key, effective_priority)
    values = _check_results(name, key, effective_priority)
    _check_not_stale(name, key, effective_priority)  # (before comparing with Python: a stale global differs there too)
    for what, fn in (("key", key), ("effective_priority", effective_priority)):
        _check_like_python(name, what, fn, values[what])


def _check_function(name, what, fn):
    from numba.core.registry import CPUDispatcher

    if not isinstance(fn, CPUDispatcher):
        hint = ""
        if inspect.isfunction(fn):  # (not a ufunc or cfunc Numba made of a lambda: they share its name)
            hint = (f" (a plain lambda: give numba.njit(lambda r, clock: ...) as {what})" if fn.__name__ == "<lambda>"
                    else f" ({fn.__name__} is a plain Python function: put @numba.njit above its def)")
        raise UserError(f"policy {name!r}: {what} must be a @numba.njit function of (r, clock), "
                        f"got {type(fn).__name__}{hint}")
    # An object-mode function (numba.jit(forceobj=True)) is a CPUDispatcher too, and even answers the
    # sample call; only the nopython kernel cannot call it, so it would fail at the first replay.
    options = getattr(fn, "targetoptions", {})
    if options.get("forceobj") or options.get("nopython") is False:
        raise UserError(f"policy {name!r}: {what} must be a @numba.njit function of (r, clock), "
                        "got an object-mode numba.jit function (forceobj=True)")
    code = fn.py_func.__code__
    if code.co_argcount != 2:
        raise UserError(f"policy {name!r}: {what} must take exactly (r, clock), "
                        f"takes {code.co_argcount} argument(s)")


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _numba_line(exc: BaseException) -> str:
    """The informative line of a Numba compile error: its first line ("Failed in nopython mode pipeline
    (step: ...)") names only the stage, so the line after it, without terminal colours, if there is one."""
    import re

    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip() for ln in str(exc).splitlines()]
    lines = [ln for ln in lines if ln]
    useful = [ln for ln in lines if not ln.startswith("Failed in ")]
    for before, line in zip(useful, useful[1:]):  # ("No implementation of ... found for signature:" says less)
        if before.endswith("raised a specific error:"):
            return line
    return useful[0] if useful else lines[0] if lines else type(exc).__name__


def _sample_view():
    import numpy as np

    view = _request_view()
    values = dict.fromkeys(view._fields, np.int64(0))
    values.update(prompt_len=np.int64(1), max_new_tokens=np.int64(1), preemptible=np.int64(1))
    return view(**values)


def _loaded_names(code) -> tuple[dict, dict]:
    """The global names `code` (nested code too) loads, and the attribute names it reads, each in order
    (unlike `_code_names`, ``r.priority`` does not count as the global ``priority``)."""
    import dis

    names, attrs = {}, {}
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(ins.argval, str):
            names[ins.argval] = None
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(ins.argval, str):
            attrs[ins.argval] = None
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            inner = _loaded_names(const)
            names.update(inner[0])
            attrs.update(inner[1])
    return names, attrs


def _user_dispatchers(functions) -> tuple[list, str | None]:
    """The ``@njit`` functions of the user's code that `functions` are or call (through their globals,
    attributes of module globals, and closures), helpers before their callers, and the name of one that
    calls itself (directly or through others), else None; not Python's own, installed packages'
    (`_library_module`) nor decodesched's."""
    from numba.core.dispatcher import Dispatcher

    found, seen, path, recursive = [], set(), set(), []

    def visit(value, depth):
        py = getattr(value, "py_func", None) if isinstance(value, Dispatcher) else None
        module = getattr(py, "__module__", None)
        if py is None or depth > _FINGERPRINT_DEPTH or _library_module(module) or \
                module.partition(".")[0] == __name__.partition(".")[0]:
            return
        if id(value) in path:
            recursive.append(py.__name__)
        if id(value) in seen:
            return
        seen.add(id(value))
        path.add(id(value))
        globals_ = getattr(py, "__globals__", None) or {}
        names, attrs = _loaded_names(py.__code__)
        for name in names:
            held = globals_.get(name)
            visit(held, depth + 1)
            for attr in attrs if isinstance(held, type(sys)) else ():
                visit(getattr(held, attr, None), depth + 1)
        for cell in py.__closure__ or ():
            with contextlib.suppress(ValueError):  # (an empty cell)
                visit(cell.cell_contents, depth + 1)
        path.discard(id(value))
        found.append(value)

    for fn in functions:
        visit(fn, 0)
    return found, (recursive[0] if recursive else None)


def _check_user_code(name, key, effective_priority) -> None:
    """Refuse recursion in a policy's functions (compiled code has no recursion limit: a deep call
    overflows the stack and the process dies without a word); key their disk caches (`_stamp_disk_caches`)."""
    functions, recursive = _user_dispatchers((key, effective_priority))
    if recursive is not None:
        raise UserError(f"policy {name!r}: {recursive} calls itself (directly or through other functions); "
                        "compiled code has no recursion limit and a deep call crashes the process: "
                        "write it as a loop")
    _stamp_disk_caches(functions)


def _stamp_disk_caches(functions) -> None:
    """Key the disk cache (``cache=True``) of the user's `functions` (`_user_dispatchers`: a policy's
    functions and the helpers they call) by `Policy.fingerprint`'s description of each as well as by its file.

    Numba checks a cached function against its own file and bytecode only, so after an edit of a helper
    or a constant in another module it would load the caller compiled with the old one: the replay would
    run old code while the model runs the new.  With this stamp such an entry is stale and compiled
    afresh.  A function that already holds code loaded from the disk cache without the stamp (called
    before its policy was made) is compiled again, helpers first."""
    stale = False
    for fn in functions:
        cache_file = getattr(getattr(fn, "_cache", None), "_cache_file", None)  # (None: NullCache)
        if cache_file is None or getattr(cache_file, "_decodesched_stamped", False):
            continue
        try:
            described = hashlib.sha256(_describe_value(fn, 0, {})).hexdigest()
            cache_file._source_stamp = (cache_file._source_stamp, described)
            cache_file._decodesched_stamped = True
            stale = stale or bool(sum(fn.stats.cache_hits.values()))
            if stale and fn.overloads:
                fn.recompile()
        except Exception:  # noqa: BLE001 - Numba internals: a version without them keeps its own rule
            continue


def _check_results(name: str, key, effective_priority) -> dict:
    """Compile both functions for a `RequestView` and check what they return on a sample request; return
    those values by function ("key", "effective_priority")."""
    import numpy as np
    from numba.core import types
    from numba.core.errors import NumbaError

    from ._io import immediate_interrupt

    r = _sample_view()
    values = {}
    for what, fn, want in (("key", key, "a tuple of integers"),
                           ("effective_priority", effective_priority, "an integer")):
        try:
            if fn._can_compile:  # (not with explicit signatures: the call below picks one)
                fn.compile(tuple(fn.typeof_pyval(a) for a in (r, np.int64(0))))
            with immediate_interrupt():  # (compiled code holds the interpreter: a loop in it ignores Ctrl-C)
                value = fn(r, np.int64(0))
        except Exception as exc:
            line = _numba_line(exc) if isinstance(exc, NumbaError) else _first_line(exc)
            raise UserError(f"policy {name!r}: {what}(r, clock) failed on a sample request: {line}"
                            f"{_compile_hint(what, exc)}") from None
        if _runs_parallel_region(fn):
            # The kernel calls the function once per request and step; a parfor there gains nothing, and
            # run from the threads of a batch Numba's workqueue threading layer aborts the process.
            raise UserError(f"policy {name!r}: {what}(r, clock) uses parallel=True (itself or in a function "
                            "it calls): a replay calls it per request, and a batch on threads would abort the "
                            "process; drop parallel=True")
        returns = _return_types(fn, (r, np.int64(0)))
        if any(isinstance(t, types.Optional) or isinstance(t, types.BaseTuple) and
               any(isinstance(e, types.Optional) for e in t) for t in returns):
            # Numba types a value that is None on some path (a function that ends without a return there) as
            # optional: it answers the sample request, and fails on the first request of the replay that takes it.
            element = ", or an element that is None on some path" if what == "key" else ""
            raise UserError(f"policy {name!r}: {what}(r, clock) can return None (a `return None` or a path "
                            f"that ends without a return{element}); make every path return {want}")
        if what == "effective_priority" and types.uint64 in returns:
            # The kernel's effective priorities are int64 (a request that need not preempt has 0): Numba
            # unifies int64 with uint64 into float64, which rounds values above 2**53, and the schedule
            # would then differ from the model's.  Key elements are only compared with the same
            # element of another key, of the same type, so a uint64 there is exact and allowed.
            raise UserError(f"policy {name!r}: effective_priority(r, clock) returns an unsigned 64-bit "
                            "integer; return a signed integer: uint64 mixes with int64 into a float in Numba "
                            "(e.g. wrap it in np.int64(...))")
        integer = (int, np.integer)
        ok = (isinstance(value, tuple) and all(isinstance(v, integer) and not isinstance(v, bool) for v in value)
              if what == "key" else isinstance(value, integer) and not isinstance(value, bool))
        if not ok:
            raise UserError(f"policy {name!r}: {what}(r, clock) must return {want}, got {value!r}"
                            f"{_value_hint(what, value)}")
        if what == "key" and type(value) is not tuple:  # the kernel appends the id: `key + (id,)`
            raise UserError(f"policy {name!r}: key(r, clock) must return a plain tuple, not a "
                            f"{type(value).__name__} (a named tuple does not compile in the replay kernel: "
                            "return (a, b, ...))")
        values[what] = value
    return values


def _check_like_python(name: str, what: str, fn, value) -> None:
    """Refuse a function whose compiled result on the sample request differs from its Python version's
    (the model's), as a constant past int64 makes it (``2**70``: compiled integers wrap around).  A
    Python version that fails is left to the model to report."""
    import numpy as np

    r = _sample_view()
    try:
        with np.errstate(over="raise"):  # (as the model runs it: `model.DecodeSchedulerSim._policy_call`)
            expected = fn.py_func(r._replace(**{k: int(v) for k, v in r._asdict().items()}), 0)
    except (FloatingPointError, OverflowError) as exc:
        raise UserError(f"policy {name!r}: {what}(r, clock) overflowed a NumPy integer in Python (the model) on a "
                        f"sample request ({exc}): {NUMPY_OVERFLOW_HINT}") from None
    except Exception:  # noqa: BLE001 - the user's code; the model reports it where it matters
        return
    try:
        same = _plain(value) == _plain(expected)
        hint = _mismatch_hint(_plain(value), _plain(expected))
    except (TypeError, ValueError):  # not integers in Python (the model would refuse it: `model._policy_value`)
        same, hint = False, "return integers in Python too (2 ** -1 is 0.5 there, 0 compiled)"
    if not same:
        raise UserError(f"policy {name!r}: {what}(r, clock) gives {_plain(value)} compiled but {expected!r} in "
                        f"Python (the model) on a sample request: {hint}")


def _mismatch_hint(compiled, expected) -> str:
    """Why a function's compiled and Python results (plain ints or tuples of them) differ: int64 wrap-around where
    they agree modulo 2**64, else a result that is not one value of (r, clock) (random numbers, a counter)."""
    pairs = (list(zip(compiled, expected)) if isinstance(compiled, tuple) and isinstance(expected, tuple)
             and len(compiled) == len(expected) else [(compiled, expected)])
    if all(isinstance(a, int) and isinstance(b, int) and (a - b) % 2**64 == 0 for a, b in pairs):
        return "keep every value inside int64, where compiled integers wrap around"
    return ("it must return one value for one (r, clock), every time it is called: no random numbers, "
            "no state kept between calls, no array it reads changed since it compiled")


def _plain(value):
    """A key or priority as Python ints (TypeError or ValueError for anything else)."""
    if isinstance(value, (float, bool)) or not isinstance(value, tuple) and not hasattr(value, "__index__"):
        raise TypeError(type(value).__name__)
    return tuple(_plain(v) for v in value) if isinstance(value, tuple) else int(value)


def _compile_hint(what: str, exc: BaseException) -> str:
    """What to do about the Numba compile errors a policy's author meets most often."""
    text = str(exc)
    if "Can't unify return type" in text:
        if what == "key":
            return ("; every return of key must give a tuple of the same length and element types "
                    "(pad the shorter ones, e.g. with 0)")
        return "; every return of effective_priority must give an integer of one type"
    if "Unknown attribute" in text and "RequestView" in text:  # (a misspelt or guessed field of r)
        return f"; r's fields are {', '.join(_request_view()._fields)}"
    if "reflected list" in text:
        return "; Numba cannot read a global list: make it a tuple or a NumPy array"
    if "Cannot modify readonly array" in text:
        return ("; a global NumPy array is read-only in compiled code: a policy is a function of (r, clock) "
                "and keeps no state between calls")
    return ""


def _value_hint(what: str, value) -> str:
    """Which element of a wrong return value is wrong, and how to make it an integer."""
    import numpy as np

    items = list(enumerate(value)) if what == "key" and isinstance(value, tuple) else [(None, value)]
    for i, v in items:
        where = "it " if i is None else f"element {i} "
        if isinstance(v, (bool, np.bool_)):
            return f": {where}is a bool; turn it into 0/1 with int(...), e.g. int(r.phase == 0)"
        if isinstance(v, (float, np.floating)):
            return (f": {where}is a float; compare integers only (// for division, int(...) to convert, "
                    "e.g. 1000 * a // b for a ratio)")
    if what == "key" and isinstance(value, (list, np.ndarray)):
        kind = "a list" if isinstance(value, list) else "a NumPy array"
        return f": {kind}; return a tuple: (a, b, ...)"
    if what == "key" and not isinstance(value, tuple) and isinstance(value, (int, np.integer)):
        return "; return a tuple, (x,) for a one-element key"
    return ""


def _runs_parallel_region(fn) -> bool:
    """Whether dispatcher `fn` is ``parallel=True`` or its compiled code, helpers included, launches a
    parallel region (Numba's parfor scheduler, ``do_scheduling_*``; only code compiled in this process
    can be inspected, a helper loaded from Numba's disk cache cannot)."""
    if getattr(fn, "targetoptions", {}).get("parallel"):
        return True
    for compiled in list(fn.overloads.values()):
        if getattr(compiled.library, "_disable_inspection", False):
            continue  # loaded from Numba's disk cache: its IR is gone (Numba would only warn and return none)
        try:
            if "do_scheduling_" in compiled.library.get_llvm_str():
                return True
        except Exception:  # noqa: BLE001 - Numba internals: a version without them is not inspected
            pass
    return False


def _stale_global(fn, depth: int = 0, seen: set | None = None) -> tuple[str, str] | None:
    """(function, global) where compiled code of dispatcher `fn`, or of a helper it calls, holds a value of a
    module global other than the one the global names now (a notebook cell re-run after the function first
    compiled, or an array changed in place: Numba froze the old value, while ``py_func``, the model's, reads the
    new), else None.  Values
    are compared as `Policy.fingerprint` describes them; code loaded from Numba's disk cache is not inspected."""
    import types

    import numpy as np
    from numba.core import ir
    from numba.core.dispatcher import Dispatcher

    seen = set() if seen is None else seen
    py = getattr(fn, "py_func", None)
    if id(fn) in seen or py is None or depth > _FINGERPRINT_DEPTH or (
            depth > 0 and _library_module(getattr(py, "__module__", None))):
        return None
    seen.add(id(fn))
    globals_ = getattr(py, "__globals__", {})
    # Numba froze each array it reads (a global or a closure's) when it compiled, and its contents can change in place
    # since: they are kept here as first seen (`Policy(...)` checks just after it compiled the functions).
    frozen = fn.__dict__.setdefault("_decodesched_frozen", {})
    for signature, compiled in list(fn.overloads.items()):
        if signature not in frozen or frozen[signature][0] is not compiled:  # (compiled anew: values of now)
            frozen[signature] = (compiled, {})
        held = frozen[signature][1]
        annotation = getattr(compiled, "type_annotation", None)
        typemap = getattr(annotation, "typemap", None) or {}
        modules: dict = {}  # variable -> (its name in the code, the module it holds)
        for block in (getattr(annotation, "blocks", None) or {}).values():
            for stmt in block.body:
                value = getattr(stmt, "value", None)
                if isinstance(value, ir.FreeVar) and value.index < len(py.__closure__ or ()):
                    try:  # (a closure's value: it cannot be bound again, but an array can change in place)
                        now = py.__closure__[value.index].cell_contents
                    except ValueError:  # an empty cell
                        continue
                    name, then = value.name, value.value
                elif isinstance(value, ir.Global) and value.name in globals_:
                    name, now, then = value.name, globals_[value.name], value.value
                elif isinstance(value, ir.Expr) and value.op == "getattr" and value.value.name in modules:
                    # an attribute of a module global (``helpers.BOOST``, ``pkg.sub.step``), which the model reads
                    # anew after ``importlib.reload(helpers)``: compared as first seen here (the IR keeps no value;
                    # the type keeps a helper only while the module still holds it)
                    where, module = modules[value.value.name]
                    name, now = f"{where}.{value.attr}", getattr(module, value.attr, None)
                    if not isinstance(now, types.ModuleType):
                        described = _describe_value(now, 1, {})
                        if held.setdefault(name, described) != described:
                            return py.__name__, name
                    try:
                        then = getattr(typemap.get(stmt.target.name), "dispatcher", now)
                    except ReferenceError:  # (the helper Numba compiled is gone: replaced, and found unchanged)
                        continue
                else:
                    continue  # (a builtin such as len)
                if isinstance(now, types.ModuleType):
                    modules[stmt.target.name] = (name, now)
                    continue
                if isinstance(then, np.ndarray):  # (its contents as first seen: they may change in place)
                    if name not in held:
                        held[name] = _describe_value(then, 1, {})
                    stale = _describe_value(now, 1, {}) != held[name]
                else:  # (a helper is described with the globals it reads now: a stale one is found in it, below)
                    stale = now is not then and _describe_value(now, 1, {}) != _describe_value(then, 1, {})
                if stale:
                    return py.__name__, name
                if isinstance(then, Dispatcher):
                    found = _stale_global(then, depth + 1, seen)
                    if found is not None:
                        return found
    return None


def _check_not_stale(name: str, key, effective_priority) -> None:
    for what, fn in (("key", key), ("effective_priority", effective_priority)):
        try:
            found = _stale_global(fn)
        except Exception:  # noqa: BLE001 - Numba internals: a version without them is not inspected
            found = None
        if found is not None:
            raise UserError(f"policy {name!r}: {what}: {found[0]} was compiled with an earlier "
                            f"{found[1]!r} than the one defined now (Numba keeps the old one; the model would "
                            f"use the new): define {found[0]} and the functions that call it again")


def _return_types(fn, args) -> list:
    """The Numba return types of dispatcher `fn` compiled for `args` (the Python value does not tell them apart:
    an int for int64 and uint64, and for an optional int the sample's value).  With explicit signatures the call
    may have used another overload: then every overload's."""
    argtypes = tuple(fn.typeof_pyval(a) for a in args)
    compiled = fn.overloads.get(argtypes)
    results = [compiled] if compiled is not None else list(fn.overloads.values())
    return [c.signature.return_type for c in results]


def _user_frame(exc: BaseException) -> str:
    """' (FILE, line N, in FUNCTION)' for the innermost frame of exc's traceback, or '' when that frame
    is decodesched's own: Numba gives a `raise` in compiled code its line, but not the error of an
    integer division by zero, whose innermost frame is then the call into the kernel."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    if os.path.dirname(os.path.abspath(code.co_filename)) == os.path.dirname(os.path.abspath(__file__)):
        return ""
    return f" ({os.path.basename(code.co_filename)}, line {tb.tb_lineno}, in {code.co_name})"


class _CompileNotice:
    """Calls a user policy's kernel; the first call prints one line on stderr (on standard output in Jupyter) if
    compiling takes over a second.  An exception the policy's functions raise during the replay becomes a `UserError`
    naming the policy and the line that raised (the original is its ``__cause__``)."""

    _lock = threading.Lock()

    def __init__(self, kernel, name):
        self.kernel = kernel
        self.name = name
        self.compiled = False
        self.noticed = False  # the notice is printed once, however many threads compile at once

    def __call__(self, *args):
        try:
            if self.compiled:
                return self.kernel(*args)
            return self._first_call(args)
        except Exception as exc:
            from numba.core.errors import NumbaError

            if isinstance(exc, NumbaError):  # compiling the kernel around the policy's functions failed
                raise UserError(f"policy {self.name!r}: its replay kernel does not compile: "
                                f"{_numba_line(exc)}") from exc
            raise UserError(f"policy {self.name!r} raised {type(exc).__name__} during the replay: "
                            f"{_first_line(exc)}{_user_frame(exc)}") from exc

    def _first_call(self, args):
        timer = threading.Timer(COMPILE_NOTICE_S, self._notice)
        timer.daemon = True
        timer.start()
        try:
            return self.kernel(*args)
        finally:
            timer.cancel()
            self.compiled = True

    def _notice(self):
        with self._lock:
            if self.noticed:
                return
            self.noticed = True
        # (in Jupyter on standard output: a notebook shows its stderr as an error, and this is none)
        print(f"decodesched: compiling policy {self.name!r} (user policies compile once per process) ...",
              file=sys.stdout if in_jupyter() else sys.stderr, flush=True)


def in_jupyter() -> bool:
    """Whether this process is a Jupyter kernel (IPython with a kernel: not a terminal IPython, not a plain Python).
    IPython is never imported here: a session that runs under it has it loaded."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if hasattr(ipython, "get_ipython") else None
    return getattr(shell, "kernel", None) is not None


def builtin(name: str, aging_interval: int | None = None) -> Policy:
    """Built-in policy `name` as a `Policy` whose functions are SPEC section 2's.

    ``builtin("aging", 8)`` carries its interval: every replay of it runs at 8 (`replay_interval`; a
    replay given another interval is refused), and its ``aging_interval`` attribute says 8.  Without
    an interval (``builtin("aging")``) it takes the replay's, as the name does (its functions, called
    directly, use `DEFAULT_AGING_INTERVAL`).  The other built-ins ignore the interval.  Given to
    `simulate`, a built-in Policy runs exactly as its name (same kernels, same results).
    """
    if name not in POLICY_NAMES:
        raise UserError(f"unknown built-in policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
    from .trace import INT64_MAX, show

    carried = aging_interval is not None
    if not carried:
        aging_interval = DEFAULT_AGING_INTERVAL
    if not is_integer(aging_interval) or not 0 < aging_interval <= INT64_MAX:
        raise UserError(f"aging_interval must be an integer from 1 to 2**63 - 1, got {show(aging_interval)}")
    aging_interval = int(aging_interval)
    from numba import njit

    from .kernels.scan_nb import builtin_effective_priority_nb, builtin_key_nb

    code = POLICY_NAMES.index(name)
    interval = aging_interval

    @njit
    def key(r, clock):
        return builtin_key_nb(r, clock, code, interval)

    @njit
    def effective_priority(r, clock):
        return builtin_effective_priority_nb(r, clock, code, interval)

    policy = Policy.__new__(Policy)
    policy._setup(name, key, effective_priority, builtin_code=code, interval=interval)
    if carried and policy.uses_aging_interval:
        policy.aging_interval = interval
    return policy


def policy_name(policy) -> str:
    """The name of a policy given as a name or a `Policy`."""
    return policy.name if isinstance(policy, Policy) else policy


def replay_interval(policy, aging_interval=None, option: str = "aging_interval"):
    """The aging interval a replay of `policy` runs at: `aging_interval` when given, else the one the
    policy carries (``builtin("aging", 8)``: its ``aging_interval``), else `DEFAULT_AGING_INTERVAL`.

    A policy that carries an interval and another interval given (`option` names where, for the
    message) is one `UserError`: taking either silently would run a replay other than the one asked
    for.  A value that is not an integer is returned as it is, for the caller's own check to name."""
    carried = policy.aging_interval if isinstance(policy, Policy) else None
    if aging_interval is None:
        return DEFAULT_AGING_INTERVAL if carried is None else carried
    given = is_integer(aging_interval)
    if carried is not None and given and aging_interval != carried:
        raise UserError(f"policy {policy.name!r} was built with aging interval {carried}, but {option} "
                        f"{int(aging_interval)} was given: give one of them (builtin({policy.name!r}) takes the "
                        "replay's interval)")
    return aging_interval


def _origin(policy) -> str:
    """How an error line names one policy among several: where it came from, else its repr."""
    if isinstance(policy, Policy) and policy.spec:
        return policy.spec
    code = getattr(getattr(getattr(policy, "key", None), "py_func", None), "__code__", None)
    if isinstance(policy, Policy) and not policy.is_builtin and code is not None:  # (two of one name: which is which)
        return f"{policy!r} with key {code.co_name} at {os.path.basename(code.co_filename)}:{code.co_firstlineno}"
    return repr(policy)


def check_distinct(policies, *, repeats: bool = False) -> None:
    """Refuse a list of policies (names or `Policy`) in which one name stands for two entries.

    Results, tables and the report know a policy only by its name, so two different policies of one
    name (two files that both say ``Policy("mine", ...)``) would give rows that cannot be told apart and
    that the report merges as one scenario; the same policy given twice only duplicates rows.  Either
    is one `UserError` line, raised before any work.  A user policy is "the same" when its
    `Policy.fingerprint` is (same name and code); a built-in, given as a name or as `builtin`, is known
    by its name (the grid gives it its aging interval).  With `repeats`, the same policy may come
    more than once (a report's timeline policy, also one of its policies).
    """
    seen: dict[str, tuple[object, str]] = {}
    for policy in policies:
        name = policy_name(policy)
        same = policy.fingerprint() if isinstance(policy, Policy) and not policy.is_builtin else name
        if name not in seen:
            seen[name] = (policy, same)
            continue
        first, first_same = seen[name]
        if first_same == same:
            if repeats:
                continue
            raise UserError(f"policy {name!r} is given twice; give each policy once")
        raise UserError(f"two different policies are named {name!r} ({_origin(first)} and {_origin(policy)}); "
                        "their results could not be told apart: give them different names")


def resolve_policy(spec):
    """A policy from a command line: a built-in name is returned unchanged; ``module:attr`` or
    ``path/to/file.py:attr`` is imported and must be a `Policy`.  Anything else: `UserError`."""
    if isinstance(spec, Policy):
        return spec
    if not isinstance(spec, str):
        raise UserError(f"a policy is a name or a Policy, got {type(spec).__name__}")
    if spec in POLICY_NAMES:
        return spec
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        raise UserError(f"unknown policy {spec!r}; choose one of {', '.join(POLICY_NAMES)}, "
                        "or give your own as module:attr or path/to/file.py:attr")
    module = _import(where, spec)
    try:
        value = getattr(module, attr)
    except AttributeError:
        held = sorted(k for k, v in vars(module).items() if isinstance(v, Policy) and not k.startswith("_"))
        there = (f"; the policies there: {', '.join(held)}" if held
                 else "; it defines no decodesched.Policy at its top level")
        raise UserError(f"policy {spec!r}: {where} has no attribute {attr!r}{there}") from None
    if not isinstance(value, Policy):
        raise UserError(f"policy {spec!r} is of type {type(value).__name__}, not a decodesched.Policy")
    if value.spec is None and value._code is None:
        value.spec = f"{Path(where).resolve()}:{attr}" if where.endswith(".py") else spec
    return value


def same_code(policy: Policy, fingerprint: str) -> Policy:
    """`policy` as another process sent it (by its spec, `Policy.__reduce__`), whose code must be the sender's (its
    `Policy.fingerprint`).  A process that imported the file before it was edited (a Dask worker that outlives a
    sweep) imports it again; a file that differs still (another copy on another machine, or edited while the sweep
    runs) is a `UserError`: its rows would be those of other code, mixed into the sweep's unseen."""
    if policy.fingerprint() == fingerprint:
        return policy
    spec = policy.spec or _importable_spec(policy)
    where = spec.rpartition(":")[0] if spec else ""
    if where:
        sys.modules.pop(_file_module(Path(where).resolve()) if where.endswith(".py") else where, None)  # (read anew)
        policy = resolve_policy(spec)
        if policy.fingerprint() == fingerprint:
            return policy
    raise UserError(f"policy {policy.name!r} ({spec}) here is not the code the sweep was started with (the file was "
                    "edited since, or this machine has another copy); give every process the same file, and run the "
                    "sweep again")


def _importable_spec(policy: Policy) -> str | None:
    """``module:attr`` for a user policy held at the top level of an importable module, else None."""
    module = getattr(policy.key.py_func, "__module__", None)
    if not module or module == "__main__" or module.startswith(_FILE_MODULE_PREFIX):
        return None
    held = sys.modules.get(module)
    for attr, value in vars(held).items() if held is not None else ():
        if value is policy:
            return f"{module}:{attr}"
    return None


# A policy file given as path.py:attr is loaded as a module of this prefix and a hash of its path.
_FILE_MODULE_PREFIX = "decodesched_user_policy_"
_no_disk_cache_lock = threading.Lock()
_no_disk_cache_installed = False


def _no_disk_cache_for_policy_files() -> None:
    """Make ``cache=True`` a no-op for functions of the policy files `_import` loads (once per process).

    Numba's disk cache is keyed by source file, function and line, but each entry records the module
    name that wrote it and imports that module when it is loaded.  A file loaded here under a private
    name (`_FILE_MODULE_PREFIX`) shares its entries with a plain ``import`` of the same file, so after
    one the other fails ("No module named ..."), or imports a second copy of the file.  So such
    functions get Numba's `NullCache` from the start: they never load nor write an entry and compile
    once per process, as user policies' kernels do anyway.  Every other function keeps Numba's rules.
    This must act when the decorator runs (a function with an explicit signature compiles there), hence
    the wrapped ``enable_caching`` rather than a change to the dispatchers after the import.
    """
    global _no_disk_cache_installed
    with _no_disk_cache_lock:
        if _no_disk_cache_installed:
            return
        try:  # (Numba's internals: a version without them keeps its own rules, and the clash above)
            from numba.core.caching import NullCache
            from numba.core.ccallback import CFunc
            from numba.core.dispatcher import Dispatcher
        except ImportError:
            _no_disk_cache_installed = True
            return
        for cls in (Dispatcher, CFunc):
            if not hasattr(cls, "enable_caching"):
                continue

            def enable_caching(self, _enable=cls.enable_caching):
                py = getattr(self, "py_func", None) or getattr(self, "_pyfunc", None)
                if (getattr(py, "__module__", None) or "").startswith(_FILE_MODULE_PREFIX):
                    self._cache = NullCache()
                else:
                    _enable(self)

            cls.enable_caching = enable_caching
        _no_disk_cache_installed = True


def _import_module(where: str, spec: str):
    """Import ``module`` of ``module:attr``, also from the current folder, which ``python -m`` puts on
    sys.path but an installed console script does not: it is added at the end, so that it never shadows
    an installed package, and for this import only."""
    if where.startswith(".") or "/" in where or os.sep in where:  # (importlib: "the 'package' argument is required")
        raise UserError(f"policy {spec!r}: {where} is neither a module name nor a .py file; give module:attr or "
                        "path/to/file.py:attr")
    try:
        here = os.getcwd()
    except OSError:  # the current folder was removed
        here = None
    added = here is not None and not any(os.path.abspath(p or os.curdir) == here for p in sys.path)
    if added:
        sys.path.append(here)
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (where == exc.name or where.startswith(exc.name + ".")):
            raise  # the module is there, but something it imports is not
        folder = f"in the current folder ({here}) or " if here is not None else ""
        raise UserError(f"policy {spec!r}: cannot import {where}: no module {exc.name!r} {folder}"
                        "on Python's path (sys.path); give a file as path/to/file.py:attr") from None
    finally:
        if added:
            for i in range(len(sys.path) - 1, -1, -1):
                if sys.path[i] == here:
                    del sys.path[i]
                    break


def _file_module(path: Path) -> str:
    """The module name a policy file (resolved `path`) is loaded as: `_FILE_MODULE_PREFIX` and a hash of its path's
    bytes (a name that is not UTF-8, ``p\\xff.py``, made ``str.encode`` raise: "importing failed")."""
    return f"{_FILE_MODULE_PREFIX}{hashlib.sha1(os.fsencode(path)).hexdigest()[:12]}"


def _import(where: str, spec: str):
    """The module of a policy spec.  What it prints while it is imported goes to stderr: standard
    output may be a table the command streams (``--events -``)."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            if where.endswith(".py"):
                path = Path(where).resolve()
                if not path.is_file():  # (a folder, a FIFO or a device is not read: it may never end)
                    raise UserError(f"policy {spec!r}: {where} is not a regular file; give a Python file"
                                    if path.exists() else f"policy {spec!r}: no such file {where}")
                name = _file_module(path)
                if name in sys.modules:
                    return sys.modules[name]
                _no_disk_cache_for_policy_files()
                loader = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(loader)
                sys.modules[name] = module
                try:
                    loader.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
                return module
            return _import_module(where, spec)
    except UserError:
        raise
    except SystemExit as exc:  # (a module that ends the program on import; Ctrl-C still stops us)
        raise UserError(f"policy {spec!r}: importing {where} called sys.exit({exc.code!r})") from None
    except Exception as exc:
        raise UserError(f"policy {spec!r}: importing {where} failed: {type(exc).__name__}: {_first_line(exc)}") \
            from None
