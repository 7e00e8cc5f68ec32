//! Strings of views kept compactly: the bytes of many strings in one arena, addressed by a
//! stable number, instead of an allocation (and its header) for each.
//!
//! - [`Strings`]: the arena. A removed string leaves garbage, compacted away once it is
//!   half the arena.
//! - [`StrColumn`]: a string column as a dictionary: one `u32` a row, each distinct value
//!   stored once with a count of the rows holding it, dropped when the last one goes.
//! - [`DocIndex`]: each document's URI and its rows' slots, found by URI.

use std::borrow::Cow;
use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::paged::Paged;
use super::sorted::{SortedStrings, UriBlocks};

/// A string's place in the arena: start in the high 40 bits, length in the low 24.
type Loc = u64;
const LEN_BITS: u32 = 24;
/// Length field of a string kept outside the arena (too long, or past 2^40 bytes).
const OUTSIDE: u64 = (1 << LEN_BITS) - 1;
/// A free number.
const FREE: Loc = u64::MAX;
/// Garbage below this is never worth a compaction.
const COMPACT_FROM: usize = 1 << 20;

#[derive(Debug, Default)]
pub(crate) struct Strings {
    text: String,
    locs: Vec<Loc>,
    free: Vec<u32>,
    garbage: usize,
    outside: crate::FastMap<u32, Box<str>>,
}

impl Strings {
    /// Store `s`; returns its number.
    pub fn push(&mut self, s: &str) -> u32 {
        let start = self.text.len() as u64;
        let n = match self.free.pop() {
            Some(n) => n,
            None => {
                self.locs.push(FREE);
                (self.locs.len() - 1) as u32
            }
        };
        if (s.len() as u64) < OUTSIDE && start < 1 << (64 - LEN_BITS) {
            self.text.push_str(s);
            self.locs[n as usize] = (start << LEN_BITS) | s.len() as u64;
        } else {
            self.outside.insert(n, s.into());
            self.locs[n as usize] = OUTSIDE;
        }
        n
    }

    #[inline]
    pub fn get(&self, n: u32) -> &str {
        let loc = self.locs[n as usize];
        let len = (loc & OUTSIDE) as usize;
        if len == OUTSIDE as usize {
            return self.outside.get(&n).map_or("", |s| s);
        }
        let start = (loc >> LEN_BITS) as usize;
        &self.text[start..start + len]
    }

    /// Whether number `n` holds a string.
    pub fn contains(&self, n: u32) -> bool {
        self.locs.get(n as usize).is_some_and(|l| *l != FREE)
    }

    /// Drop string `n`; its number is reused by a later push.
    pub fn remove(&mut self, n: u32) {
        let loc = std::mem::replace(&mut self.locs[n as usize], FREE);
        if loc & OUTSIDE == OUTSIDE {
            self.outside.remove(&n);
        } else {
            self.garbage += (loc & OUTSIDE) as usize;
        }
        self.free.push(n);
        if self.garbage >= COMPACT_FROM && self.garbage * 2 > self.text.len() {
            self.compact();
        }
    }

    /// Copy the live strings into a new arena; their numbers stay.
    fn compact(&mut self) {
        let mut text = String::with_capacity(self.text.len() - self.garbage);
        for loc in self.locs.iter_mut() {
            if *loc == FREE || *loc & OUTSIDE == OUTSIDE {
                continue;
            }
            let (start, len) = ((*loc >> LEN_BITS) as usize, (*loc & OUTSIDE) as usize);
            let at = text.len() as u64;
            text.push_str(&self.text[start..start + len]);
            *loc = (at << LEN_BITS) | len as u64;
        }
        self.text = text;
        self.garbage = 0;
    }

    /// Numbers in use, and bytes of text held (garbage included).
    #[cfg(test)]
    fn sizes(&self) -> (usize, usize) {
        (self.locs.len() - self.free.len(), self.text.len())
    }
}

/// Documents copied out of a [`DocIndex`] ([`DocIndex::copy_range`]), a range of numbers at
/// a time, then listed in URI order by [`DocList::sort`].
#[derive(Default)]
pub(crate) struct DocList {
    directories: Vec<Box<str>>,
    rests: String,
    slots: Vec<u32>,
    entries: Vec<ListEntry>,
}

struct ListEntry {
    /// Eight bytes of the URI past the prefix every URI shares: most comparisons end here.
    key: u64,
    rest: u64,
    rest_len: u32,
    slots: u64,
    slot_count: u32,
    dir: u8,
    tag: u8,
}

