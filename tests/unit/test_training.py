"""cerebro_db.training: build, train one unit, hop, evaluate, predict (tiny Keras models)."""
from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
keras = pytest.importorskip("keras")

from cerebro_db import keras_arch
from cerebro_db import training as T
from cerebro_db.errors import CerebroError
from cerebro_db.state import decode_state, encode_state

T.configure_runtime(threads=2)

CP = "optimizer='Adam(learning_rate=0.01)', loss='categorical_crossentropy', metrics=['accuracy']"
FP = "batch_size=32, epochs=1"


def mlp(inputs: int = 20, hidden: int = 8, outputs: int = 3, dropout: float = 0.0,
        activation: str = "softmax") -> str:
    layers = [keras.Input((inputs,)), keras.layers.Dense(hidden, activation="relu")]
    if dropout:
        layers.append(keras.layers.Dropout(dropout))
    layers.append(keras.layers.Dense(outputs, activation=activation))
    return keras.Sequential(layers).to_json()


def blobs(n: int, seed: int, inputs: int = 20, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Separable-ish random data: class centres plus noise, one-hot labels."""
    r = np.random.default_rng(seed)
    centres = np.random.default_rng(99).normal(size=(classes, inputs))
    label = r.integers(0, classes, n)
    x = (centres[label] + r.normal(size=(n, inputs))).astype(np.float32)
    return x, np.eye(classes, dtype=np.float32)[label]


ARCH = mlp()
ARCH_DROP = mlp(hidden=16, dropout=0.3)


@pytest.fixture(scope="module")
def cache() -> T.ModelCache:
    return T.ModelCache(max_models=8)


def weights_of(state: bytes) -> list[np.ndarray]:
    return list(decode_state(state).weights)


def opt_of(state: bytes) -> list[np.ndarray]:
    return list(decode_state(state).optimizer_vars)


def all_equal(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(
        p.dtype == q.dtype and p.shape == q.shape and p.tobytes() == q.tobytes()
        for p, q in zip(a, b)
    )


# --------------------------------------------------------------------------- data


def test_decode_buffer_packed_format():
    x = np.arange(24, dtype="<f4").reshape(4, 6)
    y = np.eye(3, dtype="<i2")[[0, 2, 1, 2]]
    dx, dy = T.decode_buffer(x.tobytes(), [4, 6], y.tobytes(), [4, 3], "int16")
    assert dx.dtype == np.float32 and dx.shape == (4, 6) and np.array_equal(dx, x)
    assert dy.dtype == np.float32 and np.array_equal(dy, y)
    assert not dx.flags.writeable  # zero copy
    t = np.linspace(0, 1, 4, dtype="<f4").reshape(4, 1)
    _, dt = T.decode_buffer(memoryview(x.tobytes()), (4, 6), t.tobytes(), (4, 1), "float4")
    assert np.array_equal(dt, t)
    assert T.decode_buffer(x.tobytes(), [4, 2, 3])[1] is None


def test_decode_buffer_errors():
    x = np.zeros((4, 6), "<f4").tobytes()
    y = np.zeros((4, 3), "<i2").tobytes()
    with pytest.raises(CerebroError) as exc:
        T.decode_buffer(x[:-1], [4, 6], y, [4, 3])
    assert exc.value.sqlstate == "22000" and "[4, 6]" in exc.value.message
    with pytest.raises(CerebroError) as exc:
        T.decode_buffer(x, [4, 6], np.zeros((3, 3), "<i2").tobytes(), [3, 3])
    assert exc.value.sqlstate == "22000" and "rows" in exc.value.message
    with pytest.raises(CerebroError):
        T.decode_buffer(x, [4, 6], y, [4, 3], "text")
    with pytest.raises(CerebroError):
        T.decode_buffer(x, [], y, [4, 3])


def test_fit_input_shape_reshapes_rows():
    model = keras_arch.build_from_json(keras.Sequential([
        keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(2)]).to_json())
    x = np.zeros((5, 784), np.float32)
    out = T.fit_input_shape(x, model)
    assert out.shape == (5, 28, 28, 1) and np.shares_memory(out, x)
    same = np.zeros((5, 28, 28, 1), np.float32)
    assert T.fit_input_shape(same, model) is same
    with pytest.raises(CerebroError) as exc:
        T.fit_input_shape(np.zeros((5, 780), np.float32), model)
    assert exc.value.sqlstate == "42804"
    assert "(780,)" in exc.value.message and "(28, 28, 1)" in exc.value.message


# --------------------------------------------------------------------------- initial state


def test_initial_state_does_not_depend_on_other_threads_drawing_random_numbers():
    """A remote worker process (Dask, Ray) has other threads that draw from Python's global
    ``random`` while a unit builds the initial model; the weights must not change."""
    import random
    import threading

    base = T.initial_state(ARCH, CP, seed=5)
    stop = threading.Event()

    def draw() -> None:
        while not stop.is_set():
            random.random()

    t = threading.Thread(target=draw, daemon=True)
    t.start()
    try:
        states = [T.initial_state(ARCH, CP, seed=5) for _ in range(5)]
    finally:
        stop.set()
        t.join()
    assert all(s == base for s in states)


def test_initial_state_is_reproducible_and_has_optimizer_vars():
    a = T.initial_state(ARCH, CP, seed=5)
    b = T.initial_state(ARCH, CP, seed=5)
    c = T.initial_state(ARCH, CP, seed=6)
    assert a == b
    assert not all_equal(weights_of(a), weights_of(c))
    state = decode_state(a)
    # Adam: iteration, learning_rate, then momentum/velocity per trainable variable
    assert len(state.optimizer_vars) == 2 + 2 * len(state.weights)
    assert int(state.optimizer_vars[0]) == 0
    assert float(state.optimizer_vars[1]) == pytest.approx(0.01)
    assert all(not v.any() for v in state.optimizer_vars[2:])
    assert state.counters() == {"epochs_done": 0, "units_done": 0, "samples_seen": 0}
    assert state.info["seed"] == 5


def _cnn_arch() -> str:
    import keras

    m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                          keras.layers.BatchNormalization(), keras.layers.Flatten(),
                          keras.layers.Dropout(0.2), keras.layers.Dense(3, activation="softmax")])
    return m.to_json()


@pytest.mark.parametrize("arch", ["mlp", "dropout", "cnn"])
def test_initial_weights_are_set_random_seeds_and_leave_tensorflows_seed(cache, arch):
    """The initial weights equal what ``keras.utils.set_random_seed(seed)`` and a build give,
    after other work in the process; TensorFlow's global seed is left as it was (setting
    it clears every kernel TensorFlow cached: each traced function was optimized again)."""
    import keras
    import tensorflow as tf

    text = {"mlp": ARCH, "dropout": ARCH_DROP, "cnn": _cnn_arch()}[arch]
    x, y = blobs(64, seed=1)
    if arch != "cnn":
        T.train_unit(cache, text, CP, FP, T.initial_state(text, CP, 1), x, y, seed=2)
    before = tf.compat.v1.get_seed(None)  # (global seed, an op seed drawn from it)
    got = weights_of(T.initial_state(text, CP, seed=987_654))
    assert tf.compat.v1.get_seed(None)[0] == before[0]
    keras.utils.set_random_seed(987_654)
    try:
        want = [v.numpy() for v in keras_arch.build_from_json(text).weights]
    finally:
        tf.random.set_seed(before[0])
    assert len(got) == len(want) and all_equal(got, want)


def test_initial_state_transfer_weights():
    base = weights_of(T.initial_state(ARCH, CP, seed=1))
    flat = keras_arch.weights_to_bytes([np.full_like(w, 0.5) for w in base])
    state = T.initial_state(ARCH, CP, seed=1, init_weights=flat)
    assert all((w == 0.5).all() for w in weights_of(state))
    with pytest.raises(CerebroError):
        T.initial_state(ARCH, CP, seed=1, init_weights=flat[:-4])


# --------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def fashion() -> tuple[np.ndarray, np.ndarray]:
    from tooling.datasets import find_dataset_dir, load_split

    try:
        x, y = load_split(find_dataset_dir("fashion-mnist"), "t10k")
    except FileNotFoundError as e:
        pytest.skip(reason=f"fashion-mnist not available: {e}")
    x = (x[:512].reshape(512, 784) / 255.0).astype(np.float32)
    return x, np.eye(10, dtype=np.float32)[y[:512]]


def test_train_unit_lowers_loss_on_fashion_mnist(cache, fashion):
    # the model takes (28, 28, 1) images; packed rows are 784 floats
    arch = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                             keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")]).to_json()
    cp = "optimizer='Adam(learning_rate=0.003)', loss='categorical_crossentropy', " \
         "metrics=['accuracy']"
    x, y = fashion
    state = T.initial_state(arch, cp, seed=0)
    before = T.evaluate(cache, arch, cp, state, x, y, batch_size=128)
    losses = []
    for i in range(3):
        state, res = T.train_unit(cache, arch, cp, "batch_size=64", state, x, y, seed=i)
        losses.append(res.loss)
        assert res.rows == 512 and res.seconds > 0 and "accuracy" in res.metrics
    after = T.evaluate(cache, arch, cp, state, x, y, batch_size=128)
    assert losses[-1] < losses[0]
    assert after.loss < 0.7 * before.loss and after.metrics["accuracy"] > 0.6
    s = decode_state(state)
    assert s.units_done == 3 and s.samples_seen == 3 * 512
    assert int(s.optimizer_vars[0]) == 3 * 8  # 8 batches of 64 per unit


def test_seed_controls_the_unit(cache):
    x, y = blobs(100, 1)
    init = T.initial_state(ARCH_DROP, CP, seed=3)
    a, _ = T.train_unit(cache, ARCH_DROP, CP, FP, init, x, y, seed=1)
    b, _ = T.train_unit(cache, ARCH_DROP, CP, FP, init, x, y, seed=1)
    c, _ = T.train_unit(cache, ARCH_DROP, CP, FP, init, x, y, seed=2)
    assert a == b
    assert not all_equal(weights_of(a), weights_of(c))


def test_a_pass_is_one_call_of_the_traced_loop_with_keras_fits_result(cache):
    """Without steps_per_execution in compile_params a unit runs its batches in one call of
    the model's traced training loop, and ends bitwise where Keras' fit with one batch per
    call ends (dropout included), with the same loss and metrics; per-batch callbacks and
    steps_per_epoch get Keras' fit with one batch per call, and a user's
    steps_per_execution is kept."""
    x, y = blobs(300, 5)  # 10 batches, the last partial
    init = T.initial_state(ARCH_DROP, CP, seed=5)
    ours, first = T.train_unit(cache, ARCH_DROP, CP, FP, init, x, y, seed=9)
    entry = cache.get(ARCH_DROP, CP)
    model = entry.model
    assert model.steps_per_execution == T.STEPS_PER_EXECUTION
    loop = entry.train_fns[(20,)]
    calls = []
    entry.train_fns[(20,)] = lambda *args: calls.append(1) or loop(*args)
    try:
        again, second = T.train_unit(cache, ARCH_DROP, CP, FP, init, x, y, seed=9)
    finally:
        entry.train_fns[(20,)] = loop
    assert len(calls) == 1 and again == ours
    assert (second.loss, second.metrics) == (first.loss, first.metrics)

    cp_one = CP + ", steps_per_execution=1"
    keras_default, by_keras = T.train_unit(cache, ARCH_DROP, cp_one, FP, init, x, y, seed=9)
    assert cache.get(ARCH_DROP, cp_one).model.steps_per_execution == 1
    assert not cache.get(ARCH_DROP, cp_one).train_fns  # Keras' fit ran it
    assert all_equal(weights_of(ours), weights_of(keras_default))
    assert all_equal(opt_of(ours), opt_of(keras_default))
    assert (by_keras.loss, by_keras.metrics) == (first.loss, first.metrics)

    with_callback, _ = T.train_unit(cache, ARCH_DROP, CP, FP + ", callbacks=['TerminateOnNaN']",
                                    init, x, y, seed=9)
    assert model.steps_per_execution == 1
    assert all_equal(weights_of(with_callback), weights_of(ours))
    T.train_unit(cache, ARCH_DROP, CP, FP, init, x, y, seed=9)
    assert model.steps_per_execution == T.STEPS_PER_EXECUTION
    cp_four = CP + ", steps_per_execution=4"
    T.train_unit(cache, ARCH_DROP, cp_four, FP + ", callbacks=['TerminateOnNaN']", init, x, y, 9)
    assert cache.get(ARCH_DROP, cp_four).model.steps_per_execution == 4


def test_optimizer_state_survives_a_hop(cache):
    x, y = blobs(96, 2)
    state, _ = T.train_unit(cache, ARCH, CP, FP, T.initial_state(ARCH, CP, 1), x, y, seed=4)
    entry1 = cache.get(ARCH, CP)
    moments = [v.numpy() for v in entry1.model.optimizer.variables]
    assert int(moments[0]) == 3 and any(m.any() for m in moments[2:])
    other = T.ModelCache()
    entry2 = other.get(ARCH, CP)
    T.restore_state(entry2, CP, state)
    assert all_equal([v.numpy() for v in entry2.model.optimizer.variables], moments)
    assert all_equal(opt_of(state), moments)
    assert all_equal([w.numpy() for w in entry2.model.weights], weights_of(state))


def test_sequential_equivalence_bitwise():
    """Hopping across two workers equals single-process replay of the visit order, bitwise."""
    cp_other_lr = CP.replace("0.01", "0.3")
    cp_sgd = "optimizer='SGD(learning_rate=0.05, momentum=0.9)', loss='categorical_crossentropy'"
    fp = "batch_size=32, epochs=2"
    parts = [blobs(150, 10), blobs(110, 11), blobs(90, 12)]  # uneven: partial last batches
    visits = [0, 2, 1, 2, 0, 1]  # two epochs over three partitions
    units = [(parts[p][0], parts[p][1], 1000 + i) for i, p in enumerate(visits)]
    init = T.initial_state(ARCH_DROP, CP, seed=21)
    reference = T.replay(ARCH_DROP, CP, fp, init, units)

    workers = [T.ModelCache(), T.ModelCache()]
    others = {
        cp_other_lr: T.initial_state(ARCH_DROP, cp_other_lr, seed=22),
        cp_sgd: T.initial_state(ARCH_DROP, cp_sgd, seed=23),
    }
    state = init
    for i, (x, y, seed) in enumerate(units):
        worker = workers[i % 2]
        state, _ = T.train_unit(worker, ARCH_DROP, CP, fp, state, x, y, seed)
        # other configs use the same worker (same cached model for the lr variant)
        for cp, st in list(others.items()):
            others[cp], _ = T.train_unit(worker, ARCH_DROP, cp, fp, st, x, y, seed + 7)
    assert state == reference  # the whole state: weights, optimizer variables, counters
    assert all_equal(weights_of(state), weights_of(reference))
    assert all_equal(opt_of(state), opt_of(reference))
    assert not all_equal(weights_of(state), weights_of(init))
    # the lr variant shared the model: one build per worker per rebuild key
    for w in workers:
        assert w.misses == 2 and w.hits == 3 * len(units) // 2 - 2


def test_learning_rate_change_does_not_rebuild():
    cache = T.ModelCache()
    x, y = blobs(64, 3)
    for lr in (0.1, 0.01, 0.001):
        cp = f"optimizer='Adam(learning_rate={lr})', loss='categorical_crossentropy', " \
             "metrics=['accuracy']"
        state, res = T.train_unit(cache, ARCH, cp, FP, T.initial_state(ARCH, CP, 1), x, y, 1)
        assert float(opt_of(state)[1]) == pytest.approx(lr)
        assert float(cache.get(ARCH, cp).model.optimizer.learning_rate.numpy()) == \
            pytest.approx(lr)
    assert cache.misses == 1 and len(cache) == 1
    assert not res.rebuilt
    # a different optimizer argument (or loss) does rebuild
    cache.get(ARCH, "optimizer='Adam(learning_rate=0.1, beta_1=0.8)', "
                    "loss='categorical_crossentropy', metrics=['accuracy']")
    assert cache.misses == 2


def test_cache_lru_bound():
    cache = T.ModelCache(max_models=2)
    cps = [f"optimizer='SGD(momentum={m})', loss='mse'" for m in (0.1, 0.2, 0.3)]
    for cp in cps:
        cache.get(ARCH, cp)
    assert len(cache) == 2 and cache.evictions == 1
    cache.get(ARCH, cps[2])
    assert cache.hits == 1
    cache.get(ARCH, cps[0])  # evicted earlier: built again
    assert cache.misses == 4
    small = T.ModelCache(max_models=5, max_params=200)  # ARCH has 195 parameters
    small.get(ARCH, cps[0])
    small.get(ARCH, cps[1])
    assert len(small) == 1 and small.evictions == 1
    with pytest.raises(CerebroError):
        T.ModelCache(max_models=0)


def test_same_architecture_made_twice_shares_one_cached_model(cache):
    """Keras numbers layer names process-wide, so two JSONs of one architecture differ
    only in names: they share a cached model (no rebuild), and training through it gives
    the same state as through a model built from either JSON."""
    a, b = mlp(), mlp()
    assert a != b and keras_arch.cache_key(a) == keras_arch.cache_key(b)
    assert keras_arch.cache_key(mlp(hidden=9)) != keras_arch.cache_key(a)
    assert keras_arch.cache_key(mlp(activation="sigmoid")) != keras_arch.cache_key(a)
    x, y = blobs(64, 3)
    s0 = T.initial_state(a, CP, 5, None)
    c = T.ModelCache()
    c.get(a, CP)
    s_shared, _ = T.train_unit(c, b, CP, FP, s0, x, y, 7)
    assert c.misses == 1 and c.hits == 1
    s_own, _ = T.train_unit(T.ModelCache(), b, CP, FP, s0, x, y, 7)
    assert decode_state(s_shared).weights[0].tobytes() == decode_state(s_own).weights[0].tobytes()


def test_cache_key_keeps_graph_topology():
    i = keras.Input((4,))
    h1 = keras.layers.Dense(3)(i)
    h2 = keras.layers.Dense(3)(i)
    parallel = keras.Model(i, keras.layers.Dense(2)(keras.layers.Concatenate()([h1, h2])))
    i = keras.Input((4,))
    h1 = keras.layers.Dense(3)(i)
    h2 = keras.layers.Dense(3)(h1)
    chained = keras.Model(i, keras.layers.Dense(2)(keras.layers.Concatenate()([h1, h2])))
    assert keras_arch.cache_key(parallel.to_json()) != keras_arch.cache_key(chained.to_json())
    i = keras.Input((4,), name="custom_name")
    same = keras.Model(i, keras.layers.Dense(2)(keras.layers.Concatenate()(
        [keras.layers.Dense(3)(i), keras.layers.Dense(3)(i)])))
    assert keras_arch.cache_key(same.to_json()) == keras_arch.cache_key(parallel.to_json())
    assert '"float32"' in keras_arch.cache_key(parallel.to_json())  # dtypes are not names


def test_reset_optimizer_zeroes_moments_keeps_iteration(cache):
    x, y = blobs(64, 4)
    state, _ = T.train_unit(cache, ARCH, CP, FP, T.initial_state(ARCH, CP, 2), x, y, 1)
    assert int(opt_of(state)[0]) == 2 and any(v.any() for v in opt_of(state)[2:])
    entry = cache.get(ARCH, CP)
    T.restore_state(entry, CP, state, reset_optimizer=True)
    values = [v.numpy() for v in entry.model.optimizer.variables]
    assert int(values[0]) == 2
    assert float(values[1]) == pytest.approx(0.01)
    assert all(not v.any() for v in values[2:])
    after, _ = T.train_unit(cache, ARCH, CP, FP, state, x, y, 1, reset_optimizer=True)
    assert int(opt_of(after)[0]) == 4
    normal, _ = T.train_unit(cache, ARCH, CP, FP, state, x, y, 1)
    assert not all_equal(weights_of(after), weights_of(normal))


def test_nan_loss_is_reported_not_raised(cache):
    x, y = blobs(64, 5)
    cp = "optimizer='SGD(learning_rate=1e10)', loss='categorical_crossentropy'"
    state, res = T.train_unit(cache, ARCH, cp, "batch_size=16", T.initial_state(ARCH, cp, 1),
                              x, y, 1)
    assert math.isnan(res.loss)
    ev = T.evaluate(cache, ARCH, cp, state, x, y, 32)
    assert math.isnan(ev.loss)


def test_evaluate_matches_keras_on_concatenated_data(cache):
    parts = [blobs(70, 30), blobs(45, 31), blobs(33, 32)]
    state, _ = T.train_unit(cache, ARCH, CP, FP, T.initial_state(ARCH, CP, 4), *parts[0], 2)
    results = [T.evaluate(cache, ARCH, CP, state, x, y, batch_size=16) for x, y in parts]
    combined = T.combine_results(results)
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    model = keras_arch.build_from_json(ARCH)
    model.set_weights(weights_of(state))
    model.compile(loss="categorical_crossentropy", metrics=["accuracy"])
    ref = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    assert combined.rows == len(x)
    assert combined.loss == pytest.approx(ref["loss"], rel=1e-6)
    assert combined.metrics["accuracy"] == pytest.approx(ref["accuracy"], rel=1e-6)
    whole = T.evaluate(cache, ARCH, CP, state, x, y, batch_size=16)
    assert whole.loss == pytest.approx(ref["loss"], rel=1e-7)
    assert math.fsum(r.loss_sum for r in results) / whole.rows == pytest.approx(whole.loss,
                                                                               rel=1e-6)


def test_a_second_evaluation_of_the_same_state_skips_loading_its_weights(cache):
    """An evaluation unit's second kind (``weights_loaded``) gives what a fresh evaluation
    gives, and uses the weights already in the model (it neither decodes nor assigns the
    state it is passed again)."""
    x, y = blobs(90, 60)
    xv, yv = blobs(40, 61)
    a, _ = T.train_unit(cache, ARCH, CP, FP, T.initial_state(ARCH, CP, 4), x, y, 2)
    b, _ = T.train_unit(cache, ARCH, CP, FP, a, x, y, 3)
    fresh = T.evaluate(cache, ARCH, CP, a, xv, yv, batch_size=16)
    T.evaluate(cache, ARCH, CP, a, x, y, batch_size=16)
    assert T.evaluate(cache, ARCH, CP, a, xv, yv, batch_size=16, weights_loaded=True) == fresh
    # the flag is trusted: the model still holds ``a``'s weights, whatever state is passed
    assert T.evaluate(cache, ARCH, CP, b, xv, yv, batch_size=16, weights_loaded=True) == fresh
    assert T.evaluate(cache, ARCH, CP, b, xv, yv, batch_size=16) != fresh


def test_the_loops_are_traced_once_for_any_row_count(cache):
    """A worker evaluates its training partition and then the validation rows, and may train
    another partition of another size: the traced loops take any number of rows, so the
    model's step is traced once (a second trace cost 0.1-0.2 s per configuration and
    worker on a small MLP: an evaluation unit's validation half took as long as its
    training half)."""
    parts = [blobs(70, 40), blobs(45, 41), blobs(33, 42)]
    state = T.initial_state(ARCH, CP, 4)
    for x, y in parts:
        state, _ = T.train_unit(cache, ARCH, CP, FP, state, x, y, 2)
        T.evaluate(cache, ARCH, CP, state, x, y, batch_size=16)
    entry = cache.get(ARCH, T._compile_params(CP))
    fns = [*entry.train_fns.values(), *entry.eval_fns.values()]
    assert len(fns) == 2
    assert [f.experimental_get_tracing_count() for f in fns] == [1, 1]


def test_predict_batched_from_state_or_flat_weights(cache):
    x, y = blobs(50, 6)
    state, _ = T.train_unit(cache, ARCH, CP, FP, T.initial_state(ARCH, CP, 4), x, y, 3)
    probs = T.predict(cache, ARCH, state, x, batch_size=16)
    assert probs.shape == (50, 3) and probs.dtype == np.float32
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    flat = keras_arch.weights_to_bytes(weights_of(state))
    assert np.array_equal(T.predict(cache, ARCH, flat, x, batch_size=16), probs)
    # another batch size: the same up to float rounding (a CPU without AVX-512 blocks the
    # matrix products by batch rows, and the last bit of some sums moves)
    assert np.allclose(T.predict(cache, ARCH, flat, x, batch_size=7), probs, rtol=0, atol=1e-6)
    model = keras_arch.build_from_json(ARCH)
    model.set_weights(weights_of(state))
    assert np.allclose(model.predict(x, verbose=0), probs, atol=1e-6)
    assert T.predict(cache, ARCH, state, x[:0]).shape == (0, 3)


def test_regression_mse_trains(cache):
    r = np.random.default_rng(7)
    x = r.normal(size=(200, 20)).astype(np.float32)
    y = (x @ r.normal(size=(20, 1)) * 0.3).astype(np.float32)
    arch = mlp(hidden=16, outputs=1, activation="linear")
    cp = "optimizer='Adam(learning_rate=0.01)', loss='mse', metrics=['mae']"
    state = T.initial_state(arch, cp, 1)
    losses = []
    for i in range(4):
        state, res = T.train_unit(cache, arch, cp, "batch_size=32, epochs=2", state, x, y, i)
        losses.append(res.loss)
    assert losses[-1] < 0.6 * losses[0] and "mae" in res.metrics


def test_sparse_categorical_integer_labels_train(cache):
    x, onehot = blobs(128, 8)
    labels = onehot.argmax(axis=1).astype(np.float32)  # integer labels, as float32
    cp = "optimizer='Adam(learning_rate=0.02)', loss='sparse_categorical_crossentropy', " \
         "metrics=['sparse_categorical_accuracy']"
    state = T.initial_state(ARCH, cp, 1)
    first = None
    for i in range(3):
        state, res = T.train_unit(cache, ARCH, cp, "batch_size=32, epochs=2", state, x,
                                  labels, i)
        first = res.loss if first is None else first
    assert res.loss < first
    ev = T.evaluate(cache, ARCH, cp, state, x, labels[:, None], 64)
    assert ev.metrics["sparse_categorical_accuracy"] > 0.5


def test_train_unit_from_madlib_flat_weights_and_counters(cache):
    x, y = blobs(40, 9)
    flat = keras_arch.weights_to_bytes(weights_of(T.initial_state(ARCH, CP, 1)))
    state, res = T.train_unit(cache, ARCH, CP, "batch_size=8, epochs=2", flat, x, y, 1,
                              completes_epoch=True, info={"mst_key": 4})
    s = decode_state(state)
    assert int(s.optimizer_vars[0]) == 10
    assert (s.epochs_done, s.units_done, s.samples_seen) == (1, 1, 80)
    assert s.info == {"mst_key": 4} and res.epochs == 2


def test_state_for_another_model_is_rejected(cache):
    x, y = blobs(16, 1)
    other = T.initial_state(mlp(hidden=5), CP, 1)
    with pytest.raises(CerebroError) as exc:
        T.train_unit(cache, ARCH, CP, FP, other, x, y, 1)
    assert exc.value.sqlstate == "22000" and "does not match" in exc.value.message
    bad_opt = decode_state(T.initial_state(ARCH, CP, 1))
    trimmed = encode_state(bad_opt.weights, bad_opt.optimizer_vars[:3], bad_opt.meta())
    with pytest.raises(CerebroError, match="optimizer variables"):
        T.train_unit(cache, ARCH, CP, FP, trimmed, x, y, 1)
    with pytest.raises(CerebroError) as exc:
        T.train_unit(cache, ARCH, CP, FP, T.initial_state(ARCH, CP, 1), x, y[:, :2], 1)
    assert exc.value.sqlstate == "42804"
    with pytest.raises(CerebroError, match="rows"):
        T.train_unit(cache, ARCH, CP, FP, T.initial_state(ARCH, CP, 1), x, y[:5], 1)


def test_fit_params_class_weight_and_shuffle_are_used(cache):
    x, y = blobs(64, 12)
    init = T.initial_state(ARCH, CP, 1)
    plain, _ = T.train_unit(cache, ARCH, CP, "batch_size=16, shuffle=False", init, x, y, 1)
    weighted, _ = T.train_unit(cache, ARCH, CP, "batch_size=16, shuffle=False, "
                               "class_weight={0: 5.0, 1: 1.0, 2: 1.0}", init, x, y, 1)
    shuffled, _ = T.train_unit(cache, ARCH, CP, "batch_size=16", init, x, y, 1)
    assert not all_equal(weights_of(plain), weights_of(weighted))
    assert not all_equal(weights_of(plain), weights_of(shuffled))
    # without shuffling the seed does not matter for this dropout-free model
    again, _ = T.train_unit(cache, ARCH, CP, "batch_size=16, shuffle=False", init, x, y, 9)
    assert again == plain


# --------------------------------------------------------------------------- buffer streaming


def source_of(parts: list[tuple[np.ndarray, np.ndarray]]) -> T.BufferSource:
    return T.BufferSource(tuple(len(p[0]) for p in parts), lambda i: parts[i])


def test_streaming_one_buffer_trains_exactly_as_the_arrays(cache):
    x, y = blobs(150, 31)
    init = T.initial_state(ARCH_DROP, CP, seed=5)
    fp = "batch_size=32, epochs=2"
    whole, r1 = T.train_unit(cache, ARCH_DROP, CP, fp, init, x, y, seed=8)
    streamed, r2 = T.train_unit(cache, ARCH_DROP, CP, fp, init, source_of([(x, y)]), None, seed=8)
    assert streamed == whole
    assert r2.rows == r1.rows == 150 and r2.loss == r1.loss and r2.metrics == r1.metrics


def test_streaming_buffers_train_hop_and_replay(cache):
    """Several uneven buffers: loss goes down, hopping equals replay bitwise, evaluation over
    the buffers equals evaluation over the concatenated rows."""
    parts = [blobs(130, 40), blobs(70, 41), blobs(100, 42)]
    src = source_of(parts)
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    fp = "batch_size=32, epochs=2"
    init = T.initial_state(ARCH_DROP, CP, seed=6)
    before = T.evaluate(cache, ARCH_DROP, CP, init, src, None)
    caches = [T.ModelCache(), T.ModelCache()]
    state, losses = init, []
    for i in range(4):
        state, res = T.train_unit(caches[i % 2], ARCH_DROP, CP, fp, state, src, None, 100 + i)
        assert res.rows == 300
        losses.append(res.loss)
    assert losses[-1] < losses[0]
    assert state == T.replay(ARCH_DROP, CP, fp, init, [(src, None, 100 + i) for i in range(4)])
    assert decode_state(state).samples_seen == 4 * 2 * 300
    after = T.evaluate(cache, ARCH_DROP, CP, state, src, None)
    whole = T.evaluate(cache, ARCH_DROP, CP, state, x, y)
    assert after.rows == whole.rows == 300
    assert after.loss == pytest.approx(whole.loss, rel=1e-5)
    assert after.metrics["accuracy"] == pytest.approx(whole.metrics["accuracy"], abs=1e-6)
    assert after.loss < 0.7 * before.loss
    # the buffer order and the rows within buffers both follow the seed
    a, _ = T.train_unit(cache, ARCH, CP, "batch_size=32", T.initial_state(ARCH, CP, 1), src,
                        None, 1)
    b, _ = T.train_unit(cache, ARCH, CP, "batch_size=32", T.initial_state(ARCH, CP, 1), src,
                        None, 2)
    assert not all_equal(weights_of(a), weights_of(b))


def test_a_training_feed_skips_the_tf_data_rewrites_that_copied_its_features():
    """tf.data's default rewrites serialize a pipeline with its captured tensors and rebuild
    it: a copy of the partition's features for as long as the feed lives (94 MB at 30,000
    Fashion-MNIST rows; ``bench/worker_memory.py``). The feed turns them off; its batches
    are still the rows in the unit's order, read from the array itself."""
    x = T.aligned_empty((64, 4))
    x[:] = np.arange(256, dtype=np.float32).reshape(64, 4)
    y = np.zeros((64, 2), np.float32)
    feed = T._TrainFeed(T._features(x), (4,), y, 16)
    opt = feed.dataset.options().experimental_optimization
    assert opt.apply_default_optimizations is False
    feed.order(np.arange(63, -1, -1))
    xb, _ = next(iter(feed.dataset))
    assert np.array_equal(xb.numpy(), x[::-1][:16])
    x[63] = -1.0  # written in place, as a streamed buffer is: the next pass reads it
    xb, _ = next(iter(feed.dataset))
    assert np.array_equal(xb.numpy()[0], [-1.0] * 4)
    T.release(x)


