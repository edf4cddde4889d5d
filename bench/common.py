"""What the benchmarks share: a connection to the embedded server."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def connect():
    """An autocommit psycopg2 connection to the embedded server (database: the demo's,
    or CEREBRO_BENCH_DB)."""
    import psycopg2

    env = dict(line.split("=", 1) for line in subprocess.run(
        [str(ROOT / "scripts" / "cerebro.sh"), "env"], capture_output=True, text=True,
        check=True).stdout.split())
    c = psycopg2.connect(host=env["PGHOST"], port=env["PGPORT"], user=env["PGUSER"],
                         dbname=os.environ.get("CEREBRO_BENCH_DB", env["PGDATABASE"]))
    c.autocommit = True
    return c
