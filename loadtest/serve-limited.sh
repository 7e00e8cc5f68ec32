#!/usr/bin/env bash
# Serve a data directory under a memory limit smaller than its data, and measure point queries:
# a cgroup (v2 `memory.max`, or v1 `memory.limit_in_bytes`; needs root) holds the server, whose
# saved views are mapped files the kernel may evict and read again. Prints the restart time,
# the point-eq rate (64 connections, answers checked) and the cgroup's peak memory; a server
# killed for memory says so. The directory needs a user `lt`/`lt` and a places layer loaded by
# growth-check.sh (KEEP=1).
#
#   loadtest/serve-limited.sh DATA_DIR LIMIT_MB DATASET [BINARY]
#   loadtest/serve-limited.sh /tmp/geoshard-growth/data-4m 192 places-4m
set -euo pipefail
DATA=$1 LIMIT_MB=$2 DATASET=$3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${4:-$ROOT/target/release/geoshard}
LT=$ROOT/target/release/geoshard-loadtest
ADDR=127.0.0.1:18015
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  CG=/sys/fs/cgroup/geoshard-limited
  mkdir -p $CG
  echo $((LIMIT_MB << 20)) > $CG/memory.max
  PEAK=$CG/memory.peak
else
  CG=/sys/fs/cgroup/memory/geoshard-limited
  mkdir -p $CG
  echo $((LIMIT_MB << 20)) > $CG/memory.limit_in_bytes
  PEAK=$CG/memory.max_usage_in_bytes
  echo 0 > $PEAK
fi
# Nothing of the directory in the page cache: the limit must hold from a cold start.
sync
echo 3 > /proc/sys/vm/drop_caches
start=$(date +%s.%N)
sh -c "echo \$\$ > $CG/cgroup.procs && exec $BIN serve --data-dir $DATA --listen $ADDR" \
  > "${TMPDIR:-/tmp}/serve-limited.log" 2>&1 &
PID=$!
trap 'kill $PID 2> /dev/null || true' EXIT
while :; do
  code=$(curl -s --digest -u lt:lt -o /dev/null -w '%{http_code}' "http://$ADDR/v1/resources/modelService" || true)
  [ "$code" = 200 ] && break
  kill -0 $PID 2> /dev/null || { echo "the server died (killed for memory?)"; tail -3 "${TMPDIR:-/tmp}/serve-limited.log"; exit 1; }
  sleep 0.02
done
echo "restart $(echo "$(date +%s.%N) - $start" | bc) s under $LIMIT_MB MB"
"$LT" run --target geoshard --addr $ADDR --user lt --password lt --workload point-eq \
  --connections 64 --duration 8 --warmup 2 --threads 1 --dataset "$DATASET" \
  --server-pid $PID --out "${TMPDIR:-/tmp}/serve-limited.jsonl" > /dev/null
tail -1 "${TMPDIR:-/tmp}/serve-limited.jsonl" | python3 -c '
import json, sys
r = json.load(sys.stdin)
print("point-eq %.0f/s, %d mismatched, %d errors" % (r["throughput"], r["mismatched"], r["errors"]))'
kill -0 $PID 2> /dev/null || { echo "the server died during the run"; exit 1; }
echo "RssAnon $(awk '/RssAnon/ {print $2, $3}' /proc/$PID/status), RssFile $(awk '/RssFile/ {print $2, $3}' /proc/$PID/status), cgroup peak $(( $(cat $PEAK) >> 20 )) MB"
