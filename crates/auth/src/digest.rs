//! HTTP Digest (RFC 7616, MD5, `qop=auth`) and Basic: parsing the `Authorization` header and
//! computing the hashes. No HTTP types. The state: a per-thread copy of the last HA2 (`ha2`),
//! which gives the same hash as computing it again, and a connection's last header
//! ([`HeaderCache`]), which parses as parsing it again does.

use std::cell::RefCell;
use std::sync::Mutex;

use md5::{Digest as _, Md5};

/// The members of a Digest `Authorization` header that the verification needs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DigestResponse<'a> {
    pub username: &'a str,
    pub realm: &'a str,
    pub nonce: &'a str,
    pub uri: &'a str,
    pub response: &'a str,
    pub qop: Option<&'a str>,
    pub nc: Option<&'a str>,
    pub cnonce: Option<&'a str>,
    pub opaque: Option<&'a str>,
    pub algorithm: Option<&'a str>,
}

/// Parse the part after `Digest `: comma-separated `key=value` or `key="quoted value"`.
/// Quoted values may not contain escaped quotes (no real client sends them here). Scans
/// bytes and compares keys in place: it runs on every request.
pub fn parse_digest(params: &str) -> Option<DigestResponse<'_>> {
    let mut out = DigestResponse::default();
    let b = params.as_bytes();
    let mut i = 0;
    let skip_ws = |mut i: usize| {
        while i < b.len() && (b[i] == b' ' || b[i] == b'\t' || b[i] == b'\r' || b[i] == b'\n') {
            i += 1;
        }
        i
    };
    loop {
        i = skip_ws(i);
        if i >= b.len() {
            break;
        }
        let eq = i + memchr::memchr(b'=', &b[i..])?;
        // Header values are visible ASCII (`HeaderValue::to_str`), so ASCII trims suffice.
        let key = b[i..eq].trim_ascii();
        i = skip_ws(eq + 1);
        let value;
        if b.get(i) == Some(&b'"') {
            let end = i + 1 + memchr::memchr(b'"', &b[i + 1..])?;
            value = &params[i + 1..end];
            i = end + 1;
        } else {
            let end = memchr::memchr(b',', &b[i..]).map_or(b.len(), |e| i + e);
            value = params[i..end].trim_ascii();
            i = end;
        }
        i = skip_ws(i);
        if b.get(i) == Some(&b',') {
            i += 1;
        }
        // One compare a key: by its length first (at most two names share one).
        let is = |name: &[u8]| key.eq_ignore_ascii_case(name);
        match key.len() {
            2 if is(b"nc") => out.nc = Some(value),
            3 if is(b"uri") => out.uri = value,
            3 if is(b"qop") => out.qop = Some(value),
            5 if is(b"realm") => out.realm = value,
            5 if is(b"nonce") => out.nonce = value,
            6 if is(b"cnonce") => out.cnonce = Some(value),
            6 if is(b"opaque") => out.opaque = Some(value),
            8 if is(b"username") => out.username = value,
            8 if is(b"response") => out.response = value,
            9 if is(b"algorithm") => out.algorithm = Some(value),
            _ => {}
        }
    }
    if out.username.is_empty() || out.nonce.is_empty() || out.response.is_empty() {
        return None;
    }
    Some(out)
}

/// Where each member's value lies in a parsed header: `None` for an empty or missing
/// required member (parsed as `""`), and for an optional one the outer `None` when missing.
#[derive(Debug, Clone, Copy)]
struct Spans {
    username: Option<Span>,
    realm: Option<Span>,
    nonce: Option<Span>,
    uri: Option<Span>,
    response: Option<Span>,
    qop: Option<Option<Span>>,
    nc: Option<Option<Span>>,
    cnonce: Option<Option<Span>>,
    opaque: Option<Option<Span>>,
    algorithm: Option<Option<Span>>,
}

type Span = (usize, usize);

