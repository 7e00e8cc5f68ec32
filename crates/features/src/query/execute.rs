//! Execution: the layer a request resolves to, the service and layer descriptors, and a
//! query from its candidates through filters, statistics, order and page.

use super::*;

/// The layer a request names and its view (none until the view's template exists).
pub(super) struct Resolved<'a> {
    pub(super) layer: &'a Layer,
    pub(super) view: Option<Arc<ViewState>>,
}

impl Queries<'_> {
    pub(super) fn resolve<'d>(
        &self,
        req: &FeatureRequest,
        descriptor: &'d Descriptor,
    ) -> Result<Option<Resolved<'d>>, FeatureError> {
        let Some(id) = req.layer else {
            return Ok(None);
        };
        let layer = descriptor.layer(id).ok_or_else(|| {
            FeatureError::LayerNotFound(req.layer_text.clone().unwrap_or_else(|| id.to_string()))
        })?;
        Ok(Some(Resolved {
            layer,
            view: self.features.view(&layer.view),
        }))
    }

    /// Answer a geoQueryService request: the JSON response body.
    pub fn execute(&self, caller: &Caller, req: &FeatureRequest) -> Result<Vec<u8>, FeatureError> {
        self.execute_within(caller, req, None)
    }

    /// [`Queries::execute`], given up with [`FeatureError::TimeLimit`] once `limit` (a
    /// deadline and the limit it came from, in ms) has passed: the spatial tests and the row
    /// filter look at the clock as they go.
    pub fn execute_within(
        &self,
        caller: &Caller,
        req: &FeatureRequest,
        limit: Option<(std::time::Instant, u64)>,
    ) -> Result<Vec<u8>, FeatureError> {
        let descriptor = self
            .features
            .descriptor(&req.service, caller.roles())
            .ok_or_else(|| FeatureError::ServiceNotFound(req.service.clone()))?;
        let resolved = self.resolve(req, &descriptor)?;
        let is_query = req
            .method
            .as_deref()
            .is_some_and(|m| m.eq_ignore_ascii_case("query"));
        match (resolved, is_query) {
            (None, _) => Ok(self.service_description(caller, &descriptor)),
            (Some(resolved), false) => Ok(self.layer_description(caller, &resolved)),
            (Some(resolved), true) => self.run_query(caller, req, &descriptor, &resolved, limit),
        }
    }

    /// The service descriptor as Koop reads it for `/FeatureServer` (docs/contract.md §5): the
    /// info's members, `maxRecordCount`, and each layer's metadata in ascending id order.
    pub(super) fn service_description(&self, caller: &Caller, d: &Descriptor) -> Vec<u8> {
        self.service_description_with(d, &|layer| self.layer_extent(layer, caller))
    }

    /// [`Features::service_description`], with each layer's data extent from `extent_of`.
    pub(super) fn service_description_with(
        &self,
        d: &Descriptor,
        extent_of: &dyn Fn(&Layer) -> Option<crate::spatial::pip::BBox>,
    ) -> Vec<u8> {
        let mut top = serde_json::Map::new();
        top.insert("description".into(), d.description.clone().into());
        top.insert(
            "maxRecordCount".into(),
            self.features.settings.max_record_count.into(),
        );
        if let Some(Value::Object(info)) = d.raw.get("info") {
            for (k, v) in info {
                top.insert(k.clone(), v.clone());
            }
        }
        let mut layers: Vec<&Layer> = d.layers.iter().collect();
        layers.sort_by_key(|l| l.id);
        let views: Vec<_> = layers.iter().map(|l| self.features.view(&l.view)).collect();
        // The service's extent holds its layers' data (Koop's fullExtent).
        let extent = layers
            .iter()
            .filter_map(|layer| extent_of(layer))
            .reduce(crate::spatial::entry::union);
        if let Some(e) = extent {
            top.entry("extent").or_insert_with(|| extent_json(e));
        }
        let layers: Vec<Value> = layers
            .iter()
            .zip(&views)
            .map(|(layer, view)| {
                let meta = self.layer_metadata(layer, view.as_deref(), extent_of(layer));
                json!({ "metadata": meta })
            })
            .collect();
        top.insert("layers".into(), Value::Array(layers));
        let mut out = Vec::new();
        envelope_start(&mut out);
        for (k, v) in top {
            out.push(b',');
            write_str(&mut out, &k);
            out.push(b':');
            let _ = serde_json::to_writer(&mut out, &v);
        }
        out.push(b'}');
        out
    }

    /// The layer descriptor: `{"metadata": {…}}`.
    pub(super) fn layer_description(&self, caller: &Caller, resolved: &Resolved<'_>) -> Vec<u8> {
        self.layer_description_with(resolved, &|layer| self.layer_extent(layer, caller))
    }

    /// [`Features::layer_description`], with the layer's data extent from `extent_of`.
    pub(super) fn layer_description_with(
        &self,
        resolved: &Resolved<'_>,
        extent_of: &dyn Fn(&Layer) -> Option<crate::spatial::pip::BBox>,
    ) -> Vec<u8> {
        let extent = extent_of(resolved.layer);
        let meta = self.layer_metadata(resolved.layer, resolved.view.as_deref(), extent);
        let mut out = Vec::new();
        envelope_start(&mut out);
        out.extend_from_slice(b",\"metadata\":");
        let _ = serde_json::to_writer(&mut out, &meta);
        out.push(b'}');
        out
    }

    /// A layer's metadata: its members as stored, `maxRecordCount`,
    /// `useStandardizedQueries`, `idField`, its fields, and its extent (the stored one, else
    /// the data's, `extent`; none for a layer with no features, which clients take as the
    /// world).
    pub(super) fn layer_metadata(
        &self,
        layer: &Layer,
        view: Option<&ViewState>,
        extent: Option<crate::spatial::pip::BBox>,
    ) -> Value {
        let mut meta = serde_json::Map::new();
        meta.insert(
            "maxRecordCount".into(),
            self.features.settings.max_record_count.into(),
        );
        meta.insert("useStandardizedQueries".into(), true.into());
        for (k, v) in &layer.raw {
            meta.insert(k.clone(), v.clone());
        }
        meta.entry("idField")
            .or_insert_with(|| layer.id_field.clone().into());
        if !meta.contains_key("extent")
            && let Some(e) = extent
        {
            meta.insert("extent".into(), extent_json(e));
        }
        let fields: Value = view
            .and_then(|v| serde_json::from_slice(&v.def.fields_json).ok())
            .unwrap_or(Value::Array(Vec::new()));
        meta.insert("fields".into(), fields);
        Value::Object(meta)
    }

    /// A query: its plan (columns, filter, output) before any row is read, then the
    /// candidate rows from the spatial index, the rows that pass the filters, and the output.
    pub(super) fn run_query(
        &self,
        caller: &Caller,
        req: &FeatureRequest,
        descriptor: &Descriptor,
        resolved: &Resolved<'_>,
        limit: Option<(std::time::Instant, u64)>,
    ) -> Result<Vec<u8>, FeatureError> {
        let q = &req.query;
        let Some(view) = resolved.view.as_ref() else {
            // The layer's view has no template yet: a valid layer with no features.
            if let Some(shape) = &q.esri {
                let answer = match (q.count_only, q.ids_only) {
                    (true, _) => EsriAnswer::Count(0),
                    (false, true) => EsriAnswer::Ids(&[]),
                    _ => EsriAnswer::Page {
                        data: None,
                        def: None,
                        page: &[],
                        out_cols: &[],
                        exceeded: false,
                        bytes: 0,
                    },
                };
                return Ok(self.write_esri(resolved, q, shape, answer));
            }
            return Ok(self.write_features(descriptor, resolved, None, &[], &[], false, q, 0));
        };
        let def = &view.def;
        let Matched {
            data,
            plan,
            mut rows,
        } = self.matched(caller, req, resolved.layer, view, limit)?;
        Ok(match plan.output {
            Output::Statistics { columns, groups } => {
                self.write_statistics(descriptor, resolved, &data, &rows, &columns, &groups, q)
            }
            Output::Count => match &q.esri {
                Some(shape) => self.write_esri(resolved, q, shape, EsriAnswer::Count(rows.len())),
                None => self.write_count(descriptor, resolved, def, rows.len()),
            },
            Output::Ids => {
                sort_rows(&mut rows, &plan.order, &data);
                match &q.esri {
                    Some(shape) => self.write_esri(resolved, q, shape, EsriAnswer::Ids(&rows)),
                    None => self.write_ids(descriptor, resolved, def, &rows),
                }
            }
            Output::Page { offset, limit } => {
                sort_rows(&mut rows, &plan.order, &data);
                let start = offset.min(rows.len());
                let end = (start + limit).min(rows.len());
                let exceeded = end < rows.len();
                let page: Vec<u32> = if q.spread && exceeded {
                    spread(&rows[start..], limit).map(|r| r.1).collect()
                } else {
                    rows[start..end].iter().map(|r| r.1).collect()
                };
                let geometries = q
                    .return_geometry
                    .then(|| data.geometry_column(resolved.layer.geometry_path.text()));
                let bytes = self.answer_fits(&page, geometries, plan.out.len())?;
                if let Some(shape) = &q.esri {
                    let answer = EsriAnswer::Page {
                        data: Some(&data),
                        def: Some(def),
                        page: &page,
                        out_cols: &plan.out,
                        exceeded,
                        bytes,
                    };
                    return Ok(self.write_esri(resolved, q, shape, answer));
                }
                self.write_features(
                    descriptor,
                    resolved,
                    Some(&data),
                    &page,
                    &plan.out,
                    exceeded,
                    q,
                    bytes,
                )
            }
        })
    }

    /// The rows a query matches for `caller`, in slot order, with the view held for reading:
    /// its plan (columns, filter, output) before any row is read, then the candidates from
    /// the spatial index, then the rows that pass the filters. The index asks the rows which
    /// candidates the caller may read before any exact test, so unreadable rows cost nothing
    /// but their box lookup.
    pub(super) fn matched<'v>(
        &self,
        caller: &Caller,
        req: &FeatureRequest,
        layer: &Layer,
        view: &'v ViewState,
        limit: Option<(std::time::Instant, u64)>,
    ) -> Result<Matched<'v>, FeatureError> {
        let deadline = limit.map(|l| l.0);
        let past_limit = || FeatureError::TimeLimit(limit.map_or(0, |l| l.1));
        let q = &req.query;
        let plan = Plan::new(&view.def, layer, q, &self.features.settings)?;
        let data = view.data.read();
        let readable = |slot: u32| data.readable(caller, slot);
        let candidates =
            candidates(view, layer, q, deadline, &readable).map_err(|_| past_limit())?;
        let rows =
            matching_rows(&data, caller, candidates, &plan, q, deadline).ok_or_else(past_limit)?;
        Ok(Matched { data, plan, rows })
    }

    /// About the bytes a page of features takes written, refused with
    /// [`FeatureError::AnswerTooLarge`] past `max_answer_bytes`: each geometry's JSON, and
    /// some for its id and each column.
    pub(super) fn answer_fits(
        &self,
        page: &[u32],
        geometries: Option<GeometryColumn<'_>>,
        columns: usize,
    ) -> Result<usize, FeatureError> {
        let geometry: usize = geometries.map_or(0, |g| {
            page.iter()
                .map(|s| match g.get(*s) {
                    Some(GeometryRef::Json(b)) => b.len(),
                    _ => 64,
                })
                .sum()
        });
        let bytes = geometry.saturating_add(page.len().saturating_mul(64 + 32 * columns));
        let limit = self.features.settings.max_answer_bytes;
        if bytes > limit {
            return Err(FeatureError::AnswerTooLarge { bytes, limit });
        }
        Ok(bytes)
    }
}

