"""docs/ carries the whole contract: each rule a user relies on is stated there, and it is what the code does.

The surfaces below are the product's contract (its specification is not shipped): the CLI words, the file columns,
the policy view, the model's refusals, the conversion rules. Each test reads the page that states a rule and runs
the code that implements it. tests/test_docs_true.py and tests/test_docs_walk58.py check links, command lines,
public names and column order; this file checks the statements themselves.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import decodesched
from decodesched import model
from decodesched.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _section(text: str, heading: str) -> str:
    assert f"\n{heading}\n" in text, f"no section {heading!r}"
    return text.split(f"\n{heading}\n")[1].split("\n## ")[0]


def _table(section: str) -> list[dict]:
    """The first Markdown table of `section` as dicts of its cells."""
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def _subparser(*words):
    parser = build_parser()
    for word in words:
        parser = next(a for a in parser._actions if isinstance(a.choices, dict) and word in a.choices).choices[word]
    return parser


# --- the worked example of docs/semantics.md -------------------------------------------------------------------

def _example(tmp_path) -> tuple[Path, str]:
    section = _section(_page("semantics.md"), "## A worked example")
    trace = tmp_path / "example.csv"
    trace.write_text(re.search(r"```csv\n(.*?)```", section, re.S).group(1), encoding="utf-8")
    return trace, section


def _cell(value: str):
    return {"": None, "true": True, "false": False}.get(value, int(value) if re.fullmatch(r"-?\d+", value) else value)


def test_worked_example_is_the_models_and_every_engines_schedule(tmp_path):
    # Found: the semantics page stated the rules but worked no schedule, so a reader could not check a prediction.
    trace, section = _example(tmp_path)
    stated = [{k: _cell(v) for k, v in row.items()} for row in _table(section)]
    assert "`fixed_priority` with 4 KV blocks" in section
    events = model.replay(trace, "fixed_priority", 4).events
    assert [{k: e[k] for k in stated[0]} for e in events] == stated
    for engine in ("scan", "fast"):
        result = decodesched.simulate(trace, "fixed_priority", 4, engine=engine)
        assert [{k: e[k] for k in stated[0] if k != "step"} for e in result.timeline()] == \
            [{k: v for k, v in row.items() if k != "step"} for row in stated]
    # The command line the page names writes them too.
    command = re.search(r"`decodesched simulate` of this trace with `([^`]*)`", _flat(section)).group(1).split()
    assert command[-2:] == ["--events", "-"]
    out = tmp_path / "events.csv"
    assert main(["simulate", str(trace), *command[:-2], "--events", str(out)]) == 0
    written = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    assert [{k: _cell(row[k]) for k in stated[0]} for row in written] == stated


def test_worked_examples_requests_and_deadline_variant_hold(tmp_path):
    trace, section = _example(tmp_path)
    text = _flat(section.split("Its requests table")[1])
    requests = decodesched.simulate(trace, "fixed_priority", 4, engine="scan").requests
    ids = list(np.asarray(requests["request_id"]))
    claims = re.findall(r"request (\d+) (?:has )?((?:`\w+` \w+(?:, | and )?)+)", text.split("Under `deadline`")[0])
    assert [int(rid) for rid, _ in claims] == ids
    for rid, pairs in claims:
        row = ids.index(int(rid))
        for name, value in re.findall(r"`(\w+)` (\w+)", pairs):
            got = requests[name][row]
            assert (bool(got) if value in ("true", "false") else float(got)) == _cell(value), (rid, name)
    order = [int(x) for x in re.search(r"in the order ((?:\d+, )+\d+)", text).group(1).split(", ")]
    victim, challenger, step = re.search(r"request (\d+) preempts request (\d+) at step (\d+)", text).group(2, 1, 3)
    events = model.replay(trace, "deadline", 4).events
    assert [e["request_id"] for e in events] == order
    assert [(e["step"], e["request_id"]) for e in events if e["preempted_request_id"] == int(victim)] == \
        [(int(step), int(challenger))]
    assert not any(e["deadline_missed"] for e in events)


def test_status_words_mean_what_the_semantics_page_says(tmp_path):
    # Found: the page listed the four statuses without saying when a request has which (the requests table of a
    # replay stopped by max_steps shows them).
    trace, _ = _example(tmp_path)
    text = _flat(_page("semantics.md"))
    assert ("`waiting` until it is first admitted, `running` while admitted, `preempted` from losing its blocks "
            "until it is admitted again, `finished`") in text
    states = model.replay(trace, "fixed_priority", 4, max_steps=2).states
    assert [(s.status, s.admitted) for s in states.values()] == [
        ("preempted", False), ("running", True), ("waiting", False)]
    status = decodesched.simulate(trace, "fixed_priority", 4, max_steps=2, engine="scan").requests["status"]
    assert list(status) == ["preempted", "running", "waiting"]
    # Requests 2 and 3 arrive at step 1: stopped after one step, they are `waiting`, as files.md says.
    assert "`waiting` also for a request that had not arrived when `max_steps` stopped the replay" in _page("files.md")
    status = decodesched.simulate(trace, "fixed_priority", 4, max_steps=1, engine="scan").requests["status"]
    assert list(status) == ["running", "waiting", "waiting"]


@settings(derandomize=True, max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2)),
                min_size=1, max_size=8), st.integers(0, 6))
def test_fcfs_enqueue_clock_is_the_arrival_step(rows, capacity):
    # Found: semantics.md said fcfs's enqueue clock is "its arrival step or the clock when the replay caught up
    # with it"; a replay's clock meets every arrival (a step at a time, or an idle gap's jump to the next one).
    assert "in a replay, always its `arrival_step`" in _flat(_page("semantics.md"))
    trace = [dict(request_id=i, arrival_step=a, prompt_len=3, max_new_tokens=m, priority=p, cache_hit=False,
                  required_blocks=b, deadline_step=None, preemptible=True) for i, (a, m, b, p) in enumerate(rows)]
    states = model.replay(trace, "fcfs", capacity).states
    assert [s.enqueue_clock for _, s in sorted(states.items())] == [a for a, *_ in rows]


# --- the model's refusals ------------------------------------------------------------------------------------

def _enqueue_twice(sim):
    sim.enqueue(1, 4)
    sim.enqueue(1, 4)


REFUSALS = {
    "an unknown policy": lambda: model.DecodeSchedulerSim(policy="lifo"),
    "a negative capacity": lambda: model.DecodeSchedulerSim(free_kv_blocks=-1),
    "an `aging_interval` below 1": lambda: model.DecodeSchedulerSim(aging_interval=0),
    "a duplicate `request_id`": lambda: _enqueue_twice(model.DecodeSchedulerSim()),
    "`max_new_tokens` or `required_blocks` below 1": lambda: model.DecodeSchedulerSim().enqueue(1, 4, 0),
    "a `prompt_len`,": lambda: model.DecodeSchedulerSim().enqueue(1, 0),
    "a `deadline_step` not after the clock at enqueue": lambda: model.DecodeSchedulerSim().enqueue(1, 4,
                                                                                                 deadline_step=0),
    "negative `max_steps`": lambda: model.DecodeSchedulerSim().run(-1),
}


@pytest.mark.parametrize("words", list(REFUSALS))
def test_each_refusal_the_semantics_page_lists_is_a_value_error(words):
    # Found: the seed's input errors (its contract) were stated nowhere in docs/.
    assert words in _flat(_page("semantics.md"))
    with pytest.raises(ValueError):
        REFUSALS[words]()


# --- trace files ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content, says", [("", "empty file"), ("\n\n", "empty file"),
                                           (None, "the trace is empty")])
def test_empty_traces_are_refused_as_the_files_page_says(tmp_path, capsys, content, says):
    # Found: docs/files.md did not say that an empty file, or a header without requests, is refused.
    from decodesched.trace import TRACE_COLUMNS

    assert "An empty file (or one of blank lines only) and a file of the header alone (no requests) are refused." \
        in _flat(_page("files.md"))
    trace = tmp_path / "t.csv"
    trace.write_text(",".join(TRACE_COLUMNS) + "\n" if content is None else content, encoding="utf-8")
    with pytest.raises(decodesched.TraceError, match=says):
        decodesched.load_trace(trace)
    assert main(["simulate", str(trace), "--policy", "fcfs", "--kv-blocks", "4",
                 "--events", str(tmp_path / "e.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == [trace]


# The columns the contract names for each file, in its order.
EVENT_COLUMNS = ("step,request_id,phase,action,prompt_len,generated_len,max_new_tokens,wait_steps,free_kv_blocks,"
                 "preempted_request_id,deadline_missed").split(",")
REQUEST_EXTRA = ("first_step,first_token_step,finish_step,wait_steps,preemptions,status,queue_wait,ttft,tpot,e2e,"
                 "deadline_met").split(",")
TRACE_HEADER = ("request_id,arrival_step,prompt_len,max_new_tokens,priority,cache_hit,required_blocks,deadline_step,"
                "preemptible").split(",")


def test_contract_columns_are_in_the_docs_tables_and_the_writers_output(tmp_path):
    # Guard (verified right): the columns are in files.md's tables and in what `simulate` writes, in order.
    trace = tmp_path / "t.csv"
    trace.write_text(",".join(TRACE_HEADER) + "\n-3,0,4,2,1,true,2,9,false\n7,1,2,3,0,false,3,,true\n")
    files = _page("files.md")
    assert ",".join(TRACE_HEADER) in files
    documented = {name for heading in ("## Events table", "## Requests table")
                  for row in _table(_section(files, heading)) for name in re.findall(r"`(\w+)`", row["column"])}
    assert set(EVENT_COLUMNS) | set(REQUEST_EXTRA) <= documented
    events, requests = tmp_path / "e.csv", tmp_path / "r.csv"
    assert main(["simulate", str(trace), "--policy", "fixed_priority", "--kv-blocks", "4",
                 "--events", str(events), "--requests", str(requests)]) == 0
    assert next(csv.reader(io.StringIO(events.read_text()))) == EVENT_COLUMNS
    assert next(csv.reader(io.StringIO(requests.read_text()))) == TRACE_HEADER + REQUEST_EXTRA
    timeline = decodesched.simulate(trace, "fixed_priority", 4, engine="scan").timeline()
    assert list(timeline[0]) == EVENT_COLUMNS[1:]


# --- CLI words ------------------------------------------------------------------------------------------------

CLI_WORDS = {
    ("simulate",): ["--policy", "--kv-blocks", "--aging-interval", "--max-steps", "--events", "--requests"],
    ("sweep",): ["--policy", "--kv-blocks", "--aging-interval", "--out"],
    ("trace", "convert"): ["--steps-per-second", "--load", "--block-size", "--seed", "--slo-factor",
                           "--deadline-fraction", "--priority-classes", "--priority-weights", "--protected-classes",
                           "--cache-min-blocks", "--out"],
    ("trace", "inspect"): [],
    ("assignment", "build"): [],
    ("grade",): ["--out"],
}


@pytest.mark.parametrize("words", list(CLI_WORDS), ids=" ".join)
def test_contract_cli_words_exist_and_docs_name_them(words):
    # Found: `--block-size` and the other conversion options were named in no page, only in `--help`.
    parser = _subparser(*words)
    options = {o for a in parser._actions for o in a.option_strings}
    pages = [p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md")) if p.name != "performance.md"]
    text = "\n".join([(ROOT / "README.md").read_text(encoding="utf-8").split("\n## Performance\n")[0], *pages])
    assert f"decodesched {' '.join(words)}" in text
    for option in CLI_WORDS[words]:
        assert option in options, (words, option)
        assert re.search(rf"(?<![\w-]){option}(?![\w-])", text), (words, option)


# --- the conversion rules of docs/files.md ---------------------------------------------------------------------

def _rules() -> dict[str, str]:
    section = _section(_page("files.md"), "### Converting real traces (`decodesched trace convert`)")
    return {row["column"].strip("`"): row["rule"] for row in _table(section)}


def test_conversion_rules_name_the_converters_defaults():
    # Found: the rules (block count, deadlines, cache hits, classes) were left to `--help`; docs/ stated none.
    from decodesched.trace import TRACE_COLUMNS

    rules = _rules()
    assert set(rules) == set(TRACE_COLUMNS)
    defaults = {a.option_strings[0]: a.default for a in _subparser("trace", "convert")._actions if a.option_strings}
    for column, option in [("required_blocks", "--block-size"), ("deadline_step", "--slo-factor"),
                           ("deadline_step", "--deadline-fraction"), ("cache_hit", "--cache-min-blocks")]:
        stated = re.search(rf"`{option}`[^(]*\(default ([\d.]+)\)", rules[column]).group(1)
        assert float(stated) == float(defaults[option]), (column, option)
    from decodesched import convert

    classes = re.search(r"`--priority-classes` \(default ([\d,]+)\)", rules["priority"]).group(1)
    weights = re.search(r"`--priority-weights` \(default ([\d.,]+) for", rules["priority"]).group(1)
    assert tuple(map(int, classes.split(","))) == convert.DEFAULT_PRIORITY_CLASSES
    assert tuple(map(float, weights.split(","))) == convert.DEFAULT_PRIORITY_WEIGHTS


def test_conversion_rules_are_what_the_converter_computes():
    from decodesched import convert

    rules = _rules()
    assert "ceil((prompt_len + max_new_tokens) / block_size)" in rules["required_blocks"]
    assert "arrival_step + ceil(slo_factor * (1 + max_new_tokens))" in rules["deadline_step"]
    assert "work_steps / (L * span_seconds)" in rules["arrival_step"]
    seconds = np.array([0.0, 0.5, 1.25, 3.0, 3.0, 7.5])
    prompt, output = np.array([10, 0, 33, 16, 1, 500]), np.array([3, 0, 7, 1, 40, 2])
    raw = convert.RawTrace(seconds, prompt, output, None)
    trace = convert.to_trace(raw, load=0.7, block_size=8, slo_factor=2.5, deadline_fraction=1.0,
                             protected_classes=(2,), seed=3)
    new = np.maximum(output, 1)
    work = int(np.sum(1 + new))
    sps = work / (0.7 * (seconds[-1] - seconds[0]))
    assert trace.steps_per_second == pytest.approx(sps)
    assert list(trace.arrival_step) == [math.floor(s * trace.steps_per_second) for s in seconds]
    assert list(trace.prompt_len) == list(np.maximum(prompt, 1)) and list(trace.max_new_tokens) == list(new)
    assert list(trace.required_blocks) == [math.ceil((p + m) / 8) for p, m in zip(np.maximum(prompt, 1), new)]
    deadlines = [a + math.ceil(2.5 * (1 + m)) for a, m in zip(trace.arrival_step, new)]
    assert list(trace.deadline_step) == deadlines
    assert list(trace.preemptible) == [p != 2 for p in trace.priority]
    assert list(trace.request_id) == list(range(len(seconds))) and not any(trace.cache_hit)


# --- custom policies --------------------------------------------------------------------------------------------

def test_policy_view_fields_are_the_documented_ones():
    # Guard (verified right): policies.md's table of `r`, the README's list and the kernel's named tuple agree.
    from decodesched.kernels.scan_nb import RequestView

    contract = ["request_id", "arrival_step", "prompt_len", "max_new_tokens", "generated_len", "phase", "priority",
                "cache_hit", "wait_steps", "deadline_step", "has_deadline", "preemptible", "preemptions", "admitted"]
    assert list(RequestView._fields) == contract
    section = _section(_page("policies.md"), "## What `r` holds")
    assert [n for row in _table(section) for n in re.findall(r"`(\w+)`", row["field"])] == contract
    readme = _flat((ROOT / "README.md").read_text(encoding="utf-8"))
    assert f"(`{', '.join(contract)}`)" in readme
