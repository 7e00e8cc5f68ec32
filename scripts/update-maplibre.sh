#!/usr/bin/env bash
# Refresh the MapLibre GL JS files the binary embeds (assets/map/vendor/) from the npm package
# of the version assets/map/package.json pins. The files are committed, so building and running
# the map page needs no network; run this only to change the version.
set -euo pipefail
cd "$(dirname "$0")/../assets/map"
version=$(python3 -c 'import json; print(json.load(open("package.json"))["dependencies"]["maplibre-gl"])')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "maplibre-gl@$version" >/dev/null && tar xzf maplibre-gl-*.tgz)
mkdir -p vendor
cp "$tmp"/package/dist/{maplibre-gl.mjs,maplibre-gl-worker.mjs,maplibre-gl.css} vendor/
cp "$tmp"/package/LICENSE.txt vendor/
echo "assets/map/vendor: maplibre-gl $version"
