//! The sections of a saved view's file: how each is written, and how each is read back in
//! place from the mapped file.
//!
//! Every section starts at a multiple of eight bytes in the file, and so does every array in
//! it, so that an array of the file is an array in memory ([`Paged`]): columns as their
//! values then a bit a row for which are present, string columns as their sorted values
//! ([`SortedStrings`]) then a number a row, documents as [`UriBlocks`], readers a byte a row,
//! points as two floats a row. Only what is not a fixed-size value a row is decoded into
//! memory: geometries other than points, and the diagnostics.

use std::sync::Arc;

use super::{Fault, Indexer, SavedDiagnostic};
use crate::paged::{Mapping, Paged};
use crate::paged::{align8, pad8, u64_at};
use crate::sorted::{SortedStrings, UriBlocks};
use crate::spatial::{Engine, EngineConfig};
use crate::strings::{DocIndex, StrColumn};
use crate::template::ViewDef;
use crate::view::{
    Bits, Column, Geometries, GeometryOut, GeometryRef, Ints, Listing, Nullable, ViewData,
};
use parking_lot::RwLock;

/// The sections of a view's file, in order.
#[derive(Clone, Copy, Debug)]
pub(super) enum Section {
    Documents,
    Readers,
    Column(usize),
    Geometry(usize),
    Diagnostics,
}

pub(super) fn sections(columns: usize, paths: usize) -> Vec<Section> {
    [Section::Documents, Section::Readers]
        .into_iter()
        .chain((0..columns).map(Section::Column))
        .chain((0..paths).map(Section::Geometry))
        .chain(std::iter::once(Section::Diagnostics))
        .collect()
}

/// Rows encoded under one hold of a view's read lock: a write to the view waits at most
/// that long while the view is saved.
const ROWS_PER_HOLD: usize = 1 << 13;

pub(super) fn put_u32(w: &mut Vec<u8>, v: u32) {
    w.extend_from_slice(&v.to_le_bytes());
}

pub(super) fn put_u64(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_le_bytes());
}

pub(super) fn put_bytes(w: &mut Vec<u8>, b: &[u8]) {
    put_u32(w, b.len() as u32);
    w.extend_from_slice(b);
}

/// Bytes being read back; every read is checked against what is left.
pub(super) struct Cursor<'a>(pub &'a [u8]);

impl<'a> Cursor<'a> {
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Fault> {
        if n > self.0.len() {
            return Err("truncated".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Fault> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    pub fn u8(&mut self) -> Result<u8, Fault> {
        Ok(self.take(1)?[0])
    }

    pub fn u32(&mut self) -> Result<u32, Fault> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, Fault> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn f64(&mut self) -> Result<f64, Fault> {
        Ok(f64::from_le_bytes(self.array()?))
    }

    fn bytes(&mut self) -> Result<&'a [u8], Fault> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn str(&mut self) -> Result<&'a str, Fault> {
        std::str::from_utf8(self.bytes()?).map_err(|_| "a string is not UTF-8".to_string())
    }

    /// A count of things each at least `min_bytes` long, no more than the bytes left hold.
    fn count(&mut self, min_bytes: usize) -> Result<usize, Fault> {
        let n = self.u64()?;
        if n.saturating_mul(min_bytes as u64) > self.0.len() as u64 {
            return Err("truncated (a count larger than its section)".into());
        }
        Ok(n as usize)
    }
}

/// A geometry section's kinds: points inline, or each row's geometry tagged.
const POINTS: u64 = 0;
const MIXED: u64 = 1;

/// What one section is encoded from.
pub(super) struct Source<'a> {
    pub view: &'a RwLock<ViewData>,
    pub listing: &'a Listing,
    /// Every listed document's slots, in the listing's order: the rows' order in the file.
    pub slots: &'a [u32],
    pub paths: &'a [&'a String],
    pub diagnostics: &'a [SavedDiagnostic],
    pub cancelled: &'a (dyn Fn() -> bool + Sync),
    /// How the points' index is saved beside them.
    pub engine: EngineConfig,
}

/// `values` then a bit a value for which are present, each eight-aligned.
fn put_nullable<T: bytemuck::Pod>(w: &mut Vec<u8>, values: &[T], present: &[u64]) {
    w.extend_from_slice(bytemuck::cast_slice(values));
    pad8(w);
    w.extend_from_slice(bytemuck::cast_slice(present));
}

/// Bits of `n` values, from which are present.
struct Presence(Vec<u64>);

impl Presence {
    fn new(n: usize) -> Presence {
        Presence(vec![0; n.div_ceil(64)])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
}

/// Visit the rows of `slots` a chunk at a time under the view's read lock.
fn each_chunk(
    src: &Source<'_>,
    mut f: impl FnMut(&ViewData, &[u32], usize),
) -> std::io::Result<()> {
    let mut at = 0;
    for chunk in src.slots.chunks(ROWS_PER_HOLD) {
        if (src.cancelled)() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                "the save was cancelled",
            ));
        }
        let data = src.view.read();
        f(&data, chunk, at);
        at += chunk.len();
        // Handed to a waiting write at once (see `Listing::of`).
        parking_lot::RwLockReadGuard::unlock_fair(data);
    }
    Ok(())
}

