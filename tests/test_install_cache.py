"""Where the kernels' Numba cache goes (`decodesched._numba_cache`), on an installed, read-only package.

The package is laid out as pip installs it (``.../site-packages/decodesched/kernels``), bind-mounted
read-only in a private mount namespace (root and ``unshare`` needed), and run with a writable home, a
read-only home, and a compiled cache shipped beside the read-only sources.  The scan engine keeps the
compiles short."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import decodesched
import decodesched.kernels
from decodesched.trace import TRACE_COLUMNS

SRC = Path(decodesched.__file__).resolve().parent
KERNELS = Path(decodesched.kernels.__file__).resolve().parent
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")

pytestmark = pytest.mark.skipif(not (os.geteuid() == 0 and shutil.which("unshare")),
                                reason="needs root and unshare for a read-only bind mount")


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    root = tmp_path_factory.mktemp("install")
    site = root / "lib" / "site-packages"
    shutil.copytree(SRC, site / "decodesched", ignore=IGNORE)
    shutil.copytree(KERNELS, site / "decodesched" / "kernels", ignore=IGNORE)
    for sub in ("grader", "assignments"):
        src = SRC.parent.parent / sub
        if src.is_dir():
            shutil.copytree(src, site / "decodesched" / sub, ignore=IGNORE)
    trace = root / "trace.csv"
    trace.write_text(",".join(TRACE_COLUMNS) + "\n1,0,4,3,0,false,2,,true\n2,1,2,2,2,true,2,8,true\n")
    return root, site, trace


SCRIPT = textwrap.dedent("""
    set -e
    mount --bind "$SITE" "$SITE" && mount -o remount,ro,bind "$SITE"
    if [ -n "$RO_HOME" ]; then mount --bind "$HOME" "$HOME" && mount -o remount,ro,bind "$HOME"; fi
    "$PY" -c 'import decodesched.kernels as k, sys; assert k.__file__.startswith(sys.argv[1]), k.__file__' "$SITE"
    exec "$PY" -m decodesched.cli simulate "$TRACE" --policy aging --kv-blocks 4 --engine scan
""")


def run(layout, home: Path, ro_home: bool, extra_env=None):
    root, site, trace = layout
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_CACHE", "XDG_"))}
    env.update(HOME=str(home), SITE=str(site), TRACE=str(trace), PY=sys.executable, PYTHONPATH=str(site),
               RO_HOME="1" if ro_home else "", **(extra_env or {}))
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", SCRIPT], env=env,
                       capture_output=True, text=True, timeout=900)
    return p


def cache_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.nbi")) if folder.exists() else []


def test_read_only_install_caches_in_the_users_folder(layout, tmp_path):
    root, site, _ = layout
    home = tmp_path / "home"
    first = run(layout, home, ro_home=False)
    assert first.returncode == 0, first.stderr
    assert "Traceback" not in first.stderr and "compiling" in first.stderr
    assert cache_files(home / ".cache" / "decodesched")
    assert not (site / "decodesched" / "kernels" / "__pycache__").exists()
    second = run(layout, home, ro_home=False)
    assert second.returncode == 0 and "compiling" not in second.stderr, second.stderr


def test_nothing_writable_runs_uncached_with_one_notice(layout, tmp_path):
    home = tmp_path / "home"
    p = run(layout, home, ro_home=True)
    assert p.returncode == 0, p.stderr
    notices = [line for line in p.stderr.splitlines() if "no writable cache folder" in line]
    assert len(notices) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "queue_wait" in p.stdout


def test_a_cache_shipped_beside_read_only_sources_is_used(layout, tmp_path):
    root, site, trace = layout
    pycache = site / "decodesched" / "kernels" / "__pycache__"
    # What an administrator does once after installing: compile into the package tree (Numba's own rule).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_CACHE", "XDG_"))}
    env.update(PYTHONPATH=str(site), NUMBA_CACHE_LOCATOR_CLASSES="InTreeCacheLocator", HOME=str(tmp_path))
    subprocess.run([sys.executable, "-m", "decodesched.cli", "simulate", str(trace), "--policy", "aging",
                    "--kv-blocks", "4", "--engine", "scan"], env=env, check=True, capture_output=True, timeout=900)
    assert cache_files(pycache)
    try:
        home = tmp_path / "home"
        p = run(layout, home, ro_home=True)
        assert p.returncode == 0, p.stderr
        assert "compiling" not in p.stderr and "no writable" not in p.stderr, p.stderr
        assert not cache_files(home)
    finally:
        shutil.rmtree(pycache)
