"""A role that may CREATE in a schema on a superuser's search_path cannot make the
extension run its code.

``mallory`` (CREATE on ``public``, nothing else) defines overloads of the functions,
aggregates and operators the extension's SQL calls, with argument types that beat
pg_catalog's (``format(text, integer, bigint)`` beats ``format(text, VARIADIC "any")``).
Each one records ``current_user`` in ``public.hijacked`` and tries ``ALTER ROLE mallory
SUPERUSER``. A superuser whose search_path is the README's ``"$user", public, cerebro_db``
then calls every entry point: preprocessing, models, configurations, a fit, a fit started
while another is interrupted, the resume of that fit, madlib_keras_fit, evaluation,
prediction, AutoML, the Hyperband schedule, the worker change. None of mallory's code runs.

Also: a resume from a session with another search_path trains the table the fit was
started on and writes the outputs where the original call would have.
"""
from __future__ import annotations

import re
import threading
import time

import pytest

from ..helpers import connect, create_database, drop_database, mlp_json, q
from .conftest import connect_as, load_mnist

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

COMPILE = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', " \
          "metrics=['accuracy']"
MALLORY = "sp_mallory"

# (signature, return type, returned value) of each hostile function
FUNCTIONS = [
    ("format(text, integer, bigint)", "text", "'x'"),
    ("format(text, bigint, bigint)", "text", "'x'"),
    ("format(text, integer)", "text", "'x'"),
    ("format(text, bigint)", "text", "'x'"),
    ("format(text, text)", "text", "'x'"),
    ("concat(text, text)", "text", "'x'"),
    ("jsonb_build_object(text, text)", "jsonb", "'{}'::jsonb"),
    ("jsonb_build_object(text, bigint)", "jsonb", "'{}'::jsonb"),
    ("json_build_object(text, text)", "json", "'{}'::json"),
    ("to_jsonb(text)", "jsonb", "'{}'::jsonb"),
    ("array_length(integer[], integer)", "integer", "1"),
    ("array_length(real[], integer)", "integer", "1"),
    ("cardinality(integer[])", "integer", "1"),
    ("pg_sleep(integer)", "void", "NULL"),
    ("pg_sleep(numeric)", "void", "NULL"),
]
SET_FUNCTIONS = ["integer", "bigint", "text", "real", "double precision", "bytea", "boolean"]
AGGREGATES = ["count(integer)", "count(bigint)", "count(text)", "array_agg(integer)",
              "max(numeric)"]
OPERATORS = [("||", "text", "integer"), ("||", "text", "bigint"),
             ("/", "double precision", "bigint"), ("*", "double precision", "bigint"),
             ("=", "integer", "numeric"), ("=", "text", "name"), ("<=", "bigint", "numeric")]


