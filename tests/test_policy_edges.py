"""Edges of user policies found by the third audit: object-mode functions, unsigned effective priorities,
``cache=True`` policy files, policies that share a name, the ``module:attr`` form from the current
folder, and names that would break the tables.  Each test checks behaviour (a replay, an import, a
refusal before any work), not only a message.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest

from decodesched import Policy, simulate
from decodesched.cli import main
from decodesched.errors import UserError
from decodesched.model import replay
from decodesched.policy import builtin, check_distinct, resolve_policy

TRACE_CSV = """\
request_id,arrival_step,prompt_len,max_new_tokens,priority,cache_hit,required_blocks,deadline_step,preemptible
1,0,4,3,0,false,2,,true
2,0,2,2,5,true,3,10,true
3,1,3,4,1,false,4,6,false
-4,2,5,1,-2,false,1,,true
"""

# Two requests that each need both blocks: request 2 (priority 3) arrives at step 1 and preempts 1
# exactly when its effective priority compares above 1's.
PREEMPTING = {"request_id": [1, 2], "arrival_step": [0, 1], "prompt_len": [1, 1], "max_new_tokens": [3, 3],
              "priority": [0, 3], "cache_hit": [False, False], "required_blocks": [2, 2],
              "deadline_step": [None, None], "preemptible": [True, True]}


def _rows(trace):
    return [dict(zip(trace, values)) for values in zip(*trace.values())]


def _steps(events):
    return [(e["request_id"], e["preempted_request_id"]) for e in events]


@numba.njit
def phase_key(r, clock):
    return (r.phase, r.request_id)


@numba.njit
def business(r, clock):
    return r.priority


@numba.jit(forceobj=True)
def object_mode_key(r, clock):
    return (r.phase,)


@numba.jit(forceobj=True)
def object_mode_priority(r, clock):
    return r.priority


# --- A: object-mode functions, and kernels that do not compile -------------------------------------

@pytest.mark.parametrize("key, priority, what", [(object_mode_key, business, "key"),
                                                 (phase_key, object_mode_priority, "effective_priority")])
def test_an_object_mode_function_is_refused_like_a_plain_function(key, priority, what):
    """numba.jit(forceobj=True) gives a CPUDispatcher that answers the sample call, but the nopython
    kernel cannot call it: Policy refuses it at once, as it refuses a function that is not jitted."""
    with pytest.raises(UserError, match=f"'objmode': {what} must be a @numba.njit function .*object-mode") as info:
        Policy("objmode", key=key, effective_priority=priority)
    assert "\n" not in str(info.value)


def test_an_object_mode_policy_file_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "t.csv").write_text(TRACE_CSV)
    (tmp_path / "opol.py").write_text(textwrap.dedent("""
        import numba
        from decodesched import Policy

        @numba.jit(forceobj=True)
        def k(r, clock):
            return (r.phase,)

        @numba.njit
        def e(r, clock):
            return r.priority

        OBJ = Policy("objmode", key=k, effective_priority=e)
    """))
    out = tmp_path / "events.csv"
    assert main(["simulate", str(tmp_path / "t.csv"), "--policy", f"{tmp_path / 'opol.py'}:OBJ", "--kv-blocks", "5",
                 "--events", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be a @numba.njit function" in err[0]
    assert not out.exists()


def test_a_kernel_that_does_not_compile_is_one_user_error_line(tmp_path, capsys):
    """Whatever gets past validation (here a function swapped in afterwards), a Numba error while the
    replay kernel compiles is a UserError naming the policy, in the API and on the command line.  (``policy.key =``
    checks the function as `Policy` does, so only code that goes around it, `object.__setattr__`, gets this far.)"""
    policy = Policy("swapped", key=phase_key, effective_priority=business)
    object.__setattr__(policy, "key", object_mode_key)
    with pytest.raises(UserError, match=r"^policy 'swapped': its replay kernel does not compile: ") as info:
        simulate(PREEMPTING, policy, free_kv_blocks=2)
    assert "\n" not in str(info.value)
    assert isinstance(info.value.__cause__, numba.core.errors.NumbaError)

    (tmp_path / "t.csv").write_text(TRACE_CSV)
    (tmp_path / "swap.py").write_text(textwrap.dedent("""
        import numba
        from decodesched import Policy

        @numba.njit
        def k(r, clock):
            return (r.phase,)

        @numba.jit(forceobj=True)
        def ko(r, clock):
            return (r.phase,)

        @numba.njit
        def e(r, clock):
            return r.priority

        SWAP = Policy("swapped_file", key=k, effective_priority=e)
        object.__setattr__(SWAP, "key", ko)
    """))
    capsys.readouterr()
    assert main(["simulate", str(tmp_path / "t.csv"), "--policy", f"{tmp_path / 'swap.py'}:SWAP",
                 "--kv-blocks", "5"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "compiling policy" not in line]
    assert len(err) == 1 and "'swapped_file': its replay kernel does not compile" in err[0]


# --- B: unsigned 64-bit effective priorities --------------------------------------------------------

@numba.njit
def uint64_priority(r, clock):
    return np.uint64(2**60) + np.uint64(r.priority + 2)


@numba.njit
def int64_priority(r, clock):
    return np.int64(2**60) + r.priority


@numba.njit
def uint64_key(r, clock):
    return (np.uint64(2**63) + np.uint64(2**60) + np.uint64(r.priority), r.phase)


def test_a_uint64_effective_priority_is_refused():
    """In the kernel a uint64 effective priority meets int64 ones and Numba makes both float64, which
    rounds 2**60 + 2 and 2**60 + 5 to one value: the preemption the model makes would not happen."""
    with pytest.raises(UserError, match="return a signed integer: uint64 mixes with int64 into a float") as info:
        Policy("ueff", key=phase_key, effective_priority=uint64_priority)
    assert "\n" not in str(info.value) and "'ueff'" in str(info.value)
    # the same values as int64 are exact: kernel and model both let request 2 preempt request 1
    signed = Policy("ieff", key=phase_key, effective_priority=int64_priority)
    kernel = _steps(simulate(PREEMPTING, signed, free_kv_blocks=2).timeline())
    assert kernel == _steps(replay(_rows(PREEMPTING), signed, 2).events)
    assert (2, 1) in kernel


def test_uint64_key_elements_stay_exact_and_equal_the_model():
    """A key element is compared only with the same element of another key (same type), so uint64 keys,
    even above 2**63 and differing only in the low bits, order exactly as the model does."""
    policy = Policy("ukey", key=uint64_key, effective_priority=business)
    rng = np.random.default_rng(5)
    for _ in range(20):
        n = 6
        trace = {"request_id": list(range(n)), "arrival_step": sorted(rng.integers(0, 4, n).tolist()),
                 "prompt_len": [1] * n, "max_new_tokens": rng.integers(1, 4, n).tolist(),
                 "priority": rng.integers(0, 5, n).tolist(), "cache_hit": [False] * n,
                 "required_blocks": rng.integers(1, 3, n).tolist(), "deadline_step": [None] * n,
                 "preemptible": [True] * n}
        assert (_steps(simulate(trace, policy, free_kv_blocks=2).timeline())
                == _steps(replay(_rows(trace), policy, 2).events))


# --- C: @numba.njit(cache=True) in a policy file ----------------------------------------------------

CACHED_MODULE = """
import numba
from decodesched import Policy

