"""Fixtures of the remote-executor tier: a database of its own, a login role with a
password (remote workers log in over TCP with it, from a PGPASSFILE, as cluster nodes do),
a small packed table that role owns, and a real local Dask cluster (a scheduler and two
worker processes of this venv, loopback only)."""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..helpers import (
    connect,
    create_database,
    drop_database,
    load_mnist_rows,
    mlp_json,
    q,
    server_params,
)

psycopg2 = pytest.importorskip("psycopg2")

PARTITIONS = 2
COMPILE = ("loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
           "metrics=['accuracy']")
SEED = 23


@pytest.fixture(scope="package")
def rdb() -> Iterator[str]:
    name = create_database()
    yield name
    drop_database(name)


@pytest.fixture(scope="package")
def radmin(rdb):
    c = connect(rdb)
    c.autocommit = True
    yield c
    c.close()


class Role:
    def __init__(self, name: str, password: str, dbname: str) -> None:
        self.name, self.password, self.dbname = name, password, dbname

    def connect(self):
        p = server_params()
        c = psycopg2.connect(dbname=self.dbname, host=p["host"], port=p["port"], user=self.name)
        c.autocommit = True
        return c


@pytest.fixture(scope="package")
def passfile(tmp_path_factory) -> Path:
    """The PGPASSFILE remote workers read (filled by the role fixtures)."""
    f = tmp_path_factory.mktemp("pgpass") / "pgpass"
    f.write_text("")
    f.chmod(0o600)
    return f


def _make_role(admin, dbname: str, passfile: Path, prefix: str, superuser: bool) -> Role:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    password = secrets.token_hex(12)
    q(admin, f'CREATE ROLE "{name}" LOGIN {"SUPERUSER" if superuser else ""} PASSWORD %s',
      (password,))
    q(admin, f'GRANT USAGE ON SCHEMA cerebro_db TO "{name}"')
    q(admin, f'CREATE SCHEMA "{name}" AUTHORIZATION "{name}"')
    port = server_params()["port"]
    with passfile.open("a") as f:
        for host in ("127.0.0.1", "localhost"):
            f.write(f"{host}:{port}:{dbname}:{name}:{password}\n")
    return Role(name, password, dbname)


def _drop_role(admin, role: Role) -> None:
    q(admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
      (role.name,))
    for t in ("units", "unit_failures", "model_states", "fit_workers", "fit_configs", "fits"):
        q(admin, f"DELETE FROM cerebro_db.{t} WHERE owner = %s", (role.name,))
    q(admin, f'DROP OWNED BY "{role.name}" CASCADE')
    q(admin, f'DROP ROLE "{role.name}"')


@pytest.fixture(scope="package")
def role(radmin, rdb, passfile) -> Iterator[Role]:
    """A plain login role with a password, owning the tier's data (in its own schema)."""
    r = _make_role(radmin, rdb, passfile, "remote", superuser=False)
    c = r.connect()
    load_mnist_rows(c, ("rm_train", 0, 400))
    q(c, "SET client_min_messages = warning")
    q(c, "SELECT training_preprocessor_dl('rm_train', 'rm_p', 'y', 'x', NULL, 255.0, NULL, "
         "NULL, %s, 2)", (PARTITIONS,))
    q(c, "SELECT load_keras_model('rm_arch', %s)", (mlp_json(4),))
    q(c, "SELECT load_model_selection_table('rm_arch', 'rm_mst', ARRAY[1], %s, %s)",
      ([COMPILE], ["batch_size=50"]))
    c.close()
    yield r
    _drop_role(radmin, r)


@pytest.fixture(scope="package")
def su_role(radmin, rdb, passfile, role) -> Iterator[Role]:
    """A superuser login role with a password (cerebro_db.test_hook is honoured only in a
    superuser's session): it trains on ``role``'s tables."""
    r = _make_role(radmin, rdb, passfile, "remote_su", superuser=True)
    yield r
    _drop_role(radmin, r)


def fit(conn, out: str, iterations: int = 2, source: str = "rm_p", mst: str = "rm_mst"):
    """A fit_multiple with a fixed seed and seeded visit orders; returns its fit_id."""
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary")
    q(conn, "SELECT madlib_keras_fit_multiple_model(%s, %s, %s, %s, FALSE, NULL, 1, FALSE, "
            "NULL, NULL, TRUE, 'mop', 'seeded_order=True', %s)",
      (source, out, mst, iterations, SEED))
    return q(conn, "SELECT fit_id FROM cerebro_db.fits WHERE model_output_table LIKE %s "
                   "ORDER BY fit_id DESC LIMIT 1", (f"%{out.split('.')[-1]}",))[0][0]


