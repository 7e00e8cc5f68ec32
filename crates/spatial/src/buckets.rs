//! The point index of one shard: every point stored once, reached by range or by value.
//!
//! - An arena holds the entries (coordinates and id, 24 bytes), in Hilbert-curve order after
//!   a bulk load, so neighbouring points sit together in memory.
//! - A bulk load (or a saved view read back) is the arena's base: a packed Hilbert R-tree
//!   over it, as flatbush builds one: one box a bucket of [`BULK_FILL`] consecutive slots,
//!   then one box a [`BULK_FILL`] boxes below, up to one. Its boxes are an array, so a saved
//!   one is used in place with no build. It never changes: a base point removed leaves a
//!   dead slot under its box, which only costs some filtering until the next bulk load.
//! - Points inserted after it go to slots past the base, in buckets of up to [`SPLIT_AT`]
//!   slots that form the leaf level of an rstar R-tree. An rstar entry costs as much as an
//!   internal node (~64 bytes) however small the object, so the tree indexes buckets, not
//!   points. An insert joins a bucket whose box holds it, else the nearest bucket
//!   (splitting it on its longer axis when full); a removal takes the slot out of its bucket
//!   and drops the bucket when empty.
//! - Exact-point lookups (a point query on a point layer) do not walk the tree: an
//!   open-addressing table of arena slots, keyed by the exact coordinates, answers in one or
//!   two cache misses, where a walk over a million points costs several. Several features at one location are just further probes.

use std::ops::ControlFlow;
use std::sync::Arc;

use geoshard_paged::{Mapping, Paged, align8, pad8, usize_at};
use rstar::{AABB, PointDistance, RTree, RTreeObject};

use super::FeatureId;
use super::entry::{Params, PointEntry, aabb};
use super::pip::{BBox, bbox_contains, bbox_intersects};

/// Points per bucket after a bulk load.
pub const BULK_FILL: usize = 16;
/// A bucket this full splits in two on the next insert.
pub const SPLIT_AT: usize = 32;

/// Marks a free arena slot.
const DEAD: FeatureId = FeatureId::MAX;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bucket {
    pub bbox: BBox,
    /// Arena slots.
    pub slots: Vec<u32>,
}

impl RTreeObject for Bucket {
    type Envelope = AABB<[f64; 2]>;
    fn envelope(&self) -> Self::Envelope {
        aabb(&self.bbox)
    }
}

impl PointDistance for Bucket {
    fn distance_2(&self, point: &[f64; 2]) -> f64 {
        self.envelope().distance_2(point)
    }
}

fn bucket(slots: Vec<u32>, arena: &Paged<PointEntry>) -> Bucket {
    let mut bbox = [
        f64::INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NEG_INFINITY,
    ];
    for &s in &slots {
        let p = arena[s as usize].xy;
        bbox[0] = bbox[0].min(p[0]);
        bbox[1] = bbox[1].min(p[1]);
        bbox[2] = bbox[2].max(p[0]);
        bbox[3] = bbox[3].max(p[1]);
    }
    Bucket { bbox, slots }
}

/// Position along a Hilbert curve over the lon/lat plane (2^16 cells a side).
fn hilbert(x: f64, y: f64) -> u64 {
    const N: u32 = 1 << 16;
    let to_grid = |v: f64, lo: f64, span: f64| -> u32 {
        (((v - lo) / span) * (N - 1) as f64).clamp(0.0, (N - 1) as f64) as u32
    };
    let (mut x, mut y) = (to_grid(x, -180.0, 360.0), to_grid(y, -90.0, 180.0));
    let mut d: u64 = 0;
    let mut s = N / 2;
    while s > 0 {
        let rx = u32::from(x & s > 0);
        let ry = u32::from(y & s > 0);
        d += s as u64 * s as u64 * ((3 * rx) ^ ry) as u64;
        if ry == 0 {
            if rx == 1 {
                x = N - 1 - x;
                y = N - 1 - y;
            }
            std::mem::swap(&mut x, &mut y);
        }
        s /= 2;
    }
    d
}

