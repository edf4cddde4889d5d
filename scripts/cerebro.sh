#!/usr/bin/env bash
# cerebro.sh: set-up and control of the embedded PostgreSQL cluster used by the demo and tests.
#
#   scripts/cerebro.sh deps      install missing Debian packages and the server's Python venv
#   scripts/cerebro.sh install   build the extension's SQL and install it (+ the package into the venv)
#   scripts/cerebro.sh start     init (once) and start the private cluster
#   scripts/cerebro.sh stop      stop it
#   scripts/cerebro.sh running   exit status 0 when the private cluster is running
#   scripts/cerebro.sh createdb NAME   create NAME (if missing) with the extension installed
#   scripts/cerebro.sh psql [args]     psql on the demo database
#   scripts/cerebro.sh env       print the connection parameters
#
# Everything is idempotent: a second run only does what is missing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_VERSION=${PG_VERSION:-15}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/$PG_VERSION/bin}
PGDIR=${CEREBRO_PGDIR:-$ROOT/.pg}
PGDATA=$PGDIR/data
# The port a cluster was made with (its postgresql.conf) is the one it listens on, and every
# later command uses it: `CEREBRO_PGPORT=55470 make start` once, then `make psql`, `make
# stop` and `scripts/cerebro.sh env` without it reach that cluster, not another on 55432.
MADE_PORT=$(sed -n 's/^port = \([0-9][0-9]*\).*/\1/p' "$PGDATA/postgresql.conf" 2>/dev/null | tail -n 1 || true)
if [ -n "$MADE_PORT" ]; then
  if [ -n "${CEREBRO_PGPORT:-}" ] && [ "$CEREBRO_PGPORT" != "$MADE_PORT" ]; then
    printf '[cerebro] error: the cluster in %s listens on port %s (set when it was made), not CEREBRO_PGPORT=%s: unset CEREBRO_PGPORT, or set CEREBRO_PGDIR for another cluster\n' \
      "$PGDATA" "$MADE_PORT" "$CEREBRO_PGPORT" >&2
    exit 1
  fi
  PGPORT=$MADE_PORT
else
  PGPORT=${CEREBRO_PGPORT:-55432}
fi
PGSOCK=$PGDIR/run
PGLOG=$PGDIR/server.log
PGDATABASE=${CEREBRO_DB:-cerebro}
PGSUPER=postgres
VENV=${CEREBRO_VENV:-$ROOT/.venv}
SERVER_PY=/usr/bin/python3
APT_PACKAGES="postgresql-$PG_VERSION postgresql-plpython3-$PG_VERSION postgresql-contrib postgresql-$PG_VERSION-cron python3-venv dataset-fashion-mnist"

log() { printf '[cerebro] %s\n' "$*" >&2; }
die() { printf '[cerebro] error: %s\n' "$*" >&2; exit 1; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else die "need root for: $*"; fi; }

# The OS user that owns and runs the cluster: never root (PostgreSQL refuses it).
run_user() { if [ "$(id -u)" = 0 ]; then echo postgres; else id -un; fi; }
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

cmd_deps() {
  local missing=()
  for p in $APT_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  local want
  want=$(cat "$ROOT/requirements.txt" "$ROOT/requirements-dev.txt" "$ROOT/requirements-remote.txt" | sha256sum | cut -c1-16)
  if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.cerebro-req" 2>/dev/null)" != "$want" ]; then
    log "preparing the server's Python environment in $VENV (tensorflow-cpu, numpy, test tools, dask and ray for the remote executors' tests)"
    [ -x "$VENV/bin/python" ] || "$SERVER_PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements.txt" -r "$ROOT/requirements-dev.txt" 2> >(grep -v '^WARNING: Location' >&2)
    echo "$want" > "$VENV/.cerebro-req"
  fi
}

