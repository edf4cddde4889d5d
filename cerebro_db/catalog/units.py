"""The worker side of a unit: the fit's rows, reading a partition of a packed table,
loading and saving model states, logging the unit."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..names import TableName, quote_ident
from .sessions import purge


def sleep(cat: Any, seconds: float) -> None:
    cat.query("SELECT pg_catalog.pg_sleep($1)", [float(seconds)], ["float8"])


def fit(cat: Any, fit_id: int) -> dict[str, Any] | None:
    rows = cat.query(f"SELECT * FROM {cat.ext('fits')} WHERE fit_id = $1", [fit_id], ["int8"])
    return rows[0] if rows else None


def fit_config(cat: Any, fit_id: int, mst_key: int) -> dict[str, Any] | None:
    rows = cat.query(f"SELECT * FROM {cat.ext('fit_configs')} WHERE fit_id = $1 AND "
                     "mst_key = $2", [fit_id, mst_key], ["int8", "int4"])
    return rows[0] if rows else None


# -- reading a partition ----------------------------------------------------------------------
def dist_expr(partition_mod: int | None) -> str:
    """The SQL expression of a packed row's partition: ``__dist_key__`` for our tables,
    ``buffer_id % p`` for a table packed by MADlib's preprocessor (no partitions of ours)."""
    return "__dist_key__" if partition_mod is None else f"(buffer_id % {int(partition_mod)})"


def buffers(cat: Any, t: TableName, xcol: str, ycol: str, partition: int,
            buffer_id: int | None = None, partition_mod: int | None = None
            ) -> list[dict[str, Any]]:
    """The partition's buffers (or one), in buffer_id order: ``id``, shapes ``xs`` and
    ``ys``, labels ``y``, the feature bytes' length ``xn``, whether they are stored
    compressed (``packed``) and the stored row version ``version`` (the relation's file,
    the row's ctid and xmin: a changed row, a rewritten or another table gets another);
    not the features themselves (:func:`feature_slice`)."""
    x = quote_ident(xcol)
    one = "" if buffer_id is None else " AND buffer_id = $2"
    return cat.query(
        f"SELECT buffer_id AS id, {quote_ident(xcol + '_shape')} AS xs, {quote_ident(ycol)} AS y, "
        f"{quote_ident(ycol + '_shape')} AS ys, pg_catalog.octet_length({x}) AS xn, "
        f"pg_catalog.pg_column_compression({x}) IS NOT NULL AS packed, "
        "pg_catalog.concat_ws('/', tableoid, pg_catalog.pg_relation_filenode(tableoid), ctid, "
        "xmin) AS version "
        f"FROM {t.sql} WHERE {dist_expr(partition_mod)} = $1{one} ORDER BY buffer_id",
        [partition] if buffer_id is None else [partition, buffer_id],
        ["int4"] if buffer_id is None else ["int4", "int4"])


def feature_slice(cat: Any, t: TableName, xcol: str, partition: int, buffer_id: int,
                  offset: int, length: int, partition_mod: int | None = None) -> bytes:
    """``length`` bytes of one buffer's features from byte ``offset`` (0-based)."""
    return cat.query(f"SELECT pg_catalog.substr({quote_ident(xcol)}, $3, $4) AS s "
                     f"FROM {t.sql} WHERE {dist_expr(partition_mod)} = $1 AND buffer_id = $2",
                     [partition, buffer_id, offset + 1, length],
                     ["int4", "int4", "int4", "int4"])[0]["s"]


def partition_fingerprint(cat: Any, t: TableName, oid: int, xcol: str, ycol: str,
                          partition: int, partition_mod: int | None = None) -> dict[str, Any]:
    """What identifies a partition's contents (``f`` filenode, ``n`` rows, ``x`` the
    largest xmin) and its stored sizes (``xb`` feature bytes, ``yb`` label bytes)."""
    return cat.query(
        f"SELECT pg_catalog.pg_relation_filenode($1::oid::regclass) AS f, count(*) AS n, "
        f"max(xmin::text::bigint) AS x, "
        f"sum(pg_catalog.octet_length({quote_ident(xcol)}))::int8 AS xb, "
        f"sum(pg_catalog.octet_length({quote_ident(ycol)}))::int8 AS yb "
        f"FROM {t.sql} WHERE {dist_expr(partition_mod)} = $2",
        [oid, partition], ["oid", "int4"])[0]


