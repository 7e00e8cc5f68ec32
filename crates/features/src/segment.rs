//! Views saved to the data directory, so that a start reads them back instead of extracting
//! every stored document again.
//!
//! One file a view, `views/<schema.view>.seg` beside the store, written as of a store commit
//! point (at a clean stop, or while writes go on: see [`save`]) and replaced by a rename. It
//! is in sections, each with its CRC-32 in a table at the head, so that they are encoded and
//! read back in parallel: the documents in URI order (URI, readers, rows), one section a
//! column (strings as a dictionary and an index a row), one a geometry path, and the view's
//! diagnostics. A start uses a file only when its checksum holds, its fingerprint (the
//! template's JSON, the geometry paths, the vertex bound, this format and version) equals the
//! view's, and the store recorded every document changed since its point; those are then read
//! again. Anything else is rebuilt from the documents.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use super::path::Path;
use super::strings::{DocIndex, StrColumn};
use super::template::{Template, ViewDef, ViewKey};
use super::view::{Column, Geometries, GeometryOut, GeometryRef, Listing, ViewData};
use crate::acl::RoleSet;
use crate::spatial::Engine;
use parking_lot::RwLock;
use rayon::prelude::*;

/// Bumped whenever what a view holds for a document changes meaning.
const FORMAT: u32 = 3;
const MAGIC: &[u8; 8] = b"GSVIEWS\0";
const END: &[u8; 4] = b"END.";

/// The directory of saved views beside the store's file.
pub(super) fn dir(store_file: &FsPath) -> PathBuf {
    store_file.with_file_name("views")
}

/// A view's file name: its key with anything but `[a-z0-9_.-]` escaped.
pub(super) fn file_name(key: &ViewKey) -> String {
    let mut out = String::new();
    for b in key.to_string().bytes() {
        match b {
            b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02x}")),
        }
    }
    out.push_str(".seg");
    out
}

/// The file listing the templates and descriptors when the views were saved.
pub(super) const DEFINITIONS: &str = "definitions.json";

#[derive(serde::Serialize, serde::Deserialize)]
struct Definitions {
    point: u64,
    uris: Vec<String>,
}

/// Write the list of definition URIs as of commit `point`, whole or not at all.
pub(super) fn write_definitions(
    file: &FsPath,
    point: u64,
    uris: &[&String],
) -> std::io::Result<()> {
    let body = serde_json::to_vec(&Definitions {
        point,
        uris: uris.iter().map(|u| u.to_string()).collect(),
    })?;
    let tmp = file.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&body)?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)
}

/// The list written by [`write_definitions`], when it is there and whole.
pub(super) fn read_definitions(file: &FsPath) -> Option<(u64, Vec<String>)> {
    let bytes = std::fs::read(file).ok()?;
    let d: Definitions = serde_json::from_slice(&bytes).ok()?;
    Some((d.point, d.uris))
}

/// What a saved view must have been built from to be used as it is.
pub(super) fn fingerprint(
    template: &Template,
    def: &ViewDef,
    paths: &BTreeMap<String, Path>,
    max_vertices: usize,
    placement: &str,
) -> String {
    let placement = if placement.is_empty() {
        String::new()
    } else {
        format!("{placement}\n")
    };
    format!(
        "geoshard {} view format {FORMAT}\nview {}\npaths {:?}\nmax_document_vertices {max_vertices}\n{placement}template {}",
        env!("CARGO_PKG_VERSION"),
        def.key(),
        paths.keys().collect::<Vec<_>>(),
        template.source
    )
}

/// A view's problem with one document: URI, problem, rows skipped.
pub(super) type SavedDiagnostic = (String, String, bool);

/// A view read back: its rows, what its indexes hold, its diagnostics, and the commit it
/// was saved at.
pub(super) struct Loaded {
    pub data: ViewData,
    /// Each geometry path's index, built as soon as its section was read.
    pub indexes: BTreeMap<String, Arc<Engine>>,
    pub diagnostics: Vec<SavedDiagnostic>,
    pub point: u64,
}

type Fault = String;

/// Builds a geometry path's index from its rows' geometries.
pub(super) type Indexer<'a> =
    dyn Fn(Vec<(u32, geo::Geometry<f64>)>) -> Result<Arc<Engine>, Fault> + Sync + 'a;

fn put_u32(w: &mut Vec<u8>, v: u32) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_le_bytes());
}