fn encode_documents(listing: &Listing, w: &mut Vec<u8>) {
    let docs = listing.iter().map(|(uri, _, slots)| {
        let [dir, rest] = uri.parts();
        ([dir.as_bytes(), rest.as_bytes()], slots.len() as u32)
    });
    UriBlocks::encode(docs, w);
}

fn encode_diagnostics(diagnostics: &[SavedDiagnostic], w: &mut Vec<u8>) {
    put_u64(w, diagnostics.len() as u64);
    for (uri, problem, skipped) in diagnostics {
        put_bytes(w, uri.as_bytes());
        put_bytes(w, problem.as_bytes());
        w.push(u8::from(*skipped));
    }
}

/// A string column: its values in byte order, then a number a row (`u32::MAX`: null).
fn encode_strings(src: &Source<'_>, i: usize, w: &mut Vec<u8>) -> std::io::Result<()> {
    // The column's value number -> its place among the values copied, or u32::MAX.
    let mut index: Vec<u32> = Vec::new();
    let (mut text, mut ends) = (String::new(), Vec::<usize>::new());
    let mut rows: Vec<u32> = Vec::with_capacity(src.slots.len());
    each_chunk(src, |data, chunk, _| {
        let Column::Str(v) = &data.columns[i] else {
            return;
        };
        for &s in chunk {
            rows.push(match v.code(s as usize) {
                None => u32::MAX,
                Some(c) => {
                    let c = c as usize;
                    if index.len() <= c {
                        index.resize(c + 1, u32::MAX);
                    }
                    if index[c] == u32::MAX {
                        index[c] = ends.len() as u32;
                        text.push_str(v.get(s as usize).unwrap_or_default());
                        ends.push(text.len());
                    }
                    index[c]
                }
            });
        }
    })?;
    let value = |k: usize| &text[if k == 0 { 0 } else { ends[k - 1] }..ends[k]];
    let mut order: Vec<u32> = (0..ends.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| value(a as usize).cmp(value(b as usize)));
    let mut rank = vec![0u32; order.len()];
    for (r, &k) in order.iter().enumerate() {
        rank[k as usize] = r as u32;
    }
    let sorted: Vec<&str> = order.iter().map(|&k| value(k as usize)).collect();
    SortedStrings::encode(&sorted, w);
    for r in rows.iter_mut() {
        if *r != u32::MAX {
            *r = rank[*r as usize];
        }
    }
    w.extend_from_slice(bytemuck::cast_slice(&rows));
    pad8(w);
    Ok(())
}

