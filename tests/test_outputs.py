"""Every output goes through `_io.atomic_writer`: regular files atomically; directories, devices, FIFOs
and sockets refused; symlinks written through (never replaced); inputs, sidecars and duplicate outputs
refused; read-only file systems, full disks, missing folders and closed pipes one line, exit 2, no
temporary file.  Device nodes and private mounts need root (skipped otherwise)."""

from __future__ import annotations

import io
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from decodesched import tables_io
from decodesched._io import atomic_writer, check_outputs
from decodesched.cli import main
from decodesched.errors import OutputError, UserError
from decodesched.trace import TRACE_COLUMNS

ROOT = os.geteuid() == 0
UNSHARE = shutil.which("unshare") is not None and ROOT

TRACE = ["1,0,4,3,0,false,2,,true", "2,1,2,2,2,true,2,8,true", "3,1,3,1,1,false,2,,true"]


@pytest.fixture
def trace_csv(tmp_path):
    p = tmp_path / "trace.csv"
    p.write_text(",".join(TRACE_COLUMNS) + "\n" + "\n".join(TRACE) + "\n")
    (tmp_path / "trace.csv.meta.json").write_text('{"steps_per_second": 10.0}\n')
    return p


@pytest.fixture
def long_trace(tmp_path):
    """A trace whose event log (~16,000 events, ~800 KB) is far more than a pipe holds."""
    p = tmp_path / "long.csv"
    rows = (f"{i},{i},8,40,{i % 3},false,2,,true" for i in range(400))
    p.write_text(",".join(TRACE_COLUMNS) + "\n" + "\n".join(rows) + "\n")
    return p


def simulate(trace, *extra):
    return main(["simulate", str(trace), "--policy", "aging", "--kv-blocks", "4", *extra])


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and len(lines[0]) <= 300
    return lines[0]


def no_temp_files(folder) -> bool:
    return not [p for p in os.listdir(folder) if p.endswith(".tmp")]


def test_regular_file_replaced_atomically_keeping_its_mode(tmp_path):
    target = tmp_path / "out.csv"
    target.write_text("old\n")
    target.chmod(0o640)
    with atomic_writer(target) as fh:
        fh.write("new\n")
    assert target.read_text() == "new\n" and stat.S_IMODE(target.stat().st_mode) == 0o640
    with pytest.raises(RuntimeError):
        with atomic_writer(target) as fh:
            fh.write("partial")
            raise RuntimeError("boom")
    assert target.read_text() == "new\n" and no_temp_files(tmp_path)


def test_symlink_is_written_through_and_stays_a_link(tmp_path):
    real = tmp_path / "real.csv"
    real.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    with atomic_writer(link) as fh:
        fh.write("new\n")
    assert link.is_symlink() and os.readlink(link) == str(real) and real.read_text() == "new\n"
    dangling = tmp_path / "dangling.csv"
    dangling.symlink_to(tmp_path / "later.csv")
    with atomic_writer(dangling) as fh:
        fh.write("x\n")
    assert dangling.is_symlink() and (tmp_path / "later.csv").read_text() == "x\n"


