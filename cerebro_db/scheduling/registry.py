"""The names SQL uses for scheduling policies, in one place."""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..errors import invalid
from .base import Policy
from .randomized import RandomizedMOP
from .ring import RingPolicy

__all__ = ["DEFAULT_POLICY", "POLICIES", "get_policy", "policy_class", "policy_names"]

DEFAULT_POLICY = "mop"

POLICIES: Mapping[str, type[Policy]] = MappingProxyType(
    {
        "mop": RandomizedMOP,
        "random": RandomizedMOP,
        "ring": RingPolicy,
    }
)
"""Registry name -> policy class (``'random'`` is an alias of the default ``'mop'``)."""


def policy_names() -> tuple[str, ...]:
    """The valid names, sorted."""
    return tuple(sorted(POLICIES))


def _names_text() -> str:
    return ", ".join(repr(n) for n in policy_names())


def policy_class(name: str) -> type[Policy]:
    """The class registered as ``name`` (case-insensitive, surrounding blanks ignored)."""
    key = name.strip().lower() if isinstance(name, str) else name
    try:
        return POLICIES[key]
    except (KeyError, TypeError):
        raise invalid(
            f"scheduling policy must be one of {_names_text()}, got {name!r}",
            hint=f"valid scheduling policies: {_names_text()}",
        ) from None


def get_policy(name: str | None = None, **options: Any) -> Policy:
    """A new policy from its SQL name (``None``: the default ``'mop'``) and options.

    Raises :class:`~cerebro_db.errors.CerebroError` (SQLSTATE 22023) for an unknown name,
    listing the valid ones, and for an unknown option, listing the accepted ones.
    """
    klass = policy_class(DEFAULT_POLICY if name is None else name)
    unknown = sorted(set(options) - set(klass.option_names))
    if unknown:
        accepted = ", ".join(klass.option_names) or "none"
        raise invalid(
            f"scheduling policy {klass.name!r} has no option {unknown[0]!r}",
            hint=f"accepted options: {accepted}",
        )
    return klass(**options)
