//! Row-extraction templates (INTERFACE §2.3, docs/contract.md §4): parsing, validation, and the
//! typed values that rows hold.

use std::sync::Arc;

use serde_json::Value;

use super::path::{ContextNode, Path, PathTooCostly};
use crate::time::parse_datetime;

/// The collection that marks a document as a template.
pub use crate::acl::TEMPLATE_COLLECTION;

/// A column's declared type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarType {
    Int,
    UnsignedInt,
    Long,
    UnsignedLong,
    Float,
    Double,
    Decimal,
    String,
    Boolean,
    Date,
    DateTime,
}

/// How a column's values are stored and compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int,
    Float,
    Str,
    Bool,
    /// Milliseconds since the Unix epoch (UTC).
    Date,
}

impl ScalarType {
    pub(crate) const NAMES: &'static str = "int, unsignedInt, long, unsignedLong, float, double, decimal, string, boolean, date, dateTime";

    pub fn parse(name: &str) -> Option<ScalarType> {
        Some(match name {
            "int" | "integer" | "short" => ScalarType::Int,
            "unsignedInt" => ScalarType::UnsignedInt,
            "long" => ScalarType::Long,
            "unsignedLong" => ScalarType::UnsignedLong,
            "float" => ScalarType::Float,
            "double" => ScalarType::Double,
            "decimal" => ScalarType::Decimal,
            "string" => ScalarType::String,
            "boolean" => ScalarType::Boolean,
            "date" => ScalarType::Date,
            "dateTime" => ScalarType::DateTime,
            _ => return None,
        })
    }

    /// The name as templates write it.
    pub fn name(self) -> &'static str {
        match self {
            ScalarType::Int => "int",
            ScalarType::UnsignedInt => "unsignedInt",
            ScalarType::Long => "long",
            ScalarType::UnsignedLong => "unsignedLong",
            ScalarType::Float => "float",
            ScalarType::Double => "double",
            ScalarType::Decimal => "decimal",
            ScalarType::String => "string",
            ScalarType::Boolean => "boolean",
            ScalarType::Date => "date",
            ScalarType::DateTime => "dateTime",
        }
    }

    pub fn kind(self) -> Kind {
        match self {
            ScalarType::Int
            | ScalarType::UnsignedInt
            | ScalarType::Long
            | ScalarType::UnsignedLong => Kind::Int,
            ScalarType::Float | ScalarType::Double | ScalarType::Decimal => Kind::Float,
            ScalarType::String => Kind::Str,
            ScalarType::Boolean => Kind::Bool,
            ScalarType::Date | ScalarType::DateTime => Kind::Date,
        }
    }

    /// The field type of the feature-service metadata (docs/contract.md §5).
    pub(crate) fn field_type(self) -> &'static str {
        match self.kind() {
            Kind::Int | Kind::Bool => "Integer",
            Kind::Float => "Double",
            Kind::Str => "String",
            Kind::Date => "Date",
        }
    }

    /// Convert a JSON value; `None` when it does not convert (a null in the row).
    pub fn convert(self, v: &Value) -> Option<Cell> {
        match self.kind() {
            Kind::Int => {
                let i = match v {
                    Value::Number(n) => n.as_i64().or_else(|| {
                        n.as_f64()
                            .filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18)
                            .map(|f| f as i64)
                    }),
                    Value::String(s) => s.trim().parse::<i64>().ok(),
                    _ => None,
                }?;
                let ok = match self {
                    ScalarType::Int => i32::try_from(i).is_ok(),
                    ScalarType::UnsignedInt => u32::try_from(i).is_ok(),
                    ScalarType::UnsignedLong => i >= 0,
                    _ => true,
                };
                ok.then_some(Cell::Int(i))
            }
            Kind::Float => match v {
                Value::Number(n) => n.as_f64().map(Cell::Float),
                Value::String(s) => s
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .map(Cell::Float),
                _ => None,
            },
            Kind::Str => match v {
                Value::String(s) => Some(Cell::Str(Arc::from(s.as_str()))),
                Value::Number(n) => Some(Cell::Str(Arc::from(n.to_string().as_str()))),
                Value::Bool(b) => Some(Cell::Str(Arc::from(if *b { "true" } else { "false" }))),
                _ => None,
            },
            Kind::Bool => match v {
                Value::Bool(b) => Some(Cell::Bool(*b)),
                Value::String(s) if s == "true" || s == "1" => Some(Cell::Bool(true)),
                Value::String(s) if s == "false" || s == "0" => Some(Cell::Bool(false)),
                Value::Number(n) if n.as_i64() == Some(1) => Some(Cell::Bool(true)),
                Value::Number(n) if n.as_i64() == Some(0) => Some(Cell::Bool(false)),
                _ => None,
            },
            Kind::Date => match v {
                Value::String(s) => parse_datetime(s).map(Cell::Date),
                Value::Number(n) => n.as_i64().map(Cell::Date),
                _ => None,
            },
        }
    }
}

