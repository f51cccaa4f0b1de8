"""A researcher's second walk through the Python API (the first is test_research_walk.py): the aging
interval a Policy carries, progress of long sweeps in a log, and a real trace (Mooncake's shape) end
to end through simulate, simulate_batch, the threaded and the Dask sweeps, checkpoints and reports."""

import io

import numpy as np
import pytest

import decodesched
from decodesched import model
from decodesched.batch import Scenario, grid, simulate_batch
from decodesched.checkpoint import run_local
from decodesched.cli import main
from decodesched.errors import UserError
from decodesched.policy import builtin

ROWS = {"request_id": [1, 2, 3, 4, 5, 6], "arrival_step": [0, 0, 0, 1, 1, 2], "prompt_len": [4, 2, 3, 5, 1, 2],
        "max_new_tokens": [6, 5, 4, 6, 3, 5], "priority": [0, 3, 1, 0, 2, 0],
        "cache_hit": [False, True, False, False, True, False], "required_blocks": [2, 2, 1, 3, 1, 2],
        "deadline_step": [None, 30, None, 40, None, None], "preemptible": [True, True, False, True, True, True]}


def _differ_by_interval():
    """Intervals 1 and 8 give different timelines on ROWS (else the tests below could not tell them apart)."""
    a = decodesched.simulate(ROWS, "aging", 4, 1).timeline()
    assert a != decodesched.simulate(ROWS, "aging", 4, 8).timeline()


# --- 1. the interval a Policy carries is never dropped silently -------------------------------------

def test_a_policy_built_with_an_interval_runs_at_it_without_one_given():
    """simulate(trace, builtin("aging", 8), N) ran at simulate's default 4, silently."""
    _differ_by_interval()
    by_policy = decodesched.simulate(ROWS, builtin("aging", 8), 4)
    assert by_policy.aging_interval == 8
    assert by_policy.timeline() == decodesched.simulate(ROWS, "aging", 4, 8).timeline()
    assert by_policy.timeline() == decodesched.simulate(ROWS, builtin("aging", 8), 4, 8).timeline()
    assert model.replay(ROWS, builtin("aging", 8), 4).events == model.replay(ROWS, "aging", 4, 8).events
    sim = decodesched.DecodeSchedulerSim(builtin("aging", 8), 4)
    assert sim.aging_interval == 8
    # names and a Policy that carries none keep SPEC's default 4 and take any interval given
    assert decodesched.simulate(ROWS, "aging", 4).aging_interval == 4
    assert decodesched.simulate(ROWS, builtin("aging"), 4, 1).timeline() == \
        decodesched.simulate(ROWS, "aging", 4, 1).timeline()
    assert decodesched.simulate(ROWS, "aging", 4, aging_interval=4).aging_interval == 4
    assert decodesched.DecodeSchedulerSim("aging").aging_interval == 4


@pytest.mark.parametrize("call", [
    lambda: decodesched.simulate(ROWS, builtin("aging", 8), 4, 4),
    lambda: decodesched.simulate(ROWS, builtin("aging", 8), 4, aging_interval=2),
    lambda: Scenario(0, builtin("aging", 8), 4, 2),
    lambda: grid(1, [builtin("aging", 8)], [4], [2, 8]),
    lambda: decodesched.DecodeSchedulerSim(builtin("aging", 8), 4, 4),
    lambda: model.replay(ROWS, builtin("aging", 8), 4, 1),
], ids=["simulate", "simulate-kw", "Scenario", "grid", "model", "replay"])
def test_another_interval_beside_a_policy_that_carries_one_is_one_line(call):
    with pytest.raises(UserError, match=r"^policy .aging. was built with aging interval 8, but .* [124] was given"
                       ) as info:
        call()
    assert "\n" not in str(info.value) and "give one of them" in str(info.value)


