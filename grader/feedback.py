"""The feedback page of one student: score, status, one row per graded cell, and a picture.

Bilingual, as the notebook (Chinese and English side by side). For the first failing scenario (the
shrunk random trace when the differential cell fails, else the first failing targeted check), the
page shows the trace as a small table and an inline SVG of the student's schedule against the
expected one, event by event, with the first divergence marked. Everything on the page comes from
verdict lines and observations: no hidden test source, no tracebacks, no external files.
"""

from __future__ import annotations

import html
import re

from . import spec
from .compare import _same

ACTION_MARK = {"prefill_to_decode": "P", "decode_one_step": "D", "finish": "F"}
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7", "#9c755f")
CELL_W, CELL_H, LEFT, MAX_EVENTS = 30, 30, 118, 40
SAME_FIELDS = ("request_id", "action", "phase", "preempted_request_id", "step")


def _fmt(x: float) -> str:
    return f"{x:g}"


_UNWRITABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def _e(text: str) -> str:
    """`text` as the page shows it: HTML-escaped, and each character that UTF-8 cannot write (a lone surrogate, as
    the message of a student's exception can hold: it stopped the outputs of the whole grading) or that a browser
    drops (NUL and the other control characters but tab and line breaks) as the escape `repr` writes (``\\ud800``)."""
    return html.escape(_UNWRITABLE.sub(lambda m: repr(m.group())[1:-1], text))


def first_divergence(expected: list, got: list) -> int | None:
    """Index of the first event that differs (request, action, phase, victim or step), else None."""
    for i, (e, g) in enumerate(zip(expected, got)):
        if not isinstance(g, dict) or any(not _same(e.get(f), g.get(f)) for f in SAME_FIELDS):
            return i
    return None if len(expected) == len(got) else min(len(expected), len(got))


def _event_box(x: float, y: float, ev, wrong: bool) -> str:
    if not isinstance(ev, dict):
        return (f'<rect x="{x}" y="{y}" width="{CELL_W - 2}" height="{CELL_H}" fill="#ddd" stroke="#c00" '
                f'stroke-width="2"/><text x="{x + CELL_W / 2 - 1}" y="{y + 19}" text-anchor="middle">?</text>')
    rid = ev.get("request_id")
    color = PALETTE[rid % len(PALETTE)] if type(rid) is int else "#bbb"
    action = ev.get("action")
    mark = ACTION_MARK.get(action, "?") if type(action) is str else "?"  # (a list or dict of the student's: no key)
    victim = ev.get("preempted_request_id")
    title = f"step {ev.get('step')}: request {rid} {ev.get('action')}" + (f", preempts {victim}" if victim is not None else "")
    stroke = ' stroke="#c00" stroke-width="2.5"' if wrong else ' stroke="#fff"'
    return (f'<g><title>{_e(str(title))}</title><rect x="{x}" y="{y}" width="{CELL_W - 2}" height="{CELL_H}" '
            f'rx="3" fill="{color}"{stroke}/><text x="{x + CELL_W / 2 - 1}" y="{y + 13}" text-anchor="middle" '
            f'fill="#fff" font-weight="bold">{_e(str(rid)[:4])}</text><text x="{x + CELL_W / 2 - 1}" y="{y + 26}" '
            f'text-anchor="middle" fill="#fff" font-size="10">{_e(mark)}{"!" if victim is not None else ""}</text></g>')


