//! geoQueryService: the request as clients send it, its execution, and the GeoJSON response
//! (REFERENCE §5).
//!
//! Requests are coerced the way Koop-style clients need: `layer` as a string or a number,
//! booleans as `true`/`"true"`/`1`, statistics as an array or a JSON string, `gis`/`esri`
//! prefixes in any case, and unknown members ignored. Execution order: spatial candidates
//! (the layer's index) -> permission filter (only rows of documents the caller may read)
//! -> objectIds, time and where -> statistics, count, ids, or order and page.

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
use super::view::{GeometryOut, ViewData};
use super::where_clause::{Row, V, Where, WhereError, compare};
use super::{Features, ViewState};
use crate::acl::Caller;
use crate::error::{ApiError, ErrorCode};
use crate::spatial::geometry::{coord_count, parse_parts};
use crate::spatial::{Query, Relation};
use crate::time::{format_datetime, write_datetime};

mod esri;
mod scan;

#[derive(Debug, Error)]
pub enum FeatureError {
    #[error("Service {0} not found")]
    ServiceNotFound(String),
    #[error("Layer {0} not found")]
    LayerNotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Where(#[from] WhereError),
    #[error("the query ran longer than query_time_limit_ms ({0} ms)")]
    TimeLimit(u64),
}

impl From<FeatureError> for ApiError {
    fn from(e: FeatureError) -> ApiError {
        let code = match &e {
            FeatureError::ServiceNotFound(_) | FeatureError::LayerNotFound(_) => {
                ErrorCode::ExtensionNotFound
            }
            FeatureError::BadRequest(_) | FeatureError::Where(_) => ErrorCode::ExtensionInvalid,
            FeatureError::TimeLimit(_) => ErrorCode::TimeLimit,
        };
        ApiError::new(code, e.to_string())
    }
}

fn bad(msg: impl Into<String>) -> FeatureError {
    FeatureError::BadRequest(msg.into())
}

/// A time window in milliseconds; either end may be open.
pub type TimeWindow = (Option<i64>, Option<i64>);

/// A statistic asked for in `outStatistics`.
#[derive(Debug, Clone, PartialEq)]
pub struct StatSpec {
    pub kind: StatKind,
    pub field: String,
    pub out_name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    Count,
    Sum,
    Min,
    Max,
    Avg,
    Stddev,
    Var,
}

impl StatKind {
    fn parse(s: &str) -> Option<StatKind> {
        Some(match s.to_ascii_lowercase().as_str() {
            "count" => StatKind::Count,
            "sum" => StatKind::Sum,
            "min" => StatKind::Min,
            "max" => StatKind::Max,
            "avg" | "mean" => StatKind::Avg,
            "stddev" => StatKind::Stddev,
            "var" | "variance" => StatKind::Var,
            _ => return None,
        })
    }

    /// Whether the statistic is arithmetic, so only for numeric fields.
    fn is_numeric(self) -> bool {
        match self {
            StatKind::Sum | StatKind::Avg | StatKind::Stddev | StatKind::Var => true,
            StatKind::Count | StatKind::Min | StatKind::Max => false,
        }
    }

    fn name(self) -> &'static str {
        match self {
            StatKind::Count => "count",
            StatKind::Sum => "sum",
            StatKind::Min => "min",
            StatKind::Max => "max",
            StatKind::Avg => "avg",
            StatKind::Stddev => "stddev",
            StatKind::Var => "var",
        }
    }
}

/// The query members, coerced.
#[derive(Debug, Default, Clone)]
pub struct QuerySpec {
    pub where_text: Option<String>,
    pub object_ids: Option<Vec<i64>>,
    pub out_fields: Option<String>,
    pub return_geometry: bool,
    pub count_only: bool,
    pub ids_only: bool,
    pub order_by: Option<String>,
    pub offset: usize,
    pub limit: Option<usize>,
    pub statistics: Option<Vec<StatSpec>>,
    pub group_by: Option<Vec<String>>,
    pub time: Option<TimeWindow>,
    pub geometry: Option<(Arc<Query>, Relation)>,
    /// `distance` in metres: features within it of the query geometry match.
    pub distance: Option<f64>,
}

/// A geoQueryService request.
#[derive(Debug, Clone)]
pub struct FeatureRequest {
    pub service: String,
    pub layer: Option<i64>,
    /// The layer as sent, for the 404 message.
    pub layer_text: Option<String>,
    pub method: Option<String>,
    pub query: QuerySpec,
}

/// A scalar member as clients send it: a JSON bool, number, string or null. Koop-style
/// clients send `"true"` for true and `"3"` for 3, so every scalar member is read this way
/// and coerced where it is used. Deserialized straight from the body, borrowing strings.
#[derive(Debug, Default, Clone, PartialEq)]
pub enum Flex<'a> {
    #[default]
    Absent,
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Cow<'a, str>),
    /// An array or object where a scalar was expected.
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Flex<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Visit<'a> {
            type Value = Flex<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Flex<'a>, E> {
                Ok(Flex::Bool(b))
            }
            fn visit_i64<E: de::Error>(self, i: i64) -> Result<Flex<'a>, E> {
                Ok(Flex::Int(i))
            }
            fn visit_u64<E: de::Error>(self, u: u64) -> Result<Flex<'a>, E> {
                Ok(i64::try_from(u).map_or(Flex::Float(u as f64), Flex::Int))
            }
            fn visit_f64<E: de::Error>(self, f: f64) -> Result<Flex<'a>, E> {
                Ok(Flex::Float(f))
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Flex<'a>, E> {
                Ok(Flex::Str(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Flex<'a>, E> {
                Ok(Flex::Str(Cow::Owned(s.to_string())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Flex<'a>, E> {
                Ok(Flex::Str(Cow::Owned(s)))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Flex<'a>, E> {
                Ok(Flex::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Flex<'a>, E> {
                Ok(Flex::Null)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Flex<'a>, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(Flex::Other)
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Flex<'a>, A::Error> {
                while map
                    .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Flex::Other)
            }
        }
        d.deserialize_any(Visit(std::marker::PhantomData))
    }
}

impl Flex<'_> {
    fn is_set(&self) -> bool {
        !matches!(self, Flex::Absent | Flex::Null)
    }

    fn text(&self) -> Option<String> {
        match self {
            Flex::Str(s) => Some(s.to_string()),
            Flex::Int(i) => Some(i.to_string()),
            Flex::Float(f) => Some(f.to_string()),
            _ => None,
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Flex::Str(s) => Some(s),
            _ => None,
        }
    }
}

#[derive(Debug, PartialEq, Deserialize, Default)]
#[serde(default)]
struct RawParams<'a> {
    #[serde(borrow)]
    id: Flex<'a>,
    #[serde(borrow)]
    layer: Flex<'a>,
    #[serde(borrow)]
    method: Flex<'a>,
}

/// A GeoJSON geometry as the request carries it: its coordinates are nested arrays, so no
/// JSON object map is built (`spatialReference` and other members are skipped).
#[derive(Debug, PartialEq, Deserialize)]
struct RawGeometry<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    coordinates: Option<Value>,
}

#[derive(Debug, PartialEq, Deserialize, Default)]
#[serde(default)]
struct RawExtension<'a> {
    #[serde(borrow)]
    geometry: Option<RawGeometry<'a>>,
}

/// The `query` members this service reads; every other member is ignored.
#[derive(Debug, PartialEq, Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawQuery<'a> {
    #[serde(borrow, rename = "where")]
    where_: Flex<'a>,
    object_ids: Option<Value>,
    #[serde(borrow)]
    out_fields: Flex<'a>,
    #[serde(borrow)]
    return_geometry: Flex<'a>,
    #[serde(borrow)]
    return_count_only: Flex<'a>,
    #[serde(borrow)]
    return_ids_only: Flex<'a>,
    #[serde(borrow)]
    order_by_fields: Flex<'a>,
    #[serde(borrow)]
    result_offset: Flex<'a>,
    #[serde(borrow)]
    result_record_count: Flex<'a>,
    out_statistics: Option<Value>,
    group_by_fields_for_statistics: Option<Value>,
    time: Option<Value>,
    #[serde(borrow)]
    geometry_type: Flex<'a>,
    #[serde(borrow)]
    spatial_rel: Flex<'a>,
    #[serde(borrow)]
    extension: Option<RawExtension<'a>>,
    /// An Esri JSON geometry (or its text form), read when there is no `extension`.
    geometry: Option<Value>,
    #[serde(rename = "inSR")]
    in_sr: Option<Value>,
    #[serde(borrow)]
    distance: Flex<'a>,
    #[serde(borrow)]
    units: Flex<'a>,
}

