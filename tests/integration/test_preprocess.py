"""training_preprocessor_dl / validation_preprocessor_dl against the real server."""
from __future__ import annotations

import numpy as np
import pytest

from tooling.datasets import find_dataset_dir, load_split

from ..helpers import error_of, q

pytestmark = pytest.mark.db


def exists(conn, name: str) -> bool:
    return q(conn, "SELECT to_regclass(%s) IS NOT NULL", (name,))[0][0]


def buffers(conn, table, xcol="x", ycol="y"):
    rows = q(conn, f'SELECT __dist_key__, "{xcol}", "{ycol}", "{xcol}_shape", "{ycol}_shape", '
                   f"buffer_id FROM {table} ORDER BY buffer_id")
    xs, ys, keys = [], [], []
    for k, xb, yb, xs_, ys_, bid in rows:
        xs.append(np.frombuffer(bytes(xb), np.float32).reshape(xs_))
        ys.append(np.frombuffer(bytes(yb), np.int16 if ycol != "t" else np.float32).reshape(ys_))
        keys.append(k)
    return np.concatenate(xs), np.concatenate(ys), keys


@pytest.fixture
def small(conn, tables):
    """40 rows: x real[3] = (i, 2i, -i), label text with a NULL class, int and bool labels."""
    tables += ["small", "small_packed"]
    q(conn, "DROP TABLE IF EXISTS small")
    q(conn, """CREATE TABLE small AS
               SELECT i AS id, ARRAY[i, 2*i, -i]::real[] AS x,
                      CASE WHEN i % 4 = 3 THEN NULL ELSE (ARRAY['cat','dog','emu'])[i % 4 + 1] END
                        AS lbl,
                      (i % 3)::int AS k, (i % 2 = 0) AS b, (i * 0.5)::float8 AS t,
                      ARRAY[i, i + 1]::float8[] AS t2
                 FROM generate_series(0, 39) i""")
    return "small"


def test_round_trip_text_labels_with_null_class(conn, small):
    q(conn, "SELECT training_preprocessor_dl('small', 'small_packed', 'lbl', 'x', NULL, 2.0,"
            " NULL, NULL, 2, 7)")
    x, y, keys = buffers(conn, "small_packed", "x", "lbl")
    assert x.shape == (40, 3) and y.shape == (40, 4)
    assert sorted(set(keys)) == [0, 1]
    summ = q(conn, "SELECT lbl_class_values, num_classes, normalizing_const, buffer_size, "
                   "dependent_vartype, num_partitions, random_state, num_rows FROM small_packed_summary")[0]
    assert summ == ([None, "cat", "dog", "emu"], [4], 2.0, 20, ["text"], 2, 7, 40)
    ids = np.rint(x[:, 0] * 2).astype(int)  # features were divided by 2
    assert sorted(ids) == list(range(40))
    assert np.allclose(x[:, 1], ids) and np.allclose(x[:, 2], -ids / 2)
    expect = np.where(ids % 4 == 3, 0, ids % 4 + 1)  # the NULL class first, as MADlib
    assert (y.argmax(axis=1) == expect).all() and (y.sum(axis=1) == 1).all()
    assert list(ids) != sorted(ids)  # shuffled


def test_seeded_shuffle_is_reproducible(conn, small, tables):
    tables += ["sp_a", "sp_b", "sp_c"]
    for t, seed in (("sp_a", 1), ("sp_b", 1), ("sp_c", 2)):
        q(conn, f"SELECT training_preprocessor_dl('small', '{t}', 'k', 'x', 8, 1.0, NULL, NULL,"
                f" 2, {seed})")
    a, b, c = (q(conn, f"SELECT string_agg(x, ''::bytea ORDER BY buffer_id) FROM {t}")[0][0]
               for t in ("sp_a", "sp_b", "sp_c"))
    assert bytes(a) == bytes(b) and bytes(a) != bytes(c)
    n = q(conn, "SELECT count(*), max(x_shape[1]), array_agg(DISTINCT __dist_key__) FROM sp_a")[0]
    assert n == (6, 7, [0, 1])  # MADlib: 2 * ceil(40 / 8 / 2) buffers of ceil(40 / 6)