/// One value of a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Int(i64),
    Float(f64),
    Str(Arc<str>),
    Bool(bool),
    Date(i64),
}

/// What a column does with a value that does not convert to its type (TDE's
/// `invalidValues`): `reject`, the default, fails the document's write; `ignore` stores the
/// document and leaves the column null (so a row whose non-nullable column it is has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidValues {
    Reject,
    Ignore,
}

#[derive(Debug, Clone)]
pub struct ColumnDef {
    pub name: String,
    pub scalar: ScalarType,
    pub val: Path,
    pub nullable: bool,
    pub invalid_values: InvalidValues,
}

/// Why a document gives a view no rows, where a write of it must fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RowError {
    /// A value that does not convert, in a column that rejects them.
    Invalid(InvalidValue),
    /// The context or a column's path would take too much of the document to select.
    Path {
        /// `schema.view`.
        view: String,
        error: PathTooCostly,
    },
}

impl std::fmt::Display for RowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RowError::Invalid(e) => write!(f, "{e}"),
            RowError::Path { view, error } => write!(f, "view {view}: {error}"),
        }
    }
}

/// A value that does not convert to its column's type, in a column that rejects them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidValue {
    /// `schema.view`.
    pub view: String,
    pub column: String,
    pub scalar: ScalarType,
    /// The value's JSON text, cut short.
    pub value: String,
}

impl std::fmt::Display for InvalidValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "view {} column {}: {} is not a valid {} (the column's invalidValues is reject)",
            self.view,
            self.column,
            self.value,
            self.scalar.name()
        )
    }
}

/// A view a template defines: `schema.view` and its columns.
#[derive(Debug, Clone)]
pub struct ViewDef {
    pub schema: String,
    pub view: String,
    pub columns: Vec<ColumnDef>,
    /// Index of the `OBJECTID` column.
    pub id_column: usize,
    /// The `fields` metadata of responses, serialized once.
    pub fields_json: Box<[u8]>,
    /// `schema.view` lower-cased, made once: every document a view reads names it.
    key: ViewKey,
}

impl ViewDef {
    pub fn key(&self) -> &ViewKey {
        &self.key
    }

    /// Case-insensitive column lookup (SQL names are case-insensitive).
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns
            .iter()
            .position(|c| c.name == name)
            .or_else(|| {
                self.columns
                    .iter()
                    .position(|c| c.name.eq_ignore_ascii_case(name))
            })
    }
}

/// `schema.view`, compared case-insensitively as the peer system does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ViewKey(Arc<str>);

impl ViewKey {
    pub fn new(schema: &str, view: &str) -> ViewKey {
        ViewKey(format!("{}.{}", schema.to_lowercase(), view.to_lowercase()).into())
    }
}

impl std::fmt::Display for ViewKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone)]
pub struct Template {
    pub uri: String,
    pub context: Path,
    /// Empty: every document (but templates and descriptors).
    pub collections: Vec<String>,
    pub views: Vec<Arc<ViewDef>>,
    /// The template's JSON as parsed: what a saved view was built from.
    pub source: Arc<str>,
}

impl Template {
    pub(crate) fn applies_to(&self, collections: &[String]) -> bool {
        self.collections.is_empty() || self.collections.iter().any(|c| collections.contains(c))
    }
}

fn field<'a>(v: &'a Value, name: &str, at: &str) -> Result<&'a Value, String> {
    v.get(name)
        .ok_or_else(|| format!("template: {at} has no \"{name}\""))
}

fn string<'a>(v: &'a Value, name: &str, at: &str) -> Result<&'a str, String> {
    match field(v, name, at)? {
        Value::String(s) if !s.is_empty() => Ok(s),
        _ => Err(format!("template: {at}.{name} must be a non-empty string")),
    }
}

