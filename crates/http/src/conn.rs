//! What one connection keeps between its requests, and the time limits on it: idle
//! keep-alives and request heads that arrive too slowly (watched by one task a connection),
//! request bodies that arrive too slowly (paced as they are read), and bodies a handler
//! answered without reading (drained, within bounds, so the connection can be kept).
//!
//! Time is read from one process clock in milliseconds, and only at the edges of a request,
//! never per byte.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use parking_lot::Mutex;

use crate::security::HeaderCache;

/// Milliseconds since the process's first look at the clock; never 0 (0 means "none").
pub(crate) fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// One connection's state, shared by its requests, its stream and its watchdog.
pub struct Activity {
    /// Requests started (heads complete) so far.
    started: AtomicU64,
    /// Requests whose handler is running.
    in_flight: AtomicU32,
    /// When the head now arriving began: the connection's opening, or the first byte read
    /// after the last request started; 0 when no head is arriving.
    head_since: AtomicU64,
    /// Set by the watchdog when a head took too long; the stream then answers 408 and ends.
    head_expired: AtomicBool,
    /// The stream's reader, woken when `head_expired` is set.
    reader: AtomicWaker,
    /// The connection's last Digest header, so that the next one, which differs only in
    /// `nc` and `response`, is bound instead of parsed.
    pub digest: HeaderCache,
    /// The client's address, for counting failed authentications.
    pub peer: Option<IpAddr>,
    /// A connection past `max_connections`, taken from the reserve: it serves `/health` and
    /// admins only.
    pub reserve: bool,
}

impl Activity {
    pub fn new(peer: Option<IpAddr>, reserve: bool) -> Activity {
        Activity {
            started: AtomicU64::new(0),
            in_flight: AtomicU32::new(0),
            head_since: AtomicU64::new(now_ms()),
            head_expired: AtomicBool::new(false),
            reader: AtomicWaker::new(),
            digest: HeaderCache::default(),
            peer,
            reserve,
        }
    }

    /// A request's head is complete and its handler starts.
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.head_since.store(0, Ordering::Relaxed);
        self.started.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }

    /// Bytes arrived: with no request running and no head timed yet, a head begins.
    pub fn bytes_read(&self) {
        if self.head_since.load(Ordering::Relaxed) == 0
            && self.in_flight.load(Ordering::Relaxed) == 0
        {
            self.head_since.store(now_ms(), Ordering::Relaxed);
        }
    }

    /// Requests whose handler is running now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether the head timed out; the reader registers to hear of it first.
    pub fn head_expired(&self, reader: &std::task::Waker) -> bool {
        self.reader.register(reader);
        self.head_expired.load(Ordering::Relaxed)
    }
}

/// The connections past `max_connections`, kept for `/health` and admins: at most `size`.
/// When it is full, a new connection takes the place of the oldest one with no request in
/// flight (which is closed), so idle connections cannot keep an operator out: a probe sends
/// its request as soon as it connects.
pub(crate) struct Reserve {
    size: usize,
    held: std::collections::VecDeque<(Arc<Activity>, tokio::task::AbortHandle)>,
}

impl Reserve {
    pub fn new(size: usize) -> Reserve {
        Reserve {
            size,
            held: std::collections::VecDeque::with_capacity(size),
        }
    }

    /// Whether a new connection may join, closing an idle one to make room if need be.
    pub fn admit(&mut self) -> bool {
        self.held.retain(|(_, task)| !task.is_finished());
        if self.held.len() < self.size {
            return true;
        }
        match self.held.iter().position(|(a, _)| a.in_flight() == 0) {
            Some(i) => {
                if let Some((_, task)) = self.held.remove(i) {
                    tracing::debug!("closing an idle reserve connection for a new one");
                    task.abort();
                }
                true
            }
            None => false,
        }
    }

    /// A connection that [`Reserve::admit`] let in, served by `task`.
    pub fn hold(&mut self, activity: Arc<Activity>, task: tokio::task::AbortHandle) {
        self.held.push_back((activity, task));
    }
}

/// Marks a request in flight until dropped (also when the handler future is dropped).
pub struct Busy(Arc<Activity>);

