"""Stop 58, sweeps that fail or are killed part way: a sweep process killed (SIGKILL) while it writes, flushes or
renames its checkpoint resumes to the table of an uninterrupted sweep and leaves no stray file; a checkpoint of
another decodesched is not resumed from; a user policy that raises is one line naming the scenario of the sweep;
on a real Dask cluster, a worker of another decodesched and a policy file edited while the workers hold the old one
give no rows of other code; and the small lies of a result and a trace (an editable metrics dict, NumPy's bare
IndexError)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from decodesched import batch as B
from decodesched import checkpoint as C
from decodesched import convert as cv
from decodesched import simulate
from decodesched.errors import UserError
from decodesched.policy import resolve_policy
from decodesched.trace import load_trace

POLICY_FILE = """
import numba
from decodesched import Policy

@numba.njit
def key(r, clock):
    if clock > {fail_after}:
        raise ValueError("clock past {fail_after}")
    return (r.phase, {sign} (r.max_new_tokens - r.generated_len))

@numba.njit
def priority(r, clock):
    return r.priority

MINE = Policy({name!r}, key=key, effective_priority=priority)
"""


def _module_of(path: Path) -> str:
    """The name of the module this process loaded the policy file `path` as."""
    return next(name for name, m in list(sys.modules.items()) if getattr(m, "__file__", None) == str(path.resolve()))


def write_policy(path: Path, name: str = "mine", sign: str = "", fail_after: int = 2**62) -> str:
    """A policy file (shortest or, with sign "-", longest remaining first) that raises past `fail_after`."""
    path.write_text(POLICY_FILE.format(name=name, sign=sign, fail_after=fail_after))
    return f"{path}:MINE"


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("traces")
    raw = cv.read_azure(cv.bundled_trace_path()).head(24)
    paths = []
    for load in (0.8, 1.2):
        paths.append(folder / f"az{load}.csv")
        cv.to_trace(raw, load=load, name=f"az{load}").to_csv(paths[-1])
    return paths


def _scenarios(traces):
    return B.grid([load_trace(t) for t in traces], ["fcfs", "aging", "deadline"], [60, 200], [1, 4])


# A run_local in another process, killed (SIGKILL, as by the OOM killer or `kill -9`) at the N-th call of one of the
# checkpoint's file operations: "write" halfway through writing its text, "fsync" once flushed, "replace" before the
# rename that puts a new checkpoint in place.
KILLED = """
import os, signal, sys
from decodesched import batch as B, checkpoint as C
from decodesched.trace import load_trace
what, n, ck, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
calls = []
def kill_at(name):
    calls.append(name)
    return calls.count(name) == n and name == what
