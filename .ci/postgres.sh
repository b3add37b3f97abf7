#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on loopback for the store tests; prints the URL to use.
# Usage: url=$(bash .ci/postgres.sh DATADIR PORT)
set -euo pipefail
datadir="$1"; port="${2:-55432}"
if ! command -v pg_ctl >/dev/null 2>&1 && [ ! -x /usr/lib/postgresql/15/bin/pg_ctl ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
fi
bin=$(dirname "$(readlink -f "$(command -v pg_ctl 2>/dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl | tail -n 1)")")
id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
mkdir -p "$datadir"; chown postgres "$datadir"
# the server refuses to run as root: run it as the postgres user, trusting loopback connections
su postgres -s /bin/sh -c "'$bin/initdb' -D '$datadir/data' -A trust -U postgres >/dev/null"
su postgres -s /bin/sh -c "'$bin/pg_ctl' -D '$datadir/data' -l '$datadir/log' -w -o \"-p $port -k '$datadir' -c listen_addresses=127.0.0.1\" start >/dev/null"
su postgres -s /bin/sh -c "'$bin/createdb' -h 127.0.0.1 -p $port -U postgres strop_test"
echo "postgresql://postgres@127.0.0.1:$port/strop_test"
