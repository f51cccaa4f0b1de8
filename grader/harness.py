"""Run a student's solution cell on scenarios and write plain observations.  STDLIB ONLY.

Usage (started by `decodesched.grader.observe`, inside `grader.sandbox.run_isolated`)::

    python -I -S harness.py IN.json

``IN.json`` is ``{"solution_source": str, "scenarios": [{"id": str, "ops": [...]}, ...],
"sys_path": [str, ...], "scenario_timeout_s": float, "memory_mb": int, "out_fd": int}``.  The harness
executes the solution cell in a fresh module, then runs every scenario's operations on the student's
`DecodeSchedulerSim` and writes one JSON line per scenario to the descriptor ``out_fd`` (an anonymous
file of the grader's, inherited: no name in the folder, which the solution can write, stands for it;
by hand, without ``out_fd``: ``harness.py IN.json OUT.jsonl``) as soon as it is done (so a crash or a
timeout later still leaves the earlier observations)::

    {"load": "ok"} | {"load": "error", "error": "..."}
    {"id": "...", "obs": [observation per op, ...]}
    ...
    {"done": N}

With ``"serve_fd": N`` in the job (the read end of the grader's pipe), the harness then reads more
batches of scenarios from it (one JSON list per line) and answers each with its result lines and
``{"batch": K}``, until EOF.

Every observed value is normalised with strict types: ``None``, ``bool``, ``int``, ``str`` and
lists/dicts of them (exact types, so an object whose ``==`` is always true cannot pass).  Anything
else becomes the string ``"<bad type: Name>"``, which the judge treats as wrong (and, when a class
of the solution's own defines comparisons, as evidence of tampering; a value of a well-known type,
a NumPy scalar, an ``Enum``, a ``Fraction``, is just wrong: `_bad`).  Two reads go by value instead,
as ``==`` sees them (`as_eq`: ``1e9`` is ``1_000_000_000``, ``True`` is ``1``): the items of the sort
key (``key``) and the items of the tuples the TODO 4 cell compares (``runf``).

This file contains no reference solution and judges nothing: the grading process compares the
observations with the reference model.  It is also imported by the grader to run the very same
operations on the reference model (`run_scenario`), so both sides are observed identically.
"""

import json
import os
import signal
import sys
import time
import types

# Captured before any student code runs; the student may later replace the names in modules.
_type = type
_len = len
_isinstance = isinstance
_issubclass = issubclass
_getattr = getattr
_setattr = setattr
_sorted = sorted
_list = list
_dict = dict
_str = str
_int = int
_bool = bool
_range = range
_tuple = tuple
_float = float
_any = any
_ord = ord
_iter = iter
_set = set
_all_done = all
_RecursionError = RecursionError
_os_write = os.write
_os_exit = os._exit
_getpid = os.getpid
_os_open = os.open
_os_read = os.read
_os_close = os.close
_O_RDONLY = os.O_RDONLY
_PAGE = os.sysconf("SC_PAGE_SIZE")
_monotonic = time.monotonic
_process_time = time.process_time
_setitimer = signal.setitimer
_ITIMER_REAL = signal.ITIMER_REAL
_SIGALRM = signal.SIGALRM
_ITIMER_PROF = signal.ITIMER_PROF
_SIGPROF = signal.SIGPROF
_signal = signal.signal
FULL_TIMEOUTS = 2  # checks that may time out with the whole per-check budget; later ones get the short limit
YIELD_MARGIN_S = 0.5  # a process this close to its CPU limit (plus the next check's) leaves the rest to a fresh one
NOT_RUN = "not run: the time allowed for checks that time out was spent"
WALL_FACTOR = 2.0  # a check that makes no progress is stopped after this many times its CPU budget
MIN_PROGRESS = 0.05  # "progress": the check got at least this share of a core since it started
WALL_CAP = 40.0  # a starved check is stopped anyway after this many times its CPU budget of wall clock
ALARM_SLACK_S = 0.05  # CPU time past its budget after which a check timed out, whether or not its alarm came
_ARMED = [0.0, 0.0, 0.0, 0]  # budget, monotonic and process time, resident bytes when the check started
_FIRED = [None]  # the alarm that interrupted the running check, if one did (see `_alarm`)
# A check stopped for time whose resident memory grew by more than this many bytes since it started (a
# quarter of the memory limit, set from the job) ran out of memory: where fresh memory is slow to come
# by (a VM whose host takes back free pages: 150-250 MB/s, charged as the process's CPU time), a memory
# bomb meets the time limit before the memory limit, and the same submission must get the same status.
_MEMORY_GROWTH = [0]


def _resident():
    """This process's resident bytes (0 if unknown), read with captured primitives only."""
    try:
        fd = _os_open("/proc/self/statm", _O_RDONLY)
        try:
            data = _os_read(fd, 256)
        finally:
            _os_close(fd)
        return _int(data.split()[1]) * _PAGE
    except _BaseException:  # noqa: BLE001
        return 0


