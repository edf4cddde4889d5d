"""Waking the coordinator when a worker's unit ends, instead of letting it find out by polling.

The coordinator waits for its worker sessions through dblink, which can only say whether a
connection is still busy (``dblink_is_busy``); it has no blocking wait on several
connections. Polling often costs the coordinator's CPU, which on a small machine is taken
from the workers; polling rarely leaves a worker idle between two units. So the
coordinator's :class:`Waker` binds a Unix datagram socket in a directory of its own (mode
0700, so only the server's OS user can reach it) and passes its path with every unit; the
worker session sends one byte to it (:func:`poke`) when its unit is done, just before its
statement returns and commits. The coordinator sleeps in ``select`` on that socket, so it
wakes as a unit ends and then polls briefly until the worker's commit is through
(:meth:`cerebro_db.executors.DblinkExecutor.wait`).

A poke is only a hint: the coordinator still learns every result from dblink, and it still
polls with its back-off when no poke comes (a worker on another host, a poke lost). A poke
that cannot be sent is dropped. The worker sends only to a path of the form
:func:`is_wake_path` accepts, and only one fixed byte.
"""
from __future__ import annotations

import os
import re
import select
import shutil
import socket
import tempfile

__all__ = ["Waker", "is_wake_path", "poke"]

_PREFIX = "cerebro_db-wake-"
_NAME = "socket"
_PATH = re.compile(r"/[^\x00]*/" + re.escape(_PREFIX) + r"[A-Za-z0-9_]+/" + _NAME)


def is_wake_path(path: object) -> bool:
    """Whether ``path`` is one that a :class:`Waker` binds (the only ones :func:`poke` sends
    to)."""
    return isinstance(path, str) and len(path) < 100 and _PATH.fullmatch(path) is not None


class Waker:
    """The coordinator's end: a bound datagram socket; :meth:`wait` sleeps until a poke or
    the timeout. :meth:`close` removes it (safe to call twice)."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix=_PREFIX)
        self.path = os.path.join(self.dir, _NAME)
        self.sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind(self.path)
            self.sock.setblocking(False)
        except OSError:
            self.close()
            raise
        if not is_wake_path(self.path):  # a temporary directory with an unusual name
            self.close()
            raise OSError(f"unusable wake-up path {self.path!r}")

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
        shutil.rmtree(self.dir, ignore_errors=True)


_out: socket.socket | None = None


def poke(path: object) -> bool:
    """The worker's end: send one byte to the coordinator's :class:`Waker` at ``path``;
    False (and nothing raised) when ``path`` is not a wake-up path or the send fails."""
    global _out
    if not is_wake_path(path):
        return False
    try:
        if _out is None:
            _out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            _out.setblocking(False)
        _out.sendto(b"!", str(path))
    except OSError:
        return False
    return True