fn encode_column(src: &Source<'_>, i: usize, w: &mut Vec<u8>) -> std::io::Result<()> {
    let n = src.slots.len();
    let mut present = Presence::new(n);
    // Read apart: a guard of the match's own expression would be held through it.
    let kind = match &src.view.read().columns[i] {
        Column::Str(_) => None,
        Column::Int(_) => Some(0),
        Column::Date(_) => Some(1),
        Column::Float(_) => Some(2),
        Column::Bool(_) => Some(3),
    };
    let Some(kind) = kind else {
        return encode_strings(src, i, w);
    };
    match kind {
        0 | 1 => {
            let mut values = vec![0i64; n];
            each_chunk(src, |data, chunk, at| {
                for (k, &s) in chunk.iter().enumerate() {
                    if let Some(v) = data.columns[i].int_at(s as usize) {
                        values[at + k] = v;
                        present.set(at + k);
                    }
                }
            })?;
            // Integers four bytes a row while every one fits; dates always eight.
            let narrow = kind == 0 && values.iter().all(|&v| i32::try_from(v).is_ok());
            put_u64(w, if narrow { 4 } else { 8 });
            if narrow {
                let values: Vec<i32> = values.iter().map(|&v| v as i32).collect();
                put_nullable(w, &values, &present.0);
            } else {
                put_nullable(w, &values, &present.0);
            }
        }
        2 => {
            let mut values = vec![0f64; n];
            each_chunk(src, |data, chunk, at| {
                let Column::Float(c) = &data.columns[i] else {
                    return;
                };
                for (k, &s) in chunk.iter().enumerate() {
                    if let Some(v) = c.get(s as usize) {
                        values[at + k] = v;
                        present.set(at + k);
                    }
                }
            })?;
            put_nullable(w, &values, &present.0);
        }
        _ => {
            let mut values = vec![0u8; n];
            each_chunk(src, |data, chunk, at| {
                let Column::Bool(c) = &data.columns[i] else {
                    return;
                };
                for (k, &s) in chunk.iter().enumerate() {
                    if let Some(v) = c.get(s as usize) {
                        values[at + k] = u8::from(v != 0);
                        present.set(at + k);
                    }
                }
            })?;
            put_nullable(w, &values, &present.0);
        }
    }
    Ok(())
}

/// A geometry path: points inline while every row's is a point (or none), else each row's
/// tagged (0: none, 1: a point, 2: JSON).
fn encode_geometries(src: &Source<'_>, p: usize, w: &mut Vec<u8>) -> std::io::Result<()> {
    let (mut points, mut mixed) = (Vec::<[f64; 2]>::with_capacity(src.slots.len()), false);
    let mut tagged = Vec::new();
    each_chunk(src, |data, chunk, _| {
        let column = data.geometry_column(src.paths[p]);
        for &s in chunk {
            let g = column.get(s);
            if !mixed {
                match g {
                    None => points.push([f64::NAN, f64::NAN]),
                    Some(GeometryRef::Point(x, y)) => points.push([x, y]),
                    Some(GeometryRef::Json(_)) => {
                        // From here on tagged: the points so far first.
                        mixed = true;
                        for &[x, y] in &points {
                            if x.is_nan() {
                                tagged.push(0);
                            } else {
                                tagged.push(1);
                                tagged.extend_from_slice(&x.to_le_bytes());
                                tagged.extend_from_slice(&y.to_le_bytes());
                            }
                        }
                        points = Vec::new();
                    }
                }
            }
            if mixed {
                match g {
                    None => tagged.push(0),
                    Some(GeometryRef::Point(x, y)) => {
                        tagged.push(1);
                        tagged.extend_from_slice(&x.to_le_bytes());
                        tagged.extend_from_slice(&y.to_le_bytes());
                    }
                    Some(GeometryRef::Json(j)) => {
                        tagged.push(2);
                        put_bytes(&mut tagged, j);
                    }
                }
            }
        }
    })?;
    if mixed {
        put_u64(w, MIXED);
        w.extend_from_slice(&tagged);
    } else {
        put_u64(w, POINTS);
        w.extend_from_slice(bytemuck::cast_slice(&points));
        pad8(w);
        // Their index, so that a start need not build it.
        crate::spatial::saved::encode_points(src.engine, &points, w)
            .map_err(std::io::Error::other)?;
    }
    pad8(w);
    Ok(())
}

