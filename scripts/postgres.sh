#!/usr/bin/env bash
# Make a local PostgreSQL server available on 127.0.0.1 for the tests, and print its SQLAlchemy URL.
#
#   export TRINE_TEST_POSTGRES_URL="$(scripts/postgres.sh)"
#
# Idempotent (Debian/Ubuntu): installs the `postgresql` package with apt-get if it is missing, uses
# the first existing cluster (or creates one), starts it, and creates (or resets the password of)
# the user and the database. Only the URL goes to stdout; progress goes to stderr.
# Needs root or sudo. Settings: TRINE_PG_USER, TRINE_PG_PASSWORD, TRINE_PG_DB (default trine /
# trine / trine_test) and TRINE_PG_DRIVER (SQLAlchemy driver: psycopg (default) or psycopg2).
set -euo pipefail

PG_USER="${TRINE_PG_USER:-trine}"
PG_PASSWORD="${TRINE_PG_PASSWORD:-trine}"
PG_DB="${TRINE_PG_DB:-trine_test}"
PG_DRIVER="${TRINE_PG_DRIVER:-psycopg}"

log() { echo "postgres.sh: $*" >&2; }

SUDO=()
if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null; then
        log "needs root (or sudo) to install/start PostgreSQL; run it as root."
        exit 1
    fi
    SUDO=(sudo)
fi

if ! command -v pg_lsclusters >/dev/null || [ -z "$(ls /usr/lib/postgresql 2>/dev/null)" ]; then
    log "installing the postgresql package (apt-get)"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi

# First cluster as "version name port status"; create one if there is none.
cluster="$(pg_lsclusters -h 2>/dev/null | awk 'NR==1 {print $1, $2, $3, $4}')"
if [ -z "$cluster" ]; then
    version="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
    log "creating cluster $version/main"
    "${SUDO[@]}" pg_createcluster "$version" main >&2
    cluster="$(pg_lsclusters -h | awk 'NR==1 {print $1, $2, $3, $4}')"
fi
read -r version name port status <<<"$cluster"

if [ "$status" != "online" ]; then
    log "starting cluster $version/$name on port $port"
    "${SUDO[@]}" pg_ctlcluster "$version" "$name" start >&2
fi
for _ in $(seq 1 60); do
    pg_isready -q -h 127.0.0.1 -p "$port" && break
    sleep 0.5
done
if ! pg_isready -q -h 127.0.0.1 -p "$port"; then
    log "PostgreSQL $version/$name is not accepting connections on 127.0.0.1:$port; see /var/log/postgresql/."
    exit 1
fi

as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi
}
psql_admin() { as_postgres psql -p "$port" -v ON_ERROR_STOP=1 -qAt "$@"; }

password_sql="${PG_PASSWORD//\'/\'\'}"
if [ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER'")" = 1 ]; then
    psql_admin -c "ALTER ROLE \"$PG_USER\" WITH LOGIN PASSWORD '$password_sql'" >&2
else
    log "creating user $PG_USER"
    psql_admin -c "CREATE ROLE \"$PG_USER\" WITH LOGIN PASSWORD '$password_sql'" >&2
fi
if [ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" != 1 ]; then
    log "creating database $PG_DB"
    psql_admin -c "CREATE DATABASE \"$PG_DB\" OWNER \"$PG_USER\"" >&2
fi

echo "postgresql+${PG_DRIVER}://${PG_USER}:${PG_PASSWORD}@127.0.0.1:${port}/${PG_DB}"
