"""The course from the student's first week (stop 64): a TODO done wrongly by reordering the queue (sorting
`self.queue` in place, putting a request at its front) made the visible cells read another request than the one
they name, and say something untrue ("victim status: expected 'preempted', got 'running'" of a victim that was
preempted). The cells now read `sim.queue[i]` through the helper cell's `queued`, which says first that the queue
keeps enqueue order, and the cells' mirrors among the checks read the same `request_id`."""

from __future__ import annotations

import json
import re
import types

import pytest

from decodesched.grader import harness, scenarios, spec, verdict

NB = json.loads(spec.SOURCE_NOTEBOOK.read_text(encoding="utf-8"))
REFERENCE = (spec.COURSE_ROOT.parent / "grader" / "solutions" / "reference.py").read_text(encoding="utf-8")
VISIBLE = [c.grade_id for c in spec.CELLS if not c.hidden]
WALK = "        for candidate in sorted(candidates, key=self._schedule_key):\n"
APPEND = "        self.queue.append(request)\n"

# Each reorders the queue and is otherwise the reference: (the edit, the visible cells it fails).
REORDERING = {
    "sorts_self_queue": ((WALK, "        self.queue.sort(key=self._schedule_key)\n"
                                "        for candidate in [req for req in self.queue if not req.done]:\n"),
                         {"test_todo3_capacity"}),
    "enqueues_at_the_front": ((APPEND, "        self.queue.insert(0, request)\n"),
                              set(VISIBLE)),
}


def _solution(name: str) -> str:
    (old, new), _ = REORDERING[name]
    assert REFERENCE.count(old) == 1, old
    return REFERENCE.replace(old, new)


def _src(cell) -> str:
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def _cell(grade_id: str) -> str:
    cell = next(c for c in NB["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    return re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", "", _src(cell), flags=re.S)


def _visible_errors(source: str) -> dict:
    """What each visible cell raises (None: it passed), run as the notebook runs it: the helper cell, the
    solution cell, then the test cell, in one namespace."""
    out = {}
    for gid in VISIBLE:
        ns: dict = {}
        exec(compile(_cell("test_helpers"), "test_helpers", "exec"), ns)
        exec(compile(source, spec.SOLUTION_CELL, "exec"), ns)
        try:
            exec(compile(_cell(gid), gid, "exec"), ns)
        except AssertionError as exc:
            out[gid] = str(exc)
        else:
            out[gid] = None
    return out


def _mirrors(source: str) -> dict:
    scen = [s for s in scenarios.build_scenarios(n_random=0) if s["cell"] in VISIBLE]
    mod = types.ModuleType("stop64_under_test")
    harness.load_solution(source, mod.__dict__, 5.0)
    obs = {s["id"]: harness.run_scenario(mod.__dict__, json.loads(json.dumps(s["ops"]))) for s in scen}
    return verdict.judge(scen, obs)


@pytest.mark.parametrize("name", sorted(REORDERING))
def test_a_visible_cell_reading_a_reordered_queue_says_the_queue_keeps_enqueue_order(name):
    # Before: "victim status: 期望 expected 'preempted', 实际 got 'running'" (sorts_self_queue; the victim was
    # preempted: queue[0] was the other request), "required_blocks: expected 3, got 1" (enqueues_at_the_front).
    errors = _visible_errors(_solution(name))
    failing = {gid for gid, err in errors.items() if err is not None}
    assert failing == REORDERING[name][1], errors
    for gid in failing:
        assert errors[gid].startswith("sim.queue[") and "the queue keeps enqueue order" in errors[gid], errors[gid]
        assert re.search(r"expected \d+, 实际 got \d+$", errors[gid]), errors[gid]


@pytest.mark.parametrize("name", sorted(REORDERING))
def test_the_mirrors_of_the_visible_cells_agree_with_the_cells_on_a_reordered_queue(name, capsys):
    """(A guard, right before too: the mirrors now read the request_id their cells read through `queued`, and
    still fail exactly the cells that fail in the notebook.)"""
    cells = _mirrors(_solution(name))
    failing = {gid for gid in VISIBLE if cells[gid].score < cells[gid].max_score}
    assert failing == REORDERING[name][1], {g: cells[g].lines for g in VISIBLE}
    capsys.readouterr()


def test_the_reference_passes_every_visible_cell_and_its_mirror(capsys):
    """(A guard, right before and after: the new reads cost a correct solution nothing.)"""
    assert _visible_errors(REFERENCE) == {gid: None for gid in VISIBLE}
    cells = _mirrors(REFERENCE)
    assert all(cells[gid].score == cells[gid].max_score for gid in VISIBLE)
    capsys.readouterr()


def _files(root) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if ".decodesched" not in p.parts)


def test_a_first_build_of_a_source_that_lost_a_cells_metadata_leaves_the_course_as_it_was(tmp_path, capsys):
    # Before: exit 2 with one line, but the course was left with nbgrader's gradebook.db and an empty release/ folder.
    pytest.importorskip("nbgrader")
    from decodesched.cli import main
    from decodesched.grader import course

    root = tmp_path / "课程 course"
    course.init_course(root)
    source = root / "source" / spec.ASSIGNMENT / spec.NOTEBOOK
    nb = json.loads(source.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == spec.SOLUTION_CELL:
            del cell["metadata"]["nbgrader"]
    source.write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    before = _files(root)
    capsys.readouterr()
    assert main(["assignment", "build", "--course", str(root)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Solution region detected in a non-solution cell" in err, err
    assert _files(root) == before
