"""``cerebro-db``: the client's verbs on the command line.

The connection comes from ``--url`` (``postgresql://user@host:port/db``) or, without it,
from the usual libpq variables (PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD, ...).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import UNDEFINED_OBJECT

EXIT_OK = 0
EXIT_SQL = 1         # the server refused or failed the request (message and SQLSTATE on stderr)
EXIT_USAGE = 2       # bad arguments (argparse's own code)
EXIT_NOT_DONE = 3    # watch: the fit ended but not 'done'; cancel: the fit was not running
EXIT_NOT_FOUND = 4   # no such fit or job (or not yours)
EXIT_CONNECT = 5     # cannot connect to the database
EXIT_TIMEOUT = 6     # watch --timeout passed while the fit was still running

EXIT_CODES = f"""exit codes:
  {EXIT_OK}  success
  {EXIT_SQL}  the server refused or failed the request (message and SQLSTATE on stderr)
  {EXIT_USAGE}  bad arguments
  {EXIT_NOT_DONE}  watch: the fit ended but not 'done' (failed, interrupted, cancelled);
     cancel: the fit was not running
  {EXIT_NOT_FOUND}  no such fit or job (or it is another role's)
  {EXIT_CONNECT}  cannot connect to the database
  {EXIT_TIMEOUT}  watch: --timeout passed while the fit was still running
"""

FIT_COLUMNS = ["fit_id", "kind", "status", "model_output_table", "units_done", "total_units",
               "percent", "best_loss", "best_loss_kind", "started_at", "elapsed"]


FIT_STATUSES = ("running", "done", "failed", "interrupted", "cancelled")
"""The statuses a fit can have (the catalog's CHECK constraint, migration 020)."""

def _whole(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: a whole number in [lo, hi] (what the SQL function takes), else a
    usage error (exit 2) instead of the server's 'out of range' (exit 1)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be between {lo} and {hi}, got {v}")
        return v
    return parse


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, 0 or more."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, 0 or more, "
                                         f"got {text}")
    return v


BIGINT = 2**63 - 1
INT4 = 2**31 - 1


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="cerebro-db", formatter_class=fmt,
        description="Watch, plot and steer cerebro_db fits and scheduled jobs. The connection "
        "comes from --url or from the libpq variables PGHOST, PGPORT, PGUSER, PGDATABASE, "
        "PGPASSWORD.", epilog=EXIT_CODES)
    p.add_argument("--url", help="database URL, e.g. postgresql://user@host:5432/db "
                   "(default: the PG* variables)")
    p.add_argument("--schema", default="cerebro_db",
                   help="schema of the extension (default: cerebro_db)")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=help_, epilog=EXIT_CODES,
                              formatter_class=fmt)

    f = verb("fits", "list fits with their progress, newest first")
    f.add_argument("--status", choices=FIT_STATUSES, help="only fits with this status")
    f.add_argument("--limit", type=_whole(0, BIGINT), help="at most this many fits")
    f.add_argument("--format", choices=("table", "csv", "json"), default="table")
    f.add_argument("--all-columns", action="store_true", help="every column of the listing")

    w = verb("watch", "show a progress bar of a fit until it ends (units done/total, best "
             "loss, ETA)")
    w.add_argument("fit_id", type=_whole(-BIGINT - 1, BIGINT))
    w.add_argument("--interval", type=_seconds, default=1.0, help="seconds between polls")
    w.add_argument("--timeout", type=_seconds, help="give up after this many seconds")

    pl = verb("plot", "draw a fit as PNG: gantt (units by worker over time), curves "
              "(learning curves per configuration), automl (trials, rungs, brackets, branches)")
    pl.add_argument("kind", choices=("gantt", "curves", "automl"))
    pl.add_argument("fit_id", type=_whole(-BIGINT - 1, BIGINT))
    pl.add_argument("-o", "--output", help="picture file, PNG, or SVG or PDF by its suffix "
                    "(default: fit<ID>_<kind>.png)")

    c = verb("cancel", "ask a running fit to stop between units (it can be resumed)")
    c.add_argument("fit_id", type=_whole(-BIGINT - 1, BIGINT))

    r = verb("resume", "continue an interrupted, failed or cancelled fit (blocks until it ends)")
    r.add_argument("fit_id", type=_whole(-BIGINT - 1, BIGINT))

    wk = verb("workers", "list a fit's worker sessions; with N, ask the running fit for N "
              "workers")
    wk.add_argument("fit_id", type=_whole(-BIGINT - 1, BIGINT))
    wk.add_argument("num_workers", type=_whole(0, INT4), nargs="?", metavar="N")
    wk.add_argument("--format", choices=("table", "csv", "json"), default="table")

    j = verb("jobs", "list scheduled model selection jobs, or with --runs their run history")
    j.add_argument("job_name", nargs="?", help="only this job")
    j.add_argument("--runs", action="store_true", help="the run history (job_runs)")
    j.add_argument("--format", choices=("table", "csv", "json"), default="table")
    return p


