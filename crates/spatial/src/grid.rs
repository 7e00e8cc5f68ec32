//! A uniform grid over one shard's polygon parts, for point probes.
//!
//! A point-in-polygon query asks for the parts whose box holds one point. The R-tree answers
//! that by walking from its root, node by node; the grid answers it from one cell: the cell
//! under the point lists the parts whose box meets the cell, sixteen bytes each, so a probe
//! reads one short run of memory. The R-tree stays the index for everything else.
//!
//! - The cells are squares with a side that follows the parts' sizes, not their extent: a
//!   layer's parts may crowd a small part of it (the US counties span the Aleutians to Puerto
//!   Rico), and a shard's parts are scattered over it (shards own H3 cells by hash). The side
//!   is the finest within a memory budget (see `PartGrid::build`). Only cells that list
//!   something are kept.
//! - A cell lists a part only where the part may hold one of its points, and says so when
//!   it holds them all: a cell that no edge of the part meets lies wholly inside or wholly
//!   outside it. Inside, the entry carries `Interior` and the probe skips locating the point;
//!   outside, the part is not listed. With cells smaller than the parts, many probes locate
//!   nothing.
//! - Where the point must be located, the entry names the short run of the polygon's shell
//!   that the crossing test needs for any point of the cell (a chain into one copy of
//!   the shells the grid keeps), so the probe locates it there, without the part, its shape
//!   and its stripes: on a busy server each of those is a cache miss.
//! - The built cells are one array of entries, found through an open-addressing table of
//!   16-byte slots (cell, start, length), so a probe usually reads one slot before the
//!   entries. Parts inserted later go to a side map of cells, removed ones are marked dead;
//!   when those grow past a share of the grid, the shard rebuilds it.
//! - A part whose box spans more than [`WIDE_CELLS`] cells is kept in a `wide` list; probes
//!   scan it. A grid whose wide list would hold more than [`MAX_SCANNED`] parts is not
//!   built, and probes go to the R-tree.
//!
//! Cell numbers come from `floor((v - origin) / side)`, which is monotonic in `v`: a part
//! whose box holds a point is always listed in the point's cell (unless the cell lies outside
//! the part), edges and corners included.

use geo::{Coord, Geometry};

use super::FeatureId;
use super::entry::{PartEntry, WHOLE};
use super::pip::{BBox, Edge, Location, bbox_contains, locate_on_chain};
use crate::FastMap;

/// A part spanning more cells than this goes to the `wide` list.
pub const WIDE_CELLS: usize = 4096;
/// More wide parts than this make probes slower than the R-tree: give up.
pub const MAX_SCANNED: usize = 64;
/// Most cells a part's box covers, on average, at the side a grid is built with: this bounds
/// the entries (16 bytes each, and up to 64 more per cell in the table's slots).
const ENTRIES_PER_PART: usize = 64;
/// The cell sides tried, as fractions of the median part's longer side, coarsest first.
const SIDES: [f64; 6] = [2.0, 1.0, 0.5, 0.25, 0.125, 0.0625];
pub(crate) struct PartGrid {
    layout: Layout,
    /// The built cells: where their entries are in `entries`.
    table: CellTable,
    entries: Vec<CellEntry>,
    /// The shells of the built entries' polygons, one after another, each once: the vertices
    /// that chains ([`Chain`]) run over.
    shells: Vec<Coord<f64>>,
    /// The parts that entries point to (removed ones stay until the grid is rebuilt).
    parts: Vec<PartEntry>,
    /// Entries of parts inserted since, by cell.
    extra: FastMap<u64, Vec<CellEntry>>,
    extra_entries: usize,
    /// Entries in `entries` of parts removed since.
    dead: usize,
    wide: Vec<PartEntry>,
}

/// A part listed in one cell: its feature, and where the part is in [`PartGrid::parts`],
/// flagged [`INTERIOR`] when the whole cell lies inside it (no edge comes near, and the
/// cell is within the part's box), or [`DEAD`] once removed. A probe that lands inside a part
/// reads nothing else.
///
/// An entry to be located carries, where it can, its cell's [`Chain`]: the run of the part's
/// polygon's shell that holds every edge a point of the cell may need. The crossing test on
/// that run alone locates any point of the cell in the polygon exactly, so such a probe reads
/// the slot, the entries and the run, and not the part, its shape and its stripes, each a
/// cold load of its own on a busy server.
#[derive(Clone, Copy)]
struct CellEntry {
    id: FeatureId,
    slot: u32,
    chain: Chain,
}

