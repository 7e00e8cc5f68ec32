#!/usr/bin/env bash
# Do the storage's per-point costs stay flat as the data grows? For generated places at each
# size (default 1m 2m 4m): an offline `geoshard load` of its NDJSON (timed), a first start and
# clean stop (the view built and saved), then a restart timed from exec to the first answered
# query, with the restarted server's anonymous resident memory (RssAnon), the data directory's
# bytes, and point queries a second (the point-eq workload: a stored point's own position, 64
# connections, answers checked; a fixed box would match more points as the data grows, so
# its rate measures the answers' size, not the index's cost). Then the checks the storage issue sets, the
# largest size against the smallest:
#
#   load rate at least 0.8 of the smallest's;   restart at most 1.5 times the smallest's + 0.5 s;
#   point queries/s at least 0.8 of the smallest's;
#   at most 150 bytes a point on disk and 60 bytes a point of anonymous memory.
#
# A measurement, not a CI test. Prints one line a size and one a check; the figures go to
# $WORK/growth.jsonl.
#
#   loadtest/growth-check.sh                    # 1m 2m 4m
#   SIZES="1m 4m" DURATION=8 loadtest/growth-check.sh
#   KEEP=1 loadtest/growth-check.sh             # keep each size's data directory
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SIZES=${SIZES:-1m 2m 4m}
DURATION=${DURATION:-6}
WORK=${WORK:-${TMPDIR:-/tmp}/geoshard-growth}
BIN=$ROOT/target/release
LT=$BIN/geoshard-loadtest
GS=127.0.0.1:18014
OUT=$WORK/growth.jsonl
mkdir -p "$WORK"
rm -f "$OUT"
cleanup() { [ -n "${GS_PID:-}" ] && kill "$GS_PID" 2> /dev/null || true; }
trap cleanup EXIT

cd "$ROOT"
cargo build --release -q -p geoshard -p geoshard-loadtest

# serve_timed DATA: start on DATA; sets GS_PID and $took (exec to the first answered query).
serve_timed() {
  local start code
  start=$(date +%s.%N)
  GEOSHARD_LOG=info "$BIN/geoshard" serve --data-dir "$1" --listen $GS > "$WORK/geoshard.log" 2>&1 &
  GS_PID=$!
  while :; do
    code=$(curl -s --digest -u lt:lt -o /dev/null -w '%{http_code}' "http://$GS/v1/resources/modelService" || true)
    [ "$code" = 200 ] && break
    case "$code" in 4*|50[0-24-9]) echo "modelService answered $code" >&2; exit 1 ;; esac
    kill -0 $GS_PID || { tail -20 "$WORK/geoshard.log"; exit 1; }
    sleep 0.02
  done
  took=$(echo "$(date +%s.%N) - $start" | bc)
}
stop() { kill -TERM $GS_PID; wait $GS_PID 2> /dev/null || true; GS_PID=; }

for size in $SIZES; do
  places=places-$size
  n=$(( ${size//[^0-9]/} * 1000000 ))
  file=$WORK/$places.ndjson
  data=$WORK/data-$size
  [ -f "$file" ] || "$LT" ndjson --dataset "$places" --out "$file"
  rm -rf "$data"
  start=$(date +%s.%N)
  "$BIN/geoshard" load "$file" --service "LT Places" --collection lt-places --data-dir "$data" --quiet
  load_s=$(echo "$(date +%s.%N) - $start" | bc)
  "$BIN/geoshard" user add --data-dir "$data" --name lt --password lt --role admin > /dev/null
  # The first start reads what the load saved (or builds it); a clean stop saves the view.
  serve_timed "$data"
  stop
  serve_timed "$data"
  restart_s=$took
  anon_kib=$(awk '/RssAnon/ {print $2}' /proc/$GS_PID/status)
  "$LT" run --target geoshard --addr $GS --user lt --password lt --workload point-eq \
    --connections 64 --duration "$DURATION" --warmup 2 --threads 1 --dataset "$places" \
    --server-pid $GS_PID --out "$WORK/run-$size.jsonl" > /dev/null
  qps=$(tail -1 "$WORK/run-$size.jsonl" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(round(r["throughput"])); sys.exit(1 if r["mismatched"] + r["errors"] else 0)')
  stop
  # Blocks allocated, not apparent sizes: redb extends a compacted file sparsely at its
  # first write after a repack, so its apparent size can be twice what it holds.
  disk=$(du -s --block-size=1 "$data" | cut -f1)
  python3 - "$OUT" "$size" "$n" "$load_s" "$restart_s" "$disk" "$anon_kib" "$qps" << 'PY'
import json, sys
out, size, n, load_s, restart_s, disk, anon_kib, qps = sys.argv[1:]
n = int(n)
r = {"size": size, "points": n, "load_s": float(load_s), "load_per_s": n / float(load_s),
     "restart_s": float(restart_s), "disk_b_per_point": int(disk) / n,
     "anon_b_per_point": int(anon_kib) * 1024 / n, "point_qps": int(qps)}
open(out, "a").write(json.dumps(r) + "\n")
print(f"{size}: load {r['load_s']:.1f} s ({r['load_per_s']:,.0f} points/s), restart {r['restart_s']:.2f} s, "
      f"disk {r['disk_b_per_point']:.0f} B/point, anonymous {r['anon_b_per_point']:.0f} B/point, "
      f"point queries {r['point_qps']:,}/s")
PY
  [ -n "${KEEP:-}" ] || rm -rf "$data"
done

python3 - "$OUT" << 'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
a, b = rows[0], rows[-1]
checks = [
    (f"load rate at {b['size']} >= 0.8 x {a['size']}", b["load_per_s"] >= 0.8 * a["load_per_s"],
     f"{b['load_per_s'] / a['load_per_s']:.2f}x"),
    (f"restart at {b['size']} <= 1.5 x {a['size']} + 0.5 s", b["restart_s"] <= 1.5 * a["restart_s"] + 0.5,
     f"{b['restart_s']:.2f} s against {1.5 * a['restart_s'] + 0.5:.2f} s"),
    (f"point queries/s at {b['size']} >= 0.8 x {a['size']}", b["point_qps"] >= 0.8 * a["point_qps"],
     f"{b['point_qps'] / a['point_qps']:.2f}x"),
    ("disk <= 150 B a point at every size", all(r["disk_b_per_point"] <= 150 for r in rows),
     ", ".join(f"{r['disk_b_per_point']:.0f}" for r in rows)),
    ("anonymous memory <= 60 B a point at every size", all(r["anon_b_per_point"] <= 60 for r in rows),
     ", ".join(f"{r['anon_b_per_point']:.0f}" for r in rows)),
]
for name, ok, figure in checks:
    print(f"{'met   ' if ok else 'MISSED'} {name}: {figure}")
PY
