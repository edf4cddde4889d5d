"""Hostile and malformed input to every SQL entry point, against the real server.

Each case must fail with a deliberate SQLSTATE and a clear message, leave nothing behind
(no new relation in any schema, no new row in the extension's catalog tables, no worker
session) and never run its payload: payloads try to create a marker table or a marker
file, and neither may appear. Calls run as a superuser, so an injection that got through
would have every right.
"""
from __future__ import annotations

import math
import os
import uuid

import numpy as np
import pytest

from ..helpers import connect, q, worker_sessions_gone
from .conftest import catalog_counts, relations

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

MARK = f"cerebro_hostile_{uuid.uuid4().hex[:8]}"
MARK_FILE = f"/tmp/{MARK}"
PY = f"__import__('os').system('touch {MARK_FILE}')"
SQLI = f"; CREATE TABLE {MARK} (); --"
DEEP = "[" * 500 + "]" * 500
LONG = "x" * 200_000
COMPILE = "loss='categorical_crossentropy', optimizer='SGD(learning_rate=0.1)', metrics=['accuracy']"
MAXINT = 2**31 - 1


def mlp(inputs: int = 4, outputs: int = 3) -> str:
    import keras

    return keras.Sequential([keras.Input((inputs,)),
                             keras.layers.Dense(outputs, activation="softmax")]).to_json()


def lambda_arch() -> str:
    """A Keras JSON whose Lambda layer would run marshalled bytecode when deserialized."""
    import json

    arch = json.loads(mlp())
    arch["config"]["layers"].insert(1, {
        "module": "keras.layers", "class_name": "Lambda", "registered_name": None,
        "config": {"name": "evil", "function": {"class_name": "__lambda__", "config": {
            "code": "4wEAAAAAAAAAAAAAAAEAAAACAAAAQwAAAHMEAAAAfABTACkBTqkAKQHaAXhyAQAAAHIBAAAA",
            "defaults": None, "closure": None}}}})
    return json.dumps(arch)


def module_arch() -> str:
    """A layer whose module and class name point at os.system."""
    import json

    arch = json.loads(mlp())
    arch["config"]["layers"][1] = {"module": "os", "class_name": "system",
                                   "registered_name": "os>system",
                                   "config": {"command": f"touch {MARK_FILE}"}}
    return json.dumps(arch)


def table(conn, name: str, rows: list[tuple], xtype: str = "real[]") -> None:
    q(conn, f"CREATE TABLE {name} (id integer, y integer, x {xtype})")
    with conn.cursor() as cur:
        for r in rows:
            cur.execute(f"INSERT INTO {name} VALUES (%s, %s, %s)", r)