/// What a page needs of a query's rows: the view locked, the plan, and the rows matched.
pub(super) struct Matched<'v> {
    pub(super) data: parking_lot::RwLockReadGuard<'v, ViewData>,
    pub(super) plan: Plan,
    pub(super) rows: Vec<(i64, u32)>,
}

impl Queries<'_> {
    /// The box `[xmin, ymin, xmax, ymax]` of the layer's features that `caller` may read
    /// (none without such features): a row the caller may not read never widens it.
    pub fn layer_extent(
        &self,
        layer: &Layer,
        caller: &Caller,
    ) -> Option<crate::spatial::pip::BBox> {
        let view = self.features.view(&layer.view)?;
        let index = view
            .indexes
            .read()
            .get(layer.geometry_path.text())
            .cloned()?;
        let data = view.data.read();
        data.readable_extent(caller, layer.geometry_path.text(), &index)
    }
}

/// An extent as the geo data services write it, in WGS84.
fn extent_json([xmin, ymin, xmax, ymax]: crate::spatial::pip::BBox) -> Value {
    json!({
        "xmin": xmin, "ymin": ymin, "xmax": xmax, "ymax": ymax,
        "spatialReference": {"wkid": 4326, "latestWkid": 4326},
    })
}

/// What a query will do, decided and checked before any row is read: the view columns it
/// names, its filter, and its output.
pub(super) struct Plan {
    /// `outFields`, in order.
    pub(super) out: Vec<usize>,
    /// `orderByFields`: column and descending.
    pub(super) order: Vec<(usize, bool)>,
    /// The layer's `timeInfo` start and end columns, when the query has a `time`.
    time: Option<(usize, Option<usize>)>,
    /// The `where` clause.
    filter: Where,
    pub(super) output: Output,
}

