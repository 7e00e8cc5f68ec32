//! HTTP Digest (RFC 7616, MD5, `qop=auth`) and Basic: parsing the `Authorization` header and
//! computing the hashes. No HTTP types; the only state is a per-thread copy of the last HA2
//! (`ha2`), which gives the same hash as computing it again.

use std::cell::RefCell;

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

fn hex_md5(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Md5::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update(b":");
        }
        h.update(p);
    }
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

/// The `response` a client with the right password sends.
pub fn expected_response(ha1: &[u8; 32], method: &str, r: &DigestResponse<'_>) -> Option<[u8; 32]> {
    let ha2 = ha2(method, r.uri);
    match r.qop {
        Some(qop) if qop.eq_ignore_ascii_case("auth") => Some(hex_md5(&[
            ha1,
            r.nonce.as_bytes(),
            r.nc?.as_bytes(),
            r.cnonce?.as_bytes(),
            b"auth",
            &ha2,
        ])),
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
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Split a decoded Basic credential `user:password`.
pub fn split_basic(decoded: &str) -> Option<(&str, &str)> {
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
}
