//! geoQueryService in a cluster whose nodes hold some shards each (`cluster_shards`): the
//! node a client asks routes the query (`Placement::route`), asks the other nodes it needs
//! over NATS (`Cluster::ask`) for the whole answer or for their part, and merges the parts.
//! A node that fails to answer is left out and the query routed again over the rest.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use geoshard_core::acl::{Caller, RoleSet};
use geoshard_core::cpu;
use geoshard_core::error::{ApiError, ErrorCode};
use geoshard_features::placement::{Placement, Route};
use geoshard_features::query::{Partial, Round};
use geoshard_features::{FeatureError, FeatureRequest, Features};
use geoshard_spatial::pip::BBox;

use crate::{Answerer, AskError, Cluster};

/// How long a node waits for another's answer when queries have no time limit.
const ASK_LIMIT: Duration = Duration::from_secs(30);
/// Routings of one query: the first, and again without each node that failed to answer.
const ATTEMPTS: usize = 3;
/// Requests up to this size are read on the thread that has them, as the HTTP handler does.
const INLINE_BYTES: usize = 64 * 1024;
/// Documents a node copies in from a holder in one question, when it takes shards.
const FILL_BATCH: usize = 64;
/// Parts of up to this many rows in all are merged on the thread that has them.
const INLINE_ROWS: usize = 512;

/// What one node asks another.
#[derive(Debug, Serialize, Deserialize)]
pub struct Question {
    user: String,
    roles: u8,
    /// The log entry the answer must include (`X-Geoshard-After`), 0 for none.
    after: u64,
    /// The shards to answer for; `None`: the whole answer.
    shards: Option<Vec<usize>>,
    /// The geoQueryService request as the client sent it.
    #[serde(with = "serde_bytes")]
    body: Vec<u8>,
    /// A page over the limit is an even sample of the matches (a tile's).
    sample: bool,
    /// Which round of a page spread in two this part answers.
    round: Round,
    /// Not a query: the stored documents of these URIs, which this node keeps.
    documents: Vec<String>,
}

/// A document as one node gives it to another that keeps only its stub.
#[derive(Debug, Serialize, Deserialize)]
pub struct Kept {
    format: u8,
    permissions: [u8; 4],
    collections: Vec<String>,
    #[serde(with = "serde_bytes")]
    content: Vec<u8>,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Whole(#[serde(with = "serde_bytes")] Vec<u8>),
    Part(Partial),
    /// A refusal, with its message.
    Refused(Refusal, String),
    /// The documents asked for, in order; `None`: absent or not readable by the caller.
    Documents(Vec<Option<Kept>>),
}

/// Why a node refused a question, which decides what the asking node does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// The request's own: what this node would answer the client, given to it.
    NotFound,
    Invalid,
    TimeLimit,
    AnswerTooLarge,
    Internal,
    /// The node cannot answer now (it is stopping, it has not applied the entry asked for, or
    /// its work failed): the question goes to another node.
    Unable,
}

impl Refusal {
    fn of(e: &FeatureError) -> Refusal {
        match e {
            FeatureError::ServiceNotFound(_) | FeatureError::LayerNotFound(_) => Refusal::NotFound,
            FeatureError::Request(_) | FeatureError::Where(_) => Refusal::Invalid,
            FeatureError::TimeLimit(_) => Refusal::TimeLimit,
            FeatureError::AnswerTooLarge { .. } => Refusal::AnswerTooLarge,
            FeatureError::Internal(_) => Refusal::Internal,
        }
    }

    /// The client's error code, for a refusal of the request; `None` for one of the node.
    fn code(self) -> Option<ErrorCode> {
        match self {
            Refusal::NotFound => Some(ErrorCode::ExtensionNotFound),
            Refusal::Invalid => Some(ErrorCode::ExtensionInvalid),
            Refusal::TimeLimit => Some(ErrorCode::TimeLimit),
            Refusal::AnswerTooLarge => Some(ErrorCode::PayloadTooLarge),
            Refusal::Internal => Some(ErrorCode::Internal),
            Refusal::Unable => None,
        }
    }
}

fn refusal(e: &FeatureError) -> Reply {
    Reply::Refused(Refusal::of(e), e.to_string())
}

/// Queries routed over a cluster whose nodes hold some shards each: this node's views and
/// its membership.
pub struct Spread {
    pub(crate) features: Arc<Features>,
    pub(crate) cluster: Arc<Cluster>,
    /// `query_time_limit_ms`, for the questions other nodes ask (0: none).
    query_time_limit_ms: u64,
    outstanding: Outstanding,
    /// Shards this node took and is still copying the documents of (`fill`): it does not
    /// answer for them yet.
    filling: parking_lot::RwLock<Vec<usize>>,
}

/// The questions this node has asked each other node and not yet had answered: the load it
/// sees on them, by which it picks among a shard's holders (fewest outstanding first, as a
/// least-request balancer does).
#[derive(Default)]
struct Outstanding(parking_lot::Mutex<HashMap<String, usize>>);

impl Outstanding {
    fn of(&self, node: &str) -> usize {
        self.0.lock().get(node).copied().unwrap_or(0)
    }

