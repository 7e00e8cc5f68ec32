#!/usr/bin/env python3
"""Dev-only oracle for the gkg relation tests (not run in CI).

Builds query geometries around the gkg office park (points on features and vertices,
boxes, a crossing line, an overlapping polygon, a feature's own polygon, a multipoint) and
writes, for every spatial relation, the OBJECTIDs shapely/GEOS says match, to
tests/fixtures/gkg_relations.json. Rules (REFERENCE §5): the relation is the feature's to the
query; point features match when they are inside or on the query (or its box, for
envelope-intersects), whatever the relation.

    python3 scripts/gkg_oracle.py
"""
import glob
import json
import os

import shapely
from shapely.geometry import box, mapping, shape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("GEOSHARD_DATA_DIR") or os.path.join(ROOT, "examples", "data")
OUT = os.path.join(ROOT, "tests", "fixtures", "gkg_relations.json")

features = {}
for f in sorted(glob.glob(os.path.join(DATA, "gds", "gkg", "[0-9]*.json"))):
    ft = json.load(open(f))["envelope"]["feature"]
    features[ft["properties"]["OBJECTID"]] = shape(ft["geometry"])

hq = features[3233]
museum = features[3235]
airport = features[32345]
shopping = features[3985]
queries = {
    "point at HQ (a point feature)": hq,
    "point at the museum": museum,
    "point inside the airport": shapely.Point(-122.2500, 37.5130),
    "point on an airport vertex": shapely.Point(*airport.exterior.coords[0]),
    "point on a Hwy 101 vertex": shapely.Point(*features[3237].coords[1]),
    "small box around the restaurant": box(-122.2590, 37.5120, -122.2570, 37.5135),
    "medium box": box(-122.2560, 37.5050, -122.2450, 37.5150),
    "box around everything": box(-122.27, 37.49, -122.23, 37.53),
    "line across the park": shapely.LineString([(-122.2700, 37.5050), (-122.2300, 37.5150)]),
    "polygon over the refuge": shapely.Polygon([(-122.2430, 37.5050), (-122.2300, 37.5050), (-122.2300, 37.5250), (-122.2430, 37.5250)]),
    "the shopping center itself": shopping,
    "multipoint museum and restaurant": shapely.MultiPoint([museum, features[56577]]),
}

RELATIONS = ["intersects", "contains", "within", "crosses", "overlaps", "touches", "envelopeIntersects"]


def matches(f, q, rel):
    if f.geom_type in ("Point", "MultiPoint"):
        if rel == "envelopeIntersects":
            return box(*q.bounds).intersects(f)
        return f.intersects(q)
    if rel == "envelopeIntersects":
        return box(*f.bounds).intersects(box(*q.bounds))
    return getattr(f, rel)(q)


out = {"shapely": shapely.__version__, "geos": ".".join(map(str, shapely.geos_version)), "queries": []}
for name, q in queries.items():
    expected = {rel: sorted(oid for oid, f in features.items() if matches(f, q, rel)) for rel in RELATIONS}
    out["queries"].append({"name": name, "geometry": mapping(q), "expected": expected})
with open(OUT, "w") as f:
    json.dump(out, f, indent=1)
print(f"wrote {OUT}")
for qd in out["queries"]:
    print(qd["name"], {k: v for k, v in qd["expected"].items()})