def _arm(seconds):
    """Interrupt the running check after `seconds` of CPU time: the limit that decides, the same on a
    quiet and on a busy machine. The wall clock only catches a check that sleeps: at WALL_FACTOR times
    the budget, a check that got CPU (it is starved by load, not sleeping) is given more time."""
    _ARMED[0], _ARMED[1], _ARMED[2] = seconds, _monotonic(), _process_time()
    _FIRED[0] = None
    _ARMED[3] = _resident() if _MEMORY_GROWTH[0] > 0 else 0
    _signal(_SIGALRM, _alarm)  # (again: the solution may have changed them)
    _signal(_SIGPROF, _alarm)
    _setitimer(_ITIMER_PROF, seconds)
    _setitimer(_ITIMER_REAL, seconds * WALL_FACTOR)


def _disarm():
    """Stop the alarms. A check that used more CPU time than its budget timed out even where no alarm
    interrupted it (the solution ignored the signal, or stopped the timer)."""
    _setitimer(_ITIMER_PROF, 0)
    _setitimer(_ITIMER_REAL, 0)
    if _FIRED[0] is None and _ARMED[0] > 0 and _process_time() - _ARMED[2] > _ARMED[0] + ALARM_SLACK_S:
        _FIRED[0] = _stopped()


def _progressing():
    """At the wall-clock alarm: True (and re-armed) when the check is running but starved by load."""
    budget, wall0, cpu0 = _ARMED[0], _ARMED[1], _ARMED[2]
    wall = _monotonic() - wall0
    if budget <= 0 or wall >= budget * WALL_CAP or _process_time() - cpu0 < MIN_PROGRESS * wall:
        return False
    _setitimer(_ITIMER_REAL, budget * WALL_FACTOR)
    return True
_BaseException = BaseException
_ValueError = ValueError
_KeyError = KeyError
_MemoryError = MemoryError
_builtins = __builtins__ if _type(__builtins__) is _dict else __builtins__.__dict__
_BUILTINS = _dict(_builtins)  # restored after every operation: the student's patches never reach us
# the builtin exception classes by name: a class of the solution's own named `ValueError` (or `MemoryError`)
# is not one of them, though its name is (`_error`)
_BUILTIN_ERRORS = {n: c for n, c in _BUILTINS.items() if _type(c) is type and issubclass(c, _BaseException)}
_HEX = "0123456789abcdef"


_GUARD = []  # non-empty only in the harness process (never restore builtins in the grading process)
_CHANGED = []  # names of builtins the student's code replaced or added, since the last report


def restore_builtins():
    """Put back every builtin the student's code replaced or added; return the names it had changed."""
    if not _GUARD:
        return []
    changed = []
    for name in _list(_builtins.keys()):
        if name not in _BUILTINS:
            changed.append(name)
            del _builtins[name]
    for name, value in _BUILTINS.items():
        if _builtins.get(name, restore_builtins) is not value:
            changed.append(name)
            _builtins[name] = value
    _CHANGED.extend(changed)
    return changed


def _json_str(s):
    out = ['"']
    for ch in s:
        code = _ord(ch)
        if ch == '"' or ch == "\\" or code < 0x20 or code > 0x7E:
            if code > 0xFFFF:
                code -= 0x10000
                for unit in (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)):
                    out.append("\\u" + _HEX[unit >> 12] + _HEX[(unit >> 8) & 15] + _HEX[(unit >> 4) & 15] + _HEX[unit & 15])
            else:
                out.append("\\u" + _HEX[code >> 12] + _HEX[(code >> 8) & 15] + _HEX[(code >> 4) & 15] + _HEX[code & 15])
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def to_json(x):
    """JSON text of a normalised value, written with captured primitives only (json may be patched)."""
    t = _type(x)
    if x is None:
        return "null"
    if t is _bool:
        return "true" if x else "false"
    if t is _int:
        return _int.__repr__(x) if _int.bit_length(x) <= MAX_INT_BITS else _json_str("<bad type: int too large>")
    if t is _str:
        return _json_str(x)
    if t is _list:
        return "[" + ",".join([to_json(v) for v in x]) + "]"
    if t is _dict:
        return "{" + ",".join([_json_str(k) + ":" + to_json(v) for k, v in x.items()]) + "}"
    return _json_str("<bad type: unserialisable>")

# enqueue's parameters in the seed's order: an "enqueue" op ``["enqueue", kwargs, n]`` passes the first n positionally
ENQ_ORDER = ("request_id", "prompt_len", "max_new_tokens", "priority", "cache_hit", "required_blocks",
             "deadline_step", "preemptible")
STATE_FIELDS = (
    "request_id", "prompt_len", "max_new_tokens", "generated_len", "phase", "priority", "cache_hit",
    "wait_steps", "required_blocks", "admitted", "deadline_step", "preemptible", "status", "preemptions",
)
MAX_ITEMS = 20000
MAX_STR = 200
MAX_INT_BITS = 4096  # a larger int is no value of a check (and str() refuses ints over 4300 digits)
COMPARISON_METHODS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__bool__",
                      "__index__", "__int__")


class ScenarioTimeout(BaseException):
    """Raised by the alarm when one scenario runs too long."""


class ScenarioOutOfMemory(ScenarioTimeout):
    """Raised by the alarm instead when the scenario's resident memory grew past `_MEMORY_GROWTH`: it
    is reported as a MemoryError (caught wherever a timeout is, so `except Exception` cannot keep it)."""