/// A run of `len & !MIRRORED` edges of a polygon's shell: the `len + 1` vertices from
/// `start` in [`PartGrid::shells`]. It holds every edge of the shell whose y-range meets the
/// cell's and that is not wholly left of it (or, when [`MIRRORED`], right of it), and maybe
/// others between them, which change nothing (see `pip::locate_in_ring`). `len` is
/// [`NO_CHAIN`] where the part must locate the point itself: lines, polygons with holes,
/// parts inserted after the build, and cells whose run would be longer than [`CHAIN_MAX`].
#[derive(Clone, Copy)]
struct Chain {
    start: u32,
    len: u32,
}

impl Chain {
    const NONE: Chain = Chain {
        start: 0,
        len: NO_CHAIN,
    };
}

/// A part's polygon's shell, where it is in [`Shells`], and the numbers of its edges (edge
/// `i` runs from vertex `i` to `i + 1`) near the part's cells ([`Layout::near_edges`]).
struct Near<'e> {
    at: u32,
    ring: &'e [Coord<f64>],
    edges: Vec<u32>,
}

/// Where the shells of a build go, each polygon's once: by shape (its address) and element.
#[derive(Default)]
struct Shells {
    coords: Vec<Coord<f64>>,
    at: FastMap<(usize, u32), u32>,
    /// Each shell's edges by height, made when a part of it first needs its near edges.
    index: FastMap<(usize, u32), ShellIndex>,
}

/// A shell's edges by the lower end of their y-range, so that the edges near a part's rows
/// are found without scanning the shell (which, for every band of a big polygon, would be
/// quadratic): edges no taller than a cell in one sorted run, where a window of lows holds
/// every one that can meet the rows; taller edges, few on real boundaries, in a list
/// scanned whole.
struct ShellIndex {
    /// Edges no taller than `short_height`: (lower y, edge number), by lower y.
    short: Vec<(f64, u32)>,
    short_height: f64,
    /// The taller edges' numbers.
    tall: Vec<u32>,
}

impl ShellIndex {
    fn new(ring: &[Coord<f64>], short_height: f64) -> ShellIndex {
        let mut short = Vec::with_capacity(ring.len().saturating_sub(1));
        let mut tall = Vec::new();
        for (i, w) in ring.windows(2).enumerate() {
            let (lo, hi) = (w[0].y.min(w[1].y), w[0].y.max(w[1].y));
            if hi - lo <= short_height {
                short.push((lo, i as u32));
            } else {
                tall.push(i as u32);
            }
        }
        short.sort_by(|a, b| a.0.total_cmp(&b.0));
        ShellIndex {
            short,
            short_height,
            tall,
        }
    }

    /// Where the short edges whose y-range may meet `[ya, yb]` are in `short`.
    fn window(&self, ya: f64, yb: f64) -> std::ops::Range<usize> {
        let from = self.short.partition_point(|e| e.0 < ya - self.short_height);
        let to = self.short.partition_point(|e| e.0 <= yb);
        from..to.max(from)
    }
}

/// The `len` of a chain to be read mirrored (`x` negated), so that the crossing test's
/// rightward ray runs leftward: a cell near a part's right side needs the few edges to its
/// right, one near its left side the few to its left.
const MIRRORED: u32 = 1 << 16;

const INTERIOR: u32 = 1 << 31;
const DEAD: u32 = u32::MAX;
/// The `len` of an entry without a chain.
const NO_CHAIN: u32 = u32::MAX;
/// Longest chain an entry keeps: past this, the part's stripes are as quick.
const CHAIN_MAX: usize = 32;
/// Most near edges a part's chains are chosen from. A part with more (its rows cross many
/// edges of its shell: many bands to a cell, or long edges) gets no chains: their runs would
/// mostly be longer than [`CHAIN_MAX`] anyway.
const NEAR_MAX: usize = 4096;
/// Most edge tests a part's chains may take, per edge of the part: cells to locate in times
/// near edges. Past it the part gets no chains, and probes locate in its stripes.
const CHAIN_WORK_PER_EDGE: usize = 128;
/// Most cell tests a part's classification may take, per edge of the part and per cell of
/// its box: edges marking the cells their boxes meet, and a location for each cell no edge
/// meets. Past it every cell of the box is left to locate in, without the shortcuts.
const CLASSIFY_WORK_PER_ITEM: usize = 64;
/// Most parts a grid lists (slot numbers below the flag).
const MAX_PARTS: usize = (INTERIOR - 1) as usize;

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// The point must be located in the part.
    Locate,
    /// Every point of the cell is inside the part.
    Interior,
}