/// One section's bytes, eight-aligned at its end. Rows are read from the view a chunk at a
/// time; `Err` when the save is cancelled.
pub(super) fn encode(section: Section, src: &Source<'_>) -> std::io::Result<Vec<u8>> {
    let mut w = Vec::new();
    match section {
        Section::Documents => encode_documents(src.listing, &mut w),
        Section::Diagnostics => encode_diagnostics(src.diagnostics, &mut w),
        Section::Readers => {
            let mut readers = vec![0u8; src.slots.len()];
            each_chunk(src, |data, chunk, at| {
                for (k, &s) in chunk.iter().enumerate() {
                    readers[at + k] = data.reader_bits(s);
                }
            })?;
            w.extend_from_slice(&readers);
        }
        Section::Column(i) => encode_column(src, i, &mut w)?,
        Section::Geometry(p) => encode_geometries(src, p, &mut w)?,
    }
    pad8(&mut w);
    Ok(w)
}

/// What one section gives back.
pub(super) enum Decoded {
    Documents(Box<DocIndex>),
    Readers(Paged<u8>),
    Column(Column),
    Geometry(Geometries, Arc<Engine>),
    Diagnostics(Vec<SavedDiagnostic>),
}

/// Values at byte `at`, then their bits of presence; returns them and the byte after.
fn read_nullable<T: bytemuck::Pod + Default>(
    map: &Arc<Mapping>,
    at: usize,
    rows: usize,
) -> Result<(Nullable<T>, usize), Fault> {
    let bits_at = align8(at + rows * size_of::<T>());
    let words = rows.div_ceil(64);
    let out = Nullable {
        values: Paged::mapped(map, at, rows)?,
        present: Bits(Paged::mapped(map, bits_at, words)?),
    };
    Ok((out, bits_at + words * 8))
}

/// A geometry section, indexed as it is read.
fn decode_geometries(
    map: &Arc<Mapping>,
    (at, end): (usize, usize),
    rows: usize,
    index: &Indexer<'_>,
    engine: EngineConfig,
) -> Result<Decoded, Fault> {
    let bytes = map.bytes();
    match u64_at(bytes, at)? {
        POINTS => {
            let points: Paged<[f64; 2]> = Paged::mapped(map, at + 8, rows)?;
            let index_at = align8(at + 8 + rows * 16);
            let (saved, after) = crate::spatial::saved::read_points(engine, map, index_at, rows)?;
            if after != end {
                return Err("damaged (a geometry section's length)".into());
            }
            if let Some(saved) = saved {
                return Ok(Decoded::Geometry(
                    Geometries::Points(points),
                    Arc::new(saved),
                ));
            }
            // Saved for other spatial settings: indexed again.
            let items: Vec<(u32, geo::Geometry<f64>)> = points
                .iter()
                .enumerate()
                .filter(|(_, [x, _])| !x.is_nan())
                .map(|(s, &[x, y])| (s as u32, geo::Geometry::Point(geo::Point::new(x, y))))
                .collect();
            Ok(Decoded::Geometry(Geometries::Points(points), index(items)?))
        }
        MIXED => {
            let mut c = Cursor(&bytes[at + 8..end]);
            let mut out = Geometries::Mixed(Vec::with_capacity(rows));
            let mut items = Vec::with_capacity(rows);
            for slot in 0..rows as u32 {
                match c.u8()? {
                    0 => out.push(None),
                    1 => {
                        let (x, y) = (c.f64()?, c.f64()?);
                        out.push(Some(GeometryOut::Point(x, y)));
                        items.push((slot, geo::Geometry::Point(geo::Point::new(x, y))));
                    }
                    2 => {
                        let json = c.bytes()?;
                        let value: serde_json::Value = serde_json::from_slice(json)
                            .map_err(|e| format!("a saved geometry is not JSON: {e}"))?;
                        let g = crate::spatial::parse_geojson(&value)
                            .map_err(|e| format!("a saved geometry is not usable: {e}"))?;
                        out.push(Some(GeometryOut::Json(Arc::from(json))));
                        items.push((slot, g));
                    }
                    t => return Err(format!("unknown geometry tag {t}")),
                }
            }
            if c.0.iter().any(|&b| b != 0) {
                return Err("damaged (a section longer than its contents)".into());
            }
            Ok(Decoded::Geometry(out, index(items)?))
        }
        k => Err(format!("unknown geometry kind {k}")),
    }
}