def test_integer_boolean_labels_and_padding(conn, small, tables):
    tables += ["sp_int", "sp_bool"]
    q(conn, "SELECT training_preprocessor_dl('small', 'sp_int', 'k', 'x', NULL, 1.0, ARRAY[5],"
            " NULL, 2, 1)")
    x, y, _ = buffers(conn, "sp_int", "x", "k")
    assert y.shape == (40, 5) and (y[:, 3:] == 0).all()
    assert (y.argmax(1) == np.rint(x[:, 0]).astype(int) % 3).all()
    cv = q(conn, "SELECT k_class_values, num_classes FROM sp_int_summary")[0]
    assert cv == ([0, 1, 2, None, None], [5])
    q(conn, "SELECT training_preprocessor_dl('small', 'sp_bool', 'b', 'x', NULL, 1.0, NULL, NULL,"
            " 2, 1)")
    x, y, _ = buffers(conn, "sp_bool", "x", "b")
    assert q(conn, "SELECT b_class_values FROM sp_bool_summary")[0][0] == [False, True]
    assert (y.argmax(1) == (np.rint(x[:, 0]).astype(int) % 2 == 0)).all()


def test_regression_targets_stay_float(conn, small, tables):
    tables += ["sp_t", "sp_t2"]
    q(conn, "SELECT training_preprocessor_dl('small', 'sp_t', 't', 'x', NULL, 1.0, NULL, NULL,"
            " 2, 3, regression_targets => 't')")
    x, t, _ = buffers(conn, "sp_t", "x", "t")
    assert t.dtype == np.float32 and t.shape == (40, 1)
    assert np.allclose(t[:, 0], x[:, 0] * 0.5)
    summ = q(conn, "SELECT dependent_kind, num_classes, t_class_values FROM sp_t_summary")[0]
    assert summ == (["regression"], [None], None)
    q(conn, "SELECT training_preprocessor_dl('small', 'sp_t2', 't2', 'x', NULL, 1.0, NULL, NULL,"
            " 2, 3, regression_targets => 't2')")
    rows = q(conn, "SELECT t2, t2_shape FROM sp_t2 ORDER BY buffer_id")
    t2 = np.concatenate([np.frombuffer(bytes(b), np.float32).reshape(s) for b, s in rows])
    assert t2.shape == (40, 2) and np.allclose(t2[:, 1] - t2[:, 0], 1)


def test_several_inputs_and_outputs(conn, small, tables):
    tables += ["sp_multi"]
    q(conn, "ALTER TABLE small ADD COLUMN x2 integer[]")
    q(conn, "UPDATE small SET x2 = ARRAY[[id, id], [id, id]]")
    q(conn, "SELECT training_preprocessor_dl('small', 'sp_multi', 'lbl, k', 'x, x2', NULL, 1.0,"
            " NULL, NULL, 2, 5)")
    cols = [r[0] for r in q(conn, "SELECT attname FROM pg_attribute WHERE attrelid = "
                                  "'sp_multi'::regclass AND attnum > 0 ORDER BY attnum")]
    assert cols == ["__dist_key__", "x", "x2", "lbl", "k", "x_shape", "x2_shape", "lbl_shape",
                    "k_shape", "buffer_id"]
    shapes = q(conn, "SELECT x2_shape, k_shape FROM sp_multi ORDER BY buffer_id")
    assert shapes[0][0][1:] == [2, 2] and shapes[0][1][1:] == [3]
    summ = q(conn, "SELECT dependent_varname, independent_varname, num_classes "
                   "FROM sp_multi_summary")[0]
    assert summ == (["lbl", "k"], ["x", "x2"], [4, 3])


def test_quoted_and_schema_qualified_names(conn, tables):
    tables += ['"Odd Schema"."Train Set"', '"Odd Schema"."packed out"',
               '"Odd Schema"."packed out_summary"']
    q(conn, 'CREATE SCHEMA IF NOT EXISTS "Odd Schema"')
    q(conn, 'CREATE TABLE "Odd Schema"."Train Set" ("My X" real[], "Label" text)')
    q(conn, """INSERT INTO "Odd Schema"."Train Set" SELECT ARRAY[i, i], 'c' || (i % 2)
               FROM generate_series(1, 10) i""")
    q(conn, """SELECT training_preprocessor_dl('"Odd Schema"."Train Set"',
               '"Odd Schema"."packed out"', '"Label"', '"My X"', NULL, 1.0, NULL, NULL, 2, 1)""")
    assert exists(conn, '"Odd Schema"."packed out_summary"')
    assert q(conn, 'SELECT sum("My X_shape"[1]) FROM "Odd Schema"."packed out"')[0][0] == 10