/// The feature-service `fields` of a view (docs/contract.md §5): name, type, alias, and a length
/// for strings.
fn fields_json(columns: &[ColumnDef]) -> Box<[u8]> {
    let fields: Vec<Value> = columns
        .iter()
        .map(|c| {
            let t = c.scalar.field_type();
            if t == "String" {
                serde_json::json!({"name": c.name, "type": t, "alias": c.name, "length": 1024})
            } else {
                serde_json::json!({"name": c.name, "type": t, "alias": c.name})
            }
        })
        .collect();
    serde_json::to_vec(&fields)
        .unwrap_or_default()
        .into_boxed_slice()
}

/// Parse and validate a template document. Errors name the fault.
pub(crate) fn parse_template(uri: &str, doc: &Value) -> Result<Template, String> {
    let t = doc
        .get("template")
        .filter(|t| t.is_object())
        .ok_or("template: the document has no \"template\" object")?;
    let context_text = t.get("context").and_then(Value::as_str).unwrap_or("/");
    let context = Path::parse(context_text).map_err(|e| format!("template: context: {e}"))?;
    let collections = match t.get("collections") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|c| {
                c.as_str()
                    .map(str::to_string)
                    .ok_or("template: collections must be strings".to_string())
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err("template: collections must be an array of strings".into()),
    };
    let rows = match t.get("rows") {
        Some(Value::Array(r)) if !r.is_empty() => r,
        _ => return Err("template: \"rows\" must be a non-empty array".into()),
    };
    let mut views = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let at = format!("rows[{i}]");
        let schema = string(row, "schemaName", &at)?;
        let view = string(row, "viewName", &at)?;
        let cols = match row.get("columns") {
            Some(Value::Array(c)) if !c.is_empty() => c,
            _ => return Err(format!("template: {at}.columns must be a non-empty array")),
        };
        let mut columns: Vec<ColumnDef> = Vec::new();
        for (j, c) in cols.iter().enumerate() {
            let cat = format!("{at}.columns[{j}]");
            let name = string(c, "name", &cat)?;
            let st = string(c, "scalarType", &cat)?;
            let scalar = ScalarType::parse(st).ok_or_else(|| {
                format!(
                    "template: {cat}: unknown scalarType {st:?} (known: {})",
                    ScalarType::NAMES
                )
            })?;
            let val_text = string(c, "val", &cat)?;
            let val = Path::parse(val_text).map_err(|e| format!("template: {cat}.val: {e}"))?;
            let nullable = match c.get("nullable") {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(format!("template: {cat}.nullable must be true or false")),
            };
            let invalid_values = match c.get("invalidValues") {
                None => InvalidValues::Reject,
                Some(Value::String(s)) if s == "reject" => InvalidValues::Reject,
                Some(Value::String(s)) if s == "ignore" => InvalidValues::Ignore,
                Some(_) => {
                    return Err(format!(
                        "template: {cat}.invalidValues must be \"reject\" or \"ignore\""
                    ));
                }
            };
            if columns.iter().any(|k| k.name.eq_ignore_ascii_case(name)) {
                return Err(format!(
                    "template: view {schema}.{view} has column {name} twice"
                ));
            }
            columns.push(ColumnDef {
                name: name.to_string(),
                scalar,
                val,
                nullable,
                invalid_values,
            });
        }
        let id_column = columns
            .iter()
            .position(|c| c.name == "OBJECTID")
            .ok_or_else(|| format!("template: view {schema}.{view} has no OBJECTID column"))?;
        if columns[id_column].scalar.kind() != Kind::Int {
            return Err(format!(
                "template: view {schema}.{view}: the OBJECTID column must have an integer scalarType, not {:?}",
                string(&cols[id_column], "scalarType", &at)?
            ));
        }
        let fields_json = fields_json(&columns);
        views.push(Arc::new(ViewDef {
            key: ViewKey::new(schema, view),
            schema: schema.to_string(),
            view: view.to_string(),
            columns,
            id_column,
            fields_json,
        }));
    }
    Ok(Template {
        uri: uri.to_string(),
        context,
        collections,
        views,
        source: Arc::from(doc.to_string()),
    })
}

