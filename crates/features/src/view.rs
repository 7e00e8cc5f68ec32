//! Views in memory: typed columns, one row per slot, and what the query path needs beside
//! them (each row's document, that document's readers, and the row's geometry per layer
//! path).
//!
//! A slot is a row's number in its view and its feature id in the view's spatial indexes.
//! Slots are reused after a row dies, but only after the spatial indexes have dropped it, so
//! a query can never see a reused slot with an old geometry.

use std::sync::Arc;

use super::paged::Paged;
use super::strings::{DocIndex, DocList, StrColumn, Uri};
use super::template::{Cell, Kind, ViewDef};
use super::where_clause::{Datum, Row};
use crate::acl::{Caller, Permissions, RoleSet};

/// One bit a slot.
#[derive(Debug, Default, Clone)]
pub struct Bits(pub(crate) Paged<u64>);

impl Bits {
    /// `n` bits, all set.
    pub(crate) fn all(n: usize) -> Bits {
        let mut words = vec![u64::MAX; n.div_ceil(64)];
        if let Some(last) = words.last_mut()
            && !n.is_multiple_of(64)
        {
            *last = (1 << (n % 64)) - 1;
        }
        Bits(Paged::from_vec(words))
    }

    #[inline]
    pub fn get(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    pub fn set(&mut self, i: usize, on: bool) {
        if self.0.len() <= i / 64 {
            self.0.resize(i / 64 + 1, 0);
        }
        let bit = 1u64 << (i % 64);
        if on {
            self.0[i / 64] |= bit;
        } else {
            self.0[i / 64] &= !bit;
        }
    }

    /// The set bits, ascending.
    fn ones(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &word)| {
            let mut word = word;
            std::iter::from_fn(move || {
                (word != 0).then(|| {
                    let b = word.trailing_zeros() as usize;
                    word &= word - 1;
                    w * 64 + b
                })
            })
        })
    }
}

/// Values of a fixed size, with a bit a row saying which are present (not null).
#[derive(Debug, Default)]
pub struct Nullable<T: bytemuck::Pod> {
    pub(crate) values: Paged<T>,
    pub(crate) present: Bits,
}

impl<T: bytemuck::Pod + Default> Nullable<T> {
    #[inline]
    pub fn get(&self, slot: usize) -> Option<T> {
        self.present.get(slot).then(|| self.values[slot])
    }

    pub fn set(&mut self, slot: usize, value: Option<T>) {
        if self.values.len() <= slot {
            self.values.resize(slot + 1, T::default());
        }
        self.values[slot] = value.unwrap_or_default();
        self.present.set(slot, value.is_some());
    }

    /// Append a row (a column read back in slot order).
    pub fn push(&mut self, value: Option<T>) {
        let slot = self.values.len();
        self.set(slot, value);
    }

    pub fn reserve(&mut self, rows: usize) {
        self.values.reserve(rows);
        self.present.0.reserve(rows / 64 + 1);
    }
}

/// An integer column: four bytes a row while every value fits (ids, counts, populations),
/// eight from the first that does not.
#[derive(Debug)]
pub enum Ints {
    Narrow(Nullable<i32>),
    Wide(Nullable<i64>),
}

impl Default for Ints {
    fn default() -> Ints {
        Ints::Narrow(Nullable::default())
    }
}

impl Ints {
    #[inline]
    pub fn get(&self, slot: usize) -> Option<i64> {
        match self {
            Ints::Narrow(v) => v.get(slot).map(i64::from),
            Ints::Wide(v) => v.get(slot),
        }
    }

    pub fn set(&mut self, slot: usize, value: Option<i64>) {
        if let Ints::Narrow(v) = self {
            match value.map(i32::try_from) {
                None => return v.set(slot, None),
                Some(Ok(n)) => return v.set(slot, Some(n)),
                Some(Err(_)) => {
                    let wide = Nullable {
                        values: Paged::from_vec(v.values.iter().map(|&n| i64::from(n)).collect()),
                        present: std::mem::take(&mut v.present),
                    };
                    *self = Ints::Wide(wide);
                }
            }
        }
        if let Ints::Wide(v) = self {
            v.set(slot, value);
        }
    }

