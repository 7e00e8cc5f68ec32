//! `geoshard export`, the mirror of `load`: a layer's features, or those a query selects,
//! written to a file as GeoJSON text sequences, CSV with a WKT column, FlatGeobuf or
//! GeoParquet.
//! Offline from a stopped server's data directory (every row), or over HTTP with the
//! caller's permissions. Both ask geoQueryService's question a page at a time, in `OBJECTID`
//! order and each page after the last id written, so memory stays bounded by a page and a
//! write meanwhile neither repeats nor skips a row that stays.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::acl::Caller;
use crate::store::{Store, StoreOptions};

/// The arguments of `geoshard export`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExportArgs {
    /// The file to write: `.geojsonl` or `.ndjson` (a feature a line), `.geojsons` (RFC 8142
    /// text sequence), `.csv` (a WKT column, then the layer's columns), `.fgb` or `.parquet`.
    pub out: PathBuf,
    /// The service (its descriptor's name, geoQueryService's `params.id`).
    #[arg(long)]
    pub service: String,
    #[arg(long, default_value_t = 0)]
    pub layer: i64,
    /// The format, when the extension does not say it.
    #[arg(long, value_enum)]
    pub format: Option<ExportFormat>,
    /// Only the rows this where clause selects (geoQueryService's `where`).
    #[arg(long = "where")]
    pub where_clause: Option<String>,
    /// Only the rows in `--relation` to this box: `xmin,ymin,xmax,ymax`, in degrees.
    #[arg(long, conflicts_with = "geometry", allow_hyphen_values = true)]
    pub bbox: Option<String>,
    /// Only the rows in `--relation` to this GeoJSON geometry.
    #[arg(long)]
    pub geometry: Option<String>,
    /// The spatial relation of `--bbox` or `--geometry`, as geoQueryService names it.
    #[arg(long, default_value = "esriSpatialRelIntersects")]
    pub relation: String,
    /// A running server, as `http://host:port`.
    #[arg(long, conflicts_with = "data_dir")]
    pub url: Option<String>,
    /// A stopped server's data directory, read offline.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long, env = "GEOSHARD_USER", default_value = "")]
    pub user: String,
    #[arg(
        long,
        env = "GEOSHARD_PASSWORD",
        default_value = "",
        hide_env_values = true,
        allow_hyphen_values = true
    )]
    pub password: String,
    /// Features asked for at a time (default: the layer's `maxRecordCount`).
    #[arg(long)]
    pub page: Option<usize>,
    /// No progress on standard error.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// A GeoJSON feature a line.
    Geojsonl,
    /// GeoJSON text sequence (RFC 8142): each feature after a record separator.
    Geojsons,
    /// CSV: a `WKT` geometry column, then the layer's columns.
    Csv,
    /// FlatGeobuf, with the layer's columns typed.
    Fgb,
    /// GeoParquet 1.1: WKB geometries with a `bbox` covering column, the columns typed.
    Parquet,
}

impl ExportFormat {
    pub fn detect(path: &Path) -> Option<ExportFormat> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "geojsonl" | "ndjson" | "jsonl" | "geojsonseq" => ExportFormat::Geojsonl,
            "geojsons" => ExportFormat::Geojsons,
            "csv" => ExportFormat::Csv,
            "fgb" => ExportFormat::Fgb,
            "parquet" | "geoparquet" => ExportFormat::Parquet,
            _ => return None,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("name --url (a running server) or --data-dir (a stopped server's directory)")]
    NoSource,
    #[error("{0}: say the format with --format (geojsonl, geojsons, csv, fgb, parquet)")]
    UnknownFormat(String),
    #[error("{0}")]
    Arguments(String),
    #[error("{0}")]
    Source(String),
    #[error("the query was refused: {0}")]
    Refused(String),
    #[error("{0}: {1}")]
    Write(String, String),
}

/// What an export wrote.
#[derive(Debug, Clone, Copy)]
pub struct Exported {
    pub features: u64,
    pub took: Duration,
}

/// Where the answers come from: geoQueryService, in this process or over HTTP.
trait Source {
    /// The answer to a geoQueryService body, or why it was refused.
    fn ask(&mut self, body: &Value) -> Result<Value, ExportError>;
}

/// A stopped server's data directory, read as the system: every row.
struct Offline {
    features: Arc<crate::features::Features>,
}

