//! GeoParquet 1.0 and 1.1, read and written through Apache Arrow's `parquet` crate. A file is
//! read a batch at a time, so one larger than memory loads. Its geometry column is WKB or one
//! of GeoArrow's native encodings; its CRS (PROJJSON in the `geo` metadata) is reprojected as
//! the other formats' are, and a `bbox` covering column is left out of the properties.
//! Written files are GeoParquet 1.1: WKB with a `bbox` covering column, one row group per
//! batch, the `geo` metadata at the end once the types and extent are known.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Decimal128Type, Float16Type, Float32Type, Float64Type, Int8Type,
    Int16Type, Int32Type, Int64Type, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::properties::WriterProperties;
use serde_json::{Map, Value, json};

use super::LoadError;
use super::gis::{Records, Reproject, file_name, hand};
use super::record::{Feature, Problem, Record, Unit};

/// Rows in a batch read, and in a row group written.
const READ_BATCH: usize = 4096;
const WRITE_GROUP: usize = 65_536;

/// How a geometry column is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Wkb,
    /// GeoArrow's native nested lists of coordinates, of this GeoJSON type.
    Native(&'static str),
}

/// The geometry column a file declares in its `geo` metadata (or, without it, a binary column
/// named as GDAL names one), and the covering column to leave out.
struct GeoColumn {
    name: String,
    encoding: Encoding,
    reproject: Option<Reproject>,
    covering: Option<String>,
}

fn geo_column(geo: Option<&Value>, schema: &Schema) -> Result<GeoColumn, String> {
    let Some(geo) = geo else {
        let field = schema
            .fields()
            .iter()
            .find(|f| {
                matches!(
                    f.name().to_ascii_lowercase().as_str(),
                    "geometry" | "geom" | "wkb_geometry" | "the_geom"
                ) && matches!(
                    f.data_type(),
                    DataType::Binary | DataType::LargeBinary | DataType::BinaryView
                )
            })
            .ok_or("no GeoParquet metadata (\"geo\"), and no binary column named geometry")?;
        return Ok(GeoColumn {
            name: field.name().clone(),
            encoding: Encoding::Wkb,
            reproject: None,
            covering: None,
        });
    };
    let name = geo["primary_column"]
        .as_str()
        .ok_or("the \"geo\" metadata names no primary_column")?
        .to_string();
    let column = &geo["columns"][&name];
    let encoding = match column["encoding"]
        .as_str()
        .unwrap_or("")
        .to_ascii_lowercase()
        .as_str()
    {
        "wkb" => Encoding::Wkb,
        "point" => Encoding::Native("Point"),
        "linestring" => Encoding::Native("LineString"),
        "polygon" => Encoding::Native("Polygon"),
        "multipoint" => Encoding::Native("MultiPoint"),
        "multilinestring" => Encoding::Native("MultiLineString"),
        "multipolygon" => Encoding::Native("MultiPolygon"),
        other => return Err(format!("geometry encoding {other:?} is not supported")),
    };
    let reproject = match column.get("crs") {
        // Absent means OGC:CRS84; null, an unknown CRS, which is taken as longitude/latitude.
        None | Some(Value::Null) => None,
        Some(crs) => crs_reprojection(crs)?,
    };
    let covering = column["covering"]["bbox"]["xmin"][0]
        .as_str()
        .map(str::to_string);
    Ok(GeoColumn {
        name,
        encoding,
        reproject,
        covering,
    })
}

