//! H3 partitioning: which shard a point belongs to, and which shards a region touches.
//!
//! A point lives in the shard of an H3 cell (at the configured resolution): its own, or a
//! neighbour of it (see the tiles below); cells map to shards by a hash, which balances dense
//! cities across shards. A line or polygon is referenced from every shard owning a cell that
//! its bounding box touches.
//!
//! The cover of a box is computed by sampling it on a grid finer than the smallest cell edge
//! and adding each sample cell's ring of neighbours. Any point `q` of the box is closer than
//! the smallest edge length to some sample `p`; two points that close lie in the same or in
//! adjacent cells (non-adjacent hexagons are at least one edge length apart), so `q`'s cell is
//! in the cover. This holds for any box: across the antimeridian (boxes are planar in
//! lon/lat, as the features are), near the poles (the longitude step widens with latitude),
//! and for continents (past a sample budget the cover is simply every shard).
//!
//! A point is routed by the cell of its *tile's corner*, not of the point itself: the plane is
//! cut into lon/lat tiles whose diagonal is at most a tenth of the average edge length, and
//! every point of a tile goes to the shard of the cell of the tile's south-west corner. That
//! is a function of the point like any other (a point feature is stored where a query for
//! it looks), and a memo of tiles turns most routings into one load instead of an H3
//! computation (trigonometry, about 0.4 µs a query on a busy server). The cover still holds:
//! a corner is within a tile's diagonal of its points, so from a sample `p` it is at most
//! `0.71 · step + edge / 10`, about 0.34 edge lengths away, under the smallest edge length,
//! and its cell is in `p`'s ring too.
//!
//! A query's box looks only in the shards of the tiles it touches (`shards_meeting`): those
//! are exactly where its points are, and a shape meeting the box at `q` is kept in `q`'s
//! tile's shard among others. For a box inside one cell that is usually one shard, where the
//! sampled cover above names the cell's ring too.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use h3o::{CellIndex, LatLng, Resolution};

use super::pip::BBox;

/// Most shards an engine may have (the width of `ShardSet`).
pub const MAX_SHARDS: usize = 256;
/// Past this many samples a box counts as touching every shard.
const MAX_SAMPLES: usize = 4096;
/// Past this many tiles a query's box is covered by samples instead (see `shards_meeting`).
const MAX_QUERY_TILES: u64 = 256;
const KM_PER_DEGREE: f64 = 111.32;
/// The longest a degree of latitude gets (at the poles), for the tiles' bound.
const KM_PER_DEGREE_MAX: f64 = 111.7;
/// Tiles remembered per partitioner (8 bytes each, allocated at the first routing).
const MEMO_BITS: u32 = 16;
/// Tile numbers must leave room for the shard and a mark in a memo word.
const TILE_KEY_BITS: u32 = 55;

/// A set of shard numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShardSet([u64; MAX_SHARDS / 64]);

impl ShardSet {
    /// Add `shard`; whether it was not in the set before.
    pub fn insert(&mut self, shard: usize) -> bool {
        let (word, bit) = (&mut self.0[shard / 64], 1 << (shard % 64));
        let new = *word & bit == 0;
        *word |= bit;
        new
    }

    pub fn contains(&self, shard: usize) -> bool {
        self.0[shard / 64] & (1 << (shard % 64)) != 0
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    #[cfg(test)]
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

#[derive(Debug)]
pub struct Partitioner {
    resolution: Resolution,
    shards: usize,
    /// Sample spacing in km: well under the smallest cell edge at this resolution.
    step_km: f64,
    /// How points are routed: by their tile's corner, or (at resolutions so fine that tile
    /// numbers would not fit a memo word) by their own cell.
    tiles: Option<Tiles>,
}

/// The lon/lat tiles points are routed by, and a memo of the tiles' shards.
struct Tiles {
    /// Side in degrees.
    side: f64,
    /// Tile columns, plus one for longitude 180 itself.
    columns: u64,
    /// Lossy and shared by all threads: a word holds `tile << 9 | 1 << 8 | shard`, or 0. A
    /// tile's shard never changes, so a word either names it or is passed over.
    memo: OnceLock<Box<[AtomicU64]>>,
}

impl std::fmt::Debug for Tiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiles")
            .field("side", &self.side)
            .field("columns", &self.columns)
            .finish_non_exhaustive()
    }
}