#[derive(Debug, PartialEq, Deserialize)]
struct RawRequest<'a> {
    #[serde(borrow, default)]
    params: Option<RawParams<'a>>,
    #[serde(borrow, default)]
    query: Option<RawQuery<'a>>,
}

fn boolish(v: &Flex<'_>, name: &str) -> Result<bool, FeatureError> {
    match v {
        Flex::Bool(b) => Ok(*b),
        Flex::Int(i) => Ok(*i != 0),
        Flex::Float(f) => Ok(*f != 0.0),
        Flex::Str(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" | "" => Ok(false),
            _ => Err(bad(format!("{name} must be true or false, not {s:?}"))),
        },
        Flex::Absent | Flex::Null => Ok(false),
        Flex::Other => Err(bad(format!("{name} must be true or false"))),
    }
}

fn count(v: &Flex<'_>, name: &str) -> Result<Option<usize>, FeatureError> {
    let fail = || bad(format!("{name} must be a non-negative integer"));
    match v {
        Flex::Absent | Flex::Null => Ok(None),
        Flex::Int(i) => usize::try_from(*i).map(Some).map_err(|_| fail()),
        Flex::Float(f) if *f >= 0.0 && f.fract() == 0.0 => Ok(Some(*f as usize)),
        Flex::Str(s) if s.trim().is_empty() => Ok(None),
        Flex::Str(s) => s
            .trim()
            .parse::<usize>()
            .map(Some)
            .map_err(|_| bad(format!("{name} must be a non-negative integer, not {s:?}"))),
        _ => Err(fail()),
    }
}

/// Strip a `gis`/`esri` prefix and a type word, case-insensitively: `esriSpatialRelContains`
/// -> `Contains`. Borrows: it runs on every query.
fn enum_value<'v>(v: &'v str, kind: &str) -> Option<&'v str> {
    let strip = |s: &'v str, p: &str| {
        (s.len() >= p.len() && s.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes()))
            .then(|| &s[p.len()..])
    };
    let rest = strip(v, "gis").or_else(|| strip(v, "esri"))?;
    strip(rest, kind)
}

fn parse_time(v: &Value) -> Result<Option<TimeWindow>, FeatureError> {
    let one = |s: &str| -> Result<Option<i64>, FeatureError> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("null") {
            return Ok(None);
        }
        s.parse::<i64>()
            .map(Some)
            .map_err(|_| bad(format!("time: {s:?} is not milliseconds since the epoch")))
    };
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => {
            let t = n.as_i64().ok_or_else(|| bad("time must be milliseconds"))?;
            Ok(Some((Some(t), Some(t))))
        }
        Value::String(s) if s.trim().is_empty() => Ok(None),
        Value::String(s) => match s.split_once(',') {
            Some((a, b)) => Ok(Some((one(a)?, one(b)?))),
            None => {
                let t = one(s)?;
                Ok(Some((t, t)))
            }
        },
        Value::Array(a) if a.len() == 2 => {
            let part = |x: &Value| match x {
                Value::Null => Ok(None),
                Value::Number(n) => n
                    .as_i64()
                    .map(Some)
                    .ok_or_else(|| bad("time must be milliseconds")),
                Value::String(s) => one(s),
                _ => Err(bad("time must be milliseconds")),
            };
            Ok(Some((part(&a[0])?, part(&a[1])?)))
        }
        _ => Err(bad("time must be \"start,end\" in milliseconds")),
    }
}

fn parse_statistics(v: &Value) -> Result<Option<Vec<StatSpec>>, FeatureError> {
    let parsed;
    let list = match v {
        Value::Null => return Ok(None),
        Value::String(s) if s.trim().is_empty() => return Ok(None),
        Value::String(s) => {
            parsed = serde_json::from_str::<Value>(s)
                .map_err(|e| bad(format!("outStatistics is not valid JSON: {e}")))?;
            &parsed
        }
        other => other,
    };
    let items: Vec<&Value> = match list {
        Value::Array(a) => a.iter().collect(),
        Value::Object(_) => vec![list],
        _ => {
            return Err(bad(
                "outStatistics must be an array of statistic definitions",
            ));
        }
    };
    let mut out = Vec::new();
    for (i, s) in items.into_iter().enumerate() {
        let kind_text = s
            .get("statisticType")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("outStatistics[{i}].statisticType is required")))?;
        let kind = StatKind::parse(kind_text).ok_or_else(|| {
            bad(format!(
                "outStatistics[{i}].statisticType {kind_text:?} is not one of count, sum, min, max, avg, stddev, var"
            ))
        })?;
        let field = s
            .get("onStatisticField")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("outStatistics[{i}].onStatisticField is required")))?
            .to_string();
        let out_name = s
            .get("outStatisticFieldName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| format!("{field}_{}", kind.name()));
        out.push(StatSpec {
            kind,
            field,
            out_name,
        });
    }
    Ok(Some(out))
}

/// serde's reading of a body the reader gave up on, with the error messages clients see.
fn serde_read(body: &[u8]) -> Result<RawRequest<'_>, FeatureError> {
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => bad(format!(
            "the request body is not a geoQueryService request: {e}"
        )),
        _ => bad(format!("the request body is not JSON: {e}")),
    })
}

/// A body this thread parsed, kept so that the next body of the same shape from the same user
/// is bound rather than parsed: the server's side of a prepared statement. Clients send one
/// request again and again with only the point or box changed, so a body that is the kept one
/// up to its coordinates array and again after it is the kept request with new coordinates.
///
/// That holds because the reader ([`scan`]) reads the body in one pass from the left: over the
/// same prefix it does the same; a JSON array ends at its own `]`, so it reads the new array
/// whole and then the same suffix. And every member but the geometry was coerced and checked
/// already, with the geometry last (as in [`FeatureRequest::from_raw`]). Kept only for bodies
/// the reader (not serde) read, and a user's bodies are only ever compared with that user's.
struct Prepared {
    user: String,
    body: Vec<u8>,
    /// The coordinates array in `body`, from its `[` to just after its `]`.
    coordinates: (usize, usize),
    /// The geometry's `type`.
    kind: String,
    /// The request; its geometry is replaced when a body binds.
    request: FeatureRequest,
}

/// Bodies longer than this are not kept (the common ones are a few hundred bytes).
const PREPARED_MAX_BODY: usize = 4096;

thread_local! {
    static PREPARED: RefCell<Option<Prepared>> = const { RefCell::new(None) };
}

impl Prepared {
    /// The request `body` makes, when it is the kept body with other coordinates.
    fn bind(
        &self,
        user: &str,
        body: &[u8],
        max_vertices: usize,
    ) -> Option<Result<FeatureRequest, FeatureError>> {
        let (start, end) = self.coordinates;
        let suffix = &self.body[end..];
        let middle = body.get(start..body.len().checked_sub(suffix.len())?)?;
        if self.user != user
            || body[..start] != self.body[..start]
            || !body.ends_with(suffix)
            || middle.first() != Some(&b'[')
            || middle.last() != Some(&b']')
        {
            return None;
        }
        let mut request = self.request.clone();
        let (_, relation) = request.query.geometry.take()?;
        // The common case without a JSON value: two numbers (serde_json reads a number for an
        // f64 as for a Value) that make a valid point. Anything else takes the general way.
        if self.kind == "Point"
            && let Ok((x, y)) = serde_json::from_slice::<(f64, f64)>(middle)
            && let Some(point) = crate::spatial::geometry::point(x, y)
        {
            request.query.geometry = Some((Arc::new(Query::new(point)), relation));
            return Some(Ok(request));
        }
        // One array and nothing else, read as the reader reads it (serde_json).
        let coords: Value = serde_json::from_slice(middle).ok()?;
        Some(
            query_geometry(&self.kind, &coords, relation, max_vertices).map(|g| {
                request.query.geometry = Some(g);
                request
            }),
        )
    }
}

