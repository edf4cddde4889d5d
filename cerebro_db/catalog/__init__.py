"""The only place that writes SQL: this package.

Every statement the project runs is written in ``cerebro_db/catalog/``: this module holds
:class:`Catalog` (the plumbing: bound-parameter queries, cursors, dblink calls, looking up
and creating the tables a user names) and one submodule per area holds that area's named
statements as functions taking the catalog (``jobs``, ``models``, ``inference``,
``packing``, ``units`` for the worker side, ``session``, and ``client`` for the SQLAlchemy
client's statement texts). Identifiers are quoted by :func:`cerebro_db.names.quote_ident`
(or :attr:`TableName.sql`), values are bound parameters, or, for statements that travel as
text over dblink or take no parameters (DDL), quoted by PostgreSQL's ``format()``
(:meth:`Catalog.format_sql`). ``tests/unit/test_sql_in_catalog.py`` fails on SQL written
anywhere else. The package talks to the database through a ``plpy``-like object handed in
by the caller (PL/Python's ``plpy`` inside the server); it imports no driver itself.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import (
    CONNECTION_EXCEPTION,
    DEPENDENT_OBJECTS_STILL_EXIST,
    DUPLICATE_TABLE,
    INSUFFICIENT_PRIVILEGE,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    UNDEFINED_COLUMN,
    UNDEFINED_TABLE,
    UNIQUE_VIOLATION,
    WRONG_OBJECT_TYPE,
    CerebroError,
)
from ..names import TableName, quote_ident
from ..settings import PREFIX as SETTINGS_PREFIX
from ..settings import unknown_settings
from .dblink_gate import TOKEN


@dataclass(frozen=True)
class Column:
    """A column of a relation as the catalog describes it."""

    name: str
    type_name: str  # format_type(), e.g. 'real[]', 'character varying', 'integer'
    base_type: str  # pg_type.typname of the element for arrays, else of the type ('float4')
    is_array: bool
    array_ndims: int  # declared dimensions (0 when not declared)


class DblinkMixin:
    """dblink calls; the functions are looked up in whatever schema dblink lives in."""

    _dblink: str | None = None

    def _dl(self: Any, fn: str) -> str:
        if self._dblink is None:
            rows = self.query("SELECT extnamespace::regnamespace::text AS s FROM "
                              "pg_catalog.pg_extension WHERE extname = 'dblink'")
            if not rows:
                raise CerebroError("the dblink extension is not installed",
                                   OBJECT_NOT_IN_PREREQUISITE_STATE,
                                   hint="CREATE EXTENSION dblink (or install cerebro_db with "
                                   "CASCADE).")
            self._dblink = rows[0]["s"]
        return f"{self._dblink}.{fn}"

    def format_sql(self: Any, template: str, args: Sequence[Any] = (),
                   types: Sequence[str] = ()) -> str:
        """``template`` with ``args`` filled in by PostgreSQL's ``format()``, for statements
        that travel as text (dblink takes no parameters): the values are bound parameters of
        the local call and PostgreSQL quotes them (``%L`` a literal, NULL as NULL; cast in the
        template, e.g. ``%L::bytea``; ``%I`` an identifier)."""
        if not args:
            return template
        marks = ", ".join(f"${i + 2}" for i in range(len(args)))
        rows = self.query(f"SELECT pg_catalog.format($1, {marks}) AS s", [template, *args],
                          ["text", *types])
        return rows[0]["s"]

    def dblink_connect(self: Any, name: str, conninfo: str) -> None:
        self.query(f"SELECT {self._dl('dblink_connect')}($1, $2)", [name, conninfo],
                   ["text", "text"])

    def _gate(self: Any, fn: str, name: str, arg: str | None = None) -> list[str | None]:
        """dblink's function ``fn`` on the open connection ``name``, through the extension's
        ``__dblink`` and this backend's key (:mod:`cerebro_db.catalog.dblink_gate`): PUBLIC
        may not run dblink's functions that use a connection. Rows of one text column."""
        rows = self.query(f"SELECT r FROM {self.ext('__dblink')}($1, $2, $3, $4) AS r",
                          [TOKEN, fn, name, arg], ["text", "text", "text", "text"])
        return [r["r"] for r in rows]

    def dblink_exec(self: Any, name: str, sql: str) -> None:
        self._gate("exec", name, sql)

    def dblink_query(self: Any, name: str, sql: str) -> list[tuple]:
        return [(r,) for r in self._gate("query", name, sql)]

    def dblink_send(self: Any, name: str, sql: str) -> None:
        if self._gate("send", name, sql) != ["1"]:
            raise CerebroError(f"could not send a unit to {name}: "
                               f"{self.dblink_error(name)}", CONNECTION_EXCEPTION)

    def dblink_is_busy(self: Any, name: str) -> bool:
        # PUBLIC's (it tells only whether a result is pending): called directly, 0.04 ms a
        # call less than through the gate, and the coordinator polls it most
        return self.query(f"SELECT {self._dl('dblink_is_busy')}($1) AS b", [name],
                          ["text"])[0]["b"] == 1

    def dblink_error(self: Any, name: str) -> str:
        return self._gate("error", name)[0] or ""

    def dblink_result(self: Any, name: str) -> tuple[bool, str | None, str | None]:
        """The text result of the last query sent on ``name``: (ok, text, error message)."""
        rows = self._gate("result", name, "false")
        self._gate("result", name, "false")  # the extra call that clears the connection
        if not rows:
            return False, None, self.dblink_error(name)
        return True, rows[0], None

    def dblink_rows(self: Any, name: str) -> list[tuple]:
        """The rows (one text column) of the first statement of the string sent on
        ``name``, or its command status; the later statements' results are read (and
        dropped) until the connection is clear. A remote error is raised as the server's
        (with its SQLSTATE)."""
        rows = self._gate("result", name, "true")
        while self._gate("result", name, "true"):  # each later statement's status, then none
            pass
        return [(r,) for r in rows]

    def dblink_next(self: Any, name: str) -> str | None:
        """The next result of a statement string sent on ``name`` (one per statement: a
        row's first column, or a command's status), None at the end or on an error."""
        rows = self._gate("result", name, "false")
        return rows[0] if rows else None

    def dblink_cancel(self: Any, name: str) -> None:
        self._gate("cancel", name)

    def dblink_disconnect(self: Any, name: str) -> None:
        self._gate("disconnect", name)


