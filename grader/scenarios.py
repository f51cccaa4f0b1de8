"""The checks' language and catalogue: what a scenario is, the targeted scenarios, the random traces.

A scenario is a small program of operations (``new``, ``enqueue``, ``step``, ``run``, ``state``,
``key``, ...) run by `grader.harness` on the student's `DecodeSchedulerSim` and, identically, on the
reference model here (`expected_for`). The catalogue is

* targeted scenarios, one small program per rule (tie-breaks, the sentinel slack, a single victim,
  non-preemptible and equal-priority requests, resume keeps progress, wait accounting, deadline
  flags, input errors), grouped by graded cell (`grader.spec.CELLS`);
* seeded random traces replayed as SPEC section 3 defines (cell ``hidden_differential``).
"""

from __future__ import annotations

import functools
import json
import random

from decodesched import model as _model

from . import harness as _harness

SENTINEL = _model.NO_DEADLINE_SLACK
N_RANDOM_TRACES = 240

ENQ_ORDER = _harness.ENQ_ORDER

# Whole events and states (ops ``step``, ``run``, and ``state`` once a step ran) in the hidden cells of TODO 1-3
# leave out the fields another TODO keeps: blocks, admission and preemption (TODO 3), wait accounting and
# deadline flags (TODO 4). A bug there costs points in its own TODO's cells (and in the random traces), not in
# every cell whose checks take a step. Probes (``reqf``, ``stepf``) read their fields whatever the cell.
TODO3_FIELDS = ("free_kv_blocks", "preempted_request_id", "admitted", "status", "preemptions")
TODO4_FIELDS = ("wait_steps", "deadline_missed")
NOT_COMPARED = {
    "hidden_todo1_enqueue": TODO3_FIELDS + TODO4_FIELDS,
    "hidden_input_errors": TODO3_FIELDS + TODO4_FIELDS,
    "hidden_todo2_schedule_key": TODO3_FIELDS + TODO4_FIELDS,
    "hidden_todo3_capacity": TODO4_FIELDS,
}


def new(**kw):
    return ["new", kw]


def enq(request_id, prompt_len, max_new_tokens=2, **kw):
    return ["enqueue", {"request_id": request_id, "prompt_len": prompt_len, "max_new_tokens": max_new_tokens, **kw}]


def enqp(request_id, prompt_len, max_new_tokens, **kw):
    """``enqueue(request_id, prompt_len, max_new_tokens, **kw)``: the first three positionally, as the visible cells
    pass them (a solution that renamed them passes there)."""
    return [*enq(request_id, prompt_len, max_new_tokens, **kw), 3]


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


def reqf(i, *fields):
    return ["reqf", i, list(fields)]


