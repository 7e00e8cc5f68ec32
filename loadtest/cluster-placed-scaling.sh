#!/bin/bash
# Placed nodes under equal CPU quotas: three geoshard nodes holding four of six shards each
# (every shard on two nodes, H3 resolution 2) against one node holding everything, each node
# in a cgroup-v1 `cpu` group of QUOTA_US of every 100 ms (30000 = 0.3 of a core) with one io
# thread. The three NATS servers (JetStream) and the load generator run outside the quotas.
#
# 1. counties and places-1m loaded into the cluster (through node 1) and into the single node.
# 2. pip-counties and envelope (0.1-degree boxes on places-1m), closed loop, CONNS connections
#    spread over the three nodes, or all to the single node; REPEAT rounds alternating. A
#    point query is answered by the node asked when it holds the shard, else by one that
#    does (asked over a direct HTTP/2 connection, or over NATS with DIRECT=false); an
#    envelope is split over the holders of its cover and merged. Every answer is checked by
#    the load generator. The nodes share a cluster secret, so questions and answers are signed.
#
# Results: $OUT.results.jsonl (a line a run) and $OUT.md. Needs root (cgroups) and
# nats-server (scripts/setup-system.sh). Usage: loadtest/cluster-placed-scaling.sh NAME
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/nats.sh
source loadtest/placed.sh
name=${1:?usage: loadtest/cluster-placed-scaling.sh NAME}
REPEAT=${REPEAT:-3}
QUOTA_US=${QUOTA_US:-30000}
DURATION=${DURATION:-8}
CONNS=${CONNS:-64}
DIRECT=${DIRECT:-true}
out=loadtest/reports/$name
cluster_work cluster-placed-scaling
: > "$out.results.jsonl"
cg=/sys/fs/cgroup/cpu
more_cleanup() {
  for g in single node1 node2 node3; do rmdir "$cg/geoshard-$g" 2> /dev/null || true; done
}

start_nats 14240 placedscale
nats_pids=("${pids[@]}")
# ticks PID...: the CPU time of the processes, in clock ticks (1/100 s).
ticks() {
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t"
}
# busy: the machine's busy ticks, over every CPU, since boot.
busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }

quota() {
  mkdir -p "$cg/geoshard-$1"
  echo 100000 > "$cg/geoshard-$1/cpu.cfs_period_us"
  echo "$QUOTA_US" > "$cg/geoshard-$1/cpu.cfs_quota_us"
  echo "$2" > "$cg/geoshard-$1/cgroup.procs"
}

# Each node runs as in a container of its quota: as many rayon threads as whole cores in it
# (at least one; what std's cgroup-aware available_parallelism gives a process started inside
# such a group, where this script moves the nodes only once loaded), and no polling of the
# reactor between requests, which would spend the quota. EXTRA_ENV: more settings for every
# node, the single one too (e.g. "RAYON_NUM_THREADS=2").
read -r -a extra_env <<< "${EXTRA_ENV:-}"
rayon=$((QUOTA_US / 100000 > 1 ? QUOTA_US / 100000 : 1))
start_placed placedscale GEOSHARD_IO_THREADS=1 GEOSHARD_PIN_IO_THREADS=false \
  RAYON_NUM_THREADS=$rayon GEOSHARD_IO_POLL_US=0 \
  GEOSHARD_CLUSTER_DIRECT="$DIRECT" GEOSHARD_CLUSTER_SECRET=loadtest-cluster-secret-0123456789 \
  "${extra_env[@]}"

# Equal CPU quotas, from here on.
quota single "$single_pid"
for i in 1 2 3; do quota "node$i" "${pid[$i]}"; done

