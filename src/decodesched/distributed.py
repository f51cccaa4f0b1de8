"""Sweeps on a Dask cluster: the same rows as a local `simulate_batch`, computed in chunks on workers.

``decodesched sweep ... --dask tcp://HOST:PORT`` (an existing scheduler) or ``--dask local`` (a
`LocalCluster` of two worker processes on 127.0.0.1) calls `run_sweep`:

1. every trace is scattered once to every worker (``broadcast=True``), so a chunk ships only its
   scenarios;
2. the scenarios are cut into chunks of ``chunk_size`` (consecutive in grid order); each chunk is one
   task that runs `decodesched.batch.simulate_batch` on a worker (no event log) and returns its rows;
3. chunks are gathered as they complete.  A worker that dies mid-sweep costs only the chunks it was
   running: the scheduler reschedules them on the remaining (or restarted) workers, and a chunk that
   raises is retried ``retries`` times; once every worker that held the traces died, the chunks left are
   sent again with the traces (`_Run.round`).  A worker runs a chunk only with the client's decodesched
   and user policies' code (`_on_worker`), and a policy that raises is one line naming its scenario;
4. with a ``checkpoint_path``, each finished chunk's rows are appended to a JSON-lines checkpoint
   (`decodesched.checkpoint`, the same file a local sweep writes): a rerun of the *same* sweep (after
   Ctrl-C, a lost scheduler, a crash) computes only the scenarios not yet saved, while a different
   sweep starts afresh.  The file is removed once the sweep completes (with ``keep_checkpoint=True``
   the caller removes it, `decodesched.checkpoint.finish`, once the rows are written).

The rows come back in scenario order, identical to ``simulate_batch(traces, scenarios).rows()``.
Dask is optional: ``pip install 'decodesched[dask]'``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import numbers
import os
import pickle
import sys
from typing import Callable, Sequence

from .batch import ScenarioError, _user_policy, progress_bar
from .checkpoint import prepare, read_checkpoint, recording, sweep_key  # noqa: F401 (read_checkpoint, sweep_key: re-exported)
from .checkpoint import code_digest, shared_names
from .engine import check_flag
from .errors import UserError

INSTALL_HINT = "pip install 'decodesched[dask]'"
DEFAULT_CHUNK_SIZE = 64
PROBE_SECONDS = 5.0  # a scheduler that does not accept a TCP connection within this is taken as unreachable
_TCP_SCHEMES = ("tcp", "tls", "ws", "wss")  # (Dask's schemes over plain TCP; others, such as ucx, are not probed)


def _import_dask():
    try:
        import distributed
    except ImportError:
        raise UserError(f"--dask needs Dask's distributed scheduler, which is not installed; {INSTALL_HINT}") from None
    return distributed


def _run_chunk(traces, scenarios, first, threads):
    """On a worker: one chunk of scenarios; returns ``(first, rows)``."""
    from .batch import simulate_batch
    from .checkpoint import _chunk_traces

    if threads is not None:  # at most what this worker's Numba allows
        import numba

        threads = max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS))
    # What a user policy prints goes to stderr: a local cluster's workers share the client's standard output,
    # which may be the CSV (`sweep --out -`).
    with contextlib.redirect_stdout(sys.stderr):
        batch = simulate_batch(*_chunk_traces(traces, scenarios), record_events=False, threads=threads)
    return first, batch.rows()  # (their "trace" labels, of the chunk's traces, are replaced with the sweep's)


def _on_worker(task, code, fingerprints, traces, scenarios, first, threads):
    """On a worker: `task` (`_run_chunk`, or a run's ``chunk_function``), once this worker's decodesched is the
    client's (`checkpoint.code_digest`) and its user policies are the client's (`fingerprints`, by name;
    `policy.same_code`): a worker of another version (another install, an edited checkout), or one holding a policy
    file as it was before an edit, would give rows of other code, mixed into the table unseen.  A refusal is a
    `UserError` naming the worker or the policy."""
    import dataclasses

    from .policy import same_code

    if code_digest() != code:
        import decodesched

        try:
            where = f" {_import_dask().get_worker().address}"
        except ValueError:  # (not in a worker: a test's own call)
            where = ""
        raise UserError(f"the Dask worker{where} runs another decodesched (version {decodesched.__version__}, "
                        f"code {code_digest()[:12]}) than this sweep's (code {code[:12]}); install the same "
                        "decodesched on every worker and the client")
    checked = {}
    for sc in scenarios:
        if _user_policy(sc.policy) and sc.policy.name in fingerprints and id(sc.policy) not in checked:
            checked[id(sc.policy)] = same_code(sc.policy, fingerprints[sc.policy.name])
    scenarios = [dataclasses.replace(sc, policy=checked[id(sc.policy)]) if id(sc.policy) in checked else sc
                 for sc in scenarios]
    return task(traces, scenarios, first, threads)


# Loggers that print on stderr while a cluster fails (a lost scheduler: tracebacks of
# ConnectionRefusedError, CommClosedError, CancelledError), or retries on its own (a lost worker).
_DASK_LOGGERS = ("distributed", "tornado", "asyncio")


@contextlib.contextmanager
def quiet_dask_logs():
    """Inside this block Dask's own log records below CRITICAL are dropped (in this process): what a
    failure means reaches the user as one `UserError` line instead.  Levels are restored on exit."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name.split(".")[0] in _DASK_LOGGERS and isinstance(logging.root.manager.loggerDict[name],
                                                                      logging.Logger)]
    loggers += [logging.getLogger(name) for name in _DASK_LOGGERS]
    before = {id(lg): (lg, lg.level) for lg in loggers}
    for lg, _ in before.values():
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in before.values():
            lg.setLevel(level)


