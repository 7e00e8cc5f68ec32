//! A point layer's spatial index saved with its view and read back in place: each shard's
//! point arena (in Hilbert order), exact-point table and packed tree, and the registry (a
//! slot and a shard a row) are arrays of the view's file. A start computes no cell, no curve
//! position, no sort and no box, and reads no point: it reads the headers, and pages come in
//! as queries and writes touch them.

use std::sync::Arc;

use geoshard_paged::{Mapping, Paged, align8, pad8, u64_at};

use super::buckets::PointIndex;
use super::engine::{Engine, EngineConfig, NO_POINT};
use super::entry::PointEntry;
use super::partition::Partitioner;

/// `points` (one a row, `NaN` for none) indexed as an engine of `config` would index them,
/// the rows their ids, as [`read_points`] reads them (eight-aligned): the shards and the
/// resolution, each shard's [`PointIndex::encode`], then each row's arena slot
/// ([`NO_POINT`] for none) and shard.
pub fn encode_points(
    config: EngineConfig,
    points: &[[f64; 2]],
    w: &mut Vec<u8>,
) -> Result<(), String> {
    use rayon::prelude::*;
    let p = Partitioner::new(config.resolution, config.shards)?;
    // Each point's shard first; then one shard's points at a time, encoded straight into
    // `w`, so that a large view's save holds one shard's index in memory, not all of them
    // twice.
    let mut of_shard: Vec<u16> = points
        .par_iter()
        .map(|xy| match xy[0].is_nan() {
            true => u16::MAX,
            false => p.shard_of_point(xy[0], xy[1]) as u16,
        })
        .collect();
    w.extend_from_slice(&(config.shards as u64).to_le_bytes());
    w.extend_from_slice(&u64::from(config.resolution).to_le_bytes());
    // The rows grouped by shard, each group in row order (a counting sort).
    let mut starts = vec![0usize; config.shards + 1];
    for &s in of_shard.iter().filter(|s| **s != u16::MAX) {
        starts[usize::from(s) + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let mut rows = vec![0u32; starts[config.shards]];
    let mut next = starts.clone();
    for (row, &s) in of_shard.iter().enumerate().filter(|(_, s)| **s != u16::MAX) {
        rows[next[usize::from(s)]] = row as u32;
        next[usize::from(s)] += 1;
    }
    let mut slots = vec![NO_POINT; points.len()];
    for shard in 0..config.shards {
        let entries: Vec<PointEntry> = rows[starts[shard]..starts[shard + 1]]
            .iter()
            .map(|&row| PointEntry {
                xy: points[row as usize],
                id: row,
            })
            .collect();
        for (slot, id) in PointIndex::encode(entries, w).into_iter().enumerate() {
            slots[id as usize] = slot as u32;
        }
    }
    for s in of_shard.iter_mut().filter(|s| **s == u16::MAX) {
        *s = 0;
    }
    w.extend_from_slice(bytemuck::cast_slice(&slots));
    pad8(w);
    w.extend_from_slice(bytemuck::cast_slice(&of_shard));
    pad8(w);
    Ok(())
}

/// The index [`encode_points`] wrote at byte `at` of `map` for `rows` rows, its arrays used
/// in place, and the byte after it. `Ok(None)`: it was built for other shards or another
/// resolution than `config`'s (the caller indexes the points again).
pub fn read_points(
    config: EngineConfig,
    map: &Arc<Mapping>,
    at: usize,
    rows: usize,
) -> Result<(Option<Engine>, usize), String> {
    let b = map.bytes();
    let (shards, resolution) = (u64_at(b, at)?, u64_at(b, at + 8)?);
    if shards > u64::from(u16::MAX) + 1 {
        return Err("damaged (a point index's shards)".into());
    }
    let mut next = at + 16;
    let registry_end = |at: usize| {
        let slots_end = rows.checked_mul(4).and_then(|n| n.checked_add(at));
        let shards_at = align8(slots_end.ok_or("damaged (a point index's size)")?);
        let shards_end = rows.checked_mul(2).and_then(|n| n.checked_add(shards_at));
        Ok::<_, String>((
            shards_at,
            align8(shards_end.ok_or("damaged (a point index's size)")?),
        ))
    };
    if shards as usize != config.shards || resolution != u64::from(config.resolution) {
        // Only its length, to check the section's.
        for _ in 0..shards {
            next = PointIndex::end_of(b, next)?;
        }
        return Ok((None, registry_end(next)?.1));
    }
    let mut indexes = Vec::with_capacity(shards as usize);
    for _ in 0..shards {
        let (index, end) = PointIndex::read(map, next)?;
        indexes.push(index);
        next = end;
    }
    let (shards_at, end) = registry_end(next)?;
    let registry = (
        Paged::mapped(map, next, rows)?,
        Paged::mapped(map, shards_at, rows)?,
    );
    let engine = Engine::from_point_shards(config, indexes, registry)?;
    Ok((Some(engine), end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predicate::{Query, Relation};

    #[test]
    fn a_saved_index_answers_as_a_bulk_loaded_one_and_keeps_changing() {
        // Points on a lattice over the world, some rows without one, some sharing a place.
        let points: Vec<[f64; 2]> = (0..20_000)
            .map(|i| {
                if i % 97 == 0 {
                    [f64::NAN, f64::NAN]
                } else {
                    let i = i % 15_000;
                    [
                        (i % 150) as f64 * 2.4 - 179.5,
                        (i / 150) as f64 * 1.7 - 84.0,
                    ]
                }
            })
            .collect();
        let config = EngineConfig {
            shards: 4,
            resolution: 2,
        };
        let mut w = vec![0u8; 8];
        encode_points(config, &points, &mut w).unwrap();
        let map = geoshard_paged::mapped_for_test(&w);
        let (saved, end) = read_points(config, &map, 8, points.len()).unwrap();
        assert_eq!(end, w.len());
        let saved = saved.expect("the same settings");
        let bulk = Engine::new(config).unwrap();
        bulk.bulk_load(
            points
                .iter()
                .enumerate()
                .filter(|(_, p)| !p[0].is_nan())
                .map(|(i, p)| (i as u32, geo::Geometry::Point(geo::Point::new(p[0], p[1]))))
                .collect(),
        );
        assert_eq!(saved.len(), bulk.len());
        // Every point found at its place; boxes answer alike; and a brute-force count.
        let ask = |e: &Engine, q: &Query| e.query(q, Relation::Intersects);
        for (i, p) in points.iter().enumerate().step_by(13) {
            if p[0].is_nan() {
                continue;
            }
            let q = Query::point(p[0], p[1]);
            let got = ask(&saved, &q);
            assert!(got.contains(&(i as u32)), "row {i}");
            assert_eq!(got, ask(&bulk, &q));
        }
        let window = [-30.0, -10.0, 40.0, 25.0];
        let rect = geo::Rect::new(
            geo::coord! { x: window[0], y: window[1] },
            geo::coord! { x: window[2], y: window[3] },
        );
        let q = Query::new(geo::Geometry::Polygon(rect.to_polygon()));
        let brute = points
            .iter()
            .filter(|p| {
                p[0] >= window[0] && p[0] <= window[2] && p[1] >= window[1] && p[1] <= window[3]
            })
            .count();
        assert_eq!(ask(&saved, &q).len(), brute);
        assert_eq!(ask(&saved, &q), ask(&bulk, &q));
        // Removed, moved and new points, alike in both.
        for e in [&saved, &bulk] {
            for id in (1..20_000u32).step_by(7) {
                e.remove(id);
            }
            for id in (2..20_000u32).step_by(11) {
                e.insert(id, geo::Geometry::Point(geo::Point::new(10.5, 5.25)));
            }
            e.insert(30_000, geo::Geometry::Point(geo::Point::new(-3.0, 3.0)));
        }
        assert_eq!(saved.len(), bulk.len());
        for q in [q, Query::point(10.5, 5.25), Query::point(-3.0, 3.0)] {
            assert_eq!(ask(&saved, &q), ask(&bulk, &q));
        }
        // Other settings: not used, and said so.
        let other = EngineConfig {
            shards: 3,
            resolution: 2,
        };
        let (none, end) = read_points(other, &map, 8, points.len()).unwrap();
        assert!(none.is_none());
        assert_eq!(end, w.len());
    }
}
