//! Immutable sorted tables of a saved view, read in place from its mapped file.
//!
//! - [`SortedStrings`]: a string column's values in byte order, each at a number, found by
//!   binary search.
//! - [`UriBlocks`]: a view's documents in URI order with their rows, front-coded in blocks
//!   of [`BLOCK`] (each block's first URI whole, so a binary search over blocks finds the one
//!   to decode), as SSTables keep their keys.
//!
//! Both are written by `encode` functions here and checked when read back ([`SortedStrings::read`],
//! [`UriBlocks::read`]); a file's sections are also summed (CRC-32) before any of this runs.

use std::ops::Range;
use std::sync::Arc;

use super::paged::{MappedStr, Mapping, Paged};
use super::paged::{align8, pad8, u64_at, usize_at};

type Fault = String;

/// Documents a block of [`UriBlocks`].
pub(crate) const BLOCK: usize = 16;

/// LEB128: seven bits a byte, low first, the high bit set on every byte but the last.
pub(crate) fn put_varint(w: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        w.push(v as u8 | 0x80);
        v >>= 7;
    }
    w.push(v as u8);
}

/// A [`put_varint`] value from the front of `b`, which moves past it.
fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    for i in 0..10 {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Where each string ends in the bytes: four bytes an end while the bytes are under 4 GiB.
#[derive(Debug, Default)]
enum Ends {
    #[default]
    None,
    Narrow(Paged<u32>),
    Wide(Paged<u64>),
}

/// Strings in byte order, numbered from 0: a saved string column's values.
#[derive(Debug, Default)]
pub(crate) struct SortedStrings {
    text: MappedStr,
    ends: Ends,
    len: usize,
}

impl SortedStrings {
    /// `values`, sorted and distinct, as [`SortedStrings::read`] reads them (eight-aligned).
    pub fn encode(values: &[&str], w: &mut Vec<u8>) {
        debug_assert!(values.windows(2).all(|p| p[0] < p[1]));
        let total: usize = values.iter().map(|s| s.len()).sum();
        let wide = total > u32::MAX as usize;
        w.extend_from_slice(&(values.len() as u64).to_le_bytes());
        w.extend_from_slice(&(total as u64).to_le_bytes());
        w.extend_from_slice(&u64::from(wide).to_le_bytes());
        let mut end = 0usize;
        for s in values {
            end += s.len();
            if wide {
                w.extend_from_slice(&(end as u64).to_le_bytes());
            } else {
                w.extend_from_slice(&(end as u32).to_le_bytes());
            }
        }
        pad8(w);
        for s in values {
            w.extend_from_slice(s.as_bytes());
        }
        pad8(w);
    }

    /// The table [`SortedStrings::encode`] wrote at byte `at` of `map`; returns it and the
    /// byte after it. Every string is checked to be UTF-8 on its own.
    pub fn read(map: &Arc<Mapping>, at: usize) -> Result<(SortedStrings, usize), Fault> {
        let b = map.bytes();
        let len = usize_at(b, at)?;
        let total = usize_at(b, at + 8)?;
        let wide = u64_at(b, at + 16)? != 0;
        let ends_at = at + 24;
        let width = if wide { 8 } else { 4 };
        let bytes_at = align8(
            len.checked_mul(width)
                .and_then(|n| n.checked_add(ends_at))
                .ok_or("damaged (a count)")?,
        );
        let end = align8(bytes_at.checked_add(total).ok_or("damaged (a length)")?);
        let ends = if wide {
            Ends::Wide(Paged::mapped(map, ends_at, len)?)
        } else {
            Ends::Narrow(Paged::mapped(map, ends_at, len)?)
        };
        let out = SortedStrings {
            text: MappedStr::mapped(map, bytes_at, total)?,
            ends,
            len,
        };
        let text = out.text.as_str();
        let mut start = 0;
        for i in 0..len {
            let e = out.end(i);
            if e < start || e > total || !text.is_char_boundary(e) {
                return Err("damaged (a value's end)".into());
            }
            start = e;
        }
        if start != total {
            return Err("damaged (values shorter than their bytes)".into());
        }
        Ok((out, end))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn end(&self, i: usize) -> usize {
        match &self.ends {
            Ends::None => 0,
            Ends::Narrow(e) => e[i] as usize,
            Ends::Wide(e) => e[i] as usize,
        }
    }

    /// String `i` (below [`SortedStrings::len`]).
    #[inline]
    pub fn get(&self, i: u32) -> &str {
        let i = i as usize;
        let start = if i == 0 { 0 } else { self.end(i - 1) };
        let end = self.end(i);
        // `read` checked that every end is a char boundary.
        self.text.as_str().get(start..end).unwrap_or_default()
    }

    /// The number of `s`, when it is here.
    pub fn find(&self, s: &str) -> Option<u32> {
        let (mut lo, mut hi) = (0usize, self.len);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.get(mid as u32).cmp(s) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid as u32),
            }
        }
        None
    }
}

