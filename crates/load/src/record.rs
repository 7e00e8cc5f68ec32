//! What a reader makes of its input: records, each a feature or the problem that keeps it
//! out, with where it was found.

use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};

/// Where a record was found: a file and a line, feature or row number (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    pub file: Arc<str>,
    pub unit: Unit,
    pub number: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Line,
    Feature,
    Row,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.unit {
            Unit::Line => "line",
            Unit::Feature => "feature",
            Unit::Row => "row",
        };
        write!(f, "{} {unit} {}", self.file, self.number)
    }
}

/// A record as read: its properties and its GeoJSON geometry. CSV values are text.
#[derive(Debug, Clone, PartialEq)]
pub struct Feature {
    pub properties: Map<String, Value>,
    pub geometry: Value,
    /// A row of a table (CSV), whose columns are the record itself, rather than a feature.
    pub row: bool,
}

/// Why a record cannot be loaded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Problem {
    #[error("bad JSON: {0}")]
    BadJson(String),
    #[error("not a GeoJSON feature: {0}")]
    NotAFeature(String),
    #[error("no geometry")]
    NoGeometry,
    #[error("missing coordinates: {x} or {y} is empty")]
    MissingCoordinates { x: String, y: String },
    #[error("{field} is not a number: {value:?}")]
    NotNumeric { field: String, value: String },
    #[error("{field} is not WKT: {message}")]
    BadWkt { field: String, message: String },
    #[error("a row of {got} fields where the header has {want}")]
    RowLength { got: usize, want: usize },
    #[error("the geometry is not usable: {0}")]
    Geometry(String),
    #[error("property {property:?} value {value} does not fit its column {column} ({kind})")]
    DoesNotFit {
        property: String,
        column: String,
        value: String,
        kind: &'static str,
    },
}

/// One record: where it was found, and what it holds or why it cannot be used.
pub type Record = (At, Result<Feature, Problem>);
