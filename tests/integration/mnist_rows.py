"""Fashion-MNIST rows (Debian's dataset-fashion-mnist, installed by the set-up) as SQL tables
for the integration tests (one helper, used by every module)."""
from __future__ import annotations

import io

import numpy as np

from tooling.datasets import copy_payload, find_dataset_dir, load_split


def load_mnist_rows(conn, *tables: tuple[str, int, int]) -> None:
    """(Re)create each ``(name, lo, hi)`` as ``(id integer, y integer, x real[])`` holding
    Fashion-MNIST training rows ``lo .. hi-1``, by binary COPY."""
    x, y = load_split(find_dataset_dir("fashion-mnist"), "train")
    with conn.cursor() as cur:
        for name, lo, hi in tables:
            cur.execute(f"DROP TABLE IF EXISTS {name}")
            cur.execute(f"CREATE TABLE {name} (id integer, y integer, x real[])")
            cur.copy_expert(f"COPY {name} FROM STDIN (FORMAT binary)",
                            io.BytesIO(copy_payload(np.arange(lo, hi),
                                                    y[lo:hi].astype(np.int32), x[lo:hi])))
