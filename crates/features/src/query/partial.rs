//! A query spread over cluster nodes that each hold some shards: each node's part of the
//! answer ([`Partial`], over the rows whose primary shard it was given, see
//! `features::placement`), and the answer merged from the parts, written as one node writes
//! it.
//!
//! Features come back with their order keys and are merged in order, `resultOffset` and
//! `resultRecordCount` applied to the merge (each part holds its first `offset + limit`). A
//! deep page goes in two rounds ([`Round`]): the parts' order keys first, then from each node
//! only its rows on the page, written;
//! ids merge in order; counts add; statistics merge by group key from partial counts,
//! minimums, maximums, exact integer sums and sums of squares, and for floats compensated
//! sums and Chan's pairwise means and squared deviations; extents are unions.

use serde::Serialize;

use std::collections::HashMap;

use super::*;
use crate::spatial::pip::BBox;

/// One node's part of an answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Partial {
    /// Not a query: each layer's data extent.
    Extents(Vec<(i64, Option<BBox>)>),
    /// The layer has no view yet.
    Empty,
    Count(u64),
    /// Ids in order, with their order keys.
    Ids(Vec<(Vec<Key>, i64)>),
    /// Every matching row counted; the first `offset + limit` in order, each written (or
    /// not, in [`Round::Keys`]); in [`Round::Rows`], the rows asked for, after `skipped` of
    /// the part's rows that come before the page.
    Page {
        total: u64,
        skipped: u64,
        #[serde(with = "written_rows")]
        rows: Vec<(Vec<Key>, i64, Vec<u8>)>,
    },
    /// Per group (its key, its members' JSON), an accumulator per statistic.
    Statistics(Vec<(Vec<u8>, Vec<u8>, Vec<Acc>)>),
}

/// A page's rows with each row's JSON as one byte string: the same bytes in postcard as a
/// sequence of bytes, written and read as a slice rather than byte by byte.
mod written_rows {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Key;

    type Row = (Vec<Key>, i64, Vec<u8>);

    pub fn serialize<S: Serializer>(rows: &[Row], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(
            rows.iter()
                .map(|(keys, id, json)| (keys, id, serde_bytes::Bytes::new(json))),
        )
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Row>, D::Error> {
        let rows = Vec::<(Vec<Key>, i64, serde_bytes::ByteBuf)>::deserialize(d)?;
        Ok(rows
            .into_iter()
            .map(|(keys, id, json)| (keys, id, json.into_vec()))
            .collect())
    }
}

impl Partial {
    /// The rows (or groups) it carries: what merging it costs.
    pub fn rows(&self) -> usize {
        match self {
            Partial::Extents(l) => l.len(),
            Partial::Empty | Partial::Count(_) => 0,
            Partial::Ids(l) => l.len(),
            Partial::Page { rows, .. } => rows.len(),
            Partial::Statistics(g) => g.len(),
        }
    }
}

/// Which round of a spread page a part answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub enum Round {
    /// The page in one round: each part's first `offset + limit` rows, written.
    #[default]
    One,
    /// The first round of a deep page: the order keys of those rows, nothing written.
    Keys,
    /// The second: the rows named (order keys and id) written, after `skipped` rows.
    Rows {
        rows: Vec<(Vec<Key>, i64)>,
        skipped: u64,
    },
}

/// A value of a row, owned, as parts carry them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Key {
    Null,
    Int(i64),
    Float(f64),
    Str(String),
    Bool(bool),
    Date(i64),
}

impl Key {
    fn of(d: &Datum<'_>) -> Key {
        match d {
            Datum::Null => Key::Null,
            Datum::Int(i) => Key::Int(*i),
            Datum::Float(f) => Key::Float(*f),
            Datum::Str(s) => Key::Str(s.to_string()),
            Datum::Bool(b) => Key::Bool(*b),
            Datum::Date(d) => Key::Date(*d),
        }
    }

