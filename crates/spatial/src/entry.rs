//! What the shards' trees hold: point and part entries, their boxes, and the trees' node
//! sizes; shared by the shard and its point buckets and grid.

use std::sync::Arc;

use rstar::{AABB, RStarInsertionStrategy, RTreeObject, RTreeParams};

use super::FeatureId;
use super::pip::BBox;
use super::predicate::Shape;

/// Node sizes tuned for read-mostly use: wider nodes make a shallower tree.
pub(crate) struct Params;

impl RTreeParams for Params {
    const MIN_SIZE: usize = 4;
    const MAX_SIZE: usize = 12;
    const REINSERTION_COUNT: usize = 3;
    type DefaultInsertionStrategy = RStarInsertionStrategy;
}

/// 20 bytes, not 24: four-byte aligned, the arenas hold millions. Plain data (`Pod`): a saved
/// view's arena is used in place.
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, packed(4))]
pub(crate) struct PointEntry {
    pub xy: [f64; 2],
    pub id: FeatureId,
}

const _: () = assert!(std::mem::size_of::<PointEntry>() == 20);

impl RTreeObject for PointEntry {
    type Envelope = AABB<[f64; 2]>;
    fn envelope(&self) -> Self::Envelope {
        AABB::from_point(self.xy)
    }
}

/// Part number of an entry that stands for a whole shape (a line, or an envelope entry).
pub(crate) const WHOLE: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub(crate) struct PartEntry {
    pub bbox: BBox,
    pub shape: Arc<Shape>,
    /// Index into `shape.parts`, or [`WHOLE`].
    pub part: u32,
    pub id: FeatureId,
}

impl PartialEq for PartEntry {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.part == other.part && Arc::ptr_eq(&self.shape, &other.shape)
    }
}

impl RTreeObject for PartEntry {
    type Envelope = AABB<[f64; 2]>;
    fn envelope(&self) -> Self::Envelope {
        AABB::from_corners([self.bbox[0], self.bbox[1]], [self.bbox[2], self.bbox[3]])
    }
}

/// The box holding both.
pub fn union(a: BBox, b: BBox) -> BBox {
    [
        a[0].min(b[0]),
        a[1].min(b[1]),
        a[2].max(b[2]),
        a[3].max(b[3]),
    ]
}

pub(crate) fn aabb(b: &BBox) -> AABB<[f64; 2]> {
    AABB::from_corners([b[0], b[1]], [b[2], b[3]])
}
