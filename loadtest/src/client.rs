//! One keep-alive HTTP/1.1 connection with Digest authentication (no pool: each virtual user
//! owns its connection, as a real client would).
//!
//! The request is written and the response read on the caller's task, straight on the
//! socket: one write and, for a small response, one read per request. hyper's client `conn`
//! API, used before, runs each connection as a task of its own and passes every request and
//! response through channels to it, which cost the client about as much CPU as the server it
//! measured; on a machine the two share, that CPU is taken from the server. Heads are parsed
//! with `httparse` (hyper's own parser); bodies may be sized, chunked, or end with the
//! connection, and none may pass [`MAX_BODY`].

use std::net::SocketAddr;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub struct Conn {
    addr: SocketAddr,
    /// `None` after the server closed it or an exchange failed: the next request reconnects.
    stream: Option<TcpStream>,
    /// Bytes read and not yet consumed.
    read: BytesMut,
    /// The next request, head and (small) body.
    write: Vec<u8>,
    user: String,
    password: String,
    /// The server's Digest challenge, once negotiated (boxed: it carries an MD5 state).
    digest: Option<Box<Digest>>,
}

/// Client-side Digest (RFC 7616, MD5, qop=auth), computed here rather than through a
/// general-purpose crate: a load generator must spend as little CPU per request as it can,
/// because it shares the machine with the server it measures. What does not change between
/// requests is built once: the header text around `uri`, `nc` and `response`, HA2 of the last
/// target, and the MD5 state after `HA1:nonce:`. Per request that leaves one MD5 over
/// `nc:cnonce:auth:HA2` and one buffer.
struct Digest {
    /// `MD5(HA1:nonce:`, ready to continue.
    prefix_hash: md5::Md5,
    cnonce: String,
    nc: u32,
    /// `Digest username="…", realm="…", nonce="…", uri="`.
    head: String,
    /// `", cnonce="…", response="`.
    middle: String,
    /// `"` and the opaque member, if any.
    tail: String,
    /// `MD5(method:uri)` of the last (method, uri), hex: almost every request repeats it.
    ha2: Option<(String, String, [u8; 32])>,
}

fn hex(d: &[u8]) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, b) in d.iter().take(16).enumerate() {
        out[2 * i] = HEX[(b >> 4) as usize];
        out[2 * i + 1] = HEX[(b & 15) as usize];
    }
    out
}

fn md5_hex(parts: &[&[u8]]) -> [u8; 32] {
    use md5::{Digest as _, Md5};
    let mut h = Md5::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update(b":");
        }
        h.update(p);
    }
    hex(&h.finalize())
}

impl Digest {
    fn from_challenge(header: &str, user: &str, password: &str) -> Result<Digest, BoxError> {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let cnonce = format!("{:016x}", seed ^ (user.len() as u128) << 64);
        Digest::with_cnonce(header, user, password, cnonce)
    }

    fn with_cnonce(
        header: &str,
        user: &str,
        password: &str,
        cnonce: String,
    ) -> Result<Digest, BoxError> {
        use md5::Digest as _;
        let c = digest_auth::parse(header)?;
        let ha1 = md5_hex(&[user.as_bytes(), c.realm.as_bytes(), password.as_bytes()]);
        let mut prefix_hash = md5::Md5::new();
        prefix_hash.update(ha1);
        prefix_hash.update(b":");
        prefix_hash.update(c.nonce.as_bytes());
        prefix_hash.update(b":");
        Ok(Digest {
            prefix_hash,
            head: format!(
                "Digest username=\"{user}\", realm=\"{}\", nonce=\"{}\", uri=\"",
                c.realm, c.nonce
            ),
            middle: format!(", cnonce=\"{cnonce}\", response=\""),
            tail: c
                .opaque
                .as_deref()
                .map_or_else(|| "\"".to_string(), |o| format!("\", opaque=\"{o}\"")),
            cnonce,
            nc: 0,
            ha2: None,
        })
    }

