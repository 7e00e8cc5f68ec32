//! The engine: features partitioned by H3 cell across shards, each with its R-trees, and the
//! query paths over them.
//!
//! - A point query computes its cell, visits that one shard on the calling thread, and tests
//!   the candidates exactly. No thread hop, no allocation beyond the answer.
//! - A region query covers its box with cells, groups them by shard, collects candidates from
//!   those shards in parallel on rayon, de-duplicates shapes referenced from several shards,
//!   and runs the exact tests in parallel, stopping at a deadline when it is given one
//!   ([`Engine::query_within`]).
//! - A distance query ([`Engine::query_distance`]) takes the candidates of a box that holds the
//!   distance and measures each on the ellipsoid ([`super::distance`]).
//! - Writers take one engine-wide lock (one writer at a time) and each shard's write lock only
//!   for the moment of the change; bulk loads build new trees outside the lock and swap them
//!   in. Readers hold a shard's read lock for one query.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use geo::Geometry;
use geoshard_paged::Paged;
use parking_lot::{Mutex, RwLock};
use rayon::prelude::*;

use super::FeatureId;
use super::entry::{PartEntry, PointEntry, WHOLE};
use super::partition::Partitioner;
use super::pip::Location;
use super::predicate::{Query, Relation, Shape, point_fast_path};
use super::shard::ShardIndex;

/// What the engine indexes for one id: enough to find and remove it.
#[derive(Debug, Clone, Default)]
enum Slot {
    #[default]
    Empty,
    Point([f64; 2]),
    MultiPoint(Arc<[[f64; 2]]>),
    Shape(Arc<Shape>),
}

/// What each id has indexed, to remove it: a point by where it sits (its shard, and its slot
/// in that shard's point arena: six bytes, not its coordinates again), any other geometry in
/// a map.
#[derive(Default)]
struct Registry {
    /// Per id: its point's arena slot, [`NO_POINT`], or [`PENDING`]. Read back from a saved
    /// view, their first part is that file's.
    point_slot: Paged<u32>,
    point_shard: Paged<u16>,
    others: crate::FastMap<FeatureId, Slot>,
    len: usize,
}

/// The id has no point of its own (nothing, or another geometry).
pub(crate) const NO_POINT: u32 = u32::MAX;
/// A point of a bulk load: its slot is known once its shard is rebuilt.
const PENDING: u32 = u32::MAX - 1;

/// What an id had.
enum Held {
    Nothing,
    Point { shard: usize, slot: u32 },
    Other(Slot),
}

impl Registry {
    fn len(&self) -> usize {
        self.len
    }

    fn reserve(&mut self, top: FeatureId) {
        if self.point_slot.len() <= top as usize {
            self.point_slot.resize(top as usize + 1, NO_POINT);
            self.point_shard.resize(top as usize + 1, 0);
        }
    }

    /// Take out what `id` has.
    fn take(&mut self, id: FeatureId) -> Held {
        let i = id as usize;
        let held = match self.point_slot.get(i).copied() {
            Some(slot) if slot != NO_POINT => {
                self.point_slot[i] = NO_POINT;
                Held::Point {
                    shard: self.point_shard[i] as usize,
                    slot,
                }
            }
            _ => match self.others.remove(&id) {
                None | Some(Slot::Empty) => Held::Nothing,
                Some(other) => Held::Other(other),
            },
        };
        if !matches!(held, Held::Nothing) {
            self.len -= 1;
        }
        held
    }

    /// `id`'s point is at `slot` of `shard`; `id` must have nothing now.
    fn put_point(&mut self, id: FeatureId, shard: usize, slot: u32) {
        self.reserve(id);
        self.point_slot[id as usize] = slot;
        self.point_shard[id as usize] = shard as u16;
        self.len += 1;
    }

    /// `id` has a geometry other than a point; it must have nothing now.
    fn put_other(&mut self, id: FeatureId, slot: Slot) {
        if matches!(slot, Slot::Empty) {
            return;
        }
        self.others.insert(id, slot);
        self.len += 1;
    }

    /// After a rebuild of `shard`: its point arena holds `id` at `slot`. An id of the bulk
    /// load ([`PENDING`]) learns its shard; a point already there moved; the entries of a
    /// multipoint are not the registry's.
    fn placed(&mut self, id: FeatureId, shard: u16, slot: u32) {
        let i = id as usize;
        match self.point_slot.get(i).copied() {
            Some(PENDING) => {
                self.point_slot[i] = slot;
                self.point_shard[i] = shard;
            }
            Some(s) if s != NO_POINT && self.point_shard[i] == shard => self.point_slot[i] = slot,
            _ => {}
        }
    }
}

