//! What a node trusts. NATS credentials and TLS keep strangers off the NATS servers. A key
//! only the nodes hold, derived from the cluster secret, signs what one node tells another:
//! every log entry, question, answer and registry record carries an HMAC-SHA256 under it.
//! So one who can reach NATS but lacks the secret cannot write, ask, answer or register as
//! a node. What fails its check is refused, logged and counted
//! (`geoshard_cluster_refused_total`).

use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use geoshard_core::secret::Secret;
use hmac::{Hmac, KeyInit, Mac};
use parking_lot::Mutex;
use sha2::Sha256;

/// How a node reaches the NATS servers: credentials (user and password, a token, or a
/// `.creds` file of NKey and JWT) and TLS (required, a CA, a client certificate).
#[derive(Debug, Clone, Default)]
pub struct NatsAccess {
    pub user: Option<String>,
    pub password: Option<Secret>,
    pub token: Option<Secret>,
    pub creds: Option<PathBuf>,
    pub tls: bool,
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// The last thing NATS reported about the connection, to say why it is not there.
#[derive(Clone, Default)]
pub(crate) struct LastEvent(Arc<Mutex<Option<(String, bool)>>>);

impl LastEvent {
    /// The last error, and whether it was the server refusing the credentials.
    pub(crate) fn get(&self) -> Option<(String, bool)> {
        self.0.lock().clone()
    }
}

impl NatsAccess {
    /// Connection options with these credentials and TLS, and what records their events.
    pub(crate) async fn options(
        &self,
        name: &str,
    ) -> Result<(async_nats::ConnectOptions, LastEvent), String> {
        let mut o = async_nats::ConnectOptions::new().name(name);
        if let Some(creds) = &self.creds {
            o = o
                .credentials_file(creds)
                .await
                .map_err(|e| format!("cluster_creds {}: {e}", creds.display()))?;
        }
        if let Some(token) = &self.token {
            o = o.token(token.expose().to_string());
        }
        match (&self.user, &self.password) {
            (Some(user), password) => {
                let password = password.as_ref().map_or("", |p| p.expose());
                o = o.user_and_password(user.clone(), password.to_string());
            }
            (None, Some(_)) => return Err("cluster_password needs cluster_user".into()),
            (None, None) => {}
        }
        if self.tls {
            o = o.require_tls(true);
        }
        if let Some(ca) = &self.ca {
            readable("cluster_ca", ca)?;
            o = o.add_root_certificates(ca.clone());
        }
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                readable("cluster_cert", cert)?;
                readable("cluster_key", key)?;
                o = o.add_client_certificate(cert.clone(), key.clone());
            }
            (None, None) => {}
            _ => return Err("cluster_cert and cluster_key are given together".into()),
        }
        let last = LastEvent::default();
        let record = last.clone();
        o = o.event_callback(move |event| {
            let record = record.clone();
            async move {
                // Credentials or certificates the server refuses; the client reports a failed
                // connection by its kind's text.
                let refused = match &event {
                    async_nats::Event::ServerError(
                        async_nats::ServerError::AuthorizationViolation,
                    ) => true,
                    async_nats::Event::ClientError(async_nats::ClientError::Other(kind)) => [
                        "authorization violation",
                        "TLS error",
                        "failed signing nonce",
                    ]
                    .contains(&kind.as_str()),
                    _ => false,
                };
                match event {
                    async_nats::Event::ServerError(_) | async_nats::Event::ClientError(_) => {
                        // A failed connection is retried every few milliseconds: one line
                        // while the error stays the same.
                        let text = event.to_string();
                        let mut last = record.0.lock();
                        if last.as_ref().is_none_or(|(t, _)| *t != text) {
                            tracing::warn!(event = %text, "NATS");
                        }
                        *last = Some((text, refused));
                    }
                    async_nats::Event::Connected => {
                        tracing::debug!(%event, "NATS");
                        *record.0.lock() = None;
                    }
                    _ => tracing::debug!(%event, "NATS"),
                }
            }
        });
        Ok((o, last))
    }
}

