#!/usr/bin/env python3
"""Geofence load test helpers for loadtest/fences.sh (standard library only).

  fences.py define ADDR USER PASSWORD SERVICE COUNT COUNTIES_GEOJSON [BULK]
      define COUNT polygon fences on SERVICE/0: the US counties first, then random boxes
      (0.05 to 1 degree) over the conterminous US; enter and exit. One PUT each, or with BULK
      a POST /v1/fences of BULK fences at a time. Prints the seconds taken.
  fences.py sse ADDR USER PASSWORD FENCE SECONDS OUT_JSON
      follow FENCE's events for SECONDS and write the delivery latency of each: the time it
      arrived less the event's `time` (when the writer decided it, before its commit's fsync,
      so this bounds the time from the write's acknowledgement from above).
"""

import base64
import datetime
import http.client
import json
import random
import socket
import sys
import time


def auth(user, password):
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def define(addr, user, password, service, count, counties, bulk=0):
    host, port = addr.split(":")
    conn = http.client.HTTPConnection(host, int(port))
    head = {"Authorization": auth(user, password), "Content-Type": "application/json"}
    shapes = [f["geometry"] for f in json.load(open(counties))["features"]][:count]
    rng = random.Random(7)
    while len(shapes) < count:
        w, h = rng.uniform(0.05, 1.0), rng.uniform(0.05, 1.0)
        x, y = rng.uniform(-125, -67 - w), rng.uniform(25, 49 - h)
        ring = [[x, y], [x + w, y], [x + w, y + h], [x, y + h], [x, y]]
        shapes.append({"type": "Polygon", "coordinates": [ring]})
    started = time.time()
    if bulk:
        for k in range(0, len(shapes), bulk):
            fences = [{"name": f"f{i}", "service": service, "layer": 0, "geometry": g, "detect": ["enter", "exit"]}
                      for i, g in enumerate(shapes[k : k + bulk], start=k)]
            conn.request("POST", "/v1/fences", json.dumps({"fences": fences}), head)
            r = conn.getresponse()
            text = r.read()
            if r.status != 200:
                sys.exit(f"fences {k}..: {r.status} {text[:300]!r}")
    else:
        for i, g in enumerate(shapes):
            body = json.dumps({"service": service, "layer": 0, "geometry": g, "detect": ["enter", "exit"]})
            conn.request("PUT", f"/v1/fences/f{i}", body, head)
            r = conn.getresponse()
            text = r.read()
            if r.status not in (200, 201):
                sys.exit(f"fence {i}: {r.status} {text[:300]!r}")
    print(f"{time.time() - started:.1f}")


def sse(addr, user, password, fence, seconds, out):
    host, port = addr.split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(
        f"GET /v1/fences/{fence}/events HTTP/1.1\r\nHost: x\r\nAuthorization: {auth(user, password)}\r\n\r\n".encode()
    )
    s.settimeout(1.0)
    buf = b""
    lat = []
    end = time.time() + seconds
    # Chunked framing is left in the buffer: events are found by their "data: " lines.
    while time.time() < end:
        try:
            got = s.recv(1 << 16)
        except socket.timeout:
            continue
        if not got:
            break
        now = time.time() * 1000
        buf += got
        while b"\n\n" in buf:
            block, buf = buf.split(b"\n\n", 1)
            for line in block.split(b"\n"):
                if line.startswith(b"data: "):
                    e = json.loads(line[6:])
                    t = datetime.datetime.fromisoformat(e["time"].replace("Z", "+00:00"))
                    lat.append(now - t.timestamp() * 1000)
    json.dump({"events": len(lat), "latencies_ms": lat}, open(out, "w"))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "define":
        a = sys.argv[2:]
        define(a[0], a[1], a[2], a[3], int(a[4]), a[5], int(a[6]) if len(a) > 6 else 0)
    elif cmd == "sse":
        a = sys.argv[2:]
        sse(a[0], a[1], a[2], a[3], float(a[4]), a[5])
    else:
        sys.exit(__doc__)
