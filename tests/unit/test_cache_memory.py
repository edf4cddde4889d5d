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
