"""Hostile submissions for `decodesched grade` (issue 3, item 5), built from the release notebook.

Every attack is a *real submission*: the release notebook with the student's solution cell filled
in by honest code (the reference solution with one bug, `HONEST_BUG`, so the honest part earns a
known, non-full score) plus the attack, placed where a student would put it. The honest code keeps
working outside a Jupyter kernel (attacks aimed at the kernel are guarded), so the test can check
that each submission is graded on exactly what its honest part earns, never more.

Build the notebooks by hand with::

    python tests/grader_attacks/attacks.py RELEASE.ipynb OUT_DIR

`EXPECT[name] = (status, score)` where score is "honest" (equal to the honest part's score),
"below" (strictly below it: the cheat made its own answers wrong), "at_most" (<= the honest
part's score: it died part-way), or a number.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[2] / "grader" / "solutions" / "reference.py"
SOLUTION_CELL = "scheduler_solution"
# One honest bug: the cache-hit rank is ignored in the sort key (costs TODO 2 points).
HONEST_BUG = ("cache_rank = 0 if req.cache_hit else 1", "cache_rank = 0")
IN_KERNEL = "__import__('sys').modules.get('ipykernel') is not None"  # the verdict harness fakes get_ipython
# Honest code the grader used to misjudge (`honest_quirks`, full marks): a line magic, a bracketed line
# continued with `!=` (PEP 8's break before a binary operator, which the magic stripping turned into `pass`:
# 0 points), and a scratch cell that rebinds a builtin's name (which made the canary cell fail: "tampered").
WRAPPED = ("phase_rank = 0 if req.phase == 'prefill' else 1",
           "phase_rank = (0 if req.phase\n                      != 'decode' else 1)")
SCRATCH = ("# try the policies\nfor type in ('fixed_priority', 'aging', 'deadline'):\n"
           "    sim = DecodeSchedulerSim(policy=type)\n    sim.enqueue(1, 2, 1)\n"
           "    print(type, sim.run(max_steps=10))\n")
# An honest NumPy value where an int belongs (`honest_numpy_value`): those checks fail, it is no forgery.
NUMPY_VALUE = ("return req.priority + (req.wait_steps // self.aging_interval if self.policy == 'aging' else 0)",
               "import numpy as np\n        return req.priority + (np.floor(req.wait_steps / self.aging_interval) "
               "if self.policy == 'aging' else 0)")

ATTACKS: dict[str, str] = {}

# Objects whose == is always true (and that still sort like the real key).
ATTACKS["eq_always_true"] = '''
class _AlwaysEqual(tuple):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = tuple.__hash__
_honest_key = DecodeSchedulerSim._schedule_key
def _cheating_key(self, req):
    return _AlwaysEqual(_honest_key(self, req))
DecodeSchedulerSim._schedule_key = _cheating_key
'''

# An IPython AST transformer that turns every assert of later cells into `pass`.
ATTACKS["ast_transformer"] = '''
import ast as _ast
class _DropAsserts(_ast.NodeTransformer):
    def visit_Assert(self, node):
        return _ast.copy_location(_ast.Pass(), node)
try:
    get_ipython().ast_transformers.append(_DropAsserts())
except NameError:
    pass
'''

# An IPython input transformer that rewrites assert lines before they are parsed.
ATTACKS["input_transformer"] = '''
def _drop_assert_lines(lines):
    out = []
    for line in lines:
        body = line.lstrip()
        out.append(line[: len(line) - len(body)] + "pass\\n" if body.startswith("assert") else line)
    return out
try:
    get_ipython().input_transformers_post.append(_drop_assert_lines)
except NameError:
    pass
'''

# Looks for the source notebook, hidden tests, the grader's reference, the gradebook and other
# students' submissions (paths learnt from the grader's command line in /proc and by walking up
# and around). If it can read any of them it "uses" them: it switches to fully correct code, so
# a leak would show as a higher score.
ATTACKS["reads_hidden_files"] = '''
import os as _os, time as _time
def _secret_paths():
    roots = set()
    d = _os.getcwd()
    while True:
        roots.add(d)
        if d == "/":
            break
        d = _os.path.dirname(d)
    for pid in _os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                for arg in fh.read().split(b"\\0"):
                    arg = arg.decode("utf-8", "replace")
                    if arg.startswith("/") and _os.path.isdir(arg):
                        roots.add(arg)
        except OSError:
            pass
    roots.update(["/work", "/tmp", "/root", "/home"])
    found, deadline = [], _time.monotonic() + 3
    wanted = ("gradebook.db", "reference.py", "checks.py", "verdict.py", "scenarios.py", "model.py", "decode_scheduling.ipynb")
    for root in sorted(roots):
        for dirpath, dirnames, filenames in _os.walk(root):
            if _time.monotonic() > deadline:
                return found
            if dirpath.count("/") - root.count("/") > 6:
                dirnames[:] = []
            dirnames[:] = [n for n in dirnames if n not in (".venv", "site-packages", "proc", "sys", ".git", "shared")]
            for name in filenames:
                path = _os.path.join(dirpath, name)
                if name in wanted or (name.endswith(".ipynb") and "attack" not in name):
                    try:
                        with open(path, "rb") as fh:
                            data = fh.read(1 << 20)
                    except OSError:
                        continue
                    if (b"BEGIN HIDDEN TESTS" in data or b"BEGIN SOLUTION" in data or b"grade_cells" in data
                            or b"DecodeSchedulerSim" in data):
                        found.append(path)
    return found
_leaks = [] if __import__('sys').modules.get('ipykernel') is not None else _secret_paths()
if _leaks:
    # A leak was usable: behave like the reference (the honest bug disappears).
    def _leaked_key(self, req):
        slack = 1_000_000_000
        if self.policy == 'deadline' and req.deadline_step is not None:
            slack = req.deadline_step - self.clock - self._remaining_steps(req)
        return (slack, 0 if req.phase == 'prefill' else 1, 0 if req.cache_hit else 1,
                -self._effective_priority(req), req.total_len, req.request_id)
    DecodeSchedulerSim._schedule_key = _leaked_key
'''

# Finds gradebook.db files (walking up from the kernel's folder and from /proc command lines) and
# gives itself full marks: manual scores and extra credit.
ATTACKS["writes_gradebook"] = '''
import os as _os, sqlite3 as _sqlite3
def _gradebooks():
    seen = set()
    d = _os.getcwd()
    while True:
        seen.add(_os.path.join(d, "gradebook.db"))
        if d == "/":
            break
        d = _os.path.dirname(d)
    for pid in _os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                for arg in fh.read().split(b"\\0"):
                    arg = arg.decode("utf-8", "replace")
                    if arg.startswith("/"):
                        seen.add(_os.path.join(arg, "gradebook.db"))
        except OSError:
            pass
    return [p for p in sorted(seen) if _os.path.isfile(p)]
for _db in _gradebooks():
    try:
        _con = _sqlite3.connect(_db, timeout=1)
        _con.execute("UPDATE grade SET manual_score = (SELECT max_score FROM grade_cells WHERE grade_cells.id = grade.cell_id), extra_credit = 50")
        _con.commit()
        _con.close()
    except Exception:
        pass
'''

# Finds the grader's --out folder and submissions folder from /proc and overwrites the results
# and another student's submission.
ATTACKS["writes_out_dir"] = '''
import os as _os
def _grader_args():
    found = []
    for pid in _os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                args = [a.decode("utf-8", "replace") for a in fh.read().split(b"\\0")]
        except OSError:
            continue
        if "grade" in args:
            for i, a in enumerate(args):
                if a == "--out" and i + 1 < len(args):
                    found.append(("out", args[i + 1]))
                elif a.startswith("/") and _os.path.isdir(a):
                    found.append(("dir", a))
    return found
for _kind, _path in _grader_args():
    for _name, _text in (("grades.csv", "student_id,score\\nwrites_out_dir,100\\n"), ("PWNED.txt", "pwned"),
                         ("feedback/honest_reference.html", "pwned"), ("honest_reference.ipynb", "{}")):
        try:
            _os.makedirs(_os.path.dirname(_os.path.join(_path, _name)), exist_ok=True)
            with open(_os.path.join(_path, _name), "w") as _fh:
                _fh.write(_text)
        except OSError:
            pass
'''

# Patches builtins so that type checks in tests always pass.
ATTACKS["patches_builtins"] = '''
import builtins as _builtins
_builtins.isinstance = lambda obj, cls: True
'''

# Imports the grader's own modules (and the verdict harness, if it is __main__) and
# patches them to give full marks.
ATTACKS["patches_grader_modules"] = '''
import sys as _sys
try:
    import decodesched.grader.verdict as _checks
    _checks.judge = lambda *a, **k: {}
    import decodesched.grader.pipeline as _pipeline
    _pipeline.grade_one = lambda *a, **k: None
except Exception:
    pass
_main = _sys.modules.get("__main__")
for _name in ("normalise", "compare", "judge"):
    if hasattr(_main, _name):
        try:
            setattr(_main, _name, lambda x, *a, **k: x)
        except Exception:
            pass
'''

# Kills its own kernel with os._exit (the verdict process is left alone).
ATTACKS["os_exit"] = f'''
import os as _os
if {IN_KERNEL}:
    _os._exit(0)
'''

# A segfault inside step() once the clock reaches 20 (long traces only).
ATTACKS["segfault"] = '''
import ctypes as _ctypes
_honest_step = DecodeSchedulerSim.step
def _crashing_step(self):
    if self.clock >= 20:
        _ctypes.string_at(0)
    return _honest_step(self)
DecodeSchedulerSim.step = _crashing_step
'''

# Kernel death by SIGKILL; outside a kernel it tries to kill its parent (the sandbox launcher).
ATTACKS["kernel_death"] = f'''
import os as _os, signal as _signal
if {IN_KERNEL}:
    _os.kill(_os.getpid(), _signal.SIGKILL)
else:
    try:
        _os.kill(_os.getppid(), _signal.SIGKILL)
    except OSError:
        pass
'''

# An infinite Python loop in the kernel (nbgrader interrupts the cell).
ATTACKS["loop_python"] = f'''
if {IN_KERNEL}:
    while True:
        pass
'''

# An infinite loop that swallows KeyboardInterrupt (and any alarm), everywhere.
ATTACKS["loop_swallows_interrupt"] = '''
import time as _time
while True:
    try:
        _time.sleep(0.05)
    except BaseException:
        pass
'''

# An infinite loop inside @njit code, where no interrupt is ever seen.
ATTACKS["loop_njit"] = f'''
if {IN_KERNEL}:
    try:
        from numba import njit as _njit
        @_njit(cache=False)
        def _spin(x):
            while x >= 0:
                x = (x * 7 + 1) % 1000003
            return x
        _spin(1)
    except ImportError:
        pass
'''

# Memory exhaustion.
ATTACKS["memory_bomb"] = '''
def _eat_memory():
    hog = []
    while True:
        hog.append(bytearray(64 * 1024 * 1024))
_eat_memory()
'''

# Background processes that try to outlive the kernel: a new session, and a double fork that
# also wipes its environment (so it carries no marker).
ATTACKS["background_process"] = '''
import os as _os, subprocess as _sp, sys as _sys
try:
    _sp.Popen([_sys.executable, "-c", "import os, time\\nos.setsid()\\nwhile True: time.sleep(0.5)  # decodesched-attack-bg"],
              start_new_session=True, stdin=_sp.DEVNULL, stdout=_sp.DEVNULL, stderr=_sp.DEVNULL)
    if _os.fork() == 0:
        try:
            _os.setsid()
            if _os.fork() == 0:
                _os.execve("/bin/sleep", ["/bin/sleep", "987654"], {})
        finally:
            _os._exit(0)
    _os.wait()
except Exception:
    pass
'''

# Floods stdout (about 30 MB), then carries on.
ATTACKS["flood_stdout"] = '''
import sys as _sys
for _ in range(300):
    _sys.stdout.write("x" * 100_000 + "\\n")
'''

# The grader used to open the harness's channels by name in the harness's folder, which this code
# can write: `more.fifo` replaced by a link to another student's notebook made the grader (root,
# outside the sandbox) write the shrinking batch over it. Now no channel has a name there; the link
# is planted anyway (tamper evidence), and the FIFO made at the victim's path lands in a trap.
ATTACKS["channel_symlink"] = f"""
import os as _os
def _victim():
    for pid in _os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                args = [a.decode("utf-8", "replace") for a in fh.read().split(b"\\0")]
        except OSError:
            continue
        if "grade" in args and "--out" in args:
            return _os.path.join(args[args.index("grade") + 1], "honest_reference.ipynb")
    return None