class File:
    def __init__(self, fh): self.fh = fh
    def write(self, text):
        if kill_at("write"):
            self.fh.write(text[:len(text) // 2]); self.fh.flush(); os.kill(os.getpid(), signal.SIGKILL)
        return self.fh.write(text)
    def __getattr__(self, name): return getattr(self.fh, name)
    def __enter__(self): return self
    def __exit__(self, *exc): self.fh.close()
class Os:
    def __getattr__(self, name): return getattr(os, name)
    def fdopen(self, *a, **k): return File(os.fdopen(*a, **k))
    def fsync(self, fd):
        os.fsync(fd)
        if kill_at("fsync"): os.kill(os.getpid(), signal.SIGKILL)
    def replace(self, a, b):
        if kill_at("replace"): os.kill(os.getpid(), signal.SIGKILL)
        os.replace(a, b)
C.os = Os()
traces = [load_trace(p) for p in paths]
scenarios = B.grid(traces, ["fcfs", "aging", "deadline"], [60, 200], [1, 4])
C.run_local(traces, scenarios, chunk_size=3, checkpoint_path=ck, threads=1)
print("not killed")
"""


@pytest.mark.parametrize("what, n", [("write", 1), ("fsync", 1), ("replace", 1), ("write", 2), ("fsync", 2),
                                     ("write", 4)])
def test_a_sweep_killed_in_a_checkpoint_write_flush_or_rename_resumes_to_the_same_rows(traces, tmp_path, what, n):
    """The first chunk's checkpoint is written beside it and renamed (write 1, fsync 1, replace 1), the later ones
    appended (write 2 and 4: a torn line; fsync 2: a whole one).  Before: a kill before the rename left a hidden
    ``.c.jsonl.XXXXXXXX.tmp`` that no later run removed, even once the sweep completed (now ``c.jsonl.tmp``, one
    name, which the next run replaces and the completed sweep removes)."""
    ck = tmp_path / "c.jsonl"
    run = subprocess.run([sys.executable, "-c", KILLED, what, str(n), str(ck), *map(str, traces)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == -9 and "not killed" not in run.stdout, run.stderr
    assert set(os.listdir(tmp_path)) <= {"c.jsonl", "c.jsonl.lock", "c.jsonl.tmp"}
    loaded = [load_trace(t) for t in traces]
    scenarios = _scenarios(traces)
    rows = C.run_local(loaded, scenarios, chunk_size=5, checkpoint_path=ck, threads=1)
    assert str(rows) == str(B.simulate_batch(loaded, scenarios).rows())  # every scenario once, with its values
    assert os.listdir(tmp_path) == []  # no checkpoint, no lock, no temporary file


def test_a_checkpoint_of_another_decodesched_is_computed_again_not_resumed(traces, tmp_path, monkeypatch):
    """A checkpoint's key held no trace of the code that wrote it: rows of an older version (another replay, other
    metrics, fewer columns) were resumed into a table of this one."""
    loaded = [load_trace(t) for t in traces]
    scenarios = _scenarios(traces)[:4]
    ck = tmp_path / "c.jsonl"
    monkeypatch.setattr(C, "_code_digest", "0" * 64, raising=False)  # (as an older version wrote it)
    old = C.Checkpoint(ck, C.sweep_key(loaded, scenarios), len(scenarios), {})
    old.add(range(4), [{"policy": "from an older version"}] * 4)
    old.close()
    monkeypatch.undo()
    rows = C.run_local(loaded, scenarios, checkpoint_path=ck, threads=1)
    assert str(rows) == str(B.simulate_batch(loaded, scenarios).rows())


def test_a_user_policy_that_raises_in_a_local_sweep_names_the_scenario_of_the_sweep(traces, tmp_path):
    """Before: "policy 'mine' raised ValueError ..." named no scenario (trace, capacity), and a chunk's own index
    would have named another scenario of the sweep."""
    loaded = [load_trace(t) for t in traces]
    bad = resolve_policy(write_policy(tmp_path / "bad_local.py", "bad_local", fail_after=30))
    scenarios = B.grid(loaded, ["fcfs", bad], [60, 200], [4])
    with pytest.raises(UserError) as info:
        C.run_local(loaded, scenarios, chunk_size=3, threads=1)
    message = str(info.value)
    index = int(message.split()[1])
    sc = scenarios[index]
    assert sc.policy is bad and "\n" not in message
    assert message.startswith(f"scenario {index} (trace {loaded[sc.trace].name!r}, free_kv_blocks "
                              f"{sc.free_kv_blocks}): policy 'bad_local' raised ValueError")


def test_a_stale_temporary_file_is_removed_but_anything_else_there_is_kept(tmp_path):
    ck = tmp_path / "c.jsonl"
    tmp = Path(C.temporary_path(ck))
    tmp.write_text('{"format": "decodesched-swe')  # (a run killed while writing it)
    new = C.Checkpoint(ck, "key", 1, {})
    new.add([0], [{"finished": 1}])
    new.close()
    assert not tmp.exists() and C.read_checkpoint(ck, "key", 1) == {0: {"finished": 1}}
    ck.unlink()
    tmp.write_text("a file of the user's")
    new = C.Checkpoint(ck, "key", 1, {})
    with pytest.raises(FileExistsError):
        new.add([0], [{"finished": 1}])
    assert tmp.read_text() == "a file of the user's" and not ck.exists()


def test_deadline_or_none_out_of_range_names_the_row_and_the_size():
    trace = load_trace({"request_id": [1, 2], "arrival_step": [0, 0], "prompt_len": [2, 3], "max_new_tokens": [2, 1],
                        "priority": [0, 1], "cache_hit": [False, False], "required_blocks": [1, 1],
                        "deadline_step": [None, 4], "preemptible": [True, True]})
    assert trace.deadline_or_none(0) is None and trace.deadline_or_none(1) == 4 and trace.deadline_or_none(-1) == 4
    with pytest.raises(IndexError, match=r"^row 2 is out of range: the trace has 2 rows"):
        trace.deadline_or_none(2)


# --- on a real Dask cluster (one worker process on 127.0.0.1: each user policy compiles there once) ---------------

@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=1, processes=True, threads_per_worker=1, host="127.0.0.1",
                                       dashboard_address=":0")
    try:
        with distributed.Client(cluster) as c:
            yield c
    finally:
        cluster.close()


@pytest.mark.slow
def test_dask_a_worker_of_another_decodesched_refuses_its_chunks(client, traces, tmp_path):
    """Before: a worker of another version ran the chunks, and its rows went into the table unseen."""
    from decodesched.distributed import run_sweep

    loaded = [load_trace(t) for t in traces]
    scenarios = _scenarios(traces)
    client.run(lambda: setattr(__import__("decodesched.checkpoint").checkpoint, "_code_digest", "1" * 64))
    try:
        with pytest.raises(UserError) as info:
            run_sweep(loaded, scenarios, client, chunk_size=4, retries=0, checkpoint_path=tmp_path / "c.jsonl")
    finally:
        client.run(lambda: setattr(__import__("decodesched.checkpoint").checkpoint, "_code_digest", None))
    assert "runs another decodesched" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "c.jsonl").exists()
    rows = run_sweep(loaded, scenarios, client, chunk_size=4, checkpoint_path=tmp_path / "c.jsonl")
    assert str(rows) == str(B.simulate_batch(loaded, scenarios).rows())


@pytest.mark.slow
def test_dask_a_policy_that_raises_on_a_worker_names_the_scenario_and_keeps_the_rest(client, traces, tmp_path):
    from decodesched.distributed import run_sweep

    loaded = [load_trace(t) for t in traces]
    bad = resolve_policy(write_policy(tmp_path / "bad_dask.py", "bad_dask", fail_after=30))
    scenarios = B.grid(loaded, ["fcfs", bad], [60, 200], [4])
    ck = tmp_path / "c.jsonl"
    with pytest.raises(UserError) as info:
        run_sweep(loaded, scenarios, client, chunk_size=2, retries=0, checkpoint_path=ck)
    message = str(info.value)
    index = int(message.split()[1])
    sc = scenarios[index]
    assert sc.policy is bad and "\n" not in message  # (before: "a chunk of the sweep failed on the cluster: ...")
    assert message.startswith(f"scenario {index} (trace {loaded[sc.trace].name!r}, free_kv_blocks "
                              f"{sc.free_kv_blocks}): policy 'bad_dask' raised ValueError")
    saved = C.read_checkpoint(ck, C.sweep_key(loaded, scenarios), len(scenarios))
    assert all(scenarios[i].policy == "fcfs" for i in saved)


@pytest.mark.slow
def test_dask_a_policy_file_edited_between_runs_gives_no_rows_of_the_old_code(client, traces, tmp_path):
    """A worker that outlives a sweep (a cluster at tcp://...) kept the policy module it imported: a sweep of the
    edited file ran the old code there, its rows saved under the new code's key.  Now the worker imports the file
    again; a file that still differs (edited while the sweep runs, another copy) is one line."""
    from decodesched.distributed import run_sweep

    loaded = [load_trace(t) for t in traces]
    path = tmp_path / "edited.py"
    spec = write_policy(path, "edited")
    old = resolve_policy(spec)
    run_sweep(loaded, B.grid(loaded, [old], [60], [4]), client)  # (the worker imports the file)
    write_policy(path, "edited", sign="-")  # longest first now
    sys.modules.pop(_module_of(path))  # (the client of the next run reads it anew)
    new = resolve_policy(spec)
    assert new.fingerprint() != old.fingerprint()
    scenarios = B.grid(loaded, [new], [60, 200], [4])
    rows = run_sweep(loaded, scenarios, client)
    assert str(rows) == str(B.simulate_batch(loaded, scenarios).rows())
    assert str(rows) != str(B.simulate_batch(loaded, B.grid(loaded, [old], [60, 200], [4])).rows())
    write_policy(path, "edited", fail_after=5)  # edited again while the sweep runs: a new worker reads this
    client.run(lambda: sys.modules.pop(_module_of(path)))
    with pytest.raises(UserError, match=r"policy 'edited' \(.*edited.py:MINE\) here is not the code the sweep was "
                                        r"started with") as info:
        run_sweep(loaded, B.grid(loaded, [new], [100], [4]), client, retries=0)
    assert "\n" not in str(info.value)


def test_np_int_rows_still_pick_a_deadline():
    trace = load_trace({"request_id": [1], "arrival_step": [0], "prompt_len": [2], "max_new_tokens": [2],
                        "priority": [0], "cache_hit": [False], "required_blocks": [1], "deadline_step": [7],
                        "preemptible": [True]})
    assert trace.deadline_or_none(np.int64(0)) == 7


def test_a_key_set_by_hand_is_the_one_the_next_replay_runs():
    """The kernel compiled around the former key ran on after ``policy.key = ...``, while `fingerprint` (a sweep's
    checkpoint key) followed the new one: rows of one key saved under the other's."""
    import numba

    from decodesched import Policy

    @numba.njit
    def shortest(r, clock):
        return (r.phase, r.max_new_tokens - r.generated_len)

    @numba.njit
    def longest(r, clock):
        return (r.phase, r.generated_len - r.max_new_tokens)

    @numba.njit
    def priority(r, clock):
        return r.priority

    trace = cv.to_trace(cv.read_azure(cv.bundled_trace_path()).head(24), load=1.2, name="az")
    policy = Policy("by_hand", key=shortest, effective_priority=priority)
    first = simulate(trace, policy, free_kv_blocks=60)
    policy.key = longest
    again = simulate(trace, policy, free_kv_blocks=60)
    assert again == simulate(trace, Policy("by_hand", key=longest, effective_priority=priority), free_kv_blocks=60)
    assert again != first


@pytest.mark.slow
def test_dask_every_worker_that_held_the_traces_killed_costs_only_their_chunks(traces, tmp_path):
    """SIGKILL of one worker, then of the other: the nanny restarts each without the traces scattered at the start,
    so the second kill lost them, and the sweep failed ("FutureCancelledError: ... already forgotten").  Now the
    chunks that needed them are sent again with the traces; the checkpoint holds every scenario exactly once."""
    import json
    import signal
    import time

    import distributed

    from decodesched.distributed import _run_chunk, run_sweep

    def slow(trace_list, chunk, first, threads):  # (runs on the workers: a chunk lasts long enough to be killed in)
        time.sleep(0.1)
        return _run_chunk(trace_list, chunk, first, threads)

    loaded = [load_trace(t) for t in traces]
    scenarios = B.grid(loaded, ["fixed_priority", "aging", "deadline", "fcfs"], list(range(30, 200, 10)), [1, 4])
    ck = tmp_path / "c.jsonl"
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1",
                                       dashboard_address=":0", silence_logs=50)
    killed = []
    try:
        with distributed.Client(cluster) as c:
            first_pids = sorted(c.run(os.getpid).values())

            def kill(done, total):
                if done <= len(first_pids) and len(killed) < done:
                    os.kill(first_pids[done - 1], signal.SIGKILL)
                    killed.append(first_pids[done - 1])

            rows = run_sweep(loaded, scenarios, c, chunk_size=4, checkpoint_path=ck, keep_checkpoint=True,
                             on_chunk=kill, quiet=True, chunk_function=slow)
    finally:
        cluster.close()
    assert killed == first_pids
    assert str(rows) == str(B.simulate_batch(loaded, scenarios).rows())
    saved = [i for line in ck.read_text().splitlines()[1:] for i in json.loads(line)["indices"]]
    assert sorted(saved) == list(range(len(scenarios)))  # each once
