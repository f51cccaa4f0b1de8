"""Write the source notebook of the decode-scheduling assignment (maintainers only).

    .venv/bin/python assignments/tools/build_source_notebook.py

The solution cell is `grader/solutions/reference.py` verbatim (nbgrader markers included); the worked
example's events table and timeline picture are computed here with `decodesched.model` and embedded
(the picture as a PNG cell attachment), so the notebook itself never imports matplotlib or numba.
Graded cells and their points come from `grader/spec.py`.
"""

from __future__ import annotations

import base64
import io
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from decodesched.grader import spec  # noqa: E402
from decodesched.model import DecodeSchedulerSim  # noqa: E402

REFERENCE = ROOT / "grader" / "solutions" / "reference.py"
OUT = ROOT / "assignments" / "source" / spec.ASSIGNMENT / spec.NOTEBOOK


# ------------------------------------------------------------------ the worked example

def worked_example():
    sim = DecodeSchedulerSim(policy="fixed_priority", free_kv_blocks=4)
    sim.enqueue(1, 4, 3, priority=0, required_blocks=3)
    sim.enqueue(2, 2, 2, priority=1, cache_hit=True, required_blocks=1)
    events = []
    for _ in range(3):
        events.append({"step": sim.clock, **sim.step()})
    sim.enqueue(3, 3, 1, priority=5, required_blocks=3)
    while True:
        clock = sim.clock
        ev = sim.step()
        if ev is None:
            break
        events.append({"step": clock, **ev})
    return events, {"1": 0, "2": 0, "3": 3}


def events_table(events) -> str:
    head = "| step | request | action | generated_len | wait_steps | free_kv_blocks | preempted |\n|---|---|---|---|---|---|---|\n"
    rows = []
    for e in events:
        pre = "" if e["preempted_request_id"] is None else str(e["preempted_request_id"])
        rows.append(f"| {e['step']} | {e['request_id']} | `{e['action']}` | {e['generated_len']} | {e['wait_steps']} "
                    f"| {e['free_kv_blocks']} | {pre} |")
    return head + "\n".join(rows)


def timeline_png(events, arrivals) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    n_steps = len(events)
    ids = [1, 2, 3]
    finish = {e["request_id"]: e["step"] for e in events if e["action"] == "finish"}
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8.0, 4.2), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1.3]})
    colors = {"prefill_to_decode": "#4C72B0", "decode_one_step": "#55A868", "finish": "#1B5E20"}
    for y, rid in enumerate(ids):
        start = arrivals[str(rid)]
        for t in range(start, finish[rid] + 1):
            ax.add_patch(plt.Rectangle((t, y - 0.35), 1, 0.7, facecolor="#E0E0E0", edgecolor="white"))
    for e in events:
        y = ids.index(e["request_id"])
        ax.add_patch(plt.Rectangle((e["step"], y - 0.35), 1, 0.7, facecolor=colors[e["action"]], edgecolor="white"))
        label = "P" if e["action"] == "prefill_to_decode" else str(e["generated_len"])
        ax.text(e["step"] + 0.5, y, label, ha="center", va="center", color="white", fontsize=9, fontweight="bold")
        if e["preempted_request_id"] is not None:
            vy = ids.index(e["preempted_request_id"])
            ax.annotate("", xy=(e["step"] + 0.5, vy + 0.3), xytext=(e["step"] + 0.5, y - 0.38),
                        arrowprops={"arrowstyle": "->", "color": "#C44E52", "lw": 1.8})
            ax.text(e["step"] + 0.6, vy + 0.45, "preempted", color="#C44E52", fontsize=8, va="bottom")
    ax.axvline(arrivals["3"], color="#8172B2", ls="--", lw=1)
    ax.text(arrivals["3"] + 0.05, 2.7, "request 3 arrives", color="#8172B2", fontsize=8)
    ax.set_yticks(range(len(ids)))
    ax.set_yticklabels([f"request {i}" for i in ids])
    ax.set_ylim(-0.6, 2.9)
    ax.invert_yaxis()
    ax.set_xlim(0, n_steps + 0.4)
    ax.legend(handles=[Patch(color=colors["prefill_to_decode"], label="prefill (P)"),
                       Patch(color=colors["decode_one_step"], label="decode (tokens so far)"),
                       Patch(color=colors["finish"], label="finish"),
                       Patch(color="#E0E0E0", label="waiting")],
              loc="upper center", bbox_to_anchor=(0.5, 1.22), ncol=4, fontsize=8, frameon=False)
    xs = [e["step"] for e in events] + [n_steps]
    free = [4] + [e["free_kv_blocks"] for e in events]
    ax2.step([0] + [x + 1 for x in xs[:-1]], free, where="post", color="#DD8452")
    ax2.set_ylabel("free KV\nblocks", fontsize=8)
    ax2.set_ylim(-0.3, 4.5)
    ax2.set_xlabel("step (scheduler clock)")
    ax2.set_xticks(range(n_steps + 1))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