def test_streaming_into_the_reusable_array_trains_and_evaluates_as_fresh_arrays(cache):
    """Buffers of one shape decoded in place into :func:`stream_array` (as the worker's
    reader does) train and evaluate bitwise as the same buffers in fresh arrays: the kept
    tensor and training feed read each buffer's new rows, never stale ones; two partitions
    streamed one after the other through the same array give their own results."""
    parts = [blobs(96, 50), blobs(96, 51), blobs(96, 52)]
    other = [blobs(96, 60), blobs(96, 61)]

    def into_reusable(bufs):
        def load(i):
            a = T.stream_array(bufs[i][0].shape)
            a[...] = bufs[i][0]
            return a, bufs[i][1]
        return T.BufferSource(tuple(len(b[0]) for b in bufs), load)

    fp = "batch_size=16, epochs=2"
    init = T.initial_state(ARCH_DROP, CP, seed=4)
    state_a = state_b = init
    for i in range(3):  # units alternate between two partitions sharing the array
        for bufs, which in ((parts, "a"), (other, "b")):
            st = state_a if which == "a" else state_b
            fresh, rf = T.train_unit(cache, ARCH_DROP, CP, fp, st, source_of(bufs), None, 20 + i)
            reused, rr = T.train_unit(cache, ARCH_DROP, CP, fp, st, into_reusable(bufs), None,
                                      20 + i)
            assert reused == fresh and rr.loss == rf.loss and rr.metrics == rf.metrics
            ef = T.evaluate(cache, ARCH_DROP, CP, fresh, source_of(bufs), None)
            er = T.evaluate(cache, ARCH_DROP, CP, fresh, into_reusable(bufs), None)
            assert (er.loss, er.metrics, er.rows) == (ef.loss, ef.metrics, ef.rows)
            if which == "a":
                state_a = reused
            else:
                state_b = reused
    assert state_a != state_b
    a = T.stream_array((96, 4))
    assert a is T.stream_array((96, 4)) and a.ctypes.data % 64 == 0


