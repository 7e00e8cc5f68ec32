#!/usr/bin/env bash
# Regenerate the load-test report: geoshard, the HTTP ceiling (the harness's baseline server)
# and PostGIS, on this machine, in one run, by the same client. Long: not for CI.
#
#   loadtest/run-report.sh [NAME]          # writes loadtest/reports/NAME.md (+ .json, .svg)
#
# Environment: REPEAT (runs per configuration, default 3), DURATION (seconds per run,
# default 8), IO_THREADS (geoshard's io threads; default the core count, geoshard's own
# default), CLIENT_THREADS (the load generator's threads for every run; default 1),
# MORE_CLIENT_THREADS (pip-counties again at 64 and 256 connections with this many, for
# every target; default 2, empty for none), PIN (bind io threads to CPUs, geoshard's
# pin_io_threads and the ceiling's --pin; default true), OPEN_CONNS (connections of the
# open-loop runs, every target; default 64), TARGET_REPEAT (open-loop runs at the latency
# target's load, 70% of the peak, for geoshard and the ceiling; default 7, at least REPEAT),
# SKIP_POSTGIS=1, PLACES=places-1m.
# The ceiling and geoshard (pip-counties, on a second server with the counties only) run on
# IO_THREADS and on 1 io thread. With the client on the same cores, the fastest split of the
# cores differs from server to server and from one concurrency to another, so the report takes
# every target at its fastest setup (io threads, client threads) and concurrency, by median.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NAME=${1:-$(date -u +%Y-%m-%d)}
REPEAT=${REPEAT:-3}
# The p99 at 70% of the peak swings from run to run on a shared machine (2026-11-23, the same
# server code and setup at 50k/s: 2.4 to 38.7 ms in 11 runs within half an hour, and two more fell
# seconds behind), so the target's verdict takes more runs than the rest of the sweep.
TARGET_REPEAT=${TARGET_REPEAT:-7}
[ "$TARGET_REPEAT" -ge "$REPEAT" ] || TARGET_REPEAT=$REPEAT
DURATION=${DURATION:-8}
IO_THREADS=${IO_THREADS:-$(nproc)}
CLIENT_THREADS=${CLIENT_THREADS:-1}
MORE_CLIENT_THREADS=${MORE_CLIENT_THREADS-2}
PLACES=${PLACES:-places-1m}
PIN=${PIN:-true}
# The store's page cache of the main geoshard server (geoshard's default, 128 MiB), set here
# because the memory-per-point figure subtracts it.
STORE_CACHE=134217728
# Open loop counts each request from its due time, so a request that waits for a free
# connection is charged the wait: 64 carry 50k/s at up to 1.3 ms each, and cost the server
# 2-3 us a request less than 256 (45k/s, 3 alternating pairs: 21.0-22.5 against 24.1-25.2).
OPEN_CONNS=${OPEN_CONNS:-64}
BIN=$ROOT/target/release
LT=$BIN/geoshard-loadtest
WORK=$(mktemp -d /tmp/geoshard-report.XXXX)
RES=$WORK/results.jsonl
CMDS=$WORK/commands.txt
GS=127.0.0.1:18011
GS1=127.0.0.1:18012
BASE=127.0.0.1:18090
BASE1=127.0.0.1:18091
FIGURES=()