    pub fn push(&mut self, value: Option<i64>) {
        let slot = match self {
            Ints::Narrow(v) => v.values.len(),
            Ints::Wide(v) => v.values.len(),
        };
        self.set(slot, value);
    }

    pub fn reserve(&mut self, rows: usize) {
        match self {
            Ints::Narrow(v) => v.reserve(rows),
            Ints::Wide(v) => v.reserve(rows),
        }
    }
}

/// One column's values, indexed by slot.
#[derive(Debug)]
pub enum Column {
    Int(Ints),
    Float(Nullable<f64>),
    /// Strings as a dictionary: real columns repeat (country codes, types).
    Str(Box<StrColumn>),
    /// 0 or 1 (a byte, so that any byte of a mapped file is a valid value).
    Bool(Nullable<u8>),
    Date(Nullable<i64>),
}

impl Column {
    pub(crate) fn new(kind: Kind) -> Column {
        match kind {
            Kind::Int => Column::Int(Ints::default()),
            Kind::Float => Column::Float(Nullable::default()),
            Kind::Str => Column::Str(Box::default()),
            Kind::Bool => Column::Bool(Nullable::default()),
            Kind::Date => Column::Date(Nullable::default()),
        }
    }

    fn set(&mut self, slot: usize, cell: Option<Cell>) {
        match (self, cell) {
            (Column::Int(v), Some(Cell::Int(i))) => v.set(slot, Some(i)),
            (Column::Float(v), Some(Cell::Float(f))) => v.set(slot, Some(f)),
            (Column::Str(v), Some(Cell::Str(s))) => v.set(slot, Some(&s)),
            (Column::Bool(v), Some(Cell::Bool(b))) => v.set(slot, Some(u8::from(b))),
            (Column::Date(v), Some(Cell::Date(d))) => v.set(slot, Some(d)),
            (Column::Int(v), _) => v.set(slot, None),
            (Column::Date(v), _) => v.set(slot, None),
            (Column::Float(v), _) => v.set(slot, None),
            (Column::Str(v), _) => v.set(slot, None),
            (Column::Bool(v), _) => v.set(slot, None),
        }
    }

    /// An integer or date column's value.
    pub(crate) fn int_at(&self, slot: usize) -> Option<i64> {
        match self {
            Column::Int(v) => v.get(slot),
            Column::Date(v) => v.get(slot),
            _ => None,
        }
    }

    #[inline]
    pub fn get(&self, slot: usize) -> Datum<'_> {
        match self {
            Column::Int(v) => v.get(slot).map_or(Datum::Null, Datum::Int),
            Column::Float(v) => v.get(slot).map_or(Datum::Null, Datum::Float),
            Column::Str(v) => v
                .get(slot)
                .map_or(Datum::Null, |s| Datum::Str(std::borrow::Cow::Borrowed(s))),
            Column::Bool(v) => v.get(slot).map_or(Datum::Null, |b| Datum::Bool(b != 0)),
            Column::Date(v) => v.get(slot).map_or(Datum::Null, Datum::Date),
        }
    }
}

/// A geometry as the response writes it: points are re-formatted (exactly: shortest
/// round-trip form), anything else is kept as its JSON text, written once per document.
#[derive(Debug, Clone)]
pub enum GeometryOut {
    Point(f64, f64),
    Json(Arc<[u8]>),
}

impl GeometryOut {
    pub fn as_ref(&self) -> GeometryRef<'_> {
        match self {
            GeometryOut::Point(x, y) => GeometryRef::Point(*x, *y),
            GeometryOut::Json(j) => GeometryRef::Json(j),
        }
    }
}

/// A geometry as the response reads it from a view.
#[derive(Debug, Clone, Copy)]
pub enum GeometryRef<'v> {
    Point(f64, f64),
    Json(&'v [u8]),
}

