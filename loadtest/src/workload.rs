//! Workloads: the queries a run sends, in the real geoQueryService request shape, and the
//! expected answers for a sample of them (from the independent oracle in `data`).
//!
//! - `pip-counties`: point-contains on the counties; query points are GeoNames places in the
//!   US and uniform points in the US bounding box, half and half.
//! - `pip-countries`: the same on the world countries, with places worldwide and uniform
//!   points over land and sea.
//! - `point-eq`: exact-point contains on a places layer, at stored points.
//! - `envelope`: 0.1° boxes around stored points, intersects.
//! - `mixed`: `pip-counties` with one request in twenty a durable `PUT`.

use bytes::Bytes;
use serde_json::json;

use crate::data::{Dataset, Jitter, Place, Rng};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    PipCounties,
    PipCountries,
    PointEq,
    Envelope,
    Mixed,
}

impl Workload {
    pub fn parse(s: &str) -> Result<Workload, String> {
        Ok(match s {
            "pip-counties" => Workload::PipCounties,
            "pip-countries" => Workload::PipCountries,
            "point-eq" => Workload::PointEq,
            "envelope" => Workload::Envelope,
            "mixed" => Workload::Mixed,
            other => {
                return Err(format!(
                    "unknown workload {other} (pip-counties, pip-countries, point-eq, envelope, mixed)"
                ));
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Workload::PipCounties => "pip-counties",
            Workload::PipCountries => "pip-countries",
            Workload::PointEq => "point-eq",
            Workload::Envelope => "envelope",
            Workload::Mixed => "mixed",
        }
    }
}

/// What the PostGIS peer runs for the same query.
#[derive(Debug, Clone, Copy)]
pub enum PgArgs {
    Point(f64, f64),
    Box(f64, f64, f64, f64),
}

#[derive(Debug, Clone)]
pub struct Query {
    pub body: Bytes,
    /// The same question as a GET of the native FeatureServer (`--target arcgis`), where the
    /// workload has one.
    pub get: Option<String>,
    pub pg: PgArgs,
    /// The right OBJECTIDs, ascending, for the queries that are checked.
    pub expected: Option<Vec<i64>>,
}

pub struct QuerySet {
    pub workload: Workload,
    pub dataset: Dataset,
    pub queries: Vec<Query>,
    /// One request in `write_every` is a PUT (mixed), 0 = none.
    pub write_every: u64,
}

fn pip_body(service: &str, x: f64, y: f64, geometry: bool) -> Bytes {
    Bytes::from(
        json!({
            "params": {"id": service, "layer": 0, "method": "query"},
            "query": {
                "returnGeometry": if geometry { 1 } else { 0 },
                "geometryType": "gisGeometryPoint",
                "spatialRel": "gisSpatialRelContains",
                "extension": {"geometry": {"type": "Point", "coordinates": [x, y]}}
            }
        })
        .to_string(),
    )
}

/// A point query of the native FeatureServer, as ArcGIS clients ask it: the features that
/// intersect the point.
fn pip_get(service: &str, x: f64, y: f64, geometry: bool) -> String {
    let service: String = form_urlencoded::byte_serialize(service.as_bytes())
        .collect::<String>()
        .replace('+', "%20");
    format!(
        "/arcgis/rest/services/{service}/FeatureServer/0/query?geometry={x},{y}\
         &geometryType=esriGeometryPoint&spatialRel=esriSpatialRelIntersects&outFields=*\
         &returnGeometry={geometry}&f=json"
    )
}

fn box_body(service: &str, b: [f64; 4], geometry: bool) -> Bytes {
    let [x0, y0, x1, y1] = b;
    Bytes::from(
        json!({
            "params": {"id": service, "layer": 0, "method": "query"},
            "query": {
                "returnGeometry": if geometry { 1 } else { 0 },
                "geometryType": "gisGeometryEnvelope",
                "spatialRel": "gisSpatialRelIntersects",
                "extension": {"geometry": {"type": "Polygon", "coordinates": [[[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]]}}
            }
        })
        .to_string(),
    )
}

/// Build a workload's queries. `checked` of them, spread evenly through the set (so some
/// are sent whatever the rate), carry expected answers.
pub fn build(
    workload: Workload,
    dataset: Dataset,
    places: &[Place],
    count: usize,
    checked: usize,
    geometry: bool,
) -> Result<QuerySet, String> {
    let mut rng = Rng::new(7 + workload as u64);
    let service = dataset.service();
    let step = count.checked_div(checked).map(|s| s.max(1));
    let is_checked = |i: usize| step.is_some_and(|st| i.is_multiple_of(st) && i / st < checked);
    let queries = match workload {
        Workload::PipCounties | Workload::PipCountries | Workload::Mixed => {
            let polys = crate::data::polygons(dataset)?;
            let (region, pool): ([f64; 4], Vec<&Place>) = if dataset == Dataset::Counties {
                (
                    [-125.0, 24.0, -66.0, 50.0],
                    places.iter().filter(|p| p.cc == "US").collect(),
                )
            } else {
                ([-180.0, -60.0, 180.0, 80.0], places.iter().collect())
            };
            (0..count)
                .map(|i| {
                    let (x, y) = if i % 2 == 0 {
                        let p = pool[rng.below(pool.len())];
                        (p.lon, p.lat)
                    } else {
                        (
                            region[0] + rng.unit() * (region[2] - region[0]),
                            region[1] + rng.unit() * (region[3] - region[1]),
                        )
                    };
                    Query {
                        body: pip_body(service, x, y, geometry),
                        get: Some(pip_get(service, x, y, geometry)),
                        pg: PgArgs::Point(x, y),
                        expected: is_checked(i).then(|| polys.containing(x, y)),
                    }
                })
                .collect()
        }
        Workload::PointEq | Workload::Envelope => {
            let Dataset::Places(n) = dataset else {
                return Err(format!("{} runs on a places dataset", workload.name()));
            };
            // Which stored points the queries use, then one pass over the generated points
            // for their coordinates and the expected answers.
            let picks: Vec<usize> = (0..count).map(|_| rng.below(n)).collect();
            let mut wanted: std::collections::HashMap<usize, Vec<usize>> = Default::default();
            for (qi, k) in picks.iter().enumerate() {
                wanted.entry(*k).or_default().push(qi);
            }
            let mut coords = vec![(0.0f64, 0.0f64); count];
            for (k, (x, y, _)) in Jitter::new(places).take(n).enumerate() {
                if let Some(qs) = wanted.get(&k) {
                    for q in qs {
                        coords[*q] = (x, y);
                    }
                }
            }
            let half = 0.05;
            let boxes: Vec<[f64; 4]> = coords
                .iter()
                .map(|(x, y)| [x - half, y - half, x + half, y + half])
                .collect();
            let checked_queries: Vec<usize> = (0..count).filter(|i| is_checked(*i)).collect();
            let mut expected: Vec<Vec<i64>> = vec![Vec::new(); checked_queries.len()];
            // The checked queries by the 0.1° grid cells their box (or point) touches, so the
            // pass over every generated point tests only the few queries near it.
            let cell = |v: f64| (v * 10.0).floor() as i64;
            let mut grid: std::collections::HashMap<(i64, i64), Vec<usize>> = Default::default();
            for (j, &q) in checked_queries.iter().enumerate() {
                let b = match workload {
                    Workload::PointEq => [coords[q].0, coords[q].1, coords[q].0, coords[q].1],
                    _ => boxes[q],
                };
                for cx in cell(b[0])..=cell(b[2]) {
                    for cy in cell(b[1])..=cell(b[3]) {
                        grid.entry((cx, cy)).or_default().push(j);
                    }
                }
            }
            for (k, (x, y, _)) in Jitter::new(places).take(n).enumerate() {
                let Some(near) = grid.get(&(cell(x), cell(y))) else {
                    continue;
                };
                for &j in near {
                    let q = checked_queries[j];
                    let hit = match workload {
                        Workload::PointEq => coords[q] == (x, y),
                        _ => {
                            let b = boxes[q];
                            b[0] <= x && x <= b[2] && b[1] <= y && y <= b[3]
                        }
                    };
                    if hit {
                        expected[j].push(k as i64 + 1);
                    }
                }
            }
            (0..count)
                .map(|i| {
                    let (x, y) = coords[i];
                    let (body, pg) = match workload {
                        Workload::PointEq => {
                            (pip_body(service, x, y, geometry), PgArgs::Point(x, y))
                        }
                        _ => {
                            let b = boxes[i];
                            (
                                box_body(service, b, geometry),
                                PgArgs::Box(b[0], b[1], b[2], b[3]),
                            )
                        }
                    };
                    Query {
                        body,
                        get: None,
                        pg,
                        expected: checked_queries.binary_search(&i).ok().map(|j| {
                            // The server returns at most 5000, in ascending id order.
                            let mut e = expected[j].clone();
                            e.truncate(5000);
                            e
                        }),
                    }
                })
                .collect()
        }
    };
    Ok(QuerySet {
        workload,
        dataset,
        queries,
        write_every: if workload == Workload::Mixed { 20 } else { 0 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Place;

    /// The expected answers of point-eq and envelope equal a scan of every generated point.
    #[test]
    fn places_answers_match_a_scan() {
        // Places close together, so that boxes hold several points and cross grid cells.
        let places: Vec<Place> = (0..50)
            .map(|i| Place {
                lon: -0.3 + 0.013 * i as f64,
                lat: 0.2 - 0.011 * i as f64,
                name: format!("p{i}"),
                cc: "X".into(),
            })
            .collect();
        let n = 3000;
        let points: Vec<(f64, f64)> = Jitter::new(&places)
            .take(n)
            .map(|(x, y, _)| (x, y))
            .collect();
        for workload in [Workload::PointEq, Workload::Envelope] {
            let set = build(workload, Dataset::Places(n), &places, 200, 50, false).unwrap();
            let mut checked = 0;
            let mut hits = 0;
            for q in &set.queries {
                let Some(expected) = &q.expected else {
                    continue;
                };
                let inside = |x: f64, y: f64| match q.pg {
                    PgArgs::Point(px, py) => (x, y) == (px, py),
                    PgArgs::Box(x0, y0, x1, y1) => x0 <= x && x <= x1 && y0 <= y && y <= y1,
                };
                let scan: Vec<i64> = (0..n)
                    .filter(|&k| inside(points[k].0, points[k].1))
                    .map(|k| k as i64 + 1)
                    .collect();
                assert_eq!(expected, &scan, "{}", workload.name());
                checked += 1;
                hits += scan.len();
            }
            assert_eq!(checked, 50);
            assert!(hits >= 50, "{}: {hits} points found", workload.name());
        }
    }
}