note() { echo "$*" >> "$CMDS"; }
cleanup() {
  [ -n "${GS_PID:-}" ] && kill "$GS_PID" 2>/dev/null || true
  [ -n "${GS1_PID:-}" ] && kill "$GS1_PID" 2>/dev/null || true
  [ -n "${BASE_PID:-}" ] && kill "$BASE_PID" 2>/dev/null || true
  [ -n "${BASE1_PID:-}" ] && kill "$BASE1_PID" 2>/dev/null || true
  [ -z "${SKIP_POSTGIS:-}" ] && "$ROOT/loadtest/peers/postgis.sh" stop || true
  # The work directory holds geoshard's whole data directory (about 340 MiB): removed once
  # the report is written, kept for a look when the run failed.
  if [ -n "${WRITTEN:-}" ]; then
    [ -n "${GS_PID:-}" ] && wait "$GS_PID" 2>/dev/null || true
    [ -n "${GS1_PID:-}" ] && wait "$GS1_PID" 2>/dev/null || true
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

cd "$ROOT"
# The report names HEAD: the binaries must be built from it, with nothing changed beside it,
# and HEAD must still be that commit when the report is written.
HEAD_AT_START=$(git rev-parse HEAD)
same_commit() {
  if [ "$(git rev-parse HEAD)" != "$HEAD_AT_START" ] || [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "run-report.sh: the tree changed or has uncommitted changes ($1); the report would not be of $HEAD_AT_START" >&2
    exit 1
  fi
}
same_commit "before the build"
cargo build --release -p geoshard -p geoshard-loadtest
same_commit "after the build"
note "cargo build --release -p geoshard -p geoshard-loadtest"

# geoshard on a fresh data directory.
"$BIN/geoshard" user add --data-dir "$WORK/data" --name lt --password lt \
  --role rest-writer --role tde-admin --role geo-data-services-writer --role rest-extension-user >/dev/null
GEOSHARD_IO_THREADS=$IO_THREADS GEOSHARD_PIN_IO_THREADS=$PIN GEOSHARD_STORE_CACHE_BYTES=$STORE_CACHE GEOSHARD_LOG=warn "$BIN/geoshard" serve --data-dir "$WORK/data" --listen $GS > "$WORK/geoshard.log" 2>&1 &
GS_PID=$!
note "GEOSHARD_IO_THREADS=$IO_THREADS GEOSHARD_PIN_IO_THREADS=$PIN GEOSHARD_STORE_CACHE_BYTES=$STORE_CACHE geoshard serve --data-dir DIR --listen $GS"
sleep 2
for ds in counties countries "$PLACES"; do
  out=$("$LT" prepare --addr $GS --user lt --password lt --dataset "$ds" --server-pid $GS_PID)
  echo "$out"
  note "geoshard-loadtest prepare --addr $GS --user lt --password lt --dataset $ds --server-pid PID"
  summary=$(echo "$out" | python3 -c "import json,sys; d=json.load(sys.stdin); print('%d documents, %.0f docs/s over HTTP bulk, index built in %.1f s, server resident %.0f MiB' % (d['documents'], d['docs_per_sec'], d['index_seconds'], d['server_rss_bytes'] / 2**20))")
  FIGURES+=("--figure" "prepare $ds=$summary")
  case $ds in
    countries) RSS_BEFORE_PLACES=$(echo "$out" | python3 -c "import json,sys; print(json.load(sys.stdin)['server_rss_bytes'])") ;;
    "$PLACES") PLACES_DOCS=$(echo "$out" | python3 -c "import json,sys; print(json.load(sys.stdin)['documents'])") ;;
  esac
done

# geoshard on one io thread too, when IO_THREADS is more (its own data directory: the store
# is one process's), with the counties for pip-counties.
if [ "$IO_THREADS" != 1 ]; then
  "$BIN/geoshard" user add --data-dir "$WORK/data1" --name lt --password lt \
    --role rest-writer --role tde-admin --role geo-data-services-writer --role rest-extension-user >/dev/null
  GEOSHARD_IO_THREADS=1 GEOSHARD_PIN_IO_THREADS=$PIN GEOSHARD_LOG=warn "$BIN/geoshard" serve --data-dir "$WORK/data1" --listen $GS1 > "$WORK/geoshard1.log" 2>&1 &
  GS1_PID=$!
  note "GEOSHARD_IO_THREADS=1 GEOSHARD_PIN_IO_THREADS=$PIN geoshard serve --data-dir DIR1 --listen $GS1"
  sleep 2
  "$LT" prepare --addr $GS1 --user lt --password lt --dataset counties --server-pid $GS1_PID
  note "geoshard-loadtest prepare --addr $GS1 --user lt --password lt --dataset counties --server-pid PID1"
fi

