//! The GIS file formats, through the field's crates: Shapefile (`shapefile`, its `.dbf` and
//! `.prj` beside it), FlatGeobuf (`flatgeobuf`) and GeoPackage (`rusqlite`, geometries through
//! geozero's GeoPackage WKB reader). Coordinates in another CRS are reprojected to WGS84 with
//! proj4rs; a CRS that cannot be stops the load with its name.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use geozero::{ColumnValue, FeatureProperties, PropertyProcessor, ToJson};
use serde_json::{Map, Value, json};

use super::LoadError;
use super::record::{At, Feature, Problem, Record, Unit};

/// Reprojection of coordinates from a file's CRS to WGS84 longitude and latitude.
pub struct Reproject {
    from: proj4rs::Proj,
    to: proj4rs::Proj,
    /// The CRS as the file names it, for errors.
    name: String,
}

/// A coordinate for proj4rs.
struct Xyz(f64, f64, f64);

impl proj4rs::transform::Transform for Xyz {
    fn transform_coordinates<F: proj4rs::transform::TransformClosure>(
        &mut self,
        f: &mut F,
    ) -> proj4rs::errors::Result<()> {
        f(self.0, self.1, self.2).map(|(x, y, z)| {
            *self = Xyz(x, y, z);
        })
    }
}

impl Reproject {
    /// From a PROJ.4 definition; `None` when it is WGS84 longitude/latitude already.
    fn from_proj4(definition: &str, name: &str) -> Result<Option<Reproject>, String> {
        let d = definition.to_ascii_lowercase();
        if d.contains("+proj=longlat")
            && (d.contains("+datum=wgs84") || d.contains("+ellps=wgs84"))
            && !d.contains("+towgs84")
            && !d.contains("+pm=")
        {
            return Ok(None);
        }
        let from = proj4rs::Proj::from_proj_string(definition)
            .map_err(|e| format!("cannot reproject from {name} ({definition}): {e}"))?;
        let to = proj4rs::Proj::from_proj_string("+proj=longlat +datum=WGS84 +no_defs")
            .map_err(|e| e.to_string())?;
        Ok(Some(Reproject {
            from,
            to,
            name: name.to_string(),
        }))
    }

    /// From an EPSG code.
    pub fn from_epsg(code: i64) -> Result<Option<Reproject>, String> {
        if code == 4326 || code == 0 {
            return Ok(None);
        }
        let def = u16::try_from(code)
            .ok()
            .and_then(crs_definitions::from_code)
            .ok_or_else(|| format!("cannot reproject from EPSG:{code}: not a known CRS"))?;
        Reproject::from_proj4(def.proj4, &format!("EPSG:{code}"))
    }

    /// From WKT, as a `.prj` file or a GeoPackage holds it.
    pub fn from_wkt(wkt: &str) -> Result<Option<Reproject>, String> {
        let name = wkt_name(wkt);
        let definition = proj4wkt::wkt_to_projstring(wkt)
            .map_err(|e| format!("cannot reproject from {name}: {e}"))?;
        Reproject::from_proj4(&definition, &name)
    }

    /// Reproject every position of a GeoJSON geometry.
    pub fn apply(&self, geometry: &mut Value) -> Result<(), Problem> {
        match geometry {
            Value::Object(o) => match o.get_mut("coordinates") {
                Some(c) => self.positions(c),
                None => match o.get_mut("geometries") {
                    Some(Value::Array(gs)) => gs.iter_mut().try_for_each(|g| self.apply(g)),
                    _ => Ok(()),
                },
            },
            _ => Ok(()),
        }
    }

    fn positions(&self, v: &mut Value) -> Result<(), Problem> {
        let Value::Array(a) = v else { return Ok(()) };
        if a.first().is_some_and(Value::is_number) {
            let (Some(x), Some(y)) = (a[0].as_f64(), a.get(1).and_then(Value::as_f64)) else {
                return Ok(());
            };
            let mut p = if self.from.is_latlong() {
                Xyz(x.to_radians(), y.to_radians(), 0.0)
            } else {
                Xyz(x, y, 0.0)
            };
            proj4rs::transform::transform(&self.from, &self.to, &mut p).map_err(|e| {
                Problem::Geometry(format!(
                    "[{x}, {y}] cannot be reprojected from {}: {e}",
                    self.name
                ))
            })?;
            a[0] = json!(p.0.to_degrees());
            a[1] = json!(p.1.to_degrees());
            return Ok(());
        }
        a.iter_mut().try_for_each(|p| self.positions(p))
    }
}

