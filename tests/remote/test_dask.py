"""Fits on a real local Dask cluster (a scheduler and two worker processes on loopback,
logging in to the database with the test role's password from their PGPASSFILE): the same
SQL fit gives bitwise the weights of the sessions executor for a fixed seed, its units
ran in the Dask worker processes, and no password reaches a table or a notice."""
from __future__ import annotations

import pytest

from .conftest import fit, q, weights

pytestmark = pytest.mark.db


def use(conn, executor):
    if executor is None:
        q(conn, "RESET cerebro_db.executor")
    else:
        q(conn, "SET cerebro_db.executor = %s", (executor,))


@pytest.fixture(scope="module")
def sessions_weights(role):
    c = role.connect()
    fit(c, "eq_sessions")
    w = weights(c, "eq_sessions")
    c.close()
    return w


def test_dask_fit_equals_sessions_fit(role, radmin, dask_cluster, sessions_weights):
    c = role.connect()
    use(c, "dask://" + dask_cluster.address.split("://")[1])
    try:
        fit_id = fit(c, "eq_dask")
    finally:
        use(c, None)
    assert any("units of this fit run on dask://" in n for n in c.notices), c.notices
    assert weights(c, "eq_dask") == sessions_weights
    # every unit once, run by the Dask worker processes' connections as the calling role
    rows = q(radmin, "SELECT kind, count(*), count(DISTINCT (mst_key, epoch, partition)), "
                     "array_agg(DISTINCT owner::text) FROM cerebro_db.units WHERE fit_id = %s "
                     "GROUP BY 1 ORDER BY 1", (fit_id,))
    assert [(k, n, d) for k, n, d, _ in rows] == [("eval_train", 4, 4), ("train", 4, 4)]
    assert all(o == [role.name] for *_, o in rows)
    dask_pids = set(dask_cluster.worker_pids().values())
    assert {p for (p,) in q(radmin, "SELECT pid FROM cerebro_db.fit_workers WHERE fit_id = %s",
                            (fit_id,))} <= dask_pids
    assert q(radmin, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("done",)]
    # nothing secret left anywhere the fit wrote
    text = " ".join(str(r) for r in q(radmin, "SELECT f::text FROM cerebro_db.fits f WHERE "
                                              "fit_id = %s", (fit_id,)))
    text += " ".join(c.notices)
    assert role.password not in text
    c.close()
