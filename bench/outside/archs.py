import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
import keras
from keras import layers


def mlp1():
    return keras.Sequential([keras.Input((784,)), layers.Dense(128, activation='relu'), layers.Dense(10, activation='softmax')])
def mlp2():
    return keras.Sequential([keras.Input((784,)), layers.Dense(256, activation='relu'), layers.Dense(128, activation='relu'), layers.Dense(10, activation='softmax')])
def cnn():
    return keras.Sequential([keras.Input((784,)), layers.Reshape((28, 28, 1)),
        layers.Conv2D(16, 3, activation='relu'), layers.MaxPooling2D(),
        layers.Conv2D(32, 3, activation='relu'), layers.MaxPooling2D(),
        layers.Flatten(), layers.Dense(64, activation='relu'), layers.Dense(10, activation='softmax')])
ARCHS = {'mlp1': mlp1, 'mlp2': mlp2, 'cnn': cnn}
if __name__ == '__main__':
    print(ARCHS[sys.argv[1]]().to_json())
