//! Where the loader writes: a stopped server's data directory (offline, through the store's
//! own writer) or a running server (multipart `POST /v1/documents` batches over parallel
//! keep-alive connections, Digest or Basic authentication). Both take batches on a bounded
//! channel, so reading and converting go on while a batch is written, and answer with an
//! [`Outcome`] a batch.

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender, bounded};
use serde_json::Value;

use super::LoadError;
use super::record::At;
use crate::acl::{Caller, Capability, Permissions, Role};
use crate::store::{Format, Op, PutDocument, Store, StoreOptions};

/// Documents to write in one request (one commit), with where the first came from.
pub struct Batch {
    pub docs: Vec<(String, Bytes)>,
    pub first: At,
}

/// What became of a batch.
#[derive(Debug, Default)]
pub struct Outcome {
    pub written: usize,
    /// `(uri, message)`: what the server could not use in a document it stored.
    pub warnings: Vec<(String, String)>,
    /// The batch was refused whole: where it started, why, and how many documents it held.
    pub failed: Option<(At, String, usize)>,
}

/// Read and write access for document permissions: the REST roles and the feature-service
/// roles, so that geoQueryService callers can read the layer.
pub fn layer_permissions() -> Permissions {
    let mut p = Permissions::new();
    p.grant(Role::RestReader, Capability::Read);
    p.grant(Role::RestWriter, Capability::Update);
    p.grant(Role::GeoReader, Capability::Read);
    p.grant(Role::GeoWriter, Capability::Update);
    p
}

/// A target the loader writes to.
pub trait Target {
    /// A stored document, for definitions kept unless replaced.
    fn get(&mut self, uri: &str) -> Result<Option<Value>, LoadError>;
    /// Store a template or descriptor in its collection, now.
    fn put_definition(&mut self, uri: &str, doc: &Value, collection: &str)
    -> Result<(), LoadError>;
    /// Queue a batch; blocks while the writers are busy.
    fn send(&mut self, batch: Batch) -> Result<(), LoadError>;
    /// The outcomes of batches written so far.
    fn outcomes(&self) -> &Receiver<Outcome>;
    /// Wait for every queued batch and close; how building the views went, when the target
    /// builds them (offline).
    /// Wait for every write; an offline target then builds and saves what a start needs,
    /// telling `phase` its steps (a name, done, in all).
    fn finish(
        self: Box<Self>,
        phase: &mut dyn FnMut(&str, u64, u64),
    ) -> Result<Option<ViewsBuilt>, LoadError>;
}

/// The views and indexes an offline load built and saved for the server's start.
#[derive(Debug, Clone, Copy)]
pub struct ViewsBuilt {
    pub took: std::time::Duration,
    /// Views built but not saved (too little free disk, or a write failed): the server's
    /// start builds them from the documents.
    pub unsaved: usize,
    /// The store rewritten (documents in key order and compressed), when the load went
    /// through the store's writer and wrote at least a [`REPACK_SHARE`]th of its documents;
    /// `None` otherwise.
    pub repacked: Option<crate::store::Repacked>,
    /// A bulk load's documents, merged into the store in key order (a load into a store
    /// holding no documents but definitions).
    pub bulk: Option<crate::store::BulkWritten>,
}

/// A load that writes at least 1/`REPACK_SHARE` of the store's documents rewrites the store
/// at its end; a smaller one into a large store would cost a rewrite of the whole for little.
pub const REPACK_SHARE: u64 = 4;

/// The offline loader's page cache: a load rereads the B-tree pages it writes, and the
/// server's default (128 MiB) holds too few of them past about a million documents.
const LOAD_CACHE_BYTES: usize = 1 << 30;

