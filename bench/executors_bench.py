"""Executors side by side: the same fit on worker sessions, on Ray, on Dask, and Ray Tune.

    python bench/executors_bench.py [--scale realistic|tiny] [--skip ray,dask,tune]

The workload is the suite's ``fashion-60k-mlp`` (bench/workloads.py): at the realistic scale
(the default) all 60,000 training and 10,000 test rows of Fashion-MNIST (Debian's
``dataset-fashion-mnist``), 8 MLP configurations, 3 epochs, validation every epoch,
``use_caching`` at its default; ``--scale tiny`` is a smoke run (600 rows, 1 epoch).
Data is packed once into p = 2 partitions. Then, one after another on this machine:

  sessions  madlib_keras_fit_multiple_model on worker sessions (the default executor)
  ray       the same call with cerebro_db.executor = 'ray://...': a local Ray cluster
            (``ray start --head`` on loopback, 2 CPUs, tooling/ray_cluster.py; one actor per
            slot placed and removed once before the fit, so the cluster has settled), one
            actor per worker slot
  dask      the same with 'dask://...': a local scheduler and 2 worker processes
            (``--nthreads 1``)
  tune      Ray Tune on the same arrays and configurations (bench/ray_runner.py: 2
            concurrent trials, each holding its own copy of the data)

Every fit is cold (``cerebro_db_close_workers()`` first) and uses policy ``'mop'`` with
``seeded_order=True`` and a fixed ``random_state``, so the three executors must give
bitwise the same weights (reported). Fits run as a login role with a password (the remote
workers log in over TCP, reading it from a PGPASSFILE the clusters get, as on real nodes).
While a system runs, the resident memory of its processes is sampled (the coordinator
backend, worker sessions or remote worker processes and the database backends serving
them; Ray Tune: its process tree). Writes bench/results/executors.json and
bench/results/executors.md: each executor's makespan and its ratio over sessions (the goal:
within 10% at realistic scale), and the peak memory per worker.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common import connect
from suite import Db, q, run_sub
from workloads import SCALES, workloads

RESULTS = ROOT / "bench" / "results"
WORKLOAD = "fashion-60k-mlp"
SCALE_OF = {"realistic": "default", "tiny": "tiny"}
PARAMS = "seeded_order=True"
ROLE = "cerebro_bench_remote"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class BenchRole:
    """A login role with a random password (in a PGPASSFILE this process and the clusters
    read), its own schema, USAGE on the extension's schema."""

    def __init__(self, admin, work: Path) -> None:
        self.admin = admin
        self.name = ROLE
        self.password = secrets.token_hex(16)
        self.dbname = q(admin, "SELECT current_database()")[0][0]
        self.port = int(q(admin, "SELECT current_setting('port')")[0][0])
        self.passfile = work / "pgpass"
        self.passfile.write_text("".join(f"{h}:{self.port}:{self.dbname}:{self.name}:"
                                         f"{self.password}\n" for h in ("127.0.0.1",
                                                                       "localhost")))
        self.passfile.chmod(0o600)
        self.drop()
        q(admin, f'CREATE ROLE "{self.name}" LOGIN PASSWORD %s', (self.password,))
        q(admin, f'GRANT USAGE ON SCHEMA cerebro_db TO "{self.name}"')
        q(admin, f'CREATE SCHEMA "{self.name}" AUTHORIZATION "{self.name}"')
        os.environ["PGPASSFILE"] = str(self.passfile)

    def connect(self):
        import psycopg2

        c = psycopg2.connect(host="127.0.0.1", port=self.port, dbname=self.dbname,
                             user=self.name)
        c.autocommit = True
        return c

    def drop(self) -> None:
        if not q(self.admin, "SELECT 1 FROM pg_roles WHERE rolname = %s", (self.name,)):
            return
        q(self.admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                      "usename = %s", (self.name,))
        for t in ("units", "unit_failures", "model_states", "fit_workers", "fit_configs",
                  "fits"):
            q(self.admin, f"DELETE FROM cerebro_db.{t} WHERE owner = %s", (self.name,))
        q(self.admin, f'DROP OWNED BY "{self.name}" CASCADE')
        q(self.admin, f'DROP ROLE "{self.name}"')


