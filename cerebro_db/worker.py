"""What a worker session does for one unit: load, train or evaluate, save, log.

A worker is a database session the coordinator opened (dblink) for the whole fit. Its
Python interpreter lives as long as the session, so this module keeps, across units:

* decoded partitions, per the fit's ``use_caching`` (:func:`unit_data`): NULL (the
  default) keeps those whose decoded size fits the fit's ``cache_memory`` budget (the
  setting ``cerebro_db.cache_memory``, else half the machine's memory over the workers,
  :func:`cache_memory`), least recently used dropped to make room, and streams larger ones;
  TRUE keeps every partition read (at most ``MAX_CACHED_PARTITIONS``); FALSE keeps
  nothing. Kept partitions are keyed by the packed table's identity and contents
  fingerprint, so a changed table is read again. Features are decoded straight into one
  aligned array (:func:`_read`) that TensorFlow reads without a copy, so a partition
  costs rows x features x 4 bytes once (plus its labels);
* the compiled Keras models (:class:`cerebro_db.training.ModelCache`, at most 8 here),
  so a unit costs training plus one state load and one state save, not a rebuild and a
  retrace. A model costs about (1 + optimizer slots per weight) x parameters x 4 bytes
  (Adam: 3x the weights) plus its traced functions.

Memory rule (README, "Memory of a worker session"): runtime + models + the kept
partitions (at most the budget with NULL), or + one buffer while a unit streams. A
streamed unit reads its partition one packed buffer at a time (:func:`partition_buffers`),
holding one decoded buffer, in a reusable array kept between units: a buffer that array
still holds (the same stored row version, as when a worker streams its partition of one
buffer unit after unit) is not read again; the buffer size is the preprocessor's ``buffer_size``
(MADlib's default rule: about 75 million feature values, 300 MB, per buffer; preprocess
with a smaller ``buffer_size`` when that is too much).
Training over buffers shuffles the buffer order, then the rows within each buffer, and a
batch never spans two buffers (as MADlib trains); with one buffer per partition it gives
bitwise the models ``use_caching`` gives.

A unit's state save, its unit row and (the first unit of an epoch after an evaluated one)
the relabelling of the config's 'current' state as 'epoch:N' are written in the worker's own
transaction, committed when the unit's statement ends, inside one
subtransaction: a unit that fails part way (even after its state save) leaves nothing, and a
session killed mid-unit leaves the config's previous state. A unit never raises: failures
come back as a JSON result with the message, SQLSTATE and traceback.

Test hook. The setting ``cerebro_db.test_hook`` (honoured only in a superuser's session)
makes chosen units sleep (``pg_sleep``, so the session can be killed meanwhile) at a named
point: a JSON object or list of objects ``{"point": "before_train" | "after_save" |
"eval", "seconds": s}`` plus optional filters ``mst_key``, ``epoch``, ``partition``,
``worker`` and ``attempt`` (default 0: only a unit's first attempt sleeps, so its retry
runs through). The coordinator reads ``{"point": "recover", "worker": w}``: worker ``w``'s
session cannot be reopened after a loss (it leaves the fit for good).
"""
from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import state as state_mod
from .catalog import Catalog, units
from .errors import (
    DATA_EXCEPTION,
    INTERNAL_ERROR,
    INVALID_PARAMETER_VALUE,
    OUT_OF_MEMORY,
    UNDEFINED_OBJECT,
    UNDEFINED_TABLE,
    UNIQUE_VIOLATION,
    CerebroError,
    out_of_memory,
)
from .keras_arch import physical_memory
from .names import TableName

MAX_CACHED_PARTITIONS = 4
DEFAULT_CHUNK_SIZE = 256 * 1024 * 1024

_partitions: collections.OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = \
    collections.OrderedDict()
_fits: dict[int, dict[str, Any]] = {}
_configs: dict[tuple[int, int], dict[str, Any]] = {}
_cache: Any = None
_runtime_done = False


def model_cache() -> Any:
    global _cache
    if _cache is None:
        from .training import ModelCache

        _cache = ModelCache(max_models=8)
    return _cache


UNUSED_BY_WORKERS = ("pandas", "matplotlib", "scipy", "PIL")
"""Packages Keras and TensorFlow import at their own import when they are installed and a
worker never uses: pandas (to accept DataFrames), matplotlib (to plot image galleries),
Pillow (``PIL``: ``keras.utils.load_img`` and friends) and SciPy (TensorFlow's legacy
``tf.keras`` v1 training loop, for sparse inputs; Keras 3 itself imports SciPy only when a
function needs it). pandas and matplotlib were about 0.8 s of a worker's 2.5 s TensorFlow
import on the benchmark machine; SciPy and Pillow a further 0.06 s of the 1.3 s left
(median of 4 imports in a backend each, 2026-11-30). A worker session of the database
imports TensorFlow without them (:func:`_without`, :func:`dedicated_session`); Keras then
treats them as absent in that session (a custom function may still import them itself:
only TensorFlow's import goes without them)."""

_dedicated = False


