"""Red team, round 3: what a hostile solution could still do to the verdict harness from inside its process.

* The per-check time limits lived only in the solution's own process: code that walks its frames
  (``sys._getframe().f_back.f_globals``) or ``gc.get_objects()`` reaches the harness's globals (``_ARMED``,
  ``_FIRED``, ``_process_time``) and its counters, so a slow check passed (graded 100), and a hanging solution that
  reset the count of its timeouts had more checks run (and scored more). The grader now measures each check's CPU
  time itself (`observe._CheckMeter`, from ``/proc``, line to line), stops a check that runs on, and applies the
  hang rules from its own count.
* A ``{"yield": n}`` line the solution wrote before it died had the check it died in run again (a crash that
  passes on a retry scored more than the same crash); a ``{"done": n}`` line it wrote before ``os._exit`` hid the
  crash ("graded").
* A non-daemon thread left running held the harness's exit: "timeout" with every check passed, after 12 s.
* An int too large for ``str()`` (10**100000) in a result crashed the harness on every check that returned it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from decodesched.grader import limits, observe, sandbox, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402

SANDBOX = pytest.mark.skipif(os.geteuid() != 0 and not sandbox.userns_available(),
                             reason="needs root or user namespaces")
REFERENCE = attacks.reference_source()


def _summary(v):
    return v.status, v.total, v.notes[:2]


SLOW_ONCE = """
import time as _time
_step_once = DecodeSchedulerSim.step
_slow = [True]

def _burn(seconds):
    start = _time.process_time()
    while _time.process_time() - start < seconds:
        pass

def _slow_first_step(self):
    if _slow[0]:
        _slow[0] = False
        _quiet()
        _burn(1.5)  # past the per-check limit below, once per process
    return _step_once(self)
DecodeSchedulerSim.step = _slow_first_step
"""
PLAIN = "\ndef _quiet():\n    pass\n" + SLOW_ONCE
FRAMES = """
import sys as _sys, signal as _signal

def _quiet():
    # the harness's module globals, from the frames that called step(): its own check budget, made endless
    f = _sys._getframe()
    while f is not None and "_ARMED" not in f.f_globals:
        f = f.f_back
    f.f_globals["_ARMED"][0] = 1e9
    _signal.setitimer(_signal.ITIMER_PROF, 0)
    _signal.setitimer(_signal.ITIMER_REAL, 0)
""" + SLOW_ONCE
GC_CLOCK = """
import gc as _gc, signal as _signal

def _quiet():
    # the same globals found among all objects: the harness's clock stopped for good
    for d in _gc.get_objects():
        if type(d) is dict and "_process_time" in d and "_ARMED" in d:
            d["_process_time"] = lambda: 0.0
            d["_setitimer"] = lambda *a: None
    _signal.setitimer(_signal.ITIMER_PROF, 0)
    _signal.setitimer(_signal.ITIMER_REAL, 0)
""" + SLOW_ONCE


@SANDBOX
@pytest.mark.parametrize("evader", [FRAMES, GC_CLOCK], ids=["frames", "gc_objects"])
def test_a_check_whose_harness_globals_were_changed_still_timed_out(evader):
    small = limits.Limits(cpu_s=30, scenario_cpu_s=0.5)
    plain = verdict.verdict_for_source(REFERENCE + PLAIN, limits=small, shrink_failures=False)
    evading = verdict.verdict_for_source(REFERENCE + evader, limits=small, shrink_failures=False)
    assert plain.status == "timeout" and plain.total < 100, _summary(plain)
    assert evading.status == "timeout" and evading.total <= plain.total, (_summary(evading), _summary(plain))


NEVER_RETURNS = """
import signal as _signal
_step_once = DecodeSchedulerSim.step

def _endless_step(self):
    if self.clock >= 3:
        _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGPROF, _signal.SIGALRM})
        while True:
            pass
    return _step_once(self)
