//! Questions over direct connections between nodes: HTTP/2 (hyper), long-lived connections
//! with every question multiplexed on them, so a routed question costs one request on a warm
//! connection rather than two trips through the NATS servers. Each thread that asks (an io
//! thread, on its own runtime) keeps its own connection to each peer and drives it itself, so
//! a question and its answer wake no other thread on the asking node. Each node answers on the
//! runtime of its accept loop (see `listen`), listening on its own port (`cluster_listen`),
//! and puts the address in its registry record (`ask`); a peer with none is asked over NATS
//! (`ask`).
//!
//! `Cluster::ask` and `Cluster::answer_asks` choose between the two ways.
//!
//! A question is signed as over NATS, over the node asked, the question and the time (a
//! node refuses one signed more than 30 s from its clock); the answer is signed over the
//! question's MAC and its bytes. HTTP/2 pings every second find a peer that stopped
//! answering: its connection fails within 3 s, and with it the questions on it, which the
//! asker then routes to another holder.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;

use super::ask::{AskError, MAX_QUESTIONS};
use super::trust::{MAC, Refused, SIGNED};
use super::{Answerer, Cluster, FastMap, Inner, NodeRecord};

const PATH: &str = "/geoshard/ask";
const REFUSED: &str = "geoshard-refused";
/// How long connecting to a peer may take.
const CONNECT_LIMIT: Duration = Duration::from_secs(2);
/// HTTP/2 pings on an open connection, and how long one may go unanswered.
const PING: Duration = Duration::from_secs(1);
const PING_LIMIT: Duration = Duration::from_secs(2);
/// The largest question a node reads.
const MAX_QUESTION_BYTES: usize = 64 << 20;

/// This node's address for other nodes' questions.
#[derive(Default)]
pub(crate) struct Direct {
    /// Set once the node listens.
    pub(crate) address: Mutex<String>,
}

thread_local! {
    /// This thread's open connections to peers, by address, driven by its own runtime.
    static CONNS: std::cell::RefCell<FastMap<String, SendRequest<Full<Bytes>>>> =
        std::cell::RefCell::new(FastMap::default());
}

fn question_parts<'a>(node: &'a str, question: &'a [u8]) -> [&'a [u8]; 3] {
    [b"direct", node.as_bytes(), question]
}

fn answer_parts<'a>(question_mac: &'a str, answer: &'a [u8]) -> [&'a [u8]; 3] {
    [b"direct answer", question_mac.as_bytes(), answer]
}

impl Cluster {
    /// Answer other nodes' questions with `answer` from now on: over NATS, and over
    /// direct connections when the node listens for them (`ClusterSettings::listen`).
    pub fn answer_asks(&self, answer: Answerer) {
        self.handle
            .spawn(super::ask::serve(self.inner.clone(), answer.clone()));
        if let Some(addr) = self.inner.settings.listen {
            match listen(self.inner.clone(), addr, answer) {
                Ok(bound) => tracing::info!(%bound, "answering other nodes' questions"),
                Err(e) => tracing::error!(
                    %addr, error = %e,
                    "cannot listen for other nodes' questions; they ask over NATS"
                ),
            }
        }
    }

    /// Ask `node` a question; its answer within `limit`.
    pub async fn ask(
        &self,
        node: &str,
        question: Vec<u8>,
        limit: Duration,
    ) -> Result<Vec<u8>, AskError> {
        let direct = self
            .inner
            .peers
            .lock()
            .iter()
            .find(|p| p.node == node)
            .map(|p| p.ask.clone())
            .filter(|a| !a.is_empty());
        match direct {
            Some(addr) => {
                let inner = &self.inner;
                inner.direct.ask(inner, node, &addr, question, limit).await
            }
            // The NATS client's connection runs on the cluster's runtime; asking from any
            // other tokio runtime only queues commands for it.
            None => super::ask::ask(&self.inner, node, question, limit).await,
        }
    }

    /// The live nodes (this one too) as the registry named them at the last heartbeat: the
    /// list itself, shared, as every query reads it.
    pub fn peers(&self) -> Arc<Vec<NodeRecord>> {
        self.inner.peers.lock().clone()
    }
}

/// Listen for other nodes' questions on `addr` and answer them with `answer`: on the runtime
/// of the caller when it runs on one (the node's accept loop, which with one io thread also
/// serves the public HTTP, so a question is answered on the thread that polls its socket with
/// no other thread woken), else on a thread of its own with a current-thread runtime. The
/// address bound.
pub(crate) fn listen(
    inner: Arc<Inner>,
    addr: SocketAddr,
    answer: Answerer,
) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    *inner.direct.address.lock() = local.to_string();
    if let Ok(here) = tokio::runtime::Handle::try_current() {
        here.spawn(serve(inner, listener, answer));
        return Ok(local);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("cluster-ask".into())
        .spawn(move || runtime.block_on(serve(inner, listener, answer)))?;
    Ok(local)
}

