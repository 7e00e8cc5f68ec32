//! The in-process readers' answers: OGC API items written straight from the view, and the
//! features of a map tile as typed values and shared geometries. No geoQueryService JSON is
//! made and read back in between, so a page costs about its answer's size.

use super::*;
use crate::spatial::engine::Indexed;

/// A page of OGC API items: how many features matched, and the answer so far: what the
/// caller's `head` wrote, then the page's features as a JSON array's members
/// (`{"type":"Feature","id":…,"properties":{…},"geometry":…}`, comma-separated), in one
/// buffer, so that the answer is never copied.
#[derive(Debug, Default)]
pub struct ItemsPage {
    pub matched: usize,
    pub returned: usize,
    pub features: Vec<u8>,
}

/// What an answer writes before its features, given how many matched and are returned.
pub type ItemsHead<'a> = &'a (dyn Fn(usize, usize) -> Vec<u8> + Sync);

/// An attribute value of a tile feature.
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    Int(i64),
    Float(f64),
    Bool(bool),
    Text(String),
}

/// A tile feature's geometry: a point's coordinates, or what the index holds, shared.
#[derive(Debug, Clone)]
pub enum TileGeometry {
    Point(f64, f64),
    Indexed(Indexed),
}

/// One feature of a tile: its id, its attributes by column (none for a null), its geometry.
#[derive(Debug, Clone)]
pub struct TileFeature {
    pub id: i64,
    pub attrs: Vec<Option<Attr>>,
    pub geometry: TileGeometry,
}

/// A tile's features and the names of their attribute columns.
#[derive(Debug, Default)]
pub struct TilePage {
    pub columns: Vec<String>,
    pub features: Vec<TileFeature>,
}

/// A typed reader's layer: its descriptor, the layer's place there, and its view (none until
/// the view's template exists).
type Target = (Arc<Descriptor>, usize, Option<Arc<ViewState>>);

impl Queries<'_> {
    /// The layer `req` names and its view, for the typed readers (which always name one).
    fn typed_target(&self, caller: &Caller, req: &FeatureRequest) -> Result<Target, FeatureError> {
        let descriptor = self
            .features
            .descriptor(&req.service, caller.roles())
            .ok_or_else(|| FeatureError::ServiceNotFound(req.service.clone()))?;
        let resolved = self.resolve(req, &descriptor)?.ok_or_else(|| {
            FeatureError::LayerNotFound(req.layer_text.clone().unwrap_or_default())
        })?;
        let at = descriptor
            .layers
            .iter()
            .position(|l| std::ptr::eq(l, resolved.layer))
            .unwrap_or_default();
        let view = resolved.view;
        Ok((descriptor, at, view))
    }

    /// A page of OGC API items for `caller`: the query's matches in its order, from its
    /// offset, at most its limit, every column and the geometry, written as items. Refused
    /// with [`FeatureError::AnswerTooLarge`] before anything is written when the page would
    /// pass `max_answer_bytes`.
    pub fn items_page(
        &self,
        caller: &Caller,
        req: &FeatureRequest,
        limit: Option<(std::time::Instant, u64)>,
        head: ItemsHead<'_>,
    ) -> Result<ItemsPage, FeatureError> {
        let (descriptor, at, view) = self.typed_target(caller, req)?;
        let layer = &descriptor.layers[at];
        let Some(view) = view else {
            return Ok(ItemsPage {
                features: head(0, 0),
                ..ItemsPage::default()
            });
        };
        let mut m = self.matched(caller, req, layer, &view, limit)?;
        sort_rows(&mut m.rows, &m.plan.order, &m.data);
        let (offset, count) = match m.plan.output {
            Output::Page { offset, limit } => (offset, limit),
            _ => (0, 0),
        };
        let start = offset.min(m.rows.len());
        let end = start.saturating_add(count).min(m.rows.len());
        let page: Vec<u32> = m.rows[start..end].iter().map(|r| r.1).collect();
        let geometries = m.data.geometry_column(layer.geometry_path.text());
        let bytes = self.answer_fits(&page, Some(geometries), m.plan.out.len())?;
        let mut features = head(m.rows.len(), page.len());
        features.reserve(bytes + 1024);
        for (i, &slot) in page.iter().enumerate() {
            if i > 0 {
                features.push(b',');
            }
            write_feature(&mut features, &m.data, slot, &m.plan.out, Some(geometries));
        }
        Ok(ItemsPage {
            matched: m.rows.len(),
            returned: page.len(),
            features,
        })
    }

    /// A map tile's features for `caller`: at most the query's limit, an even sample of the
    /// matches when there are more, each with its attributes and its geometry as the index
    /// holds it (shared, not copied).
    pub fn tile_page(
        &self,
        caller: &Caller,
        req: &FeatureRequest,
        limit: Option<(std::time::Instant, u64)>,
    ) -> Result<TilePage, FeatureError> {
        let (descriptor, at, view) = self.typed_target(caller, req)?;
        let layer = &descriptor.layers[at];
        let Some(view) = view else {
            return Ok(TilePage::default());
        };
        let path = layer.geometry_path.text();
        let index = view.indexes.read().get(path).cloned();
        let mut m = self.matched(caller, req, layer, &view, limit)?;
        sort_rows(&mut m.rows, &m.plan.order, &m.data);
        let count = match m.plan.output {
            Output::Page { limit, .. } => limit,
            _ => 0,
        };
        let page: Vec<u32> = spread(&m.rows, count).map(|r| r.1).collect();
        let geometries = m.data.geometry_column(path);
        let columns: Vec<String> = m
            .plan
            .out
            .iter()
            .map(|&c| m.data.def.columns[c].name.to_string())
            .collect();
        let mut features = Vec::with_capacity(page.len());
        for slot in page {
            let geometry = match geometries.get(slot) {
                Some(GeometryRef::Point(x, y)) => TileGeometry::Point(x, y),
                Some(GeometryRef::Json(_)) => match index.as_ref().and_then(|e| e.indexed(slot)) {
                    Some(g) => TileGeometry::Indexed(g),
                    None => continue,
                },
                None => continue,
            };
            let attrs = m
                .plan
                .out
                .iter()
                .map(|&c| match m.data.columns[c].get(slot as usize) {
                    // As geoQueryService writes them: booleans as 1 or 0, dates as text.
                    Datum::Null => None,
                    Datum::Int(i) => Some(Attr::Int(i)),
                    Datum::Date(ms) => Some(Attr::Text(format_datetime(ms))),
                    Datum::Float(f) if f.is_finite() => Some(Attr::Float(f)),
                    Datum::Float(_) => None,
                    Datum::Bool(b) => Some(Attr::Int(i64::from(b))),
                    Datum::Str(s) => Some(Attr::Text(s.into_owned())),
                })
                .collect();
            features.push(TileFeature {
                id: m.data.id_of(slot).unwrap_or_default(),
                attrs,
                geometry,
            });
        }
        Ok(TilePage { columns, features })
    }
}