impl Offline {
    fn open(dir: &Path) -> Result<Offline, ExportError> {
        let store = Store::open(dir, StoreOptions::default()).map_err(|e| {
            ExportError::Source(format!(
                "{}: {e} (is a server running on this data directory? use --url)",
                dir.display()
            ))
        })?;
        let mut settings = crate::config::Config::default().feature_settings();
        // Offline pages are bounded by this process's memory only.
        settings.max_record_count = settings.max_record_count.max(OFFLINE_PAGE);
        settings.max_answer_bytes = settings.max_answer_bytes.max(OFFLINE_ANSWER_BYTES);
        let features = crate::features::Features::open(Arc::new(store), settings)
            .map_err(|e| ExportError::Source(format!("opening the views: {e}")))?;
        Ok(Offline { features })
    }
}

/// Rows a page offline, and the most bytes of one page's answer.
const OFFLINE_PAGE: usize = 20_000;
const OFFLINE_ANSWER_BYTES: usize = 1 << 30;

impl Source for Offline {
    fn ask(&mut self, body: &Value) -> Result<Value, ExportError> {
        let req = crate::features::FeatureRequest::parse(body.to_string().as_bytes())
            .map_err(|e| ExportError::Refused(e.to_string()))?;
        let answer = self
            .features
            .queries()
            .execute(&Caller::system(), &req)
            .map_err(|e| ExportError::Refused(e.to_string()))?;
        serde_json::from_slice(&answer).map_err(|e| ExportError::Source(e.to_string()))
    }
}

/// A running server, asked as the given user.
struct Remote {
    runtime: tokio::runtime::Runtime,
    client: crate::target::Client,
}

impl Source for Remote {
    fn ask(&mut self, body: &Value) -> Result<Value, ExportError> {
        let answer = self
            .runtime
            .block_on(self.client.post_json(
                "/v1/resources/geoQueryService",
                bytes::Bytes::from(body.to_string()),
            ))
            .map_err(ExportError::Source)?;
        let (status, body) = answer;
        let parsed = serde_json::from_slice::<Value>(&body);
        let text = || {
            String::from_utf8_lossy(&body)
                .chars()
                .take(300)
                .collect::<String>()
        };
        if status != 200 {
            let message = parsed
                .ok()
                .and_then(|v| v["errorResponse"]["message"].as_str().map(str::to_string))
                .unwrap_or_else(text);
            return Err(ExportError::Refused(format!("HTTP {status}: {message}")));
        }
        let parsed = parsed.map_err(|_| ExportError::Source(format!("not JSON: {}", text())))?;
        Ok(parsed)
    }
}

/// The geoQueryService body of a page: the rows after id `after` (all from the start when
/// `None`), `page` of them in id order; or their count alone.
fn question(
    args: &ExportArgs,
    spatial: &Map<String, Value>,
    id_field: &str,
    after: Option<i64>,
    page: Option<usize>,
) -> Value {
    let mut query = spatial.clone();
    let where_clause = match (&args.where_clause, after) {
        (Some(w), Some(id)) => Some(format!("({w}) AND {id_field} > {id}")),
        (Some(w), None) => Some(w.clone()),
        (None, Some(id)) => Some(format!("{id_field} > {id}")),
        (None, None) => None,
    };
    if let Some(w) = where_clause {
        query.insert("where".into(), w.into());
    }
    match page {
        Some(n) => {
            query.insert("outFields".into(), "*".into());
            query.insert("returnGeometry".into(), true.into());
            query.insert("orderByFields".into(), format!("{id_field} ASC").into());
            query.insert("resultRecordCount".into(), n.into());
        }
        None => {
            query.insert("returnCountOnly".into(), true.into());
        }
    }
    json!({
        "params": {"id": args.service, "layer": args.layer, "method": "query"},
        "query": query,
    })
}