/// Offline: the store of a stopped server. Into a store that holds no documents but
/// definitions, a bulk load: each document compressed and its rows extracted as it comes,
/// the documents kept in sorted runs and merged into the store in key order at the end
/// (`store::Bulk`), the views built from the same documents (`features::BulkViews`). Into
/// any other, through the store's writer thread, a batch a transaction, then a repack.
pub struct Offline {
    store: Arc<Store>,
    collection: String,
    /// The first batches, held until they hold enough documents to train the store's
    /// compression dictionary on (when it has none), so that no document is written plain.
    held: Option<Vec<Batch>>,
    queue: Option<Sender<Batch>>,
    outcomes: Receiver<Outcome>,
    /// Through the writer: its thread. In bulk: the channel's ends until the first batch
    /// goes (the definitions are all in then), then the bulk thread.
    writing: Writing,
    /// Documents this load wrote.
    written: Arc<std::sync::atomic::AtomicU64>,
}

type BulkParts = (
    crate::store::Bulk,
    crate::features::BulkViews,
    Arc<crate::features::Features>,
);

enum Writing {
    Writer(JoinHandle<()>),
    BulkWaiting(Receiver<Batch>, Sender<Outcome>),
    Bulk(JoinHandle<Result<BulkParts, String>>),
    Over,
}

impl Offline {
    pub fn open(dir: &Path, collection: &str) -> Result<Offline, LoadError> {
        let open = |cache_bytes| {
            let options = StoreOptions {
                cache_bytes,
                ..StoreOptions::default()
            };
            Store::open(dir, options).map(Arc::new).map_err(|e| {
                LoadError::Target(format!(
                    "{}: {e} (is a server running on this data directory? use --url)",
                    dir.display()
                ))
            })
        };
        // A bulk load writes in key order and reads nothing back: the default cache serves it.
        let mut store = open(StoreOptions::default().cache_bytes)?;
        let definitions = [
            crate::features::template::TEMPLATE_COLLECTION,
            crate::features::descriptor::DESCRIPTOR_COLLECTION,
        ];
        let bulk = store
            .holds_only(&definitions)
            .map_err(|e| LoadError::Target(e.to_string()))?;
        if !bulk {
            store.shutdown_blocking();
            drop(store);
            store = open(LOAD_CACHE_BYTES)?;
        }
        let (queue, batches) = bounded::<Batch>(2);
        let (report, outcomes) = crossbeam_channel::unbounded();
        let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let writing = if bulk {
            Writing::BulkWaiting(batches, report)
        } else {
            Writing::Writer(spawn_writer(
                store.clone(),
                collection,
                batches,
                report,
                written.clone(),
            )?)
        };
        Ok(Offline {
            store,
            collection: collection.to_string(),
            held: Some(Vec::new()),
            queue: Some(queue),
            outcomes,
            writing,
            written,
        })
    }
}