impl Tiles {
    /// Tiles for cells of average edge `edge_km`: a diagonal of at most a tenth of it, in km,
    /// wherever the tile is. `None` when their numbers would not fit [`TILE_KEY_BITS`].
    fn new(edge_km: f64) -> Option<Tiles> {
        let side = edge_km / 10.0 / (std::f64::consts::SQRT_2 * KM_PER_DEGREE_MAX);
        let columns = (360.0 / side).floor() + 2.0;
        let rows = (180.0 / side).floor() + 2.0;
        if columns * rows >= (1u64 << TILE_KEY_BITS) as f64 {
            return None;
        }
        Some(Tiles {
            side,
            columns: columns as u64,
            memo: OnceLock::new(),
        })
    }

    /// The tile of a point of the globe (`-180 <= x <= 180`, `-90 <= y <= 90`) and its
    /// south-west corner.
    #[inline]
    fn tile(&self, x: f64, y: f64) -> (u64, f64, f64) {
        let (i, j) = self.index(x, y);
        (
            self.key(i, j),
            i as f64 * self.side - 180.0,
            j as f64 * self.side - 90.0,
        )
    }

    #[inline]
    fn key(&self, i: u64, j: u64) -> u64 {
        j * self.columns + i
    }

    /// The column and row of the tile of a point of the globe, as [`Self::tile`] numbers it.
    #[inline]
    fn index(&self, x: f64, y: f64) -> (u64, u64) {
        let i = ((x + 180.0) / self.side).floor();
        let j = ((y + 90.0) / self.side).floor();
        (i as u64, j as u64)
    }
}