/// LEB128: seven bits a byte, low first, the high bit set on every byte but the last.
fn put_varint(w: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        w.push(v as u8 | 0x80);
        v >>= 7;
    }
    w.push(v as u8);
}

fn put_bytes(w: &mut Vec<u8>, b: &[u8]) {
    put_u32(w, b.len() as u32);
    w.extend_from_slice(b);
}

/// A value that may be null: 0, or 1 and its bytes.
fn put_option<const N: usize>(w: &mut Vec<u8>, v: Option<[u8; N]>) {
    match v {
        Some(b) => {
            w.push(1);
            w.extend_from_slice(&b);
        }
        None => w.push(0),
    }
}

/// Bytes being read back; every read is checked against what is left.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Fault> {
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

    /// A tag byte (0: null), then the value when there is one.
    fn option_i64(&mut self) -> Result<Option<i64>, Fault> {
        Ok(match self.u8()? {
            0 => None,
            _ => Some(i64::from_le_bytes(self.array()?)),
        })
    }

    fn u8(&mut self) -> Result<u8, Fault> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, Fault> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A [`put_varint`] value that fits in a `u32`.
    fn varint(&mut self) -> Result<u32, Fault> {
        let mut v: u64 = 0;
        for i in 0..5 {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return u32::try_from(v).map_err(|_| "damaged (a number too large)".into());
            }
        }
        Err("damaged (a number too long)".into())
    }

    fn u64(&mut self) -> Result<u64, Fault> {
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

    fn end(&self) -> Result<(), Fault> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err("damaged (a section longer than its contents)".into())
        }
    }
}

/// The sections of a view's file, in order.
#[derive(Clone, Copy)]
enum Section {
    Documents,
    Column(usize),
    Geometry(usize),
    Diagnostics,
}

fn sections(columns: usize, paths: usize) -> Vec<Section> {
    std::iter::once(Section::Documents)
        .chain((0..columns).map(Section::Column))
        .chain((0..paths).map(Section::Geometry))
        .chain(std::iter::once(Section::Diagnostics))
        .collect()
}

/// Rows encoded under one hold of a view's read lock: a write to the view waits at most
/// that long while the view is saved.
const ROWS_PER_HOLD: usize = 1 << 13;

/// A string column's dictionary as it is encoded: the values in order of first use.
#[derive(Default)]
struct Dictionary {
    /// The column's value number -> its place in the dictionary, or `u32::MAX`.
    index: Vec<u32>,
    values: Vec<u8>,
    len: u64,
}

/// One section's bytes: documents (URI, readers, rows), a column's cells, a geometry path's
/// geometries (rows in the listing's order, which is document order), or the diagnostics.
/// Rows are read from `view` a chunk at a time; `Err` when `cancelled` says so.
/// The documents section: each URI, its readers and its number of rows.
fn encode_documents(listing: &Listing) -> Vec<u8> {
    let mut w = Vec::new();
    put_u64(&mut w, listing.len() as u64);
    // Each URI front-coded against the one before (they are in byte order): the bytes it
    // shares with it, then the rest.
    let (mut previous, mut current) = (Vec::new(), Vec::new());
    for (uri, readers, slots) in listing.iter() {
        current.clear();
        for part in uri.parts() {
            current.extend_from_slice(part.as_bytes());
        }
        let shared = previous
            .iter()
            .zip(&current)
            .take_while(|(a, b)| a == b)
            .count();
        put_varint(&mut w, shared as u64);
        put_varint(&mut w, (current.len() - shared) as u64);
        w.extend_from_slice(&current[shared..]);
        w.push(readers.bits());
        put_varint(&mut w, slots.len() as u64);
        std::mem::swap(&mut previous, &mut current);
    }
    w
}

/// The diagnostics section: each document's problem with the view.
fn encode_diagnostics(diagnostics: &[SavedDiagnostic]) -> Vec<u8> {
    let mut w = Vec::new();
    put_u64(&mut w, diagnostics.len() as u64);
    for (uri, problem, skipped) in diagnostics {
        put_bytes(&mut w, uri.as_bytes());
        put_bytes(&mut w, problem.as_bytes());
        w.push(u8::from(*skipped));
    }
    w
}

