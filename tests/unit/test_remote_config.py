"""cerebro_db.executor and cerebro_db.remote_conninfo parsing (no database)."""
from __future__ import annotations

import importlib.util

import pytest

from cerebro_db.errors import CerebroError
from cerebro_db.remote import ExecutorURL, parse_executor, require_package
from cerebro_db.remote.executor import parse_conninfo


@pytest.mark.parametrize("text", [None, "", "sessions", "  sessions "])
def test_sessions(text):
    assert parse_executor(text) is None


@pytest.mark.parametrize("text,engine,address", [
    ("dask://10.0.0.5:8786", "dask", "tcp://10.0.0.5:8786"),
    ("dask+tls://sched.example.org:8786", "dask", "tls://sched.example.org:8786"),
    ("ray://head-node:10001", "ray", "ray://head-node:10001"),
    ("dask://[::1]:8786", "dask", "tcp://[::1]:8786"),
])
def test_engines(text, engine, address):
    assert parse_executor(text) == ExecutorURL(engine, address, text)


@pytest.mark.parametrize("text,why", [
    ("dask", "not a URL"),
    ("spark://h:7077", 'unknown executor "spark"'),
    ("dask://h", "expected scheme://host:port"),
    ("dask://h:0", "expected scheme://host:port"),
    ("dask://h:70000", "expected scheme://host:port"),
    ("ray://h:1/path", "expected scheme://host:port"),
    ("ray://user:secret@h:1", "may not hold credentials"),
])
def test_bad_urls(text, why):
    with pytest.raises(CerebroError) as e:
        parse_executor(text)
    assert e.value.sqlstate == "22023" and why in e.value.message
    assert e.value.message.startswith("invalid value for cerebro_db.executor")
    assert "dask://host:port" in e.value.hint
    assert "secret" not in e.value.message


def test_missing_package(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(CerebroError) as e:
        require_package(parse_executor("ray://h:10001"))
    assert e.value.sqlstate == "58000" and '"ray" is not installed' in e.value.message
    assert "pip install 'cerebro_db[ray]'" in e.value.hint


def test_conninfo():
    assert parse_conninfo(None) == {}
    assert parse_conninfo("sslmode=verify-full  sslrootcert='/etc/a b.crt' connect_timeout=5") \
        == {"sslmode": "verify-full", "sslrootcert": "/etc/a b.crt", "connect_timeout": "5"}
    for bad in ("password=x", "sslmode=require PassWord='s3cret'"):
        with pytest.raises(CerebroError) as e:
            parse_conninfo(bad)
        assert e.value.sqlstate == "22023" and "may not hold a password" in e.value.message
        assert "s3cret" not in e.value.message
    with pytest.raises(CerebroError):
        parse_conninfo("sslmode")


@pytest.mark.parametrize("bad", ["user=postgres", "sslmode=require dbname=other",
                                 "host=10.1.1.1", "HOSTADDR=10.1.1.1", "port=5433",
                                 "service=prod"])
def test_conninfo_may_not_say_who_or_where(bad):
    """The remote workers log in as the calling role to the fit's database (host:
    remote_dbhost); a user= in remote_conninfo made every role's units run as that user (an
    outside pass)."""
    with pytest.raises(CerebroError) as e:
        parse_conninfo(bad)
    assert e.value.sqlstate == "22023" and "cerebro_db sets it" in e.value.message


def test_host_names_and_sessions_compare_case_insensitively():
    assert parse_executor("SESSIONS") is None
    assert parse_executor("dask://LOCALHOST:8786").address == "tcp://localhost:8786"


def test_a_malformed_allowed_entry_is_said_when_nothing_allows_the_cluster():
    from cerebro_db.remote.executor import require_allowed

    url = parse_executor("dask://127.0.0.1:18786")
    require_allowed(url, "ray://h:1, DASK://127.0.0.1:18786")  # listed (scheme case)
    with pytest.raises(CerebroError) as e:  # a forgotten comma
        require_allowed(url, "dask://127.0.0.1:18786 ray://127.0.0.1:20001, garbage")
    assert e.value.sqlstate == "42501"
    assert "'dask://127.0.0.1:18786 ray://127.0.0.1:20001'" in e.value.detail
    assert "'garbage'" in e.value.detail
    with pytest.raises(CerebroError) as e:  # well formed, just not listed: no detail
        require_allowed(url, "dask://127.0.0.1:1")
    assert e.value.detail is None
