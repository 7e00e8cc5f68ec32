//! The spatial engine: features (an id and a geometry) partitioned by H3 cell across shards
//! with per-shard R-trees, and exact predicates on top. Knows nothing of documents or HTTP.
//!
//! - [`geometry`]: GeoJSON <-> `geo` types, validation with the place of the fault.
//! - [`pip`]: exact point location with striped, banded edge indexes.
//! - [`predicate`]: relations (intersects, contains, ...), prepared shapes and queries.
//! - [`partition`]: H3 cells -> shards; the cover of a box.
//! - [`shard`]: one shard's R-trees; [`buckets`]: its point leaf level; [`grid`]: its
//!   point-probe grid over polygon parts.
//! - [`engine`]: insert/remove/bulk load, point and region queries, the async bridge.

#![forbid(unsafe_code)]

// Sibling crates under the module names the code uses.
use geoshard_core::FastMap;

pub mod buckets;
pub mod distance;
pub mod engine;
pub mod entry;
pub mod geometry;
pub mod grid;
pub mod partition;
pub mod pip;
pub mod predicate;
pub mod saved;
pub mod shard;
pub mod tile;

/// A feature's id in one engine. Dense ids keep the engine's registry small.
pub(crate) type FeatureId = u32;

pub use engine::{Engine, EngineConfig, PastDeadline};
pub use geometry::{GeometryError, ParseOptions, parse_geojson, parse_geojson_with, to_geojson};
pub use pip::Location;
pub use predicate::{Query, Relation, Shape};