impl Busy {
    pub fn activity(&self) -> &Activity {
        &self.0
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The answer a connection whose head timed out gets before it is closed.
pub fn head_timeout_answer() -> Vec<u8> {
    let error = crate::error::ApiError::new(
        crate::error::ErrorCode::RequestTimeout,
        "the request head did not arrive within header_timeout_secs",
    );
    let body = error.to_body();
    let mut out = format!(
        "HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-type: \
         application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Watch a connection until its task ends: close it when it starts no request for `idle`
/// with none in flight (an idle keep-alive), and when a head takes longer than `head` (a
/// slow or stalled client: it is answered 408 first, through its stream).
pub async fn watch(
    activity: Arc<Activity>,
    mut task: tokio::task::JoinHandle<()>,
    idle: Duration,
    head: Duration,
) {
    let (idle_ms, head_ms) = (idle.as_millis() as u64, head.as_millis() as u64);
    // Often enough to act within a fifth of either limit past it.
    let tick = Duration::from_millis((idle_ms.min(head_ms) / 5).clamp(50, 1000));
    let mut last_started = activity.started.load(Ordering::Relaxed);
    let mut quiet_since = now_ms();
    let mut expired_at = None;
    loop {
        tokio::select! {
            _ = &mut task => return,
            _ = tokio::time::sleep(tick) => {}
        }
        let now = now_ms();
        if let Some(at) = expired_at {
            // The stream had its chance to answer 408 and end; end it here.
            if now >= at + 1000 {
                task.abort();
                return;
            }
            continue;
        }
        let in_flight = activity.in_flight.load(Ordering::Relaxed);
        let since = activity.head_since.load(Ordering::Relaxed);
        if since != 0 && in_flight == 0 && now >= since + head_ms {
            tracing::debug!("a request head took too long: 408");
            crate::metrics::record(|m| m.shed.with_label_values(&["slow_client"]).inc());
            activity.head_expired.store(true, Ordering::Relaxed);
            activity.reader.wake();
            expired_at = Some(now);
            continue;
        }
        let started = activity.started.load(Ordering::Relaxed);
        if started != last_started || in_flight > 0 {
            last_started = started;
            quiet_since = now;
        } else if now >= quiet_since + idle_ms {
            tracing::debug!("closing an idle connection");
            task.abort();
            return;
        }
    }
}

/// How fast a body must arrive: `min_rate` bytes a second on average, after `grace`.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    pub grace: Duration,
    pub min_rate: u64,
}

impl Pace {
    /// When `bytes` must have arrived by, for a body that began at `start`; `None` when there
    /// is no minimum.
    pub fn deadline(
        &self,
        start: tokio::time::Instant,
        bytes: u64,
    ) -> Option<tokio::time::Instant> {
        if self.min_rate == 0 {
            return None;
        }
        let earned = Duration::from_secs_f64(bytes as f64 / self.min_rate as f64);
        Some(start + self.grace + earned)
    }

    /// The next frame of `body`, or `Err(())` when it does not come by the pace's deadline.
    /// A frame already there is taken without arming a timer (most bodies are one frame).
    pub async fn frame<B: Body + Unpin>(
        &self,
        body: &mut B,
        start: tokio::time::Instant,
        bytes: u64,
    ) -> Result<Option<Result<Frame<B::Data>, B::Error>>, ()> {
        let mut next = body.frame();
        if let Poll::Ready(frame) = futures_util::poll!(&mut next) {
            return Ok(frame);
        }
        match self.deadline(start, bytes) {
            None => Ok(next.await),
            Some(at) => tokio::time::timeout_at(at, next).await.map_err(|_| ()),
        }
    }
}

/// What a handler left of a request body: the body itself, and whether anyone polled it (a
/// body behind `Expect: 100-continue` that nobody polled was never sent).
pub(crate) struct Leftover<B> {
    pub body: B,
    pub polled: bool,
}

/// Where a [`Tracked`] body hands back what is left of it: a slot of the request's own.
pub(crate) type Back<B> = Mutex<Option<Leftover<B>>>;

/// A request body that knows whether it was read to its end; dropped before that, it hands
/// itself back through `back`, so the connection can drain it and stay open.
pub(crate) struct Tracked<'a, B> {
    inner: Option<B>,
    polled: bool,
    back: &'a Back<B>,
}

impl<'a, B: Body + Unpin> Tracked<'a, B> {
    /// The tracked body, which leaves what is left of it in `back`.
    pub fn new(body: B, back: &'a Back<B>) -> Tracked<'a, B> {
        Tracked {
            inner: Some(body),
            polled: false,
            back,
        }
    }
}

impl<B: Body + Unpin> Body for Tracked<'_, B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.polled = true;
        match self.inner.as_mut() {
            Some(inner) => Pin::new(inner).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl<B> Drop for Tracked<'_, B> {
    fn drop(&mut self) {
        if let Some(body) = self.inner.take() {
            *self.back.lock() = Some(Leftover {
                body,
                polled: self.polled,
            });
        }
    }
}

/// Read and discard what is left of a body, at most `limit` bytes and at `pace`: `true` when
/// it ended within both, so the connection can take its next request.
pub async fn drain<B>(mut body: B, limit: u64, pace: Pace) -> bool
where
    B: Body<Data = Bytes> + Unpin,
{
    let start = tokio::time::Instant::now();
    let mut read = 0u64;
    loop {
        if body.is_end_stream() {
            return true;
        }
        match pace.frame(&mut body, start, read).await {
            Ok(None) => return true,
            Ok(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    read += data.len() as u64;
                    if read > limit {
                        return false;
                    }
                }
            }
            Ok(Some(Err(_))) | Err(()) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};

    #[test]
    fn a_pace_earns_time_by_bytes() {
        let pace = Pace {
            grace: Duration::from_secs(10),
            min_rate: 1000,
        };
        let t0 = tokio::time::Instant::now();
        assert_eq!(pace.deadline(t0, 0), Some(t0 + Duration::from_secs(10)));
        assert_eq!(pace.deadline(t0, 5000), Some(t0 + Duration::from_secs(15)));
        let none = Pace {
            grace: Duration::from_secs(1),
            min_rate: 0,
        };
        assert_eq!(none.deadline(t0, 5), None);
    }

    #[test]
    fn a_body_dropped_unread_comes_back_and_a_read_one_does_not() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let back = Mutex::new(None);
        let tracked = Tracked::new(Full::new(Bytes::from_static(b"abc")), &back);
        drop(tracked);
        let left = back.lock().take().unwrap();
        assert!(!left.polled);
        let back = Mutex::new(None);
        let mut tracked = Tracked::new(Full::new(Bytes::from_static(b"abc")), &back);
        let got = rt.block_on(async { tracked.frame().await });
        assert!(got.is_some());
        assert!(tracked.is_end_stream());
        drop(tracked);
        // Read to its end: what comes back has nothing left, and draining it is immediate.
        let left = back.lock().take().unwrap();
        assert!(left.polled && left.body.is_end_stream());
        let pace = Pace {
            grace: Duration::from_millis(10),
            min_rate: 1,
        };
        assert!(rt.block_on(drain(left.body, 0, pace)));
    }

    #[test]
    fn drain_stops_past_its_limit_and_its_pace() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let chunks = |n: usize| {
            let frames = (0..n).map(|_| {
                Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(vec![0u8; 1000])))
            });
            StreamBody::new(futures_util::stream::iter(frames.collect::<Vec<_>>()))
        };
        let pace = Pace {
            grace: Duration::from_secs(5),
            min_rate: 1,
        };
        assert!(rt.block_on(drain(chunks(10), 10_000, pace)));
        assert!(!rt.block_on(drain(chunks(11), 10_000, pace)));
        // A body that never sends: cut at the grace.
        let stalled = StreamBody::new(futures_util::stream::pending::<
            Result<Frame<Bytes>, std::convert::Infallible>,
        >());
        let quick = Pace {
            grace: Duration::from_millis(50),
            min_rate: 1000,
        };
        let t0 = std::time::Instant::now();
        assert!(!rt.block_on(drain(stalled, 10_000, quick)));
        assert!(t0.elapsed() < Duration::from_secs(2));
    }
}
