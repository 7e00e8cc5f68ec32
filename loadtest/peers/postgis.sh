#!/usr/bin/env bash
# The PostGIS peer: PostgreSQL + PostGIS from Debian's packages, a private cluster on a local
# socket, the same dataset with a GiST index, and the same query points as prepared
# ST_Contains / ST_Intersects statements at the same concurrency (geoshard-loadtest, with
# tokio-postgres).
#
#   loadtest/peers/postgis.sh start                 # install if needed, initdb, start
#   loadtest/peers/postgis.sh load counties         # table + GiST index (any dataset name)
#   loadtest/peers/postgis.sh run pip-counties 64   # workload, connections [extra run args]
#   loadtest/peers/postgis.sh stop
set -euo pipefail
PGVER=${PGVER:-15}
PGBIN=/usr/lib/postgresql/$PGVER/bin
DATA=${GEOSHARD_PG_DATA:-/tmp/geoshard-pgdata}
SOCK=${GEOSHARD_PG_SOCKET:-/tmp/geoshard-pg}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LT=${LOADTEST_BIN:-$ROOT/target/release/geoshard-loadtest}
CONN="host=$SOCK dbname=postgres user=postgres"

as_postgres() { if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else bash -c "$*"; fi; }

install() {
  if ! dpkg -s "postgresql-$PGVER-postgis-3" >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "postgresql-$PGVER" "postgresql-$PGVER-postgis-3" >/dev/null
  fi
}

case "${1:-}" in
  start)
    install
    mkdir -p "$SOCK" && chown postgres "$SOCK" 2>/dev/null || true
    if [ ! -s "$DATA/PG_VERSION" ]; then
      mkdir -p "$DATA" && chown postgres "$DATA" 2>/dev/null || true
      as_postgres "$PGBIN/initdb -D $DATA -A trust -U postgres" >/dev/null
    fi
    # Read-only benchmark: no durability settings matter; enough connections for the sweep.
    as_postgres "$PGBIN/pg_ctl -D $DATA -l $DATA/log -w start -o \"-k $SOCK -c listen_addresses='' -c max_connections=300 -c shared_buffers=1GB -c jit=off\"" >/dev/null
    echo "postgres running on $SOCK"
    ;;
  load)
    "$LT" peer-load --pg "$CONN" --dataset "$2"
    ;;
  run)
    wl=$2; conns=$3; shift 3
    "$LT" run --target postgis --pg "$CONN" --workload "$wl" --connections "$conns" "$@"
    ;;
  stop)
    as_postgres "$PGBIN/pg_ctl -D $DATA -w stop -m fast" >/dev/null || true
    ;;
  *)
    echo "usage: $0 start | load DATASET | run WORKLOAD CONNECTIONS [run args] | stop" >&2
    exit 2
    ;;
esac