def schedule_svg(expected: list, got: list) -> str:
    """An inline SVG: the expected schedule above the student's, one box per event (request id, action),
    boxes that differ outlined in red, and a red line at the first divergence."""
    first = first_divergence(expected, got)
    n = max(len(expected), len(got), 1)
    start = 0 if first is None or n <= MAX_EVENTS else max(0, min(first - MAX_EVENTS // 2, n - MAX_EVENTS))
    end = min(n, start + MAX_EVENTS)
    width = max(LEFT + (end - start) * CELL_W + 20, 480)  # room for the divergence label
    rows = (("expected / 期望", expected, 34), ("yours / 你的", got, 34 + CELL_H + 22))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="schedule" width="{width}" height="{34 + 2 * CELL_H + 60}" '
             f'font-family="sans-serif" font-size="12" role="img" aria-label="schedule / 调度">']
    for i in range(start, end):
        x = LEFT + (i - start) * CELL_W
        ev = expected[i] if i < len(expected) else (got[i] if i < len(got) else None)
        step = ev.get("step") if isinstance(ev, dict) else None
        parts.append(f'<text x="{x + CELL_W / 2 - 1}" y="24" text-anchor="middle" fill="#666" font-size="10">'
                     f'{_e(str(step if step is not None else i))}</text>')
    parts.append('<text x="4" y="24" fill="#666" font-size="10">step / 步</text>')
    for label, events, y in rows:
        parts.append(f'<text x="4" y="{y + 19}">{_e(label)}</text>')
        for i in range(start, min(end, len(events))):
            x = LEFT + (i - start) * CELL_W
            wrong = events is got and (i >= len(expected) or not isinstance(events[i], dict)
                                       or any(not _same(expected[i].get(f), events[i].get(f)) for f in SAME_FIELDS))
            parts.append(_event_box(x, y, events[i], wrong))
        if len(events) < end and events is got:
            x = LEFT + (max(len(events), start) - start) * CELL_W
            parts.append(f'<text x="{x + 4}" y="{y + 19}" fill="#c00">(no more events / 没有更多事件)</text>')
    if first is not None and start <= first < end:
        x = LEFT + (first - start) * CELL_W - 2
        bottom = 34 + 2 * CELL_H + 26
        parts.append(f'<line x1="{x}" y1="30" x2="{x}" y2="{bottom}" stroke="#c00" stroke-width="2" stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{x + 3}" y="{bottom + 14}" fill="#c00">first difference / 第一个分歧 '
                     f'(event {first + 1})</text>')
    parts.append("</svg>")
    return "".join(parts)


TRACE_HEAD = ("request_id", "arrival", "prompt", "max_new", "priority", "cache_hit", "blocks", "deadline", "preemptible")


def trace_table_html(trace: dict) -> str:
    rows = []
    for r in trace["rows"]:
        cells = (r["request_id"], r["arrival_step"], r["prompt_len"], r["max_new_tokens"], r["priority"],
                 "yes" if r["cache_hit"] else "no", r["required_blocks"],
                 "-" if r["deadline_step"] is None else r["deadline_step"], "yes" if r["preemptible"] else "no")
        rows.append("<tr>" + "".join(f"<td>{_e(str(c))}</td>" for c in cells) + "</tr>")
    conf = (f"policy={trace['policy']} free_kv_blocks={trace['free_kv_blocks']} aging_interval={trace['aging_interval']}"
            + (f" max_steps={trace['max_steps']}" if trace.get("max_steps") is not None else ""))
    return (f"<p><code>{_e(conf)}</code></p><table class=\"trace\"><tr>"
            + "".join(f"<th>{_e(h)}</th>" for h in TRACE_HEAD) + "</tr>" + "".join(rows) + "</table>")


def picture_html(title: str, picture: dict) -> str:
    parts = [f'<section class="picture"><h2>{_e(title)}</h2>']
    if picture.get("trace"):
        parts.append("<p>smallest failing trace / 最小失败轨迹:</p>" + trace_table_html(picture["trace"]))
    if picture.get("expected") or picture.get("got"):
        parts.append("<p>your schedule against the expected one, one box per step (number: request id; "
                     "P prefill, D decode, F finish, ! preempts another request) / 你的调度与期望调度逐步对比"
                     "（数字：请求编号；P 预填充，D 解码，F 完成，! 抢占其他请求）:</p>")
        parts.append(schedule_svg(picture.get("expected") or [], picture.get("got") or []))
    parts.append(f"<p>first difference / 第一个分歧: {_e(str(picture.get('diff', '')))}</p></section>")
    return "\n".join(parts)


def _picture_or_note(title: str, picture: dict) -> str:
    """The picture of the first failing scenario, drawn from the student's own values; one that cannot be
    drawn is a sentence instead, so that no student's values can keep the whole run from writing its outputs."""
    try:
        return picture_html(title, picture)
    except Exception as exc:  # noqa: BLE001 - any value the student's step() returned
        return (f"<p class=\"picture\">{_e(title)}: the schedule could not be drawn "
                f"({_e(type(exc).__name__)}) / 无法绘制调度图</p>")


def _has_schedule(picture) -> bool:
    return isinstance(picture, dict) and bool(picture.get("expected") or picture.get("got"))


def feedback_html(r) -> str:
    """The page of one `pipeline.Result` (``r.pictures`` maps grade_id to a `verdict.schedule_picture`)."""
    rows = []
    for c in spec.CELLS:
        lines = r.lines.get(c.grade_id) or []
        items = "".join(f"<li>{_e(line)}</li>" for line in lines)
        kind = "hidden" if c.hidden else "visible"
        rows.append(
            f"<tr><td>{_e(c.title)}</td><td>{_e(c.todo)}</td><td>{kind}</td>"
            f"<td>{_fmt(r.cells[c.grade_id])} / {c.points}</td><td><ul>{items}</ul></td></tr>"
        )
    notes = "".join(f"<li>{_e(n)}</li>" for n in r.notes)
    pictures = getattr(r, "pictures", None) or {}
    # The first failing scenario: the shrunk random trace when there is one, else the first cell in notebook order
    # whose failing check has a schedule to draw (a visible cell's check may read one field), else the first cell.
    drawn = [c for c in spec.CELLS if c.grade_id in pictures and _has_schedule(pictures[c.grade_id])]
    first = next((c for c in spec.CELLS if c.grade_id == "hidden_differential" and c.grade_id in pictures),
                 next(iter(drawn), next((c for c in spec.CELLS if c.grade_id in pictures), None)))
    picture = _picture_or_note(f"{first.title}: where your schedule goes wrong / 你的调度从哪里开始出错",
                               pictures[first.grade_id]) if first is not None else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"zh-CN\"><head><meta charset=\"utf-8\">"
        f"<title>{_e(spec.ASSIGNMENT)} - {_e(r.student_id)}</title>"
        "<style>body{font-family:sans-serif;max-width:70em;margin:2em auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top}"
        "table.trace td{text-align:right;font-family:monospace}svg.schedule{display:block;margin:1em 0}</style>"
        "</head><body>\n"
        f"<h1>{_e(spec.ASSIGNMENT)}: {_e(r.student_id)}</h1>\n"
        f"<p>得分 Score: <b>{_fmt(r.score)} / {_fmt(r.max_score)}</b> &nbsp; 状态 Status: <b>{_e(r.status)}</b></p>\n"
        + (f"<ul class=\"notes\">{notes}</ul>\n" if notes else "")
        + (picture + "\n" if picture else "")
        + "<table><tr><th>测试 Test</th><th>TODO</th><th></th><th>分数 Points</th><th>反馈 Feedback</th></tr>\n"
        + "\n".join(rows)
        + "\n</table>\n</body></html>\n"
    )
