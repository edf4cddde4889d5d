"""scripts/cerebro.sh: every command reaches the cluster the port was made for (an outside
pass started a cluster with CEREBRO_PGPORT=55470, then `make psql`/`env` pointed at 55432,
where another cluster ran)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cerebro.sh"


def _env(pgdir: Path, port: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEREBRO_")}
    env["CEREBRO_PGDIR"] = str(pgdir)
    if port is not None:
        env["CEREBRO_PGPORT"] = port
    return subprocess.run(["bash", str(SCRIPT), "env"], check=False, env=env,
                          capture_output=True, text=True, timeout=30)


def _port(out: str) -> str:
    return dict(line.split("=", 1) for line in out.split())["PGPORT"]


def test_a_new_cluster_takes_the_port_given_or_the_default(tmp_path):
    assert _port(_env(tmp_path, None).stdout) == "55432"
    assert _port(_env(tmp_path, "55470").stdout) == "55470"


def test_a_made_cluster_keeps_its_port_and_refuses_another(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "postgresql.conf").write_text(
        "#port = 5432\n# cerebro_db embedded cluster\nport = 55470\nlisten_addresses = ''\n")
    r = _env(tmp_path, None)
    assert r.returncode == 0 and _port(r.stdout) == "55470"
    assert _port(_env(tmp_path, "55470").stdout) == "55470"
    r = _env(tmp_path, "55432")
    assert r.returncode == 1 and r.stdout == ""
    assert "listens on port 55470" in r.stderr and "CEREBRO_PGPORT=55432" in r.stderr