impl Spans {
    /// The spans of `r`, whose values are all slices of `params` (or empty).
    fn of(params: &str, r: &DigestResponse<'_>) -> Spans {
        let base = params.as_ptr() as usize;
        let span = |v: &str| {
            (!v.is_empty()).then(|| {
                let start = v.as_ptr() as usize - base;
                (start, start + v.len())
            })
        };
        Spans {
            username: span(r.username),
            realm: span(r.realm),
            nonce: span(r.nonce),
            uri: span(r.uri),
            response: span(r.response),
            qop: r.qop.map(span),
            nc: r.nc.map(span),
            cnonce: r.cnonce.map(span),
            opaque: r.opaque.map(span),
            algorithm: r.algorithm.map(span),
        }
    }

    fn apply<'a>(&self, params: &'a str) -> DigestResponse<'a> {
        let at = |s: Option<Span>| s.map_or("", |(a, b)| &params[a..b]);
        DigestResponse {
            username: at(self.username),
            realm: at(self.realm),
            nonce: at(self.nonce),
            uri: at(self.uri),
            response: at(self.response),
            qop: self.qop.map(at),
            nc: self.nc.map(at),
            cnonce: self.cnonce.map(at),
            opaque: self.opaque.map(at),
            algorithm: self.algorithm.map(at),
        }
    }
}

/// The last Digest header a connection parsed that can be bound: its bytes, where its
/// members lie, and the two that change from request to request (`nc`, `response`), in order.
struct KeptHeader {
    params: String,
    spans: Spans,
    varying: [Span; 2],
}

/// Headers longer than this are parsed every time and never kept.
const KEPT_HEADER_MAX: usize = 1024;

fn is_hex(b: &[u8]) -> bool {
    b.iter().all(u8::is_ascii_hexdigit)
}

impl KeptHeader {
    /// A client sends the same header again with the next `nc` and its `response`. When
    /// `params` is the kept header with only those two values replaced by as many hex digits,
    /// it parses as the kept one does, with those values at the same places: hex digits are
    /// none of the bytes the parser looks at (`=`, `"`, `,`, whitespace), and keys lie
    /// outside the two values. The rest is compared in full, without an early exit, so the
    /// time taken does not depend on another client's header.
    fn bind<'a>(&self, params: &'a str) -> Option<DigestResponse<'a>> {
        let (new, kept) = (params.as_bytes(), self.params.as_bytes());
        if new.len() != kept.len() {
            return None;
        }
        let [(a0, a1), (b0, b1)] = self.varying;
        let fixed = [(0, a0), (a1, b0), (b1, new.len())];
        let diff = fixed.iter().fold(0u8, |acc, &(s, e)| {
            new[s..e]
                .iter()
                .zip(&kept[s..e])
                .fold(acc, |acc, (x, y)| acc | (x ^ y))
        });
        (diff == 0 && is_hex(&new[a0..a1]) && is_hex(&new[b0..b1]))
            .then(|| self.spans.apply(params))
    }

    fn keep(slot: &mut Option<KeptHeader>, params: &str, r: &DigestResponse<'_>) {
        let spans = Spans::of(params, r);
        let (Some(Some(nc)), Some(response)) = (spans.nc, spans.response) else {
            return;
        };
        let b = params.as_bytes();
        if params.len() > KEPT_HEADER_MAX
            || !is_hex(&b[nc.0..nc.1])
            || !is_hex(&b[response.0..response.1])
        {
            return;
        }
        let varying = if nc.0 < response.0 {
            [nc, response]
        } else {
            [response, nc]
        };
        match slot {
            Some(k) => {
                k.params.clear();
                k.params.push_str(params);
                k.spans = spans;
                k.varying = varying;
            }
            None => {
                *slot = Some(KeptHeader {
                    params: params.to_string(),
                    spans,
                    varying,
                })
            }
        }
    }
}

/// The MD5 state after hashing `HA1:nonce:`, the start of every `response` a client sends
/// with this user and nonce. With a 38-character nonce that is one whole 64-byte block of the
/// three the hash takes, so continuing from a copy of the state saves one compression.
struct KeptPrefix {
    ha1: [u8; 32],
    nonce: String,
    md5: Md5,
}

/// Nonces longer than this (ours have 38 characters) are hashed every time and never kept.
const KEPT_NONCE_MAX: usize = 128;