/// The reprojection a PROJJSON CRS (or an `AUTHORITY:CODE` string) asks for.
fn crs_reprojection(crs: &Value) -> Result<Option<Reproject>, String> {
    let (authority, code) = match crs {
        Value::String(s) => match s.split_once(':') {
            Some((a, c)) => (a.to_string(), Value::String(c.to_string())),
            None => return Err(format!("CRS {s:?}: not AUTHORITY:CODE")),
        },
        Value::Object(o) => {
            let id = o
                .get("id")
                .or_else(|| o.get("ids").and_then(|ids| ids.get(0)))
                .ok_or_else(|| {
                    format!(
                        "CRS {}: it has no id (an EPSG code), which reprojection needs",
                        o.get("name").and_then(Value::as_str).unwrap_or("unnamed")
                    )
                })?;
            (
                id["authority"].as_str().unwrap_or("").to_string(),
                id["code"].clone(),
            )
        }
        other => return Err(format!("CRS {other}: not PROJJSON")),
    };
    let code_text = match &code {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match (authority.to_ascii_uppercase().as_str(), code_text.as_str()) {
        ("OGC", "CRS84") | ("OGC", "CRS84h") => Ok(None),
        ("EPSG", c) => match c.parse::<i64>() {
            Ok(n) => Reproject::from_epsg(n),
            Err(_) => Err(format!("CRS EPSG:{c}: not a number")),
        },
        (a, c) => Err(format!("CRS {a}:{c}: only EPSG and OGC:CRS84 are known")),
    }
}

/// A GeoParquet file, a batch at a time.
pub fn read(
    path: &Path,
    bytes: &AtomicU64,
    each: &mut dyn FnMut(Record) -> bool,
) -> Result<(), LoadError> {
    let file = file_name(path);
    let fail = |e: String| LoadError::Read(file.to_string(), e);
    let input = File::open(path).map_err(|e| LoadError::Open(path.into(), e))?;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(input).map_err(|e| fail(e.to_string()))?;
    let metadata = builder.metadata().file_metadata();
    let geo: Option<Value> = metadata
        .key_value_metadata()
        .into_iter()
        .flatten()
        .find(|kv| kv.key == "geo")
        .and_then(|kv| kv.value.as_deref())
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| fail(format!("its \"geo\" metadata is not JSON: {e}")))?;
    let total = metadata.num_rows().max(0) as u64;
    let column = geo_column(geo.as_ref(), builder.schema()).map_err(fail)?;
    let reader = builder
        .with_batch_size(READ_BATCH)
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let mut records = Records::new(path, &file, Unit::Row, total, bytes);
    for batch in reader {
        let batch = batch.map_err(|e| fail(e.to_string()))?;
        let schema = batch.schema();
        let geometry = batch
            .column_by_name(&column.name)
            .ok_or_else(|| fail(format!("no geometry column {:?}", column.name)))?;
        // A dictionary column's keys are resolved once a batch, not once a value.
        let properties: Vec<(&str, &ArrayRef, Option<Vec<usize>>)> = schema
            .fields()
            .iter()
            .zip(batch.columns())
            .filter(|(f, _)| {
                *f.name() != column.name && Some(f.name().as_str()) != column.covering.as_deref()
            })
            .map(|(f, a)| {
                let keys = matches!(a.data_type(), DataType::Dictionary(_, _))
                    .then(|| a.as_any_dictionary().normalized_keys());
                (f.name().as_str(), a, keys)
            })
            .collect();
        for row in 0..batch.num_rows() {
            let at = records.next();
            let mut map = Map::with_capacity(properties.len());
            for (name, array, keys) in &properties {
                let value = match keys {
                    Some(_) if array.is_null(row) => Some(Value::Null),
                    Some(keys) => cell(array.as_any_dictionary().values().as_ref(), keys[row]),
                    None => cell(array.as_ref(), row),
                };
                if let Some(v) = value {
                    map.insert((*name).to_string(), v);
                }
            }
            let item =
                geometry_at(geometry.as_ref(), row, column.encoding).map(|geometry| Feature {
                    properties: map,
                    geometry,
                    row: false,
                });
            if !hand(at, item, column.reproject.as_ref(), each) {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Row `i` of a geometry column as GeoJSON.
fn geometry_at(a: &dyn Array, i: usize, encoding: Encoding) -> Result<Value, Problem> {
    if a.is_null(i) {
        return Err(Problem::NoGeometry);
    }
    match encoding {
        Encoding::Wkb => {
            let wkb = match a.data_type() {
                DataType::Binary => a.as_binary::<i32>().value(i),
                DataType::LargeBinary => a.as_binary::<i64>().value(i),
                DataType::BinaryView => a.as_binary_view().value(i),
                other => {
                    return Err(Problem::Geometry(format!(
                        "a WKB column of type {other} (not binary)"
                    )));
                }
            };
            super::gis::wkb_json(wkb).map_err(Problem::Geometry)
        }
        Encoding::Native(kind) => {
            let coordinates = nested(a, i)
                .ok_or_else(|| Problem::Geometry(format!("{kind}: not GeoArrow coordinates")))?;
            Ok(json!({"type": kind, "coordinates": coordinates}))
        }
    }
}

/// Element `i` of GeoArrow's nested coordinates: lists of lists down to a coordinate, which
/// is a struct of `x`, `y` (separated) or a fixed-size list (interleaved). Z and M are left out.
fn nested(a: &dyn Array, i: usize) -> Option<Value> {
    match a.data_type() {
        DataType::List(_) => {
            let l = a.as_list::<i32>();
            let inner = l.value(i);
            (0..inner.len())
                .map(|j| nested(inner.as_ref(), j))
                .collect()
        }
        DataType::LargeList(_) => {
            let l = a.as_list::<i64>();
            let inner = l.value(i);
            (0..inner.len())
                .map(|j| nested(inner.as_ref(), j))
                .collect()
        }
        DataType::FixedSizeList(_, n) if *n >= 2 => {
            let values = a.as_fixed_size_list().value(i);
            let xy = values.as_primitive_opt::<Float64Type>()?;
            Some(json!([xy.value(0), xy.value(1)]))
        }
        DataType::Struct(_) => {
            let s = a.as_struct();
            let x = s.column_by_name("x")?.as_primitive_opt::<Float64Type>()?;
            let y = s.column_by_name("y")?.as_primitive_opt::<Float64Type>()?;
            Some(json!([x.value(i), y.value(i)]))
        }
        _ => None,
    }
}

/// Row `i` of a property column as JSON; `None` for a type with no JSON form (binary).
fn cell(a: &dyn Array, i: usize) -> Option<Value> {
    if a.is_null(i) {
        return Some(Value::Null);
    }
    macro_rules! number {
        ($t:ty) => {
            json!(a.as_primitive::<$t>().value(i))
        };
    }
    Some(match a.data_type() {
        DataType::Boolean => Value::Bool(a.as_boolean().value(i)),
        DataType::Int8 => number!(Int8Type),
        DataType::Int16 => number!(Int16Type),
        DataType::Int32 => number!(Int32Type),
        DataType::Int64 => number!(Int64Type),
        DataType::UInt8 => number!(UInt8Type),
        DataType::UInt16 => number!(UInt16Type),
        DataType::UInt32 => number!(UInt32Type),
        DataType::UInt64 => number!(UInt64Type),
        DataType::Float16 => json!(a.as_primitive::<Float16Type>().value(i).to_f64()),
        DataType::Float32 => json!(f64::from(a.as_primitive::<Float32Type>().value(i))),
        DataType::Float64 => number!(Float64Type),
        DataType::Utf8 => json!(a.as_string::<i32>().value(i)),
        DataType::LargeUtf8 => json!(a.as_string::<i64>().value(i)),
        DataType::Utf8View => json!(a.as_string_view().value(i)),
        DataType::Decimal128(_, scale) => {
            let v = a.as_primitive::<Decimal128Type>().value(i);
            json!(v as f64 / 10f64.powi(i32::from(*scale)))
        }
        DataType::Date32 => json!(
            a.as_primitive::<Date32Type>()
                .value_as_date(i)?
                .format("%Y-%m-%d")
                .to_string()
        ),
        DataType::Date64 => json!(
            a.as_primitive::<Date64Type>()
                .value_as_date(i)?
                .format("%Y-%m-%d")
                .to_string()
        ),
        DataType::Timestamp(unit, _) => {
            let t = match unit {
                TimeUnit::Second => a.as_primitive::<TimestampSecondType>().value_as_datetime(i),
                TimeUnit::Millisecond => a
                    .as_primitive::<TimestampMillisecondType>()
                    .value_as_datetime(i),
                TimeUnit::Microsecond => a
                    .as_primitive::<TimestampMicrosecondType>()
                    .value_as_datetime(i),
                TimeUnit::Nanosecond => a
                    .as_primitive::<TimestampNanosecondType>()
                    .value_as_datetime(i),
            }?;
            json!(t.format("%Y-%m-%dT%H:%M:%S%.fZ").to_string())
        }
        DataType::Dictionary(_, _) => {
            // Within a list or struct only: a top-level column's keys are resolved per batch.
            let d = a.as_any_dictionary();
            let key = *d.normalized_keys().get(i)?;
            return cell(d.values().as_ref(), key);
        }
        DataType::List(_) => {
            let inner = a.as_list::<i32>().value(i);
            Value::Array((0..inner.len()).filter_map(|j| cell(&inner, j)).collect())
        }
        DataType::LargeList(_) => {
            let inner = a.as_list::<i64>().value(i);
            Value::Array((0..inner.len()).filter_map(|j| cell(&inner, j)).collect())
        }
        DataType::Struct(fields) => {
            let s = a.as_struct();
            Value::Object(
                fields
                    .iter()
                    .zip(s.columns())
                    .filter_map(|(f, c)| Some((f.name().clone(), cell(c.as_ref(), i)?)))
                    .collect(),
            )
        }
        _ => return None,
    })
}

/// The type of a column written, from the layer's `fields`: they name types as the feature
/// service does (`Integer`) or with Esri's prefix (`esriFieldTypeInteger`); dates and the rest
/// are text, as answers give them. The export's FlatGeobuf and GeoParquet writers share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Integer,
    Double,
    Text,
}

impl Kind {
    pub(crate) fn of(esri: &str) -> Kind {
        match esri.trim_start_matches("esriFieldType") {
            "OID" | "Integer" | "SmallInteger" | "BigInteger" => Kind::Integer,
            "Double" | "Single" => Kind::Double,
            _ => Kind::Text,
        }
    }
}

/// Values of a column, gathered until a row group is written.
enum Values {
    Integer(Vec<Option<i64>>),
    Double(Vec<Option<f64>>),
    Text(Vec<Option<String>>),
}

/// A GeoParquet file being written, a row group at a time.
pub struct Writer<W: Write + Send> {
    writer: ArrowWriter<W>,
    schema: Arc<Schema>,
    columns: Vec<(String, Values)>,
    wkb: Vec<Vec<u8>>,
    boxes: [Vec<f64>; 4],
    /// The extent of every geometry written, and their GeoJSON types.
    extent: [f64; 4],
    types: std::collections::BTreeSet<String>,
}

impl<W: Write + Send> Writer<W> {
    /// A writer of `fields` (name, type as the layer's metadata names it), then the geometry.
    pub fn new(fields: &[(String, String)], out: W) -> Result<Writer<W>, String> {
        let mut schema_fields = Vec::with_capacity(fields.len() + 2);
        let mut columns = Vec::with_capacity(fields.len());
        for (name, esri) in fields {
            let (data_type, values) = match Kind::of(esri) {
                Kind::Integer => (DataType::Int64, Values::Integer(Vec::new())),
                Kind::Double => (DataType::Float64, Values::Double(Vec::new())),
                Kind::Text => (DataType::Utf8, Values::Text(Vec::new())),
            };
            schema_fields.push(Field::new(name, data_type, true));
            columns.push((name.clone(), values));
        }
        schema_fields.push(Field::new("geometry", DataType::Binary, false));
        let corner = |n: &str| Field::new(n, DataType::Float64, false);
        schema_fields.push(Field::new(
            "bbox",
            DataType::Struct(
                vec![
                    corner("xmin"),
                    corner("ymin"),
                    corner("xmax"),
                    corner("ymax"),
                ]
                .into(),
            ),
            false,
        ));
        let schema = Arc::new(Schema::new(schema_fields));
        let properties = WriterProperties::builder()
            .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
            .set_max_row_group_row_count(Some(WRITE_GROUP))
            .build();
        let writer = ArrowWriter::try_new(out, schema.clone(), Some(properties))
            .map_err(|e| e.to_string())?;
        Ok(Writer {
            writer,
            schema,
            columns,
            wkb: Vec::new(),
            boxes: Default::default(),
            extent: [
                f64::INFINITY,
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::NEG_INFINITY,
            ],
            types: Default::default(),
        })
    }

    /// Add a GeoJSON feature: its properties by the columns' names, and its geometry.
    pub fn feature(&mut self, f: &Value) -> Result<(), String> {
        let geometry = &f["geometry"];
        let kind = geometry["type"]
            .as_str()
            .ok_or("a feature with no geometry")?;
        let mut b = [
            f64::INFINITY,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NEG_INFINITY,
        ];
        extend(geometry, &mut b);
        if b[0] > b[2] || b[0].is_nan() {
            return Err(format!("a {kind} with no coordinates"));
        }
        let wkb = {
            use geozero::{CoordDimensions, ToWkb};
            geozero::geojson::GeoJson(&geometry.to_string())
                .to_wkb(CoordDimensions::xy())
                .map_err(|e| e.to_string())?
        };
        let props = f["properties"].as_object();
        for (name, values) in &mut self.columns {
            let v = props.and_then(|p| p.get(name)).filter(|v| !v.is_null());
            match values {
                Values::Integer(c) => c.push(match v {
                    None => None,
                    Some(v) => Some(v.as_i64().ok_or_else(|| {
                        format!("{name}: {v} is not of its column's type (an integer)")
                    })?),
                }),
                Values::Double(c) => c.push(match v {
                    None => None,
                    Some(v) => Some(v.as_f64().ok_or_else(|| {
                        format!("{name}: {v} is not of its column's type (a number)")
                    })?),
                }),
                Values::Text(c) => c.push(v.map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })),
            }
        }
        self.wkb.push(wkb);
        for (k, v) in b.iter().enumerate() {
            self.boxes[k].push(*v);
        }
        self.extent = [
            self.extent[0].min(b[0]),
            self.extent[1].min(b[1]),
            self.extent[2].max(b[2]),
            self.extent[3].max(b[3]),
        ];
        if !self.types.contains(kind) {
            self.types.insert(kind.to_string());
        }
        if self.wkb.len() >= WRITE_GROUP {
            self.flush()?;
        }
        Ok(())
    }

    /// Write the rows gathered as one batch.
    fn flush(&mut self) -> Result<(), String> {
        use arrow_array::{BinaryArray, Float64Array, Int64Array, StringArray, StructArray};
        if self.wkb.is_empty() {
            return Ok(());
        }
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.columns.len() + 2);
        for (_, values) in &mut self.columns {
            arrays.push(match values {
                Values::Integer(c) => Arc::new(Int64Array::from(std::mem::take(c))),
                Values::Double(c) => Arc::new(Float64Array::from(std::mem::take(c))),
                Values::Text(c) => Arc::new(StringArray::from(std::mem::take(c))),
            });
        }
        let wkb = std::mem::take(&mut self.wkb);
        arrays.push(Arc::new(BinaryArray::from_iter_values(wkb.iter())));
        let DataType::Struct(corners) = self
            .schema
            .field(self.schema.fields().len() - 1)
            .data_type()
        else {
            return Err("the bbox column is not a struct".into());
        };
        let corner_arrays: Vec<ArrayRef> = self
            .boxes
            .iter_mut()
            .map(|c| Arc::new(Float64Array::from(std::mem::take(c))) as ArrayRef)
            .collect();
        arrays.push(Arc::new(
            StructArray::try_new(corners.clone(), corner_arrays, None)
                .map_err(|e| e.to_string())?,
        ));
        let batch = RecordBatch::try_new(self.schema.clone(), arrays).map_err(|e| e.to_string())?;
        self.writer.write(&batch).map_err(|e| e.to_string())?;
        self.writer.flush().map_err(|e| e.to_string())
    }

    /// Write the last rows and the `geo` metadata, and hand back the output.
    pub fn finish(mut self) -> Result<W, String> {
        self.flush()?;
        let mut column = json!({
            "encoding": "WKB",
            "geometry_types": self.types.iter().collect::<Vec<_>>(),
            "covering": {"bbox": {
                "xmin": ["bbox", "xmin"], "ymin": ["bbox", "ymin"],
                "xmax": ["bbox", "xmax"], "ymax": ["bbox", "ymax"],
            }},
        });
        if self.extent[0] <= self.extent[2] {
            column["bbox"] = json!(self.extent);
        }
        let geo = json!({
            "version": "1.1.0",
            "primary_column": "geometry",
            "columns": {"geometry": column},
        });
        self.writer
            .append_key_value_metadata(parquet::file::metadata::KeyValue::new(
                "geo".to_string(),
                geo.to_string(),
            ));
        self.writer.into_inner().map_err(|e| e.to_string())
    }
}

