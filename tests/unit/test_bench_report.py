"""bench/report.py: the confidence interval of the paired mop / ring ratios' median, and the
realistic table's reference of our units in p processes (rendered from the committed run)."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import report


@pytest.mark.parametrize(("n", "ranks"), [(6, (1, 6)), (7, (1, 7)), (8, (1, 8)), (9, (2, 8)),
                                          (15, (4, 12)), (20, (6, 15)), (30, (10, 21))])
def test_the_interval_is_the_order_statistics_of_the_binomial_table(n: int,
                                                                    ranks: tuple[int, int]):
    # ranks from the standard table of the sign test's interval for a median at 95%
    xs = [float(i) for i in range(1, n + 1)]
    random.Random(n).shuffle(xs)
    assert report.median_interval(xs) == (float(ranks[0]), float(ranks[1]))


def test_too_few_rounds_give_no_interval():
    assert report.median_interval([0.9, 1.0, 1.1, 0.95, 1.05]) is None
    assert "95%" not in report.paired(*_runs([0.9, 1.0, 1.1]))


def test_the_paired_column_shows_the_interval():
    text = report.paired(*_runs([0.90, 0.95, 1.02, 0.97, 0.93, 0.99, 0.96]))
    assert text == "0.960 (6 of 7 faster; 95% 0.900-1.020)"


def _runs(ratios: list[float]) -> tuple[list[dict], list[dict]]:
    return [{"makespan": r * 10.0} for r in ratios], [{"makespan": 10.0} for _ in ratios]


def test_cold_over_sequential_paired_by_round():
    # each round's own ratio: a slow spell that hits both sides of a round cancels
    pairs = [{"mop": 10.0 * f, "sequential": 20.0 * f, "first": "mop"}
             for f in (1.0, 1.2, 0.9, 1.1, 1.0, 1.15)]
    assert report.cold_paired(pairs) == "0.500 (6 rounds; 95% 0.500-0.500)"
    assert report.cold_paired(pairs[:3]) == "0.500 (3 rounds)"
    assert report.cold_paired(None) == report.cold_paired([]) == "n/a"


def test_the_sequential_evaluation_batch_sizes_are_reported():
    runs = [{"eval_batches": [128]}, {"eval_batches": [128, 1024]}]
    assert "128, 1,024 rows a batch" in report._eval_batches(runs)
    assert report._eval_batches([{"makespan": 1.0}]) == ""  # an older suite's runs


def test_the_realistic_table_reports_our_units_in_p_processes(tmp_path, monkeypatch):
    # the committed run, rendered into a scratch folder: the reference column and its ratios
    import json

    results = Path(report.ROOT) / "bench" / "results" / "results.json"
    name, runs = next((n, w["runs"]) for n, w in json.loads(results.read_text())["workloads"]
                      .items() if w["runs"].get("units_split") and w["runs"].get("mop_warm"))
    monkeypatch.setattr(report, "OUT", tmp_path / "RESULTS.md")
    monkeypatch.setattr(report, "FIG", tmp_path / "figures")
    report.main(results)
    lines = (tmp_path / "RESULTS.md").read_text().splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("| workload | cerebro_db cold"))
    cols = [c.strip() for c in lines[head].strip("|").split("|")]
    row = next(ln for ln in lines[head:] if ln.startswith(f"| {name} |"))
    cells = dict(zip(cols, (c.strip() for c in row.strip("|").split("|"))))
    ours = report.med(runs["units_split"])
    assert cells["our units, p processes (s)"] == report.fmt(ours)
    assert cells["second / our units in p processes"] == \
        report.quotient(report.med(runs["mop_warm"]), ours)
    assert cells["cold / our units in p processes"] == \
        report.quotient(report.med(runs["mop"]), ours)
    assert len(cells) == len(cols) == 18
    assert report.NAMES["units_split"] in "\n".join(lines)  # its own row per workload
