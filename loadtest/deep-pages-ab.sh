#!/bin/bash
# Deep pages through nodes holding some shards: two builds of geoshard, A and B, on the same
# cluster and data (three NATS servers, three nodes holding four of six shards each, the
# counties and the GeoNames places loaded), the nodes restarted with each build in turn.
# Two pages at an offset past their length, asked through node 1 one at a time:
#   counties: every county ordered by name, with geometry, offset 700, 50 rows;
#   places:   every place by OBJECTID, all fields, offset 144,500, 100 rows.
# Each is asked COUNT times a round, REPEAT rounds alternating A and B; the time of each
# answer (curl's time_total) and the answer's digest (without its timestamp) are recorded.
#
# Usage: loadtest/deep-pages-ab.sh NAME BIN_A BIN_B  (release builds of geoshard)
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/nats.sh
name=${1:?usage: loadtest/deep-pages-ab.sh NAME BIN_A BIN_B}
declare -A bins=([A]=${2:?} [B]=${3:?})
REPEAT=${REPEAT:-3}
COUNT=${COUNT:-20}
out=loadtest/reports/$name
work=${TMPDIR:-/tmp}/geoshard-deep-pages
rm -rf "$work"
mkdir -p "$work" loadtest/reports
: > "$out.results.jsonl"

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
}
trap cleanup EXIT

start_nats 14330 deep
holds=("" "0,1,2,3" "2,3,4,5" "4,5,0,1")
declare -A pid addr

# start BUILD: the three nodes on build BUILD, once each is ready and caught up.
start() {
  for i in 1 2 3; do
    local dir=$work/node$i
    [ -e "$dir" ] || "${bins[$1]}" user add --data-dir "$dir" --name bench --password bench --role admin > /dev/null
    : > "$dir.out"
    GEOSHARD_CLUSTER_NAME=deep GEOSHARD_CLUSTER_RESOLUTION=2 GEOSHARD_ACCESS_LOG=false \
      GEOSHARD_LOG=warn "${bins[$1]}" serve --data-dir "$dir" --listen 127.0.0.1:0 \
      --cluster "$urls" --node "node$i" --cluster-shards 6 --hold "${holds[$i]}" \
      > "$dir.out" 2> "$dir.err" &
    pid[$i]=$!
    pids+=("${pid[$i]}")
  done
  for i in 1 2 3; do
    until grep -q listening "$work/node$i.out" 2> /dev/null; do sleep 0.05; done
    addr[$i]=$(sed -n 's/.*http:\/\///p' "$work/node$i.out")
    until curl -sf "http://${addr[$i]}/ready" > /dev/null; do sleep 0.2; done
  done
  sleep 3 # every node has read the others' registry entries
}
stop() {
  for i in 1 2 3; do kill "${pid[$i]}"; done
  for i in 1 2 3; do wait "${pid[$i]}" 2> /dev/null || true; done
}

start A
for s in Counties:real/us-counties.geojson Places:real/geonames-cities1000.csv; do
  "${bins[A]}" load --quiet --service "${s%%:*}" --url "http://${addr[1]}" --user bench \
    --password bench "../shared/data/${s#*:}"
done
stop

counties='{"params":{"id":"Counties","layer":0,"method":"query"},"query":{"outFields":"*","returnGeometry":true,"orderByFields":"name","resultOffset":700,"resultRecordCount":50}}'
places='{"params":{"id":"Places","layer":0,"method":"query"},"query":{"outFields":"*","resultOffset":144500,"resultRecordCount":100}}'
for r in $(seq "$REPEAT"); do
  for build in A B; do
    start "$build"
    for q in counties places; do
      for n in $(seq "$COUNT"); do
        t=$(curl -s --digest -u bench:bench -o "$work/answer" -w '%{time_total}' \
          -H 'Content-Type: application/json' --data "${!q}" \
          "http://${addr[1]}/v1/resources/geoQueryService")
        digest=$(python3 -c 'import json,sys,hashlib; v=json.load(open(sys.argv[1])); v.pop("$timestamp",None); print(hashlib.md5(json.dumps(v,sort_keys=True).encode()).hexdigest()[:12], len(v.get("features",[])))' "$work/answer")
        echo "{\"round\":$r,\"build\":\"$build\",\"query\":\"$q\",\"secs\":$t,\"digest\":\"${digest% *}\",\"features\":${digest#* }}" >> "$out.results.jsonl"
      done
    done
    stop
  done
done

python3 - "$out" "$REPEAT" "$COUNT" << 'EOF'
import json, statistics, sys
out, repeat, count = sys.argv[1:4]
runs = [json.loads(l) for l in open(out + ".results.jsonl") if l.strip()]
lines = ["# Deep pages through placed nodes: A against B", "",
         "Command: `loadtest/deep-pages-ab.sh %s A B` (REPEAT=%s, COUNT=%s): three NATS servers and three" % (out.split("/")[-1], repeat, count),
         "nodes holding four of six shards each, queries through node 1 one at a time, builds",
         "alternating on the same data. Times are curl's `time_total` in ms.", "",
         "| query | build | answers | min | median | p90 | distinct answers | features |",
         "|---|---|---|---|---|---|---|---|"]
for q in ("counties", "places"):
    for b in ("A", "B"):
        rs = [r for r in runs if r["query"] == q and r["build"] == b]
        ts = sorted(r["secs"] * 1000 for r in rs)
        lines.append("| %s | %s | %d | %.1f | %.1f | %.1f | %d | %s |" % (
            q, b, len(ts), ts[0], statistics.median(ts), ts[int(len(ts) * 0.9) - 1],
            len({r["digest"] for r in rs}), sorted({r["features"] for r in rs})))
lines.append("")
for q in ("counties", "places"):
    same = {r["digest"] for r in runs if r["query"] == q}
    lines.append("- %s: %s distinct answer(s) over both builds." % (q, len(same)))
open(out + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
echo "report: $out.md"