impl DocList {
    /// Room for `docs` documents with `bytes` of URIs past their directories and `rows`
    /// slots, its memory touched once so that copying into it later takes no page fault.
    pub fn reserve(&mut self, (docs, bytes, rows): (usize, usize, usize)) {
        let blank = || ListEntry {
            key: 0,
            rest: 0,
            rest_len: 0,
            slots: 0,
            slot_count: 0,
            dir: 0,
            tag: 0,
        };
        self.entries.resize_with(self.entries.len() + docs, blank);
        self.entries.truncate(self.entries.len() - docs);
        let at = self.rests.len();
        self.rests.extend(std::iter::repeat_n('\0', bytes));
        self.rests.truncate(at);
        self.slots.resize(self.slots.len() + rows, 0);
        self.slots.truncate(self.slots.len() - rows);
    }

    fn uri(&self, e: &ListEntry) -> Uri<'_> {
        let rest = &self.rests[e.rest as usize..e.rest as usize + e.rest_len as usize];
        match e.dir {
            0 => Uri("", rest),
            c => Uri(&self.directories[c as usize - 1], rest),
        }
    }

    /// Sort by URI; a URI copied twice (its document removed and added again between two
    /// copies) is listed once.
    pub fn sort(&mut self) {
        use rayon::slice::ParallelSliceMut;
        let mut entries = std::mem::take(&mut self.entries);
        let Some(first) = entries.first() else {
            return;
        };
        let first: Vec<u8> = self.uri(first).bytes().collect();
        let shared = entries.iter().fold(first.len(), |k, e| {
            self.uri(e)
                .bytes()
                .take(k)
                .zip(&first)
                .take_while(|(a, b)| a == *b)
                .count()
        });
        for e in entries.iter_mut() {
            let mut key = [0u8; 8];
            for (k, b) in key.iter_mut().zip(self.uri(e).bytes().skip(shared)) {
                *k = b;
            }
            e.key = u64::from_be_bytes(key);
        }
        entries.par_sort_unstable_by(|a, b| {
            a.key
                .cmp(&b.key)
                .then_with(|| self.uri(a).cmp(&self.uri(b)))
        });
        entries.dedup_by(|b, a| a.key == b.key && self.uri(a) == self.uri(b));
        self.entries = entries;
    }

    /// Each document's URI, tag and slots, in the order of [`DocList::sort`].
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (Uri<'_>, u8, &[u32])> + '_ {
        self.entries.iter().map(|e| {
            let slots = &self.slots[e.slots as usize..e.slots as usize + e.slot_count as usize];
            (self.uri(e), e.tag, slots)
        })
    }
}

/// Hashes of strings, seeded at random per table: values come from documents, so a fixed
/// seed would let a writer choose colliding values.
type State = foldhash::fast::RandomState;

fn hash(state: &State, s: &str) -> u64 {
    state.hash_one(s)
}

/// Marks a null row of a [`StrColumn`].
const NULL: u32 = u32::MAX;

/// A string column, dictionary-encoded.
///
/// Values read back from a saved view are `base`, numbered from 0, in its file: found by
/// binary search and never removed (a value no row holds stays until the view is saved
/// again). Values added since are numbered after them, counted and dropped with their last
/// row.
#[derive(Debug, Default)]
pub struct StrColumn {
    codes: Paged<u32>,
    base: SortedStrings,
    /// Values numbered `base.len() + n`, at `n`.
    values: Strings,
    /// Rows holding each of `values`.
    refs: Vec<u32>,
    /// Numbers in `values`, by their string.
    table: HashTable<u32>,
    state: State,
}

impl StrColumn {
    #[inline]
    pub fn get(&self, slot: usize) -> Option<&str> {
        match self.codes.get(slot).copied() {
            None | Some(NULL) => None,
            Some(c) => Some(self.value(c)),
        }
    }

    #[inline]
    fn value(&self, c: u32) -> &str {
        let base = self.base.len() as u32;
        if c < base {
            self.base.get(c)
        } else {
            self.values.get(c - base)
        }
    }

    pub fn set(&mut self, slot: usize, value: Option<&str>) {
        if self.codes.len() <= slot {
            self.codes.resize(slot + 1, NULL);
        }
        let new = value.map_or(NULL, |s| self.intern(s));
        let old = std::mem::replace(&mut self.codes[slot], new);
        if old != NULL {
            self.release(old);
        }
    }

