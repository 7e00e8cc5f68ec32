//! geoQueryService: the request as clients send it, its execution, and the GeoJSON response
//! (docs/contract.md §5).
//!
//! Requests are coerced the way Koop-style clients need: `layer` as a string or a number,
//! booleans as `true`/`"true"`/`1`, statistics as an array or a JSON string, `gis`/`esri`
//! prefixes in any case, and unknown members ignored. Execution order: spatial candidates
//! (the layer's index) -> permission filter (only rows of documents the caller may read)
//! -> objectIds, time and where -> statistics, count, ids, or order and page.
//!
//! - `request`: the model and its readers (`fast_reader`, serde, `esri`), the prepared-body cache;
//! - `execute`: resolving the layer, the descriptors, and running a query;
//! - `geojson`: the response writer;
//! - `esri_out`: the native FeatureServer's Esri JSON answers, written from the view;
//! - `esri_pbf`: the same as Esri's protobuf feature format (`f=pbf`);
//! - `typed`: the in-process readers' answers (OGC API items, tiles), with no JSON between.
//!
//! The submodules share this module's imports and each other's items through `super::*`.

use std::cell::{Cell, RefCell};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_json::{Value, json};
use thiserror::Error;

use super::descriptor::{Descriptor, Layer};
use super::template::{Kind, ViewDef};
use super::view::{GeometryColumn, GeometryRef, ViewData};
use super::where_clause::{Datum, Row, Where, WhereError, compare};
use super::{Features, ViewState};
use crate::acl::Caller;
use crate::error::{ApiError, ErrorCode};
use crate::spatial::geometry::{coord_count, parse_parts};
use crate::spatial::{Query, Relation};
use crate::time::{format_datetime, write_datetime};

mod esri_out;
mod esri_pbf;
mod execute;
mod geojson;
mod partial;
mod request;
mod typed;

use esri_out::EsriAnswer;
pub use esri_out::{EsriShape, Quantization, esri_field_type, esri_geometry_type, signed_area};
pub use esri_pbf::FeatureCollectionPBuffer;
use execute::*;
use geojson::*;
pub use partial::{Acc, Key, Partial, Round, merge_extents};
pub use request::readers_agree;
pub use request::{
    Coercible, DEFAULT_MAX_QUERY_VERTICES, EsriError, FeatureRequest, QuerySpec, RequestError,
    StatKind, StatSpec, TimeWindow,
};
pub use typed::{Attr, ItemsHead, ItemsPage, TileFeature, TileGeometry, TilePage};

/// The query service over the views of a [`Features`]: geoQueryService's answers, the
/// partial answers of a spread query, OGC API items and tiles. The catalog, the builds and
/// the saves stay with `Features`; this type only reads them.
#[derive(Clone, Copy)]
pub struct Queries<'a> {
    features: &'a Features,
}

impl Features {
    /// The query service over these views.
    pub fn queries(&self) -> Queries<'_> {
        Queries { features: self }
    }
}

#[derive(Debug, Error)]
pub enum FeatureError {
    #[error("Service {0} not found")]
    ServiceNotFound(String),
    #[error("Layer {0} not found")]
    LayerNotFound(String),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("{0}")]
    Where(#[from] WhereError),
    #[error("the query ran longer than query_time_limit_ms ({0} ms)")]
    TimeLimit(u64),
    /// A page of features larger than `max_answer_bytes`.
    #[error(
        "the answer would be about {bytes} bytes, more than max_answer_bytes ({limit}); ask for \
         fewer features a page (a smaller resultRecordCount or limit)"
    )]
    AnswerTooLarge { bytes: usize, limit: usize },
    /// A fault of ours (parts of a spread query that do not fit together).
    #[error("{0}")]
    Internal(String),
}

impl From<FeatureError> for ApiError {
    fn from(e: FeatureError) -> ApiError {
        let code = match &e {
            FeatureError::ServiceNotFound(_) | FeatureError::LayerNotFound(_) => {
                ErrorCode::ExtensionNotFound
            }
            FeatureError::Request(_) | FeatureError::Where(_) => ErrorCode::ExtensionInvalid,
            FeatureError::TimeLimit(_) => ErrorCode::TimeLimit,
            FeatureError::AnswerTooLarge { .. } => ErrorCode::PayloadTooLarge,
            FeatureError::Internal(_) => ErrorCode::Internal,
        };
        ApiError::new(code, e.to_string())
    }
}
