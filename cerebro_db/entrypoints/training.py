"""``madlib_keras_fit_multiple_model`` and ``madlib_keras_fit``: parse and check the
arguments, then run the fit by the fit service (:func:`cerebro_db.fitrun.run`), which
writes MADlib's outputs (:mod:`cerebro_db.outputs`). Also the worker-side checks of a fit's
configurations (:func:`check_configs`, run in the worker sessions by ``__check_fit``),
``cerebro_db_fit_workers(fit_id, num_workers)`` (asks a running fit, from another session,
for a different number of worker sessions; the coordinator reads the request between units)
and ``cerebro_db_close_workers()``. ``madlib_keras_fit_resume`` is in
:mod:`.resume`; the settings a fit reads are listed in :mod:`cerebro_db.sessions`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import fitrun, keras_arch, outputs, params
from ..catalog import Catalog
from ..catalog import fit_inputs as inputs_sql
from ..catalog import fits as fits_sql
from ..errors import (
    DATA_EXCEPTION,
    FEATURE_NOT_SUPPORTED,
    INSUFFICIENT_PRIVILEGE,
    NULL_VALUE_NOT_ALLOWED,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    UNDEFINED_OBJECT,
    UNDEFINED_TABLE,
    CerebroError,
    invalid,
)
from ..fitrun import Config, FitRequest, PackedTable, ResumePoint
from ..names import TableName
from ..scheduling import get_policy
from ..scheduling.costs import config_costs
from ..sessions import check_worker_limits, replicas
from . import entrypoint, fit_inputs
from .compat import custom_references
from .fit_inputs import check_fit_args, check_item, outputs_absent, packed_table, stored_table
from .models import require_arch_table
from .preprocessing import resolve_seed
from .selection import check_fit_bounds

MAX_WORKERS = 64


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
    arch = _named_by_summary(cat, mst, srow["model_arch_table"], "model_arch_table")
    require_arch_table(cat, arch, "model_arch_table")
    obj = srow.get("object_table")
    if obj:
        obj = str(_named_by_summary(cat, mst, obj, "object_table"))
    rows = inputs_sql.selection_rows(cat, mst, arch)
    if not rows:
        raise CerebroError(f'model_selection_table "{mst}" is empty', DATA_EXCEPTION)
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
                               f'exist in "{arch}"', UNDEFINED_OBJECT)
        cp = params.parse_compile_params(r["compile_params"],
                                         f"compile_params of mst_key {r['mst_key']}")
        fp = check_fit_bounds(params.parse_fit_params(
            r["fit_params"], f"fit_params of mst_key {r['mst_key']}"),
            f"fit_params of mst_key {r['mst_key']}")
        out.append(Config(r["mst_key"], r["model_id"], r["compile_params"], r["fit_params"],
                          r["arch"], r["w"], cp, fp))
    return out, arch, obj


def _named_by_summary(cat: Catalog, mst: TableName, name: str, what: str) -> TableName:
    """The table a selection table's summary names (its architecture or object table). A
    qualified name is the one its owner gave. An unqualified one (as MADlib stores it) is
    the table beside the selection table when there is one; else the caller's search_path
    finds it, and then it must belong to the caller, to the selection table's owner or to a
    superuser (42501): another role that may create in a schema on that path could put a
    view or table of that name there, and its functions would run as the caller (a
    red-team pass: eve's view ``public.a_arch``, looked up before the ``a_arch`` beside
    alice's selection table, made eve superuser when a superuser fitted alice's table)."""
    given = TableName.parse(name, what)
    if given.schema is not None:
        return given
    if mst.schema is not None:
        beside = TableName(mst.schema, given.name, name)
        if cat.relation_oid(beside) is not None:
            return beside
    found = cat.table(name, what)
    rel = cat.relation_owner(found)
    if rel is None or rel["mine"] or rel["owner_super"]:
        return found
    owner = cat.relation_owner(mst)
    if owner is not None and owner["owner"] == rel["owner"]:
        return found
    raise CerebroError(
        f'{what} "{name}" of the model selection table "{mst}" is found as "{found}", which '
        f'belongs to role "{rel["owner"]}", neither the calling role nor the selection '
        "table's owner", INSUFFICIENT_PRIVILEGE,
        hint="Qualify the name in the selection table's _summary (schema.table), or keep "
        "the table beside the selection table.")


def _warm_weights(cat: Catalog, out: TableName, configs: list[Config], key: str) -> None:
    """warm_start: take each config's weights from the existing output table, then drop the
    old outputs (in this transaction: a failure keeps them)."""
    oid = cat.relation_oid(out)
    if oid is None:
        raise CerebroError(f'warm_start needs the output table "{out}", which does not exist',
                           UNDEFINED_TABLE, hint="Run once without warm_start first.")
    # read, then dropped: the caller's own tables, locked (another role's view or a table
    # swapped in by the schema's owner would run its code as the caller)
    for s in ("", "_summary", "_info"):
        cat.require_own_table(out.with_suffix(s, "model_output_table") if s else out,
                              "model_output_table")
    oid = cat.relation_oid(out) or oid  # the locked table (the same unless it was replaced)
    cols = cat.columns(oid)
    if "model_weights" not in cols:
        raise invalid(f'"{out}" has no model_weights column')
    if key in cols:
        have = {r["k"]: r["w"] for r in inputs_sql.output_weights(cat, out, key)}
    else:
        rows = inputs_sql.output_weights(cat, out, None)
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
    ``random_state`` the seed is drawn and recorded in ``fits.random_state``).
    ``madlib_keras_fit_multiple_model`` adds ``config_costs``, the static cost estimate of
    each configuration (``scheduling.costs``) that the rotations are balanced by; stored
    with the fit's options, so a resume plans the same visit orders."""
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


