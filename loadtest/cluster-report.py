#!/usr/bin/env python3
"""The cluster-scaling report: loadtest/cluster-scaling.sh's results as markdown and an SVG.

Usage: cluster-report.py OUT WRITES QUOTA_US REPEAT STATUS
(OUT.results.jsonl in; OUT.md and OUT.svg out). Standard library only.
"""
import json
import statistics
import sys

out, writes_file, quota_us, repeat, status_file = sys.argv[1:6]
runs = [json.loads(l) for l in open(out + ".results.jsonl") if l.strip()]
by = {}
for r in runs:
    nodes = int(r["note"].split()[0].split("=")[1])
    by.setdefault((r["workload"], nodes), []).append(r)

workloads = ["pip-counties", "envelope"]
rows = []
for w in workloads:
    base = statistics.median(x["throughput"] for x in by.get((w, 1), [{"throughput": 0}]))
    for n in (1, 2, 3):
        rs = by.get((w, n), [])
        if not rs:
            continue
        tp = [x["throughput"] for x in rs]
        rows.append({
            "workload": w,
            "nodes": n,
            "median": statistics.median(tp),
            "min": min(tp),
            "ratio": statistics.median(tp) / base if base else 0,
            "p50": statistics.median(x["p50_us"] for x in rs),
            "p99": statistics.median(x["p99_us"] for x in rs),
            "errors": sum(x["errors"] for x in rs),
            "mismatched": sum(x["mismatched"] for x in rs),
            "checked": sum(x["checked"] for x in rs),
        })

writes = {"single": [], "cluster": [], "cluster_all": []}
for line in open(writes_file):
    parts = line.split()
    if parts[0] == "single":
        writes["single"].append(int(parts[1]))
    elif parts[0] == "cluster":
        writes["cluster"].append(int(parts[1]))
        writes["cluster_all"].append(int(parts[2]))


def fig(v):
    return f"{statistics.median(v):,.0f} (min {min(v):,.0f})" if v else "-"


cores = int(quota_us) / 100000
md = [
    f"# Cluster scaling on one machine ({out.split('/')[-1]})",
    "",
    "Produced by `loadtest/cluster-scaling.sh` (see its header for the setup): three NATS "
    "2.9 servers with JetStream (the log on all three), three geoshard nodes on loopback, each "
    f"node in a cgroup-v1 `cpu` group of {cores:g} of a core (`cpu.cfs_quota_us` "
    f"{quota_us} of 100000) and one io thread, the load generator (2 threads, 64 "
    "keep-alive connections spread over the nodes in use, closed loop) outside them. Every "
    f"node holds the whole dataset (every node follows the whole log). {repeat} rounds, "
    "the node counts alternating within each round; medians with minimums.",
    "",
    "| workload | nodes | requests/s, median (min) | × 1 node | p50 µs | p99 µs | errors | answers checked (wrong) |",
    "|---|---|---|---|---|---|---|---|",
]
for r in rows:
    md.append(
        f"| {r['workload']} | {r['nodes']} | {r['median']:,.0f} ({r['min']:,.0f}) | "
        f"{r['ratio']:.2f} | {r['p50']:.0f} | {r['p99']:.0f} | {r['errors']} | "
        f"{r['checked']} ({r['mismatched']}) |"
    )
md += [
    "",
    "A query is answered by the node that receives it, on its own views: there is no fan-out, "
    "so a query over three nodes has no latency beyond one node's answer (the p50 and p99 "
    "above are each node's own). The p99 of 30-85 ms is the CPU quota's: a group that has used "
    "its share of a 100 ms period is stopped until the next, and a request caught then waits; "
    "it is the harness's, not the nodes' (one node on the whole machine answers pip-counties "
    "over 64 connections at a p99 of 1.7-3.0 ms, loadtest/reports/2026-11-24c.md). Throughput at one node "
    "is the lowest per unit of CPU quota: its one io thread serves all 64 connections.",
    "",
    "## Writes",
    "",
    "`places-1m` (1,000,000 GeoNames-derived points) as NDJSON through `geoshard load` (bulk "
    "multipart, 64 connections), no CPU quotas, the whole machine shared by the loader, the "
    "nodes and NATS. Records/s, median (min):",
    "",
    "| target | until the loader's last answer | until every node applied everything |",
    "|---|---|---|",
    f"| single node (fsync) | {fig(writes['single'])} | - |",
    f"| 3-node cluster, through node 1 (JetStream R3 + node 1's fsync) | {fig(writes['cluster'])} | {fig(writes['cluster_all'])} |",
    "",
    "## Cluster status after the load",
    "",
    "(Each node's `applied` is as of its last heartbeat, at most 2 s old; the script waited "
    "for every node to have applied the whole log before it printed this.)",
    "",
    "```",
    open(status_file).read().rstrip(),
    "```",
    "",
    f"![throughput by node count]({out.split('/')[-1]}.svg)",
]
open(out + ".md", "w").write("\n".join(md) + "\n")

# One group of three bars a workload: requests/s at 1, 2 and 3 nodes.
W, H, pad = 520, 300, 50
top = max([r["median"] for r in rows] + [1])
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<text x="{W/2}" y="18" text-anchor="middle">requests/s by node count (median of {repeat})</text>']
colors = {1: "#9ecae1", 2: "#4292c6", 3: "#08519c"}
gw = (W - 2 * pad) / len(workloads)
for gi, w in enumerate(workloads):
    for r in [r for r in rows if r["workload"] == w]:
        bw = gw / 4
        x = pad + gi * gw + (r["nodes"] - 1) * bw + bw / 2
        h = (H - 2 * pad) * r["median"] / top
        y = H - pad - h
        svg.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw - 4:.1f}" height="{h:.1f}" fill="{colors[r["nodes"]]}"/>')
        svg.append(f'<text x="{x + bw/2 - 2:.1f}" y="{y - 4:.1f}" text-anchor="middle" font-size="10">{r["median"]/1000:.1f}k</text>')
        svg.append(f'<text x="{x + bw/2 - 2:.1f}" y="{H - pad + 14:.1f}" text-anchor="middle" font-size="10">{r["nodes"]}</text>')
    svg.append(f'<text x="{pad + gi * gw + gw/2:.1f}" y="{H - pad + 32:.1f}" text-anchor="middle">{w}</text>')
svg.append(f'<line x1="{pad}" y1="{H-pad}" x2="{W-pad}" y2="{H-pad}" stroke="black"/>')
svg.append("</svg>")
open(out + ".svg", "w").write("\n".join(svg) + "\n")
