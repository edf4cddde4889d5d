"""What a worker session does for one unit: load, train or evaluate, save, log.

A worker is a database session the coordinator opened (dblink) for the whole fit. Its
Python interpreter lives as long as the session, so this module keeps, across units:

* with ``use_caching``, the decoded buffers of the partitions it has read, concatenated
  per partition (at most ``MAX_CACHED_PARTITIONS``, least recently used dropped first),
  keyed by the packed table's identity and contents fingerprint, so a changed table is
  read again; training keeps one more float32 copy of a partition's features (its feed,
  :mod:`cerebro_db.training`, at most ``MAX_TRAIN_FEEDS``) and evaluation one per evaluated
  partition (at most 4). Each copy is rows x features x 4 bytes;
* the compiled Keras models (:class:`cerebro_db.training.ModelCache`, at most 8 here),
  so a unit costs training plus one state load and one state save, not a rebuild and a
  retrace. A model costs about (1 + optimizer slots per weight) x parameters x 4 bytes
  (Adam: 3x the weights) plus its traced functions.

Memory rule: with ``use_caching`` a worker needs about twice its training partition and
twice its validation partition, plus its models. A partition that does not fit in memory
needs ``use_caching`` off (MADlib's default): nothing of the data is kept between units,
and a unit reads its partition one packed buffer at a time (:func:`partition_buffers`),
holding one decoded buffer and one tensor copy of it; the buffer size is the
preprocessor's ``buffer_size`` (MADlib's default rule: about 75 million feature values,
300 MB, per buffer; preprocess with a smaller ``buffer_size`` when that is too much).
Training over buffers shuffles the buffer order, then the rows within each buffer, and a
batch never spans two buffers (as MADlib trains); with one buffer per partition it gives
bitwise the models ``use_caching`` gives.

A unit's state save, its unit row and (at an epoch's end) the epoch snapshot are written
in the worker's own transaction, committed when the unit's statement ends, inside one
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
import json
import time
import traceback
from typing import Any

import numpy as np

from . import state as state_mod
from .catalog import Catalog
from .errors import OUT_OF_MEMORY, CerebroError, out_of_memory
from .names import TableName, quote_ident

MAX_CACHED_PARTITIONS = 4
DEFAULT_CHUNK_SIZE = 256 * 1024 * 1024
EVAL_BATCH = 2048  # evaluation needs no small batches; large ones halve its cost

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


def _runtime(threads: int | None) -> None:
    global _runtime_done
    if not _runtime_done:
        from .training import configure_runtime

        configure_runtime(threads)
        _runtime_done = True


HOOK_SETTING = "cerebro_db.test_hook"
HOOK_POINTS = ("before_train", "after_save", "eval")


def _hook(cat: Catalog, point: str, mst_key: int, epoch: int, partition: int,
          options: dict[str, Any]) -> None:
    """Sleep where ``cerebro_db.test_hook`` says (superuser sessions only; tests)."""
    text = cat.setting(HOOK_SETTING)
    if not text or cat.setting("is_superuser") != "on":
        return
    try:
        spec = json.loads(text)
    except ValueError:
        return
    here = {"point": point, "mst_key": mst_key, "epoch": epoch, "partition": partition,
            "attempt": int(options.get("attempt", 0)), "worker": options.get("worker")}
    for h in spec if isinstance(spec, list) else [spec]:
        if not isinstance(h, dict):
            continue
        want = {"attempt": 0, **{k: v for k, v in h.items() if k != "seconds"}}
        if all(here.get(k) == v for k, v in want.items()):
            cat.query("SELECT pg_catalog.pg_sleep($1)", [float(h.get("seconds", 1))],
                      ["float8"])


def unit_seed(random_state: int, mst_key: int, epoch: int, partition: int, salt: int = 0) -> int:
    """The seed of one unit: a function of the run's seed and the unit's coordinates only,
    so a replay in any process uses the same one."""
    ss = np.random.SeedSequence([int(random_state) & 0xFFFFFFFF, mst_key, epoch, partition, salt])
    return int(ss.generate_state(1)[0] & 0x7FFFFFFF)


def _fit_row(cat: Catalog, fit_id: int) -> dict[str, Any]:
    row = _fits.get(fit_id)
    if row is None:
        rows = cat.query(f"SELECT * FROM {cat.ext('fits')} WHERE fit_id = $1", [fit_id], ["int8"])
        if not rows:
            raise CerebroError(f"fit {fit_id} does not exist", "42704")
        row = dict(rows[0])
        row["options"] = json.loads(row["options"]) if isinstance(row["options"], str) \
            else row["options"]
        _fits[fit_id] = row
    return row


def _config_row(cat: Catalog, fit_id: int, mst_key: int) -> dict[str, Any]:
    key = (fit_id, mst_key)
    row = _configs.get(key)
    if row is None:
        rows = cat.query(f"SELECT * FROM {cat.ext('fit_configs')} WHERE fit_id = $1 AND "
                         "mst_key = $2", [fit_id, mst_key], ["int8", "int4"])
        if not rows:
            raise CerebroError(f"configuration {mst_key} of fit {fit_id} does not exist", "42704")
        row = dict(rows[0])
        _configs[key] = row
    return row


def partition_data(cat: Catalog, table: str, xcol: str, ycol: str, partition: int,
                   use_caching: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The concatenated buffers of one partition (in buffer_id order) as (x, y)."""
    from .training import decode_buffer

    t = TableName.parse(table, "table")
    oid = cat.relation_oid(t)
    if oid is None:
        raise CerebroError(f'table "{table}" does not exist', "42P01")
    fp = cat.query(
        f"SELECT pg_catalog.pg_relation_filenode($1::oid::regclass) AS f, count(*) AS n, "
        f"max(xmin::text::bigint) AS x FROM {t.sql} WHERE __dist_key__ = $2",
        [oid, partition], ["oid", "int4"])[0]
    key = (oid, fp["f"], fp["n"], fp["x"], xcol, ycol, partition)
    hit = _partitions.get(key)
    if hit is not None:
        _partitions.move_to_end(key)
        return hit
    xq, yq = quote_ident(xcol), quote_ident(ycol)
    rows = cat.query(
        f"SELECT {xq} AS x, {quote_ident(xcol + '_shape')} AS xs, {yq} AS y, "
        f"{quote_ident(ycol + '_shape')} AS ys FROM {t.sql} WHERE __dist_key__ = $1 "
        "ORDER BY buffer_id", [partition], ["int4"])
    if not rows:
        raise CerebroError(f'partition {partition} of "{table}" is empty', "22000")
    ydtype = "float32" if len(rows[0]["y"]) == 4 * int(np.prod(rows[0]["ys"])) else "int16"
    xs, ys = [], []
    for r in rows:
        x, y = decode_buffer(r["x"], r["xs"], r["y"], r["ys"], ydtype)
        xs.append(x)
        ys.append(y)
    out = (np.concatenate(xs) if len(xs) > 1 else xs[0],
           np.concatenate(ys) if len(ys) > 1 else ys[0])
    if use_caching:
        _partitions[key] = out
        while len(_partitions) > MAX_CACHED_PARTITIONS:
            _partitions.popitem(last=False)
    return out