/// A view's documents in URI order, each with its rows (consecutive slots, from 0 in
/// document order), front-coded in blocks of [`BLOCK`]; numbered from 0 in that order.
#[derive(Debug, Default)]
pub(crate) struct UriBlocks {
    docs: usize,
    /// Bytes of every URI, whole.
    uri_bytes: usize,
    /// Each block's start in `data`.
    starts: Paged<u64>,
    /// Each block's first slot.
    first_slots: Paged<u32>,
    data: Paged<u8>,
}

/// One document of a block, decoded.
pub(crate) struct BlockDoc<'k> {
    pub number: u32,
    pub uri: &'k str,
    pub slots: Range<u32>,
}

impl UriBlocks {
    /// `docs` (URIs in byte order, each listed once and given as two parts to join, with
    /// their rows' count) as [`UriBlocks::read`] reads them (eight-aligned).
    pub fn encode<'a>(docs: impl ExactSizeIterator<Item = ([&'a [u8]; 2], u32)>, w: &mut Vec<u8>) {
        let n = docs.len();
        let blocks = n.div_ceil(BLOCK);
        let head_at = w.len();
        w.resize(head_at + 32, 0);
        let starts_at = w.len();
        w.resize(starts_at + blocks * 8, 0);
        let slots_at = w.len();
        w.resize(align8(slots_at + blocks * 4), 0);
        let data_at = w.len();
        let (mut previous, mut slot, mut uri_bytes) = (Vec::<u8>::new(), 0u32, 0usize);
        let mut uri = Vec::<u8>::new();
        for (i, (parts, rows)) in docs.enumerate() {
            uri.clear();
            uri.extend_from_slice(parts[0]);
            uri.extend_from_slice(parts[1]);
            let shared = if i % BLOCK == 0 {
                let b = i / BLOCK;
                let start = (w.len() - data_at) as u64;
                w[starts_at + b * 8..starts_at + b * 8 + 8].copy_from_slice(&start.to_le_bytes());
                w[slots_at + b * 4..slots_at + b * 4 + 4].copy_from_slice(&slot.to_le_bytes());
                0
            } else {
                previous
                    .iter()
                    .zip(&uri)
                    .take_while(|(a, b)| a == b)
                    .count()
            };
            put_varint(w, shared as u64);
            put_varint(w, (uri.len() - shared) as u64);
            w.extend_from_slice(&uri[shared..]);
            put_varint(w, u64::from(rows));
            slot += rows;
            uri_bytes += uri.len();
            std::mem::swap(&mut previous, &mut uri);
        }
        let data_len = w.len() - data_at;
        pad8(w);
        for (k, v) in [n, blocks, uri_bytes, data_len].into_iter().enumerate() {
            w[head_at + k * 8..head_at + k * 8 + 8].copy_from_slice(&(v as u64).to_le_bytes());
        }
    }

    /// The table [`UriBlocks::encode`] wrote at byte `at` of `map`; returns it and the byte
    /// after it. Its blocks' bounds are checked here, their contents as they are decoded.
    pub fn read(map: &Arc<Mapping>, at: usize) -> Result<(UriBlocks, usize), Fault> {
        let b = map.bytes();
        let field = |k: usize| usize_at(b, at + k * 8);
        let (docs, blocks, uri_bytes, data_len) = (field(0)?, field(1)?, field(2)?, field(3)?);
        if docs.div_ceil(BLOCK) != blocks {
            return Err("damaged (documents and blocks disagree)".into());
        }
        let starts_at = at + 32;
        let slots_at = starts_at + blocks.checked_mul(8).ok_or("damaged (a count)")?;
        let data_at = align8(slots_at + blocks * 4);
        let end = align8(data_at.checked_add(data_len).ok_or("damaged (a length)")?);
        let out = UriBlocks {
            docs,
            uri_bytes,
            starts: Paged::mapped(map, starts_at, blocks)?,
            first_slots: Paged::mapped(map, slots_at, blocks)?,
            data: Paged::mapped(map, data_at, data_len)?,
        };
        for k in 0..blocks {
            let ordered = k == 0
                || (out.starts[k - 1] < out.starts[k]
                    && out.first_slots[k - 1] < out.first_slots[k]);
            if !ordered || out.starts[k] as usize >= data_len.max(1) {
                return Err("damaged (a block out of place)".into());
            }
        }
        Ok((out, end))
    }

    pub fn len(&self) -> usize {
        self.docs
    }

    pub fn uri_bytes(&self) -> usize {
        self.uri_bytes
    }

    /// Decode block `k`, calling `f` on each document until it returns `false`. A damaged
    /// block (never written so; the file's sum holds) ends early.
    fn decode(&self, k: usize, mut f: impl FnMut(BlockDoc<'_>) -> bool) {
        let data = self.data.as_slice();
        let start = self.starts[k] as usize;
        let end = self.starts.get(k + 1).map_or(data.len(), |&e| e as usize);
        let Some(mut b) = data.get(start..end) else {
            return;
        };
        let mut slot = self.first_slots[k];
        let mut key: Vec<u8> = Vec::new();
        let first = k * BLOCK;
        for number in first..(first + BLOCK).min(self.docs) {
            let (Some(shared), Some(len)) = (varint(&mut b), varint(&mut b)) else {
                return;
            };
            let (shared, len) = (shared as usize, len as usize);
            if shared > key.len() || len > b.len() {
                return;
            }
            key.truncate(shared);
            key.extend_from_slice(&b[..len]);
            b = &b[len..];
            let Some(rows) = varint(&mut b).and_then(|r| u32::try_from(r).ok()) else {
                return;
            };
            let Ok(uri) = std::str::from_utf8(&key) else {
                return;
            };
            let doc = BlockDoc {
                number: number as u32,
                uri,
                slots: slot..slot.saturating_add(rows),
            };
            slot = slot.saturating_add(rows);
            if !f(doc) {
                return;
            }
        }
    }

    /// Block `k`'s first URI (stored whole).
    fn first_uri(&self, k: usize) -> &[u8] {
        let data = self.data.as_slice();
        let mut b = data.get(self.starts[k] as usize..).unwrap_or_default();
        let _shared = varint(&mut b);
        let len = varint(&mut b).unwrap_or(0) as usize;
        b.get(..len).unwrap_or_default()
    }

    /// `uri`'s number and slots, when it is here.
    pub fn find(&self, uri: &str) -> Option<(u32, Range<u32>)> {
        let blocks = self.starts.len();
        // The last block whose first URI is not past `uri`.
        let k = {
            let (mut lo, mut hi) = (0usize, blocks);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if self.first_uri(mid) <= uri.as_bytes() {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            lo.checked_sub(1)?
        };
        let mut found = None;
        self.decode(k, |d| match d.uri.cmp(uri) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Equal => {
                found = Some((d.number, d.slots));
                false
            }
            std::cmp::Ordering::Greater => false,
        });
        found
    }

    /// Each document numbered in `range`, in order.
    pub fn each_in(&self, range: Range<u32>, mut f: impl FnMut(BlockDoc<'_>)) {
        let end = (range.end as usize).min(self.docs);
        let start = range.start as usize;
        if start >= end {
            return;
        }
        for k in start / BLOCK..end.div_ceil(BLOCK) {
            self.decode(k, |d| {
                let n = d.number as usize;
                if n >= start && n < end {
                    f(d);
                }
                true
            });
        }
    }
}