def _numpy_scalar(x):
    """Exact NumPy integer/bool scalars (C types the student cannot subclass into lies) -> int/bool. NumPy is read
    from ``sys.modules``, which the solution can change (``sys.modules["numpy"]``, a module of its own whose
    ``int64`` is a class that lies): a class made at run time (`_HEAPTYPE`) is never one of NumPy's."""
    np = sys.modules.get("numpy")
    if np is None:
        return False, None
    try:
        t = _type(x)
        if _type_flags(t) & _HEAPTYPE:
            return False, None
        if t is _getattr(np, "bool_", None):
            return True, _bool(x)
        for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
            if t is _getattr(np, name, None):
                return True, _int(x)
    except _BaseException:
        return False, None
    return False, None


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made at run time (a class statement, type()), not in C
# Read through `type`'s own descriptors, so that a metaclass cannot answer for the class.
_type_flags = type.__dict__["__flags__"].__get__
_type_mro = type.__dict__["__mro__"].__get__
_type_dict = type.__dict__["__dict__"].__get__
_type_name = type.__dict__["__name__"].__get__


def _known_classes():
    """Well-known Python classes of the standard library whose comparisons are honest, each with its comparison
    methods as captured here, before any student code runs (a class patched later is no longer known)."""
    out = []
    for module, names in (("enum", ("Enum", "IntEnum", "Flag", "IntFlag", "ReprEnum", "StrEnum")),
                          ("numbers", ("Number", "Complex", "Real", "Rational", "Integral")),
                          ("fractions", ("Fraction",)), ("decimal", ("Decimal",)),
                          ("collections", ("Counter", "OrderedDict", "UserDict", "UserList", "UserString"))):
        try:
            mod = __import__(module)
        except ImportError:
            continue
        for name in names:
            klass = getattr(mod, name, None)
            if isinstance(klass, type):
                own = _type_dict(klass)
                out.append((klass, [own.get(m) for m in COMPARISON_METHODS]))
    return out


_KNOWN = _known_classes()


def _stdlib_classes(*names):
    """The classes `names` of ``collections``, kept only as the classes implemented in C they are (nothing of them can
    be patched), for values read as their items are:

    - ``OrderedDict`` and ``defaultdict`` as dicts: an event built as one is read as the dict it is (the notebook's
      cells read an event as ``event[field]`` and compare its values, never its type);
    - ``deque`` as a list: a timeline kept as one (the events `run()` returns) is read as the list it is (the cells
      read it by len(), index and iteration, never its type).

    A dict or list subclass of the solution's own still differs."""
    collections = __import__("collections")  # (as `_known_classes`: the standard library only)
    return [k for k in (getattr(collections, n) for n in names)
            if _isinstance(k, type) and not _type_flags(k) & _HEAPTYPE]


_STDLIB_DICTS = _stdlib_classes("OrderedDict", "defaultdict")
_STDLIB_LISTS = _stdlib_classes("deque")


def _plain_dict(t):
    """Whether values of class `t` are read as a dict: dict itself, or one of `_STDLIB_DICTS` (by identity)."""
    return t is _dict or _any([t is k for k in _STDLIB_DICTS])


def _honest_comparisons(klass):
    """Whether `klass`'s own comparison methods can be trusted: a class implemented in C (CPython's builtins,
    NumPy's scalars: Python code cannot make one), or a known class of the standard library, unchanged."""
    if not _type_flags(klass) & _HEAPTYPE:
        return True
    own = _type_dict(klass)
    for known, methods in _KNOWN:
        if known is klass:
            for i in _range(_len(COMPARISON_METHODS)):
                if own.get(COMPARISON_METHODS[i]) is not methods[i]:  # identity: a patched method may lie
                    return False
            return True
    return False


def _overrides_comparison(t):
    """Whether a class of `t`'s MRO that is not trusted (`_honest_comparisons`) defines comparisons of its own."""
    try:
        for klass in _type_mro(t):
            if _honest_comparisons(klass):
                continue
            own = _type_dict(klass)
            if "__dataclass_fields__" in own and "__eq__" in own and klass is t:
                # A dataclass instance: honest code may return one by mistake; its == is generated.
                continue
            if _any([m in own for m in COMPARISON_METHODS]):
                return True
    except _BaseException:
        return True
    return False


def _bad(x):
    """The "<bad type: ...>" of a value that is not plain data. "overrides comparison" (tamper evidence) only
    when a class of its own defines comparisons: a NumPy float, an Enum or a Fraction is merely the wrong type."""
    t = _type(x)
    name = "?"
    try:
        name = _type_name(t)
    except _BaseException:
        pass
    suspicious = _overrides_comparison(t)
    return "<bad type: %s%s>" % (name[:60], "; overrides comparison" if suspicious else "")


