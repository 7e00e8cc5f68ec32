//! The stored byte form of a document: a small header (format, permissions, collections)
//! followed by the content, so one redb value holds everything one read needs.
//!
//! ```text
//! [0]      codec version: 1 (content as it is), 2 or 3 (content compressed)
//! [1]      format
//! [2..6]   permissions: one role set per capability
//! [6..8]   collection count, u16 LE
//! then     per collection: u16 LE length + UTF-8 bytes
//! then     version 1: the content, to the end of the value
//!          version 2: the dictionary's id (u32 LE), then the content's zstd frame (which
//!          records its size), to the end of the value (written before the lean frames)
//!          version 3: the dictionary's id (u32 LE), the content's size (LEB128), then its
//!          lean zstd frame (no magic, dictionary id, size or checksum: `compress`), to the
//!          end of the value
//!          version 4 (a stub): the content is kept by other nodes of a cluster; a u16 LE
//!          count, then the shards (u16 LE each) whose holders keep it
//! ```
//!
//! The header stays plain in both, so a scan can pass over a document on its header alone.

use bytes::Bytes;

use super::{Document, Format, StoreError, compress};
use crate::acl::Permissions;

const VERSION: u8 = 1;
const VERSION_COMPRESSED: u8 = 2;
const VERSION_LEAN: u8 = 3;
const VERSION_ELSEWHERE: u8 = 4;

/// The stored bytes of `doc`, its content compressed with dictionary `dictionary` when that
/// makes it smaller (0: no dictionary).
pub fn encode(doc: &Document, dictionary: u32) -> Vec<u8> {
    let meta: usize = doc.collections.iter().map(|c| 2 + c.len()).sum();
    let mut out = Vec::with_capacity(8 + meta + doc.content.len());
    out.push(VERSION);
    out.push(doc.format as u8);
    out.extend_from_slice(&doc.permissions.to_bytes());
    let count = u16::try_from(doc.collections.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&count.to_le_bytes());
    for c in doc.collections.iter().take(count as usize) {
        let len = u16::try_from(c.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&c.as_bytes()[..len as usize]);
    }
    if dictionary != 0 {
        let header = out.len();
        out.extend_from_slice(&dictionary.to_le_bytes());
        let mut len = doc.content.len();
        while len >= 0x80 {
            out.push(len as u8 | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
        if compress::compress(dictionary, &doc.content, &mut out) {
            out[0] = VERSION_LEAN;
            return out;
        }
        out.truncate(header);
    }
    out.extend_from_slice(&doc.content);
    out
}

/// A stub of `doc`: its header, and the shards whose holders keep its content.
pub fn encode_elsewhere(doc: &Document, home: &[u16]) -> Vec<u8> {
    let mut out = encode(
        &Document {
            uri: String::new(),
            format: doc.format,
            collections: doc.collections.clone(),
            permissions: doc.permissions,
            content: Bytes::new(),
        },
        0,
    );
    out[0] = VERSION_ELSEWHERE;
    let count = u16::try_from(home.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&count.to_le_bytes());
    for s in home.iter().take(count as usize) {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out
}

/// Whether stored bytes are a stub (the content kept by other nodes).
pub fn is_elsewhere(bytes: &[u8]) -> bool {
    bytes.first() == Some(&VERSION_ELSEWHERE)
}

/// The shards whose holders keep a stub's content (empty for a malformed one).
pub(crate) fn home_of(uri: &str, bytes: &[u8]) -> Result<Vec<u16>, StoreError> {
    let (_, _, _, start) = decode_meta(uri, bytes)?;
    let rest = &bytes[start..];
    let count = rest
        .get(..2)
        .map_or(0, |c| u16::from_le_bytes([c[0], c[1]]) as usize);
    Ok(rest
        .get(2..2 + 2 * count)
        .unwrap_or_default()
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect())
}

fn corrupt(uri: &str, what: &str) -> StoreError {
    StoreError::Corrupt(format!("document {uri}: {what}"))
}

/// The collection names of a header (version checked, at least 8 bytes), as raw bytes. An
/// item is `None` where the header is cut short, and is the last; `pos` is then where the
/// names end.
struct Names<'a> {
    bytes: &'a [u8],
    pos: usize,
    left: usize,
}

impl<'a> Names<'a> {
    fn of(bytes: &'a [u8]) -> Names<'a> {
        Names {
            bytes,
            pos: 8,
            left: u16::from_le_bytes([bytes[6], bytes[7]]) as usize,
        }
    }
}

impl<'a> Iterator for Names<'a> {
    type Item = Option<&'a [u8]>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let name = self.bytes.get(self.pos..self.pos + 2).and_then(|l| {
            let len = u16::from_le_bytes([l[0], l[1]]) as usize;
            self.bytes.get(self.pos + 2..self.pos + 2 + len)
        });
        match name {
            Some(n) => self.pos += 2 + n.len(),
            None => self.left = 0,
        }
        Some(name)
    }
}