/// Where the cells lie: squares of side `1 / inv` from `origin`, numbered in `i32`.
#[derive(Debug, Clone, Copy)]
struct Layout {
    origin: [f64; 2],
    inv: f64,
}

/// Cell numbers run over `-CELL_RANGE..CELL_RANGE`, so a column and a row pack into a key.
const CELL_RANGE: f64 = (1u64 << 31) as f64;

impl Layout {
    fn index(&self, v: f64, axis: usize) -> Option<i64> {
        let c = ((v - self.origin[axis]) * self.inv).floor();
        // NaN fails both tests; so do cells too far away to number.
        (-CELL_RANGE..CELL_RANGE).contains(&c).then_some(c as i64)
    }

    fn key(c: i64, r: i64) -> u64 {
        ((c as u32 as u64) << 32) | r as u32 as u64
    }

    #[inline]
    fn cell(&self, x: f64, y: f64) -> Option<u64> {
        Some(Layout::key(self.index(x, 0)?, self.index(y, 1)?))
    }

    /// How far [`Layout::cell_box`] widens a cell: far above the rounding of `floor`.
    fn margin(&self) -> f64 {
        1e-6 / self.inv + 1e-9
    }

    /// A closed box holding every point that `index` puts in cell `(c, r)`: the cell widened
    /// by [`Layout::margin`].
    fn cell_box(&self, c: i64, r: i64) -> BBox {
        let side = 1.0 / self.inv;
        let m = self.margin();
        [
            self.origin[0] + c as f64 * side - m,
            self.origin[1] + r as f64 * side - m,
            self.origin[0] + (c + 1) as f64 * side + m,
            self.origin[1] + (r + 1) as f64 * side + m,
        ]
    }

    /// The cell ranges a box covers, or `None` for the wide list.
    fn place(&self, b: &BBox) -> Option<[i64; 4]> {
        let r = [
            self.index(b[0], 0)?,
            self.index(b[1], 1)?,
            self.index(b[2], 0)?,
            self.index(b[3], 1)?,
        ];
        ((r[2] - r[0] + 1) * (r[3] - r[1] + 1) <= WIDE_CELLS as i64).then_some(r)
    }

    /// The entries of part `e`, number `slot`, over the cells `range` of its box: `(cell,
    /// entry)` for each cell that may hold one of its points. With `shells`, entries to be
    /// located get their cell's chain, where they can.
    fn entries_of(
        &self,
        e: &PartEntry,
        slot: u32,
        range: [i64; 4],
        shells: Option<&mut Shells>,
        mut f: impl FnMut(u64, CellEntry),
    ) {
        let [c0, r0, c1, r1] = range;
        let states = self.classify(e, range);
        // A part with no cell to locate in needs no shell.
        let locates = states.iter().filter(|s| **s == Some(State::Locate)).count();
        let near = shells
            .filter(|_| locates > 0)
            .and_then(|s| self.near_edges(e, range, locates, s));
        let mut states = states.iter();
        for r in r0..=r1 {
            for c in c0..=c1 {
                let Some(state) = states.next().copied().flatten() else {
                    continue;
                };
                let (flag, chain) = match (state, &near) {
                    (State::Interior, _) => (INTERIOR, Chain::NONE),
                    (State::Locate, Some(near)) => (0, self.chain(near, c, r)),
                    (State::Locate, None) => (0, Chain::NONE),
                };
                let entry = CellEntry {
                    chain,
                    id: e.id,
                    slot: slot | flag,
                };
                f(Layout::key(c, r), entry);
            }
        }
    }

