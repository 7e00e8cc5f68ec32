#!/bin/sh
# Query throughput of two server binaries, alternating on one data directory: counties and
# places-1m loaded once (by BASE_BIN), then for each round each binary in turn serves
# pip-counties, point-eq and envelope (closed loop, 64 connections), and its resident memory
# is read. Results go to $work/ab-base.jsonl and ab-new.jsonl; medians and minimums printed.
# Usage: loadtest/query-ab.sh BASE_BIN NEW_BIN [rounds]
set -eu
cd "$(dirname "$0")/.."
base=$1
new=$2
rounds=${3:-3}
cargo build --release -q -p geoshard-loadtest
lt=$(pwd)/target/release/geoshard-loadtest
work=${TMPDIR:-/tmp}/geoshard-query-ab
data="$work/data"
mkdir -p "$work"
rm -f "$work/ab-base.jsonl" "$work/ab-new.jsonl"

start() {
  rm -f "$work/serve.out"
  "$1" serve --data-dir "$data" --listen 127.0.0.1:8011 > "$work/serve.out" 2> "$work/serve.err" &
  pid=$!
  until grep -q listening "$work/serve.out" 2> /dev/null; do sleep 0.1; done
}
stop() {
  kill -TERM $pid
  wait $pid 2> /dev/null || true
}

if [ ! -d "$data" ]; then
  "$base" user add --data-dir "$data" --name bench --password bench --role admin > /dev/null
  start "$base"
  "$lt" prepare --user bench --password bench --dataset counties > /dev/null
  "$lt" prepare --user bench --password bench --dataset places-1m > /dev/null
  stop
fi
for round in $(seq "$rounds"); do
  for which in base new; do
    eval bin=\$$which
    start "$bin"
    for w in pip-counties point-eq envelope; do
      "$lt" run --user bench --password bench --workload $w --connections 64 --duration 6 \
        --warmup 2 --out "$work/ab-$which.jsonl" > /dev/null
    done
    echo "round $round $which: resident $(grep VmRSS /proc/$pid/status | awk '{print int($2/1024)}') MiB"
    stop
  done
done
python3 - "$work" << 'PY'
import json, statistics, sys
work = sys.argv[1]
med = {}
for which in ("base", "new"):
    by = {}
    for line in open(f"{work}/ab-{which}.jsonl"):
        r = json.loads(line)
        by.setdefault(r["workload"], []).append(r)
    for w, rs in by.items():
        t = [r["throughput"] for r in rs]
        bad = sum(r["mismatched"] + r["errors"] for r in rs)
        med[(which, w)] = statistics.median(t)
        print(f"{which} {w}: runs {[round(x) for x in t]}, min {min(t):.0f}, median "
              f"{statistics.median(t):.0f}, p99 µs {[r['p99_us'] for r in rs]}, wrong or failed {bad}")
for w in ("pip-counties", "point-eq", "envelope"):
    if ("base", w) in med and ("new", w) in med:
        print(f"{w}: new/base median {med[('new', w)] / med[('base', w)]:.3f}")
PY
