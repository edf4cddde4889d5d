"""What a DBA does to a database holding the extension (an outside pass): pg_dump and
pg_restore keep the catalog (fits, units, model states, jobs, limits, the id sequences),
and installing into a schema that already holds a user's tables leaves those tables alone."""
from __future__ import annotations

import subprocess
import uuid

import psycopg2
import pytest

from ..helpers import (
    connect,
    create_database,
    drop_database,
    load_mnist_rows,
    mlp_json,
    q,
    server_or_skip,
    server_params,
)

pytestmark = pytest.mark.db

BIN = "/usr/lib/postgresql/15/bin"
CATALOG = ("fits", "fit_configs", "units", "model_states", "jobs", "limits")


def _pg(tool: str, *args: str) -> subprocess.CompletedProcess:
    p = server_params()
    return subprocess.run([f"{BIN}/{tool}", "-h", p["host"], "-p", p["port"], "-U", p["user"],
                           *args], capture_output=True, text=True, check=False)


def _counts(c) -> dict[str, int]:
    out = {t: q(c, f"SELECT count(*) FROM cerebro_db.{t}")[0][0] for t in CATALOG}
    out["last_fit_id"] = q(c, "SELECT last_value FROM cerebro_db.fits_fit_id_seq")[0][0]
    return out


