"""Sweeps on a real Dask cluster (scheduler and two worker processes on 127.0.0.1).

The rows of `distributed.run_sweep` must equal those of a local `simulate_batch`, also when a
worker is killed mid-sweep and when a sweep is interrupted and resumed from its checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time

import pytest

distributed = pytest.importorskip("distributed")

from decodesched import convert as cv  # noqa: E402
from decodesched.batch import grid, simulate_batch, write_metrics_csv  # noqa: E402
from decodesched.distributed import read_checkpoint, run_sweep, sweep_key  # noqa: E402
from decodesched.errors import UserError  # noqa: E402

POLICIES = ["fixed_priority", "aging", "deadline", "fcfs"]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def traces():
    raw = cv.read_azure(cv.bundled_trace_path()).head(24)
    return [cv.to_trace(raw, load=load, name=f"azure_load{load}") for load in (0.8, 1.2)]


@pytest.fixture(scope="module")
def scenarios(traces):
    # 2 traces x 36 capacities x (4 aging intervals + 3 policies that ignore the interval) = 504 scenarios
    sc = grid(traces, POLICIES, list(range(30, 390, 10)), [1, 2, 4, 8])
    assert len(sc) >= 500
    return sc


@pytest.fixture(scope="module")
def local_rows(traces, scenarios):
    return simulate_batch(traces, scenarios).rows()


def _cluster():
    return distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1",
                                    dashboard_address=":0")


@pytest.fixture(scope="module")
def client():
    cluster = _cluster()
    try:
        with distributed.Client(cluster) as c:
            yield c
    finally:
        cluster.close()


def same_rows(a: list[dict], b: list[dict]) -> bool:
    """Row lists equal value for value (NaN equals NaN, 1 equals 1.0 is not enough: types must match)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if list(x) != list(y):
            return False
        for k in x:
            vx, vy = x[k], y[k]
            if isinstance(vx, float) and isinstance(vy, float) and math.isnan(vx) and math.isnan(vy):
                continue
            if vx != vy or type(vx) is not type(vy):
                return False
    return True


def test_same_rows_helper_detects_differences():
    row = {"a": 1, "b": math.nan, "c": "x"}
    assert same_rows([row], [dict(row)])
    assert not same_rows([row], [{**row, "a": 2}])
    assert not same_rows([row], [{**row, "b": 0.0}])
    assert not same_rows([row], [{**row, "a": 1.0}])
    assert not same_rows([row], [row, row])


def test_dask_sweep_equals_local_run(client, traces, scenarios, local_rows, tmp_path):
    rows = run_sweep(traces, scenarios, client, chunk_size=32, checkpoint_path=tmp_path / "m.csv.partial.jsonl")
    assert same_rows(rows, local_rows)
    write_metrics_csv(rows, tmp_path / "dask.csv")
    write_metrics_csv(local_rows, tmp_path / "local.csv")
    assert (tmp_path / "dask.csv").read_bytes() == (tmp_path / "local.csv").read_bytes()
    assert not (tmp_path / "m.csv.partial.jsonl").exists()  # removed once complete


def test_killed_worker_costs_only_its_chunk(traces, scenarios, local_rows):
    cluster = _cluster()
    killed = []
    try:
        with distributed.Client(cluster) as c:
            pids = c.run(os.getpid)  # {worker address: pid}
            assert len(pids) == 2

            def kill_one(done, total):
                if not killed:
                    pid = sorted(pids.values())[0]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

            rows = run_sweep(traces, scenarios, c, chunk_size=16, on_chunk=kill_one)
            assert killed
            time.sleep(0.2)
            with pytest.raises(ProcessLookupError):
                os.kill(killed[0], 0)  # that worker process is really gone
            assert killed[0] not in c.run(os.getpid).values()
    finally:
        cluster.close()
    assert same_rows(rows, local_rows)


class Interrupt(Exception):
    pass


