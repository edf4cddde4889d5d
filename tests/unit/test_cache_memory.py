"""The worker's memory budget for use_caching NULL (cerebro_db.cache_memory)."""
from __future__ import annotations

import pytest

from cerebro_db import worker
from cerebro_db.errors import CerebroError


@pytest.mark.parametrize("text, want", [
    ("0", 0), ("1048576", 1 << 20), ("512MB", 512 << 20), ("2GB", 2 << 30),
    ("1.5 GB", 3 << 29), ("300kB", 300 << 10), ("1TB", 1 << 40), (" 64mb ", 64 << 20),
    ("10B", 10),
])
def test_parse_memory(text, want):
    assert worker.parse_memory(text) == want


@pytest.mark.parametrize("text", ["lots", "-1GB", "2 PB", "GB", "nan", "inf MB", "1e400"])
def test_parse_memory_rejects(text):
    with pytest.raises(CerebroError) as e:
        worker.parse_memory(text)
    assert e.value.sqlstate == "22023" and "cerebro_db.cache_memory" in e.value.message
    assert e.value.hint


def test_default_budget_is_half_the_memory_shared_by_the_workers():
    mem = worker.physical_memory()
    assert mem > 0
    assert worker.cache_memory(None, 2) == mem // 4
    assert worker.cache_memory("", 1) == mem // 2
    assert worker.cache_memory("100MB", 8) == 100 << 20


def test_streamed_evaluation_overlaps_its_read_only_with_a_core_to_spare(monkeypatch):
    monkeypatch.setattr(worker.os, "cpu_count", lambda: 4)
    assert not worker.spare_core({"num_workers": 2, "worker_threads": 2})
    assert not worker.spare_core({"num_workers": 4, "worker_threads": 1})
    assert worker.spare_core({"num_workers": 3, "worker_threads": 1})
    assert worker.spare_core({"num_workers": 1})
    monkeypatch.setattr(worker.os, "cpu_count", lambda: None)
    assert not worker.spare_core({"num_workers": 1, "worker_threads": 1})


def test_a_budget_above_the_servers_memory_is_refused():
    """An outside pass set '1e20' and '1TB': the fits ran with the protection off. The
    budget is each worker's: all of them together may not exceed the memory."""
    mem = worker.physical_memory()
    assert worker.cache_memory(str(mem // 2), 2) == mem // 2
    assert worker.cache_memory(str(mem), 1) == mem
    for text in (str(mem // 2 + 1), "1e20", "1TB" if mem < 1 << 40 else "1e20"):
        with pytest.raises(CerebroError) as e:
            worker.cache_memory(text, 2)
        assert e.value.sqlstate == "22023" and "more than this server's memory" in \
            e.value.message, text


def _group(tmp, *parts: str, value: str, name: str) -> None:
    d = tmp.joinpath(*parts)
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(value + "\n")


def test_cgroup_limits_follow_the_process_group_and_its_parents(tmp_path):
    """v1: the memory controller's line of /proc/self/cgroup names the group; every level's
    limit counts (the lowest wins), unlimited ones included as their huge number; v2: the
    unified line's group, 'max' left out; the top of the hierarchy too."""
    from cerebro_db.keras_arch import cgroup_limits

    root = tmp_path / "sys"
    _group(root, "memory", value="9223372036854771712", name="memory.limit_in_bytes")
    _group(root, "memory", "pg", value=str(8 << 30), name="memory.limit_in_bytes")
    _group(root, "memory", "pg", "inner", value=str(3 << 30), name="memory.limit_in_bytes")
    proc = tmp_path / "cgroup"
    proc.write_text("9:name=systemd:/\n4:memory:/pg/inner\n3:cpu,cpuacct:/x\n")
    assert sorted(cgroup_limits(str(proc), str(root))) == \
        [3 << 30, 8 << 30, 9223372036854771712]
    root2 = tmp_path / "v2"
    _group(root2, value="max", name="memory.max")
    _group(root2, "system.slice", value="max", name="memory.max")
    _group(root2, "system.slice", "postgresql.service", value=str(2 << 30), name="memory.max")
    proc.write_text("0::/system.slice/postgresql.service\n")
    assert cgroup_limits(str(proc), str(root2)) == [2 << 30]
    proc.write_text("0::/\n")
    assert cgroup_limits(str(proc), str(root2)) == []


def test_physical_memory_sees_a_limit_on_the_process_own_cgroup(tmp_path):
    """A real cgroup v1 memory group (where this machine lets the tests make one): a process
    started in it with a 3 GB limit plans with 3 GB."""
    import os
    import subprocess
    import sys
    import uuid

    base = "/sys/fs/cgroup/memory"
    if not os.access(base, os.W_OK) or os.path.exists("/sys/fs/cgroup/memory.max"):
        pytest.skip("no writable cgroup v1 memory hierarchy here")
    group = os.path.join(base, f"cerebro_test_{uuid.uuid4().hex[:8]}")
    os.mkdir(group)
    try:
        with open(os.path.join(group, "memory.limit_in_bytes"), "w") as f:
            f.write(str(3 << 30))
        code = ("import os, sys; open(sys.argv[1] + '/cgroup.procs', 'w').write(str(os.getpid()));"
                "from cerebro_db.keras_arch import physical_memory; print(physical_memory())")
        out = subprocess.run([sys.executable, "-c", code, group], capture_output=True,
                             text=True, check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert int(out.stdout.strip()) == 3 << 30
    finally:
        os.rmdir(group)
