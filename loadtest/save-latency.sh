#!/bin/sh
# Write latency while the views are saved as writes go on (`view_save_secs`), against the same
# writes with no save, on a places-N data directory that restart-bench.sh left (a view of N
# points). Each round runs both: 16 connections replacing places with single PUTs for the
# given seconds; a save every SAVE seconds in the second. The PUTs that started during a save
# (from the server's "views saved" lines: end time and duration) are counted apart. Last, the
# server is SIGKILLed under the same writes and started again: the time to its first answer,
# and the documents it read again besides the file saved while writing.
# Usage: loadtest/save-latency.sh [places-10m] [seconds] [save-every] [rounds]
set -eu
cd "$(dirname "$0")/.."
dataset=${1:-places-10m}
seconds=${2:-40}
every=${3:-10}
rounds=${4:-2}
work=${TMPDIR:-/tmp}/geoshard-restart-bench
data="$work/data"
case "$dataset" in
  places-10m) n=10000000 ;;
  places-1m) n=1000000 ;;
  *) echo "places-1m or places-10m"; exit 2 ;;
esac
[ -f "$data/geoshard.redb" ] || { echo "run loadtest/restart-bench.sh $dataset first"; exit 2; }
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p geoshard -p geoshard-loadtest
  BIN=$(pwd)/target/release/geoshard
fi
gen=$(dirname "$BIN")/geoshard-loadtest

run() { # $1: label, $2: view_save_secs
  rm -f "$work/serve.out"
  GEOSHARD_LOG=info GEOSHARD_VIEW_SAVE_SECS=$2 "$BIN" serve --data-dir "$data" \
    --listen 127.0.0.1:0 > "$work/serve.out" 2> "$work/$1.err" &
  pid=$!
  until grep -q listening "$work/serve.out" 2> /dev/null; do sleep 0.05; done
  addr=$(sed -n 's/.*http:\/\///p' "$work/serve.out")
  "$gen" put --addr "$addr" --user bench --password bench --connections 16 \
    --duration "$seconds" --places "$n" --latencies "$work/$1.lat" > "$work/$1.json"
  kill -TERM $pid; wait $pid 2> /dev/null || true
}

for r in $(seq "$rounds"); do
  run quiet 0
  run saving "$every"
  python3 - "$work" <<'EOF'
import json, re, sys, datetime
work = sys.argv[1]
def lat(name):
    return [tuple(map(int, l.split())) for l in open(f"{work}/{name}.lat")]
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * q))] if v else 0
def show(label, v):
    ms = lambda us: f"{us / 1000:.1f}"
    return (f"{label}: {len(v)} PUTs, p50 {ms(pct(v, .5))} ms, p99 {ms(pct(v, .99))} ms, "
            f"p99.9 {ms(pct(v, .999))} ms, max {ms(max(v) if v else 0)} ms")
windows = []
for line in open(f"{work}/saving.err"):
    if "views saved" in line and "live=true" in line:
        t = datetime.datetime.strptime(line[:26], "%Y-%m-%dT%H:%M:%S.%f").replace(
            tzinfo=datetime.timezone.utc).timestamp() * 1000
        secs = float(re.search(r"secs=([0-9.]+)", line).group(1))
        windows.append((t - secs * 1000, t, secs))
quiet = [l for _, l in lat("quiet")]
saving = lat("saving")
inside = [l for at, l in saving if any(a <= at <= b for a, b, _ in windows)]
outside = [l for at, l in saving if not any(a <= at <= b for a, b, _ in windows)]
q, s = json.load(open(f"{work}/quiet.json")), json.load(open(f"{work}/saving.json"))
print(show("no save       ", quiet), f"({q['put_per_sec']:.0f}/s)")
print(show("saving, all   ", [l for _, l in saving]), f"({s['put_per_sec']:.0f}/s)")
print(show("  during saves", inside))
print(show("  between     ", outside))
print(f"  {len(windows)} saves: " + ", ".join(f"{w[2]:.2f} s" for w in windows))
if quiet and inside:
    print(f"  p99 during saves / p99 with no save: {pct(inside, .99) / pct(quiet, .99):.2f}")
EOF
done

# SIGKILL under writes, then the time from exec to the first answered query.
rm -f "$work/serve.out"
GEOSHARD_LOG=info GEOSHARD_VIEW_SAVE_SECS=$every "$BIN" serve --data-dir "$data" \
  --listen 127.0.0.1:0 > "$work/serve.out" 2> "$work/killed.err" &
pid=$!
until grep -q listening "$work/serve.out" 2> /dev/null; do sleep 0.05; done
addr=$(sed -n 's/.*http:\/\///p' "$work/serve.out")
"$gen" put --addr "$addr" --user bench --password bench --connections 16 \
  --duration "$seconds" --places "$n" > /dev/null 2>&1 &
putter=$!
sleep $((seconds - 3))
kill -KILL $pid; wait $pid 2> /dev/null || true
wait $putter 2> /dev/null || true
saves=$(grep -c "views saved" "$work/killed.err" || true)
rm -f "$work/serve.out"
s=$(date +%s.%N)
GEOSHARD_LOG=info "$BIN" serve --data-dir "$data" --listen 127.0.0.1:0 > "$work/serve.out" 2> "$work/restart.err" &
pid=$!
until grep -q listening "$work/serve.out" 2> /dev/null; do sleep 0.02; done
addr=$(sed -n 's/.*http:\/\///p' "$work/serve.out")
until curl -sf --digest -u bench:bench -o /dev/null "http://$addr/v1/resources/modelService"; do sleep 0.02; done
took=$(echo "$(date +%s.%N) - $s" | bc)
read_back=$(grep -o 'view read from its saved file.*' "$work/restart.err" | grep -o 'changed_since=[0-9]*' || echo "not read back")
kill -TERM $pid; wait $pid 2> /dev/null || true
echo "SIGKILL under writes after $saves saves: restart to the first answer ${took} s ($read_back)"
