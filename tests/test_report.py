"""`decodesched report`: every figure renders to a real PNG with unit-labelled axes; the page links them."""

from __future__ import annotations

import csv
import dataclasses
import html
import math
import re

import numpy as np
import pytest

from decodesched import convert as cv
from decodesched.batch import grid, simulate_batch, write_metrics_csv
from decodesched.cli import main
from decodesched.errors import UserError
from decodesched.report import build_report, offered_load, read_sweep, trace_info
from decodesched.trace import load_trace
from oracle import write_sjf_module

POLICIES = ["fixed_priority", "aging", "deadline", "fcfs"]
LOADS = (0.7, 1.0, 1.4)
SWEEP_PLOTS = {"latency_vs_load", "deadline_vs_load", "fairness_vs_load", "class_ttft_vs_load", "ttft_vs_capacity"}
SCENARIO_PLOTS = {"latency_cdf", "per_class", "kv_queue_timeline", "gantt"}


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """Three converted prefixes of the bundled trace (with sidecars) and their sweep CSV."""
    d = tmp_path_factory.mktemp("sweep")
    raw = cv.read_azure(cv.bundled_trace_path()).head(20)
    paths = []
    for load in LOADS:
        path = d / f"azure_load{load}.csv"
        # the sidecar as `decodesched trace convert` writes it (the target load under "options")
        cv.write_trace(cv.to_trace(raw, load=load), path, {"options": {"load": load}, "source": "bundled"})
        paths.append(path)
    traces = [load_trace(p) for p in paths]
    batch = simulate_batch(traces, grid(traces, POLICIES, [60, 120, 240], [2, 4]))
    write_metrics_csv(batch.rows(), d / "metrics.csv")
    return d


def _png_ok(path) -> None:
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(path)
    assert img.shape[0] > 200 and img.shape[1] > 300
    assert np.unique(img.reshape(-1, img.shape[-1]), axis=0).shape[0] > 10  # not a blank canvas


def test_every_plot_renders_with_units_and_is_linked(sweep_dir, tmp_path):
    out = tmp_path / "report"
    plots = build_report(out, results=sweep_dir / "metrics.csv", trace=sweep_dir / "azure_load1.0.csv",
                         kv_blocks=120, gantt_requests=12)
    assert {p.name for p in plots} == SWEEP_PLOTS | SCENARIO_PLOTS | {"interval_aging"}  # aging: 2 intervals
    page = (out / "index.html").read_text()
    for p in plots:
        _png_ok(out / p.file)
        assert f'src="{p.file}"' in page
        assert p.caption.split(" (")[0][:30] in page
        assert p.xlabels and p.ylabels
    by_name = {p.name: p for p in plots}
    # the converted traces have a time scale, so latencies are in seconds
    assert "TTFT P99 (s)" in by_name["latency_vs_load"].ylabels
    assert all(x == "offered load (work steps per step)" for x in by_name["latency_vs_load"].xlabels)
    assert by_name["deadline_vs_load"].ylabels == ["deadline attainment (% of requests with a deadline)"]
    assert "starvation: max wait (s)" in by_name["fairness_vs_load"].ylabels
    assert set(by_name["ttft_vs_capacity"].xlabels) == {"KV capacity (free KV blocks)"}  # a panel per trace
    assert by_name["latency_cdf"].xlabels == ["queue wait (s)", "TTFT (s)", "end-to-end latency (s)"]
    assert "tail: slowest 5%" in by_name["latency_cdf"].ylabels
    assert "class 2: TTFT P99 (s)" in by_name["class_ttft_vs_load"].ylabels
    assert "unfinished requests" in by_name["latency_vs_load"].ylabels  # beside every latency figure
    assert "unfinished requests" in by_name["ttft_vs_capacity"].ylabels
    assert "preemptions" in by_name["interval_aging"].ylabels
    assert set(by_name["interval_aging"].legend) == {f"load {x:g}" for x in LOADS}
    assert "preemptions (victim count)" in by_name["per_class"].ylabels
    assert by_name["kv_queue_timeline"].ylabels == ["KV blocks in use", "queue length (requests waiting)"]
    assert by_name["kv_queue_timeline"].xlabels == ["time (s)"]
    assert by_name["gantt"].xlabels == ["time (s)"]
    assert "first 12 of 20 requests" in by_name["gantt"].caption


