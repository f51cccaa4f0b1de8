"""What grading as fast as plain nbgrader relies on (behaviour only, no timings): the verdicts of further submissions
go on while the kernel runs wait for the fork server's warm-up, `--jobs N` still bounds the verdict children and the
kernel runs at N each, and the fork server ends without the interpreter's teardown once the grader closes its end
(`ForkServer.close` waited about a second for it at the end of every grade run).

    python tests/grader_attacks/throughput.py --folder wild --variants colab,big50 --copies 4 --jobs 2

measures it against plain `nbgrader autograde`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from decodesched.grader import autograde, pipeline, spec
from decodesched.grader.course import Course
from decodesched.grader.limits import Limits
from decodesched.grader.notebook import Submission
from decodesched.grader.verdict import Verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks.attacks import minimal_notebook  # noqa: E402

FORKSERVER = Path(pipeline.__file__).with_name("forkserver.py")


class _NoServer:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def abort(self):
        pass


class _Meter:
    """How many calls run at once, at most."""

    def __init__(self):
        self.lock, self.now, self.most, self.calls = threading.Lock(), 0, 0, 0

    def __enter__(self):
        with self.lock:
            self.now += 1
            self.calls += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc):
        with self.lock:
            self.now -= 1


@pytest.fixture
def staged(tmp_path, monkeypatch):
    """`pipeline._grade_all` with the sandboxed stages replaced by fakes that count what runs at once; the template
    (the fork server's warm-up) is ready only once two verdicts have started, or after 30 s."""
    n = 4
    subs = []
    for k in range(n):
        path = tmp_path / f"s{k}.ipynb"
        path.write_text(json.dumps(minimal_notebook()), encoding="utf-8")
        subs.append(Submission(f"s{k}", path))
    course = Course(tmp_path, tmp_path / "release.ipynb", minimal_notebook(), tmp_path / "gradebook.db")
    verdicts, kernels, all_started = _Meter(), _Meter(), threading.Event()
    seen = {}

    def fake_verdict(source, **_kw):
        with verdicts:
            if verdicts.calls == 2:
                all_started.set()
            threading.Event().wait(0.05)  # so that overlapping calls would overlap
        return Verdict({}, "graded", 0.0, float(spec.MAX_SCORE))

    def fake_template(*_a):
        seen["verdicts_before_template"] = all_started.wait(30)
        return tmp_path

    def fake_kernel(*_a):
        with kernels:
            threading.Event().wait(0.05)
        return autograde.KernelReport()

    monkeypatch.setattr(pipeline, "ForkServer", lambda *_a: _NoServer())
    monkeypatch.setattr(pipeline, "_template", fake_template)
    monkeypatch.setattr(pipeline, "verdict_for_source", fake_verdict)
    monkeypatch.setattr(pipeline, "kernel_run", fake_kernel)
    monkeypatch.setattr(pipeline, "update_gradebook", lambda *_a: None)

    def run(jobs):
        results, rendered = [], {}
        pipeline._grade_all(subs, course, tmp_path / "work", pipeline.Options(jobs=jobs, progress=False),
                            Limits(cpu_s=10, memory_mb=256), jobs, results, rendered)
        return results

    return run, seen, verdicts, kernels


def test_verdicts_go_on_while_the_kernel_runs_wait_for_the_fork_servers_warm_up(staged):
    # before: each of the --jobs worker threads held its submission until its kernel run was done, so with --jobs 1
    # the second verdict waited for the first kernel run, which waited for the warm-up (the core that did not import
    # nbgrader sat idle for the first seconds of every grade run)
    run, seen, verdicts, _kernels = staged
    results = run(1)
    assert seen["verdicts_before_template"] is True
    assert sorted(r.status for r in results) == ["graded"] * 4 and verdicts.calls == 4


@pytest.mark.parametrize("jobs", [1, 2])
def test_jobs_still_bounds_the_verdict_children_and_the_kernel_runs(staged, jobs):
    run, _seen, verdicts, kernels = staged
    results = run(jobs)
    assert len(results) == 4 and verdicts.calls == kernels.calls == 4
    assert verdicts.most <= jobs and kernels.most <= jobs


def test_the_fork_server_ends_without_the_interpreters_teardown(tmp_path):
    # before: closing the grader's end left the server tearing down nbgrader's imports (atexit handlers, module
    # clean-up), about a second that `ForkServer.close`, the end of every grade run, waited for
    mark = tmp_path / "teardown-ran"
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    code = ("import atexit, sys\n"
            f"sys.path.insert(0, {str(FORKSERVER.parent)!r})\n"
            "import forkserver\n"
            "forkserver.PRELOAD = ()\n"
            f"atexit.register(lambda: open({str(mark)!r}, 'w').close())\n"
            f"sys.exit(forkserver.main(['forkserver.py', '{theirs.fileno()}']))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    theirs.close()
    try:
        mine.settimeout(120)
        assert mine.recv(16) == b"ready"
    finally:
        mine.close()
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode(errors="replace")
    assert not mark.exists() and not err
