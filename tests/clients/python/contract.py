"""The official Python client (marklogic-python-client 1.3.1) through the calls its users make:
single and bulk writes with and without a flow transform, multi-document and multi-category
reads, permissions in its documented form, modelService and a point-in-polygon
geoQueryService query. Prints what it got as one JSON line; tests/clients.rs checks it against
answers of its own."""
import json
import sys

from marklogic import Client
from marklogic.documents import DefaultMetadata, Document

base, user, password, lon, lat = sys.argv[1:6]
client = Client(base, digest=(user, password))
out = {}
flow = {
    "transform": "svc:sjsInputFlow",
    "trans:entity-name": "Mollusk",
    "trans:flow-name": "LoadJson",
}
# The client's documented form of permissions: role name to capability.
perms = {"rest-reader": "read", "rest-writer": ["read", "update"]}


def step(name, f):
    try:
        out[name] = f()
    except Exception as e:  # a client error is an answer too
        out[name] = {"error": repr(e)}


def written(r):
    if r.status_code != 200:
        return {"status": r.status_code, "body": r.text}
    return [d["uri"] for d in r.json()["documents"]]


step("single", lambda: written(client.documents.write(
    Document("/py/single.json", {"n": 1}, permissions=perms, collections=["py"]))))
step("bulk", lambda: written(client.documents.write([
    DefaultMetadata(permissions=perms, collections=["py"]),
    Document("/py/b1.json", {"n": 2}),
    Document("/py/b2.json", {"n": 3}),
])))
step("bulk_flow", lambda: written(client.documents.write([
    DefaultMetadata(permissions=perms, collections=["py"]),
    Document("/py/m1.json", {"id": "1", "X": "-70.5", "Y": "41.25"}),
    Document("/py/m2.json", {"id": "2", "X": "-71", "Y": "42"}),
], params=flow)))


def read_many():
    docs = client.documents.read(["/py/b1.json", "/py/m2.json", "/py/absent.json"])
    if not isinstance(docs, list):
        return {"status": docs.status_code, "body": docs.text}
    return [{"uri": d.uri, "content": d.content} for d in docs]


def read_categories():
    docs = client.documents.read(["/py/single.json", "/py/m1.json"], categories=["content", "metadata"])
    if not isinstance(docs, list):
        return {"status": docs.status_code, "body": docs.text}
    return [{"uri": d.uri, "content": d.content, "collections": d.collections,
             "permissions": d.permissions} for d in docs]


step("read_many", read_many)
step("read_categories", read_categories)


def models():
    r = client.get("/v1/resources/modelService")
    return sorted(r.json()["models"].keys()) if r.status_code == 200 else {"status": r.status_code}


def pip():
    body = {
        "params": {"id": "Counties", "layer": 0, "method": "query"},
        "query": {"returnGeometry": False, "outFields": "*",
                  "spatialRel": "esriSpatialRelContains",
                  "geometryType": "esriGeometryPoint",
                  "extension": {"geometry": {"type": "Point",
                                             "coordinates": [float(lon), float(lat)]}}},
    }
    r = client.post("/v1/resources/geoQueryService", json=body)
    if r.status_code != 200:
        return {"status": r.status_code, "body": r.text}
    return [f["properties"]["OBJECTID"] for f in r.json()["features"]]


step("models", models)
step("pip", pip)
print(json.dumps(out))
