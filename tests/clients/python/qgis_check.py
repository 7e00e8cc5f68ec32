"""QGIS, headless, as a GIS user adds geoshard's layers: run with Debian's python3 and
python3-qgis (QT_QPA_PLATFORM=offscreen), for tests/it/gis_clients.rs.

  qgis_check.py URL USER PASSWORD COLLECTION OUT.png

Adds COLLECTION as an OGC API - Features layer (QGIS's OAPIF provider) and as a vector tile
layer (XYZ, geoshard's MVT), both through a Basic authentication configuration; lists every
feature of the first and those meeting a box over Colorado; renders the tiles and the features
over Colorado to OUT.png. The last line printed is a JSON summary.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("QGIS_AUTH_DB_DIR_PATH", tempfile.mkdtemp(prefix="qgis-auth-"))

from qgis.core import (  # noqa: E402
    Qgis,
    QgsApplication,
    QgsAuthMethodConfig,
    QgsCoordinateReferenceSystem,
    QgsCoordinateTransform,
    QgsFeatureRequest,
    QgsMapRendererSequentialJob,
    QgsMapSettings,
    QgsProject,
    QgsRectangle,
    QgsVectorLayer,
    QgsVectorTileBasicRenderer,
    QgsVectorTileLayer,
)
from qgis.PyQt.QtCore import QSize  # noqa: E402
from qgis.PyQt.QtGui import QColor  # noqa: E402

COLORADO = (-109.06, 36.99, -102.04, 41.0)


def main(argv):
    url, user, password, collection, out = argv[1:6]
    app = QgsApplication([], False)
    app.initQgis()
    auth = QgsApplication.authManager()
    auth.setMasterPassword("geoshard-test", True)
    cfg = QgsAuthMethodConfig("Basic")
    cfg.setName("geoshard")
    cfg.setConfig("username", user)
    cfg.setConfig("password", password)
    if not auth.storeAuthenticationConfig(cfg)[0]:
        raise SystemExit("the authentication configuration was not stored")
    authcfg = cfg.id()

    features = QgsVectorLayer(
        f"url='{url}/ogc' typename='{collection}' authcfg={authcfg}", "features", "OAPIF")
    if not features.isValid():
        raise SystemExit(f"the OGC API layer is not valid: {features.error().summary()}")
    names = [f["name"] for f in features.getFeatures()]
    box = QgsRectangle(*COLORADO)
    in_box = sorted(f["OBJECTID"] for f in features.getFeatures(QgsFeatureRequest().setFilterRect(box)))

    tiles_url = f"{url}/tiles/{collection.replace(' ', '%20')}/{{z}}/{{x}}/{{y}}.mvt"
    tiles = QgsVectorTileLayer(
        f"type=xyz&url={tiles_url}&zmin=0&zmax=14&authcfg={authcfg}", "tiles")
    if not tiles.isValid():
        raise SystemExit(f"the vector tile layer is not valid: {tiles.error().summary()}")
    # As QGIS's "Add layer" dialog styles a vector tile source without a style of its own.
    renderer = QgsVectorTileBasicRenderer()
    renderer.setStyles(QgsVectorTileBasicRenderer.simpleStyleWithRandomColors())
    tiles.setRenderer(renderer)
    QgsProject.instance().addMapLayers([features, tiles])

    mercator = QgsCoordinateReferenceSystem("EPSG:3857")
    to_mercator = QgsCoordinateTransform(
        QgsCoordinateReferenceSystem("EPSG:4326"), mercator, QgsProject.instance())
    settings = QgsMapSettings()
    settings.setDestinationCrs(mercator)
    settings.setExtent(to_mercator.transformBoundingBox(box))
    settings.setOutputSize(QSize(800, 600))
    settings.setBackgroundColor(QColor(255, 255, 255))
    # Wait for the tiles rather than draw what has come.
    settings.setFlag(QgsMapSettings.RenderBlocking, True)
    drawn = {}
    for name, layers in (("tiles", [tiles]), ("features", [features])):
        settings.setLayers(layers)
        job = QgsMapRendererSequentialJob(settings)
        job.start()
        job.waitForFinished()
        image = job.renderedImage()
        path = out.replace(".png", f"-{name}.png")
        image.save(path)
        painted, colors = 0, set()
        for y in range(0, image.height(), 4):
            for x in range(0, image.width(), 4):
                rgb = image.pixel(x, y) & 0xFFFFFF
                colors.add(rgb)
                if rgb != 0xFFFFFF:
                    painted += 1
        drawn[name] = {"painted": painted,
                       "samples": (image.width() // 4) * (image.height() // 4),
                       "colors": len(colors), "errors": [str(e.message) for e in job.errors()]}
    print(json.dumps({"features": len(names), "names": names, "colorado": in_box,
                      "drawn": drawn, "qgis": Qgis.QGIS_VERSION}))
    app.exitQgis()


if __name__ == "__main__":
    main(sys.argv)
