//! The byte form of a write request in a replicated log (cluster mode): who wrote it and its
//! operations, so that every node applies the same request with the same rights.
//!
//! ```text
//! [0]      version (1)
//! caller   u16 LE name length + UTF-8 name, u8 effective role bits
//! u32 LE   operation count, then per operation a tag byte and its fields:
//!   0 put document     str uri, u8 format, opt collections, opt permissions,
//!                      4 bytes default permissions, bytes content
//!   1 delete document  str uri
//!   2 put record       u8 table, str key, bytes value
//!   3 delete record    u8 table, str key
//!   4 replace table    u8 table, u32 LE count, then str key + bytes value each
//! str and bytes: u32 LE length + the bytes; opt: u8 0 (none) or 1 then the value;
//! collections: u32 LE count, then a str each; permissions: 4 bytes.
//! ```

use bytes::Bytes;

use super::{Format, Op, PutDocument, StoreError, Table};
use crate::acl::{Caller, Permissions, RoleSet};

const VERSION: u8 = 1;

fn table_byte(t: Table) -> u8 {
    match t {
        Table::Users => 0,
        Table::Meta => 1,
        Table::Flows => 2,
        Table::Traces => 3,
        Table::Nonces => 4,
    }
}

fn table_of(b: u8) -> Option<Table> {
    Some(match b {
        0 => Table::Users,
        1 => Table::Meta,
        2 => Table::Flows,
        3 => Table::Traces,
        4 => Table::Nonces,
        _ => return None,
    })
}

struct Writer(Vec<u8>);

impl Writer {
    fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.0.extend_from_slice(b);
    }

    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }

    fn permissions(&mut self, p: Permissions) {
        self.0.extend_from_slice(&p.to_bytes());
    }
}

/// The log entry of a write by `caller`.
pub fn encode(caller: &Caller, ops: &[Op]) -> Vec<u8> {
    let size: usize = ops
        .iter()
        .map(|op| match op {
            Op::PutDocument(p) => 64 + p.uri.len() + p.content.len(),
            Op::PutRecord { key, value, .. } => 16 + key.len() + value.len(),
            Op::ReplaceTable { entries, .. } => {
                16 + entries
                    .iter()
                    .map(|(k, v)| 8 + k.len() + v.len())
                    .sum::<usize>()
            }
            _ => 64,
        })
        .sum();
    let mut w = Writer(Vec::with_capacity(16 + caller.name().len() + size));
    w.0.push(VERSION);
    let name = &caller.name().as_bytes()[..caller.name().len().min(u16::MAX as usize)];
    w.0.extend_from_slice(&(name.len() as u16).to_le_bytes());
    w.0.extend_from_slice(name);
    w.0.push(caller.roles().bits());
    w.0.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        match op {
            Op::PutDocument(p) => {
                w.0.push(0);
                w.str(&p.uri);
                w.0.push(p.format as u8);
                match &p.collections {
                    None => w.0.push(0),
                    Some(c) => {
                        w.0.push(1);
                        w.0.extend_from_slice(&(c.len() as u32).to_le_bytes());
                        for name in c {
                            w.str(name);
                        }
                    }
                }
                match p.permissions {
                    None => w.0.push(0),
                    Some(perms) => {
                        w.0.push(1);
                        w.permissions(perms);
                    }
                }
                w.permissions(p.default_permissions);
                w.bytes(&p.content);
            }
            Op::DeleteDocument { uri } => {
                w.0.push(1);
                w.str(uri);
            }
            Op::PutRecord { table, key, value } => {
                w.0.push(2);
                w.0.push(table_byte(*table));
                w.str(key);
                w.bytes(value);
            }
            Op::DeleteRecord { table, key } => {
                w.0.push(3);
                w.0.push(table_byte(*table));
                w.str(key);
            }
            Op::ReplaceTable { table, entries } => {
                w.0.push(4);
                w.0.push(table_byte(*table));
                w.0.extend_from_slice(&(entries.len() as u32).to_le_bytes());
                for (k, v) in entries {
                    w.str(k);
                    w.bytes(v);
                }
            }
        }
    }
    w.0
}

struct Reader<'a> {
    bytes: &'a Bytes,
    pos: usize,
}

