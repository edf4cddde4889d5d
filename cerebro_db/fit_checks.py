"""The checks of a fit that need Keras, run where TensorFlow is imported anyway: in a worker
session (``__check_fit``, :mod:`cerebro_db.entrypoints.units`) or a remote worker
(:mod:`cerebro_db.remote.unit`), never in the coordinator. Each architecture builds and fits
the packed data; with ``validate_compile`` the loss, metric and optimizer names are checked
against Keras. The coordinator builds the spec (:func:`cerebro_db.fitrun.check_spec`)."""
from __future__ import annotations

import math
from typing import Any

from . import keras_arch, params
from .catalog import Catalog
from .errors import DATATYPE_MISMATCH, CerebroError, invalid


def _check_config(c: Any, src: Any, checked: dict[str, Any]) -> None:
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
    rows = getattr(src, "x_shapes", None) or [[size] for size in x_sizes]
    for i, (shape, size, row) in enumerate(zip(ins, x_sizes, rows)):
        in_size = math.prod(int(d) for d in shape if d is not None)
        if None in shape or in_size != size:
            packed, hint = f"{size} values per row", (
                "The architecture's input must hold as many values as each packed row (a "
                "Reshape layer can adapt a flat row).")
        elif not keras_arch.reshapes_to(row, [int(d) for d in shape if d is not None]):
            packed, hint = f"rows of shape {list(row)}", (
                "Rows are taken as the model's input when they are flat or have the same "
                "dimensions (besides dimensions of size 1); pack them in the model's order.")
        else:
            continue
        which = "" if len(ins) == 1 else f" {i + 1}"
        raise CerebroError(f"model_id {c.model_id} expects input{which} shape {list(shape)}, "
                           f"but the packed data has {packed}", DATATYPE_MISMATCH, hint=hint)
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


def check_configs(spec: dict[str, Any], cat: Catalog | None = None) -> None:
    """The checks that need Keras, run in a worker session (which imports TensorFlow anyway)
    so that the coordinator never does: each architecture builds and fits the packed data
    (:func:`_check_config`), its batches fit in memory (:func:`keras_arch.check_batch`),
    and with ``validate_compile`` the loss, metric and optimizer
    names are checked against Keras. Raises the same :class:`CerebroError` as the
    coordinator would."""
    from types import SimpleNamespace

    from . import worker

    worker._runtime(int(spec.get("worker_threads") or 0) or None)
    cols = tuple(spec["columns"])
    src = SimpleNamespace(x_size=spec["x_size"], y_width=spec["y_width"], kind=spec["kind"],
                          columns=lambda: cols, x_shapes=spec.get("x_shapes"))
    refs = dict(spec.get("custom_functions") or {})
    if refs:  # this session checks the grants itself before importing anything
        from .custom_functions import parse_reference, require_allowed

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
        c = SimpleNamespace(mst_key=item["mst_key"], model_id=item["model_id"],
                            arch=item["arch"], cp=cp)
        _check_config(c, src, checked)
        batch = params.parse_fit_params(item.get("fit_params"), "fit_params").batch_size
        if spec.get("num_rows") is not None:
            batch = min(batch, int(spec["num_rows"]))
        keras_arch.check_batch(c.arch, batch)
    if not spec.get("configs"):
        from . import training  # noqa: F401 - the warm-up: import TensorFlow now
