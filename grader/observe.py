"""Running the harness: the solution cell in a fresh, sandboxed ``python -I -S harness.py`` child.

`collect_observations` runs every scenario and restarts the harness after a check that killed it,
so one crash or hang loses only its own checks. Budgets are CPU time (`grader.limits`).

The harness's folder is writable by the untrusted code, so the grader (root, outside the sandbox)
opens nothing in it by name: a link, FIFO or device planted there would be followed or waited on.
The harness's channels are file descriptors made here and inherited by the child: its output is an
anonymous file (`os.memfd_create`: a regular file no name can stand for, capped like any file by the
sandbox's ``RLIMIT_FSIZE``) that the grader reads through its own descriptor, and a session's further
scenarios go down a pipe. Links and FIFOs left at the top of the folder, and writes into the hidden
folders' traps, are tamper evidence. What the grader reads and parses is bounded (`_Output`,
`_parse`): ``MAX_OUTPUT_BYTES`` per batch, ``MAX_LINE_BYTES`` per line and ``MAX_CONTAINERS`` JSON
objects and arrays per batch, each far above what an honest harness writes (a batch of every check:
under 1 MiB, lines under 10 KiB, about 5 000 containers); a result line over them fails its check,
and any other line over them is forged (the harness writes no other long line). A line nested deeper
than ``MAX_DEPTH``, or a result line whose id is not a known check's, is forged too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import select
import shutil
import stat
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from .limits import Limits

HARNESS = Path(__file__).with_name("harness.py")
MAX_OUTPUT_BYTES = 16 * 2**20  # read per batch of output (an honest first batch: about 0.8 MiB)
MAX_LINE_BYTES = 2 * 2**20  # one line (honest: under 10 KiB)
MAX_CONTAINERS = 400_000  # JSON objects and arrays parsed per batch (honest: about 5 000): ~30 MB of Python objects
MAX_DEPTH = 32  # objects and arrays nested in one line (honest: at most 12, `harness.normalise` stops at 7)
_PREFIX = 512  # what is kept of a line too large to parse: enough for its scenario id
_TAIL = 4096  # ... and of its end: its last observation and what follows it (`harness.main`: wall_ms, 20 names)
_RESULT_START = re.compile(rb'\{"id":("(?:[^"\\]|\\.){0,400}"),"obs":')

def _numpy_dir() -> str | None:
    spec = importlib.util.find_spec("numpy")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


@dataclass
class HarnessRun:
    load: dict | None
    obs: dict
    done: bool
    outcome: object | None
    wall_s: float
    forged: list = field(default_factory=list)  # signs that the output file was written by someone else
    evidence: list = field(default_factory=list)  # planted links or FIFOs, writes into hidden folders (`_evidence`)
    builtins_changed: list = field(default_factory=list)  # builtins the solution replaced (restored by the harness)
    slow_lines: list = field(default_factory=list)  # top-level statements of the cell that timed out
    yielded: bool = False  # it stopped between checks, near its CPU limit: the rest run in a fresh process
    session: object | None = None  # a HarnessSession still serving (run_harness(serve=True)); caller closes


class _TooLarge(bytes):
    """The start of an output line that is never parsed: longer than MAX_LINE_BYTES, or with more containers
    than its batch has left of MAX_CONTAINERS. ``tail``: the line's last `_TAIL` bytes (`_says_timed_out`)."""

    tail = b""


def _too_large(line: bytes, tail: bytes) -> _TooLarge:
    out = _TooLarge(line[:_PREFIX])
    out.tail = tail[-_TAIL:]
    return out


def _anonymous_file() -> int:
    """A regular file with no name (the harness's output): nothing in any folder can stand for it."""
    with contextlib.suppress(AttributeError, OSError):  # memfd_create: Linux 3.17; else a file deleted at once
        return os.memfd_create("dsched-harness-out", os.MFD_CLOEXEC)
    fd, path = tempfile.mkstemp(prefix="dsched-harness-out-")
    os.unlink(path)
    return fd