/// `items` with each id once: the last geometry given for it, as inserts one after another
/// would leave. Unchanged (no copy) when no id repeats.
fn last_of_each(items: Vec<(FeatureId, Geometry<f64>)>) -> Vec<(FeatureId, Geometry<f64>)> {
    let top = items.iter().map(|(id, _)| *id as usize).max().unwrap_or(0);
    let mut seen = vec![0u64; top / 64 + 1];
    let mut repeats = false;
    for (id, _) in items.iter().rev() {
        let (w, bit) = (*id as usize / 64, 1u64 << (*id % 64));
        repeats |= seen[w] & bit != 0;
        seen[w] |= bit;
    }
    if !repeats {
        return items;
    }
    seen.iter_mut().for_each(|w| *w = 0);
    let mut kept: Vec<(FeatureId, Geometry<f64>)> = items
        .into_iter()
        .rev()
        .filter(|(id, _)| {
            let (w, bit) = (*id as usize / 64, 1u64 << (*id % 64));
            let first = seen[w] & bit == 0;
            seen[w] |= bit;
            first
        })
        .collect();
    kept.reverse();
    kept
}

/// A region query given up at its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PastDeadline;

/// Settings of one engine.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    pub shards: usize,
    pub resolution: u8,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            shards: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            resolution: 3,
        }
    }
}

/// New entries for one shard, in a bulk load.
#[derive(Default)]
struct ShardBatch {
    points: Vec<PointEntry>,
    parts: Vec<PartEntry>,
    envelopes: Vec<PartEntry>,
}

/// What one shard contributes to a region query: matching point ids, and candidate shapes
/// still to be tested exactly.
type ShardCandidates = (Vec<FeatureId>, Vec<(FeatureId, Arc<Shape>)>);

/// Entries of one feature, by shard.
#[derive(Default)]
struct Built {
    points: Vec<(usize, PointEntry)>,
    parts: Vec<(usize, PartEntry)>,
    envelopes: Vec<(usize, PartEntry)>,
}

/// A feature's geometry as the index holds it, shared.
#[derive(Debug, Clone)]
pub enum Indexed {
    Shape(Arc<Shape>),
    Points(Arc<[[f64; 2]]>),
}

/// Which ids a query may consider at all (a caller's readable rows): asked before any
/// exact test.
pub type Admit<'a> = &'a (dyn Fn(FeatureId) -> bool + Sync);

pub struct Engine {
    partitioner: Partitioner,
    shards: Box<[RwLock<ShardIndex>]>,
    /// Id -> what is indexed; its lock also makes writers take turns.
    registry: Mutex<Registry>,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Result<Engine, String> {
        if config.shards > u16::MAX as usize + 1 {
            return Err(format!("at most {} shards", u16::MAX as usize + 1));
        }
        let partitioner = Partitioner::new(config.resolution, config.shards)?;
        let shards = (0..config.shards)
            .map(|_| RwLock::new(ShardIndex::new()))
            .collect();
        Ok(Engine {
            partitioner,
            shards,
            registry: Mutex::new(Registry::default()),
        })
    }

    /// An engine over points alone, whose shards' point indexes were read back
    /// ([`super::saved`]) with the registry's arrays (a slot and a shard an id), holding `len`
    /// points. Nothing is built: the arrays are used as they are.
    pub(crate) fn from_point_shards(
        config: EngineConfig,
        shards: Vec<super::buckets::PointIndex>,
        (point_slot, point_shard): (Paged<u32>, Paged<u16>),
    ) -> Result<Engine, String> {
        let engine = Engine::new(config)?;
        if shards.len() != engine.shards.len() || point_slot.len() != point_shard.len() {
            return Err("damaged (shards not the engine's)".into());
        }
        let len = shards.iter().map(|s| s.len()).sum();
        for (s, points) in shards.into_iter().enumerate() {
            engine.shards[s].write().points = points;
        }
        *engine.registry.lock() = Registry {
            point_slot,
            point_shard,
            others: Default::default(),
            len,
        };
        Ok(engine)
    }

