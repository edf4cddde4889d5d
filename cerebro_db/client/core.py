"""``Client``: SQL functions with named arguments, the catalog as DataFrames, watching,
cancelling, resuming and resizing fits, and the pictures (``plots``)."""
from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import IO, Any

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ..catalog import client as stmts
from ..errors import (
    CHARACTER_NOT_IN_REPERTOIRE,
    INVALID_PARAMETER_VALUE,
    UNDEFINED_OBJECT,
    CerebroError,
)
from ..names import TableName, quote_ident

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
INTERRUPTED_REREADS = 3
INTERRUPTED_REREAD_WAIT = 0.3
"""A running fit that fit_progress shows as 'interrupted' (its coordinator session not
seen in pg_stat_activity) is read again this many times, this many seconds apart, before
:meth:`Client.watch` reports it."""


class ClientError(Exception):
    """An error of the server (with its SQLSTATE) or of the client's use."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate

    def __str__(self) -> str:
        return f"{self.message} (SQLSTATE {self.sqlstate})" if self.sqlstate else self.message


def url_from_env() -> str:
    """A URL that leaves everything to libpq: PGHOST, PGPORT, PGUSER, PGDATABASE,
    PGPASSWORD (or ~/.pgpass), PGSSLMODE, ... are read by psycopg2 itself."""
    return "postgresql+psycopg2://"


def _driver_url(url: str) -> str:
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg2://" + url[len(scheme):]
    return url


def _error(e: sa.exc.DBAPIError) -> ClientError:
    orig = getattr(e, "orig", None)
    diag = getattr(orig, "diag", None)
    msg = getattr(diag, "message_primary", None) or str(orig or e).strip().splitlines()[0]
    hint = getattr(diag, "message_hint", None)
    return ClientError(msg + (f" (hint: {hint})" if hint else ""),
                       getattr(orig, "pgcode", None))


def _read(c: Connection, sql: str, params: dict[str, Any]) -> pd.DataFrame:
    """``sql`` with ``params`` bound, as a DataFrame; a server error (pandas wraps it in its
    own ``DatabaseError``) becomes :class:`ClientError` with its SQLSTATE."""
    try:
        return pd.read_sql(sa.text(sql), c, params=params)
    except (sa.exc.DBAPIError, pd.errors.DatabaseError) as e:
        cause = e if isinstance(e, sa.exc.DBAPIError) else e.__cause__
        if isinstance(cause, sa.exc.DBAPIError):
            raise _error(cause) from None
        raise


_INT_KEYS = ("best_mst_key", "pid", "worker_pid", "parent", "target", "last_epoch", "worker")


def _int_keys(d: pd.DataFrame) -> pd.DataFrame:
    """Keys and pids as integers where a NULL made pandas read them as floats (a stopped
    worker's ``pid``: 12345.0 beside NaN)."""
    for col in _INT_KEYS:
        if col in d.columns and d[col].dtype.kind == "f":
            d[col] = d[col].astype("Int64")
    return d


def _plain(v: Any, where: str) -> Any:
    """``v`` with numpy scalars and arrays as Python numbers and lists (``np.float64(0.1)``
    would be written as a call, which the server refuses), tuples as lists; a number that
    is not finite is a :class:`ClientError` (22023)."""
    if isinstance(v, dict):
        return {_plain(k, where): _plain(x, where) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x, where) for x in v]
    if type(v).__module__ == "numpy":
        v = v.tolist() if hasattr(v, "tolist") else v.item()
        return _plain(v, where) if isinstance(v, (list, dict)) else v
    if isinstance(v, float) and not math.isfinite(v):
        raise ClientError(f"{where}: {v} is not a finite number", INVALID_PARAMETER_VALUE)
    return v