# ------------------------------------------------------------------ cells

def md(text, **extra):
    cell = nbformat.v4.new_markdown_cell(text.strip("\n"))
    cell.metadata.update(extra)
    return cell


def nb_meta(grade_id, *, grade=False, solution=False, locked=False, points=None):
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution,
            "task": False}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def code(source, meta):
    cell = nbformat.v4.new_code_cell(source.strip("\n"))
    cell.metadata.update(meta)
    return cell


CELL = spec.CELLS_BY_ID

INTRO = """
# 解码调度 · Decode Scheduling

**课程作业 / Assignment** `decode_scheduling` — 满分 100 分 / 100 points.

## 0. 为什么需要解码调度 · Why decode scheduling matters

在大模型服务（LLM serving）里，很多请求同时排队：有的刚到达、还没处理输入（prefill），有的正在一个 token 一个
token 地生成（decode），有的快要结束。GPU 上的 KV cache 容量有限，调度器每一步都要回答：**下一步推进谁？**
这个选择决定了排队时间、首 token 延迟（TTFT）、尾延迟、谁会"饿死"，以及 deadline 能否满足。

*In LLM serving many requests wait together: some have just arrived and still need their prompt processed
(prefill), some are generating one token at a time (decode), some are about to finish. KV-cache capacity is
limited, so at every step the scheduler must answer: **whom do we advance next?** That choice decides queue
wait, time to first token (TTFT), tail latency, who starves and which deadlines are met.*

本作业中你将补全一个逐步推进的调度模拟器 `DecodeSchedulerSim`（TODO 1–4），它和课程的参考引擎逐事件一致。
*You will complete a step-by-step scheduler simulator, `DecodeSchedulerSim` (TODO 1–4), that must agree event
for event with the course's reference engine.*
"""

LIFECYCLE = """
## 1. 请求的生命周期 · The request lifecycle

每个请求是一个 `RequestState`：输入长度 `prompt_len`、生成上限 `max_new_tokens`、业务优先级 `priority`（越大越先）、
是否命中前缀缓存 `cache_hit`、占用的 KV block 数 `required_blocks`、可选的截止步 `deadline_step`，以及能否被安全暂停
`preemptible`。
*Each request is a `RequestState` with its prompt length, token budget, business priority (larger first), prefix
cache hit, the KV blocks it holds while admitted, an optional deadline step, and whether it may be paused.*

| 状态 / state | 含义 / meaning |
|---|---|
| `waiting` | 已入队，尚未获得 KV block · queued, holds no blocks yet |
| `running` | 已准入（`admitted=True`），占用 `required_blocks` · admitted, holds its blocks |
| `preempted` | 被更高优先级请求抢占：归还 block，但**保留**阶段与 `generated_len` · preempted: blocks returned, phase and progress **kept** |
| `finished` | `generated_len == max_new_tokens`，释放 block · done, blocks released |

阶段 `phase`：`prefill` →（一步 `prefill_to_decode`）→ `decode` →（每步 `decode_one_step` 生成一个 token，最后一个是
`finish`）。**每一步只推进一个请求**；其余未完成的请求都 `wait_steps += 1`。
*Phase: `prefill` → one `prefill_to_decode` step → `decode`, then one token per step (`decode_one_step`, the last
one is `finish`). **One step advances exactly one request**; every other unfinished request waits one step.*
"""