    fn datum(&self) -> Datum<'_> {
        match self {
            Key::Null => Datum::Null,
            Key::Int(i) => Datum::Int(*i),
            Key::Float(f) => Datum::Float(*f),
            Key::Str(s) => Datum::Str(Cow::Borrowed(s)),
            Key::Bool(b) => Datum::Bool(*b),
            Key::Date(d) => Datum::Date(*d),
        }
    }
}

/// One statistic's partial state over some rows (nulls skipped).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Acc {
    /// Values that are not null (rows, for `count(*)`).
    values: u64,
    min: Option<Key>,
    max: Option<Key>,
    /// Numeric values (integers, floats, dates, booleans).
    nums: u64,
    /// Whether every value is an integer (a sum stays an integer only then).
    ints_only: bool,
    /// The sum and the sum of squares while every numeric value is an integer, date or
    /// boolean and they fit.
    exact: Option<(i128, i128)>,
    /// A compensated sum of the numeric values: the sum and its running error.
    sum: (f64, f64),
    /// Their mean and sum of squared deviations from it.
    mean: f64,
    m2: f64,
}

/// Neumaier's compensated addition of `x` to `(sum, error)`.
fn add_compensated((s, c): (f64, f64), x: f64) -> (f64, f64) {
    let t = s + x;
    let c = if s.abs() >= x.abs() {
        c + ((s - t) + x)
    } else {
        c + ((x - t) + s)
    };
    (t, c)
}

impl Acc {
    fn over(kind: StatKind, col: Option<usize>, data: &ViewData, slots: &[u32]) -> Acc {
        let Some(col) = col else {
            return Acc {
                values: slots.len() as u64,
                ..Acc::default()
            };
        };
        let mut acc = Acc {
            ints_only: true,
            exact: Some((0, 0)),
            ..Acc::default()
        };
        // Only sums, means and variances read the numbers.
        let numeric = kind.is_numeric();
        for s in slots {
            let v = data.columns[col].get(*s as usize);
            if v == Datum::Null {
                continue;
            }
            acc.values += 1;
            acc.ints_only &= matches!(v, Datum::Int(_));
            if matches!(kind, StatKind::Min | StatKind::Max) {
                acc.keep_extreme(&v);
            }
            if !numeric {
                continue;
            }
            let x = match v {
                Datum::Int(i) => i as f64,
                Datum::Float(f) => f,
                Datum::Bool(b) => f64::from(u8::from(b)),
                Datum::Date(d) => d as f64,
                _ => continue,
            };
            acc.exact = acc.exact.and_then(|(s, q)| {
                let i = match v {
                    Datum::Int(i) | Datum::Date(i) => i as i128,
                    Datum::Bool(b) => i128::from(b),
                    _ => return None,
                };
                Some((s.checked_add(i)?, q.checked_add(i.checked_mul(i)?)?))
            });
            acc.push_number(x);
        }
        acc
    }

    fn keep_extreme(&mut self, v: &Datum<'_>) {
        let lower = self
            .min
            .as_ref()
            .is_none_or(|m| compare(v, &m.datum()) == Some(Ordering::Less));
        if lower {
            self.min = Some(Key::of(v));
        }
        let higher = self
            .max
            .as_ref()
            .is_none_or(|m| compare(v, &m.datum()) == Some(Ordering::Greater));
        if higher {
            self.max = Some(Key::of(v));
        }
    }

    fn push_number(&mut self, x: f64) {
        self.nums += 1;
        self.sum = add_compensated(self.sum, x);
        let delta = x - self.mean;
        self.mean += delta / self.nums as f64;
        self.m2 += delta * (x - self.mean);
    }

    fn merge(&mut self, o: &Acc) {
        if o.values == 0 {
            return;
        }
        if self.values == 0 {
            *self = o.clone();
            return;
        }
        self.values += o.values;
        for m in [&o.min, &o.max].into_iter().flatten() {
            self.keep_extreme(&m.datum());
        }
        self.ints_only &= o.ints_only;
        self.exact = match (self.exact, o.exact) {
            (Some((s, q)), Some((os, oq))) => s.checked_add(os).zip(q.checked_add(oq)),
            _ => None,
        };
        self.sum = add_compensated(add_compensated(self.sum, o.sum.0), o.sum.1);
        let (n, m) = (self.nums as f64, o.nums as f64);
        if o.nums > 0 {
            let total = n + m;
            let delta = o.mean - self.mean;
            self.mean += delta * m / total;
            self.m2 += o.m2 + delta * delta * n * m / total;
        }
        self.nums += o.nums;
    }

