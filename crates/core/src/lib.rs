//! What every crate of geoshard shares: the contract's error codes, roles and permissions,
//! times, metrics, and the bridge from async code to rayon.

#![forbid(unsafe_code)]

/// A hash map for lookups on every request whose keys the service or its administrators
/// choose (views, geometry paths, users, issued nonces): foldhash, seeded per process, in one
/// fast pass (SipHash costs several times as much). A client can look keys up but
/// not insert them, so it cannot make them collide.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub mod acl;
pub mod cpu;
pub mod error;
pub mod metrics;
pub mod oneshot;
pub mod secret;
#[doc(hidden)]
pub mod testing;
pub mod time;
