"""A second hostile newcomer: standard output as a sweep's --out, traces read from `<(command)`, outputs in
folders that take no file, a report into a mount point, and the memory a long sweep keeps."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

from decodesched.batch import grid, simulate_batch, write_metrics_csv
from decodesched.cli import main
from decodesched.trace import TRACE_COLUMNS, load_trace

TRACE = ["1,0,4,3,0,false,2,,true", "2,0,2,2,5,true,3,10,true", "3,1,3,4,1,false,4,6,false",
         "-4,2,5,1,-2,false,1,,true"]
TEXT = ",".join(TRACE_COLUMNS) + "\n" + "\n".join(TRACE) + "\n"
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
UNSHARE = shutil.which("unshare") is not None and ROOT


@pytest.fixture
def trace_csv(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(TEXT)
    return p


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


class _ClosedPipe:
    """Standard output whose reader has gone (`... | head`)."""

    def __init__(self):
        self.buffer = self

    def write(self, data):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass

    def fileno(self):
        raise OSError("no descriptor")


def test_a_sweep_to_standard_output_leaves_no_checkpoint_in_the_current_folder(trace_csv, tmp_path, capsys,
                                                                                 monkeypatch):
    # `decodesched sweep ... --out - | head` left ./-.partial.jsonl behind, named after no file.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["sweep", str(trace_csv), "--policy", "fcfs,aging", "--kv-blocks", "4,5,6", "--threads", "1",
                 "--out", "-"]) == 2
    assert "the reader closed the pipe" in one_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_sweep_help_says_standard_output_keeps_no_checkpoint(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert "no checkpoint" in " ".join(capsys.readouterr().out.split())


def _pipe_path(text: str) -> tuple[str, int]:
    """A `<(cat trace.csv)` path: /dev/fd/N, the read end of a pipe that holds `text`."""
    read, write = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write, text.encode()), os.close(write)))
    writer.start()
    writer.join()
    return f"/dev/fd/{read}", read


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd")
def test_a_trace_from_a_process_substitution_is_labelled_a_pipe_not_its_descriptor(tmp_path, capsys):
    path, fd = _pipe_path(TEXT)
    try:
        out = tmp_path / "m.csv"
        assert main(["sweep", path, "--policy", "fcfs", "--kv-blocks", "5", "--threads", "1", "--out", str(out)]) == 0
    finally:
        os.close(fd)
    capsys.readouterr()
    assert out.read_text().splitlines()[1].split(",")[0] == "pipe"
    path, fd = _pipe_path(TEXT)
    try:
        assert main(["simulate", path, "--policy", "fcfs", "--kv-blocks", "5"]) == 0
    finally:
        os.close(fd)
    assert capsys.readouterr().out.startswith("pipe: 4 requests")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
@pytest.mark.parametrize("command", [
    ["sweep", "{trace}", "--policy", "fcfs", "--kv-blocks", "5", "--threads", "1", "--out", "/proc/x.csv"],
    ["trace", "convert", "{azure}", "--load", "1", "--out", "/proc/x.csv"],
])
def test_an_output_in_a_folder_that_takes_no_file_names_the_output_given(trace_csv, tmp_path, capsys, command):
    # The sweep wrote its checkpoint there first, and named it (/proc/x.csv.partial.jsonl); convert named
    # the sidecar it writes first.
    azure = tmp_path / "az.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n"
                     "2023-11-16 18:15:50.99,396,109\n")
    argv = [a.format(trace=trace_csv, azure=azure) for a in command]
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert "/proc/x.csv: cannot write in /proc" in line and ".partial.jsonl" not in line and "meta.json" not in line


REPORT_INTO_MOUNT = textwrap.dedent("""
    set -e
    mkdir -p "$OUT"
    mount -t tmpfs -o size=16m tmpfs "$OUT"
    set +e
    "$PY" -m decodesched.cli report "$RESULTS" --out "$OUT" 2>"$OUT.err"
    echo "rc=$?" >> "$OUT.err"
    ls -A "$OUT" > "$OUT.ls"
