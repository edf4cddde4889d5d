"""Custom loss and metric functions the MADlib way, without unpickling:
``load_top_k_accuracy_function`` natively, ``load_custom_function`` with a reference to a
function in a module installed in the server's environment (allowed by a superuser), used
by name in compile_params by fit, fit_multiple, evaluate and AutoML. Pickled bytes and
modules the DBA did not allow are refused before anything is imported or trained."""
from __future__ import annotations

import shutil
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
import pytest

from ..helpers import ROOT, error_of, q

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

PACKAGES = ("cerebro_compat_fns", "cerebro_compat_evil")
MARKER = Path(tempfile.gettempdir()) / "cerebro_compat_evil_imported"
OBJ = "test_custom_function_table"
REF_OBJ = "cf_refusals"


@pytest.fixture(scope="module")
def fns(madlib_conn):
    """The test package installed where the server imports from (the venv's
    site-packages), allowed for every role; removed afterwards."""
    site = Path(sysconfig.get_paths()["purelib"])
    for pkg in PACKAGES:
        shutil.copytree(ROOT / "tests" / "fixtures" / "custom_functions" / pkg, site / pkg,
                        dirs_exist_ok=True)
    MARKER.unlink(missing_ok=True)
    q(madlib_conn, "INSERT INTO madlib.custom_function_modules (module) "
                   "VALUES ('cerebro_compat_fns')")
    try:
        yield madlib_conn
    finally:
        for pkg in PACKAGES:
            shutil.rmtree(site / pkg, ignore_errors=True)
        q(madlib_conn, "DELETE FROM madlib.custom_function_modules")
        assert not MARKER.exists(), "the disallowed module was imported"


def test_top_k_and_references_are_registered_like_madlib(fns):
    c = fns
    q(c, "SELECT madlib.load_top_k_accuracy_function(%s, 3)", (OBJ,))
    q(c, "SELECT madlib.load_custom_function(%s, 'cerebro_compat_fns:scaled_mse', "
         "'scaled_mse', 'twice the mse')", (OBJ,))
    q(c, "SELECT madlib.load_custom_function(%s, 'cerebro_compat_fns:mean_max_prob', "
         "'my_metric')", (OBJ,))
    q(c, "SELECT madlib.load_custom_function(%s, "
         "'cerebro_compat_fns:weighted_ce(weight=0.5)', 'half_ce', 'bound argument')", (OBJ,))
    rows = q(c, f"SELECT id, name, description, object IS NULL, reference FROM madlib.{OBJ} "
                "ORDER BY id")
    assert rows == [
        (1, "top_3_accuracy", "returns top_3_accuracy", True, "builtin:top_k_accuracy(k=3)"),
        (2, "scaled_mse", "twice the mse", True, "cerebro_compat_fns:scaled_mse"),
        (3, "my_metric", None, True, "cerebro_compat_fns:mean_max_prob"),
        (4, "half_ce", "bound argument", True, "cerebro_compat_fns:weighted_ce(weight=0.5)")]
    e = error_of(c, "SELECT madlib.load_top_k_accuracy_function(%s, 3)", (OBJ,))
    assert "Function 'top_3_accuracy' already exists" in e.pgerror
    e = error_of(c, "SELECT madlib.load_top_k_accuracy_function(%s, 0)", (OBJ,))
    assert "k has to be a positive integer" in e.pgerror and e.pgcode == "22023"
    e = error_of(c, "SELECT madlib.load_custom_function(%s, 'cerebro_compat_fns:nope', 'x')",
                 (OBJ,))
    assert "is not a callable object" in e.pgerror and e.pgcode == "22023"


