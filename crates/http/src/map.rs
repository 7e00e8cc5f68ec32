//! The map page: `GET /` and its files under `/map/`, embedded in the binary (MapLibre GL JS
//! from its npm package, `assets/map/vendor/`, and the page itself), so it needs no network at
//! run time; and beside it `/map/cluster`, which node holds which shard. The page reads layers, tiles and features through the same authenticated routes
//! as any client.

use std::io::Write;
use std::sync::OnceLock;

use bytes::Bytes;
use hyper::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, ETAG, HeaderValue, IF_NONE_MATCH, VARY,
};

use super::Ctx;
use super::response::{self, Resp};
use crate::error::{ApiError, ErrorCode};

/// One embedded file, with its gzip form made on first use.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    gzip: OnceLock<(Bytes, String)>,
}

macro_rules! asset {
    ($path:literal, $file:literal, $kind:literal) => {
        Asset {
            path: $path,
            content_type: $kind,
            body: include_bytes!(concat!("../../../assets/map/", $file)),
            gzip: OnceLock::new(),
        }
    };
}

static ASSETS: [Asset; 8] = [
    asset!("", "index.html", "text/html; charset=utf-8"),
    asset!("map.js", "map.js", "text/javascript; charset=utf-8"),
    asset!("cluster", "cluster.html", "text/html; charset=utf-8"),
    asset!("cluster.js", "cluster.js", "text/javascript; charset=utf-8"),
    asset!("map.css", "map.css", "text/css; charset=utf-8"),
    asset!(
        "vendor/maplibre-gl.mjs",
        "vendor/maplibre-gl.mjs",
        "text/javascript; charset=utf-8"
    ),
    asset!(
        "vendor/maplibre-gl-worker.mjs",
        "vendor/maplibre-gl-worker.mjs",
        "text/javascript; charset=utf-8"
    ),
    asset!(
        "vendor/maplibre-gl.css",
        "vendor/maplibre-gl.css",
        "text/css; charset=utf-8"
    ),
];

impl Asset {
    /// The gzip of the body, and an entity tag of the content (the same for both encodings,
    /// told apart by `Vary`).
    fn encoded(&self) -> &(Bytes, String) {
        self.gzip.get_or_init(|| {
            let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            let gz = z
                .write_all(self.body)
                .and_then(|()| z.finish())
                .unwrap_or_default();
            let tag = format!("\"{:016x}\"", fnv1a(self.body));
            (Bytes::from(gz), tag)
        })
    }
}

/// FNV-1a: a stable 64-bit hash of the embedded bytes, for the entity tag.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `GET /` (`rest` empty) or `GET /map/{rest}`.
pub(super) fn get(ctx: &Ctx, rest: &str) -> Result<Resp, ApiError> {
    let asset = ASSETS.iter().find(|a| a.path == rest).ok_or_else(|| {
        ApiError::new(
            ErrorCode::UnknownEndpoint,
            format!("no endpoint at {}", ctx.path),
        )
    })?;
    let (gz, tag) = asset.encoded();
    let header = |name| ctx.headers.get(name).and_then(|v| v.to_str().ok());
    let mut r = if header(IF_NONE_MATCH).is_some_and(|m| m.split(',').any(|t| t.trim() == tag)) {
        response::empty(304)
    } else if header(ACCEPT_ENCODING).is_some_and(accepts_gzip) && !gz.is_empty() {
        let mut r = response::with_body(200, asset.content_type, gz.clone());
        r.headers_mut()
            .insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        r
    } else {
        response::with_body(200, asset.content_type, Bytes::from_static(asset.body))
    };
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(tag) {
        h.insert(ETAG, v);
    }
    h.insert(VARY, HeaderValue::from_static("Accept-Encoding"));
    // Private: the page is behind authentication. Revalidated each time, which the tag makes
    // a 304.
    h.insert(CACHE_CONTROL, HeaderValue::from_static("private, no-cache"));
    Ok(r)
}

/// Whether an `Accept-Encoding` value allows gzip (listed without `q=0`).
pub(super) fn accepts_gzip(v: &str) -> bool {
    v.split(',').any(|part| {
        let mut it = part.split(';');
        let coding = it.next().unwrap_or("").trim();
        let refused = it.any(|p| {
            p.trim()
                .strip_prefix("q=")
                .and_then(|q| q.trim().parse::<f32>().ok())
                == Some(0.0)
        });
        (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_asked_for_unless_refused() {
        assert!(accepts_gzip("gzip, deflate, br"));
        assert!(accepts_gzip("br;q=1.0, gzip;q=0.8"));
        assert!(accepts_gzip("*"));
        assert!(!accepts_gzip("gzip;q=0, br"));
        assert!(!accepts_gzip("identity"));
        assert!(!accepts_gzip("deflate"));
    }

    /// The gzip form decodes to the embedded file.
    #[test]
    fn the_gzip_is_the_file() {
        use std::io::Read;
        for a in &ASSETS {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&a.encoded().0[..])
                .read_to_end(&mut out)
                .unwrap();
            assert_eq!(out, a.body, "{}", a.path);
        }
    }

    /// The vendored MapLibre files are the version `assets/map/package.json` pins (what
    /// `scripts/update-maplibre.sh` copies).
    #[test]
    fn the_vendored_maplibre_is_the_pinned_version() {
        let pkg: serde_json::Value =
            serde_json::from_str(include_str!("../../../assets/map/package.json")).unwrap();
        let version = pkg["dependencies"]["maplibre-gl"].as_str().unwrap();
        for name in ["vendor/maplibre-gl.mjs", "vendor/maplibre-gl-worker.mjs"] {
            let a = ASSETS.iter().find(|a| a.path == name).unwrap();
            let head = String::from_utf8_lossy(&a.body[..400]);
            assert!(
                head.contains(&format!("/v{version}/LICENSE.txt")),
                "{name} is not maplibre-gl {version}: {head}"
            );
        }
    }
}