    /// The statistic, as [`statistic`] computes it over all the rows at once (floats to
    /// within rounding).
    fn value(&self, kind: StatKind, counted_rows: bool) -> Datum<'_> {
        if counted_rows {
            return Datum::Int(self.values as i64);
        }
        let exact = self.exact;
        let float_sum = self.sum.0 + self.sum.1;
        match kind {
            StatKind::Count => Datum::Int(self.values as i64),
            StatKind::Min => self.min.as_ref().map_or(Datum::Null, Key::datum),
            StatKind::Max => self.max.as_ref().map_or(Datum::Null, Key::datum),
            StatKind::Sum => {
                if self.values == 0 {
                    return Datum::Null;
                }
                match exact.filter(|_| self.ints_only) {
                    Some((s, _)) if i64::try_from(s).is_ok() => Datum::Int(s as i64),
                    _ => Datum::Float(float_sum),
                }
            }
            StatKind::Avg => {
                if self.nums == 0 {
                    return Datum::Null;
                }
                Datum::Float(match exact {
                    Some((s, _)) => s as f64 / self.nums as f64,
                    None => float_sum / self.nums as f64,
                })
            }
            StatKind::Var | StatKind::Stddev => {
                if self.nums < 2 {
                    return Datum::Null;
                }
                let k = self.nums as f64;
                let spread = exact.and_then(|(s, q)| {
                    (self.nums as i128)
                        .checked_mul(q)?
                        .checked_sub(s.checked_mul(s)?)
                });
                let var = match spread {
                    Some(spread) => spread as f64 / (k * (k - 1.0)),
                    None => self.m2 / (k - 1.0),
                };
                Datum::Float(if kind == StatKind::Var {
                    var
                } else {
                    var.sqrt()
                })
            }
        }
    }
}

/// `orderByFields` over keys (nulls first), then OBJECTID: as `sort_rows` orders rows.
fn cmp_keyed(a: (&[Key], i64), b: (&[Key], i64), order: &[(usize, bool)]) -> Ordering {
    for (i, &(_, desc)) in order.iter().enumerate() {
        let o = order_values(&a.0[i].datum(), &b.0[i].datum(), desc);
        if o != Ordering::Equal {
            return o;
        }
    }
    a.1.cmp(&b.1)
}

/// Merge parts each in order into one list in order.
fn merge_ordered<T>(
    parts: Vec<Vec<T>>,
    order: &[(usize, bool)],
    key: impl Fn(&T) -> (&[Key], i64),
) -> Vec<T> {
    let mut all: Vec<T> = parts.into_iter().flatten().collect();
    // A stable sort of concatenated sorted runs is a merge of them.
    all.sort_by(|a, b| cmp_keyed(key(a), key(b), order));
    all
}