fn encode(
    section: Section,
    view: &RwLock<ViewData>,
    listing: &Listing,
    slots: &[u32],
    paths: &[&String],
    diagnostics: &[SavedDiagnostic],
    cancelled: &(dyn Fn() -> bool + Sync),
) -> std::io::Result<Vec<u8>> {
    let mut w = Vec::new();
    let mut dictionary = Dictionary::default();
    let mut rows: Vec<u32> = Vec::new();
    match section {
        Section::Documents => return Ok(encode_documents(listing)),
        Section::Diagnostics => return Ok(encode_diagnostics(diagnostics)),
        Section::Column(_) | Section::Geometry(_) => {}
    }
    let strings =
        matches!(section, Section::Column(i) if matches!(view.read().columns[i], Column::Str(_)));
    // Room for every row, made outside the lock (a point's size for geometries; JSON ones
    // grow it under the lock).
    if strings {
        rows.reserve(slots.len());
    } else {
        let per_row = if matches!(section, Section::Geometry(_)) {
            17
        } else {
            9
        };
        w.reserve(slots.len() * per_row);
    }
    for chunk in slots.chunks(ROWS_PER_HOLD) {
        if cancelled() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                "the save was cancelled",
            ));
        }
        let data = view.read();
        let slots = chunk.iter().map(|s| *s as usize);
        match section {
            Section::Column(i) => match &data.columns[i] {
                column @ (Column::Int(_) | Column::Date(_)) => {
                    for s in slots {
                        put_option(&mut w, column.int_at(s).map(i64::to_le_bytes));
                    }
                }
                Column::Float(v) => {
                    for s in slots {
                        put_option(&mut w, v.get(s).map(f64::to_le_bytes));
                    }
                }
                Column::Bool(v) => {
                    for s in slots {
                        w.push(v.get(s).map_or(0, |b| 1 + u8::from(b)));
                    }
                }
                Column::Str(v) => {
                    // The dictionary, then an index a row (u32::MAX: null), put together
                    // once every row is read.
                    let d = &mut dictionary;
                    for s in slots {
                        rows.push(match v.code(s) {
                            None => u32::MAX,
                            Some(c) => {
                                let c = c as usize;
                                if d.index.len() <= c {
                                    d.index.resize(c + 1, u32::MAX);
                                }
                                if d.index[c] == u32::MAX {
                                    d.index[c] = d.len as u32;
                                    d.len += 1;
                                    put_bytes(
                                        &mut d.values,
                                        v.get(s).unwrap_or_default().as_bytes(),
                                    );
                                }
                                d.index[c]
                            }
                        });
                    }
                }
            },
            Section::Geometry(p) => {
                let column = data.geometry_column(paths[p]);
                for s in slots {
                    match column.get(s as u32) {
                        None => w.push(0),
                        Some(GeometryRef::Point(x, y)) => {
                            w.push(1);
                            w.extend_from_slice(&x.to_le_bytes());
                            w.extend_from_slice(&y.to_le_bytes());
                        }
                        Some(GeometryRef::Json(j)) => {
                            w.push(2);
                            put_bytes(&mut w, j);
                        }
                    }
                }
            }
            Section::Documents | Section::Diagnostics => unreachable!("encoded above"),
        }
        // Handed to a waiting write at once (see `Listing::of`).
        parking_lot::RwLockReadGuard::unlock_fair(data);
    }
    if strings {
        put_u64(&mut w, dictionary.len);
        w.extend_from_slice(&dictionary.values);
        for r in rows {
            put_u32(&mut w, r);
        }
    }
    Ok(w)
}

/// Bytes of a view's file written between two syncs.
const SYNC_EVERY: usize = 16 << 20;

/// Size of one entry of the section table: offset, length, CRC-32.
const ENTRY: usize = 8 + 8 + 4;

/// What stops a save midway: `cancelled` (an `Interrupted` error), or no `room` on the disk
/// for the next piece of so many bytes (`StorageFull`).
pub(super) struct SaveLimits<'a> {
    pub cancelled: &'a (dyn Fn() -> bool + Sync),
    pub room: &'a dyn Fn(u64) -> bool,
}

