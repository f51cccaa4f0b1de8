"""Scheduler addresses that cannot work are refused at once, in one line, before Dask's 30 s timeout:
an inproc:// address that no scheduler of this process listens at, a TCP-scheme address without a
port (ws:// without one waited the whole timeout), and ucx:// without UCX support.  An in-process
cluster (``LocalCluster(processes=False)``, an inproc:// address) still runs a sweep from the API."""

from __future__ import annotations

import importlib.util

import pytest

distributed = pytest.importorskip("distributed")

from decodesched import convert as cv  # noqa: E402
from decodesched.batch import grid, simulate_batch, write_metrics_csv  # noqa: E402
from decodesched.distributed import connect, run_sweep  # noqa: E402
from decodesched.errors import UserError  # noqa: E402


@pytest.fixture
def no_client(monkeypatch):
    monkeypatch.setattr(distributed, "Client", lambda *a, **k: pytest.fail("Dask's client was asked to connect"))


@pytest.mark.parametrize("address, why", [
    ("inproc://10.0.0.1/123/1", "no Dask scheduler at inproc://10.0.0.1/123/1 in this process"),
    ("ws://127.0.0.1", "give its port, as in ws://HOST:8786"),
    ("wss://example.invalid", "give its port, as in wss://HOST:8786"),
    ("tcp://127.0.0.1", "give its port, as in tcp://HOST:8786"),
    ("tcp://[::1", "ipv6 needs brackets"),
])
def test_an_address_that_cannot_work_is_one_line_without_asking_dask(address, why, no_client):
    with pytest.raises(UserError) as info:
        with connect(address):
            pass
    assert why in str(info.value) and "\n" not in str(info.value)


@pytest.mark.skipif(importlib.util.find_spec("ucp") is not None, reason="UCX support is installed")
def test_ucx_without_ucx_support_names_what_is_missing(no_client):
    with pytest.raises(UserError, match=r"ucx:// needs Dask's UCX support \(ucx-py\)"):
        with connect("ucx://127.0.0.1:8786"):
            pass


def test_an_in_process_cluster_runs_a_sweep_from_the_api(tmp_path):
    trace = cv.to_trace(cv.read_azure(cv.bundled_trace_path()).head(16), load=1.2, name="t")
    scenarios = grid([trace], ["fcfs", "aging"], [40, 90], [2])
    with distributed.LocalCluster(n_workers=1, processes=False, threads_per_worker=1,
                                  dashboard_address=":0") as cluster:
        assert cluster.scheduler_address.startswith("inproc://")
        rows = run_sweep([trace], scenarios, cluster.scheduler_address, chunk_size=2)
    write_metrics_csv(rows, tmp_path / "dask.csv")
    write_metrics_csv(simulate_batch([trace], scenarios).rows(), tmp_path / "local.csv")
    assert (tmp_path / "dask.csv").read_bytes() == (tmp_path / "local.csv").read_bytes()