impl Queries<'_> {
    /// This node's part of a query spread over several nodes: the rows whose primary shard
    /// is in `shards` (every row it holds when `None`).
    pub fn execute_partial(
        &self,
        caller: &Caller,
        req: &FeatureRequest,
        shards: Option<&[usize]>,
        limit: Option<(std::time::Instant, u64)>,
        round: &Round,
    ) -> Result<Partial, FeatureError> {
        let descriptor = self
            .features
            .descriptor(&req.service, caller.roles())
            .ok_or_else(|| FeatureError::ServiceNotFound(req.service.clone()))?;
        let resolved = self.resolve(req, &descriptor)?;
        let Some(resolved) = resolved.filter(|_| is_query(req)) else {
            return Ok(Partial::Extents(
                descriptor
                    .layers
                    .iter()
                    .map(|l| (l.id, self.layer_extent(l, caller)))
                    .collect(),
            ));
        };
        let Some(view) = resolved.view.as_ref() else {
            return Ok(Partial::Empty);
        };
        let q = &req.query;
        let Matched {
            data,
            plan,
            mut rows,
        } = self.matched(caller, req, resolved.layer, view, limit)?;
        if let (Some(shards), Some(placement)) = (shards, self.features.placement()) {
            let geometries = data.geometry_column(resolved.layer.geometry_path.text());
            rows.retain(|&(id, slot)| {
                shards.contains(&placement.primary_of(geometries.get(slot), id))
            });
        }
        let keys = |slot: u32| -> Vec<Key> {
            plan.order
                .iter()
                .map(|&(c, _)| Key::of(&data.columns[c].get(slot as usize)))
                .collect()
        };
        Ok(match &plan.output {
            Output::Count => Partial::Count(rows.len() as u64),
            Output::Ids => {
                sort_rows(&mut rows, &plan.order, &data);
                Partial::Ids(rows.iter().map(|&(id, s)| (keys(s), id)).collect())
            }
            Output::Page { offset, limit } => {
                let total = rows.len() as u64;
                let mut skipped = 0;
                if let Round::Rows {
                    rows: named,
                    skipped: s,
                } = round
                {
                    // The rows of the page: by id, and the same order keys as in the first
                    // round (ids may repeat in a layer).
                    let wanted: HashMap<i64, Vec<&Vec<Key>>> =
                        named.iter().fold(HashMap::new(), |mut m, (k, id)| {
                            m.entry(*id).or_default().push(k);
                            m
                        });
                    rows.retain(|&(id, slot)| {
                        wanted
                            .get(&id)
                            .is_some_and(|ks| ks.iter().any(|k| **k == keys(slot)))
                    });
                    skipped = *s;
                }
                sort_rows(&mut rows, &plan.order, &data);
                let keep = offset.saturating_add(*limit);
                match round {
                    // The page's rows only, already chosen.
                    Round::Rows { .. } => {}
                    // A tile's sample: this node's even sample; the merge samples the samples.
                    _ if q.spread && rows.len() > keep => {
                        rows = spread(&rows[*offset..], *limit).copied().collect();
                    }
                    _ => rows.truncate(keep),
                }
                let geometries = q
                    .return_geometry
                    .then(|| data.geometry_column(resolved.layer.geometry_path.text()));
                let written = !matches!(round, Round::Keys);
                Partial::Page {
                    total,
                    skipped,
                    rows: rows
                        .iter()
                        .map(|&(id, s)| {
                            let mut out = Vec::new();
                            if written {
                                write_feature(&mut out, &data, s, &plan.out, geometries);
                            }
                            (keys(s), id, out)
                        })
                        .collect(),
                }
            }
            Output::Statistics { columns, groups } => {
                let specs = q.statistics.as_deref().unwrap_or(&[]);
                Partial::Statistics(
                    group_rows(&data, &rows, groups)
                        .into_iter()
                        .map(|(key, (slots, members))| {
                            let accs = specs
                                .iter()
                                .zip(columns)
                                .map(|(spec, col)| Acc::over(spec.kind, *col, &data, &slots))
                                .collect();
                            (key, members, accs)
                        })
                        .collect(),
                )
            }
        })
    }

    /// After a first round of keys ([`Round::Keys`]): what each part must write in the
    /// second, its rows on the page and how many of its rows come before it. `None` when the
    /// parts are not pages (they are then the answer's parts already).
    pub fn second_round(
        &self,
        caller: &Caller,
        req: &FeatureRequest,
        parts: &[Partial],
    ) -> Result<Option<Vec<Round>>, FeatureError> {
        let descriptor = self
            .features
            .descriptor(&req.service, caller.roles())
            .ok_or_else(|| FeatureError::ServiceNotFound(req.service.clone()))?;
        let Some(resolved) = self.resolve(req, &descriptor)?.filter(|_| is_query(req)) else {
            return Ok(None);
        };
        let Some(view) = resolved.view.as_ref() else {
            return Ok(None);
        };
        let plan = Plan::new(
            &view.def,
            resolved.layer,
            &req.query,
            &self.features.settings,
        )?;
        let Output::Page { offset, limit } = plan.output else {
            return Ok(None);
        };
        let mut lists = Vec::with_capacity(parts.len());
        for (i, p) in parts.iter().enumerate() {
            match p {
                Partial::Page { rows, .. } => {
                    lists.push(rows.iter().map(|r| (&r.0, r.1, i)).collect::<Vec<_>>())
                }
                Partial::Empty => lists.push(Vec::new()),
                _ => return Ok(None),
            }
        }
        let merged = merge_ordered(lists, &plan.order, |r| (r.0, r.1));
        let start = offset.min(merged.len());
        let end = (start + limit).min(merged.len());
        let mut rounds = vec![
            Round::Rows {
                rows: Vec::new(),
                skipped: 0,
            };
            parts.len()
        ];
        for (at, (k, id, i)) in merged[..end].iter().enumerate() {
            if let Round::Rows { rows, skipped } = &mut rounds[*i] {
                if at < start {
                    *skipped += 1;
                } else {
                    rows.push(((*k).clone(), *id));
                }
            }
        }
        Ok(Some(rounds))
    }

    /// The answer to `req` from the parts of every node it was spread over, as
    /// [`Queries::execute`] writes it on a node holding every row.
    pub fn merge_partials(
        &self,
        caller: &Caller,
        req: &FeatureRequest,
        parts: Vec<Partial>,
    ) -> Result<Vec<u8>, FeatureError> {
        let descriptor = self
            .features
            .descriptor(&req.service, caller.roles())
            .ok_or_else(|| FeatureError::ServiceNotFound(req.service.clone()))?;
        let resolved = self.resolve(req, &descriptor)?;
        let resolved = match resolved {
            Some(r) if is_query(req) => r,
            other => {
                let extents = merge_extents(&parts);
                let extent_of = |l: &Layer| extents.get(&l.id).copied();
                return Ok(match other {
                    None => self.service_description_with(&descriptor, &extent_of),
                    Some(r) => self.layer_description_with(&r, &extent_of),
                });
            }
        };
        let q = &req.query;
        let Some(view) = resolved.view.as_ref() else {
            return Ok(self.write_features(&descriptor, &resolved, None, &[], &[], false, q, 0));
        };
        let def = &view.def;
        let plan = Plan::new(def, resolved.layer, q, &self.features.settings)?;
        Ok(match &plan.output {
            Output::Count => {
                let mut n = 0u64;
                for p in parts {
                    match p {
                        Partial::Count(c) => n += c,
                        Partial::Empty => {}
                        _ => return Err(mismatched()),
                    }
                }
                self.write_count(&descriptor, &resolved, def, n as usize)
            }
            Output::Ids => {
                let mut lists = Vec::new();
                for p in parts {
                    match p {
                        Partial::Ids(l) => lists.push(l),
                        Partial::Empty => {}
                        _ => return Err(mismatched()),
                    }
                }
                let ids: Vec<(i64, u32)> = merge_ordered(lists, &plan.order, |r| (&r.0, r.1))
                    .into_iter()
                    .map(|r| (r.1, 0))
                    .collect();
                self.write_ids(&descriptor, &resolved, def, &ids)
            }
            Output::Page { offset, limit } => {
                let (mut total, mut skipped, mut lists) = (0u64, 0u64, Vec::new());
                for p in parts {
                    match p {
                        Partial::Page {
                            total: t,
                            skipped: s,
                            rows,
                        } => {
                            total += t;
                            skipped += s;
                            lists.push(rows);
                        }
                        Partial::Empty => {}
                        _ => return Err(mismatched()),
                    }
                }
                let merged = merge_ordered(lists, &plan.order, |r| (&r.0, r.1));
                let total = total as usize;
                let start = (*offset).min(total);
                let end = (start + limit).min(total);
                // Rows before the page that the parts left out (a second round's).
                let from = start.saturating_sub(skipped as usize);
                let page: Vec<&[u8]> = if q.spread && end < total {
                    spread(&merged, *limit).map(|r| &r.2[..]).collect()
                } else {
                    merged
                        .iter()
                        .skip(from)
                        .take(end - start)
                        .map(|r| &r.2[..])
                        .collect()
                };
                self.write_written_features(&descriptor, &resolved, def, &page, end < total)
            }
            Output::Statistics { columns, groups } => {
                let merged = merge_statistics(parts, groups.is_empty(), q)?;
                let mut out = Vec::new();
                envelope_start(&mut out);
                self.write_tail(&mut out, &descriptor, &resolved, Some(def), false, true);
                write_statistics(&mut out, &merged, q, columns);
                out
            }
        })
    }
}

