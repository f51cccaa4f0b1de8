"""Stop 61, the command line and the install as a newcomer finds them (room C10)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from decodesched._numba_cache import cache_subpath
from decodesched.cli import main

ROOT = Path(__file__).resolve().parent.parent

# The folders pyproject.toml builds the package from (its package-dir), and the files a package build reads.
PACKAGE_DIRS = {"src/decodesched": "decodesched", "kernels": "decodesched/kernels", "grader": "decodesched/grader",
                "assignments": "decodesched/assignments"}

# What a checkout holds beside its sources once used: assignments/ is also a course folder (nbgrader_config.py),
# where `decodesched assignment build` and nbgrader write their outputs, and Python and Numba leave caches.
LEFT_BY_USE = ("assignments/release/decode_scheduling/decode_scheduling.ipynb",
               "assignments/submitted/alice/decode_scheduling/decode_scheduling.ipynb",
               "assignments/autograded/alice/decode_scheduling/decode_scheduling.ipynb",
               "assignments/feedback/alice/decode_scheduling/decode_scheduling.html",
               "assignments/gradebook.db", "assignments/.nbgrader.log",
               "assignments/__pycache__/nbgrader_config.cpython-311.pyc",
               "assignments/source/decode_scheduling/__pycache__/x.cpython-311.pyc",
               "grader/__pycache__/course.cpython-311.pyc", "grader/solutions/__pycache__/reference.cpython-311.pyc",
               "kernels/__pycache__/fast_nb.replay_fast_nb-10.py311.nbi",
               "src/decodesched/__pycache__/cli.cpython-311.pyc")


def _checkout_copy(dest: Path) -> None:
    """The package's sources as committed (caches and course outputs left out), plus pyproject.toml and README."""
    ignore = shutil.ignore_patterns("__pycache__", "release", "submitted", "autograded", "feedback", "gradebook.db*",
                                    ".nbgrader.log", "*.egg-info")
    for folder in PACKAGE_DIRS:
        shutil.copytree(ROOT / folder, dest / folder, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)


def _built(tree: Path, out: Path) -> set[str]:
    """The files a package build of `tree` puts in the wheel (setuptools' build_py, which the wheel is made from)."""
    code = "import sys; from setuptools import setup; sys.argv[1:] = ['-q', 'build_py', '-d', sys.argv[1]]; setup()"
    subprocess.run([sys.executable, "-c", code, str(out)], cwd=tree, check=True, capture_output=True, timeout=120,
                   env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}


def _shipped(tree: Path) -> set[str]:
    """The files a wheel of `tree` must hold: every module of the package folders, the bundled trace with its
    README and licenses, and the assignment's source notebook."""
    want = set()
    for folder, package in PACKAGE_DIRS.items():
        for path in (tree / folder).rglob("*"):
            rel = path.relative_to(tree / folder).as_posix()
            if path.is_file() and (path.suffix == ".py" or rel.startswith("data/") or rel.endswith(".ipynb")):
                want.add(f"{package}/{rel}")
    return want


@pytest.fixture(scope="module")
def used_checkout_build(tmp_path_factory):
    """(what a used checkout should ship, what its build holds, the built package's folder): a copy of the sources
    with what use leaves beside them, built (setuptools' build_py, which the wheel is made from) into a folder whose
    name is not UTF-8, as `pip install --target` would put it."""
    base = tmp_path_factory.mktemp("install")
    tree = base / "checkout"
    _checkout_copy(tree)
    want = _shipped(tree)
    for name in LEFT_BY_USE:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(b"left by use\n")
    out = base / os.fsdecode(b"site-\xff")
    return want, _built(tree, out), out


def test_a_wheel_of_a_used_checkout_ships_the_package_and_nothing_the_course_or_caches_left(used_checkout_build):
    """`pip install .` (or `pip wheel .`) in a checkout where the course was built and graded in assignments/ put
    release/, submitted/ (students' notebooks), autograded/, feedback/, gradebook.db and __pycache__ folders into
    the installed package: package-data globbed "**/*" over assignments/ and grader/."""
    want, got, _ = used_checkout_build
    assert not {name for name in got if name not in want}, "shipped what a used checkout left"
    assert want <= got, f"not shipped: {sorted(want - got)}"
    for needed in ("decodesched/data/azure_llm_2023_conv.csv", "decodesched/grader/solutions/reference.py",
                   "decodesched/assignments/source/decode_scheduling/decode_scheduling.ipynb",
                   "decodesched/assignments/tools/build_source_notebook.py", "decodesched/kernels/fast_nb.py"):
        assert needed in got


