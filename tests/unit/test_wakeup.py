"""cerebro_db.wakeup: the socket a fit's coordinator sleeps on and its workers poke, and how
DblinkExecutor.wait uses it (with a scripted waker and scripted sessions: which naps it
takes, not how long they last)."""
from __future__ import annotations

import socket
from typing import Any

import pytest

from cerebro_db import executors
from cerebro_db.executors import DblinkExecutor
from cerebro_db.wakeup import Waker, is_wake_name, poke


@pytest.fixture
def waker():
    w = Waker()
    yield w
    w.close()


def test_each_waker_has_its_own_random_name(waker):
    other = Waker()
    try:
        assert is_wake_name(waker.name) and is_wake_name(other.name)
        assert waker.name != other.name
    finally:
        other.close()


def test_pokes_wake_the_waiter_and_are_counted(waker):
    assert waker.wait(0.0) == 0
    assert poke(waker.name) and poke(waker.name)
    assert waker.wait(5.0) == 2
    assert waker.wait(0.0) == 0  # consumed


def test_close_frees_the_name_and_later_pokes_are_dropped(waker):
    name = waker.name
    waker.close()
    waker.close()  # twice is fine
    assert waker.wait(0.0) == 0
    assert poke(name) is False
    again = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        again.bind("\0" + name)  # nothing is left holding it
    finally:
        again.close()


@pytest.mark.parametrize("name", [
    None, 3, b"cerebro_db-wake-" + b"0" * 32, "", "cerebro_db-wake-", "cerebro_db-wake-" + "0" * 31,
    "cerebro_db-wake-" + "0" * 33, "cerebro_db-wake-" + "G" * 32, "/dev/log",
    "\0cerebro_db-wake-" + "0" * 32, "/tmp/cerebro_db-wake-" + "0" * 32,
    "cerebro_db-wake-" + "0" * 32 + "\n",
])
def test_a_worker_pokes_nothing_but_a_wake_socket(name):
    assert not is_wake_name(name)
    assert poke(name) is False


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
        self.name = "cerebro_db-wake-" + "0" * 32

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


def expect(ex: DblinkExecutor, *workers: int) -> None:
    """As submit_unit leaves it: these workers run units that poke, one spell each."""
    ex._will_poke.update(workers)
    ex._credits += len(workers)


def test_while_units_poke_the_coordinator_naps_long_then_polls_fast_after_a_poke():
    w = ScriptedWaker([0, 1, 0, 0])
    ex = executor({0: 5}, w)
    expect(ex, 0)
    res = ex.wait()
    assert [r.worker for r in res] == [0]
    # two long naps (the second ends with the poke), then fast polls until the commit is
    # through, then the look for pokes before the answer is counted
    assert w.naps[:2] == [executors.WAKER_NAP, executors.WAKER_NAP]
    assert w.naps[2:5] == [executors.WOKEN_POLL_INTERVAL] * 3
    assert w.naps[5:] == [0.0]
    assert (ex._pokes, ex._unpoked, ex._credits, ex._will_poke) == (0, 0, 0, set())


def test_a_poke_read_only_with_the_answer_still_counts():
    w = ScriptedWaker([0, 1])  # the nap finds none; the poke is read at collection
    ex = executor({0: 1}, w)
    expect(ex, 0)
    ex._unpoked = 2
    ex.wait()
    assert w.naps == [executors.WAKER_NAP, 0.0]
    assert (ex._pokes, ex._unpoked) == (0, 0)


def test_pokes_beyond_the_units_sent_do_not_keep_the_coordinator_polling_fast():
    """Any local process can reach the socket: pokes that no unit earned are ignored."""
    w = ScriptedWaker([5, 5, 5, 5, 5, 5])
    ex = executor({0: 6, 1: 6}, w)
    expect(ex, 0, 1)
    ex.wait()
    # the first nap's pokes open one spell per unit in flight; no more come from them
    assert ex._credits == 0
    assert w.naps[0] == executors.WAKER_NAP
    # spent: later pokes neither count nor start another spell
    ex._woken = before = -1.0
    ex._poked(5)
    assert (ex._pokes, ex._woken) == (0, before)


def test_a_statement_that_does_not_poke_gets_the_back_off_and_is_no_missed_poke():
    w = ScriptedWaker([])
    ex = executor({0: 3, 1: 50}, w)
    expect(ex, 1)  # worker 0 runs something else (a check): it never pokes
    assert [r.worker for r in ex.wait()] == [0]
    assert all(n <= ex.max_poll_interval for n in w.naps)
    assert ex._unpoked == 0 and ex._will_poke == {1}


def test_workers_whose_pokes_do_not_arrive_get_the_back_off_again():
    w = ScriptedWaker([])
    ex = executor({0: 1, 1: 10}, w)
    expect(ex, 0, 1)
    ex._unpoked = executors.WAKER_TRUSTED_AFTER - 1
    assert [r.worker for r in ex.wait()] == [0]
    assert ex._unpoked == executors.WAKER_TRUSTED_AFTER
    w.naps.clear()
    ex.wait()
    assert w.naps and all(n <= ex.max_poll_interval for n in w.naps if n)


