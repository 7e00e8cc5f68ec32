//! Which rows a cluster node holds, and which node answers for a row when a query is spread
//! over several.
//!
//! The cluster's shards are H3 cells mapped to `shards` numbers by a [`Partitioner`] of its
//! own (not the engine's). A node holds some of them. A row is held when the cover of its
//! geometry's box, or its *primary* shard, is among them; a row with no geometry at some
//! path is held everywhere. The primary shard names the one node that answers for the row
//! when a query goes to several: the shard of a point, else a hash of the geometry's bytes
//! (a row is held where its primary shard is, whatever that shard, so any fixed function
//! does), else of its `OBJECTID`.
//!
//! Why this is enough: a row that meets a query geometry meets it at some point `x` of both
//! boxes, so the shard of `x` is in both covers; a node holding every shard of the query's
//! cover holds every row that can match, and answers alone. Any other query is split by
//! primary shard: each shard given to one node that holds it, each row answered once.

use super::view::GeometryRef;
use crate::spatial::partition::{Partitioner, ShardSet};
use crate::spatial::pip::BBox;

/// The shards a node holds, of a cluster's `shards`.
#[derive(Debug)]
pub struct Placement {
    resolution: u8,
    partitioner: Partitioner,
    held: ShardSet,
    signature: String,
    partition: String,
}

impl Placement {
    /// `held` must be numbers below `shards`; `resolution` is the cells' H3 resolution.
    pub fn new(resolution: u8, shards: usize, held: &[usize]) -> Result<Placement, String> {
        if held.is_empty() {
            return Err("a node must hold at least one shard".into());
        }
        Self::holding(resolution, shards, held)
    }

    /// The same partition holding `held` instead (none: a node placed automatically that has
    /// no shard yet keeps a stub of every document with a geometry).
    pub fn new_held(&self, held: &[usize]) -> Result<Placement, String> {
        Self::holding(self.resolution, self.shards(), held)
    }

    /// A node of this partition that holds no shard yet.
    pub fn none(resolution: u8, shards: usize) -> Result<Placement, String> {
        Self::holding(resolution, shards, &[])
    }

    fn holding(resolution: u8, shards: usize, held: &[usize]) -> Result<Placement, String> {
        let partitioner = Partitioner::new(resolution, shards)?;
        let mut set = ShardSet::default();
        for &s in held {
            if s >= shards {
                return Err(format!(
                    "shard {s} is not below the cluster's {shards} shards"
                ));
            }
            set.insert(s);
        }
        let list: Vec<usize> = set.iter().collect();
        Ok(Placement {
            resolution,
            partitioner,
            held: set,
            signature: format!("placement r{resolution} of {shards} holding {list:?}"),
            partition: format!("h3 r{resolution} / {shards} shards"),
        })
    }

    pub fn shards(&self) -> usize {
        self.partitioner.shards()
    }

    pub fn held(&self) -> Vec<usize> {
        self.held.iter().collect()
    }

    /// The cluster's shards, which every node must agree on: resolution and count.
    pub fn partition(&self) -> &str {
        &self.partition
    }

    /// What a saved view built under this placement must be read back under.
    pub fn signature(&self) -> &str {
        &self.signature
    }

    /// Whether a row with these geometries (one per geometry path, with its box) is held.
    pub(crate) fn holds<'a>(
        &self,
        geometries: impl IntoIterator<Item = Option<(GeometryRef<'a>, BBox)>>,
    ) -> bool {
        for g in geometries {
            let Some((g, b)) = g else { return true };
            if self.held.contains(self.primary_of(Some(g), 0)) {
                return true;
            }
            if self
                .partitioner
                .shards_for_bbox(&b)
                .iter()
                .any(|s| self.held.contains(s))
            {
                return true;
            }
        }
        false
    }

