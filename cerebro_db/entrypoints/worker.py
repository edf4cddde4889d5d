"""The worker side of a fit: ``__run_unit`` (internal, called through dblink)."""
from __future__ import annotations

import json
from typing import Any

from ..catalog import Catalog


def run_unit(plpy: Any, schema: str, *, fit_id: int, mst_key: int, epoch: int, partition: int,
             worker: int, kind: str, options: str) -> str:
    """Run one unit; the JSON result says ok or carries the error (never raises)."""
    from .. import worker as w

    res = w.run_unit(Catalog(plpy, schema), fit_id, mst_key, epoch, partition, worker, kind,
                     json.loads(options or "{}"))
    return json.dumps(res)