def test_symlink_loop_and_link_to_a_folder_are_refused(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(OutputError):
        with atomic_writer(loop) as fh:
            fh.write("x")
    (tmp_path / "d").mkdir()
    to_dir = tmp_path / "to_dir"
    to_dir.symlink_to(tmp_path / "d")
    with pytest.raises(OutputError, match="is a directory"):
        with atomic_writer(to_dir) as fh:
            fh.write("x")
    assert to_dir.is_symlink() and no_temp_files(tmp_path)


def test_directory_fifo_and_socket_are_refused_and_left_alone(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        for target, word in ((tmp_path, "directory"), (fifo, "FIFO"), (sock_path, "socket")):
            with pytest.raises(OutputError, match=word):
                with atomic_writer(target) as fh:
                    fh.write("x")
        assert stat.S_ISFIFO(os.stat(fifo).st_mode) and stat.S_ISSOCK(os.stat(sock_path).st_mode)
    finally:
        sock.close()
    assert no_temp_files(tmp_path)


@pytest.mark.skipif(not ROOT, reason="mknod needs root")
@pytest.mark.parametrize("minor", [3, 7])  # a private /dev/null and /dev/full
def test_device_nodes_are_refused_by_every_writer(tmp_path, trace_csv, capsys, minor):
    dev = tmp_path / "dev"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    assert simulate(trace_csv, "--events", str(dev)) == 2
    assert "device" in one_line(capsys.readouterr().err)
    assert main(["sweep", str(trace_csv), "--policy", "aging", "--kv-blocks", "4", "--out", str(dev)]) == 2
    assert main(["trace", "convert", "bundled", "--load", "1", "--requests", "20", "--out", str(dev)]) == 2
    capsys.readouterr()
    assert stat.S_ISCHR(os.stat(dev).st_mode) and os.stat(dev).st_rdev == os.makedev(1, minor)
    assert sorted(os.listdir(tmp_path)) == ["dev", "trace.csv", "trace.csv.meta.json"]


@pytest.mark.parametrize("name", ["m.parquet", "m.PQ", "m.json", "metrics"])
def test_sweep_refuses_an_out_name_that_is_not_csv(tmp_path, trace_csv, capsys, name):
    """A metrics file named for another format would hold CSV that `report` then reads as that format."""
    before = sorted(os.listdir(tmp_path))
    assert main(["sweep", str(trace_csv), "--policy", "fcfs", "--kv-blocks", "4", "--out", str(tmp_path / name)]) == 2
    assert ".csv" in one_line(capsys.readouterr().err)
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, no checkpoint either


def test_sweep_takes_a_csv_name_in_any_case(tmp_path, trace_csv, capsys):
    assert main(["sweep", str(trace_csv), "--policy", "fcfs", "--kv-blocks", "4", "--out", str(tmp_path / "M.CSV")]) == 0
    capsys.readouterr()
    assert (tmp_path / "M.CSV").read_text().startswith("trace,")


def test_outputs_that_are_inputs_sidecars_or_each_other_are_refused(tmp_path, trace_csv, capsys):
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    side = str(trace_csv) + ".meta.json"
    link = tmp_path / "alias.csv"
    link.symlink_to(trace_csv)
    cases = [
        ["--events", str(trace_csv)],
        ["--events", str(link)],
        ["--requests", side],
        ["--events", str(tmp_path / "x.csv"), "--requests", str(tmp_path / "." / "x.csv")],
        ["--events", "-", "--requests", "-"],
    ]
    for extra in cases:
        assert simulate(trace_csv, *extra) == 2, extra
        one_line(capsys.readouterr().err)
    assert main(["sweep", str(trace_csv), "--policy", "aging", "--kv-blocks", "4", "--out", side]) == 2
    assert "sidecar" in one_line(capsys.readouterr().err)
    link.unlink()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    with pytest.raises(UserError):
        check_outputs([tmp_path / "a.csv", tmp_path / "a.csv"])
    check_outputs([tmp_path / "a.csv", tmp_path / "b.csv", None], [trace_csv])


def test_a_result_never_overwrites_the_file_its_trace_was_read_from(tmp_path, trace_csv):
    """Found by pointing the Python API's writers at their inputs: `result.write_requests(trace_path)`
    replaced the trace with the requests table.  A trace read from a file remembers it (`Trace.source`,
    kept by `subset`), and a result's writers refuse it and its sidecar as the CLI does."""
    from decodesched import simulate as run

    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    result = run(str(trace_csv), "aging", 4)
    assert result.trace.source == trace_csv and result.trace.subset([0]).source == trace_csv
    alias = tmp_path / "alias.csv"
    alias.symlink_to(trace_csv)
    for path in (trace_csv, str(trace_csv) + ".meta.json", alias, tmp_path / "." / "trace.csv"):
        for write in (result.write_events, result.write_requests):
            with pytest.raises(UserError, match="refusing to overwrite it"):
                write(path)
    alias.unlink()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    result.write_requests(tmp_path / "requests.csv")  # any other name is written
    assert (tmp_path / "requests.csv").read_text().startswith("request_id,")


@pytest.mark.parametrize("name, message", [("", "an empty file name"), ("x" * 300 + ".csv", "file name too long"),
                                           ("trace.csv/x.csv", "not a folder")])
def test_bad_output_names_are_one_line_errors_in_the_api_too(tmp_path, trace_csv, name, message):
    from decodesched import simulate as run

    result = run(str(trace_csv), "aging", 4)
    with pytest.raises(OutputError, match=message):
        result.write_events(name if not name or name.startswith("x") else str(tmp_path / name))


@pytest.mark.parametrize("name", ["ev.json", "ev.csv.gz", "ev", "ev.txt"])
@pytest.mark.parametrize("option", ["--events", "--requests"])
def test_a_table_name_of_another_format_is_refused_before_the_replay(tmp_path, trace_csv, capsys, name, option):
    target = tmp_path / name
    target.write_text("kept\n")  # an existing file of that name stays as it was
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert simulate(trace_csv, option, str(target)) == 2
    captured = capsys.readouterr()
    assert ".csv" in one_line(captured.err) and str(target) in captured.err
    assert captured.out == ""  # refused before the replay: no summary table
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    import decodesched

    result = decodesched.simulate(decodesched.load_trace(trace_csv), "aging", 4, 4)
    for write in (result.write_events, result.write_requests):
        with pytest.raises(UserError, match="csv"):
            write(target)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_table_extensions_are_read_in_any_case(tmp_path, trace_csv):
    assert tables_io.table_format("-") == "csv"
    assert tables_io.table_format(tmp_path / "A.CSV") == "csv"
    assert tables_io.table_format(tmp_path / "a.Parquet") == tables_io.table_format("b.PQ") == "parquet"
    assert simulate(trace_csv, "--events", str(tmp_path / "EV.CSV")) == 0
    assert simulate(trace_csv, "--events", str(tmp_path / "ev.csv")) == 0
    upper, lower = tables_io.read_table(tmp_path / "EV.CSV"), tables_io.read_table(tmp_path / "ev.csv")
    assert len(lower["step"]) == 9 and tables_io.tables_equal(upper, lower)  # 3 prefills + 6 tokens


def test_missing_folder_is_one_line(tmp_path, trace_csv, capsys):
    assert simulate(trace_csv, "--requests", str(tmp_path / "nope" / "rq.csv")) == 2
    assert "no such directory" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "nope").exists()


def test_dash_streams_a_table_to_stdout_and_the_summary_to_stderr(trace_csv, capsys):
    assert simulate(trace_csv, "--events", "-") == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == ",".join(name for name, _ in tables_io.EVENT_SCHEMA)
    assert "queue_wait P50" in err and "queue_wait" not in out


def test_closed_pipe_is_one_line_and_exit_2(trace_csv):
    with subprocess.Popen([sys.executable, "-m", "decodesched.cli", "simulate", str(trace_csv), "--policy", "fcfs",
                           "--kv-blocks", "4", "--events", "-"], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as p:
        p.stdout.close()  # the reader goes away before anything is written, as `| head -0` would
        err = p.stderr.read().decode()
        assert p.wait(timeout=300) == 2
    assert "pipe" in one_line(err)


class _Trickle(io.RawIOBase):
    """A raw stream that takes at most 1,000 bytes a write, as standard output's raw file (``python
    -u``, PYTHONUNBUFFERED) may when a signal comes or the reader closes the pipe mid-write."""

    def __init__(self):
        self.data = bytearray()

    def writable(self):
        return True

    def write(self, b):
        n = min(len(b), 1000)
        self.data += bytes(b[:n])
        return n


@pytest.mark.parametrize("mode", ["wb", "w"])
def test_standard_output_gets_every_byte_from_a_raw_file_that_takes_part(monkeypatch, mode):
    raw = _Trickle()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8", write_through=True))
    text = "".join(f"{i},é,{i * i}\n" for i in range(5000))  # 60 KB, one non-ASCII letter a line
    with atomic_writer("-", mode) as fh:
        fh.write(text.encode() if mode == "wb" else text)
    assert raw.data.decode() == text


def test_reader_closing_mid_write_is_exit_2_unbuffered_too(long_trace):
    # Under PYTHONUNBUFFERED the write that the reader's close cuts short returned part of the data,
    # which was dropped: exit 0, the table cut without a word.  The rest is written again now, and
    # meets the closed pipe.
    with subprocess.Popen([sys.executable, "-m", "decodesched.cli", "simulate", str(long_trace), "--policy", "fcfs",
                           "--kv-blocks", "64", "--events", "-"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as p:
        assert p.stdout.read(1000).startswith(b"step,request_id")  # it is writing: read a little, then go
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait(timeout=300) == 2
    assert "pipe" in one_line(err)


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_a_non_blocking_standard_output_gets_the_whole_table(long_trace, tmp_path, unbuffered):
    # A parent may leave the pipe non-blocking: a full pipe then made the write fail ("could not
    # complete without blocking", exit 2) instead of waiting for the reader.
    argv = [sys.executable, "-m", "decodesched.cli", "simulate", str(long_trace), "--policy", "fcfs", "--kv-blocks",
            "64"]
    assert main(argv[3:] + ["--events", str(tmp_path / "e.csv")]) == 0
    with subprocess.Popen(argv + ["--events", "-"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          preexec_fn=lambda: os.set_blocking(1, False),
                          env={**os.environ, "PYTHONUNBUFFERED": unbuffered}) as p:
        time.sleep(1)  # the pipe fills while nobody reads
        out = p.stdout.read()
        assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    assert out == (tmp_path / "e.csv").read_bytes()


def test_closed_standard_output_is_one_line_and_exit_2_before_any_work(trace_csv, tmp_path):
    # `cmd >&-`: Python sets sys.stdout to None and print() drops every line, so the summary vanished
    # with exit 0, and `--events -` ended in a traceback (exit 1).
    events = tmp_path / "e.csv"
    for extra in (["--events", str(events)], ["--events", "-"]):
        p = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "decodesched.cli", "simulate",
                            str(trace_csv), "--policy", "fcfs", "--kv-blocks", "4", *extra],
                           stderr=subprocess.PIPE, text=True, timeout=300)
        assert p.returncode == 2
        assert "standard output is closed" in one_line(p.stderr)
        assert not events.exists()


def test_writing_to_standard_output_when_there_is_none_is_an_output_error(monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(OutputError, match="standard output is closed"):
        with atomic_writer("-", "wb") as fh:
            fh.write(b"x")


@pytest.mark.parametrize("target", ["closed pipe", "/dev/full"])
def test_a_summary_that_cannot_be_written_is_one_line_and_exit_2(trace_csv, target):
    # Buffered standard output kept the summary until the exit's flush, whose error Python reports
    # itself: "Exception ignored ... BrokenPipeError" (or OSError), exit status 120.
    argv = [sys.executable, "-m", "decodesched.cli", "simulate", str(trace_csv), "--policy", "fcfs", "--kv-blocks", "4"]
    env = {**os.environ, "PYTHONUNBUFFERED": ""}
    if target == "closed pipe":
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as p:
            p.stdout.close()
            err = p.stderr.read().decode()
            status = p.wait(timeout=300)
    else:
        with open(target, "w") as full:
            p = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, env=env, timeout=300)
        err, status = p.stderr.decode(), p.returncode
    assert status == 2
    assert ("pipe" if target == "closed pipe" else "no space left") in one_line(err)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["simulate", "--help"]])
def test_help_that_cannot_be_written_is_one_line_and_exit_2(args):
    # argparse prints and exits before any command runs: the exit's flush failed, status 120.
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "decodesched.cli", *args], stdout=full, stderr=subprocess.PIPE,
                           env={**os.environ, "PYTHONUNBUFFERED": ""}, timeout=300)
    assert p.returncode == 2
    assert "no space left" in one_line(p.stderr.decode())