/// The thread that writes each batch through the store's writer, a transaction a batch.
fn spawn_writer(
    store: Arc<Store>,
    collection: &str,
    batches: Receiver<Batch>,
    report: Sender<Outcome>,
    written: Arc<std::sync::atomic::AtomicU64>,
) -> Result<JoinHandle<()>, LoadError> {
    let collection = collection.to_string();
    std::thread::Builder::new()
        .name("geoshard-load-writer".into())
        .spawn(move || {
            let perms = layer_permissions();
            for b in batches {
                let n = b.docs.len();
                let ops = b
                    .docs
                    .into_iter()
                    .map(|(uri, content)| put(uri, content, &collection, perms))
                    .collect();
                let outcome = match store.write_blocking(&Caller::system(), ops) {
                    Ok(w) => {
                        written.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                        Outcome {
                            written: n,
                            warnings: w.warnings.into_iter().map(|w| (w.uri, w.message)).collect(),
                            failed: None,
                        }
                    }
                    Err(e) => Outcome {
                        failed: Some((b.first, e.to_string(), n)),
                        ..Outcome::default()
                    },
                };
                if report.send(outcome).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| LoadError::Target(format!("cannot start the writer: {e}")))
}

/// The thread of a bulk load: each batch's documents compressed into the store's runs and
/// their rows added to the views.
fn spawn_bulk(
    store: &Arc<Store>,
    collection: &str,
    batches: Receiver<Batch>,
    report: Sender<Outcome>,
    written: Arc<std::sync::atomic::AtomicU64>,
) -> Result<JoinHandle<Result<BulkParts, String>>, LoadError> {
    // Opened once every definition is in: the views to build are the catalog's.
    let features = crate::features::Features::open(
        store.clone(),
        crate::config::Config::default().feature_settings(),
    )
    .map_err(|e| LoadError::Target(format!("opening the views: {e}")))?;
    let mut views = features.bulk_views();
    let mut bulk = store
        .bulk()
        .map_err(|e| LoadError::Target(format!("starting the bulk load: {e}")))?;
    let collection = collection.to_string();
    std::thread::Builder::new()
        .name("geoshard-load-bulk".into())
        .spawn(move || {
            let permissions = layer_permissions();
            for b in batches {
                let n = b.docs.len();
                let docs: Vec<crate::store::Document> = b
                    .docs
                    .into_iter()
                    .map(|(uri, content)| crate::store::Document {
                        uri,
                        format: Format::Json,
                        collections: vec![collection.clone()],
                        permissions,
                        content,
                    })
                    .collect();
                if let Err(e) = bulk.add(&docs) {
                    let why = e.to_string();
                    let _ = report.send(Outcome {
                        failed: Some((b.first, why.clone(), n)),
                        ..Outcome::default()
                    });
                    return Err(why);
                }
                views.add(&docs);
                written.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                let _ = report.send(Outcome {
                    written: n,
                    ..Outcome::default()
                });
            }
            Ok((bulk, views, features))
        })
        .map_err(|e| LoadError::Target(format!("cannot start the bulk load: {e}")))
}

impl Offline {
    /// Train the store's dictionary on the held batches (when it has none), then queue them.
    fn release_held(&mut self) -> Result<(), LoadError> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let samples: Vec<Vec<u8>> = held
            .iter()
            .flat_map(|b| b.docs.iter().map(|(_, content)| content.to_vec()))
            .take(crate::store::DICTIONARY_SAMPLES)
            .collect();
        self.store
            .train_dictionary(&samples)
            .map_err(|e| LoadError::Target(format!("training the compression dictionary: {e}")))?;
        // A bulk load's thread starts now: every definition is in.
        self.writing = match std::mem::replace(&mut self.writing, Writing::Over) {
            Writing::BulkWaiting(batches, report) => Writing::Bulk(spawn_bulk(
                &self.store,
                &self.collection,
                batches,
                report,
                self.written.clone(),
            )?),
            other => other,
        };
        for batch in held {
            self.send(batch)?;
        }
        Ok(())
    }

    /// The end of a bulk load: the documents merged into the store, the views' indexes
    /// built, the views saved.
    fn finish_bulk(
        &mut self,
        parts: BulkParts,
        phase: &mut dyn FnMut(&str, u64, u64),
    ) -> Result<ViewsBuilt, LoadError> {
        let (bulk, views, features) = parts;
        let started = std::time::Instant::now();
        let written = bulk
            .finish(|done, all| phase("writing the documents in key order", done, all))
            .map_err(|e| LoadError::Target(format!("writing the documents: {e}")))?;
        views
            .finish_for_saving()
            .map_err(|e| LoadError::Target(format!("building the views: {e}")))?;
        phase("saving the views and spatial indexes", 0, 1);
        let unsaved = features.save_views();
        drop(features);
        self.store.shutdown_blocking();
        Ok(ViewsBuilt {
            took: started.elapsed(),
            unsaved,
            repacked: None,
            bulk: Some(written),
        })
    }
}

fn put(uri: String, content: Bytes, collection: &str, perms: Permissions) -> Op {
    Op::PutDocument(PutDocument {
        uri,
        content,
        format: Format::Json,
        collections: Some(vec![collection.to_string()]),
        permissions: Some(perms),
        default_permissions: perms,
    })
}

impl Target for Offline {
    fn get(&mut self, uri: &str) -> Result<Option<Value>, LoadError> {
        let doc = self
            .store
            .get(&Caller::system(), uri)
            .map_err(|e| LoadError::Target(e.to_string()))?;
        Ok(doc.and_then(|d| serde_json::from_slice(&d.content).ok()))
    }

    fn put_definition(
        &mut self,
        uri: &str,
        doc: &Value,
        collection: &str,
    ) -> Result<(), LoadError> {
        let perms = if collection == crate::features::descriptor::DESCRIPTOR_COLLECTION {
            Permissions::descriptor_default()
        } else {
            Permissions::document_default()
        };
        let op = put(
            uri.to_string(),
            Bytes::from(doc.to_string()),
            collection,
            perms,
        );
        self.store
            .write_blocking(&Caller::system(), vec![op])
            .map(drop)
            .map_err(|e| LoadError::Target(format!("{uri}: {e}")))
    }

    fn send(&mut self, batch: Batch) -> Result<(), LoadError> {
        if let Some(held) = &mut self.held {
            held.push(batch);
            let docs: usize = held.iter().map(|b| b.docs.len()).sum();
            if docs >= crate::store::DICTIONARY_SAMPLES {
                self.release_held()?;
            }
            return Ok(());
        }
        self.queue
            .as_ref()
            .and_then(|q| q.send(batch).ok())
            .ok_or_else(|| LoadError::Target("the writer stopped".into()))
    }

    fn outcomes(&self) -> &Receiver<Outcome> {
        &self.outcomes
    }

    fn finish(
        mut self: Box<Self>,
        phase: &mut dyn FnMut(&str, u64, u64),
    ) -> Result<Option<ViewsBuilt>, LoadError> {
        self.release_held()?;
        drop(self.queue.take());
        match std::mem::replace(&mut self.writing, Writing::Over) {
            Writing::Bulk(thread) => {
                let parts = thread
                    .join()
                    .map_err(|_| LoadError::Target("the bulk load failed".into()))?
                    .map_err(LoadError::Target)?;
                let started = std::time::Instant::now();
                let mut built = self.finish_bulk(parts, phase)?;
                let dir = self.store.path().parent().map(Path::to_path_buf);
                drop(self.store);
                let dir =
                    dir.ok_or_else(|| LoadError::Target("the store has no directory".into()))?;
                phase("compacting the store", 0, 1);
                let compacting = std::time::Instant::now();
                let bytes = crate::store::compact(&dir)
                    .map_err(|e| LoadError::Target(format!("compacting the store: {e}")))?;
                if let Some(w) = &mut built.bulk {
                    w.bytes = bytes;
                    w.took += compacting.elapsed();
                }
                built.took = started.elapsed();
                return Ok(Some(built));
            }
            Writing::Writer(w) => w
                .join()
                .map_err(|_| LoadError::Target("the writer failed".into()))?,
            Writing::BulkWaiting(..) | Writing::Over => {}
        }
        let started = std::time::Instant::now();
        phase("building the views and spatial indexes", 0, 1);
        // The views and spatial indexes a server would build when it starts, built and saved
        // here (with the default settings), so that it starts from them.
        let features = crate::features::Features::open(
            self.store.clone(),
            crate::config::Config::default().feature_settings(),
        )
        .map_err(|e| LoadError::Target(format!("building the views: {e}")))?;
        phase("saving the views and spatial indexes", 0, 1);
        let unsaved = features.save_views();
        drop(features);
        self.store.shutdown_blocking();
        let took = started.elapsed();
        // The documents went in by the batch, in id order: their pages are half full and
        // plain. Rewritten in key order and compressed, they take a fraction of the disk.
        let written = self.written.load(std::sync::atomic::Ordering::Relaxed);
        let held = self
            .store
            .document_count()
            .map_err(|e| LoadError::Target(e.to_string()))?;
        let dir = self.store.path().parent().map(Path::to_path_buf);
        drop(self.store);
        let dir = dir.ok_or_else(|| LoadError::Target("the store has no directory".into()))?;
        let repacked = if written > 0 && written.saturating_mul(REPACK_SHARE) >= held {
            // Compressed as they were written, with the dictionary trained on the first of them:
            // rewritten in key order, as they are.
            let r = crate::store::repack_with(&dir, crate::store::Dictionary::Keep, |done, all| {
                phase("packing the documents", done, all)
            })
            .map_err(|e| LoadError::Target(format!("packing the documents: {e}")))?;
            Some(r)
        } else {
            None
        };
        Ok(Some(ViewsBuilt {
            took,
            unsaved,
            repacked,
            bulk: None,
        }))
    }
}

pub(crate) use http::Client;
pub use http::{Http, HttpOptions};

mod http {
    use http_body_util::{BodyExt, Full};
    use hyper::client::conn::http1::SendRequest;
    use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, WWW_AUTHENTICATE};
    use hyper::{Method, Request, StatusCode};
    use hyper_util::rt::TokioIo;
    use tokio::net::TcpStream;

    use super::*;

    /// A running server and how to reach it.
    #[derive(Debug, Clone)]
    pub struct HttpOptions {
        /// `host:port`.
        pub authority: String,
        pub user: String,
        pub password: String,
        pub connections: usize,
        /// `transform` and `trans:*` parameters for the bulk writes, already encoded.
        pub flow_query: String,
    }

    /// Over HTTP: `connections` tasks, each on its own keep-alive connection, take batches
    /// from a shared queue.
    pub struct Http {
        runtime: tokio::runtime::Runtime,
        queue: Option<tokio::sync::mpsc::Sender<Batch>>,
        outcomes: Receiver<Outcome>,
        tasks: Vec<tokio::task::JoinHandle<()>>,
        client: Client,
    }

    /// One connection with its authentication state.
    pub(crate) struct Client {
        options: Arc<HttpOptions>,
        sender: Option<SendRequest<Full<Bytes>>>,
        /// The last Digest challenge, answered with a counting `nc`.
        challenge: Option<digest_auth::WwwAuthenticateHeader>,
        basic: bool,
    }

    /// An answer: status, and body.
    struct Answer {
        status: StatusCode,
        body: Bytes,
    }

    impl Client {
        pub(crate) fn new(options: Arc<HttpOptions>) -> Client {
            Client {
                options,
                sender: None,
                challenge: None,
                basic: false,
            }
        }

        async fn connect(&mut self) -> Result<(), String> {
            let stream = TcpStream::connect(&self.options.authority)
                .await
                .map_err(|e| format!("cannot connect to {}: {e}", self.options.authority))?;
            let _ = stream.set_nodelay(true);
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            self.sender = Some(sender);
            Ok(())
        }

        fn authorization(&mut self, method: &Method, uri: &str) -> Option<String> {
            let o = &self.options;
            if self.basic {
                use base64::Engine;
                let pair = format!("{}:{}", o.user, o.password);
                return Some(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                ));
            }
            let challenge = self.challenge.as_mut()?;
            let m = if method == Method::GET {
                digest_auth::HttpMethod::GET
            } else if method == Method::PUT {
                digest_auth::HttpMethod::PUT
            } else {
                digest_auth::HttpMethod::POST
            };
            let ctx = digest_auth::AuthContext::new_with_method(
                &o.user,
                &o.password,
                uri,
                Option::<&[u8]>::None,
                m,
            );
            challenge.respond(&ctx).ok().map(|h| h.to_header_string())
        }

        /// POST a JSON body (a question: sending it again is safe): the answer's status and
        /// body.
        pub(crate) async fn post_json(
            &mut self,
            path: &str,
            body: Bytes,
        ) -> Result<(u16, Bytes), String> {
            let a = self
                .request(Method::POST, path, "application/json", body)
                .await?;
            Ok((a.status.as_u16(), a.body))
        }

        /// Send a request, answering a challenge (first, or for a stale nonce) once.
        async fn request(
            &mut self,
            method: Method,
            uri: &str,
            content_type: &str,
            body: Bytes,
        ) -> Result<Answer, String> {
            // Up to two challenges answered and two connections lost (a keep-alive connection
            // the server closed): the writes are idempotent, so sending again is safe.
            let (mut challenges, mut lost) = (0, 0);
            loop {
                if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
                    self.connect().await?;
                }
                let mut req = Request::builder()
                    .method(method.clone())
                    .uri(uri)
                    .header(HOST, &self.options.authority);
                if !content_type.is_empty() {
                    req = req.header(CONTENT_TYPE, content_type);
                }
                if let Some(a) = self.authorization(&method, uri) {
                    req = req.header(AUTHORIZATION, a);
                }
                let req = req
                    .body(Full::new(body.clone()))
                    .map_err(|e| e.to_string())?;
                let Some(sender) = self.sender.as_mut() else {
                    return Err("not connected".into());
                };
                let res = match sender.send_request(req).await {
                    Ok(r) => r,
                    Err(_) if lost < 2 => {
                        lost += 1;
                        self.sender = None;
                        continue;
                    }
                    Err(e) => return Err(e.to_string()),
                };
                let status = res.status();
                let challenge = res
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let body = res
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?
                    .to_bytes();
                if status == StatusCode::UNAUTHORIZED && challenges < 2 {
                    challenges += 1;
                    match challenge {
                        Some(c) if c.trim_start().starts_with("Digest") => {
                            self.challenge =
                                Some(digest_auth::parse(&c).map_err(|e| e.to_string())?);
                            continue;
                        }
                        Some(c) if c.trim_start().starts_with("Basic") && !self.basic => {
                            self.basic = true;
                            continue;
                        }
                        _ => {}
                    }
                }
                return Ok(Answer { status, body });
            }
        }
    }

    fn encode(s: &str) -> String {
        form_urlencoded::byte_serialize(s.as_bytes()).collect()
    }

    /// Why an answer is not a success, from its contract error body when it has one.
    fn refusal(a: &Answer) -> String {
        let message = serde_json::from_slice::<Value>(&a.body)
            .ok()
            .and_then(|v| v["errorResponse"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&a.body).chars().take(300).collect());
        format!("HTTP {}: {message}", a.status.as_u16())
    }

    /// The multipart body of a batch: one metadata part with the collection and the
    /// permissions, then a part a document.
    fn multipart(batch: &Batch, metadata: &str, boundary: &str) -> Bytes {
        let size: usize = batch
            .docs
            .iter()
            .map(|(u, c)| u.len() + c.len() + 128)
            .sum();
        let mut body = Vec::with_capacity(size + metadata.len() + 256);
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Type: application/json\r\n\
                 Content-Disposition: inline; category=metadata\r\n\r\n{metadata}\r\n"
            )
            .as_bytes(),
        );
        for (uri, content) in &batch.docs {
            body.extend_from_slice(
                format!(
                    "--{boundary}\r\nContent-Type: application/json\r\n\
                     Content-Disposition: attachment; filename=\"{uri}\"\r\n\r\n"
                )
                .as_bytes(),
            );
            body.extend_from_slice(content);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        Bytes::from(body)
    }

    impl Http {
        pub fn connect(options: HttpOptions, collection: &str) -> Result<Http, LoadError> {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("geoshard-load-http")
                .enable_all()
                .build()
                .map_err(|e| LoadError::Target(e.to_string()))?;
            let options = Arc::new(options);
            // One request first: the server is there, and the credentials are good (any user
            // may ping; writing needs rest-writer, which the writes themselves check).
            let mut client = Client::new(options.clone());
            let probe = runtime.block_on(client.request(Method::GET, "/v1/ping", "", Bytes::new()));
            match probe {
                Ok(a) if a.status.is_success() => {}
                Ok(a) => return Err(LoadError::Target(refusal(&a))),
                Err(e) => return Err(LoadError::Target(e)),
            }
            let (queue, batches) = tokio::sync::mpsc::channel::<Batch>(options.connections * 2);
            let batches = Arc::new(tokio::sync::Mutex::new(batches));
            let (report, outcomes) = crossbeam_channel::unbounded();
            let mut meta = serde_json::Map::new();
            meta.insert("collections".into(), serde_json::json!([collection]));
            let perms: serde_json::Map<String, Value> = layer_permissions()
                .pairs()
                .into_iter()
                .fold(serde_json::Map::new(), |mut m, (r, c)| {
                    let list = m
                        .entry(r.name())
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if let Value::Array(a) = list {
                        a.push(Value::from(c.name()));
                    }
                    m
                });
            meta.insert("permissions".into(), Value::Object(perms));
            let metadata: Arc<str> = Arc::from(Value::Object(meta).to_string());
            let path: Arc<str> = Arc::from(format!("/v1/documents{}", options.flow_query));
            let tasks = (0..options.connections.max(1))
                .map(|i| {
                    let mut client = Client::new(options.clone());
                    let batches = batches.clone();
                    let report = report.clone();
                    let metadata = metadata.clone();
                    let path = path.clone();
                    runtime.spawn(async move {
                        let boundary = format!("geoshard-load-{i}-{}", uuid::Uuid::new_v4());
                        let content_type = format!("multipart/mixed; boundary={boundary}");
                        loop {
                            let Some(batch) = batches.lock().await.recv().await else {
                                break;
                            };
                            let n = batch.docs.len();
                            let body = multipart(&batch, &metadata, &boundary);
                            let answer = client
                                .request(Method::POST, &path, &content_type, body)
                                .await;
                            let outcome = match answer {
                                Ok(a) if a.status.is_success() => Outcome {
                                    written: n,
                                    warnings: warnings(&a.body),
                                    failed: None,
                                },
                                Ok(a) => Outcome {
                                    failed: Some((batch.first, refusal(&a), n)),
                                    ..Outcome::default()
                                },
                                Err(e) => Outcome {
                                    failed: Some((batch.first, e, n)),
                                    ..Outcome::default()
                                },
                            };
                            if report.send(outcome).is_err() {
                                break;
                            }
                        }
                    })
                })
                .collect();
            Ok(Http {
                runtime,
                queue: Some(queue),
                outcomes,
                tasks,
                client,
            })
        }
    }

    /// The `warnings` of a bulk answer: `[{uri, message}]`.
    fn warnings(body: &[u8]) -> Vec<(String, String)> {
        serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.get("warnings").and_then(Value::as_array).cloned())
            .unwrap_or_default()
            .iter()
            .map(|w| {
                (
                    w["uri"].as_str().unwrap_or_default().to_string(),
                    w["message"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    impl Target for Http {
        fn get(&mut self, uri: &str) -> Result<Option<Value>, LoadError> {
            let path = format!("/v1/documents?uri={}", encode(uri));
            let a = self
                .runtime
                .block_on(self.client.request(Method::GET, &path, "", Bytes::new()))
                .map_err(LoadError::Target)?;
            match a.status {
                StatusCode::NOT_FOUND => Ok(None),
                s if s.is_success() => Ok(serde_json::from_slice(&a.body).ok()),
                _ => Err(LoadError::Target(format!("{uri}: {}", refusal(&a)))),
            }
        }

        fn put_definition(
            &mut self,
            uri: &str,
            doc: &Value,
            collection: &str,
        ) -> Result<(), LoadError> {
            let path = format!(
                "/v1/documents?uri={}&collection={}",
                encode(uri),
                encode(collection)
            );
            let a = self
                .runtime
                .block_on(self.client.request(
                    Method::PUT,
                    &path,
                    "application/json",
                    Bytes::from(doc.to_string()),
                ))
                .map_err(LoadError::Target)?;
            if a.status.is_success() {
                Ok(())
            } else {
                Err(LoadError::Target(format!("{uri}: {}", refusal(&a))))
            }
        }

        fn send(&mut self, batch: Batch) -> Result<(), LoadError> {
            let queue = self
                .queue
                .as_ref()
                .ok_or_else(|| LoadError::Target("closed".into()))?;
            queue
                .blocking_send(batch)
                .map_err(|_| LoadError::Target("the connections stopped".into()))
        }

        fn outcomes(&self) -> &Receiver<Outcome> {
            &self.outcomes
        }

        fn finish(
            mut self: Box<Self>,
            _: &mut dyn FnMut(&str, u64, u64),
        ) -> Result<Option<ViewsBuilt>, LoadError> {
            drop(self.queue.take());
            let tasks = std::mem::take(&mut self.tasks);
            self.runtime.block_on(async {
                for t in tasks {
                    let _ = t.await;
                }
            });
            Ok(None)
        }
    }
}
