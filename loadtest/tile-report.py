#!/usr/bin/env python3
"""Tile timings over HTTP, as a map client asks for them, against a running geoshard.

  tile-report.py URL USER PASSWORD COLLECTION...

For each collection:
- a pan-and-zoom path, one client: at each zoom 0-14 the 4x3 tiles of a viewport over
  Denver, then the viewport panned one tile east (the new column only);
- then the same path again (what a second visit, or a second user with the same roles, costs).
Then the map page's first load: every collection's tiles of a 4x3 viewport over the US at
zoom 4, asked 8 at a time, twice.

Prints a JSON object: p50, p95 and max in ms per collection, pass and zoom, and for the page.
Times are the client's, from the request to the last byte (an upper bound of the server's).
TILE_ENCODING=identity asks for tiles as they are (the default, gzip, as browsers ask, adds
the client's decompression to each time).
"""

import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import requests


def tile_of(z, lon, lat):
    n = 2 ** z
    r = math.radians(lat)
    x = int((lon + 180.0) / 360.0 * n)
    y = int((1.0 - math.log(math.tan(r) + 1.0 / math.cos(r)) / math.pi) / 2.0 * n)
    return x, y


def viewport(z, lon, lat, w=4, h=3):
    cx, cy = tile_of(z, lon, lat)
    n = 2 ** z
    tiles = []
    for dy in range(-(h // 2), h - h // 2):
        for dx in range(-(w // 2), w - w // 2):
            x, y = (cx + dx) % n, cy + dy
            if 0 <= y < n and (z, x, y) not in tiles:
                tiles.append((z, x, y))
    return tiles


def path(lon=-104.99, lat=39.74):
    """(z, x, y) in the order one client walks them: each zoom's viewport, then a pan east."""
    out = []
    for z in range(0, 15):
        tiles = viewport(z, lon, lat)
        out.extend(tiles)
        n = 2 ** z
        east = max(x for _, x, _ in tiles)
        for _, x, y in tiles:
            if x == east and (z, (x + 1) % n, y) not in out:
                out.append((z, (x + 1) % n, y))
    return out


def stats(ms):
    ms = sorted(ms)
    p95 = ms[min(len(ms) - 1, int(math.ceil(0.95 * len(ms))) - 1)]
    return {"n": len(ms), "p50": round(statistics.median(ms), 2), "p95": round(p95, 2),
            "max": round(ms[-1], 2)}


def fetch(session, url):
    t = time.perf_counter()
    r = session.get(url)
    r.content
    ms = (time.perf_counter() - t) * 1000.0
    if r.status_code != 200:
        raise SystemExit(f"{url}: HTTP {r.status_code} {r.text[:200]}")
    return ms, len(r.content)


def main(argv):
    base, user, password, collections = argv[1], argv[2], argv[3], argv[4:]
    encoding = os.environ.get("TILE_ENCODING", "gzip")
    session = requests.Session()
    session.auth = (user, password)
    session.headers["Accept-Encoding"] = encoding
    report = {"collections": {}, "page": {}}
    walk = path()
    for c in collections:
        per = {}
        for rnd in ("first", "second"):
            by_zoom = {}
            for z, x, y in walk:
                ms, size = fetch(session, f"{base}/tiles/{c}/{z}/{x}/{y}.mvt")
                by_zoom.setdefault(z, []).append(ms)
            per[rnd] = {str(z): stats(v) for z, v in sorted(by_zoom.items())}
            per[rnd]["all"] = stats([m for v in by_zoom.values() for m in v])
        report["collections"][c] = per

    page = [(c, t) for c in collections for t in viewport(4, -98.0, 39.0)]
    sessions = [requests.Session() for _ in range(8)]
    for s in sessions:
        s.auth = (user, password)
        s.headers["Accept-Encoding"] = encoding
    for rnd in ("first", "second"):
        def one(i):
            c, (z, x, y) = page[i]
            return fetch(sessions[i % 8], f"{base}/tiles/{c}/{z}/{x}/{y}.mvt")
        t = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(one, range(len(page))))
        wall = (time.perf_counter() - t) * 1000.0
        report["page"][rnd] = dict(stats([m for m, _ in got]), wall=round(wall, 1),
                                   kb=round(sum(b for _, b in got) / 1024))
    report["encoding"] = encoding
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv)
