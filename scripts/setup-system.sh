#!/usr/bin/env bash
# Install the Debian packages the tests drive, when they are missing: gdal-bin (GDAL's ogrinfo
# and ogr2ogr read the OGC API in tests/ogc.rs), chromium (the map page in a real browser,
# tests/map.rs), nats-server (the cluster's log, tests/cluster.rs) and python3-qgis (QGIS
# reading the OGC API and the tiles, tests/gis_clients.rs). Idempotent; .ci/run and a new machine run it before `cargo test`. Needs root,
# or sudo.
set -euo pipefail
missing=()
command -v ogr2ogr >/dev/null || missing+=(gdal-bin)
[ -x /usr/bin/chromium ] || missing+=(chromium fonts-dejavu-core)
[ -x /usr/sbin/nats-server ] || [ -x /usr/bin/nats-server ] || missing+=(nats-server)
# QGIS's Python bindings (headless, QT_QPA_PLATFORM=offscreen), for tests/it/gis_clients.rs.
/usr/bin/python3 -c 'import qgis.core' 2>/dev/null || missing+=(python3-qgis)
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