/// Hash of exact coordinates; `+ 0.0` makes -0.0 and 0.0 one key, as `==` has them.
#[inline]
fn coord_hash(xy: [f64; 2]) -> u64 {
    let a = (xy[0] + 0.0).to_bits();
    let b = (xy[1] + 0.0).to_bits();
    let h = (a.rotate_left(29) ^ b).wrapping_mul(0x9e3779b97f4a7c15);
    h ^ (h >> 31)
}

const EMPTY: u32 = u32::MAX;
const TOMB: u32 = u32::MAX - 1;

/// Open addressing (linear probing) over arena slots, keyed by the slot's coordinates.
#[derive(Default)]
struct ExactTable {
    /// Arena slot, [`EMPTY`] or [`TOMB`]; length a power of two (or zero).
    table: Paged<u32>,
    /// Live entries plus tombstones: what the probe lengths depend on.
    used: usize,
    live: usize,
}

impl ExactTable {
    /// A table for `capacity` entries, at most three quarters full, holding the arena's.
    fn rebuild(&mut self, arena: &Paged<PointEntry>, capacity: usize) {
        let cap = (capacity * 4 / 3 + 1).next_power_of_two().max(16);
        self.table = Paged::from_vec(vec![EMPTY; cap]);
        self.used = 0;
        self.live = 0;
        for (slot, e) in arena.iter().enumerate() {
            if e.id != DEAD {
                self.place(slot as u32, e.xy);
            }
        }
    }

    fn place(&mut self, slot: u32, xy: [f64; 2]) {
        let mask = self.table.len() - 1;
        let mut i = coord_hash(xy) as usize & mask;
        loop {
            let t = self.table[i];
            if t == EMPTY || t == TOMB {
                if t == EMPTY {
                    self.used += 1;
                }
                self.table[i] = slot;
                self.live += 1;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    fn insert(&mut self, slot: u32, arena: &Paged<PointEntry>) {
        if (self.used + 1) * 4 > self.table.len() * 3 {
            // Room for half as many again, so growth is not paid on every few inserts.
            self.rebuild(arena, (self.live + 1) * 3 / 2);
            // `rebuild` placed every live arena slot, this one included.
            return;
        }
        self.place(slot, arena[slot as usize].xy);
    }

    fn remove(&mut self, slot: u32, xy: [f64; 2]) {
        if let Some((i, _)) = self.probe(xy).find(|&(_, t)| t == slot) {
            self.table[i] = TOMB;
            self.live -= 1;
        }
    }

    /// The positions a lookup of `xy` visits and what each holds, from its home position up
    /// to (not including) the first empty one; nothing for an empty table.
    #[inline]
    fn probe(&self, xy: [f64; 2]) -> Probe<'_> {
        let mask = self.table.len().wrapping_sub(1);
        Probe {
            table: &self.table,
            i: coord_hash(xy) as usize & mask,
            mask,
        }
    }

    #[inline]
    fn for_each_at(
        &self,
        xy: [f64; 2],
        arena: &Paged<PointEntry>,
        mut f: impl FnMut(u32, &PointEntry),
    ) {
        for (_, s) in self.probe(xy) {
            // A slot past the arena is never written; a damaged saved table is not trusted.
            let Some(e) = arena.get(s as usize) else {
                continue;
            };
            if e.xy[0] == xy[0] && e.xy[1] == xy[1] {
                f(s, e);
            }
        }
    }
}

/// Linear probing from a home position: `(position, slot)` until an [`EMPTY`] one.
struct Probe<'t> {
    table: &'t Paged<u32>,
    i: usize,
    mask: usize,
}

impl Iterator for Probe<'_> {
    type Item = (usize, u32);

    #[inline]
    fn next(&mut self) -> Option<(usize, u32)> {
        let i = self.i;
        let t = *self.table.get(i)?;
        if t == EMPTY {
            return None;
        }
        self.i = (i + 1) & self.mask;
        Some((i, t))
    }
}

/// Boxes a level of a packed tree over `n` slots has, from the buckets up to the root.
fn level_sizes(n: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut at = n;
    while at > 0 {
        at = at.div_ceil(BULK_FILL);
        sizes.push(at);
        if at == 1 {
            break;
        }
    }
    sizes
}

/// The packed tree over an arena's first `slots` slots: its boxes, level by level from the
/// buckets up, in one array.
#[derive(Default)]
struct Packed {
    slots: usize,
    boxes: Paged<BBox>,
    /// Where each level starts in `boxes`, and the end.
    levels: Vec<usize>,
}