    /// One more question to `node`, until the guard is dropped.
    fn ask<'a>(&'a self, node: &'a str) -> Asking<'a> {
        *self.0.lock().entry(node.to_string()).or_default() += 1;
        Asking(self, node)
    }
}

/// A question outstanding: counted off when dropped, answered or not.
struct Asking<'a>(&'a Outstanding, &'a str);

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.0.0.lock().get_mut(self.1) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Other nodes as `(node, shards, caught up)` in the order a shard's holder is picked from:
/// caught-up nodes first, then the fewest questions outstanding (`load`), then by `turn`, so
/// that nodes equally loaded share the questions.
fn order_holders(
    mut peers: Vec<(String, Vec<usize>, bool)>,
    turn: usize,
    load: impl Fn(&str) -> usize,
) -> Vec<(String, Vec<usize>)> {
    if !peers.is_empty() {
        let n = peers.len();
        peers.rotate_left(turn % n);
    }
    let mut keyed: Vec<_> = peers
        .into_iter()
        .map(|(n, s, caught_up)| ((!caught_up, load(&n)), (n, s)))
        .collect();
    // Stable: the rotation orders nodes of equal keys.
    keyed.sort_by_key(|(k, _)| *k);
    keyed.into_iter().map(|(_, p)| p).collect()
}

/// A query's route over `nodes`, the first `ready` of them this node and the caught-up
/// peers: over those alone when they hold every shard between them, else over all.
fn route_ready<N: Clone>(
    placement: &Placement,
    region: Option<&BBox>,
    nodes: &[(N, Vec<usize>)],
    ready: usize,
) -> Result<Route<N>, usize> {
    placement
        .route(region, &nodes[..ready.min(nodes.len())])
        .or_else(|_| placement.route(region, nodes))
}

/// Why one node's part is missing.
enum Failed {
    /// The node did not answer: route again without it.
    Node(String, String),
    Api(ApiError),
}

static ROTATION: AtomicUsize = AtomicUsize::new(0);

/// One query routed over the cluster: what every node asked about it needs.
struct Routed<'a> {
    spread: &'a Spread,
    caller: &'a Caller,
    /// `X-Geoshard-After`, 0 for none.
    after: u64,
    /// The request as the client sent it, and parsed.
    body: &'a Bytes,
    request: &'a Arc<FeatureRequest>,
    limit: Option<(Instant, u64)>,
}

/// What the nodes a query went to gave: one node's whole answer, or every node's part.
enum Gathered {
    Whole(Vec<u8>),
    Parts(Vec<Partial>),
}

impl Spread {
    /// Routing for a node whose views hold some shards only; `None` for one that holds every
    /// row (it answers alone).
    pub fn new(
        features: Arc<Features>,
        cluster: Arc<Cluster>,
        query_time_limit_ms: u64,
    ) -> Option<Spread> {
        features.placement()?;
        Some(Spread {
            features,
            cluster,
            query_time_limit_ms,
            outstanding: Outstanding::default(),
            filling: parking_lot::RwLock::new(Vec::new()),
        })
    }

    /// Copy in the documents of `shards`, which this node took while it kept only stubs of
    /// them (its `hold` widened): from their holders, in batches, once it has applied the
    /// log. Meanwhile it is not caught up and does not answer for those shards; `done` runs
    /// once every document is in. A failed batch is asked again, of another holder.
    pub fn fill(
        self: Arc<Self>,
        shards: Vec<usize>,
        done: impl FnOnce() + Send + 'static,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        *self.filling.write() = shards.clone();
        self.cluster.set_filling(true);
        async move { self.filling_loop(shards, done).await }
    }