/// A query's answer.
/// `limit` of `rows` at even steps, the first included: a sample that keeps the order.
pub(super) fn spread<T>(rows: &[T], limit: usize) -> impl Iterator<Item = &T> {
    let n = rows.len();
    (0..limit.min(n)).map(move |i| &rows[i * n / limit.min(n)])
}

pub(super) enum Output {
    /// `outStatistics` (a column each, none for `count(*)`) by `groupByFieldsForStatistics`.
    Statistics {
        columns: Vec<Option<usize>>,
        groups: Vec<usize>,
    },
    /// `returnCountOnly`.
    Count,
    /// `returnIdsOnly`, every id in order.
    Ids,
    /// Features, ordered, from `offset`, at most `limit`.
    Page { offset: usize, limit: usize },
}

impl Plan {
    pub(super) fn new(
        def: &ViewDef,
        layer: &Layer,
        q: &QuerySpec,
        settings: &crate::FeatureSettings,
    ) -> Result<Plan, FeatureError> {
        let filter = Where::parse(
            q.where_text.as_deref().unwrap_or(""),
            &|name: &str| def.column(name),
            settings.where_limits,
        )?;
        let field = |name: &str, member: &'static str| -> Result<usize, FeatureError> {
            def.column(name).ok_or_else(|| {
                RequestError::UnknownField {
                    name: name.to_string(),
                    member,
                }
                .into()
            })
        };
        let out: Vec<usize> = match q.out_fields.as_deref().map(str::trim) {
            None | Some("") | Some("*") => (0..def.columns.len()).collect(),
            Some(list) => list
                .split(',')
                .map(|f| field(f.trim(), "outFields"))
                .collect::<Result<_, _>>()?,
        };
        let mut order: Vec<(usize, bool)> = Vec::new();
        if let Some(list) = q.order_by.as_deref() {
            for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let mut words = part.split_whitespace();
                let name = words.next().unwrap_or_default();
                let desc = match words.next().map(str::to_ascii_uppercase).as_deref() {
                    None | Some("ASC") => false,
                    Some("DESC") => true,
                    Some(other) => {
                        return Err(RequestError::OrderDirection(other.to_string()).into());
                    }
                };
                order.push((field(name, "orderByFields")?, desc));
            }
        }
        let time = match (&q.time, &layer.time_fields) {
            (Some(_), Some((start, end))) => Some((
                field(start, "timeInfo.startTimeField")?,
                end.as_deref()
                    .map(|e| field(e, "timeInfo.endTimeField"))
                    .transpose()?,
            )),
            _ => None,
        };
        let stats = match &q.statistics {
            None => None,
            Some(specs) => {
                let mut cols = Vec::new();
                for s in specs {
                    let c = if s.kind == StatKind::Count && s.field == "*" {
                        None
                    } else {
                        Some(field(&s.field, "outStatistics")?)
                    };
                    if let Some(c) = c
                        && s.kind.is_numeric()
                        && !matches!(def.columns[c].scalar.kind(), Kind::Int | Kind::Float)
                    {
                        return Err(RequestError::StatisticNotNumeric {
                            kind: s.kind.name(),
                            field: def.columns[c].name.to_string(),
                            scalar: def.columns[c].scalar.name(),
                        }
                        .into());
                    }
                    cols.push(c);
                }
                let groups = q
                    .group_by
                    .clone()
                    .unwrap_or_default()
                    .iter()
                    .map(|g| field(g, "groupByFieldsForStatistics"))
                    .collect::<Result<Vec<_>, _>>()?;
                Some((cols, groups))
            }
        };
        let output = if let Some((columns, groups)) = stats {
            Output::Statistics { columns, groups }
        } else if q.count_only {
            Output::Count
        } else if q.ids_only {
            Output::Ids
        } else {
            Output::Page {
                offset: q.offset,
                limit: q
                    .limit
                    .filter(|l| *l > 0)
                    .unwrap_or(settings.max_record_count)
                    .min(settings.max_record_count),
            }
        };
        Ok(Plan {
            out,
            order,
            time,
            filter,
            output,
        })
    }
}