@contextlib.contextmanager
def connect(address: str, *, n_workers: int = 2, timeout: float = 30, quiet: bool = False):
    """A `distributed.Client` for ``address``: ``"local"`` starts a `LocalCluster` of `n_workers`
    single-threaded worker processes on 127.0.0.1 (shut down on exit); anything else is a scheduler
    address such as ``tcp://10.0.0.5:8786``.  `quiet`: the local cluster's processes log only
    CRITICAL records (`quiet_dask_logs` does it for this process)."""
    distributed = _import_dask()
    if not isinstance(address, str) or not address:
        raise UserError(f"--dask needs a scheduler address (tcp://HOST:PORT) or 'local', got {address!r}")
    if address == "local":
        # (no NUMBA_NUM_THREADS in the workers' environment: Dask sets it after the worker imported Numba,
        # whose next compile then reloads its config and fails once its threads run; `local_threads`)
        cluster = distributed.LocalCluster(n_workers=n_workers, processes=True, threads_per_worker=1,
                                           host="127.0.0.1", dashboard_address=":0",
                                           **({"silence_logs": logging.CRITICAL} if quiet else {}))
        try:
            with distributed.Client(cluster) as client:
                yield client
        finally:
            cluster.close()
        return
    probe(address, min(timeout, PROBE_SECONDS), timeout)
    try:
        client = distributed.Client(address, timeout=timeout)
    except (OSError, TimeoutError, ValueError) as exc:
        raise UserError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - something else listens there: its bytes decode as anything
        raise UserError(f"{address} did not answer as a Dask scheduler ({type(exc).__name__} while "
                        "reading its handshake)") from None
    try:
        yield client
    finally:
        client.close()


