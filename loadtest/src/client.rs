//! One keep-alive HTTP/1.1 connection with Digest authentication, on hyper's client `conn`
//! API (no pool: each virtual user owns its connection, as a real client would).

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub struct Conn {
    addr: SocketAddr,
    sender: http1::SendRequest<Full<Bytes>>,
    user: String,
    password: String,
    /// The server's Digest challenge, once negotiated.
    digest: Option<Digest>,
}

/// Client-side Digest (RFC 7616, MD5, qop=auth), computed here rather than through a
/// general-purpose crate: a load generator must spend as little CPU per request as it can,
/// because it shares the machine with the server it measures.
struct Digest {
    realm: String,
    nonce: String,
    opaque: Option<String>,
    /// `MD5(user:realm:password)`, hex.
    ha1: String,
    cnonce: String,
    nc: u32,
    /// `MD5(method:uri)` of the last (method, uri), hex: almost every request repeats it.
    ha2: Option<(String, String, String)>,
}

fn md5_hex(parts: &[&[u8]]) -> String {
    use md5::{Digest as _, Md5};
    let mut h = Md5::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update(b":");
        }
        h.update(p);
    }
    let d = h.finalize();
    let mut out = String::with_capacity(32);
    for b in d.iter() {
        out.push(char::from(b"0123456789abcdef"[(b >> 4) as usize]));
        out.push(char::from(b"0123456789abcdef"[(b & 15) as usize]));
    }
    out
}

impl Digest {
    fn from_challenge(header: &str, user: &str, password: &str) -> Result<Digest, BoxError> {
        let c = digest_auth::parse(header)?;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Ok(Digest {
            ha1: md5_hex(&[user.as_bytes(), c.realm.as_bytes(), password.as_bytes()]),
            realm: c.realm,
            nonce: c.nonce,
            opaque: c.opaque,
            cnonce: format!("{:016x}", seed ^ (user.len() as u128) << 64),
            nc: 0,
            ha2: None,
        })
    }

    fn header(&mut self, user: &str, method: &str, uri: &str) -> String {
        self.nc += 1;
        let ha2 = match &self.ha2 {
            Some((m, u, h)) if m == method && u == uri => h.clone(),
            _ => {
                let h = md5_hex(&[method.as_bytes(), uri.as_bytes()]);
                self.ha2 = Some((method.to_string(), uri.to_string(), h.clone()));
                h
            }
        };
        let nc = format!("{:08x}", self.nc);
        let response = md5_hex(&[
            self.ha1.as_bytes(),
            self.nonce.as_bytes(),
            nc.as_bytes(),
            self.cnonce.as_bytes(),
            b"auth",
            ha2.as_bytes(),
        ]);
        let opaque = self
            .opaque
            .as_deref()
            .map(|o| format!(", opaque=\"{o}\""))
            .unwrap_or_default();
        format!(
            "Digest username=\"{user}\", realm=\"{}\", nonce=\"{}\", uri=\"{uri}\", qop=auth, nc={nc}, cnonce=\"{}\", response=\"{response}\"{opaque}",
            self.realm, self.nonce, self.cnonce
        )
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

    fn authorization(&mut self, method: &str, target: &str) -> Option<String> {
        let user = self.user.clone();
        self.digest
            .as_mut()
            .map(|d| d.header(&user, method, target))
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
        if let Some(auth) = self.authorization(method, target) {
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
                    self.digest = Some(Digest::from_challenge(&d, &self.user, &self.password)?);
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
