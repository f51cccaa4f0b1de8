"""The events and requests tables on disk under pressure: random traces at the edges (ids at the int64 limits,
steps near 2**53, empty and one-row tables, requests that never arrived, deadlines absent and present) read back
from CSV and Parquet, written by `simulate --events/--requests` and by the API, equal to each other and to the
result in memory, across chunk boundaries; and hostile output paths and signals that leave nothing half-written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import traces, wide_configs

import decodesched
from decodesched import frames, tables_io
from decodesched.cli import main
from decodesched.errors import UserError

pq = pytest.importorskip("pyarrow.parquet")

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
LATE = 2**53 - 64  # arrivals shifted here put every step within a few dozen of 2**53
STEP_COLUMNS = ("first_step", "first_token_step", "finish_step")


@st.composite
def edge_traces(draw):
    """`oracle.traces` (priorities up to +-2**53 in half), then (sometimes) the int64 extremes as ids and every
    arrival shifted near 2**53 (a deadline past 2**53, the largest allowed, is dropped)."""
    rows = draw(traces(max_requests=10, wide_priorities=draw(st.booleans())))
    if draw(st.booleans()):
        rows[0]["request_id"] = INT64_MIN
        if len(rows) > 1:
            rows[-1]["request_id"] = INT64_MAX
        if len({r["request_id"] for r in rows}) < len(rows):  # a drawn id met an extreme: renumber the middle
            for i, r in enumerate(rows[1:-1]):
                r["request_id"] = i
    if draw(st.booleans()):
        for r in rows:
            r["arrival_step"] += LATE
            if r["deadline_step"] is not None:
                r["deadline_step"] += LATE
                if r["deadline_step"] > 2**53:
                    r["deadline_step"] = None
    return rows


def _nullable(table, name, missing, values):
    got = table[name]
    assert np.array_equal(np.ma.getmaskarray(got), missing), name
    assert np.array_equal(np.asarray(got)[~missing], np.asarray(values)[~missing]), name


def assert_events_are(events, result):
    """The events table read back holds exactly the result's event log."""
    assert list(events) == [n for n, _ in tables_io.EVENT_SCHEMA]
    mem = result.events
    for name, _ in tables_io.EVENT_SCHEMA:
        if name == "preempted_request_id":
            _nullable(events, name, ~mem["has_victim"], mem[name])
        else:
            assert events[name].tolist() == mem[name].tolist(), name


def assert_requests_are(requests, result):
    """The requests table read back holds exactly the result's per-request table."""
    req = result.requests
    assert list(requests) == [n for n, _ in tables_io.REQUEST_SCHEMA]
    for name, kind in tables_io.REQUEST_SCHEMA:
        if name in STEP_COLUMNS:
            _nullable(requests, name, req[name] < 0, req[name])
        elif name == "deadline_step":
            deadline = np.where(req["has_deadline"], req[name], 0).astype(np.int64)
            _nullable(requests, name, ~req["has_deadline"], deadline)
        elif name == "deadline_met":
            _nullable(requests, name, ~req["has_deadline"], req[name])
        elif kind == "float?":
            assert np.array_equal(requests[name], req[name].astype(np.float64), equal_nan=True), name
        else:
            assert requests[name].tolist() == req[name].tolist(), name


def write_all(result, folder, trace_path, config) -> dict:
    """Both tables in both formats, by the API and by `simulate` (and the events by `frames.to_parquet`):
    {(how, table, format): the table read back}."""
    policy, capacity, interval, max_steps = config
    got = {}
    for fmt in ("csv", "parquet"):
        result.write_events(folder / f"api_ev.{fmt}")
        result.write_requests(folder / f"api_rq.{fmt}")
        argv = ["simulate", str(trace_path), "--policy", policy, "--kv-blocks", str(capacity), "--aging-interval",
                str(interval), "--events", str(folder / f"cli_ev.{fmt}"), "--requests", str(folder / f"cli_rq.{fmt}")]
        assert main(argv + ([] if max_steps is None else ["--max-steps", str(max_steps)])) == 0
        for how in ("api", "cli"):
            for table in ("ev", "rq"):
                got[how, table, fmt] = tables_io.read_table(folder / f"{how}_{table}.{fmt}")
    frames.to_parquet(result, folder / "frames_ev.parquet", "events")  # (its requests table has more columns)
    got["frames", "ev", "parquet"] = tables_io.read_table(folder / "frames_ev.parquet")
    return got


