//! Questions one node asks another over NATS, outside the log: the parts of a query spread
//! over the nodes holding its shards. A question goes to `geoshard-ask.<cluster>.<node>`
//! with an inbox to answer to. The node asked says at once that it has the question (a node
//! that does not within 2 s is taken for gone), then answers; an answer larger than a NATS
//! message comes in chunks, in order (NATS keeps the order of one publisher's messages), each
//! saying how many there are.
//! What questions and answers mean is the caller's business: here they are bytes.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;

use super::trust::{self, Refused};
use super::{ENVELOPE_BYTES, Inner};

const CHUNKS: &str = "Geoshard-Chunks";
/// The answer of a node that refused a question for its signature.
const REFUSED: &str = "Geoshard-Refused";
/// Sent first, as soon as a question arrives: the node is there and working on it.
const TAKEN: &str = "Geoshard-Taken";
/// How long a node may take to say it has a question before it is taken for gone: NATS can
/// still route a question to a node killed a moment ago, and nobody answers it.
const TAKEN_LIMIT: Duration = Duration::from_secs(2);
/// How often a node working on a question says so; one silent for `TAKEN_LIMIT` is gone.
const STILL_WORKING: Duration = Duration::from_secs(1);

/// Questions a node works on at once; more wait in the subscription, and an asker whose
/// question is not taken within `TAKEN_LIMIT` asks another holder or fails, so a flood of
/// questions holds bounded memory and tasks rather than one task each.
pub(crate) const MAX_QUESTIONS: usize = 256;

/// How a node answers a question: the answer's bytes.
pub type Answerer =
    Arc<dyn Fn(Bytes) -> Pin<Box<dyn Future<Output = Vec<u8>> + Send>> + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("node {0} is not answering questions")]
    NoResponders(String),
    #[error("node {0} did not take the question within {1} ms")]
    Gone(String, u128),
    #[error("node {0} did not answer within {1} ms")]
    Timeout(String, u128),
    #[error("the question is {0} bytes, more than a NATS message holds")]
    TooLarge(usize),
    #[error(
        "node {0} refused the question's signature (is cluster_secret the same on every node?)"
    )]
    Refused(String),
    #[error("an answer in node {0}'s name was not signed with the cluster's secret")]
    Forged(String),
    #[error("NATS: {0}")]
    Nats(String),
    #[error("node {0}, asked directly: {1}")]
    Direct(String, String),
}

/// Outside the log's subjects (`geoshard.<cluster>.>`), which JetStream would store and
/// acknowledge.
fn subject(inner: &Inner, node: &str) -> String {
    format!("geoshard-ask.{}.{node}", inner.settings.name)
}

/// Tell the asker the question is here and being worked on.
async fn say_taken(inner: &Inner, reply: &async_nats::Subject) {
    let mut taken = async_nats::HeaderMap::new();
    taken.insert(TAKEN, "1");
    inner
        .signer
        .sign_headers(&mut taken, &[b"taken", reply.as_bytes()]);
    let _ = inner
        .client
        .publish_with_headers(reply.clone(), taken, Bytes::new())
        .await;
}

pub(super) async fn serve(inner: Arc<Inner>, answer: Answerer) {
    let subject = subject(&inner, &inner.settings.node);
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_QUESTIONS));
    loop {
        let mut sub = match inner.client.subscribe(subject.clone()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "subscribing to questions");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        while let Some(msg) = sub.next().await {
            let Some(reply) = msg.reply.clone() else {
                continue;
            };
            if let Some(why) = check_question(&inner, &msg, &reply) {
                Refused::Question.record(&why);
                let mut refused = async_nats::HeaderMap::new();
                refused.insert(REFUSED, "signature");
                let _ = inner
                    .client
                    .publish_with_headers(reply, refused, Bytes::new())
                    .await;
                continue;
            }
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let (inner, answer) = (inner.clone(), answer.clone());
            tokio::spawn(async move {
                let _permit = permit;
                say_taken(&inner, &reply).await;
                // Until the answer is ready, a word every second that the node is still on it.
                let working = answer(msg.payload);
                tokio::pin!(working);
                let mut tick = tokio::time::interval(STILL_WORKING);
                tick.tick().await;
                let out = loop {
                    tokio::select! {
                        out = &mut working => break out,
                        _ = tick.tick() => say_taken(&inner, &reply).await,
                    }
                };
                let room = inner.max_payload.saturating_sub(ENVELOPE_BYTES).max(1024);
                let chunks: Vec<&[u8]> = if out.is_empty() {
                    vec![&[][..]]
                } else {
                    out.chunks(room).collect()
                };
                let total = chunks.len().to_string();
                for (i, c) in chunks.into_iter().enumerate() {
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert(CHUNKS, total.as_str());
                    let index = i.to_string();
                    inner
                        .signer
                        .sign_headers(&mut headers, &answer_parts(&reply, &index, &total, c));
                    let sent = inner
                        .client
                        .publish_with_headers(reply.clone(), headers, Bytes::copy_from_slice(c))
                        .await;
                    if let Err(e) = sent {
                        tracing::warn!(error = %e, "answering a question");
                        return;
                    }
                }
            });
        }
    }
}

