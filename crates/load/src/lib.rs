//! `geoshard load`: files to a queryable layer in one command. The records are read
//! (`source`), a schema is inferred from the first of them (`schema`) and published as a
//! template and a service descriptor, and every usable record is written as a GeoJSON
//! Feature document (`target`: offline into a stopped server's store, or over HTTP into a
//! running one). Every record is accounted for: loaded, skipped with its reason, or failed
//! with its batch.

// Sibling crates under the module names the code uses.
use geoshard_config as config;
use geoshard_core::{acl, time};
use geoshard_features as features;
use geoshard_spatial as spatial;
use geoshard_store as store;

pub mod export;
mod geoparquet;
mod gis;
mod record;
mod schema;
mod source;
mod target;

pub use target::ViewsBuilt;

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};

pub use record::{At, Feature, Problem};
pub use schema::{Kind, Schema};
pub use source::{CsvOptions, Format};

use crate::features::descriptor::DESCRIPTOR_COLLECTION;
use crate::features::template::TEMPLATE_COLLECTION;
use target::{Batch, Http, HttpOptions, Offline, Outcome, Target};

/// The arguments of `geoshard load`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// The files to load, all into the same layer.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The service (its descriptor's name, geoQueryService's `params.id`).
    #[arg(long)]
    pub service: String,
    /// The layer id within the service.
    #[arg(long, default_value_t = 0)]
    pub layer: i64,
    /// The layer's name (default: the first file's name without its extension).
    #[arg(long)]
    pub layer_name: Option<String>,
    /// The collection of the documents (default: the service name).
    #[arg(long)]
    pub collection: Option<String>,
    /// The URI of each document: `{service}`, `{layer}` and `{id}` (its OBJECTID) are
    /// replaced.
    #[arg(long, default_value = "/{service}/{layer}/{id}.json")]
    pub uri: String,
    /// The format, when the extension does not say it.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// CSV: the longitude column (default: X, lon, lng, long or longitude).
    #[arg(long)]
    pub x_field: Option<String>,
    /// CSV: the latitude column (default: Y, lat or latitude).
    #[arg(long)]
    pub y_field: Option<String>,
    /// CSV: a column of WKT geometries, in place of longitude and latitude.
    #[arg(long)]
    pub wkt_field: Option<String>,
    /// A template file whose columns to use, in place of inferring them.
    #[arg(long)]
    pub schema: Option<PathBuf>,
    /// Replace the layer's template and descriptor entry when they exist.
    #[arg(long)]
    pub replace_schema: bool,
    /// Records read to infer the schema.
    #[arg(long, default_value_t = 1000)]
    pub sample: usize,
    /// A running server, as `http://host:port`.
    #[arg(long, conflicts_with = "data_dir")]
    pub url: Option<String>,
    /// A stopped server's data directory, written offline.
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
    /// Parallel connections to the server.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Documents a request (over HTTP; default 1000) or a commit (offline; default 10000).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Over HTTP: run the records through an input flow (`svc:inputFlow` or
    /// `svc:sjsInputFlow`), with `--entity` and `--flow`. The flow gets each record as read (a
    /// CSV row as an object of its columns, else a GeoJSON Feature) and makes the document;
    /// the layer is the flow project's, so no template or descriptor is written.
    #[arg(long, requires = "url")]
    pub transform: Option<String>,
    #[arg(long)]
    pub entity: Option<String>,
    #[arg(long)]
    pub flow: Option<String>,
    /// Stop at the first record that cannot be loaded.
    #[arg(long)]
    pub strict: bool,
    /// Exit with success although records were skipped (failed batches still fail).
    #[arg(long)]
    pub allow_skips: bool,
    /// How many skipped records and warnings to list.
    #[arg(long, default_value_t = 20)]
    pub show: usize,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
    /// Seconds between progress lines when standard error is not a terminal (a log).
    #[arg(long, default_value_t = 5.0)]
    pub progress_every: f64,
}

/// What stops a load as a whole.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}: {1}")]
    Open(PathBuf, std::io::Error),
    #[error("{0}: {1}")]
    Read(String, String),
    #[error("{0}: the format is not known from the extension; name it with --format")]
    UnknownFormat(PathBuf),
    #[error("{0}")]
    Target(String),
    #[error("{0}")]
    Schema(String),
    #[error("name --url (a running server) or --data-dir (a stopped server's directory)")]
    NoTarget,
    #[error("{at}: {problem} (--strict)")]
    Strict { at: At, problem: Problem },
}