def test_closed_pipe_for_both_streams_is_still_exit_2(trace_csv):
    # `cmd 2>&1 | head -0`: the error line has nowhere to go either; the status must still say it (it
    # was 1, from the traceback Python could not print).
    read, write = os.pipe()
    p = subprocess.Popen([sys.executable, "-m", "decodesched.cli", "simulate", str(trace_csv), "--policy", "fcfs",
                          "--kv-blocks", "4", "--events", "-"], stdout=write, stderr=write)
    os.close(write)
    os.close(read)
    assert p.wait(timeout=300) == 2


RUN_IN_MOUNT = textwrap.dedent("""
    set -e
    mkdir -p "$MNT"
    mount -t tmpfs -o "$OPTS" tmpfs "$MNT"
    cp "$TRACE" "$MNT/trace.csv" 2>/dev/null || true
    [ -n "$READONLY" ] && mount -o remount,ro "$MNT"
    set +e
    "$PY" -m decodesched.cli "$@" 2>"$MNT.err"
    echo "rc=$?" >> "$MNT.err"
    ls -A "$MNT" > "$MNT.ls"
""")


def run_in_private_mount(tmp_path, opts, readonly, args):
    mnt = tmp_path / "mnt"
    env = dict(os.environ, MNT=str(mnt), OPTS=opts, READONLY="1" if readonly else "", PY=sys.executable,
               TRACE=str(tmp_path / "trace.csv"))
    subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", RUN_IN_MOUNT, "sh", *args],
                   env=env, check=True, timeout=600)
    err = (tmp_path / "mnt.err").read_text().strip().splitlines()
    return err[:-1], int(err[-1].split("=")[1]), (tmp_path / "mnt.ls").read_text().split()


