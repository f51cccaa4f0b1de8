"""`decodesched demo` end to end on a prefix of the bundled trace, and its error contract."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from decodesched.cli import main
from decodesched.commands import demo

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def cli(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def read_summary(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_demo_writes_table_png_and_summary(tmp_path, capsys):
    out = tmp_path / "demo"
    assert cli(["demo", "--requests", "300", "--load", "0.9", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    for policy in demo.DEMO_POLICIES:
        assert policy in captured.out.splitlines()[1]  # the header row of the side-by-side table
        assert f"] {policy}:" in captured.err  # progress, one line per policy, on stderr
    assert "ttft P99 (s)" in captured.out  # a converted trace has a time scale: seconds

    png = (out / "ttft_cdf.png").read_bytes()
    assert png.startswith(PNG_MAGIC)
    import matplotlib.image

    img = matplotlib.image.imread(out / "ttft_cdf.png")
    assert img.shape[0] > 300 and img.shape[1] > 600
    assert np.ptp(img[..., :3]) > 0.5  # not a blank canvas

    rows = read_summary(out / "summary.csv")
    assert [r["policy"] for r in rows] == list(demo.DEMO_POLICIES)
    for r in rows:
        assert r["unit"] == "s"
        assert int(r["requests"]) == 300
        # 2,000 blocks hold any single request of the trace, so every request finishes
        assert int(r["finished"]) == 300 and int(r["unservable"]) == 0
        p50, p95, p99 = (float(r[f"ttft_{p}"]) for p in ("p50", "p95", "p99"))
        assert 0 < p50 <= p95 <= p99
        assert float(r["e2e_p99"]) >= p99
    assert sorted(p.name for p in out.iterdir()) == ["summary.csv", "ttft_cdf.png"]  # no temp files left


def test_demo_reports_unservable_requests_without_failing(tmp_path, capsys):
    out = tmp_path / "d"
    assert cli(["demo", "--requests", "20", "--kv-blocks", "0", "--out", str(out)]) == 0
    rows = read_summary(out / "summary.csv")
    assert all(int(r["unservable"]) == 20 and int(r["finished"]) == 0 for r in rows)
    assert all(r["ttft_p50"] == "inf" for r in rows)  # censored: no request got a first token (SPEC 9)
    assert (out / "ttft_cdf.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("argv, words", [
    (["--load", "0"], "--load"),
    (["--load", "-1"], "--load"),
    (["--load", "nan"], "--load"),
    (["--load", "fast"], "--load: expected a positive number"),
    (["--kv-blocks", "-5"], "--kv-blocks"),
    (["--requests", "1"], "--requests"),
    (["--aging-interval", "0"], "--aging-interval"),
    (["--load", "1e-300"], "beyond 2**53"),  # (found by the CLI fuzz: a progress line came before it)
])
def test_demo_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, argv, words):
    out = tmp_path / "never"
    assert cli(["demo", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err
    assert not out.exists()


def test_demo_out_must_be_a_folder(tmp_path, capsys):
    f = tmp_path / "file.txt"
    f.write_text("keep me")
    assert cli(["demo", "--requests", "10", "--out", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a folder" in err
    assert f.read_text() == "keep me"
    assert cli(["demo", "--requests", "10", "--out", str(f / "sub")]) == 2
    assert "not a folder" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_demo_refuses_an_unwritable_out_before_the_work(capsys):
    """/proc refuses new folders even to root, for whom os.access says every folder is writable:
    the check tries to make a folder there, before any replay."""
    assert cli(["demo", "--requests", "10", "--out", "/proc/decodesched-demo"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "cannot write in /proc" in err


def test_cdf_plot_and_summary_in_steps_without_a_time_scale():
    ttft = {"fcfs": np.array([3.0, 5.0, np.nan, 40.0]), "aging": np.array([2.0, 2.0, 9.0, 1000.0])}
    png = demo.render_ttft_cdf(ttft, None, "synthetic")
    assert png.startswith(PNG_MAGIC)
    metrics = {}
    for name in ttft:
        lat = {k: {"p50": 4.0, "p95": 8.0, "p99": 9.0} for k in ("queue_wait", "ttft", "e2e")}
        metrics[name] = {**lat, "requests": 4, "finished": 3, "starvation": 12, "preemptions": 0,
                         "deadline_misses": 0, "with_deadline": 0, "unservable": 0, "unfinished": 1, "events": 9}
    text = demo.summary_csv(metrics, {"fcfs": 0.1, "aging": 0.2}, None)
    rows = list(csv.DictReader(text.splitlines()))
    assert rows[0]["unit"] == "steps" and float(rows[0]["ttft_p99"]) == 9.0
    scaled = list(csv.DictReader(demo.summary_csv(metrics, {"fcfs": 0.1, "aging": 0.2}, 2.0).splitlines()))
    assert scaled[0]["unit"] == "s" and float(scaled[0]["ttft_p99"]) == 4.5