    /// Append the next request's `Authorization` value to `out`.
    fn write_header(&mut self, out: &mut Vec<u8>, method: &str, uri: &str) {
        use md5::Digest as _;
        self.nc += 1;
        let ha2 = match &self.ha2 {
            Some((m, u, h)) if m == method && u == uri => *h,
            _ => {
                let h = md5_hex(&[method.as_bytes(), uri.as_bytes()]);
                self.ha2 = Some((method.to_string(), uri.to_string(), h));
                h
            }
        };
        // `nc` as 8 hex digits: the hex of its 4 big-endian bytes.
        let nc_hex = hex(&self.nc.to_be_bytes());
        let nc = &nc_hex[..8];
        let mut h = self.prefix_hash.clone();
        h.update(nc);
        h.update(b":");
        h.update(self.cnonce.as_bytes());
        h.update(b":auth:");
        h.update(ha2);
        let response = hex(&h.finalize());
        out.extend_from_slice(self.head.as_bytes());
        out.extend_from_slice(uri.as_bytes());
        out.extend_from_slice(b"\", qop=auth, nc=");
        out.extend_from_slice(nc);
        out.extend_from_slice(self.middle.as_bytes());
        out.extend_from_slice(&response);
        out.extend_from_slice(self.tail.as_bytes());
    }
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
}

/// A response head, as far as this client needs it.
#[derive(Debug, Default, PartialEq)]
struct Head {
    status: u16,
    /// The head's length in bytes.
    len: usize,
    /// The first `WWW-Authenticate: Digest …` challenge.
    digest: Option<String>,
    length: Option<usize>,
    chunked: bool,
    /// The server will close the connection after this response.
    close: bool,
}

/// A head longer than this is refused (the servers measured here send a few hundred bytes).
const MAX_HEAD: usize = 64 * 1024;

/// Parse a response head at the start of `buf`: `None` while it is incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, BoxError> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    let len = match r.parse(buf)? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial if buf.len() > MAX_HEAD => {
            return Err("response head too long".into());
        }
        httparse::Status::Partial => return Ok(None),
    };
    let mut head = Head {
        status: r.code.ok_or("response without a status")?,
        len,
        close: r.version == Some(0),
        ..Head::default()
    };
    for h in r.headers.iter() {
        let value = std::str::from_utf8(h.value).map_err(|_| "header value not UTF-8")?;
        if h.name.eq_ignore_ascii_case("content-length") {
            let length: usize = value.trim().parse()?;
            if length > MAX_BODY {
                return Err("response body too large".into());
            }
            head.length = Some(length);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked = value.to_ascii_lowercase().contains("chunked");
        } else if h.name.eq_ignore_ascii_case("connection") {
            let v = value.to_ascii_lowercase();
            head.close = v.contains("close") || (head.close && !v.contains("keep-alive"));
        } else if h.name.eq_ignore_ascii_case("www-authenticate")
            && value.starts_with("Digest")
            && head.digest.is_none()
        {
            head.digest = Some(value.to_string());
        }
    }
    Ok(Some(head))
}

/// A body or chunk longer than this is refused, so that a wrong size cannot grow the buffer
/// without end (or overflow an offset).
const MAX_BODY: usize = 1 << 30;

/// Decode a chunked body at the start of `buf`: the body and the bytes it spanned, or `None`
/// while it is incomplete. Chunk extensions and trailers are skipped.
fn parse_chunked(buf: &[u8]) -> Result<Option<(Vec<u8>, usize)>, BoxError> {
    let line = |at: usize| memchr::memmem::find(&buf[at..], b"\r\n").map(|e| at + e);
    let mut body = Vec::new();
    let mut i = 0;
    loop {
        let Some(eol) = line(i) else {
            return Ok(None);
        };
        let size = std::str::from_utf8(&buf[i..eol])?;
        let size = size.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| "bad chunk size")?;
        i = eol + 2;
        if size == 0 {
            // Trailers, each ending in CRLF, then an empty line.
            loop {
                let Some(eol) = line(i) else {
                    return Ok(None);
                };
                let empty = eol == i;
                i = eol + 2;
                if empty {
                    return Ok(Some((body, i)));
                }
            }
        }
        if size > MAX_BODY {
            return Err("chunk too large".into());
        }
        let end = i + size;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err("chunk without its CRLF".into());
        }
        body.extend_from_slice(&buf[i..end]);
        i = end + 2;
    }
}

