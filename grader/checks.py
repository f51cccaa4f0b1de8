"""The verdict: judge a student's solution cell outside the student's kernel.

`verdict_for_source(source, limits=...)` runs the solution cell in a fresh, sandboxed child
(``python -I -S harness.py``; stdlib only, no access to `decodesched`), collects plain observations
with strict types, and compares them here, in the grading process, with the same operations run on
the reference model `decodesched.model`.  The checks are

* targeted scenarios, one small program per rule (tie-breaks, the sentinel slack, a single victim,
  non-preemptible and equal-priority requests, resume keeps progress, wait accounting, deadline
  flags, input errors), grouped by graded cell (`grader.spec.CELLS`);
* differential runs on hundreds of small seeded random traces replayed as SPEC section 3 defines;
  a failing trace is shrunk (fewer requests, smaller values) while it still fails, and reported as
  a small table with its first diverging event.

Each cell scores ``points * passed / total`` (never above its points).  Feedback lines describe the
scenario and the first difference; they never contain test source or tracebacks.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from decodesched import model as _model

from . import harness as _harness
from .spec import CELLS, CELLS_BY_ID, SOLUTION_CELL  # noqa: F401  (SOLUTION_CELL re-exported)

HARNESS = Path(__file__).with_name("harness.py")
STATUSES = ("graded", "timeout", "crashed", "memory", "tampered", "invalid")
SENTINEL = _model.NO_DEADLINE_SLACK
N_RANDOM_TRACES = 240
MAX_LINES_PER_CELL = 6


@dataclass
class Limits:
    """Limits for one harness run (all scenarios of one submission together)."""

    timeout_s: float = 60.0
    cpu_s: float = 60.0
    memory_mb: int = 1024
    scenario_timeout_s: float = 3.0


@dataclass
class CellVerdict:
    score: float
    max_score: float
    lines: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    cells: dict[str, CellVerdict]
    status: str
    total: float
    max_total: float
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "status": self.status,
            "total": self.total,
            "max_total": self.max_total,
            "notes": list(self.notes),
            "cells": {k: {"score": v.score, "max_score": v.max_score, "lines": list(v.lines)} for k, v in self.cells.items()},
        }


# --------------------------------------------------------------------------------------------
# Scenario construction
# --------------------------------------------------------------------------------------------

ENQ_ORDER = ("request_id", "prompt_len", "max_new_tokens", "priority", "cache_hit", "required_blocks",
             "deadline_step", "preemptible")


def new(**kw):
    return ["new", kw]


def enq(request_id, prompt_len, max_new_tokens=2, **kw):
    return ["enqueue", {"request_id": request_id, "prompt_len": prompt_len, "max_new_tokens": max_new_tokens, **kw}]


STEP = ["step"]
STATE = ["state"]


def key(i):
    return ["key", i]


def eff(i):
    return ["eff", i]


def ensure(i):
    return ["ensure", i]


def run(n):
    return ["run", n]


def setf(i, name, value):
    return ["set", i, name, value]


def setclock(v):
    return ["setclock", v]


def steps(n):
    return [STEP] * n


def _targeted() -> list[dict]:
    """Targeted scenarios: (cell, id, what, ops).  `what` is shown to the student on failure."""
    S = []

    def sc(cell, sid, what, *ops):
        flat = []
        for op in ops:
            if op and isinstance(op[0], list):
                flat.extend(op)
            else:
                flat.append(op)
        S.append({"cell": cell, "id": sid, "what": what, "ops": flat})

    # ---- visible TODO 1 (mirrors the notebook's visible test) ----
    c = "test_todo1_enqueue"
    sc(c, "v1_contract", "enqueue keeps the input fields; the request starts in prefill / 入队保留输入字段，从 prefill 开始",
       new(), enq(1, 2, 2, priority=2, cache_hit=True), STATE)
    sc(c, "v1_fields", "enqueue keeps blocks, deadline and preemptible / 入队保留 block、deadline 与可抢占性",
       new(), enq(7, 3, 4, priority=-1, required_blocks=3, deadline_step=9, preemptible=False), STATE)

    # ---- visible TODO 2 ----
    c = "test_todo2_schedule_key"
    sc(c, "v2_phase_first", "phase ranks before cache and priority / 阶段先于缓存与优先级",
       new(), enq(1, 4, 1, priority=0), enq(2, 4, 1, priority=9, cache_hit=True), setf(1, "phase", "decode"),
       key(0), key(1))
    sc(c, "v2_priority", "a larger priority sorts first and runs first / 优先级大者先运行",
       new(), enq(1, 4, 1, priority=1, cache_hit=True), enq(2, 4, 1, priority=3, cache_hit=True), key(0), key(1), STEP)
    sc(c, "v2_deadline", "policy deadline sorts by slack / deadline 策略按余量排序",
       new(policy="deadline"), enq(1, 4, 4, priority=9, deadline_step=20), enq(2, 2, 1, priority=0, deadline_step=1),
       key(0), key(1), STEP)

    # ---- visible TODO 3 ----
    c = "test_todo3_capacity"
    sc(c, "v3_admission", "a request that does not fit waits; finish frees blocks / 容量不足则等待，完成释放容量",
       new(free_kv_blocks=2), enq(1, 4, 1, priority=9, required_blocks=3), enq(2, 4, 1, priority=1, required_blocks=2),
       STEP, STATE, STEP, STATE)
    sc(c, "v3_preempt", "a higher priority request preempts and the victim resumes / 高优先级抢占，victim 恢复",
       new(free_kv_blocks=2), enq(1, 4, 2, priority=1, required_blocks=2), STEP, enq(2, 2, 1, priority=9, required_blocks=2),
       STEP, STATE, run(10), STATE)
    sc(c, "v3_non_preemptible", "a non-preemptible request is never preempted / 不可抢占请求受保护",
       new(free_kv_blocks=2), enq(1, 4, 2, priority=1, required_blocks=2, preemptible=False), STEP,
       enq(2, 2, 1, priority=9, required_blocks=2), STEP, STATE)

    # ---- visible TODO 4 ----
    c = "test_todo4_step"
    sc(c, "v4_progression", "two requests run to completion in 7 steps / 两个请求 7 步完成",
       new(), enq(1, 2, 2, priority=2, cache_hit=True), enq(2, 3, 3, priority=1), run(20), STATE)
    sc(c, "v4_guards", "bad input is rejected and run stops at max_steps / 非法输入被拒绝，run 遵守 max_steps",
       new(), enq(1, 0, 2), enq(1, 1, 0), enq(1, 1, 2, required_blocks=0), enq(1, 1, 3), run(2), run(-1), STATE)

    # ---- hidden TODO 1: the request state ----
    c = "hidden_todo1_enqueue"
    sc(c, "h1_all_fields", "every field set at enqueue is kept, progress starts at zero / 入队字段全部保留，进度从零开始",
       new(policy="deadline", free_kv_blocks=10), enq(-4, 5, 3, priority=-2, cache_hit=True, required_blocks=3,
                                                      deadline_step=12, preemptible=False), STATE)
    sc(c, "h1_defaults", "defaults: max_new_tokens=2, priority 0, 1 block, no deadline, preemptible / 默认值",
       new(), ["enqueue", {"request_id": 0, "prompt_len": 1}], STATE)
    sc(c, "h1_order", "the queue keeps enqueue order / 队列保持入队顺序",
       new(), enq(5, 1, 1), enq(-1, 2, 1), enq(3, 3, 1), STATE)
    sc(c, "h1_no_admission_at_enqueue", "enqueue does not take KV blocks; admission happens in step / 入队不占用容量",
       new(free_kv_blocks=3), enq(1, 2, 1, required_blocks=2), enq(2, 2, 1, required_blocks=3), STATE)
    sc(c, "h1_late_enqueue", "a request enqueued later starts fresh (waiting, no waits) / 后入队请求从零开始",
       new(), enq(1, 2, 3), STEP, STEP, enq(2, 1, 1, deadline_step=3), STATE, STEP, STATE)
    sc(c, "h1_own_state", "each request has its own state object / 每个请求的状态相互独立",
       new(), enq(1, 1, 2), enq(2, 1, 2), STEP, STATE)

    # ---- hidden input errors ----
    c = "hidden_input_errors"
    sc(c, "he_duplicate", "a duplicate request_id raises ValueError and changes nothing / 重复 id 报 ValueError",
       new(), enq(1, 2, 1), enq(1, 3, 1), enq(2, 3, 1), STATE)
    sc(c, "he_duplicate_finished", "the id of a finished request is still taken / 已完成请求的 id 仍不可复用",
       new(), enq(3, 1, 1), run(5), enq(3, 1, 1), STATE)
    sc(c, "he_lengths", "non-positive lengths or blocks raise ValueError / 非正长度或 block 报 ValueError",
       new(), enq(1, 0, 1), enq(1, -1, 1), enq(1, 1, 0), enq(1, 1, 1, required_blocks=0), enq(1, 1, 1, required_blocks=-2),
       enq(1, 1, 1), STATE)
    sc(c, "he_deadline", "deadline_step must be after the clock / deadline 必须晚于当前时钟",
       new(), enq(1, 1, 2, deadline_step=0), enq(1, 1, 2, deadline_step=1), STEP, STEP, enq(2, 1, 1, deadline_step=2),
       enq(2, 1, 1, deadline_step=3), STATE)
    sc(c, "he_constructor", "bad policy, capacity or aging interval raise ValueError / 构造参数非法报 ValueError",
       new(policy="round_robin"), new(policy="FIXED_PRIORITY"), new(free_kv_blocks=-1), new(aging_interval=0),
       new(aging_interval=-3), new(policy="aging", free_kv_blocks=0, aging_interval=1), enq(1, 1, 1), STEP, STATE)
    sc(c, "he_max_steps", "negative max_steps raises ValueError; run(0) runs nothing / 负 max_steps 报错",
       new(), enq(1, 1, 3), run(-1), run(0), run(2), STATE)

    # ---- hidden TODO 2: the sort key ----
    c = "hidden_todo2_schedule_key"
    sc(c, "h2_sentinel_fixed", "without policy deadline the slack is the sentinel 1_000_000_000 / 非 deadline 策略用哨兵值",
       new(), enq(1, 3, 2, deadline_step=2), enq(2, 3, 2), key(0), key(1))
    sc(c, "h2_sentinel_aging", "policy aging ignores deadlines in the key / aging 策略不看 deadline",
       new(policy="aging", aging_interval=2), enq(1, 3, 2, deadline_step=3, priority=1), enq(2, 2, 2, priority=1),
       setf(1, "wait_steps", 5), key(0), key(1), eff(1), STEP)
    sc(c, "h2_slack_prefill", "slack = deadline - clock - (1 + tokens left) in prefill / prefill 余量",
       new(policy="deadline"), enq(1, 3, 4, deadline_step=12), enq(2, 2, 2), key(0), key(1), STEP, key(0), STEP, key(0))
    sc(c, "h2_slack_decode", "slack in decode counts only the tokens left / decode 阶段余量只计剩余 token",
       new(policy="deadline"), enq(1, 3, 3, deadline_step=20), STEP, key(0), STEP, key(0))
    sc(c, "h2_negative_slack", "overdue slack is negative, not clamped / 逾期余量为负，不截断",
       new(policy="deadline"), enq(1, 2, 5, deadline_step=2), enq(2, 2, 1, deadline_step=7), key(0), key(1), STEP,
       key(0), STEP, key(0))
    sc(c, "h2_huge_slack_ties", "a slack of 1_000_000_000 ties with no deadline; larger sorts after / 余量等于哨兵时平局",
       new(policy="deadline"), enq(4, 2, 1, deadline_step=1_000_000_002), enq(2, 2, 1),
       enq(1, 2, 1, deadline_step=1_000_000_050), key(0), key(1), key(2), STEP, STEP, STEP)
    sc(c, "h2_cache_then_priority", "cache hit before priority; then larger priority / 先缓存命中，再优先级",
       new(), enq(1, 4, 1, priority=5), enq(2, 4, 1, priority=0, cache_hit=True), enq(3, 4, 1, priority=2, cache_hit=True),
       key(0), key(1), key(2), STEP, STEP)
    sc(c, "h2_length_then_id", "ties break by total length, then request_id (ids may be negative) / 平局按总长度再按 id",
       new(), enq(9, 3, 1), enq(4, 5, 1), enq(-2, 3, 1), enq(0, 3, 1), key(0), key(1), key(2), key(3),
       STEP, STEP, STEP, STEP)
    sc(c, "h2_total_len_grows", "total_len counts generated tokens / 总长度包含已生成 token",
       new(), enq(1, 3, 3), enq(2, 4, 3), STEP, STEP, key(0), key(1), STEP, key(0), key(1), STEP)
    sc(c, "h2_aging_key", "under aging the key uses priority + wait_steps // aging_interval / aging 的有效优先级进入排序键",
       new(policy="aging", aging_interval=3), enq(1, 4, 1, priority=1), enq(2, 4, 1, priority=3),
       setf(0, "wait_steps", 7), eff(0), eff(1), key(0), key(1), STEP)
    sc(c, "h2_fixed_ignores_wait", "wait_steps does not change the key under fixed_priority / 固定策略中等待不改排序键",
       new(aging_interval=1), enq(1, 4, 1, priority=1), enq(2, 4, 1, priority=1), key(0),
       setf(0, "wait_steps", 50), eff(0), key(0), key(1))
    sc(c, "h2_deadline_before_phase", "under deadline, slack ranks before phase / deadline 策略中余量先于阶段",
       new(policy="deadline"), enq(1, 1, 3, deadline_step=5), enq(2, 1, 1), STEP, enq(3, 1, 1, deadline_step=30),
       key(0), key(1), key(2), STEP, STEP)

    # ---- hidden TODO 3: admission and preemption ----
    c = "hidden_todo3_capacity"
    sc(c, "h3_exact_fit", "a request whose blocks equal the free blocks is admitted / 恰好够用即可准入",
       new(free_kv_blocks=3), enq(1, 1, 1, required_blocks=3), STEP, STATE, STEP, STATE)
    sc(c, "h3_skip_to_fitting", "a request that does not fit is skipped for one that fits / 放不下则跳到下一个",
       new(free_kv_blocks=2), enq(1, 1, 2, priority=5, required_blocks=3), enq(2, 1, 1, priority=0, required_blocks=2),
       enq(3, 1, 1, priority=1, required_blocks=1), STEP, STEP, STATE)
    sc(c, "h3_single_victim", "one lower-priority victim is preempted and keeps its progress / 单一 victim 保留进度",
       new(free_kv_blocks=3), enq(1, 2, 3, priority=1, required_blocks=3), STEP, STEP,
       enq(2, 1, 1, priority=4, required_blocks=2), STEP, STATE)
    sc(c, "h3_two_victims_needed", "only one victim per step: a request needing two is skipped / 需要两个 victim 时不抢占",
       new(free_kv_blocks=4), enq(1, 1, 3, priority=0, required_blocks=2), enq(2, 1, 3, priority=0, required_blocks=2),
       STEP, STEP, enq(3, 1, 1, priority=9, required_blocks=4), STEP, STATE)
    sc(c, "h3_equal_priority", "equal priority is not lower: no preemption / 同优先级不可抢占",
       new(free_kv_blocks=2), enq(1, 1, 3, priority=3, required_blocks=2), STEP,
       enq(2, 1, 1, priority=3, required_blocks=2, cache_hit=True), STEP, STATE)
    sc(c, "h3_non_preemptible", "a non-preemptible request keeps its blocks / 不可抢占请求保留 block",
       new(free_kv_blocks=3), enq(1, 1, 3, priority=0, required_blocks=2, preemptible=False),
       enq(2, 2, 3, priority=1, required_blocks=1), STEP, STEP, enq(3, 1, 1, priority=9, required_blocks=2), STEP, STATE)
    sc(c, "h3_victim_order", "victim order: lowest priority, then most blocks, then request_id / victim 选择顺序",
       new(free_kv_blocks=6), enq(5, 1, 4, priority=1, required_blocks=1), enq(3, 1, 4, priority=1, required_blocks=2),
       enq(4, 1, 4, priority=1, required_blocks=2), enq(8, 1, 4, priority=2, required_blocks=1), run(4),
       enq(9, 1, 1, priority=9, required_blocks=1), STEP, STATE)
    sc(c, "h3_victim_must_suffice", "the first victim whose blocks are enough, not simply the lowest / victim 必须腾出足够容量",
       new(free_kv_blocks=4), enq(1, 1, 4, priority=0, required_blocks=1), enq(2, 1, 4, priority=1, required_blocks=3),
       STEP, STEP, enq(3, 1, 1, priority=5, required_blocks=3), STEP, STATE)
    sc(c, "h3_negative_and_zero_ids", "victim ids 0 and negative are reported as such / id 为 0 或负数的 victim",
       new(free_kv_blocks=1), enq(0, 1, 2, priority=0), STEP, enq(-1, 1, 2, priority=1), STEP, STATE,
       enq(7, 1, 1, priority=2), STEP, STATE)
    sc(c, "h3_ensure_direct", "_ensure_capacity: admitted -> None; fits -> admit; no victim -> None, nothing changes",
       new(free_kv_blocks=3), enq(1, 1, 2, priority=2, required_blocks=2), enq(2, 1, 2, priority=2, required_blocks=2),
       ensure(0), STATE, ensure(0), STATE, ensure(1), STATE)
    sc(c, "h3_ensure_preempts", "_ensure_capacity returns the victim's id and moves the blocks / 直接调用时返回 victim id",
       new(free_kv_blocks=2), enq(1, 1, 2, priority=0, required_blocks=2), enq(2, 1, 1, priority=5, required_blocks=2),
       ensure(0), ensure(1), STATE)
    sc(c, "h3_aging_preemption", "under aging, preemption compares effective priorities / aging 下按有效优先级比较",
       new(policy="aging", aging_interval=1, free_kv_blocks=2), enq(1, 1, 6, priority=2, required_blocks=2),
       enq(2, 1, 1, priority=0, required_blocks=2), STEP, STEP, STEP, STATE, STEP, STATE)
    sc(c, "h3_zero_capacity", "with no blocks nothing runs: step returns None and changes nothing / 零容量",
       new(free_kv_blocks=0), enq(1, 1, 1), enq(2, 1, 1, priority=3), STEP, STATE)
    sc(c, "h3_release_on_finish", "blocks come back exactly once at finish / 完成时归还一次容量",
       new(free_kv_blocks=5), enq(1, 1, 2, required_blocks=2), enq(2, 1, 1, required_blocks=3, priority=1), run(10), STATE)

    # ---- hidden TODO 4: one step ----
    c = "hidden_todo4_step"
    sc(c, "h4_wait_accounting", "every unfinished request not chosen waits one step; the chosen one does not / 等待计数",
       new(free_kv_blocks=2), enq(1, 1, 2, priority=3, required_blocks=2), enq(2, 1, 1, priority=1),
       enq(3, 1, 1, priority=0), STEP, STATE, STEP, STATE, run(10), STATE)
    sc(c, "h4_event_wait", "the event reports the chosen request's own wait_steps / 事件中的 wait_steps",
       new(), enq(1, 1, 1, priority=2), enq(2, 1, 1), run(4))
    sc(c, "h4_resume_keeps_progress", "a preempted request resumes in decode with its tokens / 恢复时保留阶段与 token",
       new(free_kv_blocks=2), enq(1, 2, 4, priority=0, required_blocks=2), STEP, STEP, STEP,
       enq(2, 1, 1, priority=5, required_blocks=2), STEP, STATE, STEP, STATE, run(10), STATE)
    sc(c, "h4_deadline_flags", "deadline_missed = clock + 1 + remaining > deadline, under every policy / 违约标记",
       new(), enq(1, 1, 2, deadline_step=3), enq(2, 1, 2, deadline_step=5), run(10))
    sc(c, "h4_deadline_flags_deadline", "deadline flags under policy deadline / deadline 策略的违约标记",
       new(policy="deadline"), enq(1, 1, 3, deadline_step=4), enq(2, 1, 1, deadline_step=3), enq(3, 1, 1), run(10))
    sc(c, "h4_finish_frees", "finish frees the blocks and marks the request finished / 完成释放容量",
       new(free_kv_blocks=2), enq(1, 1, 1, required_blocks=2), STEP, STATE, STEP, STATE, STEP)
    sc(c, "h4_none_when_stuck", "None when nothing can run; the clock does not move / 无法推进时返回 None 且时钟不变",
       new(free_kv_blocks=1), enq(1, 1, 1, required_blocks=2), STEP, STEP, STATE, run(5), STATE)
    sc(c, "h4_timeline", "events are appended to timeline and run returns it / 事件记录在 timeline 中",
       new(), enq(1, 1, 2), STEP, run(1), run(5), STATE)
    sc(c, "h4_first_admissible", "the first candidate in key order that can be admitted runs / 选择第一个可准入的候选",
       new(free_kv_blocks=2), enq(1, 1, 2, priority=1, required_blocks=2), STEP, enq(2, 1, 1, priority=5, required_blocks=3),
       enq(3, 1, 1, priority=0, required_blocks=1, cache_hit=True), STEP, STEP, STATE)
    sc(c, "h4_preempted_then_finish", "preemption, resume and finish, with events / 抢占、恢复与完成的完整事件",
       new(policy="deadline", free_kv_blocks=3), enq(1, 2, 3, priority=0, required_blocks=3, deadline_step=30),
       STEP, STEP, enq(2, 1, 2, priority=2, required_blocks=2, deadline_step=6), run(20), STATE)
    return S


def _random_trace(rng: random.Random, index: int) -> dict:
    """A small random trace and its configuration (policy, capacity, aging, max_steps)."""
    n = rng.choice((1, 2, 3, 3, 4, 4, 5, 5, 6, 7))
    policy = ("fixed_priority", "aging", "deadline")[index % 3]
    tight = rng.random() < 0.7
    capacity = rng.randint(0, 6) if tight else rng.randint(6, 30)
    ids = rng.sample(range(-6, 20), n)
    rows = []
    for i in range(n):
        arrival = rng.choice((0, 0, 0, rng.randint(0, 8), rng.randint(0, 20)))
        mnt = rng.randint(1, 4)
        deadline = None
        if rng.random() < 0.55:
            deadline = arrival + rng.randint(1, 14)
            if rng.random() < 0.05:
                deadline = arrival + SENTINEL + rng.randint(-2, 8)
        rows.append({
            "request_id": ids[i],
            "arrival_step": arrival,
            "prompt_len": rng.randint(1, 6),
            "max_new_tokens": mnt,
            "priority": rng.randint(-2, 3),
            "cache_hit": rng.random() < 0.4,
            "required_blocks": rng.randint(1, 4),
            "deadline_step": deadline,
            "preemptible": rng.random() < 0.75,
        })
    max_steps = None if rng.random() < 0.85 else rng.randint(1, 12)
    return {"rows": rows, "policy": policy, "free_kv_blocks": capacity, "aging_interval": rng.randint(1, 4),
            "max_steps": max_steps}


def _bound(trace: dict) -> int:
    """The max_steps given to the harness: the trace's own, else more than any correct run needs."""
    if trace["max_steps"] is not None:
        return trace["max_steps"]
    return sum(r["max_new_tokens"] + 1 for r in trace["rows"]) + 5


