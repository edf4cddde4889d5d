"""docs/architecture.md layering rule 1: the package imports without a database, plpy or TensorFlow."""
from __future__ import annotations

import ast
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import cerebro_db

ROOT = Path(__file__).resolve().parents[2]
# cerebro_db.client needs the package's "client" extra; without it the client is left out.
CLIENT_EXTRA = ("pandas", "sqlalchemy", "matplotlib")


def test_every_module_imports_without_tensorflow_or_a_database():
    mods = sorted(m.name for m in pkgutil.walk_packages(cerebro_db.__path__, "cerebro_db."))
    if any(importlib.util.find_spec(m) is None for m in CLIENT_EXTRA):
        mods = [m for m in mods if not m.startswith("cerebro_db.client")]
    code = (
        "import sys, importlib\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        "bad = [m for m in ('tensorflow', 'keras', 'plpy', 'psycopg2') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print(len(sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert len(mods) >= 8


def _module_names(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package) for every module under ``root/package``."""
    out = {}
    for f in sorted((root / package).rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports, at module level or inside a function
    (a deferred import closes a cycle as much as any other). ``from X import name`` counts
    as importing the submodule ``X.name`` when there is one, else ``X``."""
    mods = _module_names(root, package)
    graph: dict[str, set[str]] = {}
    for mod, (path, is_pkg) in mods.items():
        here = mod.split(".") if is_pkg else mod.split(".")[:-1]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    edges.add(sub if sub in mods else target)
        graph[mod] = {e for e in edges if e in mods and e != mod}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


# Cycles that other parts of issue 12 remove; delete a line when its cycle is gone (the test
# fails then, so the list cannot go stale).
KNOWN_CYCLES: list[list[str]] = []


def test_no_import_cycles():
    """No two modules of the package import each other, directly or through others, at
    module level or deferred inside a function (the policy bases import no registry)."""
    cycles = import_cycles(import_graph(ROOT, "cerebro_db"))
    assert cycles == KNOWN_CYCLES, f"import cycles: {cycles}"


def test_import_cycle_finder_finds_deferred_and_indirect_cycles(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .base import B\n")
    (pkg / "sub" / "base.py").write_text("def f():\n    from .registry import R\n")
    (pkg / "sub" / "registry.py").write_text("from .impl import I\n")
    (pkg / "sub" / "impl.py").write_text("from . import base\nfrom ..other import x\n")
    (pkg / "other.py").write_text("import pkg.sub\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub.impl"] == {"pkg.sub.base", "pkg.other"}
    assert import_cycles(graph) == [["pkg.other", "pkg.sub", "pkg.sub.base", "pkg.sub.impl",
                                     "pkg.sub.registry"]]
    (pkg / "sub" / "base.py").write_text("def f():\n    pass\n")
    (pkg / "other.py").write_text("")
    assert import_cycles(import_graph(tmp_path, "pkg")) == []


def test_each_module_imports_alone_in_a_fresh_interpreter():
    """Every module imports first in a fresh interpreter (an import cycle at module level
    fails there, whichever module of the cycle comes first)."""
    mods = sorted(m.name for m in pkgutil.walk_packages(cerebro_db.__path__, "cerebro_db."))
    bad = [m for m in mods if subprocess.run([sys.executable, "-c", f"import {m}"], cwd=ROOT,
                                             capture_output=True, check=False).returncode]
    assert not bad, bad