def test_stream_arrays_of_three_shapes_are_kept():
    """Full and last training buffers and a validation buffer, alternating, keep their
    arrays (and so their tensors and feeds); a fourth shape releases the oldest."""
    shapes = [(90, 4), (37, 4), (50, 4)]
    first = [T.stream_array(s) for s in shapes]
    for _ in range(2):
        assert all(T.stream_array(s) is a for s, a in zip(shapes, first))
    T.stream_array((11, 4))
    assert T.stream_array(shapes[0]) is not first[0]


def test_evaluation_overlapped_with_the_read_gives_bitwise_the_same_values(cache):
    """A source that reads a buffer part by part into the reusable array (``load_rows``, as
    the worker's reader with ``overlap``) is evaluated while it is read: the first parts are
    evaluated before the read ends, no row is read before it is in (the rows not yet read
    hold NaN), and loss and metrics are bitwise those over the arrays, over several buffers
    and for a batch size that does not divide the parts."""
    parts = [blobs(203, 70), blobs(203, 71), blobs(203, 72)]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    state = T.initial_state(ARCH, CP, seed=3)
    loss = cache.get(ARCH, CP).model.metrics[0]
    seen_early = []

    def load_rows(i, step):
        xb, yb = parts[i]
        a = T.stream_array(xb.shape)
        a[...] = np.nan
        at = 0
        for end in range(step, len(xb), step):
            a[at:end] = xb[at:end]
            at = end
            yield a, yb, end
            if end == step:  # wait (at most 10 s) for the first part to be evaluated
                for _ in range(1000):
                    if float(loss.count.numpy()) > 0:
                        break
                    time.sleep(0.01)
                seen_early.append(float(loss.count.numpy()) > 0)
        a[at:] = xb[at:]
        yield a, yb, len(xb)

    src = T.BufferSource((203,) * 3, lambda i: parts[i], load_rows)
    for bs in (16, 7, 500):
        whole = T.evaluate(cache, ARCH, CP, state, x, y, batch_size=bs)
        got = T.evaluate(cache, ARCH, CP, state, src, None, batch_size=bs)
        plain = T.evaluate(cache, ARCH, CP, state, source_of(parts), None, batch_size=bs)
        assert (got.loss, got.metrics, got.rows) == (plain.loss, plain.metrics, plain.rows)
        assert got.rows == whole.rows == 609 and math.isfinite(got.loss)
        assert got.loss == pytest.approx(whole.loss, rel=1e-5)
    assert seen_early[:6] == [True] * 6  # batch 16 and 7: 3 buffers of several parts each


