#!/usr/bin/env python3
"""Summarise loadtest/fences.sh's results.jsonl as the report's targets table (min and median
of the rounds, each ratio against the same round's run without fences), and draw the event
latencies of the last round's sse.json as an SVG of their distribution (standard library only).

Usage: loadtest/fences-report.py RESULTS_JSONL SSE_JSON OUT_SVG
"""

import json
import statistics
import sys


def main(results, sse, svg):
    runs = [json.loads(l) for l in open(results) if l.strip()]
    rounds = sorted({r["round"] for r in runs})
    by = {(r["round"], r["setup"]): r for r in runs}
    put, bulk, p99, rate, define = [], [], [], [], []
    for k in rounds:
        base, fenced = by.get((k, "none")), by.get((k, "fences"))
        if not base or not fenced:
            continue
        put.append(fenced["put_per_sec"] / base["put_per_sec"])
        bulk.append(fenced["bulk_docs_per_sec"] / base["bulk_docs_per_sec"])
        p99.append(fenced["sse"]["p99_ms"])
        rate.append(fenced["sse"]["paced_put_per_sec"])
        define.append(fenced["define_secs"])
    mm = lambda v, f: f"{f(min(v))} / {f(statistics.median(v))}"
    ratio = lambda x: f"{x:.2f}x"
    print("| target | goal | min / median |")
    print("|---|---|---|")
    print(f"| single PUTs with the fences, against none | >= 0.85x | {mm(put, ratio)} |")
    print(f"| bulk (`geoshard load` over HTTP), against none | >= 0.8x | {mm(bulk, ratio)} |")
    print(f"| event latency p99, commit to SSE client | <= 20 ms | {mm(p99, lambda x: f'{x:.1f} ms')} |")
    print(f"| the paced writes' rate during it | 5,000/s | {mm(rate, lambda x: f'{x:,.0f}/s')} |")
    print(f"| defining the fences, one PUT each | | {mm(define, lambda x: f'{x:.0f} s')} |")
    print()
    for r in runs:
        print(
            f"- round {r['round']} {r['setup']}: {r['put_per_sec']:,} PUT/s (p99 {r['put_p99_us'] / 1000:.1f} ms), "
            f"bulk {r['bulk_docs_per_sec']:,.0f} docs/s, {r['events_made']:,} events made"
            + (f", SSE {r['sse']['events']:,} events p50 {r['sse']['p50_ms']:.1f} ms p99 {r['sse']['p99_ms']:.1f} ms max {r['sse']['max_ms']:.1f} ms" if r["sse"] else "")
        )
    lat = sorted(json.load(open(sse))["latencies_ms"])
    if not lat:
        return
    # The share of events delivered within x ms, x on a log scale from 0.5 to the max.
    import math
    w, h, pad = 640, 360, 50
    lo, hi = 0.5, max(lat[-1], 1.0) * 1.1
    sx = lambda x: pad + (math.log10(max(x, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * (w - 2 * pad)
    sy = lambda f: h - pad - f * (h - 2 * pad)
    pts = " ".join(f"{sx(x):.1f},{sy((i + 1) / len(lat)):.1f}" for i, x in enumerate(lat[:: max(1, len(lat) // 800)]))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{pad}" y="20">Geofence event latency, commit to SSE client ({len(lat):,} events): share delivered within x ms</text>',
           f'<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{pts}"/>',
           f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
           f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>']
    for x in [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500]:
        if x <= hi:
            out.append(f'<line x1="{sx(x):.1f}" y1="{h - pad}" x2="{sx(x):.1f}" y2="{h - pad + 5}" stroke="black"/>')
            out.append(f'<text x="{sx(x):.1f}" y="{h - pad + 18}" text-anchor="middle">{x:g}</text>')
    for f in [0, 0.5, 0.9, 0.99, 1.0]:
        out.append(f'<text x="{pad - 6}" y="{sy(f) + 4:.1f}" text-anchor="end">{f:g}</text>')
        out.append(f'<line x1="{pad}" y1="{sy(f):.1f}" x2="{w - pad}" y2="{sy(f):.1f}" stroke="#ddd"/>')
    out.append(f'<line x1="{sx(20):.1f}" y1="{pad}" x2="{sx(20):.1f}" y2="{h - pad}" stroke="#d62728" stroke-dasharray="4"/>')
    out.append(f'<text x="{sx(20) + 4:.1f}" y="{pad + 12}" fill="#d62728">20 ms target</text>')
    out.append("</svg>")
    open(svg, "w").write("\n".join(out))


if __name__ == "__main__":
    main(*sys.argv[1:4])
