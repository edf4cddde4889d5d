"""ALTER EXTENSION ... UPDATE leaves the same catalog as a fresh install of the new version."""
from __future__ import annotations

import pytest

from ..helpers import connect, create_database, drop_database

pytestmark = pytest.mark.db

SNAPSHOT = {
    "members": """
        SELECT pg_describe_object(classid, objid, objsubid) AS d
          FROM pg_depend
         WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
           AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'cerebro_db')
         ORDER BY 1""",
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid),
               obj_description(p.oid, 'pg_proc'), p.proacl::text
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'cerebro_db' ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, pg_get_expr(d.adbin, d.adrelid), c.relacl::text,
               obj_description(c.oid, 'pg_class')
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
          LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
         WHERE n.nspname = 'cerebro_db' ORDER BY 1, 2""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
          FROM pg_constraint WHERE connamespace = 'cerebro_db'::regnamespace ORDER BY 1, 2""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'cerebro_db' ORDER BY 1""",
    "schema_acl": "SELECT nspacl::text FROM pg_namespace WHERE nspname = 'cerebro_db'",
    "versions": "SELECT version FROM cerebro_db.installed_versions ORDER BY 1",
    "extension": "SELECT extversion, extrelocatable FROM pg_extension WHERE extname = 'cerebro_db'",
}


def snapshot(dbname: str) -> dict[str, list[tuple]]:
    c = connect(dbname)
    try:
        with c.cursor() as cur:
            out = {}
            for k, sql in SNAPSHOT.items():
                cur.execute(sql)
                out[k] = cur.fetchall()
            return out
    finally:
        c.close()


def test_upgrade_equals_fresh_install():
    old = create_database(version="0.1.0")
    fresh = create_database()
    try:
        before = snapshot(old)
        assert before["extension"][0][0] == "0.1.0"
        assert not any("cerebro_db_version" in r[0] for r in before["functions"])
        c = connect(old)
        c.autocommit = True
        with c.cursor() as cur:
            cur.execute("ALTER EXTENSION cerebro_db UPDATE")
        c.close()
        upgraded, new = snapshot(old), snapshot(fresh)
        assert new["extension"][0][0] == "0.2.0"
        for key in SNAPSHOT:
            assert upgraded[key] == new[key], key
        assert any("cerebro_db_version" in r[0] for r in new["functions"])
        assert [r[0] for r in new["versions"]] == ["0.1.0", "0.2.0"]
    finally:
        drop_database(old)
        drop_database(fresh)