def test_fit_multiple_and_evaluate_use_custom_functions_by_name(fns):
    c = fns
    q(c, "SELECT madlib.load_model_selection_table('model_arch_library', 'cf_mst', ARRAY[1], "
         "ARRAY[$$loss='scaled_mse', optimizer='Adam(lr=0.01)', "
         "metrics=['top_3_accuracy', 'my_metric']$$, $$loss='half_ce', optimizer='Adam', "
         "metrics=['top_3_accuracy']$$], ARRAY['batch_size=8, epochs=1'], %s)", (OBJ,))
    assert q(c, "SELECT object_table FROM cf_mst_summary") == [(f"madlib.{OBJ}",)]
    q(c, "SELECT madlib.madlib_keras_fit_multiple_model('iris_packed', 'cf_out', 'cf_mst', 2, "
         "FALSE, 'iris_val', 1, FALSE, NULL, NULL, TRUE, 'mop', NULL, 3)")
    info = q(c, "SELECT mst_key, metrics_type, loss_type, training_metrics_final, "
                "training_metrics_all, validation_loss_final FROM cf_out_info ORDER BY 1")
    assert [r[1:3] for r in info] == [(["top_3_accuracy", "my_metric"], "scaled_mse"),
                                      (["top_3_accuracy"], "half_ce")]
    # top-3 accuracy over 3 classes is always 1; the mean highest probability is >= 1/3
    assert info[0][3] == pytest.approx(1.0) and info[1][3] == pytest.approx(1.0)
    assert 1 / 3 - 1e-6 <= info[0][4][-1][1] <= 1.0
    assert q(c, "SELECT object_table FROM cf_out_summary") == [(f"madlib.{OBJ}",)]
    # evaluate reads the object table from the model's summary; its loss is 2 x mse
    q(c, "SELECT madlib.madlib_keras_evaluate('cf_out', 'iris_val', 'cf_eval', NULL, 1)")
    loss, metric, mtype = q(c, "SELECT loss, metric, metrics_type FROM cf_eval")[0]
    assert mtype == ["top_3_accuracy", "my_metric"] and metric == pytest.approx(1.0)
    assert loss == pytest.approx(info[0][5], rel=1e-5)
    assert loss == pytest.approx(_local_scaled_mse(c), rel=1e-4)


def _local_scaled_mse(c) -> float:
    """2 x mse of cf_out's mst_key 1 over iris_val, computed here with Keras."""
    import keras

    from cerebro_db import training

    arch, w = q(c, "SELECT model_arch::text, model_weights FROM cf_out WHERE mst_key = 1")[0]
    model = keras.models.model_from_json(arch)
    flat = np.frombuffer(bytes(w), "<f4")
    at, ws = 0, []
    for v in model.weights:
        n = int(np.prod(v.shape))
        ws.append(flat[at:at + n].reshape(v.shape))
        at += n
    model.set_weights(ws)
    xs, ys = [], []
    for xb, xsh, yb, ysh in q(c, "SELECT attributes, attributes_shape, class_text, "
                                 "class_text_shape FROM iris_val"):
        x, y = training.decode_buffer(bytes(xb), xsh, bytes(yb), ysh)
        xs.append(x)
        ys.append(y)
    x, y = np.concatenate(xs), np.concatenate(ys).astype("float32")
    p = model.predict(x, verbose=0)
    return float(np.mean(2.0 * np.mean((y - p) ** 2, axis=-1)))


def test_madlib_keras_fit_and_automl_with_object_table(fns):
    c = fns
    q(c, "SELECT madlib.madlib_keras_fit('iris_packed', 'cf_single', 'model_arch_library', 1, "
         "$$loss='categorical_crossentropy', optimizer='SGD(lr=0.1)', "
         "metrics=['top_3_accuracy']$$, 'batch_size=8', 1, FALSE, NULL, NULL, NULL, NULL, NULL, "
         "%s)", (OBJ,))
    assert q(c, "SELECT object_table, metrics_type, training_metrics_final FROM "
                "cf_single_summary") == [(f"madlib.{OBJ}", ["top_3_accuracy"], 1.0)]
    q(c, "SELECT madlib.madlib_keras_automl('iris_packed', 'cf_auto', 'model_arch_library', "
         "'cf_auto_mst', ARRAY[1], $${'loss': ['scaled_mse', 'categorical_crossentropy'], "
         "'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.01]}], "
         "'metrics': [['my_metric']]}$$, $${'batch_size': [8]}$$, 'grid', "
         "'num_iterations=1', 1, %s)", (OBJ,))
    rows = q(c, "SELECT loss_type, metrics_type, training_metrics_final FROM cf_auto_info "
                "ORDER BY 1")
    assert [r[:2] for r in rows] == [("categorical_crossentropy", ["my_metric"]),
                                     ("scaled_mse", ["my_metric"])]
    assert all(1 / 3 - 1e-6 <= r[2] <= 1.0 for r in rows)
    assert q(c, "SELECT object_table FROM cf_auto_summary") == [(f"madlib.{OBJ}",)]
    assert q(c, "SELECT object_table FROM cf_auto_mst_summary") == [(f"madlib.{OBJ}",)]