def partition_buffers(cat: Catalog, table: str, xcol: str, ycol: str, partition: int,
                      compile_params: str) -> Any:
    """One partition as a :class:`~cerebro_db.training.BufferSource`: buffers read and decoded
    one at a time when the unit needs them (``use_caching`` off), labels as the loss takes
    them."""
    from .training import BufferSource, decode_buffer

    t = TableName.parse(table, "table")
    shape = quote_ident(xcol + "_shape")
    ids = cat.query(f"SELECT buffer_id, ({shape})[1] AS n FROM {t.sql} WHERE __dist_key__ = $1 "
                    "ORDER BY buffer_id", [partition], ["int4"])
    if not ids:
        raise CerebroError(f'partition {partition} of "{table}" is empty', "22000")
    keys = [r["buffer_id"] for r in ids]

    def load(i: int) -> tuple[np.ndarray, np.ndarray]:
        r = cat.query(
            f"SELECT {quote_ident(xcol)} AS x, {shape} AS xs, {quote_ident(ycol)} AS y, "
            f"{quote_ident(ycol + '_shape')} AS ys FROM {t.sql} WHERE __dist_key__ = $1 AND "
            "buffer_id = $2", [partition, keys[i]], ["int4", "int4"])[0]
        ydtype = "float32" if len(r["y"]) == 4 * int(np.prod(r["ys"])) else "int16"
        x, y = decode_buffer(r["x"], r["xs"], r["y"], r["ys"], ydtype)
        return x, labels_for(compile_params, y)

    return BufferSource(tuple(int(r["n"]) for r in ids), load)


