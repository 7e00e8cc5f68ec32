//! Datasets: the real data, the named load-test datasets built from it, and an independent
//! oracle for the answer checks.
//!
//! - `counties`: the 3,231 US counties (service "LT Counties").
//! - `countries`: the 241 world countries (service "LT Countries").
//! - `places-1m`, `places-10m` (or `places-<n>`): points jittered (±0.05°) around the GeoNames
//!   places, so the density pattern is real: dense cities, empty oceans (service "LT Places").
//!
//! Every dataset is deterministic (seeded), so `run` regenerates what `prepare` loaded to
//! know the right answers without asking the server. The oracle uses `geo`'s own `contains`
//! by brute force, not geoshard's index or point location.

use std::path::PathBuf;

use geo::{BoundingRect, Contains, Geometry, Point};
use serde_json::{Value, json};

/// `$GEOSHARD_DATA_DIR`, else `../shared/data` beside the project, else `examples/data`.
pub fn data_dir() -> PathBuf {
    if let Ok(d) = std::env::var("GEOSHARD_DATA_DIR") {
        return PathBuf::from(d);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let shared = root.join("../shared/data");
    if shared.join("real").is_dir() {
        shared
    } else {
        root.join("examples/data")
    }
}

/// A small deterministic RNG (splitmix64).
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

#[derive(Debug, Clone)]
pub struct Place {
    pub lon: f64,
    pub lat: f64,
    pub name: String,
    pub cc: String,
}

pub fn places() -> Result<Vec<Place>, String> {
    let path = data_dir().join("real/geonames-cities1000.csv");
    let mut r = csv::Reader::from_path(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for rec in r.records() {
        let rec = rec.map_err(|e| e.to_string())?;
        out.push(Place {
            lat: rec[0].parse().map_err(|_| "bad lat")?,
            lon: rec[1].parse().map_err(|_| "bad lon")?,
            name: rec[2].to_string(),
            cc: rec[5].to_string(),
        });
    }
    Ok(out)
}

/// The generator of `places-<n>`: point `k` is a random place, jittered.
pub struct Jitter<'p> {
    places: &'p [Place],
    rng: Rng,
}

pub const PLACES_SEED: u64 = 20261121;

impl<'p> Jitter<'p> {
    pub fn new(places: &'p [Place]) -> Jitter<'p> {
        Jitter {
            places,
            rng: Rng::new(PLACES_SEED),
        }
    }
}

impl<'p> Iterator for Jitter<'p> {
    /// (lon, lat, the place it is near)
    type Item = (f64, f64, &'p Place);
    fn next(&mut self) -> Option<Self::Item> {
        let p = &self.places[self.rng.below(self.places.len())];
        let x = (p.lon + (self.rng.unit() - 0.5) * 0.1).clamp(-180.0, 180.0);
        let y = (p.lat + (self.rng.unit() - 0.5) * 0.1).clamp(-90.0, 90.0);
        Some((x, y, p))
    }
}

/// A named dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dataset {
    Counties,
    Countries,
    Places(usize),
}

impl Dataset {
    pub fn parse(name: &str) -> Result<Dataset, String> {
        match name {
            "counties" => Ok(Dataset::Counties),
            "countries" => Ok(Dataset::Countries),
            other => other
                .strip_prefix("places-")
                .and_then(|n| {
                    // A count, or a count of thousands (`k`) or millions (`m`).
                    let (digits, unit) = match n.as_bytes().last()? {
                        b'k' => (&n[..n.len() - 1], 1_000),
                        b'm' => (&n[..n.len() - 1], 1_000_000),
                        _ => (n, 1),
                    };
                    digits.parse::<usize>().ok()?.checked_mul(unit)
                })
                .map(Dataset::Places)
                .ok_or_else(|| format!("unknown dataset {other} (counties, countries, places-1m, places-10m, places-<n>[k|m])")),
        }
    }

    pub fn service(self) -> &'static str {
        match self {
            Dataset::Counties => "LT Counties",
            Dataset::Countries => "LT Countries",
            Dataset::Places(_) => "LT Places",
        }
    }

    pub fn collection(self) -> &'static str {
        match self {
            Dataset::Counties => "lt-counties",
            Dataset::Countries => "lt-countries",
            Dataset::Places(_) => "lt-places",
        }
    }

    fn view(self) -> &'static str {
        match self {
            Dataset::Counties => "counties",
            Dataset::Countries => "countries",
            Dataset::Places(_) => "places",
        }
    }

    pub fn template(self) -> Value {
        let mut columns =
            vec![json!({"name": "OBJECTID", "scalarType": "long", "val": "OBJECTID"})];
        columns
            .push(json!({"name": "name", "scalarType": "string", "val": "name", "nullable": true}));
        if let Dataset::Places(_) = self {
            columns
                .push(json!({"name": "cc", "scalarType": "string", "val": "cc", "nullable": true}));
        }
        json!({"template": {"context": "/", "collections": [self.collection()], "rows": [
            {"schemaName": "loadtest", "viewName": self.view(), "columns": columns}
        ]}})
    }

    pub fn descriptor(self) -> Value {
        let geometry_type = if let Dataset::Places(_) = self {
            "Point"
        } else {
            "Polygon"
        };
        json!({
            "info": {"name": self.service(), "description": "geoshard load-test dataset"},
            "layers": [{
                "id": 0, "name": self.view(), "description": "load test", "geometryType": geometry_type,
                "idField": "OBJECTID", "displayField": "name",
                "schema": "loadtest", "view": self.view(),
                "geometry": {"format": "geojson", "coordinateSystem": "wgs84", "xpath": "//geometry"}
            }]
        })
    }
}