SORTKEY = """
## 2. 排序键 · The sort key

候选是所有未完成的请求，按下面的元组**从小到大**排序（越靠前的字段越先决定顺序）：
*The candidates are all unfinished requests, sorted by this tuple, **smallest first** (earlier fields decide first):*

```
(deadline_slack, phase_rank, cache_rank, -effective_priority, total_len, request_id)
```

| 字段 / field | 取值 / value |
|---|---|
| `deadline_slack` | 仅在 `policy='deadline'` 且有 deadline 时为 `deadline_step - clock - remaining_steps`（可以为负，不截断）；否则为哨兵值 `1_000_000_000` · only under policy `deadline` with a deadline (may be negative, never clamped); otherwise the sentinel |
| `phase_rank` | prefill 为 0，decode 为 1 · 0 for prefill |
| `cache_rank` | 命中缓存为 0 · 0 for a cache hit |
| `-effective_priority` | `priority`，在 `aging` 策略下加上 `wait_steps // aging_interval` · plus aging under policy `aging` |
| `total_len` | `prompt_len + generated_len` |
| `request_id` | 最后的稳定 tie-breaker（可以为负）· the last tie-breaker (ids may be negative) |

`remaining_steps` = prefill 阶段的 1 步 + 尚未生成的 token 数。三种策略 / three policies:
`fixed_priority`（只看业务优先级 / business priority only）、`aging`（等待越久有效优先级越高，防止饥饿 / waiting
raises the effective priority, against starvation）、`deadline`（先比较完成余量 / the smallest slack first）。
"""

ADMISSION = """
## 3. 准入与抢占 · Admission and preemption

按排序键依次查看候选 / Walk the candidates in key order:

1. 已准入（`admitted`）的请求直接被选中 · an admitted request is chosen;
2. 未准入的请求若 `required_blocks <= free_kv_blocks` 就准入（占用 block）并被选中 · a request that fits is
   admitted (takes its blocks) and chosen;
3. 否则它**最多抢占一个** victim：已准入、未完成、`preemptible=True`、有效优先级**严格更低**；按
   `(effective_priority, -required_blocks, request_id)` 的顺序取第一个"释放后容量足够"的请求。victim 变为
   `preempted`、`preemptions += 1`、归还 block，但保留阶段与进度；之后重新准入时从原处继续 · otherwise it may
   preempt **one** victim: admitted, unfinished, preemptible, with **strictly lower** effective priority, the
   first in that order whose blocks are enough; the victim keeps its phase and progress and resumes later;
4. 若需要两个 victim 才够，就不抢占，继续看下一个候选；若没有候选能运行，`step()` 返回 `None`，什么都不改变 ·
   if it would need two victims, skip it; if nothing can run, `step()` returns `None` and changes nothing.

选中的请求推进一步后，事件记录 `deadline_missed = clock + 1 + remaining_steps > deadline_step`（在所有策略下都记录），
时钟加一。*After the chosen request advances, the event records `deadline_missed` (under every policy) and the
clock moves on by one.*
"""


def example_md(events):
    return f"""
## 4. 一个小算例 · A worked example

`free_kv_blocks=4`，`fixed_priority`。时刻 0 入队请求 1（prompt 4，3 个 token，优先级 0，3 个 block）和请求 2（prompt 2，
2 个 token，优先级 1，命中缓存，1 个 block）；第 3 步之前入队高优先级请求 3（prompt 3，1 个 token，优先级 5，3 个 block）。
*Capacity 4 blocks, policy `fixed_priority`. Requests 1 and 2 are queued at clock 0; the urgent request 3
(priority 5, 3 blocks) arrives before step 3.*

{events_table(events)}

- 第 0 步：两者都在 prefill，请求 2 命中缓存（`cache_rank=0`）先行 · both in prefill; the cache hit goes first.
- 第 3 步：请求 3 处于 prefill（`phase_rank=0`）排第一，但只剩 0 个 block；它抢占优先级更低、可暂停的请求 1（归还 3 个
  block）· request 3 ranks first but no block is free, so it preempts request 1 (3 blocks back).
- 第 4 步：请求 2 与 3 都在 decode，请求 2 命中缓存先行 · both decode; the cache hit goes first.
- 第 6 步：请求 1 重新准入，**从 decode、`generated_len=0` 继续**，不会重新 prefill · request 1 is admitted
  again and resumes in decode; it does not redo its prefill.

![时间线 / timeline](attachment:timeline.png)

*图：每行一个请求；蓝色 = prefill，绿色 = decode（数字为已生成 token 数），灰色 = 等待；红色箭头 = 抢占；
下方为每步之后的空闲 KV block。Figure: one row per request; blue = prefill, green = decode (tokens so far),
grey = waiting; the red arrow is the preemption; below, the free KV blocks after each step.*
"""


