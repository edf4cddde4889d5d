"""``madlib_keras_fit_multiple_model``, ``madlib_keras_fit`` and ``madlib_keras_fit_resume``:
model hopper training, fault tolerant and resumable.

Settings read by the coordinator: ``cerebro_db.max_unit_retries`` (default 3: how often one
unit may lose its worker session before the fit fails), ``cerebro_db.unit_timeout``
(seconds, default off: a unit running longer has its session terminated and is retried on a
fresh one), ``cerebro_db.replicas`` (default 1: with r > 1 worker w holds partitions
w .. w+r-1 mod p, so a worker lost for good leaves the fit and the others serve its
partitions) and ``cerebro_db.test_hook`` (tests; forwarded to the worker sessions).

``cerebro_db_fit_workers(fit_id, num_workers)`` asks a running fit (from another session) for
a different number of worker sessions; the coordinator reads the request between units. The
availability map (worker -> partitions, status, pid) is kept in ``cerebro_db.fit_workers``.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .. import __version__, keras_arch, params
from .. import state as state_mod
from ..catalog import Catalog
from ..coordinator import ConfigResult, FitOutcome, combine, run_fit
from ..errors import (
    DATATYPE_MISMATCH,
    DUPLICATE_TABLE,
    FEATURE_NOT_SUPPORTED,
    NULL_VALUE_NOT_ALLOWED,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    UNDEFINED_TABLE,
    CerebroError,
    invalid,
)
from ..executors import DblinkExecutor, StallRule, end_sessions, is_cancel
from ..names import TableName, quote_ident
from ..remote.executor import RemoteExecutor, executor_url
from ..scheduling import (
    EVAL,
    TRAIN,
    Assignment,
    Progress,
    RunningUnit,
    evaluation_epochs,
    get_policy,
    initial_workers,
    policy_class,
    replica_partitions,
)
from . import entrypoint, require_output_schema
from .compat import custom_references
from .models import require_arch_table
from .preprocessing import read_training_summary, resolve_seed, summary_source_sql
from .selection import check_fit_bounds

CHUNK_SETTING = "cerebro_db.state_chunk_size"
MAX_ITERATIONS = 100_000
"""The most iterations (epochs) one fit may ask for; checked before any work."""
MAX_UNITS = 2**31 - 1
"""The most training units of one fit (configs x iterations x partitions; the catalog's
``total_units`` is an integer)."""
CONNINFO_SETTING = "cerebro_db.worker_conninfo"
RETRIES_SETTING = "cerebro_db.max_unit_retries"
TIMEOUT_SETTING = "cerebro_db.unit_timeout"
TIMEOUT_FLOOR_SETTING = "cerebro_db.unit_timeout_floor"
TIMEOUT_FACTOR_SETTING = "cerebro_db.unit_timeout_factor"
TIMEOUT_FIRST_SETTING = "cerebro_db.unit_timeout_first"
HOOK_SETTING = "cerebro_db.test_hook"
REPLICAS_SETTING = "cerebro_db.replicas"
IDLE_SETTING = "cerebro_db.worker_idle_timeout"
DEFAULT_IDLE_TIMEOUT = 300.0
DEFAULT_MAX_UNIT_RETRIES = 3
MAX_WORKERS = 64
MIN_CHUNK_SIZE = 1024
WORKER_LIMITS = ("max_workers_per_fit", "max_workers_per_role")
"""Rows of the DBA's table ``limits``; defaults: :func:`default_worker_limits`."""
POLL_WORKERS = 0.5


@dataclass
class PackedTable:
    """A table made by the preprocessors, with what its summary says."""

    table: TableName
    qualified: str
    summary: dict[str, Any]
    x: str
    y: str
    x_size: int
    y_width: int
    partitions: int
    kind: str
    partition_mod: int | None = None  # MADlib-packed: partition = buffer_id % partition_mod
    multi: dict[str, list[Any]] | None = None  # several inputs/outputs: xs, ys, sizes, kinds

    def columns(self) -> tuple[list[str], list[str], list[int], list[int], list[str]]:
        """Buffer columns, values per row and label kinds of every input and output."""
        if self.multi is None:
            return [self.x], [self.y], [self.x_size], [self.y_width], [self.kind]
        m = self.multi
        return m["xs"], m["ys"], m["x_sizes"], m["y_widths"], m["kinds"]

    @property
    def temporary(self) -> bool:
        """Whether the table is a temporary one (only the calling session sees it; schema
        names starting with ``pg_`` are reserved, so ``pg_temp_N`` is a session's)."""
        return self.qualified.startswith(("pg_temp_", '"pg_temp_'))

    @property
    def dep_name(self) -> str:
        """The dependent variable's name (its class values are ``<name>_class_values``)."""
        return str(self.summary["dependent_varname"][0])


def _qualified(cat: Catalog, t: TableName) -> str:
    oid = cat.relation_oid(t)
    row = cat.query("SELECT n.nspname::text AS s, c.relname::text AS r FROM pg_catalog.pg_class c "
                    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
                    [oid], ["oid"])[0]
    return quote_ident(row["s"]) + "." + quote_ident(row["r"])


def refuse_temporary(cat: Catalog, t: TableName, what: str) -> None:
    """Worker sessions cannot see another session's temporary table: refuse it up front."""
    rows = cat.query("SELECT relpersistence::text AS p FROM pg_catalog.pg_class WHERE oid = "
                     "pg_catalog.to_regclass($1)", [t.sql], ["text"])
    if rows and rows[0]["p"] == "t":
        raise CerebroError(f'{what} "{t}" is a temporary table, which the worker sessions '
                           "cannot see", FEATURE_NOT_SUPPORTED,
                           hint="Pack the data into a regular (or UNLOGGED) table.")


def refuse_uncommitted(cat: Catalog, ex: DblinkExecutor, tables: Sequence[PackedTable | None]
                       ) -> None:
    """The packed tables exist for the worker sessions (opened already): a table created in
    the caller's transaction, not yet committed, does not."""
    for t in tables:
        if t is None:
            continue
        seen = ex.control_query("SELECT (pg_catalog.to_regclass("
                                f"{cat.literal(t.qualified)}) IS NOT NULL)::text")
        if not seen or seen[0][0] != "true":
            raise CerebroError(f'table "{t.table}" was created in this transaction, which the '
                               "worker sessions cannot see until it commits",
                               OBJECT_NOT_IN_PREREQUISITE_STATE,
                               hint="COMMIT the transaction that made it, then call the "
                               "function again.")


def state_chunk_size(cat: Catalog) -> int | None:
    """``cerebro_db.state_chunk_size`` (bytes of model state per catalog row), checked."""
    raw = cat.setting(CHUNK_SETTING)
    if raw is None:
        return None
    limit = state_mod.MAX_CHUNK_SIZE - 64
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if not MIN_CHUNK_SIZE <= n <= limit:
        raise invalid(f"{CHUNK_SETTING} must be a number of bytes between {MIN_CHUNK_SIZE} and "
                      f"{limit}, got {raw!r}", hint=f"RESET {CHUNK_SETTING} for the default.")
    return n


def packed_table(cat: Catalog, name: str, what: str,
                 partitions: int | None = None) -> PackedTable:
    """A preprocessed table and its summary, or a clear error. A table packed by MADlib's
    own preprocessor has no partitions of ours: its buffers are spread as ``buffer_id % p``
    over ``partitions`` (a validation table: the training table's) or its summary's
    ``num_partitions`` (see :func:`preprocessing._madlib_summary`)."""
    try:
        t, s = read_training_summary(cat, name)
    except CerebroError as e:
        raise CerebroError(e.message.replace("training_preprocessor_table", what), e.sqlstate,
                           hint=f"{what} must be made by training_preprocessor_dl or "
                           "validation_preprocessor_dl.") from None
    refuse_temporary(cat, t, what)
    xcols, ycols = list(s["x_columns"]), list(s["y_columns"])
    x, y = xcols[0], ycols[0]
    sel = ", ".join(f"{quote_ident(c + '_shape')} AS s{i}" for i, c in enumerate(xcols + ycols))
    shape = cat.query(f"SELECT {sel} FROM {t.sql} LIMIT 1")
    if not shape:
        raise CerebroError(f'{what} "{t}" is empty', "22000")
    sizes = [int(np.prod(shape[0][f"s{i}"][1:])) for i in range(len(xcols + ycols))]
    multi = None if len(xcols) == len(ycols) == 1 else {
        "xs": xcols, "ys": ycols, "x_sizes": sizes[:len(xcols)],
        "y_widths": sizes[len(xcols):], "kinds": list(s["dependent_kind"])}
    shape = [{"xs": shape[0]["s0"], "ys": shape[0][f"s{len(xcols)}"]}]
    if s.get("madlib"):
        p = int(partitions or s["num_partitions"])
        s = {**s, "num_partitions": p}
        return PackedTable(t, _qualified(cat, t), s, x, y, int(np.prod(shape[0]["xs"][1:])),
                           int(np.prod(shape[0]["ys"][1:])), p, s["dependent_kind"][0], p,
                           multi)
    parts = cat.query(f"SELECT min(__dist_key__) AS lo, max(__dist_key__) AS m "
                      f"FROM {t.sql}")[0]
    p = int(s["num_partitions"])
    if parts["lo"] < 0 or parts["m"] > p - 1:  # a partition may hold no buffer
        raise CerebroError(f'{what} "{t}" does not hold the {p} partitions its summary '
                           "records", "22000", hint="Preprocess the data again.")
    return PackedTable(t, _qualified(cat, t), s, x, y, int(np.prod(shape[0]["xs"][1:])),
                       int(np.prod(shape[0]["ys"][1:])), p, s["dependent_kind"][0], None, multi)


