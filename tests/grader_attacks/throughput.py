"""Grading throughput: `decodesched grade` against plain `nbgrader autograde` on the same folder.

    python tests/grader_attacks/throughput.py [--folder honest|attacks|wild] [--jobs 2] [--plain-timeout 900]
    python tests/grader_attacks/throughput.py --folder wild --variants colab,big50 --copies 3

Builds a course from `assignments/` in a temporary folder, makes the submissions (honest: the
reference plus every one-bug mutant of `grader/mutants.py`; attacks: `attacks.build`; wild: `--copies` copies of
each of `--variants`, correct notebooks as editors save them, `tests/test_grade_wild.py`, and ``big50``, one with
50 MB of saved prints), then times
1. `decodesched grade SUBS --out OUT --jobs N`, and
2. plain `nbgrader autograde decode_scheduling` (one call, all students, nbgrader's own defaults
   from assignments/nbgrader_config.py), which runs hidden tests inside each student's kernel.
Prints submissions per minute for both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))

from grader_attacks import attacks  # noqa: E402
from grader_attacks.course import build_course, tool_env as _env  # noqa: E402

from decodesched.grader import mutants  # noqa: E402

ASSIGNMENT = "decode_scheduling"


def honest_folder(release: Path, out: Path) -> None:
    out.mkdir()
    rel = json.loads(release.read_text())
    sources = {"reference": attacks.reference_source(), "honest_buggy": attacks.honest_source()}
    for mutant in mutants.MUTANTS:
        sources[mutant.name] = mutant.source()
    for name, src in sources.items():
        (out / f"{name}.ipynb").write_text(json.dumps(attacks._with_solution(rel, src)))


def wild_folder(release: Path, out: Path, variants: list[str], copies: int) -> None:
    import test_grade_wild as wild

    out.mkdir()
    rel = json.loads(release.read_text())
    files = wild._variants(rel)
    big = attacks._with_solution(rel, attacks.reference_source())
    at = next(i for i, c in enumerate(big["cells"]) if wild._gid(c) == "scheduler_solution")
    big["cells"].insert(at + 1, wild._printed(50))
    files["big50"] = json.dumps(big, indent=1).encode()
    for name in variants:
        for k in range(copies):
            (out / f"{name}_{k}.ipynb").write_bytes(files[name])


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _kill_matching(token: str) -> int:
    killed = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                hit = token.encode() in fh.read()
            hit = hit or token in os.readlink(f"/proc/{name}/cwd")
            with open(f"/proc/{name}/environ", "rb") as fh:
                hit = hit or token.encode() in fh.read()
            if hit:
                os.kill(int(name), 9)
                killed += 1
        except OSError:
            pass
    return killed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", choices=("honest", "attacks", "wild"), default="honest")
    ap.add_argument("--variants", default="lab4,colab,big50", help="--folder wild: which notebooks (test_grade_wild)")
    ap.add_argument("--copies", type=int, default=3, help="--folder wild: copies of each variant")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--plain-timeout", type=float, default=900)
    ap.add_argument("--skip-plain", action="store_true", help="time only decodesched grade")
    ap.add_argument("--table", action="store_true", help="print each submission's status and score, ours and plain")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="grade-throughput-"))
    try:
        course, release = build_course(root)
        subs = root / "subs"
        if args.folder == "honest":
            honest_folder(release, subs)
        elif args.folder == "wild":
            wild_folder(release, subs, args.variants.split(","), args.copies)
        else:
            attacks.build(release, subs)
        n = len(list(subs.glob("*.ipynb")))
        print(f"load average at the start: {os.getloadavg()}", flush=True)

        t, c = time.monotonic(), _children_cpu()
        ours = subprocess.run([sys.executable, "-m", "decodesched.cli", "grade", str(subs), "--out", str(root / "out"),
                               "--course", str(course), "--jobs", str(args.jobs), "--timeout", str(args.timeout),
                               "--no-progress"], capture_output=True, text=True, env=_env())
        ours_s, ours_cpu = time.monotonic() - t, _children_cpu() - c
        print(f"decodesched grade: {n} submissions in {ours_s:.1f} s = {n / ours_s * 60:.1f} per minute, "
              f"{ours_cpu / n:.2f} CPU s each (--jobs {args.jobs}); {ours.stdout.strip()}")

        if args.skip_plain:
            return 0
        plain = root / "plain"
        shutil.copytree(course, plain, ignore=shutil.ignore_patterns("gradebook.db"))
        shutil.copy2(course / "gradebook.db", plain / "gradebook.db")
        for nb in sorted(subs.glob("*.ipynb")):
            d = plain / "submitted" / nb.stem / ASSIGNMENT
            d.mkdir(parents=True)
            shutil.copy2(nb, d / f"{ASSIGNMENT}.ipynb")
        t, c = time.monotonic(), _children_cpu()
        env = _env()
        env["JUPYTER_RUNTIME_DIR"] = str(root / "runtime")  # so the kernels it leaves behind can be found
        env["GRADE_THROUGHPUT_RUN"] = str(root)
        try:
            proc = subprocess.run([sys.executable, "-m", "nbgrader", "autograde", ASSIGNMENT], cwd=plain,
                                  capture_output=True, text=True, env=env, timeout=args.plain_timeout,
                                  start_new_session=True)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        plain_s, plain_cpu = time.monotonic() - t, _children_cpu() - c
        print(f"plain nbgrader autograde: {n} submissions in {plain_s:.1f} s = {n / plain_s * 60:.1f} per minute, "
              f"{plain_cpu / n:.2f} CPU s each, kernels it left behind not counted (one process, exit {rc})")
        print(f"ratio ours/plain: {plain_s / ours_s:.2f}x the submissions per minute")
        print(f"load average at the end: {os.getloadavg()}")
        exp = subprocess.run([sys.executable, "-m", "nbgrader", "export", f"--to={root / 'plain.csv'}"], cwd=plain,
                             capture_output=True, text=True, env=_env())
        if args.table and exp.returncode == 0:
            import csv

            with open(root / "plain.csv", newline="") as fh:
                plain_rows = {r["student_id"]: r for r in csv.DictReader(fh)}
            with open(root / "out" / "grades.csv", newline="") as fh:
                ours_rows = {r["student_id"]: r for r in csv.DictReader(fh)}
            print(f"{'submission':26} {'status':9} {'score':>6}   plain nbgrader score")
            for sid in sorted(ours_rows):
                r = ours_rows[sid]
                p = plain_rows.get(sid, {}).get("raw_score", "-")
                print(f"{sid:26} {r['status']:9} {float(r['score']):6.2f}   {p}")
        left = _kill_matching(str(root))
        if left:
            print(f"plain nbgrader left {left} process(es) running (killed now)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
