//! Views in memory: typed columns, one row per slot, and what the query path needs beside
//! them (each row's document, that document's readers, and the row's geometry per layer
//! path).
//!
//! A slot is a row's number in its view and its feature id in the view's spatial indexes.
//! Slots are reused after a row dies, but only after the spatial indexes have dropped it, so
//! a query can never see a reused slot with an old geometry.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::template::{Cell, Kind, ViewDef};
use super::where_clause::{Datum, Row};
use crate::acl::{Caller, Permissions, RoleSet};

/// Distinct strings a column keeps shared; past this, new values are stored as they come.
const INTERN_LIMIT: usize = 1 << 22;

/// One column's values, indexed by slot.
#[derive(Debug)]
pub enum Column {
    Int(Vec<Option<i64>>),
    Float(Vec<Option<f64>>),
    /// Strings, with equal values shared: real columns repeat (country codes, names, types).
    Str(Vec<Option<Arc<str>>>, HashSet<Arc<str>>),
    Bool(Vec<Option<bool>>),
    Date(Vec<Option<i64>>),
}

impl Column {
    pub(crate) fn new(kind: Kind) -> Column {
        match kind {
            Kind::Int => Column::Int(Vec::new()),
            Kind::Float => Column::Float(Vec::new()),
            Kind::Str => Column::Str(Vec::new(), HashSet::new()),
            Kind::Bool => Column::Bool(Vec::new()),
            Kind::Date => Column::Date(Vec::new()),
        }
    }

    fn set(&mut self, slot: usize, cell: Option<Cell>) {
        fn put<T>(v: &mut Vec<Option<T>>, slot: usize, x: Option<T>) {
            if v.len() <= slot {
                v.resize_with(slot + 1, || None);
            }
            v[slot] = x;
        }
        match (self, cell) {
            (Column::Int(v), Some(Cell::Int(i))) => put(v, slot, Some(i)),
            (Column::Float(v), Some(Cell::Float(f))) => put(v, slot, Some(f)),
            (Column::Str(v, shared), Some(Cell::Str(s))) => {
                let s = match shared.get(&s) {
                    Some(existing) => existing.clone(),
                    None => {
                        if shared.len() < INTERN_LIMIT {
                            shared.insert(s.clone());
                        }
                        s
                    }
                };
                put(v, slot, Some(s))
            }
            (Column::Bool(v), Some(Cell::Bool(b))) => put(v, slot, Some(b)),
            (Column::Date(v), Some(Cell::Date(d))) => put(v, slot, Some(d)),
            (Column::Int(v), _) => put(v, slot, None),
            (Column::Float(v), _) => put(v, slot, None),
            (Column::Str(v, _), _) => put(v, slot, None),
            (Column::Bool(v), _) => put(v, slot, None),
            (Column::Date(v), _) => put(v, slot, None),
        }
    }

