"""Numba's cache keys a cached function on its own file only, so a cached function that calls a kernel
of another file would keep that kernel's old machine code after an edit (a stale, even crashing,
build on a developer's machine).  The rule (see `decodesched.kernels.stamp`): a function compiled
with ``cache=True`` either calls kernels of its own file only, or closes over a source stamp of the
files it calls into.  This checks the rule on the kernel sources."""

from __future__ import annotations

import ast
from pathlib import Path

import decodesched.kernels as kernels_pkg

KERNELS = Path(kernels_pkg.__file__).resolve().parent


def cached(fn: ast.FunctionDef) -> bool:
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call) and any(k.arg == "cache" and getattr(k.value, "value", False)
                                             for k in dec.keywords):
            return True
    return False


def imported_kernels(tree: ast.Module) -> set[str]:
    """Functions imported from sibling kernel modules (constants are UPPER_CASE)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module != "enums":
            names |= {a.asname or a.name for a in node.names if not a.name.isupper()}
    return names


def test_cached_kernels_call_into_other_files_only_under_a_stamp():
    offenders = []
    checked = 0
    for path in sorted(KERNELS.glob("*.py")):
        tree = ast.parse(path.read_text())
        foreign = imported_kernels(tree) - {"source_stamp", "KERNELS"}
        for node in tree.body:  # top-level functions; the stamped ones are nested in _make_* factories
            if isinstance(node, ast.FunctionDef) and cached(node):
                checked += 1
                called = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
                if called & foreign:
                    offenders.append(f"{path.name}:{node.name} calls {sorted(called & foreign)}")
    assert checked > 20  # it did look at the kernels
    assert not offenders, offenders