@settings(max_examples=60, deadline=None)
@given(rows=edge_traces(), config=wide_configs)
def test_tables_on_disk_are_the_result_in_every_format_and_way(tmp_path_factory, rows, config):
    """Every way of writing a table gives the same table, which is the result in memory: every dtype, ids at the
    int64 limits, steps near 2**53, capacities up to 2**61, empty logs (max_steps 0), requests that never arrived
    (a small max_steps), deadlines absent and present, victims and none."""
    folder = tmp_path_factory.mktemp("tables")
    trace = decodesched.load_trace(rows)
    trace.to_csv(folder / "trace.csv")
    policy, capacity, interval, max_steps = config
    result = decodesched.simulate(trace, policy, capacity, interval, max_steps)
    got = write_all(result, folder, folder / "trace.csv", config)
    for key, table in got.items():
        assert tables_io.tables_equal(table, got["api", key[1], "csv"]), key
    for fmt in ("csv", "parquet"):
        assert_events_are(got["cli", "ev", fmt], result)
        assert_requests_are(got["cli", "rq", fmt], result)


def long_trace(n: int):
    """`n` requests of 4 tokens each, all at step 0 with room for all: 5 * n events, one a step."""
    return decodesched.load_trace({"request_id": np.arange(n) - 2, "arrival_step": np.zeros(n, np.int64),
                                   "prompt_len": np.full(n, 3), "max_new_tokens": np.full(n, 4),
                                   "priority": np.arange(n) % 3, "cache_hit": np.arange(n) % 2 == 0,
                                   "required_blocks": np.ones(n, np.int64),
                                   "deadline_step": [None if i % 2 else 7 + i for i in range(n)],
                                   "preemptible": np.ones(n, bool)})


