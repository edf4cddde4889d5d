"""cerebro_db.client's pure parts: the progress line and the AutoML timeline's artists, on
DataFrames shaped like the catalog's (the database-backed tests are in
tests/integration/test_client.py)."""
from __future__ import annotations

from datetime import timedelta

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
pytest.importorskip("sqlalchemy")

from cerebro_db.client import plots
from cerebro_db.client.core import progress_line

T0 = pd.Timestamp("2026-01-01 00:00:00", tz="UTC")


def at(s: float) -> pd.Timestamp:
    return T0 + pd.Timedelta(seconds=s)


def test_progress_line():
    p = {"fit_id": 7, "status": "running", "units_done": 12, "total_units": 40,
         "best_loss": 0.51234, "eta": timedelta(seconds=83), "elapsed": timedelta(seconds=35)}
    line = progress_line(p, width=10)
    assert line == ("fit 7 [###.......] 12/40 units  30.0%  best loss 0.5123  ETA 0:01:23  "
                    "elapsed 0:00:35  running")
    done = progress_line({**p, "status": "done", "units_done": 40, "best_loss": None}, 10)
    assert "[##########] 40/40 units 100.0%  best loss -  ETA -" in done
    # which loss it is, once the view says (a best loss that turned from a training to a
    # validation loss looked like a best that got worse)
    for kind in ("validation", "training", "training units"):
        assert f"  best {kind} loss 0.5123  " in progress_line({**p, "best_loss_kind": kind})


def test_automl_timeline_draws_units_decisions_and_branches():
    # an ASHA-like run: trials 1 and 2 in bracket 0, trial 3 a branch of trial 1
    units = pd.DataFrame({
        "unit_id": [1, 2, 3, 4], "mst_key": [1, 2, 1, 3], "epoch": [1, 1, 2, 1],
        "partition": [0, 1, 0, 1], "worker": [0, 1, 0, 1],
        "kind": ["train"] * 4, "started_at": [at(0), at(0), at(2), at(3)],
        "ended_at": [at(2), at(2.5), at(4), at(5)], "rows": [10] * 4,
        "loss": [1.0, 1.2, 0.8, 0.9]})
    trials = pd.DataFrame({"mst_key": [1, 2, 3], "parent": [None, None, 1],
                           "meta": [{"bracket": 0, "rung": 1}, {"bracket": 0, "rung": 0},
                                    {"bracket": 1, "rung": 0}]})
    decisions = pd.DataFrame({
        "decision_id": [10, 11, 12, 13, 14], "seq": [1, 1, 2, 3, 3],
        "decision": ["launch", "launch", "extend", "stop", "launch"],
        "mst_key": [1, 2, 1, 2, 3], "made_at": [at(0), at(0), at(2), at(2.5), at(3)],
        "meta": [{}, {}, {"rung": 1}, {}, {}]})
    fig = plots.automl_timeline(units, trials, decisions)
    (ax,) = fig.axes
    bars = [p for p in ax.patches if (p.get_gid() or "").startswith("trial:")]
    assert sorted(p.get_gid() for p in bars) == ["trial:1", "trial:1", "trial:2", "trial:3"]
    by_unit = sorted((p.get_x(), p.get_width(), p.get_gid()) for p in bars)
    assert by_unit[0][:2] == (0.0, 2.0) and by_unit[-1] == (3.0, 2.0, "trial:3")
    marks = {ln.get_gid(): ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith("d")}
    assert set(marks) == {f"decision:{i}" for i in range(10, 15)}
    assert marks["decision:13"].get_marker() == "x"
    assert list(marks["decision:12"].get_xdata()) == [2.0]
    branch = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    assert len(branch) == 1 and list(branch[0].get_xdata()) == [3.0, 3.0]
    assert list(branch[0].get_ydata()) == [0, 2]  # from trial 1's row to trial 3's
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1 bracket 0", "2 bracket 0",
                                                            "3 bracket 1"]
    assert "1" in [t.get_text() for t in ax.texts]  # the rung an extend goes to
    plots.save(fig, None)
