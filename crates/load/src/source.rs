//! Reading the files a user brings: GeoJSON FeatureCollections (streamed: features are read one
//! at a time, the file never whole), GeoJSON text sequences and NDJSON (a feature a line), and
//! CSV with longitude and latitude columns or a WKT column. Each reader hands out every record
//! it meets, usable or not, with where it was found.

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::LoadError;
use super::record::{At, Feature, Problem, Record, Unit};

/// The file formats the loader reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A GeoJSON FeatureCollection.
    Geojson,
    /// One GeoJSON feature a line (NDJSON, or RFC 8142 text sequences).
    Geojsonseq,
    /// Comma-separated values with coordinate columns or a WKT column.
    Csv,
    /// An ESRI Shapefile (`.shp`, with its `.dbf` and `.prj`).
    Shapefile,
    /// FlatGeobuf.
    Flatgeobuf,
    /// A GeoPackage (its first feature table).
    Geopackage,
    /// GeoParquet (WKB or GeoArrow geometries).
    Geoparquet,
}

impl Format {
    /// The format a file's extension names.
    pub fn detect(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "geojson" | "json" => Format::Geojson,
            "geojsonl" | "geojsons" | "geojsonseq" | "ndjson" | "jsonl" | "ldjson" => {
                Format::Geojsonseq
            }
            "csv" | "tsv" | "txt" => Format::Csv,
            "shp" => Format::Shapefile,
            "fgb" => Format::Flatgeobuf,
            "gpkg" => Format::Geopackage,
            "parquet" | "geoparquet" => Format::Geoparquet,
            _ => return None,
        })
    }
}

/// How the coordinates of a CSV row are found.
#[derive(Debug, Clone, Default)]
pub struct CsvOptions {
    /// The longitude and latitude columns; found by name when not given.
    pub x: Option<String>,
    pub y: Option<String>,
    /// A WKT geometry column, in place of longitude and latitude.
    pub wkt: Option<String>,
    pub delimiter: Option<u8>,
}

/// Counts the bytes read through it, for the progress display.
pub struct Counted<R> {
    inner: R,
    bytes: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Read `path` in `format`, calling `each` with every record; `each` returns false to stop.
/// An error is what stops the whole file (it cannot be opened, or a FeatureCollection's JSON
/// breaks off and nothing after it can be found).
pub fn read(
    path: &Path,
    format: Format,
    csv: &CsvOptions,
    bytes: Arc<AtomicU64>,
    each: &mut dyn FnMut(Record) -> bool,
) -> Result<(), LoadError> {
    match format {
        Format::Shapefile => return super::gis::read_shapefile(path, &bytes, each),
        Format::Flatgeobuf => return super::gis::read_flatgeobuf(path, &bytes, each),
        Format::Geopackage => return super::gis::read_geopackage(path, &bytes, each),
        Format::Geoparquet => return super::geoparquet::read(path, &bytes, each),
        Format::Geojson | Format::Geojsonseq | Format::Csv => {}
    }
    let file = std::fs::File::open(path).map_err(|e| LoadError::Open(path.into(), e))?;
    let name: Arc<str> = Arc::from(
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string()),
    );
    let input = BufReader::with_capacity(1 << 20, Counted { inner: file, bytes });
    match format {
        Format::Geojson => read_collection(input, name, each),
        Format::Geojsonseq => read_lines(input, name, each),
        Format::Csv => read_csv(input, name, csv, each),
        Format::Shapefile | Format::Flatgeobuf | Format::Geopackage | Format::Geoparquet => Ok(()),
    }
}

/// The properties and geometry of a GeoJSON Feature object.
pub fn feature(v: Value) -> Result<Feature, Problem> {
    let Value::Object(mut o) = v else {
        return Err(Problem::NotAFeature("not an object".into()));
    };
    match o.get("type").and_then(Value::as_str) {
        Some("Feature") => {}
        Some(other) => return Err(Problem::NotAFeature(format!("its type is {other:?}"))),
        None => return Err(Problem::NotAFeature("it has no \"type\"".into())),
    }
    let geometry = match o.remove("geometry") {
        None | Some(Value::Null) => return Err(Problem::NoGeometry),
        Some(g) => g,
    };
    let mut properties = match o.remove("properties") {
        Some(Value::Object(p)) => p,
        _ => Map::new(),
    };
    // A feature id the properties do not hold is kept as a property `id`.
    if let Some(id) = o.remove("id")
        && !properties.contains_key("id")
    {
        properties.insert("id".into(), id);
    }
    Ok(Feature {
        properties,
        geometry,
        row: false,
    })
}