fn header_ok(bytes: &[u8]) -> bool {
    bytes.len() >= 8
        && matches!(
            bytes[0],
            VERSION | VERSION_COMPRESSED | VERSION_LEAN | VERSION_ELSEWHERE
        )
}

/// Decode the header only: format, permissions, collections, and where the content starts.
pub(crate) fn decode_meta(
    uri: &str,
    bytes: &[u8],
) -> Result<(Format, Permissions, Vec<String>, usize), StoreError> {
    if !header_ok(bytes) {
        return Err(corrupt(uri, "bad header"));
    }
    let format = Format::from_u8(bytes[1]).ok_or_else(|| corrupt(uri, "bad format byte"))?;
    let permissions = Permissions::from_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]);
    let mut names = Names::of(bytes);
    let mut collections = Vec::with_capacity(names.left);
    for name in names.by_ref() {
        let name = name.ok_or_else(|| corrupt(uri, "truncated collections"))?;
        collections.push(
            std::str::from_utf8(name)
                .map_err(|_| corrupt(uri, "collection is not UTF-8"))?
                .to_string(),
        );
    }
    Ok((format, permissions, collections, names.pos))
}

/// Whether the header names any of `names` among its collections, read without decoding it
/// (a malformed header names none).
pub fn in_any_collection(bytes: &[u8], names: &[&str]) -> bool {
    header_ok(bytes)
        && Names::of(bytes)
            .map_while(|name| name)
            .any(|name| names.iter().any(|n| n.as_bytes() == name))
}

/// The dictionary a stored value's content is compressed with; `None` for a plain one (or a
/// malformed header).
pub(crate) fn dictionary_of(bytes: &[u8]) -> Option<u32> {
    if !header_ok(bytes) || matches!(bytes[0], VERSION | VERSION_ELSEWHERE) {
        return None;
    }
    let mut names = Names::of(bytes);
    for name in names.by_ref() {
        name?;
    }
    let id = bytes.get(names.pos..names.pos + 4)?;
    Some(u32::from_le_bytes(id.try_into().ok()?))
}

/// A document's stored bytes decoded; a stub is `StoreError::Elsewhere`.
pub(crate) fn decode(uri: &str, bytes: &[u8]) -> Result<Document, StoreError> {
    if is_elsewhere(bytes) {
        return Err(StoreError::Elsewhere(home_of(uri, bytes)?));
    }
    let (format, permissions, collections, start) = decode_meta(uri, bytes)?;
    Ok(Document {
        uri: uri.to_string(),
        format,
        collections,
        permissions,
        content: content(uri, bytes, start)?,
    })
}