pub(super) async fn ask(
    inner: &Inner,
    node: &str,
    question: Vec<u8>,
    limit: Duration,
) -> Result<Vec<u8>, AskError> {
    if question.len() + ENVELOPE_BYTES > inner.max_payload {
        return Err(AskError::TooLarge(question.len()));
    }
    let nats = |e: &dyn std::fmt::Display| AskError::Nats(e.to_string());
    let inbox = inner.client.new_inbox();
    let mut sub = inner
        .client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| nats(&e))?;
    let to = subject(inner, node);
    let mut headers = async_nats::HeaderMap::new();
    inner.signer.sign_headers(
        &mut headers,
        &[to.as_bytes(), inbox.as_bytes(), question.as_slice()],
    );
    inner
        .client
        .publish_with_reply_and_headers(to, inbox.clone(), headers, question.into())
        .await
        .map_err(|e| nats(&e))?;
    let signer = &inner.signer;
    let taken = |m: &async_nats::Message| {
        m.headers.as_ref().is_some_and(|h| h.get(TAKEN).is_some())
            && signer
                .check_headers(m.headers.as_ref(), &[b"taken", inbox.as_bytes()])
                .is_ok()
    };
    let started = tokio::time::Instant::now();
    let gone = || AskError::Gone(node.to_string(), TAKEN_LIMIT.min(limit).as_millis());
    let first = tokio::time::timeout(TAKEN_LIMIT.min(limit), async {
        loop {
            match sub.next().await {
                None => return Err(AskError::Nats("the connection closed".into())),
                Some(m) if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) => {
                    return Err(AskError::NoResponders(node.to_string()));
                }
                Some(m) if m.headers.as_ref().is_some_and(|h| h.get(REFUSED).is_some()) => {
                    return Err(AskError::Refused(node.to_string()));
                }
                Some(m) if taken(&m) => return Ok(()),
                // A word in the node's name but not signed by it: not the node's.
                Some(m) if m.headers.as_ref().is_some_and(|h| h.get(TAKEN).is_some()) => {
                    Refused::Answer.record(&format!("a 'taken' in node {node}'s name"));
                }
                Some(_) => {
                    return Err(AskError::Nats(
                        "an answer before its question was taken".into(),
                    ));
                }
            }
        }
    })
    .await;
    match first {
        Err(_) => return Err(gone()),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(())) => {}
    }
    let collect = async {
        let mut out = Vec::new();
        let mut got = 0usize;
        loop {
            let m = match tokio::time::timeout(TAKEN_LIMIT, sub.next()).await {
                Err(_) => return Err(gone()),
                Ok(None) => break,
                Ok(Some(m)) => m,
            };
            if m.headers.as_ref().is_some_and(|h| h.get(TAKEN).is_some()) {
                continue;
            }
            let chunks = m
                .headers
                .as_ref()
                .and_then(|h| h.get(CHUNKS))
                .map_or("1", |v| v.as_str());
            let total = chunks.parse::<usize>().unwrap_or(1);
            let index = got.to_string();
            if signer
                .check_headers(
                    m.headers.as_ref(),
                    &answer_parts(&inbox, &index, chunks, &m.payload),
                )
                .is_err()
            {
                Refused::Answer.record(&format!("part {got} of an answer in node {node}'s name"));
                return Err(AskError::Forged(node.to_string()));
            }
            out.extend_from_slice(&m.payload);
            got += 1;
            if got >= total {
                return Ok(out);
            }
        }
        Err(AskError::Nats("the connection closed".into()))
    };
    tokio::time::timeout(limit.saturating_sub(started.elapsed()), collect)
        .await
        .unwrap_or_else(|_| Err(AskError::Timeout(node.to_string(), limit.as_millis())))
}

/// What an answer's part is signed over: the inbox it goes to, its place and the number of
/// parts, and its bytes.
fn answer_parts<'a>(
    inbox: &'a str,
    index: &'a str,
    total: &'a str,
    bytes: &'a [u8],
) -> [&'a [u8]; 5] {
    [
        b"answer",
        inbox.as_bytes(),
        index.as_bytes(),
        total.as_bytes(),
        bytes,
    ]
}

/// Why a question is refused, if it is (`Signer::check_question`), its signature over the
/// subject, the inbox to answer to and the question.
fn check_question(
    inner: &Inner,
    msg: &async_nats::Message,
    reply: &async_nats::Subject,
) -> Option<String> {
    let header = |name: &str| {
        msg.headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str())
    };
    let parts = [
        msg.subject.as_bytes(),
        reply.as_bytes(),
        msg.payload.as_ref(),
    ];
    inner
        .signer
        .check_question(header(trust::SIGNED), header(trust::MAC), &parts)
}
