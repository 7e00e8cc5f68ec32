//! The geoQueryService request: its model (`FeatureRequest`, `QuerySpec`), the two readers
//! of a body (the fast reader in `fast_reader` and serde, which must agree), the per-thread cache of
//! a prepared body, Esri geometries (`esri`) and the coercions Koop-style clients need.

use super::*;

mod esri;
mod fast_reader;

pub use esri::EsriError;

/// Why a geoQueryService request was refused before it ran: each a 400 naming the member.
#[derive(Debug, Error)]
pub enum RequestError {
    #[error("the request body is not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("the request body is not a geoQueryService request: {0}")]
    NotARequest(serde_json::Error),
    #[error("the request body has no \"params\" object")]
    NoParams,
    #[error("params.id (the service name) is required")]
    NoService,
    #[error("{member} must be true or false{}", not(.got))]
    NotBoolean {
        member: &'static str,
        got: Option<String>,
    },
    #[error("{member} must be a non-negative integer{}", not(.got))]
    NotCount {
        member: &'static str,
        got: Option<String>,
    },
    #[error("time: {0:?} is not milliseconds since the epoch")]
    TimeText(String),
    #[error("time must be milliseconds")]
    TimeNotMillis,
    #[error("time must be \"start,end\" in milliseconds")]
    TimeShape,
    #[error("outStatistics is not valid JSON: {0}")]
    StatisticsNotJson(serde_json::Error),
    #[error("outStatistics must be an array of statistic definitions")]
    StatisticsShape,
    #[error("outStatistics[{index}].{member} is required")]
    StatisticMissing { index: usize, member: &'static str },
    #[error(
        "outStatistics[{index}].statisticType {got:?} is not one of count, sum, min, max, avg, \
         stddev, var"
    )]
    StatisticType { index: usize, got: String },
    #[error("outStatistics: {kind} needs a numeric field, and {field} is a {scalar}")]
    StatisticNotNumeric {
        kind: &'static str,
        field: String,
        scalar: &'static str,
    },
    #[error("objectIds must be integers")]
    ObjectIdsNotIntegers,
    #[error("objectIds {0:?} is not a list of integers")]
    ObjectIdsText(String),
    #[error("objectIds must be \"1,2,3\" or a number")]
    ObjectIdsShape,
    #[error("unsupported geometryType {0}")]
    GeometryType(String),
    #[error(
        "unsupported spatialRel {0}: use esriSpatialRelIntersects, esriSpatialRelContains, \
         esriSpatialRelWithin, esriSpatialRelCrosses, esriSpatialRelOverlaps, \
         esriSpatialRelTouches or esriSpatialRelEnvelopeIntersects (or gisSpatialRel…)"
    )]
    SpatialRel(String),
    #[error("extension.geometry: {0}")]
    Geometry(crate::spatial::GeometryError),
    #[error("extension.geometry: type: geometry has no string member \"type\"")]
    NoGeometryType,
    #[error("extension.geometry: coordinates: {0} has no member \"coordinates\"")]
    NoCoordinates(String),
    #[error("extension.geometry has {got} positions, above max_query_vertices ({max})")]
    TooManyVertices { got: usize, max: usize },
    #[error(transparent)]
    Esri(#[from] EsriError),
    #[error("distance must be a number{}", not(.0))]
    DistanceNotNumber(Option<String>),
    #[error("distance must be a non-negative number, not {0}")]
    DistanceNegative(f64),
    #[error("distance is supported with spatialRel intersects only, not {0}")]
    DistanceRelation(&'static str),
    #[error("distance needs a query geometry")]
    DistanceWithoutGeometry,
    #[error("unknown field {name} in {member}")]
    UnknownField { name: String, member: &'static str },
    #[error("orderByFields: {0} is not ASC or DESC")]
    OrderDirection(String),
}

/// `, not "text"` after a refusal that saw text, nothing otherwise.
fn not(got: &Option<String>) -> String {
    got.as_ref()
        .map(|s| format!(", not {s:?}"))
        .unwrap_or_default()
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
    pub(super) fn parse(s: &str) -> Option<StatKind> {
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
    pub(super) fn is_numeric(self) -> bool {
        match self {
            StatKind::Sum | StatKind::Avg | StatKind::Stddev | StatKind::Var => true,
            StatKind::Count | StatKind::Min | StatKind::Max => false,
        }
    }

    pub(super) fn name(self) -> &'static str {
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
    /// Over the limit, a page spread evenly over the ordered matches instead of the first
    /// ones: a map tile's sample of a dense layer. Set by the server only, never by a request.
    pub spread: bool,
    /// Answer as an Esri feature set, id list or count (the native FeatureServer), written
    /// so. Set by the server only; statistics are still written as geoQueryService writes them.
    pub esri: Option<EsriShape>,
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
pub enum Coercible<'a> {
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

impl<'de: 'a, 'a> Deserialize<'de> for Coercible<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Visit<'a> {
            type Value = Coercible<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Coercible<'a>, E> {
                Ok(Coercible::Bool(b))
            }
            fn visit_i64<E: de::Error>(self, i: i64) -> Result<Coercible<'a>, E> {
                Ok(Coercible::Int(i))
            }
            fn visit_u64<E: de::Error>(self, u: u64) -> Result<Coercible<'a>, E> {
                Ok(i64::try_from(u).map_or(Coercible::Float(u as f64), Coercible::Int))
            }
            fn visit_f64<E: de::Error>(self, f: f64) -> Result<Coercible<'a>, E> {
                Ok(Coercible::Float(f))
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Coercible<'a>, E> {
                Ok(Coercible::Str(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Coercible<'a>, E> {
                Ok(Coercible::Str(Cow::Owned(s.to_string())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Coercible<'a>, E> {
                Ok(Coercible::Str(Cow::Owned(s)))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Coercible<'a>, E> {
                Ok(Coercible::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Coercible<'a>, E> {
                Ok(Coercible::Null)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Coercible<'a>, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(Coercible::Other)
            }
            fn visit_map<A: de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Coercible<'a>, A::Error> {
                while map
                    .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Coercible::Other)
            }
        }
        d.deserialize_any(Visit(std::marker::PhantomData))
    }
}