@pytest.mark.parametrize("rows", [0, 1, 7, 8, 9, 16, 17])
def test_tables_of_a_chunk_and_a_chunk_plus_or_minus_one_row(tmp_path, monkeypatch, rows):
    """With chunks of 8 rows, tables of 0, 1, 8 +- 1 and 16 +- 0/1 rows (a requests table has at least one: a
    trace is never empty): the CSV is byte for byte the one written in a single chunk, the Parquet file has one
    row group per 8 rows (one for an empty table), and both read back to the result."""
    trace = long_trace(20)
    events = decodesched.simulate(trace, "aging", free_kv_blocks=40, aging_interval=2, max_steps=rows)
    assert events.n_events == rows
    requests = decodesched.simulate(trace.subset(slice(0, max(rows, 1))), "fcfs", free_kv_blocks=40)
    tables = (("ev", events.write_events, rows, assert_events_are, events),
              ("rq", requests.write_requests, max(rows, 1), assert_requests_are, requests))
    for name, write, _, _, _ in tables:
        write(tmp_path / f"{name}_whole.csv")
    monkeypatch.setattr(tables_io, "CHUNK_ROWS", 8)
    monkeypatch.setattr(tables_io, "PARQUET_CHUNK_ROWS", 8)
    for name, write, n, check, result in tables:
        write(tmp_path / f"{name}.csv")
        write(tmp_path / f"{name}.parquet")
        assert (tmp_path / f"{name}.csv").read_bytes() == (tmp_path / f"{name}_whole.csv").read_bytes()
        assert pq.ParquetFile(tmp_path / f"{name}.parquet").metadata.num_row_groups == max(1, -(-n // 8))
        for fmt in ("csv", "parquet"):
            table = tables_io.read_table(tmp_path / f"{name}.{fmt}")
            assert len(table["request_id"]) == n
            check(table, result)


SMALL = ["request_id,arrival_step,prompt_len,max_new_tokens,priority,cache_hit,required_blocks,deadline_step,"
         "preemptible", "1,0,4,3,0,false,2,,true", "2,1,2,2,2,true,2,8,true", "3,1,3,1,1,false,2,,true"]


@pytest.fixture
def small_trace(tmp_path):
    p = tmp_path / "trace.csv"
    p.write_text("\n".join(SMALL) + "\n")
    (tmp_path / "trace.csv.meta.json").write_text('{"steps_per_second": 10.0}\n')
    return p


def simulate_cli(trace, *extra):
    return main(["simulate", str(trace), "--policy", "aging", "--kv-blocks", "4", *extra])


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("option", ["--events", "--requests"])
def test_a_parquet_table_without_pyarrow_is_refused_before_the_replay(small_trace, tmp_path, monkeypatch, capsys,
                                                                      option):
    """Found: without the data extra, `simulate --events ev.parquet` replayed the whole trace (minutes for a large
    one, 444 s for the Azure trace with the scan engine) and only then said that Parquet needs pyarrow."""
    import builtins

    from decodesched.commands import simulate as command

    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    def replay(*args, **kwargs):
        raise AssertionError("the replay ran")

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    monkeypatch.setattr(command, "simulate", replay)
    assert simulate_cli(small_trace, option, str(tmp_path / "out.parquet")) == 2
    assert one_line(capsys.readouterr().err).endswith("out.parquet: writing Parquet needs pyarrow: "
                                                      "pip install 'decodesched[data]'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.csv", "trace.csv.meta.json"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt, sig", [("csv", signal.SIGINT), ("parquet", signal.SIGTERM)])
def test_a_signal_while_the_event_log_is_written_leaves_the_old_file_and_nothing_else(tmp_path, fmt, sig):
    """Ctrl-C or SIGTERM once the 4 M-row Azure event log (load 1.5) is being written: one line, 128 + the
    signal, the file that was there before unchanged, no requests table, no temporary file."""
    trace = tmp_path / "azure.csv"
    assert main(["trace", "convert", "bundled", "--load", "1.5", "--out", str(trace)]) == 0
    events = tmp_path / f"ev.{fmt}"
    events.write_bytes(b"the old log\n")
    argv = [sys.executable, "-m", "decodesched.cli", "simulate", str(trace), "--policy", "aging", "--kv-blocks",
            "4000", "--events", str(events), "--requests", str(tmp_path / f"rq.{fmt}")]

    def writing() -> bool:  # (the empty probe of the folder before the replay does not count)
        sizes = []
        for x in tmp_path.iterdir():
            try:
                sizes.append(x.name.startswith(f".ev.{fmt}.") and x.stat().st_size > 0)
            except FileNotFoundError:
                pass
        return any(sizes)

    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL)) as p:  # (as from a terminal)
        deadline = time.monotonic() + 300
        while not writing():
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()
            time.sleep(0.005)
        os.kill(p.pid, sig)
        err = p.communicate(timeout=120)[1].decode()
        rc = p.returncode
    word = "interrupted" if sig == signal.SIGINT else f"terminated ({sig.name})"
    assert (rc, one_line(err)) == (128 + sig, f"decodesched simulate: {word}")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["azure.csv", "azure.csv.meta.json", events.name]
    assert events.read_bytes() == b"the old log\n"


def test_a_batch_as_parquet_never_replaces_the_trace_it_replayed(tmp_path):
    """Found: `frames.to_parquet(batch, path)` refused a single result's trace file but wrote a batch's metrics over
    the Parquet trace that batch had replayed, which then no longer loaded ("missing column(s) request_id, ...")."""
    trace = decodesched.load_trace(dict(zip(SMALL[0].split(","), zip(*(r.split(",") for r in SMALL[1:])))))
    path = tmp_path / "t.parquet"
    frames.to_parquet(trace, path)
    before = path.read_bytes()
    other = tmp_path / "other.pq"
    frames.to_parquet(trace, other)
    traces = [decodesched.load_trace(other), decodesched.load_trace(path)]
    batch = decodesched.simulate_batch(traces, decodesched.grid(traces, ["aging"], [4], [2]))
    for target in (path, other, tmp_path / "." / "t.parquet"):
        with pytest.raises(UserError, match="refusing to overwrite it"):
            frames.to_parquet(batch, target)
    assert path.read_bytes() == before and len(decodesched.load_trace(other)) == 3
    frames.to_parquet(batch, tmp_path / "metrics.parquet")  # any other name is written
    assert pq.read_table(tmp_path / "metrics.parquet").num_rows == 2


def snapshot(folder) -> dict:
    """Every entry under `folder`: a link's target, a FIFO's kind, a file's bytes."""
    out = {}
    for p in sorted(folder.rglob("*")):
        out[p.relative_to(folder)] = (os.readlink(p) if p.is_symlink() else "fifo" if p.is_fifo() else
                                      "dir" if p.is_dir() else p.read_bytes())
    return out


@pytest.mark.parametrize("option", ["--events", "--requests"])
@pytest.mark.parametrize("name, words", [
    ("link_to_trace.csv", "is an input of this command"),
    ("link_to_link_to_trace.csv", "is an input of this command"),
    ("hard_link_to_trace.csv", "is an input of this command"),
    ("trace.csv", "is an input of this command"),
    ("trace.csv.meta.json", "is the metadata sidecar of the input"),
    ("link_to_sidecar.csv", "is the metadata sidecar of the input"),
    ("folder", "is a directory"),
    ("folder/", "names a folder"),
    ("/dev/null", "is a device"),
    ("/dev/full", "is a device"),
    ("link_to_dev_full.csv", "is a device"),
    ("fifo.csv", "is a FIFO"),
    ("link_to_fifo.csv", "is a FIFO"),
    ("out.csv.gz", "got '.gz'"),
    ("out.CSV.GZ", "got '.GZ'"),
    ("out.json", "got '.json'"),
    ("no_folder/out.csv", "no such directory"),
    ("dangling_into_no_folder.csv", "no such directory"),
])
def test_a_hostile_table_path_is_one_line_before_the_replay_and_changes_nothing(small_trace, tmp_path, capsys,
                                                                                 monkeypatch, option, name, words):
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo.csv")
    os.link(small_trace, tmp_path / "hard_link_to_trace.csv")
    for link, target in (("link_to_trace.csv", "trace.csv"), ("link_to_link_to_trace.csv", "link_to_trace.csv"),
                         ("link_to_sidecar.csv", "trace.csv.meta.json"), ("link_to_dev_full.csv", "/dev/full"),
                         ("link_to_fifo.csv", "fifo.csv"), ("dangling_into_no_folder.csv", "nowhere/x.csv")):
        (tmp_path / link).symlink_to(target)
    before = snapshot(tmp_path)
    monkeypatch.chdir(tmp_path)
    if name.startswith("/") and not os.path.exists(name):
        pytest.skip(f"no {name} here")
    assert simulate_cli(small_trace, option, name) == 2
    captured = capsys.readouterr()
    assert words in one_line(captured.err) and captured.out == ""  # (no summary: refused before the replay)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name, target, fmt", [
    ("link_to_file.csv", "old.csv", "csv"), ("dangling.csv", "new.csv", "csv"), ("out.CSV", "out.CSV", "csv"),
    ("out.Parquet", "out.Parquet", "parquet"), ("OUT.PQ", "OUT.PQ", "parquet"),
    ("link_to_file.pq", "old.pq", "parquet")])