def dedicated_session() -> None:
    """Say that this process is a worker session of the database (``__run_unit``,
    ``__check_fit``): a backend that runs nothing but units, so TensorFlow is imported
    without :data:`UNUSED_BY_WORKERS`. A remote worker (Ray, Dask) may be a process shared
    with other work, so it does not call this and imports TensorFlow as usual."""
    global _dedicated
    _dedicated = True


class _Absent:
    """A ``sys.meta_path`` finder for which the named top-level packages do not exist."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = frozenset(names)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


@contextlib.contextmanager
def _without(names: tuple[str, ...]) -> Iterator[None]:
    """While the block runs, importing any of ``names`` (not imported yet) fails as if it
    were not installed; afterwards they import as usual."""
    finder = _Absent(tuple(n for n in names if n not in sys.modules))
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


@contextlib.contextmanager
def _collector_paused(freeze: bool) -> Iterator[None]:
    """Python's cyclic garbage collector off while the block runs (TensorFlow's import); with
    ``freeze``, what exists afterwards moves to the collector's permanent generation.

    Importing TensorFlow and Keras allocates about half a million objects that live as long
    as the process; with the collector on, its passes over them took 0.5 s of a 1.6 s
    import on the benchmark machine (1.1 s with it off), and every later full pass (during
    tracing and training) walked them again. Frozen, they are never walked again; the
    import itself makes next to no garbage. Only a :func:`dedicated_session` freezes: a
    remote worker's process may hold other work's objects, which must stay collectable."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was_on:
            gc.enable()


def _runtime(threads: int | None) -> None:
    """This worker's TensorFlow: imported (in a :func:`dedicated_session`, without
    :data:`UNUSED_BY_WORKERS`, and with the collector frozen afterwards) and its thread
    pools set, once per process; the garbage collector is paused during the import
    (:func:`_collector_paused`).

    ``threads`` is caller data (a fit row's options, a check's spec: the role may edit
    both) and is kept within 1 .. this machine's cores: TensorFlow makes its pools at once
    and aborts the process when a thread cannot be created, and a backend that aborts
    makes the postmaster restart every session of the server (a red-team pass did that
    with 1,000)."""
    global _runtime_done
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise CerebroError(f"worker_threads must be an integer, got {threads!r}",
                               INVALID_PARAMETER_VALUE)
        threads = max(1, min(threads, os.cpu_count() or 1))
    if not _runtime_done:
        with _collector_paused(freeze=_dedicated), \
                _without(UNUSED_BY_WORKERS if _dedicated else ()):
            from .training import configure_runtime

            configure_runtime(threads)
        _runtime_done = True


HOOK_SETTING = "cerebro_db.test_hook"


def test_hooks(cat: Catalog) -> Any:
    """The parsed ``cerebro_db.test_hook`` (a hook or a list of them), for superuser
    sessions only; else None."""
    text = cat.setting(HOOK_SETTING)
    if text and cat.setting("is_superuser") == "on":
        try:
            return json.loads(text)
        except ValueError:
            return None
    return None


def _hook(cat: Catalog, fit_id: int, point: str, mst_key: int, epoch: int, partition: int,
          options: dict[str, Any]) -> None:
    """Sleep where ``cerebro_db.test_hook`` says (superuser sessions only; tests), at most
    :data:`HOOK_MAX_SECONDS` in all per fit in this process. The setting is read once per
    call (kept in ``options``, the call's own dict)."""
    if "_test_hooks" not in options:
        options["_test_hooks"] = test_hooks(cat)
    spec = options["_test_hooks"]
    if not spec:
        return
    here = {"point": point, "mst_key": mst_key, "epoch": epoch, "partition": partition,
            "attempt": int(options.get("attempt", 0)), "worker": options.get("worker")}
    for h in spec if isinstance(spec, list) else [spec]:
        if not isinstance(h, dict):
            continue
        want = {"attempt": 0, **{k: v for k, v in h.items() if k != "seconds"}}
        if all(here.get(k) == v for k, v in want.items()):
            left = HOOK_MAX_SECONDS - _hook_slept.get(fit_id, 0.0)
            seconds = min(_hook_seconds(h.get("seconds", 1)), left)
            if seconds > 0:
                _hook_slept[fit_id] = _hook_slept.get(fit_id, 0.0) + seconds
                units.sleep(cat, seconds)


HOOK_MAX_SECONDS = 120.0
"""The longest test hooks sleep in all, per fit and worker process: another role's definer
function can plant the setting in a superuser's session (a red-team pass stalled a fit's
workers for 28 hours that way; with the cap per hook, the next one listed 120 s entries
matching every unit)."""

_hook_slept: dict[int, float] = {}
"""fit_id -> seconds of test-hook sleep this process was asked for."""


def _hook_seconds(value: Any) -> float:
    try:
        s = float(value)
    except (TypeError, ValueError):
        return 0.0
    return min(s, HOOK_MAX_SECONDS) if s >= 0 else 0.0  # NaN and negatives: no sleep


def unit_seed(random_state: int, mst_key: int, epoch: int, partition: int, salt: int = 0) -> int:
    """The seed of one unit: a function of the run's seed and the unit's coordinates only,
    so a replay in any process uses the same one."""
    ss = np.random.SeedSequence([int(random_state) & 0xFFFFFFFF, mst_key, epoch, partition, salt])
    return int(ss.generate_state(1)[0] & 0x7FFFFFFF)