def _bool(v: bool | None, default: bool) -> bool:
    return default if v is None else bool(v)


@entrypoint
def madlib_keras_fit_multiple_model(
        cat: Catalog, *, source_table: str, model_output_table: str, model_selection_table: str,
        num_iterations: int, use_gpus: bool | None = False, validation_table: str | None = None,
        metrics_compute_frequency: int | None = None, warm_start: bool | None = False,
        name: str | None = None, description: str | None = None,
        use_caching: bool | None = None, scheduling_policy: str | None = "mop",
        policy_params: str | None = None, random_state: int | None = None) -> None:
    """Train every configuration of the model selection table by model hopper parallelism."""
    check_fit_args(cat, num_iterations, metrics_compute_frequency, use_gpus)
    warm = _bool(warm_start, False)
    # a warm start reads the output table wherever the path finds it; else it is created
    out = (cat.table if warm else cat.output_table)(model_output_table, "model_output_table")
    mst = cat.table(model_selection_table, "model_selection_table")
    pname, popts = _policy(scheduling_policy, policy_params, random_state)
    seed = resolve_seed(random_state)
    src = packed_table(cat, source_table, "source_table")
    val = fit_inputs.validation_table(cat, validation_table, src)
    outputs_absent(cat, out, ("", "_summary", "_info"), warm)
    configs, arch, object_table = _load_configs(cat, mst)
    if pname in ("mop", "random"):
        popts.setdefault("config_costs", config_costs(
            (c.mst_key, c.arch, c.fp.batch_size) for c in configs))
    obj, refs = custom_references(cat, object_table, [c.cp for c in configs], resolve=False)
    check_tensorboard(cat, configs)
    if warm:
        _warm_weights(cat, out, configs, "mst_key")
    req = FitRequest(
        kind="fit_multiple", source=src, validation=val, output=out, configs=configs,
        num_iterations=num_iterations, frequency=metrics_compute_frequency, policy=pname,
        policy_params=popts, random_state=seed, num_workers=src.partitions,
        use_caching=use_caching, mst_table=mst, arch_table=arch, warm_start=warm, name=name,
        description=description,
        replicas=fitrun.fit_replicas(cat, replicas(cat), pname, src, val, src.partitions),
        checks=[check_item(c, f"compile_params of mst_key {c.mst_key}") for c in configs],
        object_table=str(obj) if obj else None, custom_functions=refs,
        training_metrics=fitrun.training_metrics(cat))
    run = fitrun.run(cat, request=req, outputs=outputs.write_fit_multiple)
    assert run.outcome is not None
    cat.notice(f"madlib_keras_fit_multiple_model: fit {run.fit_id} trained {len(configs)} "
               f"configurations in {run.outcome.seconds:.1f} s; results in {out} and "
               f"{out.with_suffix('_info', 'model_output_table')}")


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
    check_fit_args(cat, num_iterations, metrics_compute_frequency, use_gpus)
    out = (cat.table if _bool(warm_start, False) else cat.output_table)(model, "model")
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
    val = fit_inputs.validation_table(cat, validation_table, src)
    outputs_absent(cat, out, ("", "_summary"), warm)
    require_arch_table(cat, arch_t, "model_arch_table")
    rows = inputs_sql.architectures(cat, arch_t, [model_id])
    if not rows:
        raise CerebroError(f'model_id {model_id} does not exist in "{arch_t}"', UNDEFINED_OBJECT)
    cfg = Config(1, model_id, compile_params, fit_params, rows[0]["a"],
                 bytes(rows[0]["w"]) if rows[0]["w"] is not None else None, cp, fp)
    check_tensorboard(cat, [cfg])
    if warm:
        _warm_weights(cat, out, [cfg], "mst_key")
    req = FitRequest(
        kind="fit", source=src, validation=val, output=out, configs=[cfg],
        num_iterations=num_iterations, frequency=metrics_compute_frequency, policy=pname,
        policy_params=popts, random_state=seed, num_workers=1, use_caching=None,
        mst_table=None, arch_table=arch_t, warm_start=warm, name=name,
        description=description, replicas=fitrun.fit_replicas(cat, replicas(cat), pname, src,
                                                              val, 1),
        checks=[check_item(cfg)],
        validate_compile=True, object_table=str(obj) if obj else None,
        custom_functions=refs, training_metrics=fitrun.training_metrics(cat))
    run = fitrun.run(cat, request=req, outputs=outputs.write_fit)
    assert run.outcome is not None
    cat.notice(f"madlib_keras_fit: fit {run.fit_id} trained model_id {model_id} in "
               f"{run.outcome.seconds:.1f} s; weights in {out}")