impl Packed {
    /// The boxes of the tree over `arena`, whose points are all live.
    fn boxes_of(arena: &[PointEntry]) -> Vec<BBox> {
        let sizes = level_sizes(arena.len());
        let mut boxes: Vec<BBox> = Vec::with_capacity(sizes.iter().sum());
        boxes.extend(arena.chunks(BULK_FILL).map(|c| {
            c.iter().fold(EMPTY_BOX, |b, e| {
                let p = e.xy;
                [
                    b[0].min(p[0]),
                    b[1].min(p[1]),
                    b[2].max(p[0]),
                    b[3].max(p[1]),
                ]
            })
        }));
        let mut below = 0;
        for &size in &sizes[..sizes.len().saturating_sub(1)] {
            for c in (below..below + size).step_by(BULK_FILL) {
                let end = (c + BULK_FILL).min(below + size);
                let b = boxes[c..end]
                    .iter()
                    .fold(EMPTY_BOX, |a, b| super::entry::union(a, *b));
                boxes.push(b);
            }
            below += size;
        }
        boxes
    }

    /// The tree over `slots` slots whose boxes ([`Packed::boxes_of`]) are `boxes`; `Err` when
    /// they are not as many as such a tree has.
    fn with(slots: usize, boxes: Paged<BBox>) -> Result<Packed, String> {
        let mut levels = vec![0];
        for size in level_sizes(slots) {
            levels.push(levels.last().expect("a start") + size);
        }
        if *levels.last().expect("an end") != boxes.len() {
            return Err("damaged (a point index's boxes)".into());
        }
        Ok(Packed {
            slots,
            boxes,
            levels,
        })
    }

    /// The root's box, when there are slots.
    fn root(&self) -> Option<BBox> {
        (self.slots > 0).then(|| self.boxes[self.boxes.len() - 1])
    }

    /// Buckets: the lowest level's boxes.
    #[cfg(test)]
    fn buckets(&self) -> usize {
        self.levels.get(1).copied().unwrap_or(0)
    }

    /// Every live slot under a bucket whose box meets `bbox`, with its entry.
    fn visit<'a>(
        &self,
        arena: &'a Paged<PointEntry>,
        bbox: &BBox,
        f: &mut impl FnMut(&'a PointEntry),
    ) {
        if self.slots > 0 {
            self.visit_node(arena, bbox, self.levels.len() - 2, 0, f);
        }
    }

    fn visit_node<'a>(
        &self,
        arena: &'a Paged<PointEntry>,
        bbox: &BBox,
        level: usize,
        i: usize,
        f: &mut impl FnMut(&'a PointEntry),
    ) {
        if !bbox_intersects(&self.boxes[self.levels[level] + i], bbox) {
            return;
        }
        let first = i * BULK_FILL;
        if level == 0 {
            for s in first..(first + BULK_FILL).min(self.slots) {
                let Some(p) = arena.get(s) else { return };
                if p.id != DEAD && bbox_contains(bbox, p.xy[0], p.xy[1]) {
                    f(p);
                }
            }
            return;
        }
        let below = self.levels[level] - self.levels[level - 1];
        for c in first..(first + BULK_FILL).min(below) {
            self.visit_node(arena, bbox, level - 1, c, f);
        }
    }
}

const EMPTY_BOX: BBox = [
    f64::INFINITY,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NEG_INFINITY,
];

/// The point index of one shard.
#[derive(Default)]
pub(crate) struct PointIndex {
    /// Every point once; dead slots have id [`DEAD`]. Read back from a saved view, its first
    /// part is that file's.
    arena: Paged<PointEntry>,
    /// The tree over the base: the arena's slots up to `base.slots`.
    base: Packed,
    /// Dead slots past the base, to reuse.
    free: Vec<u32>,
    /// The buckets of the slots past the base.
    tree: RTree<Bucket, Params>,
    exact: ExactTable,
    len: usize,
}

impl PointIndex {
    /// Build from scratch (the caller includes any existing content).
    pub fn bulk(points: Vec<PointEntry>) -> PointIndex {
        let (arena, exact) = packed(points);
        PointIndex::with(arena, exact)
    }