def trace_scenario(sid: str, trace: dict) -> dict:
    ops = [new(policy=trace["policy"], free_kv_blocks=trace["free_kv_blocks"], aging_interval=trace["aging_interval"]),
           ["replay", trace["rows"], _bound(trace)]]
    return {"cell": "hidden_differential", "id": sid, "what": "random trace", "ops": ops, "trace": trace}


_MODEL_NS = {"DecodeSchedulerSim": _model.DecodeSchedulerSim, "RequestState": _model.RequestState}


def expected_for(ops: list) -> list:
    """The observations the reference model gives for `ops` (same harness code, same normalising)."""
    return _harness.run_scenario(_MODEL_NS, json.loads(json.dumps(ops)))


@functools.lru_cache(maxsize=4)
def _scenarios_cached(seed: int, n_random: int) -> tuple:
    out = []
    for s in _targeted():
        s["expected"] = expected_for(s["ops"])
        out.append(s)
    rng = random.Random(1_000_003 * seed + 17)
    for i in range(n_random):
        s = trace_scenario(f"r{seed}_{i:03d}", _random_trace(rng, i))
        s["expected"] = expected_for(s["ops"])
        out.append(s)
    return tuple(out)


def build_scenarios(seed: int = 0, n_random: int = N_RANDOM_TRACES) -> list[dict]:
    """All scenarios (targeted first, then random traces), each with its ``expected`` observations."""
    return [dict(s) for s in _scenarios_cached(seed, n_random)]


