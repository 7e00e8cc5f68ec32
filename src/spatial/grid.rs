//! A uniform grid over one shard's polygon parts, for point probes.
//!
//! A point-in-polygon query asks for the parts whose box holds one point. The R-tree answers
//! that by walking from its root, node by node; the grid answers it from one cell: the cell
//! under the point lists every part whose box meets the cell, with the box inline, so a
//! probe reads one short run of memory. The R-tree stays the index for everything else.
//!
//! - The grid covers the union of the parts' boxes when it is built (bulk loads), with about
//!   two cells per part.
//! - A part whose box spans more than [`WIDE_CELLS`] cells is kept in a `wide` list instead,
//!   and one added later outside the covered extent in an `outside` list; probes scan both.
//! - A grid whose side lists hold more than [`MAX_SCANNED`] parts is not built, or is dropped
//!   when inserts push it past that, and probes go to the R-tree until the next bulk load.
//!
//! Cell numbers come from `floor((v - origin) * scale)`, which is monotonic in `v`: a part
//! whose box holds a point is always listed in the point's cell, edges and corners included.

use super::pip::{BBox, bbox_contains};
use super::shard::PartEntry;

/// A part spanning more cells than this goes to the `wide` list.
pub const WIDE_CELLS: usize = 64;
/// More wide and outside parts than this make probes slower than the R-tree: give up.
pub const MAX_SCANNED: usize = 64;
/// Most cells a grid has, whatever the part count (24 bytes each when empty).
const MAX_CELLS: usize = 1 << 20;

pub struct PartGrid {
    origin: [f64; 2],
    /// Cells per unit, in x and y.
    scale: [f64; 2],
    nx: usize,
    ny: usize,
    cells: Vec<Vec<PartEntry>>,
    wide: Vec<PartEntry>,
    outside: Vec<PartEntry>,
}

impl PartGrid {
    /// A grid over `parts`, or `None` when there are none.
    pub fn build(parts: &[PartEntry]) -> Option<PartGrid> {
        let first = parts.first()?;
        let mut ext = first.bbox;
        for p in parts {
            ext = [
                ext[0].min(p.bbox[0]),
                ext[1].min(p.bbox[1]),
                ext[2].max(p.bbox[2]),
                ext[3].max(p.bbox[3]),
            ];
        }
        let cells = (parts.len() * 2).clamp(16, MAX_CELLS) as f64;
        // Side lengths of at least a millionth of the other, so a flat extent still divides.
        let w = (ext[2] - ext[0]).max((ext[3] - ext[1]) * 1e-6).max(1e-9);
        let h = (ext[3] - ext[1]).max(w * 1e-6).max(1e-9);
        let nx = ((cells * w / h).sqrt().round() as usize).clamp(1, MAX_CELLS);
        let ny = ((cells / nx as f64).round() as usize).clamp(1, MAX_CELLS / nx);
        let mut grid = PartGrid {
            origin: [ext[0], ext[1]],
            scale: [nx as f64 / w, ny as f64 / h],
            nx,
            ny,
            cells: vec![Vec::new(); nx * ny],
            wide: Vec::new(),
            outside: Vec::new(),
        };
        for p in parts {
            grid.insert(p.clone());
        }
        grid.usable().then_some(grid)
    }

    fn col(&self, x: f64) -> Option<usize> {
        let c = ((x - self.origin[0]) * self.scale[0]).floor();
        // The far edge of the extent belongs to the last column.
        (c >= 0.0 && c <= self.nx as f64).then(|| (c as usize).min(self.nx - 1))
    }

    fn row(&self, y: f64) -> Option<usize> {
        let r = ((y - self.origin[1]) * self.scale[1]).floor();
        (r >= 0.0 && r <= self.ny as f64).then(|| (r as usize).min(self.ny - 1))
    }

    /// The cell ranges a box covers, if it lies within the extent.
    fn span(&self, b: &BBox) -> Option<(usize, usize, usize, usize)> {
        Some((
            self.col(b[0])?,
            self.row(b[1])?,
            self.col(b[2])?,
            self.row(b[3])?,
        ))
    }

    pub fn insert(&mut self, e: PartEntry) {
        match self.span(&e.bbox) {
            None => self.outside.push(e),
            Some((c0, r0, c1, r1)) if (c1 - c0 + 1) * (r1 - r0 + 1) > WIDE_CELLS => {
                self.wide.push(e)
            }
            Some((c0, r0, c1, r1)) => {
                for r in r0..=r1 {
                    for c in c0..=c1 {
                        self.cells[r * self.nx + c].push(e.clone());
                    }
                }
            }
        }
    }

