"""The Ray engine (cerebro_db.remote.ray_engine.RayEngine) against a real local Ray cluster,
with calls of the test's own (tests/remote/ray_calls) instead of units: one long-lived actor
per slot keeping its module state, a killed actor's call raising WorkerLost and a new actor
for the slot, close releasing every actor; and the default executor never importing ray."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cerebro_db.errors import CerebroError
from cerebro_db.remote.engine import EngineUnavailable, WorkerLost

pytest.importorskip("ray")

from cerebro_db.remote.ray_engine import RayEngine


def wait_done(engine, worker: int, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not engine.done(worker):
        assert time.monotonic() < end, f"worker {worker}'s call did not finish"
        time.sleep(0.02)


def wait_until(pred, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.2)


def test_default_executor_does_not_import_ray():
    code = ("import sys, cerebro_db.executors, cerebro_db.remote, cerebro_db.remote.engine, "
            "cerebro_db.remote.unit, cerebro_db.entrypoints.training; "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


def test_actor_per_slot_keeps_state_and_close_releases(ray_cluster):
    engine = RayEngine(ray_cluster.client_address, entry="ray_test_calls:echo")
    try:
        engine.start_worker(0)
        engine.start_worker(1)
        pids = {engine.pid(0), engine.pid(1)}
        assert None not in pids and len(pids) == 2
        assert sorted(pids) == ray_cluster.worker_pids()
        for n in range(3):
            for w in (0, 1):
                engine.submit(w, {"n": n, "worker": w})
            for w in (0, 1):
                wait_done(engine, w)
                res = engine.result(w)
                # the same process answers every call of its slot, module state kept
                assert res == {"ok": True, "call": {"n": n, "worker": w},
                               "pid": engine.pid(w), "calls": n + 1}
        assert engine.done(0)  # nothing in flight
        # the cluster's 2 CPUs are taken: a third slot is refused, not left pending
        t0 = time.monotonic()
        with pytest.raises(EngineUnavailable, match="no free CPU for worker 2"):
            engine.start_worker(2)
        assert time.monotonic() - t0 < 30
        assert engine.pid(2) is None and len(ray_cluster.worker_pids()) == 2
    finally:
        engine.close()
    wait_until(lambda: ray_cluster.worker_pids() == [])
    engine.close()  # twice is fine


def test_killed_actor_is_lost_and_replaced(ray_cluster):
    engine = RayEngine(ray_cluster.client_address, entry="ray_test_calls:nap")
    try:
        engine.start_worker(0)
        old = engine.pid(0)
        engine.submit(0, {"n": 1, "seconds": 30})
        time.sleep(1.0)
        assert not engine.done(0)
        os.kill(old, signal.SIGKILL)
        wait_done(engine, 0, timeout=30)
        with pytest.raises(WorkerLost, match="worker 0"):
            engine.result(0)
        engine.start_worker(0)
        assert engine.pid(0) not in (None, old)
        engine.submit(0, {"n": 2, "seconds": 0})
        wait_done(engine, 0)
        assert engine.result(0)["calls"] == 1  # a fresh process
    finally:
        engine.close()
    wait_until(lambda: ray_cluster.worker_pids() == [])


def test_call_that_raises_is_a_failed_result(ray_cluster):
    engine = RayEngine(ray_cluster.client_address, entry="ray_test_calls:boom")
    try:
        engine.start_worker(0)
        engine.submit(0, {"n": 7})
        wait_done(engine, 0)
        res = engine.result(0)
        assert res["ok"] is False and res["sqlstate"] == "XX000"
        assert "ValueError: boom 7" in res["message"]
        pid = engine.pid(0)
        engine.stop_worker(0)
        wait_until(lambda: pid not in ray_cluster.worker_pids())
    finally:
        engine.close()


@pytest.mark.slow
def test_unreachable_cluster_is_a_clear_error():
    """Ray Client gives up after its connection timeout (about 30 s)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(CerebroError) as e:
        RayEngine(f"ray://127.0.0.1:{port}")
    assert e.value.sqlstate == "08001"
    assert f"could not connect to the Ray cluster at ray://127.0.0.1:{port}" in e.value.message
    assert e.value.hint
    # and no Ray call in this process starts a local cluster (Ray's auto-init: a backend
    # started one, as the server's OS user, after the cluster was stopped mid-fit)
    import ray
    try:
        with pytest.raises(Exception, match="ray.init"):
            ray.available_resources()
        assert not ray.is_initialized()
    finally:
        if ray.is_initialized():
            ray.shutdown()