def task_md():
    rows = "\n".join(f"| `{c.grade_id}` | {c.todo} | {c.title} | {c.points} | {'隐藏 hidden' if c.hidden else '可见 visible'} |"
                     for c in spec.CELLS)
    return f"""
## 5. 你的任务 · Your task

在下面的代码单元格中补全 TODO 1–4（不要修改类名、方法名和参数；不要在该单元格之外定义这些类）。
*Complete TODO 1–4 in the code cell below (keep the class names, method names and signatures; define the classes
only in that cell).*

**只有这个单元格会被评分 / Only this cell is graded.** 评分器只运行这一个单元格，且只提供 Python 标准库和
NumPy：你的类用到的辅助函数、常量和 `import` 都必须写在这个单元格里，不能使用 numba、pandas 等其他包。
*The grader runs this one cell, with the Python standard library and NumPy only: every helper function, constant
and `import` your classes use must be in this cell, and other packages (numba, pandas, ...) are not available.*

| TODO | 位置 / where | 要做什么 / what |
|---|---|---|
| TODO 1 | `enqueue` | 构造 `RequestState` 并入队 · build the request state (status `waiting`, phase `prefill`) |
| TODO 2 | `_schedule_key` | 计算 `deadline_slack` · the slack, or the sentinel |
| TODO 3 | `_ensure_capacity` | 准入或抢占**一个** victim，返回其 `request_id` 或 `None` · admit, or preempt one victim |
| TODO 4 | `step` | 按排序键选择第一个可运行的请求 · choose the first candidate that can run |

**评分 / Grading.** 可见测试（下方）你可以自己运行；隐藏测试由评分器在你的内核之外、在全新进程中运行你的类，
并与参考引擎逐事件对照（包括数百条随机轨迹）。失败时反馈给出最小失败场景和第一个分歧事件。
*You can run the visible tests yourself. The hidden tests run your classes in a fresh process outside your kernel
and compare them event for event with the reference engine (hundreds of random traces included); feedback shows
the smallest failing case and the first diverging event.*

| cell | TODO | 内容 / checks | 分 / points | |
|---|---|---|---|---|
{rows}

请让测试单元格保持安静：不要打印调试信息到 stderr，也尽量不要发出 warning（它们不影响分数，但会淹没测试的输出）。
*Please keep the test cells quiet: no debugging output on stderr and, where you can, no warnings (they do not
change your score, but they bury the tests' own output).*
"""


HELPER = '''
# 测试辅助函数（只读）/ Test helper (read-only)
def expect_equal(what, got, expected):
    """比较实际值与期望值（类型也必须一致）/ Compare got with expected, types included."""
    if type(got) is not type(expected) or got != expected:
        items = type(got) is tuple and type(expected) is tuple and len(got) == len(expected)
        i = next((i for i, (g, e) in enumerate(zip(got, expected)) if g != e), None) if items else None
        where = "" if i is None else f"（第 {i + 1} 项不同 / item {i + 1} differs）"
        raise AssertionError(f"{what}: 期望 expected {expected!r}, 实际 got {got!r}{where}")


def queued(sim, i, request_id):
    """sim.queue[i]，它必须是请求 request_id / sim.queue[i], which must be request request_id."""
    expect_equal(f"sim.queue[{i}].request_id（队列保持入队顺序：排序副本，不要排序 self.queue / the queue keeps "
                 "enqueue order: sort a copy, never self.queue）", sim.queue[i].request_id, request_id)
    return sim.queue[i]
'''

