//! Polygons of any size in shapes that stress a polygon index: convex, zig-zag stars, combs
//! and spirals, all about the same box (centre -100, 40, radius 7 degrees) and with closed
//! rings of exactly `n` positions (the last repeating the first). Shared by the benches and
//! the tests (`#[path]`), so both measure the same shapes.
#![allow(dead_code)]

use geo::{Coord, LineString, Polygon};

/// The shapes, by name.
pub const KINDS: [&str; 4] = ["convex", "zigzag", "comb", "spiral"];

const CX: f64 = -100.0;
const CY: f64 = 40.0;

fn closed(mut pts: Vec<Coord<f64>>) -> Polygon<f64> {
    pts.push(pts[0]);
    Polygon::new(LineString(pts), vec![])
}

/// `n - 1` points of a regular polygon of radius 7.
pub fn convex(n: usize) -> Polygon<f64> {
    let m = n - 1;
    closed(
        (0..m)
            .map(|i| {
                let a = std::f64::consts::TAU * i as f64 / m as f64;
                Coord {
                    x: CX + 7.0 * a.cos(),
                    y: CY + 7.0 * a.sin(),
                }
            })
            .collect(),
    )
}

/// A star whose vertices alternate between radius 5 and 7 (the zig-zag), rounded
/// to 6 decimals as a client would send it.
pub fn zigzag(n: usize) -> Polygon<f64> {
    let m = n - 1;
    let round = |v: f64| (v * 1e6).round() / 1e6;
    closed(
        (0..m)
            .map(|i| {
                let a = std::f64::consts::TAU * i as f64 / m as f64;
                let r = if i % 2 == 0 { 5.0 } else { 7.0 };
                Coord {
                    x: round(CX + r * a.cos()),
                    y: round(CY + r * a.sin()),
                }
            })
            .collect(),
    )
}

/// A comb: a bar along the bottom and `(n - 1) / 4` teeth 10 degrees tall (`n - 1` rounded
/// down to a multiple of 4, plus padding points on the bar to make `n`).
pub fn comb(n: usize) -> Polygon<f64> {
    let m = n - 1;
    let teeth = (m - 2) / 4;
    let (x0, x1, y0, y1, y2) = (CX - 7.0, CX + 7.0, CY - 7.0, CY - 6.0, CY + 7.0);
    let w = (x1 - x0) / (2 * teeth) as f64;
    let mut pts = vec![Coord { x: x0, y: y0 }, Coord { x: x1, y: y0 }];
    // Along the top from right to left: tooth i spans [x0 + 2iw, x0 + (2i+1)w].
    for i in (0..teeth).rev() {
        let left = x0 + (2 * i) as f64 * w;
        let right = left + w;
        if i + 1 == teeth {
            pts.push(Coord { x: x1, y: y2 });
        } else {
            pts.push(Coord { x: right, y: y1 });
            pts.push(Coord { x: right, y: y2 });
        }
        pts.push(Coord { x: left, y: y2 });
        if i > 0 {
            pts.push(Coord { x: left, y: y1 });
        }
    }
    // Pad on the bottom bar to the exact count.
    let mut k = 1;
    while pts.len() < m {
        let x = x0 + (x1 - x0) * k as f64 / (m + 1) as f64;
        pts.insert(1, Coord { x, y: y0 });
        k += 1;
    }
    pts.truncate(m);
    closed(pts)
}

/// A thick spiral arm: out along the outer edge, back along the inner one, about 6 turns.
pub fn spiral(n: usize) -> Polygon<f64> {
    let m = n - 1;
    let half = m / 2;
    let turns = 6.0;
    let arm = |i: usize, offset: f64| {
        let t = i as f64 / half as f64;
        let a = t * turns * std::f64::consts::TAU;
        let r = 0.5 + 6.0 * t + offset;
        Coord {
            x: CX + r * a.cos(),
            y: CY + r * a.sin(),
        }
    };
    let mut pts: Vec<Coord<f64>> = (0..half).map(|i| arm(i, 0.4)).collect();
    pts.extend(
        (0..m - half)
            .rev()
            .map(|i| arm(i * half / (m - half).max(1), 0.0)),
    );
    closed(pts)
}

/// The shape named `kind` (one of [`KINDS`]) with `n` positions.
pub fn shape(kind: &str, n: usize) -> Polygon<f64> {
    match kind {
        "convex" => convex(n),
        "zigzag" => zigzag(n),
        "comb" => comb(n),
        "spiral" => spiral(n),
        other => panic!("unknown shape {other}"),
    }
}