/// The name in a WKT CRS: `PROJCS["NAD83 / Texas Central", …]` → `NAD83 / Texas Central`.
fn wkt_name(wkt: &str) -> String {
    wkt.split_once('"')
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(name, _)| name.to_string())
        .unwrap_or_else(|| wkt.chars().take(60).collect())
}

pub(crate) fn file_name(path: &Path) -> Arc<str> {
    Arc::from(
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string()),
    )
}

/// Numbers a file's records and reports progress as the share of records read.
pub(crate) struct Records<'b> {
    file: Arc<str>,
    unit: Unit,
    n: u64,
    /// The file's size, spread over its `total` records.
    size: u64,
    total: u64,
    bytes: &'b AtomicU64,
}

impl<'b> Records<'b> {
    pub(crate) fn new(
        path: &Path,
        file: &Arc<str>,
        unit: Unit,
        total: u64,
        bytes: &'b AtomicU64,
    ) -> Self {
        Records {
            file: file.clone(),
            unit,
            n: 0,
            size: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
            total,
            bytes,
        }
    }

    pub(crate) fn next(&mut self) -> At {
        self.n += 1;
        self.bytes
            .store(self.size * self.n / self.total.max(1), Ordering::Relaxed);
        At {
            file: self.file.clone(),
            unit: self.unit,
            number: self.n,
        }
    }
}

/// Hand a feature to `each` after reprojecting it; false to stop.
pub(crate) fn hand(
    at: At,
    item: Result<Feature, Problem>,
    reproject: Option<&Reproject>,
    each: &mut dyn FnMut(Record) -> bool,
) -> bool {
    let item = item.and_then(|mut f| {
        if let Some(r) = reproject {
            r.apply(&mut f.geometry)?;
        }
        Ok(f)
    });
    each((at, item))
}

/// A Shapefile with its `.dbf` (attributes) and `.prj` (CRS; WGS84 without one).
pub fn read_shapefile(
    path: &Path,
    bytes: &AtomicU64,
    each: &mut dyn FnMut(Record) -> bool,
) -> Result<(), LoadError> {
    let file = file_name(path);
    let fail = |e: String| LoadError::Read(file.to_string(), e);
    let reproject = match std::fs::read_to_string(path.with_extension("prj")) {
        Ok(wkt) => Reproject::from_wkt(wkt.trim()).map_err(fail)?,
        Err(_) => None,
    };
    let mut reader = shapefile::Reader::from_path(path).map_err(|e| fail(e.to_string()))?;
    let total = reader.shape_count().unwrap_or(0) as u64;
    let mut records = Records::new(path, &file, Unit::Feature, total, bytes);
    for item in reader.iter_shapes_and_records() {
        let (shape, record) = item.map_err(|e| fail(e.to_string()))?;
        let at = records.next();
        let properties: Map<String, Value> = record
            .into_iter()
            .map(|(name, value)| (name, dbf_value(value)))
            .collect();
        let item = shape_geojson(shape).map(|geometry| Feature {
            properties,
            geometry,
            row: false,
        });
        if !hand(at, item, reproject.as_ref(), each) {
            break;
        }
    }
    Ok(())
}

fn dbf_value(v: shapefile::dbase::FieldValue) -> Value {
    use shapefile::dbase::FieldValue as F;
    let whole = |f: f64| {
        if f.fract() == 0.0 && f.abs() < 9.0e15 {
            json!(f as i64)
        } else {
            json!(f)
        }
    };
    match v {
        F::Character(s) => s.map_or(Value::Null, |s| json!(s.trim_end())),
        F::Numeric(n) => n.map_or(Value::Null, whole),
        F::Logical(b) => b.map_or(Value::Null, Value::Bool),
        F::Date(d) => d.map_or(Value::Null, |d| {
            json!(format!("{:04}-{:02}-{:02}", d.year(), d.month(), d.day()))
        }),
        F::Float(f) => f.map_or(Value::Null, |f| json!(f64::from(f))),
        F::Integer(i) => json!(i),
        F::Currency(f) | F::Double(f) => json!(f),
        F::DateTime(t) => {
            let d = t.date();
            let time = t.time();
            json!(format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
                d.year(),
                d.month(),
                d.day(),
                time.hours(),
                time.minutes(),
                time.seconds()
            ))
        }
        F::Memo(s) => json!(s),
    }
}

