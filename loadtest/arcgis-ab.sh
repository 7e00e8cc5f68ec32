#!/bin/sh
# The native FeatureServer against geoQueryService and against Koop, in one run: the same
# pip-counties point queries (geometries returned), closed loop, 6 s each after 2 s of
# warm-up. Each round asks geoQueryService and the FeatureServer at 16 and 64 connections,
# then Koop (the MarkLogic provider, Digest to geoshard) at 16. Results go to OUT (JSON
# lines); minimums and medians of the rates, and the ratios, are printed.
# Usage: loadtest/arcgis-ab.sh [rounds] [OUT]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-3}
work=${TMPDIR:-/tmp}/geoshard-arcgis-ab
out=${2:-$work/results.jsonl}
cargo build --release -q -p geoshard -p geoshard-loadtest
scripts/setup-clients.sh > /dev/null
bin=$(pwd)/target/release/geoshard
lt=$(pwd)/target/release/geoshard-loadtest
rm -rf "$work"
mkdir -p "$work"
data="$work/data"
"$bin" user add --data-dir "$data" --name bench --password bench --role admin > /dev/null
"$bin" serve --data-dir "$data" --listen 127.0.0.1:8011 > "$work/serve.out" 2> "$work/serve.err" &
pid=$!
koop=
trap 'kill $pid $koop 2> /dev/null || true' EXIT
until grep -q listening "$work/serve.out" 2> /dev/null; do sleep 0.1; done
"$lt" prepare --user bench --password bench --dataset counties > /dev/null
(
  cd tests/clients/koop-provider-marklogic
  NODE_CONFIG='{"logLevel":"warn","port":8090,"ssl":{"enabled":false},"marklogic":{"connection":{"host":"127.0.0.1","port":8011,"user":"bench","password":"bench","authType":"DIGEST"}}}' \
    SUPPRESS_NO_CONFIG_WARNING=1 exec node server.js > "$work/koop.out" 2>&1
) &
koop=$!
until curl -s -o /dev/null http://127.0.0.1:8090/; do sleep 0.2; done

run() {
  "$lt" run --user bench --password bench --workload pip-counties --duration 6 --warmup 2 \
    --server-pid $pid --out "$out" "$@" > /dev/null
}
for round in $(seq "$rounds"); do
  for c in 16 64; do
    run --target geoshard --connections $c
    run --target arcgis --connections $c
  done
  run --target koop --addr 127.0.0.1:8090 --connections 16
  echo "round $round done"
done
python3 - "$out" << 'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    if r["workload"] != "pip-counties":
        continue
    by.setdefault((r["target"], r["connections"]), []).append(r)
med = {}
for (t, c), rs in sorted(by.items()):
    rate = [r["throughput"] for r in rs]
    p50 = [r["p50_us"] / 1000 for r in rs]
    cpu = [r["server_cpu_us_per_request"] or 0 for r in rs]
    bad = sum(r["mismatched"] + r["errors"] for r in rs)
    med[(t, c)] = statistics.median(rate)
    print(f"{t:8} c={c:<3} req/s min {min(rate):8.0f} median {statistics.median(rate):8.0f}"
          f"  p50 median {statistics.median(p50):6.2f} ms  server CPU/req median"
          f" {statistics.median(cpu):6.1f} us  wrong/errors {bad}")
for c in (16, 64):
    if ("arcgis", c) in med and ("geoshard", c) in med:
        print(f"arcgis / geoQueryService at {c}: {med[('arcgis', c)] / med[('geoshard', c)]:.2f}x")
if ("koop", 16) in med:
    print(f"arcgis / koop at 16: {med[('arcgis', 16)] / med[('koop', 16)]:.0f}x")
PY
