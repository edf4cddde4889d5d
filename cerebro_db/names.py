"""SQL identifiers given as text by users: parsing and quoting, without a database.

Users pass table and column names as strings, as in MADlib: ``'my_table'``,
``'public.my_table'``, ``'"My Table"'``, ``'"s p"."t""q"'``. They follow SQL's rules:
unquoted parts are folded to lower case, quoted parts are kept as written (``""`` is a
quote). Anything else (``'a; drop table b'``, ``'a b'``, ``'x)--'``) is not a name and is
rejected before it could reach SQL text. Every name that reaches SQL is re-quoted by
:func:`quote_ident`, so a parsed name can never change the statement it is placed in.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import INVALID_NAME, NULL_VALUE_NOT_ALLOWED, CerebroError

NAMEDATALEN = 64  # PostgreSQL's default: identifiers are at most 63 bytes
_UNQUOTED = re.compile(r"[A-Za-z_\u0080-\uffff][A-Za-z0-9_$\u0080-\uffff]*")


def quote_ident(name: str) -> str:
    """Quote an identifier the way ``quote_ident`` does, always (never bare)."""
    if "\x00" in name:
        raise CerebroError("identifier contains a NUL character", INVALID_NAME)
    return '"' + name.replace('"', '""') + '"'


def display_name(text: str, what: str) -> str:
    """A stored (always quoted) name as PostgreSQL shows names: each part quoted only where
    it must be (``public.t``, ``s."Mixed Case"``); it parses back to the same parts. A resume
    named its tables ``""public"."t""`` in its messages before."""
    plain = re.compile(r"^[a-z_][a-z0-9_$]*$")
    return ".".join(p if plain.match(p) else quote_ident(p)
                    for p in split_identifier(text, what))


def split_identifier(text: str, what: str) -> list[str]:
    """Split a possibly qualified name into its parts, applying SQL's case folding.

    ``what`` names the parameter for error messages (``source_table``).
    """
    if text is None:
        raise CerebroError(f"{what} must not be NULL", NULL_VALUE_NOT_ALLOWED)
    s = text.strip()
    parts: list[str] = []
    i, n = 0, len(s)
    if n == 0:
        raise CerebroError(f"{what} must not be empty", INVALID_NAME)
    while True:
        if i < n and s[i] == '"':
            j, buf = i + 1, []
            while True:
                k = s.find('"', j)
                if k < 0:
                    raise _bad(text, what, "unterminated quoted identifier")
                buf.append(s[j:k])
                if k + 1 < n and s[k + 1] == '"':
                    buf.append('"')
                    j = k + 2
                    continue
                i = k + 1
                break
            part = "".join(buf)
            if part == "":
                raise _bad(text, what, "zero-length quoted identifier")
        else:
            m = _UNQUOTED.match(s, i)
            if not m:
                raise _bad(text, what, None)
            part = m.group(0).lower()
            i = m.end()
        if len(part.encode("utf-8")) >= NAMEDATALEN:
            raise CerebroError(
                f"{what}: identifier \"{part[:20]}...\" is longer than {NAMEDATALEN - 1} bytes",
                INVALID_NAME,
            )
        parts.append(part)
        if i == n:
            return parts
        if s[i] != ".":
            raise _bad(text, what, None)
        i += 1


def _bad(text: str, what: str, why: str | None) -> CerebroError:
    shown = text if len(text) <= 80 else text[:77] + "..."
    return CerebroError(
        f"{what} is not a valid name: {shown!r}" + (f" ({why})" if why else ""),
        INVALID_NAME,
        hint='Quote names that contain spaces, capitals or punctuation: \'"My Table"\'; '
        "qualify with a schema as schema.table.",
    )


@dataclass(frozen=True)
class TableName:
    """A table name as the user wrote it, split into an optional schema and a name."""

    schema: str | None
    name: str
    given: str

    @classmethod
    def parse(cls, text: str, what: str) -> TableName:
        parts = split_identifier(text, what)
        if len(parts) == 1:
            return cls(None, parts[0], text)
        if len(parts) == 2:
            return cls(parts[0], parts[1], text)
        raise CerebroError(
            f"{what} has too many dotted parts: {text!r}",
            INVALID_NAME,
            hint="Use table or schema.table; cross-database references are not supported.",
        )

    @property
    def sql(self) -> str:
        """The quoted, possibly qualified name, safe to place in SQL text."""
        if self.schema is None:
            return quote_ident(self.name)
        return quote_ident(self.schema) + "." + quote_ident(self.name)

    def with_suffix(self, suffix: str, what: str) -> TableName:
        """The companion table ``<name><suffix>`` in the same schema (``_summary``, ``_info``)."""
        new = self.name + suffix
        if len(new.encode("utf-8")) >= NAMEDATALEN:
            raise CerebroError(
                f"{what} is too long to add {suffix!r}: {self.name!r}",
                INVALID_NAME,
                hint=f"Use a name of at most {NAMEDATALEN - 1 - len(suffix)} bytes.",
            )
        given = self.given.rstrip()
        if not given:
            shown = new
        elif given.endswith('"'):  # a quoted name: the suffix goes inside its quotes
            shown = given[:-1] + suffix + '"'
        else:
            shown = given + suffix
        return TableName(self.schema, new, shown)

    def __str__(self) -> str:
        return self.given.strip()


def split_column_list(text: str, what: str) -> list[str]:
    """Split a comma-separated list of column names (``'x1, "X 2"'``) into folded names."""
    if text is None:
        raise CerebroError(f"{what} must not be NULL", NULL_VALUE_NOT_ALLOWED)
    items: list[str] = []
    cur: list[str] = []
    quoted = False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    names: list[str] = []
    for item in items:
        parts = split_identifier(item, what)
        if len(parts) != 1:
            raise _bad(text, what, "a column name cannot be qualified")
        if parts[0] in names:
            raise CerebroError(f"{what} names column {parts[0]!r} twice", INVALID_NAME)
        names.append(parts[0])
    return names
