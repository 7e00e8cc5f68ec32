#!/bin/bash
# Shard placement: what routing a query over nodes that hold some shards costs against one
# node that holds everything. Three NATS servers (JetStream) and three geoshard nodes holding
# four of six shards each (every shard on two nodes), beside a single node holding it all; the
# counties and places-1m loaded into both. No CPU quotas: every process shares this machine.
#
# 1. Resident memory of each node against the single node's, once loaded.
# 2. pip-counties (a point: one node answers, often another than the one asked) and envelope
#    (0.1-degree boxes on places-1m: usually split over two nodes and merged), closed loop,
#    through node 1 against the single node, at 1 connection (latency) and CONNS connections
#    (throughput), REPEAT rounds alternating. Every answer is checked by the load generator.
#
# Results: $OUT.results.jsonl (a line a run) and $OUT.md. Needs nats-server
# (scripts/setup-system.sh). Usage: loadtest/cluster-placement.sh NAME
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/nats.sh
source loadtest/placed.sh
name=${1:?usage: loadtest/cluster-placement.sh NAME}
REPEAT=${REPEAT:-3}
DURATION=${DURATION:-8}
CONNS=${CONNS:-16}
out=loadtest/reports/$name
cluster_work cluster-placement
: > "$out.results.jsonl"

start_nats 14230 placement

rss_mib() { echo $(($(awk '/VmRSS/ {print $2}' "/proc/$1/status") / 1024)); }

start_placed placement
{
  echo "single $(rss_mib "$single_pid")"
  for i in 1 2 3; do echo "node$i $(rss_mib "${pid[$i]}")"; done
} | tee "$work/rss"

for r in $(seq "$REPEAT"); do
  for w in pip-counties envelope; do
    for conns in 1 "$CONNS"; do
      for target in single cluster; do
        a=$single
        [ "$target" = cluster ] && a=${addr[1]}
        "$lt" run --workload "$w" --addr "$a" --user bench --password bench \
          --connections "$conns" --duration "$DURATION" --warmup 2 --threads 1 \
          --out "$work/runs.jsonl" > /dev/null
        tail -1 "$work/runs.jsonl" | python3 -c "import json,sys; r=json.load(sys.stdin); r['note']='$target conns=$conns'; print(json.dumps(r))" >> "$out.results.jsonl"
        echo "round $r, $w, $target, $conns conn(s): $(tail -1 "$out.results.jsonl" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.0f/s p50 %s us p99 %s us errors %s wrong %s" % (r["throughput"], r["p50_us"], r["p99_us"], r["errors"], r["mismatched"]))')"
      done
    done
  done
done

python3 - "$out" "$work/rss" "$work/status" "$REPEAT" "$DURATION" << 'EOF'
import json, statistics, sys
out, rss_file, status_file, repeat, duration = sys.argv[1:6]
runs = [json.loads(l) for l in open(out + ".results.jsonl") if l.strip()]
by = {}
for r in runs:
    target, conns = r["note"].split()
    by.setdefault((r["workload"], int(conns.split("=")[1]), target), []).append(r)
def med(rs, k):
    return statistics.median(x[k] for x in rs)
lines = [
    "# Shard placement: routed queries against one node holding everything",
    "",
    "Command: `loadtest/cluster-placement.sh %s` (REPEAT=%s, %s s a run, after 2 s of warm-up)." % (out.split("/")[-1], repeat, duration),
    "Three NATS servers and three geoshard nodes on loopback, each node holding four of six",
    "shards (H3 resolution 2), beside a single node holding every row; the counties and",
    "places-1m loaded into both. No CPU quotas: all processes share this 2-core machine, so",
    "the throughput columns compare work per query, not capacity. Queries go to cluster node 1,",
    "which answers a point query itself or asks the one node holding its shard, and splits an",
    "envelope over the nodes holding its cover unless one holds all of it.",
    "",
    "## Resident memory once loaded (MiB)",
    "",
    "| node | MiB |",
    "|---|---|",
]
for l in open(rss_file):
    n, m = l.split()
    lines.append("| %s | %s |" % (n, m))
lines += ["", "## Queries (median of rounds, min in brackets)", "",
          "| workload | connections | target | queries/s | p50 µs | p99 µs | errors | wrong of checked |",
          "|---|---|---|---|---|---|---|---|"]
for (w, c, t), rs in sorted(by.items()):
    lines.append("| %s | %d | %s | %.0f (%.0f) | %.0f | %.0f | %d | %d of %d |" % (
        w, c, t, med(rs, "throughput"), min(x["throughput"] for x in rs), med(rs, "p50_us"),
        med(rs, "p99_us"), sum(x["errors"] for x in rs), sum(x["mismatched"] for x in rs),
        sum(x["checked"] for x in rs)))
lines += ["", "## Added latency at one connection (cluster p50 − single p50, median of rounds)", ""]
for w in ("pip-counties", "envelope"):
    s, c = by.get((w, 1, "single")), by.get((w, 1, "cluster"))
    if s and c:
        lines.append("- %s: %.0f µs → %.0f µs (+%.0f µs, ×%.2f)" % (
            w, med(s, "p50_us"), med(c, "p50_us"), med(c, "p50_us") - med(s, "p50_us"),
            med(c, "p50_us") / med(s, "p50_us")))
lines += ["", "## Cluster status", "", "```", open(status_file).read().rstrip(), "```", ""]
open(out + ".md", "w").write("\n".join(lines))
EOF
echo "report: $out.md"