/// `distance` in `units`, in metres; `None` for none or 0. Only `intersects` (the default)
/// measures a distance.
fn distance(
    d: &Flex<'_>,
    units: &Flex<'_>,
    relation: Relation,
) -> Result<Option<f64>, FeatureError> {
    let value = match d {
        Flex::Absent | Flex::Null => return Ok(None),
        Flex::Int(i) => *i as f64,
        Flex::Float(f) => *f,
        Flex::Str(s) if s.trim().is_empty() => return Ok(None),
        Flex::Str(s) => s
            .trim()
            .parse::<f64>()
            .map_err(|_| bad(format!("distance must be a number, not {s:?}")))?,
        _ => return Err(bad("distance must be a number")),
    };
    if !value.is_finite() || value < 0.0 {
        return Err(bad(format!(
            "distance must be a non-negative number, not {value}"
        )));
    }
    if value == 0.0 {
        return Ok(None);
    }
    let per = esri::meters_per(units.text().as_deref()).map_err(bad)?;
    if relation != Relation::Intersects {
        return Err(bad(format!(
            "distance is supported with spatialRel intersects only, not {}",
            relation.name()
        )));
    }
    Ok(Some(value * per))
}

/// The query geometry and relation of a request's `extension.geometry`, refused with more
/// than `max_vertices` positions before it is prepared.
fn query_geometry(
    kind: &str,
    coords: &Value,
    relation: Relation,
    max_vertices: usize,
) -> Result<(Arc<Query>, Relation), FeatureError> {
    let geometry = parse_parts(kind, coords, Default::default())
        .map_err(|e| bad(format!("extension.geometry: {e}")))?;
    let n = coord_count(&geometry);
    if n > max_vertices {
        return Err(too_many_vertices(n, max_vertices));
    }
    Ok((Arc::new(Query::new(geometry)), relation))
}

fn too_many_vertices(n: usize, max: usize) -> FeatureError {
    bad(format!(
        "extension.geometry has {n} positions, above max_query_vertices ({max})"
    ))
}

/// Whether the fast reader and serde read `body` alike: wherever the reader answers, serde
/// gives the same members (the property the fuzzing targets check).
pub(crate) fn readers_agree(body: &[u8]) -> bool {
    match scan::read_spanned(body) {
        None => true,
        Some((fast, _)) => {
            serde_json::from_slice::<RawRequest<'_>>(body).ok().as_ref() == Some(&fast)
        }
    }
}

/// The default of the `max_query_vertices` setting, for [`FeatureRequest::parse`].
pub const DEFAULT_MAX_QUERY_VERTICES: usize = 100_000;

/// Refuse a body that may hold a geometry with more than `max_vertices` positions before
/// any of it is parsed into a tree: every position is an array, so a body with fewer `[`
/// than that (and a little room for the other members) holds fewer positions. The exact
/// count is checked again on the geometry itself.
fn check_arrays(body: &[u8], max_vertices: usize) -> Result<(), FeatureError> {
    const OTHER_ARRAYS: usize = 64;
    let arrays = memchr::memchr_iter(b'[', body).count();
    if arrays > max_vertices.saturating_add(OTHER_ARRAYS) {
        return Err(too_many_vertices(arrays, max_vertices));
    }
    Ok(())
}

impl FeatureRequest {
    /// Parse and coerce a request body. Unknown members are ignored, as clients send many.
    /// A query geometry may have [`DEFAULT_MAX_QUERY_VERTICES`] positions.
    pub fn parse(body: &[u8]) -> Result<FeatureRequest, FeatureError> {
        check_arrays(body, DEFAULT_MAX_QUERY_VERTICES)?;
        match scan::read_spanned(body) {
            Some((raw, _)) => FeatureRequest::from_raw(raw, DEFAULT_MAX_QUERY_VERTICES),
            None => FeatureRequest::from_raw(serde_read(body)?, DEFAULT_MAX_QUERY_VERTICES),
        }
    }

    /// [`FeatureRequest::parse`], for `user`, with a query geometry of at most
    /// `max_vertices` positions: a body of the same shape as the last one this thread parsed
    /// for `user` is bound to that one's request ([`Prepared`]).
    pub fn parse_for(
        user: &str,
        body: &[u8],
        max_vertices: usize,
    ) -> Result<FeatureRequest, FeatureError> {
        let bound = PREPARED.with(|p| {
            p.borrow()
                .as_ref()
                .and_then(|p| p.bind(user, body, max_vertices))
        });
        if let Some(request) = bound {
            return request;
        }
        check_arrays(body, max_vertices)?;
        let Some((raw, span)) = scan::read_spanned(body) else {
            return FeatureRequest::from_raw(serde_read(body)?, max_vertices);
        };
        let kind = match span {
            Some(_) if body.len() <= PREPARED_MAX_BODY => raw
                .query
                .as_ref()
                .and_then(|q| q.extension.as_ref()?.geometry.as_ref()?.kind.as_deref())
                .map(str::to_string),
            _ => None,
        };
        let request = FeatureRequest::from_raw(raw, max_vertices)?;
        if let (Some(coordinates), Some(kind), Some(_)) = (span, kind, &request.query.geometry) {
            PREPARED.with(|p| {
                *p.borrow_mut() = Some(Prepared {
                    user: user.to_string(),
                    body: body.to_vec(),
                    coordinates,
                    kind,
                    request: request.clone(),
                })
            });
        }
        Ok(request)
    }

