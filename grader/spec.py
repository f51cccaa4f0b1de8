"""What is graded in the decode-scheduling assignment: one place for cell ids, points and titles.

The notebook (`assignments/source/decode_scheduling/decode_scheduling.ipynb`), the verdict checks
(`grader.scenarios`, `grader.verdict`) and the grade pipeline all read these names.  Every graded cell in the notebook
has exactly one entry here, in notebook order; `grader.verdict.judge` returns one verdict per entry.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

ASSIGNMENT = "decode_scheduling"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"
# The nbgrader grade_id of the one code cell the student completes (RequestState + DecodeSchedulerSim).
SOLUTION_CELL = "scheduler_solution"

# The course template shipped with the package (`assignments/`: nbgrader_config.py and the source
# notebook). Only ever read: `decodesched assignment init DIR` copies it into a course folder of one's own.
COURSE_ROOT = Path(__file__).resolve().parent.parent / "assignments"
SOURCE_NOTEBOOK = COURSE_ROOT / "source" / ASSIGNMENT / NOTEBOOK


class Cell(NamedTuple):
    grade_id: str
    points: int
    hidden: bool
    todo: str
    title: str


CELLS: list[Cell] = [
    # Visible tests: the student sees and runs them; a few points each.
    Cell("test_todo1_enqueue", 3, False, "TODO 1", "enqueue builds the request state / 入队构造请求状态"),
    Cell("test_todo2_schedule_key", 3, False, "TODO 2", "the sort key / 排序键"),
    Cell("test_todo3_capacity", 3, False, "TODO 3", "admission and preemption / 准入与抢占"),
    Cell("test_todo4_step", 3, False, "TODO 4", "one step and the event log / 单步推进与事件"),
    # Hidden tests: most of the points; judged outside the student's kernel by grader.verdict.
    Cell("hidden_todo1_enqueue", 8, True, "TODO 1", "request state after enqueue / 入队后的请求状态"),
    Cell("hidden_input_errors", 6, True, "TODO 1", "input errors / 非法输入"),
    Cell("hidden_todo2_schedule_key", 14, True, "TODO 2",
         "tie-breaks, sentinel, aging and deadline slack / 排序键的平局、哨兵值、aging 与 deadline 余量"),
    Cell("hidden_todo3_capacity", 16, True, "TODO 3",
         "admission, single victim, non-preemptible, equal priority / 准入、单一 victim、不可抢占、同优先级"),
    Cell("hidden_todo4_step", 14, True, "TODO 4",
         "wait accounting, resume keeps progress, deadline flags / 等待计数、恢复保留进度、deadline 标记"),
    Cell("hidden_differential", 30, True, "TODO 1-4",
         "random traces against the reference engine / 随机轨迹与参考引擎逐事件对照"),
]

# The method of the solution cell in which each TODO is done (the feedback names the TODO of an error raised there,
# such as the bare NotImplementedError of a stub left in place).
TODO_OF_METHOD = {"enqueue": "TODO 1", "_schedule_key": "TODO 2", "_ensure_capacity": "TODO 3", "step": "TODO 4"}

CELL_IDS = [c.grade_id for c in CELLS]
CELLS_BY_ID = {c.grade_id: c for c in CELLS}
MAX_SCORE = sum(c.points for c in CELLS)
HIDDEN_POINTS = sum(c.points for c in CELLS if c.hidden)

assert len(set(CELL_IDS)) == len(CELL_IDS)
assert MAX_SCORE == 100