fn read_lines(
    input: impl BufRead,
    file: Arc<str>,
    each: &mut dyn FnMut(Record) -> bool,
) -> Result<(), LoadError> {
    for (i, line) in input.split(b'\n').enumerate() {
        let line = line.map_err(|e| LoadError::Read(file.to_string(), e.to_string()))?;
        // RFC 8142 puts a record separator before each text.
        let text = line.strip_prefix(b"\x1e").unwrap_or(&line);
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let at = At {
            file: file.clone(),
            unit: Unit::Line,
            number: i as u64 + 1,
        };
        let item = serde_json::from_slice::<Value>(text)
            .map_err(|e| Problem::BadJson(e.to_string()))
            .and_then(feature);
        if !each((at, item)) {
            break;
        }
    }
    Ok(())
}

/// Streams the `features` of a FeatureCollection through serde: each feature is built as a
/// value and handed out before the next is read.
fn read_collection(
    input: impl Read,
    file: Arc<str>,
    each: &mut dyn FnMut(Record) -> bool,
) -> Result<(), LoadError> {
    struct Collection<'a> {
        file: Arc<str>,
        each: &'a mut dyn FnMut(Record) -> bool,
        found: bool,
    }
    struct Features<'c, 'a>(&'c mut Collection<'a>);

    impl<'de> Visitor<'de> for &mut Collection<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a GeoJSON FeatureCollection object")
        }
        fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<(), M::Error> {
            while let Some(key) = map.next_key::<String>()? {
                if key == "features" {
                    self.found = true;
                    map.next_value_seed(Features(self))?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(())
        }
    }
    impl<'de> DeserializeSeed<'de> for Features<'_, '_> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_seq(self)
        }
    }
    impl<'de> Visitor<'de> for Features<'_, '_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an array of features")
        }
        fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<(), S::Error> {
            let mut n = 0;
            while let Some(v) = seq.next_element::<Value>()? {
                n += 1;
                let at = At {
                    file: self.0.file.clone(),
                    unit: Unit::Feature,
                    number: n,
                };
                if !(self.0.each)((at, feature(v))) {
                    return Err(serde::de::Error::custom(STOPPED));
                }
            }
            Ok(())
        }
    }
    const STOPPED: &str = "stopped by the loader";

    let mut c = Collection {
        file: file.clone(),
        each,
        found: false,
    };
    let mut de = serde_json::Deserializer::from_reader(input);
    match serde::Deserializer::deserialize_map(&mut de, &mut c) {
        Ok(()) => {}
        Err(e) if e.to_string().starts_with(STOPPED) => return Ok(()),
        Err(e) => return Err(LoadError::Read(file.to_string(), e.to_string())),
    }
    if !c.found {
        return Err(LoadError::Read(
            file.to_string(),
            "not a FeatureCollection: it has no \"features\" array".into(),
        ));
    }
    Ok(())
}

/// The names looked for when no coordinate columns are given, in order, case-insensitively.
const X_NAMES: [&str; 5] = ["x", "lon", "lng", "long", "longitude"];
const Y_NAMES: [&str; 3] = ["y", "lat", "latitude"];
/// The names of a geometry column (WKT or hex WKB), looked for when there is no longitude
/// and latitude pair: GDAL's CSV driver takes `WKT`, and the others are what PostGIS, QGIS
/// and GeoPandas name theirs.
const WKT_NAMES: [&str; 4] = ["wkt", "geometry", "geom", "the_geom"];

/// Where a CSV row's geometry is: longitude and latitude columns, or a WKT column.
enum Geometry {
    Columns(usize, usize),
    Wkt(usize),
}

