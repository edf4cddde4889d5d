"""SQLSTATEs are written once, as named constants in cerebro_db/errors.py: a five-character
SQLSTATE literal anywhere else in the package fails this test."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from cerebro_db import errors

PACKAGE = Path(errors.__file__).resolve().parent
# A SQLSTATE: five digits or upper-case letters, with at least one digit (PostgreSQL class
# codes start with a digit or a letter; every code has a digit).
SQLSTATE = re.compile(r"^(?=.*[0-9])[0-9A-Z]{5}$")


def sqlstate_literals(source: str) -> list[tuple[int, str]]:
    """(line, literal) of each SQLSTATE-shaped string constant in ``source``."""
    return [(n.lineno, n.value) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and SQLSTATE.match(n.value)]


def test_the_check_finds_a_literal():
    assert sqlstate_literals('raise CerebroError("bad", "22023")') == [(1, "22023")]
    assert sorted(sqlstate_literals("x = {'57P01', '40001'}")) == [(1, "40001"), (1, "57P01")]
    assert sqlstate_literals('raise CerebroError("bad", INVALID_PARAMETER_VALUE)') == []
    assert sqlstate_literals('s = "ABCDE"; t = "2202"') == []


def test_no_sqlstate_literal_outside_errors_py():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "errors.py":
            continue
        found += [f"{path.relative_to(PACKAGE.parent)}:{line}: {code!r}"
                  for line, code in sqlstate_literals(path.read_text())]
    assert not found, "use the constants of cerebro_db/errors.py:\n" + "\n".join(found)


def test_errors_py_names_each_sqlstate_once():
    codes = {k: v for k, v in vars(errors).items()
             if k.isupper() and isinstance(v, str) and SQLSTATE.match(v)}
    assert len(codes) >= 30
    assert len(set(codes.values())) == len(codes), codes