def test_a_timeout_bounds_the_nap():
    w = ScriptedWaker([])
    ex = executor({0: 10**6}, w)
    expect(ex, 0)
    assert ex.wait(timeout=0.0) == []
    assert all(n <= 0.0 for n in w.naps)


def test_units_carry_the_wake_name_and_are_expected_to_poke(monkeypatch):
    ex = executor({}, ScriptedWaker([]))
    sent: list[Any] = []
    monkeypatch.setattr(executors.sql, "run_unit", lambda cat, *a: a)
    monkeypatch.setattr(ex, "submit", lambda w, text, key=None: (sent.append(text),
                                                                 ex.busy.update({w: 0.0})))
    ex.submit_unit(1, 42, 7, 3, 0, "train", {"attempt": 0})
    assert sent[0][-1] == {"attempt": 0, "wake": "cerebro_db-wake-" + "0" * 32}
    assert (ex._will_poke, ex._credits) == ({1}, 1)
    assert [r.worker for r in ex.wait()] == [1]
    assert (ex._will_poke, ex._credits) == (set(), 0)


class ScriptedChains:
    """Each worker session's results, each coming at a given count of ``dblink_is_busy``
    calls (over all sessions): a session is busy while its next result has not come."""

    def __init__(self, results: dict[int, list[tuple[int, str]]]) -> None:
        self.polls = 0
        self.results = {f"cerebro_t_{w}": list(r) for w, r in results.items()}

    def dblink_is_busy(self, name: str) -> bool:
        self.polls += 1
        pending = self.results[name]
        return bool(pending) and pending[0][0] > self.polls

    def dblink_next(self, name: str) -> str | None:
        pending = self.results[name]
        assert not pending or pending[0][0] <= self.polls, "read a result that has not come"
        return pending.pop(0)[1] if pending else None

    def dblink_result(self, name: str) -> tuple[bool, str, None]:
        return True, self.results[name].pop(0)[1], None


def test_a_chains_pad_and_begin_ahead_of_its_answer_do_not_hold_up_the_other_workers():
    """The server may send a chain's pad and the next slot's BEGIN before that slot's unit
    has answered (its output buffer filled): the coordinator reads them and goes back to
    waiting on every worker, instead of polling that one session until its unit ends while
    the other worker's answer waits (seen in the benchmark: the coordinator's CPU time up
    to 1.7 s in a 45 s fit)."""
    chains = ScriptedChains({
        0: [(1, " " * 100), (1, "BEGIN"), (400, '{"ok": true, "seq": 1}'), (400, "COMMIT")],
        1: [(20, '{"ok": true}')]})
    ex = DblinkExecutor(chains, "t", 2, None)  # type: ignore[arg-type]
    ex._waker = ScriptedWaker([])  # type: ignore[assignment]
    ex.check_interval = float("inf")
    ex.busy.update({0: 0.0, 1: 0.0})
    ex._slot[0], ex._last[0], ex._posted[0] = 1, 3, (2, None)  # its next unit is posted
    expect(ex, 0, 1)
    assert [r.worker for r in ex.wait()] == [1]
    assert chains.polls < 100 and ex._slot[0] == 1 and 0 in ex.busy
    assert chains.results["cerebro_t_0"][0][1].startswith("{")  # what is left: the answer on
    chains.polls = 400
    assert [(r.worker, r.ok) for r in ex.wait()] == [(0, True)]
    assert ex._slot[0] == 2 and 0 in ex.busy  # on to its posted unit


