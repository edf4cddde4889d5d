"""docs/architecture.md layering rule 1: the package imports without a database, plpy or TensorFlow."""
from __future__ import annotations

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
