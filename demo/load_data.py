"""Load Fashion-MNIST (from Debian's dataset-fashion-mnist) into PostgreSQL tables.

    python demo/load_data.py [--rows N] [--test-rows N] [--prefix fashion]

Creates ``<prefix>_train`` and ``<prefix>_test`` as ``(id integer, y integer, x real[])``,
pixels 0..255 flattened to 784 values, replacing tables of those names.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import time

import numpy as np
import psycopg2
from psycopg2 import sql

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tooling.datasets import copy_payload, find_dataset_dir, load_split


def load_table(conn, name: str, x: np.ndarray, y: np.ndarray) -> None:
    ident = sql.Identifier(name)
    with conn.cursor() as cur:
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident))
        cur.execute(sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY, y integer, x real[])")
                    .format(ident))
        payload = copy_payload(np.arange(len(y)), y.astype(np.int32), x)
        cur.copy_expert(sql.SQL("COPY {} FROM STDIN (FORMAT binary)").format(ident).as_string(conn),
                        io.BytesIO(payload))
        cur.execute(sql.SQL("ANALYZE {}").format(ident))
    conn.commit()


def _count(conn, table: str) -> int | None:
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))
        if not cur.fetchone()[0]:
            return None
        cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        return cur.fetchone()[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=60000)
    ap.add_argument("--test-rows", type=int, default=10000)
    ap.add_argument("--prefix", default="fashion")
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--dsn", default="")
    ap.add_argument("--if-missing", action="store_true",
                    help="do nothing when both tables already hold the requested rows")
    args = ap.parse_args()
    d = find_dataset_dir(args.dataset)
    conn = psycopg2.connect(args.dsn)
    if args.if_missing and all(
            _count(conn, f"{args.prefix}_{s}") == n
            for s, n in (("train", args.rows), ("test", args.test_rows))):
        print(f"{args.prefix}_train and {args.prefix}_test are already loaded")
        return
    t0 = time.monotonic()
    for split, table, n in (("train", f"{args.prefix}_train", args.rows),
                            ("t10k", f"{args.prefix}_test", args.test_rows)):
        x, y = load_split(d, split)
        load_table(conn, table, x[:n], y[:n])
    print(f"loaded {args.rows} + {args.test_rows} {args.dataset} rows from {d} "
          f"in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