/// One geometry path's geometries, by slot: coordinates inline while every geometry is a
/// point (a point layer), each row's [`GeometryOut`] once another kind comes.
#[derive(Debug)]
pub enum Geometries {
    /// `[NaN, NaN]`: no geometry (JSON has no NaN, so no point is ever that).
    Points(Paged<[f64; 2]>),
    Mixed(Vec<Option<GeometryOut>>),
}

const NO_POINT: [f64; 2] = [f64::NAN, f64::NAN];

impl Default for Geometries {
    fn default() -> Geometries {
        Geometries::Points(Paged::default())
    }
}

impl Geometries {
    #[inline]
    pub fn get(&self, slot: usize) -> Option<GeometryRef<'_>> {
        match self {
            Geometries::Points(v) => {
                let [x, y] = *v.get(slot)?;
                (!x.is_nan()).then_some(GeometryRef::Point(x, y))
            }
            Geometries::Mixed(v) => v.get(slot)?.as_ref().map(GeometryOut::as_ref),
        }
    }

    pub fn set(&mut self, slot: usize, g: Option<GeometryOut>) {
        if let (Geometries::Points(v), Some(GeometryOut::Json(_))) = (&*self, &g) {
            let mixed = v
                .iter()
                .map(|&[x, y]| (!x.is_nan()).then_some(GeometryOut::Point(x, y)))
                .collect();
            *self = Geometries::Mixed(mixed);
        }
        match self {
            Geometries::Points(v) => {
                if v.len() <= slot {
                    v.resize(slot + 1, NO_POINT);
                }
                v[slot] = match g {
                    Some(GeometryOut::Point(x, y)) => [x, y],
                    _ => NO_POINT,
                };
            }
            Geometries::Mixed(v) => {
                if v.len() <= slot {
                    v.resize(slot + 1, None);
                }
                v[slot] = g;
            }
        }
    }

    /// Append a row (a column read back in slot order).
    pub fn push(&mut self, g: Option<GeometryOut>) {
        let slot = match self {
            Geometries::Points(v) => v.len(),
            Geometries::Mixed(v) => v.len(),
        };
        self.set(slot, g);
    }
}

/// The rows of one view.
#[derive(Debug)]
pub struct ViewData {
    pub def: Arc<ViewDef>,
    pub columns: Vec<Column>,
    live: Bits,
    /// The readers of each row's document (effective roles holding `read`), as
    /// [`RoleSet::bits`].
    readers: Paged<u8>,
    /// Slots of each document's rows.
    docs: DocIndex,
    /// Dead slots whose removal from the spatial indexes is done; ready for reuse.
    free: Vec<u32>,
    /// Geometry of each row, per layer geometry path.
    pub geometries: crate::FastMap<String, Geometries>,
    rows: usize,
    /// Live rows per set of readers (a handful of sets per view): whether a caller may read
    /// every row, which lets it see the index's own extent.
    reader_sets: Vec<(RoleSet, usize)>,
    /// Bumped by every change of rows, and again once the indexes have followed it
    /// ([`ViewData::release`]): what a cached extent was computed at.
    version: u64,
    /// Extents of the rows some set of roles may read, by geometry path and role bits, at
    /// the version they were computed at: for callers who may read only some of the rows.
    extents: parking_lot::Mutex<ExtentCache>,
}

/// One geometry path's geometries, by slot.
#[derive(Clone, Copy)]
pub(crate) struct GeometryColumn<'v>(Option<&'v Geometries>);

impl<'v> GeometryColumn<'v> {
    #[inline]
    pub fn get(self, slot: u32) -> Option<GeometryRef<'v>> {
        self.0?.get(slot as usize)
    }
}

/// A row to add: its cells, and its geometry per geometry path.
#[derive(Clone)]
pub(crate) struct NewRow {
    pub cells: Vec<Option<Cell>>,
    pub geometries: Vec<(String, Option<GeometryOut>)>,
}