def buffer_rows(cat: Any, t: TableName, xcol: str, partition: int,
                partition_mod: int | None = None) -> list[dict[str, Any]]:
    """``buffer_id`` and ``n`` (rows) of each buffer of a partition, in order."""
    return cat.query(f"SELECT buffer_id, ({quote_ident(xcol + '_shape')})[1] AS n "
                     f"FROM {t.sql} WHERE {dist_expr(partition_mod)} = $1 ORDER BY buffer_id",
                     [partition], ["int4"])


def buffers_with_shapes(cat: Any, t: TableName, cols: Sequence[str], partition: int,
                        partition_mod: int | None = None) -> list[dict[str, Any]]:
    """Every buffer of a partition, column ``i`` of ``cols`` as ``b<i>`` with its shape as
    ``s<i>``, in buffer_id order."""
    sel = ", ".join(f"{quote_ident(c)} AS b{i}, {quote_ident(c + '_shape')} AS s{i}"
                    for i, c in enumerate(cols))
    return cat.query(f"SELECT {sel} FROM {t.sql} WHERE {dist_expr(partition_mod)} = $1 "
                     "ORDER BY buffer_id", [partition], ["int4"])


# -- model states and the unit log -----------------------------------------------------------
def _chunks(cat: Any, sql: str, args: list[Any], types: list[str]) -> Iterator[bytes]:
    """The ``data`` of a query's rows, one row fetched at a time (a cursor), so a reader
    that drops each chunk once copied holds one chunk, not all of them."""
    for rows in cat.stream(sql, args, types, batch=1):
        for r in rows:
            yield r["data"]


def state_chunks(cat: Any, fit_id: int, mst_key: int, version: str) -> Iterator[bytes]:
    """The stored chunks of one model state, in order (none when there is no state)."""
    return _chunks(cat, f"SELECT data FROM {cat.ext('model_states')} WHERE fit_id = $1 AND "
                   "mst_key = $2 AND version = $3 ORDER BY chunk",
                   [fit_id, mst_key, version], ["int8", "int4", "text"])


def epoch_state_chunks(cat: Any, fit_id: int, mst_key: int, epoch: int) -> Iterator[bytes]:
    """The chunks of the state at the end of ``epoch``, as an evaluation of that epoch reads
    it: the kept 'epoch:N' version once the config trained on (:func:`keep_state`), else
    'current' while the config's latest logged training unit is of that epoch (it has not
    moved on: 'current' is that state). One statement, so one snapshot: a unit of the next
    epoch that commits meanwhile (keeping 'epoch:N' and writing a new 'current' together)
    is seen whole or not at all. None when neither holds."""
    states, log = cat.ext("model_states"), cat.ext("units")
    return _chunks(
        cat,
        f"SELECT data FROM {states} WHERE fit_id = $1 AND mst_key = $2 AND version = "
        f"(CASE WHEN EXISTS (SELECT 1 FROM {states} WHERE fit_id = $1 AND mst_key = $2 AND "
        f"version = $3) THEN $3 WHEN (SELECT max(epoch) FROM {log} WHERE fit_id = $1 AND "
        "mst_key = $2 AND kind = 'train') = $4 THEN 'current' END) ORDER BY chunk",
        [fit_id, mst_key, f"epoch:{epoch}", epoch], ["int8", "int4", "text", "int4"])


def keep_state(cat: Any, fit_id: int, mst_key: int, version: str) -> None:
    """Keep the 'current' state as ``version`` ('epoch:N', for that epoch's evaluation) by
    relabelling its rows: the data stays where it is (no second copy, no WAL for it); the
    unit then writes a new 'current'. A ``version`` left by an earlier attempt goes first."""
    states = cat.ext("model_states")
    args, types = [fit_id, mst_key, version], ["int8", "int4", "text"]
    cat.query(f"UPDATE {states} SET doomed = true WHERE fit_id = $1 AND mst_key = $2 AND "
              "version = $3", args, types)
    cat.query(purge(cat, "model_states"))
    cat.query(f"UPDATE {states} SET version = $3 WHERE fit_id = $1 AND mst_key = $2 AND "
              "version = 'current'", args, types)