class _Output:
    """The harness's output as the grader reads it: through the grader's own descriptor of the anonymous file,
    from where the last read stopped, whole lines only, at most `budget` bytes per call."""

    def __init__(self, fd: int | None = None):
        self.fd = _anonymous_file() if fd is None else fd  # (a reader of another's descriptor never closes it)
        self.pos = 0
        self._partial = b""  # the start of a line not finished yet
        self._long = False  # that line is past MAX_LINE_BYTES: only its start is kept, the rest skipped
        self._tail = b""  # ... but for its last `_TAIL` bytes

    def lines(self, budget: int = MAX_OUTPUT_BYTES, final: bool = False) -> tuple[list, int]:
        """(new whole lines, bytes read); a line over MAX_LINE_BYTES comes as `_TooLarge`. With `final` (the
        harness has ended), an unfinished line that is already too long comes too (it never ends)."""
        out, used = [], 0
        while used < budget:
            try:
                data = os.pread(self.fd, min(2**20, budget - used), self.pos)
            except OSError:
                break
            if not data:
                break
            self.pos += len(data)
            used += len(data)
            self._split(data, out)
        if final and self._long:
            out.append(_too_large(self._partial, self._tail))
            self._partial, self._long = b"", False
        return out, used

    def _split(self, data: bytes, out: list) -> None:
        start = 0
        while True:
            nl = data.find(b"\n", start)
            piece = data[start:] if nl < 0 else data[start:nl]
            if self._long:
                self._tail = (self._tail + piece)[-_TAIL:]
            elif len(self._partial) + len(piece) > MAX_LINE_BYTES:
                self._tail = (self._partial[-_TAIL:] + piece)[-_TAIL:]
                self._partial, self._long = (self._partial + piece[:_PREFIX])[:_PREFIX], True
            else:
                self._partial += piece
            if nl < 0:
                return
            out.append(_too_large(self._partial, self._tail) if self._long else self._partial)
            self._partial, self._long = b"", False
            start = nl + 1

    def close(self) -> None:
        os.close(self.fd)


CHECK_SLACK_S = 0.2  # CPU time past its limit after which the grader itself counts a check as timed out
KILL_GRACE_S = 3.0  # ... and at most this much more before it stops one still running (see `_grace`)


def _grace(limit: float) -> float:
    """CPU time past its limit after which a check still running is stopped: three times its limit (at least
    CHECK_SLACK_S, at most KILL_GRACE_S). A call into C that no alarm interrupts comes back late, and its harness says
    it timed out; a check its harness stops, or that comes back, before then costs no fresh process, whose
    start would repeat what the solution does once per process (a slow first step)."""
    return min(max(CHECK_SLACK_S, 3 * limit), KILL_GRACE_S)
FULL_TIMEOUTS = 2  # as `harness.FULL_TIMEOUTS`
NOT_RUN = "not run: the time allowed for checks that time out was spent"  # as `harness.NOT_RUN`
FORGED_LINE = "its result line was forged"  # the observations of a check whose line said what only the grader says
_TIMED_OUT = {"timeout": True}
_OUT_OF_MEMORY = {"raised": "MemoryError", "msg": "memory kept growing until the time limit"}


