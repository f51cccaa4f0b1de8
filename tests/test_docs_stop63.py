"""docs/ alone carries the public surfaces: every command and option, every public name with its parameters and
defaults, the exit statuses and the layout, each checked against the code (the README is not read here).

tests/test_docs_stop59.py checks the contract's columns and its named CLI words against docs/ and the README
together; this file asks the same of docs/ by itself, for every word the parser and `decodesched.__all__` hold.
"""

from __future__ import annotations

import argparse
import ast
import csv
import importlib
import inspect
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

import decodesched
from decodesched.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _docs() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md")))


def _flat(text: str) -> str:
    return " ".join(text.split())


def _reference() -> str:
    return (DOCS / "reference.md").read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    assert f"\n{heading}\n" in text, f"no section {heading!r}"
    return text.split(f"\n{heading}\n")[1].split("\n## ")[0]


def _commands(parser=None, words=()):
    """(words, parser) of every command that takes no further command word."""
    parser = parser or build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield words, parser
    for action in subs:
        for word, sub in action.choices.items():
            yield from _commands(sub, (*words, word))


COMMANDS = list(_commands())


def test_the_parser_has_the_contracts_commands():
    # Guard (verified right): the walk below sees every command SPEC names, so it cannot pass on an empty list.
    names = {" ".join(words) for words, _ in COMMANDS}
    assert {"simulate", "sweep", "trace convert", "trace inspect", "assignment build", "grade"} <= names