def fit_row(cat: Catalog, fit_id: int) -> dict[str, Any]:
    row = _fits.get(fit_id)
    if row is None:
        found = units.fit(cat, fit_id)
        if found is None:
            raise CerebroError(f"fit {fit_id} does not exist", UNDEFINED_OBJECT)
        row = dict(found)
        row["options"] = json.loads(row["options"]) if isinstance(row["options"], str) \
            else row["options"]
        _fits[fit_id] = row
    return row


def _config_row(cat: Catalog, fit_id: int, mst_key: int) -> dict[str, Any]:
    key = (fit_id, mst_key)
    row = _configs.get(key)
    if row is None:
        found = units.fit_config(cat, fit_id, mst_key)
        if found is None:
            raise CerebroError(f"configuration {mst_key} of fit {fit_id} does not exist", UNDEFINED_OBJECT)
        row = dict(found)
        _configs[key] = row
    return row


def compile_params_of(cat: Catalog, fit: dict[str, Any], cfg: dict[str, Any]) -> Any:
    """A configuration's compile parameters with the fit's custom functions; this session
    checks itself that the current role may import each referenced module (the fit's
    catalog row is not trusted for that). Cached with the configuration's row."""
    cp = cfg.get("_compile")
    if cp is None:
        from .custom_functions import parse_reference, require_allowed
        from .params import parse_compile_params

        cp = parse_compile_params(cfg["compile_params"])
        refs = fit["options"].get("custom_functions") or {}
        if refs:
            cp = cp.with_custom(refs)
            if cp.custom:
                allowed = cat.custom_function_modules()
                for name, ref in cp.custom:
                    require_allowed(parse_reference(ref), allowed, name)
        cfg["_compile"] = cp
    return cp


def fit_params_of(cat: Catalog, fit: dict[str, Any], cfg: dict[str, Any]) -> Any:
    """A configuration's fit parameters; a TensorBoard log_dir is confined by this session
    to the DBA's directory (the fit's catalog row is not trusted for that) and gets
    ``fit_<id>/mst_key_<k>`` appended, so configurations never share event files."""
    fp = cfg.get("_fit")
    if fp is None:
        import os

        from .params import TENSORBOARD_SETTING, confine_log_dir, parse_fit_params

        fp = parse_fit_params(cfg["fit_params"])
        if fp.tensorboard:
            root = confine_log_dir(dict(fp.tensorboard)["log_dir"],
                                   cat.dba_setting(TENSORBOARD_SETTING))
            fp = fp.with_log_dir(os.path.join(root, f"fit_{fit['fit_id']}",
                                              f"mst_key_{cfg['mst_key']}"))
        cfg["_fit"] = fp
    return fp


READ_SLICE = 512 * 1024
"""Bytes of a packed feature buffer read per query (``substring`` of the stored value).
Measured reading a 188 MB buffer into its array (``bench/stream_profile.py``): 58 ms in
64 kB slices, 45-51 ms in 256 kB to 1 MB; at 4 MB (and in one run of three at 2 MB) each
slice's Python bytes object is freshly page-faulted and the read takes about 4 times as
long."""


def _buffers(cat: Catalog, t: TableName, xcol: str, ycol: str, partition: int,
             buffer_id: int | None = None, partition_mod: int | None = None
             ) -> list[dict[str, Any]]:
    """The partition's buffers (or one), in buffer_id order: id, shapes, labels, the feature
    bytes' length and whether they are stored compressed; the features themselves are not
    read here (:func:`_read_features`)."""
    rows = units.buffers(cat, t, xcol, ycol, partition, buffer_id, partition_mod)
    return [dict(r) for r in rows]


def _read_features(cat: Catalog, t: TableName, xcol: str, partition: int, meta: dict[str, Any],
                   out: np.ndarray, partition_mod: int | None = None) -> None:
    """Decode one buffer's features straight into ``out`` (float32, its rows x features).

    The stored bytes are little-endian float32: they are copied into ``out``'s memory in
    slices of ``READ_SLICE`` bytes (``substring`` of an uncompressed stored value reads only
    the chunks it needs), so neither a copy of the whole value nor a decoded array is made
    on the way; a compressed value is read whole."""
    for _ in _feature_steps(cat, t, xcol, partition, meta, out, partition_mod):
        pass


def _feature_steps(cat: Catalog, t: TableName, xcol: str, partition: int,
                   meta: dict[str, Any], out: np.ndarray, partition_mod: int | None = None
                   ) -> Iterator[int]:
    """:func:`_read_features` yielding, after each slice, how many of ``out``'s bytes are
    final (the leading ones)."""
    dst = out.reshape(-1).view(np.uint8)
    n = int(meta["xn"])
    if n != dst.size:
        raise CerebroError(
            f"x buffer has {n} bytes but shape {list(meta['xs'])} of float32 needs {dst.size}",
            DATA_EXCEPTION, hint="the packed table may be corrupt; run the preprocessor again")
    step = n if meta["packed"] or n <= READ_SLICE else READ_SLICE
    little = sys.byteorder == "little"
    for off in range(0, n, step):
        k = min(step, n - off)
        part = units.feature_slice(cat, t, xcol, partition, meta["id"], off, k, partition_mod)
        if len(part) != k:
            raise CerebroError(f"x buffer changed while it was read ({len(part)} of {k} bytes)",
                               DATA_EXCEPTION, hint="do not change a packed table during a fit")
        dst[off:off + k] = np.frombuffer(part, dtype=np.uint8)
        del part
        if little:
            yield off + k
    if not little:  # pragma: no cover - the packed format is little-endian
        out.byteswap(inplace=True)
        yield n