def test_pickles_and_disallowed_modules_are_refused_before_any_work(fns):
    c = fns
    q(c, "SELECT madlib.load_top_k_accuracy_function(%s, 3)", (REF_OBJ,))
    e = error_of(c, "SELECT madlib.load_custom_function(%s, %s, 'focal')",
                 (REF_OBJ, psycopg2.Binary(b"\x80\x04\x95 dill bytes")))
    assert e.pgcode == "0A000" and "never unpickles" in e.pgerror
    assert "load_custom_function('cf_refusals', 'mypkg.module:function'" in \
        e.diag.message_hint
    for ref in ("os:system", "cerebro_compat_evil:f", "subprocess:run"):
        e = error_of(c, "SELECT madlib.load_custom_function(%s, %s, 'bad')", (REF_OBJ, ref))
        assert e.pgcode == "42501" and "is not allowed for custom functions" in e.pgerror
        assert "custom_function_modules" in e.diag.message_hint
    for ref, words in (("cerebro_compat_fns", "module.path:name"),
                       ("cerebro_compat_fns:scaled_mse(1)", "keyword arguments only"),
                       ("cerebro_compat_fns:__import__", "private"),
                       ("cerebro_compat_fns:x.y", "name an object")):
        e = error_of(c, "SELECT madlib.load_custom_function(%s, %s, 'bad')", (REF_OBJ, ref))
        assert e.pgcode == "22023" and words in e.pgerror, (ref, e.pgerror)
    # rows written into the object table by other means: checked again when used
    q(c, f"INSERT INTO madlib.{REF_OBJ} (name, reference) VALUES "
         "('evil_loss', 'cerebro_compat_evil:f')")
    q(c, f"INSERT INTO madlib.{REF_OBJ} (name, object) VALUES ('dill_loss', '\\x8004'::bytea)")
    for loss, code, words in (("evil_loss", "42501", "is not allowed"),
                              ("dill_loss", "0A000", "is a pickled Python object")):
        e = error_of(c, "SELECT madlib.madlib_keras_fit('iris_packed', 'cf_bad', "
                        "'model_arch_library', 1, %s, 'batch_size=8', 1, FALSE, NULL, NULL, "
                        "NULL, NULL, NULL, %s)",
                     (f"loss='{loss}', optimizer='Adam'", REF_OBJ))
        assert e.pgcode == code and words in e.pgerror, e.pgerror
        assert q(c, "SELECT to_regclass('cf_bad'), to_regclass('cf_bad_summary')") == \
            [(None, None)]
    assert not MARKER.exists()
    # only superusers may allow modules
    q(c, "DROP ROLE IF EXISTS cf_plain; CREATE ROLE cf_plain")
    try:
        q(c, "SET ROLE cf_plain")
        e = error_of(c, "INSERT INTO madlib.custom_function_modules (module) VALUES ('os')")
        assert e.pgcode == "42501"
        assert q(c, "SELECT count(*) FROM madlib.custom_function_modules") == [(1,)]
    finally:
        q(c, "RESET ROLE; DROP ROLE cf_plain")
    # a grant to another role does not allow the module for this one
    q(c, "DELETE FROM madlib.custom_function_modules; DROP ROLE IF EXISTS cf_other; "
         "DO $$BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'cf_user') THEN "
         "DROP OWNED BY cf_user; DROP ROLE cf_user; END IF; END$$; CREATE ROLE cf_other; INSERT INTO madlib.custom_function_modules (module, grantee) "
         "VALUES ('cerebro_compat_fns', 'cf_other')")
    try:
        q(c, "CREATE ROLE cf_user; GRANT USAGE ON SCHEMA madlib TO cf_user; SET ROLE cf_user")
        e = error_of(c, "SELECT madlib.load_custom_function('public.cf_objs', "
                        "'cerebro_compat_fns:scaled_mse', 'x')")
        assert e.pgcode == "42501"
    finally:
        q(c, "RESET ROLE; DROP OWNED BY cf_user; DROP ROLE cf_user; "
             "DELETE FROM madlib.custom_function_modules; "
             "DROP ROLE cf_other; INSERT INTO madlib.custom_function_modules (module) "
             "VALUES ('cerebro_compat_fns')")
    e = error_of(c, "SELECT madlib.madlib_keras_fit('iris_packed', 'cf_bad', "
                    "'model_arch_library', 1, $$loss='focal', optimizer='Adam'$$, "
                    "'batch_size=8', 1)")
    assert e.pgcode == "22023" and "unknown loss 'focal'" in e.pgerror


