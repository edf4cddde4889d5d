"""What the benchmarks share: a connection to the embedded server."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


BENCH_DB = "cerebro_bench"
"""The benchmarks' database (the Makefile's ``BENCH_DB``); ``CEREBRO_BENCH_DB`` names another."""

_ready: set[str] = set()


def _env() -> dict[str, str]:
    out = subprocess.run([str(ROOT / "scripts" / "cerebro.sh"), "env"], capture_output=True,
                         text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.split())


def connect():
    """An autocommit psycopg2 connection to the embedded server (``make start``), database
    ``CEREBRO_BENCH_DB`` or :data:`BENCH_DB`; the first call of a process creates it with the
    extension at this checkout's version, or updates it (``scripts/cerebro.sh createdb``)."""
    import psycopg2

    env = _env()
    db = os.environ.get("CEREBRO_BENCH_DB") or BENCH_DB
    if db not in _ready:
        subprocess.run([str(ROOT / "scripts" / "cerebro.sh"), "createdb", db], check=True)
        _ready.add(db)
    # the private cluster's superuser, which keeps its idle worker sessions between fits
    # (the second fit of a session) only when it opts in; an ordinary role keeps them
    c = psycopg2.connect(host=env["PGHOST"], port=env["PGPORT"], user=env["PGUSER"], dbname=db,
                         options="-c cerebro_db.keep_workers_as_maintainer=on")
    c.autocommit = True
    return c
