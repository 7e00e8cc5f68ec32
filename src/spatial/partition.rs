//! H3 partitioning: which shard a point belongs to, and which shards a region touches.
//!
//! A point lives in the shard of its H3 cell (at the configured resolution); cells map to
//! shards by a hash, which balances dense cities across shards. A line or polygon is
//! referenced from every shard owning a cell that its bounding box touches.
//!
//! The cover of a box is computed by sampling it on a grid finer than the smallest cell edge
//! and adding each sample cell's ring of neighbours. Any point `q` of the box is closer than
//! the smallest edge length to some sample `p`; two points that close lie in the same or in
//! adjacent cells (non-adjacent hexagons are at least one edge length apart), so `q`'s cell is
//! in the cover. This holds for any box: across the antimeridian (boxes are planar in
//! lon/lat, as the features are), near the poles (the longitude step widens with latitude),
//! and for continents (past a sample budget the cover is simply every shard).

use h3o::{CellIndex, LatLng, Resolution};

use super::pip::BBox;

/// Most shards an engine may have (the width of [`ShardSet`]).
pub const MAX_SHARDS: usize = 256;
/// Past this many samples a box counts as touching every shard.
const MAX_SAMPLES: usize = 4096;
const KM_PER_DEGREE: f64 = 111.32;

/// A set of shard numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShardSet([u64; MAX_SHARDS / 64]);

impl ShardSet {
    pub fn insert(&mut self, shard: usize) {
        self.0[shard / 64] |= 1 << (shard % 64);
    }

    pub fn contains(&self, shard: usize) -> bool {
        self.0[shard / 64] & (1 << (shard % 64)) != 0
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MAX_SHARDS).filter(move |s| self.contains(*s))
    }

    pub fn all(n: usize) -> ShardSet {
        let mut s = ShardSet::default();
        for i in 0..n {
            s.insert(i);
        }
        s
    }
}

#[derive(Debug, Clone)]
pub struct Partitioner {
    resolution: Resolution,
    shards: usize,
    /// Sample spacing in km: well under the smallest cell edge at this resolution.
    step_km: f64,
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e3779b97f4a7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
    x ^ (x >> 31)
}

impl Partitioner {
    /// `resolution` 0..=15, `shards` 1..=[`MAX_SHARDS`].
    pub fn new(resolution: u8, shards: usize) -> Result<Partitioner, String> {
        let resolution = Resolution::try_from(resolution)
            .map_err(|_| format!("{resolution} is not an H3 resolution (0..=15)"))?;
        if shards == 0 || shards > MAX_SHARDS {
            return Err(format!("shard count {shards} is not in 1..={MAX_SHARDS}"));
        }
        // The smallest cells (pentagons, distorted hexagons) have edges above half the
        // average; a third of the average keeps the sample distance far below it.
        let step_km = resolution.edge_length_km() / 3.0;
        Ok(Partitioner {
            resolution,
            shards,
            step_km,
        })
    }

    pub fn shards(&self) -> usize {
        self.shards
    }

    pub fn resolution(&self) -> u8 {
        u8::from(self.resolution)
    }

    /// The cell of a (valid, finite) lon/lat point.
    #[inline]
    pub fn cell_of(&self, x: f64, y: f64) -> Option<CellIndex> {
        LatLng::new(y, x).ok().map(|ll| ll.to_cell(self.resolution))
    }

    #[inline]
    pub fn shard_of_cell(&self, cell: CellIndex) -> usize {
        (splitmix64(u64::from(cell)) % self.shards as u64) as usize
    }

    #[inline]
    pub fn shard_of_point(&self, x: f64, y: f64) -> usize {
        if self.shards == 1 {
            return 0;
        }
        self.cell_of(x, y).map_or(0, |c| self.shard_of_cell(c))
    }

    /// Every shard owning a cell that the box touches (a superset is fine, a miss is not).
    pub fn shards_for_bbox(&self, b: &BBox) -> ShardSet {
        if self.shards == 1 {
            return ShardSet::all(1);
        }
        if b[0] == b[2] && b[1] == b[3] {
            let mut s = ShardSet::default();
            s.insert(self.shard_of_point(b[0], b[1]));
            return s;
        }
        let lat_step = self.step_km / KM_PER_DEGREE;
        // Longitude degrees are shortest (in km) where the box is nearest the equator.
        let min_abs_lat = if b[1] <= 0.0 && b[3] >= 0.0 {
            0.0
        } else {
            b[1].abs().min(b[3].abs())
        };
        let cos = min_abs_lat.to_radians().cos().max(1e-6);
        let lon_step = lat_step / cos;
        let nx = ((b[2] - b[0]) / lon_step).ceil() as usize + 1;
        let ny = ((b[3] - b[1]) / lat_step).ceil() as usize + 1;
        if nx.saturating_mul(ny) > MAX_SAMPLES {
            return ShardSet::all(self.shards);
        }
        let mut set = ShardSet::default();
        let mut found = 0;
        for j in 0..ny {
            let y = if j + 1 == ny {
                b[3]
            } else {
                b[1] + j as f64 * lat_step
            };
            for i in 0..nx {
                let x = if i + 1 == nx {
                    b[2]
                } else {
                    b[0] + i as f64 * lon_step
                };
                let Some(cell) = self.cell_of(x, y) else {
                    continue;
                };
                for c in cell.grid_disk_safe(1) {
                    let s = self.shard_of_cell(c);
                    if !set.contains(s) {
                        set.insert(s);
                        found += 1;
                        if found == self.shards {
                            return set;
                        }
                    }
                }
            }
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_and_box_agree() {
        let p = Partitioner::new(4, 16).unwrap();
        let mut state = 7u64;
        let mut rnd = || {
            state = splitmix64(state);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..300 {
            let x0 = rnd() * 340.0 - 170.0;
            let y0 = rnd() * 160.0 - 80.0;
            let b = [x0, y0, x0 + rnd() * 3.0, y0 + rnd() * 3.0];
            let cover = p.shards_for_bbox(&b);
            for _ in 0..50 {
                let x = b[0] + rnd() * (b[2] - b[0]);
                let y = b[1] + rnd() * (b[3] - b[1]);
                assert!(
                    cover.contains(p.shard_of_point(x, y)),
                    "({x}, {y}) in {b:?} not covered"
                );
            }
        }
    }

    #[test]
    fn poles_antimeridian_and_huge_boxes() {
        let p = Partitioner::new(5, 64).unwrap();
        let polar = [-180.0, 89.0, 180.0, 90.0];
        let cover = p.shards_for_bbox(&polar);
        for x in [-180.0, -90.0, 0.0, 45.5, 179.999, 180.0] {
            for y in [89.0, 89.5, 89.99, 90.0] {
                assert!(cover.contains(p.shard_of_point(x, y)), "({x}, {y})");
            }
        }
        let world = [-180.0, -90.0, 180.0, 90.0];
        assert_eq!(p.shards_for_bbox(&world).len(), 64);
        let single = Partitioner::new(3, 1).unwrap();
        assert_eq!(single.shards_for_bbox(&world).len(), 1);
    }

    #[test]
    fn refuses_bad_settings() {
        assert!(Partitioner::new(16, 2).is_err());
        assert!(Partitioner::new(3, 0).is_err());
        assert!(Partitioner::new(3, MAX_SHARDS + 1).is_err());
    }
}
