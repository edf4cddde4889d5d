"""MADlib scripts with Keras 2 parameters: ``decay``, ``epsilon=None``,
integer learning rates in grids, ``sample_weight_mode``, ``initial_epoch`` /
``steps_per_epoch`` and ``fit_params`` NULL run unchanged on the real server."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ..helpers import ROOT, q, server_params

pytestmark = pytest.mark.db

GRID = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': ["
        "{'optimizer': ['SGD'], 'lr': [0.0001, 0.1, 1], 'decay': [0.05], 'nesterov': [True],"
        " 'momentum': [0.9]},"
        "{'optimizer': ['Adam'], 'lr': [0.01], 'epsilon': [None]}],"
        " 'metrics': ['accuracy'], 'sample_weight_mode': [None]}")
FIT_GRID = "{'batch_size': [8], 'epochs': [2], 'initial_epoch': [1]}"

REPLAY = textwrap.dedent("""
    import json, sys
    import numpy as np
    import psycopg2
    from cerebro_db import training, state
    from cerebro_db.worker import unit_seed
    training.configure_runtime(1)
    dsn, fit_id, packed, out_table = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    conn = psycopg2.connect(dsn)
    cur = conn.cursor()
    cur.execute("SELECT random_state FROM madlib.fits WHERE fit_id = %s", (fit_id,))
    seed = cur.fetchone()[0]
    cur.execute("SELECT __dist_key__, attributes, attributes_shape, class_text, "
                f"class_text_shape FROM {packed} ORDER BY buffer_id")
    parts = {}
    for k, xb, xs, yb, ys in cur.fetchall():
        parts.setdefault(k, []).append(training.decode_buffer(bytes(xb), xs, bytes(yb), ys))
    data = {k: (np.concatenate([a for a, _ in v]), np.concatenate([b for _, b in v]))
            for k, v in parts.items()}
    cur.execute("SELECT mst_key, compile_params, fit_params, model_arch::text FROM "
                "madlib.fit_configs WHERE fit_id = %s", (fit_id,))
    out = {}
    for mst, cp, fp, arch in cur.fetchall():
        cur.execute("SELECT epoch, partition FROM madlib.units WHERE fit_id = %s AND "
                    "mst_key = %s AND kind = 'train' ORDER BY started_at", (fit_id, mst))
        visits = cur.fetchall()
        init = training.initial_state(arch, cp, unit_seed(seed, mst, 0, 0, 1))
        units = [(*data[p], unit_seed(seed, mst, e, p)) for e, p in visits]
        final = state.decode_state(training.replay(arch, cp, fp, init, units))
        cur.execute(f"SELECT model_weights FROM {out_table} WHERE mst_key = %s", (mst,))
        stored = np.frombuffer(bytes(cur.fetchone()[0]), "<f4")
        mine = np.concatenate([np.asarray(w, "<f4").ravel() for w in final.weights])
        out[mst] = [len(visits), bool(np.array_equal(stored, mine)),
                    int(final.optimizer_vars[0])]
    print(json.dumps(out))