def hostile_sql() -> list[str]:
    """mallory's objects in public; every one calls public.h_record(its name) first."""
    out = [
        ("CREATE TABLE public.hijacked (who text, fn text, at timestamptz DEFAULT "
        "pg_catalog.clock_timestamp())"),
        "GRANT INSERT, SELECT ON public.hijacked TO PUBLIC",
        ("CREATE FUNCTION public.h_record(fn text) RETURNS void LANGUAGE plpgsql AS $h$ "
        "BEGIN INSERT INTO public.hijacked (who, fn) VALUES (current_user::text, fn); "
        f"BEGIN EXECUTE 'ALTER ROLE {MALLORY} SUPERUSER'; "
        "EXCEPTION WHEN OTHERS THEN NULL; END; END $h$"),
    ]
    for sig, ret, val in FUNCTIONS:
        out.append(f"CREATE FUNCTION public.{sig} RETURNS {ret} LANGUAGE plpgsql AS $h$ BEGIN "
                   f"PERFORM public.h_record('{sig}'); RETURN{'' if ret == 'void' else ' ' + val}; "
                   "END $h$")
    for t in SET_FUNCTIONS:
        out.append(f"CREATE FUNCTION public.unnest({t}[]) RETURNS SETOF {t} LANGUAGE plpgsql "
                   f"AS $h$ BEGIN PERFORM public.h_record('unnest({t}[])'); RETURN; END $h$")
    for i, sig in enumerate(AGGREGATES):
        name, arg = sig[:-1].split("(")
        out.append(f"CREATE FUNCTION public.h_sf{i}(bigint, {arg}) RETURNS bigint LANGUAGE "
                   f"plpgsql AS $h$ BEGIN PERFORM public.h_record('{sig}'); RETURN 0; END $h$")
        ret = "bigint"
        if name == "array_agg":
            out.append(f"CREATE FUNCTION public.h_ff{i}(bigint) RETURNS integer[] LANGUAGE sql "
                       "AS $h$ SELECT ARRAY[]::integer[] $h$")
            out.append(f"CREATE AGGREGATE public.{sig} (SFUNC = public.h_sf{i}, STYPE = bigint, "
                       f"FINALFUNC = public.h_ff{i})")
            continue
        if name == "max":
            ret = "numeric"
            out.append(f"CREATE FUNCTION public.h_ff{i}(bigint) RETURNS numeric LANGUAGE sql "
                       "AS $h$ SELECT 0::numeric $h$")
            out.append(f"CREATE AGGREGATE public.{sig} (SFUNC = public.h_sf{i}, STYPE = bigint, "
                       f"FINALFUNC = public.h_ff{i})")
            continue
        out.append(f"CREATE AGGREGATE public.{sig} (SFUNC = public.h_sf{i}, STYPE = {ret}, "
                   "INITCOND = '0')")
    for i, (op, left, right) in enumerate(OPERATORS):
        ret = "boolean" if op in ("=", "<=") else ("text" if op == "||" else
                                                   "double precision")
        val = "false" if ret == "boolean" else ("'x'" if ret == "text" else "0")
        out.append(f"CREATE FUNCTION public.h_op{i}({left}, {right}) RETURNS {ret} LANGUAGE "
                   f"plpgsql AS $h$ BEGIN PERFORM public.h_record('{left} {op} {right}'); "
                   f"RETURN {val}; END $h$")
        out.append(f"CREATE OPERATOR public.{op} (LEFTARG = {left}, RIGHTARG = {right}, "
                   f"FUNCTION = public.h_op{i})")
    return out


@pytest.fixture(scope="module")
def sp():
    """A database of its own: mallory's objects in public, a superuser victim whose
    connection keeps the README's search_path, and a checking connection that never
    resolves names in public."""
    db = create_database()
    check = connect(db)
    check.autocommit = True
    q(check, "SET search_path = pg_catalog")
    q(check, f"DROP ROLE IF EXISTS {MALLORY}")
    q(check, f"CREATE ROLE {MALLORY} LOGIN")
    q(check, f"GRANT CREATE ON SCHEMA public TO {MALLORY}")
    victim = connect(db)
    victim.autocommit = True
    # the victim's data, made before mallory arrives
    load_mnist(victim, "public.sp_raw", 0, 300)
    mal = connect_as(db, MALLORY)
    for stmt in hostile_sql():
        q(mal, stmt)
    mal.close()
    assert q(victim, "SHOW search_path") == [('"$user", public, cerebro_db',)]
    assert q(check, "SELECT count(*) FROM public.hijacked") == [(0,)]
    yield {"db": db, "victim": victim, "check": check}
    victim.close()
    check.close()
    drop_database(db)
    c = connect("postgres")
    c.autocommit = True
    q(c, f"DROP ROLE IF EXISTS {MALLORY}")
    c.close()


def hijacked(check) -> list[tuple]:
    return q(check, "SELECT who, fn FROM public.hijacked ORDER BY at")


