"""GeoPandas as a GIS user drives it, for tests/it/gis_clients.rs and tests/it/export.rs.

  gis.py write SRC OUT.parquet ENCODING [EPSG]   a GeoParquet file made by GeoPandas
  gis.py read IN.parquet OUT.geojsonl            a GeoParquet file as GeoPandas reads it
  gis.py ogc URL COLLECTION USER:PASSWORD OUT.geojsonl
                                                 an OGC API collection read by read_file

The features go out as GeoJSON lines in WGS84; the last line printed is a JSON summary.
"""

import json
import math
import sys

import geopandas as gpd
import pyarrow.parquet as pq
import pyogrio
from shapely.geometry import mapping


def lines(df, out):
    """Write each row as a GeoJSON feature line: NaN and missing values are null."""
    if df.crs is not None and df.crs.to_epsg() != 4326:
        df = df.to_crs(epsg=4326)
    columns = [c for c in df.columns if c != df.geometry.name]
    with open(out, "w") as f:
        for row in df.itertuples(index=False):
            values = row._asdict()
            props = {}
            for c in columns:
                v = values[c]
                if isinstance(v, float) and math.isnan(v):
                    v = None
                elif hasattr(v, "item"):
                    v = v.item()
                props[c] = v
            geometry = values[df.geometry.name]
            f.write(json.dumps({"type": "Feature", "properties": props,
                                "geometry": mapping(geometry) if geometry else None}))
            f.write("\n")


def main(argv):
    command = argv[1]
    if command == "write":
        src, out, encoding = argv[2], argv[3], argv[4]
        df = gpd.read_file(src)
        if len(argv) > 5:
            df = df.to_crs(epsg=int(argv[5]))
        df.to_parquet(out, geometry_encoding=encoding, write_covering_bbox=True)
        print(json.dumps({"rows": len(df), "crs": str(df.crs)}))
    elif command == "read":
        src, out = argv[2], argv[3]
        df = gpd.read_parquet(src)
        geo = json.loads(pq.read_metadata(src).metadata[b"geo"])
        lines(df, out)
        print(json.dumps({"rows": len(df), "geo": geo,
                          "crs": df.crs.to_epsg() if df.crs else None}))
    elif command == "ogc":
        url, collection, userpwd, out = argv[2], argv[3], argv[4], argv[5]
        pyogrio.set_gdal_config_options({"GDAL_HTTP_AUTH": "ANY",
                                         "GDAL_HTTP_USERPWD": userpwd})
        df = gpd.read_file(f"OAPIF:{url}", layer=collection)
        lines(df, out)
        print(json.dumps({"rows": len(df), "columns": list(df.columns)}))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv)