VISIBLE = {
    "test_todo1_enqueue": '''
# 可见测试 TODO 1（3 分）/ Visible test for TODO 1 (3 points): enqueue
sim = DecodeSchedulerSim()
sim.enqueue(request_id=1, prompt_len=2, max_new_tokens=2, priority=2, cache_hit=True)
req = queued(sim, 0, 1)
expect_equal("phase after enqueue", req.phase, 'prefill')
expect_equal("generated_len after enqueue", req.generated_len, 0)
expect_equal("status after enqueue", req.status, 'waiting')
expect_equal("priority", req.priority, 2)
expect_equal("cache_hit", req.cache_hit, True)
expect_equal("admitted after enqueue (admission happens in step)", req.admitted, False)

sim.enqueue(7, 3, 4, priority=-1, required_blocks=3, deadline_step=9, preemptible=False)
req = queued(sim, 1, 7)
expect_equal("required_blocks", req.required_blocks, 3)
expect_equal("deadline_step", req.deadline_step, 9)
expect_equal("preemptible", req.preemptible, False)
print("TODO 1 visible tests passed / 通过")
''',
    "test_todo2_schedule_key": '''
# 可见测试 TODO 2（3 分）/ Visible test for TODO 2 (3 points): the sort key
sim = DecodeSchedulerSim()
sim.enqueue(1, 4, 1, priority=0)
sim.enqueue(2, 4, 1, priority=9, cache_hit=True)
queued(sim, 1, 2).phase = 'decode'
expect_equal("key of a prefill request", sim._schedule_key(queued(sim, 0, 1)), (1_000_000_000, 0, 1, 0, 4, 1))
expect_equal("key of a decode request", sim._schedule_key(queued(sim, 1, 2)), (1_000_000_000, 1, 0, -9, 4, 2))

sim = DecodeSchedulerSim(policy='deadline')
sim.enqueue(1, 4, 4, priority=9, deadline_step=20)
sim.enqueue(2, 2, 1, priority=0, deadline_step=1)
expect_equal("deadline slack = 20 - 0 - (1 + 4)", sim._schedule_key(queued(sim, 0, 1))[0], 15)
expect_equal("deadline slack = 1 - 0 - (1 + 1) (negative, not clamped)", sim._schedule_key(queued(sim, 1, 2))[0],
             -1)
expect_equal("the request with the smallest slack runs first", sim.step()['request_id'], 2)
print("TODO 2 visible tests passed / 通过")
''',
    "test_todo3_capacity": '''
# 可见测试 TODO 3（3 分）/ Visible test for TODO 3 (3 points): admission and preemption
sim = DecodeSchedulerSim(free_kv_blocks=2)
sim.enqueue(1, 4, 1, priority=9, required_blocks=3)
sim.enqueue(2, 4, 1, priority=1, required_blocks=2)
expect_equal("request 1 does not fit, request 2 runs", sim.step()['request_id'], 2)
expect_equal("free blocks after admitting request 2", sim.free_kv_blocks, 0)
expect_equal("request 2 finishes", sim.step()['action'], 'finish')
expect_equal("free blocks after the finish", sim.free_kv_blocks, 2)

sim = DecodeSchedulerSim(free_kv_blocks=2)
sim.enqueue(1, 4, 2, priority=1, required_blocks=2)
sim.step()
sim.enqueue(2, 2, 1, priority=9, required_blocks=2)
event = sim.step()
expect_equal("the preempting request runs", event['request_id'], 2)
expect_equal("preempted_request_id", event['preempted_request_id'], 1)
victim = queued(sim, 0, 1)
expect_equal("victim status", victim.status, 'preempted')
expect_equal("victim keeps its phase", victim.phase, 'decode')
expect_equal("victim preemptions", victim.preemptions, 1)

sim = DecodeSchedulerSim(free_kv_blocks=2)
sim.enqueue(1, 4, 2, priority=1, required_blocks=2, preemptible=False)
sim.step()
sim.enqueue(2, 2, 1, priority=9, required_blocks=2)
event = sim.step()
expect_equal("a non-preemptible request keeps running", event['request_id'], 1)
expect_equal("no preemption", event['preempted_request_id'], None)
print("TODO 3 visible tests passed / 通过")
''',
    "test_todo4_step": '''
# 可见测试 TODO 4（3 分）/ Visible test for TODO 4 (3 points): one step at a time
sim = DecodeSchedulerSim()
sim.enqueue(1, 2, 2, priority=2, cache_hit=True)
sim.enqueue(2, 3, 3, priority=1)
events = sim.run(max_steps=20)
expect_equal("number of events (2 + 1 and 3 + 1 steps)", len(events), 7)
expect_equal("first event", (events[0]['request_id'], events[0]['action']), (1, 'prefill_to_decode'))
expect_equal("last event", (events[-1]['request_id'], events[-1]['action']), (2, 'finish'))
expect_equal("all requests done", all(req.done for req in sim.queue), True)
expect_equal("wait_steps of request 2 (it waited while request 1 ran)", queued(sim, 1, 2).wait_steps, 3)

sim = DecodeSchedulerSim()
sim.enqueue(1, 1, 3)
expect_equal("run stops at max_steps", len(sim.run(max_steps=2)), 2)
try:
    sim.run(max_steps=-1)
except ValueError:
    pass
else:
    raise AssertionError("run(max_steps=-1): 期望 expected ValueError, 实际 got no error")
print("TODO 4 visible tests passed / 通过")
''',
}

