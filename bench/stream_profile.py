"""Where a streamed unit's read of a packed buffer goes, step by step, in one backend.

    python bench/stream_profile.py [--reps 5]

Uses eval_bench's table (full Fashion-MNIST, 60,000 training rows packed as one partition of
one buffer: 188 MB of float32 features stored EXTERNAL, uncompressed) and times, inside one
PL/Python function (what a worker session runs), medians of ``--reps`` after a warm-up:

* the metadata queries of a streamed unit (``buffer_rows``, ``_buffers`` with the labels)
  and the labels' decode;
* per slice size: the backend alone (``octet_length(substr(x, ...))``: TOAST chunk fetches
  and the slice's copy, no value returned), plus PL/Python's bytea -> Python bytes
  conversion, plus the copy into the reusable stream array;
* the worker's own read (``_read_features``) and a streamed buffer's ``load`` when the
  stream array must read it and when it still holds it;
* a plain memcpy of the buffer's size (the floor of any copy).

Prints a JSON object of seconds; nothing is written to ``bench/results``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

BODY = r'''
import json, statistics, time
import numpy as np
from cerebro_db.catalog import Catalog
from cerebro_db import training, worker
from cerebro_db.names import TableName
a = json.loads(spec)
training.configure_runtime(1)
cat = Catalog(plpy, a["schema"])
table = a["table"]
t = TableName.parse(table, "table")
meta = worker._buffers(cat, t, "x", "y", 0)[0]
n = int(meta["xn"])
shape = [int(d) for d in meta["xs"]]
cp = "loss='sparse_categorical_crossentropy', optimizer='SGD()'"
res = {"buffer_bytes": n, "rows": shape[0]}

def timeit(name, f):
    f()
    v = []
    for _ in range(a["reps"]):
        t0 = time.perf_counter()
        f()
        v.append(time.perf_counter() - t0)
    res[name] = round(statistics.median(v), 4)

timeit("buffer_rows query", lambda: worker.partition_buffers(cat, table, "x", "y", 0, cp))
timeit("_buffers query (labels included)", lambda: worker._buffers(cat, t, "x", "y", 0, 0))
timeit("labels decode + labels_for (sparse)",
       lambda: worker.labels_for(cp, worker._labels(meta)))
out = training.stream_array(shape)
dst = out.reshape(-1).view(np.uint8)
q_len = plpy.prepare(f"SELECT octet_length(substr(x, $1, $2)) AS s FROM {t.sql} "
                     "WHERE __dist_key__ = 0 AND buffer_id = 0", ["int4", "int4"])
q_get = plpy.prepare(f"SELECT substr(x, $1, $2) AS s FROM {t.sql} "
                     "WHERE __dist_key__ = 0 AND buffer_id = 0", ["int4", "int4"])
for sl in a["slices"]:
    def backend():
        for off in range(0, n, sl):
            plpy.execute(q_len, [off + 1, min(sl, n - off)])
    def to_bytes():
        for off in range(0, n, sl):
            plpy.execute(q_get, [off + 1, min(sl, n - off)])[0]["s"]
    def to_array():
        for off in range(0, n, sl):
            k = min(sl, n - off)
            dst[off:off + k] = np.frombuffer(plpy.execute(q_get, [off + 1, k])[0]["s"], np.uint8)
    kb = f"{sl // 1024} kB slices"
    timeit(f"{kb}: backend only", backend)
    timeit(f"{kb}: + bytes to Python", to_bytes)
    timeit(f"{kb}: + copy into the array", to_array)
timeit(f"_read_features ({worker.READ_SLICE // 1024} kB slices)",
       lambda: worker._read_features(cat, t, "x", 0, meta, out))
def load_read():
    training.stream_array(shape)  # forget what the array holds: the load reads
    worker.partition_buffers(cat, table, "x", "y", 0, cp).load(0)
timeit("streamed load, buffer read", load_read)
if hasattr(training, "stream_holding"):
    timeit("streamed load, buffer held",
           lambda: worker.partition_buffers(cat, table, "x", "y", 0, cp).load(0))
src = np.ones(n, np.uint8)
def memcpy():
    dst[:] = src
timeit("memcpy of the buffer's size", memcpy)
return json.dumps(res)
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    from common import connect
    from eval_bench import q, setup

    conn = connect()
    setup(conn)
    schema = q(conn, "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n "
                     "ON n.oid = e.extnamespace WHERE e.extname = 'cerebro_db'")[0][0]
    q(conn, "CREATE FUNCTION pg_temp.cerebro_stream_profile(spec text) RETURNS text "
            "LANGUAGE plpython3u AS $body$" + BODY + "$body$")
    spec = {"schema": schema, "table": "evb_train_p", "reps": args.reps,
            "slices": [64 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20]}
    res = q(conn, "SELECT pg_temp.cerebro_stream_profile(%s)", (json.dumps(spec),))[0][0]
    print(json.dumps(json.loads(res), indent=1))


if __name__ == "__main__":
    main()
