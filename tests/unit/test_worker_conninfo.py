"""cerebro_db.worker_conninfo: what it may say (sessions.worker_conninfo_pairs)."""
from __future__ import annotations

import pytest

from cerebro_db.errors import CerebroError
from cerebro_db.sessions import worker_conninfo_pairs


@pytest.mark.parametrize("text, want", [
    ("password=secret", [("password", "secret")]),
    ("  password = 'a b\\'c'   sslmode=require ", [("password", "a b'c"), ("sslmode", "require")]),
    ("PASSWORD=x host=/var/run/postgresql connect_timeout=5",
     [("password", "x"), ("host", "/var/run/postgresql"), ("connect_timeout", "5")]),
    ("password=back\\\\slash", [("password", "back\\slash")]),
    ("", []),
])
def test_accepted(text, want):
    assert worker_conninfo_pairs(text) == want


@pytest.mark.parametrize("text", [
    "dbname=other", "user=postgres password=x", "port=5433 password=x", "hostaddr=10.0.0.1",
    "host=db.example.com password=x", "host=localhost password=x", "service=prod",
    "options='-c role=postgres' password=x", "passfile=/var/lib/postgresql/.pgpass",
    "sslkey=/etc/ssl/private/k password=x", "postgresql://postgres@localhost/db",
    "postgres://x", "password", "password='unterminated", "=x",
])
def test_refused(text):
    with pytest.raises(CerebroError) as e:
        worker_conninfo_pairs(text)
    assert e.value.sqlstate == "22023" and "cerebro_db.worker_conninfo" in e.value.message
    assert "calling role" in e.value.hint
