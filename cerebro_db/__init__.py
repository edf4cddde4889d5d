"""cerebro_db: in-database deep-learning model selection for PostgreSQL.

The package is importable without a database, PL/Python or TensorFlow: modules that
need Keras import it inside functions, and only ``catalog`` and ``executors`` talk to
the database, through a ``plpy``-like object handed to them.
"""
from __future__ import annotations

import os as _os

__version__ = "0.2.0"

#: TensorFlow's oneDNN kernels, on unless the environment says otherwise. TensorFlow reads
#: ``TF_ENABLE_ONEDNN_OPTS`` once, at its import, and on x86 CPUs without AVX-512 (AVX2
#: ones, like the benchmark machine's before 2026-11-29) leaves oneDNN off by default; with it on, a small
#: CNN's training pass (batch 64) over 30,000 rows of 784 features took 3.8-4.4 s instead of 7.7-8.8 s
#: on one thread and its evaluation 1.2-1.3 s instead of 3.5-4.4 s (an MLP's training
#: 0.45-0.50 s instead of 0.40-0.43 s). This package's modules import TensorFlow only
#: inside functions, after this line ran, so the setting is in place when TensorFlow reads
#: it, in worker sessions, remote workers and a client's replay alike (unless that process
#: imported TensorFlow before cerebro_db): results are bitwise reproducible only between
#: processes that use the same kernels. ``TF_ENABLE_ONEDNN_OPTS=0`` in the
#: server's (and remote workers') environment keeps TensorFlow's default kernels.
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
_os.environ.setdefault(ONEDNN_ENV, "1")

if "plpy" in __import__("sys").modules:  # inside a PostgreSQL backend: see cerebro_db.native
    from . import native as _native

    _native.install()