impl Coercible<'_> {
    pub(super) fn is_set(&self) -> bool {
        !matches!(self, Coercible::Absent | Coercible::Null)
    }

    pub(super) fn text(&self) -> Option<String> {
        match self {
            Coercible::Str(s) => Some(s.to_string()),
            Coercible::Int(i) => Some(i.to_string()),
            Coercible::Float(f) => Some(f.to_string()),
            _ => None,
        }
    }

    pub(super) fn as_str(&self) -> Option<&str> {
        match self {
            Coercible::Str(s) => Some(s),
            _ => None,
        }
    }
}

#[derive(Debug, PartialEq, Deserialize, Default)]
#[serde(default)]
pub(super) struct RawParams<'a> {
    #[serde(borrow)]
    id: Coercible<'a>,
    #[serde(borrow)]
    layer: Coercible<'a>,
    #[serde(borrow)]
    method: Coercible<'a>,
}

/// A GeoJSON geometry as the request carries it: its coordinates are nested arrays, so no
/// JSON object map is built (`spatialReference` and other members are skipped).
#[derive(Debug, PartialEq, Deserialize)]
pub(super) struct RawGeometry<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    coordinates: Option<Value>,
}

#[derive(Debug, PartialEq, Deserialize, Default)]
#[serde(default)]
pub(super) struct RawExtension<'a> {
    #[serde(borrow)]
    geometry: Option<RawGeometry<'a>>,
}