/// A CSV row as a feature: its geometry, and every other column as a string property.
fn csv_feature(
    headers: &[String],
    record: &csv::StringRecord,
    geometry: &Geometry,
    skip: Option<usize>,
) -> Result<Feature, Problem> {
    let geometry = match *geometry {
        Geometry::Columns(x, y) => {
            let (tx, ty) = (record[x].trim(), record[y].trim());
            if tx.is_empty() || ty.is_empty() {
                return Err(Problem::MissingCoordinates {
                    x: headers[x].clone(),
                    y: headers[y].clone(),
                });
            }
            let number = |i: usize, t: &str| {
                t.parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| Problem::NotNumeric {
                        field: headers[i].clone(),
                        value: t.to_string(),
                    })
            };
            serde_json::json!({"type": "Point", "coordinates": [number(x, tx)?, number(y, ty)?]})
        }
        Geometry::Wkt(w) => {
            let text = record[w].trim();
            let parsed = match hex_bytes(text) {
                Some(wkb) => super::gis::wkb_json(&wkb),
                None => super::schema::from_wkt(text),
            };
            parsed.map_err(|message| Problem::BadWkt {
                field: headers[w].clone(),
                message,
            })?
        }
    };
    let properties = headers
        .iter()
        .zip(record.iter())
        .enumerate()
        .filter(|(i, _)| Some(*i) != skip)
        .map(|(_, (h, v))| (h.clone(), Value::String(v.to_string())))
        .collect();
    Ok(Feature {
        properties,
        geometry,
        row: true,
    })
}

/// The bytes of `text` when it is hexadecimal, as WKB is written in text (PostGIS's EWKB
/// included): an even number of hex digits, at least a point's header.
fn hex_bytes(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if digits.len() < 10
        || !digits.len().is_multiple_of(2)
        || !digits.iter().all(u8::is_ascii_hexdigit)
    {
        return None;
    }
    let nibble = |d: u8| match d {
        b'0'..=b'9' => d - b'0',
        b'a'..=b'f' => d - b'a' + 10,
        _ => d - b'A' + 10,
    };
    Some(
        digits
            .chunks(2)
            .map(|p| (nibble(p[0]) << 4) | nibble(p[1]))
            .collect(),
    )
}