fn bad(what: &str) -> StoreError {
    StoreError::Corrupt(format!("log entry: {what}"))
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], StoreError> {
        let end = self.pos.checked_add(n).ok_or_else(|| bad("length"))?;
        let out = self
            .bytes
            .get(self.pos..end)
            .ok_or_else(|| bad("truncated"))?;
        self.pos = end;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<usize, StoreError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    /// A length-prefixed slice of the entry, shared rather than copied.
    fn bytes(&mut self) -> Result<Bytes, StoreError> {
        let n = self.u32()?;
        let start = self.pos;
        self.take(n)?;
        Ok(self.bytes.slice(start..start + n))
    }

    fn str(&mut self) -> Result<String, StoreError> {
        let n = self.u32()?;
        let b = self.take(n)?;
        std::str::from_utf8(b)
            .map(str::to_string)
            .map_err(|_| bad("text is not UTF-8"))
    }

    fn permissions(&mut self) -> Result<Permissions, StoreError> {
        let b = self.take(4)?;
        Ok(Permissions::from_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn table(&mut self) -> Result<Table, StoreError> {
        table_of(self.u8()?).ok_or_else(|| bad("unknown table"))
    }

    /// A count of items each at least `min` bytes long, bounded by what is left.
    fn count(&mut self, min: usize) -> Result<usize, StoreError> {
        let n = self.u32()?;
        if n.saturating_mul(min) > self.bytes.len() - self.pos {
            return Err(bad("count past the end"));
        }
        Ok(n)
    }
}

/// A log entry back into the writer and the operations.
pub fn decode(bytes: &Bytes) -> Result<(Caller, Vec<Op>), StoreError> {
    let mut r = Reader { bytes, pos: 0 };
    if r.u8()? != VERSION {
        return Err(bad("unknown version"));
    }
    let name_len = {
        let b = r.take(2)?;
        u16::from_le_bytes([b[0], b[1]]) as usize
    };
    let name = std::str::from_utf8(r.take(name_len)?)
        .map_err(|_| bad("caller is not UTF-8"))?
        .to_string();
    let caller = Caller::new(name, RoleSet::from_bits(r.u8()?));
    let count = r.count(1)?;
    let mut ops = Vec::with_capacity(count);
    for _ in 0..count {
        let op = match r.u8()? {
            0 => {
                let uri = r.str()?;
                let format = Format::from_u8(r.u8()?).ok_or_else(|| bad("format"))?;
                let collections = match r.u8()? {
                    0 => None,
                    _ => {
                        let n = r.count(4)?;
                        Some((0..n).map(|_| r.str()).collect::<Result<Vec<_>, _>>()?)
                    }
                };
                let permissions = match r.u8()? {
                    0 => None,
                    _ => Some(r.permissions()?),
                };
                let default_permissions = r.permissions()?;
                let content = r.bytes()?;
                Op::PutDocument(PutDocument {
                    uri,
                    content,
                    format,
                    collections,
                    permissions,
                    default_permissions,
                })
            }
            1 => Op::DeleteDocument { uri: r.str()? },
            2 => Op::PutRecord {
                table: r.table()?,
                key: r.str()?,
                value: r.bytes()?.to_vec(),
            },
            3 => Op::DeleteRecord {
                table: r.table()?,
                key: r.str()?,
            },
            4 => {
                let table = r.table()?;
                let n = r.count(8)?;
                let entries = (0..n)
                    .map(|_| Ok((r.str()?, r.bytes()?.to_vec())))
                    .collect::<Result<Vec<_>, StoreError>>()?;
                Op::ReplaceTable { table, entries }
            }
            _ => return Err(bad("unknown operation")),
        };
        ops.push(op);
    }
    if r.pos != bytes.len() {
        return Err(bad("bytes after the last operation"));
    }
    Ok((caller, ops))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{Capability, Role};

    fn sample() -> (Caller, Vec<Op>) {
        let mut perms = Permissions::new();
        perms.grant(Role::GeoReader, Capability::Read);
        let caller = Caller::new("writer", RoleSet::from_roles([Role::RestWriter]));
        let ops = vec![
            Op::PutDocument(PutDocument {
                uri: "/a/1.json".into(),
                content: Bytes::from_static(b"{\"x\":1}"),
                format: Format::Json,
                collections: Some(vec!["a".into(), "b".into()]),
                permissions: Some(perms),
                default_permissions: Permissions::document_default(),
            }),
            Op::PutDocument(PutDocument {
                uri: "/a/2.xml".into(),
                content: Bytes::from_static(b"<x/>"),
                format: Format::Xml,
                collections: None,
                permissions: None,
                default_permissions: Permissions::document_default(),
            }),
            Op::DeleteDocument { uri: "/b".into() },
            Op::PutRecord {
                table: Table::Users,
                key: "u".into(),
                value: b"{}".to_vec(),
            },
            Op::DeleteRecord {
                table: Table::Traces,
                key: "t".into(),
            },
            Op::ReplaceTable {
                table: Table::Flows,
                entries: vec![("k".into(), b"v".to_vec()), ("l".into(), Vec::new())],
            },
        ];
        (caller, ops)
    }

    #[test]
    fn an_entry_decodes_to_the_write_it_encodes() {
        let (caller, ops) = sample();
        let bytes = Bytes::from(encode(&caller, &ops));
        let (c, back) = decode(&bytes).unwrap();
        assert_eq!(c.name(), "writer");
        assert_eq!(c.roles(), caller.roles());
        assert_eq!(format!("{back:?}"), format!("{ops:?}"));
    }

    #[test]
    fn every_truncation_is_refused_not_a_panic() {
        let (caller, ops) = sample();
        let bytes = encode(&caller, &ops);
        for n in 0..bytes.len() {
            let cut = Bytes::copy_from_slice(&bytes[..n]);
            assert!(decode(&cut).is_err(), "a cut at {n} decoded");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode(&Bytes::from(long)).is_err());
    }
}
