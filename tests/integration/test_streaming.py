"""use_caching FALSE: worker units read a partition one packed buffer at a time."""
from __future__ import annotations

import pytest

from ..helpers import load_mnist_rows, q

pytestmark = pytest.mark.db


@pytest.fixture(scope="module")
def packed(session_conn):
    """1,200 MNIST rows packed twice over 2 partitions: one buffer per partition (st_p1) and
    150-row buffers (st_p4: 4 per partition); 400 validation rows; 2 configs."""
    import keras

    conn = session_conn
    load_mnist_rows(conn, *(("st_train", 0, 1200), ("st_test", 1200, 1600)))
    q(conn, "DROP TABLE IF EXISTS st_p1, st_p1_summary, st_p4, st_p4_summary, st_v1, "
            "st_v1_summary, st_v4, st_v4_summary, st_arch, st_mst, st_mst_summary")
    for suffix, size in (("1", None), ("4", 150)):
        q(conn, f"SELECT training_preprocessor_dl('st_train', 'st_p{suffix}', 'y', 'x', %s, "
                "255.0, NULL, NULL, 2, 3)", (size,))
        q(conn, f"SELECT validation_preprocessor_dl('st_test', 'st_v{suffix}', 'y', 'x', "
                f"'st_p{suffix}', %s)", (size,))
    arch = keras.Sequential([keras.Input((784,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dropout(0.2),
                             keras.layers.Dense(10, activation="softmax")]).to_json()
    q(conn, "SELECT load_keras_model('st_arch', %s)", (arch,))
    q(conn, "SELECT load_model_selection_table('st_arch', 'st_mst', ARRAY[1], %s, %s)",
      ([("loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
        "metrics=['accuracy']"),
        ("loss='sparse_categorical_crossentropy', optimizer='SGD(learning_rate=0.1)', "
        "metrics=['sparse_categorical_accuracy']")],
       ["batch_size=32, epochs=2"]))
    assert q(conn, "SELECT __dist_key__, count(*) FROM st_p4 GROUP BY 1 ORDER BY 1") == \
        [(0, 4), (1, 4)]
    return conn


def fit(conn, source, validation, out, caching, iterations=2):
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary")
    q(conn, "SELECT madlib_keras_fit_multiple_model(%s, %s, 'st_mst', %s, FALSE, %s, 1, FALSE, "
            "NULL, NULL, %s, 'mop', NULL, 11)", (source, out, iterations, validation, caching))
    return q(conn, f"SELECT mst_key, training_loss, validation_loss, validation_metrics_final "
                   f"FROM {out}_info ORDER BY 1")


def test_one_buffer_per_partition_streams_to_the_same_models(packed):
    conn = packed
    cached = fit(conn, "st_p1", "st_v1", "st_c", True, iterations=1)
    streamed = fit(conn, "st_p1", "st_v1", "st_s", False, iterations=1)
    assert streamed == cached
    assert q(conn, "SELECT mst_key, model_weights FROM st_s ORDER BY 1") == \
        q(conn, "SELECT mst_key, model_weights FROM st_c ORDER BY 1")


def test_several_buffers_per_partition_train(packed):
    conn = packed
    info = fit(conn, "st_p4", "st_v4", "st_s4", False)
    for _, train_loss, valid_loss, valid_metric in info:
        assert len(train_loss) == 2 and train_loss[-1] < train_loss[0]
        assert valid_loss[-1] < valid_loss[0] and valid_metric > 0.6
    fit_id = q(conn, "SELECT max(fit_id) FROM cerebro_db.fits WHERE model_output_table = "
                     "'st_s4'")[0][0]
    per_partition = q(conn, "SELECT DISTINCT partition, rows FROM cerebro_db.units "
                            "WHERE fit_id = %s AND kind = 'train' ORDER BY 1", (fit_id,))
    sizes = q(conn, "SELECT __dist_key__, sum(x_shape[1])::int FROM st_p4 GROUP BY 1 ORDER BY 1")
    assert per_partition == sizes and sum(s for _, s in sizes) == 1200


READ_CHECK = r"""
import json
import numpy as np
from cerebro_db import training, worker
from cerebro_db.catalog import Catalog
cat = Catalog(plpy, "cerebro_db")
out = {}
for table in ("st_p1", "st_p4", "st_pz"):
    for part in (0, 1):
        rows = plpy.execute(f"SELECT x, x_shape, y, y_shape FROM {table} "
                            f"WHERE __dist_key__ = {part} ORDER BY buffer_id")
        ref = [training.decode_buffer(r["x"], r["x_shape"], r["y"], r["y_shape"]) for r in rows]
        want_x = np.concatenate([a for a, _ in ref])
        want_y = np.concatenate([b for _, b in ref])
        for step in (1000, 7 * 1024 + 3, 1 << 20):
            worker.READ_SLICE = step
            x, y = worker.partition_data(cat, table, "x", "y", part, use_caching=False)
            assert x.ctypes.data % 64 == 0 and x.flags.writeable
            assert x.tobytes() == want_x.tobytes() and y.tobytes() == want_y.tobytes(), \
                (table, part, step)
            src = worker.partition_buffers(cat, table, "x", "y", part,
                                          "loss='mse', optimizer='SGD()'")
            got = []
            for i in range(len(src.rows)):  # one reusable array per shape: copy each buffer
                a, _ = src.load(i)
                assert a.ctypes.data % 64 == 0 and a is training.stream_array(a.shape)
                got.append(a.copy())
            assert np.concatenate(got).tobytes() == want_x.tobytes()
        out[f"{table}/{part}"] = [len(rows), int(x.shape[0])]
out["compressed"] = plpy.execute("SELECT count(*) AS n FROM st_pz "
                                 "WHERE pg_column_compression(x) IS NOT NULL")[0]["n"]
return json.dumps(out)
"""


def test_sliced_reads_decode_exactly(packed):
    """Buffers read in slices straight into aligned arrays are the stored bytes, whatever the
    slice size, for one and several buffers per partition and for compressed values."""
    conn = packed
    q(conn, "DROP TABLE IF EXISTS st_pz")
    q(conn, "CREATE TABLE st_pz (LIKE st_p4)")
    q(conn, "ALTER TABLE st_pz ALTER COLUMN x SET COMPRESSION pglz")
    # all-zero features compress: these values are stored compressed (read whole)
    q(conn, "INSERT INTO st_pz (__dist_key__, buffer_id, x, x_shape, y, y_shape) "
            "SELECT __dist_key__, buffer_id, decode(repeat('00', length(x)), 'hex'), x_shape, "
            "y, y_shape FROM st_p4")
    q(conn, "CREATE FUNCTION pg_temp.read_check() RETURNS text LANGUAGE plpython3u AS $f$"
            + READ_CHECK + "$f$")
    import json

    res = json.loads(q(conn, "SELECT pg_temp.read_check()")[0][0])
    assert res["st_p1/0"][0] == 1 and res["st_p4/0"][0] == 4 and res["compressed"] == 8
    assert res["st_p1/0"][1] + res["st_p1/1"][1] == 1200
    q(conn, "DROP TABLE st_pz")


REUSE_CHECK = r"""
import json
import numpy as np
from cerebro_db import training, worker
from cerebro_db.catalog import Catalog
cat = Catalog(plpy, "cerebro_db")
toast = plpy.execute("SELECT reltoastrelid AS t FROM pg_class "
                     "WHERE oid = 'st_pr'::regclass")[0]["t"]
def fetched():
    return plpy.execute(f"SELECT pg_stat_get_xact_blocks_fetched({toast}) AS n")[0]["n"]
def load(part):
    n = fetched()
    src = worker.partition_buffers(cat, "st_pr", "x", "y", part, "loss='mse', optimizer='SGD()'")
    x, _ = src.load(0)
    return x.tobytes(), fetched() - n
def stored(part):
    return plpy.execute(f"SELECT x FROM st_pr WHERE __dist_key__ = {part}")[0]["x"]
out = []
a0, n0 = load(0)
b0, m0 = load(0)                  # the array still holds partition 0: not read again
a1, n1 = load(1)                  # same shape, another buffer: read into the same array
c0, k0 = load(0)                  # partition 0 again: read again
out.append([a0 == b0 == c0 == bytes(stored(0)), a1 == bytes(stored(1)), a0 != a1])
out.append([n0 > 0, m0, n1 > 0, k0 > 0])
plpy.execute("UPDATE st_pr SET x = decode(repeat('00', length(x)), 'hex') "
             "WHERE __dist_key__ = 0")  # the same bytes' length, a new row version
z, nz = load(0)
out.append([z == bytes(stored(0)), z == bytes(len(z)), nz > 0])
return json.dumps(out)
"""


def test_streaming_reads_a_buffer_the_array_holds_only_when_it_changed(packed):
    """A streamed buffer that the reusable array still holds (the same stored row version)
    is not read again; another buffer of the same shape, or the same buffer changed, is."""
    conn = packed
    q(conn, "DROP TABLE IF EXISTS st_pr")
    q(conn, "CREATE TABLE st_pr (LIKE st_p1)")
    q(conn, "ALTER TABLE st_pr ALTER COLUMN x SET STORAGE EXTERNAL")
    q(conn, "INSERT INTO st_pr SELECT * FROM st_p1")
    assert q(conn, "SELECT count(DISTINCT x_shape) FROM st_pr") == [(1,)]  # one shape
    q(conn, "CREATE FUNCTION pg_temp.reuse_check() RETURNS text LANGUAGE plpython3u AS $f$"
            + REUSE_CHECK + "$f$")
    import json

    same, reads, changed = json.loads(q(conn, "SELECT pg_temp.reuse_check()")[0][0])
    assert same == [True, True, True]
    assert reads == [True, 0, True, True]
    assert changed == [True, True, True]
    q(conn, "DROP TABLE st_pr")


OVERLAP_CHECK = r"""
import json
from cerebro_db import training, worker
from cerebro_db.catalog import Catalog
cat = Catalog(plpy, "cerebro_db")
arch, cp = json.loads(spec)
cache = worker.model_cache()
state = training.initial_state(arch, cp, 1)
worker.READ_SLICE = 4096  # a 600-row buffer arrives in about 460 slices
out = []
for table in ("st_p1", "st_p4", "st_v1"):
    for part in (0, 1):
        x, y = worker.partition_data(cat, table, "x", "y", part, use_caching=False)
        res = [training.evaluate(cache, arch, cp, state, x, worker.labels_for(cp, y),
                                 batch_size=16)]
        for overlap in (True, False):
            src = worker.partition_buffers(cat, table, "x", "y", part, cp, overlap=overlap)
            for shape in {(n, 784) for n in src.rows}:
                training.stream_array(shape)  # forget what the array holds: read it
            res.append(training.evaluate(cache, arch, cp, state, src, None, batch_size=16))
            assert (src.load_rows is not None) == overlap
        out.append([[r.loss, r.metrics, r.rows] for r in res])
return json.dumps(out)
"""


def test_evaluation_overlapped_with_the_read_gives_the_values_of_the_arrays(packed):
    """A streamed evaluation that evaluates the rows read while the rest of each buffer is
    read (``overlap``, which a worker uses where the fit leaves a core free) gives bitwise
    the loss and metrics of the plain streamed evaluation, and with one buffer per
    partition those of the partition's arrays."""
    import json

    import keras

    conn = packed
    arch = keras.Sequential([keras.Input((784,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")]).to_json()
    cp = "loss='categorical_crossentropy', optimizer='SGD()', metrics=['accuracy']"
    q(conn, "CREATE FUNCTION pg_temp.overlap_check(spec text) RETURNS text "
            "LANGUAGE plpython3u AS $f$" + OVERLAP_CHECK + "$f$")
    got = json.loads(q(conn, "SELECT pg_temp.overlap_check(%s)",
                       (json.dumps([arch, cp]),))[0][0])
    assert len(got) == 6
    for i, (arrays, overlapped, plain) in enumerate(got):
        assert overlapped == plain and plain[2] == arrays[2] > 0
        if i in (2, 3):  # several buffers: batches end at each buffer's end (not bitwise)
            assert plain[0] == pytest.approx(arrays[0], rel=1e-5)
        else:
            assert plain == arrays


BUDGET_CHECK = r"""
import json
from cerebro_db import training, worker
from cerebro_db.catalog import Catalog
cat = Catalog(plpy, "cerebro_db")
worker._partitions.clear()
cp = "loss='categorical_crossentropy', optimizer='SGD()'"
base = {"x": "x", "y": "y", "use_caching": None, "num_workers": 2}
size = 600 * 784 * 4 + 600 * 10 * 4  # one partition of st_p1, decoded
kinds = []
def kind(fopts, table, part):
    x, y = worker.unit_data(cat, fopts, table, part, cp)
    return "arrays" if y is not None else type(x).__name__
kinds.append(kind({**base, "cache_memory": 1024}, "st_p1", 0))       # too small: stream
kinds.append(len(worker._partitions))
kinds.append(kind({**base, "cache_memory": 2 * size}, "st_p1", 0))   # fits: cached
kinds.append(kind({**base, "cache_memory": 2 * size}, "st_p1", 1))   # both fit
kinds.append(len(worker._partitions))
kinds.append(kind({**base, "cache_memory": size + 100}, "st_v1", 0))  # evicts the oldest
kinds.append(sorted(k[-1] for k in worker._partitions))
kinds.append(kind({**base, "use_caching": False}, "st_p1", 1))       # FALSE: never cached
kinds.append(kind({**base, "use_caching": True}, "st_p1", 1))
kinds.append(kind({**base}, "st_p1", 1))  # no budget recorded: the machine's default
worker._partitions.clear()
return json.dumps(kinds)
"""


def test_use_caching_null_caches_within_the_budget(packed):
    conn = packed
    q(conn, "CREATE OR REPLACE FUNCTION pg_temp.budget_check() RETURNS text "
            "LANGUAGE plpython3u AS $f$" + BUDGET_CHECK + "$f$")
    import json

    got = json.loads(q(conn, "SELECT pg_temp.budget_check()")[0][0])
    assert got[0] == "BufferSource" and got[1] == 0
    assert got[2:5] == ["arrays", "arrays", 2]
    assert got[5] == "arrays" and len(got[6]) == 1  # only the newest stays
    assert got[7:] == ["BufferSource", "arrays", "arrays"]


def test_use_caching_null_is_the_default_and_gives_the_same_models(packed):
    """Left NULL (the default) with room, or with a budget too small for any partition
    (streaming everything), a fit gives bitwise the models of use_caching TRUE."""
    conn = packed
    cached = fit(conn, "st_p1", "st_v1", "st_c", True, iterations=1)
    q(conn, "DROP TABLE IF EXISTS st_d, st_d_info, st_d_summary")
    q(conn, "SELECT madlib_keras_fit_multiple_model('st_p1', 'st_d', 'st_mst', 1, FALSE, "
            "'st_v1', 1, random_state => 11)")
    fit_id = q(conn, "SELECT max(fit_id) FROM cerebro_db.fits WHERE model_output_table = "
                     "'st_d'")[0][0]
    opts = q(conn, "SELECT options->'use_caching', (options->>'cache_memory')::int8 FROM "
                   "cerebro_db.fits WHERE fit_id = %s", (fit_id,))[0]
    assert opts[0] is None and opts[1] > 1 << 20
    q(conn, "SET cerebro_db.cache_memory = '1kB'")
    try:
        tiny = fit(conn, "st_p1", "st_v1", "st_t", None, iterations=1)
    finally:
        q(conn, "RESET cerebro_db.cache_memory")
    fit_id = q(conn, "SELECT max(fit_id) FROM cerebro_db.fits WHERE model_output_table = "
                     "'st_t'")[0][0]
    assert q(conn, "SELECT (options->>'cache_memory')::int8 FROM cerebro_db.fits WHERE "
                   "fit_id = %s", (fit_id,))[0][0] == 1024
    default = q(conn, "SELECT mst_key, training_loss, validation_loss, validation_metrics_final "
                      "FROM st_d_info ORDER BY 1")
    assert default == cached == tiny
    weights = q(conn, "SELECT mst_key, model_weights FROM st_c ORDER BY 1")
    assert q(conn, "SELECT mst_key, model_weights FROM st_d ORDER BY 1") == weights
    assert q(conn, "SELECT mst_key, model_weights FROM st_t ORDER BY 1") == weights


def test_bad_cache_memory_setting_fails_before_any_work(packed):
    import psycopg2

    conn = packed
    q(conn, "DROP TABLE IF EXISTS st_bad, st_bad_info, st_bad_summary")
    q(conn, "SET cerebro_db.cache_memory = 'lots'")
    try:
        with pytest.raises(psycopg2.Error) as e:
            q(conn, "SELECT madlib_keras_fit_multiple_model('st_p1', 'st_bad', 'st_mst', 1)")
    finally:
        q(conn, "RESET cerebro_db.cache_memory")
    assert e.value.pgcode == "22023" and "cerebro_db.cache_memory" in str(e.value)
    assert q(conn, "SELECT to_regclass('st_bad'), to_regclass('st_bad_summary')") == \
        [(None, None)]


DROP_CHECK = r"""
import json
from cerebro_db import training, worker
from cerebro_db.catalog import Catalog
cat = Catalog(plpy, "cerebro_db")
cp = "loss='mse', optimizer='SGD()'"
worker._partitions.clear()
def stream(table, part):
    src = worker.partition_buffers(cat, table, "x", "y", part, cp)
    for i in range(len(src.rows)):
        src.load(i)
def held():
    return sorted(k[0] for k in training._STREAM_HOLDS if k[1:] == (784,))
out = []
stream("st_p1", 0); stream("st_p4", 0)
out.append(held())
worker.partition_data(cat, "st_p1", "x", "y", 1, use_caching=True)  # other buffers
out.append(held())
worker.partition_data(cat, "st_p1", "x", "y", 0, use_caching=True)  # the one streamed
out.append(held())
worker.partition_data(cat, "st_p4", "x", "y", 0, budget=1 << 30)  # NULL: all 4 buffers
out.append(held())
worker._partitions.clear()
return json.dumps(out)
"""


def test_caching_a_partition_releases_the_stream_arrays_that_hold_its_buffers(packed):
    """A worker that caches a partition whose buffers a stream array still holds (e.g.
    streamed by an earlier fit of the session with use_caching FALSE) releases that array:
    the data is then held once. Arrays holding other buffers stay."""
    import json

    conn = packed
    q(conn, "CREATE FUNCTION pg_temp.drop_check() RETURNS text LANGUAGE plpython3u AS $f$"
            + DROP_CHECK + "$f$")
    rows1 = q(conn, "SELECT x_shape[1] FROM st_p1 WHERE __dist_key__ = 0")[0][0]
    rows4 = q(conn, "SELECT max(x_shape[1]) FROM st_p4 WHERE __dist_key__ = 0")[0][0]
    assert rows1 != rows4
    got = json.loads(q(conn, "SELECT pg_temp.drop_check()")[0][0])
    mine = [sorted(set(g) & {rows1, rows4}) for g in got]  # other tests' arrays aside
    assert mine == [sorted([rows1, rows4]), sorted([rows1, rows4]), [rows4], []]
