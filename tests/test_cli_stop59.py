"""Stop 59, every command as a hostile newcomer: `assignment init` that failed half-way (a full disk, Ctrl-C) left a
half-made course folder behind (nbgrader_config.py and an empty source folder), which its rerun then refused as
"not empty"."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from decodesched.cli import main

from test_cli_hostile2 import UNSHARE, one_line

# ---------------------------------------------------------------- assignment init: every file or none

INIT_ON_FULL_DISK = textwrap.dedent("""
    set -e
    mkdir -p "$DISK"
    mount -t tmpfs -o size=64k tmpfs "$DISK"
    mkdir "$DISK/empty"
    set +e
    for dir in "$DISK/course" "$DISK/a/b/course" "$DISK/empty"; do
        "$PY" -m decodesched.cli assignment init "$dir" 2>>"$DISK.err"
        echo "rc=$?" >> "$DISK.err"
    done
    find "$DISK" > "$DISK.ls"
""")


@pytest.mark.skipif(not UNSHARE, reason="needs root and unshare for a private mount")
def test_assignment_init_on_a_full_disk_leaves_no_half_made_course(tmp_path):
    # The source notebook (the largest file) does not fit: before, DIR/nbgrader_config.py and the empty
    # DIR/source/decode_scheduling/ stayed, and the rerun said "not empty; give a new or empty folder".
    disk = tmp_path / "disk"
    env = dict(os.environ, DISK=str(disk), PY=sys.executable)
    subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", INIT_ON_FULL_DISK], env=env,
                   check=True, timeout=600)
    err = (tmp_path / "disk.err").read_text().splitlines()
    assert err[1::2] == ["rc=2"] * 3, err
    for line, given in zip(err[::2], ("course", "a/b/course", "empty")):
        assert line.startswith(f"decodesched assignment init: error: {disk / given}/") and \
            "no space left on the device" in line, line
    assert sorted((tmp_path / "disk.ls").read_text().split()) == [str(disk), str(disk / "empty")]  # as it was


@pytest.mark.parametrize("existing", [False, True])
def test_assignment_init_stopped_by_ctrl_c_leaves_the_folder_as_it_was(tmp_path, monkeypatch, capsys, existing):
    from decodesched import _io

    real = _io.atomic_writer

    def writer(path, *args, **kwargs):  # Ctrl-C as the last file starts: the others are written
        if os.path.basename(path) == "README.md":
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(_io, "atomic_writer", writer)
    target = tmp_path / "new" / "course"
    if existing:
        target.mkdir(parents=True)
    assert main(["assignment", "init", str(target)]) == 130
    assert one_line(capsys.readouterr().err) == "decodesched assignment init: interrupted"
    assert [str(p.relative_to(tmp_path)) for p in sorted(tmp_path.rglob("*"))] == \
        (["new", "new/course"] if existing else [])
    monkeypatch.setattr(_io, "atomic_writer", real)
    assert main(["assignment", "init", str(target)]) == 0  # (the rerun is not refused as "not empty")
    assert {p.name for p in target.iterdir()} == {"nbgrader_config.py", "README.md", "source"}


# ---------------------------------------------------------------- sweep: one label per trace

@pytest.mark.parametrize("names", [["t.csv", "t.csv", "t#0.csv"], ["t#1.csv", "t.csv", "t.csv"],
                                   ["t.csv", "t.csv", "t#0.csv", "t#0.csv"]])
def test_a_trace_named_like_another_traces_label_keeps_its_rows_apart(tmp_path, monkeypatch, capsys, names):
    # `sweep t.csv t.csv t#0.csv` labelled the second file's rows t#0 too: two traces (of different loads) in one
    # name, which `report` then drew as one.
    import csv

    from test_cli_hostile3 import TRACE

    monkeypatch.chdir(tmp_path)
    for name in set(names):
        (tmp_path / name).write_text(TRACE)
    assert main(["sweep", *names, "--policy", "fcfs", "--kv-blocks", "5", "--threads", "1", "--no-progress",
                 "--out", "m.csv"]) == 0, capsys.readouterr().err
    with open("m.csv", newline="") as fh:
        labels = [row["trace"] for row in csv.DictReader(fh)]
    assert len(set(labels)) == len(names)
    for name, label in zip(names, labels):  # a name that is given once is its label, as before
        if names.count(name) == 1:
            assert label == name[: -len(".csv")]


# ---------------------------------------------------------------- report --loads: each trace's load once

@pytest.mark.parametrize("loads", ["t=1,t=2", "t=1, t=1", "u=2,t=0.5,u=3"])
def test_report_refuses_a_trace_whose_load_is_given_twice(tmp_path, loads):
    # `--loads t=1,t=2` drew t at load 2 and said nothing of the 1 (a sweep's `--kv-blocks 9,9` and a report's
    # `--policy fcfs,fcfs` are refused).
    from test_cli_hostile3 import run

    out = tmp_path / "report"
    code, _, err = run(["report", str(tmp_path / "m.csv"), "--out", str(out), "--loads", loads])
    twice = "t" if loads.startswith("t") else "u"
    assert code == 2 and one_line(err) == (f"decodesched report: error: argument --loads: {twice!r} is given "
                                                 f"twice in {loads!r}; give each trace's load once (see --help)")
    assert not out.exists()
