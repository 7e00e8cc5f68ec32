#!/bin/bash
# The cost of recording metrics: alternating closed-loop pip-counties runs against geoshard
# with metrics on and off (access log off for both). Usage: loadtest/metrics-ab.sh
set -e
cd "$(dirname "$0")/.."
B=./target/release/geoshard; L=./target/release/geoshard-loadtest
D=/tmp/metrics-ab; rm -rf $D; mkdir -p $D
$B user add --data-dir $D/data --name bench --password bench --role admin > /dev/null
start() { GEOSHARD_ACCESS_LOG=false GEOSHARD_METRICS=$1 GEOSHARD_LOG=warn $B serve --data-dir $D/data --listen 127.0.0.1:8130 > $D/serve.out 2>&1 & PID=$!; until grep -q listening $D/serve.out 2>/dev/null; do sleep 0.1; done; }
start true
$L prepare --addr 127.0.0.1:8130 --user bench --password bench --dataset counties > /dev/null
kill $PID; wait $PID 2>/dev/null || true
for round in 1 2 3 4; do
  for m in true false; do
    start $m
    $L run --target geoshard --addr 127.0.0.1:8130 --user bench --password bench --workload pip-counties --connections 64 --duration 8 --warmup 2 --out $D/results.jsonl > $D/run.out 2>&1
    echo "metrics=$m round=$round $(tail -1 $D/results.jsonl | python3 -c 'import json,sys; r=json.load(sys.stdin); print(round(r["throughput"]), "req/s p50", r["p50_us"], "p99", r["p99_us"])')"
    kill $PID; wait $PID 2>/dev/null || true
  done
done