/// The spatial members of the question: `--bbox` or `--geometry` with `--relation`.
fn spatial_members(args: &ExportArgs) -> Result<Map<String, Value>, ExportError> {
    let geometry = match (&args.bbox, &args.geometry) {
        (Some(b), _) => {
            let v: Vec<f64> = b
                .split(',')
                .map(|p| p.trim().parse::<f64>())
                .collect::<Result<_, _>>()
                .map_err(|_| ExportError::Arguments(format!("--bbox {b}: not four numbers")))?;
            let [x0, y0, x1, y1] = v[..] else {
                return Err(ExportError::Arguments(format!(
                    "--bbox {b}: give xmin,ymin,xmax,ymax"
                )));
            };
            if !(x0 < x1 && y0 < y1) {
                return Err(ExportError::Arguments(format!(
                    "--bbox {b}: xmin must be below xmax, and ymin below ymax"
                )));
            }
            json!({"type": "Polygon", "coordinates": [[[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]]})
        }
        (None, Some(g)) => serde_json::from_str::<Value>(g)
            .ok()
            .filter(|v| crate::spatial::parse_geojson(v).is_ok())
            .ok_or_else(|| {
                ExportError::Arguments(format!("--geometry: not a GeoJSON geometry: {g}"))
            })?,
        (None, None) => return Ok(Map::new()),
    };
    let mut m = Map::new();
    m.insert("extension".into(), json!({ "geometry": geometry }));
    m.insert("spatialRel".into(), args.relation.clone().into());
    Ok(m)
}

/// A file being written, a feature at a time.
trait Sink {
    fn feature(&mut self, f: &Value) -> Result<(), String>;
    fn finish(self: Box<Self>) -> Result<(), String>;
}

/// GeoJSON a line, or after a record separator (`rs`).
struct Lines<W: Write> {
    out: W,
    rs: bool,
}

impl<W: Write> Sink for Lines<W> {
    fn feature(&mut self, f: &Value) -> Result<(), String> {
        if self.rs {
            self.out.write_all(b"\x1e").map_err(|e| e.to_string())?;
        }
        serde_json::to_writer(&mut self.out, f).map_err(|e| e.to_string())?;
        self.out.write_all(b"\n").map_err(|e| e.to_string())
    }

    fn finish(mut self: Box<Self>) -> Result<(), String> {
        self.out.flush().map_err(|e| e.to_string())
    }
}

/// CSV: `WKT` first (as GDAL writes it), then the layer's columns in its order.
struct Csv<W: Write>(crate::features::csv_wkt::CsvWkt<W>);

impl<W: Write> Sink for Csv<W> {
    fn feature(&mut self, f: &Value) -> Result<(), String> {
        self.0.feature(f)
    }

    fn finish(self: Box<Self>) -> Result<(), String> {
        self.0.finish()?.flush().map_err(|e| e.to_string())
    }
}

/// FlatGeobuf: the layer's columns declared with their types, then each feature's non-null
/// properties; written out (header, features) at the end.
struct Fgb<W: Write> {
    writer: flatgeobuf::FgbWriter<'static>,
    columns: Vec<(String, flatgeobuf::ColumnType)>,
    out: W,
}

impl<W: Write> Fgb<W> {
    fn new(name: &str, fields: &[(String, String)], out: W) -> Result<Fgb<W>, String> {
        use flatgeobuf::{ColumnType, FgbCrs, FgbWriter, FgbWriterOptions, GeometryType};
        let mut writer = FgbWriter::create_with_options(
            name,
            GeometryType::Unknown,
            // Each feature keeps its own type: a layer may mix polygons and multipolygons,
            // and promoting them all to multi would change what a load wrote.
            FgbWriterOptions {
                crs: FgbCrs {
                    code: 4326,
                    ..Default::default()
                },
                detect_type: false,
                promote_to_multi: false,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let mut columns = Vec::with_capacity(fields.len());
        for (name, esri) in fields {
            let kind = match crate::geoparquet::Kind::of(esri) {
                crate::geoparquet::Kind::Integer => ColumnType::Long,
                crate::geoparquet::Kind::Double => ColumnType::Double,
                crate::geoparquet::Kind::Text => ColumnType::String,
            };
            writer.add_column(name, kind, |_, col| col.nullable = true);
            columns.push((name.clone(), kind));
        }
        Ok(Fgb {
            writer,
            columns,
            out,
        })
    }
}

impl<W: Write> Sink for Fgb<W> {
    fn feature(&mut self, f: &Value) -> Result<(), String> {
        use flatgeobuf::ColumnType;
        use geozero::{ColumnValue, PropertyProcessor};
        let geometry = f["geometry"].to_string();
        let props = f["properties"].as_object();
        let columns = &self.columns;
        let mut failed = None;
        self.writer
            .add_feature_geom(geozero::geojson::GeoJson(&geometry), |feature| {
                for (i, (name, kind)) in columns.iter().enumerate() {
                    let Some(v) = props.and_then(|p| p.get(name)).filter(|v| !v.is_null()) else {
                        continue;
                    };
                    let text;
                    let value = match (*kind, v) {
                        (ColumnType::Long, Value::Number(n)) if n.is_i64() => {
                            ColumnValue::Long(n.as_i64().unwrap_or_default())
                        }
                        (ColumnType::Double, Value::Number(n)) => {
                            ColumnValue::Double(n.as_f64().unwrap_or_default())
                        }
                        (ColumnType::String, Value::String(s)) => ColumnValue::String(s),
                        (_, other) => {
                            text = crate::features::csv_wkt::cell(Some(other));
                            if *kind != ColumnType::String {
                                failed =
                                    Some(format!("{name}: {text} is not of its column's type"));
                                continue;
                            }
                            ColumnValue::String(&text)
                        }
                    };
                    if let Err(e) = feature.property(i, name, &value) {
                        failed = Some(e.to_string());
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        failed.map_or(Ok(()), Err)
    }

    fn finish(mut self: Box<Self>) -> Result<(), String> {
        self.writer
            .write(&mut self.out)
            .map_err(|e| e.to_string())?;
        self.out.flush().map_err(|e| e.to_string())
    }
}

/// GeoParquet, a row group at a time.
struct Parquet<W: Write + Send>(crate::geoparquet::Writer<W>);

impl<W: Write + Send> Sink for Parquet<W> {
    fn feature(&mut self, f: &Value) -> Result<(), String> {
        self.0.feature(f)
    }

    fn finish(self: Box<Self>) -> Result<(), String> {
        self.0.finish()?.flush().map_err(|e| e.to_string())
    }
}

/// Run `geoshard export`: write the file (beside it as `.part` until whole), telling
/// `progress` the features written and the count the query gave first.
pub fn run(args: &ExportArgs, progress: &mut dyn FnMut(u64, u64)) -> Result<Exported, ExportError> {
    let started = Instant::now();
    let format = args
        .format
        .or_else(|| ExportFormat::detect(&args.out))
        .ok_or_else(|| ExportError::UnknownFormat(args.out.display().to_string()))?;
    let spatial = spatial_members(args)?;
    let mut source: Box<dyn Source> = match (&args.url, &args.data_dir) {
        (Some(url), _) => {
            let authority = crate::authority(url).map_err(ExportError::Arguments)?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| ExportError::Source(e.to_string()))?;
            let client = crate::target::Client::new(Arc::new(crate::target::HttpOptions {
                authority,
                user: args.user.clone(),
                password: args.password.clone(),
                connections: 1,
                flow_query: String::new(),
            }));
            Box::new(Remote { runtime, client })
        }
        (None, Some(dir)) => Box::new(Offline::open(dir)?),
        (None, None) => return Err(ExportError::NoSource),
    };

    // The count first: it names the columns, the id field and the largest page too.
    let first = source.ask(&question(args, &spatial, "", None, None))?;
    let total = first["count"].as_u64().unwrap_or(0);
    let metadata = &first["metadata"];
    let id_field = metadata["idField"]
        .as_str()
        .filter(|f| !f.is_empty())
        .unwrap_or("OBJECTID")
        .to_string();
    let fields: Vec<(String, String)> = metadata["fields"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| {
                    Some((
                        f["name"].as_str()?.to_string(),
                        f["type"].as_str().unwrap_or("").to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    let page = args
        .page
        .or_else(|| metadata["maxRecordCount"].as_u64().map(|n| n as usize))
        .unwrap_or(1000)
        .max(1);

    let part = args.out.with_extension(format!(
        "{}.part",
        args.out.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    let write_error = |e: String| ExportError::Write(part.display().to_string(), e);
    let file = std::fs::File::create(&part).map_err(|e| write_error(e.to_string()))?;
    let out = BufWriter::with_capacity(1 << 20, file);
    let mut sink: Box<dyn Sink> = match format {
        ExportFormat::Geojsonl => Box::new(Lines { out, rs: false }),
        ExportFormat::Geojsons => Box::new(Lines { out, rs: true }),
        ExportFormat::Csv => Box::new(Csv(crate::features::csv_wkt::CsvWkt::new(
            out,
            fields.iter().map(|f| f.0.clone()).collect(),
        )
        .map_err(write_error)?)),
        ExportFormat::Fgb => Box::new(Fgb::new(&args.service, &fields, out).map_err(write_error)?),
        ExportFormat::Parquet => Box::new(Parquet(
            crate::geoparquet::Writer::new(&fields, out).map_err(write_error)?,
        )),
    };

    let mut written = 0u64;
    progress(0, total);
    let pages = (|| {
        let mut after: Option<i64> = None;
        loop {
            let answer = source.ask(&question(args, &spatial, &id_field, after, Some(page)))?;
            let features = answer["features"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let mut last = after;
            for f in features {
                sink.feature(f).map_err(write_error)?;
                // The next page starts after it: without it, the export would end here short.
                let id = f["properties"][&id_field].as_i64().ok_or_else(|| {
                    ExportError::Source(format!(
                        "a feature has no integer {id_field}, which paging needs"
                    ))
                })?;
                last = Some(id);
            }
            written += features.len() as u64;
            if !features.is_empty() {
                progress(written, total.max(written));
            }
            // Until a page comes empty (a server may give fewer rows than asked for), or one
            // that does not move past the last id.
            if features.is_empty() || last <= after {
                return Ok(());
            }
            after = last;
        }
    })();
    let finished = pages.and_then(|()| sink.finish().map_err(write_error));
    if let Err(e) = finished {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    std::fs::rename(&part, &args.out)
        .map_err(|e| ExportError::Write(args.out.display().to_string(), e.to_string()))?;
    Ok(Exported {
        features: written,
        took: started.elapsed(),
    })
}