fn read_csv(
    input: impl Read,
    file: Arc<str>,
    opts: &CsvOptions,
    each: &mut dyn FnMut(Record) -> bool,
) -> Result<(), LoadError> {
    let delimiter = opts
        .delimiter
        .unwrap_or(if file.ends_with(".tsv") { b'\t' } else { b',' });
    let mut reader = csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .flexible(true)
        .from_reader(input);
    let headers: Vec<String> = reader
        .headers()
        .map_err(|e| LoadError::Read(file.to_string(), e.to_string()))?
        .iter()
        .map(str::to_string)
        .collect();
    // The first of `names` the header has, in any case.
    let named = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| headers.iter().position(|h| h.eq_ignore_ascii_case(n)))
    };
    let find = |given: &Option<String>, names: &[&str], what: &str| -> Result<usize, LoadError> {
        match given {
            Some(g) => headers.iter().position(|h| h == g).ok_or_else(|| {
                LoadError::Read(file.to_string(), format!("no column {g:?} in the header"))
            }),
            None => named(names).ok_or_else(|| {
                LoadError::Read(
                    file.to_string(),
                    format!(
                        "no {what} column: name it with --x-field/--y-field or --wkt-field \
                             (looked for {})",
                        names.join(", ")
                    ),
                )
            }),
        }
    };
    let geometry = match (&opts.wkt, &opts.x, &opts.y) {
        (Some(_), ..) => Geometry::Wkt(find(&opts.wkt, &[], "WKT")?),
        (None, None, None) => match (named(&X_NAMES), named(&Y_NAMES), named(&WKT_NAMES)) {
            (Some(x), Some(y), _) => Geometry::Columns(x, y),
            (_, _, Some(w)) => Geometry::Wkt(w),
            _ => {
                return Err(LoadError::Read(
                    file.to_string(),
                    format!(
                        "no longitude and latitude columns and no geometry column: name them \
                         with --x-field/--y-field or --wkt-field (looked for {}; {}; {})",
                        X_NAMES.join(", "),
                        Y_NAMES.join(", "),
                        WKT_NAMES.join(", ")
                    ),
                ));
            }
        },
        _ => Geometry::Columns(
            find(&opts.x, &X_NAMES, "longitude")?,
            find(&opts.y, &Y_NAMES, "latitude")?,
        ),
    };
    let skip = match geometry {
        Geometry::Wkt(w) => Some(w),
        Geometry::Columns(..) => None,
    };
    let mut record = csv::StringRecord::new();
    let mut row = 0u64;
    loop {
        let read = reader.read_record(&mut record);
        row += 1;
        let at = At {
            file: file.clone(),
            unit: Unit::Row,
            number: row,
        };
        let item = match read {
            Ok(false) => return Ok(()),
            Ok(true) if record.len() != headers.len() => Err(Problem::RowLength {
                got: record.len(),
                want: headers.len(),
            }),
            Ok(true) => csv_feature(&headers, &record, &geometry, skip),
            // A row that is not UTF-8 is reported, and reading goes on; a failing disk is not.
            Err(e) if matches!(e.kind(), csv::ErrorKind::Io(_)) => {
                return Err(LoadError::Read(file.to_string(), e.to_string()));
            }
            Err(e) => Err(Problem::BadJson(e.to_string())),
        };
        if !each((at, item)) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The features of a CSV text read with `opts`, or why the file was refused.
    fn csv(text: &str, opts: &CsvOptions) -> Result<Vec<Result<Feature, Problem>>, LoadError> {
        let mut got = Vec::new();
        read_csv(text.as_bytes(), Arc::from("t.csv"), opts, &mut |(_, r)| {
            got.push(r);
            true
        })?;
        Ok(got)
    }

    fn geometries(text: &str) -> Vec<Value> {
        csv(text, &CsvOptions::default())
            .unwrap()
            .into_iter()
            .map(|f| f.unwrap().geometry)
            .collect()
    }

    #[test]
    fn a_geometry_column_is_found_by_its_name_when_there_are_no_coordinate_columns() {
        // As `ogr2ogr -f CSV -lco GEOMETRY=AS_WKT` writes it: WKT first, quoted.
        let gdal = "WKT,name\n\"POLYGON ((0 0,1 0,1 1,0 0))\",a\n\"POINT (3.5 -2)\",b\n";
        let got = csv(gdal, &CsvOptions::default()).unwrap();
        let f = got[0].as_ref().unwrap();
        assert_eq!(
            f.geometry,
            json!({"type": "Polygon", "coordinates": [[[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]]})
        );
        assert_eq!(
            f.properties,
            json!({"name": "a"}).as_object().unwrap().clone()
        );
        assert_eq!(
            got[1].as_ref().unwrap().geometry,
            json!({"type": "Point", "coordinates": [3.5, -2.0]})
        );
        for name in ["wkt", "geometry", "Geom", "the_geom"] {
            let text = format!("id,{name}\n7,POINT (1 2)\n");
            assert_eq!(
                geometries(&text),
                [json!({"type": "Point", "coordinates": [1.0, 2.0]})],
                "{name}"
            );
        }
        // A longitude and latitude pair still comes first.
        assert_eq!(
            geometries("lon,lat,geometry\n5,6,POINT (1 2)\n"),
            [json!({"type": "Point", "coordinates": [5.0, 6.0]})]
        );
    }

    /// Geometries as geo's, so that 1 and 1.0 compare equal (geozero writes integers bare).
    fn shapes(text: &str) -> Vec<geo::Geometry<f64>> {
        geometries(text)
            .iter()
            .map(|g| crate::spatial::parse_geojson(g).unwrap())
            .collect()
    }

    fn shape(v: Value) -> geo::Geometry<f64> {
        crate::spatial::parse_geojson(&v).unwrap()
    }

    #[test]
    fn hexadecimal_wkb_and_ewkb_are_read_as_geometries() {
        // POINT (1 2) as OGC WKB, and as PostGIS's EWKB with SRID 4326, in either case.
        let point = json!({"type": "Point", "coordinates": [1.0, 2.0]});
        for hex in [
            "0101000000000000000000F03F0000000000000040",
            "0101000020e6100000000000000000f03f0000000000000040",
        ] {
            assert_eq!(
                shapes(&format!("geom\n{hex}\n")),
                [shape(point.clone())],
                "{hex}"
            );
        }
        // LINESTRING (0 0, 2 1), big-endian.
        let line =
            "0000000002000000020000000000000000000000000000000040000000000000003FF0000000000000";
        assert_eq!(
            shapes(&format!("wkt\n{line}\n")),
            [shape(
                json!({"type": "LineString", "coordinates": [[0.0, 0.0], [2.0, 1.0]]})
            )]
        );
        // Hex that is not WKB is a row's problem, not the file's.
        let got = csv("geom\n0102030405060708\n", &CsvOptions::default()).unwrap();
        assert!(matches!(&got[0], Err(Problem::BadWkt { field, .. }) if field == "geom"));
    }

    #[test]
    fn a_file_with_no_geometry_says_what_it_looked_for() {
        let e = csv("name,kind\na,b\n", &CsvOptions::default()).unwrap_err();
        let text = e.to_string();
        for name in [
            "longitude",
            "lon",
            "latitude",
            "wkt",
            "the_geom",
            "--wkt-field",
        ] {
            assert!(text.contains(name), "{text}");
        }
    }
}