    /// The shell of the polygon that part `e` is a band of, where it is in `shells` (added
    /// when it is not there yet), and its edges whose y-range meets the rows of `range`, in
    /// order. `None` for lines and for polygons with holes (their rings are located one by
    /// one, see [`super::pip`]), and where the chains of `locates` cells would take more
    /// than their budget ([`NEAR_MAX`], [`CHAIN_WORK_PER_EDGE`]).
    fn near_edges<'e>(
        &self,
        e: &'e PartEntry,
        [c0, r0, c1, r1]: [i64; 4],
        locates: usize,
        shells: &mut Shells,
    ) -> Option<Near<'e>> {
        if e.part == WHOLE {
            return None;
        }
        let part = e.shape.parts.get(e.part as usize)?;
        let element = part.element as usize;
        let polygon = match &e.shape.geometry {
            Geometry::Polygon(p) if element == 0 => p,
            Geometry::MultiPolygon(mp) => mp.0.get(element)?,
            _ => return None,
        };
        let ring = &polygon.exterior().0[..];
        if !polygon.interiors().is_empty() || ring.len() < 2 {
            return None;
        }
        let key = (std::sync::Arc::as_ptr(&e.shape) as usize, element as u32);
        let (low, high) = (self.cell_box(c0, r0), self.cell_box(c1, r1));
        let (ya, yb) = (low[1], high[3]);
        let index = shells
            .index
            .entry(key)
            .or_insert_with(|| ShellIndex::new(ring, (high[3] - high[1]).max(0.0)));
        let window = index.window(ya, yb);
        let candidates = window.len() + index.tall.len();
        let budget = CHAIN_WORK_PER_EDGE.saturating_mul(part.edges().len().max(1));
        if candidates > NEAR_MAX || locates.saturating_mul(candidates) > budget {
            return None;
        }
        let meets = |i: u32| {
            let (a, b) = (ring[i as usize], ring[i as usize + 1]);
            a.y.min(b.y) <= yb && a.y.max(b.y) >= ya
        };
        let mut edges: Vec<u32> = index.short[window]
            .iter()
            .map(|e| e.1)
            .chain(index.tall.iter().copied())
            .filter(|&i| meets(i))
            .collect();
        edges.sort_unstable();
        let at = match shells.at.get(&key) {
            Some(at) => *at,
            None => {
                // Chains number vertices in `u32`: the shell's last one must fit.
                let at = u32::try_from(shells.coords.len()).ok()?;
                at.checked_add(u32::try_from(ring.len()).ok()?)?;
                shells.coords.extend_from_slice(ring);
                shells.at.insert(key, at);
                at
            }
        };
        Some(Near { at, ring, edges })
    }

    /// The chain of cell `(c, r)` on the `near` shell, from its near edges: the shorter of
    /// the runs for a ray to the right and to the left ([`MIRRORED`]), or [`Chain::NONE`] when
    /// both are longer than [`CHAIN_MAX`].
    fn chain(&self, near: &Near<'_>, c: i64, r: i64) -> Chain {
        let Near { at, ring, edges } = near;
        let b = self.cell_box(c, r);
        let edge = |i: u32| {
            let (a, z) = (ring[i as usize], ring[i as usize + 1]);
            [a.x, a.y, z.x, z.y]
        };
        // From the first to the last edge needed, as (first, edges); none needed, no edges
        // (no point of the cell has an edge to that side: all are outside).
        let run = |keep: &dyn Fn(&Edge) -> bool| {
            let mut needed = edges.iter().copied().filter(|&i| keep(&edge(i)));
            match needed.next() {
                None => (0, 0),
                Some(first) => (first, needed.last().unwrap_or(first) - first + 1),
            }
        };
        let right = run(&|g| needed(g, b[0], b[1], b[3]));
        let left = run(&|g| needed(&[-g[0], g[1], -g[2], g[3]], -b[2], b[1], b[3]));
        let ((first, len), flag) = if left.1 < right.1 {
            (left, MIRRORED)
        } else {
            (right, 0)
        };
        if len as usize > CHAIN_MAX {
            return Chain::NONE;
        }
        Chain {
            // Vertices `first..=first + len`, within the ring: the last edge needed ends there.
            start: at + first,
            len: len | flag,
        }
    }

    /// How part `e` stands in each cell of `range` (row by row): absent (no point of the cell
    /// is in it), inside (every point is), or to be located.
    ///
    /// A cell that no edge's box meets holds no boundary, so one location holds for all its
    /// points within the part's box: the location of the middle of that piece. Edges mark the
    /// cells they may touch, each cell checked against its closed box as probes see it.
    fn classify(&self, e: &PartEntry, [c0, r0, c1, r1]: [i64; 4]) -> Vec<Option<State>> {
        let (w, h) = ((c1 - c0 + 1) as usize, (r1 - r0 + 1) as usize);
        if e.part == WHOLE {
            return vec![Some(State::Locate); w * h];
        }
        let part = &e.shape.parts[e.part as usize];
        let m = self.margin();
        let cells = w * h;
        // Past its budget the part is located in every cell of its box: no shortcuts.
        let budget = CLASSIFY_WORK_PER_ITEM.saturating_mul(part.edges().len() + cells);
        let all_located = || vec![Some(State::Locate); cells];
        let marking: usize = part
            .edges()
            .iter()
            .map(|g| {
                let span = |lo: f64, hi: f64, axis: usize| match (
                    self.index(lo - 2.0 * m, axis),
                    self.index(hi + 2.0 * m, axis),
                ) {
                    (Some(a), Some(b)) => (b - a + 1).clamp(1, 1 << 20) as usize,
                    _ => 1 << 20,
                };
                let wide = span(g[0].min(g[2]), g[0].max(g[2]), 0).min(w);
                let tall = span(g[1].min(g[3]), g[1].max(g[3]), 1).min(h);
                wide * tall
            })
            .fold(0usize, usize::saturating_add);
        if marking.saturating_add(cells.saturating_mul(part.probe_cost())) > budget {
            return all_located();
        }
        let mut touched = vec![false; w * h];
        for g in part.edges() {
            let (gx0, gx1) = (g[0].min(g[2]), g[0].max(g[2]));
            let (gy0, gy1) = (g[1].min(g[3]), g[1].max(g[3]));
            // Every cell whose widened box meets the edge's: `floor` of the edge's ends moved
            // out by twice the widening (each is checked exactly below).
            let lo = |v: f64, axis: usize, min: i64| {
                self.index(v - 2.0 * m, axis).map_or(min, |i| i.max(min))
            };
            let hi = |v: f64, axis: usize, max: i64| {
                self.index(v + 2.0 * m, axis).map_or(max, |i| i.min(max))
            };
            let (a0, a1) = (lo(gx0, 0, c0), hi(gx1, 0, c1));
            let (b0, b1) = (lo(gy0, 1, r0), hi(gy1, 1, r1));
            for r in b0..=b1 {
                for c in a0..=a1 {
                    let cb = self.cell_box(c, r);
                    if gx0 <= cb[2] && cb[0] <= gx1 && gy0 <= cb[3] && cb[1] <= gy1 {
                        touched[(r - r0) as usize * w + (c - c0) as usize] = true;
                    }
                }
            }
        }
        let b = &e.bbox;
        let mut out = Vec::with_capacity(w * h);
        for r in r0..=r1 {
            for c in c0..=c1 {
                let cell = self.cell_box(c, r);
                let piece = [
                    b[0].max(cell[0]),
                    b[1].max(cell[1]),
                    b[2].min(cell[2]),
                    b[3].min(cell[3]),
                ];
                out.push(if piece[0] > piece[2] || piece[1] > piece[3] {
                    None // the box misses the cell: no point of the cell reaches the part
                } else if touched[(r - r0) as usize * w + (c - c0) as usize] {
                    Some(State::Locate)
                } else {
                    let mid = ((piece[0] + piece[2]) / 2.0, (piece[1] + piece[3]) / 2.0);
                    match part.locate(mid.0, mid.1) {
                        Location::Exterior => None,
                        // Inside for the points of the piece; for the cell when it is the piece.
                        Location::Interior if piece == cell => Some(State::Interior),
                        _ => Some(State::Locate),
                    }
                });
            }
        }
        out
    }
}