def _labels(meta: dict[str, Any]) -> np.ndarray:
    """One buffer's labels as float32 (int16 one-hot / integer labels or float32 targets)."""
    ys = [int(d) for d in meta["ys"]]
    count = math.prod(ys)
    data = meta["y"]
    dtype = "<f4" if len(data) == 4 * count else "<i2"
    if len(data) != count * np.dtype(dtype).itemsize:
        raise CerebroError(f"y buffer has {len(data)} bytes but shape {ys} needs "
                           f"{2 * count} (int16) or {4 * count} (float32)", DATA_EXCEPTION,
                           hint="the packed table may be corrupt; run the preprocessor again")
    return np.frombuffer(data, dtype=dtype, count=count).reshape(ys).astype(np.float32)


def _read(cat: Catalog, t: TableName, xcol: str, metas: list[dict[str, Any]],
          partition: int, partition_mod: int | None = None, stream: bool = False
          ) -> tuple[np.ndarray, np.ndarray]:
    """Buffers ``metas`` (in order) as one ``(x, y)``: ``x`` decoded into one aligned array
    (:func:`cerebro_db.training.aligned_empty`, which TensorFlow then reads without a copy);
    with ``stream``, into the process' reusable array of that shape
    (:func:`cerebro_db.training.stream_array`: valid until the next buffer is streamed)."""
    for x, y, _ in _read_steps(cat, t, xcol, metas, partition, partition_mod, stream):
        pass
    return x, y


