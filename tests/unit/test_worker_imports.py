"""A worker imports TensorFlow without the packages Keras would import only to support
them (worker._without, worker.UNUSED_BY_WORKERS), the garbage collector paused meanwhile
(worker._collector_paused)."""
from __future__ import annotations

import gc
import importlib
import sys

import pytest

from cerebro_db import worker


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A package on sys.path that nothing has imported yet."""
    pkg = tmp_path / "cerebro_probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("VALUE = 7\n")
    (pkg / "sub.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "cerebro_probe_pkg"
    for name in [m for m in sys.modules if m.startswith("cerebro_probe_pkg")]:
        del sys.modules[name]


def test_named_packages_are_absent_inside_the_block_only(probe):
    before = list(sys.meta_path)
    with worker._without((probe,)):
        with pytest.raises(ModuleNotFoundError) as e:
            importlib.import_module(probe)
        assert e.value.name == probe
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(probe + ".sub")
        # what the block does not name imports as usual
        assert importlib.import_module("json").dumps(1) == "1"
    assert sys.meta_path == before
    assert importlib.import_module(probe).VALUE == 7
    assert importlib.import_module(probe + ".sub").X == 1


def test_the_finder_is_removed_when_the_block_raises(probe):
    before = list(sys.meta_path)
    with pytest.raises(RuntimeError), worker._without((probe,)):
        raise RuntimeError("boom")
    assert sys.meta_path == before
    assert importlib.import_module(probe).VALUE == 7


def test_a_package_already_imported_stays_usable(probe):
    mod = importlib.import_module(probe)
    with worker._without((probe,)):
        assert importlib.import_module(probe) is mod


@pytest.fixture
def collector():
    """The garbage collector as the test found it, restored afterwards (a test that freezes
    unfreezes)."""
    was_on = gc.isenabled()
    yield
    gc.unfreeze()
    if was_on:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.parametrize("freeze", [False, True])
def test_the_collector_is_off_in_the_block_and_on_again_after_it(collector, freeze):
    gc.enable()
    gc.unfreeze()
    with worker._collector_paused(freeze):
        assert not gc.isenabled()
        made = [[i] for i in range(1000)]  # objects that exist when the block ends
    assert gc.isenabled()
    assert (gc.get_freeze_count() >= len(made)) is freeze


def test_a_collector_that_was_off_stays_off_and_a_failure_restores_it(collector):
    gc.disable()
    with worker._collector_paused(False):
        pass
    assert not gc.isenabled()
    gc.enable()
    with pytest.raises(RuntimeError), worker._collector_paused(False):
        raise RuntimeError("boom")
    assert gc.isenabled()


@pytest.mark.parametrize("given, used", [(10**6, "cores"), (0, 1), (-5, 1), (1, 1), (None, None)])
def test_the_thread_count_stays_within_the_machines_cores(monkeypatch, given, used):
    """worker_threads is caller data (a fit row's options, a check's spec); TensorFlow
    aborts the process when it cannot create a pool's thread, and the postmaster then
    restarts every session (a red-team pass, with 1,000). _runtime keeps it in
    1 .. cores."""
    import os

    from cerebro_db import training

    seen = []
    monkeypatch.setattr(training, "configure_runtime", lambda threads: seen.append(threads))
    monkeypatch.setattr(worker, "_runtime_done", False)
    worker._runtime(given)
    assert seen == [os.cpu_count() if used == "cores" else used]


@pytest.mark.parametrize("given", ["1000", 2.5, True, [4]])
def test_a_thread_count_that_is_not_an_integer_is_refused(monkeypatch, given):
    from cerebro_db.errors import CerebroError

    monkeypatch.setattr(worker, "_runtime_done", False)
    with pytest.raises(CerebroError) as e:
        worker._runtime(given)
    assert e.value.sqlstate == "22023"


@pytest.mark.parametrize("budget, workers, used", [
    (10**15, 2, "memory/2"), (10**15, 10**9, "memory/65536"), (-5, 1, 0), (1 << 20, 2, 1 << 20),
    ("1TB", 2, "default/2"), (True, 1, "default/1"), (None, None, "default/1"),
    (2.5, 4, "default/4")])
def test_a_fits_cache_budget_stays_within_the_machines_memory(monkeypatch, budget, workers,
                                                              used):
    """cache_memory is a fit row's option, which its role may edit: a budget past the
    memory gets a backend killed and the server restarts every session (a red-team pass).
    The worker keeps it within the memory over the workers; what is not a whole number
    gets the default budget."""
    monkeypatch.setattr(worker, "physical_memory", lambda: 1 << 34)
    kind, _, n = str(used).partition("/")
    want = {"memory": (1 << 34) // int(n or 1),
            "default": (1 << 34) // (2 * int(n or 1))}.get(kind, used)
    assert worker._budget({"cache_memory": budget, "num_workers": workers}) == want
