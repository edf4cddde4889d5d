"""The remote side of a unit (cerebro_db.remote.unit.run_call), run in this process against
the real server: the same unit function as a worker session, over a psycopg2 connection
as the calling role (password from PGPASSFILE), giving bitwise the state a worker
session's ``__run_unit`` gives; failures roll back and come back as results."""
from __future__ import annotations

import json
import time

import pytest

from cerebro_db.remote import unit as remote_unit

from ..helpers import server_params
from .conftest import fit, q

pytestmark = pytest.mark.db

OPTIONS = {"attempt": 0, "completes_epoch": False, "keep_previous": False}


def call(role, fit_id, **kw):
    c = {"db": {"host": "127.0.0.1", "port": int(server_params()["port"]),
                "dbname": role.dbname, "user": role.name, "options": {}},
         "schema": "cerebro_db", "application_name": "cerebro_db test remote worker 0",
         "settings": {}, "fit_id": fit_id, "mst_key": 1, "epoch": 2, "partition": 0,
         "worker": 0, "kind": "train", "options": OPTIONS}
    c.update(kw)
    return c


def current_state(admin, fit_id):
    return [bytes(r[0]) for r in q(admin, "SELECT data FROM cerebro_db.model_states WHERE "
                                          "fit_id = %s AND mst_key = 1 AND version = 'current' "
                                          "ORDER BY chunk", (fit_id,))]


def set_state(admin, fit_id, chunks):
    q(admin, "DELETE FROM cerebro_db.model_states WHERE fit_id = %s AND mst_key = 1 AND "
             "version = 'current'", (fit_id,))
    for i, c in enumerate(chunks):
        q(admin, "INSERT INTO cerebro_db.model_states (fit_id, mst_key, version, chunk, data, "
                 "owner) VALUES (%s, 1, 'current', %s, %s, (SELECT owner FROM cerebro_db.fits "
                 "WHERE fit_id = %s))", (fit_id, i, c, fit_id))


def test_run_call_equals_worker_session_unit(role, radmin, passfile, monkeypatch):
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    monkeypatch.delenv("PGPASSWORD", raising=False)
    c = role.connect()
    fit_id = fit(c, "rc_out", iterations=1)
    before = current_state(radmin, fit_id)
    units = q(radmin, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s", (fit_id,))[0][0]

    res = remote_unit.run_call(call(role, fit_id))
    assert res["ok"], res
    assert 0 <= res["read_seconds"] <= res["seconds"]  # what the policy prices reads with
    remote_state = current_state(radmin, fit_id)
    assert remote_state != before
    row = q(radmin, "SELECT owner::text, worker, kind, rows FROM cerebro_db.units WHERE "
                    "fit_id = %s AND epoch = 2", (fit_id,))
    assert row == [(role.name, 0, "train", res["rows"])]
    # the connection is the calling role's, with the worker sessions' settings (between
    # units it shows no fit's worker name)
    db = remote_unit._state["db"]
    got = db.execute("SELECT current_user::text AS u, current_setting('search_path') AS p, "
                     "current_setting('application_name') AS a")[0]
    db.rollback()
    assert got == {"u": role.name, "p": "pg_catalog, pg_temp",
                   "a": remote_unit.IDLE_APPLICATION}

    # the same unit in a worker session (__run_unit), from the same state
    set_state(radmin, fit_id, before)
    q(radmin, "DELETE FROM cerebro_db.units WHERE fit_id = %s AND epoch = 2", (fit_id,))
    out = q(c, "SELECT cerebro_db.__run_unit(%s, 1, 2, 0, 0, 'train', %s)",
            (fit_id, json.dumps(OPTIONS)))[0][0]
    assert json.loads(out)["ok"], out
    assert 0 <= json.loads(out)["read_seconds"] <= json.loads(out)["seconds"]
    assert current_state(radmin, fit_id) == remote_state
    assert q(radmin, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s",
             (fit_id,))[0][0] == units + 1
    c.close()


def test_failed_unit_rolls_back_and_reports(role, radmin, passfile, monkeypatch):
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    c = role.connect()
    fit_id = fit(c, "rc_fail", iterations=1)
    n = q(radmin, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s", (fit_id,))[0][0]
    # no state at epoch 5: an eval unit fails inside run_unit
    res = remote_unit.run_call(call(role, fit_id, kind="eval", epoch=5))
    assert not res["ok"] and "no state of configuration 1 at epoch 5" in res["message"]
    res = remote_unit.run_call(call(role, 10**9))
    assert not res["ok"] and res["sqlstate"] == "42704", res
    assert q(radmin, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s",
             (fit_id,))[0][0] == n
    # the connection is usable after the failures
    assert remote_unit.run_call(call(role, fit_id))["ok"]
    # a connection whose backend was ended between units (a resume ends an interrupted
    # fit's workers) is opened again by the next call, which runs through
    db = remote_unit._state["db"]
    pid = db.execute("SELECT pg_backend_pid() AS p")[0]["p"]
    db.rollback()
    assert q(radmin, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                     "usename = %s AND application_name = %s AND pid = %s",
             (role.name, remote_unit.IDLE_APPLICATION, pid)) == [(1,)]
    time.sleep(0.5)
    assert remote_unit.run_call(call(role, fit_id, epoch=3))["ok"]
    c.close()


def test_connection_options_refuse_passwords(role, passfile, monkeypatch):
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    res = remote_unit.run_call(call(role, 1, db={"host": "127.0.0.1", "port": 1,
                                                  "dbname": "x", "user": "y",
                                                  "options": {"password": "s3cret"}}))
    assert not res["ok"] and "may not hold a password" in res["message"]
    assert "s3cret" not in json.dumps(res)


def test_wrong_role_password_is_a_clear_failure(role, tmp_path, monkeypatch):
    empty = tmp_path / "pgpass"
    empty.write_text("")
    empty.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(empty))
    monkeypatch.delenv("PGPASSWORD", raising=False)
    remote_unit._state.update(db=None, key=None, applied=None)
    res = remote_unit.run_call(call(role, 1))
    assert not res["ok"] and "could not connect to the database" in res["message"], res