def wait_for(check, sql: str, args=None, seconds: float = 120.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rows = q(check, sql, args)
        if rows and rows[0][0] is not None:
            return rows[0][0]
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {sql}")


def interrupted_fit(db: str, check, sql: str, args, setup: tuple[str, ...] = ()) -> int:
    """Run ``sql`` (a fit) in a new superuser session whose first training units sleep in
    the test hook, kill that session once the fit is registered; returns its fit_id, now
    'running' with a dead coordinator (an interrupted fit)."""
    c2 = connect(db)
    c2.autocommit = True
    for s in setup:
        q(c2, s)
    pid = c2.get_backend_pid()
    q(c2, "SELECT pg_catalog.set_config('cerebro_db.test_hook', "
          "'[{\"point\": \"before_train\", \"seconds\": 60}]', false)")
    errors: list[BaseException] = []

    def go():
        try:
            q(c2, sql, args)
        except BaseException as e:  # noqa: BLE001 - expected: the session is killed
            errors.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    fit_id = wait_for(check, "SELECT max(fit_id) FROM cerebro_db.fits WHERE coordinator_pid = "
                             "%s AND status = 'running'", (pid,))
    # the workers are sleeping in their first unit
    wait_for(check, "SELECT 1 FROM pg_catalog.pg_stat_activity WHERE application_name LIKE "
                    "'cerebro_db %%' AND wait_event = 'PgSleep'")
    q(check, "SELECT pg_catalog.pg_terminate_backend(%s)", (pid,))
    t.join(60)
    # and its workers, as a server restart would (they hold locks while they sleep)
    q(check, "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity "
             "WHERE application_name LIKE 'cerebro_db %%'")
    wait_for(check, "SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity "
                    "WHERE application_name LIKE 'cerebro_db %%')")
    assert errors and not t.is_alive()
    c2.close()
    return int(fit_id)


def test_hostile_overloads_never_run_as_the_superuser(sp):
    v, check, db = sp["victim"], sp["check"], sp["db"]
    calls = [
        (("SELECT training_preprocessor_dl('sp_raw', 'sp_p', 'y', 'x', NULL, 255.0, NULL, NULL, "
         "2, 7)"), None),
        ("SELECT validation_preprocessor_dl('sp_raw', 'sp_v', 'y', 'x', 'sp_p')", None),
        ("SELECT load_keras_model('sp_arch', %s)", (mlp_json(),)),
        ("SELECT load_keras_model('sp_arch', %s)", (mlp_json(),)),
        (("SELECT load_model_selection_table('sp_arch', 'sp_mst', ARRAY[1], ARRAY[%s], "
         "ARRAY['batch_size=64'])"), (COMPILE,)),
        (("SELECT generate_model_configs('sp_arch', 'sp_gen', ARRAY[1], %s, "
         "$${'batch_size': [32, 64]}$$, 'grid')"),
         (("{'loss': ['categorical_crossentropy'], 'optimizer': ['Adam'], "
          "'metrics': ['accuracy']}"),)),
        (("SELECT madlib_keras_fit_multiple_model('sp_p', 'sp_out', 'sp_mst', 1, FALSE, 'sp_v', "
         "NULL, FALSE, NULL, NULL, FALSE, 'mop', NULL, 3)"), None),
    ]
    for sql, args in calls:
        q(v, sql, args)
        assert hijacked(check) == [], sql
    # a fit of the superuser interrupted, then another fit (which marks it interrupted),
    # then its resume
    fit_id = interrupted_fit(
        db, check, "SELECT madlib_keras_fit_multiple_model('sp_p', 'sp_res', 'sp_mst', 1, "
        "FALSE, NULL, NULL, FALSE, NULL, NULL, FALSE, 'mop', NULL, 5)", None)
    q(v, "SELECT madlib_keras_fit('sp_p', 'sp_one', 'sp_arch', 1, %s, 'batch_size=64', 1)",
      (COMPILE,))
    assert q(check, "SELECT status, message FROM cerebro_db.fits WHERE fit_id = %s",
             (fit_id,))[0][0] == "interrupted"
    assert "pid" in q(check, "SELECT message FROM cerebro_db.fits WHERE fit_id = %s",
                      (fit_id,))[0][0]
    assert hijacked(check) == []
    q(v, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
    assert q(check, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("done",)]
    assert q(check, "SELECT options ? 'executor_tag' FROM cerebro_db.fits WHERE fit_id = %s",
             (fit_id,)) == [(True,)]
    assert hijacked(check) == []
    more = [
        ("SELECT madlib_keras_evaluate('sp_out', 'sp_v', 'sp_eval')", None),
        ("SELECT madlib_keras_predict('sp_one', 'sp_raw', 'id', 'x', 'sp_pred', 'response')",
         None),
        ("SELECT load_keras_model('sp_arch', model_arch, model_weights) FROM sp_one", None),
        (("SELECT madlib_keras_predict_byom('sp_arch', 3, 'sp_raw', 'id', 'x', 'sp_byom', "
         "'prob', NULL, ARRAY['0','1','2','3','4','5','6','7','8','9'], 255.0)"), None),
        (("SELECT madlib_keras_automl('sp_p', 'sp_am', 'sp_arch', 'sp_am_mst', ARRAY[1], %s, "
         "$${'batch_size': [64]}$$, 'random', 'num_configs=1, num_iterations=1', 3)"),
         (("{'loss': ['categorical_crossentropy'], 'optimizer': ['Adam'], "
          "'metrics': ['accuracy']}"),)),
        ("SELECT hyperband_schedule('sp_hb', 9, 3, 0)", None),
        ("SELECT delete_keras_model('sp_arch', 2)", None),
        ("SELECT cerebro_db_version()", None),
        ("SELECT cerebro_db.version()", None),
        ("SELECT madlib_keras_fit_multiple_model('help')", None),
    ]
    for sql, args in more:
        q(v, sql, args)
        assert hijacked(check) == [], sql
    with pytest.raises(psycopg2.Error) as e:
        q(v, "SELECT cerebro_db_fit_workers(%s, 2)", (fit_id,))
    assert e.value.pgcode == "55000"
    assert hijacked(check) == []
    assert q(check, "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = %s",
             (MALLORY,)) == [(False,)]
    # the overloads are real: the victim's own SQL does call them
    q(v, "SELECT format('%s %s', 1, 2::bigint)")
    assert [r[1] for r in hijacked(check)] == ["format(text, integer, bigint)"]
    q(check, "DELETE FROM public.hijacked")


def test_every_extension_function_pins_search_path(sp):
    """Every function of the extension runs with search_path = pg_catalog, pg_temp, except
    the entry points' PL/pgSQL wrappers, whose bodies call only qualified functions, MADlib's
    numeric overloads (SQL functions that call such a wrapper, qualified, and so hand the
    caller's search_path on to it), and the job procedure, which commits (a procedure with
    a SET clause cannot) and pins search_path itself in each of its transactions."""
    rows = q(sp["check"], "SELECT p.proname::text, p.prolang = (SELECT oid FROM pg_language "
                          "WHERE lanname = 'plpgsql') AS plpgsql, p.proconfig, "
                          "pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_depend d ON "
                          "d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = "
                          "'e' JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = "
                          "'cerebro_db'")
    assert len(rows) > 30
    dl = q(sp["check"], "SELECT n.nspname::text FROM pg_extension e JOIN pg_namespace n ON "
                        "n.oid = e.extnamespace WHERE e.extname = 'dblink'")[0][0]
    unpinned = []
    for name, plpgsql, config, src in rows:
        if config and "search_path=pg_catalog, pg_temp" in config:
            continue
        if name == "__dblink" and config == [f"search_path=pg_catalog, {dl}, pg_temp"]:
            continue  # dblink's schema (the extension's own, or where a DBA put dblink) too
        if plpgsql and "pg_catalog.set_config('cerebro_db.caller_search_path'" in src:
            continue
        if plpgsql and src.count("COMMIT;") and src.count(
                "PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);") \
                == src.count("COMMIT;"):
            continue  # pinned at its start and after every COMMIT but the last
        body = src.split("$function$")[1] if "$function$" in src else src
        if "LANGUAGE sql" in src and re.fullmatch(
                r"\s*SELECT cerebro_db\.\w+\((\$\d+(::\w+)?|NULL)(, *\s*(\$\d+(::\w+)?|NULL))*\)\s*",
                body):
            continue
        unpinned.append(name)
    assert unpinned == []


def test_only_the_known_routines_run_as_the_extensions_owner(sp):
    """The SECURITY DEFINER routines are the four that need the owner's rights, each
    reviewed for what a caller can make it do: opening a worker session as a role the
    session user may act as, reading a cerebro_db.* setting from the configuration files,
    deleting the catalog rows their owners marked doomed (roles have no DELETE on the
    catalog), and running dblink's connection functions for the holder of the backend's
    key, on open connections only (PUBLIC may not run them, migration 098). A new
    one fails here until it is reviewed and listed."""
    rows = q(sp["check"], "SELECT p.proname::text, p.proconfig FROM pg_proc p JOIN pg_depend d "
                          "ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND "
                          "d.deptype = 'e' JOIN pg_extension e ON e.oid = d.refobjid AND "
                          "e.extname = 'cerebro_db' WHERE p.prosecdef ORDER BY 1")
    assert [r[0] for r in rows] == ["__dba_setting", "__dblink", "__purge", "__worker_connect"]
    assert all("search_path=pg_catalog, pg_temp" in (config or []) for n, config in rows
               if n != "__dblink")


def test_resume_uses_the_tables_the_fit_was_started_on(sp):
    """Two schemas hold tables of the same names; a fit started with one on its
    search_path is interrupted and resumed from a session whose search_path has the other:
    it trains the original table and writes its outputs into the original schema."""
    v, check, db = sp["victim"], sp["check"], sp["db"]
    for s, lo in (("sp_one_s", 0), ("sp_two_s", 300)):
        q(v, f"CREATE SCHEMA {s}")
        load_mnist(v, f"{s}.raw", lo, lo + 200)
        q(v, f"SELECT training_preprocessor_dl('{s}.raw', '{s}.packed', 'y', 'x', NULL, 255.0, "
             "NULL, NULL, 2, 7)")
        q(v, f"SELECT load_keras_model('{s}.arch', %s)", (mlp_json(),))
        q(v, f"SELECT load_model_selection_table('{s}.arch', '{s}.mst', ARRAY[1], ARRAY[%s], "
             "ARRAY['batch_size=64'])", (COMPILE,))
    # the second schema's table has another number of partitions: a resume reading it would
    # be refused (or would train other data)
    q(v, "DROP TABLE sp_two_s.packed, sp_two_s.packed_summary")
    q(v, "SELECT training_preprocessor_dl('sp_two_s.raw', 'sp_two_s.packed', 'y', 'x', NULL, "
         "255.0, NULL, NULL, 1, 7)")
    fit_id = interrupted_fit(
        db, check, "SELECT madlib_keras_fit_multiple_model('packed', 'res_out', 'mst', 1, "
        "FALSE, NULL, NULL, FALSE, NULL, NULL, FALSE, 'mop', NULL, 5)", None,
        setup=("SET search_path = sp_one_s, cerebro_db",))
    src = q(check, "SELECT source_table FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,))
    assert src == [('"sp_one_s"."packed"',)]
    q(v, "SET search_path = sp_two_s, cerebro_db")
    try:
        q(v, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
    finally:
        q(v, 'SET search_path = "$user", public, cerebro_db')
    assert q(check, "SELECT to_regclass('sp_one_s.res_out') IS NOT NULL, "
                    "to_regclass('sp_one_s.res_out_info') IS NOT NULL, "
                    "to_regclass('sp_two_s.res_out') IS NULL") == [(True, True, True)]
    # trained on the first schema's table: its 2 partitions, 1 training unit each
    assert q(check, "SELECT count(*), array_agg(DISTINCT partition ORDER BY partition) FROM "
                    "cerebro_db.units WHERE fit_id = %s AND kind = 'train'",
             (fit_id,)) == [(2, [0, 1])]
    assert q(check, "SELECT source_table FROM sp_one_s.res_out_summary") == [("packed",)]
    assert q(check, "SELECT fit_id FROM sp_one_s.res_out_info") == [(fit_id,)]


def test_resume_refuses_a_swapped_source_table(sp):
    """The source table of an interrupted fit dropped and made again under the same name is
    another table: the resume says so instead of training other data."""
    v, check, db = sp["victim"], sp["check"], sp["db"]
    q(v, "CREATE SCHEMA IF NOT EXISTS sp_swap")
    load_mnist(v, "sp_swap.raw", 0, 200)
    q(v, "SELECT training_preprocessor_dl('sp_swap.raw', 'sp_swap.packed', 'y', 'x', NULL, "
         "255.0, NULL, NULL, 2, 7)")
    q(v, "SELECT load_keras_model('sp_swap.arch', %s)", (mlp_json(),))
    q(v, "SELECT load_model_selection_table('sp_swap.arch', 'sp_swap.mst', ARRAY[1], "
         "ARRAY[%s], ARRAY['batch_size=64'])", (COMPILE,))
    fit_id = interrupted_fit(
        db, check, "SELECT madlib_keras_fit_multiple_model('sp_swap.packed', 'sp_swap.o', "
        "'sp_swap.mst', 1, FALSE, NULL, NULL, FALSE, NULL, NULL, FALSE, 'mop', NULL, 5)", None)
    q(v, "DROP TABLE sp_swap.packed, sp_swap.packed_summary")
    q(v, "SELECT training_preprocessor_dl('sp_swap.raw', 'sp_swap.packed', 'y', 'x', NULL, "
         "255.0, NULL, NULL, 2, 8)")
    with pytest.raises(psycopg2.Error) as e:
        q(v, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
    assert e.value.pgcode == "55000", e.value.pgerror
    assert 'source_table "sp_swap.packed" is not the table fit' in e.value.pgerror, e.value.pgerror
    assert q(check, "SELECT to_regclass('sp_swap.o') IS NULL") == [(True,)]
