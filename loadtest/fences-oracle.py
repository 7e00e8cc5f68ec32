#!/usr/bin/env python3
"""A recorded random walk over many geofences, checked against shapely (dev only, not in CI).

Starts target/release/geoshard on a fresh data directory, makes a point layer, defines FENCES
fences around Colorado (boxes and triangles on a 1/8 degree grid, pairs of boxes as
multipolygons, and the real counties there), then walks MOVERS points for STEPS steps: each
step moves every mover (a few grid cells, or anywhere in the region) or deletes it, written in
bulk requests of 1,000 documents and single DELETEs. Most positions lie on the grid, and a fifth
of them on a county's vertex, so thousands fall exactly on fence edges and vertices.

Every fence's events are then read back over server-sent events (`?after=0`) and compared
with a brute-force oracle: shapely's `intersects` (an edge or a vertex is inside) of each
position with each fence, and of each segment for `cross`. Exit code 1 on any difference.

  target/clients-venv/bin/python loadtest/fences-oracle.py [--movers 10000] [--fences 1000] [--steps 8]
"""

import argparse
import base64
import concurrent.futures
import http.client
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import shapely
from shapely.geometry import LineString, Point, shape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REGION = (-110.0, 35.0, -100.0, 42.0)
GRID = 0.125
USER, PASSWORD = "oracle", "oracle-pw"
AUTH = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
TDE = "http://marklogic.com/xdmp/tde"
SERVICES = "http://marklogic.com/feature-services"


def grid_point(rng):
    x = REGION[0] + GRID * rng.randrange(int((REGION[2] - REGION[0]) / GRID) + 1)
    y = REGION[1] + GRID * rng.randrange(int((REGION[3] - REGION[1]) / GRID) + 1)
    return (x, y)