@pytest.mark.skipif(not UNSHARE, reason="needs root and unshare for a private mount")
def test_read_only_file_system_is_one_line_and_leaves_nothing(tmp_path, trace_csv):
    mnt = tmp_path / "mnt"
    err, rc, listing = run_in_private_mount(
        tmp_path, "size=1m", True, ["simulate", str(trace_csv), "--policy", "fcfs", "--kv-blocks", "4",
                                    "--events", str(mnt / "ev.csv")])
    assert rc == 2 and len(err) == 1 and "read-only file system" in err[0], err
    assert listing == ["trace.csv"]


@pytest.mark.skipif(not UNSHARE, reason="needs root and unshare for a private mount")
def test_full_disk_is_one_line_and_leaves_no_temp_file(tmp_path):
    big = tmp_path / "trace.csv"  # enough events to overflow a 64 KiB file system
    rows = [f"{i},{i},8,40,{i % 3},false,1,,true" for i in range(200)]
    big.write_text(",".join(TRACE_COLUMNS) + "\n" + "\n".join(rows) + "\n")
    mnt = tmp_path / "mnt"
    err, rc, listing = run_in_private_mount(
        tmp_path, "size=64k", False, ["simulate", str(big), "--policy", "fcfs", "--kv-blocks", "400",
                                      "--events", str(mnt / "ev.csv")])
    assert rc == 2 and len(err) == 1 and "no space left" in err[0], err
    assert listing == ["trace.csv"]