if not ({IN_KERNEL}):
    _v = _victim() or "/nonexistent/decodesched-victim.ipynb"
    try:
        _os.unlink("more.fifo")
    except OSError:
        pass
    try:
        _os.symlink(_v, "more.fifo")
        _os.mkfifo(_v)  # inside the sandbox: the harness's own open() of it would wait
    except OSError:
        pass
"""

# Its output file replaced by a FIFO: the grader used to wait for ever in open(), and so did the run.
ATTACKS["channel_fifo"] = f"""
import os as _os
if not ({IN_KERNEL}):
    try:
        _os.unlink("out.jsonl")
    except OSError:
        pass
    try:
        _os.mkfifo("out.jsonl")
    except OSError:
        pass
"""

# Writes its own "results" into the harness's output (found in /proc/self/fd, by name or as the
# grader's anonymous file): an 8 MiB line of empty objects, which json.loads in the grader used to
# blow up to about 240 MB, then a done line, and leaves.
ATTACKS["output_bomb"] = f"""
import os as _os, json as _json
def _harness_out():
    for fd in _os.listdir("/proc/self/fd"):
        try:
            target = _os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if target.endswith("out.jsonl") or "harness-out" in target:
            return int(fd)
    return None
_fd = None if {IN_KERNEL} else _harness_out()
if _fd is not None:
    _sid = _json.load(open("in.json"))["scenarios"][0]["id"]
    _bomb = b'{{"id": "%s", "obs": [' % _sid.encode() + b"{{}}," * (8 * 2**20 // 3) + b'{{}}]}}\\n'
    _os.write(_fd, b'{{"load": "ok"}}\\n' + _bomb)
    _os.write(_fd, b'{{"done": 1}}\\n')
    _os._exit(0)
"""

# Files in its own folder (on /dev/shm: RAM) past the memory limit, 63 MiB each (RLIMIT_FSIZE caps
# only each file), used to go unseen by the memory watchdog; now they count as the run's memory.
ATTACKS["fills_its_folder"] = """
import time as _time
_chunk = b"x" * (1 << 20)
for _i in range(40):
    try:
        with open("fill%03d" % _i, "wb") as _fh:
            for _j in range(63):
                _fh.write(_chunk)
    except BaseException:
        break
_t = _time.monotonic()
while _time.monotonic() - _t < 3:
    try:
        _time.sleep(0.01)
    except BaseException:
        pass
"""

EXPECT = {
    "eq_always_true": ("tampered", "below"),
    "ast_transformer": ("tampered", "honest"),
    "input_transformer": ("tampered", "honest"),
    "reads_hidden_files": ("tampered", "honest"),  # it names gradebook.db: static evidence
    "writes_gradebook": ("tampered", "honest"),
    "writes_out_dir": ("tampered", "honest"),  # its writes land in the hidden folder's trap
    "patches_builtins": ("tampered", "honest"),
    "patches_grader_modules": ("graded", "at_most"),
    "os_exit": ("crashed", "honest"),
    "segfault": ("crashed", "at_most"),
    "kernel_death": ("crashed", "honest"),
    "loop_python": ("timeout", "honest"),
    "loop_swallows_interrupt": ("timeout", 0.0),
    "loop_njit": ("timeout", "honest"),
    "memory_bomb": ("memory", "honest"),
    "background_process": ("graded", "honest"),
    "flood_stdout": ("graded", "honest"),
    "channel_symlink": ("tampered", "honest"),
    "channel_fifo": ("tampered", "honest"),
    "output_bomb": ("tampered", "at_most"),
    "fills_its_folder": ("memory", "at_most"),
    # honest and broken submissions graded in the same run
    "honest_reference": ("graded", 100.0),
    "honest_quirks": ("graded", 100.0),
    "honest_numpy_value": ("graded", "at_most"),  # not tampered: NumPy's == is no forgery
    "honest_buggy": ("graded", "honest"),
    "release_untouched": ("graded", 0.0),
    "altered_test_cell": ("tampered", "honest"),
    # the solution cell without its nbgrader metadata (VS Code's Jupyter extension has dropped cell metadata on
    # execute): the one code cell that defines both classes is graded as the solution (`notebook.find_solution`)
    "no_solution_cell": ("graded", "honest"),
    "broken_json": ("invalid", 0.0),
}


def reference_source() -> str:
    return REFERENCE.read_text(encoding="utf-8")


def honest_source() -> str:
    ref = reference_source()
    assert HONEST_BUG[0] in ref, "the reference solution changed; update HONEST_BUG"
    return ref.replace(HONEST_BUG[0], HONEST_BUG[1])


def _with_solution(release: dict, source: str) -> dict:
    nb = copy.deepcopy(release)
    cells = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == SOLUTION_CELL]
    assert len(cells) == 1, "the release must have exactly one solution cell"
    cells[0]["source"] = source
    return nb


def _honest_quirks(release: dict) -> dict:
    ref = reference_source()
    assert WRAPPED[0] in ref, "the reference solution changed; update WRAPPED"
    nb = _with_solution(release, "%matplotlib inline\n" + ref.replace(*WRAPPED))
    at = next(i for i, c in enumerate(nb["cells"])
              if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == SOLUTION_CELL)
    nb["cells"].insert(at + 1, {"cell_type": "code", "execution_count": None, "id": "scratch-quirks", "metadata": {},
                                "outputs": [], "source": SCRATCH})
    return nb


def build(release_path, out_dir, tokens: tuple[str, str] | None = None) -> dict[str, Path]:
    """Write every submission of EXPECT as OUT_DIR/<name>.ipynb; return name -> path.

    `tokens` = (text, number) replace the background-process attack's markers "decodesched-attack-bg"
    and "987654", so a test can look for exactly its own leftovers.
    """
    release = json.loads(Path(release_path).read_text(encoding="utf-8"))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    honest = honest_source()
    codes = dict(ATTACKS)
    if tokens:
        codes["background_process"] = codes["background_process"].replace(
            "decodesched-attack-bg", tokens[0]).replace("987654", tokens[1])
    nbs: dict[str, object] = {name: _with_solution(release, honest.rstrip() + "\n\n" + code.strip() + "\n")
                              for name, code in codes.items()}
    nbs["honest_reference"] = _with_solution(release, reference_source())
    nbs["honest_quirks"] = _honest_quirks(release)
    assert NUMPY_VALUE[0] in honest, "the reference solution changed; update NUMPY_VALUE"
    nbs["honest_numpy_value"] = _with_solution(release, honest.replace(*NUMPY_VALUE))
    nbs["honest_buggy"] = _with_solution(release, honest)
    nbs["release_untouched"] = copy.deepcopy(release)
    altered = _with_solution(release, honest)
    tests = [c for c in altered["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade")
             and c["metadata"]["nbgrader"].get("grade_id") != SOLUTION_CELL]
    tests[0]["source"] = "# the test was here\npass\n"
    nbs["altered_test_cell"] = altered
    nosol = _with_solution(release, honest)
    for c in nosol["cells"]:
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == SOLUTION_CELL:
            del c["metadata"]["nbgrader"]
    nbs["no_solution_cell"] = nosol
    paths = {}
    for name, nb in nbs.items():
        p = out / f"{name}.ipynb"
        p.write_text(json.dumps(nb, ensure_ascii=False, indent=1), encoding="utf-8")
        paths[name] = p
    p = out / "broken_json.ipynb"
    p.write_text('{"cells": [ {"cell_type": "code", "source": "import os', encoding="utf-8")
    paths["broken_json"] = p
    assert set(paths) == set(EXPECT)
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python tests/grader_attacks/attacks.py RELEASE.ipynb OUT_DIR")
    for name, path in sorted(build(sys.argv[1], sys.argv[2]).items()):
        print(path)


# A tiny notebook with the course's cell layout (unit tests of intake and evidence).
def minimal_notebook(solution="class RequestState: pass\nclass DecodeSchedulerSim: pass\n", extra_cells=()):
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": "# intro"},
        {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": SOLUTION_CELL, "solution": True,
                                                         "grade": False, "locked": False}},
         "source": solution, "outputs": [], "execution_count": None},
        {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "test_todo1_enqueue", "grade": True, "points": 3,
                                                         "locked": True, "solution": False}},
         "source": "assert 1 == 1\n", "outputs": [], "execution_count": None},
        *extra_cells,
    ]
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}
