"""Ctrl-C during a long replay ends `decodesched simulate` (a Numba kernel holds the interpreter, so the
CLI lets SIGINT act at once there) and leaves no output file behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from decodesched.cli import main


def test_sigint_during_a_replay_ends_the_run_and_writes_nothing(tmp_path):
    trace = tmp_path / "azure.csv"
    assert main(["trace", "convert", "bundled", "--load", "1.5", "--out", str(trace)]) == 0
    events = tmp_path / "ev.csv"
    p = subprocess.Popen([sys.executable, "-m", "decodesched.cli", "simulate", str(trace), "--policy", "aging",
                          "--kv-blocks", "2000", "--engine", "scan", "--events", str(events)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(5)  # loading and the start of the (minutes-long) scan replay
    assert p.poll() is None, p.stderr.read()
    os.kill(p.pid, signal.SIGINT)
    rc = p.wait(timeout=120)
    assert rc in (-signal.SIGINT, 130), (rc, p.stderr.read())
    assert b"Traceback" not in p.stderr.read()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["azure.csv", "azure.csv.meta.json"]
