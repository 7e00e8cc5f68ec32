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
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use super::paged::{self, Mapping, Paged};
use super::path::Path;
use super::strings::DocIndex;
use super::template::{Template, ViewDef, ViewKey};
use super::view::{Listing, ViewData};
use crate::acl::RoleSet;
use crate::spatial::{Engine, EngineConfig};
use parking_lot::RwLock;
use rayon::prelude::*;

mod sections;
use sections::{Cursor, Decoded, Section, Source, put_bytes, put_u32, put_u64, sections};

/// Bumped whenever what a view holds for a document changes meaning, or its layout.
const FORMAT: u32 = 5;
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
    /// The sections whose sums were left for later.
    pub unchecked: Unchecked,
}

/// Sections of a mapped view file whose sums are still to be checked: `(start, end, sum)`.
pub(crate) struct Unchecked {
    map: Arc<Mapping>,
    sections: Vec<(usize, usize, u32)>,
}

impl Unchecked {
    /// Check every section's sum, in parallel; `Err` says which failed.
    pub fn verify(&self) -> Result<(), Fault> {
        let bytes = self.map.bytes();
        self.sections
            .par_iter()
            .with_max_len(1)
            .try_for_each(|&(at, end, sum)| {
                if crc32fast::hash(&bytes[at..end]) == sum {
                    Ok(())
                } else {
                    Err(format!(
                        "damaged (the checksum of the section at byte {at} does not match)"
                    ))
                }
            })
    }

    pub fn is_empty(&self) -> bool {
        self.sections.is_empty()
    }

    /// Bytes still to check.
    pub fn bytes(&self) -> usize {
        self.sections.iter().map(|&(at, end, _)| end - at).sum()
    }
}

type Fault = String;

/// Builds a geometry path's index from its rows' geometries.
pub(super) type Indexer<'a> =
    dyn Fn(Vec<(u32, geo::Geometry<f64>)>) -> Result<Arc<Engine>, Fault> + Sync + 'a;

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
/// What a file is saved as: the view's fingerprint, the commit, and how its points are
/// indexed.
pub(super) struct Saving<'a> {
    pub fingerprint: &'a str,
    pub point: u64,
    pub engine: EngineConfig,
}

/// Rows past which a view's sections are encoded one at a time.
const ONE_SECTION_AT_A_TIME: usize = 4_000_000;

