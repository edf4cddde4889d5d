"""catalog.session.conninfo: a libpq URI whose values cannot add parameters."""
from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from cerebro_db.catalog.session import conninfo


def test_conninfo_values_round_trip_and_add_no_parameter():
    params = {"dbname": "it's a db&host=evil", "user": "u=1 password=x", "port": "5432",
              "host": "/var/run/post gres"}
    uri = conninfo(**params)
    parts = urlsplit(uri)
    assert (parts.scheme, parts.netloc, parts.path) == ("postgresql", "", "")
    assert dict(parse_qsl(parts.query, strict_parsing=True)) == params
    assert " " not in uri and "'" not in uri
