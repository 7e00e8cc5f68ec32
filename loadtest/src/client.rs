//! One keep-alive HTTP/1.1 connection with Digest authentication, on hyper's client `conn`
//! API (no pool: each virtual user owns its connection, as a real client would).

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::header::HeaderValue;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub struct Conn {
    addr: SocketAddr,
    sender: http1::SendRequest<Full<Bytes>>,
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

    fn header(&mut self, method: &str, uri: &str) -> Result<HeaderValue, BoxError> {
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
        let mut out = Vec::with_capacity(
            self.head.len() + uri.len() + 24 + self.middle.len() + 32 + self.tail.len(),
        );
        out.extend_from_slice(self.head.as_bytes());
        out.extend_from_slice(uri.as_bytes());
        out.extend_from_slice(b"\", qop=auth, nc=");
        out.extend_from_slice(nc);
        out.extend_from_slice(self.middle.as_bytes());
        out.extend_from_slice(&response);
        out.extend_from_slice(self.tail.as_bytes());
        Ok(HeaderValue::from_maybe_shared(Bytes::from(out))?)
    }
}

pub struct Reply {
    pub status: u16,
    pub body: Bytes,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Result<http1::SendRequest<Full<Bytes>>, BoxError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    pub async fn connect(addr: SocketAddr, user: &str, password: &str) -> Result<Conn, BoxError> {
        Ok(Conn {
            addr,
            sender: Conn::open(addr).await?,
            user: user.to_string(),
            password: password.to_string(),
            digest: None,
        })
    }

    fn authorization(
        &mut self,
        method: &str,
        target: &str,
    ) -> Result<Option<HeaderValue>, BoxError> {
        self.digest
            .as_mut()
            .map(|d| d.header(method, target))
            .transpose()
    }

    async fn send_once(
        &mut self,
        method: &str,
        target: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<(u16, Option<String>, Bytes), BoxError> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(target)
            .header("host", "geoshard");
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        if let Some(auth) = self.authorization(method, target)? {
            req = req.header("authorization", auth);
        }
        let req = req.body(Full::new(body))?;
        // A server closes a connection after answering without reading the body (a 401 to
        // a large request): open a new one; nothing was sent on this one yet.
        if self.sender.ready().await.is_err() {
            self.sender = Conn::open(self.addr).await?;
            self.sender.ready().await?;
        }
        let resp = self.sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let digest = resp
            .headers()
            .get_all("www-authenticate")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with("Digest"))
            .map(str::to_string);
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, digest, body))
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
            let (status, digest, reply) = self
                .send_once(method, target, content_type, body.clone())
                .await?;
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

    /// RFC 2617 §3.5's worked example, then the next request of the same session checked
    /// against an independent implementation (the `digest_auth` crate).
    #[test]
    fn digest_header_matches_rfc_2617() {
        let challenge = r#"Digest realm="testrealm@host.com", qop="auth", nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", opaque="5ccc069c403ebaf9f0171e9517f40e41""#;
        let mut d =
            Digest::with_cnonce(challenge, "Mufasa", "Circle Of Life", "0a4f113b".into()).unwrap();
        let h = d.header("GET", "/dir/index.html").unwrap();
        assert_eq!(
            h.to_str().unwrap(),
            r#"Digest username="Mufasa", realm="testrealm@host.com", nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", uri="/dir/index.html", qop=auth, nc=00000001, cnonce="0a4f113b", response="6629fae49393a05397450978507c4ef1", opaque="5ccc069c403ebaf9f0171e9517f40e41""#
        );
        let h = d.header("POST", "/v1/resources/geoQueryService").unwrap();
        let mut prompt = digest_auth::parse(challenge).unwrap();
        let mut ctx = digest_auth::AuthContext::new_with_method(
            "Mufasa",
            "Circle Of Life",
            "/v1/resources/geoQueryService",
            Option::<&[u8]>::None,
            digest_auth::HttpMethod::POST,
        );
        // The crate keeps its own nc; bring it to the second request, with our cnonce.
        prompt.nc = 1;
        ctx.set_custom_cnonce("0a4f113b");
        let theirs = prompt.respond(&ctx).unwrap();
        let ours = h.to_str().unwrap();
        assert!(ours.contains("nc=00000002"), "{ours}");
        assert!(
            ours.contains(&format!("response=\"{}\"", theirs.response)),
            "{ours} vs {}",
            theirs.to_header_string()
        );
    }
}
