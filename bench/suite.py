"""The benchmark suite: cerebro_db side by side with its peers, in one run on this machine.

    python bench/suite.py [--scale tiny|default|large] [--only fashion-mnist,adult,...]
                          [--skip ray,averaging,...]

For each workload of the scale (bench/workloads.py) it runs, on the same arrays and the same
configurations:

  mop          cerebro_db madlib_keras_fit_multiple_model, policy 'mop' (randomized), p = 2,
               use_caching (left at its default, NULL, on the realistic workloads),
               validation every epoch
  ring         the same with policy 'ring' (MADlib's rotation, a barrier per hop)
  ring_reset   'ring' with policy_params 'reset_optimizer_per_hop=True' (MADlib drops the
               optimizer state at every hop)
  mop_warm     a second 'mop' fit in the same session right after the first: its worker
               sessions are kept from that fit (no TensorFlow import)
  sequential   Keras, one process, the configurations one after another at its best: on the
               first workload 1 and 2 TensorFlow threads are measured on numpy input, then
               tf.data pipelines made once with steps_per_execution covering a pass
               (keras_runner.py --pipeline dataset, Keras at its fastest) at the
               better thread count; the fastest pipeline is kept for every later workload,
               and on every workload it is measured at both thread counts with
               TensorFlow's oneDNN kernels off (its default here) and on (cerebro_db's);
               each run evaluates at the batch size it measured fastest for each
               architecture before its clock starts (keras_runner.eval_batches)
  cold_pairs   rounds of a cold 'mop' fit and sequential Keras at its best setting,
               alternating which runs first (the realistic workloads): cold / sequential
               paired by round
  keras_split  p concurrent Keras processes with sequential's pipeline and kernels and the
               cores shared out (cores / p threads each), each training every
               configuration on 1/p of the rows: the machine's limit for data-parallel work
  units_one_process  cerebro_db's own unit code (cerebro_db.training), every
               configuration one after another on all rows in one process, no database
  units_split  p concurrent processes of that unit code (cores / p threads each), each
               on 1/p of the rows: the limit of data-parallel work with our own kernels,
               what a fit over p workers would take with no database, no start-up and no
               scheduling at all
  ray          Ray Tune, 2 concurrent trials, each with its own copy of the data

plus model averaging (MADlib's madlib_keras_fit) against sequential SGD for one
configuration. While a system runs, the resident memory of its processes is sampled with
psutil (cerebro_db: the coordinator backend and the worker backends found in
pg_stat_activity; the others: the subprocess and its children). Fits run in their own
session, which does nothing else, so the coordinator's memory is the fit's alone; every fit
but mop_warm starts cold (``cerebro_db_close_workers()`` first), and the time from the call
to the first unit's start is recorded (``first_unit_s``). Raw results go to
bench/results/results.json; bench/report.py turns them into bench/RESULTS.md and the figures.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common import connect
from workloads import SCALES, Workload, workloads

RESULTS = ROOT / "bench" / "results"
P = 2  # partitions = worker sessions


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def q(conn, sql: str, args: Any = None) -> list[tuple] | None:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


# --------------------------------------------------------------------------- memory


class Sampler(threading.Thread):
    """Samples the resident memory of the processes ``pids()`` returns ({pid: label}) every
    ``interval`` seconds; keeps each process's peak and the peak of their sum."""

    def __init__(self, pids: Callable[[], dict[int, str]], interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pids, self.interval = pids, interval
        self.peak: dict[int, int] = {}
        self.private: dict[int, int] = {}
        self.label: dict[int, str] = {}
        self.peak_total = 0
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        import psutil

        while not self._halt.is_set():
            try:
                found = self.pids()
            except Exception:  # noqa: BLE001 - a process or session went away mid-sample
                found = {}
            total = 0
            for pid, label in found.items():
                try:
                    rss = psutil.Process(pid).memory_info().rss
                except psutil.Error:
                    continue
                total += rss
                self.peak[pid] = max(self.peak.get(pid, 0), rss)
                self.private[pid] = max(self.private.get(pid, 0), private_memory(pid))
                self.label[pid] = label
            self.peak_total = max(self.peak_total, total)
            self.samples += 1
            self._halt.wait(self.interval)

    def stop(self) -> dict[str, Any]:
        """Stop and return {'total': peak of the sum, 'procs': [[label, peak], ...],
        'private': [[label, peak private memory], ...]}."""
        self._halt.set()
        self.join()
        procs = sorted(([self.label[p], v] for p, v in self.peak.items()), key=lambda r: r[0])
        private = sorted(([self.label[p], v] for p, v in self.private.items()),
                         key=lambda r: r[0])
        return {"total": self.peak_total, "procs": procs, "private": private,
                "samples": self.samples}


def cpu_steal() -> float:
    """CPU seconds the hypervisor gave to others so far, all CPUs together (``steal`` of
    /proc/stat; 0 where it is not reported): on a VM, what a fit's units lost to other
    guests, one of the reasons the same units run at different speeds from fit to fit."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return 0.0
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a local process has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def private_memory(pid: int) -> int:
    """``RssAnon`` of ``/proc/<pid>/status`` in bytes: the process's own memory, without the
    shared memory (a PostgreSQL backend's RSS also counts every page of the server's shared
    buffers it touched, which grows with the tables it read or wrote, not with its own
    needs); 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def tree_pids(root_pid: int) -> Callable[[], dict[int, str]]:
    """{pid: label} of a process and its descendants (Ray workers labelled 'worker')."""
    import psutil

    def f() -> dict[int, str]:
        root = psutil.Process(root_pid)
        out = {root_pid: "main"}
        for c in root.children(recursive=True):
            try:
                cmd = " ".join(c.cmdline())
            except psutil.Error:
                continue
            if "default_worker.py" in cmd or cmd.startswith("ray::") or c.name().startswith(
                    "ray::"):
                out[c.pid] = "worker"
            else:
                out[c.pid] = c.name()
        return out

    return f


# --------------------------------------------------------------------------- subprocesses


def run_sub(args: list[str]) -> tuple[dict, dict]:
    """Run a runner script, sampling its process tree; (its JSON output, memory)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "bench")]))
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=err,
                                text=True, env=env, cwd=str(ROOT))
        s = Sampler(tree_pids(proc.pid))
        s.start()
        out, _ = proc.communicate()
        mem = s.stop()
        if proc.returncode:
            err.seek(0)
            raise RuntimeError(f"{' '.join(args)} failed:\n{err.read()[-4000:]}")
    return json.loads(out.strip().splitlines()[-1]), mem


def run_concurrent(arg_lists: list[list[str]]) -> tuple[list[dict], dict, float]:
    """Run runner scripts side by side, sampling all their process trees; (their JSON
    outputs, memory, wall seconds until the last one ended)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "bench")]))
    with contextlib.ExitStack() as stack:
        errs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in arg_lists]
        return _run_concurrent(arg_lists, env, errs)