def test_a_table_path_through_a_link_or_in_any_case_is_written_in_its_format(small_trace, tmp_path, capsys, name,
                                                                             target, fmt):
    """A link is written through (the link stays, its target gets the table, a dangling one's target is made);
    the extension in any case chooses the format; the events and requests through two names read back equal."""
    for old in ("old.csv", "old.pq"):
        (tmp_path / old).write_text("old\n")
    (tmp_path / "link_to_file.csv").symlink_to("old.csv")
    (tmp_path / "link_to_file.pq").symlink_to("old.pq")
    (tmp_path / "dangling.csv").symlink_to("new.csv")
    assert simulate_cli(small_trace, "--events", str(tmp_path / name), "--requests", str(tmp_path / "rq.csv")) == 0
    capsys.readouterr()
    assert (tmp_path / name).is_symlink() == (name != target)
    head = (tmp_path / target).read_bytes()[:4]
    assert (head == b"PAR1") == (fmt == "parquet") and (head == b"step") == (fmt == "csv")
    simulate_cli(small_trace, "--events", str(tmp_path / "plain.csv"))
    assert tables_io.tables_equal(tables_io.read_table(tmp_path / target), tables_io.read_table(tmp_path / "plain.csv"))


def _written_tables(small_trace, tmp_path):
    assert simulate_cli(small_trace, "--events", str(tmp_path / "ev.csv"), "--requests", str(tmp_path / "rq.csv")) == 0
    return tmp_path / "ev.csv", tmp_path / "rq.csv"


