"""Shared pieces of the MADlib-compatibility tests: a small iris-like table and an MLP."""
from __future__ import annotations

from ..helpers import q

IRIS_ROWS = 60


def make_iris(conn, name: str, rows: int = IRIS_ROWS, label: str = "class_text",
              features: str = "attributes", offset: int = 0) -> None:
    """An iris-like table: 4 numeric features, 3 text classes (MADlib's example layout)."""
    q(conn, f"DROP TABLE IF EXISTS {name}")
    q(conn, f"CREATE TABLE {name} (id serial, {features} numeric[], {label} varchar)")
    q(conn, f"""INSERT INTO {name} ({features}, {label})
        SELECT ARRAY[4 + i % 3, 3 + i % 2, 1 + i % 5, 0.2 * (i % 4)],
               (ARRAY['Iris-setosa', 'Iris-versicolor', 'Iris-virginica'])[i % 3 + 1]
          FROM generate_series({offset + 1}, {offset + rows}) i""")


COMPILE = "loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', metrics=['accuracy']"
FIT = "batch_size=8, epochs=1"
