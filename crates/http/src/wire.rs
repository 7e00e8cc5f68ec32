//! The connection's byte stream, with hyper's own error answers given the contract's body, and
//! the read side of the head timeout.
//!
//! hyper answers a request head it cannot parse (400), one whose headers are too large (431)
//! or whose URI is too long (414) by itself, before any handler runs, with an empty body:
//! `HTTP/1.1 4xx Reason\r\nconnection: close\r\ncontent-length: 0\r\n...`, and it offers no
//! hook to change that answer. [`Wire`] recognises that exact head as hyper writes it and
//! writes the same answer with an `errorResponse` body instead. The service's own answers are
//! never taken for it: every error the service writes has a body and a `content-type`.
//!
//! When hyper shuts the stream down (an answer that closes the connection), the write side is
//! closed and what the client still sends is read and dropped until it closes, for 2 s and
//! 16 MB at most: a lingering close, so that a client still sending a body the answer did not
//! read gets the answer instead of a reset.
//!
//! A watched stream tells its connection's [`Activity`] when bytes arrive (a head may be
//! starting), and when the watchdog finds that head too slow, its next read writes the 408
//! answer and ends the stream, which ends hyper's connection.
//!
//! When a read finds nothing more while a request is part read (bytes arrived since the last
//! answer was written), the rest is awaited: the socket is told to acknowledge at once
//! (`TCP_QUICKACK`). A client with Nagle's algorithm on holds its last small segment until its
//! earlier ones are acknowledged, and Linux delays that acknowledgement by 40 ms: the Node.js
//! client (Koop's route here) sends a chunked body's last chunk on its own, so every request
//! through it waited 40 ms.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::conn::{Activity, head_timeout_answer};
use crate::error::{ApiError, ErrorCode};

/// A stream whose writes of hyper's empty error answers are replaced (see the module).
pub(crate) struct Wire<S> {
    inner: S,
    /// The replacement answer and how much of it is written; hyper was told its own
    /// answer was, so the rest goes out before anything else is written or flushed.
    pending: Option<(Vec<u8>, usize)>,
    /// The connection's state, when its head timing is watched.
    watched: Option<Arc<Activity>>,
    /// The 408 went out (or could not): every read now ends the stream.
    ended: bool,
    /// Bytes were read since the last write: a request is arriving.
    reading: bool,
    /// The socket was told to acknowledge at once since the last bytes were read.
    acked: bool,
    /// Set once this side is shut down: what the client still sends is read and dropped until
    /// it closes, for a moment and some bytes at most (a lingering close), so that its system
    /// does not reset the connection, losing the answer, while it is still sending a body the
    /// answer did not read.
    linger: Option<(Pin<Box<tokio::time::Sleep>>, usize)>,
}

/// How long, and how many bytes, a closing connection reads and drops.
pub const LINGER: std::time::Duration = std::time::Duration::from_secs(2);
pub const LINGER_BYTES: usize = 16 * 1024 * 1024;

/// A stream that can be told to acknowledge what it received at once.
pub trait AckNow {
    fn ack_now(&self) {}
}

impl AckNow for tokio::net::TcpStream {
    fn ack_now(&self) {
        // Linux clears the flag again by itself, so it is set for each wait.
        let _ = rustix::net::sockopt::set_tcp_quickack(self, true);
    }
}

impl AckNow for tokio::io::DuplexStream {}

impl<S> Wire<S> {
    pub fn new(inner: S) -> Wire<S> {
        Wire {
            inner,
            pending: None,
            watched: None,
            ended: false,
            reading: false,
            acked: false,
            linger: None,
        }
    }

    /// A stream whose reads are timed by `activity`'s watchdog.
    pub fn watched(inner: S, activity: Arc<Activity>) -> Wire<S> {
        Wire {
            watched: Some(activity),
            ..Wire::new(inner)
        }
    }
}

/// The answer with a body, when `head` is hyper's own empty error answer.
pub fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    const PREFIX: &[u8] = b"HTTP/1.1 4";
    if !head.starts_with(PREFIX) || head.len() > 512 || !head.ends_with(b"\r\n\r\n") {
        return None;
    }
    let line_end = head.windows(2).position(|w| w == b"\r\n")?;
    let headers = &head[line_end + 2..];
    if !headers.starts_with(b"connection: close\r\ncontent-length: 0\r\n") {
        return None;
    }
    let status: u16 = std::str::from_utf8(head.get(9..12)?).ok()?.parse().ok()?;
    let error = match status {
        400 => ApiError::new(
            ErrorCode::InvalidRequest,
            "the request is not valid HTTP/1.1: its request line or a header is malformed",
        ),
        414 => ApiError::new(ErrorCode::UriTooLong, "the request URI is too long"),
        431 => ApiError::new(
            ErrorCode::HeadersTooLarge,
            "the request's header fields are too large",
        ),
        _ => return None,
    };
    let body = error.to_body();
    let rest = &headers[b"connection: close\r\ncontent-length: 0\r\n".len()..];
    let mut out = Vec::with_capacity(head.len() + body.len() + 64);
    out.extend_from_slice(&head[..line_end + 2]);
    out.extend_from_slice(b"connection: close\r\ncontent-type: application/json\r\n");
    out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    out.extend_from_slice(rest);
    out.extend_from_slice(&body);
    Some(out)
}

