"""The names of cerebro_db's configuration settings, and the check for names that are none of
them.

PostgreSQL takes any ``cerebro_db.<name>`` as a placeholder setting without complaint (no
loaded C library reserves the prefix), so a misspelt ``SET cerebro_db.eval_bundel = 8`` or
``ALTER DATABASE d SET cerebro_db.max_unit_retry = 0`` would do nothing, silently. Fits and
preprocessing warn about such names (:func:`unknown_settings`; the caller reads the names
from ``pg_settings`` and emits the warnings). Each setting's meaning is documented where
it is read (the module owning the constant named in the comment).
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable

PREFIX = "cerebro_db."

KNOWN = frozenset({
    "cerebro_db.allowed_executors",           # remote/executor.py
    "cerebro_db.cache_memory",                # worker.py
    "cerebro_db.caller_search_path",          # entrypoints/__init__.py (set by the wrappers)
    "cerebro_db.eval_bundle",                 # sessions.py
    "cerebro_db.executor",                    # remote/__init__.py
    "cerebro_db.keep_workers_as_maintainer",  # sessions.py
    "cerebro_db.max_unit_retries",            # sessions.py
    "cerebro_db.num_partitions",              # entrypoints/preprocessing.py
    "cerebro_db.pipeline_depth",              # sessions.py
    "cerebro_db.remote_conninfo",             # remote/executor.py
    "cerebro_db.remote_dbhost",               # remote/executor.py
    "cerebro_db.replicas",                    # sessions.py
    "cerebro_db.state_chunk_size",            # fitrun.py
    "cerebro_db.tensorboard_log_dir",         # params.py
    "cerebro_db.test_hook",                   # sessions.py (tests)
    "cerebro_db.training_metrics",            # fitrun.py
    "cerebro_db.unit_timeout",                # sessions.py
    "cerebro_db.unit_timeout_factor",         # sessions.py
    "cerebro_db.unit_timeout_first",          # sessions.py
    "cerebro_db.unit_timeout_floor",          # sessions.py
    "cerebro_db.worker_conninfo",             # sessions.py
    "cerebro_db.worker_idle_timeout",         # sessions.py
})


def unknown_settings(names: Iterable[str]) -> list[str]:
    """One warning text per ``cerebro_db.*`` name in ``names`` that cerebro_db does not
    read, with the closest known name when there is one (sorted, each name once)."""
    out = []
    for name in sorted({n for n in names if n.lower().startswith(PREFIX)}):
        if name.lower() in KNOWN:
            continue
        close = difflib.get_close_matches(name.lower(), sorted(KNOWN), n=1, cutoff=0.75)
        hint = f'; did you mean "{close[0]}"?' if close else ""
        out.append(f'unrecognized configuration parameter "{name}": cerebro_db reads no '
                   f"such setting, so it has no effect{hint}")
    return out
