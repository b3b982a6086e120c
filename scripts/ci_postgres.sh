#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on 127.0.0.1 (a free port, a temporary folder) for the test run.
#
#   eval "$(bash scripts/ci_postgres.sh)"      # prints: export HLOTUNE_POSTGRES_URL=postgresql://...
#                                              #         export HLOTUNE_POSTGRES_DIR=/tmp/hlotune-pg.XXXX
#   bash scripts/ci_postgres.sh stop "$HLOTUNE_POSTGRES_DIR"   # stop the server and delete its folder
#
# Installs Debian's `postgresql` with apt-get when initdb/pg_ctl are not found. As root, the server runs
# as the `postgres` user (or `nobody`), since PostgreSQL refuses to run as root. Everything but the
# export lines goes to stderr, so the output can be eval'ed.
set -euo pipefail

find_bin() {  # find_bin NAME: the path of a PostgreSQL server program, or nothing
    if command -v "$1" >/dev/null 2>&1; then command -v "$1"; return; fi
    ls -1 /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -n 1
}

run_as() {  # run a command as the server's user
    if [ "$(id -u)" = 0 ]; then
        if command -v runuser >/dev/null 2>&1; then runuser -u "$PGUSER_OS" -- "$@"
        else su -s /bin/sh "$PGUSER_OS" -c "$(printf '%q ' "$@")"; fi
    else
        "$@"
    fi
}

if [ "${1:-}" = stop ]; then
    dir=${2:?usage: ci_postgres.sh stop DIR}
    PGUSER_OS=$(stat -c %U "$dir")
    PG_CTL=$(find_bin pg_ctl)
    run_as "$PG_CTL" -D "$dir/data" -m fast -w stop >&2 || true
    rm -rf "$dir"
    exit 0
fi

INITDB=$(find_bin initdb)
PG_CTL=$(find_bin pg_ctl)
if [ -z "$INITDB" ] || [ -z "$PG_CTL" ]; then
    echo "ci_postgres: PostgreSQL not found; installing Debian's postgresql" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends postgresql >&2
    INITDB=$(find_bin initdb)
    PG_CTL=$(find_bin pg_ctl)
fi
[ -n "$INITDB" ] && [ -n "$PG_CTL" ] || { echo "ci_postgres: initdb/pg_ctl still not found" >&2; exit 1; }
BINDIR=$(dirname "$(readlink -f "$INITDB")")

PGUSER_OS=$(id -un)
if [ "$(id -u)" = 0 ]; then
    if id postgres >/dev/null 2>&1; then PGUSER_OS=postgres; else PGUSER_OS=nobody; fi
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/hlotune-pg.XXXXXX")
chmod 755 "$dir"
[ "$(id -u)" = 0 ] && chown "$PGUSER_OS" "$dir"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

run_as "$INITDB" -D "$dir/data" -U hlotune --auth=trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
run_as "$PG_CTL" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-h 127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=100" start >&2 \
    || { cat "$dir/server.log" >&2; exit 1; }
run_as "$BINDIR/createdb" -h 127.0.0.1 -p "$port" -U hlotune hlotune_test >&2

echo "ci_postgres: $("$BINDIR/postgres" --version) on 127.0.0.1:$port ($dir)" >&2
echo "export HLOTUNE_POSTGRES_URL=postgresql://hlotune@127.0.0.1:$port/hlotune_test"
echo "export HLOTUNE_POSTGRES_DIR=$dir"