@pytest.mark.parametrize("words, parser", COMMANDS, ids=[" ".join(w) for w, _ in COMMANDS])
def test_every_command_and_option_is_in_help_and_in_docs(words, parser):
    # Found: docs/ named no `decodesched demo`, `trace inspect` or `assignment build`, and none of `--max-steps`
    # (a contract word), `--engine`, `--replicates`, `--threads`, `--cuda`, `--trace-dir`, `--selfcheck`...
    # The README's table had some; docs/, the account a user reads for the contract, had no command reference.
    docs = _flat(_docs())
    assert f"decodesched {' '.join(words)}" in docs, words
    help_text = parser.format_help()
    for option in (o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")):
        assert option in help_text, (words, option)
        assert re.search(rf"`[^`]*(?<![\w-]){option}(?![\w-])[^`]*`", docs), (words, option)


def test_version_option_is_documented():
    assert "--version" in build_parser().format_help()
    assert "`decodesched --version`" in _docs()


# --- public names ------------------------------------------------------------------------------------------------

def _bullets() -> dict[str, str]:
    """reference.md's Python names: the name a bullet opens with -> the bullet's text."""
    section = _section(_reference(), "## Python names (`import decodesched`)")
    items = re.split(r"\n- (?=\*\*`)", "\n" + section)[1:]
    return {re.match(r"\*\*`(\w+)", item).group(1): _flat(item) for item in items}


def _documented_signature(text: str, name: str) -> list[tuple[str, object]]:
    """The parameters of the first `name(...)` in text, as (name, default or inspect.Parameter.empty)."""
    match = re.search(rf"(?<![\w.]){name}\(([^)]*)\)", text)
    assert match, f"no {name}(...) in the docs"
    params = []
    for part in filter(None, (p.strip() for p in match.group(1).split(","))):
        if part == "*":
            params.append(("*", inspect.Parameter.empty))
            continue
        key, _, default = part.partition("=")
        params.append((key, ast.literal_eval(default) if default else inspect.Parameter.empty))
    return params


def _code_signature(obj) -> list[tuple[str, object]]:
    params, star = [], False
    for p in inspect.signature(obj).parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            params.append(("*", inspect.Parameter.empty))
            star = True
        params.append((p.name, p.default))
    return params


SIGNATURES = [("load_trace", "load_trace"), ("simulate", "simulate"), ("grid", "grid"),
              ("simulate_batch", "simulate_batch"), ("DecodeSchedulerSim", "DecodeSchedulerSim"),
              ("DecodeSchedulerSim", "DecodeSchedulerSim.enqueue"), ("DecodeSchedulerSim", "DecodeSchedulerSim.run"),
              ("Scenario", "Scenario"), ("Policy", "Policy")]


def test_every_public_name_has_its_own_entry_in_docs():
    # Found: docs/ stated no signature of `simulate`, `load_trace` or the seed's `DecodeSchedulerSim` (its
    # interface is part of the contract); some public names appeared only in passing.
    bullets = _bullets()
    assert set(bullets) == set(decodesched.__all__), set(bullets) ^ set(decodesched.__all__)
    for name in decodesched.__all__:
        assert getattr(decodesched, name) is not None


@pytest.mark.parametrize("entry, qualname", SIGNATURES, ids=[q for _, q in SIGNATURES])
def test_documented_signatures_are_the_codes(entry, qualname):
    # Each documented call lists the parameters in the code's order with the code's defaults.
    obj = decodesched
    for part in qualname.split("."):
        obj = getattr(obj, part)
    documented = _documented_signature(_bullets()[entry], qualname.split(".")[-1])
    assert documented == _code_signature(obj), qualname


def test_documented_methods_and_attributes_of_results_exist():
    # The result classes' entries name only attributes the objects have, and at least the contract's.
    bullets = _bullets()
    contract = {"SimulationResult": {"timeline", "events", "requests", "metrics", "stop_reason"},
                "BatchResult": {"result", "rows"}, "Trace": {"subset", "to_csv", "steps_per_second"}}
    for cls, needed in contract.items():
        named = set(re.findall(r"`(\w+)(?:\(|`)", bullets[cls])) - {cls, "true", "false"}
        assert needed <= named, (cls, needed - named)
        cls_obj = getattr(decodesched, cls)
        fields = set(getattr(cls_obj, "__dataclass_fields__", {}))
        missing = {n for n in named if not hasattr(cls_obj, n) and n not in fields}
        # (names the bullet quotes from elsewhere: classes, columns, values)
        missing -= {"SimulationResult", "ValueError", "drained", "stuck", "max_steps", "step", "has_victim",
                    "deadline_step", "has_deadline"}
        assert not missing, (cls, missing)


# --- exit statuses and layout ------------------------------------------------------------------------------------

def test_exit_statuses_are_documented_and_are_what_the_cli_returns(tmp_path, capsys):
    rows = [line for line in _section(_reference(), "## Exit statuses").splitlines() if line.startswith("| ")]
    statuses = {s for row in rows[1:] for s in re.findall(r"\b\d+\b", row.split("|")[1])}
    assert {"0", "1", "2", "129", "130", "143"} <= statuses
    trace = tmp_path / "t.csv"
    trace.write_text("request_id,arrival_step,prompt_len,max_new_tokens,priority,cache_hit,required_blocks,"
                     "deadline_step,preemptible\n1,0,2,2,0,false,1,,true\n", encoding="utf-8")
    events = tmp_path / "e.csv"
    assert main(["simulate", str(trace), "--policy", "fcfs", "--kv-blocks", "4", "--events", str(events)]) == 0
    assert next(csv.reader(io.StringIO(events.read_text(encoding="utf-8"))))[0] == "step"
    capsys.readouterr()
    bad = tmp_path / "bad.csv"
    assert main(["simulate", str(trace), "--policy", "nope", "--kv-blocks", "4", "--events", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not bad.exists()


def test_layout_is_documented_and_imports_under_decodesched(tmp_path):
    table = [line for line in _section(_reference(), "## Layout").splitlines() if line.startswith("| `")]
    documented = {}
    for row in table:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for path in re.findall(r"`([^`]+)`", cells[0]):
            documented[path] = cells[2].strip("`")
    for path in ("kernels/", "grader/", "assignments/", "tests/", "pyproject.toml", "README.md"):
        assert path in documented, path
    for path, module in documented.items():
        assert (ROOT / path).exists(), path
        if module:
            importlib.import_module(module)
    # No bare `kernels` or `grader` package is installed beside decodesched (run away from the checkout).
    probe = "import importlib.util as u; print(u.find_spec('kernels'), u.find_spec('grader'))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "None"], out.stdout


def test_course_units_todos_and_points_are_the_graders():
    # Found: docs/ said nothing of what the course notebook holds (the TODOs, visible and hidden cells, points).
    from decodesched.grader import spec

    text = _flat(_section(_reference(), "## The course unit"))
    for method, todo in spec.TODO_OF_METHOD.items():
        assert f"{todo} `{method}`" in text, (todo, method)
    visible = [c for c in spec.CELLS if not c.hidden]
    hidden = [c for c in spec.CELLS if c.hidden]
    assert len(visible) == len(spec.TODO_OF_METHOD) and len({c.points for c in visible}) == 1
    assert f"{len(visible)} cells, {visible[0].points} points each" in text
    assert f"{len(hidden)} hidden test cells ({sum(c.points for c in hidden)} points)" in text


def test_parquet_outputs_have_the_csv_columns(tmp_path):
    # Guard (verified right): SPEC 4's Parquet forms carry the same columns as the CSV files, in order.
    pq = pytest.importorskip("pyarrow.parquet")
    trace = tmp_path / "t.csv"
    trace.write_text("request_id,arrival_step,prompt_len,max_new_tokens,priority,cache_hit,required_blocks,"
                     "deadline_step,preemptible\n1,0,2,2,0,false,1,,true\n-4,2,1,1,3,1,2,9,0\n", encoding="utf-8")
    out = {name: tmp_path / name for name in ("e.csv", "r.csv", "e.parquet", "r.pq")}
    for events, requests in (("e.csv", "r.csv"), ("e.parquet", "r.pq")):
        assert main(["simulate", str(trace), "--policy", "aging", "--kv-blocks", "2",
                     "--events", str(out[events]), "--requests", str(out[requests])]) == 0
    for csv_name, parquet_name in (("e.csv", "e.parquet"), ("r.csv", "r.pq")):
        header = next(csv.reader(io.StringIO(out[csv_name].read_text(encoding="utf-8"))))
        assert pq.read_schema(out[parquet_name]).names == header
