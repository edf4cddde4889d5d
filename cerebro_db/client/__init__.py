"""A Python client of a cerebro_db database, on SQLAlchemy 2 (``pip install cerebro_db[client]``).

    from cerebro_db.client import Client
    c = Client("postgresql://user@host/db")      # or Client(engine), Client(connection)
    c.fits()                                     # DataFrame of fits and their progress
    c.watch(fit_id)                              # progress bar from another connection
    c.plot_gantt(fit_id, "gantt.png")

Importable without TensorFlow or a database driver (the driver, psycopg2, is loaded by
SQLAlchemy when the engine first connects); matplotlib is imported by the plots only.
"""
from __future__ import annotations

from .core import Client, ClientError, url_from_env

__all__ = ["Client", "ClientError", "url_from_env"]