@dataclass
class Config:
    mst_key: int
    model_id: int
    compile_params: str
    fit_params: str
    arch: str
    weights: bytes | None
    cp: params.CompileParams
    fp: params.FitParams


def _check_config(c: Config, src: PackedTable, checked: dict[str, Any]) -> None:
    """The architecture fits the packed data (input size, output width) and the loss fits
    the labels; checked once per architecture."""
    model = checked.get(c.arch)
    if model is None:
        model = keras_arch.build_from_json(c.arch, shared=True)
        checked[c.arch] = model
    ins, outs = keras_arch.input_shapes(model), keras_arch.output_shapes(model)
    _, _, x_sizes, y_widths, kinds = src.columns()
    if len(ins) != len(x_sizes) or len(outs) != len(y_widths):
        raise CerebroError(
            f"model_id {c.model_id} has {len(ins)} inputs and {len(outs)} outputs, but the "
            f"packed data has {len(x_sizes)} independent and {len(y_widths)} dependent "
            "variables", DATATYPE_MISMATCH,
            hint="List the variables in independent_varname / dependent_varname in the order "
            "of the model's inputs and outputs.")
    for i, (shape, size) in enumerate(zip(ins, x_sizes)):
        in_size = int(np.prod([d for d in shape if d is not None]))
        if None in shape or in_size != size:
            which = "" if len(ins) == 1 else f" {i + 1}"
            raise CerebroError(
                f"model_id {c.model_id} expects input{which} shape {list(shape)}, but the "
                f"packed data has {size} values per row", DATATYPE_MISMATCH,
                hint="The architecture's input must hold as many values as each packed row "
                "(a Reshape layer can adapt a flat row).")
    loss = c.cp.loss if isinstance(c.cp.loss, str) else None
    sparse = loss is not None and "sparse" in loss
    for shape, width, kind in zip(outs, y_widths, kinds):
        out = shape[-1] if shape else 1
        want = 1 if sparse else width
        if out is not None and out != want and not (sparse and kind != "regression"):
            raise CerebroError(
                f"model_id {c.model_id} has {out} outputs, but the labels have {width} "
                "columns", DATATYPE_MISMATCH,
                hint="The last layer's units must equal num_classes of the training data.")
        if sparse and kind == "regression":
            raise invalid(f"mst_key {c.mst_key}: loss {loss!r} needs class labels, but the "
                          "training data has a regression target")


def check_item(c: Config, what: str = "compile_params") -> dict[str, Any]:
    """One configuration as the worker-side checks (:func:`check_configs`) take it."""
    return {"mst_key": c.mst_key, "model_id": c.model_id, "compile_params": c.compile_params,
            "fit_params": c.fit_params, "arch": c.arch, "what": what}


