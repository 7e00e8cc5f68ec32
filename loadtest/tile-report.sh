#!/usr/bin/env bash
# Tile timings before and after the tile cache, on one data directory: US counties and world
# countries (polygons) and the 144k GeoNames places (points), loaded offline. The server runs
# twice per round: with encoded_tile_cache_bytes=0 (every tile made, as before the cache) and
# with its default (64 MiB). Each run walks loadtest/tile-report.py's pan-and-zoom path twice
# per layer and asks for the map page's first tiles 8 at a time, twice.
#
#   loadtest/tile-report.sh [ROUNDS]      (BIN= a built geoshard; default target/release)
# Prints one JSON line a run: {"cache": bytes, "round": n, ...tile-report.py's report}.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
bin=${BIN:-target/release/geoshard}
data_src=${GEOSHARD_DATA_DIR:-../shared/data}
py=${PYTHON:-target/clients-venv/bin/python}
work=$(mktemp -d /tmp/tile-report.XXXXXX)
trap 'kill $pid 2>/dev/null || true; rm -rf "$work"' EXIT
data="$work/data"
"$bin" load --quiet --service Counties --data-dir "$data" "$data_src/real/us-counties.geojson" >&2
"$bin" load --quiet --service Countries --data-dir "$data" "$data_src/real/world-countries-50m.geojson" >&2
"$bin" load --quiet --service Places --data-dir "$data" "$data_src/real/geonames-cities1000.csv" >&2
"$bin" user add --data-dir "$data" --name bench --password bench --role admin > /dev/null
pid=
for round in $(seq "$rounds"); do
  for cache in 0 67108864; do
    GEOSHARD_ENCODED_TILE_CACHE_BYTES=$cache GEOSHARD_LOG=warn \
      "$bin" serve --data-dir "$data" --listen 127.0.0.1:0 > "$work/serve.out" 2> "$work/serve.err" &
    pid=$!
    until grep -q listening "$work/serve.out" 2> /dev/null; do sleep 0.05; done
    addr=$(sed -n 's/.*http:\/\///p' "$work/serve.out")
    report=$("$py" loadtest/tile-report.py "http://$addr" bench bench Counties.0 Countries.0 Places.0)
    echo "{\"cache\": $cache, \"round\": $round, ${report#\{}"
    kill -TERM $pid; wait $pid 2> /dev/null || true
  done
done
