#!/bin/sh
# Restart time on places-N, from the documents and from the views saved at a clean stop.
# places-N (GeoNames jittered, as the load test's places datasets) is loaded offline into a
# fresh data directory; then, alternately, a start that builds the views from the documents
# (views/ removed first) and a start that reads them back; each timed from exec to the first
# answered query, with the server's resident memory then and the time of its clean stop (the
# save). Last, 1,000 documents replaced over HTTP and the server SIGKILLed: the next start
# reads the saved views and those documents again.
# Usage: loadtest/restart-bench.sh [places-1m] [runs]
set -eu
cd "$(dirname "$0")/.."
dataset=${1:-places-1m}
runs=${2:-3}
work=${TMPDIR:-/tmp}/geoshard-restart-bench
mkdir -p "$work"
cargo build --release -q -p geoshard -p geoshard-loadtest
bin=$(pwd)/target/release/geoshard
file="$work/$dataset.ndjson"
[ -f "$file" ] || ./target/release/geoshard-loadtest ndjson --dataset "$dataset" --out "$file"
data="$work/data"
rm -rf "$data"
"$bin" load "$file" --service places --data-dir "$data" --quiet
"$bin" user add --data-dir "$data" --name bench --password bench --role admin > /dev/null
echo "# $dataset: $(wc -l < "$file") features; store $(du -sh "$data/geoshard.redb" | cut -f1)"

# start: sets $took (seconds to the first answered query), $rss (MiB), $pid and $addr.
start() {
  rm -f "$work/serve.out"
  s=$(date +%s.%N)
  GEOSHARD_LOG=info "$bin" serve --data-dir "$data" --listen 127.0.0.1:0 > "$work/serve.out" 2> "$work/serve.err" &
  pid=$!
  until grep -q listening "$work/serve.out" 2> /dev/null; do sleep 0.02; done
  addr=$(sed -n 's/.*http:\/\///p' "$work/serve.out")
  until curl -sf --digest -u bench:bench -o /dev/null "http://$addr/v1/resources/modelService"; do sleep 0.02; done
  e=$(date +%s.%N)
  took=$(echo "$e - $s" | bc)
  rss=$(grep VmRSS /proc/$pid/status | awk '{print int($2/1024)}')
}
# stop: SIGTERM, waited for; sets $stopped (seconds).
stop() {
  s=$(date +%s.%N)
  kill -TERM $pid; wait $pid 2> /dev/null || true
  stopped=$(echo "$(date +%s.%N) - $s" | bc)
}

for i in $(seq "$runs"); do
  rm -rf "$data/views"
  start; built=$took; built_rss=$rss
  # A rebuilt view is saved at this stop.
  stop; saving=$stopped
  start; read_back=$took; read_rss=$rss
  grep -q "view read from its saved file" "$work/serve.err" || { echo "saved views not used"; exit 1; }
  stop; unchanged=$stopped
  echo "run $i: from the documents ${built} s (${built_rss} MiB), stop saving ${saving} s; from the saved views ${read_back} s (${read_rss} MiB), stop ${unchanged} s"
done

# 1,000 documents replaced, then SIGKILL.
head -1000 "$file" > "$work/changed.ndjson"
start
"$bin" load "$work/changed.ndjson" --service places --url "http://$addr" --user bench \
  --password bench --quiet > /dev/null
kill -KILL $pid; wait $pid 2> /dev/null || true
start; after_kill=$took
since=$(grep -o 'changed_since=[0-9]*' "$work/serve.err" | head -1)
stop
echo "after 1,000 writes and SIGKILL: from the saved views ${after_kill} s ($since)"