class Clock:
    """A monotonic clock that the naps (the waker's, ``time.sleep``) move forward."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class ClockedWaker(ScriptedWaker):
    """A :class:`ScriptedWaker` whose naps move ``clock`` forward."""

    def __init__(self, clock: Clock, pokes: list[int]) -> None:
        super().__init__(pokes)
        self.clock = clock

    def wait(self, timeout: float) -> int:
        self.clock.sleep(timeout)
        return super().wait(timeout)


class CommittingSessions:
    """A worker session whose statement is busy until ``until`` on the clock (a commit held
    up by the server's WAL flush), then answers ``COMMIT`` and ends."""

    def __init__(self, clock: Clock, until: float) -> None:
        self.clock, self.until, self.polls = clock, until, 0
        self.results = ["COMMIT"]

    def dblink_is_busy(self, name: str) -> bool:
        self.polls += 1
        return self.clock.now < self.until

    def dblink_next(self, name: str) -> str | None:
        return self.results.pop(0) if self.results else None


def _held_commit(monkeypatch, waker: bool) -> tuple[DblinkExecutor, Clock, CommittingSessions]:
    clock = Clock()
    monkeypatch.setattr(executors.time, "monotonic", lambda: clock.now)
    monkeypatch.setattr(executors.time, "sleep", clock.sleep)
    sessions = CommittingSessions(clock, until=0.56)
    ex = DblinkExecutor(sessions, "t", 2, None)  # type: ignore[arg-type]
    if waker:
        ex._waker = ClockedWaker(clock, [])  # type: ignore[assignment]
    return ex, clock, sessions


@pytest.mark.parametrize("waker", [True, False])
def test_a_commit_held_up_is_polled_with_a_back_off(monkeypatch, waker):
    """A unit's answer has come and its COMMIT is held up 560 ms: the coordinator polls
    fast at first, then ever less often, and reads the commit at most COMMIT_POLL_MAX late
    (polling every 0.2 ms throughout took 2,800 polls, the coordinator's CPU)."""
    ex, clock, sessions = _held_commit(monkeypatch, waker)
    assert ex._next_ready("cerebro_t_0") == "COMMIT"
    assert 0.56 <= clock.now <= 0.56 + executors.COMMIT_POLL_MAX
    assert sessions.polls < 120
    assert executors._commit_nap(0.0) == executors.WOKEN_POLL_INTERVAL
    assert executors._commit_nap(10.0) == executors.COMMIT_POLL_MAX


def test_draining_a_chain_polls_with_the_same_back_off(monkeypatch):
    ex, clock, sessions = _held_commit(monkeypatch, waker=False)
    ex._drain(0)
    assert 0.56 <= clock.now <= 0.56 + executors.COMMIT_POLL_MAX
    assert sessions.polls < 120 and sessions.results == []


@pytest.mark.parametrize("held", [0.045, 0.2])
def test_after_a_poke_a_commit_held_up_is_polled_with_the_back_off(monkeypatch, held):
    """The poke came (a unit ends before its commit) and the commit is held up ``held``
    seconds by the WAL flush: the fast polls thin out instead of running every 0.2 ms (225
    or 1,000 polls), and the answer is read at most COMMIT_POLL_MAX after the commit. Held up
    200 ms, the coordinator used to fall back to WAKER_NAP after 50 ms of polls (seen in the
    benchmark: two workers idle 0.16 s together after commits held up 90-100 ms)."""
    clock = Clock()
    monkeypatch.setattr(executors.time, "monotonic", lambda: clock.now)
    w = ClockedWaker(clock, [1])
    ex = executor({0: 10**6}, w)
    until = executors.WAKER_NAP + held  # the first nap ends with the poke
    ex.cat.dblink_is_busy = lambda name: clock.now < until  # type: ignore[method-assign]
    expect(ex, 0)
    assert [r.worker for r in ex.wait()] == [0]
    fast = [n for n in w.naps[1:] if n]
    assert fast[0] == executors.WOKEN_POLL_INTERVAL and len(fast) < 100
    assert max(fast) <= executors.COMMIT_POLL_MAX
    assert until <= clock.now <= until + executors.COMMIT_POLL_MAX


def test_a_queued_unit_earns_one_spell_of_fast_polling_not_two(monkeypatch):
    """A unit earns its credit when it is sent, whether it goes as a statement, into a
    chain's slot ahead (``queue_unit``) or into a waiting chain's slot; starting a queued
    unit earns nothing more (it did: two spells for one poke)."""
    chains = ScriptedChains({0: [(3, '{"ok": true}'), (3, "COMMIT")]})
    ex = DblinkExecutor(chains, "t", 2, None)  # type: ignore[arg-type]
    ex._waker = ScriptedWaker([1])  # type: ignore[assignment]  # the first unit's poke
    ex.check_interval = float("inf")
    ex.busy[0] = 0.0
    ex._slot[0], ex._last[0] = 0, 2  # a chain of three slots, its first unit running
    expect(ex, 0)
    monkeypatch.setattr(ex, "_post", lambda *a: True)
    assert ex.queue_unit(0, 42, 7, 1, 0, "train", {})
    assert ex._credits == 2  # two units sent
    assert [r.worker for r in ex.wait()] == [0]
    assert ex._slot[0] == 1 and 0 in ex.busy  # on to the queued unit
    assert (ex._pokes, ex._credits, ex._will_poke) == (0, 1, {0})


def test_a_chain_that_ends_leaves_the_credits_of_the_units_queued_in_other_chains():
    """Worker 0's chain ends while worker 1 runs a unit with its next one posted in its
    chain's next slot: worker 1 still pokes twice, and both pokes count. Capped at one
    credit a busy worker, the second was lost: after the fit's last unit the coordinator
    slept a whole WAKER_NAP (seen on Adult with one replica: 0.12 s from the last unit's end
    to the fit's, against 0.02 s)."""
    ex = executor({}, ScriptedWaker([]))
    ex.busy.update({0: 0.0, 1: 0.0})
    expect(ex, 0, 1)
    ex._slot[1], ex._last[1], ex._posted[1] = 1, 3, (2, None)
    ex._credits += 1  # worker 1's queued unit
    ex._unexpect(0)
    assert ex._credits == 2
    ex._poked(3)  # a third poke (from elsewhere) earns nothing
    assert (ex._pokes, ex._credits) == (2, 0)
    ex._posted.clear()  # worker 1 went on to it
    ex._unexpect(1)
    assert ex._credits == 0