/// Each layer's extent over the parts' extents (the union of their boxes); other parts are
/// passed over.
pub fn merge_extents(parts: &[Partial]) -> HashMap<i64, BBox> {
    let mut extents: HashMap<i64, BBox> = HashMap::new();
    for p in parts {
        let Partial::Extents(list) = p else { continue };
        for (id, e) in list.iter().filter_map(|(id, e)| Some((*id, (*e)?))) {
            extents
                .entry(id)
                .and_modify(|b| *b = crate::spatial::entry::union(*b, e))
                .or_insert(e);
        }
    }
    extents
}

/// Statistics by group: a group's key, its members' JSON, and its accumulators.
type Groups = BTreeMap<Vec<u8>, (Vec<u8>, Vec<Acc>)>;

/// Statistics of every part by group, merged; one group of nothing when there are no groups
/// and no rows.
fn merge_statistics(
    parts: Vec<Partial>,
    ungrouped: bool,
    q: &QuerySpec,
) -> Result<Groups, FeatureError> {
    let specs = q.statistics.as_deref().unwrap_or(&[]);
    let mut merged: Groups = BTreeMap::new();
    for p in parts {
        let list = match p {
            Partial::Statistics(l) => l,
            Partial::Empty => continue,
            _ => return Err(mismatched()),
        };
        for (key, members, accs) in list {
            match merged.get_mut(&key) {
                Some((_, have)) => {
                    for (a, b) in have.iter_mut().zip(&accs) {
                        a.merge(b);
                    }
                }
                None => {
                    merged.insert(key, (members, accs));
                }
            }
        }
    }
    if ungrouped && merged.is_empty() {
        merged.insert(Vec::new(), (Vec::new(), vec![Acc::default(); specs.len()]));
    }
    Ok(merged)
}

