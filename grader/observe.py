"""Running the harness: the solution cell in a fresh, sandboxed ``python -I -S harness.py`` child.

`collect_observations` runs every scenario and restarts the harness after a check that killed it,
so one crash or hang loses only its own checks. Budgets are CPU time (`grader.limits`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from .limits import Limits

HARNESS = Path(__file__).with_name("harness.py")

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
    builtins_changed: list = field(default_factory=list)  # builtins the solution replaced (restored by the harness)
    slow_lines: list = field(default_factory=list)  # top-level statements of the cell that timed out
    session: object | None = None  # a HarnessSession still serving (run_harness(serve=True)); caller closes


def _parse(raw: bytes, scenarios: list[dict]):
    """The harness's output lines, strictly: (load line, done?, obs by id, forged, builtins changed, slow lines)."""
    lines, forged = [], []
    for chunk in raw.split(b"\n"):
        if not chunk.strip():
            continue
        try:
            lines.append(json.loads(chunk.decode("ascii")))
        except (ValueError, UnicodeDecodeError):
            forged.append("unreadable line in the harness output")
    load = next((ln for ln in lines if isinstance(ln, dict) and "load" in ln), None)
    done = any(isinstance(ln, dict) and ("done" in ln or "batch" in ln) for ln in lines)
    known = {s["id"] for s in scenarios}
    obs, seen = {}, set()
    patched = sorted({str(n)[:40] for ln in lines if isinstance(ln, dict) and isinstance(ln.get("builtins_changed"), list)
                      for n in ln["builtins_changed"]})
    for ln in lines:
        if isinstance(ln, dict) and "id" in ln:
            sid = ln.get("id")
            if sid not in known or sid in seen or not isinstance(ln.get("obs"), list):
                forged.append(f"unexpected result line for {str(sid)[:40]!r}")
                continue
            seen.add(sid)
            obs[sid] = ln["obs"]
    slow = sorted({ln["load_timeout"] for ln in lines if isinstance(ln, dict) and type(ln.get("load_timeout")) is int})
    return load, done, obs, forged, patched, slow


def _prepare(source: str, scenarios: list[dict], limits: Limits, skip_lines, serve: bool) -> str:
    from .sandbox import scratch_root

    tmp = tempfile.mkdtemp(prefix="dsched-verdict-", dir=scratch_root())
    os.chmod(tmp, 0o700)
    shutil.copyfile(HARNESS, os.path.join(tmp, "harness.py"))
    sys_path = []
    np_dir = _numpy_dir()
    if np_dir:
        lib = os.path.join(tmp, "pylib")
        os.mkdir(lib)
        os.symlink(np_dir, os.path.join(lib, "numpy"))
        sys_path.append(lib)
    job = {"solution_source": source, "sys_path": sys_path, "scenario_timeout_s": limits.scenario_cpu_s,
           "load_timeout_s": limits.scenario_cpu_s * 1.5, "memory_mb": limits.memory_mb,
           "skip_lines": sorted(skip_lines),
           "scenarios": [{"id": s["id"], "ops": s["ops"]} for s in scenarios]}
    if serve:
        os.mkfifo(os.path.join(tmp, "more.fifo"), 0o600)
        job["serve"] = "more.fifo"
    with open(os.path.join(tmp, "in.json"), "w", encoding="utf-8") as fh:
        json.dump(job, fh)
    return tmp


ARGV = [sys.executable, "-I", "-S", "harness.py", "in.json", "out.jsonl"]