/// One connection's last Digest header that can be bound, and the MD5 state of its last
/// `HA1:nonce:`. A connection is one client, so a header is only ever compared with an
/// earlier one of its own connection.
#[derive(Default)]
pub struct HeaderCache {
    kept: Mutex<Option<KeptHeader>>,
    prefix: Mutex<Option<KeptPrefix>>,
}

impl HeaderCache {
    /// [`parse_digest`], from the kept header when this one differs from it only in `nc`
    /// and `response` (see `KeptHeader::bind`); otherwise parsed, and kept.
    pub fn parse<'a>(&self, params: &'a str) -> Option<DigestResponse<'a>> {
        self.parse_bound(params).0
    }

    /// [`HeaderCache::parse`], and whether the header was bound.
    fn parse_bound<'a>(&self, params: &'a str) -> (Option<DigestResponse<'a>>, bool) {
        // A connection's requests come one at a time: the lock is never contended, and a
        // poisoned one (a panic mid-keep) only costs the parse.
        let Ok(mut slot) = self.kept.lock() else {
            return (parse_digest(params), false);
        };
        if let Some(r) = slot.as_ref().and_then(|k| k.bind(params)) {
            return (Some(r), true);
        }
        let r = parse_digest(params);
        if let Some(r) = &r {
            KeptHeader::keep(&mut slot, params, r);
        }
        (r, false)
    }

    /// The MD5 state after `HA1:nonce:`: a copy of the kept one when the HA1 and the nonce
    /// are the connection's last ones, otherwise hashed, and kept.
    fn prefix(&self, ha1: &[u8; 32], nonce: &str) -> Md5 {
        let Ok(mut slot) = self.prefix.lock() else {
            return prefix_md5(ha1, nonce);
        };
        if let Some(k) = slot.as_ref()
            && constant_time_eq(&k.ha1, ha1)
            && k.nonce == nonce
        {
            return k.md5.clone();
        }
        let md5 = prefix_md5(ha1, nonce);
        if nonce.len() <= KEPT_NONCE_MAX {
            match &mut *slot {
                Some(k) => {
                    k.ha1 = *ha1;
                    k.nonce.clear();
                    k.nonce.push_str(nonce);
                    k.md5 = md5.clone();
                }
                None => {
                    *slot = Some(KeptPrefix {
                        ha1: *ha1,
                        nonce: nonce.to_string(),
                        md5: md5.clone(),
                    })
                }
            }
        }
        md5
    }
}

/// The MD5 state after `HA1:nonce:`.
fn prefix_md5(ha1: &[u8; 32], nonce: &str) -> Md5 {
    let mut h = Md5::new();
    h.update(ha1);
    h.update(b":");
    h.update(nonce.as_bytes());
    h.update(b":");
    h
}

fn hex_md5(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Md5::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update(b":");
        }
        h.update(p);
    }
    hex_digest(h)
}

/// The finished hash, lowercase hex.
fn hex_digest(h: Md5) -> [u8; 32] {
    let digest = h.finalize();
    let mut out = [0u8; 32];
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in digest.iter().enumerate() {
        out[2 * i] = HEX[(b >> 4) as usize];
        out[2 * i + 1] = HEX[(b & 15) as usize];
    }
    out
}

/// `HA1 = MD5(user:realm:password)`, lowercase hex: the one secret the service keeps.
pub fn ha1(user: &str, realm: &str, password: &str) -> [u8; 32] {
    hex_md5(&[user.as_bytes(), realm.as_bytes(), password.as_bytes()])
}

/// The `response` a client with the right password sends:
/// `MD5(HA1:nonce:nc:cnonce:auth:HA2)`, lowercase hex.
pub fn expected_response(ha1: &[u8; 32], method: &str, r: &DigestResponse<'_>) -> Option<[u8; 32]> {
    expected_response_on(ha1, method, r, None)
}