    /// Where a document's content is kept: `None` here, else the shards whose holders keep
    /// it. Every GeoJSON geometry anywhere in the document counts, whatever the templates
    /// read, with the shards `holds` would give a row of it (its primary shard and its box's
    /// cover): a row any template makes of the document is then held only where its content
    /// is, and a view built again from the stored documents finds every row it holds. A
    /// document with no geometry is kept everywhere, as its rows are held.
    pub fn home(&self, doc: &serde_json::Value) -> Option<Vec<u16>> {
        let mut home = ShardSet::default();
        let mut found = false;
        let mut stack = vec![doc];
        while let Some(v) = stack.pop() {
            match v {
                serde_json::Value::Object(o) => {
                    if o.get("type").is_some_and(serde_json::Value::is_string)
                        && let Ok(g) = crate::spatial::parse_geojson(v)
                        && let Some(b) = crate::spatial::predicate::bbox_of(&g)
                    {
                        found = true;
                        let bytes;
                        let r = match &g {
                            geo::Geometry::Point(p) => GeometryRef::Point(p.x(), p.y()),
                            _ => {
                                bytes = serde_json::to_vec(v).unwrap_or_default();
                                GeometryRef::Json(&bytes)
                            }
                        };
                        home.insert(self.primary_of(Some(r), 0));
                        for s in self.partitioner.shards_for_bbox(&b).iter() {
                            home.insert(s);
                        }
                    }
                    stack.extend(o.values());
                }
                serde_json::Value::Array(a) => stack.extend(a.iter()),
                _ => {}
            }
        }
        if !found || home.iter().any(|s| self.held.contains(s)) {
            return None;
        }
        Some(home.iter().map(|s| s as u16).collect())
    }

    /// The shard whose node answers for a row with geometry `g` and `OBJECTID` `id`.
    pub(crate) fn primary_of(&self, g: Option<GeometryRef<'_>>, id: i64) -> usize {
        let n = self.partitioner.shards() as u64;
        match g {
            Some(GeometryRef::Point(x, y)) => self.partitioner.shard_of_point(x, y),
            Some(GeometryRef::Json(bytes)) => (hash_bytes(bytes) % n) as usize,
            None => (mix(id as u64) % n) as usize,
        }
    }
}

/// Where a query goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route<N> {
    /// One node holds every row the query can match: it answers alone, as a single node.
    One(N),
    /// Each node answers for the rows of the shards given it (every shard to one node).
    Spread(Vec<(N, Vec<usize>)>),
}

impl Placement {
    /// Route a query over `nodes` (each with the shards it holds, in the order they are to
    /// be preferred). `region`: the query geometry's box when every row it can match meets
    /// that box (not for a query without geometry or with a distance). `Err` names a shard
    /// no node holds.
    pub fn route<N: Clone>(
        &self,
        region: Option<&BBox>,
        nodes: &[(N, Vec<usize>)],
    ) -> Result<Route<N>, usize> {
        if let Some(b) = region {
            let cover = self.partitioner.shards_meeting(b);
            if let Some((n, _)) = nodes
                .iter()
                .find(|(_, held)| cover.iter().all(|s| held.contains(&s)))
            {
                return Ok(Route::One(n.clone()));
            }
        }
        let mut given: Vec<(N, Vec<usize>)> = Vec::new();
        let mut taken = vec![false; self.shards()];
        for (n, held) in nodes {
            let mine: Vec<usize> = held
                .iter()
                .copied()
                .filter(|&s| s < taken.len() && !std::mem::replace(&mut taken[s], true))
                .collect();
            if !mine.is_empty() {
                given.push((n.clone(), mine));
            }
        }
        match taken.iter().position(|t| !t) {
            Some(missing) => Err(missing),
            None => Ok(Route::Spread(given)),
        }
    }
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e3779b97f4a7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
    x ^ (x >> 31)
}

