"""SQL regression tier: psql scripts in this folder, run against a fresh database each, with
their output compared to ``expected/<name>.out`` (error texts and SQLSTATEs pinned).

Set CEREBRO_UPDATE_EXPECTED=1 to rewrite the expected files after reviewing a change.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from ..helpers import ROOT, create_database, drop_database, server_params

HERE = Path(__file__).resolve().parent
SCRIPTS = sorted(HERE.glob("*.sql"))
PSQL = "/usr/lib/postgresql/15/bin/psql"

pytestmark = pytest.mark.db


def normalize(text: str) -> str:
    out = []
    for line in text.splitlines():
        if line.startswith("LOCATION:"):
            continue
        line = re.sub(r" in \d+\.\d+ s\b", " in N s", line)
        line = re.sub(r"cerebro_test_[0-9a-f]+", "cerebro_test_X", line)
        out.append(line.rstrip())
    return "\n".join(out).strip() + "\n"


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_sql_script(script: Path) -> None:
    db = create_database()
    try:
        p = server_params()
        env = dict(os.environ, PGHOST=p["host"], PGPORT=p["port"], PGUSER=p["user"],
                   PGDATABASE=db, PGOPTIONS="-c client_min_messages=notice")
        r = subprocess.run(
            [PSQL, "-X", "-a", "-q", "-v", "VERBOSITY=verbose", "-v", "SHOW_CONTEXT=never",
             "-f", str(script)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=600, check=False)
        got = normalize(r.stdout.replace(f"psql:{script}:", "psql:"))
    finally:
        drop_database(db)
    expected = HERE / "expected" / (script.stem + ".out")
    if os.environ.get("CEREBRO_UPDATE_EXPECTED"):
        expected.write_text(got)
    assert expected.exists(), f"no expected output for {script.name}; run with CEREBRO_UPDATE_EXPECTED=1"
    want = expected.read_text()
    if got != want:
        import difflib

        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                            "expected", "got"))
        pytest.fail(f"{script.name} output differs:\n{diff[:6000]}")