/// The `query` members this service reads; every other member is ignored.
#[derive(Debug, PartialEq, Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct RawQuery<'a> {
    #[serde(borrow, rename = "where")]
    where_: Coercible<'a>,
    object_ids: Option<Value>,
    #[serde(borrow)]
    out_fields: Coercible<'a>,
    #[serde(borrow)]
    return_geometry: Coercible<'a>,
    #[serde(borrow)]
    return_count_only: Coercible<'a>,
    #[serde(borrow)]
    return_ids_only: Coercible<'a>,
    #[serde(borrow)]
    order_by_fields: Coercible<'a>,
    #[serde(borrow)]
    result_offset: Coercible<'a>,
    #[serde(borrow)]
    result_record_count: Coercible<'a>,
    out_statistics: Option<Value>,
    group_by_fields_for_statistics: Option<Value>,
    time: Option<Value>,
    #[serde(borrow)]
    geometry_type: Coercible<'a>,
    #[serde(borrow)]
    spatial_rel: Coercible<'a>,
    #[serde(borrow)]
    extension: Option<RawExtension<'a>>,
    /// An Esri JSON geometry (or its text form), read when there is no `extension`.
    geometry: Option<Value>,
    #[serde(rename = "inSR")]
    in_sr: Option<Value>,
    #[serde(borrow)]
    distance: Coercible<'a>,
    #[serde(borrow)]
    units: Coercible<'a>,
}

#[derive(Debug, PartialEq, Deserialize)]
pub(super) struct RawRequest<'a> {
    #[serde(borrow, default)]
    params: Option<RawParams<'a>>,
    #[serde(borrow, default)]
    query: Option<RawQuery<'a>>,
}

pub(super) fn boolish(v: &Coercible<'_>, member: &'static str) -> Result<bool, RequestError> {
    let fail = |got: Option<&str>| RequestError::NotBoolean {
        member,
        got: got.map(str::to_string),
    };
    match v {
        Coercible::Bool(b) => Ok(*b),
        Coercible::Int(i) => Ok(*i != 0),
        Coercible::Float(f) => Ok(*f != 0.0),
        Coercible::Str(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" | "" => Ok(false),
            _ => Err(fail(Some(s))),
        },
        Coercible::Absent | Coercible::Null => Ok(false),
        Coercible::Other => Err(fail(None)),
    }
}

pub(super) fn count(
    v: &Coercible<'_>,
    member: &'static str,
) -> Result<Option<usize>, RequestError> {
    let fail = |got: Option<&str>| RequestError::NotCount {
        member,
        got: got.map(str::to_string),
    };
    match v {
        Coercible::Absent | Coercible::Null => Ok(None),
        Coercible::Int(i) => usize::try_from(*i).map(Some).map_err(|_| fail(None)),
        Coercible::Float(f) if *f >= 0.0 && f.fract() == 0.0 => Ok(Some(*f as usize)),
        Coercible::Str(s) if s.trim().is_empty() => Ok(None),
        Coercible::Str(s) => s
            .trim()
            .parse::<usize>()
            .map(Some)
            .map_err(|_| fail(Some(s))),
        _ => Err(fail(None)),
    }
}

/// Strip a `gis`/`esri` prefix and a type word, case-insensitively: `esriSpatialRelContains`
/// -> `Contains`. Borrows: it runs on every query.
pub(super) fn enum_value<'v>(v: &'v str, kind: &str) -> Option<&'v str> {
    let strip = |s: &'v str, p: &str| {
        (s.len() >= p.len() && s.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes()))
            .then(|| &s[p.len()..])
    };
    let rest = strip(v, "gis").or_else(|| strip(v, "esri"))?;
    strip(rest, kind)
}

pub(super) fn parse_time(v: &Value) -> Result<Option<TimeWindow>, RequestError> {
    let one = |s: &str| -> Result<Option<i64>, RequestError> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("null") {
            return Ok(None);
        }
        s.parse::<i64>()
            .map(Some)
            .map_err(|_| RequestError::TimeText(s.to_string()))
    };
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => {
            let t = n.as_i64().ok_or(RequestError::TimeNotMillis)?;
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
                Value::Number(n) => n.as_i64().map(Some).ok_or(RequestError::TimeNotMillis),
                Value::String(s) => one(s),
                _ => Err(RequestError::TimeNotMillis),
            };
            Ok(Some((part(&a[0])?, part(&a[1])?)))
        }
        _ => Err(RequestError::TimeShape),
    }
}