def check_spec(src: PackedTable, items: list[dict[str, Any]], num_workers: int,
               validate_compile: bool = False,
               custom_functions: dict[str, str] | None = None) -> dict[str, Any]:
    """What the worker sessions check before a fit writes anything (see :func:`check_configs`);
    also their warm-up: the check imports TensorFlow with the fit's thread count.
    ``custom_functions``: the fit's ``{name: reference}`` (imported by the workers only)."""
    return {"configs": items, "x_size": src.x_size, "y_width": src.y_width, "kind": src.kind,
            "columns": list(src.columns()),
            "validate_compile": validate_compile, "custom_functions": custom_functions or {},
            "worker_threads": max(1, (os.cpu_count() or 1) // max(1, num_workers))}


def check_configs(spec: dict[str, Any], cat: Catalog | None = None) -> None:
    """The checks that need Keras, run in a worker session (which imports TensorFlow anyway)
    so that the coordinator never does: each architecture builds and fits the packed data
    (:func:`_check_config`), and with ``validate_compile`` the loss, metric and optimizer
    names are checked against Keras. Raises the same :class:`CerebroError` as the
    coordinator would."""
    from types import SimpleNamespace

    from .. import worker

    worker._runtime(int(spec.get("worker_threads") or 0) or None)
    cols = tuple(spec["columns"])
    src = SimpleNamespace(x_size=spec["x_size"], y_width=spec["y_width"], kind=spec["kind"],
                          columns=lambda: cols)
    refs = dict(spec.get("custom_functions") or {})
    if refs:  # this session checks the grants itself before importing anything
        from ..custom_functions import parse_reference, require_allowed

        allowed = cat.custom_function_modules() if cat is not None else []
        for name, ref in refs.items():
            require_allowed(parse_reference(ref), allowed, name)
    checked: dict[str, Any] = {}
    for item in spec.get("configs") or []:
        cp = params.parse_compile_params(item["compile_params"], item["what"])
        if refs:
            cp = cp.with_custom(refs)
        if spec.get("validate_compile"):
            params.validate_compile_params(cp, item["what"], custom_functions=refs)
        c = Config(item["mst_key"], item["model_id"], item["compile_params"], item["fit_params"],
                   item["arch"], None, cp, None)  # type: ignore[arg-type]
        _check_config(c, src, checked)  # type: ignore[arg-type]
    if not spec.get("configs"):
        from .. import training  # noqa: F401 - the warm-up: import TensorFlow now


def worker_checks(ex: DblinkExecutor, spec: dict[str, Any]) -> None:
    """Run :func:`check_configs` in every worker session at once (each imports TensorFlow in
    parallel: a cold fit's start-up), and raise the first error one of them reports."""
    for w in ex.idle():
        ex.submit_check(w, spec)
    answers: dict[int, dict[str, Any]] = {}
    while ex.busy:
        for r in ex.wait():
            answers[r.worker] = r.data
    for w in sorted(answers):
        d = answers[w]
        if d.get("lost"):
            raise CerebroError(f"worker session {w} failed while checking the fit: "
                               f"{d.get('message')}", "08006")
        if not d.get("ok"):
            raise CerebroError(d.get("message") or "the worker's checks failed",
                               d.get("sqlstate") or "XX000", detail=d.get("detail"),
                               hint=d.get("hint"))


def check_tensorboard(cat: Catalog, configs: Sequence[Config]) -> None:
    """A TensorBoard callback's log_dir lies inside the DBA's directory (checked again by
    every worker session before it writes)."""
    import importlib.util

    for c in configs:
        if c.fp.tensorboard:
            params.confine_log_dir(dict(c.fp.tensorboard)["log_dir"],
                                   cat.dba_setting(params.TENSORBOARD_SETTING),
                                   f"fit_params of mst_key {c.mst_key}")
            if importlib.util.find_spec("tensorboard") is None:
                raise CerebroError(
                    "the TensorBoard callback needs the tensorboard package, which the "
                    "database server's Python environment lacks", FEATURE_NOT_SUPPORTED,
                    hint="Install tensorboard (the version matching TensorFlow) into the "
                    "server's environment, or drop the callback from fit_params.")


def _load_configs(cat: Catalog, mst: TableName
                  ) -> tuple[list[Config], TableName, str | None]:
    oid = cat.require_table(mst, "model_selection_table")
    cols = cat.columns(oid)
    need = {"mst_key", "model_id", "compile_params", "fit_params"}
    if not need <= set(cols):
        raise invalid(f'model_selection_table "{mst}" lacks the columns '
                      f"{', '.join(sorted(need - set(cols)))}")
    summ = mst.with_suffix("_summary", "model_selection_table")
    if cat.relation_oid(summ) is None:
        raise CerebroError(f'model_selection_table "{mst}" has no summary table "{summ}"',
                           UNDEFINED_TABLE, hint="Create it with load_model_selection_table "
                           "or generate_model_configs.")
    srow = cat.select(summ, ["model_arch_table", "object_table"]
                      if "object_table" in cat.columns(cat.require_table(summ, "summary"))
                      else ["model_arch_table"])[0]
    arch_name = srow["model_arch_table"]
    arch = cat.table(arch_name, "model_arch_table")
    require_arch_table(cat, arch, "model_arch_table")
    rows = cat.query(f"SELECT m.mst_key, m.model_id, m.compile_params, m.fit_params, "
                     f"a.model_arch::text AS arch, a.model_weights AS w FROM {mst.sql} m "
                     f"LEFT JOIN {arch.sql} a ON a.model_id = m.model_id ORDER BY m.mst_key")
    if not rows:
        raise CerebroError(f'model_selection_table "{mst}" is empty', "22000")
    keys = [r["mst_key"] for r in rows]
    if None in keys:
        raise CerebroError(f'model_selection_table "{mst}" has a NULL mst_key',
                           NULL_VALUE_NOT_ALLOWED, hint="Give every configuration an mst_key.")
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise invalid(f'model_selection_table "{mst}" has mst_key {dup[0]} more than once',
                      hint="mst_key must be unique (make it the primary key).")
    out = []
    for r in rows:
        if r["arch"] is None:
            raise CerebroError(f"mst_key {r['mst_key']}: model_id {r['model_id']} does not "
                               f'exist in "{arch}"', "42704")
        cp = params.parse_compile_params(r["compile_params"],
                                         f"compile_params of mst_key {r['mst_key']}")
        fp = check_fit_bounds(params.parse_fit_params(
            r["fit_params"], f"fit_params of mst_key {r['mst_key']}"),
            f"fit_params of mst_key {r['mst_key']}")
        out.append(Config(r["mst_key"], r["model_id"], r["compile_params"], r["fit_params"],
                          r["arch"], r["w"], cp, fp))
    return out, arch, srow.get("object_table")


def _conninfo(cat: Catalog) -> str | None:
    """How worker sessions connect: a conninfo for ``dblink_connect``, or None for the
    extension's ``__worker_connect``.

    Worker sessions always run as the calling role (``current_user``), never a more
    privileged one. dblink lets a superuser connect without a password, so a superuser
    gets a conninfo to this server's socket and port as ``current_user``, plus
    ``cerebro_db.worker_conninfo``. dblink refuses other roles a connection that did not
    use a password; two ways remain for them, and neither adds a privilege:

    * ``cerebro_db.worker_conninfo`` holds a password: plain ``dblink_connect`` with it,
      and dblink itself checks that the password was used (a wrong ``user=`` there needs
      that role's password); the host is ``localhost`` (TCP) unless the role may read
      ``unix_socket_directories`` or the setting names another;
    * otherwise None: ``__worker_connect`` (SECURITY DEFINER, owned by the extension's
      owner) builds the whole connection string itself, logs in as ``session_user`` over
      this server's socket and does ``SET ROLE current_user`` there, after checking that
      the session user may SET ROLE to it; no caller text reaches the connection string,
      so a role cannot use it to connect as someone else.
    """
    su = cat.query("SELECT rolsuper AS su FROM pg_catalog.pg_roles "
                   "WHERE rolname = current_user")[0]["su"]
    extra = cat.setting(CONNINFO_SETTING)
    if not su and not (extra and "password" in extra.lower()):
        return None
    row = cat.query("SELECT current_database()::text AS d, current_user::text AS u, "
                    "current_setting('port') AS p, "
                    "CASE WHEN $1 OR pg_catalog.pg_has_role('pg_read_all_settings', 'USAGE') "
                    "THEN split_part(current_setting('unix_socket_directories'), ',', 1) END "
                    "AS s", [su], ["bool"])[0]

    def q(v: str) -> str:
        return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"

    host = (row["s"] or "").strip() or "localhost"
    info = f"dbname={q(row['d'])} user={q(row['u'])} port={q(row['p'])} host={q(host)}"
    return info + (" " + extra if extra else "")


@dataclass
class FitRequest:
    kind: str  # 'fit_multiple' or 'fit'
    source: PackedTable
    validation: PackedTable | None
    output: TableName
    configs: list[Config]
    num_iterations: int
    frequency: int | None
    policy: str
    policy_params: dict[str, Any]
    random_state: int
    num_workers: int
    use_caching: bool | None  # None: cache what fits the workers' cache_memory budget
    mst_table: TableName | None
    arch_table: TableName
    warm_start: bool = False
    name: str | None = None
    description: str | None = None
    replicas: int = 1
    checks: list[dict[str, Any]] | None = None
    validate_compile: bool = False
    object_table: str | None = None
    custom_functions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for what, t in (("source_table", self.source), ("validation_table", self.validation)):
            if t is not None and t.temporary:
                raise CerebroError(
                    f'{what} "{t.table}" is a temporary table, which the worker sessions '
                    "cannot read", FEATURE_NOT_SUPPORTED,
                    hint="Pack it into an ordinary table (outputs may be in pg_temp).")


def _bytea_literal(b: bytes | None) -> str:
    return "NULL" if b is None else "'\\x" + bytes(b).hex() + "'::bytea"


def _table_records(cat: Catalog, req: FitRequest) -> dict[str, Any]:
    """The fit's tables as this call resolved them (schema, name, the text the caller gave)
    and the oids of its data, so that a resume uses the same ones whatever its search_path."""
    def rec(t: TableName | None) -> list[str | None] | None:
        return None if t is None else [t.schema, t.name, t.given]

    return {"output": rec(req.output), "mst": rec(req.mst_table), "arch": rec(req.arch_table),
            "source_oid": cat.relation_oid(req.source.table),
            "validation_oid": cat.relation_oid(req.validation.table) if req.validation else None}


def stored_table(cat: Catalog, opts: dict[str, Any], key: str, text: str | None,
                 what: str) -> TableName | None:
    """A table of a fit as its original call resolved it, else (a fit recorded without it)
    ``text`` as this session's search_path finds it."""
    rec = (opts.get("tables") or {}).get(key)
    if rec:
        return TableName(rec[0], rec[1], rec[2])
    return cat.table(text, what) if text else None


def same_data(cat: Catalog, opts: dict[str, Any], fit_id: int, src: PackedTable,
              val: PackedTable | None) -> None:
    """A resumed fit's source and validation tables are the ones it was started on (same
    oid), not tables made again under the same names."""
    tables = opts.get("tables") or {}
    for key, t, what in (("source_oid", src, "source_table"),
                         ("validation_oid", val, "validation_table")):
        if t is None or tables.get(key) is None:
            continue
        if cat.relation_oid(t.table) != int(tables[key]):
            raise CerebroError(
                f'{what} "{t.table}" is not the table fit {fit_id} was started on (it was '
                "dropped and made again since)", OBJECT_NOT_IN_PREREQUISITE_STATE,
                hint="A resume continues on the fit's own data; start a new fit instead.")
    for t, key in ((src, "source_name"), (val, "validation_name")):
        if t is not None and opts.get(key):
            t.table = TableName(t.table.schema, t.table.name, opts[key])


def default_worker_limits() -> dict[str, int]:
    """Without a row in ``limits``: a fit may use as many workers as the server has cores
    (at least 4), a role twice that over all its running fits."""
    per_fit = max(4, os.cpu_count() or 1)
    return {"max_workers_per_fit": per_fit, "max_workers_per_role": 2 * per_fit}


def worker_limits(cat: Catalog) -> dict[str, int]:
    """The calling role's worker limits: its own row, else the row for every role, else
    the default."""
    out = default_worker_limits()
    rows = cat.query(f"SELECT setting, value FROM {cat.ext('limits')} WHERE role_name IS NULL "
                     "OR role_name = current_user ORDER BY role_name NULLS FIRST")
    for r in rows:
        out[r["setting"]] = int(r["value"])
    return out


def check_worker_limits(cat: Catalog, want: int, fit_id: int | None = None) -> None:
    """``want`` worker sessions for one fit (``fit_id``: a running fit asking for more)
    within the calling role's limits, counting the workers of its other running fits."""
    lim = worker_limits(cat)
    per_fit, per_role = lim["max_workers_per_fit"], lim["max_workers_per_role"]
    where = f"{cat.schema}.limits"
    if want > per_fit:
        raise invalid(f"the fit needs {want} worker sessions, more than this role's "
                      f"max_workers_per_fit ({per_fit})",
                      hint=f"Use fewer partitions (training_preprocessor_dl's num_partitions) "
                      f"or workers, or ask the DBA to raise max_workers_per_fit in {where}.")
    busy = int(cat.query(
        f"SELECT count(*) AS n FROM {cat.ext('fit_workers')} w JOIN {cat.ext('fits')} f "
        "USING (fit_id) WHERE w.status IN ('active', 'joining') AND f.status = 'running' "
        f"AND f.owner = current_user AND {LIVE_COORDINATOR} "
        "AND f.fit_id IS DISTINCT FROM $1", [fit_id], ["int8"])[0]["n"])
    if busy + want > per_role:
        raise invalid(f"the fit needs {want} worker sessions and this role's other running "
                      f"fits hold {busy}, more than its max_workers_per_role ({per_role})",
                      hint=f"Wait for a fit to end, or ask the DBA to raise "
                      f"max_workers_per_role in {where}.")


def _validation_columns(v: PackedTable | None) -> dict[str, Any]:
    """The validation table's own buffer columns (its summary's names, which need not be the
    training table's) and, for a MADlib-packed one, how its buffers map to partitions."""
    if v is None:
        return {}
    out: dict[str, Any] = {"valid_x": v.x, "valid_y": v.y,
                           "valid_partition_mod": v.partition_mod}
    if v.multi is not None:
        out.update(valid_xs=v.multi["xs"], valid_ys=v.multi["ys"])
    return out


def _register(cat: Catalog, ex: DblinkExecutor, req: FitRequest, total: int) -> int:
    opts = {"x": req.source.x, "y": req.source.y, **_validation_columns(req.validation),
            "partition_mod": req.source.partition_mod,
            **({"xs": req.source.multi["xs"], "ys": req.source.multi["ys"]}
               if req.source.multi is not None else {}),
            "use_caching": req.use_caching,
            "cache_memory": _cache_memory(cat, req.num_workers),
            "worker_threads": max(1, (os.cpu_count() or 1) // req.num_workers),
            "state_chunk_size": state_chunk_size(cat),
            "policy_params": req.policy_params, "num_workers": req.num_workers,
            "replicas": req.replicas,
            "frequency": req.frequency, "arch_table": str(req.arch_table),
            "warm_start": req.warm_start, "name": req.name, "description": req.description,
            "executor_tag": ex.tag, "source_name": str(req.source.table),
            "validation_name": str(req.validation.table) if req.validation else None,
            "tables": _table_records(cat, req),
            "object_table": req.object_table, "custom_functions": req.custom_functions}
    lit = cat.literal
    sql = (f"INSERT INTO {cat.ext('fits')} (kind, source_table, validation_table, "
           "model_output_table, model_selection_table, policy, num_partitions, num_iterations, "
           "metrics_compute_frequency, random_state, options, total_units, coordinator_pid) "
           f"VALUES ({lit(req.kind)}, {lit(req.source.qualified)}, "
           f"{lit(req.validation.qualified) if req.validation else 'NULL'}, "
           f"{lit(str(req.output))}, {lit(str(req.mst_table)) if req.mst_table else 'NULL'}, "
           f"{lit(req.policy)}, {req.source.partitions}, {req.num_iterations}, "
           f"{req.frequency or req.num_iterations}, {req.random_state}, "
           f"{lit(json.dumps(opts))}::jsonb, {total}, {_my_pid(cat)}) RETURNING fit_id")
    fit_id = int(ex.control_query(sql)[0][0])
    ex.fit_id = fit_id
    for c in req.configs:
        ex.control(f"INSERT INTO {cat.ext('fit_configs')} (fit_id, mst_key, model_id, "
                   "compile_params, fit_params, model_arch, init_weights) VALUES "
                   f"({fit_id}, {int(c.mst_key)}, {int(c.model_id)}, {lit(c.compile_params)}, "
                   f"{lit(c.fit_params)}, {lit(c.arch)}::json, {_bytea_literal(c.weights)})")
    return fit_id


class _UnitExecutor:
    """Adapts :class:`DblinkExecutor` to the coordinator: assignments to unit statements."""

    def __init__(self, cat: Catalog, ex: DblinkExecutor, fit_id: int) -> None:
        self.cat, self.ex, self.fit_id = cat, ex, fit_id

    def submit(self, a: Assignment, options: dict[str, Any]) -> None:
        kind = "train" if a.kind != EVAL else "eval"
        self.ex.submit_unit(a.worker, self.fit_id, a.config, a.epoch, a.partition, kind,
                            options, key=(a.config, kind))

    def wait(self, timeout: float | None = None) -> list[tuple[int, bool, dict[str, Any]]]:
        return [(r.worker, r.ok, r.data) for r in self.ex.wait(timeout)]

    def recover(self, worker: int) -> bool:
        return self.ex.reopen(worker)

    def unit_failed(self, unit: RunningUnit, attempt: int, data: dict[str, Any]) -> None:
        """Record the failed attempt (control session: committed at once)."""
        lit = self.cat.literal
        pid = data.get("worker_pid")
        self.ex.control(
            f"INSERT INTO {self.cat.ext('unit_failures')} (fit_id, mst_key, epoch, partition, "
            f"kind, worker, worker_pid, attempt, message) VALUES ({self.fit_id}, "
            f"{int(unit.config)}, {int(unit.epoch)}, {int(unit.partition)}, {lit(unit.kind)}, "
            f"{int(unit.worker)}, {int(pid) if pid else 'NULL'}, {int(attempt)}, "
            f"{lit(str(data.get('message') or '')[:2000])})")


class _WorkerPool:
    """Worker sessions joining and leaving a running fit, and the availability map in
    ``fit_workers`` (written by the control session, committed at once)."""

    poll_interval = POLL_WORKERS

    def __init__(self, cat: Catalog, ex: DblinkExecutor, fit_id: int, num_partitions: int,
                 replicas: int) -> None:
        self.cat, self.ex, self.fit_id = cat, ex, fit_id
        self.p, self.replicas = num_partitions, replicas
        self._seen: int | None = None
        self._last = 0.0

    def start(self, workers: dict[int, frozenset[int]]) -> None:
        """Record the starting workers (and forget an earlier run's request and workers: a
        resumed fit starts with its original number of workers)."""
        self.ex.control(f"UPDATE {self.cat.ext('fits')} SET requested_workers = NULL "
                        f"WHERE fit_id = {self.fit_id}")
        self.close()
        for w, parts in workers.items():
            self.record(w, parts, "active")

    def record(self, worker: int, parts: frozenset[int] | None, status: str) -> None:
        pid = self.ex.pids.get(worker)
        arr = "ARRAY[" + ",".join(str(int(q)) for q in sorted(parts or ())) + "]::integer[]"
        upd = f"partitions = {arr}, " if parts is not None else ""
        self.ex.control(
            f"INSERT INTO {self.cat.ext('fit_workers')} AS w (fit_id, worker, partitions, "
            f"status, pid) VALUES ({self.fit_id}, {int(worker)}, {arr}, "
            f"{self.cat.literal(status)}, {int(pid) if pid else 'NULL'}) ON CONFLICT "
            f"(fit_id, worker) DO UPDATE SET {upd}status = excluded.status, pid = "
            "coalesce(excluded.pid, w.pid), updated_at = clock_timestamp()")

    def requested(self) -> int | None:
        now = time.monotonic()
        if now - self._last < self.poll_interval:
            return None
        self._last = now
        rows = self.ex.control_query(f"SELECT requested_workers FROM {self.cat.ext('fits')} "
                                     f"WHERE fit_id = {self.fit_id}")
        want = int(rows[0][0]) if rows and rows[0][0] is not None else None
        if want is None or want == self._seen:
            return None
        self._seen = want
        return want

    def holds(self, worker: int) -> frozenset[int]:
        return replica_partitions(worker, self.p, self.replicas)

    def join(self, worker: int, partitions: frozenset[int]) -> bool:
        self.record(worker, partitions, "joining")
        if not self.ex.add(worker):
            self.record(worker, None, "lost")
            return False
        self.record(worker, None, "active")
        return True

    def leave(self, worker: int, status: str) -> None:
        self.ex.retire(worker)
        self.record(worker, None, status)

    def granted(self, worker: int, partitions: frozenset[int]) -> None:
        self.record(worker, partitions, "active")

    def close(self) -> None:
        """Mark the workers still in the fit closed (the fit's sessions end)."""
        self.ex.control(f"UPDATE {self.cat.ext('fit_workers')} SET status = 'closed', "
                        f"updated_at = clock_timestamp() WHERE fit_id = {self.fit_id} AND "
                        "status IN ('active', 'joining')")


def _replicas(cat: Catalog) -> int:
    raw = cat.setting(REPLICAS_SETTING)
    try:
        r = 1 if raw is None or raw == "" else int(raw)
    except ValueError:
        r = 0
    if r < 1:
        raise invalid(f"{REPLICAS_SETTING} must be a positive integer, got {raw!r}")
    return r


def _refused_reopen(cat: Catalog) -> set[int]:
    """Workers the test hook forbids to reconnect (superusers only)."""
    text = cat.setting(HOOK_SETTING)
    if not text or cat.setting("is_superuser") != "on":
        return set()
    try:
        spec = json.loads(text)
    except ValueError:
        return set()
    return {int(h["worker"]) for h in (spec if isinstance(spec, list) else [spec])
            if isinstance(h, dict) and h.get("point") == "recover"
            and isinstance(h.get("worker"), int)}


def idle_timeout(cat: Catalog) -> float:
    """``cerebro_db.worker_idle_timeout``: seconds a fit's idle worker sessions stay open for
    the calling session's next fit (default 300; 0: closed at the end of each fit)."""
    raw = cat.setting(IDLE_SETTING)
    try:
        t = DEFAULT_IDLE_TIMEOUT if raw is None else float(raw)
    except ValueError:
        t = -1.0
    if not 0 <= t < 2**31 / 1000:
        raise invalid(f"{IDLE_SETTING} must be a number of seconds (0: close the worker "
                      f"sessions after each fit), got {raw!r}")
    return t


@entrypoint
def cerebro_db_close_workers(cat: Catalog) -> int:
    """Close the worker sessions this session keeps open between fits; returns how many."""
    from ..executors import close_pool

    return close_pool(cat)


def _my_pid(cat: Catalog) -> int:
    return int(cat.query("SELECT pg_catalog.pg_backend_pid() AS p")[0]["p"])


def _fault_settings(cat: Catalog) -> tuple[int, float | StallRule | None, dict[str, str]]:
    """max_unit_retries, unit_timeout (seconds; a :class:`StallRule` when unset or 'auto';
    None: off) and the settings forwarded to workers."""
    raw = cat.setting(RETRIES_SETTING)
    try:
        retries = DEFAULT_MAX_UNIT_RETRIES if raw is None else int(raw)
    except ValueError:
        retries = -1
    if retries < 0:
        raise invalid(f"{RETRIES_SETTING} must be a non-negative integer, got {raw!r}")
    raw = cat.setting(TIMEOUT_SETTING)
    timeout: float | StallRule | None
    if raw is None or raw.strip().lower() == "auto":
        timeout = StallRule(_seconds(cat, TIMEOUT_FLOOR_SETTING, StallRule.floor),
                            _seconds(cat, TIMEOUT_FACTOR_SETTING, StallRule.factor),
                            _seconds(cat, TIMEOUT_FIRST_SETTING, StallRule.first))
    else:
        timeout = _seconds(cat, TIMEOUT_SETTING, 0.0, "(0: no timeout, 'auto': derived "
                           "from the measured unit times)") or None
    hook = cat.setting(HOOK_SETTING)
    return retries, timeout, ({HOOK_SETTING: hook} if hook else {})


def _seconds(cat: Catalog, setting: str, default: float, what: str = "") -> float:
    """A non-negative number setting (``default`` when unset), or a 22023 error."""
    raw = cat.setting(setting)
    if raw is None:
        return default
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not 0 <= v < float("inf"):
        raise invalid(f"{setting} must be a non-negative number{' ' + what if what else ''}, "
                      f"got {raw!r}")
    return v


LIVE_COORDINATOR = (
    "EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = f.coordinator_pid "
    "AND a.backend_start <= coalesce(f.resumed_at, f.started_at))")


def _mark_interrupted(cat: Catalog, ex: DblinkExecutor) -> None:
    """Fits of this role still 'running' whose coordinator session is gone (or whose
    calling transaction rolled back its outputs: no coordinator recorded, see
    :func:`mark_done`) become 'interrupted' (resumable with madlib_keras_fit_resume). Rows
    locked by a calling transaction still open are skipped, not waited for."""
    ex.control(f"UPDATE {cat.ext('fits')} f SET status = 'interrupted', ended_at = "
               "clock_timestamp(), message = CASE WHEN f.coordinator_pid IS NULL THEN "
               "'the transaction that called the fit did not commit its outputs; resume it "
               "with madlib_keras_fit_resume(' || f.fit_id || ')' ELSE "
               "pg_catalog.format('the coordinator session (pid %s) ended before the fit did; "
               "resume it with madlib_keras_fit_resume(%s)', f.coordinator_pid, f.fit_id) END "
               f"WHERE f.fit_id IN (SELECT f.fit_id FROM {cat.ext('fits')} f WHERE f.status = "
               f"'running' AND f.owner = current_user AND NOT {LIVE_COORDINATOR} "
               "FOR UPDATE SKIP LOCKED)")


@dataclass
class ResumePoint:
    """What a resumed fit takes from the catalog."""

    fit_id: int
    tag: str | None


def _claim(cat: Catalog, ex: DblinkExecutor, fit_id: int) -> None:
    """Make this session the fit's coordinator, if the fit is not done and no live
    coordinator has it (atomic: two resumes cannot both win)."""
    rows = ex.control_query(
        f"UPDATE {cat.ext('fits')} f SET status = 'running', coordinator_pid = {_my_pid(cat)}, "
        "message = NULL, ended_at = NULL, resumed_at = clock_timestamp(), resumes = "
        "resumes + 1, cancel_requested = NULL, options = options OPERATOR(pg_catalog.||) "
        "pg_catalog.jsonb_build_object("
        f"'executor_tag', {cat.literal(ex.tag)}::text) WHERE f.fit_id = {int(fit_id)} AND "
        f"(f.status IN ('interrupted', 'failed', 'cancelled') OR (f.status = 'running' AND "
        f"NOT {LIVE_COORDINATOR})) RETURNING f.fit_id")
    if not rows:
        raise CerebroError(f"fit {fit_id} is done or has a live coordinator session",
                           "55006", hint="Only an interrupted, cancelled or failed fit can be "
                           "resumed.")
    ex.fit_id = fit_id


def take_over(cat: Catalog, ex: DblinkExecutor, resume: ResumePoint) -> tuple[int, float]:
    """Claim an interrupted fit for this session, end its orphaned worker sessions; returns
    the fit_id and its original start (epoch seconds)."""
    _claim(cat, ex, resume.fit_id)
    if resume.tag:
        end_sessions(cat, f"cerebro_db {resume.tag} worker ")
    t0 = float(cat.query(f"SELECT extract(epoch FROM started_at)::float8 AS t FROM "
                         f"{cat.ext('fits')} WHERE fit_id = $1", [resume.fit_id],
                         ["int8"])[0]["t"])
    return resume.fit_id, t0


def mark_failed(cat: Catalog, ex: DblinkExecutor, fit_id: int, e: BaseException) -> None:
    """Record a fit's failure (its message), if this session still coordinates it: status
    'cancelled' for a cancel (``pg_cancel_backend``, ``statement_timeout``,
    ``cerebro_db_cancel_fit``: SQLSTATE 57014), else 'failed'; both are resumable."""
    try:
        msg = getattr(e, "message", None) or str(e)
        status = "cancelled" if is_cancel(e) else "failed"
        if status == "cancelled":
            msg = (f"{msg.strip()}; the units committed so far are kept: resume it with "
                   f"madlib_keras_fit_resume({fit_id})")
        ex.control(f"UPDATE {cat.ext('fits')} SET status = {cat.literal(status)}, message = "
                   f"{cat.literal(msg[:2000])}, ended_at = clock_timestamp() "
                   f"WHERE fit_id = {fit_id} AND coordinator_pid = {_my_pid(cat)}")
    except Exception:  # noqa: BLE001, S110 - the original error matters more
        pass


def mark_done(cat: Catalog, ex: DblinkExecutor, fit_id: int) -> None:
    """Mark the fit done in the caller's transaction, after its outputs were written there:
    the catalog then agrees with the caller's COMMIT or ROLLBACK.

    The control session first records that no coordinator runs the fit any more (committed
    at once); the caller's transaction then sets 'done'. If that transaction rolls back, the
    fit is 'running' with no coordinator, i.e. interrupted (``fit_progress`` shows it so),
    and a resume (which only writes the outputs again: every unit is in the log) waits for
    the caller's transaction to end, then finds it done or resumable. A resume that took the
    fit over in between makes this call fail (the caller's outputs roll back)."""
    ex.control(f"UPDATE {cat.ext('fits')} SET coordinator_pid = NULL WHERE fit_id = "
               f"{int(fit_id)} AND coordinator_pid = {_my_pid(cat)}")
    rows = cat.query(f"UPDATE {cat.ext('fits')} SET status = 'done', message = NULL, "
                     "ended_at = clock_timestamp() WHERE fit_id = $1 AND status = 'running' "
                     "AND coordinator_pid IS NULL RETURNING fit_id", [fit_id], ["int8"])
    if not rows:
        raise CerebroError(f"fit {fit_id} was taken over by another session before its "
                           "outputs were written", "55006")


def _from_log(cat: Catalog, fit_id: int, targets: dict[int, int], p: int,
              workers: dict[int, set[int]], eval_epochs: frozenset[int]
              ) -> tuple[Progress, dict[int, ConfigResult], int, float]:
    """Progress, per-config results, training units done and seconds spent, from the units
    committed so far (in commit order; units in flight when the fit stopped are absent)."""
    rows = cat.query(
        f"SELECT u.mst_key, u.epoch, u.partition, u.worker, u.kind, u.loss, u.rows, "
        f"u.metrics, extract(epoch FROM u.ended_at - f.started_at)::float8 AS at "
        f"FROM {cat.ext('units')} u JOIN {cat.ext('fits')} f USING (fit_id) "
        "WHERE u.fit_id = $1 ORDER BY u.unit_id", [fit_id], ["int8"])
    records, results = [], {c: ConfigResult() for c in targets}
    done, spent = 0, 0.0
    for i, r in enumerate(rows):
        spent = max(spent, float(r["at"]))
        res = results[r["mst_key"]]
        metrics = {str(k): v for k, v in enumerate(r["metrics"] or [])}
        if r["kind"] == TRAIN:
            done += 1
            res.train_loss.setdefault(r["epoch"], []).append((r["loss"], r["rows"]))
        else:
            res.evals.setdefault((r["epoch"], r["kind"]), []).append(
                {"loss": r["loss"], "rows": r["rows"], "metrics": metrics})
            if r["kind"] == "eval_train" and len(res.evals[(r["epoch"], r["kind"])]) == p:
                res.eval_done_at[r["epoch"]] = float(r["at"])
        if r["kind"] != "eval_valid":
            records.append({"config": r["mst_key"], "epoch": r["epoch"],
                            "partition": r["partition"], "worker": r["worker"],
                            "kind": TRAIN if r["kind"] == TRAIN else EVAL,
                            "start": float(i), "end": float(i), "ok": True})
    progress = Progress.from_log(records, targets, p, workers, eval_epochs)
    return progress, results, done, spent


def execute_fit(cat: Catalog, req: FitRequest,
                finish: Callable[[int, FitOutcome, float], None],
                resume: ResumePoint | None = None) -> tuple[int, FitOutcome]:
    """Register the fit (or, with ``resume``, take over an interrupted one and continue from
    its unit log), run it on worker sessions, then ``finish(fit_id, outcome, start)`` (which
    writes the outputs in the caller's transaction); the fit is marked done only after
    that, and failed (with the message) on any error."""
    eval_epochs = evaluation_epochs(req.num_iterations, req.frequency)
    p = req.source.partitions
    targets = {c.mst_key: req.num_iterations for c in req.configs}
    workers = initial_workers(req.num_workers, p, min(req.replicas, p))
    seeded = {"random_state": req.random_state} \
        if "random_state" in policy_class(req.policy).option_names else {}
    policy = get_policy(req.policy, **seeded, **req.policy_params)
    total = len(req.configs) * req.num_iterations * p
    if total > MAX_UNITS:
        raise invalid(f"the fit has {total} training units ({len(req.configs)} configurations "
                      f"x {req.num_iterations} iterations x {p} partitions), more than "
                      f"{MAX_UNITS}", hint="Use fewer iterations or configurations.")
    retries, timeout, forward = _fault_settings(cat)
    state_chunk_size(cat)
    check_worker_limits(cat, len(workers), resume.fit_id if resume else None)
    tag = f"{os.getpid()}_{int(time.time() * 1000) % 10**9}"
    remote = executor_url(cat)
    ex = RemoteExecutor(cat, tag, len(workers), _conninfo(cat), remote,
                        unit_timeout=timeout) if remote \
        else DblinkExecutor(cat, tag, len(workers), _conninfo(cat), unit_timeout=timeout)
    ex.refuse_reopen = _refused_reopen(cat)
    ex.keep_idle = idle_timeout(cat)
    t0 = time.time()
    fit_id = None
    ended = False
    try:
        ex.open(forward)
        refuse_uncommitted(cat, ex, [req.source, req.validation])
        worker_checks(ex, check_spec(req.source, req.checks or [], len(workers),
                                     req.validate_compile, req.custom_functions))
        _mark_interrupted(cat, ex)
        results, done, spent = None, 0, 0.0
        if resume is None:
            progress = Progress(targets, p, workers, eval_epochs)
            fit_id = _register(cat, ex, req, total)
        else:
            fit_id, t0 = take_over(cat, ex, resume)
            progress, results, done, spent = _from_log(cat, fit_id, targets, p, workers,
                                                       eval_epochs)
        pool = _WorkerPool(cat, ex, fit_id, p, req.replicas)
        pool.start(workers)
        what = "resumes" if resume else "starts"
        cat.notice(f"fit {fit_id} {what}: {len(req.configs)} configurations x "
                   f"{req.num_iterations} iterations on {p} partitions, {len(workers)} worker "
                   f"sessions{f' ({req.replicas} replicas)' if req.replicas > 1 else ''}, "
                   f"policy {req.policy}"
                   + (f", {done}/{total} training units already done" if resume else "")
                   + f"; watch: SELECT * FROM {cat.schema}.fit_progress WHERE fit_id = {fit_id}")
        eval_kinds = ["eval_train"] + (["eval_valid"] if req.validation else [])
        outcome = run_fit(policy, progress, _UnitExecutor(cat, ex, fit_id), eval_kinds=eval_kinds,
                          num_partitions=p, snapshot_epochs=lambda c, e: e in eval_epochs,
                          notice=cat.notice, max_unit_retries=retries, results=results,
                          done_units=done, elapsed_before=spent, pool=pool)
        pool.close()
        finish(fit_id, outcome, t0)
        mark_done(cat, ex, fit_id)
        ex.control(f"DELETE FROM {cat.ext('model_states')} WHERE fit_id = {fit_id} AND "
                   "version <> 'current'")
        ended = True
        return fit_id, outcome
    except BaseException as e:
        if fit_id is not None:
            mark_failed(cat, ex, fit_id, e)
        raise
    finally:
        ex.close(keep=ended)


def final_weights(cat: Catalog, fit_id: int, mst_key: int) -> bytes:
    from ..worker import load_state

    data = load_state(cat, fit_id, mst_key, "current")
    if data is None:
        raise CerebroError(f"no final state for mst_key {mst_key}", "XX000")
    st = state_mod.decode_state(data)
    return b"".join(np.asarray(w, dtype="<f4").tobytes() for w in st.weights)


def _series(r: ConfigResult, epochs: list[int], kind: str) -> tuple[list[float], list[list[float]]]:
    losses, metrics = [], []
    for e in epochs:
        parts = r.evals.get((e, kind))
        if not parts:
            losses.append(float("nan"))
            metrics.append([])
            continue
        loss, m = combine(parts)
        losses.append(loss)
        metrics.append(m)
    return losses, metrics


def _first(ms: list[list[float]]) -> list[float | None]:
    return [m[0] if m else None for m in ms]


INFO_COLUMNS = [
    ("mst_key", "integer PRIMARY KEY"), ("model_id", "integer"), ("compile_params", "text"),
    ("fit_params", "text"), ("model_type", "text"), ("model_size", "double precision"),
    ("metrics_elapsed_time", "double precision[]"), ("metrics_type", "text[]"),
    ("loss_type", "text"), ("training_metrics_final", "double precision"),
    ("training_loss_final", "double precision"), ("training_metrics", "double precision[]"),
    ("training_loss", "double precision[]"), ("validation_metrics_final", "double precision"),
    ("validation_loss_final", "double precision"), ("validation_metrics", "double precision[]"),
    ("validation_loss", "double precision[]"), ("metrics_iters", "integer[]"),
    ("training_metrics_all", "double precision[]"), ("validation_metrics_all",
                                                    "double precision[]"),
    ("fit_id", "bigint"),
]
INFO_TYPES = ["int4", "int4", "text", "text", "text", "float8", "float8[]", "text[]", "text",
              "float8", "float8", "float8[]", "float8[]", "float8", "float8", "float8[]",
              "float8[]", "int4[]", "float8[]", "float8[]", "int8"]


def info_rows(req: FitRequest, fit_id: int, outcome: FitOutcome,
              sizes: dict[int, int]) -> list[list[Any]]:
    epochs = sorted(evaluation_epochs(req.num_iterations, req.frequency))
    rows = []
    for c in req.configs:
        r = outcome.results[c.mst_key]
        tl, tm = _series(r, epochs, "eval_train")
        vl, vm = _series(r, epochs, "eval_valid") if req.validation else ([], [])
        loss = c.cp.loss if isinstance(c.cp.loss, str) else json.dumps(c.cp.loss)
        elapsed = [r.eval_done_at.get(e) for e in epochs]
        has = bool(c.cp.metrics)  # without metrics MADlib writes NULL, not '{}' / '{NULL}'
        rows.append([
            c.mst_key, c.model_id, c.compile_params, c.fit_params, "madlib_keras",
            sizes[c.mst_key] / 1024.0, elapsed, c.cp.metric_names() if has else None, loss,
            tm[-1][0] if tm and tm[-1] else None, tl[-1] if tl else None,
            _first(tm) if has else None, tl,
            (vm[-1][0] if vm and vm[-1] else None) if req.validation else None,
            vl[-1] if vl else None, _first(vm) if req.validation and has else None,
            vl if req.validation else None, epochs,
            tm if all(tm) and tm and tm[0] else None,
            vm if req.validation and vm and all(vm) and vm[0] else None, fit_id,
        ])
    return rows


def summary_select(req: FitRequest) -> str:
    """A SELECT list over the source summary (alias s) for the output's _summary table."""
    cv = ", s.".join(quote_ident(d + "_class_values")
                     for d in req.source.summary["dependent_varname"])
    sel = (
        "$1::text AS source_table, $2::text AS validation_table, $3::text AS model, "
        "$4::text AS model_info, s.dependent_varname, s.independent_varname, "
        "$5::text AS model_arch_table, $6::text AS model_selection_table, "
        "$17::text AS object_table, $7::int AS num_iterations, "
        "$8::int AS metrics_compute_frequency, $9::boolean AS warm_start, $10::text AS name, "
        "$11::text AS description, to_timestamp($12)::timestamp AS start_training_time, "
        "clock_timestamp()::timestamp AS end_training_time, $13::text AS madlib_version, "
        f"s.num_classes, s.{cv}, s.dependent_vartype, s.normalizing_const, "
        "$14::int[] AS metrics_iters, $15::bigint AS fit_id, $16::text AS scheduling_policy, "
        "s.num_partitions"
    )
    return sel


def create_summary(cat: Catalog, req: FitRequest, summ: TableName, info: TableName | None,
                   fit_id: int, t0: float, warm: bool, name: str | None,
                   description: str | None) -> None:
    """The output's ``_summary`` table: this fit's facts plus the source summary's."""
    epochs = sorted(evaluation_epochs(req.num_iterations, req.frequency))
    src_summary = summary_source_sql(cat, req.source.table, req.source.summary)
    cat.query(
        f"CREATE TABLE {summ.sql} AS SELECT {summary_select(req)} FROM {src_summary} s",
        [str(req.source.table), str(req.validation.table) if req.validation else None,
         str(req.output), str(info) if info else None, str(req.arch_table),
         str(req.mst_table) if req.mst_table else None, req.num_iterations, req.frequency,
         warm, name, description, t0, __version__, epochs, fit_id, req.policy,
         req.object_table],
        ["text", "text", "text", "text", "text", "text", "int4", "int4", "bool", "text", "text",
         "float8", "text", "int4[]", "int8", "text", "text"])


def write_outputs(cat: Catalog, req: FitRequest, fit_id: int, outcome: FitOutcome, t0: float,
                  warm_start: bool, name: str | None, description: str | None) -> None:
    sizes: dict[int, int] = {}
    weights: dict[int, bytes] = {}
    for c in req.configs:
        weights[c.mst_key] = final_weights(cat, fit_id, c.mst_key)
        sizes[c.mst_key] = len(weights[c.mst_key])
    out = req.output
    info = out.with_suffix("_info", "model_output_table")
    summ = out.with_suffix("_summary", "model_output_table")
    cat.create_table(out, [("mst_key", "integer PRIMARY KEY"), ("model_weights", "bytea"),
                           ("model_arch", "json")], external_storage=["model_weights"])
    cat.insert(out, ["mst_key", "model_weights", "model_arch"], ["int4", "bytea", "json"],
               ([c.mst_key, weights[c.mst_key], c.arch] for c in req.configs))
    cat.create_table(info, INFO_COLUMNS)
    cat.insert(info, [n for n, _ in INFO_COLUMNS], INFO_TYPES,
               info_rows(req, fit_id, outcome, sizes))
    create_summary(cat, req, summ, info, fit_id, t0, warm_start, name, description)


def _cache_memory(cat: Catalog, num_workers: int) -> int:
    """Each worker's budget of cached partitions for ``use_caching`` NULL (bytes): the
    setting ``cerebro_db.cache_memory``, else the default of :func:`worker.cache_memory`."""
    from ..worker import CACHE_SETTING, cache_memory

    return cache_memory(cat.setting(CACHE_SETTING), num_workers)


def _bool(v: bool | None, default: bool) -> bool:
    return default if v is None else bool(v)


def _check_common(num_iterations: int | None, metrics_compute_frequency: int | None,
                  use_gpus: bool | None) -> None:
    if num_iterations is None:
        raise CerebroError("num_iterations must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if not 1 <= num_iterations <= MAX_ITERATIONS:
        raise invalid(f"num_iterations must be between 1 and {MAX_ITERATIONS}, got "
                      f"{num_iterations}")
    if metrics_compute_frequency is not None and not (
            1 <= metrics_compute_frequency <= num_iterations):
        raise invalid(f"metrics_compute_frequency must be between 1 and num_iterations "
                      f"({num_iterations}), got {metrics_compute_frequency}")
    if use_gpus and not os.path.exists("/dev/nvidiactl"):
        raise CerebroError("use_gpus is TRUE but this server has no GPU", FEATURE_NOT_SUPPORTED,
                           hint="Call with use_gpus => FALSE.")


def _outputs_absent(cat: Catalog, out: TableName, suffixes: Sequence[str], warm: bool) -> None:
    require_output_schema(cat, out, "model_output_table" if "_info" in suffixes else "model")
    for s in suffixes:
        t = out.with_suffix(s, "model_output_table") if s else out
        if cat.relation_oid(t) is not None and not warm:
            raise CerebroError(f'output table "{t}" already exists', DUPLICATE_TABLE,
                               hint="Drop it, choose another name, or pass warm_start => TRUE "
                               "to continue from its weights.")


def _warm_weights(cat: Catalog, out: TableName, configs: list[Config], key: str) -> None:
    """warm_start: take each config's weights from the existing output table, then drop the
    old outputs (in this transaction: a failure keeps them)."""
    oid = cat.relation_oid(out)
    if oid is None:
        raise CerebroError(f'warm_start needs the output table "{out}", which does not exist',
                           UNDEFINED_TABLE, hint="Run once without warm_start first.")
    cols = cat.columns(oid)
    if "model_weights" not in cols:
        raise invalid(f'"{out}" has no model_weights column')
    if key in cols:
        rows = cat.query(f"SELECT {quote_ident(key)} AS k, model_weights AS w FROM {out.sql}")
        have = {r["k"]: r["w"] for r in rows}
    else:
        rows = cat.query(f"SELECT model_weights AS w FROM {out.sql}")
        have = {configs[0].mst_key: rows[0]["w"]} if rows else {}
    for c in configs:
        if have.get(c.mst_key) is not None:
            c.weights = bytes(have[c.mst_key])
            try:
                keras_arch.check_weights(keras_arch.build_from_json(c.arch, shared=True),
                                         c.weights)
            except CerebroError as e:
                raise invalid(f'warm_start: the weights of mst_key {c.mst_key} in "{out}" do '
                              f"not fit its architecture: {e.message}",
                              hint="Warm start from the output of a fit of the same "
                              "configurations, or run without warm_start.") from None
    for s in ("", "_summary", "_info"):
        t = out.with_suffix(s, "model_output_table") if s else out  # (no _info after fit)
        if cat.relation_oid(t) is not None:
            cat.drop_table(t)


def _policy(scheduling_policy: str | None, policy_params: str | None,
            random_state: int | None) -> tuple[str, dict[str, Any]]:
    """The policy name and options. For MOP the defaults are ``prefer_lagging`` and
    ``cost_aware`` (a shorter tail), ``seeded_order`` with ``rotated_order`` (each config's
    visit order depends on the fit's seed only, so two runs with the same ``random_state``
    give the same models, and the orders are spread evenly over the workers; without
    ``random_state`` the seed is drawn and recorded in ``fits.random_state``)."""
    name = (scheduling_policy or "mop").strip().lower()
    opts = params.parse_keyword_string(policy_params, "policy_params")
    if "random_state" in opts:
        raise invalid("policy_params cannot set random_state; use the random_state argument")
    if name in ("mop", "random"):
        opts.setdefault("prefer_lagging", True)
        opts.setdefault("seeded_order", True)
        opts.setdefault("cost_aware", True)
        opts.setdefault("rotated_order", True)
    get_policy(name, **opts)  # validates the name and options before any work
    return name, opts


def _validation(cat: Catalog, validation_table: str | None, src: PackedTable
                ) -> PackedTable | None:
    if validation_table is None:
        return None
    v = packed_table(cat, validation_table, "validation_table", src.partitions)
    if v.partitions != src.partitions:
        raise invalid(f'validation_table "{v.table}" has {v.partitions} partitions, the '
                      f"training data {src.partitions}",
                      hint="Preprocess the validation data with validation_preprocessor_dl "
                      "from this training table.")
    if v.columns()[2:4] != src.columns()[2:4]:
        _, _, vx, vy, _ = v.columns()
        _, _, sx, sy, _ = src.columns()
        def shown(a: list[int]) -> str:
            return str(a[0]) if len(a) == 1 else str(a)

        raise CerebroError(f'validation_table "{v.table}" rows have {shown(vx)} features and '
                           f"{shown(vy)} label columns, the training data {shown(sx)} and "
                           f"{shown(sy)}", DATATYPE_MISMATCH)
    return v


@entrypoint
def madlib_keras_fit_multiple_model(
        cat: Catalog, *, source_table: str, model_output_table: str, model_selection_table: str,
        num_iterations: int, use_gpus: bool | None = False, validation_table: str | None = None,
        metrics_compute_frequency: int | None = None, warm_start: bool | None = False,
        name: str | None = None, description: str | None = None,
        use_caching: bool | None = None, scheduling_policy: str | None = "mop",
        policy_params: str | None = None, random_state: int | None = None) -> None:
    """Train every configuration of the model selection table by model hopper parallelism."""
    _check_common(num_iterations, metrics_compute_frequency, use_gpus)
    _cache_memory(cat, 1)
    out = cat.table(model_output_table, "model_output_table")
    mst = cat.table(model_selection_table, "model_selection_table")
    warm = _bool(warm_start, False)
    pname, popts = _policy(scheduling_policy, policy_params, random_state)
    seed = resolve_seed(random_state)
    src = packed_table(cat, source_table, "source_table")
    val = _validation(cat, validation_table, src)
    _outputs_absent(cat, out, ("", "_summary", "_info"), warm)
    configs, arch, object_table = _load_configs(cat, mst)
    obj, refs = custom_references(cat, object_table, [c.cp for c in configs], resolve=False)
    check_tensorboard(cat, configs)
    if warm:
        _warm_weights(cat, out, configs, "mst_key")
    req = FitRequest("fit_multiple", src, val, out, configs, num_iterations,
                     metrics_compute_frequency, pname, popts, seed, src.partitions,
                     use_caching, mst, arch, warm, name, description,
                     _replicas(cat),
                     [check_item(c, f"compile_params of mst_key {c.mst_key}") for c in configs],
                     object_table=str(obj) if obj else None, custom_functions=refs)
    fit_id, outcome = execute_fit(
        cat, req, lambda f, o, t0: write_outputs(cat, req, f, o, t0, warm, name, description))
    cat.notice(f"madlib_keras_fit_multiple_model: fit {fit_id} trained {len(configs)} "
               f"configurations in {outcome.seconds:.1f} s; results in {out} and "
               f"{out.with_suffix('_info', 'model_output_table')}")


def _write_fit_outputs(cat: Catalog, req: FitRequest, fit_id: int, outcome: FitOutcome,
                       t0: float, warm: bool, name: str | None, description: str | None) -> None:
    """madlib_keras_fit's outputs: <model> (weights, arch) and <model>_summary with the
    summary columns plus the configuration and its metrics."""
    c = req.configs[0]
    w = final_weights(cat, fit_id, c.mst_key)
    out = req.output
    summ = out.with_suffix("_summary", "model")
    cat.create_table(out, [("model_weights", "bytea"), ("model_arch", "json")],
                     external_storage=["model_weights"])
    cat.insert(out, ["model_weights", "model_arch"], ["bytea", "json"], [[w, c.arch]])
    create_summary(cat, req, summ, None, fit_id, t0, warm, name, description)
    info = info_rows(req, fit_id, outcome, {c.mst_key: len(w)})[0]
    extra = INFO_COLUMNS[1:17]  # model_id .. validation_loss
    for col, typ in extra:
        cat.db.execute(f"ALTER TABLE {summ.sql} ADD COLUMN {quote_ident(col)} "
                       f"{typ.replace(' PRIMARY KEY', '')}")
    sets = ", ".join(f"{quote_ident(col)} = ${i + 1}" for i, (col, _) in enumerate(extra))
    cat.query(f"UPDATE {summ.sql} SET {sets}", info[1:17], INFO_TYPES[1:17])


@entrypoint
def madlib_keras_fit(
        cat: Catalog, *, source_table: str, model: str, model_arch_table: str, model_id: int,
        compile_params: str, fit_params: str, num_iterations: int,
        use_gpus: bool | None = False, validation_table: str | None = None,
        metrics_compute_frequency: int | None = None, warm_start: bool | None = None,
        name: str | None = None, description: str | None = None,
        object_table: str | None = None, random_state: int | None = None) -> None:
    """Train one configuration: sequential SGD over the partitions, one worker session that
    holds them all (MADlib averages models across segments instead)."""
    _check_common(num_iterations, metrics_compute_frequency, use_gpus)
    _cache_memory(cat, 1)
    out = cat.table(model, "model")
    arch_t = cat.table(model_arch_table, "model_arch_table")
    if model_id is None:
        raise CerebroError("model_id must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if compile_params is None:
        raise CerebroError("compile_params must not be NULL", NULL_VALUE_NOT_ALLOWED)
    fit_params = fit_params or ""  # NULL: Keras' defaults, as in MADlib
    cp = params.parse_compile_params(compile_params)
    # the names are checked against Keras by the worker (validate_compile): the coordinator
    # never imports TensorFlow, nor the custom functions' modules
    obj, refs = custom_references(cat, object_table, [cp], resolve=False)
    fp = check_fit_bounds(params.parse_fit_params(fit_params))
    warm = _bool(warm_start, False)
    seed = resolve_seed(random_state)
    pname, popts = _policy("mop", None, random_state)
    src = packed_table(cat, source_table, "source_table")
    val = _validation(cat, validation_table, src)
    _outputs_absent(cat, out, ("", "_summary"), warm)
    require_arch_table(cat, arch_t, "model_arch_table")
    rows = cat.query(f"SELECT model_arch::text AS a, model_weights AS w FROM {arch_t.sql} "
                     "WHERE model_id = $1", [model_id], ["int4"])
    if not rows:
        raise CerebroError(f'model_id {model_id} does not exist in "{arch_t}"', "42704")
    cfg = Config(1, model_id, compile_params, fit_params, rows[0]["a"],
                 bytes(rows[0]["w"]) if rows[0]["w"] is not None else None, cp, fp)
    check_tensorboard(cat, [cfg])
    if warm:
        _warm_weights(cat, out, [cfg], "mst_key")
    req = FitRequest("fit", src, val, out, [cfg], num_iterations, metrics_compute_frequency,
                     pname, popts, seed, 1, None, None, arch_t, warm, name, description,
                     _replicas(cat), [check_item(cfg)], validate_compile=True,
                     object_table=str(obj) if obj else None, custom_functions=refs)
    fit_id, outcome = execute_fit(
        cat, req, lambda f, o, t0: _write_fit_outputs(cat, req, f, o, t0, warm, name,
                                                      description))
    cat.notice(f"madlib_keras_fit: fit {fit_id} trained model_id {model_id} in "
               f"{outcome.seconds:.1f} s; weights in {out}")


def stored_configs(cat: Catalog, fit_id: int) -> list[Config]:
    """A fit's configurations as its catalog rows hold them, by mst_key."""
    configs = []
    for r in cat.query(f"SELECT mst_key, model_id, compile_params, fit_params, "
                       f"model_arch::text AS arch, init_weights FROM {cat.ext('fit_configs')} "
                       "WHERE fit_id = $1 ORDER BY mst_key", [fit_id], ["int8"]):
        w = bytes(r["init_weights"]) if r["init_weights"] is not None else None
        configs.append(Config(r["mst_key"], r["model_id"], r["compile_params"], r["fit_params"],
                              r["arch"], w, params.parse_compile_params(r["compile_params"]),
                              params.parse_fit_params(r["fit_params"])))
    return configs


@entrypoint
def madlib_keras_fit_resume(cat: Catalog, *, fit_id: int) -> None:
    """Continue an interrupted (or failed) fit from the catalog: the units it committed are
    kept, each configuration continues from its last committed state, and the outputs are
    written as the original call would have. With a fixed random_state the result equals an
    uninterrupted run (the visit orders and unit seeds depend on the seed only)."""
    if fit_id is None:
        raise CerebroError("fit_id must not be NULL", NULL_VALUE_NOT_ALLOWED)
    cat.query("SELECT pg_catalog.pg_stat_clear_snapshot()")
    rows = cat.query(f"SELECT f.*, {LIVE_COORDINATOR} AS live FROM {cat.ext('fits')} f "
                     "WHERE f.fit_id = $1", [fit_id], ["int8"])
    if not rows:
        raise CerebroError(f"fit {fit_id} does not exist", "42704",
                           hint=f"SELECT fit_id, status FROM {cat.schema}.fits lists your fits.")
    f = rows[0]
    if f["status"] == "done":
        raise CerebroError(f"fit {fit_id} is already done", OBJECT_NOT_IN_PREREQUISITE_STATE)
    if f["status"] == "running" and f["live"]:
        raise CerebroError(f"fit {fit_id} is still running (coordinator pid "
                           f"{f['coordinator_pid']})", "55006",
                           hint="Only an interrupted or failed fit can be resumed.")
    opts = f["options"] if isinstance(f["options"], dict) else json.loads(f["options"])
    if "executor_tag" not in opts:
        raise CerebroError(f"fit {fit_id} was made by an older version and cannot be resumed",
                           FEATURE_NOT_SUPPORTED)
    src = packed_table(cat, f["source_table"], "source_table")
    vname = f["validation_table"]
    val = _validation(cat, vname, src) if vname else None
    same_data(cat, opts, fit_id, src, val)
    if src.partitions != f["num_partitions"]:
        raise CerebroError(f'source_table "{src.table}" now has {src.partitions} partitions, '
                           f"fit {fit_id} was started on {f['num_partitions']}",
                           OBJECT_NOT_IN_PREREQUISITE_STATE)
    out = stored_table(cat, opts, "output", f["model_output_table"], "model_output_table")
    if f["kind"] == "automl":
        from .automl import resume_automl

        resume_automl(cat, f, opts, src, val, out)
        return
    warm = bool(opts.get("warm_start"))
    suffixes = ("", "_summary", "_info") if f["kind"] == "fit_multiple" else ("", "_summary")
    if warm:  # the interrupted call had not replaced them yet
        for sfx in suffixes:
            t = out.with_suffix(sfx, "model_output_table") if sfx else out
            if cat.relation_oid(t) is not None:
                cat.drop_table(t)
    else:
        _outputs_absent(cat, out, suffixes, False)
    configs = stored_configs(cat, fit_id)
    mst = stored_table(cat, opts, "mst", f["model_selection_table"], "model_selection_table")
    req = FitRequest(f["kind"], src, val, out, configs, f["num_iterations"],
                     opts.get("frequency"), f["policy"], dict(opts.get("policy_params") or {}),
                     int(f["random_state"]), int(opts["num_workers"]),
                     opts.get("use_caching"), mst,
                     stored_table(cat, opts, "arch", opts["arch_table"], "model_arch_table"),
                     warm,
                     opts.get("name"), opts.get("description"),
                     int(opts.get("replicas") or 1), object_table=opts.get("object_table"),
                     custom_functions=dict(opts.get("custom_functions") or {}))
    if req.kind == "fit":
        def finish(fid: int, o: FitOutcome, t0: float) -> None:
            _write_fit_outputs(cat, req, fid, o, t0, warm, req.name, req.description)
    else:
        def finish(fid: int, o: FitOutcome, t0: float) -> None:
            write_outputs(cat, req, fid, o, t0, warm, req.name, req.description)
    _, outcome = execute_fit(cat, req, finish, ResumePoint(fit_id, opts.get("executor_tag")))
    cat.notice(f"madlib_keras_fit_resume: fit {fit_id} done in {outcome.seconds:.1f} s "
               f"({outcome.retried} unit attempts retried); results in {out}")


@entrypoint
def cerebro_db_fit_workers(cat: Catalog, *, fit_id: int, num_workers: int) -> None:
    """Ask a running fit for ``num_workers`` worker sessions: its coordinator opens new
    sessions or retires surplus workers (after their unit in flight) between units. Only the
    fit's owner (or a superuser) sees, hence changes, the fit."""
    if fit_id is None:
        raise CerebroError("fit_id must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if num_workers is None:
        raise CerebroError("num_workers must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if not 1 <= num_workers <= MAX_WORKERS:
        raise invalid(f"num_workers must be between 1 and {MAX_WORKERS}, got {num_workers}")
    rows = cat.query(f"SELECT status FROM {cat.ext('fits')} WHERE fit_id = $1", [fit_id],
                     ["int8"])
    if not rows:
        raise CerebroError(f"fit {fit_id} does not exist", "42704",
                           hint=f"SELECT fit_id, status FROM {cat.schema}.fits lists your fits.")
    if rows[0]["status"] != "running":
        raise CerebroError(f"fit {fit_id} is not running (status {rows[0]['status']})",
                           OBJECT_NOT_IN_PREREQUISITE_STATE,
                           hint="Workers can only be changed while the fit runs.")
    check_worker_limits(cat, num_workers, fit_id)
    cat.query(f"UPDATE {cat.ext('fits')} SET requested_workers = $2 WHERE fit_id = $1",
              [fit_id, num_workers], ["int8", "int4"])
    cat.notice(f"fit {fit_id}: asked for {num_workers} worker sessions; the coordinator "
               "applies it between units")