def test_steps_when_the_trace_has_no_time_scale(tmp_path):
    raw = cv.read_azure(cv.bundled_trace_path()).head(10)
    trace = cv.to_trace(raw, load=1.0)
    dataclasses.replace(trace, steps_per_second=None).to_csv(tmp_path / "plain.csv")  # no time scale, no sidecar
    plots = build_report(tmp_path / "r", trace=tmp_path / "plain.csv", kv_blocks=200, policies=["fcfs", "aging"])
    by_name = {p.name: p for p in plots}
    assert set(by_name) == SCENARIO_PLOTS
    assert by_name["latency_cdf"].xlabels == ["queue wait (steps)", "TTFT (steps)", "end-to-end latency (steps)"]
    assert by_name["gantt"].xlabels == ["time (steps)"]
    assert "all 10 requests" in by_name["gantt"].caption
    for p in plots:
        _png_ok(tmp_path / "r" / p.file)


def test_load_of_each_trace(sweep_dir):
    rows = read_sweep(sweep_dir / "metrics.csv")
    info = trace_info(rows, sweep_dir / "metrics.csv")
    assert {n: i.load for n, i in info.items()} == {f"azure_load{x}": x for x in LOADS}  # from the sidecars
    assert all(i.steps_per_second and i.steps_per_second > 0 for i in info.values())
    # an explicit mapping wins over the sidecar
    info = trace_info(rows, sweep_dir / "metrics.csv", loads={"azure_load1.0": 3.5})
    assert info["azure_load1.0"].load == 3.5
    # without a sidecar the load is measured on the trace: close to the converter's target
    trace = load_trace(sweep_dir / "azure_load1.4.csv")
    assert offered_load(trace) == pytest.approx(1.4, rel=0.02)
    # the sweep's own offered_load column, else a trace file; neither: load unknown
    assert trace_info([{**rows[0], "trace": "nowhere"}], None)["nowhere"].load == rows[0]["offered_load"]
    info = trace_info([{**rows[0], "trace": "nowhere", "offered_load": math.nan}], None)
    assert info["nowhere"].load is None