impl<S: AsyncWrite + Unpin> Wire<S> {
    /// Write what is pending; ready once nothing is.
    pub fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((buf, at)) = &mut self.pending {
            let n = std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, &buf[*at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *at += n;
            if *at == buf.len() {
                self.pending = None;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + AckNow + Unpin> AsyncRead for Wire<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.ended {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &read {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.reading = true;
                self.acked = false;
            }
            Poll::Pending if self.reading && !self.acked => {
                self.inner.ack_now();
                self.acked = true;
            }
            _ => {}
        }
        let Some(activity) = self.watched.clone() else {
            return read;
        };
        match &read {
            Poll::Ready(Ok(())) if buf.filled().len() > before => activity.bytes_read(),
            Poll::Pending if activity.head_expired(cx.waker()) => {
                // Best effort, once: the answer is small and the socket's buffer is empty
                // while a head is still arriving. Then the stream ends.
                let answer = head_timeout_answer();
                let _ = Pin::new(&mut self.inner).poll_write(cx, &answer);
                self.ended = true;
                return Poll::Ready(Ok(()));
            }
            _ => {}
        }
        read
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Wire<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.drain(cx))?;
        self.reading = false;
        if let Some(answer) = replacement(buf) {
            self.pending = Some((answer, 0));
            // The answer is hyper's to account for as written; it goes out as it can.
            let _ = self.drain(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.drain(cx))?;
        // hyper writes its error answer as one buffer; look only where an answer starts.
        if let Some(first) = bufs.iter().find(|b| !b.is_empty())
            && first.starts_with(b"HTTP/1.1 4")
        {
            return self.poll_write(cx, first);
        }
        self.reading = false;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        if self.linger.is_none() {
            std::task::ready!(Pin::new(&mut self.inner).poll_shutdown(cx))?;
            self.linger = Some((Box::pin(tokio::time::sleep(LINGER)), LINGER_BYTES));
        }
        let this = &mut *self;
        let Some((deadline, left)) = this.linger.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let mut scratch = [0u8; 8192];
        loop {
            if *left == 0 || deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => {
                    *left = left.saturating_sub(buf.filled().len());
                }
                // Closed (or failed) on the client's side: done.
                Poll::Ready(_) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYPER_400: &[u8] = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Tue, 24 Nov 2026 21:55:33 GMT\r\n\r\n";

    fn body_of(answer: &[u8]) -> serde_json::Value {
        let at = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = std::str::from_utf8(&answer[..at]).unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(answer.len() - at, len, "content-length matches the body");
        serde_json::from_slice(&answer[at..]).unwrap()
    }

    #[test]
    fn hyper_answers_get_the_error_body() {
        for status in [400, 414, 431] {
            let head = String::from_utf8(HYPER_400.to_vec())
                .unwrap()
                .replace("400 Bad Request", &format!("{status} Whatever"));
            let out = replacement(head.as_bytes()).unwrap();
            let text = String::from_utf8_lossy(&out);
            assert!(text.starts_with(&format!("HTTP/1.1 {status} Whatever\r\n")));
            assert!(text.contains("content-type: application/json\r\n"));
            assert!(text.contains("date: Tue, 24 Nov 2026"));
            let body = body_of(&out);
            assert_eq!(body["errorResponse"]["statusCode"], status);
            assert!(body["errorResponse"]["message"].as_str().unwrap().len() > 10);
        }
    }

    #[test]
    fn the_service_own_answers_pass_unchanged() {
        let own = [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n"[..],
            b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\nconnection: close\r\ncontent-length: 12\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n{\"a\":1}",
            b"{\"HTTP/1.1 400\"}",
        ];
        for o in own {
            assert!(replacement(o).is_none(), "{}", String::from_utf8_lossy(o));
        }
        let other = HYPER_400.to_vec();
        let other = String::from_utf8(other)
            .unwrap()
            .replace("400 Bad", "405 Bad");
        assert!(replacement(other.as_bytes()).is_none());
    }

    /// Through the stream: hyper is told its whole answer was written, and the replacement
    /// reaches the peer whole, in pieces if the peer reads slowly.
    #[tokio::test]
    async fn writes_the_replacement_whole() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, mut b) = tokio::io::duplex(16);
        let mut wire = Wire::new(a);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            b.read_to_end(&mut got).await.unwrap();
            got
        });
        let n = wire.write(HYPER_400).await.unwrap();
        assert_eq!(n, HYPER_400.len());
        wire.flush().await.unwrap();
        wire.shutdown().await.unwrap();
        drop(wire);
        let got = reader.await.unwrap();
        assert_eq!(body_of(&got)["errorResponse"]["statusCode"], 400);
    }
}
