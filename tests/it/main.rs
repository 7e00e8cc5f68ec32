//! The integration suite, one binary: every module is one area of the service, driven as its
//! clients drive it (HTTP, the CLI, the real client libraries, a cluster on NATS). Shared
//! set-ups live in `common`.

mod common;
#[path = "../../benches/shapes.rs"]
mod shapes;

mod arcgis;
mod authz;
mod clients;
mod clients_contract;
mod cluster;
mod cluster_auto;
mod cluster_trust;
mod crash;
mod demo;
mod disk_full;
mod export;
mod features;
mod fences;
mod flows;
mod foundation;
mod fuzz_corpora;
mod gis_clients;
mod hostile;
mod index_bounds;
mod kills;
mod load;
mod map;
mod ogc;
mod openapi;
mod operations;
mod overload;
mod placement;
mod readable;
mod restart;
mod security;
mod spatial_oracle;
mod spatial_props;