/// [`expected_response`], continuing from the connection's kept `HA1:nonce:` state when
/// `kept` has it for this HA1 and nonce.
pub(crate) fn expected_response_on(
    ha1: &[u8; 32],
    method: &str,
    r: &DigestResponse<'_>,
    kept: Option<&HeaderCache>,
) -> Option<[u8; 32]> {
    match r.qop {
        Some(qop) if qop.eq_ignore_ascii_case("auth") => {
            let (nc, cnonce) = (r.nc?, r.cnonce?);
            let ha2 = ha2(method, r.uri);
            let mut h = match kept {
                Some(k) => k.prefix(ha1, r.nonce),
                None => prefix_md5(ha1, r.nonce),
            };
            for part in [nc.as_bytes(), b":", cnonce.as_bytes(), b":auth:", &ha2] {
                h.update(part);
            }
            Some(hex_digest(h))
        }
        // We always offer qop=auth; replay protection needs nc, so nothing else is accepted.
        _ => None,
    }
}

thread_local! {
    /// The last `method:uri` hashed on this thread, and its hash. Query clients send one URI
    /// over and over (`POST /v1/resources/geoQueryService`).
    static LAST_HA2: RefCell<(Vec<u8>, [u8; 32])> = const { RefCell::new((Vec::new(), [0; 32])) };
}

/// `HA2 = MD5(method:uri)`, lowercase hex, from the thread's last one when it is the same.
fn ha2(method: &str, uri: &str) -> [u8; 32] {
    let (m, u) = (method.as_bytes(), uri.as_bytes());
    LAST_HA2.with(|last| {
        let mut last = last.borrow_mut();
        let (key, hash) = &mut *last;
        let same = key.len() == m.len() + 1 + u.len()
            && key[..m.len()] == *m
            && key[m.len()] == b':'
            && key[m.len() + 1..] == *u;
        if !same {
            *hash = hex_md5(&[m, u]);
            key.clear();
            key.extend_from_slice(m);
            key.push(b':');
            key.extend_from_slice(u);
        }
        *hash
    })
}

