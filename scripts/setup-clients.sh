#!/usr/bin/env bash
# Install the real clients the client tests drive, into the project's own places:
# tests/clients/node_modules (npm, from the lock file), the vendored Koop provider's
# dependencies (tests/clients/koop-provider-marklogic/node_modules), target/clients-venv and
# target/arcgis-venv (PyPI).
# Idempotent; .ci/run and a new machine run it before `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v npm >/dev/null || { echo "npm is required (Node.js 18 or later)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 is required" >&2; exit 1; }
# --ignore-scripts: the marklogic package's preinstall runs npx, which needs the network.
if [ ! -d tests/clients/node_modules/marklogic ] || [ tests/clients/package-lock.json -nt tests/clients/node_modules ]; then
  npm ci --ignore-scripts --no-audit --no-fund --prefix tests/clients
fi
koop=tests/clients/koop-provider-marklogic
if [ ! -d $koop/node_modules/@koopjs/koop-core ] || [ $koop/package-lock.json -nt $koop/node_modules ]; then
  npm ci --ignore-scripts --no-audit --no-fund --prefix $koop
fi
if [ ! -x target/clients-venv/bin/python ]; then
  mkdir -p target
  python3 -m venv target/clients-venv
fi
target/clients-venv/bin/python -m pip install --quiet --disable-pip-version-check \
  -r tests/clients/requirements.txt
# The ArcGIS API for Python pins numpy 1, GeoPandas numpy 2: a venv of its own.
if [ ! -x target/arcgis-venv/bin/python ]; then
  python3 -m venv target/arcgis-venv
fi
target/arcgis-venv/bin/python -m pip install --quiet --disable-pip-version-check \
  -r tests/clients/requirements-arcgis.txt
