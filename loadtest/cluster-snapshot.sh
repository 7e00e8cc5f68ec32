#!/bin/bash
# Snapshots of a cluster's store against replaying its log. Three NATS servers (JetStream,
# R3) and node1 with places-1m written through it (200 log entries of 5,000 documents).
#
# 1. A new node on an empty directory replays the whole log: the time from its start to
#    /ready 200 (every entry applied, its views built), REPEAT times.
# 2. node1 restarted with cluster_snapshot_entries=50: it copies its store into the snapshot
#    bucket (its log says how long and how many bytes); 60 more writes bring a second
#    snapshot, after which the log drops what the first one covers.
# 3. A new node on an empty directory now installs the snapshot and follows the log from
#    there: the time to /ready 200, REPEAT times.
#
# Results: $OUT.md. Needs nats-server (scripts/setup-system.sh).
# Usage: loadtest/cluster-snapshot.sh NAME
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/nats.sh
name=${1:?usage: loadtest/cluster-snapshot.sh NAME}
REPEAT=${REPEAT:-3}
out=loadtest/reports/$name
cluster_work cluster-snapshot

start_nats 14430 snapshot

# start_node NAME [SNAPSHOT_ENTRIES]: node NAME on $work/NAME; sets $node_pid and $node_addr.
start_node() {
  local dir=$work/$1
  [ -e "$dir" ] || "$bin" user add --data-dir "$dir" --name bench --password bench --role admin > /dev/null
  : > "$dir.out"
  GEOSHARD_CLUSTER_NAME=snapshot GEOSHARD_ACCESS_LOG=false GEOSHARD_LOG=info \
    GEOSHARD_CLUSTER_SNAPSHOT_ENTRIES=${2:-100000} \
    "$bin" serve --data-dir "$dir" --listen 127.0.0.1:0 --cluster "$urls" --node "$1" \
    > "$dir.out" 2> "$dir.err" &
  node_pid=$!
  pids+=("$node_pid")
  until grep -q listening "$dir.out" 2> /dev/null; do sleep 0.05; done
  node_addr=$(sed -n 's/.*http:\/\///p' "$dir.out")
}
now() { date +%s.%N; }
# until_ready ADDR: wait for /ready 200.
until_ready() { until curl -sf "http://$1/ready" > /dev/null; do sleep 0.1; done; }

start_node node1
node1=$node_addr
node1_pid=$node_pid
"$lt" prepare --addr "$node1" --user bench --password bench --dataset places-1m --batch 5000
"$bin" cluster status --cluster "$urls" --name snapshot | head -3 | tee "$work/status-before"

: > "$work/times"
# new_node NAME LABEL: node NAME started on an empty directory and timed to /ready 200 (a
# line "LABEL seconds" in $work/times); sets $node_pid and $node_addr.
new_node() {
  rm -rf "${work:?}/$1" "$work/$1.err"
  local t0 t1
  t0=$(now)
  start_node "$1"
  until_ready "$node_addr"
  t1=$(now)
  echo "$2 $(python3 -c "print(round($t1 - $t0, 2))")" | tee -a "$work/times"
}

for r in $(seq "$REPEAT"); do
  new_node replay replay
  kill "$node_pid"
  wait "$node_pid" 2> /dev/null || true
done

kill "$node1_pid"
wait "$node1_pid" 2> /dev/null || true
start_node node1 50
node1=$node_addr
until grep -q "snapshot taken" "$work/node1.err"; do sleep 0.2; done
for i in $(seq 60); do
  curl -sf --digest -u bench:bench -X PUT -H 'Content-Type: application/json' \
    --data "{\"n\": $i}" "http://$node1/v1/documents?uri=/extra/$i.json" > /dev/null
done
until grep -q "log entries dropped" "$work/node1.err"; do sleep 0.2; done
grep "snapshot taken" "$work/node1.err" | tee "$work/snapshots"
"$bin" cluster status --cluster "$urls" --name snapshot | head -3 | tee "$work/status-after"

for r in $(seq "$REPEAT"); do
  new_node fresh snapshot
  grep -q "snapshot installed" "$work/fresh.err" || { echo "the new node did not install the snapshot"; exit 1; }
  n=$(curl -s --digest -u bench:bench -H 'Content-Type: application/json' \
    --data '{"params":{"id":"LT Places","layer":0,"method":"query"},"query":{"returnCountOnly":true}}' \
    "http://$node_addr/v1/resources/geoQueryService" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("count"))')
  echo "fresh node counts $n places"
  kill "$node_pid"
  wait "$node_pid" 2> /dev/null || true
done

python3 - "$out" "$work" "$REPEAT" << 'EOF'
import re, statistics, sys
out, work, repeat = sys.argv[1:4]
times = {}
for l in open(work + "/times"):
    k, v = l.split()
    times.setdefault(k, []).append(float(v))
snaps = []
for l in open(work + "/snapshots"):
    m = re.search(r"seq=(\d+).*bytes=(\d+).*secs=([\d.]+)", l)
    if m:
        snaps.append((int(m.group(1)), int(m.group(2)), float(m.group(3))))
lines = ["# Cluster snapshots against replaying the log", "",
         "Command: `loadtest/cluster-snapshot.sh %s` (REPEAT=%s): three NATS servers (R3) and a node" % (out.split("/")[-1], repeat),
         "with places-1m written through it (200 entries of 5,000 documents), on this 2-core machine.", "",
         "| a new node on an empty directory | runs | min s | median s |", "|---|---|---|---|"]
for k, label in (("replay", "replays the whole log"), ("snapshot", "installs the snapshot, then follows the log")):
    v = times.get(k, [])
    if v:
        lines.append("| %s | %d | %.2f | %.2f |" % (label, len(v), min(v), statistics.median(v)))
lines += ["", "Time from the node's start to `/ready` 200 (every entry applied, views built).", "",
          "Snapshots taken by node1 (entry, bytes, seconds to copy the store and put it in the bucket):", ""]
for s, b, t in snaps:
    lines.append("- entry %d: %.1f MiB in %.1f s" % (s, b / 1048576, t))
lines += ["", "Log before and after:", "", "```"] + open(work + "/status-before").read().splitlines() \
    + ["---"] + open(work + "/status-after").read().splitlines() + ["```", ""]
open(out + ".md", "w").write("\n".join(lines))
print("\n".join(lines))
EOF
echo "report: $out.md"