def run_harness(source: str, scenarios: list[dict], *, limits: Limits | None = None, hide=(),
                skip_lines=(), serve: bool = False) -> HarnessRun:
    """Run the harness once on `scenarios` in a private temporary folder under the sandbox.

    With `serve`, a harness that gets through every scenario stays alive as ``HarnessRun.session``
    (a `HarnessSession`) for more scenarios of the same solution; the caller closes it.
    """
    limits = limits or Limits()
    start = time.monotonic()
    tmp = _prepare(source, scenarios, limits, skip_lines, serve)
    if serve:
        session = HarnessSession(tmp, limits, hide)
        raw = session.wait_for(b'\n{"done":')
        load, done, obs, forged, patched, slow = _parse(raw, scenarios)
        if not session.alive() or not done:
            session.close()
            session_out, session = session.outcome, None
        else:
            session_out = None  # still serving: it got through every scenario within its limits
        return HarnessRun(load=load, obs=obs, done=done, outcome=session_out, wall_s=time.monotonic() - start,
                          forged=forged, builtins_changed=patched, slow_lines=slow, session=session)
    try:
        outcome = _run_sandboxed(ARGV, tmp, limits, hide)
        try:
            with open(os.path.join(tmp, "out.jsonl"), "rb") as fh:
                raw = fh.read(64 * 1024 * 1024)
        except OSError:
            raw = b""
        load, done, obs, forged, patched, slow = _parse(raw, scenarios)
        return HarnessRun(load=load, obs=obs, done=done, outcome=outcome, wall_s=time.monotonic() - start,
                          forged=forged, builtins_changed=patched, slow_lines=slow)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class HarnessSession:
    """A sandboxed harness kept alive after its first batch: shrinking sends it more scenarios through a
    FIFO instead of starting a fresh sandboxed process per round (each start cost more than the round)."""

    def __init__(self, tmp: str, limits: Limits, hide):
        self.tmp = tmp
        self.outcome = None
        self._out = os.path.join(tmp, "out.jsonl")
        self._pos = 0
        self._wfd = None
        self._batches = 0
        self._thread = threading.Thread(target=self._run, args=(limits, hide), daemon=True)
        self._thread.start()

    def _run(self, limits, hide):
        self.outcome = _run_sandboxed(ARGV, self.tmp, limits, hide)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _read(self) -> bytes:
        try:
            with open(self._out, "rb") as fh:
                fh.seek(self._pos)
                data = fh.read(64 * 1024 * 1024)
        except OSError:
            return b""
        end = data.rfind(b"\n") + 1  # only whole lines
        self._pos += end
        return data[:end]

    def wait_for(self, needle: bytes) -> bytes:
        """Output lines until one contains `needle`, or the process ended."""
        raw = b""
        while True:
            alive = self.alive()
            raw += self._read()
            if needle in raw or not alive:
                return raw
            time.sleep(0.003)

    def run(self, scenarios: list[dict]) -> dict:
        """Observations (id -> obs) of more scenarios; those it did not finish are missing."""
        if not self._open_writer():
            return {}
        try:
            os.write(self._wfd, (json.dumps([{"id": s["id"], "ops": s["ops"]} for s in scenarios]) + "\n").encode())
        except OSError:
            return {}
        self._batches += 1
        raw = self.wait_for(b'\n{"batch":%d}' % self._batches)
        return _parse(raw, scenarios)[2]

    def _open_writer(self, patience_s: float = 10.0) -> bool:
        deadline = time.monotonic() + patience_s
        while self._wfd is None and self.alive() and time.monotonic() < deadline:
            try:
                self._wfd = os.open(os.path.join(self.tmp, "more.fifo"), os.O_WRONLY | os.O_NONBLOCK)
                os.set_blocking(self._wfd, True)
            except OSError:  # ENXIO: the harness has not opened its end yet
                time.sleep(0.002)
        return self._wfd is not None

    def close(self) -> None:
        """End the harness (EOF on its FIFO), wait for its sandbox to finish, remove its folder."""
        if self._open_writer():
            os.close(self._wfd)
        self._thread.join()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _run_sandboxed(argv, cwd, limits: Limits, hide):
    from .sandbox import run_isolated

    return run_isolated(argv, cwd=cwd, **{**limits.kwargs(), "hide": tuple(hide)})


def _package_paths() -> list[str]:
    """Where our own code lives (editable checkout or site-packages): the reference model must stay unreadable."""
    import decodesched

    return sorted({str(Path(decodesched.__file__).resolve().parent), str(Path(__file__).resolve().parent)})


def default_hide() -> list[str]:
    from .spec import COURSE_ROOT
    return [str(COURSE_ROOT)] + _package_paths()


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


def collect_observations(source: str, scenarios: list[dict], limits: Limits, hide, max_runs: int = 100,
                         serve: bool = False):
    """Run the harness; if it dies part-way, restart it after the check that killed it.

    The scenario being run when the process died (the first one without observations) is marked as
    failed with the reason; the rest run in a fresh process, so one crash or hang loses only its own
    checks.  The whole verdict stays within ``limits.cpu_s`` of CPU time (a run stopped by the
    wall-clock backstop, which makes no progress, counts as having spent its whole budget).
    With `serve`, a first run that gets through everything is kept alive as the returned session
    (else None); the caller closes it. Returns ``(obs, runs, session)``.
    """
    pending = list(scenarios)
    obs: dict = {}
    runs: list[HarnessRun] = []
    per_run = max(15.0, min(limits.cpu_s * 0.4, 30.0))
    skip: set = set()
    spent = 0.0
    for _ in range(max_runs):
        left = limits.cpu_s - spent
        if not pending or left < 1.0:
            break
        run_limits = replace(limits, cpu_s=min(per_run, left))
        hr = run_harness(source, pending, limits=run_limits, hide=hide, skip_lines=skip, serve=serve and not runs)
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
        obs[missing[0]["id"]] = [{"killed": why_stopped(hr.outcome)}]
        pending = missing[1:]
        if hr.load is None and not new_slow:
            break  # it dies while loading, and not on a statement we can skip: a restart would die the same way
        if hr.load is None:
            del obs[missing[0]["id"]]  # the load, not this check, was at fault: run it again
            pending = missing
    for s in pending:
        obs.setdefault(s["id"], [{"killed": "not run: the time budget was spent by earlier checks"}])
    return obs, runs, runs[0].session if runs else None