/// What a load did with every record.
#[derive(Debug, Default)]
pub struct Summary {
    pub read: u64,
    pub loaded: u64,
    pub skipped: u64,
    pub failed: u64,
    /// The first skipped records: where, the record's name when it has one, and why.
    pub skips: Vec<(At, Option<String>, Problem)>,
    /// The first failed batches: where the batch began, why, and its size.
    pub failures: Vec<(At, String, usize)>,
    /// The first warnings of the server: the document's URI and the message.
    pub warnings: Vec<(String, String)>,
    pub warning_count: u64,
    pub elapsed: Duration,
    /// Of `elapsed`, building and saving the views and indexes (offline loads).
    pub views_built: Option<ViewsBuilt>,
    /// The stop was asked for by `--strict`.
    pub strict_stop: Option<(At, Problem)>,
}

impl Summary {
    /// Whether the load succeeded as the flags ask.
    pub fn success(&self, allow_skips: bool) -> bool {
        self.failed == 0 && self.strict_stop.is_none() && (allow_skips || self.skipped == 0)
    }

    /// The report printed at the end.
    pub fn report(&self, service: &str, layer: i64) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let mut out = format!(
            "loaded {} of {} records into {service} layer {layer} ({} skipped, {} failed) in \
             {secs:.1} s ({:.0} records/s)\n",
            self.loaded,
            self.read,
            self.skipped,
            self.failed,
            self.loaded as f64 / secs
        );
        match self.views_built {
            Some(b) if b.unsaved == 0 => out.push_str(&format!(
                "views and spatial indexes built and saved in {:.1} s of it (the server starts \
                 from them)\n",
                b.took.as_secs_f64()
            )),
            Some(b) => out.push_str(&format!(
                "views and spatial indexes built in {:.1} s of it, but {} not saved (too little \
                 free disk, or a write failed: see the log); the server builds them when it \
                 starts\n",
                b.took.as_secs_f64(),
                b.unsaved
            )),
            None => {}
        }
        match self.views_built.map(|b| (b.repacked, b.bulk)) {
            Some((_, Some(w))) => out.push_str(&format!(
                "documents compressed as read and written once, in key order, in {:.1} s of it \
                 (from {} sorted run{}): the store is {} MB\n",
                w.took.as_secs_f64(),
                w.runs + 1,
                if w.runs == 0 { "" } else { "s" },
                w.bytes / 1_000_000
            )),
            Some((Some(r), None)) => out.push_str(&format!(
                "documents compressed and packed in {:.1} s of it: the store is {} MB, was {} MB\n",
                r.took.as_secs_f64(),
                r.bytes_after / 1_000_000,
                r.bytes_before / 1_000_000
            )),
            Some((None, None)) => out.push_str(&format!(
                "the store was not rewritten: the load wrote less than 1/{} of its documents \
                 (`geoshard compact` packs and compresses them)\n",
                target::REPACK_SHARE
            )),
            None => {}
        }
        if let Some((at, problem)) = &self.strict_stop {
            out.push_str(&format!("stopped at {at}: {problem} (--strict)\n"));
        }
        if !self.skips.is_empty() {
            out.push_str(&format!(
                "skipped (the first {} of {}):\n",
                self.skips.len(),
                self.skipped
            ));
            for (at, name, problem) in &self.skips {
                match name {
                    Some(n) => out.push_str(&format!("  {at} ({n}): {problem}\n")),
                    None => out.push_str(&format!("  {at}: {problem}\n")),
                }
            }
        }
        if !self.failures.is_empty() {
            out.push_str("failed batches:\n");
            for (at, why, n) in &self.failures {
                out.push_str(&format!("  {n} records from {at}: {why}\n"));
            }
        }
        if self.warning_count > 0 {
            out.push_str(&format!(
                "server warnings (the first {} of {}):\n",
                self.warnings.len(),
                self.warning_count
            ));
            for (uri, message) in &self.warnings {
                out.push_str(&format!("  {uri}: {message}\n"));
            }
        }
        out
    }
}

/// Records a read chunk carries to the converting thread.
const CHUNK: usize = 512;