def make_fences(count, rng):
    """(name, GeoJSON geometry, detect) for each fence."""
    counties = []
    for f in json.load(open(os.path.join(ROOT, "../shared/data/real/us-counties.geojson")))["features"]:
        g = shape(f["geometry"])
        w, s, e, n = g.bounds
        if w >= REGION[0] and s >= REGION[1] and e <= REGION[2] and n <= REGION[3]:
            counties.append(f["geometry"])
    counties = counties[: count // 7]
    fences = [("county-%d" % i, g) for i, g in enumerate(counties)]
    while len(fences) < count:
        i = len(fences)
        kind = rng.random()
        a = grid_point(rng)
        if kind < 0.65:
            w, h = GRID * rng.randint(2, 12), GRID * rng.randint(2, 12)
            ring = [a, (a[0] + w, a[1]), (a[0] + w, a[1] + h), (a[0], a[1] + h), a]
            fences.append(("box-%d" % i, {"type": "Polygon", "coordinates": [ring]}))
        elif kind < 0.9:
            b = (a[0] + GRID * rng.randint(-10, 10), a[1] + GRID * rng.randint(-10, 10))
            c = (a[0] + GRID * rng.randint(-10, 10), a[1] + GRID * rng.randint(-10, 10))
            if shapely.Polygon([a, b, c]).area == 0:
                continue
            fences.append(("tri-%d" % i, {"type": "Polygon", "coordinates": [[a, b, c, a]]}))
        else:
            parts = []
            for p in (a, (a[0] + GRID * rng.randint(6, 16), a[1] + GRID * rng.randint(-4, 4))):
                w, h = GRID * rng.randint(1, 5), GRID * rng.randint(1, 5)
                parts.append([[p, (p[0] + w, p[1]), (p[0] + w, p[1] + h), (p[0], p[1] + h), p]])
            if shape({"type": "MultiPolygon", "coordinates": parts}).is_valid:
                fences.append(("multi-%d" % i, {"type": "MultiPolygon", "coordinates": parts}))
    out = []
    for i, (name, g) in enumerate(fences):
        detect = ["enter", "exit"]
        if i % 10 == 3:
            detect.append("cross")
        if i % 200 == 7:
            detect.append("inside")
        out.append((name, g, detect))
    return out


def walk(movers, steps, fences, rng):
    """The writes, in order: a list of steps, each a list of batches, each
    (moves: [(mover, (x, y))], deletes: [mover])."""
    vertices = []
    for _, g, _ in fences:
        if g["type"] == "Polygon" and len(g["coordinates"][0]) > 20:
            vertices.extend(tuple(c) for c in g["coordinates"][0])
    where = {}
    out = []
    for step in range(steps):
        order = list(range(movers))
        rng.shuffle(order)
        batches = []
        for k in range(0, movers, 1000):
            moves, deletes = [], []
            for m in order[k : k + 1000]:
                r = rng.random()
                if step > 0 and r < 0.05:
                    if m in where:
                        deletes.append(m)
                        del where[m]
                    continue
                r = rng.random()
                if r < 0.2:
                    p = rng.choice(vertices)
                elif r < 0.3:
                    p = (rng.uniform(REGION[0], REGION[2]), rng.uniform(REGION[1], REGION[3]))
                elif r < 0.65 and m in where:
                    x, y = where[m]
                    p = (x + GRID * rng.randint(-3, 3), y + GRID * rng.randint(-3, 3))
                else:
                    p = grid_point(rng)
                where[m] = p
                moves.append((m, p))
            batches.append((moves, deletes))
        out.append(batches)
    return out


def oracle(fences, steps):
    """Each fence's events in commit order, [(uri, detect, position or None)], and how many
    (position, fence) pairs lie exactly on the fence's boundary. Brute force through shapely's
    R-tree: every position against every fence whose box holds it, by `intersects`."""
    areas = [shape(g) for _, g, _ in fences]
    tree = shapely.STRtree(areas)
    names = [name for name, _, _ in fences]
    detects = [set(d) for _, _, d in fences]
    changes = []
    where = {}
    for batches in steps:
        for moves, deletes in batches:
            for m, p in moves:
                changes.append((m, where.get(m), p))
                where[m] = p
            for m in deletes:
                changes.append((m, where.pop(m), None))
    positions = sorted({p for _, a, b in changes for p in (a, b) if p is not None})
    index = {p: i for i, p in enumerate(positions)}
    points = shapely.points(positions)
    inside = [set() for _ in positions]
    for i, f in zip(*tree.query(points, predicate="intersects")):
        inside[i].add(int(f))
    on_edge = len(tree.query(points, predicate="touches")[0])
    crossing = [i for i, d in enumerate(detects) if "cross" in d]
    cross_tree = shapely.STRtree([areas[i] for i in crossing])
    moved = [k for k, (_, a, b) in enumerate(changes) if a is not None and b is not None and a != b]
    crossed = {}
    segments = shapely.linestrings([[changes[k][1], changes[k][2]] for k in moved])
    for j, f in zip(*cross_tree.query(segments, predicate="intersects")):
        crossed.setdefault(moved[j], []).append(crossing[f])
    events = {name: [] for name in names}
    empty = set()
    for k, (m, before, p) in enumerate(changes):
        uri = f"/walk/{m}.json"
        was = inside[index[before]] if before is not None else empty
        now = inside[index[p]] if p is not None else empty
        for f in sorted(now - was):
            if "enter" in detects[f]:
                events[names[f]].append((uri, "enter", p))
        for f in sorted(was - now):
            if "exit" in detects[f]:
                events[names[f]].append((uri, "exit", p))
        for f in sorted(now):
            if "inside" in detects[f]:
                events[names[f]].append((uri, "inside", p))
        for f in crossed.get(k, []):
            if f not in was and f not in now:
                events[names[f]].append((uri, "cross", p))
    return events, on_edge, len(changes)


class Server:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="geoshard-oracle-")
        binary = os.path.join(ROOT, "target/release/geoshard")
        subprocess.run(
            [binary, "user", "add", "--data-dir", self.dir, "--name", USER, "--password", PASSWORD, "--role", "admin"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        env = dict(os.environ, GEOSHARD_LOG="warn", GEOSHARD_EVENT_RETENTION_BYTES=str(8 << 30),
                   GEOSHARD_MAX_FENCES="100000")
        self.proc = subprocess.Popen(
            [binary, "serve", "--data-dir", self.dir, "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for line in self.proc.stdout:
            if "listening" in line:
                self.addr = line.strip().split("http://")[1]
                break
        host, port = self.addr.split(":")
        self.host, self.port = host, int(port)
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=300)

    def request(self, method, path, body=None, content_type="application/json"):
        head = {"Authorization": AUTH}
        if body is not None:
            head["Content-Type"] = content_type
        self.conn.request(method, path, body, head)
        r = self.conn.getresponse()
        text = r.read()
        return r.status, text

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def put_doc(srv, uri, collection, doc):
    status, text = srv.request("PUT", f"/v1/documents?uri={uri}&collection={collection}", json.dumps(doc))
    assert status in (201, 204), (status, text)


def bulk(srv, moves):
    boundary = "oracle-boundary"
    parts = []
    for m, (x, y) in moves:
        doc = {"id": m, "geometry": {"type": "Point", "coordinates": [x, y]}}
        parts.append(
            f"--{boundary}\r\nContent-Type: application/json\r\n"
            f'Content-Disposition: attachment; filename="/walk/{m}.json"\r\n\r\n{json.dumps(doc)}\r\n'
        )
    parts.append(f"--{boundary}--\r\n")
    status, text = srv.request(
        "POST", "/v1/documents?collection=walk", "".join(parts).encode(), f"multipart/mixed; boundary={boundary}"
    )
    assert status == 200, (status, text[:300])


def read_events(srv, name, want, quiet=0.5):
    """A fence's events from the first, until `want` came and `quiet` seconds pass with no more."""
    s = socket.create_connection((srv.host, srv.port))
    s.sendall(f"GET /v1/fences/{name}/events?after=0 HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH}\r\n\r\n".encode())
    buf = b""
    events = []
    deadline = time.time() + 120
    s.settimeout(quiet)
    while time.time() < deadline:
        try:
            chunk = s.recv(1 << 20)
        except socket.timeout:
            if len(events) >= want:
                break
            continue
        if not chunk:
            break
        buf += chunk
        # Chunked framing is left in the buffer: events are found by their "data: " lines.
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
    s.close()
    return events


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--movers", type=int, default=10000)
    ap.add_argument("--fences", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=59)
    ap.add_argument("--ulps", type=int, default=0, help="positions may differ by this many units in the last place")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    fences = make_fences(args.fences, rng)
    steps = walk(args.movers, args.steps, fences, rng)
    started = time.time()
    expected, on_edge, changes = oracle(fences, steps)
    total = sum(len(v) for v in expected.values())
    print(f"oracle: {changes} writes, {total} events over {len(fences)} fences, {on_edge} (position, fence) "
          f"pairs on a boundary, in {time.time() - started:.1f} s", flush=True)

    srv = Server()
    try:
        columns = [{"name": "OBJECTID", "scalarType": "int", "val": "id"}]
        template = {"template": {"context": "/", "collections": ["walk"], "rows": [
            {"schemaName": "oracle", "viewName": "walk", "columns": columns}]}}
        put_doc(srv, "/t/walk.json", TDE, template)
        descriptor = {"info": {"name": "Walk", "description": "d"}, "layers": [{
            "id": 0, "name": "walkers", "description": "d", "geometryType": "Point",
            "schema": "oracle", "view": "walk",
            "geometry": {"format": "geojson", "coordinateSystem": "wgs84", "xpath": "//geometry"}}]}
        put_doc(srv, "/s/walk.json", SERVICES, descriptor)
        started = time.time()
        for name, g, detect in fences:
            status, text = srv.request("PUT", f"/v1/fences/{name}", json.dumps(
                {"service": "Walk", "layer": 0, "geometry": g, "detect": detect}))
            assert status == 201, (name, status, text[:300])
        print(f"defined {len(fences)} fences in {time.time() - started:.1f} s", flush=True)
        started = time.time()
        writes = 0
        for batches in steps:
            for moves, deletes in batches:
                bulk(srv, moves)
                for m in deletes:
                    status, text = srv.request("DELETE", f"/v1/documents?uri=/walk/{m}.json")
                    assert status == 204, (status, text)
                writes += len(moves) + len(deletes)
        print(f"walked: {writes} writes in {time.time() - started:.1f} s", flush=True)

        started = time.time()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            got = dict(zip(expected, pool.map(lambda n: read_events(srv, n, len(expected[n])), expected)))
        print(f"read {sum(len(v) for v in got.values())} events in {time.time() - started:.1f} s", flush=True)
        wrong = 0
        for name, want in expected.items():
            # A delete's exit carries the row as it was; the oracle checks the transition only.
            have = [(e["uri"], e["detect"], tuple(e["geometry"]["coordinates"]) if e.get("geometry") else None)
                    for e in got[name]]
            have = [(u, d, None if w[2] is None else g) for (u, d, g), w in zip(have, want)] + have[len(want):]
            want = [(u, d, tuple(p) if p is not None else None) for u, d, p in want]
            if args.ulps:
                near = lambda a, b: a == b or (a is not None and b is not None and all(
                    abs(x - y) <= args.ulps * math.ulp(y) for x, y in zip(a, b)))
                have = [w if len(h) == 3 and h[:2] == w[:2] and near(h[2], w[2]) else h
                        for h, w in zip(have, want)] + have[len(want):]
            if have != want:
                wrong += 1
                if wrong <= 5:
                    first = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
                    print(f"{name}: {len(have)} events, oracle {len(want)}; first difference at {first}: "
                          f"{have[first:first + 2]} against {want[first:first + 2]}")
        print(json.dumps({"movers": args.movers, "fences": len(fences), "steps": args.steps, "writes": writes,
                          "events": total, "on_boundary": on_edge, "fences_differing": wrong}))
        sys.exit(1 if wrong else 0)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
