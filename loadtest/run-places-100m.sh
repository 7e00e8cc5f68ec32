#!/usr/bin/env bash
# places-100m (issue 40): 100 million jittered GeoNames points written as NDJSON, loaded offline
# with `geoshard load` into a fresh data directory, then served: the first start (which builds
# the view from the documents), point-eq and envelope through the HTTP front end (a sample of
# answers checked against the generator's own points), a clean stop (which saves the view) and
# the restart from it to the first answered query, with resident memory at each step. Writes loadtest/reports/NAME.md (+ .json, .svg).
#
#   loadtest/run-places-100m.sh [NAME]        # default NAME: <date>-<PLACES>
#
# Environment: PLACES (places-100m; places-10m gives the figures beside it from the same
# code), REPEAT (2), DURATION (8), WORK (a directory with room: see below).
#
# Disk: about 145 bytes a point for the NDJSON, 125 for the store, 100 for a bulk load's sorted
# runs (deleted at its end) and 75 for the saved view, plus min_free_disk_bytes: some 45 GB for
# places-100m. The script stops at once, saying so, when WORK's file system has less.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PLACES=${PLACES:-places-100m}
NAME=${1:-$(date -u +%Y-%m-%d)-$PLACES}
REPEAT=${REPEAT:-2}
DURATION=${DURATION:-8}
WORK=${WORK:-${TMPDIR:-/tmp}/geoshard-$PLACES}
case "$PLACES" in
  places-*m) n=$(( ${PLACES//[^0-9]/} * 1000000 )) ;;
  places-*k) n=$(( ${PLACES//[^0-9]/} * 1000 )) ;;
  *) echo "PLACES is places-<n>m or places-<n>k"; exit 2 ;;
esac
BIN=$ROOT/target/release
LT=$BIN/geoshard-loadtest
FILE=$WORK/$PLACES.ndjson
DATA=$WORK/data
RES=$WORK/results.jsonl
CMDS=$WORK/commands.txt
GS=127.0.0.1:18013
mkdir -p "$WORK"
rm -f "$RES" "$CMDS"

need=$(( n * (125 + 100 + 75) + 64 * 1024 * 1024 ))
[ -f "$FILE" ] || need=$(( need + n * 145 ))
[ -d "$DATA" ] && need=$(( need - $(du -sb "$DATA" | cut -f1) ))
free=$(df --output=avail -B1 "$WORK" | tail -1)
if [ "$free" -lt "$need" ]; then
  echo "$PLACES needs about $(( need >> 30 )) GiB free on $WORK; $(( free >> 30 )) GiB are." >&2
  echo "Set WORK to a directory on a larger file system." >&2
  exit 3
fi

note() { echo "$*" >> "$CMDS"; }
cleanup() { [ -n "${GS_PID:-}" ] && kill "$GS_PID" 2>/dev/null || true; }
trap cleanup EXIT

cd "$ROOT"
cargo build --release -q -p geoshard -p geoshard-loadtest
note "cargo build --release -p geoshard -p geoshard-loadtest"
if [ ! -f "$FILE" ]; then
  "$LT" ndjson --dataset "$PLACES" --out "$FILE"
fi
note "geoshard-loadtest ndjson --dataset $PLACES --out FILE"

# The offline load, timed, with the loader's peak resident memory.
rm -rf "$DATA"
start=$(date +%s.%N)
if [ -x /usr/bin/time ]; then
  /usr/bin/time -v "$BIN/geoshard" load "$FILE" --service "LT Places" --collection lt-places \
    --data-dir "$DATA" --quiet 2> "$WORK/load.time"
  loader_mib=$(( $(awk -F: '/Maximum resident/ {print $2}' "$WORK/load.time") / 1024 ))
else
  "$BIN/geoshard" load "$FILE" --service "LT Places" --collection lt-places --data-dir "$DATA" --quiet
  loader_mib="?"
fi
load_s=$(echo "$(date +%s.%N) - $start" | bc)
note "geoshard load FILE --service 'LT Places' --collection lt-places --data-dir DIR --quiet"
"$BIN/geoshard" user add --data-dir "$DATA" --name lt --password lt \
  --role rest-writer --role tde-admin --role geo-data-services-writer > /dev/null

# serve_timed: start on the loaded directory; sets GS_PID and $took (exec to the first
# answered query).
serve_timed() {
  local start
  start=$(date +%s.%N)
  GEOSHARD_LOG=info "$BIN/geoshard" serve --data-dir "$DATA" --listen $GS > "$WORK/geoshard.log" 2>&1 &
  GS_PID=$!
  local code
  while :; do
    code=$(curl -s --digest -u lt:lt -o /dev/null -w '%{http_code}' "http://$GS/v1/resources/modelService" || true)
    [ "$code" = 200 ] && break
    # 503: still starting.
    case "$code" in 4*|50[0-24-9]) echo "modelService answered $code" >&2; exit 1 ;; esac
    kill -0 $GS_PID || { tail -20 "$WORK/geoshard.log"; exit 1; }
    sleep 0.05
  done
  took=$(echo "$(date +%s.%N) - $start" | bc)
}
# The first start reads the view the load saved.
serve_timed
first_s=$took
note "geoshard serve --data-dir DIR --listen $GS (timed to the first answered modelService)"
rss_start=$(( $(awk '/VmRSS/ {print $2}' /proc/$GS_PID/status) / 1024 ))

COMMON="--duration $DURATION --warmup 2 --threads 1 --out $RES --dataset $PLACES"
note "geoshard-loadtest run --target geoshard --workload point-eq|envelope --connections 4|64 $COMMON"
for r in $(seq "$REPEAT"); do
  for c in 4 64; do
    for wl in point-eq envelope; do
      "$LT" run --target geoshard --addr $GS --user lt --password lt --workload "$wl" \
        --connections "$c" --server-pid $GS_PID $COMMON > /dev/null
    done
  done
done
rss_end=$(( $(awk '/VmRSS/ {print $2}' /proc/$GS_PID/status) / 1024 ))
# A clean stop saves the view; the restart reads it back.
start=$(date +%s.%N)
kill -TERM $GS_PID; wait $GS_PID 2> /dev/null || true
stop_s=$(echo "$(date +%s.%N) - $start" | bc)
disk_mib=$(( $(du -sb "$DATA" | cut -f1) >> 20 ))
serve_timed
restart_s=$took
rss_restart=$(( $(awk '/VmRSS/ {print $2}' /proc/$GS_PID/status) / 1024 ))
grep -q "view read from its saved file" "$WORK/geoshard.log" || { echo "the restart did not read the saved view"; exit 1; }
"$LT" run --target geoshard --addr $GS --user lt --password lt --workload point-eq \
  --connections 64 --server-pid $GS_PID $COMMON > /dev/null
summary="$n points loaded offline in ${load_s} s ($(echo "$n / $load_s" | bc) a second), loader peak ${loader_mib} MiB"
"$LT" report --results "$RES" --name "$NAME" --dir "$ROOT/loadtest/reports" --commands "$CMDS" \
  --figure "load $PLACES=$summary" \
  --figure "data directory on disk=$disk_mib MiB (store and saved view)" \
  --figure "first start, from the view the load saved=${first_s} s to the first answer" \
  --figure "resident memory after the first start=$rss_start MiB ($(( rss_start * 1048576 / n )) bytes a point); after the runs $rss_end MiB" \
  --figure "clean stop (saves the view unless it was saved since the last write)=${stop_s} s" \
  --figure "restart from the saved view=${restart_s} s to the first answer, $rss_restart MiB ($(( rss_restart * 1048576 / n )) bytes a point)"
cp "$RES" "$ROOT/loadtest/reports/$NAME.results.jsonl"
echo "load ${load_s} s (loader ${loader_mib} MiB); first start ${first_s} s (${rss_start} MiB, ${rss_end} after the runs); stop ${stop_s} s; restart ${restart_s} s (${rss_restart} MiB); disk ${disk_mib} MiB"
