//! Views saved to the data directory, so that a start reads them back instead of extracting
//! every stored document again.
//!
//! One file a view, `views/<schema.view>.seg` beside the store, written whole at a store
//! commit point (a clean stop) and replaced by a rename: its documents in URI order with
//! their readers, each row's cells and geometries, and the view's diagnostics, then a CRC-32
//! of everything before it. A start uses a file only when its checksum holds, its
//! fingerprint (the template's JSON, the geometry paths, the vertex bound, this format and
//! version) equals the view's, and the store recorded every document changed since its point;
//! those are then read again. Anything else is rebuilt from the documents.

use std::collections::BTreeMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use super::IndexItems;
use super::path::Path;
use super::template::{Cell, Template, ViewDef, ViewKey};
use super::view::{Column, GeometryOut, NewRow, ViewData};
use crate::acl::RoleSet;

/// Bumped whenever what a view holds for a document changes meaning.
const FORMAT: u32 = 1;
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

/// What a saved view must have been built from to be used as it is.
pub(super) fn fingerprint(
    template: &Template,
    def: &ViewDef,
    paths: &BTreeMap<String, Path>,
    max_vertices: usize,
) -> String {
    format!(
        "geoshard {} view format {FORMAT}\nview {}\npaths {:?}\nmax_document_vertices {max_vertices}\ntemplate {}",
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
    pub items: IndexItems,
    pub diagnostics: Vec<SavedDiagnostic>,
    pub point: u64,
}

/// A writer that keeps the CRC-32 of what passes through.
struct Summed<W> {
    inner: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Write for Summed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn put_u32(w: &mut impl Write, v: u32) -> std::io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

fn put_u64(w: &mut impl Write, v: u64) -> std::io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

fn put_bytes(w: &mut impl Write, b: &[u8]) -> std::io::Result<()> {
    put_u32(w, b.len() as u32)?;
    w.write_all(b)
}

/// One cell of `column` at `slot`: a tag, then the value.
fn put_cell(w: &mut impl Write, column: &Column, slot: usize) -> std::io::Result<()> {
    match column {
        Column::Int(v) => match v.get(slot).copied().flatten() {
            Some(i) => {
                w.write_all(&[1])?;
                w.write_all(&i.to_le_bytes())
            }
            None => w.write_all(&[0]),
        },
        Column::Float(v) => match v.get(slot).copied().flatten() {
            Some(f) => {
                w.write_all(&[2])?;
                w.write_all(&f.to_le_bytes())
            }
            None => w.write_all(&[0]),
        },
        Column::Str(v, _) => match v.get(slot).and_then(|s| s.as_deref()) {
            Some(s) => {
                w.write_all(&[3])?;
                put_bytes(w, s.as_bytes())
            }
            None => w.write_all(&[0]),
        },
        Column::Bool(v) => match v.get(slot).copied().flatten() {
            Some(b) => w.write_all(&[4, u8::from(b)]),
            None => w.write_all(&[0]),
        },
        Column::Date(v) => match v.get(slot).copied().flatten() {
            Some(d) => {
                w.write_all(&[5])?;
                w.write_all(&d.to_le_bytes())
            }
            None => w.write_all(&[0]),
        },
    }
}

fn put_geometry(w: &mut impl Write, g: Option<&GeometryOut>) -> std::io::Result<()> {
    match g {
        None => w.write_all(&[0]),
        Some(GeometryOut::Point(x, y)) => {
            w.write_all(&[1])?;
            w.write_all(&x.to_le_bytes())?;
            w.write_all(&y.to_le_bytes())
        }
        Some(GeometryOut::Json(j)) => {
            w.write_all(&[2])?;
            put_bytes(w, j)
        }
    }
}

/// Write `data` to `file` as of commit `point`: to a temporary file, synced, then renamed
/// over the old one, so a crash leaves the old file or the new one whole.
pub(super) fn save(
    file: &FsPath,
    data: &ViewData,
    paths: &BTreeMap<String, Path>,
    fingerprint: &str,
    point: u64,
    diagnostics: &[SavedDiagnostic],
) -> std::io::Result<()> {
    let tmp = file.with_extension("seg.tmp");
    let out = std::fs::File::create(&tmp)?;
    let mut w = Summed {
        inner: BufWriter::with_capacity(1 << 20, out),
        crc: crc32fast::Hasher::new(),
    };
    w.write_all(MAGIC)?;
    put_u32(&mut w, FORMAT)?;
    put_bytes(&mut w, fingerprint.as_bytes())?;
    put_u64(&mut w, point)?;
    let geometries: Vec<_> = paths.keys().map(|p| data.geometry_column(p)).collect();
    let docs = data.documents();
    put_u64(&mut w, docs.len() as u64)?;
    for (uri, slots) in docs {
        put_bytes(&mut w, uri.as_bytes())?;
        let readers = slots
            .first()
            .map_or(RoleSet::EMPTY, |s| data.readers_at(*s));
        w.write_all(&[readers.bits()])?;
        put_u32(&mut w, slots.len() as u32)?;
        for &slot in slots {
            for column in &data.columns {
                put_cell(&mut w, column, slot as usize)?;
            }
            for g in &geometries {
                put_geometry(&mut w, g.get(slot))?;
            }
        }
    }
    put_u64(&mut w, diagnostics.len() as u64)?;
    for (uri, problem, skipped) in diagnostics {
        put_bytes(&mut w, uri.as_bytes())?;
        put_bytes(&mut w, problem.as_bytes())?;
        w.write_all(&[u8::from(*skipped)])?;
    }
    w.write_all(END)?;
    let crc = w.crc.clone().finalize();
    let mut out = w.inner;
    out.write_all(&crc.to_le_bytes())?;
    let file_handle = out.into_inner().map_err(|e| e.into_error())?;
    file_handle.sync_all()?;
    drop(file_handle);
    std::fs::rename(&tmp, file)?;
    if let Some(parent) = file.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// A reader over a file's bytes that knows how many are left, so that no length read from a
/// damaged file makes it allocate more than the file holds.
struct Input<R> {
    inner: R,
    left: u64,
    crc: crc32fast::Hasher,
}

type Fault = String;

impl<R: Read> Input<R> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], Fault> {
        let mut b = [0u8; N];
        self.fill(&mut b)?;
        Ok(b)
    }

    fn fill(&mut self, b: &mut [u8]) -> Result<(), Fault> {
        if (b.len() as u64) > self.left {
            return Err("truncated".into());
        }
        self.inner
            .read_exact(b)
            .map_err(|e| format!("cannot be read: {e}"))?;
        self.left -= b.len() as u64;
        self.crc.update(b);
        Ok(())
    }

    fn u8(&mut self) -> Result<u8, Fault> {
        Ok(self.take::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, Fault> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, Fault> {
        Ok(u64::from_le_bytes(self.take()?))
    }

    fn f64(&mut self) -> Result<f64, Fault> {
        Ok(f64::from_le_bytes(self.take()?))
    }

    /// A count of things each at least `min_bytes` long.
    fn count(&mut self, n: u64, min_bytes: u64) -> Result<usize, Fault> {
        if n.saturating_mul(min_bytes) > self.left {
            return Err("truncated (a count larger than the file)".into());
        }
        Ok(n as usize)
    }

    fn bytes(&mut self) -> Result<Vec<u8>, Fault> {
        let n = self.u32()? as u64;
        let n = self.count(n, 1)?;
        let mut v = vec![0u8; n];
        self.fill(&mut v)?;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, Fault> {
        String::from_utf8(self.bytes()?).map_err(|_| "a string is not UTF-8".to_string())
    }
}

fn cell<R: Read>(input: &mut Input<R>) -> Result<Option<Cell>, Fault> {
    Ok(match input.u8()? {
        0 => None,
        1 => Some(Cell::Int(i64::from_le_bytes(input.take()?))),
        2 => Some(Cell::Float(input.f64()?)),
        3 => Some(Cell::Str(Arc::from(input.string()?))),
        4 => Some(Cell::Bool(input.u8()? != 0)),
        5 => Some(Cell::Date(i64::from_le_bytes(input.take()?))),
        t => return Err(format!("unknown cell tag {t}")),
    })
}

/// A saved geometry, and the same geometry for the index.
fn geometry<R: Read>(
    input: &mut Input<R>,
) -> Result<Option<(GeometryOut, geo::Geometry<f64>)>, Fault> {
    Ok(match input.u8()? {
        0 => None,
        1 => {
            let (x, y) = (input.f64()?, input.f64()?);
            Some((
                GeometryOut::Point(x, y),
                geo::Geometry::Point(geo::Point::new(x, y)),
            ))
        }
        2 => {
            let json = input.bytes()?;
            let value: serde_json::Value = serde_json::from_slice(&json)
                .map_err(|e| format!("a saved geometry is not JSON: {e}"))?;
            let g = crate::spatial::parse_geojson(&value)
                .map_err(|e| format!("a saved geometry is not usable: {e}"))?;
            Some((GeometryOut::Json(Arc::from(json)), g))
        }
        t => return Err(format!("unknown geometry tag {t}")),
    })
}

/// Read a saved view back, when its file is whole and was built from what `fingerprint`
/// says; `Err` says why not.
pub(super) fn load(
    file: &FsPath,
    def: Arc<ViewDef>,
    paths: &BTreeMap<String, Path>,
    fingerprint: &str,
) -> Result<Loaded, Fault> {
    let f = std::fs::File::open(file).map_err(|e| format!("cannot be opened: {e}"))?;
    let size = f
        .metadata()
        .map_err(|e| format!("cannot be read: {e}"))?
        .len();
    if size < (MAGIC.len() + END.len() + 4) as u64 {
        return Err("truncated".into());
    }
    let mut input = Input {
        inner: BufReader::with_capacity(1 << 20, f),
        left: size - 4,
        crc: crc32fast::Hasher::new(),
    };
    if &input.take::<8>()? != MAGIC {
        return Err("not a saved view".into());
    }
    let format = input.u32()?;
    if format != FORMAT {
        return Err(format!("format {format}, not {FORMAT}"));
    }
    if input.bytes()? != fingerprint.as_bytes() {
        return Err("built from another template, paths or version".into());
    }
    let point = input.u64()?;
    let mut data = ViewData::new(def.clone());
    let mut items: IndexItems = paths.keys().map(|p| (p.clone(), Vec::new())).collect();
    let path_names: Vec<&String> = paths.keys().collect();
    let n = input.u64()?;
    let docs = input.count(n, 9)?;
    for _ in 0..docs {
        let uri: Arc<str> = Arc::from(input.string()?);
        let readers = RoleSet::from_bits(input.u8()?);
        let n = input.u32()? as u64;
        let n = input.count(n, 1)?;
        let mut rows = Vec::with_capacity(n);
        let mut shapes = Vec::with_capacity(n);
        for _ in 0..n {
            let mut cells = Vec::with_capacity(def.columns.len());
            for _ in 0..def.columns.len() {
                cells.push(cell(&mut input)?);
            }
            let mut geometries = Vec::with_capacity(path_names.len());
            let mut indexed = Vec::new();
            for p in &path_names {
                match geometry(&mut input)? {
                    Some((out, g)) => {
                        geometries.push(((*p).clone(), Some(out)));
                        indexed.push(((*p).clone(), g));
                    }
                    None => geometries.push(((*p).clone(), None)),
                }
            }
            rows.push(NewRow { cells, geometries });
            shapes.push(indexed);
        }
        let slots = data.add_rows(&uri, readers, rows);
        for (slot, indexed) in slots.into_iter().zip(shapes) {
            for (p, g) in indexed {
                items.entry(p).or_default().push((slot, g));
            }
        }
    }
    let n = input.u64()?;
    let count = input.count(n, 9)?;
    let mut diagnostics = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let uri = input.string()?;
        let problem = input.string()?;
        let skipped = input.u8()? != 0;
        diagnostics.push((uri, problem, skipped));
    }
    if &input.take::<4>()? != END || input.left != 0 {
        return Err("damaged (its end is not where it should be)".into());
    }
    let computed = input.crc.clone().finalize();
    let mut stored = [0u8; 4];
    input
        .inner
        .read_exact(&mut stored)
        .map_err(|e| format!("cannot be read: {e}"))?;
    if u32::from_le_bytes(stored) != computed {
        return Err("damaged (its checksum does not match)".into());
    }
    Ok(Loaded {
        data,
        items,
        diagnostics,
        point,
    })
}