HIDDEN = {
    "hidden_todo1_enqueue": ('''
_probe = DecodeSchedulerSim()
_probe.enqueue(1, 2, 3, priority=4)
''', '''
_sim = DecodeSchedulerSim(policy='deadline', free_kv_blocks=10)
_sim.enqueue(-4, 5, 3, priority=-2, cache_hit=True, required_blocks=3, deadline_step=12, preemptible=False)
_r = _sim.queue[0]
assert (_r.request_id, _r.prompt_len, _r.max_new_tokens, _r.priority, _r.cache_hit, _r.required_blocks,
        _r.deadline_step, _r.preemptible) == (-4, 5, 3, -2, True, 3, 12, False)
assert (_r.phase, _r.generated_len, _r.wait_steps, _r.status, _r.admitted, _r.preemptions) == ('prefill', 0, 0, 'waiting', False, 0)
assert _sim.free_kv_blocks == 10
'''),
    "hidden_input_errors": ('''
_probe = DecodeSchedulerSim()
_probe.enqueue(1, 1, 1)
''', '''
for _kwargs in ({'request_id': 1, 'prompt_len': 1}, {'request_id': 2, 'prompt_len': -1},
                {'request_id': 2, 'prompt_len': 1, 'required_blocks': -2}, {'request_id': 2, 'prompt_len': 1, 'deadline_step': 0}):
    try:
        _probe.enqueue(**_kwargs)
    except ValueError:
        continue
    raise AssertionError(f"enqueue({_kwargs}) should raise ValueError")
assert len(_probe.queue) == 1
'''),
    "hidden_todo2_schedule_key": ('''
_probe = DecodeSchedulerSim(policy='deadline')
_probe.enqueue(1, 2, 1, deadline_step=5)
_probe._schedule_key(_probe.queue[0])
''', '''
assert _probe._schedule_key(_probe.queue[0]) == (3, 0, 1, 0, 2, 1)
_sim = DecodeSchedulerSim()
_sim.enqueue(1, 3, 2, deadline_step=2)
assert _sim._schedule_key(_sim.queue[0])[0] == 1_000_000_000
_sim = DecodeSchedulerSim(policy='aging', aging_interval=3)
_sim.enqueue(1, 4, 1, priority=1)
_sim.queue[0].wait_steps = 7
assert _sim._schedule_key(_sim.queue[0])[3] == -3
'''),
    "hidden_todo3_capacity": ('''
_probe = DecodeSchedulerSim(free_kv_blocks=2)
_probe.enqueue(1, 1, 3, priority=3, required_blocks=2)
_probe.step()
''', '''
_probe.enqueue(2, 1, 1, priority=3, required_blocks=2, cache_hit=True)
_e = _probe.step()
assert _e['request_id'] == 1 and _e['preempted_request_id'] is None
_sim = DecodeSchedulerSim(free_kv_blocks=1)
_sim.enqueue(0, 1, 2, priority=0)
_sim.step()
_sim.enqueue(-3, 1, 2, priority=1)
assert _sim.step()['preempted_request_id'] == 0
'''),
    "hidden_todo4_step": ('''
_probe = DecodeSchedulerSim()
_probe.enqueue(1, 1, 1, priority=2)
_probe.enqueue(2, 1, 1)
_probe.run(4)
''', '''
assert [e['wait_steps'] for e in _probe.timeline] == [0, 1, 1, 2]
_sim = DecodeSchedulerSim()
_sim.enqueue(1, 1, 2, deadline_step=3)
_flags = [e['deadline_missed'] for e in _sim.run(10)]
assert _flags == [False, False, False]
'''),
    "hidden_differential": ('''
_probe = DecodeSchedulerSim(free_kv_blocks=3)
for _i, (_p, _b) in enumerate([(1, 2), (3, 2), (0, 1)]):
    _probe.enqueue(_i, 2, 2, priority=_p, required_blocks=_b)
_probe.run(50)
''', '''
assert all(_r.done for _r in _probe.queue)
assert _probe.free_kv_blocks == 3
'''),
}