def _run_concurrent(arg_lists: list[list[str]], env: dict[str, str],
                    errs: list[Any]) -> tuple[list[dict], dict, float]:
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=e,
                              text=True, env=env, cwd=str(ROOT))
             for args, e in zip(arg_lists, errs)]
    trees = [tree_pids(pr.pid) for pr in procs]

    def all_pids() -> dict[int, str]:
        out: dict[int, str] = {}
        for i, f in enumerate(trees):
            try:
                out.update({pid: f"{label} {i}" for pid, label in f().items()})
            except Exception:  # noqa: BLE001, S112 - that process already ended
                continue
        return out

    s = Sampler(all_pids)
    s.start()
    outs = [pr.communicate()[0] for pr in procs]
    wall = time.perf_counter() - t0
    mem = s.stop()
    for pr, e, args in zip(procs, errs, arg_lists):
        if pr.returncode:
            e.seek(0)
            raise RuntimeError(f"{' '.join(args)} failed:\n{e.read()[-4000:]}")
    return [json.loads(o.strip().splitlines()[-1]) for o in outs], mem, wall


# --------------------------------------------------------------------------- cerebro_db


# --------------------------------------------------------------------------- waits


WAIT_INTERVAL = 0.005
"""Seconds between two samples of what the worker sessions wait on (the sampled fit only)."""
WAIT_CLASSES = ("running", "WAL", "data files", "locks", "other waits", "between statements")


def wait_class(state: str | None, kind: str | None, event: str | None) -> str:
    """The class of one worker session's ``pg_stat_activity`` sample: running (in a
    statement, no wait event: training, evaluating, or the worker's own Python), WAL (writing
    or flushing WAL: a state's records, a commit's flush, a buffer evicted ahead of its WAL),
    data files (reading, writing, extending relations), locks (heavyweight locks and buffer
    locks), other waits, between statements (idle: its statement ended, the next not there)."""
    if state != "active":
        return "between statements"
    if kind is None:
        return "running"
    if kind in ("IO", "LWLock") and event and event.startswith("WAL"):
        return "WAL"
    if kind == "IO":
        return "data files"
    if kind in ("Lock", "LWLock"):
        return "locks"
    return "other waits"