# The ceiling on IO_THREADS io threads (BASE), and on one (BASE1) when that differs.
"$LT" baseline --listen $BASE --threads "$IO_THREADS" --pin "$PIN" > "$WORK/baseline.log" 2>&1 &
BASE_PID=$!
note "geoshard-loadtest baseline --listen $BASE --threads $IO_THREADS --pin $PIN"
if [ "$IO_THREADS" != 1 ]; then
  "$LT" baseline --listen $BASE1 --threads 1 > "$WORK/baseline1.log" 2>&1 &
  BASE1_PID=$!
  note "geoshard-loadtest baseline --listen $BASE1 --threads 1"
fi

if [ -z "${SKIP_POSTGIS:-}" ]; then
  "$ROOT/loadtest/peers/postgis.sh" start
  for ds in counties countries "$PLACES"; do "$ROOT/loadtest/peers/postgis.sh" load "$ds"; done
  note "loadtest/peers/postgis.sh start; loadtest/peers/postgis.sh load {counties,countries,$PLACES}"
fi
sleep 1

COMMON="--duration $DURATION --warmup 2 --out $RES"
run() { # target workload conns [extra]; the client's threads are CT, else CLIENT_THREADS
  local target=$1 wl=$2 c=$3; shift 3
  set -- --threads "${CT:-$CLIENT_THREADS}" "$@"
  case $target in
    geoshard) "$LT" run --target geoshard --addr $GS --user lt --password lt --workload "$wl" --connections "$c" --server-pid $GS_PID --server-threads "$IO_THREADS" $COMMON "$@" >/dev/null ;;
    geoshard1) "$LT" run --target geoshard --addr $GS1 --user lt --password lt --workload "$wl" --connections "$c" --server-pid $GS1_PID --server-threads 1 $COMMON "$@" >/dev/null ;;
    baseline) "$LT" run --target baseline --addr $BASE --workload "$wl" --connections "$c" --server-pid $BASE_PID --server-threads "$IO_THREADS" $COMMON "$@" >/dev/null ;;
    baseline1) "$LT" run --target baseline --addr $BASE1 --workload "$wl" --connections "$c" --server-pid $BASE1_PID --server-threads 1 $COMMON "$@" >/dev/null ;;
    postgis) [ -n "${SKIP_POSTGIS:-}" ] || "$ROOT/loadtest/peers/postgis.sh" run "$wl" "$c" $COMMON "$@" >/dev/null ;;
  esac
}
note "geoshard-loadtest run --target {geoshard,baseline,postgis} --workload W --connections C --duration $DURATION --warmup 2 --threads {$CLIENT_THREADS${MORE_CLIENT_THREADS:+,$MORE_CLIENT_THREADS at 64 and 256 conns}} [--rate R, at $OPEN_CONNS conns] [--dataset D] [--server-pid PID] [--server-threads N]; the load generator under SCHED_BATCH (--sched-batch, default true)"

# Throughput against concurrency, targets alternating within each repetition.
for r in $(seq "$REPEAT"); do
  for c in 1 4 16 64 256; do
    for t in geoshard baseline postgis; do run $t pip-counties $c; done
    [ -z "${BASE1_PID:-}" ] || run baseline1 pip-counties $c
    [ -z "${GS1_PID:-}" ] || run geoshard1 pip-counties $c
  done
  for ct in $MORE_CLIENT_THREADS; do
    for c in 64 256; do
      for t in geoshard baseline postgis; do CT=$ct run $t pip-counties $c; done
      [ -z "${BASE1_PID:-}" ] || CT=$ct run baseline1 pip-counties $c
      [ -z "${GS1_PID:-}" ] || CT=$ct run geoshard1 pip-counties $c
    done
  done
  if [ -z "${SKIP_POSTGIS:-}" ]; then
    # The peer checked from outside the harness, by PostgreSQL's own client.
    for w in select-1 pip-counties; do
      # A failed run is left out of the figures (their run counts show it), not the report.
      if tps=$("$ROOT/loadtest/peers/postgis.sh" pgbench $w 4 "$DURATION"); then
        echo "$w $tps" >> "$WORK/pgbench.txt"
      fi
    done
  fi
  for c in 4 64; do
    for t in geoshard postgis; do
      run $t pip-countries $c
      run $t point-eq $c --dataset "$PLACES"
      run $t envelope $c --dataset "$PLACES"
    done
    run geoshard mixed $c
  done
