"""Fixtures of the integration modules: ``madlib_conn`` (a database with the extension in
schema ``madlib`` and the iris tables, for the MADlib compatibility modules)."""
from .madlib_compat_common import madlib_conn  # noqa: F401 - a fixture