@numba.njit(cache=True)
def helper(x):
    return x + 1

@numba.njit("int64(int64)", cache=True)
def eager(x):  # compiled (and, with cache=True, cached) when the decorator runs
    return x * 2

@numba.njit(cache=True)
def key(r, clock):
    return (r.phase, helper(r.request_id))

@numba.njit(cache=True)
def priority(r, clock):
    return eager(r.priority)

P = Policy("cachedpol", key=key, effective_priority=priority)
"""

# What --policy cpol.py:P does, in a process that, like the console script, cannot import cpol by name.
RESOLVE = ("import sys; del sys.path[0]; from decodesched.policy import resolve_policy; "
           "p = resolve_policy('cpol.py:P'); print(type(p.key._cache).__name__)")


def _python(code, cwd):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600)


def _cache_files(folder, cache_dir):
    """Numba cache files of cpol.py, beside it or under NUMBA_CACHE_DIR."""
    roots = [folder / "__pycache__"] + ([cache_dir] if cache_dir else [])
    return sorted(str(p) for root in roots if os.path.isdir(root) for p in root.rglob("cpol.*.nb*"))


def test_a_cached_policy_file_works_however_it_was_imported_before(tmp_path):
    """Numba's cache entries record the module that wrote them: a file loaded as path.py:attr (under a
    private name) and the same file imported by name must not read each other's entries."""
    (tmp_path / "cpol.py").write_text(CACHED_MODULE)
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    # a normal import first (it writes the cache), then the file form
    first = _python("import cpol", tmp_path)
    assert first.returncode == 0, first.stderr
    written = _cache_files(tmp_path, cache_dir)
    assert written  # the normal import caches as usual
    after = _python(RESOLVE, tmp_path)
    assert after.returncode == 0, after.stderr
    assert after.stdout.split() == ["NullCache"]
    # the file form first: it writes nothing, so a later normal import works and caches as usual
    for path in written:
        os.remove(path)
    resolved = _python(RESOLVE, tmp_path)
    assert resolved.returncode == 0, resolved.stderr
    assert _cache_files(tmp_path, cache_dir) == []
    imported = _python("import cpol; print(cpol.P.name)", tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.split() == ["cachedpol"]
    assert _cache_files(tmp_path, cache_dir)


def test_other_functions_keep_their_disk_cache(tmp_path):
    """Only functions of a policy file loaded by decodesched lose the disk cache."""
    (tmp_path / "cpol2.py").write_text(CACHED_MODULE)
    resolve_policy(f"{tmp_path / 'cpol2.py'}:P")

    @numba.njit(cache=True)
    def elsewhere(x):
        return x

    assert type(elsewhere._cache).__name__ == "FunctionCache"


# --- D: one name, one policy ------------------------------------------------------------------------

def _write_named(path, sign):
    path.write_text(textwrap.dedent(f"""
        import numba
        from decodesched import Policy

        @numba.njit
        def k(r, clock):
            return (r.phase, {sign}(r.max_new_tokens - r.generated_len))

        @numba.njit
        def e(r, clock):
            return {sign}r.priority

        P = Policy("mine", key=k, effective_priority=e)
    """))
    return path


@pytest.mark.parametrize("policies, message", [
    (["pa.py:P", "pb.py:P"], r"two different policies are named 'mine' \(.*pa.py:P and .*pb.py:P\)"),
    (["aging", "aging"], "policy 'aging' is given twice"),
    (["pa.py:P", "fcfs", "pa.py:P"], "policy 'mine' is given twice"),
])
def test_sweep_refuses_one_name_for_two_entries_before_any_work(tmp_path, capsys, monkeypatch, policies, message):
    import decodesched.commands.sweep as sweep

    def no_work(*args, **kwargs):
        raise AssertionError("the sweep loaded or ran something")

    monkeypatch.setattr(sweep, "load_trace", no_work)
    monkeypatch.setattr(sweep, "_run_local", no_work)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(TRACE_CSV)
    _write_named(tmp_path / "pa.py", "")
    _write_named(tmp_path / "pb.py", "-")
    capsys.readouterr()
    assert main(["sweep", "t.csv", "--policy", ",".join(policies), "--kv-blocks", "3", "--out", "sw.csv"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert re.search(message, err[0]), err[0]
    assert not (tmp_path / "sw.csv").exists() and not (tmp_path / "sw.csv.partial.jsonl").exists()


def test_check_distinct_knows_policies_by_name_and_code(tmp_path):
    a = resolve_policy(f"{_write_named(tmp_path / 'a.py', '')}:P")
    b = resolve_policy(f"{_write_named(tmp_path / 'b.py', '-')}:P")
    same_code = resolve_policy(f"{_write_named(tmp_path / 'c.py', '')}:P")
    other = Policy("other", key=phase_key, effective_priority=business)
    check_distinct(["fcfs", "aging", a, other])  # distinct: no error
    check_distinct([])
    with pytest.raises(UserError, match="two different policies are named 'mine'"):
        check_distinct([a, other, b])
    for twice in ([a, a], [a, same_code], ["aging", builtin("aging", 8)], [other, "fcfs", other]):
        with pytest.raises(UserError, match="is given twice") as info:
            check_distinct(twice)
        assert "\n" not in str(info.value)


# --- E: module:attr from the current folder; printable names -----------------------------------------

def test_module_form_finds_a_module_in_the_current_folder(tmp_path, monkeypatch):
    """The console script does not put the current folder on sys.path (python -m does): the module form
    looks there too, after everything else, and leaves sys.path as it was."""
    cwd = tmp_path / "here"
    cwd.mkdir()
    (cwd / "edge_cwd_policies.py").write_text(textwrap.dedent("""
        import numba
        from decodesched import Policy

        @numba.njit
        def k(r, clock):
            return (r.prompt_len,)

        @numba.njit
        def e(r, clock):
            return r.priority

        SHORT = Policy("cwd_short", key=k, effective_priority=e)
    """))
    (cwd / "textwrap.py").write_text("raise RuntimeError('the current folder shadowed the standard library')\n")
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p and os.path.abspath(p) != str(cwd)])
    before = list(sys.path)
    assert resolve_policy("edge_cwd_policies:SHORT").name == "cwd_short"
    assert sys.path == before
    # an installed (here: standard) module of the same name wins over the current folder
    with pytest.raises(UserError, match="textwrap has no attribute 'SHORT'"):
        resolve_policy("textwrap:SHORT")
    assert sys.path == before
    with pytest.raises(UserError, match=rf"cannot import no_such_policies_xyz: .*current folder \({cwd}\)") as info:
        resolve_policy("no_such_policies_xyz:P")
    assert "sys.path" in str(info.value) and "\n" not in str(info.value)
    assert sys.path == before


def test_module_form_reports_a_missing_import_inside_the_module(tmp_path, monkeypatch):
    (tmp_path / "edge_needs_missing.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match="importing edge_needs_missing failed: ModuleNotFoundError: "
                                        "No module named 'no_such_dependency_xyz'"):
        resolve_policy("edge_needs_missing:P")


@pytest.mark.parametrize("name", ["two\nlines", "esc\x1b[31mred", "tab\there", "bell\a"])
def test_a_name_that_is_not_printable_is_refused(name):
    with pytest.raises(UserError, match="not printable") as info:
        Policy(name, key=phase_key, effective_priority=business)
    assert "\n" not in str(info.value)


def test_printable_names_are_kept_as_given():
    for name in ("two words", "SJF", "sjf/v2", "délai"):
        assert Policy(name, key=phase_key, effective_priority=business).name == name


def test_what_a_policy_module_prints_at_import_stays_out_of_a_streamed_table(tmp_path, capfd):
    """`--events -` streams the log on stdout; a module that prints on import must not open it."""
    import subprocess
    import sys

    from oracle import write_sjf_module

    module = write_sjf_module(tmp_path / "loud.py", "loud")
    module.write_text("print('hello from import')\n" + module.read_text())
    trace = tmp_path / "t.csv"
    trace.write_text("request_id,arrival_step,prompt_len,max_new_tokens,priority,cache_hit,required_blocks,"
                     "deadline_step,preemptible\n1,0,4,3,0,false,2,,true\n")
    proc = subprocess.run([sys.executable, "-m", "decodesched.cli", "simulate", str(trace), "--policy",
                           f"{module}:SJF", "--kv-blocks", "4", "--events", "-"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("step,") and "hello from import" in proc.stderr


def test_a_key_returning_a_named_tuple_is_refused_when_the_policy_is_built():
    """The model took it (it calls tuple() on the key), the replay kernel did not compile it: refused at
    once, with what to return instead."""
    from collections import namedtuple

    pair = namedtuple("Pair", ("a", "b"))
    key = numba.njit(lambda r, clock: pair(r.phase, -r.priority))
    prio = numba.njit(lambda r, clock: r.priority)
    with pytest.raises(UserError, match="must return a plain tuple, not a Pair"):
        Policy("named", key=key, effective_priority=prio)


def test_a_builtin_policy_takes_a_numpy_integer_interval_as_its_name_does():
    from decodesched import DecodeSchedulerSim

    rows = [dict(request_id=i, arrival_step=0, prompt_len=1, max_new_tokens=3, priority=i % 2, cache_hit=False,
                 required_blocks=1, deadline_step=None, preemptible=True) for i in range(4)]
    by_policy = replay(rows, policy=builtin("aging"), free_kv_blocks=2, aging_interval=np.int64(2))
    by_name = replay(rows, policy="aging", free_kv_blocks=2, aging_interval=2)
    assert by_policy.events == by_name.events
    assert DecodeSchedulerSim(builtin("aging"), 4, np.int64(8)) is not None
    assert builtin("aging", np.int64(8)).effective_priority is not None
    with pytest.raises(UserError, match="aging_interval must be an integer"):
        builtin("aging", np.bool_(True))


# The policy pattern of docs/policies.md (a key and a priority that call an @njit helper), with a
# module constant that the key reads, a helper held in a closure, and a helper of another module.
HELPER_POLICY = '''
import numba
import {helpers} as helpers
from decodesched import Policy

BIAS = {bias}

@numba.njit
def remaining_steps(r):
    return {remaining}

def _closed(offset):
    @numba.njit
    def tie(r):
        return r.priority + offset
    return tie

TIE = _closed({offset})

@numba.njit
def sjf_key(r, clock):
    return (remaining_steps(r) + BIAS, TIE(r))

@numba.njit
def sjf_priority(r, clock):
    return -remaining_steps(r) + helpers.boost(r)

SJF = Policy("sjf", key=sjf_key, effective_priority=sjf_priority)
'''
HELPER_MODULE = '''
import numba

@numba.njit
def boost(r):
    return {boost}
'''
BASE = {"bias": 0, "remaining": "r.max_new_tokens - r.generated_len + (1 if r.phase == 0 else 0)",
        "offset": 0, "boost": "r.priority"}


def _helper_policy(folder, **edits) -> Policy:
    """`folder`/pol.py:SJF, importing `folder`/fp_helpers.py (imported afresh, as a new process would)."""
    values = {**BASE, **edits}
    folder.mkdir(exist_ok=True)
    (folder / "fp_helpers.py").write_text(HELPER_MODULE.format(**values))
    (folder / "pol.py").write_text(HELPER_POLICY.format(helpers="fp_helpers", **values))
    sys.modules.pop("fp_helpers", None)
    for name in [n for n, m in sys.modules.items() if (getattr(m, "__file__", None) or "") == str(folder / "pol.py")]:
        del sys.modules[name]
    sys.path.insert(0, str(folder))
    try:
        return resolve_policy(f"{folder / 'pol.py'}:SJF")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("fp_helpers", None)


def test_the_fingerprint_follows_helpers_constants_and_closures(tmp_path):
    """Numba freezes the helpers a policy calls and the module constants it reads: editing any of them
    must change `Policy.fingerprint` (the checkpoint key), or a resumed sweep mixes two policies'
    rows.  Before, only `key` and `effective_priority` themselves were hashed."""
    base = _helper_policy(tmp_path / "base")
    assert _helper_policy(tmp_path / "copy").fingerprint() == base.fingerprint()  # same code, other files
    edited = {
        "helper": {"remaining": "-(r.max_new_tokens - r.generated_len)"},
        "constant": {"bias": 7},
        "closure": {"offset": 3},
        "module_helper": {"boost": "2 * r.priority"},
    }
    prints = {what: _helper_policy(tmp_path / what, **change).fingerprint() for what, change in edited.items()}
    assert base.fingerprint() not in prints.values() and len(set(prints.values())) == len(prints), prints
    # the same in another process (no address or hash-randomised order in it), so a rerun resumes
    code = (f"import sys; sys.path.insert(0, {str(tmp_path / 'base')!r}); "
            "from decodesched.policy import resolve_policy; "
            f"print(resolve_policy({str(tmp_path / 'base' / 'pol.py') + ':SJF'!r}).fingerprint())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "random"}).stdout.split()
    assert out[-1] == base.fingerprint()


def test_a_sweep_resumed_after_a_helper_was_edited_starts_afresh(tmp_path, monkeypatch):
    """The audit's case end to end: a sweep of the docs' policy stopped after its first chunk, the
    helper edited, the same command run again: every row must come from the edited policy."""
    from decodesched import batch as B

    trace = tmp_path / "t.csv"
    trace.write_text(TRACE_CSV)
    base = _helper_policy(tmp_path / "p")
    out, clean = tmp_path / "m.csv", tmp_path / "clean.csv"
    argv = ["sweep", str(trace), "--policy", f"{tmp_path / 'p' / 'pol.py'}:SJF", "--kv-blocks", "3,4,5,6",
            "--chunk-size", "1", "--threads", "1"]
    real, calls = B.simulate_batch, []

    def stop_at_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(B, "simulate_batch", stop_at_second)
    assert main([*argv, "--out", str(out)]) == 130
    monkeypatch.setattr(B, "simulate_batch", real)
    assert (tmp_path / "m.csv.partial.jsonl").exists()
    # the edited file is loaded afresh (as a new process would)
    edited = _helper_policy(tmp_path / "p", remaining="-(r.max_new_tokens - r.generated_len)")
    assert edited is not base and edited.fingerprint() != base.fingerprint()
    assert main([*argv, "--out", str(out)]) == 0
    assert main([*argv, "--out", str(clean)]) == 0
    assert out.read_bytes() == clean.read_bytes()


def test_the_fingerprint_follows_enum_members_and_survives_odd_globals():
    """Numba compiles `Level.BOOST` as the member's value: editing it must change the fingerprint.  Any
    object may sit in a policy module's globals: one whose repr, attributes or iteration raise, a huge
    int, containers sharing parts 30 levels deep: a fingerprint, at once, never an exception."""
    import enum
    import time

    from decodesched.policy import _describe_value

    def levels(boost):
        return enum.IntEnum("Level", {"LOW": 0, "BOOST": boost})

    assert _describe_value(levels(1), 0, {}) == _describe_value(levels(1), 0, {})
    assert _describe_value(levels(1), 0, {}) != _describe_value(levels(5), 0, {})

    class Hostile(str):
        def __repr__(self):
            raise RuntimeError("no")

        def __getattribute__(self, name):
            raise RuntimeError("no")

    class BadItems(dict):
        def items(self):
            raise RuntimeError("no")

    shared = [1]
    for _ in range(30):
        shared = [shared, shared]  # 2**30 paths to one list
    start = time.process_time()
    for odd in (Hostile("x"), BadItems(a=1), 10**5000, shared):
        assert isinstance(_describe_value(odd, 0, {}), bytes)
    assert time.process_time() - start < 30  # (it was exponential: 22 levels took 7 s, each one more doubles)
    assert _describe_value(10**5000, 0, {}) != _describe_value(10**5000 + 1, 0, {})