def _warm_kernels_into(package: Path) -> None:
    """The checkout's compiled kernels (`decodesched warmup`'s cache), put beside the built package's kernel files,
    which get the sources' times: Numba keys its cache by them, so that nothing compiles for minutes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "PYTHONWARNINGS"))}
    done = subprocess.run([sys.executable, "-m", "decodesched", "warmup"], capture_output=True, text=True,
                          timeout=900, env=env, check=True)
    where = Path(done.stdout.splitlines()[0].split("cache in ", 1)[1].split(" (")[0])
    shutil.copytree(where, package / "kernels" / "__pycache__", dirs_exist_ok=True)
    for source in (ROOT / "kernels").glob("*.py"):
        st = source.stat()
        os.utime(package / "kernels" / source.name, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_the_package_in_a_folder_whose_name_is_not_utf8_replays(used_checkout_build, tmp_path):
    # Before: every replay (simulate, sweep, demo, warmup, report --trace) ended in a traceback, "UnicodeEncodeError:
    # 'utf-8' codec can't encode character '\udcff'", from the cache folder's name (`_numba_cache.cache_subpath`, and
    # Numba's own under NUMBA_CACHE_DIR).
    _, _, site = used_checkout_build
    _warm_kernels_into(site / "decodesched")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "PYTHONWARNINGS"))}
    env["PYTHONPATH"] = str(site)

    def run(*argv):
        return subprocess.run([sys.executable, "-m", "decodesched", *argv], capture_output=True, text=True,
                              timeout=600, env=env, cwd=tmp_path, errors="backslashreplace")

    converted = run("trace", "convert", str(ROOT / "tests/data/azure_llm_2023_code_head60.csv"), "--load", "1",
                    "--out", "t.csv")
    assert converted.returncode == 0, converted.stderr
    done = run("simulate", "t.csv", "--policy", "aging", "--kv-blocks", "400")
    assert done.returncode == 0 and "Error" not in done.stderr, done.stderr
    assert done.stdout.startswith("t: 60 requests, policy aging")
    # NUMBA_CACHE_DIR (Numba's own subfolder rule, which raised the same): the warm cache copied there is used
    cache_dir = tmp_path / "numba-cache"
    kernels = site / "decodesched" / "kernels"
    shutil.copytree(kernels / "__pycache__", cache_dir / cache_subpath(str(kernels / "fast_nb.py")))
    shutil.rmtree(kernels / "__pycache__")
    env["NUMBA_CACHE_DIR"] = str(cache_dir)
    again = run("simulate", "t.csv", "--policy", "aging", "--kv-blocks", "400")
    assert (again.returncode, again.stdout[-200:]) == (0, done.stdout[-200:]), again.stderr
    assert "compiling" not in again.stderr and not (kernels / "__pycache__").exists()
    probe = subprocess.run([sys.executable, "-c", "import decodesched; print(ascii(decodesched.__file__))"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    assert "site-\\udcff" in probe.stdout  # (the package that ran is the built one, not the checkout's)


def test_a_course_folder_whose_name_is_not_utf8_is_made(tmp_path, capsys):
    # Before: a traceback, "UnicodeEncodeError: 'utf-8' codec can't encode character '\udcff'" (the README names
    # the folder), and no course.
    target = tmp_path / os.fsdecode(b"course-\xe9t\xe9")
    assert main(["assignment", "init", str(target)]) == 0
    assert "course folder:" in capsys.readouterr().out
    readme = (target / "README.md").read_bytes()
    assert os.fsencode(target.resolve()) in readme
    assert sorted(p.name for p in target.iterdir()) == ["README.md", "nbgrader_config.py", "source"]


def test_a_cache_folder_that_cannot_exist_is_a_plain_miss(tmp_path, monkeypatch, capsys):
    # Before: with HOME=/dev/null (an installed package caches under ~/.cache), every kernel said "decodesched: cannot
    # read the kernel cache file /dev/null/.cache/... (a part of the path is not a folder); compiling that kernel
    # again", as if a cache file were damaged, where there is no cache at all (the one line that says so follows).
    from decodesched._numba_locators import _TolerantCacheFile

    notices = set()  # (said once per process: a fresh record, so that an earlier test's notice is no excuse)
    monkeypatch.setattr("decodesched._numba_cache._notices", notices)
    (tmp_path / "home").write_text("a file where a folder would be\n")
    folder = tmp_path / "home" / ".cache" / "decodesched"
    cache_file = _TolerantCacheFile(str(folder), "fast_nb.replay_fast_nb-1.py311", (0.0, 1))
    assert cache_file._load_index() == {}
    assert capsys.readouterr().err == ""
    assert not notices
