"""docs/architecture.md layering rule 1: the package imports without a database, plpy or TensorFlow."""
from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import cerebro_db

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_imports_without_tensorflow_or_a_database():
    mods = sorted(m.name for m in pkgutil.walk_packages(cerebro_db.__path__, "cerebro_db."))
    code = (
        "import sys, importlib\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        "bad = [m for m in ('tensorflow', 'keras', 'plpy', 'psycopg2') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print(len(sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert len(mods) >= 8


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """The package's modules that ``module`` imports anywhere in its code (a function-level
    import counts: it is a dependency all the same), except under ``if TYPE_CHECKING``."""
    import ast

    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and ast.unparse(node.test).endswith("TYPE_CHECKING")
                   for n in ast.walk(node)}
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                base = package
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                if node.module:
                    base = f"{base}.{node.module}"
            for a in node.names:
                full = f"{base}.{a.name}"
                out.add(full if full in modules else base)
    return {m for m in out if m in modules and m != module}


def import_cycles(root: Path) -> list[frozenset[str]]:
    """The import cycles (strongly connected components of more than one module) among the
    modules of the package at ``root``."""
    files = {}
    for p in root.rglob("*.py"):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph = {m: _imports(p, m, set(files)) for m, p in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


KNOWN_CYCLES = {
    # lazy imports of a registry from the policies' base classes (issue 12 part 5 removes them)
    frozenset({"cerebro_db.scheduling.base", "cerebro_db.scheduling.randomized",
               "cerebro_db.scheduling.registry", "cerebro_db.scheduling.ring"}),
    frozenset({"cerebro_db.automl.base", "cerebro_db.automl.registry"}),
    # the literal-only parser and custom function references use each other lazily
    frozenset({"cerebro_db.custom_functions", "cerebro_db.params"}),
}
"""Cycles that other changes are to remove; no other may appear."""


def test_no_import_cycles_between_modules_of_the_package():
    cycles = import_cycles(Path(cerebro_db.__file__).parent)
    new = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not new, f"import cycles: {new}"


def test_the_cycle_check_finds_a_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from . import a\n")
    assert import_cycles(pkg) == [frozenset({"pkg.a", "pkg.sub.b"})]


def test_each_module_imports_alone_in_a_fresh_interpreter():
    """Every module imports first in a fresh interpreter (an import cycle at module level
    fails there, whichever module of the cycle comes first)."""
    mods = sorted(m.name for m in pkgutil.walk_packages(cerebro_db.__path__, "cerebro_db."))
    bad = [m for m in mods if subprocess.run([sys.executable, "-c", f"import {m}"], cwd=ROOT,
                                             capture_output=True, check=False).returncode]
    assert not bad, bad