/// The rows a document yields for one view: one per context node, each a cell (or null)
/// per column. A row whose non-nullable column has no value is not extracted. A value that
/// does not convert is an error in a column that rejects them, and null in one that
/// ignores them; a JSON `null`, or no value at the column's path, is no value.
pub(crate) fn extract_rows(
    template: &Template,
    view: &ViewDef,
    doc: &Value,
) -> Result<Vec<Vec<Option<Cell>>>, RowError> {
    let path_error = |error| RowError::Path {
        view: format!("{}.{}", view.schema, view.view),
        error,
    };
    let mut rows = Vec::new();
    let contexts = template
        .context
        .select(doc, ContextNode::root(doc))
        .map_err(path_error)?;
    for ctx in contexts {
        let mut row = Vec::with_capacity(view.columns.len());
        let mut complete = true;
        for col in &view.columns {
            let value = col
                .val
                .select(doc, ctx.clone())
                .map_err(path_error)?
                .first()
                .map(|n| n.value())
                .filter(|v| !v.is_null());
            let cell = match value {
                None => None,
                Some(v) => match (col.scalar.convert(v), col.invalid_values) {
                    (Some(cell), _) => Some(cell),
                    (None, InvalidValues::Ignore) => None,
                    (None, InvalidValues::Reject) => {
                        return Err(RowError::Invalid(InvalidValue {
                            view: format!("{}.{}", view.schema, view.view),
                            column: col.name.clone(),
                            scalar: col.scalar,
                            value: value_text(v),
                        }));
                    }
                },
            };
            if cell.is_none() && !col.nullable {
                complete = false;
            }
            row.push(cell);
        }
        if complete {
            rows.push(row);
        }
    }
    Ok(rows)
}