pub(super) fn parse_statistics(v: &Value) -> Result<Option<Vec<StatSpec>>, RequestError> {
    let parsed;
    let list = match v {
        Value::Null => return Ok(None),
        Value::String(s) if s.trim().is_empty() => return Ok(None),
        Value::String(s) => {
            parsed = serde_json::from_str::<Value>(s).map_err(RequestError::StatisticsNotJson)?;
            &parsed
        }
        other => other,
    };
    let items: Vec<&Value> = match list {
        Value::Array(a) => a.iter().collect(),
        Value::Object(_) => vec![list],
        _ => {
            return Err(RequestError::StatisticsShape);
        }
    };
    let mut out = Vec::new();
    for (i, s) in items.into_iter().enumerate() {
        let kind_text = s.get("statisticType").and_then(Value::as_str).ok_or(
            RequestError::StatisticMissing {
                index: i,
                member: "statisticType",
            },
        )?;
        let kind = StatKind::parse(kind_text).ok_or_else(|| RequestError::StatisticType {
            index: i,
            got: kind_text.to_string(),
        })?;
        let field = s
            .get("onStatisticField")
            .and_then(Value::as_str)
            .ok_or(RequestError::StatisticMissing {
                index: i,
                member: "onStatisticField",
            })?
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
pub(super) fn serde_read(body: &[u8]) -> Result<RawRequest<'_>, RequestError> {
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => RequestError::NotARequest(e),
        _ => RequestError::NotJson(e),
    })
}

/// A body this thread parsed, kept so that the next body of the same shape from the same user
/// is bound rather than parsed: the server's side of a prepared statement. Clients send one
/// request again and again with only the point or box changed, so a body that is the kept one
/// up to its coordinates array and again after it is the kept request with new coordinates.
///
/// That holds because the reader ([`fast_reader`]) reads the body in one pass from the left: over the
/// same prefix it does the same; a JSON array ends at its own `]`, so it reads the new array
/// whole and then the same suffix. And every member but the geometry was coerced and checked
/// already, with the geometry last (as in [`FeatureRequest::from_raw`]). Kept only for bodies
/// the reader (not serde) read, and a user's bodies are only ever compared with that user's.
pub(super) struct Prepared {
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
pub(super) const PREPARED_MAX_BODY: usize = 4096;

thread_local! {
    static PREPARED: RefCell<Option<Prepared>> = const { RefCell::new(None) };
}

impl Prepared {
    /// The request `body` makes, when it is the kept body with other coordinates.
    pub(super) fn bind(
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
            query_geometry(&self.kind, &coords, relation, max_vertices)
                .map(|g| {
                    request.query.geometry = Some(g);
                    request
                })
                .map_err(FeatureError::from),
        )
    }
}

/// `distance` in `units`, in metres; `None` for none or 0. Only `intersects` (the default)
/// measures a distance.
pub(super) fn distance(
    d: &Coercible<'_>,
    units: &Coercible<'_>,
    relation: Relation,
) -> Result<Option<f64>, RequestError> {
    let value = match d {
        Coercible::Absent | Coercible::Null => return Ok(None),
        Coercible::Int(i) => *i as f64,
        Coercible::Float(f) => *f,
        Coercible::Str(s) if s.trim().is_empty() => return Ok(None),
        Coercible::Str(s) => s
            .trim()
            .parse::<f64>()
            .map_err(|_| RequestError::DistanceNotNumber(Some(s.to_string())))?,
        _ => return Err(RequestError::DistanceNotNumber(None)),
    };
    if !value.is_finite() || value < 0.0 {
        return Err(RequestError::DistanceNegative(value));
    }
    if value == 0.0 {
        return Ok(None);
    }
    let per = esri::meters_per(units.text().as_deref())?;
    if relation != Relation::Intersects {
        return Err(RequestError::DistanceRelation(relation.name()));
    }
    Ok(Some(value * per))
}