def test_batch_grid_and_sweeps_run_a_carried_interval_as_simulate_does():
    aged = builtin("aging", 8)
    scenarios = grid(1, [aged, "fcfs"], [4, 8], None)
    assert [(s.policy.name if hasattr(s.policy, "name") else s.policy, s.aging_interval) for s in scenarios] == [
        ("aging", 8), ("aging", 8), ("fcfs", 4), ("fcfs", 4)]
    assert Scenario(0, aged, 4).aging_interval == 8 and Scenario(0, "aging", 4).aging_interval == 4
    batch = simulate_batch([ROWS], scenarios)
    want = decodesched.simulate(ROWS, "aging", 4, 8, record_events=False)
    np.testing.assert_array_equal(batch.result(0).request_state, want.request_state)
    assert batch.rows()[0]["aging_interval"] == 8
    assert run_local([ROWS], scenarios, chunk_size=1) == batch.rows()
    # the name still varies over the grid's intervals; a Policy that carries none does as well
    assert [s.aging_interval for p in ("aging", builtin("aging")) for s in grid(1, [p], [4], [1, 2])] == [1, 2, 1, 2]


def _write_policy_module(tmp_path):
    (tmp_path / "aged.py").write_text("from decodesched.policy import builtin\nAGED8 = builtin('aging', 8)\n")
    return f"{tmp_path / 'aged.py'}:AGED8"