def test_validation_uses_training_classes_and_constant(conn, small, tables):
    tables += ["sp_tr", "sp_val", "small_val", "sp_val2"]
    q(conn, "SELECT training_preprocessor_dl('small', 'sp_tr', 'lbl', 'x', NULL, 4.0, NULL, NULL,"
            " 2, 1)")
    q(conn, "CREATE TABLE small_val AS SELECT * FROM small WHERE id < 10")
    q(conn, "SELECT validation_preprocessor_dl('small_val', 'sp_val', 'lbl', 'x', 'sp_tr')")
    x, y, _ = buffers(conn, "sp_val", "x", "lbl")
    assert y.shape == (10, 4)
    ids = np.rint(x[:, 0] * 4).astype(int)
    assert sorted(ids) == list(range(10))
    assert (y.argmax(1) == np.where(ids % 4 == 3, 0, ids % 4 + 1)).all()
    q(conn, "UPDATE small_val SET lbl = 'yak' WHERE id = 1")
    e = error_of(conn, "SELECT validation_preprocessor_dl('small_val', 'sp_val2', 'lbl', 'x', 'sp_tr')")
    assert e.pgcode == "22000" and "'yak'" in e.pgerror
    assert not exists(conn, "sp_val2")
    q(conn, "UPDATE small_val SET lbl = 'cat', x = ARRAY[1, 2]")
    e = error_of(conn, "SELECT validation_preprocessor_dl('small_val', 'sp_val2', 'lbl', 'x', 'sp_tr')")
    assert e.pgcode == "22000" and "shape" in e.pgerror
    e = error_of(conn, "SELECT validation_preprocessor_dl('small_val', 'sp_val2', 'k', 'x', 'sp_tr')")
    assert e.pgcode == "42804"


BAD_CALLS = [
    ("SELECT training_preprocessor_dl('no_such', 'o1', 'lbl', 'x')", "42P01", "does not exist"),
    ("SELECT training_preprocessor_dl('small', 'o1', 'nolabel', 'x')", "42703", "nolabel"),
    ("SELECT training_preprocessor_dl('small', 'o1', 'lbl', 'lbl2')", "42703", "lbl2"),
    ("SELECT training_preprocessor_dl('small', 'o1', 'lbl', 'k')", "42804", "numeric array"),
    ("SELECT training_preprocessor_dl('small', 'o1', 'x', 'x')", "22023", "both"),
    ("SELECT training_preprocessor_dl('small', 'small', 'lbl', 'x')", "42P07", "already exists"),
    ("SELECT training_preprocessor_dl('small', 'o1; DROP TABLE small', 'lbl', 'x')", "42602",
     "not a valid name"),
    ("SELECT training_preprocessor_dl('small', 'o1', 'lbl); DROP TABLE small; --', 'x')", "42602",
     "not a valid name"),
    ("SELECT training_preprocessor_dl(NULL, 'o1', 'lbl', 'x')", "22004", "source_table"),
    ("SELECT training_preprocessor_dl('small', 'o1', 'lbl', 'x', 0)", "22023", "buffer_size"),
    ("SELECT training_preprocessor_dl('small', 'o1', 'lbl', 'x', NULL, 0)", "22023",
     "normalizing_const"),
    ("SELECT training_preprocessor_dl('small', 'o1', 'lbl', 'x', NULL, 'NaN')", "22023",
     "normalizing_const"),
    ("SELECT training_preprocessor_dl('small', 'o1', 'lbl', 'x', NULL, 1, ARRAY[2])", "22023",
     "num_classes"),
    ("SELECT training_preprocessor_dl('small', 'o1', 'lbl', 'x', NULL, 1, NULL, 'no_segs')",
     "42P01", "distribution_rules"),
    ("SELECT training_preprocessor_dl('small', 'o1', 'lbl', 'x', NULL, 1, NULL, NULL, 0)", "22023",
     "num_partitions"),
    ("SELECT training_preprocessor_dl('small', 'o1', 'lbl', 'x', regression_targets => 'k')",
     "22023", "regression_targets"),
    ("SELECT training_preprocessor_dl('small', 'o1', 'lbl', 'x', regression_targets => 'lbl')",
     "42804", "regression target"),
    ("SELECT training_preprocessor_dl('small', 'o1', 't', 'x', NULL, 1, ARRAY[3])", "22023",
     "num_classes"),
    ("SELECT training_preprocessor_dl('small', 'a.b.c.d', 'lbl', 'x')", "42602", "dotted"),
    ("SELECT validation_preprocessor_dl('small', 'o1', 'lbl', 'x', 'small')", "42P01",
     "summary"),
]