class WaitSampler(threading.Thread):
    """Counts, every :data:`WAIT_INTERVAL` seconds, what each worker session of the fit
    (``pg_stat_activity``: application names '... worker N') is doing, by
    :func:`wait_class`, over its own connection. Sampling costs CPU, so it runs in one extra
    fit per workload whose times are not reported (its ``units`` are)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.counts: dict[str, int] = dict.fromkeys(WAIT_CLASSES, 0)
        self.events: dict[str, int] = {}
        self._halt = threading.Event()
        self.conn = connect()

    def run(self) -> None:
        sql = ("SELECT state, wait_event_type, wait_event FROM pg_catalog.pg_stat_activity "
               "WHERE application_name ~ ' worker [0-9]+$'")
        while not self._halt.is_set():
            for state, kind, event in q(self.conn, sql) or []:
                c = wait_class(state, kind, event)
                self.counts[c] += 1
                if kind is not None and state == "active":
                    self.events[f"{kind}:{event}"] = self.events.get(f"{kind}:{event}", 0) + 1
            self._halt.wait(WAIT_INTERVAL)

    def stop(self) -> dict[str, Any]:
        """Stop; {'counts': {class: samples}, 'events': {type:event: samples}}."""
        self._halt.set()
        self.join()
        self.conn.close()
        return {"counts": self.counts, "events": self.events}


class Db:
    """The workload's tables in the benchmark database and the cerebro_db runs on them."""

    def __init__(self, conn, w: Workload) -> None:
        self.conn, self.w = conn, w
        self.t = "bench_" + w.name.replace("-", "_")
        self.fit_conn = connect()  # fits only: its backend's memory is the coordinator's
        self.backend_pid = q(self.fit_conn, "SELECT pg_backend_pid()")[0][0]
        self.fit_ids: list[int] = []

    def load(self) -> float:
        """Load the arrays, pack them (p = 2); returns the preprocessing seconds."""
        from tooling.datasets import copy_payload

        t = self.t
        q(self.conn, f"DROP TABLE IF EXISTS {t}_train, {t}_valid, {t}_p, {t}_p_summary, "
                     f"{t}_v, {t}_v_summary, {t}_arch, {t}_mst, {t}_mst_summary")
        for tab, x, y in ((f"{t}_train", self.w.x, self.w.y), (f"{t}_valid", self.w.vx, self.w.vy)):
            q(self.conn, f"CREATE TABLE {tab} (id integer, y integer, x real[])")
            with self.conn.cursor() as cur:
                cur.copy_expert(f"COPY {tab} FROM STDIN (FORMAT binary)", io.BytesIO(
                    copy_payload(np.arange(len(y)), y.astype(np.int32), x)))
            q(self.conn, f"ANALYZE {tab}")
        t0 = time.perf_counter()
        q(self.conn, f"SELECT training_preprocessor_dl('{t}_train', '{t}_p', 'y', 'x', NULL, 1.0, "
                     f"NULL, NULL, {P}, 1)")
        q(self.conn, f"SELECT validation_preprocessor_dl('{t}_valid', '{t}_v', 'y', 'x', '{t}_p')")
        pre = time.perf_counter() - t0
        archs: list[str] = []
        for c in self.w.configs:
            if c["arch_json"] not in archs:
                archs.append(c["arch_json"])
                q(self.conn, f"SELECT load_keras_model('{t}_arch', %s)", (c["arch_json"],))
        q(self.conn, f"CREATE TABLE {t}_mst (mst_key serial PRIMARY KEY, model_id int, "
                     "compile_params varchar, fit_params varchar)")
        q(self.conn, f"CREATE TABLE {t}_mst_summary AS SELECT '{t}_arch'::varchar AS "
                     "model_arch_table, NULL::varchar AS object_table")
        for c in self.w.configs:
            q(self.conn, f"INSERT INTO {t}_mst (model_id, compile_params, fit_params) VALUES "
                         "(%s, %s, %s)", (archs.index(c["arch_json"]) + 1, c["compile_params"],
                                          c["fit_params"]))
        # the loading's dirty buffers go to disk now, not in a checkpoint spread over the
        # first measured fits. Whether that ever slowed them is not shown: two checks each
        # way (fashion-20k-mlp, policy_check 3 pairs after the warm-up) gave the first two
        # fits' units 17.3 / 18.6 and 16.1 / 15.8 s without it, 15.4 / 16.1 and 17.8 / 16.3 s
        # with it, the later fits 16.2-21.8 s: this VM's fit-to-fit spread
        q(self.conn, "CHECKPOINT")
        return pre

    def _pids(self) -> Callable[[], dict[int, str]]:
        import psycopg2

        mon = connect()

        def f() -> dict[int, str]:
            try:
                rows = q(mon, "SELECT pid, application_name FROM pg_stat_activity "
                              "WHERE application_name LIKE 'cerebro_db % worker %'") or []
            except psycopg2.Error:
                rows = []
            out = {self.backend_pid: "coordinator"}
            for pid, app in rows:
                last = app.rsplit(" ", 1)[-1]
                out[pid] = "control session" if last == "ctl" else f"worker {last}"
            return out

        f.close = mon.close  # type: ignore[attr-defined]
        return f

    def _units(self, fit_id: int) -> list[dict[str, Any]]:
        rows = q(self.conn, """
            SELECT mst_key, epoch, partition, worker, kind,
                   extract(epoch FROM started_at)::float8, extract(epoch FROM ended_at)::float8,
                   rows, loss, metrics, seconds_load, seconds_run, seconds_save, state_bytes,
                   worker_pid
              FROM cerebro_db.units WHERE fit_id = %s ORDER BY started_at""", (fit_id,)) or []
        keys = ("config", "epoch", "partition", "worker", "kind", "start", "end", "rows", "loss",
                "metrics", "load", "run", "save", "state_bytes", "pid")
        return [dict(zip(keys, r)) for r in rows]

    def fit(self, policy: str, params: str | None, epochs: int | None = None,
            warm: bool = False, waits: bool = False) -> dict[str, Any]:
        """One madlib_keras_fit_multiple_model call in the fit session: makespan, memory,
        unit log, seconds from the call to the first unit. Cold (the session's kept worker
        sessions closed first) unless ``warm``; ``waits``: sample what the worker sessions
        wait on (:class:`WaitSampler`, in ``"waits"``)."""
        t, c = self.t, self.fit_conn
        q(c, f"DROP TABLE IF EXISTS {t}_out, {t}_out_info, {t}_out_summary")
        if not warm:
            q(c, "SELECT cerebro_db_close_workers()")
        pids = self._pids()
        s = Sampler(pids)
        s.start()
        ws = WaitSampler() if waits else None
        if ws is not None:
            ws.start()
        called = q(c, "SELECT extract(epoch FROM clock_timestamp())::float8")[0][0]
        stolen, coordinator = cpu_steal(), process_cpu(self.backend_pid)
        t0 = time.perf_counter()
        q(c, f"SELECT madlib_keras_fit_multiple_model('{t}_p', '{t}_out', '{t}_mst', %s, "
             f"FALSE, '{t}_v', 1, FALSE, NULL, NULL, %s, %s, %s, 1)",
          (epochs or self.w.epochs, self.w.use_caching, policy, params))
        wall = time.perf_counter() - t0
        stolen = cpu_steal() - stolen
        coordinator = process_cpu(self.backend_pid) - coordinator
        mem = s.stop()
        sampled = ws.stop() if ws is not None else None
        pids.close()  # type: ignore[attr-defined]
        res = self._result(wall, mem)
        if sampled is not None:
            res["waits"] = sampled
        res["warm"] = warm
        res["steal_s"] = stolen
        res["coordinator_cpu_s"] = coordinator
        res["first_unit_s"] = min((u["start"] for u in res["units"]), default=called) - called
        return res

    def warm_up(self) -> float:
        """One unmeasured fit (mop, 1 epoch) in a session of its own, its worker sessions
        closed after; returns its seconds. In the run of 2026-11-28 the first measured fit
        after a workload's loading (mop, first in the first round) ran its units 4-17% slower
        than the ring's in the same round on 5 of 6 workloads; whether that is a penalty of
        a first fit or this VM's fit-to-fit spread (two identical fits minutes apart: 15%),
        one run cannot tell, and this fit takes whatever penalty there is. The measured
        fits' session is untouched (its first fit stays its first)."""
        t = self.t
        c = connect()
        try:
            q(c, f"DROP TABLE IF EXISTS {t}_warm, {t}_warm_info, {t}_warm_summary")
            t0 = time.perf_counter()
            q(c, f"SELECT madlib_keras_fit_multiple_model('{t}_p', '{t}_warm', '{t}_mst', 1, "
                 f"FALSE, '{t}_v', 1, FALSE, NULL, NULL, %s, 'mop', NULL, 1)",
              (self.w.use_caching,))
            took = time.perf_counter() - t0
            q(c, "SELECT cerebro_db_close_workers()")
            q(c, f"DROP TABLE IF EXISTS {t}_warm, {t}_warm_info, {t}_warm_summary")
            q(c, "DELETE FROM cerebro_db.fits WHERE fit_id = (SELECT max(fit_id) FROM "
                 "cerebro_db.fits)")
        finally:
            c.close()
        return took

    def fit_single(self, index: int, epochs: int) -> dict[str, Any]:
        """madlib_keras_fit of one configuration (sequential SGD over the partitions)."""
        t = self.t
        c = self.w.configs[index]
        q(self.conn, f"DROP TABLE IF EXISTS {t}_one, {t}_one_summary")
        model_id = q(self.conn, f"SELECT model_id FROM {t}_mst WHERE mst_key = %s",
                     (index + 1,))[0][0]
        t0 = time.perf_counter()
        q(self.conn, f"SELECT madlib_keras_fit('{t}_p', '{t}_one', '{t}_arch', %s, %s, %s, %s, "
                     f"FALSE, '{t}_v', 1)", (model_id, c["compile_params"], c["fit_params"],
                                             epochs))
        return self._result(time.perf_counter() - t0, None)

    def _result(self, wall: float, mem: dict | None) -> dict[str, Any]:
        fit_id, started, ended = q(self.conn, """
            SELECT fit_id, extract(epoch FROM started_at)::float8,
                   extract(epoch FROM ended_at)::float8
              FROM cerebro_db.fits ORDER BY fit_id DESC LIMIT 1""")[0]
        self.fit_ids.append(fit_id)
        units = self._units(fit_id)
        return {"makespan": wall, "fit_start": started, "fit_end": ended, "memory": mem,
                "units": units, "curves": curves_from_units(units)}

    def cleanup(self) -> None:
        t = self.t
        try:
            self.fit_conn.close()
        except Exception:  # noqa: BLE001, S110 - closing anyway
            pass
        if self.fit_ids:
            q(self.conn, "DELETE FROM cerebro_db.fits WHERE fit_id = ANY(%s)", (self.fit_ids,))
        q(self.conn, f"DROP TABLE IF EXISTS {t}_train, {t}_valid, {t}_p, {t}_p_summary, {t}_v, "
                     f"{t}_v_summary, {t}_arch, {t}_mst, {t}_mst_summary, {t}_out, {t}_out_info, "
                     f"{t}_out_summary, {t}_one, {t}_one_summary")


