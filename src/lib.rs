//! geoshard: a sharded spatial engine behind a document and feature-service REST contract.
//!
//! # Layout
//!
//! Arrows point one way: `http` -> `features`/`flow`/`security` -> `store`/`spatial`.
//!
//! - [`config`]: one `Config`, defaults < file < `GEOSHARD_*` environment < flags.
//! - [`error`]: the contract's error codes and their HTTP statuses, in one table.
//! - [`acl`]: roles, capabilities, document permissions, the authenticated `Caller`.
//! - [`store`]: the durable redb document store with group commit; permission checks on
//!   every read and write.
//! - [`security`]: users, Digest and Basic verification; no HTTP types.
//! - [`features`]: templates, views, descriptors, the where language, geoQueryService.
//! - [`flow`]: deployed projects, input flows, envelopes, the JavaScript plugin host, traces.
//! - [`spatial`]: the H3-sharded R-tree engine with exact predicates; no documents, no HTTP.
//! - [`cpu`]: the one bridge from async code to rayon.
//! - [`http`]: the hyper front end, the only module that knows HTTP.
//! - [`service`]: starting and stopping the whole service (serve, demo).
//! - [`demo`]: the sample layers `geoshard demo` loads from `examples/`.
//! - [`time`]: ISO-8601 dates and times to and from milliseconds.
//! - [`fuzzing`]: the properties the fuzz targets check, shared with the corpus replay test.

#![forbid(unsafe_code)]

/// A hash map for lookups on every request whose keys the service or its administrators
/// choose (views, geometry paths, users, issued nonces): foldhash, seeded per process, in one
/// fast pass (SipHash costs several times as much). A client can look keys up but
/// not insert them, so it cannot make them collide.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub mod acl;
pub mod cluster;
pub mod config;
pub mod cpu;
pub mod demo;
pub mod error;
pub mod features;
pub mod flow;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod load;
pub mod metrics;
pub mod security;
pub mod service;
pub mod spatial;
pub mod store;
pub mod time;

/// mimalloc for every binary, test and bench that links the crate: the request path
/// allocates small short-lived buffers, where it beats the system allocator. Through
/// `geoshard-alloc`, which calls mimalloc's plain entry points where the `mimalloc` crate
/// would call the slower `_aligned` ones.
#[global_allocator]
static GLOBAL: geoshard_alloc::MiMalloc = geoshard_alloc::MiMalloc;