/// Compare without an early exit, so timing does not reveal how much matched.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Split a decoded Basic credential `user:password`.
pub(crate) fn split_basic(decoded: &str) -> Option<(&str, &str)> {
    decoded.split_once(':')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 2617 §3.5's worked example (MD5, qop=auth).
    #[test]
    fn rfc2617_example() {
        let header = r#"username="Mufasa", realm="testrealm@host.com",
            nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", uri="/dir/index.html", qop=auth,
            nc=00000001, cnonce="0a4f113b", response="6629fae49393a05397450978507c4ef1",
            opaque="5ccc069c403ebaf9f0171e9517f40e41""#;
        let r = parse_digest(header).unwrap();
        assert_eq!(r.username, "Mufasa");
        assert_eq!(r.nc, Some("00000001"));
        let h = ha1("Mufasa", "testrealm@host.com", "Circle Of Life");
        let want = expected_response(&h, "GET", &r).unwrap();
        assert_eq!(&want, r.response.as_bytes());
    }

    /// Headers in runs from one client shape, as clients send them, with `nc` and
    /// `response` replaced by all sorts of text, and sometimes another member changed to
    /// text of the same length: binding to the kept header must give what parsing gives,
    /// every time, and must bind the ordinary ones.
    #[test]
    fn a_bound_header_is_what_parsing_gives() {
        let shapes = [
            // The load test client's order (loadtest/src/client.rs), with an algorithm.
            r#"username="{u}", realm="public", nonce="{n}", uri="/v1/resources/geoQueryService", qop=auth, nc={nc}, cnonce="{c}", response="{r}", opaque="{o}", algorithm=MD5"#,
            // curl's order.
            r#"username="{u}", realm="public", nonce="{n}", uri="/v1/resources/geoQueryService", cnonce="{c}", nc={nc}, qop=auth, response="{r}", opaque="{o}", algorithm=MD5"#,
            // response before nc, quoted nc, upper-case keys, folded lines.
            "Response=\"{r}\",\r\n USERNAME=\"{u}\", realm=public, NC=\"{nc}\", nonce={n},\n\turi=\"/x\", qop=\"auth\", cnonce={c}",
            // A response given twice: the last counts.
            r#"username="{u}", realm="public", nonce="{n}", uri="/", qop=auth, nc={nc}, cnonce="{c}", response="{r}", response="{r}""#,
            // No nc: never kept.
            r#"username="{u}", realm="public", nonce="{n}", uri="/", response="{r}""#,
        ];
        let texts = [
            "00000001",
            "0000000a",
            "DEADBEEF",
            "0000000",
            "000000001",
            "0000000g",
            "0000 001",
            "00,00001",
            "000=0001",
            "0000\"001",
            "",
            "6629fae49393a05397450978507c4ef1",
            "6629FAE49393A05397450978507C4EF1",
            "6629fae49393a05397450978507c4ef",
            "6629fae49393a05397450978507c4eF1x",
            "6629fae49393a0539745097850 c4ef1",
            "6629fae49393a05397450978507c4e\"1",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let hex = |v: usize, width: usize| format!("{v:0width$x}");
        let (mut total, mut bound) = (0, 0);
        let cache = HeaderCache::default();
        for run in 0..400 {
            let shape = shapes[run % shapes.len()];
            // Same-length values, so only a compare can tell them apart.
            let u = ["alice", "bobby", "carol"][next(3)];
            let n = ["nonce-one-000", "nonce-two-000"][next(2)];
            let c = ["0a4f113b", "0a4f113c"][next(2)];
            for i in 0..15 {
                let (mut nc, mut r) = (hex(i + 1, 8), hex(next(1 << 30) * 7919, 32));
                match next(8) {
                    0 => nc = texts[next(texts.len())].to_string(),
                    1 => r = texts[next(texts.len())].to_string(),
                    _ => {}
                }
                let (mut u, mut o) = (u, "opaque-0");
                match next(20) {
                    0 => u = "alicf",
                    1 => o = "opaque-1",
                    _ => {}
                }
                let h = shape
                    .replace("{u}", u)
                    .replace("{n}", n)
                    .replace("{c}", c)
                    .replace("{o}", o)
                    .replace("{nc}", &nc)
                    .replace("{r}", &r);
                let (got, was_bound) = cache.parse_bound(&h);
                assert_eq!(got, parse_digest(&h), "{h}");
                total += 1;
                bound += usize::from(was_bound);
            }
        }
        assert_eq!(total, 6000);
        // A third bind: of the four shapes with nc, all but the first of a run, the changed
        // ones, and the one after each changed one that was kept.
        assert!(bound > 1500, "{bound} bound");
    }

    /// A kept header binds the next request's nc and response, and nothing else: not a
    /// header with another member changed, nor one with non-hex text in those two places.
    #[test]
    fn a_kept_header_binds_only_new_nc_and_response() {
        let h = |u: &str, nc: &str, r: &str| {
            format!(
                r#"username="{u}", realm="public", nonce="abc", uri="/", qop=auth, nc={nc}, cnonce="c0", response="{r}""#
            )
        };
        let cache = HeaderCache::default();
        let first = h("alice", "00000001", "aaaa");
        assert!(!cache.parse_bound(&first).1);
        let next = h("alice", "00000002", "bbbb");
        let (r, bound) = cache.parse_bound(&next);
        assert!(bound);
        let r = r.unwrap();
        assert_eq!(
            (r.username, r.nc, r.response),
            ("alice", Some("00000002"), "bbbb")
        );
        // Kept now: the second. Another user of the same length is parsed, and kept.
        let other = h("bobby", "00000003", "cccc");
        let (r, bound) = cache.parse_bound(&other);
        assert_eq!((bound, r.unwrap().username), (false, "bobby"));
        // A comma in the unquoted nc's place is parsed: it ends the value.
        let comma = h("bobby", "0000,004", "cccc");
        let (r, bound) = cache.parse_bound(&comma);
        assert_eq!((bound, r.unwrap().nc), (false, Some("0000")));
    }

    /// The kept HA2 is the one of the same method and URI, never of another that shares a
    /// prefix, a length or the other half.
    #[test]
    fn ha2_is_kept_only_for_the_same_method_and_uri() {
        let fresh = |m: &str, u: &str| hex_md5(&[m.as_bytes(), u.as_bytes()]);
        for (m, u) in [
            ("POST", "/v1/resources/geoQueryService"),
            ("POST", "/v1/resources/geoQueryService"),
            ("GET", "/v1/resources/geoQueryService"),
            ("POST", "/v1/resources/geoQueryServicf"),
            ("POS", "T:/v1/resources/geoQueryService"),
            ("POST", "/v1/resources/geoQueryService?x"),
            ("POST", ""),
            ("", "POST"),
            ("POST", "/v1/resources/geoQueryService"),
        ] {
            assert_eq!(ha2(m, u), fresh(m, u), "{m} {u}");
        }
    }

    #[test]
    fn malformed_headers_are_none() {
        assert!(parse_digest("").is_none());
        assert!(parse_digest("username=\"x").is_none());
        assert!(parse_digest("garbage").is_none());
        assert!(parse_digest("username=\"a\", nonce=\"n\"").is_none());
    }

    #[test]
    fn no_qop_is_refused() {
        let r = parse_digest(r#"username="a", nonce="n", uri="/", response="r""#).unwrap();
        assert!(expected_response(&ha1("a", "r", "p"), "GET", &r).is_none());
    }

    /// Requests on one connection that keep, switch and come back to a user and a nonce,
    /// with `HA1:nonce:` shorter than one MD5 block, exactly one (a 30-character nonce), just
    /// over, over two, and too long to keep: every
    /// `response` continued from the kept state is the MD5 of the whole text, hashed in one go.
    #[test]
    fn a_kept_prefix_gives_the_whole_texts_hash() {
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let md5_hex = |text: &str| hex(&Md5::digest(text.as_bytes()));
        let ha1s = [ha1("alice", "r", "pw"), ha1("bob", "r", "pw")];
        let nonces: Vec<String> = [38, 38, 5, 30, 31, 32, 100, KEPT_NONCE_MAX + 1, 38]
            .iter()
            .enumerate()
            .map(|(i, n)| {
                (0..*n)
                    .map(|j| (b'a' + ((i + j) % 26) as u8) as char)
                    .collect()
            })
            .collect();
        let kept_of = |c: &HeaderCache| {
            let slot = c.prefix.lock().unwrap();
            slot.as_ref().map(|k| (k.ha1, k.nonce.clone()))
        };
        let cache = HeaderCache::default();
        let mut hits = 0;
        for step in 0..400usize {
            let ha1 = &ha1s[step / 7 % 2];
            let nonce = &nonces[step / 3 % nonces.len()];
            let nc = format!("{:08x}", step + 1);
            let cnonce = format!("c{}", step % 5);
            let uri = ["/v1/resources/geoQueryService", "/v1/documents"][step / 11 % 2];
            let r = DigestResponse {
                nonce,
                uri,
                qop: Some("auth"),
                nc: Some(&nc),
                cnonce: Some(&cnonce),
                ..Default::default()
            };
            let kept_before = kept_of(&cache);
            hits += usize::from(kept_before.as_ref() == Some(&(*ha1, nonce.clone())));
            let got = expected_response_on(ha1, "POST", &r, Some(&cache)).unwrap();
            let ha2 = md5_hex(&format!("POST:{uri}"));
            let ha1_text = std::str::from_utf8(ha1).unwrap();
            let want = md5_hex(&format!("{ha1_text}:{nonce}:{nc}:{cnonce}:auth:{ha2}"));
            assert_eq!(std::str::from_utf8(&got).unwrap(), want, "step {step}");
            assert_eq!(got, expected_response(ha1, "POST", &r).unwrap());
            // A nonce longer than the limit leaves the kept state as it was.
            let kept = kept_of(&cache);
            if nonce.len() > KEPT_NONCE_MAX {
                assert_eq!(kept, kept_before, "step {step}");
            } else {
                assert_eq!(kept, Some((*ha1, nonce.clone())), "step {step}");
            }
        }
        assert!(hits > 150, "{hits} of 400 continued from the kept state");
    }
}
