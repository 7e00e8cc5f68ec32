#!/usr/bin/env bash
# A soak: geoshard under the `mixed` workload (pip-counties, one request in twenty a durable
# PUT), open loop at a share of its own closed-loop peak, for a long run, with its resident
# memory sampled as it goes. Not part of CI.
#
#   loadtest/soak.sh [SECONDS (600)] [SHARE (0.7)]
#
# Prints the peak, the open-loop run's result line (requests, errors, wrong answers,
# latency percentiles) and the resident memory over time; writes them under $OUT (a temp dir
# by default) with the server's log, whose warnings and errors it counts.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_LONG=${1:-600}
SHARE=${2:-0.7}
OUT=${OUT:-$(mktemp -d /tmp/geoshard-soak.XXXXXX)}
ADDR=127.0.0.1:18099
cargo build --release -q -p geoshard -p geoshard-loadtest
BIN=target/release
LT=$BIN/geoshard-loadtest
"$BIN/geoshard" user add --data-dir "$OUT/data" --name lt --password lt \
  --role rest-writer --role tde-admin --role geo-data-services-writer --role rest-extension-user >/dev/null
GEOSHARD_LOG=warn "$BIN/geoshard" serve --data-dir "$OUT/data" --listen $ADDR > "$OUT/geoshard.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
until grep -q "listening" "$OUT/geoshard.log"; do sleep 0.2; done
"$LT" prepare --addr $ADDR --user lt --password lt --dataset counties --server-pid $PID > "$OUT/prepare.json"
# The peak: the median of three closed-loop runs.
for i in 1 2 3; do
  "$LT" run --target geoshard --addr $ADDR --user lt --password lt --workload mixed \
    --connections 64 --duration 15 --warmup 2 --server-pid $PID --out "$OUT/peak.jsonl" >/dev/null
done
PEAK=$(python3 -c "
import json,statistics
rs=[json.loads(l) for l in open('$OUT/peak.jsonl')]
print(statistics.median(r['throughput'] for r in rs))")
RATE=$(python3 -c "print(round($PEAK*$SHARE))")
echo "peak (median of 3, closed loop, 64 conns): $PEAK/s; soak at $SHARE: $RATE/s for ${SECONDS_LONG}s"
rss() { awk '/VmRSS/ {print $2}' /proc/$PID/status; }
( t=0; while kill -0 $PID 2>/dev/null; do echo "$t $(rss)"; sleep 15; t=$((t+15)); done ) > "$OUT/rss.txt" &
SAMPLER=$!
"$LT" run --target geoshard --addr $ADDR --user lt --password lt --workload mixed \
  --connections 64 --rate "$RATE" --duration "$SECONDS_LONG" --warmup 5 --server-pid $PID \
  --out "$OUT/soak.jsonl" >/dev/null
kill $SAMPLER 2>/dev/null || true
echo "soak: $(cat "$OUT/soak.jsonl")"
echo "resident memory (seconds, KiB):"
cat "$OUT/rss.txt"
echo "server log: $(grep -c -E 'WARN|ERROR' "$OUT/geoshard.log" || true) warnings or errors"
echo "results in $OUT"