def keyf(i, k):
    return ["keyf", i, k]


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

    # ---- visible TODO 1-4: each mirrors its notebook cell: it calls enqueue as the cell does (``enq``: by keyword,
    # ``enqp``: the first three positionally), reads only what the cell reads (the probes ``reqf``, ``stepf``,
    # ``keyf``, ``free``, ``runf``, ``alldone``, ``stepq``) and compares as the cell does (typed, but by value where
    # the cell compares a tuple's items with ==: ``key``, ``runf``), so a visible cell that passes in the student's
    # notebook scores its points here too. Whole states and events are checked by the hidden cells.
    c = "test_todo1_enqueue"
    sc(c, "v1_contract", "enqueue keeps the input fields; the request starts in prefill / 入队保留输入字段，从 prefill 开始",
       new(), enq(1, 2, 2, priority=2, cache_hit=True),
       reqf(0, "request_id", "phase", "generated_len", "status", "priority", "cache_hit", "admitted"))
    sc(c, "v1_fields", "enqueue keeps blocks, deadline and preemptible / 入队保留 block、deadline 与可抢占性",
       new(), enq(1, 2, 2, priority=2, cache_hit=True),
       enqp(7, 3, 4, priority=-1, required_blocks=3, deadline_step=9, preemptible=False),
       reqf(1, "request_id", "required_blocks", "deadline_step", "preemptible"))

    # ---- visible TODO 2 ----
    c = "test_todo2_schedule_key"
    sc(c, "v2_phase_first", "phase ranks before cache and priority / 阶段先于缓存与优先级",
       new(), enqp(1, 4, 1, priority=0), enqp(2, 4, 1, priority=9, cache_hit=True), reqf(1, "request_id"),
       setf(1, "phase", "decode"), reqf(0, "request_id"), key(0), reqf(1, "request_id"), key(1))
    sc(c, "v2_deadline", "policy deadline sorts by slack / deadline 策略按余量排序",
       new(policy="deadline"), enqp(1, 4, 4, priority=9, deadline_step=20), enqp(2, 2, 1, priority=0, deadline_step=1),
       reqf(0, "request_id"), keyf(0, 0), reqf(1, "request_id"), keyf(1, 0), ["stepf", ["request_id"]])

    # ---- visible TODO 3 ----
    c = "test_todo3_capacity"
    sc(c, "v3_admission", "a request that does not fit waits; finish frees blocks / 容量不足则等待，完成释放容量",
       new(free_kv_blocks=2), enqp(1, 4, 1, priority=9, required_blocks=3),
       enqp(2, 4, 1, priority=1, required_blocks=2),
       ["stepf", ["request_id"]], ["free"], ["stepf", ["action"]], ["free"])
    sc(c, "v3_preempt", "a higher priority request preempts; the victim keeps its phase / 高优先级抢占，victim 保留阶段",
       new(free_kv_blocks=2), enqp(1, 4, 2, priority=1, required_blocks=2), ["stepq"],
       enqp(2, 2, 1, priority=9, required_blocks=2), ["stepf", ["request_id", "preempted_request_id"]],
       reqf(0, "request_id", "status", "phase", "preemptions"))
    sc(c, "v3_non_preemptible", "a non-preemptible request is never preempted / 不可抢占请求受保护",
       new(free_kv_blocks=2), enqp(1, 4, 2, priority=1, required_blocks=2, preemptible=False), ["stepq"],
       enqp(2, 2, 1, priority=9, required_blocks=2), ["stepf", ["request_id", "preempted_request_id"]])

    # ---- visible TODO 4 ----
    c = "test_todo4_step"
    sc(c, "v4_progression", "two requests run to completion in 7 steps / 两个请求 7 步完成",
       new(), enqp(1, 2, 2, priority=2, cache_hit=True), enqp(2, 3, 3, priority=1), ["runf", 20], ["alldone"],
       reqf(1, "request_id", "wait_steps"))
    sc(c, "v4_guards", "run stops at max_steps and rejects a negative one / run 遵守 max_steps，拒绝负数",
       new(), enqp(1, 1, 3), ["runf", 2, ["len"]], run(-1))  # the cell reads len(run(max_steps=2)) only

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
       new(), enq(1, 2, 3), STEP, STEP, enq(2, 1, 1, deadline_step=3), STATE,
       reqf(1, "status", "admitted", "wait_steps", "preemptions"), STEP, STATE)
    # (no step: which of two tied requests runs first is TODO 2's tie-break, not TODO 1's business)
    sc(c, "h1_own_state", "each request has its own state object / 每个请求的状态相互独立",
       new(), enq(1, 1, 2), enq(2, 1, 2), setf(0, "phase", "decode"), setf(0, "wait_steps", 3), STATE)

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
    sc(c, "h2_priority_runs_first", "a larger priority sorts first and runs first / 优先级大者先运行",
       new(), enq(1, 4, 1, priority=1, cache_hit=True), enq(2, 4, 1, priority=3, cache_hit=True), key(0), key(1), STEP)

    c = "hidden_todo3_capacity"
    sc(c, "h3_preempt_and_resume", "a higher priority request preempts and the victim resumes / 高优先级抢占，victim 恢复",
       new(free_kv_blocks=2), enq(1, 4, 2, priority=1, required_blocks=2), STEP, enq(2, 2, 1, priority=9, required_blocks=2),
       STEP, STATE, run(10), STATE)
    sc(c, "h3_exact_fit", "a request whose blocks equal the free blocks is admitted / 恰好够用即可准入",
       new(free_kv_blocks=3), enq(1, 1, 1, required_blocks=3), STEP, STATE, STEP, STATE)
    sc(c, "h3_skip_to_fitting", "a request that does not fit is skipped for one that fits / 放不下则跳到下一个",
       new(free_kv_blocks=2), enq(1, 1, 2, priority=5, required_blocks=3), enq(2, 1, 1, priority=0, required_blocks=2),
       enq(3, 1, 1, priority=1, required_blocks=1), STEP, STEP, STATE)
    sc(c, "h3_single_victim", "one lower-priority victim is preempted and keeps its progress / 单一 victim 保留进度",
       new(free_kv_blocks=3), enq(1, 2, 3, priority=1, required_blocks=3), STEP, STEP,
       enq(2, 1, 1, priority=4, required_blocks=2), STEP, STATE)
    # (the TODO 3 setups give tied requests different lengths: TODO 2's request_id tie-break decides no step here)
    sc(c, "h3_two_victims_needed", "only one victim per step: a request needing two is skipped / 需要两个 victim 时不抢占",
       new(free_kv_blocks=4), enq(1, 1, 3, priority=0, required_blocks=2), enq(2, 2, 3, priority=0, required_blocks=2),
       STEP, STEP, enq(3, 1, 1, priority=9, required_blocks=4), STEP, STATE)
    sc(c, "h3_equal_priority", "equal priority is not lower: no preemption / 同优先级不可抢占",
       new(free_kv_blocks=2), enq(1, 1, 3, priority=3, required_blocks=2), STEP,
       enq(2, 1, 1, priority=3, required_blocks=2, cache_hit=True), STEP, STATE)
    sc(c, "h3_non_preemptible", "a non-preemptible request keeps its blocks / 不可抢占请求保留 block",
       new(free_kv_blocks=3), enq(1, 1, 3, priority=0, required_blocks=2, preemptible=False),
       enq(2, 2, 3, priority=1, required_blocks=1), STEP, STEP, enq(3, 1, 1, priority=9, required_blocks=2), STEP, STATE)
    sc(c, "h3_victim_order", "victim order: lowest priority, then most blocks, then request_id / victim 选择顺序",
       new(free_kv_blocks=6), enq(5, 3, 4, priority=1, required_blocks=1), enq(3, 1, 4, priority=1, required_blocks=2),
       enq(4, 2, 4, priority=1, required_blocks=2), enq(8, 1, 4, priority=2, required_blocks=1), run(4),
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
    sc(c, "h4_two_requests_events", "two requests run to completion in 7 steps, every event and state / 两个请求 7 步完成（全部事件与状态）",
       new(), enq(1, 2, 2, priority=2, cache_hit=True), enq(2, 3, 3, priority=1), run(20), STATE)
    sc(c, "h4_wait_accounting", "every unfinished request not chosen waits one step; the chosen one does not / 等待计数",
       new(free_kv_blocks=2), enq(1, 1, 2, priority=3, required_blocks=2), enq(2, 1, 1, priority=1),
       enq(3, 1, 1, priority=0), STEP, STATE, STEP, STATE, run(10), STATE)
    sc(c, "h4_event_wait", "the event reports the chosen request's own wait_steps / 事件中的 wait_steps",
       new(), enq(1, 1, 1, priority=2), enq(2, 1, 1), run(4))
    sc(c, "h4_resume_keeps_progress", "a preempted request resumes in decode with its tokens / 恢复时保留阶段与 token",
       new(free_kv_blocks=2), enq(1, 2, 4, priority=0, required_blocks=2), STEP, STEP, STEP,
       enq(2, 1, 1, priority=5, required_blocks=2), STEP, STATE, STEP, STATE, run(10), STATE)
    sc(c, "h4_deadline_flags", "deadline_missed = clock + 1 + remaining > deadline, under every policy / 违约标记",
       new(), enq(1, 1, 2, deadline_step=3), enq(2, 3, 2, deadline_step=5), run(10))
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
