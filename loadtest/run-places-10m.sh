#!/usr/bin/env bash
# places-10m for real: load 10 million jittered GeoNames points into a fresh geoshard over the
# bulk documents API, then serve point-eq and envelope queries on them (answers checked).
# Writes loadtest/reports/NAME.md (+ .json, .svg). Needs about 4 GB of memory and ~10 min.
#
#   loadtest/run-places-10m.sh [NAME]      # default NAME: <date>-places-10m
#
# Environment: REPEAT (default 3), DURATION (default 8), IO_THREADS (default 1),
# CLIENT_THREADS (default 1), PLACES (default places-10m).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NAME=${1:-$(date -u +%Y-%m-%d)-places-10m}
REPEAT=${REPEAT:-3}
DURATION=${DURATION:-8}
IO_THREADS=${IO_THREADS:-1}
CLIENT_THREADS=${CLIENT_THREADS:-1}
PLACES=${PLACES:-places-10m}
BIN=$ROOT/target/release
LT=$BIN/geoshard-loadtest
WORK=$(mktemp -d /tmp/geoshard-places.XXXX)
RES=$WORK/results.jsonl
CMDS=$WORK/commands.txt
GS=127.0.0.1:18012

note() { echo "$*" >> "$CMDS"; }
cleanup() {
  [ -n "${GS_PID:-}" ] && kill "$GS_PID" 2>/dev/null || true
  rm -rf "$WORK/data"
}
trap cleanup EXIT

cd "$ROOT"
cargo build --release -p geoshard -p geoshard-loadtest
note "cargo build --release -p geoshard -p geoshard-loadtest"
"$BIN/geoshard" user add --data-dir "$WORK/data" --name lt --password lt \
  --role rest-writer --role tde-admin --role geo-data-services-writer >/dev/null
GEOSHARD_IO_THREADS=$IO_THREADS GEOSHARD_LOG=warn "$BIN/geoshard" serve --data-dir "$WORK/data" --listen $GS > "$WORK/geoshard.log" 2>&1 &
GS_PID=$!
note "GEOSHARD_IO_THREADS=$IO_THREADS geoshard serve --data-dir DIR --listen $GS"
sleep 2

out=$("$LT" prepare --addr $GS --user lt --password lt --dataset "$PLACES" --server-pid $GS_PID)
echo "$out"
note "geoshard-loadtest prepare --addr $GS --user lt --password lt --dataset $PLACES --server-pid PID"
summary=$(echo "$out" | python3 -c "import json,sys; d=json.load(sys.stdin); print('%d documents in %.0f s (%.0f docs/s over HTTP bulk, durable), index built in %.1f s, server resident %.0f MiB = %.0f bytes per feature' % (d['documents'], d['load_seconds'], d['docs_per_sec'], d['index_seconds'], d['server_rss_bytes'] / 2**20, d['server_rss_bytes_per_document']))")
du=$(du -sb "$WORK/data" | awk '{print $1}')

COMMON="--duration $DURATION --warmup 2 --threads $CLIENT_THREADS --out $RES --dataset $PLACES"
note "geoshard-loadtest run --target geoshard --workload point-eq|envelope --connections C --duration $DURATION --warmup 2 --threads $CLIENT_THREADS --dataset $PLACES"
for r in $(seq "$REPEAT"); do
  for c in 4 64; do
    for wl in point-eq envelope; do
      "$LT" run --target geoshard --addr $GS --user lt --password lt --workload "$wl" \
        --connections "$c" --server-pid $GS_PID $COMMON >/dev/null
    done
  done
done
RSS=$(grep VmRSS /proc/$GS_PID/status | awk '{print $2}')
"$LT" report --results "$RES" --name "$NAME" --dir "$ROOT/loadtest/reports" --commands "$CMDS" \
  --figure "prepare $PLACES=$summary" \
  --figure "data directory on disk=$((du / 1048576)) MiB" \
  --figure "geoshard resident memory after the runs=$((RSS / 1024)) MiB"
cp "$RES" "$ROOT/loadtest/reports/$NAME.results.jsonl"