for r in $(seq "$REPEAT"); do
  for w in pip-counties envelope; do
    for target in single cluster; do
      args=(--addr "$single")
      nodes=("$single_pid")
      if [ "$target" = cluster ]; then
        args=(--addr "${addr[1]}" --also "${addr[2]}" --also "${addr[3]}")
        nodes=("${pid[1]}" "${pid[2]}" "${pid[3]}")
      fi
      n0=$(ticks "${nodes[@]}") s0=$(ticks "${nats_pids[@]}") b0=$(busy) t0=$(date +%s.%N)
      # PROFILE=1: a CPU profile of node 1 through the first cluster run of each workload
      # (CALLGRAPH=dwarf for whole stacks from the release build's unwind tables).
      if [ "${PROFILE:-0}" = 1 ] && [ "$target" = cluster ] && [ "$r" = 1 ]; then
        perf record -F 999 --call-graph "${CALLGRAPH:-fp}" -p "${pid[1]}" \
          -o "$out.$w.perf.data" -- sleep "$DURATION" > /dev/null 2>&1 &
      fi
      "$lt" run --workload "$w" "${args[@]}" --user bench --password bench \
        --connections "$CONNS" --duration "$DURATION" --warmup 2 --threads 2 \
        --out "$work/runs.jsonl" > /dev/null
      n1=$(ticks "${nodes[@]}") s1=$(ticks "${nats_pids[@]}") b1=$(busy) t1=$(date +%s.%N)
      # CPU in cores over the run (its 2 s of warm-up included): the nodes, the NATS servers,
      # and the whole machine.
      cpu="$n0 $n1 $s0 $s1 $b0 $b1 $t0 $t1"
      tail -1 "$work/runs.jsonl" | python3 -c "import json,sys; r=json.load(sys.stdin); r['note']='$target'; n0,n1,s0,s1,b0,b1,t0,t1=map(float,'$cpu'.split()); d=(t1-t0)*100; r['cpu']={'nodes':(n1-n0)/d,'nats':(s1-s0)/d,'machine':(b1-b0)/d}; print(json.dumps(r))" >> "$out.results.jsonl"
      echo "round $r, $w, $target: $(tail -1 "$out.results.jsonl" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.0f/s p50 %s us p99 %s us errors %s wrong %s; cores: nodes %.2f nats %.2f machine %.2f" % (r["throughput"], r["p50_us"], r["p99_us"], r["errors"], r["mismatched"], r["cpu"]["nodes"], r["cpu"]["nats"], r["cpu"]["machine"]))')"
    done
  done
done

python3 - "$out" "$work/status" "$REPEAT" "$DURATION" "$QUOTA_US" "$CONNS" "$DIRECT" \
  "$rayon" "${EXTRA_ENV:-}" << 'EOF'
import json, statistics, sys
out, status_file, repeat, duration, quota, conns, direct, rayon, extra = sys.argv[1:10]
runs = [json.loads(l) for l in open(out + ".results.jsonl") if l.strip()]
by = {}
for r in runs:
    by.setdefault((r["workload"], r["note"]), []).append(r)
def med(rs, k):
    return statistics.median(x[k] for x in rs)
lines = [
    "# Placed nodes under equal CPU quotas",
    "",
    "Command: `loadtest/cluster-placed-scaling.sh %s` (REPEAT=%s, %s s a run after 2 s of"
    " warm-up, %s connections, closed loop)." % (out.split("/")[-1], repeat, duration, conns),
    "Three geoshard nodes each holding four of six shards (every shard on two nodes, H3",
    "resolution 2) against a single node holding every row, each node in a cgroup-v1 `cpu`",
    "group of %.2f of a core with one io thread; the three NATS servers and the load" % (int(quota) / 100000),
    "generator outside the quotas. The cluster's connections are spread over its three nodes.",
    "Each node as in a container of its quota: %s rayon thread(s), no polling of the reactor"
    " between requests (`io_poll_us = 0`)%s." % (rayon, "; also " + extra if extra else ""),
    "Questions between nodes: %s; signed with a cluster secret." % (
        "direct HTTP/2 connections" if direct == "true" else "NATS request and reply"),
    "",
    "CPU columns: cores used over a run (medians), by the nodes under test, by the NATS",
    "servers, and by the whole machine (2 cores; the load generator is the rest).",
    "",
    "| workload | target | queries/s, median (min) | × single | p50 µs | p99 µs | errors | wrong of checked | nodes' cores | NATS cores | machine cores | nodes' µs a query | NATS µs a query |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]
for w in ("pip-counties", "envelope"):
    base = by.get((w, "single"))
    for t in ("single", "cluster"):
        rs = by.get((w, t))
        if not rs:
            continue
        cpu = lambda k: statistics.median(x["cpu"][k] for x in rs)
        # CPU a query: cores over the run (warm-up included) over the queries measured.
        per = lambda k: statistics.median(
            x["cpu"][k] * (float(duration) + 2) * 1e6 / (x["throughput"] * float(duration)) for x in rs)
        lines.append("| %s | %s | %.0f (%.0f) | %.2f | %.0f | %.0f | %d | %d of %d | %.2f | %.2f | %.2f | %.0f | %.0f |" % (
            w, t, med(rs, "throughput"), min(x["throughput"] for x in rs),
            med(rs, "throughput") / med(base, "throughput"), med(rs, "p50_us"),
            med(rs, "p99_us"), sum(x["errors"] for x in rs), sum(x["mismatched"] for x in rs),
            sum(x["checked"] for x in rs), cpu("nodes"), cpu("nats"), cpu("machine"),
            per("nodes"), per("nats")))
lines += ["", "## Cluster status", "", "```", open(status_file).read().rstrip(), "```", ""]
open(out + ".md", "w").write("\n".join(lines))
EOF
echo "report: $out.md"
