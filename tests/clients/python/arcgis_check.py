"""The ArcGIS API for Python (`arcgis`) against a FeatureServer (Koop in front of geoshard),
for tests/it/clients.rs. Run with target/arcgis-venv's python (arcgis pins numpy 1, GeoPandas
in target/clients-venv wants numpy 2).

  arcgis_check.py LAYER_URL

Asks a FeatureLayer, anonymously: a where clause, a count, an envelope filter and every id
page by page. The last line printed is a JSON summary of the OBJECTIDs it got.
"""

import json
import sys

from arcgis.features import FeatureLayer
from arcgis.geometry import Envelope
from arcgis.geometry.filters import intersects
from arcgis.gis._impl._con import Connection


def ids(result):
    return sorted(int(f.attributes["OBJECTID"]) for f in result.features)


def main(argv):
    # A connection to the server itself: with no GIS, the API asks www.arcgis.com for an
    # anonymous one first.
    layer = FeatureLayer(argv[1], gis=Connection(baseurl=argv[1], all_ssl=False))
    props = layer.properties
    washington = layer.query(where="name = 'Washington'", out_fields="OBJECTID,name",
                             return_geometry=False)
    count = layer.query(where="1=1", return_count_only=True)
    box = Envelope({"xmin": -105.1, "ymin": 39.6, "xmax": -104.8, "ymax": 39.9,
                    "spatialReference": {"wkid": 4326}})
    in_box = layer.query(where="1=1", geometry_filter=intersects(box, sr=4326),
                         out_fields="OBJECTID", return_geometry=False)
    # Paging as a client walks a layer: resultOffset and resultRecordCount, in OBJECTID order.
    paged, offset, page = [], 0, 500
    while True:
        r = layer.query(where="1=1", out_fields="OBJECTID", return_geometry=False,
                        order_by_fields="OBJECTID ASC", result_offset=offset,
                        result_record_count=page)
        got = [int(f.attributes["OBJECTID"]) for f in r.features]
        paged.extend(got)
        if len(got) < page:
            break
        offset += page
    print(json.dumps({
        "name": props.get("name"),
        "washington": ids(washington),
        "count": count,
        "box": ids(in_box),
        "paged": paged,
    }))


if __name__ == "__main__":
    main(sys.argv)