@pytest.fixture(scope="module")
def hconn(rel_db):
    """A connection whose objects live in the schema h, with valid objects to attack:
    raw tables (good and bad), packed training and validation data, an architecture
    table, a model selection table, a trained model and a table of hostile configs."""
    c = connect(rel_db)
    c.autocommit = True
    q(c, "SET client_min_messages = warning")
    q(c, "CREATE SCHEMA h")
    q(c, "SET search_path = h, public, cerebro_db")
    rng = np.random.default_rng(0)
    good = [(i, i % 3, [float(v) for v in rng.normal(size=4)]) for i in range(40)]
    table(c, "raw", good)
    table(c, "raw_nan", good[:5] + [(99, 0, [1.0, float("nan"), 0.0, 0.0])])
    table(c, "raw_inf", good[:5] + [(99, 0, [1.0, float("inf"), 0.0, 0.0])])
    table(c, "raw_ragged", good[:5] + [(99, 0, [1.0, 2.0, 3.0, 4.0, 5.0])])
    table(c, "raw_xnull", good[:5] + [(99, 0, None)])
    table(c, "raw_elemnull", good[:5] + [(99, 0, [1.0, None, 0.0, 0.0])])
    table(c, "raw_label99", good[:5] + [(99, 99, [1.0, 0.0, 0.0, 0.0])])
    table(c, "raw_wide", [(i, i % 3, [0.5] * 5) for i in range(6)])
    table(c, "raw_empty", [])
    table(c, "raw_idnull", good[:5] + [(None, 0, [1.0, 0.0, 0.0, 0.0])])
    table(c, "raw_text", [(1, 0, "{1,2,3,4}")], xtype="text")
    q(c, "SELECT training_preprocessor_dl('raw', 'packed', 'y', 'x', NULL, 1.0, NULL, NULL, 1, 1)")
    q(c, "SELECT validation_preprocessor_dl('raw', 'vpacked', 'y', 'x', 'packed')")
    q(c, "SELECT training_preprocessor_dl('raw', 'packed2', 'y', 'x', NULL, 1.0, NULL, NULL, 2, 1)")
    q(c, "SELECT validation_preprocessor_dl('raw', 'vpacked2', 'y', 'x', 'packed2')")
    q(c, "SELECT training_preprocessor_dl('raw_wide', 'packed_wide', 'y', 'x', NULL, 1.0, NULL, "
         "NULL, 1, 1)")
    q(c, "SELECT load_keras_model('arch', %s)", (mlp(),))  # 1: no weights
    q(c, "SELECT load_keras_model('arch', %s, %s)",
      (mlp(), psycopg2.Binary(np.zeros(15, "<f4").tobytes())))  # 2: with weights
    q(c, "SELECT load_keras_model('arch', %s)", (mlp(5),))  # 3: 5 inputs
    q(c, "SELECT load_model_selection_table('arch', 'mst', ARRAY[1], ARRAY[%s], "
         "ARRAY['batch_size=8'])", (COMPILE,))
    q(c, "CREATE TABLE mst_evil (mst_key serial PRIMARY KEY, model_id integer, "
         "compile_params varchar, fit_params varchar)")
    q(c, "INSERT INTO mst_evil (model_id, compile_params, fit_params) VALUES (1, %s, "
         "'batch_size=8')", (f"loss={PY}, optimizer='SGD'",))
    q(c, "CREATE TABLE mst_evil_summary AS SELECT * FROM mst_summary")
    q(c, "CREATE TABLE mst_empty (LIKE mst INCLUDING ALL)")
    q(c, "CREATE TABLE mst_empty_summary AS SELECT * FROM mst_summary")
    q(c, "CREATE TABLE mst_badarch (LIKE mst INCLUDING ALL)")
    q(c, "INSERT INTO mst_badarch (mst_key, model_id, compile_params, fit_params) "
         "VALUES (1, 3, %s, 'batch_size=8')", (COMPILE,))
    q(c, "CREATE TABLE mst_badarch_summary AS SELECT * FROM mst_summary")
    q(c, "SELECT madlib_keras_fit('packed', 'model', 'arch', 1, %s, 'batch_size=8', 1)",
      (COMPILE,))
    q(c, "CREATE TABLE taken (x integer)")
    q(c, "SET statement_timeout = '60s'")  # a case that starts real work fails, not hangs
    yield c
    q(c, "DROP SCHEMA h CASCADE")
    c.close()


def case(id_: str, sql: str, args: tuple, sqlstate: str, fragment: str):
    return pytest.param(sql, args, sqlstate, fragment, id=id_)


TP = "SELECT training_preprocessor_dl(%s, %s, %s, %s, %s, %s::real, %s::int[], %s, %s, %s)"
VP = "SELECT validation_preprocessor_dl(%s, %s, %s, %s, %s, %s, %s, %s)"
LKM = "SELECT load_keras_model(%s, %s, %s)"
DKM = "SELECT delete_keras_model(%s, %s)"
LMST = "SELECT load_model_selection_table(%s, %s, %s, %s::varchar[], %s::varchar[], %s)"
GEN = "SELECT generate_model_configs(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
FMM = ("SELECT madlib_keras_fit_multiple_model(%s, %s, %s, %s, %s, %s, %s, %s, NULL, NULL, "
       "FALSE, %s, %s, %s)")
FIT = "SELECT madlib_keras_fit(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, NULL, NULL, %s, %s)"
EVAL = "SELECT madlib_keras_evaluate(%s, %s, %s, %s, %s)"
PRED = "SELECT madlib_keras_predict(%s, %s, %s, %s, %s, %s, %s, %s)"
BYOM = "SELECT madlib_keras_predict_byom(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"


def tp(src="raw", out="tp_out", dep="y", indep="x", buf=None, norm=1.0, ncls=None,
       rules=None, parts=1, seed=1):
    return (src, out, dep, indep, buf, norm, ncls, rules, parts, seed)