    async fn filling_loop(&self, shards: Vec<usize>, done: impl FnOnce() + Send) {
        loop {
            match self.fill_once(&shards).await {
                Ok(n) => {
                    tracing::info!(?shards, documents = n, "the shards taken are copied in");
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "copying in the shards taken; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        self.filling.write().clear();
        self.cluster.set_filling(false);
        done();
    }

    pub(crate) async fn fill_once(&self, shards: &[usize]) -> Result<usize, String> {
        while !self.cluster.log_caught_up() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let wanted: Vec<u16> = shards.iter().map(|&s| s as u16).collect();
        let store = self.features.store().clone();
        let stubs = tokio::task::spawn_blocking(move || store.stubs_in(&wanted))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        // Grouped by one shard each of whose holders keeps them all.
        let mut groups: std::collections::BTreeMap<u16, Vec<String>> = Default::default();
        for (uri, home) in stubs {
            groups.entry(home[0]).or_default().push(uri);
        }
        let mut copied = 0;
        let mut pace = crate::Pace::new(self.cluster.catch_up_bytes());
        for (shard, uris) in groups {
            for chunk in uris.chunks(FILL_BATCH) {
                let (docs, _) = documents(self, &Caller::system(), 0, chunk, &[shard])
                    .await
                    .map_err(|e| e.to_string())?;
                let docs: Vec<_> = docs
                    .into_iter()
                    .flatten()
                    .map(|d| (d.uri, d.format, d.content))
                    .collect();
                let bytes: usize = docs.iter().map(|d| d.0.len() + d.2.len()).sum();
                copied += docs.len();
                self.features
                    .store()
                    .fill(docs)
                    .await
                    .map_err(|e| e.to_string())?;
                geoshard_core::metrics::record(|m| {
                    m.cluster_copied
                        .with_label_values(&["holders"])
                        .inc_by(bytes as u64)
                });
                pace.take(bytes as u64).await;
            }
        }
        Ok(copied)
    }

    /// The deadline of a question answered now, and the limit it comes from.
    fn query_limit(&self) -> Option<(Instant, u64)> {
        let ms = self.query_time_limit_ms;
        (ms > 0).then(|| (Instant::now() + Duration::from_millis(ms), ms))
    }
}

/// Answer a geoQueryService request (its JSON body) by routing it over the cluster.
pub async fn geo_query(
    spread: &Spread,
    caller: &Caller,
    after: u64,
    body: Bytes,
    limit: Option<(Instant, u64)>,
    sample: bool,
) -> Result<Vec<u8>, ApiError> {
    let max_vertices = spread.features.settings().max_query_vertices;
    let mut request = if body.len() <= INLINE_BYTES {
        FeatureRequest::parse_for(caller.name(), &body, max_vertices)?
    } else {
        let (body, name) = (body.clone(), caller.name().to_string());
        cpu::run_cpu_intensive(move || FeatureRequest::parse_for(&name, &body, max_vertices))
            .await
            .ok_or_else(|| ApiError::new(ErrorCode::Internal, "the query failed"))??
    };
    request.query.spread = sample;
    let request = Arc::new(request);
    let routed = Routed {
        spread,
        caller,
        after,
        body: &body,
        request: &request,
        limit,
    };
    let parts = match gather(&routed).await? {
        Gathered::Whole(bytes) => return Ok(bytes),
        Gathered::Parts(parts) => parts,
    };
    let (features, caller) = (spread.features.clone(), caller.clone());
    let merged = if parts.iter().map(Partial::rows).sum::<usize>() <= INLINE_ROWS {
        Some(features.queries().merge_partials(&caller, &request, parts))
    } else {
        cpu::run_cpu_intensive(move || features.queries().merge_partials(&caller, &request, parts))
            .await
    };
    merged
        .ok_or_else(|| ApiError::new(ErrorCode::Internal, "the query failed"))?
        .map_err(ApiError::from)
}

/// Each layer's data extent over every node, by layer id, for service `service`: what the
/// OGC collections and TileJSON give as bounds. `None` when this node holds every shard or
/// is not placed (its own views then say).
pub async fn layer_extents(
    spread: &Spread,
    caller: &Caller,
    after: u64,
    service: &str,
) -> Result<Option<std::collections::HashMap<i64, BBox>>, ApiError> {
    let body = Bytes::from(serde_json::json!({"params": {"id": service}}).to_string());
    let request = Arc::new(FeatureRequest::parse_for(
        caller.name(),
        &body,
        spread.features.settings().max_query_vertices,
    )?);
    let routed = Routed {
        spread,
        caller,
        after,
        body: &body,
        request: &request,
        limit: None,
    };
    let parts = match gather(&routed).await? {
        Gathered::Whole(_) => return Ok(None),
        Gathered::Parts(parts) => parts,
    };
    Ok(Some(geoshard_features::query::merge_extents(&parts)))
}

/// Route a parsed request over the cluster: one node's whole answer, or the parts.
async fn gather(q: &Routed<'_>) -> Result<Gathered, ApiError> {
    let (cluster, request) = (&q.spread.cluster, q.request);
    let features = &q.spread.features;
    let Some(placement) = features.placement() else {
        return Err(ApiError::new(ErrorCode::Internal, "no shard placement"));
    };
    let me = cluster.node().to_string();
    let mut left_out: Vec<String> = Vec::new();
    let mut last_failure = String::new();
    for _ in 0..ATTEMPTS {
        let peers: Vec<(String, Vec<usize>, bool)> = cluster
            .peers()
            .iter()
            .filter(|p| {
                p.node != me && p.partition == placement.partition() && !left_out.contains(&p.node)
            })
            .map(|p| (p.node.clone(), p.shards.clone(), p.caught_up))
            .collect();
        // This node answers for what it holds. A node still catching up answers with what it
        // has applied (and waits for `X-Geoshard-After`): used only when the caught-up nodes
        // do not hold every shard between them, even where it alone would hold a query's
        // whole cover (a node that joins may hold shards no other node holds together).
        let turn = ROTATION.fetch_add(1, Ordering::Relaxed);
        let caught_up = peers.iter().filter(|p| p.2).count();
        let mut mine = cluster.serving();
        {
            let filling = q.spread.filling.read();
            if !filling.is_empty() {
                mine.retain(|s| !filling.contains(s));
            }
        }
        let mut nodes = vec![(me.clone(), mine)];
        nodes.extend(order_holders(peers, turn, |n| q.spread.outstanding.of(n)));
        let route = route_ready(&placement, request.region().as_ref(), &nodes, 1 + caught_up)
            .map_err(|shard| {
                ApiError::new(
                    ErrorCode::Unavailable,
                    format!("no live node holds shard {shard}{last_failure}"),
                )
            })?;
        let route = match route {
            // Every shard is here: the whole answer, as a single node gives it.
            Route::Spread(parts) if parts.len() == 1 && parts[0].0 == me => Route::One(me.clone()),
            r => r,
        };
        let asked = match route {
            Route::One(n) => answer_from(q, &n, None, Round::One)
                .await
                .and_then(|r| match r {
                    Reply::Whole(bytes) => Ok(Gathered::Whole(bytes)),
                    _ => Err(Failed::Node(n, "an answer of the wrong kind".into())),
                }),
            Route::Spread(parts) => {
                let max_records = features.settings().max_record_count;
                if request.deep_page(max_records) {
                    two_rounds(q, &parts).await
                } else {
                    let asks = parts
                        .iter()
                        .map(|(n, s)| (n.clone(), s.clone(), Round::One));
                    ask_parts(q, asks.collect()).await
                }
                .map(Gathered::Parts)
            }
        };
        match asked {
            Ok(gathered) => return Ok(gathered),
            Err(Failed::Api(e)) => return Err(e),
            Err(Failed::Node(n, why)) => {
                tracing::warn!(node = %n, why = %why, "a node left out of a query");
                last_failure = format!(" (node {n}: {why})");
                left_out.push(n);
            }
        }
    }
    Err(ApiError::new(
        ErrorCode::Unavailable,
        format!("the nodes holding the query's shards did not answer{last_failure}"),
    ))
}

/// Each node's part, asked of all at once: (node, its shards, the round).
async fn ask_parts(
    q: &Routed<'_>,
    asks: Vec<(String, Vec<usize>, Round)>,
) -> Result<Vec<Partial>, Failed> {
    let replies = futures_util::future::join_all(
        asks.iter()
            .map(|(n, shards, round)| answer_from(q, n, Some(shards.clone()), round.clone())),
    )
    .await;
    let mut partials = Vec::with_capacity(replies.len());
    let mut failed = None;
    for (r, (n, _, _)) in replies.into_iter().zip(&asks) {
        match r {
            Ok(Reply::Part(p)) => partials.push(p),
            Ok(_) => {
                failed = Some(Failed::Node(
                    n.clone(),
                    "an answer of the wrong kind".into(),
                ))
            }
            Err(f @ Failed::Api(_)) => return Err(f),
            Err(f) => failed = failed.or(Some(f)),
        }
    }
    match failed {
        Some(f) => Err(f),
        None => Ok(partials),
    }
}

/// A deep page: every part's order keys first, then from each node only its rows on the
/// page, written (a node with none is not asked again).
async fn two_rounds(
    q: &Routed<'_>,
    parts: &[(String, Vec<usize>)],
) -> Result<Vec<Partial>, Failed> {
    let asks = parts
        .iter()
        .map(|(n, s)| (n.clone(), s.clone(), Round::Keys));
    let keys = ask_parts(q, asks.collect()).await?;
    // The merge of every part's keys, off the async thread unless small, as the merge of rows.
    let (features, caller, request) = (
        q.spread.features.clone(),
        q.caller.clone(),
        q.request.clone(),
    );
    let (keys, rounds) = if keys.iter().map(Partial::rows).sum::<usize>() <= INLINE_ROWS {
        let rounds = features.queries().second_round(&caller, &request, &keys);
        (keys, rounds)
    } else {
        cpu::run_cpu_intensive(move || {
            let rounds = features.queries().second_round(&caller, &request, &keys);
            (keys, rounds)
        })
        .await
        .ok_or_else(|| Failed::Api(ApiError::new(ErrorCode::Internal, "the query failed")))?
    };
    let rounds = rounds.map_err(|e| Failed::Api(e.into()))?;
    let Some(rounds) = rounds else {
        return Ok(keys);
    };
    let mut asks = Vec::new();
    let mut out: Vec<Option<Partial>> = Vec::with_capacity(parts.len());
    for ((part, (node, shards)), round) in keys.into_iter().zip(parts).zip(rounds) {
        match (&round, part) {
            (Round::Rows { rows, skipped }, Partial::Page { total, .. }) if rows.is_empty() => {
                out.push(Some(Partial::Page {
                    total,
                    skipped: *skipped,
                    rows: Vec::new(),
                }));
            }
            (_, Partial::Empty) => out.push(Some(Partial::Empty)),
            _ => {
                out.push(None);
                asks.push((node.clone(), shards.clone(), round));
            }
        }
    }
    let mut written = ask_parts(q, asks).await?.into_iter();
    Ok(out
        .into_iter()
        .map(|p| p.or_else(|| written.next()).unwrap_or(Partial::Empty))
        .collect())
}

/// The whole answer or the part for `shards` of node `node`: this one's own, or asked.
async fn answer_from(
    q: &Routed<'_>,
    node: &str,
    shards: Option<Vec<usize>>,
    round: Round,
) -> Result<Reply, Failed> {
    let Routed {
        spread,
        caller,
        after,
        body,
        request,
        limit,
    } = *q;
    let cluster = &spread.cluster;
    if node == cluster.node() {
        let (features, caller, request) =
            (spread.features.clone(), caller.clone(), request.clone());
        let reply = if request.is_light() {
            answer(&features, &caller, &request, shards, limit, &round)
        } else {
            cpu::run_cpu_intensive(move || {
                answer(&features, &caller, &request, shards, limit, &round)
            })
            .await
            .ok_or_else(|| Failed::Api(ApiError::new(ErrorCode::Internal, "the query failed")))?
        };
        return match reply {
            // This node's own refusal is the client's, whatever its kind.
            Reply::Refused(why, message) => Err(Failed::Api(ApiError::new(
                why.code().unwrap_or(ErrorCode::Unavailable),
                message,
            ))),
            r => Ok(r),
        };
    }
    let question = Question {
        user: caller.name().to_string(),
        roles: caller.roles().bits(),
        after,
        shards,
        body: body.to_vec(),
        sample: request.query.spread,
        round,
        documents: Vec::new(),
    };
    let bytes = postcard::to_stdvec(&question)
        .map_err(|e| Failed::Api(ApiError::new(ErrorCode::Internal, e.to_string())))?;
    let wait = limit.map_or(ASK_LIMIT, |(deadline, _)| {
        deadline.saturating_duration_since(Instant::now())
    });
    let _asked = spread.outstanding.ask(node);
    let answer = cluster.ask(node, bytes, wait).await.map_err(|e| match e {
        AskError::TooLarge(n) => Failed::Api(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("a query of {n} bytes is more than the cluster's messages hold"),
        )),
        AskError::Timeout(..) if limit.is_some() => {
            Failed::Api(FeatureError::TimeLimit(limit.map_or(0, |l| l.1)).into())
        }
        e => Failed::Node(node.to_string(), e.to_string()),
    })?;
    match postcard::from_bytes::<Reply>(&answer) {
        Ok(Reply::Refused(why, message)) => match why.code() {
            Some(code) => Err(Failed::Api(ApiError::new(code, message))),
            None => Err(Failed::Node(node.to_string(), message)),
        },
        Ok(r) => Ok(r),
        Err(e) => Err(Failed::Node(
            node.to_string(),
            format!("an unreadable answer of {} bytes: {e}", answer.len()),
        )),
    }
}

/// This node's whole answer, or its part for `shards`.
fn answer(
    features: &Features,
    caller: &Caller,
    request: &FeatureRequest,
    shards: Option<Vec<usize>>,
    limit: Option<(Instant, u64)>,
    round: &Round,
) -> Reply {
    let out = match shards {
        None => features
            .queries()
            .execute_within(caller, request, limit)
            .map(Reply::Whole),
        Some(s) => features
            .queries()
            .execute_partial(caller, request, Some(&s), limit, round)
            .map(Reply::Part),
    };
    out.unwrap_or_else(|e| refusal(&e))
}

/// How this node answers other nodes' questions: refused once `spread` is dropped (the
/// node is stopping).
pub fn answerer(spread: Weak<Spread>) -> Answerer {
    Arc::new(move |bytes: Bytes| {
        let spread = spread.clone();
        Box::pin(async move {
            let reply = match (spread.upgrade(), postcard::from_bytes::<Question>(&bytes)) {
                (None, _) => Reply::Refused(Refusal::Unable, "the node is stopping".into()),
                (_, Err(e)) => {
                    Reply::Refused(Refusal::Invalid, format!("an unreadable question: {e}"))
                }
                (Some(spread), Ok(q)) => answer_question(&spread, q).await,
            };
            postcard::to_stdvec(&reply).unwrap_or_default()
        })
    })
}

/// This node's answer to another's question.
pub async fn answer_question(spread: &Spread, q: Question) -> Reply {
    let limit = spread.query_limit();
    if q.after > 0
        && !spread
            .cluster
            .wait_visible(
                q.after,
                limit.map_or(ASK_LIMIT, |(_, ms)| Duration::from_millis(ms)),
            )
            .await
    {
        return Reply::Refused(
            Refusal::Unable,
            format!("log entry {} is not applied here yet", q.after),
        );
    }
    let caller = Caller::new(q.user, RoleSet::from_bits(q.roles));
    let features = spread.features.clone();
    if !q.documents.is_empty() {
        let uris = q.documents;
        return tokio::task::spawn_blocking(move || kept(&features, &caller, &uris))
            .await
            .unwrap_or_else(|_| Reply::Refused(Refusal::Unable, "the read failed".into()));
    }
    let max_vertices = features.settings().max_query_vertices;
    let (shards, sample, round) = (q.shards, q.sample, q.round);
    let failed = || Reply::Refused(Refusal::Unable, "the query failed".into());
    if q.body.len() > INLINE_BYTES {
        return cpu::run_cpu_intensive(move || {
            match FeatureRequest::parse_for(caller.name(), &q.body, max_vertices) {
                Ok(mut request) => {
                    request.query.spread = sample;
                    answer(&features, &caller, &request, shards, limit, &round)
                }
                Err(e) => refusal(&e),
            }
        })
        .await
        .unwrap_or_else(failed);
    }
    let mut request = match FeatureRequest::parse_for(caller.name(), &q.body, max_vertices) {
        Ok(r) => r,
        Err(e) => return refusal(&e),
    };
    request.query.spread = sample;
    // A point query or a descriptor is answered here, as the HTTP handler answers it inline.
    if request.is_light() {
        return answer(&features, &caller, &request, shards, limit, &round);
    }
    cpu::run_cpu_intensive(move || answer(&features, &caller, &request, shards, limit, &round))
        .await
        .unwrap_or_else(failed)
}

/// This node's stored documents `uris`, as `caller` may read them; refused if one is not
/// kept here (moved away since the asker looked: it asks again, of the holders it now sees).
fn kept(features: &Features, caller: &Caller, uris: &[String]) -> Reply {
    use crate::store::Lookup;
    let mut out = Vec::with_capacity(uris.len());
    for uri in uris {
        out.push(match features.store().lookup(caller, uri) {
            Ok(Lookup::Here(doc)) => Some(Kept {
                format: doc.format as u8,
                permissions: doc.permissions.to_bytes(),
                collections: doc.collections,
                content: doc.content.to_vec(),
            }),
            Ok(Lookup::Absent) => None,
            Ok(Lookup::Elsewhere { .. }) => {
                return Reply::Refused(Refusal::Unable, format!("{uri} is not kept here"));
            }
            Err(e) => return Reply::Refused(Refusal::Unable, e.to_string()),
        });
    }
    Reply::Documents(out)
}

/// A document whose content this node does not keep, read from a node that does: a holder
/// of one of `shards`, the least loaded first, after log entry `after`. With the node that
/// gave it.
pub async fn document(
    spread: &Spread,
    caller: &Caller,
    after: u64,
    uri: &str,
    shards: &[u16],
) -> Result<Option<(crate::store::Document, String)>, ApiError> {
    let (mut docs, node) = documents(spread, caller, after, &[uri.to_string()], shards).await?;
    Ok(docs.pop().flatten().map(|d| (d, node)))
}

/// Documents whose content this node does not keep, read from one node that keeps them all:
/// a holder of one of `shards`, caught up and least loaded first, after log entry `after`
/// (and what this node has applied). `None` for one absent or unreadable by `caller`; with
/// the node that gave them.
pub async fn documents(
    spread: &Spread,
    caller: &Caller,
    after: u64,
    uris: &[String],
    shards: &[u16],
) -> Result<(Vec<Option<crate::store::Document>>, String), ApiError> {
    use crate::store::{Document, Format};
    let cluster = &spread.cluster;
    let me = cluster.node().to_string();
    // The holder answers as of at least what this node has applied, where it found the stubs.
    let after = after.max(cluster.visible());
    let question = Question {
        user: caller.name().to_string(),
        roles: caller.roles().bits(),
        after,
        shards: None,
        body: Vec::new(),
        sample: false,
        round: Round::One,
        documents: uris.to_vec(),
    };
    let bytes = postcard::to_stdvec(&question)
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
    let partition = spread
        .features
        .placement()
        .map(|p| p.partition().to_string());
    let what = || match uris {
        [one] => one.clone(),
        _ => format!("{} documents", uris.len()),
    };
    let mut last_failure = String::new();
    let mut left_out: Vec<String> = Vec::new();
    for _ in 0..ATTEMPTS {
        let holders: Vec<(String, Vec<usize>, bool)> = cluster
            .peers()
            .iter()
            .filter(|p| {
                p.node != me
                    && Some(&p.partition) == partition.as_ref()
                    && !left_out.contains(&p.node)
                    && p.shards.iter().any(|s| shards.contains(&(*s as u16)))
            })
            .map(|p| (p.node.clone(), p.shards.clone(), p.caught_up))
            .collect();
        let turn = ROTATION.fetch_add(1, Ordering::Relaxed);
        let Some((node, _)) = order_holders(holders, turn, |n| spread.outstanding.of(n))
            .into_iter()
            .next()
        else {
            return Err(ApiError::new(
                ErrorCode::Unavailable,
                format!(
                    "no live node keeps {} (the holders of shards {shards:?}){last_failure}",
                    what()
                ),
            ));
        };
        let asked = spread.outstanding.ask(&node);
        let answer = cluster.ask(&node, bytes.clone(), ASK_LIMIT).await;
        drop(asked);
        let why = match answer {
            Ok(answer) => match postcard::from_bytes::<Reply>(&answer) {
                Ok(Reply::Documents(kept)) if kept.len() == uris.len() => {
                    let docs = kept
                        .into_iter()
                        .zip(uris)
                        .map(|(k, uri)| {
                            k.map(|k| Document {
                                uri: uri.clone(),
                                format: Format::from_u8(k.format).unwrap_or(Format::Binary),
                                collections: k.collections,
                                permissions: geoshard_core::acl::Permissions::from_bytes(
                                    k.permissions,
                                ),
                                content: Bytes::from(k.content),
                            })
                        })
                        .collect();
                    return Ok((docs, node));
                }
                Ok(Reply::Refused(_, message)) => message,
                Ok(_) => "an answer of the wrong kind".to_string(),
                Err(e) => format!("an unreadable answer: {e}"),
            },
            Err(e) => e.to_string(),
        };
        tracing::warn!(node = %node, why = %why, "a node left out of a document read");
        last_failure = format!(" (node {node}: {why})");
        left_out.push(node);
    }
    Err(ApiError::new(
        ErrorCode::Unavailable,
        format!("the nodes keeping {} did not answer{last_failure}", what()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Holders are asked in order of their questions outstanding, then in turn.
    #[test]
    fn holders_are_picked_by_outstanding_questions_then_in_turn() {
        let peers = |list: &[(&str, bool)]| -> Vec<(String, Vec<usize>, bool)> {
            list.iter()
                .map(|(n, c)| (n.to_string(), vec![0], *c))
                .collect()
        };
        let names = |v: Vec<(String, Vec<usize>)>| -> Vec<String> {
            v.into_iter().map(|(n, _)| n).collect()
        };
        let idle = |_: &str| 0;
        // Equally loaded: each turn starts with the next node.
        let all = peers(&[("a", true), ("b", true), ("c", true)]);
        assert_eq!(names(order_holders(all.clone(), 0, idle)), ["a", "b", "c"]);
        assert_eq!(names(order_holders(all.clone(), 1, idle)), ["b", "c", "a"]);
        assert_eq!(names(order_holders(all.clone(), 5, idle)), ["c", "a", "b"]);
        // The node with the fewest questions outstanding first, whatever the turn.
        let load = |n: &str| match n {
            "a" => 3,
            "b" => 1,
            _ => 2,
        };
        for turn in 0..3 {
            assert_eq!(
                names(order_holders(all.clone(), turn, load)),
                ["b", "c", "a"]
            );
        }
        // A node catching up comes last, however idle.
        let some = peers(&[("a", false), ("b", true), ("c", true)]);
        assert_eq!(names(order_holders(some, 0, idle)), ["b", "c", "a"]);
        assert!(order_holders(Vec::new(), 3, idle).is_empty());
        // Outstanding questions are counted while asked.
        let out = Outstanding::default();
        {
            let _one = out.ask("a");
            let _two = out.ask("a");
            assert_eq!(out.of("a"), 2);
        }
        assert_eq!(out.of("a"), 0);
        assert_eq!(out.of("b"), 0);
    }

    /// A refusal of the request reaches the client of another node with the code this node's
    /// own answer would have had, and survives the wire; a refusal of the node has none.
    #[test]
    fn refusals_map_as_the_node_answers_alone() {
        let errors = [
            FeatureError::ServiceNotFound("s".into()),
            FeatureError::LayerNotFound("1".into()),
            FeatureError::TimeLimit(5),
            FeatureError::AnswerTooLarge { bytes: 9, limit: 1 },
            FeatureError::Internal("x".into()),
        ];
        for e in &errors {
            let Reply::Refused(why, message) = refusal(e) else {
                panic!("{e}")
            };
            let bytes = postcard::to_stdvec(&Reply::Refused(why, message.clone())).unwrap();
            let Ok(Reply::Refused(back, _)) = postcard::from_bytes::<Reply>(&bytes) else {
                panic!("{e}: not read back")
            };
            assert_eq!(back, why);
            let code = why.code().expect("a refusal of the request");
            assert_eq!(
                ApiError::new(code, message).status(),
                ApiError::from(match e {
                    FeatureError::ServiceNotFound(s) => FeatureError::ServiceNotFound(s.clone()),
                    FeatureError::LayerNotFound(s) => FeatureError::LayerNotFound(s.clone()),
                    FeatureError::TimeLimit(n) => FeatureError::TimeLimit(*n),
                    FeatureError::AnswerTooLarge { bytes, limit } => {
                        FeatureError::AnswerTooLarge {
                            bytes: *bytes,
                            limit: *limit,
                        }
                    }
                    other => FeatureError::Internal(other.to_string()),
                })
                .status(),
                "{e}"
            );
        }
        assert_eq!(Refusal::Unable.code(), None);
    }

    /// A node catching up is not asked while the caught-up nodes hold every shard, even for
    /// a box whose cover it alone holds whole.
    #[test]
    fn a_node_catching_up_is_asked_only_for_what_no_caught_up_node_holds() {
        let p = Placement::new(2, 6, &[0, 1, 2, 3]).unwrap();
        let nodes = vec![
            ("me", vec![0, 1, 2, 3]),
            ("b", vec![2, 3, 4, 5]),
            ("c", vec![0, 1, 4, 5]),
            ("joining", vec![1, 3, 5]),
        ];
        let only =
            |i: usize, b: &BBox| matches!(p.route(Some(b), &nodes[i..=i]), Ok(Route::One(_)));
        // A box only the joining node's shards cover.
        let mut found = None;
        'search: for i in 0..72 {
            for j in 0..30 {
                for size in [2.0, 6.0, 15.0] {
                    let (x, y) = (-180.0 + i as f64 * 5.0, -75.0 + j as f64 * 5.0);
                    let b = [x, y, (x + size).min(180.0), (y + size).min(85.0)];
                    if only(3, &b) && !(0..3).any(|k| only(k, &b)) {
                        found = Some(b);
                        break 'search;
                    }
                }
            }
        }
        let b = found.expect("a box covered by shards 1, 3 and 5 together only");
        assert!(matches!(
            p.route(Some(&b), &nodes),
            Ok(Route::One("joining"))
        ));
        match route_ready(&p, Some(&b), &nodes, 3) {
            Ok(Route::Spread(parts)) => {
                assert!(parts.iter().all(|(n, _)| *n != "joining"), "{parts:?}")
            }
            r => panic!("{r:?}"),
        }
        // When the others do not hold every shard, it is asked.
        assert!(matches!(
            route_ready(&p, None, &[nodes[0].clone(), nodes[2].clone()], 1),
            Ok(Route::Spread(parts)) if parts.len() == 2
        ));
    }

    #[test]
    fn questions_and_replies_read_back_as_sent() {
        let q = Question {
            user: "u".into(),
            roles: 5,
            after: 7,
            shards: Some(vec![0, 3]),
            body: b"{}".to_vec(),
            sample: false,
            round: Round::Rows {
                rows: vec![(vec![geoshard_features::query::Key::Str("a".into())], 4)],
                skipped: 9,
            },
            documents: vec!["/a.json".into()],
        };
        let back: Question = postcard::from_bytes(&postcard::to_stdvec(&q).unwrap()).unwrap();
        assert_eq!(
            (
                back.user,
                back.roles,
                back.after,
                back.shards,
                back.documents
            ),
            (
                "u".into(),
                5,
                7,
                Some(vec![0, 3]),
                vec!["/a.json".to_string()]
            )
        );
        let Round::Rows { rows, skipped } = back.round else {
            panic!("{:?}", back.round)
        };
        assert_eq!(skipped, 9);
        assert_eq!(
            rows,
            [(vec![geoshard_features::query::Key::Str("a".into())], 4)]
        );
        let part = Partial::Count(12);
        let bytes = postcard::to_stdvec(&Reply::Part(part)).unwrap();
        assert!(matches!(
            postcard::from_bytes::<Reply>(&bytes).unwrap(),
            Reply::Part(Partial::Count(12))
        ));
        let kept = Reply::Documents(vec![
            None,
            Some(Kept {
                format: 0,
                permissions: [1, 2, 3, 4],
                collections: vec!["c".into()],
                content: b"{}".to_vec(),
            }),
        ]);
        let Reply::Documents(mut got) =
            postcard::from_bytes::<Reply>(&postcard::to_stdvec(&kept).unwrap()).unwrap()
        else {
            panic!("not documents")
        };
        let k = got.pop().flatten().unwrap();
        assert!(got[0].is_none());
        assert_eq!(
            (k.permissions, k.collections, k.content),
            ([1, 2, 3, 4], vec!["c".to_string()], b"{}".to_vec())
        );
    }

    /// Byte fields go as one slice, in the same bytes as the byte sequences they were: nodes
    /// of the release before still read them, and they read its.
    #[test]
    fn byte_fields_keep_the_wire_of_byte_sequences() {
        use geoshard_features::query::Key;
        #[derive(Serialize)]
        #[allow(dead_code)]
        enum Before {
            Whole(Vec<u8>),
            Part(BeforePartial),
        }
        #[derive(Serialize)]
        #[allow(dead_code)]
        enum BeforePartial {
            Extents(()),
            Empty,
            Count(u64),
            Ids(()),
            Page {
                total: u64,
                skipped: u64,
                rows: Vec<(Vec<Key>, i64, Vec<u8>)>,
            },
        }
        let json = br#"{"attributes":{"NAME":"Autauga"}}"#.to_vec();
        let rows = vec![
            (
                vec![Key::Str("Autauga".into()), Key::Int(7)],
                7,
                json.clone(),
            ),
            (vec![Key::Null], 8, Vec::new()),
        ];
        let before = postcard::to_stdvec(&Before::Whole(json.clone())).unwrap();
        let now = postcard::to_stdvec(&Reply::Whole(json.clone())).unwrap();
        assert_eq!(now, before);
        let before = postcard::to_stdvec(&Before::Part(BeforePartial::Page {
            total: 9,
            skipped: 1,
            rows: rows.clone(),
        }))
        .unwrap();
        let part = Reply::Part(Partial::Page {
            total: 9,
            skipped: 1,
            rows: rows.clone(),
        });
        assert_eq!(postcard::to_stdvec(&part).unwrap(), before);
        match postcard::from_bytes::<Reply>(&before).unwrap() {
            Reply::Part(Partial::Page {
                total,
                skipped,
                rows: read,
            }) => assert_eq!((total, skipped, read), (9, 1, rows)),
            other => panic!("read back as {other:?}"),
        }
    }
}