def labels_for(compile_params: str, y: np.ndarray) -> np.ndarray:
    """Sparse categorical losses take class indices: one-hot rows become their argmax."""
    from .params import parse_compile_params

    loss = parse_compile_params(compile_params).loss
    if isinstance(loss, str) and "sparse" in loss and y.ndim == 2 and y.shape[1] > 1:
        return y.argmax(axis=1).astype(np.int32)
    return y


def load_state(cat: Catalog, fit_id: int, mst_key: int, version: str) -> bytes | None:
    rows = cat.query(f"SELECT data FROM {cat.ext('model_states')} WHERE fit_id = $1 AND "
                     "mst_key = $2 AND version = $3 ORDER BY chunk",
                     [fit_id, mst_key, version], ["int8", "int4", "text"])
    if not rows:
        return None
    chunks = [bytes(r["data"]) for r in rows]
    return chunks[0] if len(chunks) == 1 and state_mod.is_state(chunks[0]) \
        else state_mod.join_chunks(chunks)


def save_state(cat: Catalog, fit_id: int, mst_key: int, version: str, data: bytes,
               chunk_size: int) -> None:
    chunks = [data] if len(data) <= chunk_size else state_mod.split_chunks(data, chunk_size)
    cat.query(f"DELETE FROM {cat.ext('model_states')} WHERE fit_id = $1 AND mst_key = $2 "
              "AND version = $3", [fit_id, mst_key, version], ["int8", "int4", "text"])
    for i, c in enumerate(chunks):
        cat.query(f"INSERT INTO {cat.ext('model_states')} (fit_id, mst_key, version, chunk, "
                  "data) VALUES ($1, $2, $3, $4, $5)", [fit_id, mst_key, version, i, c],
                  ["int8", "int4", "text", "int4", "bytea"])


def _log_unit(cat: Catalog, fit_id: int, mst_key: int, epoch: int, partition: int,
              worker: int, kind: str, started: float, ended: float, rows: int,
              loss: float, metrics: list[float], t_load: float, t_run: float, t_save: float,
              state_bytes: int | None) -> None:
    cat.query(
        f"INSERT INTO {cat.ext('units')} (fit_id, mst_key, epoch, partition, worker, kind, "
        "started_at, ended_at, rows, loss, metrics, seconds_load, seconds_run, seconds_save, "
        "state_bytes, worker_pid) VALUES ($1, $2, $3, $4, $5, $6, to_timestamp($7), "
        "to_timestamp($8), $9, $10, $11, $12, $13, $14, $15, pg_backend_pid())",
        [fit_id, mst_key, epoch, partition, worker, kind, started, ended, rows, loss, metrics,
         t_load, t_run, t_save, state_bytes],
        ["int8", "int4", "int4", "int4", "int4", "text", "float8", "float8", "int8", "float8",
         "float8[]", "float8", "float8", "float8", "int8"])