def test_streaming_holds_one_buffer_in_memory(cache):
    """Peak Python/numpy memory of a unit over 8 buffers of 2,000 x 784 float32 (6.3 MB each):
    streaming stays under 3 buffers; loading the partition as one array (what use_caching
    does) needs all 8."""
    import gc
    import tracemalloc

    arch = mlp(inputs=784, hidden=8, outputs=10)
    n, count = 2000, 8
    buffer_bytes = n * 784 * 4

    def load(i: int) -> tuple[np.ndarray, np.ndarray]:
        r = np.random.default_rng(i)
        return r.random((n, 784), dtype=np.float32), \
            np.eye(10, dtype=np.float32)[r.integers(0, 10, n)]

    src = T.BufferSource((n,) * count, load)
    init = T.initial_state(arch, CP, 1)
    T.train_unit(cache, arch, CP, "batch_size=500", init, src, None, 1)  # build, trace

    def peak(fn) -> int:
        gc.collect()
        tracemalloc.start()
        try:
            fn()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    def whole() -> None:
        parts = [load(i) for i in range(count)]
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        del parts
        T.train_unit(cache, arch, CP, "batch_size=500", init, x, y, 1)

    streamed = peak(lambda: T.train_unit(cache, arch, CP, "batch_size=500", init, src, None, 1))
    assert streamed < 3 * buffer_bytes, streamed
    assert peak(whole) > count * buffer_bytes