def weights(conn, out: str) -> dict[int, bytes]:
    return {k: bytes(w) for k, w in q(conn, f"SELECT mst_key, model_weights FROM {out}")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaskCluster:
    """A scheduler and worker processes of this venv on loopback."""

    def __init__(self, env: dict[str, str], workers: int = 2) -> None:
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.env = env
        self.procs: list[subprocess.Popen] = []
        dask = shutil.which("dask", path=str(Path(sys.executable).parent))
        assert dask, "dask is not installed in the venv (pip install 'cerebro_db[dask]')"
        self.dask = dask
        # --no-dashboard drops the dashboard's pages only: the scheduler's and each worker's
        # HTTP server (health, metrics) listen on every address unless told otherwise
        self._start([dask, "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                     "--no-dashboard", "--dashboard-address", "127.0.0.1:0"])
        for _ in range(workers):
            self._start([dask, "worker", self.address, "--nthreads", "1", "--nworkers", "1",
                         "--host", "127.0.0.1", "--no-dashboard", "--dashboard-address",
                         "127.0.0.1:0", "--memory-limit", "0"])
        self.wait_workers(workers)

    def _start(self, cmd: list[str]) -> None:
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True))

    def client(self):
        from distributed import Client

        return Client(self.address, timeout=30, set_as_default=False)

    def wait_workers(self, n: int, timeout: float = 120.0) -> dict:
        end = time.monotonic() + timeout
        with self.client() as c:
            while True:
                ws = c.scheduler_info()["workers"]
                if len(ws) >= n:
                    return ws
                assert time.monotonic() < end, f"{len(ws)} of {n} dask workers came up"
                time.sleep(0.5)

    def worker_pids(self) -> dict[str, int]:
        with self.client() as c:
            return c.run(os.getpid)

    def listening(self) -> set[str]:
        """The addresses (host:port) the cluster's processes (each started in a process
        group of its own, children included) listen on, from /proc."""
        groups = {p.pid for p in self.procs}
        inodes: set[str] = set()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
                pgid = int(stat.rsplit(")", 1)[1].split()[2])
                if pgid not in groups:
                    continue
                for fd in (d / "fd").iterdir():
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
            except OSError:  # a process that ended meanwhile
                continue
        found = set()
        for name, width in (("tcp", 8), ("tcp6", 32)):
            for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
                f = line.split()
                if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                    continue
                host, port = f[1].split(":")
                raw = bytes.fromhex(host)
                # /proc holds the address as 32-bit words in host (little-endian) order
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                ip = socket.inet_ntop(socket.AF_INET if width == 8 else socket.AF_INET6, words)
                found.add(f"{ip}:{int(port, 16)}")
        return found

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


_allowed: list[str] = []


def allow_executor(admin, executor: str, allow: bool = True) -> None:
    """The DBA lets fits use ``executor`` (or, ``allow`` False, no longer):
    ``cerebro_db.allowed_executors`` by ALTER SYSTEM."""
    if allow:
        _allowed.append(executor)
    elif executor in _allowed:
        _allowed.remove(executor)
    # PostgreSQL 15's ALTER SYSTEM wants the custom setting known in its session
    q(admin, "SELECT set_config('cerebro_db.allowed_executors', '', false)")
    if _allowed:
        q(admin, "ALTER SYSTEM SET cerebro_db.allowed_executors = %s", (",".join(_allowed),))
    else:
        q(admin, "ALTER SYSTEM RESET cerebro_db.allowed_executors")
    q(admin, "SELECT pg_reload_conf()")


@pytest.fixture(scope="package")
def dask_cluster(passfile, radmin) -> Iterator[DaskCluster]:
    pytest.importorskip("distributed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(PGPASSFILE=str(passfile), TF_CPP_MIN_LOG_LEVEL="2", PYTHONDONTWRITEBYTECODE="1")
    cluster = DaskCluster(env)
    allow_executor(radmin, "dask://" + cluster.address.split("://")[1])
    yield cluster
    allow_executor(radmin, "dask://" + cluster.address.split("://")[1], allow=False)
    cluster.stop()


# --------------------------------------------------------------------------- Ray

RAY_CALLS = Path(__file__).resolve().parent / "ray_calls"


@pytest.fixture(scope="package")
def ray_cluster(passfile, radmin):
    """A real local Ray cluster (``ray start --head`` of this venv on loopback, 2 CPUs, the
    Ray Client server on a free port, no dashboard; tooling/ray_cluster.py), with the test
    roles' PGPASSFILE in its environment; stopped at the end (its own processes only)."""
    pytest.importorskip("ray")
    from tooling.ray_cluster import RayHead

    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    # the actors import the test's own call functions from RAY_CALLS (the package comes
    # from the venv, as on a real node)
    env.update(PGPASSFILE=str(passfile), TF_CPP_MIN_LOG_LEVEL="2", PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=str(RAY_CALLS))
    head = RayHead(num_cpus=2, env=env)
    allow_executor(radmin, head.client_address)
    yield head
    allow_executor(radmin, head.client_address, allow=False)
    head.stop()