/// A shape as GeoJSON (its M and Z values left out).
fn shape_geojson(shape: shapefile::Shape) -> Result<Value, Problem> {
    use shapefile::Shape as S;
    macro_rules! xy {
        ($points:expr) => {
            $points
                .iter()
                .map(|p| [p.x, p.y])
                .collect::<Vec<[f64; 2]>>()
        };
    }
    let lines = |parts: Vec<Vec<[f64; 2]>>| match parts.len() {
        1 => json!({"type": "LineString", "coordinates": parts[0]}),
        _ => json!({"type": "MultiLineString", "coordinates": parts}),
    };
    let polygon = |rings: Vec<Vec<[f64; 2]>>| {
        let (kind, coordinates) = crate::spatial::geometry::rings_to_polygon(rings);
        json!({"type": kind, "coordinates": coordinates})
    };
    Ok(match shape {
        S::NullShape => return Err(Problem::NoGeometry),
        S::Point(p) => json!({"type": "Point", "coordinates": [p.x, p.y]}),
        S::PointM(p) => json!({"type": "Point", "coordinates": [p.x, p.y]}),
        S::PointZ(p) => json!({"type": "Point", "coordinates": [p.x, p.y]}),
        S::Multipoint(m) => json!({"type": "MultiPoint", "coordinates": xy!(m.points())}),
        S::MultipointM(m) => json!({"type": "MultiPoint", "coordinates": xy!(m.points())}),
        S::MultipointZ(m) => json!({"type": "MultiPoint", "coordinates": xy!(m.points())}),
        S::Polyline(l) => lines(l.parts().iter().map(|p| xy!(p)).collect()),
        S::PolylineM(l) => lines(l.parts().iter().map(|p| xy!(p)).collect()),
        S::PolylineZ(l) => lines(l.parts().iter().map(|p| xy!(p)).collect()),
        S::Polygon(p) => polygon(p.rings().iter().map(|r| xy!(r.points())).collect()),
        S::PolygonM(p) => polygon(p.rings().iter().map(|r| xy!(r.points())).collect()),
        S::PolygonZ(p) => polygon(p.rings().iter().map(|r| xy!(r.points())).collect()),
        S::Multipatch(_) => {
            return Err(Problem::NotAFeature(
                "multipatch shapes are not supported".into(),
            ));
        }
    })
}

/// Feature properties as JSON, typed as the file types them.
#[derive(Default)]
struct Properties(Map<String, Value>);

impl PropertyProcessor for Properties {
    fn property(
        &mut self,
        _: usize,
        name: &str,
        value: &ColumnValue,
    ) -> geozero::error::Result<bool> {
        let v = match value {
            ColumnValue::Byte(v) => json!(v),
            ColumnValue::UByte(v) => json!(v),
            ColumnValue::Bool(v) => json!(v),
            ColumnValue::Short(v) => json!(v),
            ColumnValue::UShort(v) => json!(v),
            ColumnValue::Int(v) => json!(v),
            ColumnValue::UInt(v) => json!(v),
            ColumnValue::Long(v) => json!(v),
            ColumnValue::ULong(v) => json!(v),
            ColumnValue::Float(v) => json!(f64::from(*v)),
            ColumnValue::Double(v) => json!(v),
            ColumnValue::String(s) | ColumnValue::DateTime(s) => json!(s),
            ColumnValue::Json(s) => serde_json::from_str(s).unwrap_or_else(|_| json!(s)),
            ColumnValue::Binary(_) => return Ok(false),
        };
        self.0.insert(name.to_string(), v);
        Ok(false)
    }
}

/// A FlatGeobuf file; its header's CRS (an EPSG code or WKT) says how to reproject.
pub fn read_flatgeobuf(
    path: &Path,
    bytes: &AtomicU64,
    each: &mut dyn FnMut(Record) -> bool,
) -> Result<(), LoadError> {
    use flatgeobuf::FallibleStreamingIterator;
    let file = file_name(path);
    let fail = |e: String| LoadError::Read(file.to_string(), e);
    let mut input = std::io::BufReader::new(
        std::fs::File::open(path).map_err(|e| LoadError::Open(path.into(), e))?,
    );
    let reader = flatgeobuf::FgbReader::open(&mut input).map_err(|e| fail(e.to_string()))?;
    let header = reader.header();
    let reproject = match header.crs() {
        Some(crs)
            if crs.code() != 0 && crs.org().is_none_or(|o| o.eq_ignore_ascii_case("EPSG")) =>
        {
            Reproject::from_epsg(i64::from(crs.code())).map_err(fail)?
        }
        Some(crs) => match crs.wkt() {
            Some(wkt) => Reproject::from_wkt(wkt).map_err(fail)?,
            None => None,
        },
        None => None,
    };
    let mut records = Records::new(path, &file, Unit::Feature, header.features_count(), bytes);
    let mut features = reader.select_all().map_err(|e| fail(e.to_string()))?;
    while let Some(f) = features.next().map_err(|e| fail(e.to_string()))? {
        let at = records.next();
        let mut props = Properties::default();
        let item = f
            .process_properties(&mut props)
            .map_err(|e| Problem::NotAFeature(e.to_string()))
            .and_then(|_| geometry_json(f.to_json()))
            .map(|geometry| Feature {
                properties: props.0,
                geometry,
                row: false,
            });
        if !hand(at, item, reproject.as_ref(), each) {
            break;
        }
    }
    Ok(())
}

