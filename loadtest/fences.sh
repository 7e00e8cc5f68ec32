#!/bin/sh
# Geofences under load: the same writes with no fences and with COUNT polygon fences (the US
# counties, then random boxes over the conterminous US), on a places-N layer whose points the
# writes move at random over the US.
#  - single PUTs: 16 connections replacing places for SECONDS;
#  - bulk: `geoshard load` of the places file again over HTTP (every document replaced);
#  - event latency: with the fences, one more fence over the whole US that reports `inside`,
#    followed by a server-sent events client while PUTs go at RATE a second.
# Each round runs both setups, alternated; a round starts from a fresh data directory.
# JITTER (degrees, default none) keeps each place within that distance of a home drawn from
# its id, a random walk; without it every write moves a place anywhere in the US.
# MOVERS (default: every place) limits the PUTs to the first MOVERS places, so that each moves
# many times.
# Usage: [JITTER=0.05] [MOVERS=5000] loadtest/fences.sh [count] [seconds] [rounds] [places-N] [rate]
set -eu
cd "$(dirname "$0")/.."
count=${1:-10000}
seconds=${2:-20}
rounds=${3:-2}
dataset=${4:-places-200k}
rate=${5:-5000}
work=${TMPDIR:-/tmp}/geoshard-fences-bench
mkdir -p "$work"
cargo build --release -q -p geoshard -p geoshard-loadtest
bin=$(pwd)/target/release/geoshard
gen=$(pwd)/target/release/geoshard-loadtest
file="$work/$dataset.ndjson"
[ -f "$file" ] || "$gen" ndjson --dataset "$dataset" --out "$file"
n=$(wc -l < "$file")
movers=${MOVERS:-$n}
counties=../shared/data/real/us-counties.geojson
us="-125,25,-67,49"
walk=${JITTER:+--jitter=$JITTER}
out="$work/results${JITTER:+-walk}${MOVERS:+-$MOVERS}.jsonl"
: > "$out"

serve() { # sets $pid and $addr
  rm -f "$work/serve.out"
  GEOSHARD_LOG=warn "$bin" serve --data-dir "$work/data" --listen 127.0.0.1:0 \
    > "$work/serve.out" 2> "$work/serve.err" &
  pid=$!
  until grep -q listening "$work/serve.out" 2> /dev/null; do sleep 0.05; done
  addr=$(sed -n 's/.*http:\/\///p' "$work/serve.out")
  until curl -sf -u bench:bench -o /dev/null "http://$addr/v1/resources/modelService"; do
    sleep 0.05
  done
}

for r in $(seq "$rounds"); do
  for setup in none fences; do
    rm -rf "$work/data"
    "$bin" load "$file" --service places --data-dir "$work/data" --quiet
    "$bin" user add --data-dir "$work/data" --name bench --password bench --role admin > /dev/null
    serve
    define=0
    if [ "$setup" = fences ]; then
      define=$(python3 loadtest/fences.py define "$addr" bench bench places "$count" "$counties")
    fi
    "$gen" put --addr "$addr" --user bench --password bench --connections 16 \
      --duration "$seconds" --places "$movers" --bbox="$us" $walk > "$work/put.json"
    start=$(date +%s.%N)
    "$bin" load "$file" --service places --url "http://$addr" --user bench --password bench \
      --quiet > /dev/null
    bulk=$(echo "$(date +%s.%N) - $start" | bc)
    sse="{}"
    if [ "$setup" = fences ]; then
      curl -sf -u bench:bench -X PUT -H 'Content-Type: application/json' \
        --data "{\"service\":\"places\",\"layer\":0,\"detect\":[\"inside\"],\"geometry\":{\"type\":\"Polygon\",\"coordinates\":[[[-125,25],[-67,25],[-67,49],[-125,49],[-125,25]]]}}" \
        "http://$addr/v1/fences/us" > /dev/null
      python3 loadtest/fences.py sse "$addr" bench bench us "$((seconds + 4))" "$work/sse${JITTER:+-walk}.json" &
      follower=$!
      sleep 1
      "$gen" put --addr "$addr" --user bench --password bench --connections 16 --warmup 1 \
        --duration "$seconds" --places "$movers" --bbox="$us" $walk --rate "$rate" > "$work/paced.json"
      wait $follower
      sse=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
v = sorted(d["latencies_ms"])
q = lambda p: v[min(len(v) - 1, int(len(v) * p))] if v else None
p = json.load(open(sys.argv[2]))
print(json.dumps({"events": len(v), "paced_put_per_sec": p["put_per_sec"], "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": v[-1] if v else None}))' "$work/sse${JITTER:+-walk}.json" "$work/paced.json")
    fi
    made=$(curl -sf -u bench:bench "http://$addr/metrics" | sed -n 's/^geoshard_fence_events_total //p')
    kill -TERM $pid; wait $pid 2> /dev/null || true
    python3 -c '
import json, sys
put = json.load(open(sys.argv[1]))
print(json.dumps({"round": int(sys.argv[2]), "setup": sys.argv[3], "fences": int(sys.argv[4]) if sys.argv[3] == "fences" else 0,
  "define_secs": float(sys.argv[5]), "put_per_sec": put["put_per_sec"], "put_p99_us": put["p99_us"],
  "bulk_secs": float(sys.argv[6]), "bulk_docs_per_sec": int(sys.argv[7]) / float(sys.argv[6]),
  "events_made": int(sys.argv[8] or 0), "sse": json.loads(sys.argv[9])}))' \
      "$work/put.json" "$r" "$setup" "$count" "$define" "$bulk" "$n" "${made:-0}" "$sse" | tee -a "$out"
  done
done