""")


def test_keras2_grid_trains_and_replays(madlib_conn):
    """The grid MADlib users write (Keras 2 decay, integer lr, epsilon=None,
    sample_weight_mode, initial_epoch) trains by model hopping; every configuration's weights
    equal a one-process replay of its visit order (the decay schedule is rebuilt from
    compile_params on every worker, its step count travels with the state)."""
    c = madlib_conn
    q(c, "SELECT madlib.generate_model_configs('model_arch_library', 'k2_mst', ARRAY[1], "
         "%s, %s)", (GRID, FIT_GRID))
    rows = q(c, "SELECT mst_key, compile_params, fit_params FROM k2_mst ORDER BY mst_key")
    assert len(rows) == 4
    assert "SGD(lr=1,decay=0.05" in rows[2][1] and "epsilon=None" in rows[3][1]
    q(c, "SELECT madlib.madlib_keras_fit_multiple_model('iris_packed', 'k2_out', 'k2_mst', 2, "
         "FALSE, 'iris_val', 1, FALSE, NULL, NULL, TRUE, 'mop', NULL, 11)")
    info = q(c, "SELECT mst_key, array_length(training_loss, 1), validation_loss_final "
                "FROM k2_out_info ORDER BY mst_key")
    assert [r[:2] for r in info] == [(k, 2) for k in (1, 2, 3, 4)]
    assert all(np.isfinite(r[2]) for r in info if r[0] != 3)  # lr=1 may diverge; it runs
    fit_id = q(c, "SELECT max(fit_id) FROM madlib.fits WHERE model_output_table = 'k2_out'")[0][0]
    p = server_params()
    dsn = f"dbname={c.info.dbname} host={p['host']} port={p['port']} user={p['user']}"
    r = subprocess.run([sys.executable, "-c", REPLAY, dsn, str(fit_id), "iris_packed",
                        "k2_out"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert all(v[0] == 4 and v[1] for v in res.values()), res
    # initial_epoch=1 with epochs=2: one pass per unit, ceil(30 / 8) = 4 steps per pass of a
    # partition's 30 rows, 4 units: 16 optimizer steps
    sizes = q(c, "SELECT __dist_key__, sum(class_text_shape[1]) FROM iris_packed "
                 "GROUP BY 1 ORDER BY 1")
    steps = 2 * sum(-(-int(n) // 8) for _, n in sizes)
    assert {v[2] for v in res.values()} == {steps}


def test_decay_changes_training_and_keras3_arguments_still_work(madlib_conn):
    """SGD(lr=0.01, decay=1e-6, nesterov=True) (MADlib's most common string, bare call) and a
    large decay train; the large decay gives other weights than no decay."""
    c = madlib_conn
    q(c, """SELECT madlib.load_model_selection_table('model_arch_library', 'k2_mst2', ARRAY[1],
            ARRAY[$$loss='categorical_crossentropy', optimizer=SGD(lr=0.01, decay=1e-6,
                    nesterov=True, momentum=0.9), metrics=['accuracy']$$,
                  $$loss='categorical_crossentropy', optimizer=SGD(lr=0.5, decay=0.5),
                    metrics=['accuracy']$$,
                  $$loss='categorical_crossentropy', optimizer=SGD(lr=0.5),
                    metrics=['accuracy']$$,
                  $$loss='categorical_crossentropy',
                    optimizer='RMSprop(lr=1, rho=0.9, epsilon=None, decay=0.0)',
                    metrics=['accuracy'], sample_weight_mode='temporal'$$],
            ARRAY[$$batch_size=8, epochs=1, steps_per_epoch=2$$])""")
    q(c, "SELECT madlib.madlib_keras_fit_multiple_model('iris_packed', 'k2_out2', 'k2_mst2', "
         "2, FALSE, NULL, NULL, FALSE, NULL, NULL, TRUE, 'mop', NULL, 11)")
    w = {k: np.frombuffer(bytes(b), "<f4") for k, b in
         q(c, "SELECT mst_key, model_weights FROM k2_out2 ORDER BY mst_key")}
    assert len(w) == 4 and all(np.isfinite(v).all() for v in w.values())
    assert not np.array_equal(w[2], w[3])  # decay=0.5 vs none, same seed and visits
    loss = dict(q(c, "SELECT mst_key, training_loss_final FROM k2_out2_info"))
    assert all(np.isfinite(v) for v in loss.values())


def test_fit_params_null_and_refusals_up_front(madlib_conn):
    """madlib_keras_fit with fit_params NULL uses Keras' defaults; what cannot work is
    refused before any output table exists."""
    import psycopg2

    c = madlib_conn
    q(c, "SELECT madlib.madlib_keras_fit('iris_packed', 'k2_single', 'model_arch_library', 1, "
         "$$loss='categorical_crossentropy', optimizer=SGD(lr=0.01, decay=1e-6, nesterov=True),"
         " metrics=['accuracy']$$, NULL, 1)")
    summ = q(c, "SELECT num_iterations, array_length(training_loss, 1) FROM k2_single_summary")
    assert summ == [(1, 1)]
    for compile_params, fit_params, words in (
            ("loss='mse', optimizer=SGD(lr=0.1, decay=-1)", "batch_size=2",
             "decay must be a non-negative number"),
            ("loss='mse', optimizer='SGD'", "epochs=2, initial_epoch=2",
             "initial_epoch must be less than epochs"),
            ("loss='mse', optimizer='SGD', sample_weight_mode='x'", "batch_size=2",
             "sample_weight_mode must be None or 'temporal'")):
        with pytest.raises(psycopg2.Error) as info:
            q(c, "SELECT madlib.madlib_keras_fit('iris_packed', 'k2_bad', 'model_arch_library', "
                 "1, %s, %s, 1)", (compile_params, fit_params))
        assert words in info.value.pgerror and info.value.pgcode == "22023"
        assert q(c, "SELECT to_regclass('k2_bad'), to_regclass('k2_bad_summary')") == \
            [(None, None)]