@pytest.mark.skipif(not UNSHARE, reason="needs root and unshare for a private mount")
def test_demo_on_a_read_only_file_system_says_so_before_working(tmp_path):
    (tmp_path / "trace.csv").write_text(",".join(TRACE_COLUMNS) + "\n" + "\n".join(TRACE) + "\n")
    mnt = tmp_path / "mnt"
    err, rc, listing = run_in_private_mount(tmp_path, "size=1m", True,
                                            ["demo", "--requests", "20", "--out", str(mnt / "demo")])
    assert rc == 2 and len(err) == 1 and "read-only" in err[0], err
    assert listing == ["trace.csv"]


@pytest.mark.parametrize("command", [
    ["simulate", "{}", "--policy", "fcfs", "--kv-blocks", "4"],
    ["trace", "inspect", "{}"],
    ["trace", "convert", "{}", "--format", "azure", "--load", "1", "--out", "{out}"],
    ["report", "{}", "--out", "{out}"],
])
def test_inputs_that_never_end_or_are_not_files_are_refused(command, tmp_path, capsys):
    """A device (``/dev/zero`` would be read forever), a socket or a folder as an input: one line, exit
    2, before anything is read; nothing is written."""
    sock_path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        for source, kind in (("/dev/zero", "is a device"), (str(sock_path), "is a socket"),
                             (str(tmp_path), "is a directory")):
            out = tmp_path / "out.csv"
            argv = [a.format(source, out=out) for a in command]
            assert main(argv) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and kind in err[0], err
            assert sorted(p.name for p in tmp_path.iterdir()) == ["s.sock"]
    finally:
        sock.close()


