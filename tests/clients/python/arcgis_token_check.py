"""The ArcGIS API for Python (`arcgis`) against geoshard's own FeatureServer, with a token,
for tests/it/arcgis.rs. Run with target/arcgis-venv's python.

  arcgis_token_check.py ARCGIS_ROOT LAYER_URL USER PASSWORD

Gets a token from the token service that ARCGIS_ROOT/rest/info names, as a script for a
standalone ArcGIS Server does, then asks a FeatureLayer with it (the API sends it as
`X-Esri-Authorization: Bearer`): a where clause's count, the whole count, an envelope filter,
statistics grouped by country, and every id page by page. The last line printed is a JSON
summary.
"""

import json
import sys

import requests
from arcgis.features import FeatureLayer
from arcgis.geometry import Envelope
from arcgis.geometry.filters import intersects
from arcgis.gis._impl._con import Connection


def main(argv):
    root, url, user, password = argv[1:5]
    info = requests.get(f"{root}/rest/info", params={"f": "json"}, timeout=60).json()
    token_url = info["authInfo"]["tokenServicesUrl"]
    answer = requests.post(token_url, data={"username": user, "password": password,
                                            "expiration": 60, "client": "requestip",
                                            "f": "json"}, timeout=60).json()
    token = answer["token"]
    # A connection to the server itself, with the token: with no GIS, the API asks
    # www.arcgis.com for an anonymous one first.
    con = Connection(baseurl=url, token=token, all_ssl=False)
    layer = FeatureLayer(url, gis=con)
    props = layer.properties
    assert props["objectIdField"] == "OBJECTID", props
    count_fr = layer.query(where="cc = 'FR'", return_count_only=True)
    count = layer.query(where="1=1", return_count_only=True)
    box = Envelope({"xmin": 2.2, "ymin": 48.7, "xmax": 2.5, "ymax": 49.0,
                    "spatialReference": {"wkid": 4326}})
    in_box = layer.query(where="1=1", geometry_filter=intersects(box, sr=4326),
                         out_fields="OBJECTID", return_geometry=False)
    stats = layer.query(
        where="cc IN ('FR', 'DE', 'IT')", group_by_fields_for_statistics="cc",
        out_statistics=[{"statisticType": "count", "onStatisticField": "OBJECTID",
                         "outStatisticFieldName": "n"}])
    # Paging as a client walks a layer: resultOffset and resultRecordCount of the layer's
    # maxRecordCount, in OBJECTID order.
    paged, offset, page = [], 0, int(props["maxRecordCount"])
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
        "count_fr": count_fr,
        "count": count,
        "box": sorted(int(f.attributes["OBJECTID"]) for f in in_box.features),
        "stats": {f.attributes["cc"]: f.attributes["n"] for f in stats.features},
        "paged": paged,
    }))


if __name__ == "__main__":
    main(sys.argv)
