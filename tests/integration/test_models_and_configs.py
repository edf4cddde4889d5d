"""load_keras_model / delete_keras_model / model selection tables through psycopg2."""
from __future__ import annotations

import numpy as np
import pytest

from ..helpers import q

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db


def keras3_mlp_json_and_weights():
    import keras

    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                          keras.layers.Dense(3, activation="softmax")])
    flat = np.concatenate([w.ravel() for w in m.get_weights()]).astype("<f4")
    return m.to_json(), flat.tobytes(), m.count_params()


def test_keras3_json_with_weights_is_stored_as_given(conn, tables):
    tables += ['"Arch Lib"']
    arch, weights, n = keras3_mlp_json_and_weights()
    q(conn, """SELECT load_keras_model('"Arch Lib"', %s, %s, 'mlp', 'three classes')""",
      (arch, psycopg2.Binary(weights)))
    row = q(conn, 'SELECT model_arch::text, model_weights, name FROM "Arch Lib"')[0]
    assert row[0] == arch and bytes(row[1]) == weights and row[2] == "mlp"
    assert len(weights) == 4 * n
    with pytest.raises(psycopg2.Error) as e:
        q(conn, """SELECT load_keras_model('"Arch Lib"', %s, %s)""",
          (arch, psycopg2.Binary(weights[:-4])))
    assert e.value.pgcode == "22023"
    assert f"{n - 1} values but the architecture has {n} parameters" in e.value.pgerror
    assert q(conn, 'SELECT count(*) FROM "Arch Lib"')[0][0] == 1


def test_arch_table_must_look_like_one(conn, tables):
    tables += ["not_arch"]
    q(conn, "CREATE TABLE not_arch (a int)")
    arch, _, _ = keras3_mlp_json_and_weights()
    with pytest.raises(psycopg2.Error) as e:
        q(conn, "SELECT load_keras_model('not_arch', %s)", (arch,))
    assert e.value.pgcode == "42809" and "not a model architecture table" in e.value.pgerror


def test_random_search_reproducible_and_appends(conn, tables):
    tables += ["arch_r", "mst_r1", "mst_r2"]
    arch, _, _ = keras3_mlp_json_and_weights()
    q(conn, "SELECT load_keras_model('arch_r', %s)", (arch,))
    q(conn, "SELECT load_keras_model('arch_r', %s)", (arch,))
    grid = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': ["
            "{'optimizer': ['SGD'], 'lr': [0.0001, 0.1, 'log'], 'momentum': [0.5, 0.99, 'log_near_one']},"
            "{'optimizer': ['Adam'], 'lr': [0.0001, 0.01, 'log']}], 'metrics': ['accuracy']}")
    fit = "{'batch_size': [16, 32, 64], 'epochs': [1, 2]}"
    for t in ("mst_r1", "mst_r2"):
        q(conn, "SELECT generate_model_configs('arch_r', %s, ARRAY[1, 2], %s, %s, 'random', 10, 123)",
          (t, grid, fit))
    a = q(conn, "SELECT model_id, compile_params, fit_params FROM mst_r1 ORDER BY mst_key")
    b = q(conn, "SELECT model_id, compile_params, fit_params FROM mst_r2 ORDER BY mst_key")
    assert a == b and len(a) == 10 and {r[0] for r in a} <= {1, 2}
    for _, c, _ in a:
        if "SGD" in c:
            lr = float(c.split("lr=")[1].split(",")[0].split(")")[0])
            assert 0.0001 <= lr <= 0.1
    q(conn, "SELECT generate_model_configs('arch_r', 'mst_r1', ARRAY[1], %s, %s, 'random', 4, 9)",
      (grid, fit))
    assert q(conn, "SELECT count(*) FROM mst_r1")[0][0] == 14
    keys = [r[0] for r in q(conn, "SELECT mst_key FROM mst_r1 ORDER BY mst_key")]
    assert keys == list(range(1, 15))


def test_append_requires_same_arch_table(conn, tables):
    tables += ["arch_a", "arch_b", "mst_ab"]
    arch, _, _ = keras3_mlp_json_and_weights()
    for t in ("arch_a", "arch_b"):
        q(conn, f"SELECT load_keras_model('{t}', %s)", (arch,))
    grid = "{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD']}]}"
    q(conn, "SELECT generate_model_configs('arch_a', 'mst_ab', ARRAY[1], %s, '{}')", (grid,))
    with pytest.raises(psycopg2.Error) as e:
        q(conn, "SELECT generate_model_configs('arch_b', 'mst_ab', ARRAY[1], %s, '{}')", (grid,))
    assert e.value.pgcode == "22023" and "made for model_arch_table" in e.value.pgerror


def test_sessions_making_the_same_new_table_at_once_both_append(dbname, conn, tables):
    """An outside pass ran load_keras_model / generate_model_configs into one new table from
    three sessions at once: one appended, the others got 42P07 or a raw 23505 on pg_type.
    A session whose CREATE TABLE meets another's (here held open until the second waits
    on it) now appends to that table, as it would have had the table been there."""
    import threading

    from ..helpers import connect

    tables += ["arch_c", "mst_c"]
    arch, _, _ = keras3_mlp_json_and_weights()
    grid = "{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [" \
           "{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}], 'metrics': ['accuracy']}"
    calls = [("SELECT load_keras_model('arch_c', %s)", (arch,)),
             (("SELECT generate_model_configs('arch_c', 'mst_c', ARRAY[1], %s, "
               "'{''batch_size'': [16]}', 'grid')"), (grid,))]
    for sql, args in calls:
        first, second = connect(dbname, autocommit=False), connect(dbname, autocommit=True)
        errors: list[BaseException] = []
        try:
            q(first, sql, args)  # creates the table; not committed yet
            pid = second.get_backend_pid()

            def run(second=second, sql=sql, args=args, errors=errors) -> None:
                try:
                    q(second, sql, args)
                except BaseException as e:  # noqa: BLE001 - checked below
                    errors.append(e)

            t = threading.Thread(target=run)
            t.start()
            for _ in range(200):  # until the second session waits for the first
                if q(conn, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                     (pid,)) == [("Lock",)]:
                    break
                q(conn, "SELECT pg_stat_clear_snapshot(), pg_sleep(0.05)")
            first.commit()
            t.join(60)
        finally:
            first.close()
            second.close()
        assert not errors, errors
    assert q(conn, "SELECT count(*) FROM arch_c")[0][0] == 2
    assert q(conn, "SELECT count(*) FROM mst_c")[0][0] == 2  # the same 2 configs, deduplicated