site_packages() { "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

cmd_install() {
  [ -x "$VENV/bin/python" ] || cmd_deps
  "$VENV/bin/python" "$ROOT/scripts/build_sql.py" --out "$ROOT/build"
  local ext
  ext=$("$PG_BIN/pg_config" --sharedir)/extension
  as_root install -m 644 "$ROOT"/build/cerebro_db.control "$ROOT"/build/cerebro_db--*.sql "$ext/"
  # the package itself, into the venv the server imports from (not editable: PYTHONPATH
  # entries do not process .pth files)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation "$ROOT" 2> >(grep -v '^WARNING: Location' >&2)
}

pg_running() { [ -f "$PGDATA/postmaster.pid" ] && as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; }

cmd_start() {
  [ -x "$VENV/bin/python" ] || cmd_deps
  local user; user=$(run_user)
  if ! as_pg test -x "$ROOT"; then
    die "the OS user '$user' cannot reach $ROOT; clone the project somewhere all users can traverse (e.g. /opt or /srv)"
  fi
  mkdir -p "$PGDIR"
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    log "creating the private cluster in $PGDATA (owner: $user)"
    mkdir -p "$PGDATA" "$PGSOCK"
    [ "$(id -u)" = 0 ] && chown "$user": "$PGDIR" "$PGDATA" "$PGSOCK"
    as_pg "$PG_BIN/initdb" -D "$PGDATA" -U "$PGSUPER" --auth-local=trust --auth-host=scram-sha-256 \
      -E UTF8 --locale=C.UTF-8 >/dev/null
    cat >> "$PGDATA/postgresql.conf" <<CONF
# cerebro_db embedded cluster
port = $PGPORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$PGSOCK'
max_connections = 100
shared_buffers = 256MB
work_mem = 16MB
maintenance_work_mem = 256MB
log_min_messages = warning
CONF
  fi
  local added=0
  ensure_cron_conf && added=1
  if pg_running; then
    if [ "$added" = 0 ]; then ensure_cron_extension; return 0; fi
    log "restarting PostgreSQL to load pg_cron"
    cmd_stop
  fi
  local sp; sp=$(site_packages)
  log "starting PostgreSQL $PG_VERSION on port $PGPORT (socket in $PGSOCK)"
  as_pg env PYTHONPATH="$sp" TF_CPP_MIN_LOG_LEVEL=2 PYTHONDONTWRITEBYTECODE=1 \
    "$PG_BIN/pg_ctl" -D "$PGDATA" -l "$PGLOG" -w -t 60 start >/dev/null \
    || { tail -n 20 "$PGLOG" >&2; die "the server did not start (log: $PGLOG)"; }
  ensure_cron_extension
}

# pg_cron's tables, in cron.database_name (postgres), so that schedule_model_selection works
ensure_cron_extension() {
  psql_cmd -d postgres -qc "SET client_min_messages = warning; CREATE EXTENSION IF NOT EXISTS pg_cron" \
    || die "could not create the pg_cron extension in database postgres"
}

# pg_cron (scheduled model selection jobs): loaded at start, its metadata in the database
# 'postgres' (jobs target other databases with cron.schedule_in_database), connecting over
# the socket (trust). Clusters made before this are given the lines too; returns 0 when it
# added them.
ensure_cron_conf() {
  if as_pg grep -q "^cron.database_name" "$PGDATA/postgresql.conf"; then return 1; fi
  as_pg tee -a "$PGDATA/postgresql.conf" >/dev/null <<CONF
# cerebro_db: scheduled model selection jobs (pg_cron)
shared_preload_libraries = 'pg_cron'
cron.database_name = 'postgres'
cron.host = '$PGSOCK'
CONF
  return 0
}

cmd_stop() {
  if pg_running; then as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null; log "stopped"; fi
}

psql_cmd() { "$PG_BIN/psql" -X -h "$PGSOCK" -p "$PGPORT" -U "$PGSUPER" "$@"; }

cmd_createdb() {
  local db=${1:-$PGDATABASE}
  if ! psql_cmd -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1; then
    psql_cmd -d postgres -qc "CREATE DATABASE \"$db\""
  fi
  # A development build whose script changed under the same version number is reinstalled
  # (the extension's own tables are dropped with it; user tables are not extension members).
  # (A checkout without build/, its extension installed from elsewhere, skips that check.)
  local sum="" mark="$PGDIR/ext-$db.sha"
  if compgen -G "$ROOT/build/cerebro_db--*.sql" >/dev/null; then
    sum=$(cat "$ROOT"/build/cerebro_db--*.sql | sha256sum | cut -c1-16)
  fi
  if [ -n "$sum" ] && [ -f "$mark" ] && [ "$(cat "$mark")" != "$sum" ]; then
    psql_cmd -d "$db" -qc "SET client_min_messages = warning; DROP EXTENSION IF EXISTS cerebro_db CASCADE"
  fi
  psql_cmd -d "$db" -q -v ON_ERROR_STOP=1 <<SQL
SET client_min_messages = warning;
CREATE SCHEMA IF NOT EXISTS cerebro_db;
CREATE EXTENSION IF NOT EXISTS cerebro_db SCHEMA cerebro_db CASCADE;
ALTER EXTENSION cerebro_db UPDATE;
ALTER DATABASE "$db" SET search_path = "\$user", public, cerebro_db;
SQL
  if [ -n "$sum" ]; then echo "$sum" > "$mark"; fi
}

cmd_env() {
  cat <<ENV
PGHOST=$PGSOCK
PGPORT=$PGPORT
PGUSER=$PGSUPER
PGDATABASE=$PGDATABASE
ENV
}

case "${1:-}" in
  deps) cmd_deps ;;
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  running) pg_running ;;
  createdb) shift; cmd_createdb "$@" ;;
  psql) shift; psql_cmd -d "$PGDATABASE" "$@" ;;
  env) cmd_env ;;
  pgdir) echo "$PGDIR" ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