    pub fn remove(&mut self, e: &PartEntry) {
        let drop_from = |list: &mut Vec<PartEntry>| {
            if let Some(i) = list.iter().position(|x| x == e) {
                list.swap_remove(i);
            }
        };
        match self.span(&e.bbox) {
            None => drop_from(&mut self.outside),
            Some((c0, r0, c1, r1)) if (c1 - c0 + 1) * (r1 - r0 + 1) > WIDE_CELLS => {
                drop_from(&mut self.wide)
            }
            Some((c0, r0, c1, r1)) => {
                for r in r0..=r1 {
                    for c in c0..=c1 {
                        drop_from(&mut self.cells[r * self.nx + c]);
                    }
                }
            }
        }
    }

    /// Whether probes here beat the R-tree.
    pub fn usable(&self) -> bool {
        self.wide.len() + self.outside.len() <= MAX_SCANNED
    }

    /// Every part whose box holds `(x, y)`, each once.
    #[inline]
    pub fn probe<'a>(&'a self, x: f64, y: f64, mut f: impl FnMut(&'a PartEntry)) {
        if let (Some(c), Some(r)) = (self.col(x), self.row(y)) {
            for e in &self.cells[r * self.nx + c] {
                if bbox_contains(&e.bbox, x, y) {
                    f(e);
                }
            }
        }
        for e in self.wide.iter().chain(&self.outside) {
            if bbox_contains(&e.bbox, x, y) {
                f(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use geo::{Geometry, Rect, coord};

    use super::*;
    use crate::spatial::predicate::Shape;
    use crate::spatial::shard::WHOLE;

    fn entry(id: u32, b: BBox) -> PartEntry {
        let rect = Rect::new(coord! {x: b[0], y: b[1]}, coord! {x: b[2], y: b[3]});
        PartEntry {
            bbox: b,
            shape: Arc::new(Shape::new(Geometry::Polygon(rect.to_polygon())).unwrap()),
            part: WHOLE,
            id,
        }
    }

    /// splitmix64: deterministic boxes and points.
    fn rng(state: &mut u64) -> f64 {
        *state = state.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Probes agree with a scan of the live boxes, for small, wide and late outside parts,
    /// after removals, at box corners and edges and at random points.
    #[test]
    fn probes_match_a_scan() {
        let mut s = 7u64;
        let mut boxes: Vec<(u32, BBox)> = Vec::new();
        for id in 0..400u32 {
            let (x, y) = (rng(&mut s) * 100.0, rng(&mut s) * 50.0);
            let (w, h) = if id % 50 == 0 {
                (60.0, 30.0) // wide
            } else {
                (rng(&mut s) * 3.0, rng(&mut s) * 3.0)
            };
            boxes.push((id, [x, y, x + w, y + h]));
        }
        let mut entries: Vec<PartEntry> = boxes.iter().map(|(id, b)| entry(*id, *b)).collect();
        let mut grid = PartGrid::build(&entries).unwrap();
        assert!(!grid.wide.is_empty());
        // Later: parts beyond the extent, and removals.
        for id in 400..410u32 {
            let b = [150.0 + id as f64, -20.0, 152.0 + id as f64, -18.0];
            entries.push(entry(id, b));
            grid.insert(entries[id as usize].clone());
            boxes.push((id, b));
        }
        assert_eq!(grid.outside.len(), 10);
        for id in (0..410u32).step_by(7) {
            let i = boxes.iter().position(|(b, _)| *b == id).unwrap();
            boxes.swap_remove(i);
            // The same entry (its shape is compared by pointer), as the engine passes it.
            grid.remove(&entries[id as usize]);
        }
        assert!(grid.usable());
        let mut probes: Vec<(f64, f64)> = (0..3000)
            .map(|_| (rng(&mut s) * 180.0 - 10.0, rng(&mut s) * 90.0 - 25.0))
            .collect();
        for (_, b) in &boxes {
            probes.extend([(b[0], b[1]), (b[2], b[3]), (b[0], (b[1] + b[3]) / 2.0)]);
        }
        let mut hits = 0;
        for (x, y) in probes {
            let mut got = Vec::new();
            grid.probe(x, y, |e| got.push(e.id));
            got.sort_unstable();
            let mut want: Vec<u32> = boxes
                .iter()
                .filter(|(_, b)| bbox_contains(b, x, y))
                .map(|(id, _)| *id)
                .collect();
            want.sort_unstable();
            assert_eq!(got, want, "at ({x}, {y})");
            hits += got.len();
        }
        assert!(hits > 3000, "too few hits to mean much: {hits}");
    }

    /// Too many parts to scan beside the cells: no grid, so probes use the R-tree.
    #[test]
    fn no_grid_when_side_lists_would_be_long() {
        let mut parts: Vec<PartEntry> = (0..200u32)
            .map(|i| entry(i, [i as f64, 0.0, i as f64 + 0.5, 0.5]))
            .collect();
        assert!(PartGrid::build(&parts).is_some());
        // Each of these spans the whole extent: wide.
        parts.extend((200..200 + MAX_SCANNED as u32 + 1).map(|i| entry(i, [0.0, 0.0, 200.0, 0.5])));
        assert!(PartGrid::build(&parts).is_none());
    }
}