impl ViewData {
    pub fn new(def: Arc<ViewDef>) -> ViewData {
        let columns = def
            .columns
            .iter()
            .map(|c| Column::new(c.scalar.kind()))
            .collect();
        ViewData {
            def,
            columns,
            live: Bits::default(),
            readers: Paged::default(),
            docs: DocIndex::default(),
            free: Vec::new(),
            geometries: crate::FastMap::default(),
            rows: 0,
            reader_sets: Vec::new(),
            version: 0,
            extents: Default::default(),
        }
    }

    /// A view read back whole: every row live, slots in document order; `reader_sets`
    /// counts the rows of each set of readers.
    pub(crate) fn from_parts(
        def: Arc<ViewDef>,
        columns: Vec<Column>,
        readers: Paged<u8>,
        reader_sets: Vec<(RoleSet, usize)>,
        docs: DocIndex,
        geometries: crate::FastMap<String, Geometries>,
    ) -> ViewData {
        let rows = readers.len();
        ViewData {
            def,
            columns,
            live: Bits::all(rows),
            readers,
            docs,
            free: Vec::new(),
            geometries,
            rows,
            reader_sets,
            version: 0,
            extents: Default::default(),
        }
    }

    /// Whether `caller` may read every live row.
    pub(crate) fn all_readable_by(&self, caller: &Caller) -> bool {
        self.reader_sets
            .iter()
            .all(|&(r, n)| n == 0 || Permissions::readable_by(r, caller.roles()))
    }

    /// The extent of the rows `caller` may read at geometry path `path`, from `index`: the
    /// index's own when every row is readable, else a walk of the readable rows' entries,
    /// kept until the rows change.
    pub(crate) fn readable_extent(
        &self,
        caller: &Caller,
        path: &str,
        index: &crate::spatial::Engine,
    ) -> Option<crate::spatial::pip::BBox> {
        if self.all_readable_by(caller) {
            return index.extent();
        }
        let key = (path.to_string(), caller.roles().bits());
        if let Some(&(at, extent)) = self.extents.lock().get(&key)
            && at == self.version
        {
            return extent;
        }
        let extent = index.extent_admitted(&|slot| self.readable(caller, slot));
        let mut cache = self.extents.lock();
        // Role bits are seven: at most 128 sets a path.
        cache.insert(key, (self.version, extent));
        extent
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    #[inline]
    pub(crate) fn is_live(&self, slot: u32) -> bool {
        self.live.get(slot as usize)
    }

    /// Whether `caller` may read the document behind a row: checked for every row a query
    /// returns, here where the rows are, so no query path can skip it.
    #[inline]
    pub fn readable(&self, caller: &Caller, slot: u32) -> bool {
        self.is_live(slot)
            && self
                .readers
                .get(slot as usize)
                .is_some_and(|r| Permissions::readable_by(RoleSet::from_bits(*r), caller.roles()))
    }

    pub(crate) fn slots_of(&self, uri: &str) -> std::borrow::Cow<'_, [u32]> {
        self.docs.get(uri)
    }

    /// Add a document's rows; returns their slots.
    pub(crate) fn add_rows(&mut self, uri: &str, readers: RoleSet, rows: Vec<NewRow>) -> Vec<u32> {
        let mut slots = Vec::with_capacity(rows.len());
        for row in rows {
            let slot = match self.free.pop() {
                Some(s) => s,
                None => self.readers.len() as u32,
            };
            let s = slot as usize;
            if self.readers.len() <= s {
                self.readers.resize(s + 1, 0);
            }
            for (col, cell) in self.columns.iter_mut().zip(row.cells) {
                col.set(s, cell);
            }
            for (path, g) in row.geometries {
                self.geometries.entry(path).or_default().set(s, g);
            }
            self.live.set(s, true);
            self.readers[s] = readers.bits();
            self.rows += 1;
            slots.push(slot);
        }
        count_readers(&mut self.reader_sets, readers, slots.len() as isize);
        self.version += 1;
        let mut all: Vec<u32> = self.slots_of(uri).to_vec();
        all.extend(&slots);
        self.docs.set(uri, &all);
        slots
    }