def normalise(x, depth=0):
    """A plain JSON value with exact types, or a "<bad type: ...>" string."""
    t = _type(x)
    if t is _int and _int.bit_length(x) > MAX_INT_BITS:
        return "<bad type: int of %d bits>" % (_int.bit_length(x),)  # (its digits would not even be written)
    if x is None or t is _bool or t is _int:
        return x
    if t is _str:
        return x if _len(x) <= MAX_STR else x[:MAX_STR] + "..."
    if t is _float:
        return "<float: %s>" % (_float.__repr__(x),)
    ok, value = _numpy_scalar(x)
    if ok:
        return value
    if depth > 6:
        return "<bad type: too deep>"
    if t is _list or t is _tuple or _any([t is k for k in _STDLIB_LISTS]):
        if _len(x) > MAX_ITEMS:
            return "<bad type: too long>"
        return [normalise(v, depth + 1) for v in x]
    if _plain_dict(t):
        if _dict.__len__(x) > MAX_ITEMS:
            return "<bad type: too long>"
        out = {}
        for k in _list(_dict.keys(x)):
            if _type(k) is not _str:
                return "<bad type: dict key %s>" % (_type(k).__name__,)
            out[k] = normalise(_dict.__getitem__(x, k), depth + 1)
        return out
    return _bad(x)


def _numpy_float(x):
    """An exact NumPy float scalar (a C type, as in `_numpy_scalar`) -> float; else None."""
    np = sys.modules.get("numpy")
    t = _type(x)
    if np is None or _type_flags(t) & _HEAPTYPE:
        return None
    for name in ("float16", "float32", "float64"):
        if t is _getattr(np, name, None):
            return _float(x)
    return None


def as_eq(x):
    """A scalar as ``==`` against a plain value sees it, for the reads a visible cell compares with ``==`` (the
    items of a tuple it builds or gets: expect_equal checks the tuple's type, not its items') and for the sort
    key: a bool, an integral float (Python's or NumPy's) or an int subclass is the int it equals (``True == 1``,
    ``1e9 == 1_000_000_000``), another float stays ``"<float: ...>"``, a str subclass is its str. Only comparisons
    Python or NumPy define count: a class of the solution's own that defines comparisons is `_bad` (forgery)."""
    t = _type(x)
    if x is None or t is _int or t is _str:
        return normalise(x)
    if t is _bool:
        return _int(x)
    value = _numpy_float(x)
    if value is None:
        ok, plain = _numpy_scalar(x)
        if ok:
            return _int(plain)
        if _overrides_comparison(t):
            return _bad(x)
        try:
            mro = _type_mro(t)
            if _int in mro:
                return normalise(_int.__int__(x))
            if _str in mro:
                return normalise(_str.__str__(x))
            if _float not in mro:
                return normalise(x)
            value = _float.__float__(x)
        except _BaseException:
            return _bad(x)
    if _float.is_integer(value):
        return _int(value)
    return "<float: %s>" % (_float.__repr__(value),)


def _plain_scalar(x):
    """None or a value of a builtin scalar or sequence type: what ``value[field]`` cannot read a field of."""
    t = _type(x)
    return x is None or t is _bool or t is _int or t is _float or t is _str or t is _list or t is _tuple


def _fields(ev, names):
    """``ev[name]`` for each name, as a visible cell reads an event (any mapping that answers, a dict subclass
    included); a missing name is left out. The values keep their strict types."""
    out = {}
    for f in names:
        try:
            value = ev[f]
        except _KeyError:
            continue
        out[f] = normalise(value)
    return out


def _raised(exc, klass):
    """Whether `exc` is a `klass`, as ``except klass`` decides: by its class, never by a ``__class__`` it claims
    (isinstance believes one: an exception of the solution's own would read as a ValueError, or as our timeout)."""
    return _issubclass(_type(exc), klass)


def _error(exc):
    """A short, safe description of an exception raised by student code."""
    if _raised(exc, ScenarioOutOfMemory):
        return {"raised": "MemoryError", "msg": "memory kept growing until the time limit"}
    if _raised(exc, ScenarioTimeout):
        return {"timeout": True}
    if _raised(exc, _ValueError):
        name = "ValueError"
    else:
        try:
            name = _type(exc).__name__
            if _type(name) is not _str:
                name = "?"
        except _BaseException:
            name = "?"
        builtin = _BUILTIN_ERRORS.get(name)
        if builtin is not None and not _raised(exc, builtin):
            # `except ValueError` would not catch it: it must not read as the builtin (a check expecting a
            # ValueError would pass, a MemoryError would set the status)
            name = name[:30] + " (not the builtin)"
    msg = ""
    try:
        args = exc.args
        if _type(args) is _tuple and args and _type(args[0]) is _str:
            msg = args[0][:MAX_STR]
    except _BaseException:
        pass
    where = _raised_in(exc)
    return {"raised": name[:60], "msg": msg, **({"in": where} if where else {})}


SOLUTION_FILE = "<solution cell>"
_TRACEBACK_OF = BaseException.__traceback__  # (the real one: a class of the solution's may override the attribute)


def _raised_in(exc):
    """The name of the solution cell's function in which `exc` was raised (its innermost frame there), or None:
    the feedback names the method, and so the TODO, of a stub's bare NotImplementedError."""
    found = None
    try:
        tb = _TRACEBACK_OF.__get__(exc)
        for _ in _range(1000):
            if _type(tb) is not types.TracebackType:
                break
            code = tb.tb_frame.f_code
            if code.co_filename == SOLUTION_FILE and _type(code.co_name) is _str:
                found = code.co_name[:60]
            tb = tb.tb_next
    except _BaseException:
        return None
    return found