/// Whether a point is within the globe's lon/lat range, where tiles route it.
#[inline]
fn on_globe(x: f64, y: f64) -> bool {
    (-180.0..=180.0).contains(&x) && (-90.0..=90.0).contains(&y)
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
            tiles: Tiles::new(resolution.edge_length_km()),
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
    pub(crate) fn cell_of(&self, x: f64, y: f64) -> Option<CellIndex> {
        LatLng::new(y, x).ok().map(|ll| ll.to_cell(self.resolution))
    }

    #[inline]
    pub(crate) fn shard_of_cell(&self, cell: CellIndex) -> usize {
        (splitmix64(u64::from(cell)) % self.shards as u64) as usize
    }

    /// The shard of a point: that of its tile's corner's cell (see the module's doc), or of
    /// its own cell off the globe's range or at resolutions without tiles.
    #[inline]
    pub fn shard_of_point(&self, x: f64, y: f64) -> usize {
        if self.shards == 1 {
            return 0;
        }
        match &self.tiles {
            Some(t) if on_globe(x, y) => {
                let (key, cx, cy) = t.tile(x, y);
                self.shard_of_tile(t, key, cx, cy)
            }
            _ => self.shard_of_own_cell(x, y),
        }
    }

    /// The shard of tile `key` (south-west corner `cx`, `cy`): from the memo, else its
    /// corner's cell's.
    #[inline]
    fn shard_of_tile(&self, t: &Tiles, key: u64, cx: f64, cy: f64) -> usize {
        let memo = t.memo.get_or_init(|| {
            (0..1usize << MEMO_BITS)
                .map(|_| AtomicU64::new(0))
                .collect()
        });
        let word = &memo[(splitmix64(key) >> (64 - MEMO_BITS)) as usize];
        let known = word.load(Ordering::Relaxed);
        if known >> 9 == key && known & 0x100 != 0 {
            return (known & 0xff) as usize;
        }
        let shard = self.shard_of_own_cell(cx, cy);
        word.store(key << 9 | 0x100 | shard as u64, Ordering::Relaxed);
        shard
    }

    /// The shards a query for box `b` must look in: those of the tiles it touches, which are
    /// exactly the shards of the points it can hold. A line or polygon meeting the box at a
    /// point `q` is kept in the shards [`Self::shards_for_bbox`] gives its box, which include
    /// `q`'s tile's, so one of these holds it too. Far fewer than [`Self::shards_for_bbox`]
    /// for a box inside a cell, which otherwise counts the cell's neighbours as well. That
    /// cover, where points are not routed by tiles, the box leaves the globe's range, or it
    /// touches more than [`MAX_QUERY_TILES`] tiles.
    pub fn shards_meeting(&self, b: &BBox) -> ShardSet {
        if self.shards == 1 {
            return ShardSet::all(1);
        }
        let Some(t) = &self.tiles else {
            return self.shards_for_bbox(b);
        };
        if !(b[0] <= b[2] && b[1] <= b[3] && on_globe(b[0], b[1]) && on_globe(b[2], b[3])) {
            return self.shards_for_bbox(b);
        }
        // The same arithmetic as a point's tile: every point of the box falls in this range.
        let (i0, j0) = t.index(b[0], b[1]);
        let (i1, j1) = t.index(b[2], b[3]);
        if (i1 - i0 + 1).saturating_mul(j1 - j0 + 1) > MAX_QUERY_TILES {
            return self.shards_for_bbox(b);
        }
        let mut set = ShardSet::default();
        let mut found = 0;
        for j in j0..=j1 {
            for i in i0..=i1 {
                let (cx, cy) = (i as f64 * t.side - 180.0, j as f64 * t.side - 90.0);
                if set.insert(self.shard_of_tile(t, t.key(i, j), cx, cy)) {
                    found += 1;
                    if found == self.shards {
                        return set;
                    }
                }
            }
        }
        set
    }

    /// The shard of the point's own cell (0 for a point without one).
    #[inline]
    fn shard_of_own_cell(&self, x: f64, y: f64) -> usize {
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
                    if set.insert(self.shard_of_cell(c)) {
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

    /// Random points of the globe, a quarter of them near the 12 pentagons of `res` (the most
    /// distorted cells), and the globe's corners.
    fn points(res: Resolution, n: usize, seed: u64) -> Vec<(f64, f64)> {
        let mut state = seed;
        let mut rnd = || {
            state = splitmix64(state);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut out = Vec::with_capacity(n);
        let pentagons: Vec<LatLng> = res.pentagons().map(LatLng::from).collect();
        let edge_deg = res.edge_length_km() / KM_PER_DEGREE;
        for k in 0..n {
            let (x, y) = if k % 4 == 0 {
                let c = pentagons[k / 4 % pentagons.len()];
                (
                    c.lng() + (rnd() - 0.5) * 4.0 * edge_deg,
                    c.lat() + (rnd() - 0.5) * 4.0 * edge_deg,
                )
            } else {
                (
                    rnd() * 360.0 - 180.0,
                    (rnd() * 2.0 - 1.0).asin().to_degrees(),
                )
            };
            out.push((x.clamp(-180.0, 180.0), y.clamp(-90.0, 90.0)));
        }
        out.extend([
            (-180.0, -90.0),
            (180.0, 90.0),
            (180.0, 0.0),
            (0.0, 90.0),
            (0.0, 0.0),
        ]);
        out
    }

    /// What routing promises, checked against h3o directly: every point of a tile goes where
    /// its corner's cell goes, that cell is the point's own or a neighbour of it (so the
    /// boxes' covers hold it), and the memo, however full, answers as a fresh computation.
    #[test]
    fn points_route_by_a_neighbouring_corner() {
        for res in [0u8, 2, 3, 5, 8, 10] {
            let p = Partitioner::new(res, 7).unwrap();
            let t = p.tiles.as_ref().expect("tiles at this resolution");
            // More tiles than memo words: the memo overwrites itself throughout.
            let pts = points(p.resolution, 3 << MEMO_BITS, u64::from(res) + 1);
            for round in 0..2 {
                for &(x, y) in &pts {
                    let i = ((x + 180.0) / t.side).floor();
                    let j = ((y + 90.0) / t.side).floor();
                    let corner = LatLng::new(j * t.side - 90.0, i * t.side - 180.0)
                        .unwrap()
                        .to_cell(p.resolution);
                    let own = LatLng::new(y, x).unwrap().to_cell(p.resolution);
                    assert!(
                        own.grid_distance(corner).is_ok_and(|d| d <= 1),
                        "res {res}: ({x}, {y}) in {own}, its corner in {corner}"
                    );
                    assert_eq!(
                        p.shard_of_point(x, y),
                        p.shard_of_cell(corner),
                        "res {res}, round {round}: ({x}, {y})"
                    );
                }
            }
        }
        // Too fine for tile numbers: a point goes by its own cell.
        let fine = Partitioner::new(15, 7).unwrap();
        assert!(fine.tiles.is_none());
        let own = LatLng::new(45.0, 7.0).unwrap().to_cell(fine.resolution);
        assert_eq!(fine.shard_of_point(7.0, 45.0), fine.shard_of_cell(own));
    }

    /// Small boxes about cell boundaries (where a corner is most often another cell than its
    /// points) cover every point inside them, corners and sides included.
    #[test]
    fn small_boxes_cover_their_points() {
        for res in [2u8, 3, 4, 6] {
            let p = Partitioner::new(res, 16).unwrap();
            let edge_deg = p.resolution.edge_length_km() / KM_PER_DEGREE;
            let mut state = u64::from(res);
            let mut rnd = || {
                state = splitmix64(state);
                (state >> 11) as f64 / (1u64 << 53) as f64
            };
            for (k, (x0, y0)) in points(p.resolution, 2000, 99).into_iter().enumerate() {
                let w = edge_deg * [1e-6, 1e-3, 0.05, 0.4][k % 4] * rnd();
                let h = edge_deg * [1e-6, 1e-3, 0.05, 0.4][(k / 4) % 4] * rnd();
                let b = [x0, y0, (x0 + w).min(180.0), (y0 + h).min(90.0)];
                let cover = p.shards_for_bbox(&b);
                let mut probes = vec![(b[0], b[1]), (b[2], b[3]), (b[0], b[3]), (b[2], b[1])];
                for _ in 0..20 {
                    probes.push((b[0] + rnd() * (b[2] - b[0]), b[1] + rnd() * (b[3] - b[1])));
                }
                for (x, y) in probes {
                    assert!(
                        cover.contains(p.shard_of_point(x, y)),
                        "res {res}: ({x}, {y}) in {b:?} not covered"
                    );
                }
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

    /// A query's cover holds every point of its box (corners, edges and inside), keeps no
    /// shard the sampled cover does not, and is one shard for a box inside one tile.
    #[test]
    fn query_covers_hold_their_points_and_no_more_than_the_sampled_cover() {
        let mut state = 11u64;
        let mut rnd = || {
            state = splitmix64(state);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for (res, shards) in [(2, 6), (4, 16), (7, 64)] {
            let p = Partitioner::new(res, shards).unwrap();
            let side = p.tiles.as_ref().unwrap().side;
            let mut fewer = 0;
            for k in 0..400 {
                let w = side * [0.3, 1.0, 3.0, 20.0][k % 4] * rnd();
                let h = side * [0.3, 1.0, 3.0, 20.0][(k / 4) % 4] * rnd();
                let x0 = rnd() * (360.0 - w) - 180.0;
                let y0 = rnd() * (170.0 - h) - 85.0;
                let b = [x0, y0, x0 + w, y0 + h];
                let cover = p.shards_meeting(&b);
                let sampled = p.shards_for_bbox(&b);
                assert!(cover.iter().all(|s| sampled.contains(s)), "{b:?}");
                fewer += usize::from(cover.len() < sampled.len());
                let mut on = vec![(b[0], b[1]), (b[2], b[3]), (b[0], b[3]), (b[2], b[1])];
                for _ in 0..100 {
                    on.push((b[0] + rnd() * w, b[1] + rnd() * h));
                    on.push((b[0] + rnd() * w, b[1]));
                    on.push((b[2], b[1] + rnd() * h));
                }
                for (x, y) in on {
                    let s = p.shard_of_point(x, y);
                    assert!(
                        cover.contains(s),
                        "res {res}: ({x}, {y}) in {b:?} not covered"
                    );
                }
            }
            assert!(
                fewer > 100,
                "res {res}: fewer shards for only {fewer} of 400 boxes"
            );
            // Inside one tile: that tile's shard alone.
            let t = p.tiles.as_ref().unwrap();
            let (x, y) = (-87.65 + side * 0.25, 41.85 + side * 0.25);
            let (_, cx, cy) = t.tile(x, y);
            let inside = [
                cx + side * 0.1,
                cy + side * 0.1,
                cx + side * 0.9,
                cy + side * 0.9,
            ];
            let cover = p.shards_meeting(&inside);
            assert_eq!(cover.len(), 1);
            assert!(cover.contains(p.shard_of_point(x, y)));
        }
    }

    /// A shape kept where the sampled cover of its box says, and a query box meeting that
    /// box, share a shard: the query finds the shape.
    #[test]
    fn a_query_cover_meets_every_shape_box_it_meets() {
        let p = Partitioner::new(2, 6).unwrap();
        let mut state = 5u64;
        let mut rnd = || {
            state = splitmix64(state);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for k in 0..3000 {
            let size = [0.02, 0.3, 2.0][k % 3];
            let sx = rnd() * 350.0 - 175.0;
            let sy = rnd() * 160.0 - 80.0;
            let shape = [sx, sy, sx + rnd() * size, sy + rnd() * size];
            // A query box around a point of the shape's box.
            let (qx, qy) = (
                shape[0] + rnd() * (shape[2] - shape[0]),
                shape[1] + rnd() * (shape[3] - shape[1]),
            );
            let q = [
                qx - rnd() * size,
                qy - rnd() * size,
                qx + rnd() * size,
                qy + rnd() * size,
            ];
            let kept = p.shards_for_bbox(&shape);
            let cover = p.shards_meeting(&q);
            assert!(
                kept.iter().any(|s| cover.contains(s)),
                "shape {shape:?}, query {q:?}"
            );
        }
    }
}