# --------------------------------------------------------------------------------------------
# Comparing observations and saying what differs
# --------------------------------------------------------------------------------------------

def _fmt(v) -> str:
    if isinstance(v, str):
        return repr(v) if not v.startswith("<") else v
    if isinstance(v, list):
        return "(" + ", ".join(_fmt(x) for x in v) + ")"
    return repr(v)


def _event_head(ev) -> str:
    if not isinstance(ev, dict):
        return "no event (None)" if ev is None else f"{_fmt(ev)}"
    text = f"request {_fmt(ev.get('request_id'))} {ev.get('action')}"
    if ev.get("preempted_request_id") is not None:
        text += f" (preempting {_fmt(ev.get('preempted_request_id'))})"
    return text


EVENT_FIELDS = ("request_id", "action", "phase", "preempted_request_id", "generated_len", "wait_steps",
                "free_kv_blocks", "deadline_missed", "prompt_len", "max_new_tokens", "step")


def diff_event(exp, got, where: str) -> str:
    if _same(exp, got):
        return ""
    if not isinstance(exp, dict) or not isinstance(got, dict):
        return f"{where}: expected {_event_head(exp)}, got {_describe_got(got)}"
    if exp.get("request_id") != got.get("request_id") or exp.get("action") != got.get("action") \
            or type(exp.get("request_id")) is not type(got.get("request_id")):
        return f"{where}: expected {_event_head(exp)}, got {_event_head(got)}"
    for f in EVENT_FIELDS + tuple(k for k in exp if k not in EVENT_FIELDS):
        if not _same(exp.get(f), got.get(f, "<missing>")):
            return (f"{where} ({_event_head(exp)}): expected {f}={_fmt(exp.get(f))}, "
                    f"got {f}={_fmt(got.get(f, '<missing>'))}")
    extra = sorted(set(got) - set(exp))
    return f"{where} ({_event_head(exp)}): unexpected event keys {extra}"


