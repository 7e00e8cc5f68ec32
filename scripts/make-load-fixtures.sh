#!/bin/sh
# The loader's GIS fixtures (tests/fixtures/load), made once with GDAL (Debian's gdal-bin) from
# the US counties of Texas and Colorado: a GeoJSON source with typed properties, and the same
# features as a Shapefile in UTM zone 14N (a .prj to reproject from), a GeoPackage in Web
# Mercator and a FlatGeobuf in WGS84.
set -eu
cd "$(dirname "$0")/.."
out=tests/fixtures/load
mkdir -p "$out"
python3 - "$out/counties-tx-co.geojson" <<'PY'
import json, sys
fc = json.load(open("examples/data/real/us-counties.geojson"))
def positions(c):
    return [c] if isinstance(c[0], (int, float)) else [p for x in c for p in positions(x)]
features = []
for f in fc["features"]:
    if f["id"][:2] not in ("48", "08"):
        continue
    ps = positions(f["geometry"]["coordinates"])
    features.append({"type": "Feature", "properties": {
        "name": f["properties"]["name"], "fips": f["id"], "state": int(f["id"][:2]),
        "vertices": len(ps), "west": min(p[0] for p in ps)}, "geometry": f["geometry"]})
json.dump({"type": "FeatureCollection", "features": features}, open(sys.argv[1], "w"))
PY
rm -f "$out"/counties-tx-co-utm14.* "$out"/counties-tx-co-3857.gpkg "$out"/counties-tx-co.fgb
ogr2ogr -f "ESRI Shapefile" -t_srs EPSG:32614 "$out/counties-tx-co-utm14.shp" "$out/counties-tx-co.geojson"
ogr2ogr -f GPKG -t_srs EPSG:3857 "$out/counties-tx-co-3857.gpkg" "$out/counties-tx-co.geojson"
ogr2ogr -f FlatGeobuf "$out/counties-tx-co.fgb" "$out/counties-tx-co.geojson"
