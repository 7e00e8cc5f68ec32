//! One shard: R-trees over the features whose cells the shard owns.
//!
//! - `points`: point features (and each point of a multipoint), 24 bytes each, in buckets
//!   (see [`super::buckets`]).
//! - `parts`: polygon bands and whole lines, each referring to its shared [`super::predicate::Shape`].
//! - `envelopes`: the whole bounding box of each polygon, for `envelope-intersects` only.
//! - `grid`: the parts again, in a uniform grid for point probes (see [`super::grid`]).

use std::ops::ControlFlow;

use rstar::{AABB, RTree};

use super::FeatureId;
use super::buckets::PointIndex;
use super::entry::{Params, PartEntry, PointEntry, aabb, union};
use super::grid::PartGrid;
use super::pip::{BBox, Location};

#[derive(Default)]
pub(crate) struct ShardIndex {
    pub points: PointIndex,
    parts: RTree<PartEntry, Params>,
    pub envelopes: RTree<PartEntry, Params>,
    /// Built with each bulk load; kept up to date by single inserts and removals, and
    /// dropped when inserts make it slower than the R-tree.
    grid: Option<PartGrid>,
}

impl ShardIndex {
    pub fn new() -> ShardIndex {
        ShardIndex {
            points: PointIndex::default(),
            parts: RTree::new_with_params(),
            envelopes: RTree::new_with_params(),
            grid: None,
        }
    }

    /// Rebuild with the current entries plus `points`/`parts`/`envelopes`, by bulk loading.
    pub(crate) fn rebuilt_with(
        &self,
        mut points: Vec<PointEntry>,
        mut parts: Vec<PartEntry>,
        mut envelopes: Vec<PartEntry>,
    ) -> ShardIndex {
        points.extend(self.points.iter().copied());
        parts.extend(self.parts.iter().cloned());
        envelopes.extend(self.envelopes.iter().cloned());
        ShardIndex {
            points: PointIndex::bulk(points),
            grid: PartGrid::build(&parts),
            parts: RTree::bulk_load_with_params(parts),
            envelopes: RTree::bulk_load_with_params(envelopes),
        }
    }

    pub(crate) fn insert_part(&mut self, e: PartEntry) {
        if let Some(g) = &mut self.grid {
            g.insert(e.clone());
        }
        self.parts.insert(e);
        self.refresh_grid();
    }

    pub(crate) fn remove_part(&mut self, e: &PartEntry) {
        if let Some(g) = &mut self.grid {
            g.remove(e);
        }
        self.parts.remove(e);
        self.refresh_grid();
    }

    /// Rebuilds the grid from the R-tree's parts when changes since its build call for it
    /// (see [`PartGrid::stale`]); a grid that cannot be rebuilt is dropped until the next
    /// bulk load.
    fn refresh_grid(&mut self) {
        if self.grid.as_ref().is_some_and(PartGrid::stale) {
            let parts: Vec<PartEntry> = self.parts.iter().cloned().collect();
            self.grid = PartGrid::build(&parts);
        }
    }

    /// Point features exactly at `(x, y)`.
    #[inline]
    pub(crate) fn points_at(&self, x: f64, y: f64, f: impl FnMut(FeatureId)) {
        self.points.at(x, y, f);
    }

    /// Parts whose box contains `(x, y)`, with the point's location in the part when the
    /// grid knows it already. Parts the point is known to be exterior to may be left out.
    #[inline]
    pub(crate) fn parts_at<'a>(
        &'a self,
        x: f64,
        y: f64,
        mut f: impl FnMut(FeatureId, &'a PartEntry, Option<Location>),
    ) {
        if let Some(g) = &self.grid {
            return g.probe(x, y, f);
        }
        let _ = self
            .parts
            .locate_in_envelope_intersecting_int(AABB::from_point([x, y]), |e| {
                f(e.id, e, None);
                ControlFlow::<()>::Continue(())
            });
    }

    pub(crate) fn points_in<'a>(&'a self, b: &BBox, f: impl FnMut(&'a PointEntry)) {
        self.points.within(b, f);
    }

    pub(crate) fn parts_in<'a>(
        &'a self,
        b: &BBox,
        envelopes: bool,
        mut f: impl FnMut(&'a PartEntry),
    ) {
        let tree = if envelopes {
            &self.envelopes
        } else {
            &self.parts
        };
        let _ = tree.locate_in_envelope_intersecting_int(aabb(b), |e| {
            f(e);
            ControlFlow::<()>::Continue(())
        });
    }

    /// A box holding every entry of the shard, or `None` when it is empty.
    pub fn bounds(&self) -> Option<BBox> {
        let parts = (self.parts.size() > 0).then(|| super::buckets::bbox_of(&self.parts));
        let envelopes =
            (self.envelopes.size() > 0).then(|| super::buckets::bbox_of(&self.envelopes));
        [self.points.bounds(), parts, envelopes]
            .into_iter()
            .flatten()
            .reduce(union)
    }

    pub fn len(&self) -> (usize, usize, usize) {
        (self.points.len(), self.parts.size(), self.envelopes.size())
    }
}