    /// Features indexed.
    pub fn len(&self) -> usize {
        self.registry.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A box `[xmin, ymin, xmax, ymax]` holding every feature, or `None` when there are
    /// none. Removals may leave it larger than the features left until the next bulk load.
    pub fn extent(&self) -> Option<super::pip::BBox> {
        self.shards
            .iter()
            .filter_map(|s| s.read().bounds())
            .reduce(super::entry::union)
    }

    /// A box holding every feature that `admit` takes, or `None` when there is none: a walk
    /// of every entry, for callers who may read only some of the features.
    pub fn extent_admitted(&self, admit: Admit<'_>) -> Option<super::pip::BBox> {
        self.shards
            .par_iter()
            .filter_map(|s| {
                let idx = s.read();
                // Every entry of the shard lies within its bounds.
                let all = idx.bounds()?;
                let mut out: Option<super::pip::BBox> = None;
                let mut add = |b: super::pip::BBox| {
                    out = Some(out.map_or(b, |o| super::entry::union(o, b)));
                };
                idx.points_in(&all, |e| {
                    if admit(e.id) {
                        add([e.xy[0], e.xy[1], e.xy[0], e.xy[1]]);
                    }
                });
                idx.parts_in(&all, true, |e| {
                    if admit(e.id) {
                        add(e.shape.bbox);
                    }
                });
                out
            })
            .reduce_with(super::entry::union)
    }

    /// What is indexed for `id` when it is not a single point: its prepared shape, or a
    /// multipoint's positions (a point's coordinates are its view's).
    pub fn indexed(&self, id: FeatureId) -> Option<Indexed> {
        match self.registry.lock().others.get(&id)? {
            Slot::Shape(shape) => Some(Indexed::Shape(shape.clone())),
            Slot::MultiPoint(points) => Some(Indexed::Points(points.clone())),
            Slot::Point(_) | Slot::Empty => None,
        }
    }

    /// Entries per shard: (points, parts, envelopes).
    pub fn shard_sizes(&self) -> Vec<(usize, usize, usize)> {
        self.shards.iter().map(|s| s.read().len()).collect()
    }

    /// What to keep for a geometry: points inline, anything else as a prepared shape.
    fn slot_for(geometry: Geometry<f64>) -> Slot {
        match geometry {
            // Never stored: parsing refuses coordinates that are not finite.
            Geometry::Point(pt) if pt.x().is_nan() || pt.y().is_nan() => Slot::Empty,
            Geometry::Point(pt) => Slot::Point([pt.x(), pt.y()]),
            Geometry::MultiPoint(mp) => {
                let mut pts: Vec<[f64; 2]> = mp.0.iter().map(|p| [p.x(), p.y()]).collect();
                pts.sort_by(|a, b| a[0].total_cmp(&b[0]).then(a[1].total_cmp(&b[1])));
                pts.dedup();
                Slot::MultiPoint(pts.into())
            }
            other => Shape::new(other).map_or(Slot::Empty, |s| Slot::Shape(Arc::new(s))),
        }
    }

    /// The entries a slot puts in the shards. Partitioning is deterministic, so removal
    /// recomputes them instead of remembering them.
    fn entries(&self, id: FeatureId, slot: &Slot) -> Built {
        let mut b = Built::default();
        let p = &self.partitioner;
        let point = |xy: &[f64; 2]| (p.shard_of_point(xy[0], xy[1]), PointEntry { xy: *xy, id });
        match slot {
            Slot::Empty => {}
            Slot::Point(xy) => b.points.push(point(xy)),
            Slot::MultiPoint(pts) => b.points.extend(pts.iter().map(point)),
            Slot::Shape(shape) => {
                let entry = |bbox, part| PartEntry {
                    bbox,
                    shape: shape.clone(),
                    part,
                    id,
                };
                if shape.is_polygonal() {
                    for (i, part) in shape.parts.iter().enumerate() {
                        for s in p.shards_for_bbox(&part.bbox).iter() {
                            b.parts.push((s, entry(part.bbox, i as u32)));
                        }
                    }
                }
                for s in p.shards_for_bbox(&shape.bbox).iter() {
                    if !shape.is_polygonal() {
                        b.parts.push((s, entry(shape.bbox, WHOLE)));
                    }
                    b.envelopes.push((s, entry(shape.bbox, WHOLE)));
                }
            }
        }
        b
    }

    fn remove_locked(&self, registry: &mut Registry, id: FeatureId) -> bool {
        let old = match registry.take(id) {
            Held::Nothing => return false,
            Held::Point { shard, slot } => {
                self.shards[shard].write().points.remove_at(slot, id);
                return true;
            }
            Held::Other(old) => old,
        };
        let b = self.entries(id, &old);
        for (s, e) in b.points {
            self.shards[s].write().points.remove(&e);
        }
        for (s, e) in b.parts {
            self.shards[s].write().remove_part(&e);
        }
        for (s, e) in b.envelopes {
            self.shards[s].write().envelopes.remove(&e);
        }
        true
    }

    fn apply(&self, b: Built) {
        for (s, e) in b.points {
            self.shards[s].write().points.insert(e);
        }
        for (s, e) in b.parts {
            self.shards[s].write().insert_part(e);
        }
        for (s, e) in b.envelopes {
            self.shards[s].write().envelopes.insert(e);
        }
    }

    /// Index a feature, replacing whatever the id had. The geometry must be valid (see
    /// [`super::geometry::parse_geojson`]).
    pub fn insert(&self, id: FeatureId, geometry: Geometry<f64>) {
        let slot = Self::slot_for(geometry);
        let built = self.entries(id, &slot);
        let mut registry = self.registry.lock();
        self.remove_locked(&mut registry, id);
        match (&slot, built.points.first()) {
            (Slot::Point(_), Some(&(s, e))) => {
                let at = self.shards[s].write().points.insert(e);
                registry.put_point(id, s, at);
            }
            _ => {
                registry.put_other(id, slot);
                self.apply(built);
            }
        }
    }

    /// Remove a feature; `false` if the id had nothing.
    pub fn remove(&self, id: FeatureId) -> bool {
        let mut registry = self.registry.lock();
        self.remove_locked(&mut registry, id)
    }

    /// Index many features at once: entries are built in parallel and each shard's trees are
    /// bulk-loaded (existing entries included) and swapped in. Replaces existing ids.
    pub fn bulk_load(&self, items: Vec<(FeatureId, Geometry<f64>)>) {
        let items = last_of_each(items);
        let slots: Vec<(FeatureId, Slot)> = items
            .into_par_iter()
            .map(|(id, g)| (id, Self::slot_for(g)))
            .collect();
        // Each rayon task sorts its entries by shard; points, nearly always one entry a
        // feature, go straight in without a list of their own.
        let shards = self.shards.len();
        let empty = || -> Vec<ShardBatch> { (0..shards).map(|_| ShardBatch::default()).collect() };
        let p = &self.partitioner;
        let batches = slots
            .par_iter()
            .fold(empty, |mut acc, (id, slot)| {
                match slot {
                    Slot::Point(xy) => acc[p.shard_of_point(xy[0], xy[1])]
                        .points
                        .push(PointEntry { xy: *xy, id: *id }),
                    other => {
                        let b = self.entries(*id, other);
                        for (s, e) in b.points {
                            acc[s].points.push(e);
                        }
                        for (s, e) in b.parts {
                            acc[s].parts.push(e);
                        }
                        for (s, e) in b.envelopes {
                            acc[s].envelopes.push(e);
                        }
                    }
                }
                acc
            })
            .reduce(empty, |mut a, b| {
                for (x, y) in a.iter_mut().zip(b) {
                    x.points.extend(y.points);
                    x.parts.extend(y.parts);
                    x.envelopes.extend(y.envelopes);
                }
                a
            });
        let mut registry = self.registry.lock();
        if let Some(top) = slots.iter().map(|(id, _)| *id).max() {
            registry.reserve(top);
        }
        for (id, slot) in slots {
            self.remove_locked(&mut registry, id);
            match slot {
                // Its shard and slot are known once the shards are rebuilt.
                Slot::Point(_) => registry.put_point(id, 0, PENDING),
                other => registry.put_other(id, other),
            }
        }
        // A rebuild puts every point of its shard in a new slot: (id, shard, slot), sorted by
        // id so the registry is written in order.
        let mut placed: Vec<(FeatureId, u16, u32)> = batches
            .into_par_iter()
            .enumerate()
            .flat_map_iter(|(s, b)| {
                if b.points.is_empty() && b.parts.is_empty() && b.envelopes.is_empty() {
                    return Vec::new();
                }
                // Readers keep using the old trees while the new ones are built.
                let fresh = self.shards[s]
                    .read()
                    .rebuilt_with(b.points, b.parts, b.envelopes);
                let placed: Vec<(FeatureId, u16, u32)> = fresh
                    .points
                    .slots()
                    .map(|(slot, id)| (id, s as u16, slot))
                    .collect();
                *self.shards[s].write() = fresh;
                placed
            })
            .collect();
        placed.par_sort_unstable_by_key(|p| p.0);
        for (id, shard, slot) in placed {
            registry.placed(id, shard, slot);
        }
    }

    /// The ids of the features that stand in relation `rel` to `q`, ascending and unique.
    pub fn query(&self, q: &Query, rel: Relation) -> Vec<FeatureId> {
        self.query_within(q, rel, None).unwrap_or_default()
    }

    /// [`Engine::query`], given up (`Err`) once `deadline` has passed: the exact tests of a
    /// region query look at the clock every few shapes. A point query, a single shard's
    /// lookup, always finishes.
    pub fn query_within(
        &self,
        q: &Query,
        rel: Relation,
        deadline: Option<Instant>,
    ) -> Result<Vec<FeatureId>, PastDeadline> {
        self.query_admitted(q, rel, deadline, &|_| true)
    }

    /// [`Engine::query_within`] over the ids `admit` takes only: the others are left out
    /// before any exact test, so a feature the caller may not see costs no more than its
    /// box's lookup.
    pub fn query_admitted(
        &self,
        q: &Query,
        rel: Relation,
        deadline: Option<Instant>,
        admit: Admit<'_>,
    ) -> Result<Vec<FeatureId>, PastDeadline> {
        if let Some((x, y)) = q.as_point() {
            return Ok(self.query_point(q, x, y, rel, admit));
        }
        self.query_region(q, rel, deadline, admit)
    }

    fn query_point(
        &self,
        q: &Query,
        x: f64,
        y: f64,
        rel: Relation,
        admit: Admit<'_>,
    ) -> Vec<FeatureId> {
        let shard = self.shards[self.partitioner.shard_of_point(x, y)].read();
        let mut out = Vec::new();
        shard.points_at(x, y, |id| {
            if admit(id) {
                out.push(id)
            }
        });
        if rel == Relation::EnvelopeIntersects {
            shard.parts_in(&[x, y, x, y], true, |e| {
                if admit(e.id) {
                    out.push(e.id)
                }
            });
        } else {
            // Candidates of one id arrive as several parts; combine their locations.
            let mut cands: Vec<(FeatureId, Location, &PartEntry)> = Vec::new();
            shard.parts_at(x, y, |id, e, known| {
                if !admit(id) {
                    return;
                }
                let loc = known.unwrap_or_else(|| {
                    if e.part == WHOLE {
                        e.shape.locate(x, y)
                    } else {
                        e.shape.parts[e.part as usize].locate(x, y)
                    }
                });
                cands.push((id, loc, e));
            });
            if cands.len() > 1 {
                cands.sort_unstable_by_key(|c| (c.0, std::cmp::Reverse(c.1)));
                cands.dedup_by_key(|c| c.0);
            }
            for (id, loc, e) in cands {
                let hit = match point_fast_path(loc, rel) {
                    Some(b) => b,
                    None => q.matches_shape(&e.shape, rel),
                };
                if hit {
                    out.push(id);
                }
            }
        }
        drop(shard);
        out.sort_unstable();
        out.dedup();
        out
    }

    fn query_region(
        &self,
        q: &Query,
        rel: Relation,
        deadline: Option<Instant>,
        admit: Admit<'_>,
    ) -> Result<Vec<FeatureId>, PastDeadline> {
        let bbox = *q.bbox();
        if bbox[0] > bbox[2] {
            return Ok(Vec::new());
        }
        let stopped = AtomicBool::new(false);
        // Every eighth shape, look at the clock; once past the deadline, every test stops.
        let go_on = |i: usize| {
            if stopped.load(Ordering::Relaxed) {
                return false;
            }
            if i.is_multiple_of(8) && deadline.is_some_and(|d| Instant::now() >= d) {
                stopped.store(true, Ordering::Relaxed);
                return false;
            }
            true
        };
        let cover = self.partitioner.shards_meeting(&bbox);
        let shards: Vec<usize> = cover.iter().collect();
        let envelopes = rel == Relation::EnvelopeIntersects;
        // Phase 1, per shard: points tested at once, shapes collected as candidates.
        let collected: Vec<ShardCandidates> = shards
            .par_iter()
            .map(|&s| {
                let idx = self.shards[s].read();
                let mut ids = Vec::new();
                idx.points_in(&bbox, |e| {
                    if admit(e.id) && q.matches_point(e.xy[0], e.xy[1], rel) {
                        ids.push(e.id);
                    }
                });
                let mut shapes: Vec<(FeatureId, Arc<Shape>)> = Vec::new();
                idx.parts_in(&bbox, envelopes, |e| {
                    if admit(e.id) {
                        shapes.push((e.id, e.shape.clone()))
                    }
                });
                (ids, shapes)
            })
            .collect();
        let mut ids: Vec<FeatureId> = Vec::new();
        let mut shapes: Vec<(FeatureId, Arc<Shape>)> = Vec::new();
        for (i, s) in collected {
            ids.extend(i);
            shapes.extend(s);
        }
        shapes.sort_unstable_by_key(|c| c.0);
        shapes.dedup_by_key(|c| c.0);
        // Phase 2: exact tests, each shape once.
        if envelopes {
            ids.extend(shapes.iter().map(|c| c.0));
        } else if shapes.len() < 64 {
            let prepared = q.prepared();
            ids.extend(
                shapes
                    .iter()
                    .enumerate()
                    .take_while(|(i, _)| go_on(*i))
                    .filter(|(_, c)| prepared.matches_shape(&c.1, rel))
                    .map(|(_, c)| c.0),
            );
        } else {
            // One chunk a thread, each preparing the query once.
            let chunk = shapes.len().div_ceil(rayon::current_num_threads().max(1));
            let hits: Vec<FeatureId> = shapes
                .par_chunks(chunk)
                .flat_map_iter(|part| {
                    let prepared = q.prepared();
                    part.iter()
                        .enumerate()
                        .take_while(|(i, _)| go_on(*i))
                        .filter(|(_, c)| prepared.matches_shape(&c.1, rel))
                        .map(|(_, c)| c.0)
                        .collect::<Vec<_>>()
                })
                .collect();
            ids.extend(hits);
        }
        if stopped.load(Ordering::Relaxed) {
            return Err(PastDeadline);
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// The features within `meters` of `q`'s geometry on the WGS84 ellipsoid (see
    /// [`super::distance`]), ascending and unique; `Err` once `deadline` has passed.
    pub fn query_distance(
        &self,
        q: &Query,
        meters: f64,
        deadline: Option<Instant>,
    ) -> Result<Vec<FeatureId>, PastDeadline> {
        self.query_distance_admitted(q, meters, deadline, &|_| true)
    }

    /// [`Engine::query_distance`] over the ids `admit` takes only, as in
    /// [`Engine::query_admitted`].
    pub fn query_distance_admitted(
        &self,
        q: &Query,
        meters: f64,
        deadline: Option<Instant>,
        admit: Admit<'_>,
    ) -> Result<Vec<FeatureId>, PastDeadline> {
        let qb = *q.bbox();
        if qb[0] > qb[2] {
            return Ok(Vec::new());
        }
        let bbox = super::distance::around(&qb, meters);
        let mut points: Vec<(FeatureId, [f64; 2])> = Vec::new();
        let mut shapes: Vec<(FeatureId, Arc<Shape>)> = Vec::new();
        for s in self.partitioner.shards_meeting(&bbox).iter() {
            let idx = self.shards[s].read();
            idx.points_in(&bbox, |e| {
                if admit(e.id) {
                    points.push((e.id, e.xy))
                }
            });
            idx.parts_in(&bbox, true, |e| {
                if admit(e.id) {
                    shapes.push((e.id, e.shape.clone()))
                }
            });
        }
        shapes.sort_unstable_by_key(|c| c.0);
        shapes.dedup_by_key(|c| c.0);
        // What intersects the query is at distance 0 (the prepared tests of every relation);
        // the rest is measured against the query made once on the sphere.
        let on_sphere = super::distance::Near::new(q.geometry());
        let stopped = AtomicBool::new(false);
        let apart_within = |g: &Geometry<f64>| -> bool {
            if stopped.load(Ordering::Relaxed) {
                return false;
            }
            on_sphere
                .apart_within(g, meters, deadline)
                .unwrap_or_else(|| {
                    stopped.store(true, Ordering::Relaxed);
                    false
                })
        };
        let mut ids: Vec<FeatureId> = points
            .par_iter()
            .filter(|(_, [x, y])| {
                q.matches_point(*x, *y, Relation::Intersects)
                    || apart_within(&Geometry::Point(geo::Point::new(*x, *y)))
            })
            .map(|c| c.0)
            .collect();
        ids.extend(
            shapes
                .par_iter()
                .map_init(
                    || q.prepared(),
                    |prepared, c| {
                        (prepared.matches_shape(&c.1, Relation::Intersects)
                            || apart_within(&c.1.geometry))
                        .then_some(c.0)
                    },
                )
                .flatten()
                .collect::<Vec<_>>(),
        );
        if stopped.load(Ordering::Relaxed) {
            return Err(PastDeadline);
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use geo::{point, polygon};

    /// A region query past its deadline gives up; before it, or without one, it answers as
    /// `query` does; a point query always answers.
    /// Ids left out by `admit` never reach an exact test, and the answer is the unfiltered
    /// one less those ids, for points, regions, envelopes and distances.
    #[test]
    fn admitted_queries_leave_out_what_admit_refuses_before_testing_it() {
        let e = Engine::new(EngineConfig {
            shards: 4,
            resolution: 3,
        })
        .unwrap();
        let mut items: Vec<(FeatureId, Geometry<f64>)> = (0..100u32)
            .map(|i| {
                let (x, y) = (f64::from(i % 10), f64::from(i / 10));
                let p = polygon![(x: x, y: y), (x: x + 0.9, y: y), (x: x + 0.9, y: y + 0.9), (x: x, y: y + 0.9), (x: x, y: y)];
                (i, Geometry::Polygon(p))
            })
            .collect();
        items.extend((101..201u32).map(|i| {
            let (x, y) = (
                f64::from((i - 101) % 10) + 0.5,
                f64::from((i - 101) / 10) + 0.5,
            );
            (i, Geometry::Point(point!(x: x, y: y)))
        }));
        e.bulk_load(items);
        let odd = |id: FeatureId| id % 2 == 1;
        let region = Query::new(Geometry::Polygon(
            polygon![(x: -1., y: -1.), (x: 4.2, y: -1.), (x: 4.2, y: 4.2), (x: -1., y: 4.2), (x: -1., y: -1.)],
        ));
        for rel in [
            Relation::Intersects,
            Relation::EnvelopeIntersects,
            Relation::Contains,
        ] {
            for q in [&region, &Query::point(3.5, 2.5)] {
                let all = e.query(q, rel);
                let want: Vec<FeatureId> = all.iter().copied().filter(|i| odd(*i)).collect();
                assert!(!want.is_empty(), "{rel:?}");
                assert_eq!(
                    e.query_admitted(q, rel, None, &odd).unwrap(),
                    want,
                    "{rel:?}"
                );
            }
        }
        assert!(e.query(&region, Relation::Intersects).len() > 30);
        let all = e
            .query_distance(&Query::point(2.0, 2.0), 200_000.0, None)
            .unwrap();
        let want: Vec<FeatureId> = all.iter().copied().filter(|i| odd(*i)).collect();
        assert!(!want.is_empty() && want.len() < all.len());
        assert_eq!(
            e.query_distance_admitted(&Query::point(2.0, 2.0), 200_000.0, None, &odd)
                .unwrap(),
            want
        );
        // Nothing admitted: nothing tested, nothing found.
        let tested = std::sync::atomic::AtomicUsize::new(0);
        let none = |_: FeatureId| {
            tested.fetch_add(1, Ordering::Relaxed);
            false
        };
        assert!(
            e.query_admitted(&region, Relation::Intersects, None, &none)
                .unwrap()
                .is_empty()
        );
        assert!(tested.load(Ordering::Relaxed) > 0);
        // The extent of the admitted features only: the squares with ids below 12 span
        // x 0..9.9 and y 0..1.9; every feature, 0..9.9 by 0..9.9.
        assert_eq!(e.extent_admitted(&|_| true), Some([0.0, 0.0, 9.9, 9.9]));
        assert_eq!(e.extent_admitted(&|i| i < 12), Some([0.0, 0.0, 9.9, 1.9]));
        assert_eq!(e.extent_admitted(&|i| i == 151), Some([0.5, 5.5, 0.5, 5.5]));
        assert_eq!(e.extent_admitted(&|_| false), None);
    }

    #[test]
    fn a_region_query_stops_at_its_deadline() {
        let e = Engine::new(EngineConfig {
            shards: 2,
            resolution: 3,
        })
        .unwrap();
        let squares: Vec<(FeatureId, Geometry<f64>)> = (0..200u32)
            .map(|i| {
                let (x, y) = (f64::from(i % 20), f64::from(i / 20));
                let p = polygon![(x: x, y: y), (x: x + 0.9, y: y), (x: x + 0.9, y: y + 0.9), (x: x, y: y + 0.9), (x: x, y: y)];
                (i, Geometry::Polygon(p))
            })
            .collect();
        e.bulk_load(squares);
        let region = Query::new(Geometry::Polygon(
            polygon![(x: -1., y: -1.), (x: 30., y: -1.), (x: 30., y: 30.), (x: -1., y: 30.), (x: -1., y: -1.)],
        ));
        let all = e.query(&region, Relation::Intersects);
        assert_eq!(all.len(), 200);
        let past = Instant::now() - std::time::Duration::from_millis(1);
        assert_eq!(
            e.query_within(&region, Relation::Intersects, Some(past)),
            Err(PastDeadline)
        );
        let later = Instant::now() + std::time::Duration::from_secs(60);
        assert_eq!(
            e.query_within(&region, Relation::Intersects, Some(later)),
            Ok(all)
        );
        let point = Query::point(0.5, 0.5);
        assert_eq!(
            e.query_within(&point, Relation::Contains, Some(past)),
            Ok(vec![0])
        );
    }

    #[test]
    fn insert_replace_remove() {
        let e = Engine::new(EngineConfig {
            shards: 4,
            resolution: 3,
        })
        .unwrap();
        e.insert(1, Geometry::Point(point!(x: 10.0, y: 10.0)));
        e.insert(
            2,
            Geometry::Polygon(polygon![(x: 0., y: 0.), (x: 20., y: 0.), (x: 20., y: 20.), (x: 0., y: 20.), (x: 0., y: 0.)]),
        );
        let at = |x: f64, y: f64| e.query(&Query::point(x, y), Relation::Contains);
        assert_eq!(at(10.0, 10.0), vec![1, 2]);
        assert_eq!(at(5.0, 5.0), vec![2]);
        // Replace the polygon with one elsewhere; move the point.
        e.insert(
            2,
            Geometry::Polygon(
                polygon![(x: 30., y: 30.), (x: 40., y: 30.), (x: 40., y: 40.), (x: 30., y: 30.)],
            ),
        );
        e.insert(1, Geometry::Point(point!(x: 35.0, y: 32.0)));
        assert_eq!(at(10.0, 10.0), Vec::<FeatureId>::new());
        assert_eq!(at(35.0, 32.0), vec![1, 2]);
        assert!(e.remove(2));
        assert!(!e.remove(2));
        assert_eq!(at(35.0, 32.0), vec![1]);
        assert_eq!(e.len(), 1);
        let sizes: usize = e.shard_sizes().iter().map(|s| s.0 + s.1 + s.2).sum();
        assert_eq!(sizes, 1, "removal leaves no stray entries");
    }

    #[test]
    fn a_bulk_load_giving_an_id_twice_keeps_the_last() {
        let e = Engine::new(EngineConfig {
            shards: 4,
            resolution: 3,
        })
        .unwrap();
        let square = Geometry::Polygon(
            polygon![(x: 0., y: 0.), (x: 20., y: 0.), (x: 20., y: 20.), (x: 0., y: 20.), (x: 0., y: 0.)],
        );
        e.bulk_load(vec![
            (1, Geometry::Point(point!(x: 10.0, y: 10.0))),
            (2, square),
            (1, Geometry::Point(point!(x: -50.0, y: 40.0))),
            (2, Geometry::Point(point!(x: 5.0, y: 5.0))),
        ]);
        let at = |x: f64, y: f64| e.query(&Query::point(x, y), Relation::Contains);
        assert_eq!(e.len(), 2);
        assert_eq!(at(10.0, 10.0), Vec::<FeatureId>::new());
        assert_eq!(at(-50.0, 40.0), vec![1]);
        assert_eq!(at(5.0, 5.0), vec![2]);
        assert!(e.remove(1) && e.remove(2));
        let sizes: usize = e.shard_sizes().iter().map(|s| s.0 + s.1 + s.2).sum();
        assert_eq!(sizes, 0, "no entry of a repeated id is left behind");
    }
}
