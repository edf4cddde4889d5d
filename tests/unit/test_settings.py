"""cerebro_db.settings: the known setting names and the warning for unknown ones."""
from __future__ import annotations

import ast
from pathlib import Path

from cerebro_db import settings

PACKAGE = Path(settings.__file__).resolve().parent


def _setting_literals() -> set[str]:
    """Every ``cerebro_db.<name>`` string the package passes to ``setting`` or assigns to a
    ``*_SETTING`` constant (the names it reads)."""
    found = set()
    for f in PACKAGE.rglob("*.py"):
        if f.name == "settings.py":
            continue
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and any(isinstance(t, ast.Name) and t.id.endswith("_SETTING")
                            for t in node.targets):
                found.add(node.value.value)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "setting" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                found.add(node.args[0].value)
    return {v for v in found if isinstance(v, str) and v.startswith(settings.PREFIX)}


def test_known_names_are_the_ones_the_package_reads():
    read = _setting_literals()
    assert len(read) >= 15
    assert read == settings.KNOWN


def test_unknown_names_are_warned_with_the_closest_known_one():
    out = settings.unknown_settings(["cerebro_db.eval_bundel", "cerebro_db.eval_bundle",
                                     "work_mem", "cerebro_db.zzz", "cerebro_db.eval_bundel"])
    tail = "cerebro_db reads no such setting, so it has no effect"
    assert out == [
        (f'unrecognized configuration parameter "cerebro_db.eval_bundel": {tail}; '
         f'did you mean "cerebro_db.eval_bundle"?'),
        f'unrecognized configuration parameter "cerebro_db.zzz": {tail}',
    ]
    assert settings.unknown_settings(sorted(settings.KNOWN)) == []
