"""PostgreSQL's LLVM JIT and TensorFlow in one backend: a session that JIT-compiled a query
before its first TensorFlow import crashed the backend (and so restarted the server) before
cerebro_db.native loaded TensorFlow's libraries with RTLD_DEEPBIND."""
from __future__ import annotations

import pytest

from ..helpers import connect, q

pytestmark = pytest.mark.db


def _maps_have(conn, needle: str) -> bool:
    """Whether the backend of ``conn`` has a library whose path holds ``needle`` mapped."""
    pid = q(conn, "SELECT pg_backend_pid()")[0][0]
    try:
        with open(f"/proc/{pid}/maps") as f:
            return needle in f.read()
    except OSError:
        pytest.skip("the server's /proc/<pid>/maps cannot be read from here")


def test_tensorflow_loads_after_a_jit_compiled_query(rel_db):
    c = connect(rel_db, autocommit=True)
    try:
        q(c, "SET jit = on")
        q(c, "SET jit_above_cost = 0")
        plan = q(c, "EXPLAIN (ANALYZE, FORMAT JSON) SELECT sum(g) FROM generate_series(1, 1000) g")
        if "JIT" not in plan[0][0][0]:
            pytest.skip("this server has no JIT provider (llvmjit)")
        assert _maps_have(c, "llvmjit")
        assert not _maps_have(c, "tensorflow")
        q(c, "SELECT gpu_configuration('jit_gpus')")  # imports TensorFlow in this backend
        assert _maps_have(c, "tensorflow")
        assert q(c, "SELECT count(*) FROM jit_gpus")[0][0] == 0
        # and the JIT still works beside it
        assert q(c, "SELECT sum(g) FROM generate_series(1, 1000) g")[0][0] == 500500
        q(c, "DROP TABLE jit_gpus")
    finally:
        c.close()
