"""The course notebook and the graded-cell spec agree, and the notebook is what the design says."""

import ast
import base64
import json
import re

from decodesched.grader import spec

NB = json.loads(spec.SOURCE_NOTEBOOK.read_text(encoding="utf-8"))
REFERENCE = (spec.COURSE_ROOT.parent / "grader" / "solutions" / "reference.py").read_text(encoding="utf-8")


def _src(cell):
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def _meta(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def test_spec_points_and_ids():
    assert spec.MAX_SCORE == 100
    assert spec.HIDDEN_POINTS >= 80  # hidden tests carry most of the points
    assert len(set(spec.CELL_IDS)) == len(spec.CELL_IDS)
    for todo in ("TODO 1", "TODO 2", "TODO 3", "TODO 4"):
        assert any(c.todo == todo and not c.hidden for c in spec.CELLS), f"no visible test for {todo}"
        assert any(c.todo == todo and c.hidden for c in spec.CELLS), f"no hidden test for {todo}"


def test_graded_cells_match_spec_in_order():
    graded = [(_meta(c)["grade_id"], _meta(c)["points"]) for c in NB["cells"] if _meta(c).get("grade")]
    assert graded == [(c.grade_id, c.points) for c in spec.CELLS]
    for cell in NB["cells"]:
        m = _meta(cell)
        if not m.get("grade"):
            continue
        assert m["locked"] and cell["cell_type"] == "code"
        hidden = "### BEGIN HIDDEN TESTS" in _src(cell)
        assert hidden == spec.CELLS_BY_ID[m["grade_id"]].hidden, m["grade_id"]
        # the points are stated in the cell itself
        assert f"{m['points']} 分 / points" in _src(cell) or f"({m['points']} points)" in _src(cell)


def test_one_solution_cell_equal_to_reference_with_four_regions():
    sols = [c for c in NB["cells"] if _meta(c).get("solution")]
    assert len(sols) == 1 and _meta(sols[0])["grade_id"] == spec.SOLUTION_CELL
    src = _src(sols[0])
    assert src == REFERENCE.rstrip("\n")
    assert src.count("### BEGIN SOLUTION") == src.count("### END SOLUTION") == 4
    for todo in ("TODO 1", "TODO 2", "TODO 3", "TODO 4"):
        assert todo in src


def test_seed_interface_is_kept():
    tree = ast.parse(REFERENCE)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    assert set(classes) >= {"RequestState", "DecodeSchedulerSim"}
    methods = {f.name: [a.arg for a in f.args.args] for f in classes["DecodeSchedulerSim"].body
               if isinstance(f, ast.FunctionDef)}
    assert methods["__init__"] == ["self", "policy", "free_kv_blocks", "aging_interval"]
    assert methods["enqueue"] == ["self", "request_id", "prompt_len", "max_new_tokens", "priority", "cache_hit",
                                  "required_blocks", "deadline_step", "preemptible"]
    for name in ("_effective_priority", "_remaining_steps", "_schedule_key", "_ensure_capacity"):
        assert methods[name] == ["self", "challenger" if name == "_ensure_capacity" else "req"]
    assert methods["step"] == ["self"] and methods["run"] == ["self", "max_steps"]


def test_text_is_chinese_first_with_english_and_a_timeline_picture():
    md = [c for c in NB["cells"] if c["cell_type"] == "markdown"]
    text = "\n".join(_src(c) for c in md)
    for topic in ("为什么", "生命周期", "排序键", "准入与抢占", "算例"):
        assert topic in text
    for topic in ("why decode scheduling matters", "lifecycle", "sort key", "Admission and preemption", "worked example"):
        assert topic.lower() in text.lower()
    heads = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert heads and all(re.search(r"[\u4e00-\u9fff]", h.split("·")[0]) for h in heads)  # Chinese first
    pics = [c for c in md if "attachment:timeline.png" in _src(c)]
    assert len(pics) == 1
    png = base64.b64decode(pics[0]["attachments"]["timeline.png"]["image/png"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_code_cells_import_no_numba_or_matplotlib_and_warn_nothing():
    for cell in NB["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = _src(cell)
        assert "numba" not in src and "matplotlib" not in src and "warnings.warn" not in src
        assert "decodesched" not in src  # the student's kernel needs nothing of ours


def test_worked_example_table_matches_the_model():
    from decodesched.model import DecodeSchedulerSim

    sim = DecodeSchedulerSim(free_kv_blocks=4)
    sim.enqueue(1, 4, 3, priority=0, required_blocks=3)
    sim.enqueue(2, 2, 2, priority=1, cache_hit=True, required_blocks=1)
    events = [sim.step() for _ in range(3)]
    sim.enqueue(3, 3, 1, priority=5, required_blocks=3)
    events += sim.run(20)[3:]
    text = next(_src(c) for c in NB["cells"] if "attachment:timeline.png" in _src(c))
    rows = [ln for ln in text.splitlines() if re.match(r"\| \d+ \|", ln)]
    assert len(rows) == len(events)
    for row, ev in zip(rows, events):
        cells = [x.strip() for x in row.strip("|").split("|")]
        assert int(cells[1]) == ev["request_id"] and cells[2] == f"`{ev['action']}`"
        assert int(cells[5]) == ev["free_kv_blocks"]
        assert cells[6] == ("" if ev["preempted_request_id"] is None else str(ev["preempted_request_id"]))


def _task_text():
    md = [_src(c) for c in NB["cells"] if c["cell_type"] == "markdown"]
    return next(t for t in md if "Your task" in t)


def test_the_task_says_up_front_that_only_the_solution_cell_runs_with_the_stdlib_and_numpy():
    # Audit 6, findings 2 and 3: a helper in another cell, or `import numba`, scored ~10 with no word about why.
    text = _task_text()
    zh = text.index("只提供 Python 标准库和\nNumPy")
    en = text.index("with the Python standard library and NumPy only")
    assert zh < en  # Chinese first, English beside it
    assert "只有这个单元格会被评分" in text and "every helper function, constant\nand `import`" in text
    assert "numba" in text


def test_the_task_promises_nothing_about_stderr_that_the_grader_does_not_do():
    # Audit 6, finding 9: "a test cell with stderr output scores 0" was false (scores come from the verdict).
    text = _task_text()
    assert "scores 0" not in text and "记 0 分" not in text
    assert "do not\nchange your score" in text and "不影响分数" in text