def build() -> nbformat.NotebookNode:
    events, arrivals = worked_example()
    png = timeline_png(events, arrivals)
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    cells = [md(INTRO), md(LIFECYCLE), md(SORTKEY), md(ADMISSION)]
    ex = md(example_md(events))
    ex["attachments"] = {"timeline.png": {"image/png": base64.b64encode(png).decode("ascii")}}
    cells.append(ex)
    cells.append(md(task_md()))
    cells.append(code(HELPER, nb_meta("test_helpers", locked=True)))
    reference = REFERENCE.read_text(encoding="utf-8")
    cells.append(code(reference, nb_meta(spec.SOLUTION_CELL, solution=True)))
    cells.append(md("""
## 6. 可见测试 · Visible tests

每个 TODO 一个测试单元格（各 3 分）；失败信息会写出期望值和实际值。
*One test cell per TODO (3 points each); a failure says what was expected and what came.*
"""))
    for c in spec.CELLS:
        if not c.hidden:
            cells.append(code(VISIBLE[c.grade_id], nb_meta(c.grade_id, grade=True, locked=True, points=c.points)))
    cells.append(md(f"""
## 7. 隐藏测试 · Hidden tests

以下单元格在你的版本中只有一个小检查；评分时由评分器在你的内核之外运行完整的隐藏测试（共 {spec.HIDDEN_POINTS} 分）：
每条规则的针对性场景，以及数百条随机轨迹与参考引擎的逐事件对照。
*In your copy these cells hold only a small probe; at grading time the grader runs the full hidden tests
({spec.HIDDEN_POINTS} points) outside your kernel: targeted cases per rule and hundreds of random traces compared
event for event with the reference engine.*
"""))
    for c in spec.CELLS:
        if c.hidden:
            probe, hidden = HIDDEN[c.grade_id]
            head = (f"# 隐藏测试 / Hidden tests: {c.grade_id} — {c.todo}, {c.points} 分 / points\n"
                    f"# {c.title}\n")
            src = head + probe.strip("\n") + "\n### BEGIN HIDDEN TESTS" + hidden.rstrip("\n") + "\n### END HIDDEN TESTS"
            cells.append(code(src, nb_meta(c.grade_id, grade=True, locked=True, points=c.points)))
    cells.append(md("""
## 提交前 · Before you submit

重启内核并运行全部单元格（Kernel → Restart & Run All），确认可见测试全部通过，然后提交本 notebook。
*Restart the kernel and run all cells, check that the visible tests pass, then submit this notebook.*
"""))
    for i, cell in enumerate(cells):  # stable ids, so a rebuild changes only what changed
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        cell["id"] = gid.replace("_", "-") if gid else f"text-{i:02d}"
    nb.cells = cells
    return nb


def main() -> int:
    nb = build()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    nbformat.validate(nb)
    OUT.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)} ({len(nb.cells)} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
