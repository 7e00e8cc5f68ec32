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
    bytes.len() >= 8 && bytes[0] == VERSION
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