def test_sweep_without_known_loads_skips_load_figures(sweep_dir, tmp_path):
    csv_path = tmp_path / "metrics.csv"  # no trace files beside it, and no offered_load column
    with open(sweep_dir / "metrics.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    with open(csv_path, "w", newline="") as fh:
        w = csv.DictWriter(fh, [k for k in table[0] if k != "offered_load"], extrasaction="ignore")
        w.writeheader()
        w.writerows(table)
    plots = build_report(tmp_path / "r", results=csv_path, trace_dirs=[])
    assert plots == []
    assert "Offered load unknown" in (tmp_path / "r" / "index.html").read_text()
    plots = build_report(tmp_path / "r2", results=csv_path, loads={f"azure_load{x}": x for x in LOADS})
    assert {p.name for p in plots} == SWEEP_PLOTS | {"interval_aging"}


def test_report_command(sweep_dir, tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["report", str(sweep_dir / "metrics.csv"), "--out", f"{out}/", "--kv-blocks", "240",
                 "--aging-interval", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[-1] == f"wrote 6 plots and {out}/index.html"  # (one slash after --out DIR/)
    assert all(line.startswith(f"{out}/") and "//" not in line for line in printed.splitlines()[:-1]), printed
    page = (out / "index.html").read_text()
    assert "240 KV blocks, aging interval 2" in page
    linked = set(re.findall(r'src="([^"]+)"', page))
    assert linked == {p.name for p in out.glob("*.png")}
    # the summary tables: one row per trace (named, with its load), the lowest P99 TTFT in bold
    tables = page.split("<table")[1:]
    assert len(tables) == 2 and "class 2" in tables[1]
    table_rows = re.findall(r"<tr><td>([^<]+)</td><td>([0-9.]+)</td>(.*?)</tr>", tables[0])
    assert [(n, float(x)) for n, x, _ in table_rows] == [(f"azure_load{x}", x) for x in sorted(LOADS)]
    for _, _, cells in table_rows:
        values = [float(v) for v in re.findall(r"<td>(?:<b>)?([0-9.e+-]+)[ <]", cells)]
        bold = re.findall(r"<b>([0-9.e+-]+)[ <]", cells)
        assert len(values) == len(POLICIES) and len(bold) == 1 and float(bold[0]) == min(values)


@pytest.mark.parametrize("argv, message", [
    (["--kv-blocks", "7"], "no capacity (kv_blocks) 7"),
    (["--aging-interval", "3"], "no aging interval 3"),
    (["--load", "9"], "no load 9"),
    (["--loads", "azure_load1.0=nan"], "a load must be a positive number"),
    (["--loads", "azure_load1.0=-2"], "a load must be a positive number"),
    (["--loads", "azure_lod1.0=2"], "--loads names 'azure_lod1.0', which is not a trace of the sweep"),
    (["--trace-dir", "/dev/null"], "--trace-dir /dev/null: not a folder"),
])
def test_report_command_bad_input(sweep_dir, tmp_path, capsys, argv, message):
    out = tmp_path / "rep"
    try:
        code = main(["report", str(sweep_dir / "metrics.csv"), "--out", str(out), *argv])
    except SystemExit as exc:  # argparse's own errors (the --loads values) exit from inside
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary folder left behind


def test_report_replays_a_user_policy_given_as_module_attr(sweep_dir, tmp_path, capsys):
    """--policy and --timeline-policy take what `simulate --policy` takes (they took built-in names only)."""
    write_sjf_module(tmp_path / "mine.py", "sjf")
    out = tmp_path / "rep"
    spec = f"{tmp_path / 'mine.py'}:SJF"
    assert main(["report", "--trace", str(sweep_dir / "azure_load1.0.csv"), "--kv-blocks", "60",
                 "--policy", f"fcfs,{spec}", "--timeline-policy", spec, "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "sjf" in page and "fcfs" in page
    _png_ok(out / "gantt.png")
    assert main(["report", "--trace", str(sweep_dir / "azure_load1.0.csv"), "--kv-blocks", "60",
                 "--policy", f"{tmp_path / 'mine.py'}:nope", "--out", str(tmp_path / "r2")]) == 2
    assert "has no attribute 'nope'" in capsys.readouterr().err and not (tmp_path / "r2").exists()


def test_report_command_needs_input(tmp_path, capsys):
    assert main(["report", "--out", str(tmp_path / "x")]) == 2
    assert main(["report", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "x")]) == 2
    (tmp_path / "not_sweep.csv").write_text("a,b\n1,2\n")
    assert main(["report", str(tmp_path / "not_sweep.csv"), "--out", str(tmp_path / "x")]) == 2
    assert "not a sweep metrics CSV" in capsys.readouterr().err
    assert main(["report", "--trace", str(tmp_path / "not_sweep.csv"), "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_read_sweep_parses_numbers_and_empty_cells(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("trace,policy,kv_blocks,aging_interval,ttft_p99\nt,fcfs,10,4,\nt,aging,10,4,2.5\n")
    rows = read_sweep(p)
    assert rows[0]["kv_blocks"] == 10 and math.isnan(rows[0]["ttft_p99"]) and rows[1]["ttft_p99"] == 2.5


@pytest.mark.parametrize("body, message", [
    ("t,fcfs,10\n", "line 2: 3 cells, the header has 4"),
    ("t,fcfs,10,4,9\n", "line 2: 5 cells, the header has 4"),
    ("t,,10,4\n", "line 2, column policy: empty"),
    ("t,fcfs,,4\n", "line 2, column kv_blocks: not a whole number of blocks (0 to 2**63 - 1): ''"),
    ("t,fcfs,-3,4\n", "line 2, column kv_blocks: not a whole number of blocks (0 to 2**63 - 1): '-3'"),
    ("t,fcfs,9223372036854775808,4\n", "column kv_blocks: not a whole number of blocks (0 to 2**63 - 1): '92"),
    ("t,fcfs,10,x\n", "line 2, column aging_interval: not a number: 'x'"),
    (b"t,fcfs,1\xe9,4\n", "not a UTF-8 text file"),
    # a value no replay gives ended in a matplotlib traceback ("arange: cannot compute length")
    ("t,fcfs,10,1e308\n", "line 2, column aging_interval: '1e308' is beyond any metric of a replay"),
    ("t,fcfs,10,-9223372036854775809\n", "column aging_interval: '-9223372036854775809' is beyond"),
])
def test_read_sweep_refuses_malformed_rows_in_one_line(tmp_path, body, message):
    """Found by feeding the report mutated sweep CSVs: a short row reached the plots as policy None."""
    p = tmp_path / "m.csv"
    head = "trace,policy,kv_blocks,aging_interval\n"
    p.write_bytes(head.encode() + body) if isinstance(body, bytes) else p.write_text(head + body)
    with pytest.raises(UserError) as info:
        read_sweep(p)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_sweep_view_points_are_the_rows_of_the_cut(sweep_dir):
    from decodesched.report import SweepView

    rows = read_sweep(sweep_dir / "metrics.csv")
    info = trace_info(rows, sweep_dir / "metrics.csv")
    view = SweepView(rows, info, kv_blocks=120, aging_interval=2)
    assert view.unit == "s"
    assert view.families == {"bundled": [f"azure_load{x}" for x in LOADS]}  # one source: a line over load
    for policy in POLICIES:
        loads, p99, lo, hi = view.by_load(policy, "ttft_p99", "bundled", time=True)
        assert loads.tolist() == sorted(LOADS)
        for load, value in zip(loads, p99):
            name = f"azure_load{load}"
            want = [r["ttft_p99"] / info[name].steps_per_second for r in rows
                    if r["trace"] == name and r["policy"] == policy and r["kv_blocks"] == 120
                    and (policy != "aging" or r["aging_interval"] == 2)]
            assert len(want) == 1  # the grid runs interval-independent policies once
            assert value == pytest.approx(want[0])
        assert np.array_equal(lo, p99, equal_nan=True) and np.array_equal(hi, p99, equal_nan=True)  # 1 replicate
    caps, *_ = view.by_capacity("fcfs", "ttft_p99", "azure_load1.4", time=True)
    assert caps.tolist() == [60, 120, 240]
    assert SweepView(rows, info).kv_blocks == 120 and SweepView(rows, info).aging_interval == 4


def _rows_of(trace_name: str, load: float, values: dict, policies) -> list[dict]:
    return [{"trace": trace_name, "replicate": 0, "policy": p, "kv_blocks": 10, "aging_interval": 4 if p == "aging"
             else math.nan, "offered_load": load, "steps_per_second": 1.0, **values(p)} for p in policies]


def test_traces_are_never_averaged(tmp_path):
    """Two traces at the same load, P99 TTFT 9.5 s and 1,597.6 s: both appear, nothing in between."""
    from decodesched.report import SweepView, TraceInfo, sweep_plots

    rows = (_rows_of("a", 1.0, lambda p: {"ttft_p99": 9.5}, ["fcfs"])
            + _rows_of("b", 1.0, lambda p: {"ttft_p99": 1597.6}, ["fcfs"]))
    info = {"a": TraceInfo(1.0, 1.0, None, "src"), "b": TraceInfo(1.0, 1.0, None, "src")}
    view = SweepView(rows, info)
    assert view.families == {"a": ["a"], "b": ["b"]}  # same source and load: not one line
    assert [view.by_load("fcfs", "ttft_p99", f, time=True)[1].tolist() for f in view.families] == [[9.5], [1597.6]]
    _, notes = sweep_plots(rows, info, tmp_path)
    table = "".join(n for n in notes if n.startswith("<table"))
    assert "9.5" in table and "1598" in table and "803" not in table


def test_censored_points_and_unfinished_counts_are_shown(tmp_path):
    from decodesched.report import SweepView, TraceInfo, sweep_plots

    rows = _rows_of("a", 1.0, lambda p: {"ttft_p99": math.inf if p == "fcfs" else 4.0,
                                         "unfinished": 7 if p == "fcfs" else 0}, ["fcfs", "aging"])
    info = {"a": TraceInfo(1.0, 1.0)}
    _, notes = sweep_plots(rows, info, tmp_path)
    table = "".join(n for n in notes if n.startswith("<table"))
    assert "inf (7 unfinished)" in table and "<b>4</b>" in table
    x, y, *_ = SweepView(rows, info).by_load("fcfs", "ttft_p99", "a", time=True)
    assert y.tolist() == [math.inf]


def test_every_subset_and_order_of_policies_renders(sweep_dir, tmp_path):
    """Each figure draws a line for every policy of the sweep, whichever policies it has, in any order."""
    import itertools

    from decodesched.report import sweep_plots

    rows = read_sweep(sweep_dir / "metrics.csv")
    info = trace_info(rows, sweep_dir / "metrics.csv")
    subsets = [list(c) for k in range(1, 5) for c in itertools.combinations(POLICIES, k)]
    subsets += [["fcfs", "fixed_priority"], ["fcfs", "aging"], list(reversed(POLICIES))]
    for i, subset in enumerate(subsets):
        mine = [r for p in subset for r in rows if r["policy"] == p]  # rows in the subset's order
        out = tmp_path / str(i)
        out.mkdir()
        plots, notes = sweep_plots(mine, info, out)
        names = {p.name for p in plots}
        assert names - {"interval_aging"} == SWEEP_PLOTS and ("interval_aging" in names) == ("aging" in subset)
        for p in plots:
            if p.name != "interval_aging":  # its lines are the traces, by load
                assert sorted(p.legend) == sorted(subset), (subset, p.name, p.legend)
        for table in notes[-1].split("<table")[1:]:
            head = re.findall(r"<th>([a-z_]+)</th>", table)
            assert sorted(h for h in head if h in POLICIES) == sorted(subset)
            assert len(re.findall(r"<tr><td>", table)) == len(LOADS)  # every trace, every policy a cell


def _renamed(sweep_dir, tmp_path, policy_name: str):
    """The sweep CSV with policy aging renamed (a user Policy's name may hold any printable character)."""
    with open(sweep_dir / "metrics.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    for r in table:
        r["policy"] = policy_name if r["policy"] == "aging" else r["policy"]
    path = tmp_path / "renamed.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    return path


@pytest.mark.parametrize("name", ['x"><img src=x onerror=alert(1)>', "sjf/v2", "a%20b#1", r"sjf$\sqrt$", "$x$"])
def test_a_policy_name_is_text_in_the_page_and_never_a_path_or_markup(sweep_dir, tmp_path, name):
    """Names go into figure files, HTML ids and links: a file name of safe characters, the name
    escaped everywhere it is shown, and drawn as given (no mathtext, which fails on '$\\sqrt$')."""
    out = tmp_path / "r"
    plots = build_report(out, results=_renamed(sweep_dir, tmp_path, name))
    interval = next(p for p in plots if p.name == f"interval_{name}")
    assert re.fullmatch(r"[A-Za-z0-9_.-]+\.png", interval.file) and (out / interval.file).is_file()
    assert sorted(f.name for f in out.iterdir()) == sorted([p.file for p in plots] + ["index.html"])
    page = (out / "index.html").read_text()
    assert "<img src=x" not in page and f'src="{interval.file}"' in page and f'id="{interval.slug}"' in page
    assert name in html.unescape(page)  # shown, as text


def test_the_sweeps_own_results_are_never_taken_for_its_trace(tmp_path, capsys):
    """`sweep traces/study.csv --out study.csv`, then `report study.csv`: the trace named study is
    not the results file beside it."""
    (tmp_path / "traces").mkdir()
    raw = cv.read_azure(cv.bundled_trace_path()).head(12)
    cv.to_trace(raw, load=1.0).to_csv(tmp_path / "traces" / "study.csv")
    results = tmp_path / "study.csv"
    assert main(["sweep", str(tmp_path / "traces" / "study.csv"), "--policy", "aging,fcfs", "--kv-blocks", "60,120",
                 "--out", str(results)]) == 0
    for extra in ([], ["--trace-dir", str(tmp_path / "traces")]):
        assert main(["report", str(results), "--out", str(tmp_path / "rep"), *extra]) == 0, capsys.readouterr().err
    assert (tmp_path / "rep" / "index.html").is_file()


def test_a_report_that_cannot_replace_one_file_replaces_none(sweep_dir, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["report", str(sweep_dir / "metrics.csv"), "--out", str(out)]) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}
    (out / "latency_vs_load.png").unlink()
    (out / "latency_vs_load.png").mkdir()  # a folder where a figure goes
    capsys.readouterr()
    assert main(["report", str(sweep_dir / "metrics.csv"), "--out", str(out), "--kv-blocks", "60"]) == 2
    err = capsys.readouterr().err
    assert "latency_vs_load.png: is a directory" in err and ".r." not in err
    after = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}
    assert after == {k: v for k, v in before.items() if k != "latency_vs_load.png"}
    assert sorted(f.name for f in tmp_path.iterdir()) == ["r"]  # no temporary folder left


@pytest.mark.parametrize("value", ["0", "2001"])
def test_gantt_requests_out_of_range_is_one_line(sweep_dir, tmp_path, capsys, value):
    """A row per request: beyond 2,000 the figure is an image no viewer opens (Pillow calls it a bomb)."""
    assert main(["report", "--trace", str(sweep_dir / "azure_load1.0.csv"), "--kv-blocks", "60",
                 "--gantt-requests", value, "--out", str(tmp_path / "r")]) == 2
    assert "--gantt-requests must be from 1 to 2000" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["report", "demo"])
def test_an_output_folder_that_is_a_broken_link_is_refused_before_any_work(sweep_dir, tmp_path, capsys, command):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "nowhere")
    args = (["report", str(sweep_dir / "metrics.csv")] if command == "report" else ["demo", "--requests", "20"])
    assert main([*args, "--out", str(link)]) == 2
    assert "is a broken symbolic link" in capsys.readouterr().err
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


def test_two_policies_of_one_name_are_refused_before_any_replay(sweep_dir, tmp_path, capsys, monkeypatch):
    """The figures know a policy by its name: two different files that both say Policy("sjf") would
    be drawn as one (and --timeline-policy would take the other's replay)."""
    import decodesched.engine

    a = write_sjf_module(tmp_path / "a.py", "sjf")
    b = tmp_path / "b.py"
    b.write_text(a.read_text().replace("r.max_new_tokens - r.generated_len", "r.prompt_len"))  # another order
    monkeypatch.setattr(decodesched.engine, "simulate", lambda *a, **k: pytest.fail("replayed"))
    trace = str(sweep_dir / "azure_load1.0.csv")
    cases = [(["--policy", f"{a}:SJF,{b}:SJF"], "two different policies are named 'sjf'"),
             (["--policy", f"fcfs,{a}:SJF", "--timeline-policy", f"{b}:SJF"], "two different policies are named"),
             (["--policy", "fcfs,fcfs"], "policy 'fcfs' is given twice")]
    for extra, message in cases:
        assert main(["report", "--trace", trace, "--kv-blocks", "60", *extra, "--out", str(tmp_path / "r")]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("extra, message", [
    (["--policy", "fcfs"], "--policy chooses the replays of --trace; give --trace TRACE too"),
    (["--timeline-policy", "aging"], "--timeline-policy chooses the replays of --trace"),
])
def test_replay_options_without_a_trace_are_refused_not_ignored(sweep_dir, tmp_path, capsys, extra, message):
    assert main(["report", str(sweep_dir / "metrics.csv"), *extra, "--out", str(tmp_path / "r")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_an_empty_timeline_policy_is_refused(sweep_dir, tmp_path, capsys):
    assert main(["report", "--trace", str(sweep_dir / "azure_load1.0.csv"), "--kv-blocks", "60",
                 "--timeline-policy", " ", "--out", str(tmp_path / "r")]) == 2
    assert "--timeline-policy is empty" in capsys.readouterr().err and not (tmp_path / "r").exists()


@pytest.mark.parametrize("how", ["named", "symlink", "hard link", "trace link"])
def test_report_refuses_an_input_that_is_one_of_its_outputs(sweep_dir, tmp_path, capsys, monkeypatch, how):
    """A results file in --out under an output's name (index.html), or a link there to it (or to one of
    the sweep's trace files), was replaced by the page or a PNG, exit 0."""
    import os
    import shutil

    import decodesched.report as R

    out = tmp_path / "rc"
    out.mkdir()
    results = tmp_path / "study.csv"
    shutil.copy(sweep_dir / "metrics.csv", results)
    for f in sweep_dir.iterdir():
        if f.name.startswith("azure_load"):
            shutil.copy(f, tmp_path / f.name)
    protected = results
    if how == "named":
        results = protected = out / "index.html"
        shutil.move(tmp_path / "study.csv", results)
    elif how == "symlink":
        (out / "latency_vs_load.png").symlink_to(results)
    elif how == "hard link":
        os.link(results, out / "gantt.png")
    else:
        protected = tmp_path / "azure_load1.0.csv"
        (out / "fairness_vs_load.png").symlink_to(protected)
    before = protected.read_bytes()
    rendered = []
    monkeypatch.setattr(R, "_save", lambda *a: rendered.append(1))
    capsys.readouterr()
    assert main(["report", str(results), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to overwrite it" in err and "input" in err
    assert protected.read_bytes() == before and not rendered  # refused before any figure was drawn


@pytest.mark.parametrize("cell", ["4_0", "\u0664\u0660", "+40", "0x28", "4 0", "\uff14\uff10"])
def test_read_sweep_reads_integers_as_every_csv_reader_does(tmp_path, cell):
    """`int()` took '4_0' and Arabic-Indic digits as 40; docs/files.md refuses them in every CSV reader."""
    p = tmp_path / "m.csv"
    p.write_text(f"trace,policy,kv_blocks,aging_interval,ttft_p99\nt,fcfs,{cell},4,2.5\n", encoding="utf-8")
    with pytest.raises(UserError, match="line 2, column kv_blocks: not a number"):
        read_sweep(p)
    p.write_text(f"trace,policy,kv_blocks,aging_interval,ttft_p99\nt,fcfs,40,4,{cell}\n", encoding="utf-8")
    with pytest.raises(UserError, match="line 2, column ttft_p99: not a number"):
        read_sweep(p)


def test_read_sweep_keeps_every_spelling_the_sweep_writes(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("trace,policy,kv_blocks,aging_interval,a,b,c,d,e,f,g\n"
                 "t,fcfs, 40 ,,inf,-inf,1e-06,2.5e+12,-0.5,Infinity,nan\n")
    row = read_sweep(p)[0]
    assert row["kv_blocks"] == 40 and math.isnan(row["aging_interval"])
    assert (row["a"], row["b"], row["c"], row["d"], row["e"], row["f"]) == (math.inf, -math.inf, 1e-06, 2.5e12,
                                                                             -0.5, math.inf)
    assert math.isnan(row["g"]) and isinstance(row["kv_blocks"], int)


def test_a_missing_metric_column_is_named_on_stderr_and_in_the_page(sweep_dir, tmp_path, capsys):
    """A CSV without ttft_p99 gave blank panels and '-' cells (which elsewhere mean 'no value'), exit 0,
    and no word that the column was missing."""
    rows = list(csv.reader((sweep_dir / "metrics.csv").read_text().splitlines()))
    j = rows[0].index("ttft_p99")
    src = tmp_path / "nottft.csv"
    with open(src, "w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows([r[:j] + r[j + 1:] for r in rows])
    for f in sweep_dir.iterdir():
        if f.name.startswith("azure_load"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    assert main(["report", str(src), "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no column ttft_p99" in err
    assert "latency_vs_load.png" in err and "ttft_vs_capacity.png" in err and "table of P99 TTFT" in err
    page = html.unescape((tmp_path / "rep" / "index.html").read_text())
    assert "no column ttft_p99" in page
    # every column there: no note
    assert main(["report", str(sweep_dir / "metrics.csv"), "--out", str(tmp_path / "rep2")]) == 0
    assert "no column" not in capsys.readouterr().err
    assert "no column" not in (tmp_path / "rep2" / "index.html").read_text()