/// The content of stored bytes whose header ends at `start`.
fn content(uri: &str, bytes: &[u8], start: usize) -> Result<Bytes, StoreError> {
    if bytes[0] == VERSION {
        return Ok(Bytes::copy_from_slice(&bytes[start..]));
    }
    let truncated = || corrupt(uri, "truncated compressed content");
    let (id, mut frame) = bytes[start..]
        .split_first_chunk::<4>()
        .ok_or_else(truncated)?;
    let mut lean = None;
    if bytes[0] == VERSION_LEAN {
        let mut len = 0usize;
        for shift in (0..).step_by(7) {
            let (&b, rest) = frame.split_first().ok_or_else(truncated)?;
            frame = rest;
            if shift > 28 {
                return Err(corrupt(uri, "a content size past 4 GiB"));
            }
            len |= usize::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
        }
        lean = Some(len);
    }
    compress::decompress(u32::from_le_bytes(*id), frame, lean)
        .map(Bytes::from)
        .map_err(|e| corrupt(uri, &e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{Capability, Role};

    #[test]
    fn round_trip() {
        let mut permissions = Permissions::new();
        permissions.grant(Role::GeoReader, Capability::Read);
        let doc = Document {
            uri: "/a/b.json".into(),
            format: Format::Json,
            collections: vec!["mollusks".into(), "".into(), "ü".into()],
            permissions,
            content: Bytes::from_static(b"{\"a\":1}"),
        };
        let bytes = encode(&doc, 0);
        assert_eq!(decode("/a/b.json", &bytes).unwrap(), doc);
    }

    #[test]
    fn a_stub_keeps_the_header_and_the_keepers_shards() {
        let mut permissions = Permissions::new();
        permissions.grant(Role::GeoReader, Capability::Read);
        let doc = Document {
            uri: "/s.json".into(),
            format: Format::Json,
            collections: vec!["places".into()],
            permissions,
            content: Bytes::from_static(b"{\"geometry\":{}}"),
        };
        let bytes = encode_elsewhere(&doc, &[2, 5]);
        assert!(is_elsewhere(&bytes) && !is_elsewhere(&encode(&doc, 0)));
        let (format, perms, colls, _) = decode_meta("/s.json", &bytes).unwrap();
        assert_eq!(
            (format, perms, colls),
            (doc.format, permissions, doc.collections)
        );
        assert_eq!(home_of("/s.json", &bytes).unwrap(), [2, 5]);
        assert!(matches!(
            decode("/s.json", &bytes),
            Err(StoreError::Elsewhere(s)) if s == [2, 5]
        ));
        assert!(in_any_collection(&bytes, &["places"]));
        assert_eq!(dictionary_of(&bytes), None);
        // Cut anywhere, a stub is an error or fewer shards, never a panic.
        for n in 0..bytes.len() {
            let _ = home_of("/s.json", &bytes[..n]);
            let _ = decode("/s.json", &bytes[..n]);
        }
    }

    #[test]
    fn collections_are_found_in_the_header_alone() {
        let doc = Document {
            uri: "/t.json".into(),
            format: Format::Json,
            collections: vec!["a".into(), "templates".into()],
            permissions: Permissions::document_default(),
            content: Bytes::from_static(b"{\"templates\":1}"),
        };
        let bytes = encode(&doc, 0);
        assert!(in_any_collection(&bytes, &["x", "templates"]));
        assert!(!in_any_collection(&bytes, &["template", "b"]));
        // The content is not a collection, and a cut header names none.
        assert!(!in_any_collection(&bytes, &["{\"templates\":1}"]));
        for end in 0..bytes.len() - 16 {
            assert!(!in_any_collection(&bytes[..end], &["templates"]), "{end}");
        }
    }

    #[test]
    fn truncated_is_an_error_not_a_panic() {
        let doc = Document {
            uri: "/x".into(),
            format: Format::Text,
            collections: vec!["abc".into()],
            permissions: Permissions::document_default(),
            content: Bytes::from_static(b"hi"),
        };
        let bytes = encode(&doc, 0);
        for cut in 0..11 {
            assert!(decode("/x", &bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    fn sample(i: usize) -> Vec<u8> {
        format!(
            r#"{{"type":"Feature","properties":{{"name":"Place {i}","cc":"{}"}},"geometry":{{"type":"Point","coordinates":[{}.{},{}.{}]}}}}"#,
            ["DE", "US", "FR", "ID"][i % 4],
            i % 180,
            i * 7919 % 100_000,
            i % 90,
            i * 104_729 % 100_000
        )
        .into_bytes()
    }

    /// Sample place `i` as a stored document.
    fn place(i: usize) -> Document {
        Document {
            uri: format!("/p/{i}.json"),
            format: Format::Json,
            collections: vec!["places".into()],
            permissions: Permissions::document_default(),
            content: Bytes::from(sample(i)),
        }
    }

    fn trained() -> u32 {
        let samples: Vec<Vec<u8>> = (0..2_000).map(sample).collect();
        let dictionary = compress::train(&samples).expect("a dictionary");
        compress::register(&dictionary).unwrap()
    }

    #[test]
    fn compressed_content_reads_back_and_is_smaller() {
        let id = trained();
        for i in [3, 5_000, 77_777] {
            let doc = place(i);
            let plain = encode(&doc, 0);
            let packed = encode(&doc, id);
            assert_eq!((plain[0], packed[0]), (VERSION, VERSION_LEAN));
            assert!(
                packed.len() * 2 < plain.len(),
                "{} bytes compressed, {} plain",
                packed.len(),
                plain.len()
            );
            assert_eq!(decode(&doc.uri, &packed).unwrap(), doc);
            assert_eq!(decode(&doc.uri, &plain).unwrap(), doc);
            // The header reads alike in both.
            assert!(in_any_collection(&packed, &["places"]));
            // Every cut of the compressed value is an error, not a panic or other content.
            for cut in 0..packed.len() {
                assert!(decode(&doc.uri, &packed[..cut]).is_err(), "cut at {cut}");
            }
        }
        // Short contents stay plain, and an unknown dictionary is an error naming it.
        let short = Document {
            uri: "/s".into(),
            format: Format::Json,
            collections: vec![],
            permissions: Permissions::document_default(),
            content: Bytes::from_static(b"{}"),
        };
        assert_eq!(encode(&short, id)[0], VERSION);
        let mut packed = encode(
            &Document {
                content: Bytes::from(sample(9)),
                ..short
            },
            id,
        );
        packed[8..12].copy_from_slice(&(id ^ 0x5555).to_le_bytes());
        let err = decode("/s", &packed).unwrap_err().to_string();
        assert!(err.contains("is unknown"), "{err}");
    }

    /// Values of codec version 2 (standard zstd frames) still read back, and a lean value
    /// is 7 bytes or more shorter than its version 2 form.
    #[test]
    fn version_2_values_read_back() {
        let id = trained();
        for i in [3, 5_000, 77_777] {
            let doc = place(i);
            let lean = encode(&doc, id);
            let header = encode(&doc, 0).len() - doc.content.len();
            let mut old = lean[..header].to_vec();
            old[0] = VERSION_COMPRESSED;
            old.extend_from_slice(&id.to_le_bytes());
            old.extend_from_slice(&compress::compress_standard(id, &doc.content));
            assert_eq!(decode(&doc.uri, &old).unwrap(), doc);
            assert_eq!(dictionary_of(&old), Some(id));
            assert_eq!(dictionary_of(&lean), Some(id));
            assert!(
                lean.len() + 7 <= old.len(),
                "{} and {}",
                lean.len(),
                old.len()
            );
            // A lean value whose size was changed is an error, not other content.
            let mut wrong = lean.clone();
            wrong[header + 4] ^= 1;
            assert!(decode(&doc.uri, &wrong).is_err());
        }
    }

    #[test]
    fn a_dictionary_id_names_its_bytes() {
        let a = compress::train(&(0..2_000).map(sample).collect::<Vec<_>>()).unwrap();
        assert_eq!(compress::register(&a).unwrap(), compress::id_of(&a));
        assert_eq!(compress::register(&a).unwrap(), compress::id_of(&a));
        assert_ne!(compress::id_of(&a), 0);
        // Too few samples train none.
        assert!(compress::train(&(0..10).map(sample).collect::<Vec<_>>()).is_none());
    }
}
