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
    sender: http1::SendRequest<Full<Bytes>>,
    user: String,
    password: String,
    /// The server's Digest challenge, once negotiated; its `nc` counts up per request.
    challenge: Option<digest_auth::WwwAuthenticateHeader>,
}

pub struct Reply {
    pub status: u16,
    pub body: Bytes,
}

impl Conn {
    pub async fn connect(addr: SocketAddr, user: &str, password: &str) -> Result<Conn, BoxError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn {
            sender,
            user: user.to_string(),
            password: password.to_string(),
            challenge: None,
        })
    }

    fn authorization(&mut self, method: &str, target: &str) -> Option<String> {
        let ch = self.challenge.as_mut()?;
        let ctx = digest_auth::AuthContext::new_with_method(
            self.user.as_str(),
            self.password.as_str(),
            target,
            Option::<&[u8]>::None,
            digest_auth::HttpMethod(method.to_string().into()),
        );
        ch.respond(&ctx).ok().map(|h| h.to_header_string())
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
        self.sender.ready().await?;
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
                let parsed = digest_auth::parse(&d)?;
                if self.challenge.is_none() || parsed.stale {
                    self.challenge = Some(parsed);
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