def vp(src="raw", out="vp_out", dep="y", indep="x", train="packed", buf=None, rules=None,
       parts=None):
    return (src, out, dep, indep, train, buf, rules, parts)


def lmst(arch="arch", mst="lm_out", ids=(1,), comp=(COMPILE,), fit=("batch_size=8",), obj=None):
    return (arch, mst, list(ids) if ids is not None else None,
            list(comp) if comp is not None else None, list(fit) if fit is not None else None, obj)


def gen(arch="arch", mst="gen_out", ids=(1,), cgrid=None, fgrid="{'batch_size': [8, 16]}",
        search="grid", n=None, seed=None, obj=None):
    cgrid = cgrid if cgrid is not None else \
        "{'loss': ['categorical_crossentropy'], 'optimizer_params_list': " \
        "[{'optimizer': ['SGD'], 'lr': [0.1]}], 'metrics': ['accuracy']}"
    return (arch, mst, list(ids) if ids is not None else None, cgrid, fgrid, search, n, seed,
            obj)


def fmm(src="packed", out="fmm_out", mst="mst", iters=1, gpus=False, val=None, freq=None,
        warm=False, policy="mop", pparams=None, seed=1):
    return (src, out, mst, iters, gpus, val, freq, warm, policy, pparams, seed)


def fit(src="packed", out="fit_out", arch="arch", mid=1, comp=COMPILE, fitp="batch_size=8",
        iters=1, gpus=False, val=None, freq=None, warm=False, obj=None, seed=1):
    return (src, out, arch, mid, comp, fitp, iters, gpus, val, freq, warm, obj, seed)


def ev(model="model", test="vpacked", out="ev_out", gpus=False, mst=None):
    return (model, test, out, gpus, mst)


def pr(model="model", test="raw", id_="id", x="x", out="pr_out", pt="prob", gpus=False,
       mst=None):
    return (model, test, id_, x, out, pt, gpus, mst)


def byom(arch="arch", mid=2, test="raw", id_="id", x="x", out="by_out", pt="prob", gpus=False,
         cv=None, norm=None, dc=1):
    return (arch, mid, test, id_, x, out, pt, gpus, cv, norm, dc)