/// A value's JSON text for a message: at most about 80 characters.
fn value_text(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(80) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mollusk_template() -> Value {
        serde_json::from_str(include_str!(
            "../../../examples/data/gds/mollusks/template.json"
        ))
        .unwrap()
    }

    #[test]
    fn parses_the_sample_templates() {
        let t = parse_template("/t.json", &mollusk_template()).unwrap();
        assert_eq!(t.collections, vec!["mollusks"]);
        let v = &t.views[0];
        assert_eq!(
            (v.schema.as_str(), v.view.as_str()),
            ("arcgis_hub", "mollusks")
        );
        assert_eq!(v.columns.len(), 5);
        assert_eq!(v.columns[v.id_column].name, "OBJECTID");
        let gkg: Value =
            serde_json::from_str(include_str!("../../../examples/data/gds/gkg/template.json"))
                .unwrap();
        let t = parse_template("/g.json", &gkg).unwrap();
        assert_eq!(t.views[0].columns[1].scalar, ScalarType::DateTime);
    }

    #[test]
    fn refuses_what_the_issue_names() {
        let mut no_id = mollusk_template();
        no_id["template"]["rows"][0]["columns"][0]["name"] = json!("ID");
        assert!(
            parse_template("u", &no_id)
                .unwrap_err()
                .contains("no OBJECTID column")
        );
        let mut string_id = mollusk_template();
        string_id["template"]["rows"][0]["columns"][0]["scalarType"] = json!("string");
        assert!(
            parse_template("u", &string_id)
                .unwrap_err()
                .contains("integer scalarType")
        );
        let mut bad_type = mollusk_template();
        bad_type["template"]["rows"][0]["columns"][2]["scalarType"] = json!("varchar");
        let e = parse_template("u", &bad_type).unwrap_err();
        assert!(
            e.contains("rows[0].columns[2]") && e.contains("varchar"),
            "{e}"
        );
        let mut bad_val = mollusk_template();
        bad_val["template"]["rows"][0]["columns"][3]["val"] = json!("fn:concat(X, Y)");
        let e = parse_template("u", &bad_val).unwrap_err();
        assert!(
            e.contains("rows[0].columns[3].val") && e.contains("malformed path"),
            "{e}"
        );
        assert!(parse_template("u", &json!({"x": 1})).is_err());
    }

    #[test]
    fn extracts_typed_rows() {
        let t = parse_template("/t.json", &mollusk_template()).unwrap();
        let doc = json!({"id": "12", "type": "PhysicalObject", "bibliographicCitation": "c", "X": 178.5, "Y": "-18.25"});
        let rows = extract_rows(&t, &t.views[0], &doc).unwrap();
        assert_eq!(
            rows,
            vec![vec![
                Some(Cell::Int(12)),
                Some(Cell::Str("PhysicalObject".into())),
                Some(Cell::Str("c".into())),
                Some(Cell::Float(-18.25)),
                Some(Cell::Float(178.5)),
            ]]
        );
        // A missing non-nullable value, or a null one: no row.
        let doc = json!({"id": 1, "type": "t", "bibliographicCitation": "c", "X": 1});
        assert!(extract_rows(&t, &t.views[0], &doc).unwrap().is_empty());
        let doc = json!({"id": 1, "type": "t", "bibliographicCitation": "c", "X": 1, "Y": null});
        assert!(extract_rows(&t, &t.views[0], &doc).unwrap().is_empty());
    }

    #[test]
    fn invalid_values_reject_or_ignore() {
        let t = parse_template("/t.json", &mollusk_template()).unwrap();
        // The default rejects, naming the view, the column and the value.
        let doc = json!({"id": "abc", "type": "t", "bibliographicCitation": "c", "X": 1, "Y": 2});
        let invalid = |doc: &Value| match extract_rows(&t, &t.views[0], doc) {
            Err(RowError::Invalid(e)) => e,
            other => panic!("{other:?}"),
        };
        let e = invalid(&doc);
        assert_eq!((e.column.as_str(), e.scalar), ("OBJECTID", ScalarType::Int));
        assert_eq!(
            e.to_string(),
            "view arcgis_hub.mollusks column OBJECTID: \"abc\" is not a valid int (the column's invalidValues is reject)"
        );
        let doc = json!({"id": 1, "type": "t", "bibliographicCitation": {"a": 1}, "X": 1, "Y": 2});
        assert_eq!(invalid(&doc).column, "citation");
        let long = "y".repeat(500);
        let doc = json!({"id": 1, "type": "t", "bibliographicCitation": "c", "X": 1, "Y": long});
        let e = invalid(&doc);
        assert!(
            e.value.len() < 100 && e.value.ends_with("..."),
            "{}",
            e.value
        );
        // `ignore` leaves the column null: a nullable column keeps the row, another drops it.
        let mut v = mollusk_template();
        let cols = &mut v["template"]["rows"][0]["columns"];
        cols[3]["invalidValues"] = json!("ignore");
        cols[3]["nullable"] = json!(true);
        cols[4]["invalidValues"] = json!("ignore");
        let t = parse_template("/t.json", &v).unwrap();
        let doc = json!({"id": 1, "type": "t", "bibliographicCitation": "c", "X": 1, "Y": "north"});
        let rows = extract_rows(&t, &t.views[0], &doc).unwrap();
        assert_eq!(rows[0][3], None);
        assert_eq!(rows[0][4], Some(Cell::Float(1.0)));
        let doc = json!({"id": 1, "type": "t", "bibliographicCitation": "c", "X": [], "Y": 2});
        assert!(extract_rows(&t, &t.views[0], &doc).unwrap().is_empty());
        let mut bad = mollusk_template();
        bad["template"]["rows"][0]["columns"][1]["invalidValues"] = json!("skip");
        assert!(
            parse_template("u", &bad)
                .unwrap_err()
                .contains("invalidValues")
        );
    }

    #[test]
    fn conversions() {
        assert_eq!(ScalarType::Int.convert(&json!(5.0)), Some(Cell::Int(5)));
        assert_eq!(ScalarType::Int.convert(&json!(5.5)), None);
        assert_eq!(ScalarType::Int.convert(&json!(3_000_000_000i64)), None);
        assert_eq!(
            ScalarType::Long.convert(&json!(3_000_000_000i64)),
            Some(Cell::Int(3_000_000_000))
        );
        assert_eq!(ScalarType::UnsignedInt.convert(&json!(-1)), None);
        assert_eq!(
            ScalarType::Boolean.convert(&json!("true")),
            Some(Cell::Bool(true))
        );
        assert_eq!(
            ScalarType::String.convert(&json!(12)),
            Some(Cell::Str("12".into()))
        );
        assert_eq!(ScalarType::String.convert(&json!({"a": 1})), None);
        assert_eq!(
            ScalarType::Decimal.convert(&json!(-0.6)),
            Some(Cell::Float(-0.6))
        );
    }
}
