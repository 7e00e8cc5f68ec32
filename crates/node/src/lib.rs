//! The composition root: opening the store, security, features, flows and the cluster,
//! the service's lifecycle (serve, demo, shutdown), and the demo's sample layers.

#![forbid(unsafe_code)]

// Sibling crates under the module names the code uses.
use geoshard_auth as security;
use geoshard_cluster as cluster;
use geoshard_config as config;
use geoshard_core::acl;
use geoshard_features as features;
use geoshard_flow as flow;
use geoshard_http as http;
use geoshard_store as store;

pub mod demo;
pub mod open;
pub mod service;

pub use open::{StartError, open};