def curves_from_units(units: list[dict]) -> list[list[float]]:
    """Validation accuracy per config (mst_key order) per epoch, row-weighted over the
    partitions' eval_valid units (the first metric is accuracy)."""
    acc: dict[tuple[int, int], list[float]] = {}
    for u in units:
        if u["kind"] == "eval_valid" and u["metrics"]:
            a = acc.setdefault((u["config"], u["epoch"]), [0.0, 0.0])
            a[0] += u["metrics"][0] * u["rows"]
            a[1] += u["rows"]
    out: dict[int, list[float]] = {}
    for (c, e), (s, n) in sorted(acc.items()):
        out.setdefault(c, []).append(s / n)
    return [out[c] for c in sorted(out)]


# --------------------------------------------------------------------------- driver


DB_FITS = ("mop", "mop_warm", "ring", "ring_reset")
"""The cerebro_db systems: fits in the benchmark database (:meth:`Db.fit`)."""


def interleaved_fits(db: Db, systems: list[str], repeats: int) -> dict[str, list[dict]]:
    """``repeats`` runs of each cerebro_db system in ``systems``, interleaved (repeat ``i``
    runs them in turn, starting from the ``i``-th), so a drift of the machine over the
    workload (load, caches, frequency) falls on every system alike instead of on whichever
    ran first. ``mop_warm`` runs right after each ``mop`` (a second fit of its session)."""
    calls = {"mop": lambda: db.fit("mop", None),
             "mop_warm": lambda: db.fit("mop", None, warm=True),
             "ring": lambda: db.fit("ring", None),
             "ring_reset": lambda: db.fit("ring", "reset_optimizer_per_hop=True")}
    order = [s for s in systems if s != "mop_warm" or "mop" not in systems]
    runs: dict[str, list[dict]] = {s: [] for s in systems}
    for i in range(repeats):
        for system in order[i % len(order):] + order[:i % len(order)]:
            runs[system].append(calls[system]())
            if system == "mop" and "mop_warm" in systems:
                runs["mop_warm"].append(calls["mop_warm"]())
    return runs