def test_a_table_saved_by_a_spreadsheet_reads_as_written(small_trace, tmp_path):
    """Found: docs/files.md gives every CSV reader, the events and requests tables' included, one set of spellings
    (booleans in any case or 1/0, spaces around a field ignored, blank lines skipped as in a trace), but the table
    reader refused `TRUE` (what a spreadsheet writes back), `1` / `0`, a space after a comma and a trailing blank
    line."""
    for path in _written_tables(small_trace, tmp_path):
        text = path.read_text()
        want = tables_io.read_table(path)
        for changed in (text.replace("true", "TRUE").replace("false", "False"),
                        text.replace(",true", ",1").replace(",false", ",0"),
                        "\n" + text.replace(",", " , ").replace("\n", " \r\n") + "\r\n\n"):
            path.write_text(changed)
            assert tables_io.tables_equal(tables_io.read_table(path), want), changed


@pytest.mark.parametrize("table, column, cell", [
    ("ev", "step", "1_0"), ("ev", "step", "+1"), ("ev", "step", "\u0661"), ("ev", "step", "\uff17"),
    ("ev", "step", "--1"), ("ev", "step", "1 0"), ("rq", "deadline_step", "1_0"), ("rq", "deadline_step", "\u0663"),
    ("rq", "ttft", "1_0"), ("rq", "ttft", "\u0661.5"), ("rq", "tpot", "0x10"), ("ev", "deadline_missed", "yes"),
    ("rq", "deadline_met", "t"),
])
def test_a_table_cell_spelled_outside_the_documented_rules_is_refused_not_misread(small_trace, tmp_path, table,
                                                                                     column, cell):
    """Found: the table reader parsed whole numbers with NumPy, which takes Python's spellings: `1_0` was read as 10,
    `+1` as 1 and digits of other scripts (Arabic-Indic, fullwidth) as their values, where docs/files.md refuses
    them."""
    path = dict(zip(("ev", "rq"), _written_tables(small_trace, tmp_path)))[table]
    lines = path.read_text().splitlines()
    cells = lines[1].split(",")
    cells[lines[0].split(",").index(column)] = cell
    lines[1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=f"line 2, column {column}: not a "):
        tables_io.read_table(path)