/// Write `view` to `file` as of commit `point`: to a temporary file, synced, then renamed
/// over the old one, so a crash leaves the old file or the new one whole. Returns the rows
/// written.
///
/// Writes may go on meanwhile: the documents are listed at one moment and the rows read a
/// chunk at a time, so a row may hold a later write than the listing. Every such row belongs
/// to a document changed after `point`, which a start reads again anyway
/// ([`Features::catch_up`](super::Features)), replacing all of that document's rows.
pub(super) fn save(
    file: &FsPath,
    view: &RwLock<ViewData>,
    paths: &BTreeMap<String, Path>,
    fingerprint: &str,
    point: u64,
    diagnostics: &[SavedDiagnostic],
    limits: &SaveLimits,
) -> std::io::Result<usize> {
    let (cancelled, room) = (limits.cancelled, limits.room);
    let listing = Listing::of(view);
    let slots: Vec<u32> = listing
        .iter()
        .flat_map(|(_, _, s)| s.iter().copied())
        .collect();
    let columns = view.read().columns.len();
    let path_names: Vec<&String> = paths.keys().collect();
    let all = sections(columns, path_names.len());
    let mut head = Vec::new();
    head.extend_from_slice(MAGIC);
    put_u32(&mut head, FORMAT);
    put_bytes(&mut head, fingerprint.as_bytes());
    put_u64(&mut head, point);
    put_u64(&mut head, slots.len() as u64);
    put_u32(&mut head, all.len() as u32);
    let table_at = head.len();
    head.resize(table_at + all.len() * ENTRY + 4, 0);
    let tmp = file.with_extension("seg.tmp");
    let written = (|| {
        let mut out = std::fs::File::create(&tmp)?;
        out.write_all(&head)?;
        let mut offset = head.len() as u64;
        let mut unsynced = 0;
        let threads = rayon::current_num_threads().max(1);
        // A few sections at a time: as many as there are threads, not the whole file in memory.
        for (chunk_at, chunk) in all.chunks(threads).enumerate() {
            let encoded: Vec<Vec<u8>> = chunk
                .par_iter()
                .map(|s| {
                    encode(
                        *s,
                        view,
                        &listing,
                        &slots,
                        &path_names,
                        diagnostics,
                        cancelled,
                    )
                })
                .collect::<std::io::Result<_>>()?;
            for (i, bytes) in encoded.iter().enumerate() {
                if !room(bytes.len() as u64) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::StorageFull,
                        "too little free disk: the store keeps min_free_disk_bytes",
                    ));
                }
                let at = table_at + (chunk_at * threads + i) * ENTRY;
                head[at..at + 8].copy_from_slice(&offset.to_le_bytes());
                head[at + 8..at + 16].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
                head[at + 16..at + 20].copy_from_slice(&crc32fast::hash(bytes).to_le_bytes());
                // Synced as it goes: one sync of the whole file at the end would hold up the
                // store's own syncs, which wait for it on the same file system.
                for piece in bytes.chunks(SYNC_EVERY) {
                    out.write_all(piece)?;
                    unsynced += piece.len();
                    if unsynced >= SYNC_EVERY {
                        out.sync_data()?;
                        unsynced = 0;
                    }
                }
                offset += bytes.len() as u64;
            }
        }
        out.write_all(END)?;
        // The head, its table filled in, summed last.
        let sum = crc32fast::hash(&head[..head.len() - 4]);
        let n = head.len();
        head[n - 4..].copy_from_slice(&sum.to_le_bytes());
        out.seek(SeekFrom::Start(0))?;
        out.write_all(&head)?;
        out.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, file)?;
    if let Some(parent) = file.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(slots.len())
}

/// What one section gives back.
enum Decoded {
    Documents {
        docs: DocIndex,
        readers: Vec<RoleSet>,
    },
    Column(Column),
    Geometry(Geometries, Arc<Engine>),
    Diagnostics(Vec<SavedDiagnostic>),
}

/// The documents section: each URI with its readers and rows, numbered in order.
fn decode_documents(c: &mut Cursor<'_>, rows: usize) -> Result<Decoded, Fault> {
    let docs = c.count(4)?;
    let mut by_uri = DocIndex::default();
    by_uri.reserve(docs);
    let mut readers = Vec::with_capacity(rows);
    let mut slots: Vec<u32> = Vec::new();
    let mut uri = String::new();
    for i in 0..docs {
        let shared = c.varint()? as usize;
        let len = c.varint()? as usize;
        let rest = c.take(len)?;
        // Saved in the order of their bytes, each once: so listed, none needs looking up.
        // The URI is greater than the one before exactly when its own part starts with a
        // greater byte, or it follows the whole of the one before.
        let greater = match (uri.as_bytes().get(shared), rest.first()) {
            _ if i == 0 => shared == 0,
            _ if shared > uri.len() => false,
            (None, Some(_)) => true,
            (Some(before), Some(first)) => first > before,
            (_, None) => false,
        };
        if !greater || !uri.is_char_boundary(shared) {
            return Err("damaged (documents out of order, or listed twice)".into());
        }
        uri.truncate(shared);
        uri.push_str(std::str::from_utf8(rest).map_err(|_| "a URI is not UTF-8".to_string())?);
        let r = RoleSet::from_bits(c.u8()?);
        let n = c.varint()? as usize;
        let first = readers.len();
        if first + n > rows {
            return Err("damaged (more rows than the view holds)".into());
        }
        if n == 0 {
            return Err("damaged (a document without rows)".into());
        }
        readers.resize(first + n, r);
        slots.clear();
        slots.extend(first as u32..(first + n) as u32);
        by_uri.add_new(&uri, &slots);
    }
    if readers.len() != rows {
        return Err("damaged (fewer rows than the view holds)".into());
    }
    Ok(Decoded::Documents {
        docs: by_uri,
        readers,
    })
}