def replace_state(cat: Any, fit_id: int, mst_key: int, version: str,
                  chunks: Iterable[bytes | bytearray]) -> None:
    """Store one model state as ``chunks`` in place of the one stored before."""
    cat.query(f"UPDATE {cat.ext('model_states')} SET doomed = true WHERE fit_id = $1 AND "
              "mst_key = $2 AND version = $3", [fit_id, mst_key, version],
              ["int8", "int4", "text"])
    cat.query(purge(cat, "model_states"))
    for i, c in enumerate(chunks):
        cat.query(f"INSERT INTO {cat.ext('model_states')} (fit_id, mst_key, version, chunk, "
                  "data) VALUES ($1, $2, $3, $4, $5)", [fit_id, mst_key, version, i, c],
                  ["int8", "int4", "text", "int4", "bytea"])


def log_unit(cat: Any, *, fit_id: int, mst_key: int, epoch: int, partition: int,
             worker: int, kind: str, started: float, ended: float, rows: int, loss: float,
             metrics: list[float], t_load: float, t_run: float, t_save: float,
             state_bytes: int | None) -> None:
    """One row of ``units`` (times as Unix seconds), with this backend's pid."""
    cat.query(
        f"INSERT INTO {cat.ext('units')} (fit_id, mst_key, epoch, partition, worker, kind, "
        "started_at, ended_at, rows, loss, metrics, seconds_load, seconds_run, seconds_save, "
        "state_bytes, worker_pid) VALUES ($1, $2, $3, $4, $5, $6, pg_catalog.to_timestamp($7), "
        "pg_catalog.to_timestamp($8), $9, $10, $11, $12, $13, $14, $15, "
        "pg_catalog.pg_backend_pid())",
        [fit_id, mst_key, epoch, partition, worker, kind, started, ended, rows, loss, metrics,
         t_load, t_run, t_save, state_bytes],
        ["int8", "int4", "int4", "int4", "int4", "text", "float8", "float8", "int8", "float8",
         "float8[]", "float8", "float8", "float8", "int8"])


def logged_unit(cat: Any, fit_id: int, mst_key: int, epoch: int, partition: int,
                kinds: Sequence[str]) -> list[dict[str, Any]]:
    """The committed ``units`` rows of one unit, one per kind logged (a training unit's
    kind is 'train'; an evaluation unit's, each of its eval kinds)."""
    return cat.query(
        f"SELECT kind, rows, loss, metrics, seconds_load, seconds_run, seconds_save "
        f"FROM {cat.ext('units')} WHERE fit_id = $1 AND mst_key = $2 AND epoch = $3 "
        "AND partition = $4 AND kind = ANY($5)", [fit_id, mst_key, epoch, partition,
                                                  list(kinds)],
        ["int8", "int4", "int4", "int4", "text[]"])


# -- pipelined dispatch: a worker session's slots (see migration 080_unit_postings) ------------
def posting(cat: Any, tag: str, fit_id: int, worker: int, seq: int
            ) -> tuple[str, str | None] | None:
    """The slot's posting: (kind, unit JSON) or None while nothing is posted."""
    rows = cat.query(f"SELECT kind, unit::text AS unit FROM {cat.ext('unit_postings')} "
                     "WHERE fit_id = $1 AND tag = $2 AND worker = $3 AND seq = $4",
                     [fit_id, tag, worker, seq], ["int8", "text", "int4", "int4"])
    return (rows[0]["kind"], rows[0]["unit"]) if rows else None


def abandon_slot(cat: Any, tag: str, fit_id: int, worker: int, seq: int) -> bool:
    """Mark the slot abandoned unless something was posted for it first (the primary key
    decides); True when it is abandoned."""
    return bool(cat.query(
        f"INSERT INTO {cat.ext('unit_postings')} (tag, worker, seq, fit_id, kind) "
        "VALUES ($1, $2, $3, $4, 'abandoned') ON CONFLICT DO NOTHING RETURNING 1 AS x",
        [tag, worker, seq, fit_id], ["text", "int4", "int4", "int8"]))