    /// The number of a row's value (equal values, equal numbers), or `None` when null.
    #[inline]
    pub fn code(&self, slot: usize) -> Option<u32> {
        self.codes.get(slot).copied().filter(|&c| c != NULL)
    }

    /// A column read back: its values (`base`) and each row's number among them
    /// (`u32::MAX`: null); `Err` when a number is past the values.
    pub(crate) fn from_saved(base: SortedStrings, codes: Paged<u32>) -> Result<StrColumn, String> {
        let n = base.len() as u32;
        if codes.iter().any(|&c| c != NULL && c >= n) {
            return Err("damaged (a value past the column's list)".into());
        }
        Ok(StrColumn {
            codes,
            base,
            ..StrColumn::default()
        })
    }

    fn intern(&mut self, s: &str) -> u32 {
        let base = self.base.len() as u32;
        let h = hash(&self.state, s);
        let values = &self.values;
        if let Some(&c) = self.table.find(h, |&c| values.get(c) == s) {
            self.refs[c as usize] += 1;
            return base + c;
        }
        if let Some(c) = self.base.find(s) {
            return c;
        }
        let c = self.values.push(s);
        if self.refs.len() <= c as usize {
            self.refs.resize(c as usize + 1, 0);
        }
        self.refs[c as usize] = 1;
        let values = &self.values;
        self.table
            .insert_unique(h, c, |&c| hash(&self.state, values.get(c)));
        base + c
    }

    fn release(&mut self, c: u32) {
        let Some(c) = c.checked_sub(self.base.len() as u32) else {
            // A saved value: kept until the next save.
            return;
        };
        let refs = &mut self.refs[c as usize];
        *refs -= 1;
        if *refs > 0 {
            return;
        }
        let h = hash(&self.state, self.values.get(c));
        if let Ok(entry) = self.table.find_entry(h, |&x| x == c) {
            entry.remove();
        }
        self.values.remove(c);
    }

    /// Distinct values held since the column was read back.
    #[cfg(test)]
    pub(crate) fn distinct(&self) -> usize {
        self.table.len()
    }
}

/// Marks a [`DocIndex`] entry whose slots are in `many`.
const MANY: u32 = 1 << 31;

/// Directories a [`DocIndex`] shares; a URI in any other is kept whole.
const MAX_DIRECTORIES: usize = u8::MAX as usize;

/// A URI as its directory (up to and including its last `/`) and the rest.
fn split(uri: &str) -> (&str, &str) {
    match uri.rfind('/') {
        Some(i) => uri.split_at(i + 1),
        None => ("", uri),
    }
}

/// A document's URI as a [`DocIndex`] keeps it: a shared directory, then the rest.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Uri<'a>(&'a str, &'a str);

impl<'a> Uri<'a> {
    pub fn bytes(&self) -> impl Iterator<Item = u8> + '_ {
        self.0.bytes().chain(self.1.bytes())
    }

    pub fn parts(&self) -> [&'a str; 2] {
        [self.0, self.1]
    }
}

impl std::fmt::Display for Uri<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.0, self.1)
    }
}

impl PartialEq for Uri<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Uri<'_> {}

impl PartialOrd for Uri<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The order of the whole URIs' bytes (the store's order).
impl Ord for Uri<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if self.0 == other.0 {
            self.1.cmp(other.1)
        } else {
            self.bytes().cmp(other.bytes())
        }
    }
}

/// Each document's rows, by URI.
///
/// Documents read back from a saved view are `base`, numbered from 0 in URI order, in its
/// file: found by binary search; one removed (or given new rows, which moves it to the
/// others) is marked in `gone`. Documents added since are numbered after them, found
/// through a hash table.
#[derive(Debug, Default)]
pub(crate) struct DocIndex {
    base: UriBlocks,
    /// One bit a document of `base`: removed or moved.
    gone: Vec<u64>,
    gone_count: usize,
    /// Per document number: its URI past the directory (whole, when the directory has no
    /// code).
    rests: Strings,
    /// Per document number: its directory's code (index + 1 into `directories`), or 0.
    dirs: Vec<u8>,
    directories: Vec<Box<str>>,
    /// Per document number: its one slot, or [`MANY`] | an index into `many`.
    slots: Vec<u32>,
    many: Vec<Box<[u32]>>,
    many_free: Vec<u32>,
    /// Document numbers, by URI.
    table: HashTable<u32>,
    state: State,
}