# --------------------------------------------------------------------------- evaluation path


def keras_reference(arch: str, cp: str, state: bytes) -> keras.Model:
    from cerebro_db.params import parse_compile_params

    model = keras_arch.build_from_json(arch)
    model.set_weights(weights_of(state))
    model.compile(**parse_compile_params(cp).to_keras())
    return model


@pytest.mark.parametrize("kind", ["categorical", "sparse", "regression", "cnn"])
def test_evaluate_equals_keras_evaluate(cache, kind):
    """The traced evaluation loop gives what Keras' own evaluate gives at the same batch size
    (arrays, aligned arrays, one buffer and several buffers), with a partial last batch."""
    x, y = blobs(203, 50)
    arch, cp = ARCH, CP
    if kind == "sparse":
        cp = ("optimizer='Adam(learning_rate=0.01)', loss='sparse_categorical_crossentropy', "
              "metrics=['sparse_categorical_accuracy', 'sparse_top_k_categorical_accuracy']")
        y = y.argmax(axis=1).astype(np.int32)
    elif kind == "regression":
        arch, cp = mlp(hidden=8, outputs=2, activation="linear"), \
            "optimizer='SGD(learning_rate=0.01)', loss='mse', metrics=['mae', 'mse']"
        y = (x[:, :2] * 0.5).astype(np.float32)
    elif kind == "cnn":
        L = keras.layers
        arch = keras.Sequential([keras.Input((4, 5, 1)), L.Conv2D(3, 2, activation="relu"),
                                 L.Flatten(), L.Dense(3, activation="softmax")]).to_json()
    state, _ = T.train_unit(cache, arch, cp, FP, T.initial_state(arch, cp, 3), x, y, 1)
    ref = keras_reference(arch, cp, state)
    xr = x.reshape(-1, 4, 5, 1) if kind == "cnn" else x
    want = ref.evaluate(xr, y, batch_size=16, verbose=0, return_dict=True)
    aligned = T.aligned_empty(x.shape)
    aligned[:] = x
    cuts = [(0, 64), (64, 150), (150, 203)]
    several = T.BufferSource(tuple(b - a for a, b in cuts),
                             lambda i: (x[cuts[i][0]:cuts[i][1]], y[cuts[i][0]:cuts[i][1]]))
    one = T.BufferSource((203,), lambda i: (aligned, y))
    for data in ((x, y), (aligned, y), (one, None)):
        got = T.evaluate(cache, arch, cp, state, *data, batch_size=16)
        assert got.rows == 203
        assert set(got.metrics) | {"loss"} == set(want)
        assert got.loss == pytest.approx(want["loss"], rel=1e-6)
        for k, v in got.metrics.items():
            assert v == pytest.approx(want[k], rel=1e-6, abs=1e-7), k
    # several buffers accumulate into the same metric variables: the value over all rows
    # (batches restart at each buffer, so equal up to float rounding)
    got = T.evaluate(cache, arch, cp, state, several, None, batch_size=16)
    assert got.rows == 203 and got.loss == pytest.approx(want["loss"], rel=1e-5)
    for k, v in got.metrics.items():
        assert v == pytest.approx(want[k], rel=1e-5, abs=1e-6), k
    # a second call (new weights) resets the metrics first
    assert T.evaluate(cache, arch, cp, state, x, y, batch_size=16) == \
        T.evaluate(cache, arch, cp, state, x, y, batch_size=16)


