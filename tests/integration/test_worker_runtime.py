"""A worker session's TensorFlow, in a real backend: imported without the packages Keras
imports only to support them (worker.UNUSED_BY_WORKERS), and Keras works on the arrays a
worker gives it."""
from __future__ import annotations

from ..helpers import connect

PROBE = """
DO $$
import sys
from cerebro_db import worker
assert "tensorflow" not in sys.modules, "a fresh backend has not imported TensorFlow"
worker._runtime(1)
absent = [m for m in worker.UNUSED_BY_WORKERS if m in sys.modules]
import keras
import numpy as np
m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
h = m.fit(np.ones((8, 3), np.float32), np.zeros(8, np.int32), batch_size=4, verbose=0)
import pandas
plpy.notice("absent=%s loss=%d pandas=%s" % (absent, len(h.history["loss"]),
                                             pandas.DataFrame({"a": [1]}).shape))
$$ LANGUAGE plpython3u
"""


def test_worker_imports_tensorflow_without_pandas_and_matplotlib(dbname):
    c = connect(dbname, autocommit=True)  # a fresh backend: nothing imported yet
    try:
        with c.cursor() as cur:
            cur.execute(PROBE)
        assert c.notices[-1].strip() == "NOTICE:  absent=[] loss=1 pandas=(1, 1)"
    finally:
        c.close()