/// A fixed hash of a geometry's text: its length and its first and last 64 bytes, so a large
/// polygon costs no more than a small one.
fn hash_bytes(b: &[u8]) -> u64 {
    let head = &b[..b.len().min(64)];
    let tail = &b[b.len().saturating_sub(64)..];
    let mut h = mix(b.len() as u64);
    for chunk in head.chunks(8).chain(tail.chunks(8)) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = mix(h ^ u64::from_le_bytes(w));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_point_is_held_by_its_shard_alone_and_a_null_everywhere() {
        let all: Vec<Placement> = (0..4)
            .map(|s| Placement::new(3, 4, &[s]).unwrap())
            .collect();
        for i in 0..2000 {
            let x = -180.0 + (i as f64 * 7.37) % 360.0;
            let y = -85.0 + (i as f64 * 3.11) % 170.0;
            let g = GeometryRef::Point(x, y);
            let holders: Vec<usize> = (0..4)
                .filter(|&s| all[s].holds([Some((g, [x, y, x, y]))]))
                .collect();
            assert_eq!(holders, [all[0].primary_of(Some(g), 0)], "{x} {y}");
        }
        assert!(all.iter().all(|p| p.holds([None])));
        assert!(Placement::new(3, 4, &[4]).is_err());
        assert!(Placement::new(3, 4, &[]).is_err());
    }

    #[test]
    fn a_query_goes_to_one_node_holding_its_cover_else_every_shard_once() {
        let p = Placement::new(2, 6, &[0]).unwrap();
        let nodes = vec![
            ("a", vec![0, 1, 2, 3]),
            ("b", vec![2, 3, 4, 5]),
            ("c", vec![4, 5, 0, 1]),
        ];
        // A point: the first node holding its shard.
        let s = p.primary_of(Some(GeometryRef::Point(2.35, 48.85)), 0);
        let first = nodes.iter().find(|n| n.1.contains(&s)).unwrap().0;
        assert_eq!(
            p.route(Some(&[2.35, 48.85, 2.35, 48.85]), &nodes),
            Ok(Route::One(first))
        );
        // Without a region: every shard once, the earlier nodes first.
        assert_eq!(
            p.route(None, &nodes),
            Ok(Route::Spread(vec![
                ("a", vec![0, 1, 2, 3]),
                ("b", vec![4, 5])
            ]))
        );
        // A continent covers every shard, which no node holds alone.
        let world = [-170.0, -60.0, 170.0, 80.0];
        assert!(matches!(
            p.route(Some(&world), &nodes),
            Ok(Route::Spread(_))
        ));
        // Shards 4 and 5 live on b and c only.
        assert_eq!(p.route(None, &nodes[..1]), Err(4));
    }

    /// A document is kept by every node that holds a row any template could make of it (a
    /// geometry at any path, whole), so it is never kept nowhere; and a document without
    /// geometry is kept everywhere.
    #[test]
    fn a_document_is_kept_wherever_a_row_of_it_is_held() {
        let nodes: Vec<Placement> = (0..6)
            .map(|s| Placement::new(2, 6, &[s]).unwrap())
            .collect();
        let mut seen_stub = 0;
        for i in 0..500 {
            let (x, y) = (
                -170.0 + (i as f64 * 13.37) % 340.0,
                -70.0 + (i as f64 * 7.1) % 140.0,
            );
            let (x2, y2) = ((x + 97.0) % 170.0, (y + 31.0) % 80.0);
            let point = json!({"type": "Point", "coordinates": [x, y]});
            let square = json!({"type": "Polygon", "coordinates": [[
                [x2, y2], [x2 + 3.0, y2], [x2 + 3.0, y2 + 2.0], [x2, y2 + 2.0], [x2, y2]]]});
            let doc = json!({"type": "Feature", "geometry": point,
                "properties": {"name": i, "area": {"shape": square}}});
            // The rows a template could make: each geometry alone, at its own path.
            let rows = [&doc["geometry"], &doc["properties"]["area"]["shape"]];
            for n in &nodes {
                let holds_a_row = rows.iter().any(|g| {
                    let geo = crate::spatial::parse_geojson(g).unwrap();
                    let b = crate::spatial::predicate::bbox_of(&geo).unwrap();
                    let bytes = serde_json::to_vec(g).unwrap();
                    let r = match geo {
                        geo::Geometry::Point(p) => GeometryRef::Point(p.x(), p.y()),
                        _ => GeometryRef::Json(&bytes),
                    };
                    n.holds([Some((r, b))])
                });
                let home = n.home(&doc);
                if holds_a_row {
                    assert_eq!(home, None, "doc {i} on {:?}", n.held());
                }
                if let Some(shards) = home {
                    seen_stub += 1;
                    // The shards named are those of the nodes that keep it.
                    for s in shards {
                        assert_eq!(nodes[s as usize].home(&doc), None, "doc {i} shard {s}");
                    }
                }
            }
            assert!(
                nodes.iter().any(|n| n.home(&doc).is_none()),
                "doc {i} kept nowhere"
            );
            // A point's document is kept by its shard's node alone.
            let only_point = json!({"geometry": point, "properties": {"name": i}});
            let keepers: Vec<usize> = (0..6)
                .filter(|&s| nodes[s].home(&only_point).is_none())
                .collect();
            let shard = nodes[0].primary_of(Some(GeometryRef::Point(x, y)), 0);
            assert_eq!(keepers, [shard], "point doc {i}");
        }
        assert!(seen_stub > 100, "{seen_stub} stubs");
        let plain = json!({"name": "no geometry", "type": "Feature", "geometry": null});
        assert!(nodes.iter().all(|n| n.home(&plain).is_none()));
    }
}