/// Whether a point with `x >= x0` and `y0 <= y <= y1` may need edge `g` to be located: the
/// edge's closed y-range meets `[y0, y1]` and it is not wholly left of `x0`. The crossing test
/// (`pip::locate_in_ring`) passes over every other edge.
fn needed(g: &Edge, x0: f64, y0: f64, y1: f64) -> bool {
    g[1].min(g[3]) <= y1 && g[1].max(g[3]) >= y0 && g[0].max(g[2]) >= x0
}

/// Open addressing over the built cells, with linear probing, at most half full.
struct CellTable {
    slots: Box<[Slot]>,
    shift: u32,
}

#[derive(Clone, Copy)]
struct Slot {
    key: u64,
    start: u32,
    len: u32,
}

/// The key of no slot (an empty slot has `len` 0, so a cell with this key finds nothing).
const NO_KEY: u64 = u64::MAX;

impl CellTable {
    /// `cells`: `(key, start, len)`, keys distinct.
    fn new(cells: &[(u64, u32, u32)]) -> CellTable {
        let bits = (cells.len().max(1) * 2)
            .next_power_of_two()
            .trailing_zeros()
            .max(4);
        let empty = Slot {
            key: NO_KEY,
            start: 0,
            len: 0,
        };
        let mut t = CellTable {
            slots: vec![empty; 1 << bits].into_boxed_slice(),
            shift: 64 - bits,
        };
        let mask = t.slots.len() - 1;
        for &(key, start, len) in cells {
            // Built cells have no negative numbers (the origin is the parts' lowest corner).
            debug_assert_ne!(key, NO_KEY);
            let mut i = t.home(key);
            while t.slots[i].key != NO_KEY {
                i = (i + 1) & mask;
            }
            t.slots[i] = Slot { key, start, len };
        }
        t
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// Where the entries of cell `key` are in the entry array (empty when it has none).
    #[inline]
    fn range(&self, key: u64) -> std::ops::Range<usize> {
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        loop {
            let s = self.slots[i];
            if s.key == key || s.key == NO_KEY {
                return s.start as usize..(s.start + s.len) as usize;
            }
            i = (i + 1) & mask;
        }
    }
}

impl PartGrid {
    /// A grid over `parts`, or `None` when there are none or the wide list would be long.
    ///
    /// The side is the finest of `SIDES` (times the median part's longer side) whose boxes
    /// cover at most `ENTRIES_PER_PART` cells a part, on average: finer cells list fewer
    /// parts and lie inside more of them, so probes scan and locate less, and the boxes'
    /// cells bound the entries (cells outside a part do not list it).
    pub fn build(parts: &[PartEntry]) -> Option<PartGrid> {
        let first = parts.first()?;
        let mut origin = [first.bbox[0], first.bbox[1]];
        let mut sizes: Vec<f64> = Vec::with_capacity(parts.len());
        for p in parts {
            origin = [origin[0].min(p.bbox[0]), origin[1].min(p.bbox[1])];
            sizes.push((p.bbox[2] - p.bbox[0]).max(p.bbox[3] - p.bbox[1]));
        }
        let mid = sizes.len() / 2;
        let median = *sizes.select_nth_unstable_by(mid, f64::total_cmp).1;
        let median = if median.is_finite() && median > 0.0 {
            median
        } else {
            1e-6
        };
        let budget = parts.len().saturating_mul(ENTRIES_PER_PART);
        let mut chosen = None;
        for f in SIDES {
            let layout = Layout {
                origin,
                inv: 1.0 / (median * f),
            };
            let (mut cells, mut wide) = (0usize, 0usize);
            for p in parts {
                match layout.place(&p.bbox) {
                    Some(r) => cells += ((r[2] - r[0] + 1) * (r[3] - r[1] + 1)) as usize,
                    None => wide += 1,
                }
            }
            // Finer sides only add wide parts and cells.
            if wide > MAX_SCANNED || cells > budget {
                break;
            }
            chosen = Some(layout);
        }
        Some(PartGrid::with_layout(chosen?, parts))
    }

