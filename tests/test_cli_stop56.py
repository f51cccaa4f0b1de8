"""Stop 56, the CLI as a hostile newcomer: Ctrl-C while NumPy imports `datetime` (an ImportError without a trace of
the interrupt), a CSV trace with an old Mac's lone CR line ends, `trace convert --cache-min-blocks 0`, `demo --out` in
folders that do not exist yet or naming none, a command started with standard error closed, and two commands writing
the same pair of files at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from decodesched import load_trace
from decodesched.cli import main
from decodesched.trace import TRACE_COLUMNS

from test_cli_hostile3 import AZURE, MOONCAKE, TRACE, one_line, run

# A signal delivered, in a fresh process, at the moment NumPy's C extension imports `datetime` (by PyCapsule_Import,
# which replaces the KeyboardInterrupt or `Terminated` by `ImportError: PyCapsule_Import could not import module ...`).
_SIGNAL_IN_DATETIME = textwrap.dedent("""\
    import os, signal, sys

    class Hook:
        def find_spec(self, name, path=None, target=None):
            if name == "datetime" and "numpy" in sys.modules:
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.{sig})
            return None

    assert "numpy" not in sys.modules and "datetime" not in sys.modules
    sys.meta_path.insert(0, Hook())
    from decodesched.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("sig, status, line", [("SIGINT", 130, "decodesched trace inspect: interrupted"),
                                               ("SIGTERM", 143, "decodesched trace inspect: terminated (SIGTERM)")])