done

# Latency against offered load (open loop), at shares of geoshard's peak as the report takes
# it (its fastest setup and concurrency by median), on IO_THREADS io threads with the client
# threads of their fastest setup; at 70%, on one io thread too, with its own. Repeated: the
# tail on a shared machine swings from run to run.
field() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'] or '')"; }
PEAK_JSON=$("$LT" peak --results "$RES" --target geoshard --workload pip-counties)
PEAK=$(echo "$PEAK_JSON" | python3 -c "import json,sys; print(int(json.load(sys.stdin)['throughput']))")
note "geoshard-loadtest peak --results RESULTS: $PEAK_JSON"
SWEEP_JSON=$("$LT" peak --results "$RES" --target geoshard --workload pip-counties --server-threads "$IO_THREADS")
SWEEP_CT=$(echo "$SWEEP_JSON" | field client_threads)
note "geoshard-loadtest peak --results RESULTS --server-threads $IO_THREADS: $SWEEP_JSON"
if [ -n "${GS1_PID:-}" ]; then
  ONE_JSON=$("$LT" peak --results "$RES" --target geoshard --workload pip-counties --server-threads 1)
  ONE_CT=$(echo "$ONE_JSON" | field client_threads)
  note "geoshard-loadtest peak --results RESULTS --server-threads 1: $ONE_JSON"
fi
# Runs at 70% in repetition r: TARGET_REPEAT spread over the REPEAT repetitions.
at_target() { echo $(( TARGET_REPEAT / REPEAT + ($1 <= TARGET_REPEAT % REPEAT ? 1 : 0) )); }
for r in $(seq "$REPEAT"); do
  for pct in 10 30 50 60 70 80 90; do
    rate=$(( PEAK * pct / 100 ))
    times=1
    if [ "$pct" = 70 ]; then times=$(at_target "$r"); fi
    for k in $(seq "$times"); do
      CT=$SWEEP_CT run geoshard pip-counties "$OPEN_CONNS" --rate "$rate"
      CT=$SWEEP_CT run baseline pip-counties "$OPEN_CONNS" --rate "$rate"
    done
    if [ "$pct" = 70 ] && [ -n "${GS1_PID:-}" ]; then
      CT=$ONE_CT run geoshard1 pip-counties "$OPEN_CONNS" --rate "$rate"
    fi
  done
done

# The ceiling held to the same bar: open loop at 70% of its own closed-loop peak, in the setup
# of that peak (the report sets it beside geoshard's figure).
CEIL_JSON=$("$LT" peak --results "$RES" --target baseline --workload pip-counties)
CEIL=$(echo "$CEIL_JSON" | python3 -c "import json,sys; print(int(json.load(sys.stdin)['throughput']))")
CEIL_IO=$(echo "$CEIL_JSON" | field server_threads)
CEIL_CT=$(echo "$CEIL_JSON" | field client_threads)
note "geoshard-loadtest peak --results RESULTS --target baseline: $CEIL_JSON"
if [ "$CEIL_IO" = 1 ] && [ -n "${BASE1_PID:-}" ]; then CEIL_TARGET=baseline1; else CEIL_TARGET=baseline; fi
for r in $(seq "$TARGET_REPEAT"); do
  CT=$CEIL_CT run $CEIL_TARGET pip-counties "$OPEN_CONNS" --rate $(( CEIL * 70 / 100 ))
done