def run_unit(cat: Catalog, fit_id: int, mst_key: int, epoch: int, partition: int,
             worker: int, kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """Run one unit and return its result (never raises)."""
    t0 = time.time()
    sub = getattr(cat.db, "subtransaction", None)
    try:
        with sub() if sub else contextlib.nullcontext():
            return _run_unit(cat, fit_id, mst_key, epoch, partition, worker, kind,
                             {**options, "worker": worker}, t0)
    except CerebroError as e:
        return {"ok": False, "message": e.message, "sqlstate": e.sqlstate, "hint": e.hint,
                "detail": e.detail or traceback.format_exc(), "worker": worker}
    except Exception as e:  # noqa: BLE001 - reported to the coordinator with the traceback
        sqlstate = getattr(e, "sqlstate", None) or (OUT_OF_MEMORY if out_of_memory(e)
                                                     else "XX000")
        return {"ok": False, "message": f"{type(e).__name__}: {e}", "sqlstate": sqlstate,
                "detail": traceback.format_exc(), "worker": worker}


def _run_unit(cat: Catalog, fit_id: int, mst_key: int, epoch: int, partition: int, worker: int,
              kind: str, options: dict[str, Any], t0: float) -> dict[str, Any]:
    from . import training

    fit = _fit_row(cat, fit_id)
    fopts = fit["options"]
    _runtime(fopts.get("worker_threads"))
    cfg = _config_row(cat, fit_id, mst_key)
    chunk = int(fopts.get("state_chunk_size") or DEFAULT_CHUNK_SIZE)
    if kind == "train":
        if fopts.get("use_caching", True):
            x, y = partition_data(cat, fit["source_table"], fopts["x"], fopts["y"], partition)
            y = labels_for(cfg["compile_params"], y)
        else:
            x, y = partition_buffers(cat, fit["source_table"], fopts["x"], fopts["y"],
                                     partition, cfg["compile_params"]), None
        state = load_state(cat, fit_id, mst_key, "current")
        if state is None:
            state = training.initial_state(cfg["model_arch"], cfg["compile_params"],
                                           unit_seed(fit["random_state"], mst_key, 0, 0, 1),
                                           cfg["init_weights"])
        _hook(cat, "before_train", mst_key, epoch, partition, options)
        t1 = time.time()
        new_state, res = training.train_unit(
            model_cache(), cfg["model_arch"], cfg["compile_params"], cfg["fit_params"], state,
            x, y, unit_seed(fit["random_state"], mst_key, epoch, partition),
            bool(options.get("reset_optimizer")),
            completes_epoch=bool(options.get("completes_epoch")))
        t2 = time.time()
        save_state(cat, fit_id, mst_key, "current", new_state, chunk)
        if options.get("snapshot"):
            save_state(cat, fit_id, mst_key, f"epoch:{epoch}", new_state, chunk)
        t3 = time.time()
        metrics = [float(v) for v in res.metrics.values()]
        _log_unit(cat, fit_id, mst_key, epoch, partition, worker, kind, t0, t3, res.rows,
                  res.loss, metrics, t1 - t0, t2 - t1, t3 - t2, len(new_state))
        _hook(cat, "after_save", mst_key, epoch, partition, options)
        return {"ok": True, "loss": res.loss, "rows": res.rows, "metrics": res.metrics,
                "seconds": t3 - t0, "train_seconds": t2 - t1, "worker": worker}
    from .params import parse_fit_params

    state = load_state(cat, fit_id, mst_key, f"epoch:{epoch}")
    if state is None:
        raise CerebroError(f"no state of configuration {mst_key} at epoch {epoch}", "XX000")
    bs = max(parse_fit_params(cfg["fit_params"]).batch_size, EVAL_BATCH)
    _hook(cat, "eval", mst_key, epoch, partition, options)
    evals: dict[str, Any] = {}
    for ek in options.get("eval_kinds", ["eval_train"]):
        t1 = time.time()
        table = fit["source_table"] if ek == "eval_train" else fit["validation_table"]
        if fopts.get("use_caching", True):
            x, y = partition_data(cat, table, fopts["x"], fopts["y"], partition)
            y = labels_for(cfg["compile_params"], y)
        else:
            x, y = partition_buffers(cat, table, fopts["x"], fopts["y"], partition,
                                     cfg["compile_params"]), None
        t2 = time.time()
        ev = training.evaluate(model_cache(), cfg["model_arch"], cfg["compile_params"], state,
                               x, y, batch_size=bs)
        t3 = time.time()
        _log_unit(cat, fit_id, mst_key, epoch, partition, worker, ek, t1, t3, ev.rows, ev.loss,
                  [float(v) for v in ev.metrics.values()], t2 - t1, t3 - t2, 0.0, None)
        evals[ek] = {"loss": ev.loss, "rows": ev.rows, "metrics": ev.metrics}
    return {"ok": True, "evals": evals, "seconds": time.time() - t0, "worker": worker}