    /// An index whose base is `arena` (in Hilbert order, every point live), with its table.
    fn with(arena: Paged<PointEntry>, exact: ExactTable) -> PointIndex {
        let boxes = Packed::boxes_of(arena.as_slice());
        let base = Packed::with(arena.len(), Paged::from_vec(boxes)).expect("its own boxes");
        PointIndex {
            len: arena.len(),
            arena,
            base,
            free: Vec::new(),
            tree: RTree::new_with_params(),
            exact,
        }
    }

    /// `points` as a saved view keeps them ([`PointIndex::read`]): the arena in Hilbert order,
    /// the exact-point table, then the packed tree's boxes, each eight-aligned. Returns the
    /// ids in arena order.
    pub fn encode(points: Vec<PointEntry>, w: &mut Vec<u8>) -> Vec<FeatureId> {
        let (arena, exact) = packed(points);
        let arena = arena.as_slice();
        for v in [arena.len(), exact.table.len(), exact.used, exact.live] {
            w.extend_from_slice(&(v as u64).to_le_bytes());
        }
        w.extend_from_slice(bytemuck::cast_slice(arena));
        pad8(w);
        w.extend_from_slice(bytemuck::cast_slice(exact.table.as_slice()));
        pad8(w);
        w.extend_from_slice(bytemuck::cast_slice(&Packed::boxes_of(arena)));
        arena.iter().map(|e| e.id).collect()
    }

    /// Where the parts of the index [`PointIndex::encode`] wrote at byte `at` of `b` lie:
    /// its header's (points, table size, table slots used, live), the table's start, the
    /// boxes' start and the byte after them. The table is checked to keep an empty slot,
    /// which every probe ends at.
    fn layout(b: &[u8], at: usize) -> Result<([usize; 4], usize, usize, usize), String> {
        let field = |k: usize| usize_at(b, at + k * 8);
        let (n, cap, used, live) = (field(0)?, field(1)?, field(2)?, field(3)?);
        if !cap.is_power_of_two() || used * 4 > cap * 3 || live > used || live > n {
            return Err("damaged (a point index's table)".into());
        }
        let damaged = || "damaged (a point index's size)".to_string();
        let arena_end = n.checked_mul(20).and_then(|b| b.checked_add(at + 32));
        let table_at = align8(arena_end.ok_or_else(damaged)?);
        let table_end = cap.checked_mul(4).and_then(|b| b.checked_add(table_at));
        let boxes_at = align8(table_end.ok_or_else(damaged)?);
        let boxes: usize = level_sizes(n).iter().sum();
        let end = boxes
            .checked_mul(size_of::<BBox>())
            .and_then(|b| b.checked_add(boxes_at));
        Ok((
            [n, cap, used, live],
            table_at,
            boxes_at,
            end.ok_or_else(damaged)?,
        ))
    }

    /// The byte after the index [`PointIndex::encode`] wrote at byte `at` of `b`.
    pub fn end_of(b: &[u8], at: usize) -> Result<usize, String> {
        Ok(PointIndex::layout(b, at)?.3)
    }

