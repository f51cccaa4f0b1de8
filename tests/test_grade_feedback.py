"""grader.feedback: the student's page, its schedule picture, and what it must never show."""

from __future__ import annotations

import html
import re

from decodesched.grader import feedback, pipeline, scenarios, spec, verdict


def _result(sid, status="graded", pictures=None):
    cells = {c.grade_id: float(c.points) / 2 for c in spec.CELLS}
    lines = {c.grade_id: [f"line <b>{c.grade_id}</b>"] for c in spec.CELLS}
    return pipeline.Result(sid, status, sum(cells.values()), float(spec.MAX_SCORE), cells, lines,
                           notes=["a note & more"], pictures=pictures or {})


def test_feedback_html_is_escaped_and_names_every_cell():
    page = feedback.feedback_html(_result("amy"))
    assert "<b>test_todo1_enqueue</b>" not in page and "&lt;b&gt;test_todo1_enqueue&lt;/b&gt;" in page
    assert "a note &amp; more" in page
    for c in spec.CELLS:
        assert html_escape(c.title) in page
    assert "BEGIN HIDDEN TESTS" not in page


def html_escape(s):
    return html.escape(s)


def _two_request_picture():
    """The reference and a submission that breaks the id tie-break the wrong way, on two requests."""
    trace = {"policy": "fixed_priority", "free_kv_blocks": 1, "aging_interval": 1, "max_steps": None,
             "rows": [{"request_id": i, "arrival_step": 0, "prompt_len": 1, "max_new_tokens": 1, "priority": 0,
                       "cache_hit": False, "required_blocks": 1, "deadline_step": None, "preemptible": True}
                      for i in (0, 1)]}
    s = scenarios.trace_scenario("t", trace)
    s["expected"] = scenarios.expected_for(s["ops"])
    got = [s["expected"][0], dict(s["expected"][1], events=s["expected"][1]["events"][2:] + s["expected"][1]["events"][:2])]
    return verdict.schedule_picture(s, got, "step 0: expected request 0, got request 1"), s


def test_schedule_events_and_first_divergence():
    picture, s = _two_request_picture()
    assert [e["request_id"] for e in picture["expected"]] == [0, 0, 1, 1]
    assert [e["request_id"] for e in picture["got"]] == [1, 1, 0, 0]
    assert feedback.first_divergence(picture["expected"], picture["got"]) == 0
    assert feedback.first_divergence(picture["expected"], picture["expected"]) is None
    assert feedback.first_divergence(picture["expected"], picture["expected"][:3]) == 3


def test_feedback_page_draws_the_first_failure_inline():
    picture, _ = _two_request_picture()
    page = feedback.feedback_html(_result("amy", pictures={"hidden_differential": picture}))
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    assert len(svgs) == 1 and "first difference / 第一个分歧" in svgs[0]
    assert svgs[0].count("<rect") == 8  # 4 expected events, 4 of the student's
    assert svgs[0].count('stroke="#c00"') >= 4  # every one of the student's boxes differs here
    assert "<table class=\"trace\">" in page and "最小失败轨迹" in page
    assert not re.search(r"(src|href)=", page)  # no external files: everything is inline
    assert "<svg" not in feedback.feedback_html(_result("bob"))


def test_feedback_picture_escapes_what_the_student_returned():
    picture, _ = _two_request_picture()
    picture["got"] = [{"request_id": "<script>x</script>", "action": "<b>"}, "not an event"]
    page = feedback.feedback_html(_result("amy", pictures={"hidden_differential": picture}))
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_a_picture_of_any_plain_values_is_drawn_or_said_never_raised(monkeypatch):
    """A trailing comma made an action a tuple (JSON: a list); `ACTION_MARK.get` raised TypeError in
    `render_outputs`, after every submission was graded: no grades.csv, no pages, no gradebook for anyone."""
    for odd in (["prefill_to_decode"], {"a": 1}, None, 1.5, True, [[["deep"]]]):
        picture, _ = _two_request_picture()
        picture["got"] = [dict(e, action=odd, request_id=odd) for e in picture["got"]]
        page = feedback.feedback_html(_result("amy", pictures={"hidden_differential": picture}))
        assert "<svg" in page and "first difference" in page, odd
    picture, _ = _two_request_picture()

    def fails(*args):
        raise TypeError("a value no figure expected")

    monkeypatch.setattr(feedback, "picture_html", fails)  # whatever else may fail in a picture: a sentence, the page
    page = feedback.feedback_html(_result("amy", pictures={"hidden_differential": picture}))
    assert "could not be drawn (TypeError)" in page and "<table>" in page
    assert pipeline.render_outputs([_result("amy", pictures={"hidden_differential": picture})])["grades.csv"]