def test_dump_and_restore_keep_the_catalog(tmp_path):
    src = create_database()
    dst = f"cerebro_test_{uuid.uuid4().hex[:10]}"
    try:
        c = connect(src, autocommit=True)
        q(c, "SET client_min_messages = warning")
        load_mnist_rows(c, ("raw", 0, 120))
        q(c, "SELECT training_preprocessor_dl('raw', 'p', 'y', 'x', NULL, 255.0, NULL, NULL, 2, 1)")
        q(c, "SELECT load_keras_model('arch', %s)", (mlp_json(),))
        q(c, "SELECT load_model_selection_table('arch', 'mst', ARRAY[1], "
             "ARRAY[$$loss='categorical_crossentropy', optimizer='Adam', metrics=['accuracy']$$],"
             " ARRAY['batch_size=32'])")
        q(c, "SELECT madlib_keras_fit_multiple_model('p', 'out', 'mst', 1, FALSE, NULL, NULL, "
             "FALSE, NULL, NULL, NULL, 'mop', NULL, 5)")
        q(c, "INSERT INTO cerebro_db.limits (setting, role_name, value) "
             "VALUES ('max_workers_per_fit', NULL, 4)")
        # an interrupted fit (its transaction rolled back: every unit is logged, no output)
        t = connect(src)
        q(t, "SELECT madlib_keras_fit_multiple_model('p', 'out_int', 'mst', 1, FALSE, NULL, "
             "NULL, FALSE, NULL, NULL, NULL, 'mop', NULL, 5)")
        t.rollback()
        t.close()
        before = _counts(c)
        assert before["fits"] == 2 and before["units"] > 0 and before["model_states"] > 0
        fit_id = q(c, "SELECT fit_id FROM out_summary")[0][0]
        interrupted = q(c, "SELECT max(fit_id) FROM cerebro_db.fits")[0][0]
        c.close()

        dump = str(tmp_path / "db.dump")
        r = _pg("pg_dump", "-Fc", "-d", src, "-f", dump)
        assert r.returncode == 0, r.stderr
        admin = server_or_skip()
        q(admin, f'CREATE DATABASE "{dst}"')
        admin.close()
        r = _pg("pg_restore", "-d", dst, dump)
        assert r.returncode == 0, r.stderr

        # a role that is not a superuser: the catalog left out, or only its own rows (a
        # plain dump fails on the catalog's row-level security, README "Operating it")
        role = f"dumper_{uuid.uuid4().hex[:8]}"
        admin = connect(src, autocommit=True)
        q(admin, f'CREATE ROLE "{role}" LOGIN')
        q(admin, f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"')
        q(admin, f'GRANT SELECT ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
        try:
            for extra in (["--exclude-table-data", "cerebro_db.*"], ["--enable-row-security"]):
                r = _pg("pg_dump", "-U", role, "-Fc", "-d", src, "-f",
                        str(tmp_path / "mine.dump"), *extra)
                assert r.returncode == 0, (extra, r.stderr)
            r = _pg("pg_dump", "-U", role, "-Fc", "-d", src, "-f", str(tmp_path / "x.dump"))
            assert r.returncode != 0 and "row-level security" in r.stderr, r.stderr
        finally:
            q(admin, f'DROP OWNED BY "{role}"')
            q(admin, f'DROP ROLE "{role}"')
            admin.close()

        d = connect(dst, autocommit=True)
        q(d, "SET search_path = public, cerebro_db")
        assert _counts(d) == before
        assert q(d, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) \
            == [("done",)]
        # the interrupted fit resumes there (its source has another oid after the restore;
        # its contents are the same)
        q(d, "SELECT madlib_keras_fit_resume(%s)", (interrupted,))
        assert q(d, "SELECT (SELECT model_weights FROM out) = "
                    "(SELECT model_weights FROM out_int)") == [(True,)]
        # a new fit takes the next id, not one the restored outputs carry
        q(d, "SELECT madlib_keras_fit_multiple_model('p', 'out2', 'mst', 1, FALSE, NULL, NULL, "
             "FALSE, NULL, NULL, NULL, 'mop', NULL, 5)")
        assert q(d, "SELECT fit_id FROM out2_summary")[0][0] > fit_id
        # the restored model state is the fit's: the same weights as the output
        same = q(d, "SELECT (SELECT model_weights FROM out) = (SELECT model_weights FROM out2)")
        assert same == [(True,)]  # same seed, same data: the same model
        d.close()

        # in the source database, the same table packed again from changed labels (same
        # rows, seed and sizes): the interrupted fit refuses it
        c = connect(src, autocommit=True)
        q(c, "SET client_min_messages = warning")
        q(c, "DROP TABLE p, p_summary")
        q(c, "UPDATE raw SET y = (y + 1) % 10 WHERE id % 7 = 0")
        q(c, "SELECT training_preprocessor_dl('raw', 'p', 'y', 'x', NULL, 255.0, NULL, NULL, 2, 1)")
        with pytest.raises(psycopg2.Error) as e:
            q(c, "SELECT madlib_keras_fit_resume(%s)", (interrupted,))
        assert e.value.pgcode == "55000" and "with other contents" in e.value.pgerror, \
            e.value.pgerror
        c.close()
    finally:
        drop_database(dst)
        drop_database(src)


def test_install_into_a_schema_with_user_tables_leaves_them_alone():
    admin = server_or_skip()
    name = f"cerebro_test_{uuid.uuid4().hex[:10]}"
    q(admin, f'CREATE DATABASE "{name}"')
    admin.close()
    try:
        c = connect(name, autocommit=True)
        q(c, "SET client_min_messages = warning")
        q(c, "CREATE SCHEMA ml")
        # tables and a view of a user, shaped like the catalog's (fit_id, owner) and like an
        # output of an earlier install (fit_id without owner)
        q(c, "CREATE TABLE ml.results (fit_id int, owner name, score real)")
        q(c, "CREATE TABLE ml.old_info (fit_id int, mst_key int)")
        q(c, "CREATE VIEW ml.v AS SELECT * FROM ml.results")
        q(c, "CREATE EXTENSION cerebro_db SCHEMA ml CASCADE")
        assert q(c, "SELECT relname::text, relrowsecurity FROM pg_class WHERE relnamespace = "
                    "'ml'::regnamespace AND relname IN ('results', 'old_info') ORDER BY 1") \
            == [("old_info", False), ("results", False)]
        assert q(c, "SELECT count(*) FROM pg_policy WHERE polrelid IN "
                    "('ml.results'::regclass, 'ml.old_info'::regclass)") == [(0,)]
        assert q(c, "SELECT reloptions FROM pg_class WHERE oid = 'ml.v'::regclass") == [(None,)]
        assert q(c, "SELECT relrowsecurity FROM pg_class WHERE oid = 'ml.units'::regclass") \
            == [(True,)]
        q(c, "DROP EXTENSION cerebro_db")
        c.close()
    finally:
        drop_database(name)