def _bind(positional: tuple[Any, ...], named: dict[str, Any]) -> tuple[list[str],
                                                                        dict[str, Any]]:
    """The argument names and bound values of a call (``:a<i>`` positional, ``:p<i>``
    named); a dict becomes its Python literal (``{'batch_size': [32, 64]}``), which the
    parameter strings and search grids parse, where psycopg2 cannot adapt it. A text with
    a NUL character is a :class:`ClientError` (PostgreSQL's text cannot hold one)."""
    def value(v: Any, where: str) -> Any:
        if isinstance(v, dict):
            return repr(_plain(v, where))
        if isinstance(v, str) and "\x00" in v:
            raise ClientError(f"{where}: a text value may not contain NUL characters",
                              CHARACTER_NOT_IN_REPERTOIRE)
        return _plain(v, where) if type(v).__module__ == "numpy" else v

    names = [_ident(k, "argument name") for k in named]
    params = {f"a{i}": value(v, f"argument {i + 1}") for i, v in enumerate(positional)}
    params.update({f"p{i}": value(v, k) for i, (k, v) in enumerate(named.items())})
    return names, params


def _table(text: str, what: str) -> TableName:
    """A table name as SQL takes it, or :class:`ClientError` (22023, 42602)."""
    try:
        return TableName.parse(text, what)
    except CerebroError as e:
        raise ClientError(e.message, e.sqlstate) from None


def _ident(name: str, what: str) -> str:
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ClientError(f"{what} must be a plain SQL name, got {name!r}")
    return quote_ident(name)