    fn with_layout(layout: Layout, parts: &[PartEntry]) -> PartGrid {
        let mut wide = Vec::new();
        let mut listed: Vec<(u64, CellEntry)> = Vec::new();
        let mut shells = Shells::default();
        let mut kept = Vec::new();
        for p in parts {
            match layout.place(&p.bbox) {
                Some(r) if kept.len() < MAX_PARTS => {
                    let before = listed.len();
                    let s = Some(&mut shells);
                    layout.entries_of(p, kept.len() as u32, r, s, |c, e| listed.push((c, e)));
                    if listed.len() > before {
                        kept.push(p.clone());
                    }
                }
                _ => wide.push(p.clone()),
            }
        }
        // Stable: a cell's entries stay in the parts' order.
        listed.sort_by_key(|(c, _)| *c);
        let mut cells: Vec<(u64, u32, u32)> = Vec::new();
        for (i, (c, _)) in listed.iter().enumerate() {
            match cells.last_mut() {
                Some(last) if last.0 == *c => last.2 += 1,
                _ => cells.push((*c, i as u32, 1)),
            }
        }
        PartGrid {
            layout,
            table: CellTable::new(&cells),
            entries: listed.into_iter().map(|(_, e)| e).collect(),
            shells: shells.coords,
            parts: kept,
            extra: FastMap::default(),
            extra_entries: 0,
            dead: 0,
            wide,
        }
    }