/// A geometry section, indexed as it is read.
fn decode_geometries(
    c: &mut Cursor<'_>,
    rows: usize,
    index: &Indexer<'_>,
) -> Result<Decoded, Fault> {
    let mut out = Geometries::default();
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
    // Indexed now, while the other sections are still being read.
    Ok(Decoded::Geometry(out, index(items)?))
}

fn decode(
    section: Section,
    bytes: &[u8],
    def: &ViewDef,
    rows: usize,
    index: &Indexer<'_>,
) -> Result<Decoded, Fault> {
    let mut c = Cursor(bytes);
    let decoded = match section {
        Section::Documents => decode_documents(&mut c, rows)?,
        Section::Column(i) => {
            let kind = def
                .columns
                .get(i)
                .ok_or("damaged (a column the view has not)")?
                .scalar
                .kind();
            let mut column = Column::new(kind);
            match &mut column {
                Column::Int(v) => {
                    v.reserve(rows);
                    for _ in 0..rows {
                        v.push(c.option_i64()?);
                    }
                }
                Column::Date(v) => {
                    v.reserve(rows);
                    for _ in 0..rows {
                        v.push(c.option_i64()?);
                    }
                }
                Column::Float(v) => {
                    v.reserve(rows);
                    for _ in 0..rows {
                        v.push(match c.u8()? {
                            0 => None,
                            _ => Some(c.f64()?),
                        });
                    }
                }
                Column::Bool(v) => {
                    v.reserve(rows);
                    for _ in 0..rows {
                        v.push(match c.u8()? {
                            0 => None,
                            b => Some(b == 2),
                        });
                    }
                }
                Column::Str(v) => {
                    let n = c.count(4)?;
                    let mut dictionary: Vec<&str> = Vec::with_capacity(n);
                    for _ in 0..n {
                        dictionary.push(c.str()?);
                    }
                    let codes = c.take(rows.checked_mul(4).ok_or("damaged (too many rows)")?)?;
                    *v = StrColumn::from_dictionary(
                        &dictionary,
                        codes
                            .chunks_exact(4)
                            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                    )
                    .map_err(|e| format!("damaged ({e})"))?;
                }
            }
            Decoded::Column(column)
        }
        Section::Geometry(_) => decode_geometries(&mut c, rows, index)?,
        Section::Diagnostics => {
            let n = c.count(9)?;
            let mut out = Vec::with_capacity(n);
            for _ in 0..n {
                let uri = c.str()?.to_string();
                let problem = c.str()?.to_string();
                out.push((uri, problem, c.u8()? != 0));
            }
            Decoded::Diagnostics(out)
        }
    };
    c.end()?;
    Ok(decoded)
}

/// One section's bytes, read from the file at `offset` and checked against its sum.
fn read_section(
    file: &FsPath,
    offset: u64,
    len: u64,
    sum: u32,
    size: u64,
) -> Result<Vec<u8>, Fault> {
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err("truncated".into());
    }
    let mut f = std::fs::File::open(file).map_err(|e| format!("cannot be opened: {e}"))?;
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("cannot be read: {e}"))?;
    let mut bytes = vec![0u8; len as usize];
    f.read_exact(&mut bytes)
        .map_err(|e| format!("cannot be read: {e}"))?;
    if crc32fast::hash(&bytes) != sum {
        return Err("damaged (a section's checksum does not match)".into());
    }
    Ok(bytes)
}