CASES = [
    # ---------------------------------------------------------------- training_preprocessor_dl
    case("tp-source-null", TP, tp(src=None), "22004", "source_table must not be NULL"),
    case("tp-source-missing", TP, tp(src="no_such"), "42P01", 'source_table "no_such" does not exist'),
    case("tp-source-semicolon-drop", TP, tp(src=f"raw{SQLI}"), "42602", "source_table"),
    case("tp-source-quoted-drop", TP, tp(src=f'"raw"" {SQLI}"'), "42P01", "does not exist"),
    case("tp-source-missing-schema", TP, tp(src="no_schema.raw"), "42P01",
         'source_table "no_schema.raw" does not exist'),
    case("tp-source-too-many-dots", TP, tp(src="a.b.c.d"), "42602", "too many dotted parts"),
    case("tp-output-dollar-quote", TP, tp(out=f"$$ {SQLI} $$"), "42602", "output_table"),
    case("tp-output-comment", TP, tp(out="tp_out -- x"), "42602", "output_table"),
    case("tp-output-exists", TP, tp(out="taken"), "42P07", 'output_table "taken" already exists'),
    case("tp-output-very-long", TP, tp(out=LONG), "42602", "longer than 63 bytes"),
    case("tp-output-missing-schema", TP, tp(out="no_schema.tp_out"), "3F000", "no_schema"),
    case("tp-dep-drop", TP, tp(dep=f"y{SQLI}"), "42602", "dependent_varname"),
    case("tp-indep-paren-drop", TP, tp(indep=f"x) FROM raw{SQLI}"), "42602",
         "independent_varname"),
    case("tp-indep-quoted-drop", TP, tp(indep=f'"x"" {SQLI}"'), "42703", "does not exist"),
    case("tp-indep-text-column", TP, tp(src="raw_text"), "42804", "expected a numeric array"),
    case("tp-dep-is-indep", TP, tp(dep="x"), "22023", "both a dependent and an independent"),
    case("tp-empty-table", TP, tp(src="raw_empty"), "22000", 'source_table "raw_empty" is empty'),
    case("tp-nan-feature", TP, tp(src="raw_nan"), "22P01", "NaN"),
    case("tp-inf-feature", TP, tp(src="raw_inf"), "22P01", "infinit"),
    case("tp-ragged-shapes", TP, tp(src="raw_ragged"), "22000", "same shape in every row"),
    case("tp-null-feature-row", TP, tp(src="raw_xnull"), "22004", "NULL"),
    case("tp-null-feature-element", TP, tp(src="raw_elemnull"), "22004", "NULL"),
    case("tp-buffer-size-zero", TP, tp(buf=0), "22023", "buffer_size"),
    case("tp-buffer-size-negative", TP, tp(buf=-5), "22023", "buffer_size"),
    case("tp-normalizing-const-zero", TP, tp(norm=0.0), "22023", "normalizing_const"),
    case("tp-normalizing-const-nan", TP, tp(norm=math.nan), "22023", "normalizing_const"),
    case("tp-normalizing-const-inf", TP, tp(norm=math.inf), "22023", "normalizing_const"),
    case("tp-num-classes-huge", TP, tp(ncls=[MAXINT]), "22023", "num_classes"),
    case("tp-num-classes-negative", TP, tp(ncls=[-1]), "22023", "num_classes"),
    case("tp-num-partitions-max", TP, tp(parts=MAXINT), "22023", "num_partitions"),
    case("tp-num-partitions-zero", TP, tp(parts=0), "22023", "num_partitions"),
    case("tp-distribution-rules-drop", TP, tp(rules=f"x'{SQLI}"), "42602", "distribution_rules"),
    case("tp-distribution-rules-missing", TP, tp(rules="no_such_segments"), "42P01",
         "distribution_rules"),
    # ---------------------------------------------------------------- validation_preprocessor_dl
    case("vp-training-table-missing", VP, vp(train="no_such"), "42P01", "no_such"),
    case("vp-training-table-raw", VP, vp(train="raw"), "42P01", "raw_summary"),
    case("vp-training-table-drop", VP, vp(train=f"packed{SQLI}"), "42602",
         "training_preprocessor_table"),
    case("vp-feature-shape-mismatch", VP, vp(src="raw_wide"), "22000", "shape"),
    case("vp-unknown-label", VP, vp(src="raw_label99"), "22000", "not a class of the training"),
    case("vp-empty-table", VP, vp(src="raw_empty"), "22000", 'source_table "raw_empty" is empty'),
    case("vp-output-exists", VP, vp(out="taken"), "42P07", "already exists"),
    case("vp-buffer-size-zero", VP, vp(buf=0), "22023", "buffer_size"),
    # ---------------------------------------------------------------- load_keras_model
    case("lkm-arch-null", LKM, ("lkm_out", None, None), "22004", "model_arch"),
    case("lkm-arch-empty-object", LKM, ("lkm_out", "{}", None), "22023", "model_arch"),
    case("lkm-arch-lambda-layer", LKM, ("lkm_out", lambda_arch(), None), "0A000", "Lambda"),
    case("lkm-arch-os-system-layer", LKM, ("lkm_out", module_arch(), None), "0A000",
         "refers to module os"),
    case("lkm-arch-deep-nesting", LKM, ("lkm_out", DEEP, None), "22023", "model_arch"),
    case("lkm-weights-wrong-length", LKM, ("lkm_out", mlp(), psycopg2.Binary(b"\0" * 7)),
         "22023", "model_weights"),
    case("lkm-table-drop", LKM, (f"lkm{SQLI}", mlp(), None), "42602", "keras_model_arch_table"),
    case("lkm-table-not-arch", LKM, ("raw", mlp(), None), "42809", "not a model architecture"),
    case("lkm-table-missing-schema", LKM, ("no_schema.arch", mlp(), None), "3F000", "no_schema"),
    # ---------------------------------------------------------------- delete_keras_model
    case("dkm-model-id-null", DKM, ("arch", None), "22004", "model_id must not be NULL"),
    case("dkm-model-id-missing", DKM, ("arch", MAXINT), "42704", f"model_id {MAXINT} does not"),
    case("dkm-table-missing", DKM, ("no_such", 1), "42P01", "no_such"),
    case("dkm-table-drop", DKM, (f"arch{SQLI}", 1), "42602", "keras_model_arch_table"),
    case("dkm-table-quote-drop", DKM, (f'arch"{SQLI}', 1), "42602", "keras_model_arch_table"),
    case("dkm-table-not-arch", DKM, ("raw", 1), "42809", "not a model architecture"),
    # ---------------------------------------------------------------- load_model_selection_table
    case("lmst-compile-import-os", LMST, lmst(comp=(f"loss={PY}, optimizer='SGD'",)), "22023",
         "compile_params"),
    case("lmst-compile-lambda", LMST, lmst(comp=("loss=lambda y, p: 0, optimizer='SGD'",)),
         "22023", "lambda"),
    case("lmst-compile-attribute", LMST,
         lmst(comp=("loss=keras.losses.__class__, optimizer='SGD'",)), "22023", "compile_params"),
    case("lmst-compile-fstring", LMST, lmst(comp=("loss=f'{__import__(\"os\")}', optimizer='SGD'",)),
         "22023", "compile_params"),
    case("lmst-compile-dollar-semicolon", LMST,
         lmst(comp=(f"$$ {SQLI} $$",)), "42601", "compile_params"),
    case("lmst-compile-too-long", LMST, lmst(comp=("loss='" + LONG + "'",)), "22023",
         "too long"),
    case("lmst-compile-element-null", LMST, lmst(comp=(COMPILE, None)), "22004", "NULL"),
    case("lmst-fit-deep-nesting", LMST, lmst(fit=(f"batch_size=8, class_weight={DEEP}",)),
         "42601", "too many nested parentheses"),
    case("lmst-fit-1e309", LMST, lmst(fit=("batch_size=1e309",)), "22023", "batch_size"),
    case("lmst-fit-epochs-overflow", LMST, lmst(fit=("batch_size=8, epochs=2147483648",)),
         "22023", "epochs must be at most"),
    case("lmst-model-id-null-element", LMST, lmst(ids=(1, None)), "22004", "model_id_list"),
    case("lmst-model-id-missing", LMST, lmst(ids=(77,)), "42704", "model_id 77 does not exist"),
    case("lmst-table-drop", LMST, lmst(mst='"lm"; DROP TABLE h.raw; --'), "42602",
         "model_selection_table"),
    case("lmst-object-table", LMST, lmst(obj="objs"), "42P01", "object_table"),
    # ---------------------------------------------------------------- generate_model_configs
    case("gen-grid-import-os", GEN, gen(cgrid="{'loss': [" + PY + "]}"), "22023",
         "compile_params_grid"),
    case("gen-grid-not-dict", GEN, gen(fgrid="[1, 2]"), "22023", "fit_params_grid"),
    case("gen-grid-deep", GEN, gen(fgrid="{'batch_size': " + DEEP + "}"), "42601",
         "too many nested parentheses"),
    case("gen-grid-epochs-huge", GEN, gen(fgrid="{'batch_size': [8], 'epochs': [10**9]}"),
         "22023", "fit_params_grid"),
    case("gen-grid-epochs-over-limit", GEN, gen(fgrid="{'batch_size': [8], 'epochs': [1000000]}"),
         "22023", "epochs must be at most 10000"),
    case("gen-grid-too-large", GEN,
         gen(fgrid=f"{{'batch_size': {list(range(1, 401))}, 'epochs': {list(range(1, 401))}}}"),
         "22023", "more than 100000"),
    case("gen-search-type-drop", GEN, gen(search=f"grid'{SQLI}"), "22023", "search_type"),
    case("gen-search-type-null", GEN, gen(search=None), "22004", "search_type"),
    case("gen-num-configs-max", GEN, gen(search="random", n=MAXINT), "22023", "num_configs"),
    case("gen-num-configs-zero", GEN, gen(search="random", n=0), "22023", "num_configs"),
    case("gen-table-quote", GEN, gen(mst='gen"out'), "42602", "model_selection_table"),
    # ---------------------------------------------------------------- fit_multiple_model
    case("fmm-num-iterations-max", FMM, fmm(iters=MAXINT), "22023", "num_iterations"),
    case("fmm-num-iterations-zero", FMM, fmm(iters=0), "22023", "num_iterations"),
    case("fmm-num-iterations-null", FMM, fmm(iters=None), "22004", "num_iterations"),
    case("fmm-frequency-above-iterations", FMM, fmm(iters=2, freq=3), "22023",
         "metrics_compute_frequency"),
    case("fmm-source-raw", FMM, fmm(src="raw"), "42P01", "source_table"),
    case("fmm-source-drop", FMM, fmm(src=f"packed{SQLI}"), "42602", "source_table"),
    case("fmm-output-drop", FMM, fmm(out=f'"o""{SQLI}'), "42602", "model_output_table"),
    case("fmm-output-exists", FMM, fmm(out="model"), "42P07", "already exists"),
    case("fmm-mst-missing", FMM, fmm(mst="no_schema.mst"), "42P01", "no_schema.mst"),
    case("fmm-mst-empty", FMM, fmm(mst="mst_empty"), "22000", '"mst_empty" is empty'),
    case("fmm-mst-hostile-row", FMM, fmm(mst="mst_evil"), "22023",
         "compile_params of mst_key 1: loss must be a literal"),
    case("fmm-mst-arch-mismatch", FMM, fmm(mst="mst_badarch"), "42804", "expects input shape"),
    case("fmm-validation-partitions", FMM, fmm(val="vpacked2"), "22023", "partitions"),
    case("fmm-policy-drop", FMM, fmm(policy=f"mop'{SQLI}"), "22023", "scheduling policy"),
    case("fmm-policy-params-import", FMM, fmm(pparams=f"prefer_lagging={PY}"), "22023",
         "policy_params"),
    case("fmm-policy-params-lambda", FMM, fmm(pparams="prefer_lagging=lambda: 1"), "22023",
         "lambda"),
    case("fmm-policy-params-1e309", FMM, fmm(policy="ring", pparams="reset_optimizer_per_hop=1e309"),
         "22023", "policy_params"),
    case("fmm-use-gpus", FMM, fmm(gpus=True), "0A000", "GPU"),
    # ---------------------------------------------------------------- madlib_keras_fit
    case("fit-num-iterations-max", FIT, fit(iters=MAXINT), "22023", "num_iterations"),
    case("fit-compile-import-os", FIT, fit(comp=f"loss={PY}, optimizer='SGD'"), "22023",
         "compile_params"),
    case("fit-compile-null", FIT, fit(comp=None), "22004", "compile_params"),
    case("fit-fit-params-nan", FIT, fit(fitp="batch_size=8, class_weight={0: nan}"), "22023",
         "fit_params"),
    case("fit-fit-params-batch-max", FIT, fit(fitp=f"batch_size={MAXINT + 1}"), "22023",
         "batch_size must be at most"),
    case("fit-fit-params-epochs-max", FIT, fit(fitp=f"epochs={MAXINT}"), "22023",
         "epochs must be at most"),
    case("fit-model-id-missing", FIT, fit(mid=MAXINT), "42704", "does not exist"),
    case("fit-arch-input-mismatch", FIT, fit(mid=3), "42804", "expects input shape"),
    case("fit-model-quote-drop", FIT, fit(out=f'fo"{SQLI}'), "42602", "model"),
    case("fit-object-table", FIT, fit(obj="objs"), "42P01", "object_table"),
    # ---------------------------------------------------------------- madlib_keras_evaluate
    case("ev-model-missing", EVAL, ev(model="no_such"), "42P01", "no_such"),
    case("ev-model-raw", EVAL, ev(model="raw"), "22023", "model_weights"),
    case("ev-test-raw", EVAL, ev(test="raw"), "42P01", "test_table"),
    case("ev-test-other-width", EVAL, ev(test="packed_wide"), "42804", "model expects (4,)"),
    case("ev-output-exists", EVAL, ev(out="taken"), "42P07", "already exists"),
    case("ev-output-drop", EVAL, ev(out=f"ev{SQLI}"), "42602", "output_table"),
    # ---------------------------------------------------------------- madlib_keras_predict
    case("pr-pred-type-drop", PRED, pr(pt=f"prob'{SQLI}"), "22023", "pred_type"),
    case("pr-pred-type-nan", PRED, pr(pt="nan"), "22023", "pred_type"),
    case("pr-pred-type-inf", PRED, pr(pt="inf"), "22023", "pred_type"),
    case("pr-pred-type-1e309", PRED, pr(pt="1e309"), "22023", "pred_type"),
    case("pr-id-col-drop", PRED, pr(id_=f"id{SQLI}"), "42602", "id_col"),
    case("pr-id-col-null", PRED, pr(id_=None), "22004", "id_col"),
    case("pr-id-null-rows", PRED, pr(test="raw_idnull"), "22004", "NULL"),
    case("pr-x-missing", PRED, pr(x="no_col"), "42703", "no_col"),
    case("pr-x-text", PRED, pr(test="raw_text"), "42804", "expected a numeric array"),
    case("pr-x-nan", PRED, pr(test="raw_nan"), "22P01", "NaN"),
    case("pr-x-wrong-width", PRED, pr(test="raw_wide"), "42804",
         "shape (5,) per row but the model expects (4,)"),
    case("pr-x-ragged", PRED, pr(test="raw_ragged"), "22000", "shape"),
    case("pr-model-missing-schema", PRED, pr(model="no_schema.model"), "42P01", "no_schema"),
    # ---------------------------------------------------------------- madlib_keras_predict_byom
    case("byom-norm-nan", BYOM, byom(norm=math.nan), "22023", "normalizing_const"),
    case("byom-norm-inf", BYOM, byom(norm=math.inf), "22023", "normalizing_const"),
    case("byom-norm-zero", BYOM, byom(norm=0.0), "22023", "normalizing_const"),
    case("byom-model-id-null", BYOM, byom(mid=None), "22004", "model_id"),
    case("byom-no-weights", BYOM, byom(mid=1), "22023", "has no weights"),
    case("byom-class-values-count", BYOM, byom(cv=["a", "b"]), "42804", "class values"),
    case("byom-dependent-count", BYOM, byom(dc=2), "42804", "dependent_count"),
    case("byom-arch-drop", BYOM, byom(arch=f"arch{SQLI}"), "42602", "model_arch_table"),
    case("byom-output-exists", BYOM, byom(out="taken"), "42P07", "already exists"),
]