def test_evaluate_of_a_model_never_trained_in_this_process():
    """A fresh cache evaluates (the compiled metrics are built on first use)."""
    x, y = blobs(50, 51)
    state = T.initial_state(ARCH, CP, 4)
    got = T.evaluate(T.ModelCache(), ARCH, CP, state, x, y, batch_size=8)
    want = keras_reference(ARCH, CP, state).evaluate(x, y, batch_size=8, verbose=0,
                                                     return_dict=True)
    assert got.loss == pytest.approx(want["loss"], rel=1e-6)
    assert got.metrics["accuracy"] == pytest.approx(want["accuracy"], rel=1e-6)


def test_aligned_arrays_reach_tensorflow_without_a_copy(cache):
    a = T.aligned_empty((6, 4))
    assert a.ctypes.data % 64 == 0 and a.flags.c_contiguous and a.flags.writeable
    a[:] = 1.0
    shared = T.as_tensor(a)
    a[0, 0] = 7.0
    assert float(shared[0, 0]) == 7.0  # the same memory
    plain = np.ones((6, 4), np.float32)[:, :3]  # not contiguous: copied
    copied = T.as_tensor(plain)
    plain[0, 0] = 7.0
    assert float(copied[0, 0]) == 1.0
    assert T.as_tensor(np.frombuffer(np.ones(8, np.float32).tobytes(), np.float32)).shape == (8,)
    # training from an aligned (shared) array is bitwise training from a plain copy
    x, y = blobs(100, 52)
    xa = T.aligned_empty(x.shape)
    xa[:] = x
    init = T.initial_state(ARCH, CP, 5)
    s1, _ = T.train_unit(cache, ARCH, CP, FP, init, x, y, 9)
    s2, _ = T.train_unit(cache, ARCH, CP, FP, init, xa, y, 9)
    assert s1 == s2
    T.release(xa)
    assert all(v[0] is not xa for v in T._FEATURES.values())


