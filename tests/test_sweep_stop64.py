"""Stop 64, a long sweep that does not go to plan: `--dask` given the address of a server that waits for its client
to speak (the dashboard's HTTP port), something of the user's at the name where a new checkpoint is written first,
and a checkpoint that cannot be made when `--out` is spelled with ``./``.  Each test runs the command (or the call
it makes) and checks the files it leaves, not only a message."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from decodesched import checkpoint as C
from decodesched.cli import main
from decodesched.errors import UserError
from decodesched.trace import TRACE_COLUMNS

TRACE_CSV = ",".join(TRACE_COLUMNS) + """
1,0,4,3,0,false,2,,true
2,0,2,2,5,true,3,10,true
3,1,3,4,1,false,4,6,false
"""
GRID = ["--policy", "fcfs,aging", "--kv-blocks", "3,4", "--aging-interval", "1,4", "--threads", "1",
        "--chunk-size", "1", "--no-progress"]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(TRACE_CSV)
    return path


@pytest.mark.parametrize("form", ["tcp://{}", "{}"])
def test_a_dask_address_where_a_server_waits_for_its_client_is_one_line_not_a_hang(form):
    # A listening socket that never speaks, as an HTTP server (the dashboard, port 8787) or a database does: Dask's
    # client sent its handshake and waited for the scheduler's forever (`--dask 127.0.0.1:8787` never ended).
    pytest.importorskip("distributed")
    from decodesched.distributed import connect

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    address = form.format(f"127.0.0.1:{server.getsockname()[1]}")
    raised = []

    def attempt():
        try:
            with connect(address, timeout=2):
                pass
        except Exception as exc:  # noqa: BLE001 - judged below
            raised.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    try:
        worker.join(60)
        assert not worker.is_alive(), f"connecting to {address} still waits after 60 s"
    finally:
        server.close()  # (ends the wait of a client that hangs)
        worker.join(30)
    assert len(raised) == 1 and isinstance(raised[0], UserError), raised
    msg = str(raised[0])
    assert "\n" not in msg and msg.startswith(f"{address} did not answer as a Dask scheduler") and "8786" in msg, msg


@pytest.mark.parametrize("what", ["folder", "file"])
def test_something_else_where_a_new_checkpoint_is_written_first_is_refused_before_any_work(trace, tmp_path, what):
    # Before: the first chunk's work was done, then the sweep ended with "m.csv.partial.jsonl: cannot write the
    # sweep's checkpoint (File exists)", naming a file that did not exist, not the one in the way.
    out = tmp_path / "m.csv"
    tmp = Path(C.temporary_path(C.checkpoint_path_for(str(out))))
    if what == "folder":
        tmp.mkdir()
        (tmp / "notes.txt").write_text("mine")
    else:
        tmp.write_text("a file of the user's\n")
    before = sorted(os.listdir(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "decodesched", "sweep", str(trace), *GRID, "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert "\n" not in err and err.startswith(f"decodesched sweep: error: {tmp}: the sweep writes its new checkpoint "
                                              "here first, but this is"), err
    assert sorted(os.listdir(tmp_path)) == before  # no CSV, no checkpoint, no lock; what was there is kept
    assert (tmp / "notes.txt").read_text() == "mine" if what == "folder" else tmp.read_text() == "a file of the user's\n"


def test_a_stale_temporary_checkpoint_is_still_replaced_by_the_sweep(trace, tmp_path, capsys):
    # (guards the refusal above: what a run killed while making its checkpoint leaves is removed, as before)
    out = tmp_path / "m.csv"
    tmp = Path(C.temporary_path(C.checkpoint_path_for(str(out))))
    tmp.write_text('{"format": "decodesched-swe')
    assert main(["sweep", str(trace), *GRID, "--out", str(out)]) == 0
    capsys.readouterr()
    assert sorted(os.listdir(tmp_path)) == ["m.csv", "t.csv"]


def test_a_checkpoint_that_cannot_be_made_says_so_for_an_out_name_spelled_with_dot_slash(trace, tmp_path, capsys,
                                                                                         monkeypatch):
    # The checkpoint's folder refuses a new file once the work ran (a full disk of inodes, a quota): with
    # `--out ./m.csv` the error named the file as Path spells it, "m.csv.partial.jsonl", which the sweep did not
    # take for its checkpoint's: the line "m.csv.partial.jsonl: No space left on device" said nothing of what
    # was saved, nor how to resume.
    real_open = os.open

    def full(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and os.fspath(path).endswith(C.CHECKPOINT_SUFFIX + C.TEMPORARY_SUFFIX):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(C.os, "open", full)
    assert main(["sweep", "t.csv", *GRID, "--out", "./m.csv"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("decodesched sweep: error: ./m.csv.partial.jsonl: cannot write the sweep's checkpoint (no space "
                   "left on the device); no scenario was saved"), err
    assert sorted(os.listdir(tmp_path)) == ["t.csv"]


def _kept_checkpoint(trace, out, grid, monkeypatch, capsys) -> Path:
    """The checkpoint a sweep over `grid` keeps when its CSV cannot be written (every scenario in it)."""
    from decodesched.commands import sweep

    def fail(rows, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(sweep, "write_metrics_csv", fail)
        assert main(["sweep", str(trace), *grid, "--out", str(out)]) == 2
    capsys.readouterr()
    ck = Path(C.checkpoint_path_for(str(out)))
    assert C.is_checkpoint(ck) and not out.exists()
    return ck


def test_a_sweep_that_will_replace_another_sweep_s_checkpoint_says_so_first(trace, tmp_path, monkeypatch, capsys):
    # A rerun with one value changed (`--kv-blocks 3,5` for `3,4`) replaced the other sweep's saved scenarios,
    # perhaps hours of them, without a word.
    out = tmp_path / "m.csv"
    ck = _kept_checkpoint(trace, out, GRID, monkeypatch, capsys)
    other = [x.replace("3,4", "3,5") for x in GRID]
    assert main(["sweep", str(trace), *other, "--out", str(out)]) == 0
    err = capsys.readouterr().err.strip()
    assert err == (f"decodesched sweep: {ck} holds the scenarios of another sweep (other traces or settings, or "
                   "another decodesched), which this one does not resume; it is replaced once this sweep's first "
                   "chunk is saved (Ctrl-C before that keeps it)"), err
    assert out.exists() and not ck.exists()


def test_a_sweep_s_own_checkpoint_is_no_other_sweep_s_even_with_no_line_left_to_resume(trace, tmp_path, monkeypatch,
                                                                                       capsys):
    # (guards the line above, verified right: resumed, or with its first chunk's line damaged, it is said of no
    # checkpoint of this sweep)
    out = tmp_path / "m.csv"
    ck = _kept_checkpoint(trace, out, GRID, monkeypatch, capsys)
    assert main(["sweep", str(trace), *GRID, "--out", str(out)]) == 0
    assert capsys.readouterr().err == "" and not ck.exists()
    expected = out.read_bytes()
    out.unlink()
    ck = _kept_checkpoint(trace, out, GRID, monkeypatch, capsys)
    lines = ck.read_bytes().split(b"\n")
    assert b'"rows"' in lines[1]
    ck.write_bytes(b"\n".join([lines[0], lines[1].replace(b'"rows"', b'"rowz"'), *lines[2:]]))
    assert main(["sweep", str(trace), *GRID, "--out", str(out)]) == 0
    assert capsys.readouterr().err == "" and out.read_bytes() == expected and not ck.exists()