/// A file named by a setting must be there: NATS's client would only say "no such file" on
/// each retry.
fn readable(key: &str, path: &std::path::Path) -> Result<(), String> {
    std::fs::metadata(path)
        .map(|_| ())
        .map_err(|e| format!("{key} {}: {e}", path.display()))
}

/// How far a question's signing time may be from the clock of the node asked: a copy of an
/// older question sent again is refused.
const QUESTION_FRESH_MS: u64 = 30_000;

/// The header carrying a message's MAC.
pub(crate) const MAC: &str = "Geoshard-Mac";
/// The header carrying when a message was signed, in milliseconds since the epoch.
pub(crate) const SIGNED: &str = "Geoshard-Signed";

/// What was refused, as `/metrics` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    Entry,
    Question,
    Answer,
    Record,
    Snapshot,
}

impl Refused {
    fn label(self) -> &'static str {
        match self {
            Refused::Entry => "entry",
            Refused::Question => "question",
            Refused::Answer => "answer",
            Refused::Record => "record",
            Refused::Snapshot => "snapshot",
        }
    }

    /// Count and log a message that failed its check.
    pub(crate) fn record(self, why: &str) {
        geoshard_core::metrics::record(|m| {
            m.cluster_refused.with_label_values(&[self.label()]).inc()
        });
        tracing::warn!(
            what = self.label(),
            why,
            "refused a cluster message: not signed with this cluster's secret"
        );
    }
}

/// Signs and checks with the key derived from the cluster secret; with no secret, signs
/// nothing and takes everything, as a cluster without one always has.
#[derive(Clone)]
pub struct Signer {
    key: Option<Hmac<Sha256>>,
}

impl Signer {
    pub fn new(secret: Option<&Secret>) -> Signer {
        let key = secret.map(|s| {
            let mut derive = <Hmac<Sha256> as KeyInit>::new_from_slice(s.expose().as_bytes())
                .expect("HMAC takes any key");
            derive.update(b"geoshard cluster messages v1");
            let derived = derive.finalize().into_bytes();
            <Hmac<Sha256> as KeyInit>::new_from_slice(&derived).expect("HMAC takes any key")
        });
        Signer { key }
    }

    pub(crate) fn on(&self) -> bool {
        self.key.is_some()
    }

    fn mac(key: &Hmac<Sha256>, parts: &[&[u8]]) -> Hmac<Sha256> {
        let mut m = key.clone();
        // Each part with its length first, so no two lists of parts feed the same bytes.
        for p in parts {
            m.update(&(p.len() as u64).to_le_bytes());
            m.update(p);
        }
        m
    }

    /// The MAC of `parts`, as a header value; `None` without a secret.
    pub fn sign(&self, parts: &[&[u8]]) -> Option<String> {
        let key = self.key.as_ref()?;
        Some(URL_SAFE_NO_PAD.encode(Self::mac(key, parts).finalize().into_bytes()))
    }

    /// Whether `mac` is the MAC of `parts` (always, without a secret); compared in constant
    /// time.
    pub fn verify(&self, parts: &[&[u8]], mac: Option<&str>) -> bool {
        let Some(key) = self.key.as_ref() else {
            return true;
        };
        let Some(bytes) = mac.and_then(|m| URL_SAFE_NO_PAD.decode(m).ok()) else {
            return false;
        };
        Self::mac(key, parts).verify_slice(&bytes).is_ok()
    }

    /// The signing time (now, in milliseconds) and the MAC of `parts` with it; `None`
    /// without a secret.
    pub(crate) fn sign_now(&self, parts: &[&[u8]]) -> Option<(String, String)> {
        self.key.as_ref()?;
        let now = now_ms().to_string();
        let mut all: Vec<&[u8]> = parts.to_vec();
        all.push(now.as_bytes());
        self.sign(&all).map(|mac| (now, mac))
    }

    /// Sign `parts` into `headers` (the signing time is one of the parts).
    pub(crate) fn sign_headers(&self, headers: &mut async_nats::HeaderMap, parts: &[&[u8]]) {
        if let Some((now, mac)) = self.sign_now(parts) {
            headers.insert(SIGNED, now.as_str());
            headers.insert(MAC, mac.as_str());
        }
    }