/// The query geometry and relation of a request's `extension.geometry`, refused with more
/// than `max_vertices` positions before it is prepared.
pub(super) fn query_geometry(
    kind: &str,
    coords: &Value,
    relation: Relation,
    max_vertices: usize,
) -> Result<(Arc<Query>, Relation), RequestError> {
    let geometry = parse_parts(kind, coords, Default::default()).map_err(RequestError::Geometry)?;
    let n = coord_count(&geometry);
    if n > max_vertices {
        return Err(too_many_vertices(n, max_vertices));
    }
    Ok((Arc::new(Query::new(geometry)), relation))
}

pub(super) fn too_many_vertices(n: usize, max: usize) -> RequestError {
    RequestError::TooManyVertices { got: n, max }
}

/// Whether the fast reader and serde read `body` alike: wherever the reader answers, serde
/// gives the same members (the property the fuzzing targets check).
pub fn readers_agree(body: &[u8]) -> bool {
    match fast_reader::read_spanned(body) {
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
pub(super) fn check_arrays(body: &[u8], max_vertices: usize) -> Result<(), FeatureError> {
    const OTHER_ARRAYS: usize = 64;
    let arrays = memchr::memchr_iter(b'[', body).count();
    if arrays > max_vertices.saturating_add(OTHER_ARRAYS) {
        return Err(too_many_vertices(arrays, max_vertices).into());
    }
    Ok(())
}

impl FeatureRequest {
    /// Parse and coerce a request body. Unknown members are ignored, as clients send many.
    /// A query geometry may have [`DEFAULT_MAX_QUERY_VERTICES`] positions.
    pub fn parse(body: &[u8]) -> Result<FeatureRequest, FeatureError> {
        check_arrays(body, DEFAULT_MAX_QUERY_VERTICES)?;
        match fast_reader::read_spanned(body) {
            Some((raw, _)) => FeatureRequest::from_raw(raw, DEFAULT_MAX_QUERY_VERTICES),
            None => FeatureRequest::from_raw(serde_read(body)?, DEFAULT_MAX_QUERY_VERTICES),
        }
    }

    /// A query of `layer` of `service` from text parameters, as ArcGIS clients send a
    /// FeatureServer query: the members geoQueryService reads, under the same names, coerced
    /// and checked as a body's are. Empty values are unset; other names are ignored.
    pub fn from_params<'p>(
        service: &str,
        layer: i64,
        params: impl IntoIterator<Item = (&'p str, &'p str)>,
        max_vertices: usize,
    ) -> Result<FeatureRequest, FeatureError> {
        let mut q = RawQuery::default();
        for (name, v) in params {
            if v.is_empty() {
                continue;
            }
            let text = Coercible::Str(Cow::Borrowed(v));
            let value = Some(Value::String(v.to_string()));
            match name {
                "where" => q.where_ = text,
                "objectIds" => q.object_ids = value,
                "outFields" => q.out_fields = text,
                "returnGeometry" => q.return_geometry = text,
                "returnCountOnly" => q.return_count_only = text,
                "returnIdsOnly" => q.return_ids_only = text,
                "orderByFields" => q.order_by_fields = text,
                "resultOffset" => q.result_offset = text,
                "resultRecordCount" => q.result_record_count = text,
                "outStatistics" => q.out_statistics = value,
                "groupByFieldsForStatistics" => q.group_by_fields_for_statistics = value,
                "time" => q.time = value,
                "geometryType" => q.geometry_type = text,
                "spatialRel" => q.spatial_rel = text,
                "geometry" => q.geometry = value,
                "inSR" => q.in_sr = value,
                "distance" => q.distance = text,
                "units" => q.units = text,
                _ => {}
            }
        }
        let raw = RawRequest {
            params: Some(RawParams {
                id: Coercible::Str(Cow::Borrowed(service)),
                layer: Coercible::Int(layer),
                method: Coercible::Str(Cow::Borrowed("query")),
            }),
            query: Some(q),
        };
        FeatureRequest::from_raw(raw, max_vertices)
    }

    /// [`FeatureRequest::parse`], for `user`, with a query geometry of at most
    /// `max_vertices` positions: a body of the same shape as the last one this thread parsed
    /// for `user` is bound to that one's request (`Prepared`).
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
        let Some((raw, span)) = fast_reader::read_spanned(body) else {
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
    pub(super) fn from_raw(
        raw: RawRequest<'_>,
        max_vertices: usize,
    ) -> Result<FeatureRequest, FeatureError> {
        let params = raw.params.ok_or(RequestError::NoParams)?;
        let service = params
            .id
            .text()
            .filter(|s| !s.is_empty())
            .ok_or(RequestError::NoService)?;
        let (layer, layer_text) = match &params.layer {
            Coercible::Absent | Coercible::Null => (None, None),
            // A number's text is the number itself: the 404 message writes it when needed.
            Coercible::Int(i) => (Some(*i), None),
            Coercible::Float(f) if f.fract() == 0.0 => (Some(*f as i64), None),
            Coercible::Str(s) => match s.trim().parse::<i64>() {
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
            Value::Number(n) => Some(vec![n.as_i64().ok_or(RequestError::ObjectIdsNotIntegers)?]),
            Value::String(s) if s.trim().is_empty() => None,
            Value::String(s) => Some(
                s.split(',')
                    .map(|p| p.trim().parse::<i64>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| RequestError::ObjectIdsText(s.to_string()))?,
            ),
            Value::Array(a) => Some(
                a.iter()
                    .map(|x| {
                        x.as_i64()
                            .or_else(|| x.as_str().and_then(|s| s.trim().parse().ok()))
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or(RequestError::ObjectIdsNotIntegers)?,
            ),
            _ => return Err(RequestError::ObjectIdsShape.into()),
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
                return Err(RequestError::GeometryType(shown).into());
            }
        }
        let relation = match q.spatial_rel.as_str().filter(|s| !s.is_empty()) {
            None => Relation::Intersects,
            Some(r) => enum_value(r, "spatialrel")
                .and_then(Relation::parse)
                .ok_or_else(|| RequestError::SpatialRel(r.to_string()))?,
        };
        spec.distance = distance(&q.distance, &q.units, relation)?;
        if let Some(g) = q.extension.and_then(|e| e.geometry) {
            let kind = g.kind.ok_or(RequestError::NoGeometryType)?;
            let coords = g
                .coordinates
                .ok_or_else(|| RequestError::NoCoordinates(kind.to_string()))?;
            spec.geometry = Some(query_geometry(&kind, &coords, relation, max_vertices)?);
        } else if let Some(g) = q
            .geometry
            .filter(|g| !g.is_null() && g.as_str() != Some(""))
        {
            // An ArcGIS client's own geometry: never dropped, used or refused.
            let (kind, coords) =
                esri::to_geojson(&g, q.in_sr.as_ref()).map_err(RequestError::from)?;
            spec.geometry = Some(query_geometry(&kind, &coords, relation, max_vertices)?);
        }
        if spec.distance.is_some() && spec.geometry.is_none() {
            return Err(RequestError::DistanceWithoutGeometry.into());
        }
        Ok(FeatureRequest {
            service,
            layer,
            layer_text,
            method,
            query: spec,
        })
    }

    #[cfg(test)]
    /// [`FeatureRequest::parse`] of an already parsed body (tests, tools).
    pub(crate) fn from_json(body: &Value) -> Result<FeatureRequest, FeatureError> {
        FeatureRequest::parse(&serde_json::to_vec(body).unwrap_or_default())
    }

    /// Small enough to answer on the calling task: a point query, or no query at all.
    /// A page worth spreading over nodes in two rounds (keys, then the page's rows): one at
    /// an offset at least as large as the page, which is `max_record_count` rows unless asked.
    pub fn deep_page(&self, max_record_count: usize) -> bool {
        let q = &self.query;
        let limit = q.limit.filter(|l| *l > 0).unwrap_or(max_record_count);
        self.method.as_deref() == Some("query")
            && !q.count_only
            && !q.ids_only
            && q.statistics.is_none()
            && !q.spread
            && q.offset > 0
            && q.offset >= limit.min(max_record_count)
    }

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

#[cfg(test)]
mod tests;
