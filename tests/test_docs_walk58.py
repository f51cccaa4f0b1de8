"""The docs walked as a newcomer reads them: every link lands, every command line parses, every name exists.

README.md (up to its Performance section) and docs/*.md (but performance.md), checked against the code.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from decodesched.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if p.name != "performance.md"]
IDS = [str(p.relative_to(ROOT)) for p in PAGES]


def _text(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    return text.split("\n## Performance\n")[0] if page.name == "README.md" else text


def _blocks(text: str, *languages: str) -> list[str]:
    """Fenced code blocks of the given languages, and (for "bash") the four-space indented ones."""
    found = [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M) if lang in languages]
    if "bash" in languages:
        found += ["\n".join(m.group(0)[4:] for m in re.finditer(r"^    decodesched .*$", text, re.M))]
    return found


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_relative_links_land(page):
    for href in re.findall(r"\]\(([^)\s]+)\)", _text(page)):
        if re.match(r"[a-z]+:", href):
            continue
        path, _, anchor = href.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: link to a missing file: {href}"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", target.read_text(encoding="utf-8"), re.M)
            assert anchor in map(_anchor, headings), f"{page.name}: link to a missing heading: {href}"


def _command_lines(text: str):
    """`decodesched ...` lines of the shell blocks, comments and continuations resolved, one per command."""
    for block in _blocks(text, "bash", "sh", "console"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.split(r"\s#\s", line)[0]
            for part in re.split(r"&&|;|\|", line):
                if part.strip().startswith("decodesched "):
                    yield part.strip()


def _parse(words: list[str]) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(words)
        except SystemExit as exc:
            return err.getvalue().strip() or f"exit {exc.code}"
    return ""


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_shell_command_lines_parse(page):
    # Every `decodesched ...` line in a shell block is one a newcomer can paste: the real parser takes it.
    for line in _command_lines(_text(page)):
        words = [w.replace("*", "x") for w in shlex.split(line.replace("$L", "1.0"))[1:]]
        assert not _parse(words), f"{page.name}: {line!r}: {_parse(words)}"


def _subparser(words: list[str]):
    parser, used = build_parser(), []
    for word in words:
        actions = [a for a in parser._actions if isinstance(a.choices, dict) and word in a.choices]
        if not actions:
            break
        parser, used = actions[0].choices[word], used + [word]
    return parser, used


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_option_named_beside_a_command_exists(page):
    # A `decodesched SUB ... --option` anywhere in the text (synopses in tables included) names a real option.
    for match in re.finditer(r"decodesched ((?:[a-z]+ ?){1,2})([^`\n]*)", _text(page)):
        parser, used = _subparser(match.group(1).split())
        if not used:
            continue
        options = {o for a in parser._actions for o in a.option_strings}
        for option in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", match.group(2)):
            assert option in options, f"{page.name}: decodesched {' '.join(used)} has no {option}: {match.group(0)!r}"


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_python_snippets_compile_and_name_real_attributes(page):
    # Each ```python block is valid Python, and each `decodesched.X` / `from decodesched import X` it uses exists.
    import importlib

    for block in _blocks(_text(page), "python"):
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("decodesched"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), \
                        f"{page.name}: from {node.module} import {alias.name}"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "decodesched":
                import decodesched
                assert hasattr(decodesched, node.attr), f"{page.name}: decodesched.{node.attr}"


def _table_column(text: str, heading: str) -> list[str]:
    """The first cells of the table under a heading, backticks split (`a`, `b` in one cell gives a and b)."""
    section = text.split(f"\n## {heading}\n")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])]


def test_files_page_lists_the_codes_columns_in_order():
    from decodesched import metrics
    from decodesched.batch import SCENARIO_KEYS, TRACE_KEYS
    from decodesched.tables_io import EVENT_SCHEMA, REQUEST_SCHEMA
    from decodesched.trace import TRACE_COLUMNS

    text = (ROOT / "docs" / "files.md").read_text(encoding="utf-8")
    assert ",".join(TRACE_COLUMNS) in text
    assert _table_column(text, "Trace CSV") and set(_table_column(text, "Trace CSV")) == set(TRACE_COLUMNS)
    assert _table_column(text, "Events table") == [name for name, _ in EVENT_SCHEMA]
    assert _table_column(text, "Requests table") == [name for name, _ in REQUEST_SCHEMA][len(TRACE_COLUMNS):]
    sweep = " ".join(text.split("\n## Sweep metrics CSV\n")[1].split("\nCells:")[0].split())
    assert f"`{', '.join(SCENARIO_KEYS)}`" in sweep
    assert f"`{'` and `'.join(TRACE_KEYS)}`" in sweep
    flat = [c for c in metrics.FLAT_COLUMNS if not re.search(r"_(mean|p50|p95|p99|max|censored)$", c)]
    assert f"`{', '.join(flat)}`" in sweep
    classes = re.search(r"`<name>_classP` for (.*?) \(time columns", sweep).group(1)
    named = re.sub(r"the P50 / P95 / P99 of `queue_wait`, `ttft` and `e2e`",
                   "queue_wait_p50 queue_wait_p95 queue_wait_p99 ttft_p50 ttft_p95 ttft_p99 e2e_p50 e2e_p95 e2e_p99",
                   classes)
    assert re.findall(r"[a-z_0-9]+", named.replace("`", " ")) == list(metrics.CLASS_COLUMNS)


def test_metrics_page_names_every_key_of_result_metrics():
    # Found: `result.metrics` had `mean_service_share` (overall and per class) and `steps_per_second`, named nowhere.
    import decodesched

    trace = decodesched.load_trace({
        "request_id": [1, 2], "arrival_step": [0, 1], "prompt_len": [4, 2], "max_new_tokens": [3, 2],
        "priority": [0, 2], "cache_hit": [False, True], "required_blocks": [2, 2], "deadline_step": [None, 8],
        "preemptible": [True, True]})
    metrics = decodesched.simulate(trace, "fcfs", 4, engine="scan").metrics
    assert metrics["steps_per_second"] is None
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    keys = set(metrics) | {k for row in metrics["per_class"].values() for k in row}
    assert {k for k in keys if f"`{k}`" not in text} == set()


def test_a_newcomer_finds_how_to_uninstall_and_how_to_cite(monkeypatch):
    # Found: no page said how to uninstall (the compile cache outlives `pip uninstall`), and the README cited the
    # Azure trace but not the Mooncake one its study uses.
    from decodesched import _numba_cache

    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    install = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    assert "`pip uninstall decodesched`" in install
    if sys.platform.startswith("linux"):
        cache = str(_numba_cache.user_cache_dir()).replace(str(Path.home()), "~")
        assert f"rm -rf {cache}" in install
    readme = _text(ROOT / "README.md")
    data = readme.split("\n## Data\n")[1].split("\n## ")[0]
    assert "Splitwise" in data and "Mooncake: Trading More Storage" in data
    assert "docs/install.md#uninstalling" in readme


def test_readme_names_every_package_of_the_test_extra():
    # Found: the set-up block's comment listed "pytest, hypothesis, nbgrader, dask, pandas"; the extra also installs
    # ipykernel and pyarrow.
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    extra = re.search(r"^test = \[(.*?)^\]", pyproject, re.S | re.M).group(1)
    packages = [re.match(r"[\w-]+", item).group(0) for item in re.findall(r'"([^"]+)"', extra)]
    comment = next(line for line in _text(ROOT / "README.md").splitlines() if line.startswith("# 2. Run the tests"))
    listed = re.findall(r"[\w-]+", comment.split("test extras:")[1])
    assert sorted(listed) == sorted(packages)


def test_readme_states_the_demos_defaults():
    # Found: "at a load where a backlog builds up" with the options unnamed; the demo runs at load 0.8, 2,000 blocks.
    demo = _subparser(["demo"])[0]
    defaults = {a.dest: a.default for a in demo._actions}
    intro = " ".join(_text(ROOT / "README.md").split("\n## What it is")[0].split())
    assert f"offered load of {defaults['load']} with {defaults['kv_blocks']:,} KV blocks" in intro
    assert f"`{defaults['out']}/ttft_cdf.png`" in intro


def test_example_notebooks_closing_claims_hold():
    # examples/policy_comparison.ipynb said the price of SJF and least laxity first "shows in the `starvation_s`
    # column"; on its 200-request prefix both wait less at 300 blocks than every built-in. The claims it makes now:
    import json

    import decodesched
    from decodesched import convert

    nb = json.loads((ROOT / "examples" / "policy_comparison.ipynb").read_text(encoding="utf-8"))
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    ns: dict = {}
    exec(next(c for c in code if "def llf_key" in c), ns)
    raw = convert.read_azure(convert.bundled_trace_path()).head(200)
    trace = convert.to_trace(raw, load=1.2, seed=0)
    builtins = ["fixed_priority", "aging", "deadline", "fcfs"]
    by_policy = {cap: {str(p): decodesched.simulate(trace, p, cap, aging_interval=4, engine="scan").metrics
                       for p in [*builtins, ns["sjf"], ns["llf"]]} for cap in (300, 1000)}
    for cap, results in by_policy.items():
        assert max(results, key=lambda p: results[p]["slo_attainment"]) == "least_laxity", cap
    small = by_policy[300]
    assert min(small, key=lambda p: small[p]["ttft"]["p50"]) == "sjf"
    assert max(small["sjf"]["starvation"], small["least_laxity"]["starvation"]) < min(
        small[p]["starvation"] for p in builtins)
    assert "Neither pays in the longest wait here" in " ".join(" ".join(c["source"]) for c in nb["cells"]).replace(
        "\n", " ").replace("  ", " ")


def test_readmes_course_counts_are_the_graders():
    # The README's numbers of the course unit come from grader/spec.py and grader/mutants.py, not from memory.
    from decodesched.grader import mutants, spec

    readme = " ".join(_text(ROOT / "README.md").split())
    visible = [c for c in spec.CELLS if not c.hidden]
    hidden = [c for c in spec.CELLS if c.hidden]
    words = {4: "four", 6: "six"}
    assert {c.points for c in visible} == {3} and len(visible) == 4
    assert "a visible test cell per TODO (3 points each)" in readme
    assert f"{words[len(hidden)]} hidden test cells ({sum(c.points for c in hidden)} points)" in readme
    assert f"a library of {len(mutants.MUTANTS)} one-bug solutions" in readme
    assert f"{len(mutants.MUTANTS) + 3} in all" in readme


def test_readme_states_the_grade_limits_defaults():
    # Found: the README's grade synopsis named --jobs, --timeout and --memory-mb but no default; a newcomer sizing
    # a course had to read --help. The defaults it states now are the parser's.
    grade = _subparser(["grade"])[0]
    actions = {a.dest: a for a in grade._actions}
    assert "default: all cores" in " ".join(actions["jobs"].help.split())
    timeout, memory = actions["timeout"].default, actions["memory_mb"].default
    assert f"default {timeout:g})" in " ".join(actions["timeout"].help.split())
    readme = " ".join(_text(ROOT / "README.md").split())
    stated = f"`--jobs` all cores, `--timeout {timeout:g}` CPU seconds and `--memory-mb {memory}` per submission"
    assert stated in readme


def test_readme_explains_every_status_of_grades_csv_and_which_wins():
    # Found: the README's status table did not say which status a submission gets when several apply
    # (a memory bomb that also tampers), nor how `score` relates to the cell columns.
    from decodesched.grader import status

    readme = _text(ROOT / "README.md")
    table = re.findall(r"^\| `(\w+)` \|", readme.split("| status | meaning |")[1].split("\n\n")[0], re.M)
    assert table == [*status.STATUSES, status.MISSING]
    order = [s for s in status.PRECEDENCE if s != "graded"]
    text = " ".join(readme.split())
    assert "gets the first of " + ", ".join(f"`{s}`" for s in order) + ", else `graded`" in text


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_named_repository_files_and_grader_names_exist(page):
    # `grader/x.py`, `tests/test_y.py`, `benchmarks/...` and `module.name` of grader/ a page names are there.
    import importlib

    text = _text(page)
    for path in re.findall(r"`((?:grader|kernels|src/decodesched|tests|benchmarks|examples|assignments)/[\w./-]+)`",
                           text):
        assert (ROOT / path).exists(), f"{page.name}: {path}"
    modules = "|".join(p.stem for p in (ROOT / "grader").glob("*.py"))
    for module, name in re.findall(rf"`({modules})\.([A-Za-z_]\w*)", text):
        if name != "py":
            grader_module = importlib.import_module(f"decodesched.grader.{module}")
            assert hasattr(grader_module, name), f"{page.name}: {module}.{name}"


def test_research_block_says_what_to_leave_out_without_mooncake():
    # Found: "or leave out its two lines" where the Mooncake trace is one line of the loop and a glob in the sweep
    # line; kept, the unmatched `mooncake_load*.csv` is "no such file", exit 2.
    section = _text(ROOT / "README.md").split("\n## Research workflows\n")[1]
    intro, block = section.split("```bash\n")[0], section.split("```bash\n")[1].split("```")[0]
    intro = " ".join(intro.split())
    names = {w for w in re.findall(r"\S+", block) if "mooncake" in w and not w.startswith("--")}
    assert names == {"mooncake_conversation.jsonl", "mooncake_load$L.csv", "mooncake_load*.csv"}
    assert "leave out its `trace convert` line and its `mooncake_load*.csv`" in intro
    assert "`mooncake_conversation.jsonl`" in intro
