"""Run a command as an unprivileged user (uid/gid 65534) from a root test process: what a grader
without root sees, checked on machines (CI) where the tests run as root.

The interpreter, the venv and this checkout may sit under a folder only root can enter (pyenv
under /root); the command runs in a private mount namespace where the sandbox launcher's own
`_expose` makes just those reachable, then drops to uid 65534 and execs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from decodesched.grader import sandbox

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]

_WRAPPER = """\
import os, sys
sys.path.insert(0, {grader!r})
import _launcher
_launcher._unshare()
_launcher._expose({paths!r})
os.setgroups([])
os.setgid({uid})
os.setuid({uid})
os.execv(sys.executable, [sys.executable] + sys.argv[1:])
"""


def available() -> str | None:
    """None when `run` works here, else why not (for a skip)."""
    if os.geteuid() != 0:
        return "needs root (to become another user)"
    return None


def workdir() -> Path:
    """A fresh folder the unprivileged user owns, outside root's private temporary folders."""
    path = Path(tempfile.mkdtemp(prefix="decodesched-nobody-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    os.chmod(path, 0o755)
    os.chown(path, NOBODY, NOBODY)
    return path


def give(path: Path) -> None:
    """Hand `path` (a tree) to the unprivileged user."""
    for dirpath, dirnames, filenames in os.walk(path):
        os.chown(dirpath, NOBODY, NOBODY)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), NOBODY, NOBODY)


def run(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` as uid 65534 in `cwd`, with this venv's interpreter; output captured as text."""
    grader = str(Path(sandbox.__file__).resolve().parent)
    paths = sorted({os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix),
                    os.path.realpath(sys.prefix), str(REPO), grader})
    wrapper = Path(cwd) / ".as_nobody.py"
    wrapper.write_text(_WRAPPER.format(grader=grader, paths=paths, uid=NOBODY))
    env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin", "HOME": str(cwd),
           "LANG": "C.UTF-8"}
    try:
        return subprocess.run([sys.executable, str(wrapper), *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
    finally:
        wrapper.unlink()


def userns() -> bool:
    """Whether the sandbox, run by the unprivileged user, gets a user namespace on this machine."""
    base = workdir()
    try:
        proc = run(["-c", "from decodesched.grader import sandbox; print(sandbox.userns_available())"], cwd=base)
        return proc.stdout.strip() == "True"
    finally:
        cleanup(base)


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