    #[inline]
    pub fn get(&self, slot: usize) -> Datum<'_> {
        match self {
            Column::Int(v) => v
                .get(slot)
                .copied()
                .flatten()
                .map_or(Datum::Null, Datum::Int),
            Column::Float(v) => v
                .get(slot)
                .copied()
                .flatten()
                .map_or(Datum::Null, Datum::Float),
            Column::Str(v, _) => v
                .get(slot)
                .and_then(|s| s.as_deref())
                .map_or(Datum::Null, |s| Datum::Str(std::borrow::Cow::Borrowed(s))),
            Column::Bool(v) => v
                .get(slot)
                .copied()
                .flatten()
                .map_or(Datum::Null, Datum::Bool),
            Column::Date(v) => v
                .get(slot)
                .copied()
                .flatten()
                .map_or(Datum::Null, Datum::Date),
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

/// The slots of one document's rows: nearly always one, kept inline.
#[derive(Debug, Clone)]
pub(crate) enum DocSlots {
    One(u32),
    Many(Box<[u32]>),
}

impl DocSlots {
    fn as_slice(&self) -> &[u32] {
        match self {
            DocSlots::One(s) => std::slice::from_ref(s),
            DocSlots::Many(b) => b,
        }
    }

    /// `n` slots from `first` on.
    pub(crate) fn range(first: u32, n: u32) -> DocSlots {
        match n {
            1 => DocSlots::One(first),
            _ => DocSlots::Many((first..first + n).collect()),
        }
    }

    fn from_vec(v: Vec<u32>) -> DocSlots {
        match v.as_slice() {
            [one] => DocSlots::One(*one),
            _ => DocSlots::Many(v.into_boxed_slice()),
        }
    }
}

/// The rows of one view.
#[derive(Debug)]
pub struct ViewData {
    pub def: Arc<ViewDef>,
    pub columns: Vec<Column>,
    live: Vec<bool>,
    /// The readers of each row's document (effective roles holding `read`).
    readers: Vec<RoleSet>,
    /// Slots of each document's rows.
    by_doc: HashMap<Arc<str>, DocSlots>,
    /// Dead slots whose removal from the spatial indexes is done; ready for reuse.
    free: Vec<u32>,
    /// Geometry of each row, per layer geometry path.
    pub geometries: crate::FastMap<String, Vec<Option<GeometryOut>>>,
    rows: usize,
}

/// One geometry path's geometries, by slot.
#[derive(Clone, Copy)]
pub(crate) struct GeometryColumn<'v>(&'v [Option<GeometryOut>]);

impl<'v> GeometryColumn<'v> {
    pub fn get(self, slot: u32) -> Option<&'v GeometryOut> {
        self.0.get(slot as usize)?.as_ref()
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
            live: Vec::new(),
            readers: Vec::new(),
            by_doc: HashMap::new(),
            free: Vec::new(),
            geometries: crate::FastMap::default(),
            rows: 0,
        }
    }

    /// A view read back whole: every row live, slots in document order.
    pub(crate) fn from_parts(
        def: Arc<ViewDef>,
        columns: Vec<Column>,
        readers: Vec<RoleSet>,
        by_doc: HashMap<Arc<str>, DocSlots>,
        geometries: crate::FastMap<String, Vec<Option<GeometryOut>>>,
    ) -> ViewData {
        let rows = readers.len();
        ViewData {
            def,
            columns,
            live: vec![true; rows],
            readers,
            by_doc,
            free: Vec::new(),
            geometries,
            rows,
        }
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    #[inline]
    pub(crate) fn is_live(&self, slot: u32) -> bool {
        self.live.get(slot as usize).copied().unwrap_or(false)
    }

    /// Whether `caller` may read the document behind a row: checked for every row a query
    /// returns, here where the rows are, so no query path can skip it.
    #[inline]
    pub fn readable(&self, caller: &Caller, slot: u32) -> bool {
        self.is_live(slot)
            && self
                .readers
                .get(slot as usize)
                .is_some_and(|r| Permissions::readable_by(*r, caller.roles()))
    }

    pub(crate) fn slots_of(&self, uri: &str) -> &[u32] {
        self.by_doc.get(uri).map_or(&[], |s| s.as_slice())
    }

    /// Add a document's rows; returns their slots.
    pub(crate) fn add_rows(
        &mut self,
        uri: &Arc<str>,
        readers: RoleSet,
        rows: Vec<NewRow>,
    ) -> Vec<u32> {
        let mut slots = Vec::with_capacity(rows.len());
        for row in rows {
            let slot = match self.free.pop() {
                Some(s) => s,
                None => self.live.len() as u32,
            };
            let s = slot as usize;
            if self.live.len() <= s {
                self.live.resize(s + 1, false);
                self.readers.resize(s + 1, RoleSet::EMPTY);
            }
            for (col, cell) in self.columns.iter_mut().zip(row.cells) {
                col.set(s, cell);
            }
            for (path, g) in row.geometries {
                let v = self.geometries.entry(path).or_default();
                if v.len() <= s {
                    v.resize(s + 1, None);
                }
                v[s] = g;
            }
            self.live[s] = true;
            self.readers[s] = readers;
            self.rows += 1;
            slots.push(slot);
        }
        let mut all: Vec<u32> = self.slots_of(uri).to_vec();
        all.extend(&slots);
        if !all.is_empty() {
            self.by_doc.insert(uri.clone(), DocSlots::from_vec(all));
        }
        slots
    }

    /// Mark a document's rows dead; returns their slots (to drop from the spatial indexes,
    /// then hand back with [`ViewData::release`]).
    pub(crate) fn kill_rows(&mut self, uri: &str) -> Vec<u32> {
        let Some(slots) = self.by_doc.remove(uri) else {
            return Vec::new();
        };
        let slots = slots.as_slice().to_vec();
        for &s in slots.iter() {
            let s = s as usize;
            self.live[s] = false;
            for col in &mut self.columns {
                col.set(s, None);
            }
            for g in self.geometries.values_mut() {
                if let Some(x) = g.get_mut(s) {
                    *x = None;
                }
            }
            self.rows -= 1;
        }
        slots
    }

    /// Slots that no index refers to any more may be reused.
    pub fn release(&mut self, slots: &[u32]) {
        self.free.extend_from_slice(slots);
    }

    /// The id (OBJECTID) of a row.
    #[inline]
    pub(crate) fn id_of(&self, slot: u32) -> Option<i64> {
        match &self.columns[self.def.id_column] {
            Column::Int(v) => v.get(slot as usize).copied().flatten(),
            _ => None,
        }
    }

    /// The geometries of every slot at `path`: one lookup for a whole page of rows.
    pub(crate) fn geometry_column(&self, path: &str) -> GeometryColumn<'_> {
        GeometryColumn(self.geometries.get(path).map_or(&[], Vec::as_slice))
    }

    /// Every document with rows, in URI order, with its rows' slots.
    pub(crate) fn documents(&self) -> Vec<(&Arc<str>, &[u32])> {
        use rayon::slice::ParallelSliceMut;
        let mut docs: Vec<(&Arc<str>, &[u32])> =
            self.by_doc.iter().map(|(u, s)| (u, s.as_slice())).collect();
        docs.par_sort_unstable_by(|a, b| a.0.cmp(b.0));
        docs
    }

    /// The readers of the document behind a row.
    pub(crate) fn readers_at(&self, slot: u32) -> RoleSet {
        self.readers
            .get(slot as usize)
            .copied()
            .unwrap_or(RoleSet::EMPTY)
    }

    /// Every live slot, ascending.
    pub(crate) fn live_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.live
            .iter()
            .enumerate()
            .filter(|(_, l)| **l)
            .map(|(s, _)| s as u32)
    }

    /// A row as the `where` evaluator reads it.
    pub fn row(&self, slot: u32) -> RowRef<'_> {
        RowRef { view: self, slot }
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
