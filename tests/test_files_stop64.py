"""Event logs and figures written where users point them: the figures whatever the environment says of matplotlib."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

COLUMNS = ["trace", "replicate", "policy", "kv_blocks", "aging_interval", "offered_load", "requests", "finished",
           "unfinished", "ttft_p50", "ttft_p99", "queue_wait_p99", "e2e_p99", "slo_attainment", "starvation",
           "fairness_jain", "preemptions"]


def _cli(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "decodesched", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def _sweep(path) -> None:
    """A small sweep CSV, as `decodesched sweep` writes one (its traces' files nowhere: each its own family)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for t in range(2):
            for policy in ("fcfs", "aging"):
                for kv in (60, 120):
                    w.writerow([f"gone{t}", 0, policy, kv, 4 if policy == "aging" else "", 0.5 + t / 2, 20, 19, 1,
                                3 + t, 30 + t + kv / 60, 20, 90, 0.9, 40, 0.8, 2])


def _env(**values):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}  # (headless)
    env.update(values)
    return env


@pytest.mark.parametrize("backend", ["junk"])
def test_report_draws_whatever_mplbackend_says(tmp_path, backend):
    """Before: MPLBACKEND=junk (a name matplotlib does not know) failed `report` with a traceback from matplotlib's
    import (ValueError: Key backend: 'junk' is not a valid value), exit 1.  The figures are drawn on Agg canvases,
    never with a backend: the report is written, exit 0, nothing on stderr."""
    _sweep(tmp_path / "s.csv")
    r = _cli("report", "s.csv", "--out", "r", cwd=tmp_path, env=_env(MPLBACKEND=backend))
    assert (r.returncode, r.stderr) == (0, ""), r.stderr[-2000:]
    assert (tmp_path / "r" / "index.html").is_file() and (tmp_path / "r" / "latency_vs_load.png").stat().st_size


def test_demo_draws_whatever_mplbackend_says(tmp_path):
    """Before: `demo` replayed every policy, then failed with matplotlib's traceback as it drew (MPLBACKEND=junk),
    exit 1, nothing written.  After: its plot and summary are written, exit 0, and its stderr holds only its own
    progress lines."""
    r = _cli("demo", "--requests", "200", "--out", "d", cwd=tmp_path, env=_env(MPLBACKEND="junk"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert all(line.startswith("demo: ") for line in r.stderr.splitlines()), r.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["summary.csv", "ttft_cdf.png"]
    assert (tmp_path / "d" / "ttft_cdf.png").read_bytes().startswith(b"\x89PNG")


def test_a_valid_mplbackend_still_reaches_matplotlib():
    """Guard (right before and after): a report's import of matplotlib leaves a valid MPLBACKEND in force for the
    script's own pyplot, and the variable as it was."""
    code = ("import os\n"
            "from decodesched.report import import_matplotlib\n"
            "print(import_matplotlib().rcParams['backend'], os.environ['MPLBACKEND'])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(MPLBACKEND="svg"),
                       timeout=300)
    assert (r.returncode, r.stdout.split(), r.stderr) == (0, ["svg", "svg"], ""), r.stderr[-2000:]


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_demo_refuses_an_output_it_cannot_replace_before_the_replays(tmp_path, kind):
    """Before: `demo --out d`, where d/summary.csv (or d/ttft_cdf.png) was a folder or a FIFO, replayed the trace
    under every policy (a minute and more on the whole trace) and only then refused it.  After: one line, exit 2,
    before any replay; the folder as it was."""
    out = tmp_path / "d"
    out.mkdir()
    bad = out / ("ttft_cdf.png" if kind == "folder" else "summary.csv")
    bad.mkdir() if kind == "folder" else os.mkfifo(bad)
    r = _cli("demo", "--requests", "200", "--out", "d", cwd=tmp_path, env=_env())
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("decodesched demo: error: "), r.stderr
    assert str(bad.relative_to(tmp_path)) in lines[0]
    assert [p.name for p in out.iterdir()] == [bad.name] and r.stdout == ""


@pytest.mark.parametrize("name", ["gantt.png", "index.html"])
def test_report_refuses_an_output_it_cannot_replace_before_the_replays(tmp_path, name):
    """Before: `report --trace T --out r`, where a file the report writes (r/gantt.png) was a folder, a FIFO or a
    link into a missing folder, replayed T under every policy and drew every figure, then refused it.  After: the
    same one-line error before the replay (the CLI's compile note, `before_replay`, is never reached)."""
    from decodesched.errors import UserError
    from decodesched.report import build_report
    from decodesched.trace import load_trace

    trace = load_trace({"request_id": [0, 1], "arrival_step": [0, 1], "prompt_len": [3, 2],
                        "max_new_tokens": [2, 1], "priority": [0, 1], "cache_hit": [False, True],
                        "required_blocks": [1, 1], "deadline_step": [None, 9], "preemptible": [True, True]})
    out = tmp_path / "r"
    out.mkdir()
    (out / name).mkdir() if name == "gantt.png" else os.mkfifo(out / name)
    (out / "per_class.png").write_bytes(b"old")
    replays = []
    with pytest.raises(UserError, match=f"{name}: is a"):
        build_report(out, trace=trace, kv_blocks=4, before_replay=lambda: replays.append(1))
    assert replays == [] and (out / "per_class.png").read_bytes() == b"old"
    assert sorted(p.name for p in out.iterdir()) == sorted([name, "per_class.png"])