""")


@pytest.mark.skipif(not UNSHARE, reason="needs root and unshare for a private mount")
def test_a_report_into_a_folder_that_is_a_mount_point_is_written(trace_csv, tmp_path):
    # (`docker run -v ./out:/out ... --out /out`): the figures were made in a folder beside it, on the parent's
    # file system, and the move failed: "cannot move a file across file systems", every time.
    traces = [load_trace(trace_csv)]
    results = tmp_path / "m.csv"
    write_metrics_csv(simulate_batch(traces, grid(traces, ["fcfs", "aging"], [5, 8], [4])).rows(), results)
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), RESULTS=str(results), PY=sys.executable)
    subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", REPORT_INTO_MOUNT], env=env,
                   check=True, timeout=600)
    err = (tmp_path / "out.err").read_text().strip().splitlines()
    assert err[-1] == "rc=0", err
    assert "index.html" in (tmp_path / "out.ls").read_text().split()


def test_a_long_sweep_keeps_its_rows_with_shared_column_names(trace_csv):
    # 58,000 scenarios took 875 MB: every row spelled its own copy of each column name (~5 KB a row).
    from decodesched.checkpoint import run_local

    traces = [load_trace(trace_csv)]
    rows = run_local(traces, grid(traces, ["aging"], list(range(5, 25)), [1, 2]), chunk_size=16, threads=1)
    assert len(rows) == 40
    names = {k: k for k in rows[0]}
    assert all(k is names[k] for row in rows for k in row)  # one str object per column name, in every chunk


def test_a_chunk_of_a_sweep_prepares_only_the_traces_it_replays(trace_csv, monkeypatch):
    # `sweep --replicates 5000` handed all 5,000 traces to each chunk of 16 scenarios, which prepared and labelled
    # every one of them: 254 s, nearly all of it on traces the chunk did not replay (8.7 s now).
    from decodesched import batch
    from decodesched.batch import replicate_traces
    from decodesched.checkpoint import run_local

    traces = replicate_traces([load_trace(trace_csv)], 40)
    scenarios = grid(1, ["fcfs", "aging"], [5, 9], [2], replicates=40)
    expected = simulate_batch(traces, scenarios, threads=1).rows()
    real, given = batch.simulate_batch, []

    def spy(chunk_traces, chunk_scenarios, **kwargs):
        given.append(len(chunk_traces))
        return real(chunk_traces, chunk_scenarios, **kwargs)

    monkeypatch.setattr(batch, "simulate_batch", spy)
    rows = run_local(traces, scenarios, chunk_size=16, threads=1)
    assert len(given) == 10 and max(given) <= 16, given
    assert rows == expected or all(_same_row(a, b) for a, b in zip(rows, expected, strict=True))


def _same_row(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(x == y or (x != x and y != y) for x, y in zip(a.values(), b.values()))


def test_trace_without_an_action_is_one_line(capsys):
    # It printed its whole help (12 lines) on stderr; `decodesched assignment` alone says one line.
    assert main(["trace"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("decodesched trace: error: say what to do") and "inspect" in line


@pytest.mark.parametrize("option", ["--slo-factor", "--deadline-fraction", "--priority-weights"])
@pytest.mark.parametrize("value", ["1_0", "\u0663"])
def test_convert_reads_its_numbers_as_strictly_as_load(tmp_path, capsys, option, value):
    # `float` took `--slo-factor 1_0` as 10 and Arabic-Indic digits, where `--load 1_0` is refused.
    azure = tmp_path / "az.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n"
                     "2023-11-16 18:15:50.99,396,109\n")
    out = tmp_path / "cv.csv"
    argv = ["trace", "convert", str(azure), "--load", "1", "--priority-classes", "1", option, value, "--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert f"argument {option}: expected" in one_line(capsys.readouterr().err)
    assert not out.exists()


def _bom(path):
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())


def test_a_sweep_csv_and_a_table_saved_with_a_byte_order_mark_read_as_without(trace_csv, tmp_path, capsys):
    # docs/files.md: every CSV reader takes UTF-8 with or without a BOM (what spreadsheet programs write);
    # `report` said "not a sweep metrics CSV (no column trace)", `read_table` "not an events or requests table".
    from decodesched.tables_io import read_table

    traces = [load_trace(trace_csv)]
    results = tmp_path / "m.csv"
    write_metrics_csv(simulate_batch(traces, grid(traces, ["fcfs", "aging"], [5, 8], [4])).rows(), results)
    _bom(results)
    assert main(["report", str(results), "--out", str(tmp_path / "rep")]) == 0, capsys.readouterr().err
    assert (tmp_path / "rep" / "index.html").is_file()
    events = tmp_path / "ev.csv"
    assert main(["simulate", str(trace_csv), "--policy", "fcfs", "--kv-blocks", "5", "--events", str(events)]) == 0
    plain = read_table(events)
    _bom(events)
    with_bom = read_table(events)
    assert list(with_bom) == list(plain) and all(with_bom[k].tolist() == plain[k].tolist() for k in plain)


def test_a_sweep_csv_with_a_column_twice_is_refused(trace_csv, tmp_path, capsys):
    # The rows kept the last of the two cells without a word (the trace reader refuses a duplicate column).
    traces = [load_trace(trace_csv)]
    results = tmp_path / "m.csv"
    write_metrics_csv(simulate_batch(traces, grid(traces, ["fcfs", "aging"], [5, 8], [4])).rows(), results)
    lines = results.read_text().splitlines()
    results.write_text("\n".join([lines[0] + ",policy"] + [line + ",fcfs" for line in lines[1:]]) + "\n")
    out = tmp_path / "rep"
    assert main(["report", str(results), "--out", str(out)]) == 2
    assert one_line(capsys.readouterr().err).endswith("m.csv: duplicate column(s) policy")
    assert not out.exists()