/// The hash of a URI given as its directory and the rest.
fn hash_split(state: &State, (dir, rest): (&str, &str)) -> u64 {
    use std::hash::Hasher;
    let mut h = state.build_hasher();
    h.write(dir.as_bytes());
    h.write_u8(0xff);
    h.write(rest.as_bytes());
    h.finish()
}

impl DocIndex {
    /// A saved view's documents.
    pub fn from_saved(base: UriBlocks) -> DocIndex {
        DocIndex {
            gone: vec![0; base.len().div_ceil(64)],
            base,
            ..DocIndex::default()
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.len() + self.base.len() - self.gone_count
    }

    fn is_gone(&self, b: u32) -> bool {
        self.gone[b as usize / 64] >> (b % 64) & 1 == 1
    }

    /// `uri`'s number and slots in `base`, unless it is gone.
    fn find_base(&self, uri: &str) -> Option<(u32, std::ops::Range<u32>)> {
        if self.base.len() == 0 {
            return None;
        }
        self.base.find(uri).filter(|(b, _)| !self.is_gone(*b))
    }

    fn mark_gone(&mut self, b: u32) {
        self.gone[b as usize / 64] |= 1 << (b % 64);
        self.gone_count += 1;
    }

    fn uri_at(&self, d: u32) -> Uri<'_> {
        let rest = self.rests.get(d);
        match self.dirs[d as usize] {
            0 => Uri("", rest),
            c => Uri(&self.directories[c as usize - 1], rest),
        }
    }

    /// Document `d`'s URI split as [`split`] splits it.
    fn split_at(&self, d: u32) -> (&str, &str) {
        match self.uri_at(d) {
            Uri("", whole) => split(whole),
            Uri(dir, rest) => (dir, rest),
        }
    }

    fn slots_at(&self, d: u32) -> &[u32] {
        let s = &self.slots[d as usize];
        if s & MANY == 0 {
            std::slice::from_ref(s)
        } else {
            &self.many[(s & !MANY) as usize]
        }
    }