/// The server closed the connection before the answer was complete.
#[derive(Debug)]
struct Closed;

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the server closed the connection")
    }
}

impl std::error::Error for Closed {}

/// Whether an exchange failed because the peer had closed the connection.
fn closed(e: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    e.is::<Closed>()
        || e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| matches!(e.kind(), BrokenPipe | ConnectionReset | ConnectionAborted))
}

/// Requests whose bodies are at most this long are sent in one write with their head.
const COALESCE: usize = 16 * 1024;

impl Conn {
    async fn open(addr: SocketAddr) -> Result<TcpStream, BoxError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    pub async fn connect(addr: SocketAddr, user: &str, password: &str) -> Result<Conn, BoxError> {
        Ok(Conn {
            addr,
            stream: Some(Conn::open(addr).await?),
            read: BytesMut::with_capacity(8192),
            write: Vec::with_capacity(1024),
            user: user.to_string(),
            password: password.to_string(),
            digest: None,
        })
    }

    /// Read more of the response; an error at the end of the stream.
    async fn fill(&mut self) -> Result<(), BoxError> {
        let stream = self.stream.as_mut().ok_or("not connected")?;
        self.read.reserve(8192);
        if stream.read_buf(&mut self.read).await? == 0 {
            return Err(Box::new(Closed));
        }
        Ok(())
    }

    async fn receive(&mut self) -> Result<(Head, Bytes), BoxError> {
        let head = loop {
            match parse_head(&self.read)? {
                // An interim answer (103 Early Hints, say): the final one follows.
                Some(head) if (100..200).contains(&head.status) && head.status != 101 => {
                    self.read.advance(head.len);
                }
                Some(head) => break head,
                None => self.fill().await?,
            }
        };
        let bodyless = head.status == 204 || head.status == 304 || head.status < 200;
        let body = if bodyless {
            self.read.advance(head.len);
            Bytes::new()
        } else if head.chunked {
            loop {
                if let Some((body, n)) = parse_chunked(&self.read[head.len..])? {
                    self.read.advance(head.len + n);
                    break Bytes::from(body);
                }
                self.fill().await?;
            }
        } else if let Some(length) = head.length {
            while self.read.len() < head.len + length {
                self.fill().await?;
            }
            self.read.advance(head.len);
            self.read.split_to(length).freeze()
        } else {
            // Delimited by the end of the connection.
            let stream = self.stream.as_mut().ok_or("not connected")?;
            let mut rest = Vec::new();
            let limit = MAX_BODY.saturating_sub(self.read.len() - head.len) as u64;
            stream.take(limit + 1).read_to_end(&mut rest).await?;
            if rest.len() as u64 > limit {
                self.stream = None;
                return Err("response body too large".into());
            }
            self.read.advance(head.len);
            let mut body = self.read.split().to_vec();
            body.extend_from_slice(&rest);
            self.stream = None;
            Bytes::from(body)
        };
        Ok((head, body))
    }