    /// Coerce and check the members as read. The geometry comes last: [`Prepared`] relies on
    /// every other member having been checked before it.
    fn from_raw(raw: RawRequest<'_>, max_vertices: usize) -> Result<FeatureRequest, FeatureError> {
        let params = raw
            .params
            .ok_or_else(|| bad("the request body has no \"params\" object"))?;
        let service = params
            .id
            .text()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("params.id (the service name) is required"))?;
        let (layer, layer_text) = match &params.layer {
            Flex::Absent | Flex::Null => (None, None),
            // A number's text is the number itself: the 404 message writes it when needed.
            Flex::Int(i) => (Some(*i), None),
            Flex::Float(f) if f.fract() == 0.0 => (Some(*f as i64), None),
            Flex::Str(s) => match s.trim().parse::<i64>() {
                Ok(id) => (Some(id), Some(s.to_string())),
                Err(_) => return Err(FeatureError::LayerNotFound(s.to_string())),
            },
            other => {
                return Err(FeatureError::LayerNotFound(
                    other.text().unwrap_or_else(|| "(not a number)".into()),
                ));
            }
        };
        let method = params.method.text();
        let q = raw.query.unwrap_or_default();
        let mut spec = QuerySpec {
            where_text: q.where_.as_str().map(str::to_string),
            out_fields: q.out_fields.text(),
            return_geometry: boolish(&q.return_geometry, "returnGeometry")?,
            count_only: boolish(&q.return_count_only, "returnCountOnly")?,
            ids_only: boolish(&q.return_ids_only, "returnIdsOnly")?,
            order_by: q.order_by_fields.as_str().map(str::to_string),
            offset: count(&q.result_offset, "resultOffset")?.unwrap_or(0),
            limit: count(&q.result_record_count, "resultRecordCount")?,
            statistics: parse_statistics(q.out_statistics.as_ref().unwrap_or(&Value::Null))?,
            time: parse_time(q.time.as_ref().unwrap_or(&Value::Null))?,
            ..QuerySpec::default()
        };
        spec.object_ids = match q.object_ids.unwrap_or(Value::Null) {
            Value::Null => None,
            Value::Number(n) => Some(vec![
                n.as_i64()
                    .ok_or_else(|| bad("objectIds must be integers"))?,
            ]),
            Value::String(s) if s.trim().is_empty() => None,
            Value::String(s) => Some(
                s.split(',')
                    .map(|p| p.trim().parse::<i64>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| bad(format!("objectIds {s:?} is not a list of integers")))?,
            ),
            Value::Array(a) => Some(
                a.iter()
                    .map(|x| {
                        x.as_i64()
                            .or_else(|| x.as_str().and_then(|s| s.trim().parse().ok()))
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad("objectIds must be integers"))?,
            ),
            _ => return Err(bad("objectIds must be \"1,2,3\" or a number")),
        };
        spec.group_by = match q.group_by_fields_for_statistics {
            Some(Value::String(s)) if !s.trim().is_empty() => {
                Some(s.split(',').map(|f| f.trim().to_string()).collect())
            }
            Some(Value::Array(a)) => Some(
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect(),
            ),
            _ => None,
        };
        if q.geometry_type.is_set() {
            let gt = q.geometry_type.as_str().unwrap_or_default();
            let known = enum_value(gt, "geometry").is_some_and(|kind| {
                ["point", "multipoint", "polyline", "polygon", "envelope"]
                    .iter()
                    .any(|k| kind.eq_ignore_ascii_case(k))
            });
            if !known {
                let shown = q.geometry_type.text().unwrap_or_default();
                return Err(bad(format!("unsupported geometryType {shown}")));
            }
        }
        let relation = match q.spatial_rel.as_str().filter(|s| !s.is_empty()) {
            None => Relation::Intersects,
            Some(r) => enum_value(r, "spatialrel")
                .and_then(Relation::parse)
                .ok_or_else(|| {
                    bad(format!(
                        "unsupported spatialRel {r}: use esriSpatialRelIntersects, \
                         esriSpatialRelContains, esriSpatialRelWithin, esriSpatialRelCrosses, \
                         esriSpatialRelOverlaps, esriSpatialRelTouches or \
                         esriSpatialRelEnvelopeIntersects (or gisSpatialRel…)"
                    ))
                })?,
        };
        spec.distance = distance(&q.distance, &q.units, relation)?;
        if let Some(g) = q.extension.and_then(|e| e.geometry) {
            let kind = g.kind.ok_or_else(|| {
                bad("extension.geometry: type: geometry has no string member \"type\"")
            })?;
            let coords = g.coordinates.ok_or_else(|| {
                bad(format!(
                    "extension.geometry: coordinates: {kind} has no member \"coordinates\""
                ))
            })?;
            spec.geometry = Some(query_geometry(&kind, &coords, relation, max_vertices)?);
        } else if let Some(g) = q
            .geometry
            .filter(|g| !g.is_null() && g.as_str() != Some(""))
        {
            // An ArcGIS client's own geometry: never dropped, used or refused.
            let (kind, coords) = esri::to_geojson(&g, q.in_sr.as_ref()).map_err(bad)?;
            spec.geometry = Some(query_geometry(&kind, &coords, relation, max_vertices)?);
        }
        if spec.distance.is_some() && spec.geometry.is_none() {
            return Err(bad("distance needs a query geometry"));
        }
        Ok(FeatureRequest {
            service,
            layer,
            layer_text,
            method,
            query: spec,
        })
    }

    /// [`FeatureRequest::parse`] of an already parsed body (tests, tools).
    pub fn from_json(body: &Value) -> Result<FeatureRequest, FeatureError> {
        FeatureRequest::parse(&serde_json::to_vec(body).unwrap_or_default())
    }

    /// Small enough to answer on the calling task: a point query, or no query at all.
    pub fn is_light(&self) -> bool {
        self.method.as_deref() != Some("query")
            || self
                .query
                .geometry
                .as_ref()
                .is_some_and(|(q, _)| q.as_point().is_some())
                && self.query.distance.is_none()
    }
}

/// The JSON text of a value.
fn write_value(out: &mut Vec<u8>, v: &V<'_>) {
    match v {
        V::Null => out.extend_from_slice(b"null"),
        V::Int(i) => write_int(out, *i),
        V::Float(f) if f.is_finite() => {
            let _ = serde_json::to_writer(&mut *out, f);
        }
        V::Float(_) => out.extend_from_slice(b"null"),
        V::Str(s) => {
            let _ = serde_json::to_writer(&mut *out, s.as_ref());
        }
        V::Bool(b) => out.push(if *b { b'1' } else { b'0' }),
        V::Date(ms) => {
            let _ = serde_json::to_writer(&mut *out, &format_datetime(*ms));
        }
    }
}

/// An integer's JSON text, without a temporary String (this runs per feature).
fn write_int(out: &mut Vec<u8>, i: impl serde::Serialize) {
    let _ = serde_json::to_writer(&mut *out, &i);
}

/// `s` as a JSON string, as serde_json writes it. serde_json escapes only `"`, `\` and
/// control characters, and most strings (names, ids, ordinary attribute text) have none of
/// them: those are copied as they are.
fn write_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

fn write_geometry(out: &mut Vec<u8>, g: Option<&GeometryOut>) {
    match g {
        None => out.extend_from_slice(b"null"),
        Some(GeometryOut::Point(x, y)) => {
            out.extend_from_slice(b"{\"type\":\"Point\",\"coordinates\":[");
            let _ = serde_json::to_writer(&mut *out, x);
            out.push(b',');
            let _ = serde_json::to_writer(&mut *out, y);
            out.extend_from_slice(b"]}");
        }
        Some(GeometryOut::Json(bytes)) => out.extend_from_slice(bytes),
    }
}

/// `"$version"` and `"$timestamp"` as the first members of a response object.
fn envelope_start(out: &mut Vec<u8>) {
    // The version is plain semver: nothing to escape.
    out.extend_from_slice(
        concat!(
            "{\"$version\":\"",
            env!("CARGO_PKG_VERSION"),
            "\",\"$timestamp\":\""
        )
        .as_bytes(),
    );
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    write_timestamp(out, ms);
    out.push(b'"');
}

thread_local! {
    /// The last timestamp text written on this thread. At thousands of answers a second, most
    /// share their millisecond with the one before.
    static LAST_TIMESTAMP: Cell<(i64, [u8; 24])> = const { Cell::new((i64::MIN, [0; 24])) };
}

/// [`write_datetime`], from the thread's last text when `ms` is the same millisecond.
fn write_timestamp(out: &mut Vec<u8>, ms: i64) {
    LAST_TIMESTAMP.with(|last| {
        let (at, text) = last.get();
        if at == ms {
            out.extend_from_slice(&text);
            return;
        }
        let start = out.len();
        write_datetime(out, ms);
        // Years 0 to 9999 (every real clock) give 24 bytes; others are not kept.
        if let Ok(text) = <[u8; 24]>::try_from(&out[start..]) {
            last.set((ms, text));
        }
    });
}

struct Plan<'a> {
    layer: &'a Layer,
    view: Option<Arc<ViewState>>,
}

