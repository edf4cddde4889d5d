"""Data and connection for the outside harness (see README.md here)."""
import gzip
import os

import numpy as np

D = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")  # Debian's package


def idx(name):
    with gzip.open(f'{D}/{name}', 'rb') as f:
        b = f.read()
    nd = b[3]
    dims = [int.from_bytes(b[4+4*i:8+4*i], 'big') for i in range(nd)]
    return np.frombuffer(b, np.uint8, offset=4+4*nd).reshape(dims)


def load():
    xtr = idx('train-images-idx3-ubyte.gz').reshape(-1, 784).astype(np.float32) / 255.0
    ytr = idx('train-labels-idx1-ubyte.gz').astype(np.int64)
    xte = idx('t10k-images-idx3-ubyte.gz').reshape(-1, 784).astype(np.float32) / 255.0
    yte = idx('t10k-labels-idx1-ubyte.gz').astype(np.int64)
    return xtr, ytr, xte, yte


# the server `scripts/cerebro.sh env` names (run.sh exports it); the database run.sh makes
CONN = {"host": os.environ["PGHOST"], "port": int(os.environ["PGPORT"]), "user": "postgres",
            "dbname": os.environ.get("OUTSIDE_DB", "cerebro_outside")}