async fn serve(inner: Arc<Inner>, listener: std::net::TcpListener, answer: Answerer) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "listening for other nodes' questions");
            return;
        }
    };
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_QUESTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a node's connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (inner, answer, permits) = (inner.clone(), answer.clone(), permits.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                handle(inner.clone(), answer.clone(), permits.clone(), req)
            });
            let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_concurrent_streams(MAX_QUESTIONS as u32)
                .keep_alive_interval(PING)
                .keep_alive_timeout(PING_LIMIT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(error = %e, "a node's connection ended");
            }
        });
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r
}

async fn handle(
    inner: Arc<Inner>,
    answer: Answerer,
    permits: Arc<tokio::sync::Semaphore>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() != PATH || req.method() != hyper::Method::POST {
        return Ok(plain(StatusCode::NOT_FOUND, "no such path"));
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (signed, mac) = (header(SIGNED), header(MAC));
    let question = match Limited::new(req.into_body(), MAX_QUESTION_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(plain(StatusCode::PAYLOAD_TOO_LARGE, "question too large")),
    };
    let node = inner.settings.node.as_str();
    let refusal = inner.signer.check_question(
        signed.as_deref(),
        mac.as_deref(),
        &question_parts(node, &question),
    );
    if let Some(why) = refusal {
        Refused::Question.record(&format!("direct: {why}"));
        let mut r = plain(
            StatusCode::FORBIDDEN,
            "refused: not signed with this cluster's secret",
        );
        r.headers_mut().insert(
            REFUSED,
            hyper::header::HeaderValue::from_static("signature"),
        );
        return Ok(r);
    }
    let Ok(_permit) = permits.acquire().await else {
        return Ok(plain(StatusCode::SERVICE_UNAVAILABLE, "stopping"));
    };
    let out = answer(question).await;
    let answer_mac = mac
        .as_deref()
        .and_then(|m| inner.signer.sign(&answer_parts(m, &out)));
    let mut r = Response::new(Full::new(Bytes::from(out)));
    if let Some(m) = answer_mac
        && let Ok(v) = hyper::header::HeaderValue::from_str(&m)
    {
        r.headers_mut().insert(MAC, v);
    }
    Ok(r)
}

impl Direct {
    /// This thread's connection to `addr`: the open one, or a new one, driven by the
    /// runtime the caller runs on.
    async fn sender(&self, node: &str, addr: &str) -> Result<SendRequest<Full<Bytes>>, AskError> {
        let open = CONNS.with(|c| c.borrow().get(addr).filter(|s| !s.is_closed()).cloned());
        if let Some(s) = open {
            return Ok(s);
        }
        let made = async {
            let stream = tokio::time::timeout(CONNECT_LIMIT, tokio::net::TcpStream::connect(addr))
                .await
                .map_err(|_| "no answer".to_string())?
                .map_err(|e| e.to_string())?;
            let _ = stream.set_nodelay(true);
            let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .keep_alive_interval(PING)
                .keep_alive_timeout(PING_LIMIT)
                .keep_alive_while_idle(true)
                .handshake(TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "a connection to a node ended");
                }
            });
            Ok::<_, String>(sender)
        }
        .await
        .map_err(|e| AskError::Direct(node.to_string(), format!("connecting to {addr}: {e}")))?;
        CONNS.with(|c| c.borrow_mut().insert(addr.to_string(), made.clone()));
        Ok(made)
    }

    /// Ask `node` at `addr` a question; its answer within `limit`.
    pub(crate) async fn ask(
        &self,
        inner: &Inner,
        node: &str,
        addr: &str,
        question: Vec<u8>,
        limit: Duration,
    ) -> Result<Vec<u8>, AskError> {
        let started = tokio::time::Instant::now();
        let mut sender = self.sender(node, addr).await?;
        let signed = inner.signer.sign_now(&question_parts(node, &question));
        let mut req = Request::post(PATH);
        if let Some((time, mac)) = &signed {
            req = req.header(SIGNED, time.as_str()).header(MAC, mac.as_str());
        }
        let req = req
            .body(Full::new(Bytes::from(question)))
            .map_err(|e| AskError::Direct(node.to_string(), e.to_string()))?;
        let failed = |e: &dyn std::fmt::Display| {
            CONNS.with(|c| c.borrow_mut().remove(addr));
            AskError::Direct(node.to_string(), e.to_string())
        };
        let answered = async {
            let resp = sender.send_request(req).await.map_err(|e| failed(&e))?;
            let status = resp.status();
            let refused = resp.headers().contains_key(REFUSED);
            let mac = resp
                .headers()
                .get(MAC)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| failed(&e))?
                .to_bytes();
            if refused {
                return Err(AskError::Refused(node.to_string()));
            }
            if status != StatusCode::OK {
                return Err(AskError::Direct(
                    node.to_string(),
                    format!("answered {status}: {}", String::from_utf8_lossy(&body)),
                ));
            }
            if let Some((_, question_mac)) = &signed
                && !inner
                    .signer
                    .verify(&answer_parts(question_mac, &body), mac.as_deref())
            {
                Refused::Answer.record(&format!("a direct answer in node {node}'s name"));
                return Err(AskError::Forged(node.to_string()));
            }
            Ok(body.to_vec())
        };
        tokio::time::timeout(limit.saturating_sub(started.elapsed()), answered)
            .await
            .unwrap_or_else(|_| Err(AskError::Timeout(node.to_string(), limit.as_millis())))
    }
}