    /// Mark a document's rows dead; returns their slots (to drop from the spatial indexes,
    /// then hand back with [`ViewData::release`]).
    pub(crate) fn kill_rows(&mut self, uri: &str) -> Vec<u32> {
        let slots = self.docs.remove(uri);
        self.version += 1;
        for &s in slots.iter() {
            let s = s as usize;
            if self.live.get(s) {
                let r = RoleSet::from_bits(self.readers[s]);
                count_readers(&mut self.reader_sets, r, -1);
            }
            self.live.set(s, false);
            for col in &mut self.columns {
                col.set(s, None);
            }
            for g in self.geometries.values_mut() {
                g.set(s, None);
            }
            self.rows -= 1;
        }
        slots
    }

    /// Slots that no index refers to any more may be reused.
    pub fn release(&mut self, slots: &[u32]) {
        self.free.extend_from_slice(slots);
        // The indexes have followed the last change: extents computed before are stale.
        self.version += 1;
    }

    /// The readers of a row's document, as [`RoleSet::bits`].
    pub(crate) fn reader_bits(&self, slot: u32) -> u8 {
        self.readers.get(slot as usize).copied().unwrap_or(0)
    }

    /// The id (OBJECTID) of a row.
    #[inline]
    pub(crate) fn id_of(&self, slot: u32) -> Option<i64> {
        match &self.columns[self.def.id_column] {
            Column::Int(v) => v.get(slot as usize),
            _ => None,
        }
    }

    /// The geometries of every slot at `path`: one lookup for a whole page of rows.
    pub(crate) fn geometry_column(&self, path: &str) -> GeometryColumn<'_> {
        GeometryColumn(self.geometries.get(path))
    }

    /// Every live slot, ascending.
    pub(crate) fn live_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.live.ones().map(|s| s as u32)
    }

    /// A row as the `where` evaluator reads it.
    pub fn row(&self, slot: u32) -> RowRef<'_> {
        RowRef { view: self, slot }
    }
}

/// The documents of a view and their readers, in URI order.
pub(crate) struct Listing(DocList);

/// Documents copied under one hold of a view's read lock.
const DOCS_PER_HOLD: u32 = 1 << 13;

impl Listing {
    /// Copied from `view` a range of document numbers at a time under its read lock, sorted
    /// outside it, so that a write waits at most for one range. Writes made meanwhile may
    /// show in later ranges: a document is then listed as one copy or the other.
    pub fn of(view: &parking_lot::RwLock<ViewData>) -> Listing {
        let mut list = DocList::default();
        // Reserved outside the lock: growing the copy under it would copy it whole.
        let ((docs, bytes), rows) = {
            let data = view.read();
            (data.docs.sizes(), data.rows)
        };
        // An eighth more, for the writes made while copying.
        list.reserve((docs + docs / 8, bytes + bytes / 8, rows + rows / 8));
        let mut from: u32 = 0;
        loop {
            let data = view.read();
            let to = from.saturating_add(DOCS_PER_HOLD);
            let readers = |slots: &[u32]| {
                slots
                    .first()
                    .and_then(|s| data.readers.get(*s as usize))
                    .map_or(0, |r| *r)
            };
            data.docs.copy_range(from..to, readers, &mut list);
            let done = to >= data.docs.numbers();
            // Handed to a waiting write at once: a plain unlock lets this loop take it again
            // first.
            parking_lot::RwLockReadGuard::unlock_fair(data);
            if done {
                break;
            }
            from = to;
        }
        list.sort();
        Listing(list)
    }

    /// Each document's URI, readers (those of its first row) and slots, in URI order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (Uri<'_>, RoleSet, &[u32])> + '_ {
        self.0
            .iter()
            .map(|(uri, readers, slots)| (uri, RoleSet::from_bits(readers), slots))
    }
}

