#!/bin/sh
# Write latency while a template change rebuilds its view in the background, against the
# same writes with no rebuild, on the places-N data directory that restart-bench.sh left.
# Each round runs both: 16 connections replacing places with single PUTs for the given
# seconds; in the second, 3 s in, the layer's template gains (or, the next round, loses) a
# column, so its whole view is rebuilt while the PUTs go on. The PUTs that started between
# the template's PUT and the server's "views rebuilt" line are counted apart.
# Usage: loadtest/rebuild-latency.sh [places-10m] [seconds] [rounds]
set -eu
cd "$(dirname "$0")/.."
dataset=${1:-places-10m}
seconds=${2:-60}
rounds=${3:-2}
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
template="/geoshard-load/places/template-0.json"

serve() { # $1: label; sets $pid and $addr
  rm -f "$work/serve.out"
  GEOSHARD_LOG=info "$BIN" serve --data-dir "$data" --listen 127.0.0.1:0 \
    > "$work/serve.out" 2> "$work/$1.err" &
  pid=$!
  until grep -q listening "$work/serve.out" 2> /dev/null; do sleep 0.05; done
  addr=$(sed -n 's/.*http:\/\///p' "$work/serve.out")
  until curl -sf --digest -u bench:bench -o /dev/null "http://$addr/v1/resources/modelService"; do
    sleep 0.05
  done
}
puts() { # $1: label
  "$gen" put --addr "$addr" --user bench --password bench --connections 16 \
    --duration "$seconds" --places "$n" --latencies "$work/$1.lat" > "$work/$1.json"
}

for r in $(seq "$rounds"); do
  serve quiet
  puts quiet
  kill -TERM $pid; wait $pid 2> /dev/null || true

  serve rebuilding
  puts rebuilding &
  putter=$!
  sleep 3
  curl -sf --digest -u bench:bench "http://$addr/v1/documents?uri=$template" \
    | python3 -c '
import json, sys
t = json.load(sys.stdin)
cols = t["template"]["rows"][0]["columns"]
extra = [c for c in cols if c["name"] == "cc_again"]
if extra:
    cols.remove(extra[0])
else:
    cols.append({"name": "cc_again", "scalarType": "string", "val": "properties/cc", "nullable": True})
json.dump(t, sys.stdout)' > "$work/template.json"
  date +%s%3N > "$work/rebuild-start"
  curl -sf --digest -u bench:bench -X PUT -H 'Content-Type: application/json' \
    --data-binary @"$work/template.json" \
    "http://$addr/v1/documents?uri=$template&collection=http://marklogic.com/xdmp/tde" > /dev/null
  wait $putter
  kill -TERM $pid; wait $pid 2> /dev/null || true
  python3 - "$work" <<'EOF'
import json, sys, datetime
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
start = int(open(f"{work}/rebuild-start").read())
end = None
for line in open(f"{work}/rebuilding.err"):
    if "views rebuilt" in line:
        end = datetime.datetime.strptime(line[:26], "%Y-%m-%dT%H:%M:%S.%f").replace(
            tzinfo=datetime.timezone.utc).timestamp() * 1000
if end is None:
    sys.exit("the rebuild did not end within the run: give it more seconds")
quiet = [l for _, l in lat("quiet")]
during = [l for at, l in lat("rebuilding") if start <= at <= end]
q = json.load(open(f"{work}/quiet.json"))
print(show("no rebuild     ", quiet), f"({q['put_per_sec']:.0f}/s)")
print(show("during rebuild ", during), f"({len(during) / ((end - start) / 1000):.0f}/s)")
print(f"  rebuild of the view: {(end - start) / 1000:.1f} s after the template's PUT")
if quiet and during:
    print(f"  p99 during the rebuild / p99 with no rebuild: {pct(during, .99) / pct(quiet, .99):.2f}")
EOF
done