# Every table and column name argument of every entry point, each with every payload.
# (template, builder, keyword, name used in messages, "in" for inputs / "out" for outputs)
NAME_ARGS = [
    ("tp", TP, tp, "src", "source_table", "in"),
    ("tp", TP, tp, "out", "output_table", "out"),
    ("tp", TP, tp, "dep", "dependent_varname", "col"),
    ("tp", TP, tp, "indep", "independent_varname", "col"),
    ("vp", VP, vp, "src", "source_table", "in"),
    ("vp", VP, vp, "out", "output_table", "out"),
    ("vp", VP, vp, "dep", "dependent_varname", "col"),
    ("vp", VP, vp, "indep", "independent_varname", "col"),
    ("vp", VP, vp, "train", "training_preprocessor_table", "in"),
    ("lkm", LKM, lambda t="lkm_out": (t, mlp(), None), "t", "keras_model_arch_table", "out"),
    ("dkm", DKM, lambda t="arch": (t, 1), "t", "keras_model_arch_table", "in"),
    ("lmst", LMST, lmst, "arch", "model_arch_table", "in"),
    ("lmst", LMST, lmst, "mst", "model_selection_table", "out"),
    ("gen", GEN, gen, "arch", "model_arch_table", "in"),
    ("gen", GEN, gen, "mst", "model_selection_table", "out"),
    ("fmm", FMM, fmm, "src", "source_table", "in"),
    ("fmm", FMM, fmm, "out", "model_output_table", "out"),
    ("fmm", FMM, fmm, "mst", "model_selection_table", "in"),
    ("fmm", FMM, fmm, "val", "validation_table", "in"),
    ("fit", FIT, fit, "src", "source_table", "in"),
    ("fit", FIT, fit, "out", "model", "out"),
    ("fit", FIT, fit, "arch", "model_arch_table", "in"),
    ("fit", FIT, fit, "val", "validation_table", "in"),
    ("ev", EVAL, ev, "model", "model_table", "in"),
    ("ev", EVAL, ev, "test", "test_table", "in"),
    ("ev", EVAL, ev, "out", "output_table", "out"),
    ("pr", PRED, pr, "model", "model_table", "in"),
    ("pr", PRED, pr, "test", "test_table", "in"),
    ("pr", PRED, pr, "id_", "id_col", "col"),
    ("pr", PRED, pr, "x", "independent_varname", "col"),
    ("pr", PRED, pr, "out", "output_table", "out"),
    ("byom", BYOM, byom, "arch", "model_arch_table", "in"),
    ("byom", BYOM, byom, "test", "test_table", "in"),
    ("byom", BYOM, byom, "id_", "id_col", "col"),
    ("byom", BYOM, byom, "x", "independent_varname", "col"),
    ("byom", BYOM, byom, "out", "output_table", "out"),
]
NAME_PAYLOADS = {
    "semicolon-drop": f"x; DROP TABLE h.raw; CREATE TABLE {MARK} (); --",
    "dollar-quote": "x$$; DROP TABLE h.raw; $$",
    "single-quote": "x' OR '1'='1",
    "double-quote": 'x"; DROP TABLE h.raw; --',
    "comment": "x -- DROP TABLE h.raw",
}


