"""cerebro_db: in-database deep-learning model selection for PostgreSQL.

The package is importable without a database, PL/Python or TensorFlow: modules that
need Keras import it inside functions, and only ``catalog`` and ``executors`` talk to
the database, through a ``plpy``-like object handed to them.
"""
from __future__ import annotations

__version__ = "0.2.0"