/// Read a saved view back, when its file is whole and was built from what `fingerprint`
/// says; `Err` says why not. Its sections are read and decoded in parallel.
pub(super) fn load(
    file: &FsPath,
    def: Arc<ViewDef>,
    paths: &BTreeMap<String, Path>,
    fingerprint: &str,
    index: &Indexer<'_>,
) -> Result<Loaded, Fault> {
    let mut f = std::fs::File::open(file).map_err(|e| format!("cannot be opened: {e}"))?;
    let size = f
        .metadata()
        .map_err(|e| format!("cannot be read: {e}"))?
        .len();
    // The head: magic, format, fingerprint, point, rows, the section table and its sum.
    let fixed = MAGIC.len() + 4 + 4;
    let mut start = vec![0u8; fixed];
    f.read_exact(&mut start)
        .map_err(|_| "truncated".to_string())?;
    if &start[..8] != MAGIC {
        return Err("not a saved view".into());
    }
    let format = u32::from_le_bytes(start[8..12].try_into().expect("4 bytes"));
    if format != FORMAT {
        return Err(format!("format {format}, not {FORMAT}"));
    }
    let print_len = u32::from_le_bytes(start[12..16].try_into().expect("4 bytes")) as usize;
    if print_len != fingerprint.len() {
        return Err("built from another template, paths or version".into());
    }
    let path_names: Vec<&String> = paths.keys().collect();
    let all = sections(def.columns.len(), path_names.len());
    let rest = print_len + 8 + 8 + 4 + all.len() * ENTRY + 4;
    let mut head = start;
    head.resize(fixed + rest, 0);
    f.read_exact(&mut head[fixed..])
        .map_err(|_| "truncated".to_string())?;
    let n = head.len();
    if crc32fast::hash(&head[..n - 4]) != u32::from_le_bytes(head[n - 4..].try_into().expect("4")) {
        return Err("damaged (its head's checksum does not match)".into());
    }
    let mut c = Cursor(&head[fixed..n - 4]);
    if c.take(print_len)? != fingerprint.as_bytes() {
        return Err("built from another template, paths or version".into());
    }
    let point = c.u64()?;
    let rows = c.u64()?;
    if c.u32()? as usize != all.len() || rows > size {
        return Err("damaged (its sections are not the view's)".into());
    }
    let rows = rows as usize;
    let mut table = Vec::with_capacity(all.len());
    for _ in 0..all.len() {
        table.push((c.u64()?, c.u64()?, c.u32()?));
    }
    let end = table.last().map_or(n as u64, |(o, l, _)| o + l);
    let mut tail = [0u8; END.len()];
    let tail_read = f
        .seek(SeekFrom::Start(end))
        .and_then(|_| f.read_exact(&mut tail));
    if end + END.len() as u64 != size || tail_read.is_err() || &tail != END {
        return Err("damaged (its end is not where it should be)".into());
    }
    // Geometries first, so that their indexes are built while the rest is read; then the
    // largest sections.
    let mut order: Vec<usize> = (0..all.len()).collect();
    order.sort_by_key(|&i| {
        let first = matches!(all[i], Section::Geometry(_));
        (!first, std::cmp::Reverse(table[i].1))
    });
    let mut decoded: Vec<(usize, Decoded)> = order
        .into_par_iter()
        .with_max_len(1)
        .map(|i| {
            let (offset, len, sum) = table[i];
            let bytes = read_section(file, offset, len, sum, size)?;
            Ok((i, decode(all[i], &bytes, &def, rows, index)?))
        })
        .collect::<Result<_, Fault>>()?;
    decoded.sort_by_key(|(i, _)| *i);
    let decoded = decoded.into_iter().map(|(_, d)| d);
    let mut columns = Vec::with_capacity(def.columns.len());
    let (mut docs, mut readers, mut geometries, mut indexes, mut diagnostics) = (
        DocIndex::default(),
        Vec::new(),
        crate::FastMap::default(),
        BTreeMap::new(),
        Vec::new(),
    );
    let mut names = path_names.iter();
    for d in decoded {
        match d {
            Decoded::Documents {
                docs: d,
                readers: r,
            } => (docs, readers) = (d, r),
            Decoded::Column(column) => columns.push(column),
            Decoded::Geometry(out, engine) => {
                let name = names.next().expect("a section a path");
                geometries.insert((*name).clone(), out);
                indexes.insert((*name).clone(), engine);
            }
            Decoded::Diagnostics(d) => diagnostics = d,
        }
    }
    Ok(Loaded {
        data: ViewData::from_parts(def, columns, readers, docs, geometries),
        indexes,
        diagnostics,
        point,
    })
}

#[cfg(test)]
mod tests;