DecodeSchedulerSim.step = _endless_step
"""


@SANDBOX
def test_a_check_that_never_returns_is_stopped_by_the_grader_near_its_limit():
    # Signals blocked: no alarm of the harness reaches the check. Before, only the run's CPU limit (15 s here)
    # ended it, and the check read "killed: time limit"; now the grader stops it at its limit + `_grace` (2 s).
    small = limits.Limits(cpu_s=12, scenario_cpu_s=0.5)
    scen = [s for s in verdict.build_scenarios(0, 3)][:80]
    run = observe.run_harness(REFERENCE + NEVER_RETURNS, scen, limits=small, hide=observe.default_hide())
    assert run.outcome.check_exceeded, run.outcome.notes
    assert run.outcome.cpu_s < 8, run.outcome.cpu_s
    stopped = [sid for sid, o in run.obs.items() if o == [{"timeout": True}]]
    assert len(stopped) == 1, stopped


def _meter(scen, timeouts_before=0, **kw):
    fd = os.memfd_create("t")
    lim = limits.Limits(**{"scenario_cpu_s": 1.0, "short_scenario_cpu_s": 0.25, "cpu_s": 20, **kw})
    return fd, observe._CheckMeter(fd, scen, lim, timeouts_before=timeouts_before,
                                   allowance_s=lim.timeout_allowance_s(), hang_rules=True)


def _line(sid, obs='["ok"]'):
    return b'{"id":"%s","obs":%s,"wall_ms":1}\n' % (sid.encode(), obs.encode())


def test_the_meter_charges_a_check_what_it_used_between_lines_never_more():
    scen = [{"id": f"c{i}"} for i in range(6)]
    fd, m = _meter(scen)
    os.write(fd, b'{"load":"ok"}\n')
    assert m.poll(5.0) is None  # the load (5 s) is no check's
    assert m.poll(5.01) is None  # c0 starts by 5.01 at the latest
    # a starved watcher: 3 s of CPU pass between two polls, and the lines of c0..c4 all appear in that time
    os.write(fd, b"".join(_line(f"c{i}") for i in range(5)))
    assert m.poll(8.0) is None
    assert m.apply({}) == {}  # each of them may have taken 0.6 s: none is charged anything
    # c5 runs on: charged from the poll after c4's line, stopped past its limit + 3 s (`observe._grace`)
    assert m.poll(8.5) is None and m.poll(12.4) is None
    reason = m.poll(12.6)
    assert reason and m.killed == "c5"
    assert m.apply({}) == {"c5": [{"timeout": True}]}


def test_a_line_written_for_the_next_check_by_someone_else_ends_nothing():
    scen = [{"id": "a"}, {"id": "b"}, {"id": "c"}]
    fd, m = _meter(scen)
    os.write(fd, b'{"load":"ok"}\n')
    m.poll(1.0)
    m.poll(1.0)
    os.write(fd, b'{}\n{"done":3}\n{"load":"ok"}\n' + _line("c") + _line("a", '[{"timeout":true}]'))
    m.poll(1.1)  # "a" (out of order lines are ignored) took at most 0.1 s: not charged
    m.poll(1.2)
    assert m.poll(3.0) is None  # b runs (not yet past its limit + grace)
    os.write(fd, _line("b"))
    m.poll(3.1)
    # b: from at most 1.2 to at least 3.0: 1.8 s, past its limit of 1 s (+ slack)
    obs = m.apply({"a": [{"timeout": True}], "b": ["ok"]})
    assert obs["b"] == ["ok", {"timeout": True}] and obs["a"] == [{"timeout": True}]


HANGS = REFERENCE.replace("        if chosen is None:\n            return None\n        ### END SOLUTION\n",
                          "        while chosen is None:\n            pass\n        ### END SOLUTION\n")
FORGETS_TIMEOUTS = """
import sys as _sys
_hang_step = DecodeSchedulerSim.step

def _forget_timeouts():
    f = _sys._getframe()
    while f is not None:
        t = f.f_locals.get("timeouts")  # the harness's count of the checks that timed out (run_all's closure)
        if type(t) is list and len(t) == 1:
            t[0] = 0
        f = f.f_back

def _step(self):
    _forget_timeouts()
    return _hang_step(self)
