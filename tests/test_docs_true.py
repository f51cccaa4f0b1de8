"""The docs are true: README.md and docs/*.md checked mechanically against the code and against each other."""

import re
from pathlib import Path

import pytest

from decodesched import _io
from decodesched.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
# README up to its Performance section, and docs/ but for performance.md: the measured history has its own owner.
PAGES = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if p.name != "performance.md"]


def _text(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    return text.split("\n## Performance\n")[0] if page.name == "README.md" else text


def _subcommand(*words):
    parser = build_parser()
    for word in words:
        parser = next(a for a in parser._actions if a.choices and word in a.choices).choices[word]
    return parser


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_lines_fit_the_style_limit(page):
    # Found: 13 lines of prose (and one of the README's Python block) ran past 120 characters, up to 198.
    # A table row cannot wrap; every other line can.
    long = [(n, len(line)) for n, line in enumerate(_text(page).splitlines(), 1)
            if len(line) > 120 and not line.startswith("|")]
    assert not long, f"{page.name}: (line, length) over 120: {long}"


@pytest.mark.parametrize("words", [("sweep",), ("grade",)])
def test_no_progress_help_states_the_progress_rule(words):
    # docs/install.md and `_io.Progress`: off a terminal, a line once both a tenth of the work and 30 s have
    # passed since the last. Found: --help said "a line each 10% ... and 30 s at most", the opposite bound.
    action = next(a for a in _subcommand(*words)._actions if "--no-progress" in a.option_strings)
    help_text = " ".join(action.help.split())
    assert f"{_io.Progress.LINE_FRACTION:.0%} of the" in help_text.replace("%%", "%")
    assert f"{_io.Progress.LINE_SECONDS:.0f} s have passed since the last" in help_text
    assert "at most" not in help_text
    install = " ".join((ROOT / "docs" / "install.md").read_text(encoding="utf-8").split())
    assert "once both a tenth of the scenarios and 30 s have passed since the last" in install


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_quote_no_benchmark_timings_of_their_own(page):
    # A paragraph that names a benchmark script leaves its numbers to the README's dated Performance table.
    # Found: docs/files.md still said a million requests load in 15 s as Python lists and 40 s from CSV
    # ("everything else value by value"), where lists and CSV text are converted whole (about 0.5 s and 3.5 s).
    for paragraph in re.split(r"\n\s*\n", _text(page)):
        if "benchmarks/" in paragraph:
            figures = re.findall(r"\b\d[\d.,]* s\b", paragraph)
            assert not figures, f"{page.name}: timings {figures} beside a benchmark: {paragraph[:200]!r}"


@pytest.mark.parametrize("threads", ["0", "100000"])
def test_sweep_threads_out_of_range_names_the_flag(tmp_path, capsys, threads):
    # docs/files.md: a bad option is one line naming it; the line said "threads must be ...", the API's keyword.
    from decodesched.cli import main
    from decodesched.trace import TRACE_COLUMNS

    trace = tmp_path / "t.csv"
    trace.write_text(",".join(TRACE_COLUMNS) + "\n1,0,4,3,0,false,2,,true\n")
    out = tmp_path / "m.csv"
    assert main(["sweep", str(trace), "--policy", "fcfs", "--kv-blocks", "4", "--threads", threads,
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("decodesched sweep: error: --threads must be") and err.count("\n") == 1, err
    assert not out.exists() and list(tmp_path.iterdir()) == [trace]


def test_every_public_name_is_documented():
    # SPEC 5's surfaces and `decodesched.__all__`: each exists and the README or docs/ name it.
    # Found: `TraceError` (what a bad trace raises) and `BatchResult` (what simulate_batch returns) were named nowhere.
    import decodesched

    text = "\n".join(_text(page) for page in PAGES)
    for name in sorted(set(decodesched.__all__) - {"__version__"}):
        assert getattr(decodesched, name) is not None
        assert re.search(rf"`(decodesched\.)?{name}\b", text), f"decodesched.{name} is in no page"
    for words in [("simulate",), ("sweep",), ("trace", "convert"), ("trace", "inspect"), ("assignment", "build"),
                  ("grade",)]:
        _subcommand(*words)  # (raises StopIteration where the command does not exist)
        assert f"decodesched {' '.join(words)}" in text, words
