"""The grader's secrets against a student's code where the checkout is in sight (stop 61, room S).

The sandbox covers every top-level folder but the system ones (`sandbox.covered_dirs`), and hid of our own code only
``src/decodesched/`` and ``grader/``. A checkout under a system folder (``/usr/src/app``, a container's usual
WORKDIR, installed with ``pip install -e .`` or ``pip install .``) stayed readable around them: ``assignments/source``
(the solution and the hidden tests; the kernel run did not even hide that), ``kernels/`` (an exact engine), and
``tests/grader_attacks/styles/`` (correct solutions in nine styles). Now the whole checkout is hidden, entry by entry
around its ``.venv``, and so is the folder that ``direct_url.json`` says pip installed from.

Here the checkout (or a folder pip installed from) is bound back as a system folder leaves it (`expose`), as in
test_grade_sandbox's test of the package under ``sys.prefix``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from decodesched.grader import observe, pipeline, sandbox, spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks.attacks import _with_solution, honest_source  # noqa: E402
from grader_attacks.course import build_course  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
needs_namespaces = pytest.mark.skipif(os.geteuid() != 0 and not sandbox.userns_available(),
                                      reason="needs root or user namespaces")


def _seen(tmp_path, paths, hide, expose) -> list[bool]:
    """Whether a sandboxed Python run with `hide` and `expose` reads anything at each of `paths` (a hidden folder is
    an empty trap, a hidden file /dev/null)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "x.py").write_text(
        "import os\ndef read(p):\n    try:\n"
        "        return bool(os.listdir(p) if os.path.isdir(p) else open(p, 'rb').read(1))\n"
        f"    except OSError:\n        return False\nprint([read(p) for p in {[str(p) for p in paths]!r}])\n")
    out = sandbox.run_isolated([sys.executable, "-I", "-S", "x.py"], cwd=work, timeout_s=30, cpu_s=10,
                               memory_mb=400, hide=hide, expose=expose)
    assert out.returncode == 0, (out.stdout, out.stderr[-2000:])
    return json.loads(out.stdout.decode().strip().replace("False", "false").replace("True", "true"))


@needs_namespaces
def test_a_checkout_in_sight_keeps_the_solution_the_engine_and_the_tests_hidden(tmp_path):
    if not (REPO / "pyproject.toml").is_file() or not (REPO / "kernels").is_dir():
        pytest.skip("an installed package: no checkout beside it")
    secrets = [spec.SOURCE_NOTEBOOK, REPO / "kernels" / "step_nb.py", REPO / "tests" / "grader_attacks" / "styles",
               REPO / "pyproject.toml"]
    assert all(p.exists() for p in secrets)
    course = type("C", (), {"root": tmp_path / "course"})()
    course.root.mkdir()
    for hide in (pipeline.default_hide(course, tmp_path / "subs", tmp_path / "out"), observe.default_hide()):
        # before: [True, True, True, True] in the kernel run, [False, True, True, True] in the verdict harness
        assert _seen(tmp_path, secrets, hide, expose=[REPO]) == [False] * len(secrets)
    # the interpreter still runs (above) where the venv is inside the checkout, and the venv stays readable
    inside = Path(sys.prefix).resolve()
    if REPO in inside.parents:
        assert _seen(tmp_path, [inside / "pyvenv.cfg"], observe.default_hide(), expose=[REPO]) == [True]


@needs_namespaces
def test_the_folder_pip_installed_from_is_hidden(tmp_path, monkeypatch):
    """``pip install /usr/src/app`` puts the package in site-packages (hidden) and leaves the checkout where it was;
    site-packages' ``direct_url.json`` tells anyone where."""
    import importlib.metadata

    app = tmp_path / "my app"
    (app / "build" / "lib" / "decodesched").mkdir(parents=True)
    model = app / "build" / "lib" / "decodesched" / "model.py"
    model.write_text("class DecodeSchedulerSim: ...\n")

    class Dist:
        def read_text(self, name):
            assert name == "direct_url.json"
            return json.dumps({"url": app.as_uri(), "dir_info": {}})

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Dist())
    assert str(app) in observe.package_paths()
    assert _seen(tmp_path, [model], observe.default_hide(), expose=[app]) == [False]  # before: [True]


@pytest.mark.parametrize("text", [None, "", "{", "[]", '{"url": 3}', '{"url": "https://example.org/x.tar.gz"}',
                                  '{"url": "file:///"}', '{"url": "file:///nonexistent-decodesched"}'])
def test_a_direct_url_of_no_local_folder_hides_nothing_more(monkeypatch, text):
    import importlib.metadata

    before = observe.package_paths()
    dist = type("D", (), {"read_text": lambda self, name: text})()
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: dist)
    assert observe.package_paths() == before


# --- one real grading (the verdict harness, which scores; no kernel run) -----------------------------------------

# A student's cell: walks up from the interpreter (a checkout's .venv) and runs a correct solution found there.
LEAKS = '''
import os as _os, sys as _sys
def _found():
    d = _sys.executable
    while d != _os.path.dirname(d):
        d = _os.path.dirname(d)
        for rel in ("grader/solutions/reference.py", "tests/grader_attacks/styles/s01_dict_by_id_heapq.py"):
            try:
                with open(_os.path.join(d, rel), encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                continue
            if "class DecodeSchedulerSim" in text:
                return text
    return None
_text = _found()
if _text:
    exec(_text, globals())
'''


@needs_namespaces
def test_a_solution_that_runs_a_correct_one_from_the_checkout_in_sight_scores_its_own(tmp_path, monkeypatch):
    pytest.importorskip("nbgrader")
    if not (REPO / "tests" / "grader_attacks" / "styles").is_dir():
        pytest.skip("an installed package: no checkout beside it")
    course, release_path = build_course(tmp_path)
    release = json.loads(release_path.read_text(encoding="utf-8"))
    subs = tmp_path / "subs"
    subs.mkdir()
    for sid, source in (("honest", honest_source()), ("leaks", honest_source() + LEAKS)):
        (subs / f"{sid}.ipynb").write_text(json.dumps(_with_solution(release, source)), encoding="utf-8")
    # the checkout's top-level folder left in sight, as /usr is (/usr/src/app)
    top = "/" + REPO.parts[1]
    monkeypatch.setattr(sandbox, "covered_dirs", lambda real=sandbox.covered_dirs: [d for d in real() if d != top])
    results = pipeline.grade(subs, tmp_path / "out", course=course,
                             options=pipeline.Options(run_nbgrader=False, jobs=1, progress=False))
    got = {r.student_id: (r.status, r.score) for r in results}
    assert got["honest"][0] == "graded" and got["honest"][1] < spec.MAX_SCORE
    assert got["leaks"] == got["honest"]  # before: ('graded', 100.0)
