#!/usr/bin/env bash
# First start of the container only (empty data directory), run by the postgres image's
# entrypoint as the postgres user against its socket-only temporary server:
# install cerebro_db (with plpython3u and dblink, via CASCADE) into $POSTGRES_DB, in schema
# cerebro_db, and put that schema on the database's search_path. Same SQL as
# scripts/cerebro.sh createdb. For another database, run the same four statements there.
set -e

PGHOST= PGHOSTADDR= psql -v ON_ERROR_STOP=1 --no-psqlrc --no-password \
    --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" --set db="$POSTGRES_DB" <<'EOSQL'
SET client_min_messages = warning;
CREATE SCHEMA IF NOT EXISTS cerebro_db;
CREATE EXTENSION IF NOT EXISTS cerebro_db SCHEMA cerebro_db CASCADE;
ALTER DATABASE :"db" SET search_path = "$user", public, cerebro_db;
EOSQL