def test_a_fifo_input_is_read(trace_csv, tmp_path, capsys):
    """A FIFO (what ``<(command)`` gives) is a fine input: it ends when its writer closes it."""
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", f"import shutil; shutil.copyfileobj(open({str(trace_csv)!r}), "
                               f"open({str(fifo)!r}, 'w'))"])
    try:
        assert main(["simulate", str(fifo), "--policy", "fcfs", "--kv-blocks", "4"]) == 0
    finally:
        writer.wait(timeout=60)
    assert "3 requests" in capsys.readouterr().out


def test_a_command_that_fails_at_its_second_output_keeps_the_first_as_it_was(tmp_path, trace_csv, capsys):
    """`--events A --requests B` where B cannot be written (a folder of /proc, where not even root
    creates files): exit 2, and A still holds what it held (the files of one command appear together,
    `_io.output_group`)."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux's /proc")
    events = tmp_path / "events.csv"
    events.write_text("OLD\n")
    assert simulate(trace_csv, "--events", str(events), "--requests", "/proc/decodesched-test.csv") == 2
    one_line(capsys.readouterr().err)
    assert events.read_text() == "OLD\n" and no_temp_files(tmp_path)


def test_an_output_group_renames_nothing_when_its_block_fails_and_everything_when_it_ends(tmp_path):
    from decodesched._io import output_group

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("old a\n")
    with pytest.raises(KeyboardInterrupt):
        with output_group():
            with atomic_writer(a) as fh:
                fh.write("new a\n")
            assert a.read_text() == "old a\n"  # (written, not yet in place)
            with atomic_writer(b) as fh:
                fh.write("new b\n")
            raise KeyboardInterrupt  # Ctrl-C after both were written, before the block ended
    assert a.read_text() == "old a\n" and not b.exists() and no_temp_files(tmp_path)
    with output_group():
        with output_group():  # an inner group joins the outer one
            with atomic_writer(a) as fh:
                fh.write("new a\n")
        assert a.read_text() == "old a\n"
        with atomic_writer(b) as fh:
            fh.write("new b\n")
    assert a.read_text() == "new a\n" and b.read_text() == "new b\n" and no_temp_files(tmp_path)


@pytest.mark.parametrize("length", [200, 245, 251])
def test_the_longest_legal_output_names_are_written(tmp_path, trace_csv, capsys, length):
    """A name of up to 255 bytes is legal; its temporary twin must stay under that limit too."""
    name = tmp_path / ("e" * length + ".csv")
    assert simulate(trace_csv, "--events", str(name)) == 0, capsys.readouterr().err
    assert name.read_text().startswith("step,") and no_temp_files(tmp_path)


def test_a_name_that_ends_in_a_slash_is_a_folder_not_a_file(tmp_path, trace_csv, capsys):
    """`--events out.csv/` asks for a folder; pathlib would quietly write the file out.csv."""
    target = str(tmp_path / "out.csv") + "/"
    assert simulate(trace_csv, "--events", target) == 2
    assert "names a folder" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "out.csv").exists() and no_temp_files(tmp_path)


def test_an_output_group_whose_later_target_became_a_folder_renames_none(tmp_path):
    """All targets are checked before the first rename: a folder that appeared at the second target
    while the group was writing leaves the first file as it was too."""
    from decodesched._io import output_group

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("old a\n")
    with pytest.raises(OutputError, match="is a directory"):
        with output_group():
            with atomic_writer(a) as fh:
                fh.write("new a\n")
            with atomic_writer(b) as fh:
                fh.write("new b\n")
            b.mkdir()  # (after its file was written, before the group ends)
    assert a.read_text() == "old a\n" and b.is_dir() and no_temp_files(tmp_path)