def state_of(sim):
    queue = sim.queue
    reqs = []
    for i in _range(_len(queue)):
        req = queue[i]
        reqs.append({f: normalise(_getattr(req, f)) for f in STATE_FIELDS})
    return {"clock": normalise(sim.clock), "free_kv_blocks": normalise(sim.free_kv_blocks), "queue": reqs}


def replay(sim, rows, max_steps):
    """SPEC section 3 over the student's class: enqueue arrivals before each step, jump idle gaps."""
    order = _sorted(_range(_len(rows)), key=lambda i: (rows[i]["arrival_step"], i))
    arrived = {}
    events = []
    pos = 0
    steps = 0
    while True:
        if steps >= max_steps:
            stop = "max_steps"
            break
        while pos < _len(order) and rows[order[pos]]["arrival_step"] <= sim.clock:
            row = rows[order[pos]]
            sim.enqueue(
                request_id=row["request_id"], prompt_len=row["prompt_len"], max_new_tokens=row["max_new_tokens"],
                priority=row["priority"], cache_hit=row["cache_hit"], required_blocks=row["required_blocks"],
                deadline_step=row["deadline_step"], preemptible=row["preemptible"],
            )
            arrived[order[pos]] = sim.queue[-1]
            pos += 1
        clock = sim.clock
        if _type(clock) is not _int:
            stop = "bad clock"
            break
        event = sim.step()
        if event is not None:
            ev = normalise(event)
            if _type(ev) is _dict:
                ev = _dict(ev)
                ev["step"] = clock
            events.append(ev)
            steps += 1
            continue
        if pos < _len(order):
            sim.clock = rows[order[pos]]["arrival_step"]
            continue
        stop = "stopped"
        break
    states = {}
    for i in _sorted(arrived):
        states[_str(i)] = {f: normalise(_getattr(arrived[i], f)) for f in STATE_FIELDS}
    return {"events": events, "states": states, "stop": stop, "clock": normalise(sim.clock),
            "free_kv_blocks": normalise(sim.free_kv_blocks)}


def run_op(ns, box, op):
    """Execute one operation; return its observation (plain data)."""
    name = op[0]
    if name == "new":
        box["sim"] = None
        if "DecodeSchedulerSim" not in ns:  # the cell did not load: say so, not the lookup's KeyError
            return {"raised": "NameError", "msg": "the solution cell did not define DecodeSchedulerSim"}
        box["sim"] = ns["DecodeSchedulerSim"](**op[1])
        return "ok"
    sim = box.get("sim")
    if sim is None:
        return {"raised": "NoSimulator", "msg": "the simulator was not constructed"}
    if name == "enqueue":
        if _len(op) > 2:  # the first op[2] parameters positionally, as a visible cell passes them
            kw = _dict(op[1])
            args = [kw.pop(k) for k in ENQ_ORDER[:op[2]]]
            sim.enqueue(*args, **kw)
        else:
            sim.enqueue(**op[1])
        return "ok"
    if name == "step":
        return normalise(sim.step())
    if name == "run":
        return normalise(sim.run(max_steps=op[1]))
    if name == "key":  # the sort key's items by value (`as_eq`): it is only ever compared, with == and <
        key = sim._schedule_key(sim.queue[op[1]])
        t = _type(key)
        if (t is _tuple or t is _list) and _len(key) <= MAX_ITEMS:
            return [as_eq(v) for v in key]
        if _tuple in _type_mro(t) and not _overrides_comparison(t) and _tuple.__len__(key) <= MAX_ITEMS:
            # a tuple subclass that compares as a tuple (a NamedTuple): its own items, read as a tuple's
            return [as_eq(v) for v in _list(_tuple.__iter__(key))]
        return normalise(key)
    if name == "eff":
        return normalise(sim._effective_priority(sim.queue[op[1]]))
    if name == "ensure":
        return normalise(sim._ensure_capacity(sim.queue[op[1]]))
    if name == "state":
        return state_of(sim)
    # Probes that read only what a visible test cell reads (so its mirror checks no more than the cell does)
    if name == "stepq":  # a step whose event the test does not look at
        sim.step()
        return None
    if name == "stepf":  # the listed fields of step()'s event, as ``event[field]`` reads them
        ev = sim.step()
        return normalise(ev) if _plain_scalar(ev) else _fields(ev, op[1])
    if name == "reqf":  # the listed fields of queue[i]
        req = sim.queue[op[1]]
        return {f: normalise(_getattr(req, f)) for f in op[2]}
    if name == "free":
        return normalise(sim.free_kv_blocks)
    if name == "keyf":  # one item of the sort key
        return normalise(sim._schedule_key(sim.queue[op[1]])[op[2]])
    if name == "runf":
        # What the TODO 4 cell reads of run(): len(events), and (events[i]['request_id'], events[i]['action']) for
        # the first and the last, a tuple it compares with == (`as_eq`); op[2]: only those it reads
        evs = sim.run(max_steps=op[1])
        t = _type(evs)
        if evs is None or t is _bool or t is _int or t is _float or t is _str:  # no events to read: say what came
            return normalise(evs)
        n = _len(evs)

        def head(i):
            ev = evs[i]
            if _plain_scalar(ev):
                return normalise(ev)
            return [as_eq(ev["request_id"]), as_eq(ev["action"])]

        out = {}
        for f in (op[2] if _len(op) > 2 else ("len", "first", "last")):
            if f == "len":
                out[f] = n
            elif f in ("first", "last"):
                out[f] = (head(0) if f == "first" else head(-1)) if n else None
        return out
    if name == "alldone":
        queue = sim.queue
        return normalise(_all_done([queue[i].done for i in _range(_len(queue))]))
    if name == "set":
        _setattr(sim.queue[op[1]], op[2], op[3])
        return None
    if name == "setclock":
        sim.clock = op[1]
        return None
    if name == "replay":
        return replay(sim, op[1], op[2])
    raise RuntimeError("unknown op %r" % (name,))


