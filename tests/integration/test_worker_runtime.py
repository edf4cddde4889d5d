"""A worker session's TensorFlow, in a real backend: imported through the worker entry point
(``__check_fit``) without the packages Keras imports only to support them
(worker.UNUSED_BY_WORKERS) and with what the import made frozen out of the garbage
collector's passes (worker._collector_paused), the collector on again afterwards, oneDNN's
kernels on (cerebro_db's default, set before TensorFlow's import), Keras working on the
arrays a worker gives it; a process that is not a worker session (a remote
worker, the caller's own session) imports them as usual and freezes nothing."""
from __future__ import annotations

import json

import pytest

from ..helpers import connect

SPEC = json.dumps({"configs": [], "x_size": 3, "y_width": 1, "kind": "classification",
                   "columns": [["x"], ["y"], [3], [1], ["classification"]],
                   "worker_threads": 1})
PROBE = """
DO $$
import gc, sys
from cerebro_db import worker
import keras
absent = [m for m in worker.UNUSED_BY_WORKERS if m not in sys.modules]
import numpy as np
m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
h = m.fit(np.ones((8, 3), np.float32), np.zeros(8, np.int32), batch_size=4, verbose=0)
import pandas, scipy.sparse
from tensorflow.python.util import _pywrap_util_port
plpy.notice("absent=%s loss=%d pandas=%s scipy=%s frozen=%s collector=%s onednn=%s" % (
    absent, len(h.history["loss"]), pandas.DataFrame({"a": [1]}).shape,
    scipy.sparse.eye(2).nnz,
    gc.get_freeze_count() > 100000, gc.isenabled(), _pywrap_util_port.IsMklEnabled()))
$$ LANGUAGE plpython3u
"""


@pytest.mark.parametrize("first, absent, frozen", [
    # a worker session: its entry point imports TensorFlow without them, then freezes
    ("SELECT cerebro_db.__check_fit(%s)::json->>'ok'",
     "['pandas', 'matplotlib', 'scipy', 'PIL']", True),
    # any other session (here: TensorFlow imported by the probe itself)
    ("SELECT 'true' WHERE %s IS NOT NULL", "[]", False),
])
def test_only_worker_sessions_import_tensorflow_without_the_unused_packages(
        dbname, first, absent, frozen):
    c = connect(dbname, autocommit=True)  # a fresh backend: nothing imported yet
    try:
        with c.cursor() as cur:
            cur.execute(first, (SPEC,))
            assert cur.fetchone()[0] == "true"
            cur.execute(PROBE)
        assert c.notices[-1].strip() == (f"NOTICE:  absent={absent} loss=1 pandas=(1, 1) scipy=2 "
                                         f"frozen={frozen} collector=True onednn=True")
    finally:
        c.close()


POKE_PROBE = """
DO $$
import json
from cerebro_db.wakeup import Waker
w = Waker()
try:
    before = w.wait(0.0)
    out = plpy.execute("SELECT cerebro_db.__run_unit(-1, 1, 1, 0, 0, 'train', %s) AS r"
                       % plpy.quote_literal(json.dumps({"wake": w.name})))[0]["r"]
    plpy.notice("before=%d ok=%s pokes=%d" % (before, json.loads(out)["ok"], w.wait(10.0)))
finally:
    w.close()
$$ LANGUAGE plpython3u
"""


def test_a_unit_pokes_the_coordinators_socket_when_it_ends_even_when_it_fails(dbname):
    """The real entry point in a real backend: the server's OS user can bind the socket
    and reach it, and a unit that fails (here: no such fit) still wakes the coordinator."""
    c = connect(dbname, autocommit=True)
    try:
        with c.cursor() as cur:
            cur.execute(POKE_PROBE)
        assert c.notices[-1].strip() == "NOTICE:  before=0 ok=False pokes=1"
    finally:
        c.close()