    async fn send_once(
        &mut self,
        method: &str,
        target: &str,
        content_type: Option<&str>,
        body: &Bytes,
    ) -> Result<(u16, Option<String>, Bytes), BoxError> {
        let w = &mut self.write;
        w.clear();
        for part in [method, " ", target, " HTTP/1.1\r\nhost: geoshard\r\n"] {
            w.extend_from_slice(part.as_bytes());
        }
        if let Some(ct) = content_type {
            w.extend_from_slice(b"content-type: ");
            w.extend_from_slice(ct.as_bytes());
            w.extend_from_slice(b"\r\n");
        }
        if let Some(digest) = &mut self.digest {
            w.extend_from_slice(b"authorization: ");
            digest.write_header(w, method, target);
            w.extend_from_slice(b"\r\n");
        }
        if !body.is_empty() || method == "POST" || method == "PUT" {
            use std::io::Write as _;
            // Writing to a Vec cannot fail.
            let _ = write!(w, "content-length: {}\r\n", body.len());
        }
        w.extend_from_slice(b"\r\n");
        let coalesce = body.len() <= COALESCE;
        if coalesce {
            w.extend_from_slice(body);
        }
        let mut retried = false;
        loop {
            let reused = self.stream.is_some();
            if !reused {
                self.stream = Some(Conn::open(self.addr).await?);
                self.read.clear();
            }
            let result = async {
                let stream = self.stream.as_mut().ok_or("not connected")?;
                stream.write_all(&self.write).await?;
                if !coalesce {
                    stream.write_all(body).await?;
                }
                self.receive().await
            }
            .await;
            match result {
                Ok((head, reply)) => {
                    // A server may answer an error without reading the request body, and
                    // then close: start the next request on a new connection.
                    if head.close || (!body.is_empty() && !(200..300).contains(&head.status)) {
                        self.stream = None;
                    }
                    return Ok((head.status, head.digest, reply));
                }
                Err(e) => {
                    self.stream = None;
                    // A kept-alive connection that the server closed while it was idle fails
                    // before any byte of an answer: the request was not read, so it goes once
                    // more on a new connection, as HTTP clients do with idempotent requests
                    // (every request sent here is a query or a write by URI).
                    if reused && !retried && self.read.is_empty() && closed(&*e) {
                        retried = true;
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Send a request, negotiating Digest on a 401 (first use, or `stale=true`).
    pub async fn request(
        &mut self,
        method: &str,
        target: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<Reply, BoxError> {
        for _ in 0..3 {
            let (status, digest, reply) =
                self.send_once(method, target, content_type, &body).await?;
            if status == 401
                && let Some(d) = digest
            {
                let stale = d.contains("stale=true");
                if self.digest.is_none() || stale {
                    self.digest = Some(Box::new(Digest::from_challenge(
                        &d,
                        &self.user,
                        &self.password,
                    )?));
                    continue;
                }
            }
            return Ok(Reply {
                status,
                body: reply,
            });
        }
        Err("authentication did not settle".into())
    }
}

/// GET without authentication (for `/health`).
pub async fn get_plain(addr: SocketAddr, target: &str) -> Result<Bytes, BoxError> {
    let mut c = Conn::connect(addr, "", "").await?;
    let r = c.request("GET", target, None, Bytes::new()).await?;
    if r.status != 200 {
        return Err(format!("GET {target}: {}", r.status).into());
    }
    Ok(r.body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `response` of a POST answering `challenge`, by an independent implementation (the
    /// `digest_auth` crate), after `nc_before` earlier requests on the same nonce.
    fn reference_response(
        challenge: &str,
        (user, password): (&str, &str),
        uri: &str,
        nc_before: u32,
        cnonce: &str,
    ) -> String {
        let mut prompt = digest_auth::parse(challenge).unwrap();
        let mut ctx = digest_auth::AuthContext::new_with_method(
            user,
            password,
            uri,
            Option::<&[u8]>::None,
            digest_auth::HttpMethod::POST,
        );
        // The crate keeps its own nc, and counts up from it.
        prompt.nc = nc_before;
        ctx.set_custom_cnonce(cnonce);
        prompt.respond(&ctx).unwrap().response
    }

    #[test]
    fn heads_are_read_whole_or_not_at_all() {
        let full = b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"r\"\r\nwww-authenticate: Digest realm=\"r\", nonce=\"n\"\r\nContent-Length: 12\r\nConnection: close\r\n\r\nnot the head";
        let head = parse_head(full).unwrap().unwrap();
        assert_eq!(
            head,
            Head {
                status: 401,
                len: full.len() - 12,
                digest: Some("Digest realm=\"r\", nonce=\"n\"".into()),
                length: Some(12),
                chunked: false,
                close: true,
            }
        );
        // Every proper prefix of the head is incomplete, not an error.
        for cut in 0..head.len {
            assert_eq!(parse_head(&full[..cut]).unwrap(), None, "cut at {cut}");
        }
        let head = parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(head.chunked && !head.close && head.length.is_none());
        // HTTP/1.0 closes unless asked to keep alive.
        assert!(
            parse_head(b"HTTP/1.0 200 OK\r\n\r\n")
                .unwrap()
                .unwrap()
                .close
        );
        let kept = parse_head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n");
        assert!(!kept.unwrap().unwrap().close);
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
        let huge = b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n";
        assert!(parse_head(huge).is_err());
        assert!(parse_head(b"SMTP ready\r\n\r\n").is_err());
    }

    #[test]
    fn chunked_bodies_decode_whole_or_not_at_all() {
        let wire = b"5\r\nhello\r\n6;name=value\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT";
        let (body, used) = parse_chunked(wire).unwrap().unwrap();
        assert_eq!(body, b"hello world");
        assert_eq!(&wire[used..], b"NEXT");
        for cut in 0..used {
            assert_eq!(parse_chunked(&wire[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert_eq!(parse_chunked(b"0\r\n\r\n").unwrap(), Some((Vec::new(), 5)));
        assert!(parse_chunked(b"zz\r\n").is_err());
        assert!(parse_chunked(b"ffffffffffffffff\r\n").is_err());
        assert!(parse_chunked(b"40000001\r\n").is_err());
        assert_eq!(parse_chunked(b"40000000\r\n").unwrap(), None);
        assert!(parse_chunked(b"2\r\nabc\r\n0\r\n\r\n").is_err());
    }

    /// Read one request head and its body (sized by content-length) from a raw socket.
    async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> String {
        loop {
            if let Some(end) = memchr::memmem::find(buf, b"\r\n\r\n") {
                let head = String::from_utf8(buf[..end + 4].to_vec()).unwrap();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map_or(0, |v| v.trim().parse().unwrap());
                while buf.len() < end + 4 + len {
                    assert_ne!(s.read_buf(buf).await.unwrap(), 0);
                }
                let request = String::from_utf8(buf[..end + 4 + len].to_vec()).unwrap();
                buf.drain(..end + 4 + len);
                return request;
            }
            assert_ne!(s.read_buf(buf).await.unwrap(), 0, "request cut short");
        }
    }

    /// Against a scripted server: a 401 that closes the connection without reading the body
    /// (the client reconnects and answers the challenge), an interim 103 and then a chunked
    /// answer, then a sized one written in two parts on the same kept-alive connection.
    #[tokio::test]
    async fn negotiates_reconnects_and_reads_both_body_kinds() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            // Only the head: the body is left unread, and the connection closed.
            while memchr::memmem::find(&head, b"\r\n\r\n").is_none() {
                assert_ne!(s.read_buf(&mut head).await.unwrap(), 0);
            }
            assert!(!String::from_utf8_lossy(&head).contains("authorization"));
            s.write_all(b"HTTP/1.1 401 Unauthorized\r\nwww-authenticate: Digest realm=\"r\", qop=\"auth\", nonce=\"n1\", opaque=\"o\"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await.unwrap();
            drop(s);
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let first = read_request(&mut s, &mut buf).await;
            s.write_all(b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n").await.unwrap();
            let second = read_request(&mut s, &mut buf).await;
            s.write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 10\r\n\r\n01234")
                .await
                .unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            s.write_all(b"56789").await.unwrap();
            (first, second)
        });
        let mut c = Conn::connect(addr, "u", "p").await.unwrap();
        let body = Bytes::from_static(b"{\"q\":1}");
        let r = c
            .request("POST", "/q", Some("application/json"), body.clone())
            .await
            .unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"hello world"[..]));
        let r = c.request("PUT", "/d?x=1", None, body).await.unwrap();
        assert_eq!((r.status, &r.body[..]), (201, &b"0123456789"[..]));
        let (first, second) = server.await.unwrap();
        // The answered challenge, checked against an independent implementation.
        let cnonce = first
            .split("cnonce=\"")
            .nth(1)
            .and_then(|v| v.split('"').next())
            .unwrap();
        let theirs = reference_response(
            "Digest realm=\"r\", qop=\"auth\", nonce=\"n1\", opaque=\"o\"",
            ("u", "p"),
            "/q",
            0,
            cnonce,
        );
        assert!(first.starts_with("POST /q HTTP/1.1\r\n"), "{first}");
        assert!(first.contains("nc=00000001"), "{first}");
        assert!(first.contains(&format!("response=\"{theirs}\"")), "{first}");
        assert!(first.ends_with("\r\n\r\n{\"q\":1}"), "{first}");
        assert!(second.starts_with("PUT /d?x=1 HTTP/1.1\r\n"), "{second}");
        assert!(second.contains("nc=00000002"), "{second}");
        assert!(second.contains("content-length: 7\r\n"), "{second}");
    }

    /// A kept-alive connection that the server closed while idle: the next request goes
    /// again on a new connection, once; a server that closes every connection unanswered is
    /// an error, not a loop.
    #[tokio::test]
    async fn a_request_on_a_connection_closed_while_idle_is_sent_again() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut requests = Vec::new();
            for answer in [true, true, false, false] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = Vec::new();
                requests.push(read_request(&mut s, &mut buf).await);
                if answer {
                    s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await
                        .unwrap();
                }
                // Closed without a `connection: close` header, as an idle timeout does.
            }
            requests
        });
        let mut c = Conn::connect(addr, "", "").await.unwrap();
        let r = c.request("GET", "/a", None, Bytes::new()).await.unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let r = c.request("GET", "/b", None, Bytes::new()).await.unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]));
        // A fresh connection closed unanswered is not retried: one more connection in all.
        let e = c
            .request("GET", "/c", None, Bytes::new())
            .await
            .unwrap_err();
        assert!(closed(&*e), "{e}");
        let e = c
            .request("GET", "/d", None, Bytes::new())
            .await
            .unwrap_err();
        assert!(closed(&*e), "{e}");
        let requests = server.await.unwrap();
        let lines: Vec<&str> = requests.iter().map(|r| r.lines().next().unwrap()).collect();
        assert_eq!(
            lines,
            [
                "GET /a HTTP/1.1",
                "GET /b HTTP/1.1",
                "GET /c HTTP/1.1",
                "GET /d HTTP/1.1"
            ]
        );
    }

    /// A body with neither a length nor chunks ends with the connection; the next request
    /// opens a new one.
    #[tokio::test]
    async fn a_body_that_ends_with_the_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            for answer in [
                &b"HTTP/1.1 200 OK\r\n\r\nuntil the "[..],
                b"HTTP/1.1 204 No Content\r\n\r\n",
            ] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = Vec::new();
                read_request(&mut s, &mut buf).await;
                s.write_all(answer).await.unwrap();
                if answer.starts_with(b"HTTP/1.1 200") {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    s.write_all(b"end").await.unwrap();
                } else {
                    // Kept open: the client must not wait for it to close.
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                }
            }
        });
        let mut c = Conn::connect(addr, "", "").await.unwrap();
        let r = c.request("GET", "/a", None, Bytes::new()).await.unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"until the end"[..]));
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            c.request("GET", "/b", None, Bytes::new()),
        )
        .await
        .expect("a 204 has no body to wait for")
        .unwrap();
        assert_eq!((r.status, r.body.len()), (204, 0));
        server.abort();
    }

    /// RFC 2617 §3.5's worked example, then the next request of the same session checked
    /// against an independent implementation (the `digest_auth` crate).
    #[test]
    fn digest_header_matches_rfc_2617() {
        let challenge = r#"Digest realm="testrealm@host.com", qop="auth", nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", opaque="5ccc069c403ebaf9f0171e9517f40e41""#;
        let mut d =
            Digest::with_cnonce(challenge, "Mufasa", "Circle Of Life", "0a4f113b".into()).unwrap();
        let header = |d: &mut Digest, method, uri| {
            let mut out = Vec::new();
            d.write_header(&mut out, method, uri);
            String::from_utf8(out).unwrap()
        };
        let h = header(&mut d, "GET", "/dir/index.html");
        assert_eq!(
            h,
            r#"Digest username="Mufasa", realm="testrealm@host.com", nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", uri="/dir/index.html", qop=auth, nc=00000001, cnonce="0a4f113b", response="6629fae49393a05397450978507c4ef1", opaque="5ccc069c403ebaf9f0171e9517f40e41""#
        );
        let h = header(&mut d, "POST", "/v1/resources/geoQueryService");
        let theirs = reference_response(
            challenge,
            ("Mufasa", "Circle Of Life"),
            "/v1/resources/geoQueryService",
            1,
            "0a4f113b",
        );
        let ours = h.as_str();
        assert!(ours.contains("nc=00000002"), "{ours}");
        assert!(ours.contains(&format!("response=\"{theirs}\"")), "{ours}");
    }
}
