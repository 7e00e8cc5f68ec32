#!/bin/sh
# geoshard load over HTTP, two server binaries alternated: places-N (GeoNames jittered, as the
# load test's) loaded by this tree's loader into a fresh directory served by each binary in
# turn. Prints records/s and the CPU seconds of the server and of its store-writer thread.
# Usage: loadtest/load-ab.sh BASE_BIN NEW_BIN [places-1m] [runs]
set -eu
cd "$(dirname "$0")/.."
base=$1; new=$2; dataset=${3:-places-1m}; runs=${4:-3}
work=${TMPDIR:-/tmp}/geoshard-load-ab
mkdir -p "$work"
cargo build --release -q -p geoshard -p geoshard-loadtest
file="$work/$dataset.ndjson"
[ -f "$file" ] || ./target/release/geoshard-loadtest ndjson --dataset "$dataset" --out "$file"
one() {
  rm -rf "$work/d"
  "$1" user add --data-dir "$work/d" --name bench --password bench --role admin > /dev/null
  "$1" serve --data-dir "$work/d" --listen 127.0.0.1:0 > "$work/serve.out" 2> "$work/serve.err" &
  pid=$!
  until grep -q listening "$work/serve.out" 2> /dev/null; do sleep 0.05; done
  addr=$(sed -n 's/.*http:\/\///p' "$work/serve.out")
  ./target/release/geoshard load "$file" --service places --url "http://$addr" --user bench \
    --password bench --quiet | head -1
  for t in /proc/$pid/task/*; do
    [ "$(cat "$t/comm")" = store-writer ] && echo "  store-writer cpu $(awk '{print ($14+$15)/100}' "$t/stat") s"
  done
  echo "  server cpu $(awk '{print ($14+$15)/100}' /proc/$pid/stat) s"
  kill $pid; wait $pid 2> /dev/null || true
}
for i in $(seq "$runs"); do
  echo "base run $i:"; one "$base"
  echo "new run $i:"; one "$new"
done
