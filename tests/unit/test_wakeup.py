"""cerebro_db.wakeup: the socket a fit's coordinator sleeps on and its workers poke, and how
DblinkExecutor.wait uses it (with a scripted waker and scripted sessions: which naps it
takes, not how long they last)."""
from __future__ import annotations

import os
import socket
import stat
from typing import Any

import pytest

from cerebro_db import executors
from cerebro_db.executors import DblinkExecutor
from cerebro_db.wakeup import Waker, is_wake_path, poke


@pytest.fixture
def waker():
    w = Waker()
    yield w
    w.close()


def test_the_socket_lies_in_a_private_directory(waker):
    assert is_wake_path(waker.path)
    assert stat.S_IMODE(os.stat(waker.dir).st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(waker.path).st_mode)


def test_pokes_wake_the_waiter_and_are_counted(waker):
    assert waker.wait(0.0) == 0
    assert poke(waker.path) and poke(waker.path)
    assert waker.wait(5.0) == 2
    assert waker.wait(0.0) == 0  # consumed


def test_close_removes_the_socket_and_later_pokes_are_dropped(waker):
    path, d = waker.path, waker.dir
    waker.close()
    waker.close()  # twice is fine
    assert not os.path.exists(d)
    assert waker.wait(0.0) == 0
    assert poke(path) is False


@pytest.mark.parametrize("path", [
    None, 3, b"/tmp/cerebro_db-wake-abc/socket", "", "relative/cerebro_db-wake-abc/socket",
    "/tmp/cerebro_db-wake-abc/other", "/tmp/cerebro_db-wake-/socket",
    "/tmp/cerebro_db-wake-a.b/socket", "/tmp/cerebro_db-wake-abc/socket/..",
    "/tmp/x\x00/cerebro_db-wake-abc/socket", "/dev/log", "/tmp/" + "a" * 100 + "/cerebro_db-wake-abc/socket",
])
def test_a_worker_pokes_nothing_but_a_wake_socket(path):
    assert not is_wake_path(path)
    assert poke(path) is False


def test_poke_sends_nothing_to_a_datagram_socket_under_another_name(tmp_path):
    other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    other.bind(str(tmp_path / "log"))
    other.setblocking(False)
    try:
        assert poke(str(tmp_path / "log")) is False
        with pytest.raises(BlockingIOError):
            other.recv(16)
    finally:
        other.close()


class ScriptedWaker:
    """Pokes given per call of wait (a list, consumed); records each nap asked for."""

    def __init__(self, pokes: list[int]) -> None:
        self.pokes = pokes
        self.naps: list[float] = []
        self.path = "/tmp/cerebro_db-wake-test/socket"

    def wait(self, timeout: float) -> int:
        self.naps.append(timeout)
        return self.pokes.pop(0) if self.pokes else 0


class ScriptedSessions:
    """The catalog calls wait makes: each worker stays busy for a given number of polls."""

    def __init__(self, busy_polls: dict[int, int]) -> None:
        self.left = {f"cerebro_t_{w}": n for w, n in busy_polls.items()}

    def dblink_is_busy(self, name: str) -> bool:
        self.left[name] -= 1
        return self.left[name] >= 0

    def dblink_result(self, name: str) -> tuple[bool, str, None]:
        return True, '{"ok": true}', None


def executor(busy_polls: dict[int, int], waker: ScriptedWaker | None) -> DblinkExecutor:
    ex = DblinkExecutor(ScriptedSessions(busy_polls), "t", 2, None)  # type: ignore[arg-type]
    ex._waker = waker  # type: ignore[assignment]
    ex.check_interval = float("inf")
    for w in busy_polls:
        ex.busy[w] = 0.0
    return ex


def test_while_units_poke_the_coordinator_naps_long_then_polls_fast_after_a_poke():
    w = ScriptedWaker([0, 1, 0, 0])
    ex = executor({0: 5}, w)
    ex._will_poke.add(0)
    res = ex.wait()
    assert [r.worker for r in res] == [0]
    # two long naps (the second ends with the poke), then fast polls until the commit is through
    assert w.naps[:2] == [executors.WAKER_NAP, executors.WAKER_NAP]
    assert w.naps[2:] == [executors.WOKEN_POLL_INTERVAL] * (len(w.naps) - 2)
    assert len(w.naps) == 5


def test_a_statement_that_does_not_poke_gets_the_back_off():
    w = ScriptedWaker([])
    ex = executor({0: 3, 1: 50}, w)
    ex._will_poke.add(1)  # worker 0 runs something else (a check): it never pokes
    ex.wait()
    assert all(n <= ex.max_poll_interval for n in w.naps)


def test_workers_whose_pokes_do_not_arrive_get_the_back_off_again():
    w = ScriptedWaker([])
    ex = executor({0: 1}, w)
    ex._unpoked = executors.WAKER_TRUSTED_AFTER
    ex._will_poke.add(0)
    ex.wait()
    assert w.naps and all(n <= ex.max_poll_interval for n in w.naps)


def test_a_timeout_bounds_the_nap():
    w = ScriptedWaker([])
    ex = executor({0: 10**6}, w)
    ex._will_poke.add(0)
    assert ex.wait(timeout=0.0) == []
    assert all(n <= 0.0 for n in w.naps)


def test_units_carry_the_wake_path_and_are_expected_to_poke(monkeypatch):
    ex = executor({}, ScriptedWaker([]))
    sent: list[Any] = []
    monkeypatch.setattr(executors.sql, "run_unit", lambda cat, *a: a)
    monkeypatch.setattr(ex, "submit", lambda w, text, key=None: (sent.append(text),
                                                                 ex.busy.update({w: 0.0})))
    ex.submit_unit(1, 42, 7, 3, 0, "train", {"attempt": 0})
    assert sent[0][-1] == {"attempt": 0, "wake": "/tmp/cerebro_db-wake-test/socket"}
    assert ex._will_poke == {1}
    assert [r.worker for r in ex.wait()] == [1]
    assert ex._will_poke == set()