    /// `uri` split, its hash, and its document number if it has one.
    fn find<'u>(&self, uri: &'u str) -> ((&'u str, &'u str), u64, Option<u32>) {
        let parts = split(uri);
        let h = hash_split(&self.state, parts);
        let d = self.table.find(h, |&d| self.split_at(d) == parts).copied();
        (parts, h, d)
    }

    /// The slots of `uri`'s rows (none when it has none).
    pub fn get(&self, uri: &str) -> Cow<'_, [u32]> {
        if let Some(d) = self.find(uri).2 {
            return Cow::Borrowed(self.slots_at(d));
        }
        match self.find_base(uri) {
            Some((_, slots)) => Cow::Owned(slots.collect()),
            None => Cow::Borrowed(&[]),
        }
    }

    fn encode(&mut self, slots: &[u32]) -> u32 {
        match slots {
            [one] if one & MANY == 0 => *one,
            _ => {
                let b: Box<[u32]> = slots.into();
                let i = match self.many_free.pop() {
                    Some(i) => {
                        self.many[i as usize] = b;
                        i
                    }
                    None => {
                        self.many.push(b);
                        (self.many.len() - 1) as u32
                    }
                };
                MANY | i
            }
        }
    }

    fn drop_many(&mut self, s: u32) {
        if s & MANY != 0 {
            self.many[(s & !MANY) as usize] = Box::new([]);
            self.many_free.push(s & !MANY);
        }
    }

    /// The code of directory `dir`, made if there is room; 0 when none.
    fn directory(&mut self, dir: &str) -> u8 {
        if dir.is_empty() {
            return 0;
        }
        if let Some(i) = self.directories.iter().position(|d| &**d == dir) {
            return i as u8 + 1;
        }
        if self.directories.len() < MAX_DIRECTORIES {
            self.directories.push(dir.into());
            return self.directories.len() as u8;
        }
        0
    }

    /// Set `uri`'s slots (removing it when there are none); `true` when it had none.
    pub fn set(&mut self, uri: &str, slots: &[u32]) -> bool {
        if slots.is_empty() {
            return self.remove(uri).is_empty();
        }
        let code = self.encode(slots);
        let ((dir, rest), h, found) = self.find(uri);
        if let Some(d) = found {
            let old = std::mem::replace(&mut self.slots[d as usize], code);
            self.drop_many(old);
            return false;
        }
        let saved = self.find_base(uri);
        if let Some((b, _)) = saved {
            self.mark_gone(b);
        }
        self.add(uri, (dir, rest), h, code);
        saved.is_none()
    }

    fn add(&mut self, uri: &str, (dir, rest): (&str, &str), h: u64, code: u32) {
        let c = self.directory(dir);
        let d = self.rests.push(if c == 0 { uri } else { rest });
        let d_at = d as usize;
        if self.slots.len() <= d_at {
            self.slots.resize(d_at + 1, 0);
            self.dirs.resize(d_at + 1, 0);
        }
        self.slots[d_at] = code;
        self.dirs[d_at] = c;
        // Out of `self` while it grows, which rehashes the entries from `self`.
        let mut table = std::mem::take(&mut self.table);
        table.insert_unique(h, d, |d| hash_split(&self.state, self.split_at(*d)));
        self.table = table;
    }

    /// Take `uri` out; returns its slots.
    pub fn remove(&mut self, uri: &str) -> Vec<u32> {
        let (_, h, Some(d)) = self.find(uri) else {
            return match self.find_base(uri) {
                Some((b, slots)) => {
                    self.mark_gone(b);
                    slots.collect()
                }
                None => Vec::new(),
            };
        };
        if let Ok(entry) = self.table.find_entry(h, |&x| x == d) {
            entry.remove();
        }
        let out = self.slots_at(d).to_vec();
        self.drop_many(self.slots[d as usize]);
        self.rests.remove(d);
        out
    }

    /// Every document and its slots, in no order.
    #[cfg(test)]
    pub fn iter(&self) -> Vec<(String, Vec<u32>)> {
        let mut out: Vec<(String, Vec<u32>)> = self
            .table
            .iter()
            .map(|&d| (self.uri_at(d).to_string(), self.slots_at(d).to_vec()))
            .collect();
        self.base.each_in(0..u32::MAX, |d| {
            if !self.is_gone(d.number) {
                out.push((d.uri.to_string(), d.slots.collect()));
            }
        });
        out
    }

    /// One past the highest document number (those of `base` first).
    pub fn numbers(&self) -> u32 {
        (self.base.len() + self.slots.len()) as u32
    }

    /// What copying every document takes: documents, and bytes of URIs past their
    /// directories (garbage included: an upper bound).
    pub fn sizes(&self) -> (usize, usize) {
        (
            self.table.len() + self.base.len() - self.gone_count,
            self.rests.text.len() + self.base.uri_bytes(),
        )
    }

    /// Copy the documents numbered in `range` (those there are) into `list`, each with the
    /// `tag` of its slots.
    pub fn copy_range(
        &self,
        range: std::ops::Range<u32>,
        tag: impl Fn(&[u32]) -> u8,
        list: &mut DocList,
    ) {
        // Directories only ever join the list, keeping their codes.
        for d in &self.directories[list.directories.len()..] {
            list.directories.push(d.clone());
        }
        let mut slots: Vec<u32> = Vec::new();
        self.base.each_in(range.clone(), |d| {
            if self.is_gone(d.number) {
                return;
            }
            slots.clear();
            slots.extend(d.slots);
            list.entries.push(ListEntry {
                key: 0,
                rest: list.rests.len() as u64,
                rest_len: d.uri.len() as u32,
                slots: list.slots.len() as u64,
                slot_count: slots.len() as u32,
                dir: 0,
                tag: tag(&slots),
            });
            list.rests.push_str(d.uri);
            list.slots.extend_from_slice(&slots);
        });
        let base = self.base.len() as u32;
        let range = range.start.saturating_sub(base)..range.end.saturating_sub(base);
        for d in range.start..range.end.min(self.slots.len() as u32) {
            if !self.rests.contains(d) {
                continue;
            }
            let rest = self.rests.get(d);
            let slots = self.slots_at(d);
            list.entries.push(ListEntry {
                key: 0,
                rest: list.rests.len() as u64,
                rest_len: rest.len() as u32,
                slots: list.slots.len() as u64,
                slot_count: slots.len() as u32,
                dir: self.dirs[d as usize],
                tag: tag(slots),
            });
            list.rests.push_str(rest);
            list.slots.extend_from_slice(slots);
        }
    }
}

#[cfg(test)]
mod tests;