def local_threads(n_workers: int = 2) -> int:
    """Numba threads per chunk on a ``"local"`` cluster's workers: the cores shared out, so that the
    workers do not oversubscribe them."""
    return max(1, (os.cpu_count() or 1) // n_workers)


def probe(address: str, seconds: float = PROBE_SECONDS, handshake_seconds: float = 30) -> None:
    """Fail fast where nothing listens: a plain TCP connection to a scheduler address (``tcp://HOST:PORT``,
    ``HOST:PORT``, ``tls://``, ``ws://``, ``wss://``), closed at once.  Dask's own client retries a refused
    connection until its whole timeout (30 s) has passed; here a refused port answers at once, and a host
    that does not answer within `seconds` is given up.  On ``tcp://`` a Dask server speaks first (its
    handshake); a peer silent for `handshake_seconds` is another server waiting for its client to speak (the
    dashboard's HTTP port, a database), where Dask's client would wait for the handshake forever.  Raises
    `UserError` naming the address; an address this cannot read, or of another scheme, is left to Dask."""
    import socket

    try:
        from distributed.comm.addressing import parse_address, parse_host_port

        scheme, location = parse_address(address)
    except Exception:  # noqa: BLE001 - Dask's own parsing says what is wrong with it, or takes it
        return
    if scheme == "inproc" and not _inproc_listening(location):
        raise UserError(f"no Dask scheduler at {address} in this process (an inproc:// scheduler is reached only "
                        "from the process that runs it); give tcp://HOST:PORT or 'local'")
    if scheme == "ucx" and importlib.util.find_spec("ucp") is None:
        raise UserError(f"{address}: ucx:// needs Dask's UCX support (ucx-py), which is not installed; "
                        "give tcp://HOST:PORT or 'local'")
    if scheme not in _TCP_SCHEMES:
        return
    try:
        host, port = parse_host_port(location)
    except ValueError as exc:  # (without a port Dask tries port 0 of a ws:// host until its timeout)
        why = f"give its port, as in {scheme}://HOST:8786" if "missing port" in str(exc) else str(exc)
        raise UserError(f"cannot reach the Dask scheduler at {address}: {why}") from None
    if not host:
        return
    if not 0 < port < 65536:
        raise UserError(f"cannot reach the Dask scheduler at {address}: port {port} is not a TCP port (1-65535)")
    why = None
    try:
        with socket.create_connection((host, port), timeout=seconds) as sock:
            if scheme == "tcp" and not _speaks_first(sock, handshake_seconds):
                raise UserError(f"{address} did not answer as a Dask scheduler (no handshake within "
                                f"{handshake_seconds:g} s: another server listens there, such as the dashboard's "
                                "HTTP port; give the scheduler's port, 8786 by default)")
    except ConnectionRefusedError:
        why = "connection refused (is a scheduler running there?)"
    except socket.gaierror as exc:
        why = f"unknown host {host!r} ({exc.strerror or exc})"
    except (socket.timeout, TimeoutError):
        why = f"no answer within {seconds:g} s"
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
    if why is not None:
        raise UserError(f"cannot reach the Dask scheduler at {address}: {why}")


def _speaks_first(sock, seconds: float) -> bool:
    """Whether the peer of the connected `sock` sends a byte (or closes) within `seconds` without being spoken to."""
    import socket

    sock.settimeout(seconds)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except (socket.timeout, TimeoutError):
        return False
    except OSError:  # (reset: Dask's own connection says what is wrong)
        pass
    return True


def _inproc_listening(location: str) -> bool:
    """Whether this process runs a Dask listener at inproc://`location` (a ``LocalCluster(processes=False)``)."""
    from distributed.comm import inproc

    try:
        return inproc.global_manager.get_listener_for(location) is not None
    except Exception:  # noqa: BLE001 - not an address of this process: Dask's validation says so
        return False


def run_sweep(traces, scenarios: Sequence, address, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
              checkpoint_path=None, progress: bool | None = False, threads: int | None = None,
              retries: int = 2, on_chunk: Callable[[int, int], None] | None = None,
              chunk_function: Callable | None = None, keep_checkpoint: bool = False,
              quiet: bool = False) -> list[dict]:
    """Run `scenarios` over `traces` on a Dask cluster; return the rows of ``simulate_batch(...).rows()``.

    `address`: ``"local"``, a scheduler address, or an existing `distributed.Client`.
    `traces`: anything `simulate_batch` accepts.  `threads`: Numba threads per chunk on the workers
    (default: the workers' Numba setting; on ``"local"``, the cores shared out, `local_threads`).
    `on_chunk(done, total)` is called on the client after each chunk computed in this run (not for
    rows resumed from the checkpoint); an exception it
    raises stops the sweep, keeping the checkpoint.  `chunk_function(traces, scenarios, first,
    threads) -> (first, rows)` replaces the task run on the workers (for tests and instrumentation).
    A chunk that still fails after `retries` raises `UserError` (finished chunks stay in the
    checkpoint).  The checkpoint is removed at the end, unless `keep_checkpoint` (the caller then
    calls `decodesched.checkpoint.finish` once it has written the rows).  `quiet`: Dask's own log
    records (tracebacks of a lost scheduler, a retried chunk) are not shown (`quiet_dask_logs`); the
    `UserError` says what failed.
    """
    from .batch import trace_labels

    _import_dask()
    # Validate everything here, before any cluster work (the same checks as a local run).
    progress = check_flag("progress", progress, none=True)
    keep_checkpoint, quiet = check_flag("keep_checkpoint", keep_checkpoint), check_flag("quiet", quiet)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 1):
        raise UserError(f"threads must be a positive integer (Numba threads per chunk on a worker), got {threads!r}")
    if isinstance(retries, bool) or not isinstance(retries, numbers.Integral) or retries < 0:
        raise UserError(f"retries must be an integer >= 0 (Dask's retries of a failed chunk), got {retries!r}")
    with contextlib.ExitStack() as stack:  # (the checkpoint's lock, `checkpoint.held`)
        traces, scenarios, key, done = prepare(traces, scenarios, chunk_size, checkpoint_path, stack)
        chunk_size, retries = int(chunk_size), int(retries)  # (checked; a NumPy int8 would wrap around in the bounds)
        if threads is None and isinstance(address, str) and address == "local":
            threads = local_threads()
        for policy in {id(sc.policy): sc.policy for sc in scenarios if not isinstance(sc.policy, str)}.values():
            try:
                pickle.dumps(policy)  # a user policy travels by its module:attr (`Policy.__reduce__`)
            except TypeError as exc:
                raise UserError(str(exc)) from None

        n = len(scenarios)
        todo = [i for i in range(n) if i not in done]
        chunks = []  # (first index, scenarios) over runs of consecutive missing indices
        run_start = 0
        while run_start < len(todo):
            run_end = run_start
            while run_end + 1 < len(todo) and todo[run_end + 1] == todo[run_end] + 1:
                run_end += 1
            lo, hi = todo[run_start], todo[run_end] + 1
            chunks += [(a, scenarios[a:min(a + chunk_size, hi)]) for a in range(lo, hi, chunk_size)]
            run_start = run_end + 1

        labels = trace_labels(traces, scenarios)  # of the whole sweep: a chunk alone may label its traces otherwise
        with recording(checkpoint_path, key, n, done, keep_checkpoint) as checkpoint:
            if chunks:
                with quiet_dask_logs() if quiet else contextlib.nullcontext():
                    _compute(traces, chunks, address, done, checkpoint, progress, threads, retries, on_chunk, n,
                             chunk_function or _run_chunk, [labels[s.trace] for s in scenarios], quiet)
        return [done[i] for i in range(n)]