def test_delete_custom_function_drops_the_empty_table(fns):
    c = fns
    q(c, "SELECT madlib.load_top_k_accuracy_function('cf_del', 2)")
    q(c, "SELECT madlib.load_top_k_accuracy_function('cf_del', 4)")
    q(c, "SELECT madlib.delete_custom_function('cf_del', 'top_2_accuracy')")
    assert q(c, "SELECT name FROM madlib.cf_del") == [("top_4_accuracy",)]
    e = error_of(c, "SELECT madlib.delete_custom_function('cf_del', 99)")
    assert "not found" in e.pgerror
    q(c, "SELECT madlib.delete_custom_function('cf_del', 2)")
    assert q(c, "SELECT to_regclass('madlib.cf_del')") == [(None,)]
    assert "load_custom_function" in q(c, "SELECT madlib.load_custom_function('usage')")[0][0]


def test_a_granted_role_registers_and_trains_with_its_module(fns):
    """A role that is not a superuser, granted the module, registers a reference in its own
    object table and trains with it (its worker sessions check the grant as that role)."""
    c = fns
    q(c, "DO $$BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'cf_granted') THEN "
         "DROP OWNED BY cf_granted; DROP ROLE cf_granted; END IF; END$$; "
         "CREATE ROLE cf_granted LOGIN; GRANT USAGE ON SCHEMA madlib TO cf_granted; "
         "GRANT CREATE ON SCHEMA public TO cf_granted; "
         "GRANT SELECT ON iris_packed, iris_packed_summary, model_arch_library TO cf_granted; "
         "INSERT INTO madlib.custom_function_modules (module, grantee) "
         "VALUES ('cerebro_compat_fns.sub', 'cf_granted')")
    try:
        q(c, "SET ROLE cf_granted")
        e = error_of(c, "SELECT madlib.load_custom_function('public.cf_mine', "
                        "'cerebro_compat_evil:f', 'evil')")
        assert e.pgcode == "42501"
        q(c, "SELECT madlib.load_custom_function('public.cf_mine', "
             "'cerebro_compat_fns:scaled_mse', 'my_loss')")  # the package grant is 'public'
        q(c, "SELECT madlib.madlib_keras_fit('iris_packed', 'public.cf_granted_out', "
             "'model_arch_library', 1, $$loss='my_loss', optimizer='Adam'$$, 'batch_size=8', 1, "
             "FALSE, NULL, NULL, NULL, NULL, NULL, 'public.cf_mine')")
        assert q(c, "SELECT loss_type, object_table, training_loss_final > 0 "
                    "FROM public.cf_granted_out_summary") == [("my_loss", "public.cf_mine", True)]
    finally:
        q(c, "RESET ROLE; DROP TABLE IF EXISTS public.cf_mine, public.cf_granted_out, "
             "public.cf_granted_out_summary; DELETE FROM madlib.custom_function_modules "
             "WHERE grantee = 'cf_granted'; DROP OWNED BY cf_granted; DROP ROLE cf_granted")
    assert not MARKER.exists()