def run_scenario(ns, ops, budget_s=None):
    """Run one scenario's ops against the classes in namespace `ns`; errors become observations."""
    box = {"sim": None}
    obs = []
    for op in ops:
        try:
            obs.append(run_op(ns, box, op))
        except ScenarioTimeout as exc:
            obs.append(_error(exc))
            break
        except _BaseException as exc:  # noqa: BLE001 - the student's code may raise anything
            obs.append(_error(exc))
            if _raised(exc, _MemoryError) or _raised(exc, _RecursionError):
                box["sim"] = None
        restore_builtins()
    return obs


def _scan_line(line, state):
    """Carry `state` (open brackets, the open string's quote, a backslash at the end) over one physical line."""
    depth, quote = state[0], state[1]
    j, n, cont = 0, _len(line), False
    while j < n:
        ch = line[j]
        if quote:
            if ch == "\\":
                cont = j + 1 >= n
                j += 2
                continue
            if line.startswith(quote, j):
                j += _len(quote)
                quote = None
                continue
            j += 1
            continue
        if ch == "#":
            break
        if ch == "'" or ch == '"':
            quote = line[j:j + 3] if line[j:j + 3] in ("'''", '"""') else ch
            j += _len(quote)
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = depth - 1 if depth > 0 else 0
        elif ch == "\\" and j == n - 1:
            cont = True
        j += 1
    if quote and _len(quote) == 1 and not cont:
        quote = None  # an unterminated one-line string ends with its line (a syntax error either way)
    state[0], state[1], state[2] = depth, quote, cont


def strip_magics(source):
    """IPython line magics and shell escapes are not Python; turn them into ``pass``, as IPython does: only a
    ``%`` or ``!`` that starts a statement, not a line inside brackets, a string or after a backslash (a
    continuation line such as ``!= 'decode'`` stays code); a magic's own continuation lines go with it."""
    lines = source.split("\n")
    state = [0, None, False]  # open brackets, open string quote, the last line ended with a backslash
    in_magic = False
    for k in _range(_len(lines)):
        line = lines[k]
        body = line[:-1] if line.endswith("\r") else line
        if in_magic:
            in_magic = body.endswith("\\")
            lines[k] = ""
            continue
        stripped = body.lstrip()
        if state[0] == 0 and state[1] is None and not state[2]:
            indent = body[: _len(body) - _len(stripped)]
            target = _magic_target(stripped)
            if stripped.startswith(("%", "!", "?")) or _help_line(stripped):  # ``%time f()``, ``!ls``, ``obj?``
                lines[k] = indent + "pass"
                in_magic = body.endswith("\\")
                continue
            if target is not None:  # ``files = !ls``, ``a, b = %magic``: each name is bound, to None
                lines[k] = indent + " = ".join([t.strip() for t in target.split(",")]) + " = None"
                in_magic = body.endswith("\\")
                continue
        _scan_line(body, state)
    return "\n".join(lines)


# Cell magics that run the cell's body as Python in the notebook's namespace (IPython 9): ``%%time`` (with nothing
# after it on its line), ``%%capture [--no-stdout] [--no-stderr] [--no-display] [NAME]``, ``%%prun [options]``. Every
# other one hands the body over as text (``%%writefile``/``%%file``, ``%%script``, ``%%bash``, ``%%html``,
# ``%%markdown``, ``%%javascript``, ``%%python3``: another process), runs it inside a function of its own
# (``%%timeit``), or does not exist (a UsageError): none of it is defined in the notebook.
_CAPTURE_FLAGS = ("--no-stdout", "--no-stderr", "--no-display")


def cell_magic(source):
    """(the Python that IPython runs in the notebook's namespace for this cell, the cell magic line that kept the
    cell's body from running or None). As IPython's input transformers: leading blank lines are dropped, then a
    first line ``%%name args`` calls that magic with the rest of the cell; a magic that runs the body as Python
    (the comment above) transforms it again, so ``%%capture`` over ``%%time`` runs too. Line numbers are
    kept: what does not run becomes empty lines."""
    lines = source.split("\n")
    k = 0
    while k < _len(lines) and (not lines[k] or lines[k].isspace()):
        k += 1
    if k == _len(lines) or not lines[k].startswith("%%"):
        return source, None
    name, _sep, args = lines[k][2:].rstrip().partition(" ")
    words = args.split()
    plain = [w for w in words if w not in _CAPTURE_FLAGS]
    runs = ((name == "time" and not args) or name == "prun"
            or (name == "capture" and _len(plain) <= 1 and not (plain and plain[0].startswith("-"))))
    if not runs:
        return "\n" * (_len(lines) - 1), lines[k].rstrip()
    body, why = cell_magic("\n".join(lines[k + 1:]))
    return "\n" * (k + 1) + body, why