pub struct RowRef<'v> {
    view: &'v ViewData,
    slot: u32,
}

impl Row for RowRef<'_> {
    #[inline]
    fn get(&self, column: usize) -> Datum<'_> {
        self.view.columns[column].get(self.slot as usize)
    }
}

/// Extents by geometry path and role bits, with the version each was computed at.
type ExtentCache = crate::FastMap<(String, u8), (u64, Option<crate::spatial::pip::BBox>)>;

/// Add `n` (may be negative) rows to the count of rows read by `readers`.
fn count_readers(sets: &mut Vec<(RoleSet, usize)>, readers: RoleSet, n: isize) {
    match sets.iter_mut().find(|(r, _)| *r == readers) {
        Some((_, count)) => *count = count.saturating_add_signed(n),
        None if n > 0 => sets.push((readers, n as usize)),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(g: &Geometries, slots: usize) -> Vec<String> {
        (0..slots)
            .map(|s| match g.get(s) {
                None => "-".to_string(),
                Some(GeometryRef::Point(x, y)) => format!("{x} {y}"),
                Some(GeometryRef::Json(j)) => String::from_utf8_lossy(j).into_owned(),
            })
            .collect()
    }

    #[test]
    fn points_stay_inline_until_another_kind_comes() {
        let mut g = Geometries::default();
        g.set(0, Some(GeometryOut::Point(1.5, -2.0)));
        g.set(3, Some(GeometryOut::Point(-0.0, 90.0)));
        g.set(0, None);
        g.set(2, Some(GeometryOut::Point(7.0, 8.0)));
        assert!(matches!(g, Geometries::Points(_)));
        assert_eq!(show(&g, 5), ["-", "-", "7 8", "-0 90", "-"]);
        let line: Arc<[u8]> = Arc::from(&br#"{"type":"LineString"}"#[..]);
        g.set(1, Some(GeometryOut::Json(line)));
        assert!(matches!(g, Geometries::Mixed(_)));
        g.push(Some(GeometryOut::Point(3.0, 4.0)));
        assert_eq!(
            show(&g, 6),
            ["-", r#"{"type":"LineString"}"#, "7 8", "-0 90", "3 4", "-"]
        );
    }

    #[test]
    fn integers_widen_when_one_does_not_fit() {
        let mut v = Ints::default();
        v.set(0, Some(i32::MAX as i64));
        v.set(2, Some(-7));
        assert!(matches!(v, Ints::Narrow(_)));
        v.set(3, Some(i32::MIN as i64 - 1));
        assert!(matches!(v, Ints::Wide(_)));
        v.push(Some(1 << 40));
        let all: Vec<Option<i64>> = (0..6).map(|s| v.get(s)).collect();
        assert_eq!(
            all,
            [
                Some(i32::MAX as i64),
                None,
                Some(-7),
                Some(i32::MIN as i64 - 1),
                Some(1 << 40),
                None
            ]
        );
    }

    #[test]
    fn bits_list_their_ones() {
        let mut b = Bits::all(70);
        assert!(b.get(69) && !b.get(70));
        b.set(0, false);
        b.set(64, false);
        b.set(200, true);
        let ones: Vec<usize> = b.ones().collect();
        assert_eq!(ones.len(), 69);
        assert_eq!(&ones[..2], [1, 2]);
        assert_eq!(&ones[ones.len() - 3..], [68, 69, 200]);
        assert!(!ones.contains(&64));
    }

    #[test]
    fn nullable_values_keep_their_nulls() {
        let mut v: Nullable<i64> = Nullable::default();
        v.set(70, Some(-5));
        v.set(3, Some(0));
        v.push(Some(9));
        v.set(70, None);
        assert_eq!(v.get(3), Some(0));
        assert_eq!(v.get(70), None);
        assert_eq!(v.get(71), Some(9));
        assert_eq!(v.get(72), None);
        assert_eq!(v.get(1000), None);
        assert_eq!((0..72).filter(|&s| v.get(s).is_some()).count(), 2);
    }
}