def _name_cases() -> list:
    out = []
    for fn, tmpl, build, kw, what, kind in NAME_ARGS:
        for pid, payload in NAME_PAYLOADS.items():
            out.append(case(f"{fn}-{what}-{pid}", tmpl, build(**{kw: payload}), "42602", what))
        if kind == "col":
            out.append(case(f"{fn}-{what}-quoted-drop", tmpl,
                            build(**{kw: '"x""; DROP TABLE h.raw; --"'}), "42703",
                            'does not exist'))
            continue
        schema_state, frag = ("42P01", "does not exist") if kind == "in" else \
            ("3F000", 'schema "no_schema" does not exist')
        out.append(case(f"{fn}-{what}-missing-schema", tmpl,
                        build(**{kw: "no_schema.t_x"}), schema_state, frag))
        if kind == "in":
            out.append(case(f"{fn}-{what}-quoted-drop", tmpl,
                            build(**{kw: '"x""; DROP TABLE h.raw; --"'}), "42P01",
                            "does not exist"))
    return out


CASES += _name_cases()


@pytest.mark.parametrize("sql, args, sqlstate, fragment", CASES)
def test_hostile_input_is_rejected(hconn, admin, sql, args, sqlstate, fragment):
    rel, cat = relations(admin), catalog_counts(admin)
    try:
        with pytest.raises(psycopg2.Error) as ei:
            q(hconn, sql, args)
    finally:  # a call that wrongly succeeded must not spoil the cases after it
        for schema, name in relations(admin) - rel:
            if schema == "h":
                q(admin, f'DROP TABLE IF EXISTS h."{name}" CASCADE')
    e = ei.value
    msg = e.diag.message_primary or ""
    assert e.pgcode == sqlstate, f"{e.pgcode}: {e.pgerror}"
    assert fragment.lower() in msg.lower(), msg
    assert not msg.endswith(".") and msg[:1] == msg[:1].lower(), msg
    assert e.pgcode != "XX000"
    assert relations(admin) == rel
    assert catalog_counts(admin) == cat
    assert worker_sessions_gone(admin)
    assert not os.path.exists(MARK_FILE)
    assert q(admin, "SELECT count(*) FROM pg_class WHERE relname = %s", (MARK,)) == [(0,)]
    assert q(hconn, "SELECT to_regclass('h.raw') IS NOT NULL") == [(True,)]


