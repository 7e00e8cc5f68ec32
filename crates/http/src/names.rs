//! What several routes share on the wire: the cluster's consistency headers and the OpenAPI
//! description.

/// The header by which a client asks a cluster node to answer only once it has applied a log
/// entry (the `X-Geoshard-Sequence` of an earlier answer), so it reads its own writes on any
/// node.
pub(crate) const AFTER: &str = "x-geoshard-after";
/// The header of every answer of a cluster node: the last log entry it had applied.
pub(crate) const SEQUENCE: &str = "x-geoshard-sequence";
/// The header of a document read from a cluster node: the node whose store gave the content
/// (a node holding some shards keeps only a stub of the others' documents).
pub(crate) const KEPT_BY: &str = "x-geoshard-kept-by";

/// The OpenAPI 3.1 description of every route, kept by hand beside the code
/// (`docs/openapi.json`); a test holds it to the router.
pub(crate) const OPENAPI: &str = include_str!("../../../docs/openapi.json");