class _CheckMeter:
    """Each check's CPU time, measured by the grader from outside the harness: the per-check alarms live in the
    solution's own process, whose code can reach the harness's globals (``sys._getframe().f_back.f_globals``,
    ``gc.get_objects()``) and silence them, so a slow check would pass.

    The sandbox's watcher calls `poll` with the CPU time of the run's processes (``/proc``) every 0.02 s; each poll
    first notes that CPU time, then reads the result lines that have appeared since. A check runs from the line
    before it (the load line, the previous check's line, or the sending of a shrinking batch) to its own line;
    only the next check's line, in order, ends it (any other line is forged or ignored: writing one never
    resets the count). For a line first seen at poll j, the CPU time at poll j-1 is a lower bound of when it was
    written, and the CPU time at poll j+1 an upper bound: so a check is charged at least what it used minus two
    polls' worth, never more (a busy machine polls less often: it never charges an honest check more).
    A check whose charge passes its limit + CHECK_SLACK_S timed out, and one still running past its limit +
    `_grace` is stopped (`poll` returns a reason: the sandbox kills the run; `collect_observations` goes on in a
    fresh one). The hang rules (`harness.main`: which limit, which checks are not run) are applied again here,
    from the grader's own count of the checks that timed out, so a harness whose counters were reset changes
    nothing."""

    def __init__(self, fd: int, scenarios: list[dict], limits: Limits, *, timeouts_before: int, allowance_s: float,
                 hang_rules: bool):
        self._out = _Output(fd)
        self._lock = threading.Lock()
        self.budget = limits.scenario_cpu_s
        self.short = min(limits.short_scenario_cpu_s, limits.scenario_cpu_s)
        self.allowance = allowance_s
        self.growth = limits.memory_mb * 2**20 // 4
        self.timeouts = int(timeouts_before)
        self.expected, self.next, self.hang_rules = [s["id"] for s in scenarios], 0, hang_rules
        self.loaded = False
        self.used = 0  # bytes read (at most MAX_OUTPUT_BYTES per batch, as the grader's own reading)
        self.prev_cpu = 0.0  # the CPU time at the previous poll
        self.mark = None  # the latest the running check can have started, in CPU time (None: not known yet)
        self.mark_rss = 0
        self.rebase = False  # a check ended (or a batch was sent): its successor's start is the next poll's CPU
        self.verdicts: dict = {}  # id -> "timeout" (append a timeout), or the observations that replace the line's
        self.killed = None  # the id of the check the run was stopped in

    def batch(self, scenarios: list[dict]) -> None:
        """A shrinking batch is about to be sent: its checks come next, each with the full limit."""
        with self._lock:
            self.expected, self.next, self.hang_rules, self.used = [s["id"] for s in scenarios], 0, False, 0
            self.rebase, self.loaded = True, True

    def _limit(self) -> float:
        if not self.hang_rules:
            return self.budget
        n = self.timeouts
        spent = self.budget * min(n, FULL_TIMEOUTS) + self.short * max(0, n - FULL_TIMEOUTS)
        limit = self.budget if n < FULL_TIMEOUTS else self.short
        return -1.0 if spent + limit > self.allowance + 1e-9 else limit  # -1: the check is not run

    def poll(self, cpu: float | None, rss: int = 0, final: bool = True):
        """One turn of the watcher: a reason to stop the run, or None. With ``cpu`` None, only the lines written
        since the last turn are read (the run has ended, when `final`; else the batch's last line came)."""
        with self._lock:
            if cpu is not None and self.rebase:
                self.mark, self.mark_rss, self.rebase = cpu, rss, False
            lines, n = self._out.lines(max(0, MAX_OUTPUT_BYTES - self.used), final=cpu is None and final)
            self.used += n
            for chunk in lines:
                self._line(chunk)
            if cpu is None:
                return None
            self.prev_cpu = cpu
            if self.rebase or self.mark is None or self.next >= len(self.expected):
                return None
            limit = self._limit()
            if cpu - self.mark <= max(limit, 0.0) + _grace(limit):
                return None
            sid = self.killed = self.expected[self.next]
            if limit < 0:
                self.verdicts[sid] = [{"killed": NOT_RUN}]
            else:
                self.verdicts[sid] = [_OUT_OF_MEMORY if rss - self.mark_rss > self.growth else _TIMED_OUT]
            return f"a check ran past its time limit ({cpu - self.mark:.1f} s of CPU, limit {max(limit, 0.0):g} s)"

    def _line(self, chunk: bytes) -> None:
        if not self.loaded:
            if chunk.startswith(b'{"load":'):
                self.loaded, self.rebase = True, True
            return
        if self.next >= len(self.expected) or _result_id(chunk) != self.expected[self.next]:
            return  # not the next check's line: it ends nothing (`_parse_all` says which lines are forged)
        sid = self.expected[self.next]
        charged = 0.0 if self.rebase or self.mark is None else self.prev_cpu - self.mark
        limit = self._limit()
        if limit < 0:
            self.verdicts[sid] = [{"killed": NOT_RUN}]
        else:
            if charged > limit + CHECK_SLACK_S:
                self.verdicts[sid] = "timeout"
            if charged > limit + CHECK_SLACK_S or _says_timed_out(chunk):
                self.timeouts += 1
        self.next += 1
        self.rebase = True

    def claimed_not_run(self, obs: dict) -> list[str]:
        """Forged: a check whose line says it was not run (`harness.NOT_RUN`) where the grader's own count of the checks
        that timed out (never below the harness's) still ran it. Its observations become `FORGED_LINE`."""
        with self._lock:
            verdicts = dict(self.verdicts)
        found = [sid for sid, got in obs.items() if got == [{"killed": NOT_RUN}] and verdicts.get(sid) != got]
        for sid in found:
            obs[sid] = [{"killed": FORGED_LINE}]
        return [f"the result line for {sid[:40]!r} says it was not run, though its turn had come" for sid in found[:1]]

    def apply(self, obs: dict) -> dict:
        """`obs` with the grader's own measure applied: a check over its limit timed out, whatever its line says."""
        with self._lock:
            verdicts = dict(self.verdicts)
        for sid, v in verdicts.items():
            if v == "timeout":
                got = obs.get(sid)
                got = got if isinstance(got, list) else []
                obs[sid] = got if _timed_out(got) else got + [_TIMED_OUT]
            elif sid in obs or sid == self.killed:
                obs[sid] = v
        return obs


