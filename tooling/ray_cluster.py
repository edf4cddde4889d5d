"""A local Ray cluster for the tests and the benchmarks: ``ray start --head`` of this venv on
loopback, with the Ray Client server, no dashboard, and its own ports and temp directory.

    head = RayHead(num_cpus=2, env={"PGPASSFILE": ...})
    head.client_address            # 'ray://127.0.0.1:<port>' (cerebro_db.executor)
    head.worker_pids()             # pids of the actor processes (ray::UnitActor)
    head.stop()

The head runs with ``--block`` in a session of its own; :meth:`RayHead.stop` sends SIGTERM to
that process (Ray then drains and stops the processes it started) and kills what is left of
its session after a grace period. It never runs ``ray stop``, which stops every Ray
process of the machine, other users' included.

Ray binds the node to the machine's routable address by default, even for ``127.0.0.1``;
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes it use loopback (a single-node cluster, which
is all this is). Token authentication is off (``RAY_AUTH_MODE=disabled``) unless ``env``
says otherwise. Never imported by ``cerebro_db``.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PORT_NAMES = ("port", "ray-client-server-port", "node-manager-port", "object-manager-port",
              "runtime-env-agent-port", "dashboard-agent-grpc-port",
              "dashboard-agent-listen-port", "metrics-export-port", "dashboard-port")


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _free_range(width: int, avoid: frozenset[int] = frozenset()) -> int:
    """The first port of ``width`` consecutive ports free on loopback, none of them in
    ``avoid`` (ports already given to the cluster's components: they are free until Ray
    binds them, and Ray refuses a worker port range that holds one)."""
    for _ in range(50):
        base = _free_ports(1)[0]
        if base + width >= 65535 or avoid.intersection(range(base, base + width)):
            continue
        ok = True
        for p in range(base, base + width):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"no {width} consecutive free ports on 127.0.0.1")


class RayHead:
    """A single-node Ray cluster of this venv on 127.0.0.1 (see the module)."""

    def __init__(self, num_cpus: int = 2, env: dict[str, str] | None = None,
                 object_store_bytes: int = 100_000_000, timeout: float = 120.0) -> None:
        ray = shutil.which("ray", path=str(Path(sys.executable).parent))
        if ray is None:
            raise RuntimeError("ray is not installed in this venv (pip install 'cerebro_db[ray]')")
        ports = dict(zip(PORT_NAMES, _free_ports(len(PORT_NAMES))))
        first = _free_range(40, frozenset(ports.values()))
        self.temp_dir = tempfile.mkdtemp(prefix="ray_", dir="/tmp")  # short: socket paths
        self.client_port = ports["ray-client-server-port"]
        self.client_address = f"ray://127.0.0.1:{self.client_port}"
        self.gcs_address = f"127.0.0.1:{ports['port']}"
        cmd = [ray, "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
               "--num-cpus", str(num_cpus), "--include-dashboard", "false",
               "--disable-usage-stats", "--object-store-memory", str(object_store_bytes),
               "--min-worker-port", str(first), "--max-worker-port", str(first + 39),
               "--temp-dir", self.temp_dir]
        for name, port in ports.items():
            cmd += [f"--{name}", str(port)]
        # token authentication off explicitly: Ray turns it on for a head whose user has
        # a ~/.ray/auth_token (a local ray.init() writes one), and the coordinator, a
        # database backend of another OS user, has no token (a loopback test cluster)
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", **(env or {}),
                    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
        self.log = open(Path(self.temp_dir) / "head.log", "w+b")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {self.proc.returncode}:\n"
                                   f"{self.output()[-3000:]}")
            with socket.socket() as s:
                s.settimeout(1)
                if s.connect_ex(("127.0.0.1", self.client_port)) == 0 and \
                        b"Ray runtime started" in self.output().encode():
                    return
            time.sleep(0.5)
        raise RuntimeError(f"the Ray head did not start within {timeout:g} s:\n"
                           f"{self.output()[-3000:]}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def pids(self) -> dict[int, str]:
        """{pid: command line} of this cluster's processes (those of the head's session:
        Ray puts its workers in process groups of their own), read from /proc."""
        out = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                if os.getsid(int(d.name)) != self.proc.pid:
                    continue
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except (OSError, ProcessLookupError):
                continue
            out[int(d.name)] = cmd
        return out

    def worker_pids(self, title: str = "ray::UnitActor") -> list[int]:
        """Pids of the cluster's processes whose title starts with ``title`` (Ray names an
        actor's process ``ray::<class>``), the actors' own processes only: a child an actor
        forks carries its parent's title until it execs, and is not another actor (nor is a
        process gone before its parent could be read)."""
        titled = {p for p, cmd in self.pids().items() if cmd.startswith(title)}
        parents = {p: _ppid(p) for p in titled}
        return sorted(p for p, pp in parents.items() if pp is not None and pp not in titled)

    def stop(self, grace: float = 40.0) -> None:
        """SIGTERM to the head (Ray stops its processes), then SIGKILL to whatever of its
        session is left; removes the temp directory. Safe to call twice."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()
        if not os.environ.get("CEREBRO_KEEP_RAY_TEMP"):
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def _ppid(pid: int) -> int | None:
    """The parent pid of ``pid`` from /proc (None once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces
    return int(stat.rsplit(")", 1)[1].split()[1])