def interruptible(c: Connection, fn: Callable[[], Any]) -> Any:
    """``fn()`` (a statement on ``c``), where Ctrl-C (SIGINT) cancels the statement on the
    server. psycopg2 waits for a query's answer inside libpq, where Python's signal handler
    does not run until the answer comes: Ctrl-C did nothing during a fit (an outside pass;
    the fit ran to its end). So in the main thread the statement runs in a helper thread
    while the main thread waits in short, interruptible joins; a ``KeyboardInterrupt`` sends
    the server a cancel request on the statement's own connection, and the statement then
    fails with 57014 (the fit is ``cancelled``, its units kept for a resume). Nothing
    process-wide changes (psycopg2's wait callback would switch every connection of the
    process to its asynchronous mode, where COPY fails). Outside the main thread, which
    gets no signals, ``fn()`` runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        return fn()
    out: dict[str, Any] = {}
    done = threading.Event()  # not Thread.join: an interrupted join can leave a thread
                              # marked ended while it still runs (Python 3.11)

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            out["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name="cerebro_db statement", daemon=True).start()
    try:
        while not done.wait(0.2):
            pass
    except KeyboardInterrupt:
        raw = getattr(c.connection, "dbapi_connection", None)
        cancel = getattr(raw, "cancel", None)
        if cancel is None:
            raise
        cancel()
        done.wait()
    if "error" in out:
        raise out["error"]
    return out.get("value")


class Client:
    """A cerebro_db database, reached through SQLAlchemy.

    ``bind`` is a URL (``postgresql://...``; the psycopg2 driver is used), an ``Engine`` or
    a ``Connection`` (then the caller owns its transactions; a fit's worker sessions commit
    on their own either way). ``schema`` is the extension's schema.
    """

    def __init__(self, bind: str | Engine | Connection | None = None, *,
                 schema: str = "cerebro_db") -> None:
        if bind is None:
            bind = url_from_env()
        if isinstance(bind, str):
            try:
                bind = sa.create_engine(_driver_url(bind), poolclass=sa.pool.NullPool)
            except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as e:
                raise ClientError(f"not a PostgreSQL URL: {bind!r} ({e})") from None
        if not isinstance(bind, (Engine, Connection)):
            raise ClientError(f"bind must be a URL, an Engine or a Connection, got {type(bind)}")
        self.bind = bind
        self.schema = schema
        self._s = _ident(schema, "schema")

    # -- plumbing -----------------------------------------------------------------------
    @contextlib.contextmanager
    def connection(self, autocommit: bool = True) -> Iterator[Connection]:
        """The given connection, or a new one of the engine (autocommit: each statement,
        and each step of a procedure, commits on its own)."""
        try:
            if isinstance(self.bind, Connection):
                yield self.bind
                return
            with self.bind.connect() as c:
                if autocommit:
                    c = c.execution_options(isolation_level="AUTOCOMMIT")
                yield c
        except sa.exc.DBAPIError as e:
            raise _error(e) from None

    def _fresh(self) -> contextlib.AbstractContextManager[Connection]:
        """A connection of its own (for watching), even when the client wraps a Connection."""
        engine = self.bind.engine if isinstance(self.bind, Connection) else self.bind
        return self.__class__(engine, schema=self.schema).connection()

    def _sql(self, name: str) -> str:
        return f"{self._s}.{_ident(name, 'name')}"

    def df(self, sql: str, **params: Any) -> pd.DataFrame:
        """A query (``:name`` placeholders, bound) as a DataFrame."""
        with self.connection() as c:
            return _read(c, sql, params)

    def call(self, function: str, /, *positional: Any, **args: Any) -> Any:
        """``SELECT schema.function(value, ..., name => value, ...)`` with bound values
        (``call('madlib_keras_fit', 'help')`` as in SQL); returns the scalar result (None
        for VOID). A dict is passed as the Python literal MADlib's parameter strings take
        (a search grid), a list as an array."""
        names, params = _bind(positional, args)
        with self.connection() as c:
            try:
                return interruptible(c, lambda: c.execute(
                    sa.text(stmts.call(self._sql(function), names, len(positional))),
                    params).scalar())
            except sa.exc.DBAPIError as e:
                raise _error(e) from None

    def call_procedure(self, procedure: str, /, *positional: Any, **args: Any) -> None:
        """``CALL schema.procedure(value, ..., name => value, ...)`` (autocommit: it
        commits itself)."""
        names, params = _bind(positional, args)
        with self.connection() as c:
            try:
                interruptible(c, lambda: c.execute(
                    sa.text(stmts.call_procedure(self._sql(procedure), names,
                                                 len(positional))), params))
            except sa.exc.DBAPIError as e:
                raise _error(e) from None

    # -- the catalog as DataFrames ------------------------------------------------------
    def _of_fit(self, fit_id: int, sql: str) -> pd.DataFrame:
        """A fit's rows of a catalog relation; :class:`ClientError` (42704) when the fit
        does not exist or is another role's (not an empty frame, which reads as a fit
        that has no units yet)."""
        d = self.df(sql, f=fit_id)
        if d.empty:
            self.progress(fit_id)
        return _int_keys(d)

    def fits(self, status: str | None = None, limit: int | None = None) -> pd.DataFrame:
        """Every fit with its progress (``fit_progress`` plus the fit's kind, tables and
        times), newest first; ``status`` filters (as fit_progress shows it)."""
        d = self.df(stmts.fits(self._sql("fit_progress"), self._sql("fits")),
                    status=status, limit=limit)
        return _int_keys(d)

    def progress(self, fit_id: int) -> dict[str, Any]:
        """One fit's row of ``fit_progress``."""
        d = self.df(stmts.fit_rows(self._sql("fit_progress")), f=fit_id)
        if d.empty:
            raise ClientError(f"fit {fit_id} does not exist (or is not yours)",
                              UNDEFINED_OBJECT)
        return _int_keys(d).iloc[0].to_dict()

    def units(self, fit_id: int) -> pd.DataFrame:
        """Every unit of a fit (training and evaluation), in the order they started."""
        return self._of_fit(fit_id, stmts.units(self._sql("units")))

    def configs(self, fit_id: int) -> pd.DataFrame:
        """Per configuration: ``fit_config_progress``."""
        return self._of_fit(fit_id, stmts.by_config(self._sql("fit_config_progress")))

    def info(self, model_output_table: str) -> pd.DataFrame:
        """The ``<model_output_table>_info`` table."""
        t = _table(model_output_table, "model_output_table")
        return self.df(stmts.info(t.with_suffix("_info", "model_output_table").sql))

    def summary(self, model_output_table: str) -> dict[str, Any]:
        t = _table(model_output_table, "model_output_table")
        d = self.df(stmts.summary(t.with_suffix("_summary", "model_output_table").sql))
        return d.iloc[0].to_dict() if not d.empty else {}

    def automl_trials(self, fit_id: int) -> pd.DataFrame:
        return self._of_fit(fit_id, stmts.by_config(self._sql("automl_trials")))

    def automl_decisions(self, fit_id: int) -> pd.DataFrame:
        return self._of_fit(fit_id, stmts.automl_decisions(self._sql("automl_decisions")))

    def workers(self, fit_id: int) -> pd.DataFrame:
        """The availability map of a fit's worker sessions (``fit_workers``)."""
        return self._of_fit(fit_id, stmts.workers(self._sql("fit_workers")))

    def jobs(self) -> pd.DataFrame:
        """Scheduled model selection jobs with their last run (``model_selection_jobs``)."""
        return self.df(stmts.jobs(self._sql("model_selection_jobs")))

    def job_runs(self, job_name: str | None = None) -> pd.DataFrame:
        """Run history of the jobs (``job_runs``), newest first."""
        return self.df(stmts.job_runs(self._sql("job_runs")), j=job_name)

    # -- acting on fits and jobs --------------------------------------------------------
    def cancel(self, fit_id: int) -> bool:
        """Ask a running fit to stop between units (``cerebro_db_cancel_fit``); True when
        the fit was running and is now asked to stop."""
        return bool(self.call("cerebro_db_cancel_fit", fit_id=int(fit_id)))

    def resume(self, fit_id: int) -> None:
        """Continue an interrupted, cancelled or failed fit (``madlib_keras_fit_resume``;
        blocks)."""
        self.call("madlib_keras_fit_resume", fit_id=int(fit_id))

    def resize(self, fit_id: int, num_workers: int) -> None:
        """Ask a running fit for ``num_workers`` worker sessions (``cerebro_db_fit_workers``)."""
        if not isinstance(num_workers, int) or isinstance(num_workers, bool):
            raise ClientError(f"num_workers must be an integer, got {num_workers!r}",
                              INVALID_PARAMETER_VALUE)
        self.call("cerebro_db_fit_workers", fit_id=int(fit_id), num_workers=int(num_workers))

    def schedule_model_selection(self, job_name: str, schedule: str | None,
                                 **args: Any) -> int:
        """``schedule_model_selection`` with named arguments (dicts for the JSONB ones)."""
        import json

        for k in ("fit_options", "preprocess_options"):
            if isinstance(args.get(k), dict):
                args[k] = json.dumps(args[k])
        return int(self.call("schedule_model_selection", job_name=job_name, schedule=schedule,
                             **args))

    def run_job(self, job_name: str) -> dict[str, Any]:
        """Run a job now (``CALL run_model_selection_job``); returns its history row. A run
        that ends failed raises :class:`ClientError` (the procedure fails after recording
        it; its row is in :meth:`job_runs`)."""
        self.call_procedure("run_model_selection_job", job_name=job_name)
        return self.job_runs(job_name).iloc[0].to_dict()

    def unschedule_model_selection(self, job_name: str) -> bool:
        return bool(self.call("unschedule_model_selection", job_name=job_name))

    # -- watching -----------------------------------------------------------------------
    def watch(self, fit_id: int, *, interval: float = 1.0, timeout: float | None = None,
              out: IO[str] | None = None, width: int = 30) -> dict[str, Any]:
        """Show a progress bar of a fit (units done/total, best loss, ETA) until it ends,
        polling ``fit_progress`` from a connection of its own; returns the last row. On a
        terminal the bar redraws in place, otherwise a line is printed when it changes.
        Raises ``TimeoutError`` after ``timeout`` seconds."""
        out = out if out is not None else sys.stderr
        tty = hasattr(out, "isatty") and out.isatty()
        t0 = time.monotonic()
        last = None
        doubts = INTERRUPTED_REREADS
        while True:
            with self._fresh() as c:
                d = _read(c, stmts.fit_rows(self._sql("fit_progress")), {"f": fit_id})
            if d.empty:
                raise ClientError(f"fit {fit_id} does not exist (or is not yours)",
                              UNDEFINED_OBJECT)
            p = d.iloc[0].to_dict()
            if p["status"] == "interrupted" and doubts > 0:
                # fit_progress calls a running fit 'interrupted' from one reading of
                # pg_stat_activity: believe it when it holds over a few re-reads
                doubts -= 1
                time.sleep(INTERRUPTED_REREAD_WAIT)
                continue
            doubts = INTERRUPTED_REREADS
            line = progress_line(p, width)
            if tty:
                out.write("\r" + line)
            elif line != last:
                out.write(line + "\n")
            out.flush()
            last = line
            if p["status"] != "running":
                if tty:
                    out.write("\n")
                return p
            if timeout is not None and time.monotonic() - t0 > timeout:
                if tty:
                    out.write("\n")
                raise TimeoutError(f"fit {fit_id} still running after {timeout} s")
            time.sleep(interval)

    # -- pictures -----------------------------------------------------------------------
    def plot_gantt(self, fit_id: int, path: str | None = None) -> Any:
        from . import plots

        self.progress(fit_id)  # ClientError (42704) for a fit that does not exist
        return _save(plots.gantt(self.units(fit_id), title=f"fit {fit_id}"), path)

    def plot_curves(self, fit_id: int, path: str | None = None) -> Any:
        from . import plots

        p = self.progress(fit_id)
        return _save(plots.learning_curves(self.units(fit_id), int(p["num_partitions"]),
                                                title=f"fit {fit_id}"), path)

    def plot_automl(self, fit_id: int, path: str | None = None) -> Any:
        from . import plots

        self.progress(fit_id)
        kind = self.df(stmts.fit_rows(self._sql("fits")), f=fit_id)["kind"].iloc[0]
        if kind != "automl":
            raise ClientError(f"fit {fit_id} is not an AutoML run (it is a {kind!r} fit); "
                              "plot its units with plot_gantt or plot_curves",
                              INVALID_PARAMETER_VALUE)
        return _save(plots.automl_timeline(self.units(fit_id), self.automl_trials(fit_id),
                                                self.automl_decisions(fit_id),
                                                title=f"AutoML fit {fit_id}"), path)