DecodeSchedulerSim.step = _step
"""


@SANDBOX
@pytest.mark.slow
def test_a_hanging_solution_that_resets_the_harness_s_count_loses_the_same_checks():
    assert HANGS != REFERENCE
    tight = limits.Limits(cpu_s=12)
    plain = verdict.verdict_for_source(HANGS, limits=tight, shrink_failures=False)
    forgets = verdict.verdict_for_source(HANGS + FORGETS_TIMEOUTS, limits=tight, shrink_failures=False)
    assert plain.status == forgets.status == "timeout"
    assert forgets.total <= plain.total, (_summary(forgets), _summary(plain))


def _job_source(body: str) -> str:
    return REFERENCE + "\nimport os as _o, json as _j\n_job = _j.load(open('in.json'))\n" + body


DIES_AT_THIRD = """
_st = DecodeSchedulerSim.step
_calls = [0]

def _s(self):
    _calls[0] += 1
    if _calls[0] == 3:
        _o.write(_job['out_fd'], LINE)
        _o._exit(0)
    return _st(self)
DecodeSchedulerSim.step = _s
"""


@SANDBOX
@pytest.mark.parametrize("line, word", [
    (b'{"yield":0}\n', "yield"),
    (None, "done"),
], ids=["yield", "done"])
def test_a_yield_or_done_line_written_by_the_solution_is_forged(line, word):
    scen = [s for s in verdict.build_scenarios(0, 3) if any(op[0] in ("step", "stepf", "stepq") for op in s["ops"])][:6]
    text = repr(line) if line else "('{\"done\":%d}\\n' % len(_job['scenarios'])).encode()"
    run = observe.run_harness(_job_source(DIES_AT_THIRD.replace("LINE", text)), scen, limits=limits.Limits(cpu_s=30),
                              hide=observe.default_hide())
    assert any(word in f for f in run.forged), run.forged
    assert not run.yielded


THREAD_LEFT = """
import threading as _th, time as _time

def _ticker():
    while True:
        _time.sleep(0.5)
_th.Thread(target=_ticker).start()  # not a daemon: Python's exit waits for it
"""


@SANDBOX
def test_a_thread_the_solution_left_running_does_not_hold_the_harness():
    v = verdict.verdict_for_source(REFERENCE + THREAD_LEFT, limits=limits.Limits(cpu_s=30), shrink_failures=False)
    assert (v.status, v.total) == ("graded", 100.0), _summary(v)


HUGE_INT_AT_7 = """
_st = DecodeSchedulerSim.step

def _s(self):
    ev = _st(self)
    if isinstance(ev, dict) and self.clock == 7:
        ev = dict(ev)
        ev["request_id"] = 10 ** 100000
    return ev
DecodeSchedulerSim.step = _s
"""


@SANDBOX
def test_an_int_too_large_to_write_is_a_wrong_value_not_a_crash():
    v = verdict.verdict_for_source(REFERENCE + HUGE_INT_AT_7, limits=limits.Limits(cpu_s=30), shrink_failures=False)
    assert v.status == "graded" and 80 < v.total < 100, _summary(v)
    assert any("int of 332193 bits" in n for n in v.notes), v.notes


def test_lines_the_harness_never_writes_are_forged():
    # (the grader's meter ends a check only at the next check's line: these lines never help, and now say so)
    scen = [{"id": "a"}, {"id": "b"}]
    a, b = b'{"id":"a","obs":[]}', b'{"id":"b","obs":[]}'
    for lines, word in (([b'{"load":"ok"}', a, b'{"load":"ok"}', b, b'{"done":2}'], "second load"),
                        ([b'{"load":"ok"}', a, b, b'{"done":2}', b'{"done":2}'], "second done"),
                        ([b'{"load":"ok"}', b, a, b'{"done":2}'], "order")):
        forged = observe._parse(lines, scen)[3]
        assert any(word in f for f in forged), forged
    assert observe._parse([b'{"load":"ok"}', a, b, b'{"done":2}'], scen)[3] == []
    assert observe._parse([b'{"load":"ok"}', a], scen)[3] == []  # (a run that died after "a")