    /// Check what [`Signer::sign_headers`] wrote: the signing time in milliseconds when the
    /// MAC is right (0 without a secret), or why not.
    pub(crate) fn check_headers(
        &self,
        headers: Option<&async_nats::HeaderMap>,
        parts: &[&[u8]],
    ) -> Result<u64, &'static str> {
        let header = |name: &str| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
        self.check_signed(header(SIGNED), header(MAC), parts)
    }

    /// Why a question (over NATS or direct) is refused, if it is: its signature over `parts`
    /// fails, or it was signed more than [`QUESTION_FRESH_MS`] from this node's clock.
    pub(crate) fn check_question(
        &self,
        signed: Option<&str>,
        mac: Option<&str>,
        parts: &[&[u8]],
    ) -> Option<String> {
        match self.check_signed(signed, mac, parts) {
            Ok(0) => None,
            Ok(t) if t.abs_diff(now_ms()) > QUESTION_FRESH_MS => Some(format!(
                "a question signed {} s from now",
                t.abs_diff(now_ms()) / 1000
            )),
            Ok(_) => None,
            Err(why) => Some(format!("a question: {why}")),
        }
    }

    /// Check a signing time and MAC made by [`Signer::sign_now`] over `parts`: the time
    /// when right (0 without a secret), or why not.
    pub(crate) fn check_signed(
        &self,
        signed: Option<&str>,
        mac: Option<&str>,
        parts: &[&[u8]],
    ) -> Result<u64, &'static str> {
        if !self.on() {
            return Ok(0);
        }
        let (Some(signed), Some(mac)) = (signed, mac) else {
            return Err("not signed");
        };
        let mut all: Vec<&[u8]> = parts.to_vec();
        all.push(signed.as_bytes());
        if !self.verify(&all, Some(mac)) {
            return Err("a wrong signature");
        }
        signed
            .parse()
            .map_err(|_| "a signing time that is not a number")
    }
}

pub(crate) use geoshard_core::time::now_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mac_holds_only_for_its_parts_and_key() {
        let a = Signer::new(Some(&Secret::new("0123456789abcdef-a")));
        let b = Signer::new(Some(&Secret::new("0123456789abcdef-b")));
        let mac = a.sign(&[b"ab", b"c"]).unwrap();
        assert!(a.verify(&[b"ab", b"c"], Some(&mac)));
        // The same bytes cut differently, another key, another part: refused.
        assert!(!a.verify(&[b"a", b"bc"], Some(&mac)));
        assert!(!b.verify(&[b"ab", b"c"], Some(&mac)));
        assert!(!a.verify(&[b"ab", b"d"], Some(&mac)));
        assert!(!a.verify(&[b"ab", b"c"], None));
        assert!(!a.verify(&[b"ab", b"c"], Some("not base64!")));
        // Without a secret nothing is signed and everything is taken.
        let none = Signer::new(None);
        assert_eq!(none.sign(&[b"x"]), None);
        assert!(none.verify(&[b"x"], None));
    }

    #[test]
    fn signed_headers_check_out_and_tampering_does_not() {
        let s = Signer::new(Some(&Secret::new("a cluster secret of some length")));
        let mut h = async_nats::HeaderMap::new();
        s.sign_headers(&mut h, &[b"subject", b"payload"]);
        let signed = s
            .check_headers(Some(&h), &[b"subject", b"payload"])
            .unwrap();
        assert!(signed.abs_diff(now_ms()) < 60_000);
        assert_eq!(
            s.check_headers(Some(&h), &[b"subject", b"payload!"]),
            Err("a wrong signature")
        );
        assert_eq!(
            s.check_headers(None, &[b"subject", b"payload"]),
            Err("not signed")
        );
        let mut later = h.clone();
        later.insert(SIGNED, (signed + 1).to_string().as_str());
        assert_eq!(
            s.check_headers(Some(&later), &[b"subject", b"payload"]),
            Err("a wrong signature")
        );
    }
}