/// The rows the spatial index gives for the query's geometry (and distance) among those
/// `admit` takes, or `None` for every row when there is no geometry.
pub(super) fn candidates(
    view: &ViewState,
    layer: &Layer,
    q: &QuerySpec,
    deadline: Option<std::time::Instant>,
    admit: crate::spatial::engine::Admit<'_>,
) -> Result<Option<Vec<u32>>, crate::spatial::PastDeadline> {
    let Some((query, rel)) = &q.geometry else {
        return Ok(None);
    };
    let index = view.indexes.read().get(layer.geometry_path.text()).cloned();
    Ok(Some(match (index, q.distance) {
        (Some(engine), Some(meters)) => {
            engine.query_distance_admitted(query, meters, deadline, admit)?
        }
        (Some(engine), None) => engine.query_admitted(query, *rel, deadline, admit)?,
        (None, _) => Vec::new(),
    }))
}

/// `(OBJECTID, slot)` of the candidate rows that pass the filters: readable by the caller,
/// among `objectIds`, within `time`, and matching `where`. `None` past the deadline (a look
/// at the clock every 4,096 rows).
#[allow(clippy::too_many_arguments)]
pub(super) fn matching_rows(
    data: &ViewData,
    caller: &Caller,
    candidates: Option<Vec<u32>>,
    plan: &Plan,
    q: &QuerySpec,
    deadline: Option<std::time::Instant>,
) -> Option<Vec<(i64, u32)>> {
    let object_ids: Option<std::collections::HashSet<i64>> =
        q.object_ids.as_ref().map(|v| v.iter().copied().collect());
    let passes = |slot: u32| -> bool {
        if !data.readable(caller, slot) {
            return false;
        }
        if let Some(ids) = &object_ids
            && !data.id_of(slot).is_some_and(|id| ids.contains(&id))
        {
            return false;
        }
        if let (Some((start, end)), Some((from, to))) = (plan.time, q.time) {
            let row = data.row(slot);
            let t0 = match row.get(start) {
                Datum::Date(ms) | Datum::Int(ms) => Some(ms),
                _ => None,
            };
            let t1 = end.map_or(t0, |e| match row.get(e) {
                Datum::Date(ms) | Datum::Int(ms) => Some(ms),
                _ => t0,
            });
            let Some(t0) = t0 else { return false };
            let t1 = t1.unwrap_or(t0);
            if from.is_some_and(|f| t1 < f) || to.is_some_and(|t| t0 > t) {
                return false;
            }
        }
        plan.filter.matches(&data.row(slot))
    };
    let mut seen = 0usize;
    let mut stopped = false;
    let mut within = |_: &u32| {
        seen += 1;
        if seen.is_multiple_of(4096) && deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            stopped = true;
        }
        !stopped
    };
    let rows: Vec<(i64, u32)> = match candidates {
        Some(c) => c
            .into_iter()
            .take_while(&mut within)
            .filter(|s| passes(*s))
            .filter_map(|s| data.id_of(s).map(|id| (id, s)))
            .collect(),
        None => data
            .live_slots()
            .take_while(&mut within)
            .filter(|s| passes(*s))
            .filter_map(|s| data.id_of(s).map(|id| (id, s)))
            .collect(),
    };
    (!stopped).then_some(rows)
}