/// A WKB or EWKB geometry as GeoJSON.
pub(crate) fn wkb_json(wkb: &[u8]) -> Result<Value, String> {
    let text = geozero::wkb::Ewkb(wkb)
        .to_json()
        .map_err(|e| e.to_string())?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Null) | Err(_) => Err("not a WKB geometry".into()),
        Ok(v) => Ok(v),
    }
}

fn geometry_json(json: geozero::error::Result<String>) -> Result<Value, Problem> {
    let text = json.map_err(|e| Problem::Geometry(e.to_string()))?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Null) | Err(_) => Err(Problem::NoGeometry),
        Ok(v) => Ok(v),
    }
}

/// A GeoPackage: the first feature table of `gpkg_geometry_columns`, reprojected from its
/// spatial reference system.
pub fn read_geopackage(
    path: &Path,
    bytes: &AtomicU64,
    each: &mut dyn FnMut(Record) -> bool,
) -> Result<(), LoadError> {
    use rusqlite::types::ValueRef;
    let file = file_name(path);
    let fail = |e: String| LoadError::Read(file.to_string(), e);
    let db =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| fail(e.to_string()))?;
    let (table, column, srs_id): (String, String, i64) = db
        .query_row(
            "SELECT table_name, column_name, srs_id FROM gpkg_geometry_columns \
             ORDER BY table_name LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(|e| fail(format!("not a GeoPackage with a feature table: {e}")))?;
    let (org, code, definition): (String, i64, String) = db
        .query_row(
            "SELECT organization, organization_coordsys_id, definition \
             FROM gpkg_spatial_ref_sys WHERE srs_id = ?1",
            [srs_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(|e| fail(format!("spatial reference system {srs_id}: {e}")))?;
    let reproject = if org.eq_ignore_ascii_case("EPSG") {
        Reproject::from_epsg(code)
    } else if definition.trim().is_empty() || definition == "undefined" {
        Ok(None)
    } else {
        Reproject::from_wkt(&definition)
    }
    .map_err(fail)?;
    let total: u64 = db
        .query_row(
            &format!("SELECT count(*) FROM \"{}\"", table.replace('"', "\"\"")),
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(|e| fail(e.to_string()))?
        .max(1) as u64;
    let mut stmt = db
        .prepare(&format!("SELECT * FROM \"{}\"", table.replace('"', "\"\"")))
        .map_err(|e| fail(e.to_string()))?;
    let names: Vec<String> = stmt
        .column_names()
        .into_iter()
        .map(str::to_string)
        .collect();
    let mut rows = stmt.query([]).map_err(|e| fail(e.to_string()))?;
    let mut records = Records::new(path, &file, Unit::Row, total, bytes);
    while let Some(row) = rows.next().map_err(|e| fail(e.to_string()))? {
        let at = records.next();
        let mut properties = Map::new();
        let mut geometry = Err(Problem::NoGeometry);
        for (i, name) in names.iter().enumerate() {
            let value = row.get_ref(i).map_err(|e| fail(e.to_string()))?;
            if *name == column {
                if let ValueRef::Blob(b) = value {
                    geometry = geometry_json(geozero::wkb::GpkgWkb(b).to_json());
                }
                continue;
            }
            let v = match value {
                ValueRef::Null => Value::Null,
                ValueRef::Integer(i) => json!(i),
                ValueRef::Real(f) => json!(f),
                ValueRef::Text(t) => json!(String::from_utf8_lossy(t)),
                ValueRef::Blob(_) => continue,
            };
            properties.insert(name.clone(), v);
        }
        let item = geometry.map(|geometry| Feature {
            properties,
            geometry,
            row: false,
        });
        if !hand(at, item, reproject.as_ref(), each) {
            break;
        }
    }
    Ok(())
}