fn decode_column(
    map: &Arc<Mapping>,
    (at, end): (usize, usize),
    def: &ViewDef,
    i: usize,
    rows: usize,
) -> Result<Decoded, Fault> {
    let kind = def
        .columns
        .get(i)
        .ok_or("damaged (a column the view has not)")?
        .scalar
        .kind();
    let bytes = map.bytes();
    let (column, after) = match Column::new(kind) {
        Column::Int(_) => match u64_at(bytes, at)? {
            4 => {
                let (v, after) = read_nullable::<i32>(map, at + 8, rows)?;
                (Column::Int(Ints::Narrow(v)), after)
            }
            8 => {
                let (v, after) = read_nullable::<i64>(map, at + 8, rows)?;
                (Column::Int(Ints::Wide(v)), after)
            }
            w => return Err(format!("damaged (integers {w} bytes wide)")),
        },
        Column::Date(_) => {
            if u64_at(bytes, at)? != 8 {
                return Err("damaged (dates not eight bytes wide)".into());
            }
            let (v, after) = read_nullable::<i64>(map, at + 8, rows)?;
            (Column::Date(v), after)
        }
        Column::Float(_) => {
            let (v, after) = read_nullable::<f64>(map, at, rows)?;
            (Column::Float(v), after)
        }
        Column::Bool(_) => {
            let (v, after) = read_nullable::<u8>(map, at, rows)?;
            (Column::Bool(v), after)
        }
        Column::Str(_) => {
            let (values, codes_at) = SortedStrings::read(map, at)?;
            let codes = Paged::mapped(map, codes_at, rows)?;
            let column = StrColumn::from_saved(values, codes)?;
            (Column::Str(Box::new(column)), codes_at + rows * 4)
        }
    };
    if align8(after) != end {
        return Err("damaged (a column's length)".into());
    }
    Ok(Decoded::Column(column))
}

/// Section `section`, at bytes `at..end` of `map` (its sum checked), read back in place.
pub(super) fn decode(
    section: Section,
    map: &Arc<Mapping>,
    (at, end): (usize, usize),
    (def, rows): (&ViewDef, usize),
    index: &Indexer<'_>,
    engine: EngineConfig,
) -> Result<Decoded, Fault> {
    match section {
        Section::Documents => {
            let (blocks, after) = UriBlocks::read(map, at)?;
            if after != end {
                return Err("damaged (the documents' length)".into());
            }
            Ok(Decoded::Documents(Box::new(DocIndex::from_saved(blocks))))
        }
        Section::Readers => {
            if align8(at + rows) != end {
                return Err("damaged (the readers' length)".into());
            }
            Ok(Decoded::Readers(Paged::mapped(map, at, rows)?))
        }
        Section::Column(i) => decode_column(map, (at, end), def, i, rows),
        Section::Geometry(_) => decode_geometries(map, (at, end), rows, index, engine),
        Section::Diagnostics => {
            let mut c = Cursor(&map.bytes()[at..end]);
            let n = c.count(9)?;
            let mut out = Vec::with_capacity(n);
            for _ in 0..n {
                let uri = c.str()?.to_string();
                let problem = c.str()?.to_string();
                out.push((uri, problem, c.u8()? != 0));
            }
            if c.0.iter().any(|&b| b != 0) {
                return Err("damaged (a section longer than its contents)".into());
            }
            Ok(Decoded::Diagnostics(out))
        }
    }
}
