#!/usr/bin/env python3
"""Print criterion's median estimate (ns) for every benchmark under target/criterion.

    python3 scripts/criterion_summary.py [label]   # one line per bench, JSON

Used to collect repeated runs: run the benches N times, calling this after each run.
"""
import json
import pathlib
import sys

root = pathlib.Path(__file__).resolve().parent.parent / "target" / "criterion"
label = sys.argv[1] if len(sys.argv) > 1 else ""
out = {}
for est in sorted(root.glob("**/new/estimates.json")):
    name = str(est.parent.parent.relative_to(root))
    median = json.loads(est.read_text())["median"]["point_estimate"]
    out[name] = round(median, 1)
print(json.dumps({"run": label, "median_ns": out}))
