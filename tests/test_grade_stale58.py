"""A grading killed by a signal it cannot catch (SIGKILL, the OOM killer) leaves its private scratch folder (in
/dev/shm: memory); the next grading removes it (`sandbox.remove_stale_scratch`), and never one of a grading still
under way, one it cannot tell (no owner lock), a link or a file."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from decodesched.grader import sandbox

PREFIX = "decodesched-test-stale58-"
_KILLED_HOLDER = textwrap.dedent(f"""\
    import os, signal, sys
    from decodesched.grader import sandbox
    folder, fd = sandbox.private_scratch({PREFIX!r})
    (folder / "work").mkdir()
    (folder / "work" / "x.json").write_text("{{}}")
    print(folder, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _root() -> Path:
    import tempfile

    return Path(sandbox.scratch_root() or tempfile.gettempdir())


def test_a_killed_gradings_folder_is_removed_and_a_live_ones_kept(tmp_path):
    done = subprocess.run([sys.executable, "-c", _KILLED_HOLDER], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL
    stale = Path(done.stdout.strip())
    assert (stale / "work" / "x.json").is_file()  # (before: left there for good)
    live, fd = sandbox.private_scratch(PREFIX)
    unknown = Path(os.path.realpath(_root())) / (PREFIX + "no-lock")
    unknown.mkdir()
    link = _root() / (PREFIX + "link")
    link.symlink_to(live)
    plain = _root() / (PREFIX + "file")
    plain.write_text("x")
    try:
        assert sandbox.remove_stale_scratch(PREFIX) == 1
        assert not stale.exists()
        assert (live / sandbox.OWNER_LOCK).is_file() and unknown.is_dir() and link.is_symlink() and plain.is_file()
        assert sandbox.remove_stale_scratch(PREFIX) == 0
    finally:
        os.close(fd)
        for p in (link, plain):
            p.unlink()
        unknown.rmdir()
    assert sandbox.remove_stale_scratch(PREFIX) == 1  # (its lock released: a folder no grading removed)
    assert not live.exists()