/// The `statistics` member and an empty `features`, closing the answer.
fn write_statistics(out: &mut Vec<u8>, merged: &Groups, q: &QuerySpec, columns: &[Option<usize>]) {
    let specs = q.statistics.as_deref().unwrap_or(&[]);
    out.extend_from_slice(b",\"statistics\":[");
    for (gi, (_, (members, accs))) in merged.iter().enumerate() {
        if gi > 0 {
            out.push(b',');
        }
        out.push(b'{');
        out.extend_from_slice(members);
        let mut first = members.is_empty();
        for ((spec, col), acc) in specs.iter().zip(columns).zip(accs) {
            if !first {
                out.push(b',');
            }
            first = false;
            write_str(out, &spec.out_name);
            out.push(b':');
            write_value(out, &acc.value(spec.kind, col.is_none()));
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"features\":[]}");
}

/// The parts of a spread query do not fit its plan: a node answered another question.
fn mismatched() -> FeatureError {
    tracing::error!("the parts of a spread query do not match its plan");
    FeatureError::Internal("the nodes' parts of the answer do not match".into())
}

fn is_query(req: &FeatureRequest) -> bool {
    req.method
        .as_deref()
        .is_some_and(|m| m.eq_ignore_ascii_case("query"))
}

impl FeatureRequest {
    /// The query geometry's box when every row the query can match meets it: for
    /// [`crate::placement::Placement::route`]. None for a query without geometry,
    /// with a distance, or that is not a query.
    pub fn region(&self) -> Option<BBox> {
        if !is_query(self) || self.query.distance.is_some() {
            return None;
        }
        self.query.geometry.as_ref().map(|(g, _)| *g.bbox())
    }
}