@pytest.mark.parametrize("sql,code,words", BAD_CALLS, ids=[c[1] + ":" + c[2] for c in BAD_CALLS])
def test_bad_input_gets_clear_error_and_no_tables(conn, small, sql, code, words):
    e = error_of(conn, sql)
    assert e.pgcode == code, e.pgerror
    assert words in e.pgerror
    assert q(conn, "SELECT count(*) FROM small")[0][0] == 40
    assert not exists(conn, "o1") and not exists(conn, "o1_summary")


@pytest.mark.parametrize("update,code,words", [
    ("UPDATE small SET x = NULL WHERE id = 5", "22004", "NULL in some rows"),
    ("UPDATE small SET x = ARRAY[1, NULL, 3] WHERE id = 5", "22004", "NULL elements"),
    ("UPDATE small SET x = ARRAY[1, 'NaN', 3]::real[] WHERE id = 5", "22P01", "NaN"),
    ("UPDATE small SET x = ARRAY[1, '-Infinity', 3]::real[] WHERE id = 5", "22P01", "infinity"),
    ("UPDATE small SET x = ARRAY[1, 2] WHERE id = 5", "22000", "same shape"),
    ("UPDATE small SET x = '{}' WHERE id = 5", "22000", "shape"),
    ("UPDATE small SET t = 'NaN' WHERE id = 5", "22P01", "NaN"),
    ("DELETE FROM small", "22000", "is empty"),
])
def test_bad_data(conn, small, update, code, words):
    q(conn, update)
    dep = "t" if "SET t" in update else "lbl"
    e = error_of(conn, f"SELECT training_preprocessor_dl('small', 'o1', '{dep}', 'x', NULL, 1, NULL,"
                  f" NULL, 2, regression_targets => {'t' if dep == 't' else ''!r})")
    assert e.pgcode == code, e.pgerror
    assert words in e.pgerror
    assert not exists(conn, "o1")


def test_help_texts(conn):
    for fn in ("training_preprocessor_dl", "validation_preprocessor_dl"):
        assert "SELECT " + fn in q(conn, f"SELECT {fn}('help')")[0][0]
        assert fn in q(conn, f"SELECT {fn}()")[0][0]


def test_real_fashion_mnist_subset_round_trips(conn, tables):
    """2,000 real Fashion-MNIST images: every packed row is an original image / 255."""
    import io

    from tooling.datasets import copy_payload

    tables += ["fm_small", "fm_packed"]
    x, y = load_split(find_dataset_dir("fashion-mnist"), "t10k")
    x, y = x[:2000], y[:2000]
    q(conn, "DROP TABLE IF EXISTS fm_small")
    q(conn, "CREATE TABLE fm_small (id integer, y integer, x real[])")
    with conn.cursor() as cur:
        cur.copy_expert("COPY fm_small FROM STDIN (FORMAT binary)",
                        io.BytesIO(copy_payload(np.arange(2000), y.astype(np.int32), x)))
    q(conn, "SELECT training_preprocessor_dl('fm_small', 'fm_packed', 'y', 'x', NULL, 255.0,"
            " NULL, NULL, 2, 11)")
    px, py, _keys = buffers(conn, "fm_packed")
    assert px.shape == (2000, 784) and py.shape == (2000, 10)
    flat = x.reshape(2000, -1).astype(np.float32) / np.float32(255.0)
    order = np.lexsort(px.T[::-1])
    ref = np.lexsort(flat.T[::-1])
    assert np.array_equal(px[order], flat[ref])
    assert np.array_equal(py[order].argmax(1), y[ref])


def test_misspelt_setting_is_warned_about(conn, small):
    """PostgreSQL accepts any cerebro_db.* name; a misspelt one stored for the database
    would do nothing silently."""
    db = q(conn, "SELECT quote_ident(current_database())")[0][0]
    q(conn, f"ALTER DATABASE {db} SET cerebro_db.num_partition = '3'")
    q(conn, f"ALTER DATABASE {db} SET cerebro_db.eval_bundle = '2'")
    try:
        conn.notices.clear()
        q(conn, "SELECT training_preprocessor_dl('small', 'small_packed', 'lbl', 'x')")
    finally:
        q(conn, f"ALTER DATABASE {db} RESET cerebro_db.num_partition")
        q(conn, f"ALTER DATABASE {db} RESET cerebro_db.eval_bundle")
    warned = [n for n in conn.notices if n.startswith("WARNING:")]
    assert len(warned) == 1, conn.notices
    assert 'unrecognized configuration parameter "cerebro_db.num_partition"' in warned[0]
    assert 'did you mean "cerebro_db.num_partitions"?' in warned[0]
