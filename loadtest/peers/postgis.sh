#!/usr/bin/env bash
# The PostGIS peer: PostgreSQL + PostGIS from Debian's packages, a private cluster on a local
# socket, the same dataset with a GiST index, and the same query points as prepared
# ST_Contains / ST_Intersects statements at the same concurrency (geoshard-loadtest, with
# tokio-postgres).
#
#   loadtest/peers/postgis.sh start                 # install if needed, initdb, start
#   loadtest/peers/postgis.sh load counties         # table + GiST index (any dataset name)
#   loadtest/peers/postgis.sh run pip-counties 64   # workload, connections [extra run args]
#   loadtest/peers/postgis.sh pgbench select-1 4 8  # PostgreSQL's own client: tps
#   loadtest/peers/postgis.sh stop
#
# `pgbench` checks the peer from outside the harness, with PostgreSQL's own C client (one
# thread, like the harness's report runs) and prepared statements:
# - `select-1` is PostgreSQL's round trip (the issue takes it to be about the HTTP ceiling);
# - `pip-counties` is the statement the harness prepares for the report (ids, names and
#   ST_AsGeoJSON, ST_Contains on the counties) at uniform points in the US bounding box. The
#   harness mixes in GeoNames places, so the points differ.
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
    # No parallel plans: the planner guesses 10,000 rows for a point's index condition on a
    # large point table and starts workers for a one-row lookup (17 ms, not 0.3 ms).
    as_postgres "$PGBIN/pg_ctl -D $DATA -l $DATA/log -w start -o \"-k $SOCK -c listen_addresses='' -c max_connections=300 -c shared_buffers=1GB -c jit=off -c max_parallel_workers_per_gather=0\"" >/dev/null
    echo "postgres running on $SOCK"
    ;;
  load)
    "$LT" peer-load --pg "$CONN" --dataset "$2"
    ;;
  run)
    wl=$2; conns=$3; shift 3
    "$LT" run --target postgis --pg "$CONN" --workload "$wl" --connections "$conns" "$@"
    ;;
  pgbench)
    what=$2; conns=$3; secs=$4
    script=$(mktemp /tmp/geoshard-pgbench.XXXX.sql)
    case $what in
      select-1) echo 'SELECT 1;' > "$script" ;;
      pip-counties)
        # Whole-number microdegrees: pgbench's random() draws integers.
        cat > "$script" <<'SQL'
\set x random(-125000000, -66000000)
\set y random(24000000, 50000000)
SELECT id, name, ST_AsGeoJSON(geom) FROM lt_counties WHERE ST_Contains(geom, ST_SetSRID(ST_MakePoint(:x / 1e6, :y / 1e6), 4326));
SQL
        ;;
      *) echo "pgbench: select-1 or pip-counties" >&2; rm -f "$script"; exit 2 ;;
    esac
    chmod a+r "$script"
    out=$(as_postgres "$PGBIN/pgbench -n -M prepared -f $script -c $conns -j 1 -T $secs -h $SOCK postgres" 2>&1) || { echo "$out" >&2; rm -f "$script"; exit 1; }
    rm -f "$script"
    tps=$(echo "$out" | awk '/^tps = /{print $3}')
    [ -n "$tps" ] || { echo "pgbench gave no tps:" >&2; echo "$out" >&2; exit 1; }
    echo "$tps"
    ;;
  stop)
    as_postgres "$PGBIN/pg_ctl -D $DATA -w stop -m fast" >/dev/null || true
    ;;
  *)
    echo "usage: $0 start | load DATASET | run WORKLOAD CONNECTIONS [run args] | pgbench select-1|pip-counties CONNECTIONS SECONDS | stop" >&2
    exit 2
    ;;
esac