def _says_timed_out(chunk: bytes) -> bool:
    """Whether a result line's last observation is the harness's timeout (its limit for the next check). A line too
    long to parse here is read at its end, as `harness.to_json` writes one (``{"timeout":true}],"wall_ms":``: no
    string it writes holds a ``"``), so the grader never counts fewer timeouts than the harness (`claimed_not_run`)."""
    if isinstance(chunk, _TooLarge) or len(chunk) > 64 * 1024:
        tail = chunk.tail if isinstance(chunk, _TooLarge) else chunk[-_TAIL:]
        return tail.rpartition(b'],"wall_ms":')[0].endswith(b'{"timeout":true}')
    try:
        items = json.loads(chunk.decode("ascii")).get("obs")
    except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        return False
    return _timed_out(items)


def _result_id(chunk: bytes):
    """The scenario id at the start of a harness result line (as `to_json` writes it), or None."""
    m = _RESULT_START.match(chunk)
    if m is None:
        return None
    try:
        sid = json.loads(m.group(1).decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None
    return sid if isinstance(sid, str) else None


class _GraderLine(dict):
    """A result line the grader wrote in place of one it could not read (`_decode`): its words are the grader's."""


def _decode(chunks: list) -> tuple[list, list]:
    """Parse the lines of one batch within MAX_CONTAINERS: (JSON values, forged). A result line that is too
    large becomes a failed observation of its scenario; any other is forged."""
    lines, forged, containers = [], [], 0
    for chunk in chunks:
        if not chunk.strip():
            continue
        if not isinstance(chunk, _TooLarge):
            n = chunk.count(b"{") + chunk.count(b"[")
            if containers + n > MAX_CONTAINERS:  # not parsed (and not counted: later lines still are)
                chunk = _too_large(chunk, chunk)
            containers += 0 if isinstance(chunk, _TooLarge) else n
        if isinstance(chunk, _TooLarge):
            sid = _result_id(chunk)
            if sid is None:
                forged.append("an oversized line in the harness output")
            else:
                lines.append(_GraderLine(id=sid, obs=[{"killed": "its observations were too large to read"}]))
            continue
        try:
            value = json.loads(chunk.decode("ascii"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            forged.append("unreadable line in the harness output")
            continue
        if _too_deep(value):
            forged.append("a line nested too deep in the harness output")
        else:
            lines.append(value)
    return lines, forged


def _too_deep(value, limit: int = MAX_DEPTH) -> bool:
    """Whether a parsed line nests more than `limit` objects and arrays (walked without recursion: the judge's
    recursive code would fail on it)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (list, dict)):
            if depth > limit:
                return True
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def _parse(chunks: list, scenarios: list[dict], first: bool = True):
    """`_parse_all` without its last item (whether the harness yielded)."""
    return _parse_all(chunks, scenarios, first)[:6]


def _grader_words(items) -> bool:
    """Whether observations open with ``{"killed": ...}``, the grader's record of a check it stopped or never ran
    (`compare.compare` says so in the feedback, `verdict` sets the status by it): the harness writes one only as
    `NOT_RUN` (its first observation is the constructor's), checked against the grader's count (`claimed_not_run`)."""
    return (isinstance(items, list) and bool(items) and isinstance(items[0], dict) and "killed" in items[0]
            and items != [{"killed": NOT_RUN}])


def _parse_all(chunks: list, scenarios: list[dict], first: bool = True):
    """The harness's output lines, strictly: (load line, done?, obs by id, forged, builtins changed, slow lines,
    yielded?).

    `chunks` are the lines of one batch (`_Output.lines`). In the `first` batch the load line comes before any
    result, and the done line counts every scenario: the harness loads the cell, then runs every check."""
    lines, forged = _decode(chunks)
    load = next((ln for ln in lines if isinstance(ln, dict) and "load" in ln), None)
    done = any(isinstance(ln, dict) and ("done" in ln or "batch" in ln) for ln in lines)
    known = {s["id"] for s in scenarios}
    obs, seen = {}, set()
    patched = sorted({str(n)[:40] for ln in lines if isinstance(ln, dict) and isinstance(ln.get("builtins_changed"), list)
                      for n in ln["builtins_changed"]})
    loaded = not first
    if sum(1 for ln in lines if isinstance(ln, dict) and "load" in ln) > 1:
        forged.append("a second load line")  # the harness loads the cell once
    if sum(1 for ln in lines if isinstance(ln, dict) and ("done" in ln or "batch" in ln)) > 1:
        forged.append("a second done line")  # ... and ends a batch once
    for ln in lines:
        if not isinstance(ln, dict):
            continue
        loaded = loaded or "load" in ln
        if not loaded and ("id" in ln or "done" in ln or "batch" in ln):
            forged.append("results before the solution cell had loaded")
        if first and "done" in ln and ln["done"] != len(scenarios):
            forged.append(f"a count of {str(ln['done'])[:20]} checks done, of {len(scenarios)}")
        if "id" in ln:
            sid = ln.get("id")
            if not isinstance(sid, str) or sid not in known or sid in seen or not isinstance(ln.get("obs"), list):
                forged.append(f"unexpected result line for {str(sid)[:40]!r}")
                continue
            if sid != scenarios[len(seen)]["id"]:
                forged.append(f"the result line for {sid[:40]!r} out of the checks' order")  # it runs them in order
            seen.add(sid)
            if type(ln) is not _GraderLine and _grader_words(ln["obs"]):
                forged.append(f"the result line for {sid[:40]!r} says the grader stopped its check")
                obs[sid] = [{"killed": FORGED_LINE}]
                continue
            obs[sid] = ln["obs"]
    if done and len(seen) < len(scenarios):
        forged.append(f"a done line after {len(seen)} of {len(scenarios)} checks")  # it writes one after the last
    slow = sorted({ln["load_timeout"] for ln in lines if isinstance(ln, dict) and type(ln.get("load_timeout")) is int})
    yielded = any(isinstance(ln, dict) and "yield" in ln for ln in lines)
    return load, done, obs, forged, patched, slow, yielded


def _planted(folder: str) -> list[str]:
    """Links, FIFOs and devices at the top of the harness's folder. The grader opens nothing there, and an
    honest solution has no reason to make them: they are aimed at the grader's files (tamper evidence)."""
    found = []
    try:
        with os.scandir(folder) as entries:
            for k, entry in enumerate(entries):
                if k >= 10_000:
                    break
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                if stat.S_ISLNK(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                    found.append(entry.name[:40])
    except OSError:
        return []
    return sorted(found)


def _planted_note(folder: str) -> list[str]:
    planted = _planted(folder)
    return ["links or FIFOs planted in the checks' folder: " + ", ".join(planted[:3])] if planted else []


def _evidence(folder: str, outcome) -> list[str]:
    """Tamper evidence a finished harness run left: planted links or FIFOs, writes into hidden folders."""
    found = _planted_note(folder)
    writes = list(getattr(outcome, "protected_writes", None) or [])
    if writes:
        found.append("wrote into protected folders: " + ", ".join(writes[:3]))
    return found


@dataclass
class _Prepared:
    """A harness run's folder and channels: the grader's ends, and the copies the child inherits."""

    tmp: str
    out: _Output
    child_fds: tuple  # closed by `run_isolated` once the child has them
    more_w: int | None  # the write end of the session's pipe
    meter: _CheckMeter  # each check's CPU time, from outside


def _prepare(source: str, scenarios: list[dict], limits: Limits, skip_lines, serve: bool,
             timeouts_before: int = 0, allowance_s: float | None = None, hang_rules: bool = True) -> _Prepared:
    from .sandbox import process_scratch

    tmp = tempfile.mkdtemp(prefix="dsched-verdict-", dir=process_scratch())
    os.chmod(tmp, 0o700)
    shutil.copyfile(HARNESS, os.path.join(tmp, "harness.py"))
    sys_path = []
    np_dir = _numpy_dir()
    if np_dir:
        lib = os.path.join(tmp, "pylib")
        os.mkdir(lib)
        os.symlink(np_dir, os.path.join(lib, "numpy"))
        sys_path.append(lib)
    out = _Output()
    child_fds = [os.dup(out.fd)]
    more_w = None
    job = {"solution_source": source, "sys_path": sys_path, "scenario_timeout_s": limits.scenario_cpu_s,
           "load_timeout_s": limits.scenario_cpu_s * 1.5, "memory_mb": limits.memory_mb,
           "skip_lines": sorted(skip_lines), "out_fd": child_fds[0],
           "short_timeout_s": min(limits.short_scenario_cpu_s, limits.scenario_cpu_s),
           "timeout_allowance_s": limits.timeout_allowance_s() if allowance_s is None else allowance_s,
           "timeouts_before": int(timeouts_before), "cpu_limit_s": limits.cpu_s, "hang_rules": bool(hang_rules),
           "scenarios": [{"id": s["id"], "ops": s["ops"]} for s in scenarios]}
    if serve:
        more_r, more_w = os.pipe()
        child_fds.append(more_r)
        job["serve_fd"] = more_r
    with open(os.path.join(tmp, "in.json"), "w", encoding="utf-8") as fh:
        fh.write(json.dumps(job))  # (json.dump encodes in Python, piece by piece: several times the CPU)
    meter = _CheckMeter(out.fd, scenarios, limits, timeouts_before=timeouts_before,
                        allowance_s=job["timeout_allowance_s"], hang_rules=bool(hang_rules))
    return _Prepared(tmp, out, tuple(child_fds), more_w, meter)


ARGV = [sys.executable, "-I", "-S", "harness.py", "in.json"]


def run_harness(source: str, scenarios: list[dict], *, limits: Limits | None = None, hide=(),
                skip_lines=(), serve: bool = False, timeouts_before: int = 0,
                allowance_s: float | None = None, hang_rules: bool = True) -> HarnessRun:
    """Run the harness once on `scenarios` in a private temporary folder under the sandbox.

    With `serve`, a harness that gets through every scenario stays alive as ``HarnessRun.session``
    (a `HarnessSession`) for more scenarios of the same solution; the caller closes it.
    With ``hang_rules=False`` (shrinking) every check gets the full per-check limit and none is "not run"
    (`harness.main`); the session's later batches always run so.
    """
    limits = limits or Limits()
    start = time.monotonic()
    prep = _prepare(source, scenarios, limits, skip_lines, serve, timeouts_before, allowance_s, hang_rules)
    if serve:
        session = HarnessSession(prep, limits, hide)
        try:
            load, done, obs, forged, patched, slow, yielded = _parse_all(session.wait_for(b'{"done":'), scenarios)
            prep.meter.poll(None, final=not session.alive())
            forged += prep.meter.claimed_not_run(obs)
            obs = prep.meter.apply(obs)
        except BaseException:
            session.close()  # its sandbox ends and its folder goes, whatever went wrong here
            raise
        if not session.alive() or not done:
            session.close()
            evidence, session_out, session = session.evidence, session.outcome, None
            if yielded and not _may_yield(session_out, limits):
                forged.append("a yield line with CPU time left")
                yielded = False
        else:
            evidence = _planted_note(prep.tmp)  # so far: the rest is `session.evidence` once it is closed
            session_out = None  # still serving: it got through every scenario within its limits
        return HarnessRun(load=load, obs=obs, done=done, outcome=session_out, wall_s=time.monotonic() - start,
                          forged=forged, evidence=evidence, builtins_changed=patched, slow_lines=slow,
                          session=session, yielded=yielded)
    try:
        outcome = _run_sandboxed(ARGV, prep.tmp, limits, hide, prep.child_fds, monitor=prep.meter.poll)
        load, done, obs, forged, patched, slow, yielded = _parse_all(prep.out.lines(final=True)[0], scenarios)
        prep.meter.poll(None)
        forged += prep.meter.claimed_not_run(obs)
        obs = prep.meter.apply(obs)
        if yielded and not _may_yield(outcome, limits):
            forged.append("a yield line with CPU time left")
            yielded = False
        return HarnessRun(load=load, obs=obs, done=done, outcome=outcome, wall_s=time.monotonic() - start,
                          forged=forged, evidence=_evidence(prep.tmp, outcome), builtins_changed=patched,
                          slow_lines=slow, yielded=yielded)
    finally:
        prep.out.close()
        shutil.rmtree(prep.tmp, ignore_errors=True)


YIELD_MARGIN_S = 0.5  # as `harness.YIELD_MARGIN_S`


def _may_yield(outcome, limits: Limits) -> bool:
    """Whether a harness that said it yielded (``{"yield": n}``) was near its run's CPU limit, as it yields only
    then: a solution that writes that line itself before it dies would have the check it died in run again."""
    cpu = float(getattr(outcome, "cpu_s", 0.0) or 0.0)
    return cpu + limits.scenario_cpu_s + YIELD_MARGIN_S + 0.25 > limits.cpu_s


class HarnessSession:
    """A sandboxed harness kept alive after its first batch: shrinking sends it more scenarios down a pipe
    instead of starting a fresh sandboxed process per round (each start cost more than the round).

    ``evidence`` holds the tamper evidence found once it has ended (`close`)."""

    def __init__(self, prep: _Prepared, limits: Limits, hide):
        self.tmp = prep.tmp
        self.outcome = None
        self.evidence: list = []
        self._out = prep.out
        self._meter = prep.meter
        self._wfd = prep.more_w
        os.set_blocking(self._wfd, False)
        self._batches = 0
        self._closed = False
        self._interrupted = None
        self._thread = threading.Thread(target=self._run, args=(limits, hide, prep.child_fds), daemon=True)
        self._thread.start()

    def _run(self, limits, hide, child_fds):
        from .sandbox import Interrupted

        try:
            self.outcome = _run_sandboxed(ARGV, self.tmp, limits, hide, child_fds, monitor=self._meter.poll)
        except Interrupted as exc:  # the grading is being stopped: `wait_for` raises it in the grading thread
            self._interrupted = exc

    def alive(self) -> bool:
        return self._thread.is_alive()

    def wait_for(self, needle: bytes) -> list:
        """This batch's output lines until one starts with `needle`, the process ended, or the batch read
        MAX_OUTPUT_BYTES (the rest of an output that large is never read)."""
        chunks, used = [], 0
        while True:
            alive = self.alive()
            more, n = self._out.lines(MAX_OUTPUT_BYTES - used, final=not alive)
            chunks += more
            used += n
            if not alive and self._interrupted is not None:
                raise self._interrupted
            if not alive or used >= MAX_OUTPUT_BYTES or any(c.startswith(needle) for c in more):
                return chunks
            time.sleep(0.003)

    def run(self, scenarios: list[dict]) -> dict:
        """Observations (id -> obs) of more scenarios; those it did not finish are missing."""
        data = (json.dumps([{"id": s["id"], "ops": s["ops"]} for s in scenarios]) + "\n").encode()
        if self._closed:
            return {}
        self._meter.batch(scenarios)
        if not self._send(data):
            return {}
        self._batches += 1
        obs = _parse(self.wait_for(b'{"batch":%d}' % self._batches), scenarios, first=False)[2]
        self._meter.poll(None, final=not self.alive())
        self._meter.claimed_not_run(obs)  # (a shrinking batch is never "not run": such a line's candidate did not run)
        return self._meter.apply(obs)

    def _send(self, data: bytes, patience_s: float = 60.0) -> bool:
        """Write `data` down the pipe without ever blocking on a harness that does not read it."""
        view, deadline = memoryview(data), time.monotonic() + patience_s
        while view and self.alive() and time.monotonic() < deadline:
            try:
                view = view[os.write(self._wfd, view):]
            except BlockingIOError:
                select.select([], [self._wfd], [], 0.05)
            except OSError:  # EPIPE: the harness has gone
                return False
        return not view

    def close(self) -> None:
        """End the harness (EOF on its pipe), wait for its sandbox to finish, note its tamper evidence,
        remove its folder."""
        if self._closed:
            return
        self._closed = True
        os.close(self._wfd)
        self._thread.join()
        self.evidence = _evidence(self.tmp, self.outcome)
        self._out.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _run_sandboxed(argv, cwd, limits: Limits, hide, child_fds=(), monitor=None):
    from .sandbox import run_isolated

    return run_isolated(argv, cwd=cwd, **{**limits.kwargs(), "hide": tuple(hide)}, pass_fds=child_fds, monitor=monitor)


def package_paths() -> list[str]:
    """Where our own code lives: the reference model, the engine, the source notebook and the solutions of the tests
    must stay unreadable, to the verdict harness and to the kernel run alike (`pipeline.default_hide`).

    That is the folder holding every package of ours (``decodesched/`` in site-packages; the whole checkout of an
    editable install, whose ``kernels/``, ``assignments/`` and ``tests/`` sit beside ``src/``) and the folder pip
    installed from (``direct_url.json``): a checkout under a system folder (``/usr/src/app``, a container's usual
    WORKDIR) is not covered by the sandbox (`sandbox.covered_dirs`). A folder that holds the interpreter or the
    venv (a checkout's ``.venv``) is hidden entry by entry around it."""
    import decodesched
    from .sandbox import interpreter_paths
    from .spec import COURSE_ROOT

    ours = {Path(decodesched.__file__).resolve().parent, Path(__file__).resolve().parent, COURSE_ROOT.resolve(),
            *(Path(p).resolve() for p in importlib.util.find_spec("decodesched.kernels").submodule_search_locations)}
    common = Path(os.path.commonpath(ours))
    roots = {common} if common != Path("/") else ours
    kept = [Path(p) for p in interpreter_paths()]
    return sorted({str(p) for root in roots | set(_installed_from()) for p in _around(root, kept)})


def _installed_from() -> list[Path]:
    """The local folder pip installed this package from, as its ``direct_url.json`` names it (PEP 610)."""
    import importlib.metadata

    try:
        url = json.loads(importlib.metadata.distribution("decodesched").read_text("direct_url.json") or "{}")["url"]
    except (importlib.metadata.PackageNotFoundError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(url, str) or not url.startswith("file://"):
        return []
    from urllib.parse import unquote, urlsplit

    folder = Path(unquote(urlsplit(url).path)).resolve()
    return [folder] if folder.is_dir() and folder != Path("/") else []


def _around(folder: Path, kept: list[Path]) -> list[Path]:
    """`folder`, or where it holds a path of `kept` its entries but for those that lead there (links are left: the
    sandbox would hide what they point to)."""
    if not any(k == folder or folder in k.parents for k in kept):
        return [folder]
    if folder in kept:
        return []
    return [p for entry in sorted(folder.iterdir()) if not entry.is_symlink() for p in _around(entry, kept)]


def default_hide() -> list[str]:
    """What every verdict harness run hides: our own code (the grading adds the course, the submissions, --out)."""
    return package_paths()


def why_stopped(out) -> str:
    if out is None:
        return "the process did not start"
    if getattr(out, "timed_out", False):
        return "time limit"
    if getattr(out, "memory_exceeded", False):
        return "memory limit"
    sig = getattr(out, "signal", None)
    if sig:
        return f"killed by signal {sig}"
    return f"the process exited early (exit code {getattr(out, 'returncode', None)})"


BUDGET_SPENT = "not run: the time budget was spent by earlier checks"  # a check left when the CPU budget ran out


def _timed_out(items) -> bool:
    """A check that the harness stopped at its time limit (`harness._error`: ``{"timeout": true}``)."""
    return isinstance(items, list) and bool(items) and isinstance(items[-1], dict) and items[-1].get("timeout") is True


def collect_observations(source: str, scenarios: list[dict], limits: Limits, hide, max_runs: int = 100,
                         serve: bool = False):
    """Run the harness; if it dies part-way, restart it after the check that killed it.

    The scenario being run when the process died (the first one without observations) is marked as
    failed with the reason; the rest run in a fresh process, so one crash or hang loses only its own
    checks.  The whole verdict stays within ``limits.cpu_s`` of CPU time (a run stopped by the
    wall-clock backstop, which makes no progress, counts as having spent its whole budget). Checks that time
    out are budgeted by count (`Limits.timeout_allowance_s`, `harness.main`), so a hanging solution loses the
    same checks on every run; a harness close to its run's CPU limit stops between two checks (``yield``)
    and a fresh one goes on, so no honest check is cut short by that limit.
    With `serve`, a first run that gets through everything is kept alive as the returned session
    (else None); the caller closes it. Returns ``(obs, runs, session)``.
    """
    pending = list(scenarios)
    obs: dict = {}
    runs: list[HarnessRun] = []
    per_run = max(15.0, min(limits.cpu_s * 0.4, 30.0))
    skip: set = set()
    spent = 0.0
    allowance = limits.timeout_allowance_s()
    for _ in range(max_runs):
        left = limits.cpu_s - spent
        if not pending or left < 1.0:
            break
        run_limits = replace(limits, cpu_s=min(per_run, left))
        # checks that timed out so far, in order: the harness goes on counting (`harness.main`, run_all)
        timeouts = sum(1 for sid in obs if _timed_out(obs[sid]))
        hr = run_harness(source, pending, limits=run_limits, hide=hide, skip_lines=skip, serve=serve and not runs,
                         timeouts_before=timeouts, allowance_s=allowance)
        runs.append(hr)
        out = hr.outcome
        spent += run_limits.cpu_s if getattr(out, "wall_exceeded", False) else float(getattr(out, "cpu_s", 0.0) or 0.0)
        new_slow = set(hr.slow_lines) - skip
        skip |= new_slow
        obs.update(hr.obs)
        if hr.done:
            pending = []
            break
        missing = [s for s in pending if s["id"] not in hr.obs]
        if not missing:
            pending = []
            break
        stopped_check = getattr(hr.outcome, "check_exceeded", False) and hr.load is not None and \
            not getattr(hr.outcome, "memory_exceeded", False)  # the grader stopped a check past its limit
        if stopped_check or hr.yielded and hr.load is not None and hr.outcome is not None and not (
                getattr(hr.outcome, "timed_out", False) or getattr(hr.outcome, "memory_exceeded", False)):
            if len(missing) == len(pending):
                break  # not even one check fitted in what is left of the budget: the rest are not run
            pending = missing  # it stopped between two checks, near its CPU limit: nothing was lost
            continue
        obs[missing[0]["id"]] = [{"killed": why_stopped(hr.outcome)}]
        pending = missing[1:]
        if hr.load is None and not new_slow:
            break  # it dies while loading, and not on a statement we can skip: a restart would die the same way
        if hr.load is None:
            del obs[missing[0]["id"]]  # the load, not this check, was at fault: run it again
            pending = missing
    for s in pending:
        obs.setdefault(s["id"], [{"killed": BUDGET_SPENT}])
    return obs, runs, runs[0].session if runs else None