def test_interrupted_sweep_resumes_from_checkpoint(client, traces, scenarios, local_rows, tmp_path):
    ck = tmp_path / "metrics.csv.partial.jsonl"
    chunk = 64
    n_chunks = -(-len(scenarios) // chunk)

    def stop_after_three(done, total):
        assert total == n_chunks
        if done == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_sweep(traces, scenarios, client, chunk_size=chunk, checkpoint_path=ck, on_chunk=stop_after_three)
    saved = read_checkpoint(ck, sweep_key(traces, scenarios), len(scenarios))
    assert len(saved) == 3 * chunk
    # a torn last line (the process died while writing it) is ignored
    with open(ck, "a", encoding="utf-8") as fh:
        fh.write('{"first": 0, "rows": [{"tra')

    computed = []
    rows = run_sweep(traces, scenarios, client, chunk_size=chunk, checkpoint_path=ck,
                     on_chunk=lambda done, total: computed.append(total))
    assert len(computed) == n_chunks - 3  # only the missing chunks ran
    assert same_rows(rows, local_rows)
    assert not ck.exists()


def test_checkpoint_of_another_sweep_is_not_reused(client, traces, scenarios, local_rows, tmp_path):
    ck = tmp_path / "metrics.csv.partial.jsonl"
    other = scenarios[:128]
    with pytest.raises(Interrupt):
        run_sweep(traces, [s for s in reversed(other)], client, chunk_size=32, checkpoint_path=ck,
                  on_chunk=lambda done, total: (_ for _ in ()).throw(Interrupt()))
    assert json.loads(ck.read_text().splitlines()[0])["sweep"] != sweep_key(traces, other)
    computed = []
    rows = run_sweep(traces, other, client, chunk_size=32, checkpoint_path=ck,
                     on_chunk=lambda done, total: computed.append(done))
    assert len(computed) == 4  # every chunk ran again
    assert same_rows(rows, local_rows[:128])


def test_bad_scenarios_fail_before_any_cluster_work(traces, scenarios, tmp_path):
    from decodesched.batch import Scenario

    with pytest.raises(UserError, match="scenario 1: unknown policy"):
        run_sweep(traces, [scenarios[0], Scenario(0, "lifo", 10, 4)], "tcp://127.0.0.1:1", chunk_size=4)
    with pytest.raises(UserError, match="trace index 5"):
        run_sweep(traces, [Scenario(5, "fcfs", 10, 4)], "tcp://127.0.0.1:1", chunk_size=4)
    with pytest.raises(UserError, match="chunk size"):
        run_sweep(traces, scenarios, "tcp://127.0.0.1:1", chunk_size=0)
    with pytest.raises(UserError, match="progress must be True or False or None, got 1"):
        run_sweep(traces, scenarios, "tcp://127.0.0.1:1", chunk_size=4, progress=1)


def test_without_dask_says_how_to_install(traces, scenarios, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    with pytest.raises(UserError, match=r"pip install 'decodesched\[dask\]'"):
        run_sweep(traces, scenarios[:4], "local", chunk_size=4)


def test_sweep_command_on_dask_matches_local(traces, tmp_path, capsys, monkeypatch):
    from decodesched.cli import main

    paths = []
    for t in traces:
        paths.append(str(tmp_path / f"{t.name}.csv"))
        t.to_csv(paths[-1])
    grid_args = ["--policy", ",".join(POLICIES), "--kv-blocks", "40,90,200", "--aging-interval", "2,8"]
    assert main(["sweep", *paths, *grid_args, "--out", str(tmp_path / "local.csv")]) == 0
    local_out = capsys.readouterr().out
    assert main(["sweep", *paths, *grid_args, "--dask", "local", "--chunk-size", "5",
                 "--out", str(tmp_path / "dask.csv")]) == 0
    dask_out = capsys.readouterr().out
    assert (tmp_path / "dask.csv").read_bytes() == (tmp_path / "local.csv").read_bytes()
    assert local_out.splitlines()[:-1] == dask_out.splitlines()[:-1]  # the same table
    assert "Dask at local" in dask_out.splitlines()[-1]
    assert not (tmp_path / "dask.csv.partial.jsonl").exists()

    monkeypatch.setitem(sys.modules, "distributed", None)
    assert main(["sweep", *paths, *grid_args, "--dask", "local", "--out", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'decodesched[dask]'" in err and err.count("\n") == 1
    assert not (tmp_path / "x.csv").exists()


def test_unreachable_scheduler_is_a_user_error():
    from decodesched.distributed import connect

    with pytest.raises(UserError, match="cannot reach the Dask scheduler"):
        with connect("tcp://127.0.0.1:9", timeout=1):
            pass


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:{port}", "127.0.0.1:{port}", "tcp://127.0.0.1:1"])
def test_a_closed_port_fails_at_once_without_waiting_for_dask_s_timeout(address, monkeypatch):
    """Nothing listening at the address: Dask's client retried the refused connection for its whole
    30 s timeout.  A plain TCP connection is tried first; refused, it is one line naming the address."""
    from decodesched.distributed import connect

    address = address.format(port=_free_port())

    def no_client(*args, **kwargs):
        raise AssertionError("Dask's client was asked to connect")

    monkeypatch.setattr(distributed, "Client", no_client)
    start = time.monotonic()
    with pytest.raises(UserError, match="cannot reach the Dask scheduler at") as info:
        with connect(address):  # (the default 30 s timeout)
            pass
    assert address in str(info.value) and "refused" in str(info.value) and "\n" not in str(info.value)
    assert time.monotonic() - start < 20


@pytest.mark.parametrize("address, why", [("tcp://127.0.0.1:99999", "not a TCP port"),
                                          ("tcp://no-such-host.invalid:8786", "unknown host")])
def test_an_address_that_cannot_be_connected_to_is_one_line(address, why, monkeypatch):
    from decodesched.distributed import connect

    monkeypatch.setattr(distributed, "Client", lambda *a, **k: pytest.fail("Dask's client was asked to connect"))
    with pytest.raises(UserError, match=why) as info:
        with connect(address):
            pass
    assert address in str(info.value)


def test_sweep_with_a_closed_scheduler_port_exits_2_at_once_and_writes_nothing(traces, tmp_path, capsys):
    from decodesched.cli import main

    traces[0].to_csv(tmp_path / "t.csv")
    before = sorted(p.name for p in tmp_path.iterdir())
    start = time.monotonic()
    assert main(["sweep", str(tmp_path / "t.csv"), "--policy", "fcfs", "--kv-blocks", "40,90",
                 "--dask", "tcp://127.0.0.1:1", "--out", str(tmp_path / "m.csv")]) == 2
    assert time.monotonic() - start < 20  # (it waited 30 s)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tcp://127.0.0.1:1" in err and "refused" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("answer", [b"\xff" * 64, b"HTTP/1.1 400 Bad Request\r\n\r\n" * 4, b""])
def test_a_peer_that_is_not_a_scheduler_is_a_user_error(answer):
    # Something else listening at the address (a web server, a proxy) answers bytes that Dask's
    # handshake decodes as anything: 'HTTP/1.1' read as a frame length asked NumPy for 3 EiB, and the
    # sweep ended with a MemoryError traceback.
    import socket
    import threading

    from decodesched.distributed import connect

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve():  # every connection (the reachability probe's, then Dask's) gets the answer
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                with conn, contextlib.suppress(OSError):
                    conn.sendall(answer)
                    time.sleep(0.5)

    server_thread = threading.Thread(target=serve, daemon=True)
    server_thread.start()
    try:
        with pytest.raises(UserError, match=f"127.0.0.1:{server.getsockname()[1]}") as info:
            with connect(f"tcp://127.0.0.1:{server.getsockname()[1]}", timeout=3):
                pass
        assert "\n" not in str(info.value)
    finally:
        server.close()
        server_thread.join(timeout=5)


def test_chunk_failing_past_retries_is_a_user_error_and_keeps_the_checkpoint(client, traces, scenarios, tmp_path):
    from decodesched.distributed import _run_chunk

    ck = tmp_path / "m.csv.partial.jsonl"
    attempts = []

    def fail_at_scenario_64(trace_list, chunk, first, threads):  # runs on the workers (pickled by value)
        if first == 64:
            raise RuntimeError("boom on the worker")
        return _run_chunk(trace_list, chunk, first, threads)

    with pytest.raises(UserError, match=r"RuntimeError: boom on the worker; the \d+ finished scenarios are saved "
                                        r"in .*m.csv.partial.jsonl, rerun the same sweep to resume"):
        run_sweep(traces, scenarios[:128], client, chunk_size=32, checkpoint_path=ck, retries=1,
                  chunk_function=fail_at_scenario_64, on_chunk=lambda d, t: attempts.append(d))
    saved = read_checkpoint(ck, sweep_key(traces, scenarios[:128]), 128)
    assert 64 not in saved and len(saved) == 32 * len(attempts)
    rows = run_sweep(traces, scenarios[:128], client, chunk_size=32, checkpoint_path=ck)
    assert same_rows(rows, simulate_batch(traces, scenarios[:128]).rows())


def test_user_policy_runs_on_dask_by_its_import_spec(client, traces, tmp_path):
    """A user Policy travels to the workers as the module:attr it was resolved from (compiled functions
    do not pickle) and gives the local rows; one built in __main__-like code is a one-line UserError."""
    import pickle

    import numba

    from decodesched import Policy
    from decodesched.policy import builtin, resolve_policy

    from oracle import write_sjf_module

    write_sjf_module(tmp_path / "dask_policies.py", "dask_sjf")
    sjf = resolve_policy(f"{tmp_path / 'dask_policies.py'}:SJF")
    assert pickle.loads(pickle.dumps(sjf)) is sjf  # same process: the same object, by its spec
    aging = pickle.loads(pickle.dumps(builtin("aging", aging_interval=3)))
    assert aging.is_builtin and aging.name == "aging" and aging._interval == 3
    scenarios = grid(traces, [sjf, "fcfs"], [60, 200], [4])
    rows = run_sweep(traces, scenarios, client, chunk_size=2)
    assert same_rows(rows, simulate_batch(traces, scenarios).rows())
    assert {r["policy"] for r in rows} == {"dask_sjf", "fcfs"}

    @numba.njit
    def local_key(r, clock):
        return (r.prompt_len,)

    @numba.njit
    def local_priority(r, clock):
        return r.priority

    here = Policy("nowhere", key=local_key, effective_priority=local_priority)
    with pytest.raises(UserError, match="cannot be sent to another process") as info:
        run_sweep(traces, grid(traces, [here], [60], [4]), client)
    assert "\n" not in str(info.value)


def test_threads_below_one_are_refused_before_any_cluster_work(traces, scenarios):
    """The workers clamped ``threads=0`` (or -1) to 1, so a bad value passed unreported."""
    for threads in (0, -1, 1.5, True):
        with pytest.raises(UserError, match="threads must be a positive integer"):
            run_sweep(traces, scenarios[:4], "tcp://127.0.0.1:9", threads=threads)


def test_quiet_dask_logs_keeps_dask_records_off_stderr(capfd):
    import logging

    from decodesched.distributed import quiet_dask_logs

    client_log = logging.getLogger("distributed.client")
    level = client_log.level
    with quiet_dask_logs():
        client_log.error("Failed to reconnect to scheduler after 30.00 seconds, closing client")
        logging.getLogger("distributed.worker.state_machine").warning("Async instruction failed")
    assert "Failed to reconnect" not in capfd.readouterr().err
    assert client_log.level == level  # restored


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, process, seconds: float = 120) -> None:
    import socket

    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            return
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.1)


def test_a_lost_scheduler_is_one_line_on_stderr(tmp_path):
    """`kill -9` of the scheduler mid-sweep: Dask's client logged about 35 lines of tracebacks
    (ConnectionRefusedError, CommClosedError, CancelledError) before the sweep's one-line error."""
    import subprocess

    raw = cv.read_azure(cv.bundled_trace_path()).head(400)
    paths = []
    for load in (0.9, 1.1):
        paths.append(f"b{load}.csv")
        cv.to_trace(raw, load=load, name=f"b{load}").to_csv(tmp_path / paths[-1])
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    scheduler = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                  "--port", str(port), "--dashboard-address", ":0"], **quiet)
    worker = sweep = None
    try:
        _wait_for_port(port, scheduler)  # (a refused port is an error at once, not waited for)
        worker = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
                                   "--no-nanny"], **quiet)
        out = tmp_path / "d.csv"
        partial = tmp_path / "d.csv.partial.jsonl"
        sweep = subprocess.Popen(
            [sys.executable, "-m", "decodesched.cli", "sweep", *paths, "--policy", ",".join(POLICIES),
             "--kv-blocks", ",".join(str(c) for c in range(100, 1060, 10)), "--aging-interval", "1,4,16",
             "--dask", address, "--chunk-size", "1", "--out", out.name],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        for _ in range(1200):  # until two chunks are saved
            if partial.exists() and len(partial.read_text().splitlines()) >= 3 or sweep.poll() is not None:
                break
            time.sleep(0.05)
        scheduler.kill()
        _, err = sweep.communicate(timeout=120)
        assert sweep.returncode == 2, err
        assert err.count("\n") == 1 and "failed on the cluster" in err and "saved in" in err, err
        assert not out.exists() and partial.exists()
    finally:
        for proc in (sweep, worker, scheduler):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