PICTURE_FORMATS = ("png", "svg", "pdf")


def _save(fig: Any, path: str | os.PathLike[str] | None) -> Any:
    """:func:`plots.save` in the format the path's suffix names (PNG without one), where a
    path that is not a path, a suffix of another format and a file that cannot be written
    are a :class:`ClientError` (an outside pass got a traceback for a folder that does not
    exist, an AttributeError for a number and a PNG in a '.svg' file)."""
    from . import plots

    fmt = "png"
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            plots._plt().close(fig)
            raise ClientError(f"path must be a file name, got {path!r}",
                              INVALID_PARAMETER_VALUE)
        path = os.fspath(path)
        suffix = os.path.splitext(path)[1].lower().lstrip(".")
        if suffix and suffix not in PICTURE_FORMATS:
            plots._plt().close(fig)
            raise ClientError(f"cannot write a picture as .{suffix}: the formats are "
                              f"{', '.join(PICTURE_FORMATS)}", INVALID_PARAMETER_VALUE)
        fmt = suffix or fmt
    try:
        return plots.save(fig, path, fmt=fmt)
    except OSError as e:
        plots._plt().close(fig)
        raise ClientError(f"cannot write the picture to {path}: {e.strerror or e}") from None


def _td(v: Any) -> str:
    if v is None or pd.isna(v):
        return "-"
    if isinstance(v, pd.Timedelta):
        v = v.to_pytimedelta()
    if isinstance(v, timedelta):
        s = int(v.total_seconds())
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return str(v)


def progress_line(p: dict[str, Any], width: int = 30) -> str:
    """``fit 7 [#######.......] 12/40 units  30.0%  best validation loss 0.5120  ETA 0:01:23
    running``: the best loss says which it is (``fit_progress.best_loss_kind``: a validation
    loss once one is evaluated, a training loss before)."""
    done, total = int(p.get("units_done") or 0), int(p.get("total_units") or 0)
    fill = round(width * done / total) if total else 0
    bar = "#" * fill + "." * (width - fill)
    best = p.get("best_loss")
    best_s = "-" if best is None or pd.isna(best) else f"{best:.4f}"
    pct = 100.0 * done / total if total else 0.0
    kind = p.get("best_loss_kind")
    which = f"best {kind} loss" if isinstance(kind, str) else "best loss"
    return (f"fit {p['fit_id']} [{bar}] {done}/{total} units {pct:5.1f}%  {which} {best_s}  "
            f"ETA {_td(p.get('eta')) if p['status'] == 'running' else '-'}  "
            f"elapsed {_td(p.get('elapsed'))}  {p['status']}")