def sequential_runs(w: Workload, data: Path, baseline: dict[str, Any],
                    res: dict[str, Any]) -> list[dict]:
    """Sequential Keras on ``w`` at its best setting (threads, pipeline, oneDNN). The first
    call measures 1 and 2 threads on numpy input, then tf.data at the better thread count,
    with TensorFlow's default kernels (oneDNN on with AVX-512, off on an AVX2-only host), and keeps the fastest
    pipeline in ``baseline["chosen"]``; every call (the first included) then also measures
    that pipeline at each other combination of thread count and oneDNN (off, on), since the
    best ones differ by model (on this 2-core host the MLPs ran fastest on 1 thread without
    oneDNN, the CNNs on 2 threads, and oneDNN halved a CNN's step): once each, and
    ``w.repeats`` times if that one run beat the best median so far. The workload's
    fastest goes to ``res["sequential_chosen"]`` (what the limit uses; our units in one
    process take its thread count) and every setting measured to
    ``res["sequential_settings"]``."""
    by_setting: dict[tuple[int, str, int], list[dict]] = {}

    def measure(th: int, pl: str, dnn: int, times: int) -> None:
        for _ in range(times):
            out, mem = run_sub(keras_sequential(data, th, pl, dnn))
            by_setting.setdefault((th, pl, dnn), []).append(
                {**out, "memory": mem, "curves": [c["curve"] for c in out["configs"]]})

    def median_of(key: tuple[int, str, int]) -> float:
        return statistics.median(r["makespan"] for r in by_setting[key])

    if "chosen" in baseline:
        measure(*baseline["chosen"], 0, w.repeats)
    else:
        for th in (1, 2):
            measure(th, "numpy", 0, w.repeats)
        measure(min(by_setting, key=median_of)[0], "dataset", 0, w.repeats)
        baseline["chosen"] = min(by_setting, key=median_of)[:2]
    th, pl = baseline["chosen"]
    for other in ((3 - th, pl, 0), (th, pl, 1), (3 - th, pl, 1)):
        if other not in by_setting:
            measure(*other, 1)
            if w.repeats > 1 and median_of(other) < min(
                    median_of(k) for k in by_setting if k != other and k[1] == pl):
                measure(*other, w.repeats - 1)
    best = min((k for k in by_setting if k[1] == pl), key=median_of)
    res["sequential_chosen"] = list(best)
    res["sequential_settings"] = [
        {"threads": t, "pipeline": p, "onednn": bool(d), "makespan": median_of((t, p, d)),
         "runs": len(v)} for (t, p, d), v in by_setting.items()]
    return by_setting[best]