/// `orderByFields` (nulls first, then by OBJECTID), or OBJECTID order.
pub(super) fn sort_rows(rows: &mut [(i64, u32)], order: &[(usize, bool)], data: &ViewData) {
    if order.is_empty() {
        rows.sort_unstable();
        return;
    }
    rows.sort_by(|a, b| {
        for &(col, desc) in order {
            let o = order_values(
                &data.columns[col].get(a.1 as usize),
                &data.columns[col].get(b.1 as usize),
                desc,
            );
            if o != Ordering::Equal {
                return o;
            }
        }
        a.0.cmp(&b.0)
    });
}

/// Two values of an `orderByFields` column: nulls first, reversed when descending.
pub(super) fn order_values(a: &Datum<'_>, b: &Datum<'_>, desc: bool) -> Ordering {
    let o = match (a, b) {
        (Datum::Null, Datum::Null) => Ordering::Equal,
        (Datum::Null, _) => Ordering::Less,
        (_, Datum::Null) => Ordering::Greater,
        _ => compare(a, b).unwrap_or(Ordering::Equal),
    };
    if desc { o.reverse() } else { o }
}

/// One statistic over some rows. Nulls are skipped; `stddev` and `var` are the sample
/// forms (n - 1), null below two values.
pub(super) fn statistic<'d>(
    kind: StatKind,
    col: Option<usize>,
    data: &'d ViewData,
    slots: &[u32],
) -> Datum<'d> {
    let Some(col) = col else {
        return Datum::Int(slots.len() as i64);
    };
    let values: Vec<Datum<'d>> = slots
        .iter()
        .map(|s| data.columns[col].get(*s as usize))
        .filter(|v| *v != Datum::Null)
        .collect();
    let nums = || {
        values.iter().filter_map(|v| match v {
            Datum::Int(i) => Some(*i as f64),
            Datum::Float(f) => Some(*f),
            Datum::Bool(b) => Some(f64::from(u8::from(*b))),
            Datum::Date(d) => Some(*d as f64),
            _ => None,
        })
    };
    match kind {
        StatKind::Count => Datum::Int(values.len() as i64),
        StatKind::Min | StatKind::Max => values
            .iter()
            .cloned()
            .reduce(|a, b| {
                let o = compare(&a, &b).unwrap_or(Ordering::Equal);
                let keep_a = if kind == StatKind::Min {
                    o != Ordering::Greater
                } else {
                    o != Ordering::Less
                };
                if keep_a { a } else { b }
            })
            .unwrap_or(Datum::Null),
        StatKind::Sum => {
            if values.is_empty() {
                return Datum::Null;
            }
            // Integers sum exactly while they fit; past i64 the sum is a float.
            let exact = values.iter().try_fold(0i64, |acc, v| match v {
                Datum::Int(i) => acc.checked_add(*i),
                _ => None,
            });
            match exact {
                Some(total) => Datum::Int(total),
                None => Datum::Float(ascending_sum(nums().collect())),
            }
        }
        StatKind::Avg => {
            let count = nums().count();
            if count == 0 {
                return Datum::Null;
            }
            Datum::Float(match exact_sums(&values) {
                Some((sum, _)) => sum as f64 / count as f64,
                None => ascending_sum(nums().collect()) / count as f64,
            })
        }
        StatKind::Var | StatKind::Stddev => {
            let count = nums().count();
            if count < 2 {
                return Datum::Null;
            }
            let k = count as f64;
            // (n Σx² − (Σx)²) / (n (n − 1)) for integers, exact until the last division.
            let exact = exact_sums(&values).and_then(|(sum, squares)| {
                (count as i128)
                    .checked_mul(squares)?
                    .checked_sub(sum.checked_mul(sum)?)
            });
            let var = match exact {
                Some(spread) => spread as f64 / (k * (k - 1.0)),
                None => float_variance(nums().collect()),
            };
            Datum::Float(if kind == StatKind::Var {
                var
            } else {
                var.sqrt()
            })
        }
    }
}