pub(super) fn save(
    file: &FsPath,
    view: &RwLock<ViewData>,
    paths: &BTreeMap<String, Path>,
    saving: &Saving<'_>,
    diagnostics: &[SavedDiagnostic],
    limits: &SaveLimits,
) -> std::io::Result<usize> {
    let (fingerprint, point) = (saving.fingerprint, saving.point);
    let room = limits.room;
    let listing = Listing::of(view);
    let slots: Vec<u32> = listing
        .iter()
        .flat_map(|(_, _, s)| s.iter().copied())
        .collect();
    let columns = view.read().columns.len();
    let path_names: Vec<&String> = paths.keys().collect();
    let all = sections(columns, path_names.len());
    let src = Source {
        view,
        listing: &listing,
        slots: &slots,
        paths: &path_names,
        diagnostics,
        cancelled: limits.cancelled,
        engine: saving.engine,
    };
    let mut head = Vec::new();
    head.extend_from_slice(MAGIC);
    put_u32(&mut head, FORMAT);
    put_bytes(&mut head, fingerprint.as_bytes());
    put_u64(&mut head, point);
    put_u64(&mut head, slots.len() as u64);
    put_u32(&mut head, all.len() as u32);
    let table_at = head.len();
    head.resize(table_at + all.len() * ENTRY + 4, 0);
    // Sections start eight-aligned, as their arrays are mapped in place.
    let first = paged::align8(head.len());
    let tmp = file.with_extension("seg.tmp");
    let written = (|| {
        let mut out = std::fs::File::create(&tmp)?;
        out.write_all(&head)?;
        out.write_all(&vec![0u8; first - head.len()])?;
        let mut offset = first as u64;
        let mut unsynced = 0;
        // A few sections at a time: as many as there are threads, not the whole file in
        // memory; a large view's one at a time, since one section is then gigabytes.
        let threads = match slots.len() > ONE_SECTION_AT_A_TIME {
            true => 1,
            false => rayon::current_num_threads().max(1),
        };
        for (chunk_at, chunk) in all.chunks(threads).enumerate() {
            let encoded: Vec<Vec<u8>> = chunk
                .par_iter()
                .map(|s| sections::encode(*s, &src))
                .collect::<std::io::Result<_>>()?;
            for (i, bytes) in encoded.iter().enumerate() {
                if !room(bytes.len() as u64) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::StorageFull,
                        "too little free disk: the store keeps min_free_disk_bytes",
                    ));
                }
                debug_assert!(bytes.len().is_multiple_of(8));
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

/// Read a saved view back, when its file is whole and was built from what `fingerprint`
/// says; `Err` says why not. The file is mapped, its head's sum checked and its sections'
/// places; the sums of sections up to `check_at_open` bytes are checked (in parallel), the
/// others' are left in [`Loaded::unchecked`], as Lucene checks a large file's footer at open
/// and its whole sum when it merges. Its arrays are then used in place, and each geometry
/// path indexed.
pub(super) fn load(
    file: &FsPath,
    def: Arc<ViewDef>,
    paths: &BTreeMap<String, Path>,
    fingerprint: &str,
    index: &Indexer<'_>,
    (engine, check_at_open): (EngineConfig, usize),
) -> Result<Loaded, Fault> {
    if cfg!(target_endian = "big") {
        return Err("saved views are little-endian; this machine is not".into());
    }
    let f = std::fs::File::open(file).map_err(|e| format!("cannot be opened: {e}"))?;
    let map = Mapping::open(&f).map_err(|e| format!("cannot be mapped: {e}"))?;
    let bytes = map.bytes();
    let size = bytes.len();
    // The head: magic, format, fingerprint, point, rows, the section table and its sum.
    let fixed = MAGIC.len() + 4 + 4;
    let start = bytes.get(..fixed).ok_or("truncated")?;
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
    let n = fixed + print_len + 8 + 8 + 4 + all.len() * ENTRY + 4;
    let head = bytes.get(..n).ok_or("truncated")?;
    if crc32fast::hash(&head[..n - 4]) != u32::from_le_bytes(head[n - 4..].try_into().expect("4")) {
        return Err("damaged (its head's checksum does not match)".into());
    }
    // The bytes between the head and the first section are zeros (no sum covers them).
    let mut next = paged::align8(n);
    if bytes
        .get(n..next)
        .is_none_or(|pad| pad.iter().any(|&b| b != 0))
    {
        return Err("damaged (its head's padding)".into());
    }
    let mut c = Cursor(&head[fixed..n - 4]);
    if c.take(print_len)? != fingerprint.as_bytes() {
        return Err("built from another template, paths or version".into());
    }
    let point = c.u64()?;
    let rows = c.u64()?;
    if c.u32()? as usize != all.len() || rows > size as u64 {
        return Err("damaged (its sections are not the view's)".into());
    }
    let rows = rows as usize;
    let mut table = Vec::with_capacity(all.len());
    for _ in 0..all.len() {
        let (offset, len, sum) = (c.u64()?, c.u64()?, c.u32()?);
        // In order, back to back, each eight-aligned: no two share a byte.
        if offset != next as u64 || !len.is_multiple_of(8) || len > (size - next) as u64 {
            return Err("damaged (a section out of place)".into());
        }
        next += len as usize;
        table.push((offset as usize, next, sum));
    }
    if bytes.get(next..) != Some(&END[..]) {
        return Err("damaged (its end is not where it should be)".into());
    }
    let (now, later): (Vec<_>, Vec<_>) = table
        .iter()
        .partition(|&&(at, end, _)| end - at <= check_at_open);
    Unchecked {
        map: map.clone(),
        sections: now,
    }
    .verify()?;
    // Geometries first, so that their indexes are built while the rest is read.
    let mut order: Vec<usize> = (0..all.len()).collect();
    order.sort_by_key(|&i| !matches!(all[i], Section::Geometry(_)));
    let mut decoded: Vec<(usize, Decoded)> = order
        .into_par_iter()
        .with_max_len(1)
        .map(|i| {
            let (at, end, _) = table[i];
            Ok((
                i,
                sections::decode(all[i], &map, (at, end), (&def, rows), index, engine)?,
            ))
        })
        .collect::<Result<_, Fault>>()?;
    map.read_at_random();
    decoded.sort_by_key(|(i, _)| *i);
    let mut columns = Vec::with_capacity(def.columns.len());
    let (mut docs, mut readers, mut geometries, mut indexes, mut diagnostics) = (
        DocIndex::default(),
        Paged::default(),
        crate::FastMap::default(),
        BTreeMap::new(),
        Vec::new(),
    );
    let mut names = path_names.iter();
    for (_, d) in decoded {
        match d {
            Decoded::Documents(d) => docs = *d,
            Decoded::Readers(r) => readers = r,
            Decoded::Column(column) => columns.push(column),
            Decoded::Geometry(out, engine) => {
                let name = names.next().expect("a section a path");
                geometries.insert((*name).clone(), out);
                indexes.insert((*name).clone(), engine);
            }
            Decoded::Diagnostics(d) => diagnostics = d,
        }
    }
    if docs.sizes().0 > rows || docs.numbers() as usize > rows {
        return Err("damaged (more documents than rows)".into());
    }
    // The rows of each set of readers.
    let mut counts = [0usize; 256];
    for &r in readers.iter() {
        counts[r as usize] += 1;
    }
    let reader_sets = (0..=255u8)
        .filter(|&r| counts[r as usize] > 0)
        .map(|r| (RoleSet::from_bits(r), counts[r as usize]))
        .collect();
    Ok(Loaded {
        data: ViewData::from_parts(def, columns, readers, reader_sets, docs, geometries),
        indexes,
        diagnostics,
        point,
        unchecked: Unchecked {
            map,
            sections: later,
        },
    })
}

#[cfg(test)]
mod tests;