def resume_fit(cat: Catalog, f: dict[str, Any], opts: dict[str, Any], src: PackedTable,
               val: PackedTable | None, out: TableName) -> None:
    """``madlib_keras_fit_resume`` of a fit of fixed configurations (kind ``'fit'`` or
    ``'fit_multiple'``): the request as the original call made it, from the catalog."""
    fit_id = int(f["fit_id"])
    warm = bool(opts.get("warm_start"))
    suffixes = ("", "_summary", "_info") if f["kind"] == "fit_multiple" else ("", "_summary")
    if warm:  # the interrupted call had not replaced them yet
        for sfx in suffixes:
            t = out.with_suffix(sfx, "model_output_table") if sfx else out
            if cat.relation_oid(t) is not None:
                cat.drop_table(t)
    else:
        outputs_absent(cat, out, suffixes, False, resume=True)
    arch = stored_table(cat, opts, "arch", opts["arch_table"], "model_arch_table")
    assert arch is not None
    configs = fitrun.stored_configs(cat, fit_id)
    if not configs:
        raise CerebroError(f"fit {fit_id} cannot be resumed: its catalog row is damaged (it "
                           "has no configurations)", OBJECT_NOT_IN_PREREQUISITE_STATE,
                           hint="Start a new fit instead.")
    req = FitRequest(
        kind=f["kind"], source=src, validation=val, output=out,
        configs=configs, num_iterations=f["num_iterations"],
        frequency=opts.get("frequency"), policy=f["policy"],
        policy_params=dict(opts.get("policy_params") or {}),
        random_state=int(f["random_state"]), num_workers=int(opts["num_workers"]),
        use_caching=opts.get("use_caching"),
        mst_table=stored_table(cat, opts, "mst", f["model_selection_table"],
                               "model_selection_table"),
        arch_table=arch, warm_start=warm, name=opts.get("name"),
        description=opts.get("description"), replicas=int(opts.get("replicas") or 1),
        object_table=opts.get("object_table"),
        custom_functions=dict(opts.get("custom_functions") or {}),
        training_metrics=opts.get("training_metrics") or "evaluated")
    write = outputs.write_fit if req.kind == "fit" else outputs.write_fit_multiple
    run = fitrun.run(cat, request=req, outputs=write,
                     resume=ResumePoint(fit_id, opts.get("executor_tag")))
    assert run.outcome is not None
    cat.notice(f"madlib_keras_fit_resume: fit {fit_id} done in {run.outcome.seconds:.1f} s "
               f"({run.outcome.retried} unit attempts retried); results in {out}")


@entrypoint
def cerebro_db_close_workers(cat: Catalog) -> int:
    """Close the worker sessions this session keeps open between fits; returns how many."""
    from ..executors import close_pool

    return close_pool(cat)


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
    status = fits_sql.fit_status(cat, fit_id)
    if status is None:
        raise CerebroError(f"fit {fit_id} does not exist", UNDEFINED_OBJECT,
                           hint=f"SELECT fit_id, status FROM {cat.schema}.fits lists your fits.")
    if status != "running":
        raise CerebroError(f"fit {fit_id} is not running (status {status})",
                           OBJECT_NOT_IN_PREREQUISITE_STATE,
                           hint="Workers can only be changed while the fit runs.")
    check_worker_limits(cat, num_workers, fit_id, fits_sql.coordinator_pid(cat, fit_id))
    fits_sql.request_workers(cat, fit_id, num_workers)
    cat.notice(f"fit {fit_id}: asked for {num_workers} worker sessions; the coordinator "
               "applies it between units")
