"""Sequential Keras baseline. Usage: seq_keras.py WORKLOAD THREADS INPUT SPE VBS [tag]
WORKLOAD: A (8 MLP, 60k, 3 ep) | B (4 CNN, 60k, 2 ep) | C (8 MLP, 20k, 3 ep)
INPUT: numpy | tfdata ; SPE: steps_per_execution (0 = one full pass) ; VBS: validation batch size (0 = = batch size)
TF_ENABLE_ONEDNN_OPTS taken from the environment."""
import json
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
t_start = time.time()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
wl, threads, inp, spe, vbs = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
tag = sys.argv[6] if len(sys.argv) > 6 else ''
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(threads)
tf.config.threading.set_inter_op_parallelism_threads(threads)
import keras
import numpy as np
from archs import ARCHS

t_import = time.time() - t_start
from common import load

t0 = time.time()
xtr, ytr, xte, yte = load()
nrows = 20000 if wl == 'C' else 60000
xtr, ytr = xtr[:nrows], ytr[:nrows]
if os.environ.get('HALF'):
    h0 = int(os.environ['HALF']); nrows = nrows // 2; xtr, ytr = xtr[h0*nrows:(h0+1)*nrows], ytr[h0*nrows:(h0+1)*nrows]
Ytr = np.eye(10, dtype=np.float32)[ytr]; Yte = np.eye(10, dtype=np.float32)[yte]
t_load = time.time() - t0
archs = ['cnn'] if wl == 'B' else ['mlp1', 'mlp2']
epochs = 2 if wl == 'B' else 3
configs = [(a, lr, bs) for a in archs for lr in (1e-3, 1e-4) for bs in (64, 256)]
res = []
T0 = time.time()
for a, lr, bs in configs:
    c0 = time.time()
    keras.utils.set_random_seed(1)
    m = ARCHS[a]()
    steps = -(-nrows // bs)
    m.compile(optimizer=keras.optimizers.Adam(learning_rate=lr), loss='categorical_crossentropy',
              metrics=['accuracy'], steps_per_execution=(steps if spe == 0 else spe))
    v = vbs or bs
    if inp == 'numpy':
        h = m.fit(xtr, Ytr, batch_size=bs, epochs=epochs, validation_data=(xte, Yte),
                  validation_batch_size=v, verbose=0)
    else:
        ds = tf.data.Dataset.from_tensor_slices((xtr, Ytr)).shuffle(nrows, reshuffle_each_iteration=True).batch(bs).prefetch(tf.data.AUTOTUNE)
        vds = tf.data.Dataset.from_tensor_slices((xte, Yte)).batch(v).cache().prefetch(tf.data.AUTOTUNE)
        h = m.fit(ds, epochs=epochs, validation_data=vds, verbose=0)
    res.append({'cfg': f'{a} lr={lr} bs={bs}', 's': round(time.time()-c0, 2),
                    'val_acc': [round(x, 4) for x in h.history['val_accuracy']],
                    'train_acc': [round(x, 4) for x in h.history['accuracy']]})
total = time.time() - T0
print(json.dumps({'system': 'keras', 'wl': wl, 'tag': tag, 'threads': threads, 'input': inp, 'spe': spe, 'vbs': vbs,
    'onednn': os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset'), 'import_s': round(t_import, 2), 'load_s': round(t_load, 2),
    'total_s': round(total, 2), 'best_val_acc': max(max(r['val_acc']) for r in res), 'configs': res,
    'load1': os.getloadavg()[0]}))
