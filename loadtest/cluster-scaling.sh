#!/bin/bash
# Cluster scaling on one machine: three NATS servers (JetStream, the log kept on all three) and
# three geoshard nodes on loopback, each node in a cgroup-v1 `cpu` group with the same CPU quota
# (QUOTA_US of every 100 ms: 30000 = 0.3 of a core), the load generator outside them.
#
# 1. counties and places-1m loaded through node 1; every node applies them from the log.
# 2. pip-counties and envelope (places-1m), closed loop, over 1, 2 and 3 nodes (the
#    connections spread over them), REPEAT times each, alternating the node counts.
# 3. Writes: places-1m as NDJSON through `geoshard load` (bulk multipart, LOAD_CONNS
#    connections) into a single node and into node 1 of a fresh 3-node cluster, durable
#    (fsync; in the cluster, JetStream R3 too), no quotas.
#
# Results: $OUT.results.jsonl (one line a run, as `geoshard-loadtest run` writes them),
# $OUT.md and $OUT.svg. Needs root (cgroups) and nats-server (scripts/setup-system.sh).
# Usage: loadtest/cluster-scaling.sh NAME   (writes loadtest/reports/NAME.*)
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/nats.sh
name=${1:?usage: loadtest/cluster-scaling.sh NAME}
REPEAT=${REPEAT:-3}
QUOTA_US=${QUOTA_US:-30000}
DURATION=${DURATION:-8}
CONNS=${CONNS:-64}
LOAD_CONNS=${LOAD_CONNS:-64}
out=loadtest/reports/$name
cluster_work cluster-scaling
: > "$out.results.jsonl"
cg=/sys/fs/cgroup/cpu
more_cleanup() {
  for i in 1 2 3; do rmdir "$cg/geoshard-node$i" 2> /dev/null || true; done
}

start_nats 14220 scaling

# start_node DIR NODE [cluster]: starts a node (of the cluster GEOSHARD_CLUSTER_NAME with a
# third argument), sets $node_pid and $node_addr.
start_node() {
  "$bin" user add --data-dir "$1" --name bench --password bench --role admin > /dev/null
  rm -f "$1.out" "$1.err"
  local mode=()
  [ -n "${3:-}" ] && mode=(--cluster "$urls" --node "$2")
  GEOSHARD_IO_THREADS=1 GEOSHARD_PIN_IO_THREADS=false GEOSHARD_ACCESS_LOG=false \
    GEOSHARD_LOG=warn "$bin" serve --data-dir "$1" --listen 127.0.0.1:0 "${mode[@]}" \
    > "$1.out" 2> "$1.err" &
  node_pid=$!
  pids+=("$node_pid")
  until grep -q listening "$1.out" 2> /dev/null; do sleep 0.05; done
  node_addr=$(sed -n 's/.*http:\/\///p' "$1.out")
}
applied() { curl -s "http://$1/ready" | python3 -c 'import json,sys; print(json.load(sys.stdin)["cluster"]["applied"])'; }

export GEOSHARD_CLUSTER_NAME=scaling
declare -a addr pid
for i in 1 2 3; do
  start_node "$work/node$i" "node$i" cluster
  pid[$i]=$node_pid
  addr[$i]=$node_addr
done
echo "nodes: ${addr[*]}"
"$lt" prepare --addr "${addr[1]}" --user bench --password bench --dataset counties --batch 200
"$lt" prepare --addr "${addr[1]}" --user bench --password bench --dataset places-1m --batch 5000
target=$(applied "${addr[1]}")
for i in 2 3; do
  until [ "$(applied "${addr[$i]}")" -ge "$target" ]; do sleep 0.5; done
done
"$bin" cluster status --cluster "$urls" --name scaling | tee "$work/status"

# Equal CPU quotas, from here on.
for i in 1 2 3; do
  mkdir -p "$cg/geoshard-node$i"
  echo 100000 > "$cg/geoshard-node$i/cpu.cfs_period_us"
  echo "$QUOTA_US" > "$cg/geoshard-node$i/cpu.cfs_quota_us"
  echo "${pid[$i]}" > "$cg/geoshard-node$i/cgroup.procs"
done

for r in $(seq "$REPEAT"); do
  for n in 1 2 3; do
    also=()
    for k in $(seq 2 "$n"); do also+=(--also "${addr[$k]}"); done
    for w in pip-counties envelope; do
      "$lt" run --workload "$w" --addr "${addr[1]}" "${also[@]}" --user bench --password bench \
        --connections "$CONNS" --duration "$DURATION" --warmup 2 --threads 2 \
        --out "$work/n$n.jsonl" > /dev/null
      tail -1 "$work/n$n.jsonl" | python3 -c "import json,sys; r=json.load(sys.stdin); r['note']='nodes=$n quota_us=$QUOTA_US'; print(json.dumps(r))" >> "$out.results.jsonl"
      echo "round $r, $n node(s), $w: $(tail -1 "$out.results.jsonl" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.0f/s p50 %s us p99 %s us errors %s" % (r["throughput"], r["p50_us"], r["p99_us"], r["errors"]))')"
    done
  done
done

# The query nodes stop: the write runs have the machine.
for i in 1 2 3; do kill "${pid[$i]}"; done
# Writes: a single node, then a fresh 3-node cluster loaded through its node 1 (its answer
# waits for JetStream R3 and node 1's own commit; the time for all three to have applied
# everything is given too), the same file, alternating.
"$lt" ndjson --dataset places-1m --out "$work/places-1m.ndjson"
: > "$work/writes"
load_into() {
  "$bin" load "$work/places-1m.ndjson" --service places --url "http://$1" --user bench \
    --password bench --connections "$LOAD_CONNS" --quiet > /dev/null
}
for r in $(seq "$REPEAT"); do
  rm -rf "$work/single"
  start_node "$work/single" single
  s=$(date +%s.%N)
  load_into "$node_addr"
  e=$(date +%s.%N)
  echo "single $(echo "1000000 / ($e - $s)" | bc)" | tee -a "$work/writes"
  kill "$node_pid"
  export GEOSHARD_CLUSTER_NAME=writes$r
  w=()
  for i in 1 2 3; do
    start_node "$work/w$r-$i" "w$r-$i" cluster
    w+=("$node_pid:$node_addr")
  done
  first=${w[0]#*:}
  s=$(date +%s.%N)
  load_into "$first"
  e=$(date +%s.%N)
  target=$(applied "$first")
  for x in "${w[@]}"; do
    until [ "$(applied "${x#*:}")" -ge "$target" ]; do sleep 0.2; done
  done
  a=$(date +%s.%N)
  echo "cluster $(echo "1000000 / ($e - $s)" | bc) $(echo "1000000 / ($a - $s)" | bc)" | tee -a "$work/writes"
  for x in "${w[@]}"; do kill "${x%%:*}"; done
  export GEOSHARD_CLUSTER_NAME=scaling
done

python3 loadtest/cluster-report.py "$out" "$work/writes" "$QUOTA_US" "$REPEAT" "$work/status"
echo "report: $out.md"
