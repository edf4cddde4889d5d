"""Try Cerebro's own implementation (PyPI ``cerebro-dl``, Spark backend, local Spark).

Run by bench/cerebro_dl_try.sh in a throwaway virtual environment (never the project's):
a grid of 2 learning rates on 1,000 Fashion-MNIST rows, 1 epoch, 2 Spark workers. Prints
what happened; the notes in bench/results/cerebro_dl.md come from its output.
"""
from __future__ import annotations

import gzip
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROWS = 1000


def images(d: Path) -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(d / "train-images-idx3-ubyte.gz", "rb") as f:
        raw = f.read()
    n, r, c = struct.unpack_from(">III", raw, 4)
    x = np.frombuffer(raw, np.uint8, n * r * c, 16).reshape(n, r * c)[:ROWS] / 255.0
    with gzip.open(d / "train-labels-idx1-ubyte.gz", "rb") as f:
        y = np.frombuffer(f.read(), np.uint8, n, 8)[:ROWS]
    return x.astype(np.float32), y


def main() -> None:
    import tensorflow as tf
    from cerebro.backend import SparkBackend
    from cerebro.keras import SparkEstimator
    from cerebro.storage import LocalStore
    from cerebro.tune import GridSearch, hp_choice
    from pyspark.sql import SparkSession

    x, y = images(Path(sys.argv[1]))
    spark = (SparkSession.builder.master("local[2]").appName("cerebro-dl-try")
             .config("spark.ui.enabled", "false").getOrCreate())
    rows = [(x[i].tolist(), np.eye(10)[y[i]].tolist()) for i in range(ROWS)]
    df = spark.createDataFrame(rows, ["features", "label"])
    backend = SparkBackend(spark_context=spark.sparkContext, num_workers=2)
    store = LocalStore(prefix_path=tempfile.mkdtemp(prefix="cerebro_dl_store_"))

    def estimator_gen_fn(params):
        inputs = tf.keras.Input(shape=(784,))
        h = tf.keras.layers.Dense(64, activation="relu")(inputs)
        out = tf.keras.layers.Dense(10, activation="softmax")(h)
        model = tf.keras.Model(inputs, out)
        opt = getattr(tf.keras.optimizers, "legacy", tf.keras.optimizers).Adam
        return SparkEstimator(model=model, optimizer=opt(learning_rate=params["lr"]),
                              loss="categorical_crossentropy", metrics=["acc"],
                              batch_size=params["batch_size"])

    t0 = time.perf_counter()
    ms = GridSearch(backend, store, estimator_gen_fn,
                    {"lr": hp_choice([0.001, 0.01]), "batch_size": hp_choice([64])},
                    num_epochs=1, evaluation_metric="loss", label_columns=["label"],
                    feature_columns=["features"], validation=0.25, verbose=1)
    model = ms.fit(df)
    print(f"cerebro-dl grid search finished in {time.perf_counter() - t0:.1f} s; "
          f"best model: {model}")


if __name__ == "__main__":
    main()