class RoleDb(Db):
    """The suite's tables and fits (bench/suite.py ``Db``), owned and run by the bench role."""

    def __init__(self, role: BenchRole, w) -> None:
        self.admin = role.admin
        self.conn, self.w = role.connect(), w
        self.t = "bench_" + w.name.replace("-", "_")
        self.fit_conn = role.connect()
        self.backend_pid = q(self.fit_conn, "SELECT pg_backend_pid()")[0][0]
        self.fit_ids: list[int] = []
        self.extra_pids: Callable[[], dict[int, str]] = dict

    def _pids(self) -> Callable[[], dict[int, str]]:
        base = super()._pids()
        extra = self.extra_pids

        def f() -> dict[int, str]:
            out = base()
            # remote workers' database connections carry the same application_name as
            # worker sessions: label them as the backends they are
            return {p: (lab.replace("worker", "db backend of remote worker")
                        if extra is not dict else lab) for p, lab in out.items()} | extra()

        f.close = base.close  # type: ignore[attr-defined]
        return f

    def allow(self, executor: str | None) -> None:
        """As the DBA: let fits use the cluster ``executor`` (None: no cluster);
        ``cerebro_db.allowed_executors`` counts only from the server's configuration."""
        # PostgreSQL 15's ALTER SYSTEM wants the custom setting known in its session
        q(self.admin, "SELECT set_config('cerebro_db.allowed_executors', '', false)")
        if executor:
            q(self.admin, "ALTER SYSTEM SET cerebro_db.allowed_executors = %s", (executor,))
        else:
            q(self.admin, "ALTER SYSTEM RESET cerebro_db.allowed_executors")
        q(self.admin, "SELECT pg_reload_conf()")
        time.sleep(0.2)

    def weights(self) -> dict[int, bytes]:
        return {k: bytes(v) for k, v in q(self.conn, f"SELECT mst_key, model_weights FROM "
                                                    f"{self.t}_out")}

    def run(self, executor: str | None, pids: Callable[[], dict[int, str]] | None = None
            ) -> dict[str, Any]:
        q(self.fit_conn, "SET cerebro_db.executor = %s", (executor or "sessions",))
        self.extra_pids = pids or dict
        self.allow(executor)
        try:
            res = self.fit("mop", PARAMS)
        finally:
            q(self.fit_conn, "RESET cerebro_db.executor")
            self.extra_pids = dict
            self.allow(None)
        res["weights"] = self.weights()
        res["unit_failures"] = q(self.conn, "SELECT count(*) FROM cerebro_db.unit_failures "
                                            "WHERE fit_id = %s", (self.fit_ids[-1],))[0][0]
        return res


def settle_ray(address: str) -> None:
    """Place and remove one actor per slot from this process: the cluster has started its
    agents and worker processes before the fit is timed (a long-running cluster would
    have)."""
    from cerebro_db.remote.ray_engine import RayEngine

    engine = RayEngine(address, entry="os:getpid")
    try:
        for w in (0, 1):
            engine.start_worker(w)
    finally:
        engine.close()


def differing(base: dict[str, Any], res: dict[str, Any]) -> list[int]:
    """The mst_keys whose weights differ from the sessions executor's."""
    return sorted(k for k in base["weights"] if res["weights"].get(k) != base["weights"][k])


def per_worker(mem: dict[str, Any], prefix: str) -> float | None:
    """The largest peak RSS (GiB) of the processes whose label starts with ``prefix``."""
    vals = [v for lab, v in mem["procs"] if lab.startswith(prefix)]
    return max(vals) / 2**30 if vals else None