    pub fn insert(&mut self, e: PartEntry) {
        let Some(r) = self
            .layout
            .place(&e.bbox)
            .filter(|_| self.parts.len() < MAX_PARTS)
        else {
            return self.wide.push(e);
        };
        let (layout, extra, n) = (&self.layout, &mut self.extra, &mut self.extra_entries);
        let before = *n;
        layout.entries_of(&e, self.parts.len() as u32, r, None, |c, entry| {
            extra.entry(c).or_default().push(entry);
            *n += 1;
        });
        if *n > before {
            self.parts.push(e);
        }
    }

    pub fn remove(&mut self, e: &PartEntry) {
        let Some([c0, r0, c1, r1]) = self.layout.place(&e.bbox) else {
            if let Some(i) = self.wide.iter().position(|x| x == e) {
                self.wide.swap_remove(i);
            }
            return;
        };
        for r in r0..=r1 {
            for c in c0..=c1 {
                let cell = Layout::key(c, r);
                let range = self.table.range(cell);
                let parts = &self.parts;
                let is_e =
                    |x: &CellEntry| x.slot != DEAD && parts[(x.slot & !INTERIOR) as usize] == *e;
                for x in &mut self.entries[range] {
                    if is_e(x) {
                        x.slot = DEAD;
                        self.dead += 1;
                    }
                }
                if let Some(list) = self.extra.get_mut(&cell) {
                    let before = list.len();
                    list.retain(|x| !is_e(x));
                    self.extra_entries -= before - list.len();
                    if list.is_empty() {
                        self.extra.remove(&cell);
                    }
                }
            }
        }
    }

    /// Whether probes here beat the R-tree.
    pub fn usable(&self) -> bool {
        self.wide.len() <= MAX_SCANNED
    }

    /// Whether inserts and removals since the build have made the grid worth rebuilding: they
    /// cost memory, and probes of the side map cost time.
    pub fn stale(&self) -> bool {
        !self.usable() || self.extra_entries + self.dead > self.entries.len() / 2 + 4096
    }

    /// Every part whose box holds `(x, y)` and that the point may lie in, each once, with the
    /// point's location when the grid knows it. Parts the point is known to be exterior to
    /// may be left out.
    ///
    /// A known location is the point's in the part's polygon (the element of its shape that
    /// the part is a band of), which is the part's own wherever the part's box holds the
    /// point. Entries with a chain answer for the polygon at any point of their cell, so
    /// a part whose box does not hold the point may come with `Interior` or `Boundary`: the
    /// polygon's, from a band of it that lists the cell.
    #[inline]
    pub fn probe<'a>(
        &'a self,
        x: f64,
        y: f64,
        mut f: impl FnMut(FeatureId, &'a PartEntry, Option<Location>),
    ) {
        let mut visit = |e: &CellEntry| {
            if e.slot == DEAD {
                return;
            }
            let p = &self.parts[(e.slot & !INTERIOR) as usize];
            if e.slot & INTERIOR != 0 {
                // The point is in the cell, which is within the part's box.
                f(e.id, p, Some(Location::Interior));
            } else if e.chain.len != NO_CHAIN {
                let (start, n) = (e.chain.start as usize, (e.chain.len & !MIRRORED) as usize);
                let chain = &self.shells[start..start + n + 1];
                match locate_on_chain(chain, e.chain.len & MIRRORED != 0, x, y) {
                    Location::Exterior => {}
                    known => f(e.id, p, Some(known)),
                }
            } else if bbox_contains(&p.bbox, x, y) {
                f(e.id, p, None);
            }
        };
        if let Some(cell) = self.layout.cell(x, y) {
            self.entries[self.table.range(cell)]
                .iter()
                .for_each(&mut visit);
            if !self.extra.is_empty()
                && let Some(list) = self.extra.get(&cell)
            {
                list.iter().for_each(&mut visit);
            }
        }
        for e in &self.wide {
            if bbox_contains(&e.bbox, x, y) {
                f(e.id, e, None);
            }
        }
    }
}

#[cfg(test)]
mod tests;