def keras_sequential(data: Path, threads: int, pipeline: str, onednn: int,
                     *extra: str) -> list[str]:
    """The command line of one sequential Keras run (``bench/keras_runner.py``)."""
    return ["bench/keras_runner.py", "sequential", str(data), "--threads", str(threads),
            "--pipeline", pipeline, "--onednn", str(onednn), *extra]


def cold_pairs(db: Db, w: Workload, data: Path, res: dict[str, Any], baseline: dict[str, Any],
               rounds: int) -> list[dict[str, Any]]:
    """``rounds`` rounds of a cold mop fit (as the measured ones) and sequential Keras at
    its best setting (``res["sequential_chosen"]``), alternating which runs first: each
    round's two makespans, so cold / sequential is paired by round like mop / ring (the
    two measured apart can fall in different spells of the machine's speed)."""
    th, pl, dnn = _keras_setting(res, baseline)
    out: list[dict[str, Any]] = []
    for i in range(rounds):
        got: dict[str, Any] = {"first": "mop" if i % 2 == 0 else "sequential"}
        for side in (("mop", "sequential") if i % 2 == 0 else ("sequential", "mop")):
            if side == "mop":
                got["mop"] = db.fit("mop", None)["makespan"]
            else:
                seq, _ = run_sub(keras_sequential(data, th, pl, dnn))
                got["sequential"] = seq["makespan"]
        out.append(got)
    return out


def _keras_setting(res: dict[str, Any], baseline: dict[str, Any]) -> tuple[int, str, int]:
    """(threads, pipeline, oneDNN) of the Keras baselines on this workload: sequential's best
    here, else the suite's chosen one with TensorFlow's default kernels, else 1 thread on
    numpy input."""
    th, pl, *dnn = res.get("sequential_chosen", baseline.get("chosen", (1, "numpy")))
    return int(th), str(pl), int(dnn[0]) if dnn else 0


