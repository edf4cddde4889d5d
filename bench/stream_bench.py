"""Streaming (``use_caching`` FALSE) against cached units, in one worker-like session.

    python bench/stream_bench.py [--rows 20000] [--reps 7] [--buffers 1] [--read]

Fashion-MNIST ``--rows`` rows are packed into one partition of ``--buffers`` buffers. One
database session (a PL/Python ``DO`` block, as a worker session runs units) then times,
interleaved after two warm-up calls each, the two data paths of a unit with the worker's own
functions:

cached      ``partition_data`` (the partition decoded once and kept; each unit finds it in
            the cache) then ``training.train_unit`` / ``training.evaluate``;
streaming   ``partition_buffers`` (a :class:`~cerebro_db.training.BufferSource`: each unit
            reads its buffers from the table and decodes them again, except a buffer the
            reusable array still holds: with one buffer, after the first unit, none) then
            the same calls; with ``--read`` the array forgets what it holds before each
            unit, so every unit reads its buffers.

For an MLP 784-128-64-10 (batch 128) and a small CNN (batch 128) it reports the median
seconds of a training unit and of an evaluation unit on each path, and streaming / cached.
The issue's target: streaming within 1.15x of cached where a partition is one buffer.
Prints one JSON line per case; nothing is written to ``bench/results``.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from eval_bench import CP, cnn_json, mlp_json, q

BODY = r"""
import json, statistics, time
from cerebro_db.catalog import Catalog
from cerebro_db import training, worker
cat = Catalog(plpy, 'cerebro_db')
args = json.loads(ARGS)
training.configure_runtime(1)
cache = worker.model_cache()
table, cp, reps = args['table'], args['cp'], args['reps']
out = []
for name, arch, bs in args['cases']:
    fp = f'batch_size={bs}'
    state = [training.initial_state(arch, cp, 1)]
    seed = [0]
    def data(streaming):
        if streaming:
            src = worker.partition_buffers(cat, table, 'x', 'y', 0, cp)
            if args['read']:
                for n in set(src.rows):
                    training.stream_array((n, 784))
            return src, None
        x, y = worker.partition_data(cat, table, 'x', 'y', 0, use_caching=True)
        return x, worker.labels_for(cp, y)
    def train(streaming):
        x, y = data(streaming)
        seed[0] += 1
        state[0], _ = training.train_unit(cache, arch, cp, fp, state[0], x, y, seed[0])
    def evaluate(streaming):
        x, y = data(streaming)
        training.evaluate(cache, arch, cp, state[0], x, y, batch_size=bs)
    times = {}
    for kind, fn in (('train', train), ('eval', evaluate)):
        for s in (False, True):
            fn(s); fn(s)
        for i in range(reps):
            for s in ((False, True) if i % 2 == 0 else (True, False)):
                t0 = time.perf_counter()
                fn(s)
                times.setdefault((kind, s), []).append(time.perf_counter() - t0)
    r = {'model': name, 'batch_size': bs}
    for kind in ('train', 'eval'):
        c, s = statistics.median(times[(kind, False)]), statistics.median(times[(kind, True)])
        r[kind + '_cached_s'] = round(c, 4)
        r[kind + '_streaming_s'] = round(s, 4)
        r[kind + '_ratio'] = round(s / c, 3)
    out.append(r)
plpy.notice('RESULT ' + json.dumps(out))
"""


def setup(conn, rows: int, buffers: int) -> None:
    from tooling.datasets import copy_payload, find_dataset_dir, load_split

    x, y = load_split(find_dataset_dir("fashion-mnist"), "train")
    q(conn, "DROP TABLE IF EXISTS bench_stream_src, bench_stream_p, bench_stream_p_summary")
    q(conn, "CREATE TABLE bench_stream_src (id integer, y integer, x real[])")
    with conn.cursor() as cur:
        cur.copy_expert("COPY bench_stream_src FROM STDIN (FORMAT binary)", io.BytesIO(
            copy_payload(np.arange(rows), y[:rows].astype(np.int32), x[:rows])))
    q(conn, "SELECT training_preprocessor_dl('bench_stream_src', 'bench_stream_p', 'y', 'x', "
            "%s, 255.0, NULL, NULL, 1, 1)", (-(-rows // buffers),))
    q(conn, "ANALYZE bench_stream_p")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--buffers", type=int, default=1)
    ap.add_argument("--read", action="store_true", help="every streamed unit reads its buffers")
    a = ap.parse_args()
    from common import connect

    conn = connect()
    setup(conn, a.rows, a.buffers)
    n = q(conn, "SELECT count(*) FROM bench_stream_p")[0][0]
    args = {"table": "bench_stream_p", "cp": CP, "reps": a.reps,
            "read": a.read,
            "cases": [["MLP 784-128-64-10", mlp_json(), 128],
                      ["CNN conv8-conv16-dense10", cnn_json(), 128]]}
    body = BODY.replace("json.loads(ARGS)", f"json.loads({json.dumps(args)!r})")
    conn.notices.clear()
    q(conn, "DO $bench$" + body + "$bench$ LANGUAGE plpython3u")
    for line in conn.notices:
        if "RESULT " in line:
            for r in json.loads(line.split("RESULT ", 1)[1]):
                print(json.dumps({"rows": a.rows, "buffers": n, "read": a.read, **r}),
                      flush=True)
    q(conn, "DROP TABLE IF EXISTS bench_stream_src, bench_stream_p, bench_stream_p_summary")


if __name__ == "__main__":
    main()