def test_cli_aging_interval_beside_a_policy_that_carries_one(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    decodesched.load_trace(ROWS).to_csv(trace)
    spec = _write_policy_module(tmp_path)
    assert main(["simulate", str(trace), "--policy", spec, "--kv-blocks", "4"]) == 0
    assert "aging interval 8" in capsys.readouterr().out
    assert main(["simulate", str(trace), "--policy", spec, "--kv-blocks", "4", "--aging-interval", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--aging-interval 4" in err[0] and "built with aging interval 8" in err[0], err
    out = tmp_path / "m.csv"
    assert main(["sweep", str(trace), "--policy", f"{spec},fcfs", "--kv-blocks", "4", "--aging-interval", "2",
                 "--out", str(out)]) == 2
    assert "--aging-interval 2" in capsys.readouterr().err and not out.exists()
    assert main(["sweep", str(trace), "--policy", f"{spec},fcfs", "--kv-blocks", "4", "--out", str(out)]) == 0
    import csv

    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["policy"], r["aging_interval"]) for r in rows] == [("aging", "8"), ("fcfs", "")]


# --- 2. progress in a log (stderr not a terminal) ----------------------------------------------------

class _Clock:
    """A stand-in for `time` in decodesched._io: `monotonic` returns what the test sets."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


class _Log(io.StringIO):
    def isatty(self):
        return False


def test_progress_in_a_log_prints_a_line_each_tenth_and_half_minute_whichever_is_later(monkeypatch):
    from decodesched import _io

    clock = _Clock()
    monkeypatch.setattr(_io, "time", clock)
    log = _Log()
    with _io.Progress(100, "sweep", enabled=None, stream=log) as bar:
        for _ in range(100):  # 1 s per scenario: a tenth every 10 s, so a line each 30 s (30 scenarios)
            clock.now += 1
            bar.advance()
    lines = log.getvalue().splitlines()
    assert lines == ["sweep: 30 of 100 done (30%), 30 s", "sweep: 60 of 100 done (60%), 60 s",
                     "sweep: 90 of 100 done (90%), 90 s", "sweep: 100 of 100 done (100%), 100 s"]
    assert "\r" not in log.getvalue()
    log = _Log()
    with _io.Progress(100, "sweep", enabled=None, stream=log) as bar:
        for _ in range(100):  # 40 s per scenario: one line per tenth, not one per scenario
            clock.now += 40
            bar.advance()
    assert len(log.getvalue().splitlines()) == 10
    log = _Log()
    with _io.Progress(100, "sweep", enabled=None, stream=log) as bar:
        clock.now += 29
        bar.advance(100)  # done within half a minute: nothing
    assert log.getvalue() == ""
    log = _Log()  # switched off: nothing
    with _io.Progress(10, "sweep", enabled=False, stream=log) as bar:
        clock.now += 100
        bar.advance(10)
    assert log.getvalue() == ""


def test_a_sweep_in_a_log_shows_progress_lines_and_none_with_no_progress(tmp_path, monkeypatch, capsys):
    from decodesched import _io

    monkeypatch.setattr(_io.Progress, "LINE_SECONDS", 0.0)  # every tenth, however fast the machine
    trace = tmp_path / "t.csv"
    decodesched.load_trace(ROWS).to_csv(trace)
    out = tmp_path / "m.csv"
    args = ["sweep", str(trace), "--policy", "aging,fcfs", "--kv-blocks", ",".join(map(str, range(2, 12))),
            "--aging-interval", "1,2", "--chunk-size", "1", "--out", str(out)]
    assert main(args) == 0
    err = capsys.readouterr().err  # (pytest's capture is not a terminal, as a log under nohup)
    lines = [ln for ln in err.splitlines() if ln.startswith("sweep: ")]
    assert 5 <= len(lines) <= 11 and lines[-1].startswith("sweep: 30 of 30 done (100%)"), err
    assert "\r" not in err
    out.unlink()
    assert main(args + ["--no-progress"]) == 0
    assert "sweep: " not in capsys.readouterr().err


# --- 3. the walk: a local Dask sweep of built-in Policies and a policy file ---------------------------

DASK_SCRIPT = """
import json
from decodesched.batch import grid, simulate_batch
from decodesched.distributed import run_sweep
from decodesched.policy import builtin, resolve_policy

ROWS = {rows!r}

if __name__ == "__main__":
    sjf = resolve_policy("walk_policies.py:SJF")
    scenarios = grid(1, ["fixed_priority", builtin("aging", 3), "deadline", "fcfs", sjf], [1, 6, 2**61], [3])
    want = simulate_batch([ROWS], scenarios).rows()
    got = run_sweep([ROWS], scenarios, "local", chunk_size=4, quiet=True)
    print("same rows" if json.dumps(got) == json.dumps(want) else "rows differ")
"""


def test_a_script_sweeping_a_policy_file_on_a_local_dask_cluster_equals_the_batch(tmp_path):
    """A script (whose imports a Dask worker repeats before it applies its environment) sweeping a policy
    file with ``"local"``: Dask set NUMBA_NUM_THREADS in the worker after Numba was imported there, so
    the policy's first compile reloaded Numba's config and failed ("Cannot set NUMBA_NUM_THREADS to a
    different value once the threads have been launched"), and the sweep stopped (FutureCancelledError)."""
    import subprocess
    import sys

    pytest.importorskip("distributed")
    from oracle import write_sjf_module

    write_sjf_module(tmp_path / "walk_policies.py", "walk_sjf")
    (tmp_path / "walk.py").write_text(DASK_SCRIPT.format(rows=ROWS))
    run = subprocess.run([sys.executable, "walk.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "same rows", run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]


def _distinct_priorities(n=40):
    """A trace of `n` requests whose priorities are all distinct (shortest job first's -max_new_tokens
    on a real trace is nearly so): not classes."""
    rng = np.random.default_rng(7)
    return decodesched.load_trace({
        "request_id": list(range(n)), "arrival_step": sorted(rng.integers(0, 30, n).tolist()),
        "prompt_len": rng.integers(1, 9, n).tolist(), "max_new_tokens": rng.integers(1, 6, n).tolist(),
        "priority": (rng.permutation(n) * 2**47 - 2**52).tolist(), "cache_hit": [False] * n,
        "required_blocks": rng.integers(1, 4, n).tolist(), "deadline_step": [None] * n, "preemptible": [True] * n},
        name="distinct")


def test_priorities_that_are_not_classes_give_no_column_per_request():
    """With all-distinct priorities every request was a class: the Mooncake trace's metrics rows had
    324,904 columns (and took ten times its replay to compute), its report a panel per request."""
    distinct = _distinct_priorities()
    batch = simulate_batch([distinct, ROWS], grid(2, ["fcfs"], [6], None))
    wide, narrow = batch.rows()
    assert not [k for k in wide if "_class" in k] and len(wide) < 100
    assert len(batch.metrics(0)["per_class"]) == 40  # (the metrics keep every class)
    assert all(c["requests"] == 1 for c in batch.metrics(0)["per_class"].values())
    assert {k for k in narrow if k.startswith("requests_class")} == {"requests_class0", "requests_class1",
                                                                   "requests_class2", "requests_class3"}
    assert [narrow[f"requests_class{p}"] for p in range(4)] == [3, 1, 1, 1]
    assert batch.metrics(0)["requests"] == 40 and batch.metrics(1)["per_class"][0]["requests"] == 3


def test_a_report_of_a_trace_without_classes_says_why_it_has_no_class_figure(tmp_path):
    from decodesched.report import build_report

    trace = tmp_path / "distinct.csv"
    _distinct_priorities().to_csv(trace)
    plots = build_report(tmp_path / "rep", trace=str(trace), policies=["fcfs", "aging"], kv_blocks=6)
    assert "per_class" not in {p.name for p in plots} and not (tmp_path / "rep" / "per_class.png").exists()
    assert "40 distinct priorities" in (tmp_path / "rep" / "index.html").read_text()


def test_deadlines_on_every_row_by_replace_need_has_deadline_and_say_so():
    """`dataclasses.replace(trace, deadline_step=...)` kept the old has_deadline: the rows that had no
    deadline silently kept none (10 of a converted trace's 20 requests), and no message said why."""
    import dataclasses

    trace = decodesched.load_trace(ROWS)
    with pytest.raises(UserError, match=r"row 1, column deadline_step: 10 on a row whose has_deadline is False.*"
                                        r"replace has_deadline as well") as info:
        decodesched.simulate(dataclasses.replace(trace, deadline_step=trace.arrival_step + 10), "deadline", 4)
    assert "\n" not in str(info.value)
    every = dataclasses.replace(trace, deadline_step=trace.arrival_step + 10, has_deadline=np.ones(len(trace), bool))
    assert decodesched.simulate(every, "deadline", 4).metrics["with_deadline"] == 6
    assert decodesched.load_trace(dataclasses.replace(trace, priority=-trace.max_new_tokens)).has_deadline.sum() == 2


def test_a_trace_frame_keeps_its_time_scale_and_name_through_pandas():
    """`load_trace(trace_frame(trace))` gave a trace without a time scale, named "trace": every result and
    sweep row of the edited frame was in steps, not seconds, with nothing saying the scale was lost."""
    pytest.importorskip("pandas")
    from decodesched.frames import trace_frame

    trace = decodesched.load_trace(ROWS, steps_per_second=250.0, name="mooncake_head")
    frame = trace_frame(trace)
    frame["priority"] = -frame["max_new_tokens"]  # (a column edited: pandas keeps the attrs)
    back = decodesched.load_trace(frame)
    assert back.steps_per_second == 250.0 and back.name == "mooncake_head"
    assert back.priority.tolist() == [-v for v in ROWS["max_new_tokens"]]
    assert decodesched.simulate(back, "fcfs", 4).metrics["steps_per_second"] == 250.0
    assert decodesched.load_trace(frame, steps_per_second=10.0, name="x").steps_per_second == 10.0
    assert decodesched.load_trace(trace_frame(decodesched.load_trace(ROWS))).steps_per_second is None


def test_a_raw_trace_given_to_simulate_is_told_to_convert_it():
    from decodesched.convert import RawTrace

    raw = RawTrace(np.array([0.0, 1.5]), np.array([900, 7000]), np.array([3, 0]), None)
    with pytest.raises(UserError, match=r"convert it first, decodesched\.convert\.to_trace\(raw, load=\.\.\.\)"):
        decodesched.simulate(raw, "fcfs", 100)


def test_a_checkpoint_in_a_missing_folder_is_refused_before_any_work(tmp_path, monkeypatch):
    """run_local(checkpoint_path=...) in a folder that does not exist ran its first chunk, then raised a bare
    FileNotFoundError when the checkpoint was first written."""
    from decodesched import batch as B

    ran = []
    real = B.simulate_batch
    monkeypatch.setattr(B, "simulate_batch", lambda *a, **k: ran.append(1) or real(*a, **k))
    with pytest.raises(UserError, match=r"no such directory .*missing") as info:
        run_local([ROWS], grid(1, ["fcfs", "aging"], [4, 8], None), checkpoint_path=tmp_path / "missing" / "c.jsonl")
    assert "\n" not in str(info.value) and not ran


def test_a_sweep_saved_as_parquet_reads_back_as_its_csv_and_reports(tmp_path):
    """`frames.to_parquet(batch, "m.parquet")` (README: a result, a batch or a trace) gave a file that
    `report` refused as "not a UTF-8 text file (invalid start byte)", with no word of what to do."""
    import json

    pytest.importorskip("pyarrow")
    from decodesched.batch import write_metrics_csv
    from decodesched.frames import to_parquet
    from decodesched.report import read_sweep

    batch = simulate_batch([ROWS], grid(1, ["fcfs", "aging", "deadline"], [1, 4, 2**61], [1, 4], max_steps=12))
    to_parquet(batch, tmp_path / "m.parquet")
    write_metrics_csv(batch.rows(), tmp_path / "m.csv")
    assert json.dumps(read_sweep(tmp_path / "m.parquet")) == json.dumps(read_sweep(tmp_path / "m.csv"))
    assert main(["report", str(tmp_path / "m.parquet"), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "index.html").is_file()


# --- 10. report: the compile note after every check, the flag named as the user wrote it -----------------

def test_a_report_checks_every_input_before_the_note_that_a_kernel_compiles(tmp_path):
    from decodesched.report import build_report

    trace = tmp_path / "t.csv"
    decodesched.load_trace(ROWS).to_csv(trace)
    calls = []
    with pytest.raises(UserError, match="kv-blocks"):  # (no results and no --kv-blocks: nothing to replay with)
        build_report(tmp_path / "r", trace=trace, before_replay=lambda: calls.append(1))
    with pytest.raises(UserError, match="built with aging interval 8"):
        build_report(tmp_path / "r", trace=trace, kv_blocks=4, aging_interval=2, policies=[builtin("aging", 8)],
                     before_replay=lambda: calls.append(1))
    assert calls == [] and not (tmp_path / "r").exists()
    build_report(tmp_path / "r", trace=trace, kv_blocks=4, policies=["fcfs"], before_replay=lambda: calls.append(1))
    assert calls == [1] and (tmp_path / "r" / "index.html").is_file()


def test_cli_report_names_its_aging_interval_flag_beside_a_policy_that_carries_one(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    decodesched.load_trace(ROWS).to_csv(trace)
    spec = _write_policy_module(tmp_path)
    assert main(["report", "--trace", str(trace), "--policy", spec, "--kv-blocks", "4", "--aging-interval", "2",
                 "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--aging-interval 2" in err[0], err
    assert not (tmp_path / "r").exists()


def test_a_sweep_table_that_is_not_text_names_what_it_is(tmp_path):
    import gzip

    from decodesched.report import read_sweep

    path = tmp_path / "m.csv"
    path.write_bytes(gzip.compress(b"policy,kv_blocks\nfcfs,4\n"))
    with pytest.raises(UserError, match="gzip-compressed"):
        read_sweep(path)


def test_grading_progress_in_a_log_is_lines_too(monkeypatch):
    """`grade` builds its bar as the sweeps do (`options.progress` None by default): in a log, lines."""
    from decodesched import _io
    from decodesched.grader.pipeline import Options

    clock = _Clock()
    monkeypatch.setattr(_io, "time", clock)
    log = _Log()
    with _io.Progress(4, "grading", enabled=Options().progress, stream=log) as bar:
        for _ in range(4):
            clock.now += 40
            bar.advance()
    assert log.getvalue().splitlines()[0] == "grading: 1 of 4 done (25%), 40 s"