def _dotted_name(text):
    """Whether `text` is a name or a dotted attribute chain (``DecodeSchedulerSim.run``)."""
    parts = text.strip().split(".")
    return _all_done([p.isidentifier() for p in parts])


def _help_line(stripped):
    """IPython's help syntax at the end of a statement: ``obj?``, ``obj.attr??``."""
    text = stripped.rstrip()
    return text.endswith("?") and _dotted_name(text.rstrip("?"))


def _magic_target(stripped):
    """``NAMES = !cmd`` or ``NAMES = %magic``: the NAMES (plain or dotted, comma-separated), else None."""
    i = stripped.find("=")
    if i <= 0 or stripped[i + 1: i + 2] == "=" or stripped[i - 1] in "=!<>+-*/%&|^@:":
        return None
    left, right = stripped[:i].strip(), stripped[i + 1:].lstrip()
    if not right.startswith(("!", "%")) or right.startswith("%="):
        return None
    return left if _all_done([_dotted_name(t) for t in left.split(",")]) else None


class _Anything:
    """Stands in for IPython objects (``get_ipython()``, ``display``): every use is accepted and ignored."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Anything()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __iter__(self):
        return iter(())


def load_solution(source, namespace, budget_s, skip_lines=(), timed_out_lines=None, on_timeout=None):
    """Execute the cell one top-level statement at a time; a failing statement does not stop the rest.

    Each statement may run `budget_s` seconds of CPU (twice that of wall clock); one that runs longer
    is interrupted, its line number appended to `timed_out_lines` (and passed to `on_timeout`), and
    loading goes on. Statements starting on a line in `skip_lines` are not run (they timed out in an
    earlier process). Returns the errors, as short strings.
    """
    import __future__
    import ast

    errors = []
    source, magic = cell_magic(source)
    if magic is not None:
        errors.append("the cell magic line %s hands the rest of the cell to that magic instead of running it as Python "
                      "(as IPython does), so nothing in it was defined: delete that line" % magic[:60])
    try:
        tree = ast.parse(strip_magics(source), SOLUTION_FILE)
    except SyntaxError as exc:
        return ["SyntaxError: %s (line %s)" % (exc.msg, exc.lineno)]
    except _BaseException as exc:  # noqa: BLE001
        err = _error(exc)
        return ["%s: %s" % (err.get("raised", "error"), err.get("msg", ""))]
    flags = 0
    for node in tree.body:
        if _type(node) is ast.ImportFrom and node.module == "__future__":
            for alias in node.names:
                feature = _getattr(__future__, alias.name, None)
                if feature is not None:
                    flags |= feature.compiler_flag
            continue
        if node.lineno in skip_lines:
            errors.append("line %s was skipped (it timed out before)" % node.lineno)
            continue
        try:
            code = compile(ast.Module(body=[node], type_ignores=[]), SOLUTION_FILE, "exec", flags=flags,
                           dont_inherit=True)
            _arm(budget_s)
            try:
                exec(code, namespace)
            finally:
                _disarm()
                restore_builtins()
        except _BaseException as exc:  # noqa: BLE001 - the cell may raise anything
            err = _error(exc)
            if err.get("timeout"):
                errors.append("line %s timed out (a top-level statement of the solution cell may use %.3g s of "
                              "CPU time; it was skipped, the rest of the cell ran)" % (node.lineno, budget_s))
                if timed_out_lines is not None:
                    timed_out_lines.append(node.lineno)
                if on_timeout is not None:
                    on_timeout(node.lineno)
                continue
            errors.append("line %s raised %s: %s" % (node.lineno, err["raised"], err["msg"]))
    return errors


def _alarm(signum, _frame):
    if signum == _SIGALRM and _progressing():
        return
    # Noted before it is raised: a check that catches it and goes on (``except BaseException``) still timed out.
    _FIRED[0] = _stopped()
    raise _FIRED[0]


def _stopped():
    """Why the check was stopped at its time limit: its memory (see _MEMORY_GROWTH) or its time."""
    if _MEMORY_GROWTH[0] > 0 and _resident() - _ARMED[3] > _MEMORY_GROWTH[0]:
        return ScenarioOutOfMemory()
    return ScenarioTimeout()


def _channel(job, key):
    """A descriptor the grader passed (``"out_fd"``, ``"serve_fd"``), kept from the processes the solution starts."""
    fd = job.get(key)
    if _type(fd) is not _int:
        return None
    os.set_inheritable(fd, False)
    return fd


def main(argv):
    with open(argv[1], encoding="utf-8") as fh:
        job = json.load(fh)
    fd = _channel(job, "out_fd")
    if fd is None:  # by hand: python -I -S harness.py IN.json OUT.jsonl
        fd = os.open(argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    harness_pid = _getpid()

    def emit(obj):
        if _getpid() != harness_pid:
            # A process the solution forked has come back into the harness: it leaves without a word
            # (its lines would repeat the harness's, read as forged results).
            _os_exit(0)
        data = (to_json(obj) + "\n").encode("ascii")
        _os_write(fd, data)

    def changed_builtins():
        names = _sorted(_set(_CHANGED))[:20]
        del _CHANGED[:]
        return names

    _GUARD.append(True)

    for p in job.get("sys_path", []):
        sys.path.append(p)
    budget = float(job.get("scenario_timeout_s", 5.0))
    if _type(job.get("memory_mb")) is _int and job["memory_mb"] > 0:
        _MEMORY_GROWTH[0] = job["memory_mb"] * 2**20 // 4
    devnull = open(os.devnull, "w")
    real_stdout = sys.stdout
    sys.stdout = devnull  # the student's prints go nowhere (the sandbox caps direct writes anyway)

    module = types.ModuleType("solution")
    module.__file__ = SOLUTION_FILE
    module.__dict__["get_ipython"] = _Anything  # IPython hooks in a cell do nothing here
    module.__dict__["display"] = _Anything()
    module.__dict__["help"] = _Anything()  # what `site` adds and `python -S` lacks; in a notebook it only prints
    sys.modules["solution"] = module
    slow_lines = []
    skip = [n for n in job.get("skip_lines", []) if _type(n) is _int]
    errors = load_solution(job["solution_source"], module.__dict__, float(job.get("load_timeout_s", 4.0)),
                           skip_lines=skip, timed_out_lines=slow_lines,
                           on_timeout=lambda lineno: emit({"load_timeout": lineno}))
    restore_builtins()
    missing = [n for n in ("DecodeSchedulerSim", "RequestState") if n not in module.__dict__]
    if missing:
        errors = ["the solution cell did not define %s%s" % (", ".join(missing),
                                                             ": " + "; ".join(errors) if errors else "")]
    line = {"load": "error", "error": "; ".join(errors)[:500]} if errors else {"load": "ok"}
    changed = changed_builtins()
    if changed:
        line["builtins_changed"] = changed
    if slow_lines or skip:
        line["load_timeouts"] = slow_lines + skip
    emit(line)
    ns = module.__dict__

    # Checks that time out (SPEC: a hang) are counted, never timed: the first FULL_TIMEOUTS checks that time out
    # had the whole per-check budget, every later check gets `short`, and once the checks that timed out have
    # used `allowance` seconds (a sum of those fixed limits) the rest are not run. Which checks run, and with
    # which limit, depends only on which earlier checks timed out: the same on every run, busy or not.
    short = _float(job.get("short_timeout_s", budget))
    allowance = _float(job.get("timeout_allowance_s", 1e9))
    timeouts = [_int(job.get("timeouts_before", 0))]
    cpu_limit = _float(job.get("cpu_limit_s", 1e9))

    def limit_now():
        return budget if timeouts[0] < FULL_TIMEOUTS else short

    def spent_on_timeouts():
        n = timeouts[0]
        return budget * min(n, FULL_TIMEOUTS) + short * max(0, n - FULL_TIMEOUTS)

    def run_all(scenarios, may_yield=False, hang_rules=True):
        # hang_rules=False (the batches of a shrinking): every check gets the full limit and none is "not run",
        # so a smaller trace is never reported as failing for a limit or allowance that earlier checks spent
        count = 0
        for scenario in scenarios:
            if hang_rules and spent_on_timeouts() + limit_now() > allowance + 1e-9:
                emit({"id": scenario["id"], "obs": [{"killed": NOT_RUN}]})
                count += 1
                continue
            limit = limit_now() if hang_rules else budget
            if may_yield and _process_time() + limit + YIELD_MARGIN_S > cpu_limit:
                # this process could meet its CPU limit inside the check: a fresh one runs the rest
                emit({"yield": count})
                return None
            start = _monotonic()
            _arm(limit)
            try:
                obs = run_scenario(ns, scenario["ops"])
            except ScenarioTimeout as exc:
                obs = [_error(exc)]
            finally:
                _disarm()
            restore_builtins()
            fired = _FIRED[0]
            if fired is not None and not (obs and obs[-1] == _error(fired)):  # the student's code swallowed it
                obs = _list(obs) + [_error(fired)]
            if obs and _type(obs[-1]) is _dict and obs[-1].get("timeout") is True:
                timeouts[0] += 1
            line = {"id": scenario["id"], "obs": obs, "wall_ms": _int((_monotonic() - start) * 1000)}
            changed = changed_builtins()
            if changed:
                line["builtins_changed"] = changed
            emit(line)
            count += 1
        return count

    count = run_all(job["scenarios"], may_yield=True, hang_rules=job.get("hang_rules", True) is not False)
    if count is not None:
        emit({"done": count})
    serve = _channel(job, "serve_fd")
    if serve is not None and count is not None:
        # More batches (shrinking a failing trace) arrive down a pipe, one JSON list of scenarios per line;
        # each answered by its result lines and {"batch": N}. The grader closes its end to end us.
        with open(serve, encoding="utf-8") as more:
            batch = 0
            for text in more:
                batch += 1
                try:
                    scenarios = json.loads(text)
                except ValueError:
                    break
                run_all(scenarios, hang_rules=False)
                emit({"batch": batch})
    sys.stdout = real_stdout
    os.close(fd)
    # Gone at once: no thread the solution left (a non-daemon one would hold the exit), no atexit handler,
    # finalizer or __del__ of its objects runs after the last line.
    _os_exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