/// One polygon of a layer.
pub struct PolygonFeature {
    pub id: i64,
    pub geometry: Geometry<f64>,
    pub json: Value,
    pub name: String,
    pub bbox: [f64; 4],
}

/// A polygon layer in memory, with the oracle.
pub struct Polygons {
    pub features: Vec<PolygonFeature>,
}

pub fn polygons(dataset: Dataset) -> Result<Polygons, String> {
    let file = match dataset {
        Dataset::Counties => "us-counties.geojson",
        Dataset::Countries => "world-countries-50m.geojson",
        Dataset::Places(_) => return Err("places is not a polygon layer".into()),
    };
    let path = data_dir().join("real").join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let fc: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let mut features = Vec::new();
    for (i, f) in fc["features"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let gj = f["geometry"].clone();
        let geometry =
            to_geo(&gj).ok_or_else(|| format!("{file} feature {i}: unsupported geometry"))?;
        let r = geometry.bounding_rect().ok_or("empty geometry")?;
        features.push(PolygonFeature {
            id: i as i64 + 1,
            geometry,
            json: gj,
            name: f["properties"]["name"].as_str().unwrap_or("").to_string(),
            bbox: [r.min().x, r.min().y, r.max().x, r.max().y],
        });
    }
    Ok(Polygons { features })
}

/// GeoJSON polygon/multipolygon to `geo` (the harness's own conversion).
fn to_geo(v: &Value) -> Option<Geometry<f64>> {
    fn ring(v: &Value) -> Option<geo::LineString<f64>> {
        Some(geo::LineString(
            v.as_array()?
                .iter()
                .map(|p| {
                    Some(geo::Coord {
                        x: p[0].as_f64()?,
                        y: p[1].as_f64()?,
                    })
                })
                .collect::<Option<Vec<_>>>()?,
        ))
    }
    fn poly(v: &Value) -> Option<geo::Polygon<f64>> {
        let rings = v.as_array()?;
        let shell = ring(rings.first()?)?;
        let holes = rings[1..].iter().map(ring).collect::<Option<Vec<_>>>()?;
        Some(geo::Polygon::new(shell, holes))
    }
    match v["type"].as_str()? {
        "Polygon" => Some(Geometry::Polygon(poly(&v["coordinates"])?)),
        "MultiPolygon" => Some(Geometry::MultiPolygon(geo::MultiPolygon(
            v["coordinates"]
                .as_array()?
                .iter()
                .map(poly)
                .collect::<Option<Vec<_>>>()?,
        ))),
        _ => None,
    }
}

impl Polygons {
    /// The OBJECTIDs of the polygons that contain the point (boundary excluded), by brute
    /// force over bounding boxes and `geo::Contains`.
    pub fn containing(&self, x: f64, y: f64) -> Vec<i64> {
        let p = Point::new(x, y);
        let mut out: Vec<i64> = self
            .features
            .iter()
            .filter(|f| f.bbox[0] <= x && x <= f.bbox[2] && f.bbox[1] <= y && y <= f.bbox[3])
            .filter(|f| f.geometry.contains(&p))
            .map(|f| f.id)
            .collect();
        out.sort_unstable();
        out
    }

    /// Documents, in batches of `batch`: (uri, JSON).
    pub fn documents(&self, dataset: Dataset) -> Vec<(String, Vec<u8>)> {
        self.features
            .iter()
            .map(|f| {
                let doc = json!({"OBJECTID": f.id, "name": f.name, "geometry": f.json});
                (
                    format!("/lt/{}/{}.json", dataset.collection(), f.id),
                    serde_json::to_vec(&doc).unwrap_or_default(),
                )
            })
            .collect()
    }
}

/// The document of place point `k` (0-based) of a places dataset.
pub fn place_document(k: usize, x: f64, y: f64, p: &Place) -> (String, Vec<u8>) {
    let doc = json!({
        "OBJECTID": k + 1,
        "name": p.name,
        "cc": p.cc,
        "geometry": {"type": "Point", "coordinates": [x, y]},
    });
    (
        format!("/lt/lt-places/{}.json", k + 1),
        serde_json::to_vec(&doc).unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datasets_parse_and_generate_deterministically() {
        assert_eq!(
            Dataset::parse("places-1m").unwrap(),
            Dataset::Places(1_000_000)
        );
        assert_eq!(
            Dataset::parse("places-2500").unwrap(),
            Dataset::Places(2500)
        );
        assert_eq!(
            Dataset::parse("places-100m").unwrap(),
            Dataset::Places(100_000_000)
        );
        assert_eq!(Dataset::parse("places-5k").unwrap(), Dataset::Places(5000));
        assert!(Dataset::parse("moon").is_err());
        assert!(Dataset::parse("places-m").is_err());
        assert!(Dataset::parse("places-1x").is_err());
        let places = vec![Place {
            lon: 10.0,
            lat: 20.0,
            name: "a".into(),
            cc: "X".into(),
        }];
        let a: Vec<(f64, f64)> = Jitter::new(&places)
            .take(5)
            .map(|(x, y, _)| (x, y))
            .collect();
        let b: Vec<(f64, f64)> = Jitter::new(&places)
            .take(5)
            .map(|(x, y, _)| (x, y))
            .collect();
        assert_eq!(a, b);
        assert!(
            a.iter()
                .all(|(x, y)| (x - 10.0).abs() <= 0.05 && (y - 20.0).abs() <= 0.05)
        );
    }
}