def test_a_signal_while_numpy_imports_datetime_is_the_interrupt_line(tmp_path, sig, status, line):
    # Before: exit 1 and two tracebacks ending in NumPy's "Importing the numpy C-extensions failed" ImportError.
    script = tmp_path / "hook.py"
    script.write_text(_SIGNAL_IN_DATETIME.replace("{sig}", sig))
    done = subprocess.run([sys.executable, str(script), "trace", "inspect", str(tmp_path / "none.csv")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert (done.returncode, done.stderr, done.stdout) == (status, line + "\n", "")


def test_a_bug_after_no_signal_is_still_a_traceback(monkeypatch):
    # The record of signals turns an exception into the interrupt line only when a signal came.
    import decodesched.cli as cli

    def boom(argv):
        raise ImportError("not an interrupt")

    monkeypatch.setattr(cli, "_main", boom)
    with pytest.raises(ImportError, match="not an interrupt"):
        main([])
    assert signal.set_wakeup_fd(-1) == -1  # (and no wakeup fd is left behind)


def test_the_command_leaves_no_wakeup_fd_or_descriptor_behind(tmp_path):
    def open_fds():
        return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0

    run(["trace", "inspect", str(tmp_path / "none.csv")])  # (the modules it imports may open files once)
    before = open_fds()
    for _ in range(3):
        assert run(["trace", "inspect", str(tmp_path / "none.csv")])[0] == 2
    assert signal.set_wakeup_fd(-1) == -1
    assert open_fds() == before


# ---------------------------------------------------------------- lone CR line ends (an old Mac's CSV)


@pytest.mark.parametrize("blank", [False, True])
def test_a_trace_with_lone_cr_line_ends_reads_as_with_newlines(tmp_path, blank):
    # Before: "line 1: unreadable CSV (new-line character seen in unquoted field - do you need to open the file in
    # universal-newline mode?)", where the Azure, table and sweep readers took the same line ends.
    lf = tmp_path / "lf.csv"
    lf.write_text(TRACE)
    cr = tmp_path / "cr.csv"
    cr.write_bytes(TRACE.replace("\n", "\r\r" if blank else "\r").encode())
    a, b = load_trace(lf), load_trace(cr)
    for name in TRACE_COLUMNS:
        assert np.ma.allequal(getattr(a, name), getattr(b, name)), name
    assert run(["trace", "inspect", str(cr)])[0] == 0


def test_a_bad_cell_after_lone_cr_line_ends_names_its_line(tmp_path):
    cr = tmp_path / "cr.csv"
    cr.write_bytes((TRACE + "3,2,1,1,0,maybe,1,,true\n").replace("\n", "\r").encode())
    code, _, err = run(["trace", "inspect", str(cr)])
    assert code == 2
    assert "row 3 (line 4), column cache_hit" in one_line(err), err


# ---------------------------------------------------------------- trace convert --cache-min-blocks


@pytest.mark.parametrize("source", ["azure.csv", "mooncake.jsonl"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_cache_min_blocks_below_one_is_refused_naming_the_option(tmp_path, source, value):
    # Before: a Mooncake source said "cache_min_blocks must be >= 1" (the API's keyword) after reading the file; an
    # Azure one took 0 (or -3) silently and wrote it into nothing.
    src = tmp_path / source
    src.write_text(AZURE if source.endswith(".csv") else MOONCAKE)
    code, out, err = run(["trace", "convert", str(src), "--load", "1", "--cache-min-blocks", value,
                          "--out", str(tmp_path / "out.csv")])
    assert (code, out) == (2, "")
    assert one_line(err) == f"decodesched trace convert: error: --cache-min-blocks must be >= 1, got {value}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [source]


def test_convert_help_states_the_range_of_cache_min_blocks(capsys):
    with pytest.raises(SystemExit):
        main(["trace", "convert", "--help"])
    assert "K >= 1" in " ".join(capsys.readouterr().out.split())


# ---------------------------------------------------------------- demo --out in folders not made yet


def test_demo_makes_the_missing_folders_of_its_out_and_removes_them_when_it_fails(tmp_path, monkeypatch):
    # The decision (README, docs/files.md): `demo --out` makes the folders it needs, as `mkdir -p` (as `assignment
    # init`); a demo that fails leaves none of them.  `report --out` wants its parent folder to exist.
    out = tmp_path / "a" / "b" / "demo"
    code, _, err = run(["demo", "--requests", "20", "--out", str(out)])
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["summary.csv", "ttft_cdf.png"]

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("decodesched._io.check_outputs", full)  # (where the demo's files are about to be written)
    other = tmp_path / "c" / "d" / "demo"
    code, _, err = run(["demo", "--requests", "20", "--out", str(other)])
    assert code == 2
    assert err.splitlines()[-1] == "decodesched demo: error: no space left on the device", err  # (after progress)
    assert not (tmp_path / "c").exists()


def test_the_docs_say_where_demo_out_folders_come_from():
    root = os.path.join(os.path.dirname(__file__), "..")
    for doc in ("README.md", os.path.join("docs", "files.md")):
        with open(os.path.join(root, doc), encoding="utf-8") as fh:
            assert "missing parent folders" in " ".join(fh.read().split()), doc


# ---------------------------------------------------------------- standard error closed (`cmd 2>&-`)


def test_with_standard_error_closed_the_summary_stays_out_of_the_table_on_standard_output(tmp_path):
    # Before: Python's sys.stderr is None, print(file=None) writes to stdout: the summary table (and "wrote -") went
    # into the CSV on standard output, exit 0.
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    argv = [sys.executable, "-m", "decodesched.cli", "simulate", str(trace), "--policy", "fcfs", "--kv-blocks", "4",
            "--events", "-"]
    want = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert want.returncode == 0 and "fcfs" in want.stderr, want.stderr
    got = subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", *argv], stdout=subprocess.PIPE, text=True, timeout=600)
    assert (got.returncode, got.stdout) == (0, want.stdout)


def test_an_error_with_standard_error_closed_is_the_status_alone(tmp_path, monkeypatch):
    import contextlib
    import io

    monkeypatch.setattr(sys, "stderr", None)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["trace", "inspect", str(tmp_path / "none.csv")]) == 2
    assert (out.getvalue(), sys.stderr) == ("", None)


# ---------------------------------------------------------------- two commands writing the same group at once

_PAUSED_BETWEEN_RENAMES = textwrap.dedent("""\
    import os, sys, time

    real, renamed = os.replace, []

    def replace(src, dst):  # the first file of the group in place, then a pause before the second
        real(src, dst)
        renamed.append(dst)
        if len(renamed) == 1:
            open(sys.argv[1] + ".paused", "w").close()
            for _ in range(200):
                if os.path.exists(sys.argv[1] + ".go"):
                    break
                time.sleep(0.05)

    os.replace = replace
    from decodesched.cli import main
    sys.exit(main(sys.argv[2:]))
""")


def test_two_converts_into_one_name_at_once_leave_a_csv_and_sidecar_of_the_same_run(tmp_path):
    # Before: A's CSV renamed, B's CSV and sidecar renamed, A's sidecar renamed: B's trace beside A's time scale.
    import json
    import threading
    import time

    src = tmp_path / "az.csv"
    src.write_text(AZURE)
    want = {}
    for sps in ("1", "2"):
        ref = tmp_path / f"{sps}.csv"
        assert run(["trace", "convert", str(src), "--steps-per-second", sps, "--out", str(ref)])[0] == 0
        want[float(sps)] = ref.read_bytes()
    out, marker = tmp_path / "out.csv", str(tmp_path / "marker")
    script = tmp_path / "paused.py"
    script.write_text(_PAUSED_BETWEEN_RENAMES)
    log = open(tmp_path / "a.log", "w")  # noqa: SIM115 - (closed below)
    a = subprocess.Popen([sys.executable, str(script), marker, "trace", "convert", str(src), "--steps-per-second", "1",
                          "--out", str(out)], stdout=subprocess.DEVNULL, stderr=log)
    try:
        for _ in range(6000):  # (a cold start may compile)
            if os.path.exists(marker + ".paused") or a.poll() is not None:
                break
            time.sleep(0.05)
        assert os.path.exists(marker + ".paused"), (tmp_path / "a.log").read_text()
        b = threading.Thread(target=run, args=(["trace", "convert", str(src), "--steps-per-second", "2", "--out",
                                                str(out)],))
        b.start()
        b.join(3)  # (done at once before; now it waits for A's group)
        open(marker + ".go", "w").close()
        b.join(60)
        assert a.wait(60) == 0
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
        log.close()
    sps = json.loads((tmp_path / "out.csv.meta.json").read_text())["steps_per_second"]
    assert out.read_bytes() == want[sps]


@pytest.mark.parametrize("name", ["", "  ", "demo\0out"])
def test_demo_out_that_names_no_folder_is_refused_before_the_work(tmp_path, monkeypatch, name):
    # Before: '' wrote the plot and summary into the current folder (an unset `--out "$DIR"`, which `report` refuses);
    # a NUL character (from Python: `main([...])`) ran the whole demo, then a ValueError traceback.
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["demo", "--requests", "5", "--out", name])
    assert (code, out) == (2, "")
    assert one_line(err).startswith("decodesched demo: error: ") and "not a folder name" in err
    assert list(tmp_path.iterdir()) == []
