"""The key to the extension's own dblink calls (``__dblink``).

dblink keeps its named connections per backend, and any code that runs in that backend can
use any of them by name (``dblink_get_connections()`` lists them). A fit's coordinator holds
its worker and control sessions that way, and keeps idle worker sessions open between fits
(``cerebro_db.worker_idle_timeout``). With dblink's functions open to PUBLIC, another role's
code that ran later in the same backend (its SECURITY DEFINER function, a row-level security
policy or view of its table that calls one) ran SQL as the fit's caller through them: a
red-team pass read a role's tables that way, and made itself superuser through a maintainer's
kept sessions.

So the extension revokes EXECUTE on dblink's functions that use an open connection from
PUBLIC (migration 098), and calls them only through ``@extschema@.__dblink``, a SECURITY
DEFINER function that first asks :func:`check` (``__dblink_gate``) whether its caller
presented :data:`TOKEN`. The token is made when this module is first imported in a backend
and lives only in that backend's Python memory: only code running in PL/Python (the
extension's own, or a superuser's) can read it, and SQL never sees it (it travels as a bound
parameter, which neither ``pg_stat_activity`` nor an error's context shows)."""
from __future__ import annotations

import hmac
import secrets

TOKEN = secrets.token_hex(32)


def check(token: str | None) -> bool:
    """Whether ``token`` is this backend's :data:`TOKEN`."""
    return token is not None and hmac.compare_digest(str(token), TOKEN)