/// Grow `b` (xmin, ymin, xmax, ymax) by every position of a GeoJSON geometry.
fn extend(g: &Value, b: &mut [f64; 4]) {
    fn positions(v: &Value, b: &mut [f64; 4]) {
        let Value::Array(a) = v else { return };
        if let (Some(x), Some(y)) = (
            a.first().and_then(Value::as_f64),
            a.get(1).and_then(Value::as_f64),
        ) {
            *b = [b[0].min(x), b[1].min(y), b[2].max(x), b[3].max(y)];
            return;
        }
        a.iter().for_each(|p| positions(p, b));
    }
    match g.get("geometries") {
        Some(Value::Array(gs)) => gs.iter().for_each(|g| extend(g, b)),
        _ => positions(&g["coordinates"], b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_then_read(features: &[Value], fields: &[(String, String)]) -> Vec<Feature> {
        let dir = std::env::temp_dir().join(format!("gs-parquet-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.parquet");
        let mut w = Writer::new(fields, File::create(&path).unwrap()).unwrap();
        for f in features {
            w.feature(f).unwrap();
        }
        w.finish().unwrap();
        let mut out = Vec::new();
        read(&path, &AtomicU64::new(0), &mut |(_, r)| {
            out.push(r.unwrap());
            true
        })
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        out
    }

    /// Every number of nested coordinates, in order.
    fn flat(v: &Value) -> Vec<f64> {
        match v {
            Value::Array(a) => a.iter().flat_map(flat).collect(),
            other => vec![other.as_f64().unwrap()],
        }
    }

    #[test]
    fn features_written_are_read_back_with_their_types_and_geometries() {
        let fields = vec![
            ("OBJECTID".to_string(), "OID".to_string()),
            ("name".to_string(), "String".to_string()),
            ("pop".to_string(), "Double".to_string()),
        ];
        let features = vec![
            json!({"type": "Feature", "properties": {"OBJECTID": 1, "name": "a", "pop": 1.5},
                   "geometry": {"type": "Point", "coordinates": [-105.123456789, 39.5]}}),
            json!({"type": "Feature", "properties": {"OBJECTID": 2, "name": null, "pop": 2.0},
                   "geometry": {"type": "Polygon", "coordinates": [[[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]]}}),
        ];
        let got = write_then_read(&features, &fields);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].properties["OBJECTID"], json!(1));
        assert_eq!(got[0].properties["name"], json!("a"));
        assert_eq!(got[0].properties["pop"], json!(1.5));
        assert_eq!(got[1].properties["name"], Value::Null);
        // The bbox covering column is not a property.
        assert!(!got[0].properties.contains_key("bbox"));
        for (g, f) in got.iter().zip(&features) {
            assert_eq!(g.geometry["type"], f["geometry"]["type"]);
            assert_eq!(
                flat(&g.geometry["coordinates"]),
                flat(&f["geometry"]["coordinates"])
            );
        }
    }

    /// A file as pandas writes a categorical column (a dictionary), with no `geo` metadata:
    /// its geometry is found by its column's name, its categories read as text.
    #[test]
    fn a_dictionary_column_and_a_plain_wkb_geometry_column_are_read() {
        use arrow_array::types::Int32Type;
        use arrow_array::{BinaryArray, DictionaryArray};
        use geozero::{CoordDimensions, ToWkb};
        let kinds: DictionaryArray<Int32Type> =
            vec![Some("truck"), None, Some("van"), Some("truck")]
                .into_iter()
                .collect();
        let points: Vec<Vec<u8>> = (0..4)
            .map(|i| {
                geo::Geometry::Point(geo::Point::new(f64::from(i), 1.5))
                    .to_wkb(CoordDimensions::xy())
                    .unwrap()
            })
            .collect();
        let batch = RecordBatch::try_from_iter([
            ("kind", Arc::new(kinds) as ArrayRef),
            (
                "geometry",
                Arc::new(BinaryArray::from_iter_values(points.iter())) as ArrayRef,
            ),
        ])
        .unwrap();
        let dir = std::env::temp_dir().join(format!("gs-parquet-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.parquet");
        let mut w =
            ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let mut got = Vec::new();
        read(&path, &AtomicU64::new(0), &mut |(_, r)| {
            got.push(r.unwrap());
            true
        })
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let kinds: Vec<&Value> = got.iter().map(|f| &f.properties["kind"]).collect();
        assert_eq!(
            kinds,
            [
                &json!("truck"),
                &Value::Null,
                &json!("van"),
                &json!("truck")
            ]
        );
        assert_eq!(flat(&got[3].geometry["coordinates"]), [3.0, 1.5]);
    }

    #[test]
    fn a_wrongly_typed_value_is_refused_with_its_column() {
        let fields = vec![("n".to_string(), "Integer".to_string())];
        let mut w = Writer::new(&fields, Vec::new()).unwrap();
        let e = w
            .feature(&json!({"properties": {"n": "x"}, "geometry": {"type": "Point", "coordinates": [0, 0]}}))
            .unwrap_err();
        assert!(e.contains("n:"), "{e}");
    }

    #[test]
    fn a_projjson_crs_names_its_reprojection() {
        assert!(
            crs_reprojection(&json!({"id": {"authority": "OGC", "code": "CRS84"}}))
                .unwrap()
                .is_none()
        );
        assert!(
            crs_reprojection(&json!({"id": {"authority": "EPSG", "code": 4326}}))
                .unwrap()
                .is_none()
        );
        assert!(
            crs_reprojection(&json!({"id": {"authority": "EPSG", "code": 3857}}))
                .unwrap()
                .is_some()
        );
        let e = crs_reprojection(&json!({"name": "custom"})).err().unwrap();
        assert!(e.contains("custom"), "{e}");
    }
}