def summarize(system: str, res: dict[str, Any], worker_prefix: str) -> dict[str, Any]:
    mem = res["memory"]
    return {"system": system, "makespan": res["makespan"],
            "unit_failures": res.get("unit_failures"),
            "first_unit_s": res.get("first_unit_s"),
            "worker_peak_gib": per_worker(mem, worker_prefix),
            "db_backend_peak_gib": per_worker(mem, "db backend"),
            "coordinator_peak_gib": per_worker(mem, "coordinator"),
            "total_peak_gib": mem["total"] / 2**30,
            "procs": [[lab, v / 2**30] for lab, v in mem["procs"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="realistic", choices=sorted(SCALE_OF))
    ap.add_argument("--skip", default="", help="comma list of systems to skip (ray, dask, "
                    "tune)")
    ap.add_argument("--out", default=str(RESULTS / "executors.json"))
    a = ap.parse_args()
    skip = {s for s in a.skip.split(",") if s}
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # local Ray clusters (the executor's and Ray Tune's) on loopback, not the routable address
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # and without token authentication: a local ray.init() (Ray Tune's) would otherwise
    # write a token to ~/.ray/auth_token, which turns it on for every later `ray start`
    # of this user
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    scale = SCALES[SCALE_OF[a.scale]]
    (w,) = workloads(scale, {WORKLOAD})
    admin = connect()
    results: dict[str, Any] = {
        "command": "python bench/executors_bench.py " + " ".join(
            shlex.quote(x) for x in sys.argv[1:]),
        "scale": a.scale, "workload": w.label, "rows": len(w.y), "valid_rows": len(w.vy),
        "configs": len(w.configs), "epochs": w.epochs, "partitions": 2,
        "machine": {"platform": platform.platform(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "loadavg_start": os.getloadavg()},
        "runs": {}}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cerebro_bench_exec_") as tmp:
        work = Path(tmp)
        role = BenchRole(admin, work)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(PGPASSFILE=str(role.passfile), TF_CPP_MIN_LOG_LEVEL="2")
        db = RoleDb(role, w)
        try:
            log(f"{w.name} ({a.scale}): loading {len(w.y)} + {len(w.vy)} rows")
            results["preprocess_s"] = db.load()
            log("sessions")
            base = db.run(None)
            results["runs"]["sessions"] = summarize("sessions", base, "worker")
            if "ray" not in skip:
                from tooling.ray_cluster import RayHead

                head = RayHead(num_cpus=2, env=env)
                try:
                    settle_ray(head.client_address)
                    log(f"ray ({head.client_address})")
                    res = db.run(head.client_address, lambda: {
                        p: f"ray actor {i}" for i, p in enumerate(head.worker_pids())})
                finally:
                    head.stop()
                results["runs"]["ray"] = summarize("ray", res, "ray actor")
                results["runs"]["ray"]["same_weights"] = res["weights"] == base["weights"]
                results["runs"]["ray"]["differing_configs"] = differing(base, res)
            if "dask" not in skip:
                from tests.remote.conftest import DaskCluster

                cluster = DaskCluster(env)
                try:
                    log(f"dask ({cluster.address})")
                    wp = cluster.worker_pids()
                    res = db.run("dask://" + cluster.address.split("://", 1)[1], lambda: {
                        p: f"dask worker {i}" for i, p in enumerate(sorted(wp.values()))})
                finally:
                    cluster.stop()
                results["runs"]["dask"] = summarize("dask", res, "dask worker")
                results["runs"]["dask"]["same_weights"] = res["weights"] == base["weights"]
                results["runs"]["dask"]["differing_configs"] = differing(base, res)
            if "tune" not in skip:
                data = work / f"{w.name}.npz"
                w.save(data)
                log("ray tune")
                tout, mem = run_sub(["bench/ray_runner.py", str(data)])
                sampled = {"makespan": tout["makespan"], "memory": mem}
                results["runs"]["tune"] = summarize("tune", sampled, "worker")
                results["runs"]["tune"]["init_s"] = tout["init_s"]
        finally:
            db.cleanup()
            db.conn.close()
            role.drop()
    sessions = results["runs"]["sessions"]["makespan"]
    for r in results["runs"].values():
        r["ratio"] = r["makespan"] / sessions
    results["seconds"] = time.perf_counter() - t0
    results["machine"]["loadavg_end"] = os.getloadavg()
    out.write_text(json.dumps(results, indent=1))
    md = out.with_suffix(".md")
    md.write_text(report(results))
    log(f"done in {results['seconds']:.0f} s: {out}, {md}")


def gib(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def report(r: dict[str, Any]) -> str:
    lines = [
        "# Executors side by side",
        "",
        (f"`{r['command']}` ({r['scale']} scale). {r['workload']}: {r['rows']:,} training and "
        f"{r['valid_rows']:,} validation rows, {r['configs']} configurations, {r['epochs']} "
        f"epoch(s), p = {r['partitions']} partitions / workers, validation every epoch; "
        f"{r['machine']['cores']} cores ({r['machine']['platform']}), load average "
        f"{r['machine']['loadavg_start'][0]:.1f} at the start, "
        f"{r['machine']['loadavg_end'][0]:.1f} at the end."),
        "",
        ("| system | makespan (s) | / sessions | first unit (s) | peak RSS per worker (GiB) | "
        "its DB backend (GiB) | coordinator (GiB) | all processes (GiB) | weights = "
        "sessions |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, x in r["runs"].items():
        same = {True: "yes", False: "NO"}.get(x.get("same_weights"), "-")
        if x.get("differing_configs"):
            same += f" (configs {', '.join(map(str, x['differing_configs']))} differ)"
        if x.get("unit_failures"):
            same += f"; {x['unit_failures']} unit(s) retried"
        first = "-" if x.get("first_unit_s") is None else f"{x['first_unit_s']:.1f}"
        lines.append(f"| {name} | {x['makespan']:.1f} | {x['ratio']:.2f} | {first} | "
                     f"{gib(x['worker_peak_gib'])} | {gib(x['db_backend_peak_gib'])} | "
                     f"{gib(x['coordinator_peak_gib'])} | {gib(x['total_peak_gib'])} | {same} |")
    lines += [
        "",
        ("Makespan: the fit call from the client (sessions, ray, dask: cold, so it includes "
        "connecting to the cluster, placing the workers and their TensorFlow import; first "
        "unit: seconds from the call to the first unit's start) or Ray Tune from `ray.init` to "
        "the end of `Tuner.fit` (its own local cluster). Peak RSS per worker: the largest of "
        "the worker processes (worker sessions; Ray actors; Dask worker processes; Ray Tune's "
        "trial processes); a remote worker also has a database backend serving its "
        "connection (reads of its partitions, state reads and writes), listed apart. "
        "Resident sizes count shared library pages in every process."),
    ]
    if r["scale"] == "tiny":
        lines += ["", ("A smoke run on tiny data: fixed costs (connecting, placing workers, "
                      "TensorFlow's import) dominate; the ratios say nothing about the "
                      "realistic scale.")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
