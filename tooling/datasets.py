"""Reading the real datasets the demo, tests and benchmarks use, and loading them fast.

``read_idx`` reads the original MNIST / Fashion-MNIST idx files (gzip). ``copy_payload``
turns numpy arrays into PostgreSQL's binary COPY format for a table
``(id integer, y integer, x real[])``, built with numpy in a few passes (no Python object
per pixel), so 60,000 images load in a couple of seconds.
"""
from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path
from typing import Sequence

import numpy as np

FLOAT4_OID = 700
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)

FASHION_MNIST_DIRS = (
    "/usr/share/datasets/fashion-mnist",  # Debian's dataset-fashion-mnist
)
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                   "Sneaker", "Bag", "Ankle boot")


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an idx file (optionally gzip-compressed): images -> uint8 [n, rows, cols],
    labels -> uint8 [n]."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:  # type: ignore[operator]
        data = f.read()
    magic = struct.unpack_from(">I", data)[0]
    if magic == 2051:
        n, r, c = struct.unpack_from(">III", data, 4)
        return np.frombuffer(data, np.uint8, n * r * c, 16).reshape(n, r, c)
    if magic == 2049:
        (n,) = struct.unpack_from(">I", data, 4)
        return np.frombuffer(data, np.uint8, n, 8)
    raise ValueError(f"{path}: not an idx file (magic {magic})")


REPO = Path(__file__).resolve().parent.parent
#: Small datasets committed with the repository (each folder carries its licence).
REPO_DATA = REPO / "bench" / "data"


def find_dataset_dir(name: str, extra: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """The first folder holding ``train-images-idx3-ubyte.gz`` for ``name``: ``extra``, then
    Debian's package folder (Fashion-MNIST), then ``bench/data/<name>`` in the repository.
    Nothing outside the repository and what ``make`` installs is read."""
    cands = [Path(p) for p in extra]
    if name == "fashion-mnist":
        cands += [Path(p) for p in FASHION_MNIST_DIRS]
    cands.append(REPO_DATA / name)
    for c in cands:
        if (c / "train-images-idx3-ubyte.gz").exists():
            return c
    hint = " (apt-get install dataset-fashion-mnist)" if name == "fashion-mnist" else ""
    raise FileNotFoundError(f"no {name} idx files in: " + ", ".join(map(str, cands)) + hint)


def load_split(directory: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels of ``split`` ('train' or 't10k') from an idx folder."""
    x = read_idx(directory / f"{split}-images-idx3-ubyte.gz")
    y = read_idx(directory / f"{split}-labels-idx1-ubyte.gz")
    return x, y


def copy_payload(ids: np.ndarray, labels: np.ndarray, features: np.ndarray) -> bytes:
    """Binary COPY data for rows ``(id integer, y integer, x real[])``; ``features`` is
    [n, ...] and each row's array is one-dimensional (flattened)."""
    n = len(ids)
    x = np.ascontiguousarray(features, dtype=np.float32).reshape(n, -1)
    d = x.shape[1]
    row = np.dtype([
        ("nf", ">i2"), ("l_id", ">i4"), ("id", ">i4"), ("l_y", ">i4"), ("y", ">i4"),
        ("l_x", ">i4"), ("ndim", ">i4"), ("flags", ">i4"), ("oid", ">i4"), ("dim", ">i4"),
        ("lb", ">i4"), ("elems", [("len", ">i4"), ("v", ">f4")], (d,)),
    ])
    rows = np.zeros(n, dtype=row)
    rows["nf"] = 3
    rows["l_id"] = 4
    rows["id"] = ids
    rows["l_y"] = 4
    rows["y"] = labels
    rows["l_x"] = 20 + 8 * d
    rows["ndim"] = 1
    rows["oid"] = FLOAT4_OID
    rows["dim"] = d
    rows["lb"] = 1
    rows["elems"]["len"] = 4
    rows["elems"]["v"] = x
    return _COPY_HEADER + rows.tobytes() + struct.pack(">h", -1)
