#!/usr/bin/env python3
"""Dev-only oracle for the spatial differential test (not run in CI).

Computes, with shapely/GEOS, which US counties and which world countries contain each of
the 144,563 GeoNames places and a set of seeded random points, and writes the answers to
tests/fixtures/pip_oracle.csv. The Rust test `tests/spatial_oracle.rs` runs the engine on
the same points and compares.

    pip install shapely==2.2.0
    python3 scripts/oracle.py            # reads examples/data/real (or $GEOSHARD_DATA_DIR/real)

Feature numbers are positions in each GeoJSON FeatureCollection (0-based). "Contains" is
GEOS's `contains(polygon, point)`: a point on a boundary is not contained.
"""
import csv
import json
import os
import random
import sys

import numpy as np
import shapely
from shapely import STRtree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("GEOSHARD_DATA_DIR") or os.path.join(ROOT, "examples", "data")
OUT = os.path.join(ROOT, "tests", "fixtures", "pip_oracle.csv")
RANDOM_WORLD = 20_000
RANDOM_US = 10_000
SEED = 20261121


def load(name):
    with open(os.path.join(DATA, "real", name)) as f:
        fc = json.load(f)
    return [shapely.geometry.shape(ft["geometry"]) for ft in fc["features"]]


def containing(polys, xs, ys):
    """For each point, the sorted indexes of the polygons that contain it."""
    tree = STRtree(polys)
    pts = shapely.points(xs, ys)
    # (point index, polygon index) pairs where the point is within the polygon, i.e. the
    # polygon contains the point (GEOS prepared predicate).
    pairs = tree.query(pts, predicate="within")
    out = [[] for _ in range(len(xs))]
    for p, g in zip(pairs[0], pairs[1]):
        out[p].append(int(g))
    return [sorted(o) for o in out]


def main():
    counties = load("us-counties.geojson")
    countries = load("world-countries-50m.geojson")
    xs, ys, labels = [], [], []
    with open(os.path.join(DATA, "real", "geonames-cities1000.csv")) as f:
        for i, row in enumerate(csv.DictReader(f)):
            xs.append(float(row["lon"]))
            ys.append(float(row["lat"]))
            labels.append(("g", i))
    rng = random.Random(SEED)
    for i in range(RANDOM_WORLD):
        xs.append(rng.uniform(-180.0, 180.0))
        ys.append(rng.uniform(-90.0, 90.0))
        labels.append(("r", i))
    for i in range(RANDOM_US):
        xs.append(rng.uniform(-125.0, -66.0))
        ys.append(rng.uniform(24.0, 50.0))
        labels.append(("u", i))
    xs = np.array(xs)
    ys = np.array(ys)
    in_counties = containing(counties, xs, ys)
    in_countries = containing(countries, xs, ys)
    with open(OUT, "w") as f:
        f.write(f"# shapely {shapely.__version__} GEOS {'.'.join(map(str, shapely.geos_version))}; "
                f"seed {SEED}; kind: g = GeoNames row, r = random world, u = random US box\n")
        f.write("kind,index,lon,lat,counties,countries\n")
        for (kind, i), x, y, a, b in zip(labels, xs, ys, in_counties, in_countries):
            # Random points carry their coordinates (repr round-trips exactly); GeoNames
            # rows are re-read from the CSV by the test.
            coords = ("", "") if kind == "g" else (repr(float(x)), repr(float(y)))
            f.write(f"{kind},{i},{coords[0]},{coords[1]},{'|'.join(map(str, a))},{'|'.join(map(str, b))}\n")
    n_multi = sum(1 for a in in_counties if len(a) > 1) + sum(1 for b in in_countries if len(b) > 1)
    print(f"wrote {OUT}: {len(labels)} points, {n_multi} in more than one feature", file=sys.stderr)


if __name__ == "__main__":
    main()
