//! geoshard: a sharded spatial engine behind a document and feature-service REST contract.
//!
//! The engine lives in the workspace's crates, one job each; their arrows point one way,
//! from `node` at the top to `core` at the bottom (ARCHITECTURE.md draws the map). This
//! crate is the `geoshard` binary, and names those crates as modules for the binary, the
//! tests, the benches and the fuzz targets.

#![forbid(unsafe_code)]

pub use geoshard_auth as security;
pub use geoshard_cluster as cluster;
pub use geoshard_config as config;
pub use geoshard_core::{FastMap, acl, cpu, error, metrics, secret, time};
pub use geoshard_features as features;
pub use geoshard_flow as flow;
pub use geoshard_http as http;
pub use geoshard_load as load;
pub use geoshard_node as node;
pub use geoshard_node::{demo, service};
pub use geoshard_spatial as spatial;
pub use geoshard_store as store;

#[doc(hidden)]
pub mod fuzzing;

/// mimalloc for every binary, test and bench that links the crate: the request path
/// allocates small short-lived buffers, where it beats the system allocator. Through
/// `geoshard-alloc`, which calls mimalloc's plain entry points where the `mimalloc` crate
/// would call the slower `_aligned` ones.
#[global_allocator]
static GLOBAL: geoshard_alloc::MiMalloc = geoshard_alloc::MiMalloc;
