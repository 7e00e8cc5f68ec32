//! The stored byte form of a document: a small header (format, permissions, collections)
//! followed by the content, so one redb value holds everything one read needs.
//!
//! ```text
//! [0]      codec version (1)
//! [1]      format
//! [2..6]   permissions: one role set per capability
//! [6..8]   collection count, u16 LE
//! then     per collection: u16 LE length + UTF-8 bytes
//! then     the content, to the end of the value
//! ```

use bytes::Bytes;

use super::{Document, Format, StoreError};
use crate::acl::Permissions;

const VERSION: u8 = 1;

pub fn encode(doc: &Document) -> Vec<u8> {
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
    out.extend_from_slice(&doc.content);
    out
}

fn corrupt(uri: &str, what: &str) -> StoreError {
    StoreError::Corrupt(format!("document {uri}: {what}"))
}

/// Decode the header only: format, permissions, collections, and where the content starts.
pub(crate) fn decode_meta(
    uri: &str,
    bytes: &[u8],
) -> Result<(Format, Permissions, Vec<String>, usize), StoreError> {
    if bytes.len() < 8 || bytes[0] != VERSION {
        return Err(corrupt(uri, "bad header"));
    }
    let format = Format::from_u8(bytes[1]).ok_or_else(|| corrupt(uri, "bad format byte"))?;
    let permissions = Permissions::from_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]);
    let count = u16::from_le_bytes([bytes[6], bytes[7]]) as usize;
    let mut pos = 8;
    let mut collections = Vec::with_capacity(count);
    for _ in 0..count {
        let len_bytes = bytes
            .get(pos..pos + 2)
            .ok_or_else(|| corrupt(uri, "truncated collections"))?;
        let len = u16::from_le_bytes([len_bytes[0], len_bytes[1]]) as usize;
        pos += 2;
        let name = bytes
            .get(pos..pos + len)
            .ok_or_else(|| corrupt(uri, "truncated collection name"))?;
        collections.push(
            std::str::from_utf8(name)
                .map_err(|_| corrupt(uri, "collection is not UTF-8"))?
                .to_string(),
        );
        pos += len;
    }
    Ok((format, permissions, collections, pos))
}

/// Whether the header names any of `names` among its collections, read without decoding it
/// (a malformed header names none).
pub(crate) fn in_any_collection(bytes: &[u8], names: &[&str]) -> bool {
    if bytes.len() < 8 || bytes[0] != VERSION {
        return false;
    }
    let count = u16::from_le_bytes([bytes[6], bytes[7]]) as usize;
    let mut pos = 8;
    for _ in 0..count {
        let Some(&[a, b]) = bytes.get(pos..pos + 2) else {
            return false;
        };
        let len = u16::from_le_bytes([a, b]) as usize;
        pos += 2;
        let Some(name) = bytes.get(pos..pos + len) else {
            return false;
        };
        if names.iter().any(|n| n.as_bytes() == name) {
            return true;
        }
        pos += len;
    }
    false
}

pub(crate) fn decode(uri: &str, bytes: &[u8]) -> Result<Document, StoreError> {
    let (format, permissions, collections, start) = decode_meta(uri, bytes)?;
    Ok(Document {
        uri: uri.to_string(),
        format,
        collections,
        permissions,
        content: Bytes::copy_from_slice(&bytes[start..]),
    })
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
        let bytes = encode(&doc);
        assert_eq!(decode("/a/b.json", &bytes).unwrap(), doc);
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
        let bytes = encode(&doc);
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
        let bytes = encode(&doc);
        for cut in 0..11 {
            assert!(decode("/x", &bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