def test_case_count():
    """The suite covers every SQL entry point with many cases (at least 40 in all)."""
    fns = {c.values[0].split("(")[0].split()[-1] for c in CASES}
    assert fns == {"training_preprocessor_dl", "validation_preprocessor_dl", "load_keras_model",
                   "delete_keras_model", "load_model_selection_table", "generate_model_configs",
                   "madlib_keras_fit_multiple_model", "madlib_keras_fit",
                   "madlib_keras_evaluate", "madlib_keras_predict",
                   "madlib_keras_predict_byom"}
    assert len(CASES) >= 40


def test_large_values_are_bounded(hconn, admin):
    """Values that are huge but harmless are bounded, not refused: a buffer_size above the
    row count gives one buffer per partition, a top-k above the class count every class."""
    try:
        q(hconn, TP, tp(out="big_buf", buf=MAXINT))
        assert q(hconn, "SELECT buffer_size, num_rows FROM big_buf_summary") == [(40, 40)]
        assert q(hconn, "SELECT count(*) FROM big_buf") == [(1,)]
        q(hconn, PRED, pr(out="big_k", pt=str(MAXINT + 1)))
        assert q(hconn, "SELECT count(*), max(rank) FROM big_k") == [(120, 3)]
    finally:
        q(hconn, "DROP TABLE IF EXISTS big_buf, big_buf_summary, big_k")
