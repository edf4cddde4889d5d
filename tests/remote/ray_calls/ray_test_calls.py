"""Calls the Ray engine's tests give the actors instead of a unit (importable by the actor
processes: the test cluster's PYTHONPATH holds this folder)."""
from __future__ import annotations

import os
import time
from typing import Any

_seen: list[Any] = []


def echo(call: dict[str, Any]) -> dict[str, Any]:
    """Returns the call, this process's pid and how many calls this process has answered
    (module state lives as long as the actor's process)."""
    _seen.append(call.get("n"))
    return {"ok": True, "call": call, "pid": os.getpid(), "calls": len(_seen)}


def nap(call: dict[str, Any]) -> dict[str, Any]:
    """Sleeps ``call["seconds"]``, then answers like :func:`echo`."""
    time.sleep(float(call["seconds"]))
    return echo(call)


def boom(call: dict[str, Any]) -> dict[str, Any]:
    raise ValueError(f"boom {call.get('n')}")