def _print(df: Any, fmt: str) -> None:
    import pandas as pd

    if fmt == "csv":
        sys.stdout.write(df.to_csv(index=False))
    elif fmt == "json":
        sys.stdout.write(df.to_json(orient="records", date_format="iso") + "\n")
    elif df.empty:
        print("(none)")
    else:
        with pd.option_context("display.width", 200, "display.max_columns", 50,
                               "display.max_colwidth", 60):
            print(df.to_string(index=False))


def _exists(client: Any, fit_id: int) -> bool:
    from ..catalog import client as stmts

    return not client.df(stmts.fit_exists(client._sql("fit_progress")), f=fit_id).empty


def _run(args: argparse.Namespace) -> int:
    from .core import Client, ClientError, url_from_env

    try:
        client = Client(args.url or url_from_env(), schema=args.schema)
    except ClientError as e:  # a malformed URL or schema name
        print(f"cerebro-db: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with client.connection():
            pass
    except ClientError as e:
        print(f"cerebro-db: cannot connect: {e}", file=sys.stderr)
        return EXIT_CONNECT
    if getattr(args, "output", None):
        parent = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(parent):
            print(f"cerebro-db: cannot write {args.output}: {parent} is not a directory",
                  file=sys.stderr)
            return EXIT_USAGE
    if hasattr(args, "fit_id") and not _exists(client, args.fit_id):
        print(f"cerebro-db: fit {args.fit_id} does not exist (or is not yours)", file=sys.stderr)
        return EXIT_NOT_FOUND
    if args.verb == "fits":
        df = client.fits(status=args.status, limit=args.limit)
        # a superuser sees every role's fits: say whose (an outside pass could not tell)
        cols = FIT_COLUMNS[:1] + ["owner"] + FIT_COLUMNS[1:] \
            if "owner" in df and df["owner"].nunique() > 1 else FIT_COLUMNS
        _print(df if args.all_columns or args.format != "table" else df[cols], args.format)
    elif args.verb == "watch":
        try:
            p = client.watch(args.fit_id, interval=args.interval, timeout=args.timeout,
                             out=sys.stdout)
        except TimeoutError as e:
            print(f"cerebro-db: {e}", file=sys.stderr)
            return EXIT_TIMEOUT
        return EXIT_OK if p["status"] == "done" else EXIT_NOT_DONE
    elif args.verb == "plot":
        path = args.output or f"fit{args.fit_id}_{args.kind}.png"
        getattr(client, f"plot_{args.kind}")(args.fit_id, path)
        print(path)
    elif args.verb == "cancel":
        ok = client.cancel(args.fit_id)
        print(f"fit {args.fit_id}: " + ("cancel requested" if ok else "not running"))
        return EXIT_OK if ok else EXIT_NOT_DONE
    elif args.verb == "resume":
        client.resume(args.fit_id)
        print(f"fit {args.fit_id}: {client.progress(args.fit_id)['status']}")
    elif args.verb == "workers":
        if args.num_workers is not None:
            client.resize(args.fit_id, args.num_workers)
            print(f"fit {args.fit_id}: asked for {args.num_workers} workers")
        else:
            _print(client.workers(args.fit_id), args.format)
    elif args.verb == "jobs":
        if args.job_name is not None:
            jobs = client.jobs()
            if args.job_name not in set(jobs["job_name"]) and \
                    client.job_runs(args.job_name).empty:
                print(f"cerebro-db: job {args.job_name!r} does not exist", file=sys.stderr)
                return EXIT_NOT_FOUND
        if args.runs:
            _print(client.job_runs(args.job_name), args.format)
        else:
            df = client.jobs()
            if args.job_name is not None:
                df = df[df["job_name"] == args.job_name]
            _print(df, args.format)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from .core import ClientError

    try:
        return _run(args)
    except ClientError as e:
        print(f"cerebro-db: {e}", file=sys.stderr)
        return EXIT_NOT_FOUND if e.sqlstate == UNDEFINED_OBJECT else EXIT_SQL
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