/// Run a load.
pub fn run(args: &LoadArgs) -> Result<Summary, LoadError> {
    let started = Instant::now();
    let formats = args
        .files
        .iter()
        .map(|f| {
            args.format
                .or_else(|| Format::detect(f))
                .ok_or_else(|| LoadError::UnknownFormat(f.clone()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let collection = args
        .collection
        .clone()
        .unwrap_or_else(|| args.service.clone());
    let mut target: Box<dyn Target> = match (&args.url, &args.data_dir) {
        (Some(url), _) => Box::new(Http::connect(http_options(args, url)?, &collection)?),
        (None, Some(dir)) => Box::new(Offline::open(dir, &collection)?),
        (None, None) => return Err(LoadError::NoTarget),
    };
    let total_bytes: u64 = args
        .files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();

    // Reading (and JSON parsing) on a thread of its own, in chunks.
    let bytes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (reader, incoming) = spawn_reader(args, formats, bytes.clone(), stop.clone())?;

    let mut summary = Summary::default();
    let mut records = incoming.iter();
    let held = match take_sample(&mut records, args) {
        Ok(held) => held,
        Err(e) => {
            stop.store(true, Ordering::Relaxed);
            return Err(e);
        }
    };
    let schema = schema_of(args, &held)?;
    // Through a flow, the flow makes the documents: its project defines their layer.
    if args.transform.is_none() {
        publish(args, &schema, &collection, target.as_mut())?;
    }

    let batch = args
        .batch
        .unwrap_or(if args.url.is_some() { 1000 } else { 10_000 })
        .max(1);
    let mut loader = Loader {
        args,
        batch_size: batch,
        schema: &schema,
        summary: &mut summary,
        ordinal: 0,
        batch: Vec::with_capacity(batch),
        first: None,
        uri: UriPattern::new(&args.uri, &args.service, args.layer),
    };
    let mut progress = Progress::new(args.quiet, total_bytes, bytes.clone());
    progress.plain_every =
        Duration::try_from_secs_f64(args.progress_every.max(0.0)).unwrap_or(progress.plain_every);
    let mut result = Ok(());
    let feed = |loader: &mut Loader, target: &mut dyn Target, chunk: Vec<record::Record>| {
        for record in chunk {
            loader.take(record, target)?;
        }
        loader.drain(target);
        Ok::<(), LoadError>(())
    };
    if let Err(e) = feed(&mut loader, target.as_mut(), held) {
        result = Err(e);
    }
    if result.is_ok() {
        for chunk in records {
            let step = chunk.and_then(|c| feed(&mut loader, target.as_mut(), c));
            progress.tick(loader.summary);
            if let Err(e) = step {
                result = Err(e);
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    // Unblock the reader if it is waiting to hand over a chunk, then wait for it.
    drop(incoming);
    let _ = reader.join();
    if result.is_ok() {
        result = loader.flush(target.as_mut());
    }
    let outcomes = target.outcomes().clone();
    let finished = target.finish(&mut |name, done, all| progress.phase(name, done, all));
    for o in outcomes.try_iter() {
        count(loader.summary, o, args.show);
    }
    progress.done();
    summary.elapsed = started.elapsed();
    match result {
        Err(LoadError::Strict { at, problem }) => {
            summary.strict_stop = Some((at, problem));
        }
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    summary.views_built = finished?;
    Ok(summary)
}

type Chunk = Result<Vec<record::Record>, LoadError>;

/// Start the thread that reads the files in turn and hands their records over in chunks,
/// counting the bytes read into `bytes`, until `stop` is set or the receiver is dropped.
fn spawn_reader(
    args: &LoadArgs,
    formats: Vec<Format>,
    bytes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> Result<
    (
        std::thread::JoinHandle<()>,
        crossbeam_channel::Receiver<Chunk>,
    ),
    LoadError,
> {
    let (chunks, incoming) = crossbeam_channel::bounded::<Chunk>(8);
    let files: Vec<(PathBuf, Format)> = args.files.iter().cloned().zip(formats).collect();
    let csv = CsvOptions {
        x: args.x_field.clone(),
        y: args.y_field.clone(),
        wkt: args.wkt_field.clone(),
        delimiter: None,
    };
    let reader = std::thread::Builder::new()
        .name("geoshard-load-read".into())
        .spawn(move || {
            for (path, format) in files {
                let mut chunk = Vec::with_capacity(CHUNK);
                let result = source::read(&path, format, &csv, bytes.clone(), &mut |r| {
                    chunk.push(r);
                    if chunk.len() == CHUNK {
                        let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
                        if chunks.send(Ok(full)).is_err() {
                            return false;
                        }
                    }
                    !stop.load(Ordering::Relaxed)
                });
                if !chunk.is_empty() && chunks.send(Ok(chunk)).is_err() {
                    return;
                }
                if let Err(e) = result {
                    let _ = chunks.send(Err(e));
                    return;
                }
            }
        })
        .map_err(|e| LoadError::Target(format!("cannot start the reader: {e}")))?;
    Ok((reader, incoming))
}

/// The sample: records up to `sample` usable ones, kept to be loaded after; at most ten
/// times that many records in all, so a file of bad records is not held in memory.
fn take_sample(
    records: &mut impl Iterator<Item = Chunk>,
    args: &LoadArgs,
) -> Result<Vec<record::Record>, LoadError> {
    let mut held: Vec<record::Record> = Vec::new();
    let mut usable = 0;
    let most = args.sample.max(1).saturating_mul(10).max(CHUNK);
    while usable < args.sample.max(1) && held.len() < most {
        match records.next() {
            Some(Ok(chunk)) => {
                usable += chunk.iter().filter(|(_, r)| r.is_ok()).count();
                held.extend(chunk);
            }
            Some(Err(e)) => return Err(e),
            None => break,
        }
    }
    Ok(held)
}

/// The layer's schema: from `--schema`'s template, or inferred from the sample.
fn schema_of(args: &LoadArgs, held: &[record::Record]) -> Result<Schema, LoadError> {
    let sample: Vec<&Feature> = held
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .take(args.sample.max(1))
        .collect();
    Ok(match &args.schema {
        Some(path) => {
            let text = std::fs::read(path).map_err(|e| LoadError::Open(path.clone(), e))?;
            let t: Value = serde_json::from_slice(&text)
                .map_err(|e| LoadError::Schema(format!("{}: {e}", path.display())))?;
            Schema::from_template(&t, schema::geometry_type(&sample))
                .map_err(|e| LoadError::Schema(format!("{}: {e}", path.display())))?
        }
        None => Schema::infer(&sample, formats_are_text(&args.files, args.format)),
    })
}

/// A record as an input flow takes it: a table's row as an object of its columns (text, as
/// the file has them), anything else as a GeoJSON Feature. The flow makes the document, so the
/// loader neither types nor numbers it.
fn raw(f: Feature) -> Vec<u8> {
    let value = if f.row {
        Value::Object(f.properties)
    } else {
        json!({"type": "Feature", "properties": f.properties, "geometry": f.geometry})
    };
    serde_json::to_vec(&value).unwrap_or_default()
}

/// CSV values are all text; JSON values carry their types.
fn formats_are_text(files: &[PathBuf], given: Option<Format>) -> bool {
    files
        .iter()
        .any(|f| given.or_else(|| Format::detect(f)) == Some(Format::Csv))
}

/// The `host:port` of a `--url`, which takes `http://host:port`.
pub(crate) fn authority(url: &str) -> Result<String, String> {
    url.trim_end_matches('/')
        .strip_prefix("http://")
        .map(str::to_string)
        .ok_or_else(|| format!("{url}: --url takes http://host:port"))
}

fn http_options(args: &LoadArgs, url: &str) -> Result<HttpOptions, LoadError> {
    let authority = authority(url).map_err(LoadError::Target)?;
    let mut flow_query = String::new();
    if let Some(t) = &args.transform {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("transform", t);
        if let Some(e) = &args.entity {
            q.append_pair("trans:entity-name", e);
        }
        if let Some(f) = &args.flow {
            q.append_pair("trans:flow-name", f);
        }
        flow_query = format!("?{}", q.finish());
    }
    Ok(HttpOptions {
        authority,
        user: args.user.clone(),
        password: args.password.clone(),
        connections: args.connections.max(1),
        flow_query,
    })
}

/// A name for the view: letters, digits and `_`, as a column's.
fn view_name(text: &str) -> String {
    schema::column_name(text)
}

/// Where the loader keeps a service's definitions.
fn template_uri(service: &str, layer: i64) -> String {
    format!("/geoshard-load/{service}/template-{layer}.json")
}

fn descriptor_uri(service: &str) -> String {
    format!("/geoshard-load/{service}/service.json")
}

/// Write the layer's template and its entry in the service descriptor, keeping what exists
/// unless `--replace-schema`.
fn publish(
    args: &LoadArgs,
    schema: &Schema,
    collection: &str,
    target: &mut dyn Target,
) -> Result<(), LoadError> {
    let layer_name = args.layer_name.clone().unwrap_or_else(|| {
        args.files[0]
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| format!("layer {}", args.layer))
    });
    let schema_name = view_name(&args.service);
    let view = view_name(&format!("{layer_name}_{}", args.layer));
    let t_uri = template_uri(&args.service, args.layer);
    if args.replace_schema || target.get(&t_uri)?.is_none() {
        target.put_definition(
            &t_uri,
            &schema.template(&schema_name, &view, collection),
            TEMPLATE_COLLECTION,
        )?;
    }
    let d_uri = descriptor_uri(&args.service);
    let files: Vec<String> = args
        .files
        .iter()
        .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let layer = schema.layer(
        args.layer,
        &layer_name,
        &format!("loaded by geoshard load from {}", files.join(", ")),
        &schema_name,
        &view,
    );
    let mut descriptor = target.get(&d_uri)?.unwrap_or_else(|| {
        json!({
            "info": {"name": args.service, "description": format!("{} (geoshard load)", args.service)},
            "layers": [],
        })
    });
    let Some(layers) = descriptor["layers"].as_array_mut() else {
        return Err(LoadError::Schema(format!(
            "{d_uri}: its layers are not an array"
        )));
    };
    let at = layers
        .iter()
        .position(|l| l["id"].as_i64() == Some(args.layer));
    match at {
        Some(i) if args.replace_schema => layers[i] = layer,
        Some(_) => return Ok(()),
        None => layers.push(layer),
    }
    target.put_definition(&d_uri, &descriptor, DESCRIPTOR_COLLECTION)
}

/// The converting side of a load: records to documents, in batches.
struct Loader<'a> {
    args: &'a LoadArgs,
    schema: &'a Schema,
    summary: &'a mut Summary,
    batch_size: usize,
    /// Records seen, bad ones included: a record's default OBJECTID, the same on every load
    /// of the same files.
    ordinal: i64,
    batch: Vec<(String, Bytes)>,
    first: Option<At>,
    /// `--uri` with its service and layer filled in, split at `{id}` when it has one.
    uri: UriPattern,
}

/// A document URI pattern: the text around one `{id}`, or any other text to replace in.
enum UriPattern {
    Around(String, String),
    Other(String),
}

impl UriPattern {
    fn new(pattern: &str, service: &str, layer: i64) -> UriPattern {
        let filled = pattern
            .replace("{service}", service)
            .replace("{layer}", &layer.to_string());
        match filled.split_once("{id}") {
            Some((before, after)) if !after.contains("{id}") => {
                UriPattern::Around(before.to_string(), after.to_string())
            }
            _ => UriPattern::Other(filled),
        }
    }

    fn uri(&self, id: i64) -> String {
        match self {
            UriPattern::Around(before, after) => {
                let mut uri = String::with_capacity(before.len() + 20 + after.len());
                uri.push_str(before);
                let _ = write!(uri, "{id}");
                uri.push_str(after);
                uri
            }
            UriPattern::Other(text) => text.replace("{id}", &id.to_string()),
        }
    }
}

impl Loader<'_> {
    fn take(
        &mut self,
        (at, record): record::Record,
        target: &mut dyn Target,
    ) -> Result<(), LoadError> {
        self.ordinal += 1;
        self.summary.read += 1;
        let converted = match record {
            Err(p) => Err((None, p)),
            Ok(mut f) => match crate::spatial::parse_geojson(&f.geometry) {
                Err(e) => Err((label(&f), Problem::Geometry(e.to_string()))),
                Ok(_) if self.args.transform.is_some() => Ok((self.ordinal, raw(f))),
                Ok(_) => self
                    .schema
                    .document(&mut f, self.ordinal)
                    .map_err(|p| (label(&f), p)),
            },
        };
        match converted {
            Ok((id, doc)) => {
                let uri = self.uri.uri(id);
                self.first.get_or_insert(at);
                self.batch.push((uri, Bytes::from(doc)));
                if self.batch.len() >= self.batch_size {
                    self.flush(target)?;
                }
            }
            Err((name, problem)) => {
                if self.args.strict {
                    return Err(LoadError::Strict { at, problem });
                }
                self.summary.skipped += 1;
                if self.summary.skips.len() < self.args.show {
                    self.summary.skips.push((at, name, problem));
                }
            }
        }
        Ok(())
    }

    fn flush(&mut self, target: &mut dyn Target) -> Result<(), LoadError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let mut docs = std::mem::replace(&mut self.batch, Vec::with_capacity(self.batch_size));
        // In key order the store's B-tree takes a batch as runs of neighbouring inserts; the
        // sort is stable, so of two records with one URI the later still wins.
        docs.sort_by(|a, b| a.0.cmp(&b.0));
        let first = self.first.take().unwrap_or(At {
            file: Arc::from(""),
            unit: record::Unit::Line,
            number: 0,
        });
        target.send(Batch { docs, first })
    }

    fn drain(&mut self, target: &mut dyn Target) {
        for o in target.outcomes().try_iter() {
            count(self.summary, o, self.args.show);
        }
    }
}

fn count(summary: &mut Summary, o: Outcome, show: usize) {
    summary.loaded += o.written as u64;
    summary.warning_count += o.warnings.len() as u64;
    for w in o.warnings {
        if summary.warnings.len() < show {
            summary.warnings.push(w);
        }
    }
    if let Some((at, why, n)) = o.failed {
        summary.failed += n as u64;
        if summary.failures.len() < show {
            summary.failures.push((at, why, n));
        }
    }
}

/// A record's name for the report: its `name` property in any case, when it has one.
fn label(f: &Feature) -> Option<String> {
    f.properties
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("name"))
        .and_then(|(_, v)| match v {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        })
}

/// Progress on standard error: a bar on a terminal, a line every few seconds otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    plain: bool,
    bytes: Arc<AtomicU64>,
    total: u64,
    started: Instant,
    last: Instant,
    /// Between plain lines.
    plain_every: Duration,
}

impl Progress {
    fn new(quiet: bool, total: u64, bytes: Arc<AtomicU64>) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        let bar = (!quiet && terminal).then(|| {
            let bar = indicatif::ProgressBar::new(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{bar:30} {bytes}/{total_bytes} {msg} ETA {eta}",
            ) {
                bar.set_style(style);
            }
            bar
        });
        Progress {
            bar,
            plain: !quiet && !terminal,
            bytes,
            total,
            started: Instant::now(),
            last: Instant::now(),
            plain_every: Duration::from_secs(5),
        }
    }

    fn tick(&mut self, s: &Summary) {
        let now = Instant::now();
        let every = if self.bar.is_some() {
            Duration::from_millis(200)
        } else {
            self.plain_every
        };
        if now - self.last < every {
            return;
        }
        self.last = now;
        let rate = s.read as f64 / (now - self.started).as_secs_f64().max(1e-9);
        let read = self.bytes.load(Ordering::Relaxed);
        if let Some(bar) = &self.bar {
            bar.set_position(read);
            bar.set_message(format!("{} records ({rate:.0}/s)", s.read));
        } else if self.plain {
            eprintln!(
                "read {} records ({rate:.0}/s), {} of {} MB, {} loaded, {} skipped",
                s.read,
                read / 1_000_000,
                self.total / 1_000_000,
                s.loaded,
                s.skipped
            );
        }
    }

    /// A step after the records are in: `done` of `all`.
    fn phase(&mut self, name: &str, done: u64, all: u64) {
        if let Some(bar) = &self.bar {
            if let Ok(style) =
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} ETA {eta}")
            {
                bar.set_style(style);
            }
            bar.set_length(all);
            bar.set_position(done);
            bar.set_message(name.to_string());
            return;
        }
        let now = Instant::now();
        if self.plain && (done == 0 || done == all || now - self.last >= self.plain_every) {
            self.last = now;
            eprintln!("{name}: {done} of {all}");
        }
    }

    fn done(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::UriPattern;

    #[test]
    fn uris_are_the_pattern_filled_in() {
        let p = UriPattern::new("/{service}/{layer}/{id}.json", "places", 2);
        assert_eq!(p.uri(17), "/places/2/17.json");
        assert_eq!(p.uri(-3), "/places/2/-3.json");
        let twice = UriPattern::new("/{id}/{service}-{id}", "s", 0);
        assert_eq!(twice.uri(5), "/5/s-5");
        let none = UriPattern::new("/{service}/one.json", "s", 0);
        assert_eq!(none.uri(5), "/s/one.json");
    }
}
