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


def sibling_imports(tree: ast.Module) -> set[str]:
    """The kernel files a module imports from (``from .x import ...``, ``from . import x``)."""
    files = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                files.add(node.module + ".py")
            else:
                files |= {a.name + ".py" for a in node.names}
    return files - {"stamp.py"}


def literal_stamp(tree: ast.Module) -> set[str] | None:
    """The file names of a module's ``SOURCE_STAMP = source_stamp("a.py", ...)``, None when it has none
    or computes them (batch_nb stamps every file)."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SOURCE_STAMP" for t in node.targets)
                and isinstance(node.value, ast.Call)):
            args = node.value.args
            if all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args):
                return {a.value for a in args}
    return None


def test_every_stamp_covers_the_files_its_kernels_reach():
    """A stamped kernel's compiled code holds what it calls, and what that calls in turn: the stamp
    must name every kernel file reachable through imports (fast_nb -> aging_nb -> btree_nb), not
    only the direct ones."""
    imports = {p.name: sibling_imports(ast.parse(p.read_text())) for p in KERNELS.glob("*.py")}
    missing = []
    checked = 0
    for path in sorted(KERNELS.glob("*.py")):
        stamp = literal_stamp(ast.parse(path.read_text()))
        if stamp is None:
            continue
        checked += 1
        reach, todo = set(), list(imports[path.name])
        while todo:
            f = todo.pop()
            if f not in reach:
                reach.add(f)
                todo.extend(imports.get(f, ()))
        if reach - stamp:
            missing.append(f"{path.name}: stamp lacks {sorted(reach - stamp)}")
    assert checked >= 3  # aging_nb, fast_nb, scan_nb at least
    assert not missing, missing
