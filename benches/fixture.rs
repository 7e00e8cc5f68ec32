//! Shared fixture of the benches: the real datasets and a seeded RNG.
#![allow(dead_code)]

use std::path::PathBuf;

use geo::Geometry;
use geoshard::spatial::parse_geojson;

/// `$GEOSHARD_DATA_DIR`, else `../shared/data`, else the repository's `examples/data/`.
pub fn data_dir() -> PathBuf {
    if let Ok(d) = std::env::var("GEOSHARD_DATA_DIR") {
        return PathBuf::from(d);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let shared = root.join("../shared/data");
    if shared.join("real").is_dir() {
        shared
    } else {
        root.join("examples/data")
    }
}

pub fn layer(name: &str) -> Vec<Geometry<f64>> {
    let text = std::fs::read_to_string(data_dir().join("real").join(name)).unwrap();
    let fc: serde_json::Value = serde_json::from_str(&text).unwrap();
    fc["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| parse_geojson(&f["geometry"]).unwrap())
        .collect()
}

/// GeoNames places as (lon, lat, country code).
pub fn places() -> Vec<(f64, f64, String)> {
    let text = std::fs::read_to_string(data_dir().join("real/geonames-cities1000.csv")).unwrap();
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                f[1].parse().unwrap(),
                f[0].parse().unwrap(),
                f[f.len() - 1].to_string(),
            )
        })
        .collect()
}

/// A small deterministic RNG (splitmix64), so every run uses the same points.
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
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `n` points jittered (±0.05°) around GeoNames places: the real density pattern, dense
/// cities and empty oceans.
pub fn jittered(places: &[(f64, f64, String)], n: usize, seed: u64) -> Vec<(f64, f64)> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            let p = &places[(rng.next_u64() % places.len() as u64) as usize];
            let x = (p.0 + (rng.unit() - 0.5) * 0.1).clamp(-180.0, 180.0);
            let y = (p.1 + (rng.unit() - 0.5) * 0.1).clamp(-90.0, 90.0);
            (x, y)
        })
        .collect()
}
