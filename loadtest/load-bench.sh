#!/bin/sh
# geoshard load, end to end: places-N (GeoNames jittered, as the load test's places datasets)
# as NDJSON, loaded offline into a fresh data directory and over HTTP into a running server,
# each repeated; then the time for a server to start on the loaded directory and answer.
# Usage: loadtest/load-bench.sh [places-1m] [runs]
set -eu
cd "$(dirname "$0")/.."
dataset=${1:-places-1m}
runs=${2:-3}
work=${TMPDIR:-/tmp}/geoshard-load-bench
mkdir -p "$work"
cargo build --release -q -p geoshard -p geoshard-loadtest
bin=./target/release/geoshard
file="$work/$dataset.ndjson"
[ -f "$file" ] || ./target/release/geoshard-loadtest ndjson --dataset "$dataset" --out "$file"
echo "# $dataset: $(wc -l < "$file") features, $(du -h "$file" | cut -f1)"
rss() { grep 'Maximum resident' "$1" | awk '{print $6/1024 " MiB"}'; }
for i in $(seq "$runs"); do
  rm -rf "$work/offline"
  /usr/bin/time -v "$bin" load "$file" --service places --data-dir "$work/offline" --quiet \
    > "$work/out" 2> "$work/time"
  echo "offline run $i: $(head -1 "$work/out"); loader peak $(rss "$work/time")"
done
"$bin" user add --data-dir "$work/offline" --name bench --password bench --role admin > /dev/null
start=$(date +%s.%N)
"$bin" serve --data-dir "$work/offline" --listen 127.0.0.1:0 > "$work/serve.out" 2> "$work/serve.err" &
pid=$!
until grep -q listening "$work/serve.out" 2> /dev/null; do sleep 0.05; done
addr=$(sed -n 's/.*http:\/\///p' "$work/serve.out")
until curl -sf --digest -u bench:bench "http://$addr/v1/resources/modelService" > /dev/null; do sleep 0.05; done
echo "restart on the loaded directory to the first answer: $(echo "$(date +%s.%N) - $start" | bc) s; server resident $(grep VmRSS /proc/$pid/status | awk '{print $2/1024 " MiB"}')"
kill $pid; wait $pid 2> /dev/null || true
for i in $(seq "$runs"); do
  rm -rf "$work/http"
  "$bin" user add --data-dir "$work/http" --name bench --password bench --role admin > /dev/null
  "$bin" serve --data-dir "$work/http" --listen 127.0.0.1:0 > "$work/serve.out" 2> "$work/serve.err" &
  pid=$!
  until grep -q listening "$work/serve.out" 2> /dev/null; do sleep 0.05; done
  addr=$(sed -n 's/.*http:\/\///p' "$work/serve.out")
  /usr/bin/time -v "$bin" load "$file" --service places --url "http://$addr" --user bench \
    --password bench --quiet > "$work/out" 2> "$work/time"
  echo "http run $i: $(head -1 "$work/out"); loader peak $(rss "$work/time"); server resident $(grep VmHWM /proc/$pid/status | awk '{print $2/1024 " MiB"}') (peak)"
  kill $pid; wait $pid 2> /dev/null || true
done
