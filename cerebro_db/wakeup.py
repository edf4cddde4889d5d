"""Waking the coordinator when a worker's unit ends, instead of letting it find out by polling.

The coordinator waits for its worker sessions through dblink, which can only say whether a
connection is still busy (``dblink_is_busy``); it has no blocking wait on several
connections. Polling often costs the coordinator's CPU, which on a small machine is taken
from the workers; polling rarely leaves a worker idle between two units. So the
coordinator's :class:`Waker` binds a Unix datagram socket under a random name in Linux's
abstract socket namespace (nothing in the file system, gone when the socket is closed or its
process ends, however it ends) and passes the name with every unit; the worker session
sends one byte to it (:func:`poke`) when its unit is done, just before its statement returns
and commits. The coordinator sleeps in ``select`` on that socket, so it wakes as a unit ends
and then polls briefly until the worker's commit is through
(:meth:`cerebro_db.executors.DblinkExecutor.wait`).

A poke is only a hint: the coordinator still learns every result from dblink, and it still
polls with its back-off when no poke comes (a worker on another host, a poke lost, a system
without abstract sockets, where :class:`Waker` raises ``OSError`` and the coordinator only
polls). Any local process could send to the socket (the abstract namespace has no
permissions): what it gets is an early poll. A worker sends only one fixed byte, and only to
a name of the form :func:`is_wake_name` accepts.
"""
from __future__ import annotations

import re
import secrets
import select
import socket

__all__ = ["Waker", "is_wake_name", "poke"]

_PREFIX = "cerebro_db-wake-"
_NAME = re.compile(re.escape(_PREFIX) + r"[0-9a-f]{32}")


def is_wake_name(name: object) -> bool:
    """Whether ``name`` is one that a :class:`Waker` binds (the only ones :func:`poke` sends
    to)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def _address(name: str) -> str:
    return "\0" + name  # the abstract namespace: a leading NUL byte


class Waker:
    """The coordinator's end: a bound datagram socket; :meth:`wait` sleeps until a poke or
    the timeout. ``name``: what the workers are given. :meth:`close` frees it (safe to call
    twice)."""

    def __init__(self) -> None:
        self.name = _PREFIX + secrets.token_hex(16)
        self.sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind(_address(self.name))
            self.sock.setblocking(False)
        except OSError:
            self.close()
            raise

    def wait(self, timeout: float) -> int:
        """Sleep until a poke arrives or ``timeout`` seconds pass; how many pokes came (all
        waiting are consumed)."""
        if self.sock is None:
            return 0
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        n = 0
        while ready:
            try:
                self.sock.recv(16)
            except OSError:  # nothing more waiting
                break
            n += 1
        return n

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


_out: socket.socket | None = None


def poke(name: object) -> bool:
    """The worker's end: send one byte to the coordinator's :class:`Waker` called ``name``;
    False (and nothing raised) when ``name`` is not a wake-up name or the send fails."""
    global _out
    if not is_wake_name(name):
        return False
    try:
        if _out is None:
            _out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            _out.setblocking(False)
        _out.sendto(b"!", _address(str(name)))
    except OSError:
        return False
    return True
