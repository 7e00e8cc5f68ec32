#!/usr/bin/env python3
"""The growth check's figures as an SVG: load time a point, restart and a point query's server
CPU against the dataset's size, with PostGIS's figures beside them where given. No plotting
library: three log-x panels drawn by hand.

    python3 loadtest/growth-plot.py WORK OUT.svg [POSTGIS.json]

WORK is growth-check.sh's directory (growth.jsonl and run-<size>.jsonl). POSTGIS.json, if
given, is a list of {"points", "load_s", "restart_s", "cpu_us"} measured beside it.
"""
import json
import math
import sys
from pathlib import Path

work, out = Path(sys.argv[1]), Path(sys.argv[2])
peer = json.loads(Path(sys.argv[3]).read_text()) if len(sys.argv) > 3 else []

rows = [json.loads(l) for l in (work / "growth.jsonl").read_text().splitlines() if l.strip()]
ours = []
for r in rows:
    run = work / f"run-{r['size']}.jsonl"
    cpu = None
    if run.exists():
        last = run.read_text().strip().splitlines()[-1]
        cpu = json.loads(last).get("server_cpu_us_per_request")
    ours.append({"points": r["points"], "load_us": r["load_s"] / r["points"] * 1e6,
                 "restart_s": r["restart_s"], "cpu_us": cpu})
theirs = [{"points": p["points"], "load_us": p["load_s"] / p["points"] * 1e6,
           "restart_s": p["restart_s"], "cpu_us": p.get("cpu_us")} for p in peer]

panels = [("load, µs a point", "load_us"), ("restart to the first answer, s", "restart_s"),
          ("point query, server CPU µs", "cpu_us")]
W, H, PAD = 300, 220, 45
sizes = sorted({p["points"] for p in ours + theirs})
xmin, xmax = math.log10(min(sizes)) - 0.2, math.log10(max(sizes)) + 0.2
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{3 * W}" height="{H + 40}" '
       'font-family="sans-serif" font-size="11">']
for i, (title, key) in enumerate(panels):
    x0 = i * W
    vals = [p[key] for p in ours + theirs if p[key] is not None]
    top = max(vals) * 1.15 if vals else 1
    sx = lambda n: x0 + PAD + (math.log10(n) - xmin) / (xmax - xmin) * (W - PAD - 15)
    sy = lambda v: H - 25 - v / top * (H - 55)
    svg.append(f'<text x="{x0 + W / 2}" y="15" text-anchor="middle" font-weight="bold">{title}</text>')
    svg.append(f'<line x1="{x0 + PAD}" y1="{H - 25}" x2="{x0 + W - 15}" y2="{H - 25}" stroke="#444"/>')
    svg.append(f'<line x1="{x0 + PAD}" y1="30" x2="{x0 + PAD}" y2="{H - 25}" stroke="#444"/>')
    for k in range(5):
        v = top * k / 4
        svg.append(f'<text x="{x0 + PAD - 4}" y="{sy(v) + 4}" text-anchor="end">{v:.3g}</text>')
    for n in sizes:
        label = f"{n / 1e6:g}M"
        svg.append(f'<text x="{sx(n)}" y="{H - 10}" text-anchor="middle">{label}</text>')
    for series, colour in ((ours, "#1f77b4"), (theirs, "#d62728")):
        pts = [(sx(p["points"]), sy(p[key])) for p in series if p[key] is not None]
        if len(pts) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            svg.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in pts:
            svg.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"/>')
svg.append(f'<text x="{PAD}" y="{H + 30}" fill="#1f77b4">● geoshard</text>')
if theirs:
    svg.append(f'<text x="{PAD + 90}" y="{H + 30}" fill="#d62728">● PostGIS</text>')
svg.append("</svg>")
out.write_text("\n".join(svg) + "\n")
print(f"wrote {out}")