def _describe_got(got) -> str:
    if isinstance(got, dict) and "raised" in got:
        return f"{got['raised']}"
    if isinstance(got, dict) and got.get("timeout"):
        return "a timeout (the step did not return)"
    if got is None:
        return "no event (None)"
    if isinstance(got, dict):
        return _event_head(got)
    return _fmt(got)


def _same(a, b) -> bool:
    """Equality with exact types (True is not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def diff_events(exp: list, got, label: str = "step") -> str:
    if not isinstance(got, list):
        return f"expected a list of events, got {_describe_got(got)}"
    for i in range(max(len(exp), len(got))):
        e = exp[i] if i < len(exp) else "<no more events>"
        g = got[i] if i < len(got) else "<no more events>"
        if i >= len(exp):
            at = g.get("step", i) if isinstance(g, dict) and type(g.get("step")) is int else i
            return f"{label} {at}: expected no more events, got {_event_head(g)}"
        if i >= len(got):
            return f"{label} {e.get('step', i)}: expected {_event_head(e)}, got no more events"
        where = f"{label} {e.get('step', i) if isinstance(e, dict) else i}"
        d = diff_event(e, g, where)
        if d:
            return d
    return ""


def diff_states(exp: dict, got, ids=None) -> str:
    if not isinstance(got, dict):
        return f"expected the scheduler state, got {_describe_got(got)}"
    for f in ("clock", "free_kv_blocks"):
        if f in exp and not _same(exp[f], got.get(f)):
            return f"expected {f}={_fmt(exp[f])}, got {f}={_fmt(got.get(f))}"
    eq, gq = exp.get("queue"), got.get("queue")
    if eq is not None:
        if not isinstance(gq, list) or len(gq) != len(eq):
            n = len(gq) if isinstance(gq, list) else _fmt(gq)
            return f"expected {len(eq)} requests in the queue, got {n}"
        for e, g in zip(eq, gq):
            d = _diff_request(e, g)
            if d:
                return d
    return ""


def _diff_request(e: dict, g) -> str:
    if not isinstance(g, dict):
        return f"request {_fmt(e.get('request_id'))}: expected its state, got {_fmt(g)}"
    for f in _harness.STATE_FIELDS:
        if not _same(e.get(f), g.get(f)):
            return f"request {_fmt(e.get('request_id'))}: expected {f}={_fmt(e.get(f))}, got {f}={_fmt(g.get(f))}"
    return ""


def _op_text(op) -> str:
    name = op[0]
    if name == "new":
        return "DecodeSchedulerSim(" + ", ".join(f"{k}={v!r}" for k, v in op[1].items()) + ")"
    if name == "enqueue":
        kw = op[1]
        return "enqueue(" + ", ".join(f"{k}={kw[k]!r}" for k in ENQ_ORDER if k in kw) + ")"
    if name == "step":
        return "step()"
    if name == "run":
        return f"run(max_steps={op[1]})"
    if name == "key":
        return f"_schedule_key(queue[{op[1]}])"
    if name == "eff":
        return f"_effective_priority(queue[{op[1]}])"
    if name == "ensure":
        return f"_ensure_capacity(queue[{op[1]}])"
    if name == "state":
        return "(state)"
    if name == "set":
        return f"queue[{op[1]}].{op[2]} = {op[3]!r}"
    if name == "setclock":
        return f"clock = {op[1]!r}"
    return name


def diff_op(op, exp, got, step_no: int) -> str:
    """'' when equal, else one line saying what was expected and what came."""
    if _same(exp, got):
        return ""
    name = op[0]
    if isinstance(got, dict) and got.get("timeout"):
        return f"{_op_text(op)} did not return within the time limit"
    if name in ("new", "enqueue"):
        e = "ValueError" if isinstance(exp, dict) and exp.get("raised") == "ValueError" else "no error"
        if isinstance(exp, dict) and exp.get("raised") not in (None, "ValueError"):
            e = exp["raised"]
        return f"{_op_text(op)}: expected {e}, got {_describe_got(got) if got != 'ok' else 'no error'}"
    if name == "step":
        return diff_event(exp, got, f"step {step_no}")
    if name == "run":
        if isinstance(exp, dict) and "raised" in exp:
            return f"{_op_text(op)}: expected {exp['raised']}, got {_describe_got(got)}"
        d = diff_events(exp, got)
        return f"{_op_text(op)}: " + (d or f"expected {_fmt(exp)}, got {_describe_got(got)}")
    if name in ("key", "eff", "ensure"):
        return f"{_op_text(op)} after {step_no} step(s): expected {_fmt(exp)}, got {_describe_got(got)}"
    if name == "state":
        d = diff_states(exp, got)
        return f"after {step_no} step(s): " + (d or f"expected {_fmt(exp)}, got {_describe_got(got)}")
    if name == "replay":
        return diff_replay(exp, got)
    return f"{_op_text(op)}: expected {_fmt(exp)}, got {_describe_got(got)}"


def diff_replay(exp, got) -> str:
    if not isinstance(got, dict) or "events" not in got:
        return f"the replay stopped with {_describe_got(got)}"
    d = diff_events(exp["events"], got["events"])
    if d:
        return d
    es, gs = exp["states"], got.get("states")
    if not isinstance(gs, dict):
        return f"after the replay: expected the request states, got {_fmt(gs)}"
    for k in es:
        dd = _diff_request(es[k], gs.get(k))
        if dd:
            return "after the replay: " + dd
    for f in ("free_kv_blocks", "stop"):
        if not _same(exp.get(f), got.get(f)):
            return f"after the replay: expected {f}={_fmt(exp.get(f))}, got {f}={_fmt(got.get(f))}"
    return ""


def _canon(x):
    """An error observation compares by exception class only (messages are the student's own words)."""
    if isinstance(x, dict) and "raised" in x:
        return {"raised": x["raised"]}
    return x


def compare(scenario: dict, obs) -> str:
    """'' if the observations match the expected ones, else the first difference in words."""
    exp = scenario["expected"]
    if obs is None:
        return "did not run (the checks' process stopped before this check)"
    if isinstance(obs, list) and obs and isinstance(obs[0], dict) and "killed" in obs[0]:
        return f"did not run to the end ({obs[0]['killed']})"
    if not isinstance(obs, list):
        return "no usable observations"
    step_no = 0
    for i, op in enumerate(scenario["ops"]):
        e = exp[i] if i < len(exp) else None
        if i >= len(obs):
            return f"{_op_text(op)} did not return (time limit, or the run stopped)"
        g = _canon(obs[i])
        d = diff_op(op, _canon(e), g, step_no)
        if d:
            return d
        if op[0] == "step" and isinstance(e, dict):
            step_no += 1
        elif op[0] == "run" and isinstance(e, list):
            step_no = len(e)
    if len(obs) > len(exp):
        return "more observations than operations"
    return ""


def setup_text(scenario: dict, upto: int | None = None) -> str:
    """The scenario's operations as short calls (``sim = DecodeSchedulerSim(...); enqueue(...); step()``)."""
    ops = scenario["ops"] if upto is None else scenario["ops"][:upto]
    parts = []
    for op in ops:
        if op[0] == "state":
            continue
        text = _op_text(op)
        if op[0] == "new":
            text = "sim = " + text
        if parts and parts[-1][0] == text:
            parts[-1][1] += 1
        else:
            parts.append([text, 1])
    text = "; ".join(t if n == 1 else f"{t} x{n}" for t, n in parts)
    return text if len(text) <= 500 else text[:500] + " ..."


def trace_table(trace: dict) -> list[str]:
    lines = [f"policy={trace['policy']} free_kv_blocks={trace['free_kv_blocks']} "
             f"aging_interval={trace['aging_interval']}" + (f" max_steps={trace['max_steps']}"
                                                            if trace["max_steps"] is not None else "")]
    head = ("request_id", "arrival", "prompt", "max_new", "priority", "cache_hit", "blocks", "deadline", "preemptible")
    rows = [head]
    for r in trace["rows"]:
        rows.append((str(r["request_id"]), str(r["arrival_step"]), str(r["prompt_len"]), str(r["max_new_tokens"]),
                     str(r["priority"]), "yes" if r["cache_hit"] else "no", str(r["required_blocks"]),
                     "-" if r["deadline_step"] is None else str(r["deadline_step"]),
                     "yes" if r["preemptible"] else "no"))
    widths = [max(len(row[j]) for row in rows) for j in range(len(head))]
    for row in rows:
        lines.append("  " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    return lines


# --------------------------------------------------------------------------------------------
# Shrinking a failing random trace
# --------------------------------------------------------------------------------------------

def _size(trace: dict) -> tuple:
    rows = trace["rows"]
    total = 0
    for r in rows:
        total += r["prompt_len"] + r["max_new_tokens"] + r["required_blocks"] + abs(r["priority"]) + r["arrival_step"]
        total += abs(r["request_id"]) + (0 if r["deadline_step"] is None else 1 + min(r["deadline_step"], 10**6))
        total += int(r["cache_hit"]) + int(not r["preemptible"])
    return (len(rows), total, trace["free_kv_blocks"])


def _valid(trace: dict) -> bool:
    ids = [r["request_id"] for r in trace["rows"]]
    if len(set(ids)) != len(ids) or not trace["rows"]:
        return False
    for r in trace["rows"]:
        if r["prompt_len"] <= 0 or r["max_new_tokens"] <= 0 or r["required_blocks"] <= 0 or r["arrival_step"] < 0:
            return False
        if r["deadline_step"] is not None and r["deadline_step"] <= r["arrival_step"]:
            return False
    return trace["free_kv_blocks"] >= 0


def shrink_candidates(trace: dict) -> list[dict]:
    out = []

    def variant(rows=None, **cfg):
        t = {**trace, **cfg, "rows": rows if rows is not None else [dict(r) for r in trace["rows"]]}
        if _valid(t) and _size(t) < _size(trace):
            out.append(t)

    rows = trace["rows"]
    minimal = {"prompt_len": 1, "max_new_tokens": 1, "required_blocks": 1, "priority": 0, "cache_hit": False,
               "preemptible": True, "deadline_step": None}
    # Big jumps first: every row minimal, one field minimal in every row, one row minimal.
    variant(rows=[{**r, **minimal, "arrival_step": 0} for r in rows])
    for f, v in minimal.items():
        variant(rows=[{**r, f: v} for r in rows])
    variant(rows=[{**r, "arrival_step": 0,
                   "deadline_step": None if r["deadline_step"] is None else r["deadline_step"] - r["arrival_step"]}
                  for r in rows])
    for i in range(len(rows)):
        variant(rows=[{**r, **minimal} if j == i else dict(r) for j, r in enumerate(rows)])
    for i in range(len(rows)):
        variant(rows=[dict(r) for j, r in enumerate(rows) if j != i])
    for i, r in enumerate(rows):
        def change(**kw):
            new_rows = [dict(x) for x in rows]
            new_rows[i].update(kw)
            variant(rows=new_rows)
        for f in ("prompt_len", "max_new_tokens", "required_blocks"):
            if r[f] > 1:
                change(**{f: 1})
                change(**{f: (r[f] + 1) // 2})
                change(**{f: r[f] - 1})
        if r["priority"] != 0:
            change(priority=0)
            change(priority=int(r["priority"] / 2))
            change(priority=r["priority"] - (1 if r["priority"] > 0 else -1))
        if r["arrival_step"] > 0:
            shift = r["arrival_step"]
            change(arrival_step=0, deadline_step=None if r["deadline_step"] is None else r["deadline_step"] - shift)
            change(arrival_step=0)
            change(arrival_step=shift // 2)
            change(arrival_step=shift - 1)
        if r["deadline_step"] is not None:
            d, a = r["deadline_step"], r["arrival_step"]
            change(deadline_step=None)
            if d > 10**6:
                change(deadline_step=a + SENTINEL)
            change(deadline_step=a + 1)
            change(deadline_step=a + max(1, (d - a) // 2))
            change(deadline_step=d - 1)
        if r["cache_hit"]:
            change(cache_hit=False)
        if not r["preemptible"]:
            change(preemptible=True)
        if r["request_id"] != i and i not in {x["request_id"] for x in rows}:
            change(request_id=i)
    if trace["free_kv_blocks"] > 0:
        variant(free_kv_blocks=trace["free_kv_blocks"] // 2)
        variant(free_kv_blocks=trace["free_kv_blocks"] - 1)
    if trace["max_steps"] is not None:
        variant(max_steps=None)
    return out


# --------------------------------------------------------------------------------------------
# Judging
# --------------------------------------------------------------------------------------------

def _observations_by_id(observations) -> dict:
    """Accept a dict id -> obs, or the harness's list of JSON lines."""
    if isinstance(observations, dict):
        return observations
    out = {}
    for line in observations or []:
        if isinstance(line, dict) and isinstance(line.get("id"), str) and "obs" in line:
            out[line["id"]] = line["obs"]
    return out


def _walk_bad(obj, found: set):
    if isinstance(obj, str):
        if obj.startswith("<bad type:"):
            found.add(obj)
    elif isinstance(obj, list):
        for x in obj:
            _walk_bad(x, found)
    elif isinstance(obj, dict):
        for x in obj.values():
            _walk_bad(x, found)


def judge(scenarios: list[dict], observations, *, rerun=None, shrink_budget_s: float = 15.0) -> dict[str, CellVerdict]:
    """Per graded cell: score, max score and feedback lines.

    `observations` maps scenario id -> the harness observations (or is the harness's JSON lines).
    `rerun(list_of_scenarios) -> dict id -> obs`, when given, runs more scenarios in a fresh harness
    (used to shrink a failing random trace).
    """
    obs_by_id = _observations_by_id(observations)
    by_cell: dict[str, list] = {c.grade_id: [] for c in CELLS}
    for s in scenarios:
        by_cell.setdefault(s["cell"], []).append(s)
    verdicts = {}
    for cell in CELLS:
        items = by_cell.get(cell.grade_id, [])
        failures = []
        passed = 0
        for s in items:
            d = compare(s, obs_by_id.get(s["id"]))
            if d:
                failures.append((s, d))
            else:
                passed += 1
        total = len(items)
        score = 0.0 if total == 0 else min(float(cell.points), round(cell.points * passed / total, 2))
        if passed < total and score >= cell.points:
            score = max(0.0, cell.points - 0.01)
        lines = []
        if cell.grade_id == "hidden_differential":
            if failures:
                lines.extend(_differential_lines(failures, total, rerun, shrink_budget_s))
            else:
                lines.append(f"all {total} random traces match the reference engine event for event")
        else:
            for k, (s, d) in enumerate(failures[:MAX_LINES_PER_CELL]):
                lines.append(f"FAIL {s['what']}: {d}")
                if k == 0:
                    lines.append("  setup / 场景: " + setup_text(s))
            if len(failures) > MAX_LINES_PER_CELL:
                lines.append(f"... and {len(failures) - MAX_LINES_PER_CELL} more failing checks")
            if not failures:
                lines.append(f"all {total} checks passed")
        verdicts[cell.grade_id] = CellVerdict(score=score, max_score=float(cell.points), lines=lines)
    return verdicts


def _differential_lines(failures, total, rerun, budget_s) -> list[str]:
    lines = [f"FAIL {len(failures)} of {total} random traces differ from the reference engine"]
    not_run = [s for s, d in failures if d.startswith("did not run")]
    ran = [(s, d) for s, d in failures if not d.startswith("did not run")]
    if not ran:
        lines.append(f"{len(not_run)} traces did not run to the end (crash, time or memory limit)")
        return lines
    s, d = min(ran, key=lambda item: _size(item[0]["trace"]))
    trace, diff = s["trace"], d
    if rerun is not None:
        trace, diff = shrink(trace, diff, rerun, budget_s)
    lines.append("smallest failing trace / 最小失败轨迹:")
    lines.extend(trace_table(trace))
    lines.append("first difference / 第一个分歧: " + diff)
    return lines


def shrink(trace: dict, diff: str, rerun, budget_s: float = 15.0, max_rounds: int = 60):
    """Greedy shrinking: keep the smallest candidate that still fails, until none does."""
    deadline = time.monotonic() + budget_s
    for round_no in range(max_rounds):
        if time.monotonic() > deadline:
            break
        cands = shrink_candidates(trace)
        if not cands:
            break
        scen = [trace_scenario(f"s{round_no}_{i}", t) for i, t in enumerate(cands)]
        try:
            obs = rerun(scen)
        except Exception:  # noqa: BLE001 - a broken rerun just stops shrinking
            break
        if not obs:
            break
        best = None
        for sc_, t in zip(scen, cands):
            if sc_["id"] not in obs:
                continue
            sc_["expected"] = expected_for(sc_["ops"])
            dd = compare(sc_, obs[sc_["id"]])
            if dd and not dd.startswith("did not") and (best is None or _size(t) < _size(best[0])):
                best = (t, dd)
        if best is None:
            break
        trace, diff = best
    return trace, diff


# --------------------------------------------------------------------------------------------
# Running the harness
# --------------------------------------------------------------------------------------------

def _numpy_dir() -> str | None:
    spec = importlib.util.find_spec("numpy")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


@dataclass
class HarnessRun:
    load: dict | None
    obs: dict
    done: bool
    outcome: object | None
    wall_s: float
    forged: list = field(default_factory=list)  # signs that the output file was written by someone else
    builtins_changed: list = field(default_factory=list)  # builtins the solution replaced (restored by the harness)
    slow_lines: list = field(default_factory=list)  # top-level statements of the cell that timed out


def run_harness(source: str, scenarios: list[dict], *, limits: Limits | None = None, hide=(),
                skip_lines=()) -> HarnessRun:
    """Run the harness once on `scenarios` in a private temporary folder under the sandbox."""
    limits = limits or Limits()
    start = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="dsched-verdict-")
    try:
        os.chmod(tmp, 0o700)
        shutil.copyfile(HARNESS, os.path.join(tmp, "harness.py"))
        sys_path = []
        np_dir = _numpy_dir()
        if np_dir:
            lib = os.path.join(tmp, "pylib")
            os.mkdir(lib)
            os.symlink(np_dir, os.path.join(lib, "numpy"))
            sys_path.append(lib)
        job = {"solution_source": source, "sys_path": sys_path, "scenario_timeout_s": limits.scenario_timeout_s,
               "load_timeout_s": limits.scenario_timeout_s * 1.5, "skip_lines": sorted(skip_lines),
               "scenarios": [{"id": s["id"], "ops": s["ops"]} for s in scenarios]}
        with open(os.path.join(tmp, "in.json"), "w", encoding="utf-8") as fh:
            json.dump(job, fh)
        argv = [sys.executable, "-I", "-S", "harness.py", "in.json", "out.jsonl"]
        outcome = _run_sandboxed(argv, tmp, limits, hide)
        lines, forged = [], []
        try:
            with open(os.path.join(tmp, "out.jsonl"), "rb") as fh:
                raw = fh.read(64 * 1024 * 1024)
        except OSError:
            raw = b""
        for chunk in raw.split(b"\n"):
            if not chunk.strip():
                continue
            try:
                lines.append(json.loads(chunk.decode("ascii")))
            except (ValueError, UnicodeDecodeError):
                forged.append("unreadable line in the harness output")
        load = next((ln for ln in lines if isinstance(ln, dict) and "load" in ln), None)
        done = any(isinstance(ln, dict) and "done" in ln for ln in lines)
        known = {s["id"] for s in scenarios}
        obs, seen = {}, set()
        patched = sorted({str(n)[:40] for ln in lines if isinstance(ln, dict) and isinstance(ln.get("builtins_changed"), list)
                          for n in ln["builtins_changed"]})
        for ln in lines:
            if isinstance(ln, dict) and "id" in ln:
                sid = ln.get("id")
                if sid not in known or sid in seen or not isinstance(ln.get("obs"), list):
                    forged.append(f"unexpected result line for {str(sid)[:40]!r}")
                    continue
                seen.add(sid)
                obs[sid] = ln["obs"]
        slow = sorted({ln["load_timeout"] for ln in lines if isinstance(ln, dict) and type(ln.get("load_timeout")) is int})
        return HarnessRun(load=load, obs=obs, done=done, outcome=outcome, wall_s=time.monotonic() - start,
                          forged=forged, builtins_changed=patched, slow_lines=slow)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_sandboxed(argv, cwd, limits: Limits, hide):
    from .sandbox import run_isolated

    return run_isolated(argv, cwd=cwd, timeout_s=limits.timeout_s, cpu_s=limits.cpu_s,
                        memory_mb=limits.memory_mb, hide=hide)


def _package_paths() -> list[str]:
    """Where our own code lives (editable checkout or site-packages): the reference model must stay unreadable."""
    import decodesched

    return sorted({str(Path(decodesched.__file__).resolve().parent), str(Path(__file__).resolve().parent)})


def _default_hide() -> list[str]:
    from .spec import COURSE_ROOT
    return [str(COURSE_ROOT)] + _package_paths()


def _why_stopped(out) -> str:
    if out is None:
        return "the process did not start"
    if getattr(out, "timed_out", False):
        return "time limit"
    if getattr(out, "memory_exceeded", False):
        return "memory limit"
    sig = getattr(out, "signal", None)
    if sig:
        return f"killed by signal {sig}"
    return f"the process exited early (exit code {getattr(out, 'returncode', None)})"


def collect_observations(source: str, scenarios: list[dict], limits: Limits, hide, max_runs: int = 100):
    """Run the harness; if it dies part-way, restart it after the check that killed it.

    The scenario being run when the process died (the first one without observations) is marked as
    failed with the reason; the rest run in a fresh process, so one crash or hang loses only its own
    checks.  The whole verdict stays within ``limits.timeout_s`` of wall clock.
    """
    start = time.monotonic()
    pending = list(scenarios)
    obs: dict = {}
    runs: list[HarnessRun] = []
    per_run = max(15.0, min(limits.timeout_s * 0.4, 30.0))
    skip: set = set()
    for _ in range(max_runs):
        left = limits.timeout_s - (time.monotonic() - start)
        if not pending or left < 2.0:
            break
        run_limits = Limits(timeout_s=min(per_run, left), cpu_s=min(limits.cpu_s, per_run, left),
                            memory_mb=limits.memory_mb, scenario_timeout_s=limits.scenario_timeout_s)
        hr = run_harness(source, pending, limits=run_limits, hide=hide, skip_lines=skip)
        runs.append(hr)
        new_slow = set(hr.slow_lines) - skip
        skip |= new_slow
        obs.update(hr.obs)
        if hr.done:
            pending = []
            break
        missing = [s for s in pending if s["id"] not in hr.obs]
        if not missing:
            pending = []
            break
        obs[missing[0]["id"]] = [{"killed": _why_stopped(hr.outcome)}]
        pending = missing[1:]
        if hr.load is None and not new_slow:
            break  # it dies while loading, and not on a statement we can skip: a restart would die the same way
        if hr.load is None:
            del obs[missing[0]["id"]]  # the load, not this check, was at fault: run it again
            pending = missing
    for s in pending:
        obs.setdefault(s["id"], [{"killed": "not run: the time budget was spent by earlier checks"}])
    return obs, runs


def verdict_for_source(source, *, limits: Limits | dict | None = None, seed: int = 0, shrink_failures: bool = True,
                       hide=None, n_random: int = N_RANDOM_TRACES) -> Verdict:
    """Judge one solution cell's source: run it in the sandboxed harness, compare, score every cell."""
    if isinstance(limits, dict):
        limits = Limits(**limits)
    limits = limits or Limits()
    # Always hidden (as root), whatever the caller adds: the course and our own packages, so the
    # student's code cannot read and run the reference model from disk.
    hide = sorted(set(_default_hide()) | set(hide or ()))
    max_total = float(sum(c.points for c in CELLS))
    if not isinstance(source, str) or not source.strip():
        cells = {c.grade_id: CellVerdict(0.0, float(c.points), ["no solution cell source / 没有找到解答单元格"])
                 for c in CELLS}
        return Verdict(cells=cells, status="invalid", total=0.0, max_total=max_total,
                       notes=["the solution cell is missing or empty"])
    scenarios = build_scenarios(seed, n_random)
    obs, runs = collect_observations(source, scenarios, limits, hide)
    outcomes = [r.outcome for r in runs]
    timed_out = any(getattr(o, "timed_out", False) for o in outcomes)
    memory = any(getattr(o, "memory_exceeded", False) for o in outcomes)
    crashed = any(not r.done for r in runs) and not timed_out and not memory
    all_obs_text = json.dumps(list(obs.values()))
    scenario_timeouts = '"timeout": true' in all_obs_text or any(r.slow_lines for r in runs)
    mem_in_obs = '"raised": "MemoryError"' in all_obs_text
    forged = [f for r in runs for f in r.forged]
    patched = sorted({n for r in runs for n in r.builtins_changed})
    load_errors = " ".join(str(r.load.get("error", "")) for r in runs if r.load)
    mem_in_obs = mem_in_obs or "MemoryError" in load_errors

    def rerun(more):
        small = Limits(timeout_s=min(limits.timeout_s, 20.0), cpu_s=min(limits.cpu_s, 20.0),
                       memory_mb=limits.memory_mb, scenario_timeout_s=limits.scenario_timeout_s)
        return run_harness(source, more, limits=small, hide=hide).obs

    can_rerun = shrink_failures and not timed_out and not memory and not crashed and not scenario_timeouts
    cells = judge(scenarios, obs, rerun=rerun if can_rerun else None)
    notes = []
    first = runs[0] if runs else None
    if first is not None and first.load is None:
        notes.append("the solution cell did not load (the checks' process stopped at once)")
    elif first is not None and first.load.get("load") == "error":
        notes.append(str(first.load.get("error", "the solution cell raised an error"))[:300])
    found: set = set()
    _walk_bad(list(obs.values()), found)
    suspicious = sorted(x for x in found if "overrides comparison" in x)
    if forged or suspicious or patched:
        status = "tampered"
        if patched:
            notes.append("the solution replaced builtins (" + ", ".join(patched[:5]) + "); they were put back "
                         "before every check, so the checks saw the honest code only")
        if suspicious:
            notes.append("values with forged comparison were returned (" + ", ".join(suspicious[:3]) +
                         "): those checks score 0")
        if forged:
            notes.append("the checks' output was written by someone else: " + forged[0])
    elif memory or mem_in_obs:
        status = "memory"
        notes.append("memory limit reached: checks that ran out of memory score 0")
    elif timed_out or scenario_timeouts:
        status = "timeout"
        notes.append("time limit reached: checks that did not finish score 0")
    elif crashed:
        status = "crashed"
        reasons = [_why_stopped(r.outcome) for r in runs if not r.done]
        why = "; ".join(sorted(set(reasons)))
        notes.append(f"the checks' process died {len(reasons)} time(s) ({why}): each check it was running scores 0, "
                     "the others ran in a fresh process")
    else:
        status = "graded"
    if found and not suspicious:
        notes.append("non-plain values were returned (" + ", ".join(sorted(found)[:3]) + "): those checks failed")
    total = round(sum(v.score for v in cells.values()), 2)
    return Verdict(cells=cells, status=status, total=total, max_total=max_total, notes=notes)