impl Features {
    fn resolve<'d>(
        &self,
        req: &FeatureRequest,
        descriptor: &'d Descriptor,
    ) -> Result<Option<Plan<'d>>, FeatureError> {
        let Some(id) = req.layer else {
            return Ok(None);
        };
        let layer = descriptor.layer(id).ok_or_else(|| {
            FeatureError::LayerNotFound(req.layer_text.clone().unwrap_or_else(|| id.to_string()))
        })?;
        Ok(Some(Plan {
            layer,
            view: self.view(&layer.view),
        }))
    }

    /// Answer a geoQueryService request: the JSON response body.
    pub fn execute(&self, caller: &Caller, req: &FeatureRequest) -> Result<Vec<u8>, FeatureError> {
        self.execute_within(caller, req, None)
    }

    /// [`Features::execute`], given up with [`FeatureError::TimeLimit`] once `limit` (a
    /// deadline and the limit it came from, in ms) has passed: the spatial tests and the row
    /// filter look at the clock as they go.
    pub fn execute_within(
        &self,
        caller: &Caller,
        req: &FeatureRequest,
        limit: Option<(std::time::Instant, u64)>,
    ) -> Result<Vec<u8>, FeatureError> {
        let descriptor = self
            .descriptor(&req.service, caller.roles())
            .ok_or_else(|| FeatureError::ServiceNotFound(req.service.clone()))?;
        let plan = self.resolve(req, &descriptor)?;
        let is_query = req
            .method
            .as_deref()
            .is_some_and(|m| m.eq_ignore_ascii_case("query"));
        match (plan, is_query) {
            (None, _) => Ok(self.service_description(&descriptor)),
            (Some(plan), false) => Ok(self.layer_description(&plan)),
            (Some(plan), true) => self.run_query(caller, req, &descriptor, &plan, limit),
        }
    }

    /// The service descriptor as Koop reads it for `/FeatureServer` (REFERENCE §5): the
    /// info's members, `maxRecordCount`, and each layer's metadata in ascending id order.
    fn service_description(&self, d: &Descriptor) -> Vec<u8> {
        let mut top = serde_json::Map::new();
        top.insert("description".into(), d.description.clone().into());
        top.insert(
            "maxRecordCount".into(),
            self.settings.max_record_count.into(),
        );
        if let Some(Value::Object(info)) = d.raw.get("info") {
            for (k, v) in info {
                top.insert(k.clone(), v.clone());
            }
        }
        let mut layers: Vec<&Layer> = d.layers.iter().collect();
        layers.sort_by_key(|l| l.id);
        let layers: Vec<Value> = layers
            .into_iter()
            .map(|layer| {
                let view = self.view(&layer.view);
                json!({ "metadata": self.layer_metadata(layer, view.as_deref()) })
            })
            .collect();
        // The service's extent holds its layers' (Koop's fullExtent).
        let extent = layers
            .iter()
            .filter_map(|l| {
                let e = &l["metadata"]["extent"];
                let n = |k: &str| e.get(k).and_then(Value::as_f64);
                Some([n("xmin")?, n("ymin")?, n("xmax")?, n("ymax")?])
            })
            .reduce(|a, b| {
                [
                    a[0].min(b[0]),
                    a[1].min(b[1]),
                    a[2].max(b[2]),
                    a[3].max(b[3]),
                ]
            });
        if let Some([xmin, ymin, xmax, ymax]) = extent {
            top.entry("extent").or_insert_with(|| {
                json!({
                    "xmin": xmin, "ymin": ymin, "xmax": xmax, "ymax": ymax,
                    "spatialReference": {"wkid": 4326, "latestWkid": 4326},
                })
            });
        }
        top.insert("layers".into(), Value::Array(layers));
        let mut out = Vec::new();
        envelope_start(&mut out);
        for (k, v) in top {
            out.push(b',');
            write_str(&mut out, &k);
            out.push(b':');
            let _ = serde_json::to_writer(&mut out, &v);
        }
        out.push(b'}');
        out
    }

    /// The layer descriptor: `{"metadata": {…}}`.
    fn layer_description(&self, plan: &Plan<'_>) -> Vec<u8> {
        let meta = self.layer_metadata(plan.layer, plan.view.as_deref());
        let mut out = Vec::new();
        envelope_start(&mut out);
        out.extend_from_slice(b",\"metadata\":");
        let _ = serde_json::to_writer(&mut out, &meta);
        out.push(b'}');
        out
    }

    /// A layer's metadata: its members as stored, `maxRecordCount`,
    /// `useStandardizedQueries`, `idField`, its fields, and its extent (the stored one, else
    /// the data's; none for a layer with no features, which clients take as the world).
    fn layer_metadata(&self, layer: &Layer, view: Option<&ViewState>) -> Value {
        let mut meta = serde_json::Map::new();
        meta.insert(
            "maxRecordCount".into(),
            self.settings.max_record_count.into(),
        );
        meta.insert("useStandardizedQueries".into(), true.into());
        for (k, v) in &layer.raw {
            meta.insert(k.clone(), v.clone());
        }
        meta.entry("idField")
            .or_insert_with(|| layer.id_field.clone().into());
        if !meta.contains_key("extent") {
            let extent = view.and_then(|v| {
                v.indexes
                    .read()
                    .get(layer.geometry_path.text())
                    .and_then(|e| e.extent())
            });
            if let Some([xmin, ymin, xmax, ymax]) = extent {
                meta.insert(
                    "extent".into(),
                    json!({
                        "xmin": xmin, "ymin": ymin, "xmax": xmax, "ymax": ymax,
                        "spatialReference": {"wkid": 4326, "latestWkid": 4326},
                    }),
                );
            }
        }
        let fields: Value = view
            .and_then(|v| serde_json::from_slice(&v.def.fields_json).ok())
            .unwrap_or(Value::Array(Vec::new()));
        meta.insert("fields".into(), fields);
        Value::Object(meta)
    }

    fn run_query(
        &self,
        caller: &Caller,
        req: &FeatureRequest,
        descriptor: &Descriptor,
        plan: &Plan<'_>,
        limit: Option<(std::time::Instant, u64)>,
    ) -> Result<Vec<u8>, FeatureError> {
        let deadline = limit.map(|l| l.0);
        let past_limit = || FeatureError::TimeLimit(limit.map_or(0, |l| l.1));
        let q = &req.query;
        let Some(view) = plan.view.as_ref() else {
            // The layer's view has no template yet: a valid layer with no features.
            return Ok(self.write_features(descriptor, plan, None, &[], &[], false, q));
        };
        let def = &view.def;
        let resolve = |name: &str| def.column(name);
        let filter = Where::parse(
            q.where_text.as_deref().unwrap_or(""),
            &resolve,
            self.settings.where_limits,
        )?;
        let field = |name: &str, member: &str| -> Result<usize, FeatureError> {
            def.column(name)
                .ok_or_else(|| bad(format!("unknown field {name} in {member}")))
        };
        let out_cols: Vec<usize> = match q.out_fields.as_deref().map(str::trim) {
            None | Some("") | Some("*") => (0..def.columns.len()).collect(),
            Some(list) => list
                .split(',')
                .map(|f| field(f.trim(), "outFields"))
                .collect::<Result<_, _>>()?,
        };
        let mut order: Vec<(usize, bool)> = Vec::new();
        if let Some(list) = q.order_by.as_deref() {
            for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let mut words = part.split_whitespace();
                let name = words.next().unwrap_or_default();
                let desc = match words.next().map(str::to_ascii_uppercase).as_deref() {
                    None | Some("ASC") => false,
                    Some("DESC") => true,
                    Some(other) => {
                        return Err(bad(format!("orderByFields: {other} is not ASC or DESC")));
                    }
                };
                order.push((field(name, "orderByFields")?, desc));
            }
        }
        let time_cols = match (&q.time, &plan.layer.time_fields) {
            (Some(_), Some((start, end))) => Some((
                field(start, "timeInfo.startTimeField")?,
                end.as_deref()
                    .map(|e| field(e, "timeInfo.endTimeField"))
                    .transpose()?,
            )),
            _ => None,
        };
        let stats = match &q.statistics {
            None => None,
            Some(specs) => {
                let mut cols = Vec::new();
                for s in specs {
                    let c = if s.kind == StatKind::Count && s.field == "*" {
                        None
                    } else {
                        Some(field(&s.field, "outStatistics")?)
                    };
                    if let Some(c) = c
                        && s.kind.is_numeric()
                        && !matches!(def.columns[c].scalar.kind(), Kind::Int | Kind::Float)
                    {
                        return Err(bad(format!(
                            "outStatistics: {} needs a numeric field, and {} is a {}",
                            s.kind.name(),
                            def.columns[c].name,
                            def.columns[c].scalar.name()
                        )));
                    }
                    cols.push(c);
                }
                let groups = q
                    .group_by
                    .clone()
                    .unwrap_or_default()
                    .iter()
                    .map(|g| field(g, "groupByFieldsForStatistics"))
                    .collect::<Result<Vec<_>, _>>()?;
                Some((cols, groups))
            }
        };
        let object_ids: Option<std::collections::HashSet<i64>> =
            q.object_ids.as_ref().map(|v| v.iter().copied().collect());

        // Spatial candidates, or every row.
        let candidates: Option<Vec<u32>> = match &q.geometry {
            None => None,
            Some((query, rel)) => {
                let index = view
                    .indexes
                    .read()
                    .get(plan.layer.geometry_path.text())
                    .cloned();
                Some(match (index, q.distance) {
                    (Some(engine), Some(meters)) => engine
                        .query_distance(query, meters, deadline)
                        .map_err(|_| past_limit())?,
                    (Some(engine), None) => engine
                        .query_within(query, *rel, deadline)
                        .map_err(|_| past_limit())?,
                    (None, _) => Vec::new(),
                })
            }
        };
        let data = view.data.read();
        let passes = |slot: u32| -> bool {
            if !data.readable(caller, slot) {
                return false;
            }
            if let Some(ids) = &object_ids
                && !data.id_of(slot).is_some_and(|id| ids.contains(&id))
            {
                return false;
            }
            if let (Some((start, end)), Some((from, to))) = (time_cols, q.time) {
                let row = data.row(slot);
                let t0 = match row.get(start) {
                    V::Date(ms) | V::Int(ms) => Some(ms),
                    _ => None,
                };
                let t1 = end.map_or(t0, |e| match row.get(e) {
                    V::Date(ms) | V::Int(ms) => Some(ms),
                    _ => t0,
                });
                let Some(t0) = t0 else { return false };
                let t1 = t1.unwrap_or(t0);
                if from.is_some_and(|f| t1 < f) || to.is_some_and(|t| t0 > t) {
                    return false;
                }
            }
            filter.matches(&data.row(slot))
        };
        // Every 4,096 rows, a look at the clock.
        let mut seen = 0usize;
        let mut stopped = false;
        let mut within = |_: &u32| {
            seen += 1;
            if seen.is_multiple_of(4096) && deadline.is_some_and(|d| std::time::Instant::now() >= d)
            {
                stopped = true;
            }
            !stopped
        };
        let mut rows: Vec<(i64, u32)> = match candidates {
            Some(c) => c
                .into_iter()
                .take_while(&mut within)
                .filter(|s| passes(*s))
                .filter_map(|s| data.id_of(s).map(|id| (id, s)))
                .collect(),
            None => data
                .live_slots()
                .take_while(&mut within)
                .filter(|s| passes(*s))
                .filter_map(|s| data.id_of(s).map(|id| (id, s)))
                .collect(),
        };
        if stopped {
            return Err(past_limit());
        }

        if let Some((cols, groups)) = stats {
            return Ok(self.write_statistics(descriptor, plan, &data, &rows, &cols, &groups, q));
        }
        if q.count_only {
            let mut out = Vec::new();
            envelope_start(&mut out);
            out.extend_from_slice(b",\"count\":");
            write_int(&mut out, rows.len());
            self.write_tail(&mut out, descriptor, plan, Some(def), false, true);
            out.extend_from_slice(b",\"features\":[]}");
            return Ok(out);
        }
        if order.is_empty() {
            rows.sort_unstable();
        } else {
            rows.sort_by(|a, b| {
                for &(col, desc) in &order {
                    let (va, vb) = (
                        data.columns[col].get(a.1 as usize),
                        data.columns[col].get(b.1 as usize),
                    );
                    let o = match (&va, &vb) {
                        (V::Null, V::Null) => Ordering::Equal,
                        (V::Null, _) => Ordering::Less,
                        (_, V::Null) => Ordering::Greater,
                        _ => compare(&va, &vb).unwrap_or(Ordering::Equal),
                    };
                    let o = if desc { o.reverse() } else { o };
                    if o != Ordering::Equal {
                        return o;
                    }
                }
                a.0.cmp(&b.0)
            });
        }
        if q.ids_only {
            let mut out = Vec::new();
            envelope_start(&mut out);
            out.extend_from_slice(b",\"objectIdFieldName\":");
            write_str(&mut out, &def.columns[def.id_column].name);
            out.extend_from_slice(b",\"objectIds\":[");
            for (i, (id, _)) in rows.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_int(&mut out, *id);
            }
            out.push(b']');
            self.write_tail(&mut out, descriptor, plan, Some(def), false, true);
            out.extend_from_slice(b",\"features\":[");
            let id_name = &def.columns[def.id_column].name;
            for (i, (id, _)) in rows.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(b"{\"type\":\"Feature\",\"id\":");
                write_int(&mut out, *id);
                out.extend_from_slice(b",\"properties\":{");
                write_str(&mut out, id_name);
                out.push(b':');
                write_int(&mut out, *id);
                out.extend_from_slice(b"},\"geometry\":null}");
            }
            out.extend_from_slice(b"]}");
            return Ok(out);
        }
        let limit = q
            .limit
            .filter(|l| *l > 0)
            .unwrap_or(self.settings.max_record_count)
            .min(self.settings.max_record_count);
        let start = q.offset.min(rows.len());
        let end = (start + limit).min(rows.len());
        let exceeded = end < rows.len();
        let page: Vec<u32> = rows[start..end].iter().map(|r| r.1).collect();
        Ok(self.write_features(descriptor, plan, Some(&data), &page, &out_cols, exceeded, q))
    }

    /// `"metadata"` and `"filtersApplied"`, after the leading members.
    fn write_tail(
        &self,
        out: &mut Vec<u8>,
        descriptor: &Descriptor,
        plan: &Plan<'_>,
        def: Option<&ViewDef>,
        exceeded: bool,
        with_type: bool,
    ) {
        if with_type {
            out.extend_from_slice(b",\"type\":\"FeatureCollection\"");
        }
        out.extend_from_slice(b",\"metadata\":{\"name\":");
        write_str(out, &descriptor.name);
        out.extend_from_slice(b",\"maxRecordCount\":");
        write_int(out, self.settings.max_record_count);
        out.extend_from_slice(b",\"fields\":");
        match def {
            Some(d) => out.extend_from_slice(&d.fields_json),
            None => out.extend_from_slice(b"[]"),
        }
        out.extend_from_slice(b",\"limitExceeded\":");
        out.extend_from_slice(if exceeded { b"true" } else { b"false" });
        out.extend_from_slice(b",\"idField\":");
        write_str(out, &plan.layer.id_field);
        if let Some(d) = &plan.layer.display_field {
            out.extend_from_slice(b",\"displayField\":");
            write_str(out, d);
        }
        out.extend_from_slice(
            concat!(
                "},\"filtersApplied\":{\"geometry\":true,\"where\":true,\"offset\":true,",
                "\"limit\":true,\"resultRecordCount\":true,\"objectIds\":true,",
                "\"orderByFields\":true}"
            )
            .as_bytes(),
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn write_features(
        &self,
        descriptor: &Descriptor,
        plan: &Plan<'_>,
        data: Option<&ViewData>,
        page: &[u32],
        out_cols: &[usize],
        exceeded: bool,
        q: &QuerySpec,
    ) -> Vec<u8> {
        let geometries = match data {
            Some(d) if q.return_geometry => {
                Some(d.geometry_column(plan.layer.geometry_path.text()))
            }
            _ => None,
        };
        let geometry_bytes: usize = geometries.map_or(0, |g| {
            page.iter()
                .map(|s| match g.get(*s) {
                    Some(GeometryOut::Json(b)) => b.len(),
                    _ => 64,
                })
                .sum()
        });
        let mut out = Vec::with_capacity(768 + page.len() * 256 + geometry_bytes);
        envelope_start(&mut out);
        self.write_tail(
            &mut out,
            descriptor,
            plan,
            data.map(|d| d.def.as_ref()),
            exceeded,
            true,
        );
        out.extend_from_slice(b",\"features\":[");
        if let Some(data) = data {
            for (i, &slot) in page.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(b"{\"type\":\"Feature\",\"id\":");
                write_value(&mut out, &data.id_of(slot).map_or(V::Null, V::Int));
                out.extend_from_slice(b",\"properties\":{");
                for (j, &c) in out_cols.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    write_str(&mut out, &data.def.columns[c].name);
                    out.push(b':');
                    write_value(&mut out, &data.columns[c].get(slot as usize));
                }
                out.extend_from_slice(b"},\"geometry\":");
                write_geometry(&mut out, geometries.and_then(|g| g.get(slot)));
                out.push(b'}');
            }
        }
        out.extend_from_slice(b"]}");
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn write_statistics(
        &self,
        descriptor: &Descriptor,
        plan: &Plan<'_>,
        data: &ViewData,
        rows: &[(i64, u32)],
        cols: &[Option<usize>],
        groups: &[usize],
        q: &QuerySpec,
    ) -> Vec<u8> {
        let specs = q.statistics.as_deref().unwrap_or(&[]);
        // Group rows by the group-by values (their JSON text is a total, printable key).
        let mut grouped: BTreeMap<Vec<u8>, (Vec<u32>, Vec<u8>)> = BTreeMap::new();
        for &(_, slot) in rows {
            let mut key = Vec::new();
            let mut members = Vec::new();
            for (i, &g) in groups.iter().enumerate() {
                let v = data.columns[g].get(slot as usize);
                write_value(&mut key, &v);
                key.push(0);
                if i > 0 {
                    members.push(b',');
                }
                write_str(&mut members, &data.def.columns[g].name);
                members.push(b':');
                write_value(&mut members, &v);
            }
            grouped
                .entry(key)
                .or_insert_with(|| (Vec::new(), members))
                .0
                .push(slot);
        }
        if groups.is_empty() && grouped.is_empty() {
            grouped.insert(Vec::new(), (Vec::new(), Vec::new()));
        }
        let mut out = Vec::new();
        envelope_start(&mut out);
        self.write_tail(&mut out, descriptor, plan, Some(&data.def), false, true);
        out.extend_from_slice(b",\"statistics\":[");
        for (gi, (_, (slots, members))) in grouped.iter().enumerate() {
            if gi > 0 {
                out.push(b',');
            }
            out.push(b'{');
            out.extend_from_slice(members);
            let mut first = members.is_empty();
            for (spec, col) in specs.iter().zip(cols) {
                if !first {
                    out.push(b',');
                }
                first = false;
                write_str(&mut out, &spec.out_name);
                out.push(b':');
                write_value(&mut out, &statistic(spec.kind, *col, data, slots));
            }
            out.push(b'}');
        }
        out.extend_from_slice(b"],\"features\":[]}");
        out
    }
}

