#!/bin/sh
# Two builds of geoshard, alternating: an offline `geoshard load` of an NDJSON file into a
# fresh data directory (views built and saved), then a server started on it until its first
# answer. Prints one line per run; compare within one run of this script.
# Usage: loadtest/offline-ab.sh A_BINARY B_BINARY FILE.ndjson [runs]
# (FILE from `geoshard-loadtest ndjson --dataset places-1m --out FILE`.)
set -eu
a=$1
b=$2
file=$3
runs=${4:-3}
work=${TMPDIR:-/tmp}/geoshard-offline-ab
mkdir -p "$work"
rss() { grep 'Maximum resident' "$1" | awk '{print $6/1024 " MiB"}'; }
for i in $(seq "$runs"); do
  for side in A B; do
    if [ "$side" = A ]; then bin=$a; else bin=$b; fi
    rm -rf "$work/data"
    /usr/bin/time -v "$bin" load "$file" --service places --data-dir "$work/data" --quiet \
      > "$work/out" 2> "$work/time"
    "$bin" user add --data-dir "$work/data" --name bench --password bench --role admin > /dev/null
    start=$(date +%s.%N)
    "$bin" serve --data-dir "$work/data" --listen 127.0.0.1:0 > "$work/serve.out" 2> "$work/serve.err" &
    pid=$!
    until grep -q listening "$work/serve.out" 2> /dev/null; do sleep 0.02; done
    addr=$(sed -n 's/.*http:\/\///p' "$work/serve.out")
    until curl -sf --digest -u bench:bench "http://$addr/v1/resources/modelService" > /dev/null; do
      sleep 0.02
    done
    up=$(echo "$(date +%s.%N) - $start" | bc)
    kill $pid
    wait $pid 2> /dev/null || true
    echo "run $i $side: $(head -1 "$work/out" | sed 's/.* in //'); loader peak $(rss "$work/time"); server start to first answer $up s"
  done
done