def test_eval_batch_size_follows_the_activation_size():
    mlp_model = keras_arch.build_from_json(mlp(inputs=784, hidden=128, outputs=10))
    L = keras.layers
    cnn = keras.Sequential([keras.Input((28, 28, 1)), L.Conv2D(8, 3, activation="relu"),
                            L.MaxPooling2D(), L.Conv2D(16, 3, activation="relu"),
                            L.MaxPooling2D(), L.Flatten(), L.Dense(10, activation="softmax")])
    assert T.eval_batch_size(mlp_model, 32) > 512
    assert T.eval_batch_size(mlp_model, 32) <= T.MAX_EVAL_BATCH
    assert T.eval_batch_size(cnn, 128) == 128  # its activations fill the budget already
    assert T.eval_batch_size(cnn, 16) > 16
    assert T.eval_batch_size(mlp_model, 20000) == 20000  # never below the configuration's
def test_metrics_come_back_in_compile_order():
    """Keras sorts its logs by name; units report metrics in compile_params' order (the order
    of metrics_type), e.g. top_k_categorical_accuracy before accuracy."""
    cp = ("optimizer='Adam(learning_rate=0.01)', loss='categorical_crossentropy', "
          "metrics=['top_k_categorical_accuracy', 'mse', 'accuracy']")
    x, y = blobs(64, 1)
    cache = T.ModelCache()
    init = T.initial_state(ARCH, cp, 3)
    state, res = T.train_unit(cache, ARCH, cp, FP, init, x, y, seed=1)
    assert list(res.metrics) == ["top_k_categorical_accuracy", "mse", "accuracy"]
    ev = T.evaluate(cache, ARCH, cp, state, x, y, batch_size=16)
    assert list(ev.metrics) == ["top_k_categorical_accuracy", "mse", "accuracy"]
    assert ev.metrics["top_k_categorical_accuracy"] == 1.0  # k=5 > 3 classes


def test_drop_streams_releases_only_the_arrays_whose_contents_match():
    a = T.stream_array((5, 3))
    T.mark_stream(a, ("x", ((1, 60),)))
    b = T.stream_array((6, 3))
    T.mark_stream(b, ("x", ((2, 72),)))
    T._features(a)  # a tensor kept for the array, released with it
    assert T.drop_streams(lambda c: c == ("x", ((1, 60),))) == 1
    assert T.stream_holding((5, 3), ("x", ((1, 60),))) is None
    assert all(v[0] is not a for v in T._FEATURES.values())
    assert T.stream_holding((6, 3), ("x", ((2, 72),))) is b
    assert T.stream_array((5, 3)) is not a  # a new array for that shape
    assert T.drop_streams(lambda c: False) == 0