def _compute(traces, chunks, address, done, checkpoint, progress, threads, retries, on_chunk, n, task,
             labels, quiet=False) -> None:
    distributed = _import_dask()
    if isinstance(address, distributed.Client):
        ctx = contextlib.nullcontext(address)
    else:
        ctx = connect(address, quiet=quiet)
    with ctx as client:
        run = _Run(client, traces, chunks, done, checkpoint, threads, retries, on_chunk, task, labels)
        with progress_bar(n, "sweep", progress) as bar:
            bar.advance(len(done))
            pending = chunks
            for attempt in range(LOST_TRACES_ROUNDS + 1):
                pending = run.round(pending, bar, last=attempt == LOST_TRACES_ROUNDS)
                if not pending:
                    return


# Rounds in which chunks whose traces were lost (every worker that held them died) are sent again with the traces.
LOST_TRACES_ROUNDS = 3


class _Run:
    """One `run_sweep` on a client: the chunks submitted in rounds (`round`)."""

    def __init__(self, client, traces, chunks, done, checkpoint, threads, retries, on_chunk, task, labels):
        self.client, self.traces, self.done, self.checkpoint = client, traces, done, checkpoint
        self.threads, self.retries, self.on_chunk, self.task, self.labels = threads, retries, on_chunk, task, labels
        self.total, self.completed = len(chunks), 0
        self.code = code_digest()
        policies = {id(sc.policy): sc.policy for _, chunk in chunks for sc in chunk if _user_policy(sc.policy)}
        self.fingerprints = {p.name: p.fingerprint() for p in policies.values()}  # (one name, one policy)

    def round(self, chunks, bar, last: bool) -> list:
        """Scatter the traces to every worker and run `chunks`; the chunks whose traces were lost meanwhile: a
        worker that dies is restarted without the traces scattered before, so once every worker that held them died
        Dask cancels the chunks that need them ("already forgotten").  Sent again with the traces, they cost only
        their work.  Any other failure (and a loss in the `last` round) is a `UserError`."""
        distributed = _import_dask()
        client = self.client
        # hash=False: keys of this run only, so releasing them never touches another run's data
        try:
            trace_futures = client.scatter(self.traces, broadcast=True, hash=False)
        except Exception as exc:  # (the cluster went away since the last round)
            self._fail(exc, 0)
        futures = {client.submit(_on_worker, self.task, self.code, self.fingerprints, trace_futures, chunk, first,
                                 self.threads, retries=self.retries, pure=False): (first, chunk)
                   for first, chunk in chunks}
        lost = []
        try:
            for fut in distributed.as_completed(list(futures)):
                try:
                    first, rows = fut.result()
                except distributed.client.FutureCancelledError as exc:
                    if last or client.status != "running":
                        self._fail(exc, futures[fut][0])
                    lost.append(futures[fut])
                    continue
                except Exception as exc:  # a chunk failed past its retries, or the cluster went away
                    self._fail(exc, futures[fut][0])
                self._save(first, rows, bar)
        finally:
            for fut in futures:
                fut.cancel()
            del trace_futures  # released once no chunk needs them
        return sorted(lost, key=lambda c: c[0])

    def _save(self, first, rows, bar) -> None:
        rows = [shared_names(row) for row in rows]
        for i, row in enumerate(rows):
            row["trace"] = self.labels[first + i]
            self.done[first + i] = row
        if self.checkpoint is not None:
            self.checkpoint.add(range(first, first + len(rows)), rows)
        self.completed += 1
        bar.advance(len(rows))
        if self.on_chunk is not None:
            self.on_chunk(self.completed, self.total)

    def _fail(self, exc: Exception, first: int):
        saved = f"; the {len(self.done)} finished scenarios are saved in {self.checkpoint.path}, rerun the same " \
                "sweep to resume" if self.checkpoint is not None and self.done else ""
        if isinstance(exc, ScenarioError):  # (a user policy raised: which scenario of the sweep)
            raise UserError(f"{exc.in_sweep(first + exc.index)}{saved}") from exc
        if isinstance(exc, UserError):  # (a worker of another version, a policy edited since)
            raise UserError(f"{str(exc).splitlines()[0]}{saved}") from exc
        raise UserError(f"a chunk of the sweep failed on the cluster: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}{saved}") from exc