def run_workload(conn, w: Workload, work: Path, skip: set[str], baseline: dict[str, Any],
                 scale_name: str) -> dict[str, Any]:
    """Every system of ``w``. ``baseline["chosen"]``: (threads, pipeline) of the Keras
    baselines, measured on the first workload that runs sequential Keras and kept after."""
    data = work / f"{w.name}.npz"
    w.save(data)
    db = Db(conn, w)
    res: dict[str, Any] = {
        "label": w.label, "rows": len(w.y), "valid_rows": len(w.vy),
        "features": int(w.x.shape[1]), "epochs": w.epochs, "repeats": w.repeats,
        "data_bytes": int(w.x.nbytes + w.vx.nbytes),
        "configs": [{k: c[k] for k in ("arch", "lr", "l2", "batch_size")} for c in w.configs],
        "runs": {}}
    try:
        log(f"{w.name}: loading {len(w.y)} + {len(w.vy)} rows")
        res["preprocess_s"] = db.load()
        fits = [s for s in w.systems if s in DB_FITS and s not in skip]
        for system in w.systems:
            if system in skip or (system in DB_FITS and system != fits[0]):
                continue
            t0 = time.perf_counter()
            if system in DB_FITS:  # every cerebro_db system's repeats, interleaved
                res["warm_up_s"] = db.warm_up()
                log(f"{w.name}: warm-up fit (not measured) {res['warm_up_s']:.1f} s")
                for name, got in interleaved_fits(db, fits, w.fit_repeats or w.repeats).items():
                    res["runs"][name] = got
                    log(f"{w.name}: {name} x{len(got)}: makespan "
                        f"{statistics.median(r['makespan'] for r in got):.1f} s")
                if "mop" in fits:  # one more, sampled: where the workers' time goes
                    res["wait_sample"] = db.fit("mop", None, waits=True)
                    counts = res["wait_sample"]["waits"]["counts"]
                    n = sum(counts.values()) or 1
                    log(f"{w.name}: worker sessions sampled: " + ", ".join(
                        f"{k} {100 * v / n:.1f}%" for k, v in counts.items()))
                log(f"{w.name}: cerebro_db fits done (wall {time.perf_counter() - t0:.0f} s)")
                continue
            if system in ("keras_split", "units_split"):
                runs = []
                for _ in range(w.repeats):
                    _, pl, dnn = _keras_setting(res, baseline)
                    # the cores shared out: sequential's best thread count is one process's;
                    # p processes with 2 threads each on 2 cores would only contend
                    th = max(1, (os.cpu_count() or P) // P)
                    if system == "units_split":  # our unit code, with our kernels (oneDNN)
                        pl, dnn = "units", 1
                    outs, mem, wall = run_concurrent(
                        [keras_sequential(data, th, pl, dnn, "--shard", f"{i}/{P}")
                         for i in range(P)])
                    # makespan as sequential's (data in memory to the last evaluation) of
                    # the slower process; wall: with process start and TensorFlow's import
                    runs.append({"makespan": max(o["makespan"] for o in outs), "wall": wall,
                                 "threads": th, "pipeline": pl, "onednn": bool(dnn),
                                 "memory": mem,
                                 "process_makespans": [o["makespan"] for o in outs],
                                 "curves": [c["curve"] for c in outs[0]["configs"]]})
            elif system == "sequential":
                runs = sequential_runs(w, data, baseline, res)
            elif system == "cold_pairs":
                res["cold_pairs"] = cold_pairs(db, w, data, res, baseline,
                                               SCALES[scale_name].cold_pairs)
                ratios = [r["mop"] / r["sequential"] for r in res["cold_pairs"]]
                if ratios:
                    log(f"{w.name}: cold / sequential paired x{len(ratios)}: median "
                        f"{statistics.median(ratios):.3f} (wall {time.perf_counter() - t0:.0f} s)")
                continue
            elif system == "units_one_process":
                runs = []
                for _ in range(w.repeats):
                    out, mem = run_sub(["bench/keras_runner.py", "sequential", str(data),
                                        "--threads", str(_keras_setting(res, baseline)[0]),
                                        "--pipeline", "units"])
                    runs.append({**out, "memory": mem,
                                 "curves": [c["curve"] for c in out["configs"]]})
            elif system == "ray":
                runs = []
                # its trials evaluate at the sizes that evaluated fastest in a process like
                # theirs (1 thread, numpy input), measured here, before its runs' clocks
                cal, _ = run_sub(["bench/keras_runner.py", "eval-batches", str(data),
                                  "--threads", "1"])
                for _ in range(w.repeats):
                    out, mem = run_sub(["bench/ray_runner.py", str(data), "--eval-batch",
                                        json.dumps(cal["eval_batch"])])
                    runs.append({**out, "memory": mem,
                                 "curves": [c["curve"] for c in out["configs"]]})
            else:
                raise ValueError(system)
            res["runs"][system] = runs
            log(f"{w.name}: {system} x{len(runs)}: makespan "
                f"{statistics.median(r['makespan'] for r in runs):.1f} s "
                f"(wall {time.perf_counter() - t0:.0f} s)")
        if w.name == "fashion-mnist" and "averaging" not in skip:
            scale = SCALES[scale_name]
            idx = next(i for i, c in enumerate(w.configs)
                       if c["arch"] == "mlp" and c["lr"] == 0.001 and c["batch_size"] == 64
                       and c["l2"] == 0.0)
            out, mem = run_sub(["bench/keras_runner.py", "averaging", str(data), "--config",
                                str(idx), "--epochs", str(scale.ma_epochs), "--partitions",
                                str(P)])
            one = db.fit_single(idx, scale.ma_epochs)
            out["cerebro_db_fit"] = one["curves"][0] if one["curves"] else []
            out["cerebro_db_fit_makespan"] = one["makespan"]
            out["config_label"] = w.configs[idx]
            res["averaging"] = out
            log(f"{w.name}: model averaging vs sequential SGD done")
    finally:
        db.cleanup()
    return res


VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")
"""CPU flags that decide how fast TensorFlow's kernels run (oneDNN picks its code by them):
two virtual machines both named "AMD EPYC" ran the same Fashion-MNIST CNN units 3x apart,
one with AVX-512 and one without."""


def cpu_detail(cpuinfo: list[str]) -> str:
    """"family F model M, flags" of the first CPU in ``/proc/cpuinfo``'s lines: the model
    name of a virtual machine often hides the generation, which these tell."""
    first: dict[str, str] = {}
    for ln in cpuinfo:
        if not ln.strip():
            break
        k, _, v = ln.partition(":")
        first[k.strip()] = v.strip()
    flags = set(first.get("flags", "").split())
    have = [f for f in VECTOR_FLAGS if f in flags]
    return (f"family {first.get('cpu family', '?')} model {first.get('model', '?')}, "
            f"{' '.join(have) if have else 'no AVX2'}")


def machine(conn) -> dict[str, Any]:
    import keras
    import tensorflow as tf

    info: dict[str, Any] = {
        "host": platform.node(), "platform": platform.platform(),
        "python": platform.python_version(), "cores": os.cpu_count(),
        "numpy": np.__version__, "tensorflow": tf.__version__, "keras": keras.__version__,
        "postgres": q(conn, "SELECT version()")[0][0],
        "cerebro_db": q(conn, "SELECT cerebro_db_version()")[0][0],
    }
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = [ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")]
        info["cpu"] = cpu[0] if cpu else platform.processor()
        info["cpu_detail"] = cpu_detail(cpuinfo)
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        mem = [ln.split()[1] for ln in meminfo if ln.startswith("MemTotal")]
        info["memory_gib"] = round(int(mem[0]) / 2**20, 1)
        info["loadavg_start"] = os.getloadavg()
    except OSError:
        pass
    try:  # the worker sessions' TensorFlow kernels: the server's environment after cerebro_db
        q(conn, "CREATE FUNCTION pg_temp.bench_onednn() RETURNS text AS $$\n"
                "import os, cerebro_db\nreturn os.environ.get(cerebro_db.ONEDNN_ENV)\n"
                "$$ LANGUAGE plpython3u")
        info["server_onednn"] = q(conn, "SELECT pg_temp.bench_onednn()")[0][0] == "1"
    except Exception as e:  # noqa: BLE001 - a report detail, not worth failing the suite
        conn.rollback()
        log(f"could not read the server's oneDNN setting: {e}")
    for mod in ("ray", "psutil", "matplotlib"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = None
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="default", choices=sorted(SCALES))
    ap.add_argument("--only", default="", help="comma list of workloads (e.g. adult,hetero)")
    ap.add_argument("--skip", default="", help="comma list of systems or parts to skip "
                    "(mop, ring, ring_reset, sequential, ray, averaging)")
    ap.add_argument("--out", default=str(RESULTS / "results.json"))
    ap.add_argument("--no-report", action="store_true")
    a = ap.parse_args()
    scale = SCALES[a.scale]
    only = {s for s in a.only.split(",") if s} or None
    skip = {s for s in a.skip.split(",") if s}
    conn = connect()
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "command": "python bench/suite.py " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
        "scale": a.scale, "partitions": P, "machine": machine(conn), "workloads": {}}
    log(f"scale {a.scale}; writing {a.out}")
    baseline: dict[str, Any] = {}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cerebro_bench_") as tmp:
        for w in workloads(scale, only):
            results["workloads"][w.name] = run_workload(conn, w, Path(tmp), skip, baseline,
                                                        a.scale)
            results["seconds"] = time.perf_counter() - t0
            results["machine"]["loadavg_end"] = os.getloadavg()
            out.write_text(json.dumps(results))  # after every workload: a partial run is kept
    log(f"suite done in {results['seconds']:.0f} s")
    if not a.no_report:
        from report import main as report

        report(out)


if __name__ == "__main__":
    main()