def _read_steps(cat: Catalog, t: TableName, xcol: str, metas: list[dict[str, Any]],
                partition: int, partition_mod: int | None = None, stream: bool = False,
                step: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """:func:`_read` as it goes: yields ``(x, y, ready)``, rows ``[0, ready)`` of ``x``
    final; with ``step`` (rows) whenever a further multiple of ``step`` rows is read, and
    always once at the end (``ready`` all rows, the buffers' contents then recorded as
    what the stream array holds)."""
    from .training import aligned_empty, mark_stream, stream_array, stream_holding

    shapes = [[int(d) for d in m["xs"]] for m in metas]
    row = shapes[0][1:]
    for m, s in zip(metas, shapes):
        if s[1:] != row:
            raise CerebroError(f"buffers of partition {partition} have different row shapes "
                               f"({row} and {s[1:]})", DATA_EXCEPTION,
                               hint="the packed table may be corrupt; run the preprocessor again")
    ys = [_labels(m) for m in metas]
    for s, y in zip(shapes, ys):
        if y.shape[0] != s[0]:
            raise CerebroError(f"x buffer has {s[0]} rows but y buffer has {y.shape[0]}",
                               DATA_EXCEPTION,
                               hint="the packed table may be corrupt; run the preprocessor again")
    y = np.concatenate(ys) if len(ys) > 1 else ys[0]
    shape = [sum(s[0] for s in shapes), *row]
    contents = (xcol, tuple((m["version"], int(m["xn"])) for m in metas))
    if stream:
        held = stream_holding(shape, contents)
        if held is not None:  # the array still holds these stored buffers: nothing to read
            yield held, y, shape[0]
            return
    x = stream_array(shape) if stream else aligned_empty(shape)
    row_bytes = 4 * math.prod(int(d) for d in row)
    at = last = 0
    for m, s in zip(metas, shapes):
        for done in _feature_steps(cat, t, xcol, partition, m, x[at:at + s[0]], partition_mod):
            if step > 0 and row_bytes > 0:
                ready = (at + done // row_bytes) // step * step
                if last < ready < shape[0]:
                    last = ready
                    yield x, y, ready
        at += s[0]
    if stream:
        mark_stream(x, contents)
    yield x, y, shape[0]


CACHE_SETTING = "cerebro_db.cache_memory"
_UNITS = {"b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40}


def parse_memory(text: str) -> int:
    """Bytes of a memory size written as PostgreSQL writes them: ``'512MB'``, ``'4GB'``,
    ``'1.5 GB'``, ``'300kB'``; a plain number is bytes. Raises 22023 otherwise."""
    raw = str(text).strip()
    num = raw.rstrip("bBkKmMgGtT ").strip()
    unit = raw[len(num):].strip().lower() or "b"
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not (value >= 0 and np.isfinite(value)):
        raise CerebroError(f'invalid value for {CACHE_SETTING}: "{text}"', INVALID_PARAMETER_VALUE,
                           hint="Use a size such as '2GB', '512MB' or '0' (cache nothing), or "
                                "RESET it to the default.")
    return int(value * _UNITS[unit])


def cache_memory(setting: str | None, num_workers: int) -> int:
    """Bytes of decoded partitions one worker of a fit keeps with ``use_caching`` NULL: the
    setting ``cerebro_db.cache_memory`` (a size) when set, else half the machine's memory
    shared by the fit's workers (``physical_memory() / (2 * num_workers)``)."""
    if setting is not None and str(setting).strip() != "":
        value = parse_memory(setting)
        workers = max(int(num_workers), 1)
        if value * workers > physical_memory():
            # more than there is turns off what the budget is for: the workers would cache
            # partitions the machine (or the server's cgroup) cannot hold, and the kernel
            # kills a backend, which restarts every session of the server
            raise CerebroError(
                f'{CACHE_SETTING} = "{setting}" for each of {workers} workers is more than '
                f"this server's memory ({physical_memory() / (1 << 30):.1f} GB, the "
                "machine's or its cgroup limit)", INVALID_PARAMETER_VALUE,
                hint="It is each worker's budget, and the workers need their runtime "
                     "besides. RESET it for the default (half the memory over the workers).")
        return value
    return physical_memory() // (2 * max(int(num_workers), 1))


def _cached_bytes() -> int:
    return sum(x.nbytes + y.nbytes for x, y in _partitions.values())


def _evict_oldest() -> None:
    from .training import release

    _, (x, _y) = _partitions.popitem(last=False)
    release(x)


def partition_data(cat: Catalog, table: str, xcol: str, ycol: str, partition: int,
                   use_caching: bool = True, budget: int | None = None,
                   partition_mod: int | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """The concatenated buffers of one partition (in buffer_id order) as (x, y).

    With ``use_caching`` the result is kept for later units (at most
    ``MAX_CACHED_PARTITIONS``, least recently used dropped first). With a ``budget`` (bytes;
    ``use_caching`` NULL) a partition is kept when its decoded size fits, dropping the least
    recently used ones until the kept partitions stay within it; one larger than the budget
    is not read at all: None is returned and the caller streams it
    (:func:`partition_buffers`). Dropped partitions' tensors are released
    (:func:`cerebro_db.training.release`). A partition that holds no buffer (fewer buffers
    than partitions) gives empty arrays. ``partition_mod``: see
    :func:`cerebro_db.catalog.units.dist_expr`."""
    t = TableName.parse(table, "table")
    oid = cat.relation_oid(t)
    if oid is None:
        raise CerebroError(f'table "{table}" does not exist', UNDEFINED_TABLE)
    fp = units.partition_fingerprint(cat, t, oid, xcol, ycol, partition, partition_mod)
    key = (oid, fp["f"], fp["n"], fp["x"], xcol, ycol, partition, partition_mod)
    hit = _partitions.get(key)
    if hit is not None:
        _partitions.move_to_end(key)
        return hit
    if budget is not None:
        # decoded: float32 features as stored, labels at most twice their int16 bytes
        size = int(fp["xb"] or 0) + 2 * int(fp["yb"] or 0)
        if size > budget:
            return None
        while _partitions and _cached_bytes() + size > budget:
            _evict_oldest()
    metas = _buffers(cat, t, xcol, ycol, partition, partition_mod=partition_mod)
    if not metas:
        return np.empty((0, 0), np.float32), np.empty((0, 0), np.float32)
    keep = use_caching or budget is not None
    if keep:  # before the read, so that the data is never held twice
        _drop_streams_of(xcol, metas)
    out = _read(cat, t, xcol, metas, partition, partition_mod)
    if keep:
        _partitions[key] = out
        while budget is None and len(_partitions) > MAX_CACHED_PARTITIONS:
            _evict_oldest()
    return out


def _drop_streams_of(xcol: str, metas: list[dict[str, Any]]) -> None:
    """Release the stream arrays that hold buffers of a partition about to be cached (what
    :func:`_read_steps` recorded: the column and each buffer's stored version and size),
    e.g. left by an earlier fit of the session that streamed the same table: 94 MB per
    30,000 Fashion-MNIST rows that the cache would hold too. Called before the cache's
    read, so the two copies never coexist (a read that fails leaves neither)."""
    from .training import drop_streams

    have = {(m["version"], int(m["xn"])) for m in metas}
    drop_streams(lambda c: isinstance(c, tuple) and len(c) == 2 and c[0] == xcol
                 and set(c[1]) <= have)


def unit_data(cat: Catalog, fopts: dict[str, Any], table: str, partition: int,
              compile_params: str, kind: str = "train") -> tuple[Any, np.ndarray | None]:
    """What a unit trains or evaluates on, per the fit's ``use_caching``: TRUE, the cached
    partition; FALSE, a :class:`~cerebro_db.training.BufferSource` (nothing kept); NULL, the
    cached partition when it fits the fit's ``cache_memory`` budget, else a source. A table
    with several inputs/outputs is read whole as a :class:`~cerebro_db.training.MultiData`.
    ``kind`` 'eval_valid' reads the validation table's own columns and partitioning."""
    valid = kind == "eval_valid"
    xcol, ycol = _eval_columns(fopts, kind)
    mod = fopts.get("valid_partition_mod" if valid else "partition_mod")
    if fopts.get("xs"):
        return partition_multi(cat, table, fopts["valid_xs" if valid else "xs"],
                               fopts["valid_ys" if valid else "ys"], partition,
                               compile_params, mod), None
    caching = fopts.get("use_caching", True)
    xy = None
    if caching is None:
        xy = partition_data(cat, table, xcol, ycol, partition, budget=_budget(fopts),
                            partition_mod=mod)
    elif caching:
        xy = partition_data(cat, table, xcol, ycol, partition, partition_mod=mod)
    if xy is None:
        return partition_buffers(cat, table, xcol, ycol, partition, compile_params, mod,
                                 overlap=kind != "train" and spare_core(fopts)), None
    return xy[0], labels_for(compile_params, xy[1])


def _budget(fopts: dict[str, Any]) -> int:
    """The fit's recorded ``cache_memory``, within what :func:`cache_memory` lets a setting
    ask for (the machine's memory over the workers): the role that owns a fit may edit its
    row, and a budget past the memory gets a backend killed, which restarts every session
    of the server (a red-team pass). Not a whole number: the default."""
    workers = fopts.get("num_workers")
    workers = workers if isinstance(workers, int) and not isinstance(workers, bool) else 1
    workers = min(max(workers, 1), 1 << 16)
    budget = fopts.get("cache_memory")
    if not isinstance(budget, int) or isinstance(budget, bool):
        return cache_memory(None, workers)
    return max(0, min(budget, physical_memory() // workers))


def spare_core(fopts: dict[str, Any]) -> bool:
    """Whether the fit leaves this machine a core that its workers' TensorFlow threads do
    not use (``num_workers`` x ``worker_threads`` < cores): only then does an evaluation
    over a streamed partition evaluate the rows read while it reads the rest
    (:func:`cerebro_db.training.evaluate`); on a machine whose cores the workers fill,
    the second thread only competes with the other workers."""
    workers = int(fopts.get("num_workers") or 1)
    threads = int(fopts.get("worker_threads") or 1)
    return workers * threads < (os.cpu_count() or 1)


def _eval_columns(fopts: dict[str, Any], kind: str) -> tuple[str, str]:
    """The buffer columns a unit reads: the validation table's own names (its summary's) for
    ``eval_valid``, the training table's otherwise."""
    if kind == "eval_valid":
        return fopts.get("valid_x", fopts["x"]), fopts.get("valid_y", fopts["y"])
    return fopts["x"], fopts["y"]


def _no_rows(x: Any) -> bool:
    """Whether a unit's data is empty (a partition that holds no buffer)."""
    total = getattr(x, "total_rows", None)
    return (total if total is not None else len(x)) == 0


def partition_buffers(cat: Catalog, table: str, xcol: str, ycol: str, partition: int,
                      compile_params: str, partition_mod: int | None = None,
                      overlap: bool = False) -> Any:
    """One partition as a :class:`~cerebro_db.training.BufferSource`: buffers read and decoded
    one at a time when the unit needs them (``use_caching`` off), features straight into
    the array TensorFlow reads, reused from buffer to buffer and unit to unit
    (:func:`cerebro_db.training.stream_array`; a buffer whose stored row version that array
    still holds is not read again), labels as the loss takes them. With ``overlap`` the
    source also reads a buffer part by part (``load_rows``), so an evaluation runs on the
    rows read while the rest is read (:func:`spare_core` says when a worker asks for it)."""
    from .training import BufferSource

    t = TableName.parse(table, "table")
    ids = units.buffer_rows(cat, t, xcol, partition, partition_mod)
    keys = [r["buffer_id"] for r in ids]

    def load_rows(i: int, step: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        metas = _buffers(cat, t, xcol, ycol, partition, keys[i], partition_mod)
        if not metas:
            raise CerebroError(f'buffer {keys[i]} of "{table}" disappeared during the fit',
                               DATA_EXCEPTION, hint="do not change a packed table during a fit")
        labels = None
        for x, y, ready in _read_steps(cat, t, xcol, metas, partition, partition_mod,
                                       stream=True, step=step):
            if labels is None:
                labels = labels_for(compile_params, y)
            yield x, labels, ready

    def load(i: int) -> tuple[np.ndarray, np.ndarray]:
        for x, y, _ in load_rows(i):
            pass
        return x, y

    return BufferSource(tuple(int(r["n"]) for r in ids), load, load_rows if overlap else None)


def partition_multi(cat: Catalog, table: str, xcols: list[str], ycols: list[str],
                    partition: int, compile_params: str,
                    partition_mod: int | None = None) -> Any:
    """One partition of a table with several inputs/outputs as a
    :class:`~cerebro_db.training.MultiData` (every buffer read; labels as the loss takes
    them)."""
    from .training import MultiData, decode_buffer

    t = TableName.parse(table, "table")
    cols = xcols + ycols
    rows = units.buffers_with_shapes(cat, t, cols, partition, partition_mod)
    parts: list[list[np.ndarray]] = [[] for _ in cols]
    for r in rows:
        for i in range(len(cols)):
            raw, shape = r[f"b{i}"], r[f"s{i}"]
            if i < len(xcols):
                parts[i].append(decode_buffer(raw, shape)[0])
            else:
                wide = len(raw) == 4 * int(np.prod(shape))
                parts[i].append(np.frombuffer(bytes(raw), "<f4" if wide else "<i2")
                                .reshape(shape).astype(np.float32))
    arrays = [np.concatenate(p) if p else np.empty((0, 0), np.float32) for p in parts]
    return MultiData(arrays[:len(xcols)],
                     [labels_for(compile_params, y) for y in arrays[len(xcols):]])


def labels_for(compile_params: str, y: np.ndarray) -> np.ndarray:
    """Sparse categorical losses take class indices: one-hot rows become their argmax."""
    from .params import parse_compile_params

    loss = parse_compile_params(compile_params).loss
    if isinstance(loss, str) and "sparse" in loss and y.ndim == 2 and y.shape[1] > 1:
        return y.argmax(axis=1).astype(np.int32)
    return y


def load_state(cat: Catalog, fit_id: int, mst_key: int, version: str
               ) -> state_mod.StateBytes | None:
    return _joined(units.state_chunks(cat, fit_id, mst_key, version))


def _joined(chunks: Iterator[bytes]) -> state_mod.StateBytes | None:
    """The state from its stored rows, read one at a time: a state stored whole (one row) as
    it is, chunks copied into one buffer as they come (:func:`state.join_chunks`)."""
    first = next(chunks, None)
    if first is None:
        return None
    if state_mod.is_state(first):
        second = next(chunks, None)
        if second is None:
            return first
        return state_mod.join_chunks(itertools.chain([first, second], chunks))  # refused
    return state_mod.join_chunks(itertools.chain([first], chunks))


def save_state(cat: Catalog, fit_id: int, mst_key: int, version: str, data: state_mod.StateBytes,
               chunk_size: int) -> None:
    chunks = [data] if len(data) <= chunk_size else state_mod.iter_chunks(data, chunk_size)
    units.replace_state(cat, fit_id, mst_key, version, chunks)


def _log_unit(cat: Catalog, fit_id: int, mst_key: int, epoch: int, partition: int,
              worker: int, kind: str, started: float, ended: float, rows: int,
              loss: float, metrics: list[float], t_load: float, t_run: float, t_save: float,
              state_bytes: int | None) -> None:
    units.log_unit(cat, fit_id=fit_id, mst_key=mst_key, epoch=epoch, partition=partition,
                   worker=worker, kind=kind, started=started, ended=ended, rows=rows, loss=loss,
                   metrics=metrics, t_load=t_load, t_run=t_run, t_save=t_save,
                   state_bytes=state_bytes)


def run_unit(cat: Catalog, fit_id: int, mst_key: int, epoch: int, partition: int,
             worker: int, kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """Run one unit and return its result (never raises)."""
    t0 = time.time()
    sub = getattr(cat.db, "subtransaction", None)
    try:
        if options.get("attempt"):  # a retry: the lost session may have committed the unit
            logged = _logged_result(cat, fit_id, mst_key, epoch, partition, worker, kind,
                                    options)
            if logged is not None:
                return logged
        with sub() if sub else contextlib.nullcontext():
            return _run_unit(cat, fit_id, mst_key, epoch, partition, worker, kind,
                             {**options, "worker": worker}, t0)
    except CerebroError as e:
        return {"ok": False, "message": e.message, "sqlstate": e.sqlstate, "hint": e.hint,
                "detail": e.detail or traceback.format_exc(), "worker": worker}
    except Exception as e:  # noqa: BLE001 - reported to the coordinator with the traceback
        sqlstate = getattr(e, "sqlstate", None) or (OUT_OF_MEMORY if out_of_memory(e)
                                                     else INTERNAL_ERROR)
        if sqlstate == UNIQUE_VIOLATION and "units_once_idx" in str(e):
            # another session committed this unit while it ran here (a session the
            # coordinator gave up on, whose commit landed late): that result stands, this
            # run's state and row were rolled back with the subtransaction
            with contextlib.suppress(Exception):
                logged = _logged_result(cat, fit_id, mst_key, epoch, partition, worker,
                                        kind, options)
                if logged is not None:
                    return logged
        return {"ok": False, "message": f"{type(e).__name__}: {e}", "sqlstate": sqlstate,
                "detail": traceback.format_exc(), "worker": worker}


def _logged_result(cat: Catalog, fit_id: int, mst_key: int, epoch: int, partition: int,
                   worker: int, kind: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """The result of a unit another session already committed, as :func:`run_unit` returns
    it (metrics keyed by position, as a resume reads them), or None when it is not in the
    log. Two outside passes saw a fit fail on ``units_once_idx``: a worker killed (or a
    stalled session terminated) right after its unit committed, and the retry ran it again."""
    kinds = ["train"] if kind == "train" else list(options.get("eval_kinds", ["eval_train"]))
    rows = {r["kind"]: r for r in units.logged_unit(cat, fit_id, mst_key, epoch, partition,
                                                     kinds)}
    if set(rows) != set(kinds):
        return None

    def metrics(r: dict[str, Any]) -> dict[str, float]:
        return {str(i): v for i, v in enumerate(r["metrics"] or [])}

    def secs(r: dict[str, Any], k: str) -> float:
        return float(r[k] or 0.0)

    if kind == "train":
        r = rows["train"]
        return {"ok": True, "loss": r["loss"], "rows": r["rows"], "metrics": metrics(r),
                "seconds": secs(r, "seconds_load") + secs(r, "seconds_run")
                + secs(r, "seconds_save"), "train_seconds": secs(r, "seconds_run"),
                "read_seconds": secs(r, "seconds_load"), "worker": worker, "from_log": True}
    return {"ok": True, "evals": {k: {"loss": rows[k]["loss"], "rows": rows[k]["rows"],
                                      "metrics": metrics(rows[k])} for k in kinds},
            "seconds": sum(secs(r, "seconds_load") + secs(r, "seconds_run")
                           for r in rows.values()),
            "read_seconds": 0.0, "worker": worker, "from_log": True}


def _run_unit(cat: Catalog, fit_id: int, mst_key: int, epoch: int, partition: int, worker: int,
              kind: str, options: dict[str, Any], t0: float) -> dict[str, Any]:
    from . import training

    fit = fit_row(cat, fit_id)
    fopts = fit["options"]
    _runtime(fopts.get("worker_threads"))
    cfg = _config_row(cat, fit_id, mst_key)
    cp = compile_params_of(cat, fit, cfg)
    chunk = int(fopts.get("state_chunk_size") or DEFAULT_CHUNK_SIZE)
    if kind == "train":
        x, y = unit_data(cat, fopts, fit["source_table"], partition, cfg["compile_params"])
        t_read = time.time() - t0
        state: state_mod.StateBytes | None = load_state(cat, fit_id, mst_key, "current")
        if state is None:
            state = training.initial_state(cfg["model_arch"], cp,
                                           unit_seed(fit["random_state"], mst_key, 0, 0, 1),
                                           cfg["init_weights"])
        _hook(cat, fit_id, "before_train", mst_key, epoch, partition, options)
        t1 = time.time()
        if _no_rows(x):  # a partition that holds no buffer trains nothing
            new_state, res = training.empty_unit(state, bool(options.get("completes_epoch")))
        else:
            new_state, res = training.train_unit(
                model_cache(), cfg["model_arch"], cp, fit_params_of(cat, fit, cfg), state,
                x, y, unit_seed(fit["random_state"], mst_key, epoch, partition),
                bool(options.get("reset_optimizer")),
                completes_epoch=bool(options.get("completes_epoch")))
        t2 = time.time()
        if options.get("keep_previous"):
            units.keep_state(cat, fit_id, mst_key, f"epoch:{epoch - 1}")
        save_state(cat, fit_id, mst_key, "current", new_state, chunk)
        t3 = time.time()
        metrics = [float(v) for v in res.metrics.values()]
        _log_unit(cat, fit_id, mst_key, epoch, partition, worker, kind, t0, t3, res.rows,
                  res.loss, metrics, t1 - t0, t2 - t1, t3 - t2, len(new_state))
        _hook(cat, fit_id, "after_save", mst_key, epoch, partition, options)
        return {"ok": True, "loss": res.loss, "rows": res.rows, "metrics": res.metrics,
                "seconds": t3 - t0, "train_seconds": t2 - t1, "read_seconds": t_read,
                "worker": worker}
    from .params import parse_fit_params

    _hook(cat, fit_id, "eval", mst_key, epoch, partition, options)
    state = _joined(units.epoch_state_chunks(cat, fit_id, mst_key, epoch))
    if state is None:
        raise CerebroError(f"no state of configuration {mst_key} at epoch {epoch}", INTERNAL_ERROR)
    entry = model_cache().get(cfg["model_arch"], cp)
    bs = training.eval_batch_size(entry.model, parse_fit_params(cfg["fit_params"]).batch_size)
    evals: dict[str, Any] = {}
    loaded = False  # the cached model holds the state's weights (after the first evaluate)
    t1 = t0  # the first kind's row covers the call's own work: the state's read and load
    t_read = 0.0  # the partitions' rows
    for ek in options.get("eval_kinds", ["eval_train"]):
        table = fit["source_table"] if ek == "eval_train" else fit["validation_table"]
        t_data = time.time()
        x, y = unit_data(cat, fopts, table, partition, cfg["compile_params"], ek)
        t2 = time.time()
        t_read += t2 - t_data
        if _no_rows(x):
            ev = training.EvalResult(float("nan"), {}, 0)
        else:
            ev = training.evaluate(model_cache(), cfg["model_arch"], cp, state, x, y,
                                   batch_size=bs, weights_loaded=loaded)
            loaded = True
        t3 = time.time()
        _log_unit(cat, fit_id, mst_key, epoch, partition, worker, ek, t1, t3, ev.rows, ev.loss,
                  [float(v) for v in ev.metrics.values()], t2 - t1, t3 - t2, 0.0, None)
        evals[ek] = {"loss": ev.loss, "rows": ev.rows, "metrics": ev.metrics}
        t1 = t3
    return {"ok": True, "evals": evals, "seconds": time.time() - t0, "read_seconds": t_read,
            "worker": worker}
