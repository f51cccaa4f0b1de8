"""grader.harness: which lines are IPython magics, and which returned values count as forged comparisons."""

from __future__ import annotations

import collections
import decimal
import enum
import fractions
import sys
import types
from pathlib import Path

import pytest

from decodesched.grader import harness

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402

# Python that IPython runs as it is: a `%` or `!` that does not start a statement.
KEPT = [
    "phase_rank = (0 if phase\n              != 'decode' else 1)\n",
    "x = [1,\n     % 2]\n",
    "y = {'a': 1,\n     }\nz = (y\n     != {})\n",
    "total = 1 + \\\n    % 3\n",
    'doc = """\n%d items\n!important\n"""\n',
    "s = '(' \nt = '''\n!= ''' \n",
    "f(a,\n  # a comment (with a bracket\n  !=b)\n",
]


@pytest.mark.parametrize("source", KEPT)
def test_continuation_lines_and_strings_are_never_stripped(source):
    assert harness.strip_magics(source) == source


def test_magics_that_start_a_statement_become_pass():
    source = ("%matplotlib inline\nimport os\nif True:\n    !ls -la\nx = (1)\n%time x\n"
              "s = '('  # ( not open\n!echo done\n%time f(1, \\\n      2)\ny = 2\n")
    assert harness.strip_magics(source) == ("pass\nimport os\nif True:\n    pass\nx = (1)\npass\n"
                                            "s = '('  # ( not open\npass\npass\n\ny = 2\n")


HELP_AND_ASSIGNED = [  # IPython's help syntax and magics assigned to a name: not Python, run fine in the kernel
    "DecodeSchedulerSim.run?\nx = 1\n", "?len\n", "x = 1\nsim.step??\n", "files = !ls\n",
    "t = %timeit -o -q sum([1])\ny = 2\n", "a, b = !echo 1 2\n", "if x:\n    out = !ls\n",
]


@pytest.mark.parametrize("cell", HELP_AND_ASSIGNED)
def test_help_syntax_and_assigned_magics_do_not_stop_the_cell_loading(cell):
    """``DecodeSchedulerSim.run?`` or ``files = !ls`` beside a correct solution scored 0: the cell did not
    parse, so not one statement ran (red-team finding). The notebook runs them, and so does the grader."""
    module = types.ModuleType("magic_solution")
    module.__dict__["sim"] = module.__dict__["x"] = 1
    assert harness.load_solution(cell + attacks.reference_source(), module.__dict__, 5.0) == []
    assert "DecodeSchedulerSim" in module.__dict__


def test_strip_magics_agrees_with_ipython():
    transformer = pytest.importorskip("IPython.core.inputtransformer2").TransformerManager()
    cells = KEPT + HELP_AND_ASSIGNED + ["%matplotlib inline\nx = 1\n", "if x:\n    !ls\n    y = (x\n         != 2)\n",
                                        "x = 1  # why?\ny = x != 2\nz = {'a': 1}\n"]
    for cell in cells:
        ours = harness.strip_magics(cell).split("\n")
        theirs = transformer.transform_cell(cell).split("\n")
        original = cell.split("\n")
        changed_by_us = {i for i, line in enumerate(ours) if line != original[i]}
        changed_by_ipython = {i for i, line in enumerate(theirs) if i < len(original) and line != original[i]}
        assert changed_by_us == changed_by_ipython, cell


def test_a_wrapped_comparison_loads_as_written():
    module = types.ModuleType("wrapped_solution")
    source = "%matplotlib inline\n" + attacks.reference_source().replace(*attacks.WRAPPED)
    assert harness.load_solution(source, module.__dict__, 5.0) == []
    assert "DecodeSchedulerSim" in module.__dict__


class _Phase(enum.Enum):
    DECODE = "decode"


class _Rank(enum.IntEnum):
    LOW = 1


def _well_known_values():
    np = pytest.importorskip("numpy")
    return [np.float64(1.0), np.float32(2.5), np.str_("decode"), np.array([1]), fractions.Fraction(1, 2),
            decimal.Decimal("1.5"), _Phase.DECODE, _Rank.LOW, collections.Counter("ab"), 1.5j]


def test_well_known_types_are_wrong_not_forged():
    for value in _well_known_values():
        got = harness.normalise(value)
        assert got.startswith("<bad type: ") and "overrides comparison" not in got, (value, got)


def test_comparisons_the_solution_defines_are_still_forged():
    np = pytest.importorskip("numpy")

    class Liar(np.float64):
        def __eq__(self, other):
            return True

        __hash__ = np.float64.__hash__

    class Disguised:
        __module__ = "builtins"

        def __eq__(self, other):
            return True

    class LyingPhase(enum.Enum):
        DECODE = "decode"

        def __eq__(self, other):
            return True

        __hash__ = enum.Enum.__hash__

    for value in (Liar(1.0), Disguised(), LyingPhase.DECODE):
        assert harness.normalise(value).endswith("; overrides comparison>"), value


def test_as_eq_reads_a_value_as_eq_sees_it_and_still_catches_forgery():
    np = pytest.importorskip("numpy")

    class Label(str):
        pass

    class Liar(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    for value, seen in [(1e9, 1_000_000_000), (True, 1), (np.float64(3.0), 3), (np.float32(1e9), 1_000_000_000),
                        (np.int64(4), 4), (_Rank.LOW, 1), (Label("finish"), "finish"), (7, 7), (None, None)]:
        got = harness.as_eq(value)
        assert got == seen and type(got) is type(seen), (value, got)
    assert harness.as_eq(1.5) == "<float: 1.5>" and harness.as_eq(float("inf")) == "<float: inf>"
    assert harness.as_eq(Liar(3)).endswith("; overrides comparison>")
    assert harness.as_eq(fractions.Fraction(4)).startswith("<bad type: Fraction")  # not read by value: documented


def test_a_patched_standard_class_is_no_longer_trusted(monkeypatch):
    monkeypatch.setattr(fractions.Fraction, "__eq__", lambda self, other: True)
    assert harness.normalise(fractions.Fraction(1, 3)).endswith("; overrides comparison>")