class Catalog(DblinkMixin):
    """SQL access for one call, over a ``plpy``-like object.

    ``db`` must offer ``prepare(sql, types)``, ``execute(plan_or_sql, args)``,
    ``cursor(plan, args)`` and ``notice(msg)`` like PL/Python's ``plpy``.
    """

    def __init__(self, db: Any, schema: str, caller_path: str | None = None) -> None:
        self.db = db
        self.schema = schema  # the extension's schema (its own tables live there)
        # The caller's search_path: every extension function runs with search_path pinned
        # to pg_catalog, pg_temp (so no object a role can create shadows a function or
        # operator this code calls); the caller's own path is used only to find the tables
        # it names, in :meth:`table`.
        self.caller_path = caller_path
        self._plans: dict[tuple[str, tuple[str, ...]], Any] = {}

    # -- plumbing -------------------------------------------------------------------------
    def query(self, sql: str, args: Sequence[Any] = (), types: Sequence[str] = ()) -> list[dict]:
        """Run one statement with bound parameters; return rows as dicts."""
        if not types:
            return list(self.db.execute(sql)) if not args else self._run(sql, args, types)
        return self._run(sql, args, types)

    def _plan(self, sql: str, types: Sequence[str]) -> Any:
        key = (sql, tuple(types))
        plan = self._plans.get(key)
        if plan is None:
            plan = self.db.prepare(sql, list(types))
            self._plans[key] = plan
        return plan

    def _run(self, sql: str, args: Sequence[Any], types: Sequence[str]) -> list[dict]:
        if len(types) != len(args):
            raise ValueError("one type per argument")
        return list(self.db.execute(self._plan(sql, types), list(args)))

    def stream(self, sql: str, args: Sequence[Any] = (), types: Sequence[str] = (),
               batch: int = 1000) -> Iterator[list[dict]]:
        """Yield the rows of a query in batches, through a server-side cursor."""
        cur = self.db.cursor(self._plan(sql, types), list(args))
        while True:
            rows = cur.fetch(batch)
            if not rows:
                return
            yield list(rows)

    def notice(self, message: str) -> None:
        self.db.notice(message)

    def warning(self, message: str) -> None:
        self.db.warning(message)

    def set_local(self, setting: str, value: str) -> None:
        """``SET LOCAL`` for this transaction, through ``set_config`` (bound values)."""
        self.query("SELECT pg_catalog.set_config($1, $2, true)", [setting, value], ["text", "text"])

    # -- relations ------------------------------------------------------------------------
    def table(self, text: str, what: str) -> TableName:
        """The table a user named, schema-qualified as the caller's search_path finds it.

        An existing table gets its schema; a name that does not exist gets the schema a
        CREATE TABLE of the caller would use (``current_schema()``), or stays unqualified
        when the caller has none (:func:`entrypoints.require_output_schema` says so; never
        ``pg_catalog``, which a direct call of an implementation would otherwise get). Every
        later statement then names it qualified, whatever search_path it runs under."""
        return self._qualified(text, what, existing=True)

    def output_table(self, text: str, what: str) -> TableName:
        """A table the call will create, schema-qualified where a CREATE TABLE of the caller
        would put it (``current_schema()`` in the caller's search_path), whether or not a
        table of that name exists further along the path: a role whose path is
        ``"$user", public`` writes into its own schema even when ``public`` holds a table
        of that name (another role's), as PostgreSQL would (an outside pass got "already
        exists" for the other role's table). A name the caller qualified stays as given;
        without a creation schema the name stays unqualified (see :meth:`table`)."""
        return self._qualified(text, what, existing=False)

    def _qualified(self, text: str, what: str, existing: bool) -> TableName:
        t = TableName.parse(text, what)
        if t.schema is not None:
            return t
        pinned = None
        if self.caller_path is not None:
            pinned = self.query("SELECT pg_catalog.current_setting('search_path') AS p")[0]["p"]
            self.set_local("search_path", self.caller_path)
        try:
            # no operator or unqualified function here: this runs in the caller's path
            row = self.query("SELECT pg_catalog.to_regclass($1)::oid AS oid, "
                             "pg_catalog.current_schema()::text AS creation", [t.sql],
                             ["text"])[0]
        finally:
            if pinned is not None:
                self.set_local("search_path", pinned)
        schema = None
        if existing and row["oid"] is not None:
            schema = self.query("SELECT n.nspname::text AS s FROM pg_catalog.pg_class c JOIN "
                                "pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                                "WHERE c.oid = $1", [row["oid"]], ["oid"])[0]["s"]
            rel = self.relation_owner(TableName(schema, t.name, t.given)) \
                if schema.startswith("pg_temp_") else None
            if rel is not None and not rel["mine"]:
                # the session's own temporary schema comes first in every search_path: a
                # relation another role made there (its SECURITY DEFINER function, called by
                # this session) would shadow the caller's table, and reading a view runs its
                # functions as the caller (a red-team pass: eve's temp view made a
                # superuser's fit run her function)
                raise CerebroError(
                    f'{what} "{t.given}" is found as a temporary relation of role '
                    f'"{rel["owner"]}" in this session, not of the calling role',
                    INSUFFICIENT_PRIVILEGE,
                    hint="Another role's function made it in your session; DISCARD TEMP (or a "
                    "new session) removes it. Qualify the name to reach your own table.")
        elif row["creation"] != "pg_catalog":
            schema = row["creation"]
        return TableName(schema, t.name, t.given) if schema else t

    def relation_oid(self, table: TableName) -> int | None:
        rows = self.query("SELECT pg_catalog.to_regclass($1)::oid AS oid", [table.sql], ["text"])
        return rows[0]["oid"]

    def require_table(self, table: TableName, what: str) -> int:
        """The oid of an existing table, view or materialized view, or a clear error."""
        oid = self.relation_oid(table)
        if oid is None:
            raise CerebroError(
                f'{what} "{table}" does not exist',
                UNDEFINED_TABLE,
                hint="Check the name and the search_path; quote mixed-case names.",
            )
        kind = self.query(
            "SELECT relkind::text AS k FROM pg_catalog.pg_class WHERE oid = $1", [oid], ["oid"]
        )[0]["k"]
        if kind not in ("r", "v", "m", "p", "f"):
            raise CerebroError(f'{what} "{table}" is not a table or view', WRONG_OBJECT_TYPE)
        return self.require_readable(table, what) or oid

    def require_readable(self, table: TableName, what: str) -> int | None:
        """A relation the call reads runs no other role's code as the caller: one that
        belongs to the calling role itself or to a superuser may be anything
        :meth:`require_table` takes; another role's must be a plain or partitioned table
        without row-level security that applies to the caller. Reading a view runs the
        functions in its query as the reader, and a row security policy's expressions too
        (a red-team pass made itself superuser with a view as its model's ``_summary``,
        read by a superuser's ``madlib_keras_predict``). Such a relation is then locked
        (ACCESS SHARE, as the read would) and checked again, whatever its oid: it cannot be
        swapped for a view, or made one in place (``CREATE RULE "_RETURN"`` on an empty
        table keeps the oid: a later red-team pass), before the reads (the worker
        sessions' included). Another role's materialized view cannot be locked (LOCK TABLE
        takes tables and views only), so it is refused too.

        Whoever owns the relation, none of its columns may be of a type of another role
        that is not a superuser (a domain, at any depth of domains and arrays, a composite,
        enum or range type): casting to a domain runs its CHECK constraints, and casting
        from a type runs the casts its owner made, as the caller (the same pass ran a
        function through a domain's CHECK, cast to in predict's output table, and through a
        cast to text). Returns the oid checked, None when there is no such relation."""
        rel = self.relation_owner(table)
        if rel is None:
            return None
        if not (rel["mine"] or rel["owner_super"]):
            self._foreign_readable(table, what, rel)
            self.lock_table(table)
            again = self.relation_owner(table)
            if again is None:
                return None
            if not (again["mine"] or again["owner_super"]):
                self._foreign_readable(table, what, again)
            rel = again
        self._foreign_types(table, what, int(rel["oid"]))
        return int(rel["oid"])

    def _foreign_readable(self, table: TableName, what: str, rel: dict[str, Any]) -> None:
        """Raise unless ``rel``, another role's relation, runs none of its code when read."""
        hint = ("A view or a row security policy of another role runs that role's functions as "
                "you. Ask its owner for a plain table (CREATE TABLE ... AS SELECT), or copy "
                "it into a table of your own.")
        if rel["kind"] == "m":
            raise CerebroError(
                f'{what} "{table}" is a materialized view of role "{rel["owner"]}"; '
                "cerebro_db reads only plain tables of other roles (a materialized view "
                "cannot be locked against being replaced by a view)", INSUFFICIENT_PRIVILEGE,
                hint=hint)
        if rel["kind"] not in ("r", "p"):
            raise CerebroError(
                f'{what} "{table}" is a view or foreign table of role "{rel["owner"]}"; '
                "cerebro_db reads only plain tables of other roles", INSUFFICIENT_PRIVILEGE,
                hint=hint)
        row = self.query(
            "SELECT c.relrowsecurity AS rls, (SELECT r.rolsuper OR r.rolbypassrls FROM "
            "pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user) AS "
            "bypass FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) $1",
            [rel["oid"]], ["oid"])[0]
        if row["rls"] and not row["bypass"]:
            raise CerebroError(
                f'{what} "{table}" of role "{rel["owner"]}" has row-level security, whose '
                "policies would run as you", INSUFFICIENT_PRIVILEGE, hint=hint)

    def _foreign_types(self, table: TableName, what: str, oid: int) -> None:
        """Raise when a column of relation ``oid`` is of a type (or built on a domain or
        array element type) of another role that is not a superuser."""
        rows = self.query(
            "WITH RECURSIVE chain(col, typ) AS ("
            " SELECT a.attname::text, a.atttypid FROM pg_catalog.pg_attribute a"
            "  WHERE a.attrelid OPERATOR(pg_catalog.=) $1 AND a.attnum OPERATOR(pg_catalog.>) 0"
            "    AND NOT a.attisdropped"
            " UNION"
            " SELECT c.col, CASE WHEN t.typtype OPERATOR(pg_catalog.=) 'd'"
            "                    THEN t.typbasetype ELSE t.typelem END"
            "   FROM chain c JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) c.typ"
            "  WHERE t.typtype OPERATOR(pg_catalog.=) 'd'"
            "     OR t.typcategory OPERATOR(pg_catalog.=) 'A')"
            " SELECT c.col, pg_catalog.format_type(t.oid, NULL) AS type,"
            "        pg_catalog.pg_get_userbyid(t.typowner) AS owner"
            "   FROM chain c JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) c.typ"
            "   JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) t.typowner"
            "  WHERE NOT o.rolsuper AND o.rolname OPERATOR(pg_catalog.<>) current_user"
            "  ORDER BY 1 LIMIT 1", [oid], ["oid"])
        if rows:
            r = rows[0]
            raise CerebroError(
                f'{what} "{table}": column "{r["col"]}" is of type {r["type"]} of role '
                f'"{r["owner"]}", whose constraints and casts would run as you',
                INSUFFICIENT_PRIVILEGE,
                hint="cerebro_db reads only columns of built-in types or of types of your "
                "own or of a superuser; copy the data into a table of your own with a "
                "built-in type (CREATE TABLE ... AS SELECT c::<base type> ...).")

    def relation_owner(self, table: TableName) -> dict[str, Any] | None:
        """``oid``, ``kind`` (pg_class.relkind), ``owner`` (the role's name), ``mine``
        (owned by current_user itself, not a role it is a member of) and ``owner_super``
        (the owner is a superuser) of ``table``; None when there is none."""
        rows = self.query(
            "SELECT c.oid, c.relkind::text AS kind, "
            "pg_catalog.pg_get_userbyid(c.relowner) AS owner, "
            "c.relowner OPERATOR(pg_catalog.=) (SELECT r.oid FROM pg_catalog.pg_roles r "
            "WHERE r.rolname OPERATOR(pg_catalog.=) current_user) AS mine, "
            "(SELECT o.rolsuper FROM pg_catalog.pg_roles o "
            "WHERE o.oid OPERATOR(pg_catalog.=) c.relowner) AS owner_super "
            "FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) "
            "pg_catalog.to_regclass($1)", [table.sql], ["text"])
        return rows[0] if rows else None

    def require_own_table(self, table: TableName, what: str) -> None:
        """An existing table the call writes into (appends, deletes, drops) must be a plain
        table owned by the calling role itself: another role's triggers, rules, column
        defaults and index expressions run as the caller who writes into its table (a
        red-team pass made itself superuser through a trigger on a ``model_arch`` table in
        ``public`` and through a temporary table its definer function made in a superuser's
        session). Membership in the owner is not enough: any member could have put the
        trigger there. A superuser's table is fine (a DBA's shared object table): its
        owner gains nothing by running code as the caller.

        The table is then locked (ACCESS SHARE, until the caller's transaction ends) and
        checked again: the owner of its schema may drop a table it does not own, and a
        statement waiting on its lock looks the name up again, so a table replaced between
        this check and the write would be written instead (the red-team pass after the
        check above did that: its trigger ran as a superuser)."""
        rel = self.relation_owner(table)
        if rel is not None and self._own_plain(table, what, rel):
            self.lock_table(table)
            again = self.relation_owner(table)
            if again is not None and again["oid"] != rel["oid"]:
                self._own_plain(table, what, again)

    def lock_table(self, table: TableName) -> None:
        """``LOCK TABLE`` in ACCESS SHARE mode (until the transaction ends): nobody drops or
        replaces it meanwhile; reads and writes go on."""
        self.query(f"LOCK TABLE {table.sql} IN ACCESS SHARE MODE")

    def _own_plain(self, table: TableName, what: str, rel: dict[str, Any]) -> bool:
        """True when ``rel`` (:meth:`relation_owner`) is a plain table of the caller or of a
        superuser; raises otherwise (see :meth:`require_own_table`)."""
        if rel["kind"] != "r":
            raise CerebroError(f'{what} "{table}" is not a plain table', WRONG_OBJECT_TYPE,
                               hint="cerebro_db appends only to plain tables.")
        if not (rel["mine"] or rel["owner_super"]):
            raise CerebroError(
                f'{what} "{table}" belongs to role "{rel["owner"]}", not to the calling role',
                INSUFFICIENT_PRIVILEGE,
                hint="cerebro_db writes only into existing tables the calling role (or a "
                "superuser) owns: another role's triggers and defaults on its table would run "
                "as you. Name a table of your own (a new name is created), or have its owner "
                "run the call.")
        return True

    def require_absent(self, table: TableName, what: str, hint: str | None = None) -> None:
        if self.relation_oid(table) is not None:
            raise CerebroError(
                f'{what} "{table}" already exists',
                DUPLICATE_TABLE,
                hint=hint or "Drop it first or choose another name.",
            )

    def columns(self, oid: int) -> dict[str, Column]:
        rows = self.query(
            """
            SELECT a.attname::text AS name,
                   pg_catalog.format_type(a.atttypid, a.atttypmod) AS type_name,
                   COALESCE(et.typname, t.typname)::text AS base_type,
                   (t.typcategory = 'A') AS is_array,
                   a.attndims AS ndims
              FROM pg_catalog.pg_attribute a
              JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
              LEFT JOIN pg_catalog.pg_type et ON et.oid = t.typelem AND t.typcategory = 'A'
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
             ORDER BY a.attnum
            """,
            [oid],
            ["oid"],
        )
        return {
            r["name"]: Column(r["name"], r["type_name"], r["base_type"], r["is_array"], r["ndims"])
            for r in rows
        }

    def require_column(self, table: TableName, cols: dict[str, Column], name: str,
                       what: str) -> Column:
        col = cols.get(name)
        if col is None:
            shown = ", ".join(list(cols)[:12])
            raise CerebroError(
                f'{what}: column "{name}" does not exist in "{table}"',
                UNDEFINED_COLUMN,
                hint=f"Columns of {table}: {shown}" + (" ..." if len(cols) > 12 else ""),
            )
        return col

    def count_rows(self, table: TableName) -> int:
        return int(self.query(f"SELECT count(*) AS n FROM {table.sql}")[0]["n"])

    # -- DDL and writes -------------------------------------------------------------------
    def create_table(self, table: TableName, columns: Sequence[tuple[str, str]],
                     *, external_storage: Iterable[str] = (), exists_ok: bool = False) -> bool:
        """CREATE TABLE with quoted column names; ``columns`` are (name, SQL type) pairs.
        True when it made the table.

        Types come from the project's code, never from user text. Columns in
        ``external_storage`` skip compression (packed float buffers do not compress well
        and are read far more often than written).

        Another session may create a table of the same name between the caller's check and
        this statement (an outside pass ran three at once): PostgreSQL then says 42P07, or,
        when both inserted the row type at once, 23505 on ``pg_type``. Both become 42P07
        here; with ``exists_ok`` (callers that append to an existing table) the result is
        False instead, once the other session committed, and the caller uses that table.
        """
        body = ", ".join(f"{quote_ident(n)} {t}" for n, t in columns)
        sub = getattr(self.db, "subtransaction", None)
        try:
            with (sub() if sub is not None else contextlib.nullcontext()):
                self.db.execute(f"CREATE TABLE {table.sql} ({body})")
        except Exception as e:
            if getattr(e, "sqlstate", None) not in (DUPLICATE_TABLE, UNIQUE_VIOLATION):
                raise
            if exists_ok:
                return False
            raise CerebroError(f'relation "{table}" already exists', DUPLICATE_TABLE,
                               detail="Another session created it at the same time.") from e
        for n in external_storage:
            self.db.execute(
                f"ALTER TABLE {table.sql} ALTER COLUMN {quote_ident(n)} SET STORAGE EXTERNAL"
            )
        return True

    def insert(self, table: TableName, names: Sequence[str], types: Sequence[str],
               rows: Iterable[Sequence[Any]]) -> int:
        """Insert rows with bound parameters; returns how many."""
        cols = ", ".join(quote_ident(n) for n in names)
        marks = ", ".join(f"${i + 1}" for i in range(len(names)))
        sql = f"INSERT INTO {table.sql} ({cols}) VALUES ({marks})"
        n = 0
        for row in rows:
            self._run(sql, list(row), types)
            n += 1
        return n

    def drop_table(self, table: TableName) -> None:
        self.db.execute(f"DROP TABLE {table.sql}")

    def drop_table_unless_used(self, table: TableName) -> bool:
        """Drop ``table`` unless other objects depend on it (2BP01: another role's view on
        it, which the caller cannot and should not drop); True when it was dropped."""
        sub = getattr(self.db, "subtransaction", None)
        try:
            with (sub() if sub is not None else contextlib.nullcontext()):
                self.db.execute(f"DROP TABLE {table.sql}")
        except Exception as e:
            if getattr(e, "sqlstate", None) != DEPENDENT_OBJECTS_STILL_EXIST:
                raise
            return False
        return True

    def comment_on_table(self, table: TableName, text: str) -> None:
        """COMMENT takes no parameters: the text is quoted by PostgreSQL (:meth:`format_sql`)."""
        self.db.execute(self.format_sql("COMMENT ON TABLE %s IS %L", [table.sql, text],
                                        ["text", "text"]))

    def select(self, table: TableName, names: Sequence[str], where: str = "",
               args: Sequence[Any] = (), types: Sequence[str] = (),
               order_by: Sequence[str] = ()) -> list[dict]:
        """SELECT named columns; ``where`` is project-written SQL with $n placeholders."""
        cols = ", ".join(quote_ident(n) for n in names)
        sql = f"SELECT {cols} FROM {table.sql}"
        if where:
            sql += f" WHERE {where}"
        if order_by:
            sql += " ORDER BY " + ", ".join(quote_ident(n) for n in order_by)
        return self.query(sql, args, types) if args else list(self.db.execute(sql))

    def ext(self, name: str) -> str:
        """A qualified name of one of the extension's own objects."""
        return quote_ident(self.schema) + "." + quote_ident(name)

    def custom_function_modules(self) -> list[str]:
        """Modules the current role may reference in custom functions (see
        ``custom_function_modules`` in the migrations)."""
        rows = self.query(
            f"SELECT module FROM {self.ext('custom_function_modules')} WHERE grantee = 'public' "
            "OR (EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = grantee) AND "
            "pg_catalog.pg_has_role(current_user, grantee, 'MEMBER')) ORDER BY module")
        return [r["module"] for r in rows]

    def dba_setting(self, name: str) -> str | None:
        """A ``cerebro_db.*`` setting as written in the server's configuration files
        (postgresql.conf, ALTER SYSTEM); a value SET in a session, or for a role or
        database, is ignored (any role can SET a custom setting)."""
        v = self.query(f"SELECT {self.ext('__dba_setting')}($1) AS v", [name], ["text"])[0]["v"]
        return v if v not in (None, "") else None

    def stored_setting_names(self, prefix: str) -> list[str]:
        """The names starting with ``prefix`` of the settings stored for this session's
        database and login role (ALTER DATABASE / ROLE ... SET, in ``pg_db_role_setting``)
        and, where the role may read ``pg_file_settings``, in the server's configuration
        files. A name only SET in a session cannot be listed: PostgreSQL hides custom
        placeholders from ``pg_settings``."""
        rows = self.query(
            "SELECT DISTINCT pg_catalog.split_part(c, '=', 1) AS name "
            "FROM pg_catalog.pg_db_role_setting s, pg_catalog.unnest(s.setconfig) c "
            "WHERE s.setdatabase IN (0, (SELECT oid FROM pg_catalog.pg_database "
            "WHERE datname = pg_catalog.current_database())) "
            "AND s.setrole IN (0, (SELECT oid FROM pg_catalog.pg_roles "
            "WHERE rolname = session_user)) "
            "AND pg_catalog.starts_with(pg_catalog.lower(c), $1)", [prefix.lower()], ["text"])
        names = {r["name"] for r in rows}
        if self.query("SELECT pg_catalog.has_table_privilege('pg_catalog.pg_file_settings', "
                      "'SELECT') AS ok")[0]["ok"]:
            names.update(r["name"] for r in self.query(
                "SELECT name FROM pg_catalog.pg_file_settings "
                "WHERE pg_catalog.starts_with(pg_catalog.lower(name), $1)",
                [prefix.lower()], ["text"]))
        return sorted(names)

    def warn_unknown_settings(self) -> None:
        """A WARNING for each ``cerebro_db.*`` setting stored for this session (see
        :meth:`stored_setting_names`) that cerebro_db does not read (a misspelt name would
        otherwise do nothing, silently)."""
        for message in unknown_settings(self.stored_setting_names(SETTINGS_PREFIX)):
            self.warning(message)

    def setting(self, name: str) -> str | None:
        """A (possibly custom) configuration setting, or None when unset or empty."""
        v = self.query("SELECT pg_catalog.current_setting($1, true) AS v", [name], ["text"])[0]["v"]
        return v if v not in (None, "") else None