/// The sum and the sum of squares of integer values, exactly; `None` when some value is not
/// an integer or the sums do not fit. The same whatever the rows' order.
fn exact_sums(values: &[Datum<'_>]) -> Option<(i128, i128)> {
    values.iter().try_fold((0i128, 0i128), |(s, q), v| {
        let x = match v {
            Datum::Int(i) | Datum::Date(i) => *i as i128,
            Datum::Bool(b) => i128::from(*b),
            _ => return None,
        };
        Some((s.checked_add(x)?, q.checked_add(x.checked_mul(x)?)?))
    })
}

/// A float sum taken in ascending order, so that it does not depend on the rows' order.
fn ascending_sum(mut n: Vec<f64>) -> f64 {
    n.sort_unstable_by(f64::total_cmp);
    n.iter().sum()
}

/// The sample variance of floats, summed in ascending order.
fn float_variance(mut n: Vec<f64>) -> f64 {
    n.sort_unstable_by(f64::total_cmp);
    let count = n.len() as f64;
    let mean = n.iter().sum::<f64>() / count;
    let mut deviations: Vec<f64> = n.iter().map(|x| (x - mean) * (x - mean)).collect();
    deviations.sort_unstable_by(f64::total_cmp);
    deviations.iter().sum::<f64>() / (count - 1.0)
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn spread_takes_even_steps_from_the_first() {
        let rows: Vec<u32> = (0..10).collect();
        let got: Vec<u32> = spread(&rows, 4).copied().collect();
        assert_eq!(got, [0, 2, 5, 7]);
        let all: Vec<u32> = spread(&rows, 20).copied().collect();
        assert_eq!(all, rows);
        assert_eq!(spread(&rows, 0).count(), 0);
        assert_eq!(spread(&rows[..0], 3).count(), 0);
    }
}
