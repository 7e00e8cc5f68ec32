#!/usr/bin/env python3
"""Query windows through cluster changes as a report and a timeline SVG (throughput and p99
a window, each change marked). No plotting library: drawn by hand. The report begins with
WORK/intro.md; each MARK is `seconds=label`, and the phases are the windows' own, in order.

    python3 loadtest/cluster-join-report.py WORK NAME COMMAND MARK... > NAME.md
"""
import json
import statistics
import sys
from pathlib import Path

work, name, command = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
marks = [(float(m.split("=", 1)[0]), m.split("=", 1)[1]) for m in sys.argv[4:]]
rows = [json.loads(l) for l in (work / "windows.jsonl").read_text().splitlines() if l.strip()]
phases = list(dict.fromkeys(r["phase"] for r in rows))


def by(phase, workload):
    return [r for r in rows if r["phase"] == phase and r["workload"] == workload]


print((work / "intro.md").read_text().replace("COMMAND", command))
for t, label in marks:
    print(f"- {t:.1f} s into the run: {label}.")
failed = sum(r["errors"] for r in rows)
wrong = sum(r["mismatched"] for r in rows)
checked = sum(r["checked"] for r in rows)
print(f"- {sum(r['requests'] for r in rows)} queries in {len(rows)} windows: {failed} failed, "
      f"{wrong} wrong of {checked} checked.\n")
print("| workload | phase | windows | throughput (median /s) | p99 (median, max ms) | against before (p99 max) |")
print("|---|---|---|---|---|---|")
for w in ("pip-counties", "envelope"):
    base = by("before", w)
    base_p99 = statistics.median(r["p99_us"] for r in base) if base else None
    for phase in phases:
        rs = by(phase, w)
        if not rs:
            continue
        tp = statistics.median(r["throughput"] for r in rs)
        p99s = [r["p99_us"] for r in rs]
        ratio = f"{max(p99s) / base_p99:.2f}×" if base_p99 else ""
        print(f"| {w} | {phase} | {len(rs)} | {tp:,.0f} | {statistics.median(p99s) / 1000:.1f}, "
              f"{max(p99s) / 1000:.1f} | {ratio} |")
du = (work / "du").read_text().split("\n")
print("\nData directories at the end (bytes, as written):\n")
for line in du:
    if line.strip():
        size, path = line.split()
        print(f"- {Path(path).name}: {int(size) / 1e6:.0f} MB")
print(f"\n![timeline]({name}.svg)")

# The timeline: a window's throughput (bars' tops as a line) and p99, by start time.
W, H, pad = 760, 360, 50
end = max(r["start"] + r["seconds"] for r in rows)
x = lambda t: pad + (W - 2 * pad) * t / end
tp_max = max(r["throughput"] for r in rows) * 1.1
p99_max = max(r["p99_us"] for r in rows) / 1000 * 1.1
y_tp = lambda v: pad + (H / 2 - pad) * (1 - v / tp_max)
y_p99 = lambda v: H / 2 + 20 + (H / 2 - pad - 20) * (1 - v / p99_max)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       f'<rect width="{W}" height="{H}" fill="white"/>']
for t, label in marks:
    svg.append(f'<line x1="{x(t):.1f}" y1="{pad - 10}" x2="{x(t):.1f}" y2="{H - pad}" stroke="#999" stroke-dasharray="4 3"/>')
    svg.append(f'<text x="{x(t) + 3:.1f}" y="{pad - 14}">{label}</text>')
colors = {"pip-counties": "#1f77b4", "envelope": "#d62728"}
for w, c in colors.items():
    rs = [r for r in rows if r["workload"] == w]
    pts = " ".join(f"{x(r['start'] + r['seconds'] / 2):.1f},{y_tp(r['throughput']):.1f}" for r in rs)
    svg.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"/>')
    pts = " ".join(f"{x(r['start'] + r['seconds'] / 2):.1f},{y_p99(r['p99_us'] / 1000):.1f}" for r in rs)
    svg.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2" stroke-dasharray="5 2"/>')
svg.append(f'<text x="{pad}" y="{pad - 30}">queries/s per window (solid) and p99 ms (dashed): '
           f'<tspan fill="{colors["pip-counties"]}">pip-counties</tspan>, '
           f'<tspan fill="{colors["envelope"]}">envelope</tspan></text>')
svg.append(f'<text x="5" y="{y_tp(tp_max / 1.1):.1f}">{tp_max / 1.1:,.0f}/s</text>')
svg.append(f'<text x="5" y="{y_p99(p99_max / 1.1):.1f}">{p99_max / 1.1:.0f} ms</text>')
svg.append(f'<line x1="{pad}" y1="{H - pad}" x2="{W - pad}" y2="{H - pad}" stroke="black"/>')
svg.append(f'<text x="{W / 2 - 20}" y="{H - pad + 25}">seconds: 0 to {end:.0f}</text>')
svg.append("</svg>")
Path(f"loadtest/reports/{name}.svg").write_text("\n".join(svg) + "\n")