RSS=$(grep VmRSS /proc/$GS_PID/status | awk '{print $2}')
FIGURES+=("--figure" "geoshard resident memory after the runs=$((RSS / 1024)) MiB (counties + countries + $PLACES loaded)")
# Memory per point feature: the growth from before the places were loaded to after the runs,
# and what it implies for places-10m on this machine. The growth includes the store's page
# cache, which the load fills to its bound (redb moves the pages each commit writes into its
# read cache, up to STORE_CACHE; the places take more) and which does not grow with the
# points: the figure with it is an upper bound, the one without it the better estimate.
MEM_KB=$(grep MemTotal /proc/meminfo | awk '{print $2}')
FIGURES+=("--figure" "$(python3 - "$RSS_BEFORE_PLACES" "$((RSS * 1024))" "$PLACES_DOCS" "$((MEM_KB * 1024))" "$STORE_CACHE" <<'PY'
import sys
before, after, n, mem, cache = map(int, sys.argv[1:])
per = (after - before) / n
per_points = (after - before - cache) / n
need = before + cache + per_points * 10e6
print("resident memory per point feature=%.0f bytes ((%.0f - %.0f MiB) / %d places, after the runs), "
      "%.0f without the store's page cache (%.0f MiB, full after the load, not growing with the points); "
      "places-10m would need about %.1f GiB of %.1f GiB (%.0f MiB before the places, the cache, and %.0f bytes a point), "
      "room for about %.0f million points"
      % (per, after / 2**20, before / 2**20, n, per_points, cache / 2**20, need / 2**30, mem / 2**30,
         before / 2**20, per_points, (mem * 0.8 - before - cache) / per_points / 1e6))
PY
)")
if [ -s "$WORK/pgbench.txt" ]; then
  note "loadtest/peers/postgis.sh pgbench {select-1,pip-counties} 4 $DURATION"
  while IFS= read -r line; do FIGURES+=("--figure" "$line"); done < <(python3 - "$WORK/pgbench.txt" "$RES" <<'PY'
import json, sys, statistics
from collections import defaultdict
tps = defaultdict(list)
for l in open(sys.argv[1]):
    w, v = l.split()
    tps[w].append(float(v))
harness = defaultdict(list)
ceilings = defaultdict(list)  # by server threads (None: not recorded)
for l in open(sys.argv[2]):
    r = json.loads(l)
    if r["workload"] == "pip-counties" and r["mode"] == "closed" and r["connections"] == 4:
        harness[r["target"]].append(r["throughput"])
        if r["target"] == "baseline":
            ceilings[r.get("server_threads")].append(r["throughput"])
def fig(v):
    if not v:
        return "no runs"
    return "%.1fk [%.1fk] (%d runs)" % (statistics.median(v) / 1e3, min(v) / 1e3, len(v))
ceiling = "; ".join(fig(v) if t is None else "%s on %d io thread%s" % (fig(v), t, "" if t == 1 else "s")
                    for t, v in sorted(ceilings.items(), key=lambda kv: kv[0] or 0)) or fig([])
print("PostgreSQL round trip, pgbench SELECT 1, 4 conns=%s; the HTTP ceiling at 4 conns: %s"
      % (fig(tps["select-1"]), ceiling))
print("PostGIS by pgbench, the harness's pip-counties statement at uniform US points, 4 conns=%s; "
      "the harness's client at 4 conns: %s" % (fig(tps["pip-counties"]), fig(harness["postgis"])))
PY
)
fi
# The places-10m run (loadtest/run-places-10m.sh) is long and not repeated with every report:
# link the newest. A glob expands sorted, so the last match is the newest date; none is no link.
P10=
for f in "$ROOT"/loadtest/reports/*-places-10m.md; do
  [ -e "$f" ] && P10=$(basename "$f")
done
if [ -n "$P10" ]; then
  FIGURES+=("--figure" "places-10m, loaded and served for real=[$P10]($P10) (loadtest/run-places-10m.sh)")
fi
same_commit "before writing the report"
"$LT" report --results "$RES" --name "$NAME" --dir "$ROOT/loadtest/reports" --commands "$CMDS" "${FIGURES[@]}"
cp "$RES" "$ROOT/loadtest/reports/$NAME.results.jsonl"
WRITTEN=1
