"""Print the demo's model architectures as Keras JSON: `python demo/archs.py mlp|cnn`."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras


def mlp() -> keras.Model:
    return keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ], name="fashion_mlp")


def cnn() -> keras.Model:
    return keras.Sequential([
        keras.Input((784,)),
        keras.layers.Reshape((28, 28, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ], name="fashion_cnn")


if __name__ == "__main__":
    print({"mlp": mlp, "cnn": cnn}[sys.argv[1]]().to_json())