/// One statistic over some rows. Nulls are skipped; `stddev` and `var` are the sample
/// forms (n - 1), null below two values.
fn statistic<'d>(kind: StatKind, col: Option<usize>, data: &'d ViewData, slots: &[u32]) -> V<'d> {
    let Some(col) = col else {
        return V::Int(slots.len() as i64);
    };
    let values: Vec<V<'d>> = slots
        .iter()
        .map(|s| data.columns[col].get(*s as usize))
        .filter(|v| *v != V::Null)
        .collect();
    let nums = || {
        values.iter().filter_map(|v| match v {
            V::Int(i) => Some(*i as f64),
            V::Float(f) => Some(*f),
            V::Bool(b) => Some(f64::from(u8::from(*b))),
            V::Date(d) => Some(*d as f64),
            _ => None,
        })
    };
    match kind {
        StatKind::Count => V::Int(values.len() as i64),
        StatKind::Min | StatKind::Max => values
            .iter()
            .cloned()
            .reduce(|a, b| {
                let o = compare(&a, &b).unwrap_or(Ordering::Equal);
                let keep_a = if kind == StatKind::Min {
                    o != Ordering::Greater
                } else {
                    o != Ordering::Less
                };
                if keep_a { a } else { b }
            })
            .unwrap_or(V::Null),
        StatKind::Sum => {
            if values.is_empty() {
                return V::Null;
            }
            // Integers sum exactly while they fit; past i64 the sum is a float.
            let exact = values.iter().try_fold(0i64, |acc, v| match v {
                V::Int(i) => acc.checked_add(*i),
                _ => None,
            });
            match exact {
                Some(total) => V::Int(total),
                None => V::Float(nums().sum()),
            }
        }
        StatKind::Avg => {
            let n: Vec<f64> = nums().collect();
            if n.is_empty() {
                V::Null
            } else {
                V::Float(n.iter().sum::<f64>() / n.len() as f64)
            }
        }
        StatKind::Var | StatKind::Stddev => {
            let n: Vec<f64> = nums().collect();
            if n.len() < 2 {
                return V::Null;
            }
            let mean = n.iter().sum::<f64>() / n.len() as f64;
            let var = n.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n.len() - 1) as f64;
            V::Float(if kind == StatKind::Var {
                var
            } else {
                var.sqrt()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every ASCII character alone, and strings mixing plain text with the characters that
    /// need escapes and with non-ASCII ones: each written as serde_json writes it.
    #[test]
    fn a_string_is_written_as_serde_json_writes_it() {
        let mut texts: Vec<String> = (0u8..128).map(|b| char::from(b).to_string()).collect();
        let pieces = [
            "Ada County",
            "\"",
            "\\",
            "\n",
            "\u{0}",
            "\u{1f}",
            "\u{7f}",
            "é",
            "東京",
            "🦪",
            "/",
            "'",
            " ",
            "",
        ];
        let mut state = 11u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state
        };
        for _ in 0..2_000 {
            let mut t = String::new();
            for _ in 0..(next() % 6) {
                t.push_str(pieces[(next() >> 33) as usize % pieces.len()]);
            }
            texts.push(t);
        }
        let mut out = b"x".to_vec();
        for t in &texts {
            out.truncate(1);
            write_str(&mut out, t);
            assert_eq!(out[1..], serde_json::to_vec(t).unwrap()[..], "{t:?}");
        }
    }

    #[test]
    fn coerces_what_koop_sends() {
        let body = json!({
            "params": {"id": "GDeltGKG", "layer": "3", "method": "query"},
            "query": {
                "f": "json", "inSR": 4326, "outSR": {"wkid": 4326},
                "geometry": "{\"x\":1,\"y\":2}",
                "returnGeometry": "true", "returnCountOnly": false,
                "resultRecordCount": "10", "resultOffset": 5,
                "outStatistics": "[{\"statisticType\":\"count\",\"onStatisticField\":\"OBJECTID\"}]",
                "geometryType": "esriGeometryEnvelope",
                "spatialRel": "esrispatialrelcontains",
                "time": "1495605600000,null",
                "objectIds": "1, 2,3",
                "extension": {"geometry": {"type": "Polygon", "coordinates": [[[0,0],[1,0],[1,1],[0,1],[0,0]]], "spatialReference": {"wkid": 4326}}}
            }
        });
        let r = FeatureRequest::from_json(&body).unwrap();
        assert_eq!(r.layer, Some(3));
        assert!(r.query.return_geometry);
        assert_eq!(r.query.limit, Some(10));
        assert_eq!(r.query.offset, 5);
        assert_eq!(r.query.object_ids, Some(vec![1, 2, 3]));
        assert_eq!(r.query.time, Some((Some(1_495_605_600_000), None)));
        let stats = r.query.statistics.unwrap();
        assert_eq!(stats[0].out_name, "OBJECTID_count");
        assert_eq!(r.query.geometry.unwrap().1, Relation::Contains);
    }

    #[test]
    fn refuses_bad_members() {
        let base =
            |q: Value| json!({"params": {"id": "s", "layer": 0, "method": "query"}, "query": q});
        let cases = [
            (
                json!({"geometryType": "gisGeometryCircle"}),
                "unsupported geometryType",
            ),
            (
                json!({"spatialRel": "gisSpatialRelNear"}),
                "unsupported spatialRel",
            ),
            (json!({"returnGeometry": "maybe"}), "returnGeometry"),
            (json!({"resultRecordCount": -1}), "resultRecordCount"),
            (json!({"objectIds": "1,x"}), "objectIds"),
            (json!({"outStatistics": "[{"}), "outStatistics"),
            (
                json!({"outStatistics": [{"statisticType": "median", "onStatisticField": "a"}]}),
                "median",
            ),
            (
                json!({"extension": {"geometry": {"type": "Point", "coordinates": [500, 0]}}}),
                "longitude 500",
            ),
        ];
        for (q, needle) in cases {
            let e = FeatureRequest::from_json(&base(q.clone()))
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{q}: {e}");
        }
        assert!(
            FeatureRequest::from_json(&json!({"query": {}}))
                .unwrap_err()
                .to_string()
                .contains("params")
        );
        assert!(matches!(
            FeatureRequest::from_json(&json!({"params": {"id": "s", "layer": "abc"}})),
            Err(FeatureError::LayerNotFound(_))
        ));
    }

    /// The kept timestamp text is the one of the same millisecond, and a new millisecond,
    /// earlier or later, is written afresh.
    #[test]
    fn timestamps_are_kept_only_for_their_millisecond() {
        let fresh = |ms: i64| {
            let mut v = Vec::new();
            write_datetime(&mut v, ms);
            v
        };
        for ms in [
            1_763_700_000_123,
            1_763_700_000_123,
            1_763_700_000_124,
            1_763_700_000_123,
            0,
            // Outside years 0 to 9999: not kept, still right.
            -62_200_000_000_000,
            253_402_300_800_000,
            1_763_700_000_124,
        ] {
            let mut out = b"x".to_vec();
            write_timestamp(&mut out, ms);
            assert_eq!(out[1..], fresh(ms), "{ms}");
        }
        let mut out = Vec::new();
        envelope_start(&mut out);
        out.extend_from_slice(b"}");
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["$version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(v["$timestamp"].as_str().unwrap().len(), 24);
    }

    /// A body bound to the kept one ([`Prepared`]) gives what parsing it gives, whatever its
    /// coordinates, including ones that are not a valid geometry, not JSON, or not one array;
    /// bodies of several shapes and two users are interleaved, so kept bodies are also
    /// compared with ones that differ from them elsewhere.
    #[test]
    fn a_bound_body_is_what_parsing_gives() {
        let templates = [
            r#"{"params":{"id":"lt-counties","layer":0,"method":"query"},"query":{"returnGeometry":1,"geometryType":"gisGeometryPoint","spatialRel":"gisSpatialRelContains","extension":{"geometry":{"type":"Point","coordinates":@}}}}"#,
            r#"{"params":{"id":"lt-counties","layer":1,"method":"query"},"query":{"returnGeometry":1,"geometryType":"gisGeometryPoint","spatialRel":"gisSpatialRelContains","extension":{"geometry":{"type":"Point","coordinates":@}}}}"#,
            r#"{"params":{"id":"lt-counties","layer":0,"method":"query"},"query":{"returnGeometry":0,"geometryType":"gisGeometryPoint","spatialRel":"gisSpatialRelContains","extension":{"geometry":{"type":"Point","coordinates":@}}}}"#,
            "{ \"query\": {\"extension\": {\"geometry\": {\"coordinates\": @ , \"type\": \"Point\"}},\n \"where\": \"name = 'Potter'\", \"outFields\": \"*\", \"spatialRel\": \"esriSpatialRelIntersects\"},\n \"params\": {\"id\": \"s\", \"layer\": \"0\", \"method\": \"query\"} }\n",
            r#"{"params":{"id":"lt-places","layer":0,"method":"query"},"query":{"returnGeometry":0,"geometryType":"gisGeometryEnvelope","spatialRel":"gisSpatialRelIntersects","extension":{"geometry":{"type":"Polygon","coordinates":@}}}}"#,
            r#"{"params":{"id":"s","layer":0},"query":{"extension":{"geometry":{"type":"MultiPoint","coordinates":@}},"resultRecordCount":"5"}}"#,
        ];
        let mut coords: Vec<String> = [
            "[1.5,2.25]",
            "[-100.26183662316625,45.246596062450614]",
            "[0,0]",
            "[-0,1e2]",
            "[ 3 , 4 ]",
            "[1,2,3]",
            "[1]",
            "[]",
            "[1e400,0]",
            "[181,0]",
            "[0,-90.5]",
            "[180,90]",
            "[-180.0,-90.0]",
            "[12345678901234567890,1]",
            "[-9223372036854775809,1]",
            "[1.7976931348623157e308,0]",
            r#"["a",1]"#,
            r#"["]",1]"#,
            "[[1,2]]",
            "[[1,2],[3,4]]",
            "[null,1]",
            "[1,2] ",
            " [1,2]",
            "[1,2]]",
            "[1,2],[3,4]",
            "[1,2],\"x\":[3,4]",
            "[1,2}",
            "1",
            "null",
            "[[[0,0],[1,0],[1,1],[0,1],[0,0]]]",
            "[[[0,0],[1,0]]]",
            "[[[0,0],[1,0],[1,1],[0,1],[0,0]],[[0.2,0.2],[0.4,0.2],[0.4,0.4],[0.2,0.2]]]",
        ]
        .iter()
        .map(|c| c.to_string())
        .collect();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..200 {
            let x = (next() % 36_000_000) as f64 / 100_000.0 - 180.0;
            let y = (next() % 18_000_000) as f64 / 100_000.0 - 90.0;
            coords.push(format!("[{x},{y}]"));
            coords.push(format!(
                "[[[{x},{y}],[{},{y}],[{},{}],[{x},{}],[{x},{y}]]]",
                x + 0.5,
                x + 0.5,
                y + 0.5,
                y + 0.5
            ));
        }
        let (mut bound, mut total) = (0, 0);
        // Runs of one shape and user, as a client sends them, between changes of both.
        while total < 6_000 {
            let template = templates[(next() % templates.len() as u64) as usize];
            assert_eq!(template.matches('@').count(), 1);
            let user = ["u1", "u2"][(next() % 2) as usize];
            for _ in 0..1 + next() % 8 {
                let c = &coords[(next() % coords.len() as u64) as usize];
                let body = template.replace('@', c);
                let binds = PREPARED.with(|p| {
                    let kept = p.borrow();
                    kept.as_ref()
                        .and_then(|p| p.bind(user, body.as_bytes(), DEFAULT_MAX_QUERY_VERTICES))
                        .is_some()
                });
                bound += usize::from(binds);
                total += 1;
                let got =
                    FeatureRequest::parse_for(user, body.as_bytes(), DEFAULT_MAX_QUERY_VERTICES);
                let want = FeatureRequest::parse(body.as_bytes());
                assert_eq!(format!("{got:?}"), format!("{want:?}"), "{user}: {body}");
            }
        }
        assert!(bound > total / 3, "{bound} of {total} bound");
    }

    /// The kept body is one user's: another's body of the same shape is parsed.
    #[test]
    fn a_kept_body_binds_only_for_its_user() {
        let body = |x: f64| {
            format!(
                r#"{{"params":{{"id":"s","layer":0}},"query":{{"extension":{{"geometry":{{"type":"Point","coordinates":[{x},1]}}}}}}}}"#
            )
        };
        FeatureRequest::parse_for("u1", body(1.0).as_bytes(), DEFAULT_MAX_QUERY_VERTICES).unwrap();
        let binds = |user: &str, b: &str| {
            PREPARED.with(|p| {
                p.borrow()
                    .as_ref()
                    .and_then(|p| p.bind(user, b.as_bytes(), DEFAULT_MAX_QUERY_VERTICES))
                    .is_some()
            })
        };
        assert!(binds("u1", &body(2.5)));
        assert!(!binds("u2", &body(2.5)));
        assert!(!binds("u", &body(2.5)));
        assert!(!binds("u1", &body(2.5).replace("\"s\"", "\"t\"")));
        let r = FeatureRequest::parse_for("u1", body(2.5).as_bytes(), DEFAULT_MAX_QUERY_VERTICES)
            .unwrap();
        let (q, _) = r.query.geometry.unwrap();
        assert_eq!(q.as_point(), Some((2.5, 1.0)));
    }

    #[test]
    fn prefixes_in_any_case() {
        assert_eq!(
            enum_value("gisSpatialRelContains", "spatialrel"),
            Some("Contains")
        );
        assert_eq!(
            enum_value("ESRISPATIALRELWITHIN", "spatialrel"),
            Some("WITHIN")
        );
        assert_eq!(enum_value("esriGeometryPoint", "geometry"), Some("Point"));
        assert_eq!(enum_value("gis", "spatialrel"), None);
        assert_eq!(enum_value("SpatialRelContains", "spatialrel"), None);
    }
}