    /// The index [`PointIndex::encode`] wrote at byte `at` of `map`, its arrays used in place;
    /// returns it and the byte after it.
    pub fn read(map: &Arc<Mapping>, at: usize) -> Result<(PointIndex, usize), String> {
        let ([n, cap, used, live], table_at, boxes_at, end) = PointIndex::layout(map.bytes(), at)?;
        let boxes = level_sizes(n).iter().sum();
        let index = PointIndex {
            arena: Paged::mapped(map, at + 32, n)?,
            base: Packed::with(n, Paged::mapped(map, boxes_at, boxes)?)?,
            free: Vec::new(),
            tree: RTree::new_with_params(),
            exact: ExactTable {
                table: Paged::mapped(map, table_at, cap)?,
                used,
                live,
            },
            len: live,
        };
        Ok((index, end))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub fn buckets(&self) -> usize {
        self.base.buckets() + self.tree.size()
    }

    /// A box holding every point (the union of the buckets': after removals it may be larger
    /// than the points left), or `None` when there are none.
    pub fn bounds(&self) -> Option<BBox> {
        if self.len == 0 {
            return None;
        }
        let delta = (self.tree.size() > 0).then(|| bbox_of(&self.tree));
        match (self.base.root(), delta) {
            (Some(a), Some(b)) => Some(super::entry::union(a, b)),
            (a, b) => a.or(b),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &PointEntry> {
        self.arena.iter().filter(|e| e.id != DEAD)
    }

    /// Add a point; returns its arena slot.
    pub fn insert(&mut self, e: PointEntry) -> u32 {
        debug_assert_ne!(e.id, DEAD);
        let slot = match self.free.pop() {
            Some(s) => {
                self.arena[s as usize] = e;
                s
            }
            None => {
                self.arena.push(e);
                (self.arena.len() - 1) as u32
            }
        };
        self.len += 1;
        self.exact.insert(slot, &self.arena);
        // Inside the box of a bucket with room, the point joins it in place: the box stays,
        // so the tree does not change. Dense data mostly lands here.
        if let Some(b) = self
            .tree
            .locate_in_envelope_intersecting_mut(AABB::from_point(e.xy))
            .find(|b| b.slots.len() + 1 < SPLIT_AT)
        {
            b.slots.push(slot);
            return slot;
        }
        let Some(nearest) = self.tree.nearest_neighbor(e.xy).cloned() else {
            self.tree.insert(bucket(vec![slot], &self.arena));
            return slot;
        };
        // The bucket's box changes, so it leaves the tree and comes back.
        let mut slots = self
            .tree
            .remove(&nearest)
            .map(|b| b.slots)
            .unwrap_or_default();
        slots.push(slot);
        if slots.len() < SPLIT_AT {
            self.tree.insert(bucket(slots, &self.arena));
            return slot;
        }
        // Split on the longer axis at the median.
        let b = bucket(slots, &self.arena);
        let axis = usize::from(b.bbox[3] - b.bbox[1] > b.bbox[2] - b.bbox[0]);
        let mut slots = b.slots;
        let arena = &self.arena;
        slots.sort_by(|p, q| {
            let (a, b) = (arena[*p as usize].xy, arena[*q as usize].xy);
            a[axis].total_cmp(&b[axis])
        });
        let right = slots.split_off(slots.len() / 2);
        self.tree.insert(bucket(slots, &self.arena));
        self.tree.insert(bucket(right, &self.arena));
        slot
    }

    /// Every live point's arena slot and id.
    pub fn slots(&self) -> impl Iterator<Item = (u32, FeatureId)> + '_ {
        self.arena
            .iter()
            .enumerate()
            .filter(|(_, e)| e.id != DEAD)
            .map(|(s, e)| (s as u32, e.id))
    }

    /// Remove one entry; `false` if it was not there.
    pub fn remove(&mut self, e: &PointEntry) -> bool {
        let mut found = None;
        self.exact.for_each_at(e.xy, &self.arena, |s, p| {
            if p.id == e.id && found.is_none() {
                found = Some(s);
            }
        });
        found.is_some_and(|slot| self.remove_at(slot, e.id))
    }

    /// Remove the entry at arena `slot`, when it is `id`'s; `false` if it is not.
    pub fn remove_at(&mut self, slot: u32, id: FeatureId) -> bool {
        let Some(&e) = self.arena.get(slot as usize) else {
            return false;
        };
        if e.id != id || id == DEAD {
            return false;
        }
        self.exact.remove(slot, e.xy);
        if (slot as usize) < self.base.slots {
            // The base's boxes stay; its slots are not reused.
            self.arena[slot as usize].id = DEAD;
            self.len -= 1;
            return true;
        }
        let mut emptied = None;
        let _ = self
            .tree
            .locate_in_envelope_intersecting_int_mut(AABB::from_point(e.xy), |b| {
                if let Some(i) = b.slots.iter().position(|s| *s == slot) {
                    b.slots.swap_remove(i);
                    if b.slots.is_empty() {
                        emptied = Some(b.bbox);
                    }
                    return ControlFlow::Break(());
                }
                ControlFlow::Continue(())
            });
        if let Some(bbox) = emptied {
            self.tree.remove_with_selection_function(EmptyAt(bbox));
        }
        self.arena[slot as usize].id = DEAD;
        self.free.push(slot);
        self.len -= 1;
        true
    }

    /// Ids of the points exactly at `(x, y)`.
    #[inline]
    pub fn at(&self, x: f64, y: f64, mut f: impl FnMut(FeatureId)) {
        self.exact.for_each_at([x, y], &self.arena, |_, e| f(e.id));
    }

    /// Points inside or on `bbox`.
    pub fn within<'a>(&'a self, bbox: &BBox, mut f: impl FnMut(&'a PointEntry)) {
        let arena = &self.arena;
        self.base.visit(arena, bbox, &mut f);
        if self.tree.size() == 0 {
            return;
        }
        let _ = self
            .tree
            .locate_in_envelope_intersecting_int(aabb(bbox), |b| {
                for &s in &b.slots {
                    let Some(p) = arena.get(s as usize) else {
                        continue;
                    };
                    if bbox_contains(bbox, p.xy[0], p.xy[1]) {
                        f(p);
                    }
                }
                ControlFlow::<()>::Continue(())
            });
    }
}

/// `points` sorted along the Hilbert curve, and their exact-point table.
fn packed(mut points: Vec<PointEntry>) -> (Paged<PointEntry>, ExactTable) {
    points.sort_by_cached_key(|p| hilbert(p.xy[0], p.xy[1]));
    let arena = Paged::from_vec(points);
    let mut exact = ExactTable::default();
    exact.rebuild(&arena, arena.len());
    (arena, exact)
}

/// Selects the (one) empty bucket with this box, for removal.
struct EmptyAt(BBox);

impl rstar::SelectionFunction<Bucket> for EmptyAt {
    fn should_unpack_parent(&self, envelope: &AABB<[f64; 2]>) -> bool {
        rstar::Envelope::contains_envelope(envelope, &aabb(&self.0))
    }
    fn should_unpack_leaf(&self, leaf: &Bucket) -> bool {
        leaf.slots.is_empty() && leaf.bbox == self.0
    }
}

/// The root envelope of a non-empty tree, as a box.
pub(crate) fn bbox_of<T: RTreeObject<Envelope = AABB<[f64; 2]>>, P: rstar::RTreeParams>(
    tree: &RTree<T, P>,
) -> BBox {
    let e = tree.root().envelope();
    [e.lower()[0], e.lower()[1], e.upper()[0], e.upper()[1]]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(x: f64, y: f64, id: u32) -> PointEntry {
        PointEntry { xy: [x, y], id }
    }

    #[test]
    fn insert_split_remove_query() {
        let mut idx = PointIndex::default();
        for i in 0..500u32 {
            idx.insert(e((i % 25) as f64, (i / 25) as f64, i));
        }
        assert_eq!(idx.len(), 500);
        assert!(idx.buckets() >= 500 / SPLIT_AT, "{} buckets", idx.buckets());
        let mut got = Vec::new();
        idx.at(3.0, 4.0, |id| got.push(id));
        assert_eq!(got, vec![4 * 25 + 3]);
        let mut n = 0;
        idx.within(&[0.0, 0.0, 4.0, 1.0], |_| n += 1);
        assert_eq!(n, 10);
        for i in 0..500u32 {
            assert!(idx.remove(&e((i % 25) as f64, (i / 25) as f64, i)));
        }
        assert!(!idx.remove(&e(0.0, 0.0, 0)));
        assert_eq!(idx.len(), 0);
        assert_eq!(idx.buckets(), 0, "empty buckets are dropped");
        // Freed slots are reused.
        idx.insert(e(1.0, 1.0, 9));
        assert_eq!(idx.arena.len(), 500);
    }

    #[test]
    fn bulk_then_incremental() {
        let pts: Vec<PointEntry> = (0..1000u32)
            .map(|i| e((i as f64 * 0.37) % 50.0, (i as f64 * 0.11) % 20.0, i))
            .collect();
        let mut idx = PointIndex::bulk(pts.clone());
        assert_eq!(idx.buckets(), 1000usize.div_ceil(BULK_FILL));
        idx.insert(e(1.5, 1.5, 5000));
        for p in &pts {
            let mut hit = false;
            idx.at(p.xy[0], p.xy[1], |id| hit |= id == p.id);
            assert!(hit, "{p:?}");
        }
        let mut got = Vec::new();
        idx.at(1.5, 1.5, |id| got.push(id));
        assert!(got.contains(&5000));
    }

    /// The packed base and the buckets past it answer boxes as a scan of the live points
    /// does, through removals from both and inserts, at sizes that make one to four levels.
    #[test]
    fn packed_base_and_buckets_answer_as_a_scan() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        for n in [1usize, 15, 16, 17, 255, 256, 257, 5000] {
            let mut live: Vec<PointEntry> = (0..n as u32)
                .map(|id| e(next() * 40.0 - 20.0, next() * 30.0 - 15.0, id))
                .collect();
            let mut idx = PointIndex::bulk(live.clone());
            assert_eq!(idx.buckets(), n.div_ceil(BULK_FILL));
            let check = |idx: &PointIndex, live: &[PointEntry], next: &mut dyn FnMut() -> f64| {
                for _ in 0..40 {
                    let (x, y) = (next() * 44.0 - 22.0, next() * 34.0 - 17.0);
                    let b = [x, y, x + next() * 12.0, y + next() * 9.0];
                    let mut got: Vec<u32> = Vec::new();
                    idx.within(&b, |p| got.push(p.id));
                    got.sort_unstable();
                    let mut want: Vec<u32> = live
                        .iter()
                        .filter(|p| bbox_contains(&b, p.xy[0], p.xy[1]))
                        .map(|p| p.id)
                        .collect();
                    want.sort_unstable();
                    assert_eq!(got, want, "{n} points, box {b:?}");
                }
                assert_eq!(idx.len(), live.len());
                if let Some(bounds) = idx.bounds() {
                    assert!(
                        live.iter()
                            .all(|p| bbox_contains(&bounds, p.xy[0], p.xy[1]))
                    );
                }
            };
            check(&idx, &live, &mut next);
            // A third of the base removed, then new points (some reusing freed delta slots).
            let gone: Vec<PointEntry> = live.iter().copied().step_by(3).collect();
            for p in &gone {
                assert!(idx.remove(p));
                assert!(!idx.remove(p));
            }
            live.retain(|p| !gone.contains(p));
            for id in 0..(n as u32 / 2 + 1) {
                let p = e(next() * 40.0 - 20.0, next() * 30.0 - 15.0, 100_000 + id);
                idx.insert(p);
                live.push(p);
            }
            let moved: Vec<PointEntry> = live.iter().copied().skip(1).step_by(4).collect();
            for p in &moved {
                assert!(idx.remove(p));
            }
            live.retain(|p| !moved.contains(p));
            check(&idx, &live, &mut next);
        }
    }

    #[test]
    fn shared_locations() {
        let mut idx = PointIndex::default();
        for id in 0..5 {
            idx.insert(e(-0.0, 1.0, id));
        }
        let mut got = Vec::new();
        idx.at(0.0, 1.0, |id| got.push(id));
        got.sort();
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        for id in [0, 2, 4, 1] {
            assert!(idx.remove(&e(-0.0, 1.0, id)));
        }
        let mut got = Vec::new();
        idx.at(0.0, 1.0, |id| got.push(id));
        assert_eq!(got, vec![3]);
        let bulk = PointIndex::bulk(vec![e(2.0, 2.0, 7), e(2.0, 2.0, 8), e(3.0, 3.0, 9)]);
        let mut got = Vec::new();
        bulk.at(2.0, 2.0, |id| got.push(id));
        got.sort();
        assert_eq!(got, vec![7, 8]);
    }

    #[test]
    fn table_survives_growth_and_tombstones() {
        let mut idx = PointIndex::default();
        for round in 0..5u32 {
            for i in 0..300u32 {
                idx.insert(e(i as f64, round as f64, round * 1000 + i));
            }
            for i in (0..300u32).step_by(2) {
                assert!(idx.remove(&e(i as f64, round as f64, round * 1000 + i)));
            }
        }
        for round in 0..5u32 {
            for i in 0..300u32 {
                let mut got = Vec::new();
                idx.at(i as f64, round as f64, |id| got.push(id));
                let want = if i % 2 == 1 {
                    vec![round * 1000 + i]
                } else {
                    vec![]
                };
                assert_eq!(got, want);
            }
        }
        assert_eq!(idx.len(), 5 * 150);
    }

    #[test]
    fn hilbert_endpoints() {
        assert_ne!(hilbert(0.0, 0.0), hilbert(180.0, 90.0));
        assert_eq!(hilbert(-180.0, -90.0), 0);
    }
}
