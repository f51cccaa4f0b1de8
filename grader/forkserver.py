"""A pre-started nbgrader: one process that imports nbgrader once and forks a sandboxed child per run.

``nbgrader autograde`` spends about 2.5 s of CPU importing itself; in a fresh process per
submission that was most of the grader's time. The fork server pays it once per grade run. It is
trusted code that never touches a submission: for each request (`grader.sandbox.run_isolated` with
``server=``) it forks, and the child becomes exactly what ``_launcher.py`` makes of a fresh process
(new session, private mount namespace, subreaper, limits, private uid; see `grader.sandbox`), then
runs ``python -m nbgrader ARGS`` *in-process* instead of exec'ing it; any other argv is exec'd as
usual. nbgrader still starts the student's kernel as a fresh process, inside the sandbox.

Protocol (a SOCK_SEQPACKET socket pair): the grader sends the launcher's spec as JSON with three
file descriptors (stdout, stderr and the launcher's status pipe); the server answers
``{"pid": PID}`` with a pidfd of the child, so the grader can watch it without being its parent.
The server exits when the grader closes its end. One more request, ``{"warm": COURSE, "assignment": A, "student": ID}``
without file descriptors (`ForkServer.warm`), pre-initialises nbgrader in the server (`_warm`); ``{"gradebook": PATH, "rows": ...}``, sent when every
run has ended, writes the instructor's gradebook here (`grader.outputs.write_gradebook`), where
nbgrader is imported already.

    python -I forkserver.py SOCKET_FD      (started by `grader.sandbox.ForkServer`)
"""

import asyncio
import gc
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PRELOAD = ("nbgrader.apps", "nbgrader.converters", "nbgrader.preprocessors", "nbgrader.api", "nbclient",
           "jupyter_client.manager", "jupyter_client.provisioning", "nbconvert.exporters", "nbformat")


def _load_launcher():
    spec = importlib.util.spec_from_file_location("_decodesched_launcher", os.path.join(HERE, "_launcher.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start(spec):
    """In the sandboxed child: run ``python -m nbgrader ARGS`` in this (pre-imported) process, else exec."""
    argv = spec["argv"]
    if len(argv) < 3 or argv[1:3] != ["-m", "nbgrader"]:
        os.execvpe(argv[0], argv, spec["env"])
    import tempfile

    os.environ.clear()
    os.environ.update(spec["env"])
    tempfile.tempdir = None  # honour the run's TMPDIR
    sys.argv = ["nbgrader", *argv[3:]]
    from nbgrader.apps.nbgraderapp import NbGraderApp

    try:
        NbGraderApp.launch_instance(argv=argv[3:])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


def _warm(course, assignment, student):
    """Pre-initialise nbgrader in the server: one real ``nbgrader autograde`` of `student` in `course`
    (the grader's private copy of the release template, no student code) with the Execute step
    skipped, so no kernel starts and nothing runs. What every kernel run would otherwise set up again
    stays in this process for the forks: the ORM's memoised paths, nbformat's compiled JSON-schema
    validators, traitlets' and nbconvert's class set-up (measured: a fork's own CPU 0.55-0.7 s -> 0.3 s).
    Compiled SQL does not carry over (SQLAlchemy keys it by each engine's dialect). Nothing of the
    warm-up run stays open or configured: its apps are cleared, its connections closed, its folder is
    the caller's."""
    from nbgrader.apps.nbgraderapp import NbGraderApp
    from nbgrader.preprocessors import Execute
    from traitlets.config import SingletonConfigurable

    here = os.getcwd()
    own = Execute.__dict__.get("preprocess")
    Execute.preprocess = lambda self, nb, resources: (nb, resources)  # nothing runs, no kernel starts
    try:
        os.chdir(course)
        NbGraderApp.launch_instance(argv=["autograde", assignment, f"--student={student}", "--force",
                                          "--log-level=CRITICAL"])
    except SystemExit:
        pass
    finally:
        if own is None:
            del Execute.preprocess
        else:
            Execute.preprocess = own
        os.chdir(here)
        stack = [SingletonConfigurable]
        while stack:
            cls = stack.pop()
            stack.extend(cls.__subclasses__())
            if getattr(cls, "_instance", None) is not None:
                cls.clear_instance()
        gc.collect()  # the warm-up gradebook's engine and its SQLite connection
        policy = asyncio.get_event_loop_policy()
        policy.get_event_loop().close()  # its epoll fd would be shared by every fork
        policy.set_event_loop(None)


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(sock):
    launcher = _load_launcher()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a missing optional module only costs its import later
            pass
    try:  # SQLAlchemy sets up nbgrader's ORM mappers on first use: once here, not in every child
        from sqlalchemy.orm import configure_mappers

        configure_mappers()
    except Exception:  # noqa: BLE001
        pass
    sock.send(b"ready")
    while True:
        ready, _, _ = select.select([sock], [], [], 0.5)
        _reap()
        if not ready:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        except OSError:
            break
        if not msg:
            break  # the grader closed its end
        if not fds and msg.startswith(b'{"warm"'):
            try:
                req = json.loads(msg)
                _warm(req["warm"], req["assignment"], req["student"])
                sock.send(b'{"warm": true}')
            except Exception as exc:  # noqa: BLE001 - a failed warm-up only costs time in each run
                sock.send(json.dumps({"warm": False, "error": repr(exc)[:200]}).encode())
            continue
        if not fds and msg.startswith(b'{"gradebook"'):
            try:  # trusted and at the end of the run: the grader's own gradebook writer, nbgrader imported
                from decodesched.grader.outputs import write_gradebook

                req = json.loads(msg)
                write_gradebook(req["gradebook"], req["rows"], req.get("stamps"))
                sock.send(b'{"gradebook": true}')
            except Exception as exc:  # noqa: BLE001 - the grader then writes it itself
                sock.send(json.dumps({"gradebook": False, "error": repr(exc)[:200]}).encode())
            continue
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            sock.send(b'{"error": "expected 3 file descriptors"}')
            continue
        spec = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                os.setsid()
                out, err, status = fds
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(out, 1)
                os.dup2(err, 2)
                for fd in (null, out, err):
                    os.close(fd)
                launcher.launch(spec, status, start=_start)
            finally:
                os._exit(127)
        pidfd = os.pidfd_open(pid)
        for fd in fds:
            os.close(fd)
        try:
            socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
        finally:
            os.close(pidfd)
    _reap()


def main(argv):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the grader decides when we stop
    serve(socket.socket(fileno=int(argv[1])))
    # Every reply was sent (the gradebook is committed and closed before its answer) and stdout and stderr are
    # /dev/null: nothing is left to flush, so the interpreter's teardown of nbgrader's imports (about a second of
    # CPU that `ForkServer.close`, the end of every grade run, waited for) is skipped.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
