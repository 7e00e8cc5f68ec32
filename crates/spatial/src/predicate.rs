//! Spatial relations: the feature's relation to the query geometry (docs/contract.md §5).
//!
//! - A query point against a line or polygon is answered by exact point location (the
//!   striped parts of [`super::pip`]): `intersects` = not exterior, `contains` = interior,
//!   `touches` = boundary. Other relations use geo's DE-9IM `relate`.
//! - A query region against a line or polygon uses `relate` (DE-9IM, as GEOS defines it),
//!   except `envelope-intersects`, which compares bounding boxes.
//! - Point features (Point, MultiPoint) match when one of their points lies inside or on the
//!   query geometry, whatever the relation; for `envelope-intersects`, inside or on its box.
//!
//! A point exactly on a polygon's edge or vertex is on its boundary: `contains` is false
//! there and `intersects` and `touches` are true, as in GEOS. Polygons sharing an edge
//! touch; they do not overlap.

use geo::{Coord, Geometry, LineString, Point, Polygon, Relate};

use super::pip::{self, BBox, Location, PolygonPart};

/// The relation asked for, named as the feature's relation to the query geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Relation {
    Intersects,
    Contains,
    Within,
    Crosses,
    Overlaps,
    Touches,
    EnvelopeIntersects,
}

impl Relation {
    pub const ALL: [Relation; 7] = [
        Relation::Intersects,
        Relation::Contains,
        Relation::Within,
        Relation::Crosses,
        Relation::Overlaps,
        Relation::Touches,
        Relation::EnvelopeIntersects,
    ];

    /// `intersects`, `contains`, … `envelope-intersects`, case-insensitively and ignoring
    /// `-` and `_` (`envelopeIntersects`, `ENVELOPE_INTERSECTS`). Allocates nothing: it
    /// runs on every query.
    pub fn parse(name: &str) -> Option<Relation> {
        fn letters(s: &str) -> impl Iterator<Item = u8> + '_ {
            s.bytes()
                .filter(|b| *b != b'-' && *b != b'_')
                .map(|b| b.to_ascii_lowercase())
        }
        Relation::ALL
            .into_iter()
            .find(|r| letters(r.name()).eq(letters(name)))
    }

    pub fn name(self) -> &'static str {
        match self {
            Relation::Intersects => "intersects",
            Relation::Contains => "contains",
            Relation::Within => "within",
            Relation::Crosses => "crosses",
            Relation::Overlaps => "overlaps",
            Relation::Touches => "touches",
            Relation::EnvelopeIntersects => "envelope-intersects",
        }
    }

    fn holds(self, m: &geo::relate::IntersectionMatrix) -> bool {
        match self {
            Relation::Intersects => m.is_intersects(),
            Relation::Contains => m.is_contains(),
            Relation::Within => m.is_within(),
            Relation::Crosses => m.is_crosses(),
            Relation::Overlaps => m.is_overlaps(),
            Relation::Touches => m.is_touches(),
            Relation::EnvelopeIntersects => m.is_intersects(),
        }
    }
}

pub fn bbox_of(g: &Geometry<f64>) -> Option<BBox> {
    use geo::BoundingRect;
    g.bounding_rect()
        .map(|r| [r.min().x, r.min().y, r.max().x, r.max().y])
}

/// A line or polygon feature, prepared for fast exact tests. Its geometry is stored once;
/// every shard that references it holds an `Arc`.
#[derive(Debug)]
pub struct Shape {
    pub geometry: Geometry<f64>,
    pub bbox: BBox,
    /// Banded, striped pieces of each polygon; empty for lines.
    pub parts: Vec<PolygonPart>,
}

impl Shape {
    /// `None` for point geometries, which are not shapes.
    pub fn new(geometry: Geometry<f64>) -> Option<Shape> {
        let bbox = bbox_of(&geometry)?;
        let parts = match &geometry {
            Geometry::Polygon(p) => pip::polygon_parts(0, p),
            Geometry::MultiPolygon(mp) => {
                mp.0.iter()
                    .enumerate()
                    .flat_map(|(i, p)| pip::polygon_parts(i as u32, p))
                    .collect()
            }
            Geometry::LineString(_) | Geometry::MultiLineString(_) => Vec::new(),
            _ => return None,
        };
        Some(Shape {
            geometry,
            bbox,
            parts,
        })
    }

    pub(crate) fn is_polygonal(&self) -> bool {
        matches!(
            self.geometry,
            Geometry::Polygon(_) | Geometry::MultiPolygon(_)
        )
    }

    pub fn lines(&self) -> &[LineString<f64>] {
        match &self.geometry {
            Geometry::LineString(l) => std::slice::from_ref(l),
            Geometry::MultiLineString(ml) => &ml.0,
            _ => &[],
        }
    }

    /// Exact location of a point relative to the whole shape.
    pub fn locate(&self, x: f64, y: f64) -> Location {
        if !pip::bbox_contains(&self.bbox, x, y) {
            return Location::Exterior;
        }
        if self.is_polygonal() {
            pip::locate_in_parts(&self.parts, x, y)
        } else {
            pip::locate_on_lines(self.lines(), x, y)
        }
    }

    pub fn heap_bytes(&self) -> usize {
        use geo::CoordsIter;
        self.parts
            .iter()
            .map(|p| p.heap_bytes() + std::mem::size_of::<PolygonPart>())
            .sum::<usize>()
            + self.geometry.coords_count() * std::mem::size_of::<Coord<f64>>()
    }
}

/// How a query geometry is tested against point features.
#[derive(Debug)]
enum QueryKind {
    Point(f64, f64),
    Points(Vec<Coord<f64>>),
    /// An axis-aligned rectangle (how an envelope arrives): containment is a box test.
    Rect,
    Shape(Shape),
}

/// A validated query geometry, prepared once per request.
#[derive(Debug)]
pub struct Query {
    geometry: Geometry<f64>,
    bbox: BBox,
    kind: QueryKind,
}

fn is_axis_rect(p: &Polygon<f64>) -> bool {
    let c = &p.exterior().0;
    if !p.interiors().is_empty() || c.len() != 5 {
        return false;
    }
    let xs: Vec<f64> = c.iter().map(|c| c.x).collect();
    let ys: Vec<f64> = c.iter().map(|c| c.y).collect();
    (0..4).all(|i| c[i].x == c[i + 1].x || c[i].y == c[i + 1].y)
        && xs.iter().filter(|x| **x == xs[0]).count() >= 2
        && ys.iter().filter(|y| **y == ys[0]).count() >= 2
        && {
            let (x0, x1) = (
                xs.iter().cloned().fold(f64::INFINITY, f64::min),
                xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
            );
            let (y0, y1) = (
                ys.iter().cloned().fold(f64::INFINITY, f64::min),
                ys.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
            );
            x0 < x1
                && y0 < y1
                && c.iter()
                    .all(|c| (c.x == x0 || c.x == x1) && (c.y == y0 || c.y == y1))
        }
}

impl Query {
    /// Prepare a (validated) geometry for querying.
    pub fn new(geometry: Geometry<f64>) -> Query {
        let bbox = bbox_of(&geometry).unwrap_or([0.0, 0.0, -1.0, -1.0]);
        let kind = match &geometry {
            Geometry::Point(p) => QueryKind::Point(p.x(), p.y()),
            Geometry::MultiPoint(mp) => QueryKind::Points(mp.0.iter().map(|p| p.0).collect()),
            Geometry::Polygon(p) if is_axis_rect(p) => QueryKind::Rect,
            other => match Shape::new(other.clone()) {
                Some(s) => QueryKind::Shape(s),
                None => QueryKind::Points(Vec::new()),
            },
        };
        Query {
            geometry,
            bbox,
            kind,
        }
    }

    pub fn point(x: f64, y: f64) -> Query {
        Query::new(Geometry::Point(Point::new(x, y)))
    }

    pub fn geometry(&self) -> &Geometry<f64> {
        &self.geometry
    }

    pub fn bbox(&self) -> &BBox {
        &self.bbox
    }

    /// The query point, when the query is a single point (the one-shard fast path).
    pub fn as_point(&self) -> Option<(f64, f64)> {
        match self.kind {
            QueryKind::Point(x, y) => Some((x, y)),
            _ => None,
        }
    }

    /// Whether a point feature at `(x, y)` matches: inside or on the query geometry (or its
    /// box, for `envelope-intersects`), whatever the relation.
    #[inline]
    pub(crate) fn matches_point(&self, x: f64, y: f64, rel: Relation) -> bool {
        if rel == Relation::EnvelopeIntersects {
            return pip::bbox_contains(&self.bbox, x, y);
        }
        match &self.kind {
            QueryKind::Point(qx, qy) => *qx == x && *qy == y,
            QueryKind::Points(ps) => ps.iter().any(|c| c.x == x && c.y == y),
            QueryKind::Rect => pip::bbox_contains(&self.bbox, x, y),
            QueryKind::Shape(s) => s.locate(x, y) != Location::Exterior,
        }
    }

    /// Whether a line or polygon feature matches. To test many features, prepare the
    /// query once with [`Query::prepared`].
    pub(crate) fn matches_shape(&self, f: &Shape, rel: Relation) -> bool {
        self.prepared().matches_shape(f, rel)
    }

    /// The query ready to test many features on one thread.
    pub fn prepared(&self) -> PreparedQuery<'_> {
        PreparedQuery {
            query: self,
            graph: std::cell::OnceCell::new(),
        }
    }
}

/// A query as one thread tests features against it: geo's noded graph of the query
/// geometry is made on the first feature that needs the full relate, and reused for the
/// rest, instead of noding the query again for each (for a query ring of n edges that is up
/// to n^2 candidate pairs every time). Not `Send`: make one per thread.
pub struct PreparedQuery<'q> {
    query: &'q Query,
    /// `None` when preparing failed (geo panicked on a degenerate geometry).
    graph: std::cell::OnceCell<Option<geo::PreparedGeometry<'q, &'q Geometry<f64>>>>,
}

impl PreparedQuery<'_> {
    /// Whether a line or polygon feature matches.
    pub(crate) fn matches_shape(&self, f: &Shape, rel: Relation) -> bool {
        let q = self.query;
        if !pip::bbox_intersects(&f.bbox, &q.bbox) {
            return false;
        }
        if rel == Relation::EnvelopeIntersects {
            return true;
        }
        if let QueryKind::Point(x, y) = q.kind
            && let Some(answer) = point_fast_path(f.locate(x, y), rel)
        {
            return answer;
        }
        if let (QueryKind::Rect, Relation::Intersects) = (&q.kind, rel) {
            return rect_intersects(&q.bbox, f);
        }
        let graph = self.graph.get_or_init(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                geo::PreparedGeometry::from(&q.geometry)
            }))
            .ok()
        });
        match graph {
            Some(g) => contained_relate(rel, || rel.holds(&f.geometry.relate(g))),
            None => relate_holds(&f.geometry, &q.geometry, rel),
        }
    }
}

/// Whether the closed rectangle `r` meets a line or polygon feature, in time linear in its
/// vertices (a box query, a map tile's bounds): the feature's box within `r`; a corner of `r`
/// in or on the feature (its polygon index); a vertex of the feature in `r`; or an edge of
/// the feature crossing `r`. One of these holds exactly when they meet.
fn rect_intersects(r: &BBox, f: &Shape) -> bool {
    use geo::CoordsIter;
    if f.bbox[0] >= r[0] && f.bbox[1] >= r[1] && f.bbox[2] <= r[2] && f.bbox[3] <= r[3] {
        return true;
    }
    let areal = matches!(f.geometry, Geometry::Polygon(_) | Geometry::MultiPolygon(_));
    if areal
        && [(r[0], r[1]), (r[2], r[1]), (r[2], r[3]), (r[0], r[3])]
            .iter()
            .any(|&(x, y)| f.locate(x, y) != Location::Exterior)
    {
        return true;
    }
    if f.geometry
        .coords_iter()
        .any(|c| c.x >= r[0] && c.x <= r[2] && c.y >= r[1] && c.y <= r[3])
    {
        return true;
    }
    let lines: Vec<&LineString<f64>> = match &f.geometry {
        Geometry::LineString(l) => vec![l],
        Geometry::MultiLineString(m) => m.0.iter().collect(),
        Geometry::Polygon(p) => std::iter::once(p.exterior()).chain(p.interiors()).collect(),
        Geometry::MultiPolygon(m) => {
            m.0.iter()
                .flat_map(|p| std::iter::once(p.exterior()).chain(p.interiors()))
                .collect()
        }
        // Nothing else is a shape; should it be, the full relate decides.
        other => {
            return relate_holds(
                other,
                &Geometry::Polygon(rect_polygon(r)),
                Relation::Intersects,
            );
        }
    };
    lines.iter().any(|l| {
        l.0.windows(2)
            .any(|w| clip_segment(w[0], w[1], r).is_some())
    })
}

fn rect_polygon(r: &BBox) -> Polygon<f64> {
    Polygon::new(
        LineString::from(vec![
            (r[0], r[1]),
            (r[2], r[1]),
            (r[2], r[3]),
            (r[0], r[3]),
            (r[0], r[1]),
        ]),
        vec![],
    )
}

/// The part of segment `p`-`q` inside the closed rectangle `r` (Liang-Barsky), or `None`
/// when they do not meet.
pub fn clip_segment(p: Coord<f64>, q: Coord<f64>, r: &BBox) -> Option<(Coord<f64>, Coord<f64>)> {
    let (dx, dy) = (q.x - p.x, q.y - p.y);
    let (mut t0, mut t1) = (0.0f64, 1.0f64);
    for (pv, qv) in [
        (-dx, p.x - r[0]),
        (dx, r[2] - p.x),
        (-dy, p.y - r[1]),
        (dy, r[3] - p.y),
    ] {
        if pv == 0.0 {
            if qv < 0.0 {
                return None;
            }
        } else {
            let t = qv / pv;
            if pv < 0.0 {
                t0 = t0.max(t);
            } else {
                t1 = t1.min(t);
            }
        }
    }
    let at = |t: f64| Coord {
        x: p.x + t * dx,
        y: p.y + t * dy,
    };
    (t0 <= t1).then(|| (at(t0), at(t1)))
}

/// The relation of a shape to a query point, from the point's location, where that decides.
#[inline]
pub(crate) fn point_fast_path(loc: Location, rel: Relation) -> Option<bool> {
    match rel {
        Relation::Intersects | Relation::EnvelopeIntersects => Some(loc != Location::Exterior),
        Relation::Contains => Some(loc == Location::Interior),
        Relation::Touches => Some(loc == Location::Boundary),
        // A point never crosses or overlaps a line or polygon; `within` needs a degenerate
        // feature to be true, so it goes to the full relate.
        Relation::Crosses | Relation::Overlaps => Some(false),
        Relation::Within => None,
    }
}

/// DE-9IM through geo's `relate`. geo's topology graph can panic on some degenerate
/// input; a panic is contained and counts as "no match" (logged), never a crash.
pub(crate) fn relate_holds(feature: &Geometry<f64>, query: &Geometry<f64>, rel: Relation) -> bool {
    contained_relate(rel, || rel.holds(&feature.relate(query)))
}

/// Run a relate, a panic in it counting as "no match" (logged).
fn contained_relate(rel: Relation, f: impl FnOnce() -> bool) -> bool {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(b) => b,
        Err(_) => {
            tracing::warn!(
                relation = rel.name(),
                "relate failed on a degenerate geometry"
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use geo::{line_string, point, polygon};

    fn sq(x0: f64, y0: f64, x1: f64, y1: f64) -> Geometry<f64> {
        Geometry::Polygon(
            polygon![(x: x0, y: y0), (x: x1, y: y0), (x: x1, y: y1), (x: x0, y: y1), (x: x0, y: y0)],
        )
    }

    #[test]
    fn parse_names() {
        assert_eq!(
            Relation::parse("EnvelopeIntersects"),
            Some(Relation::EnvelopeIntersects)
        );
        assert_eq!(
            Relation::parse("envelope-intersects"),
            Some(Relation::EnvelopeIntersects)
        );
        assert_eq!(Relation::parse("CONTAINS"), Some(Relation::Contains));
        assert_eq!(Relation::parse("near"), None);
        assert_eq!(
            Relation::parse("ENVELOPE_INTERSECTS"),
            Some(Relation::EnvelopeIntersects)
        );
        assert_eq!(Relation::parse("within-x"), None);
        assert_eq!(Relation::parse(""), None);
    }

    #[test]
    fn point_on_edge_and_vertex() {
        let f = Shape::new(sq(0.0, 0.0, 10.0, 10.0)).unwrap();
        let on_edge = Query::point(0.0, 5.0);
        let on_vertex = Query::point(10.0, 10.0);
        let inside = Query::point(5.0, 5.0);
        for q in [&on_edge, &on_vertex] {
            assert!(!q.matches_shape(&f, Relation::Contains));
            assert!(q.matches_shape(&f, Relation::Intersects));
            assert!(q.matches_shape(&f, Relation::Touches));
        }
        assert!(inside.matches_shape(&f, Relation::Contains));
        assert!(!inside.matches_shape(&f, Relation::Touches));
        assert!(!inside.matches_shape(&f, Relation::Within));
        // The fast path agrees with relate.
        for q in [&on_edge, &on_vertex, &inside] {
            for rel in Relation::ALL {
                if rel == Relation::EnvelopeIntersects {
                    continue;
                }
                assert_eq!(
                    q.matches_shape(&f, rel),
                    relate_holds(&f.geometry, q.geometry(), rel),
                    "{rel:?} {:?}",
                    q.geometry()
                );
            }
        }
    }

    #[test]
    fn polygons_sharing_an_edge_touch() {
        let a = Shape::new(sq(0.0, 0.0, 1.0, 1.0)).unwrap();
        let q = Query::new(sq(1.0, 0.0, 2.0, 1.0));
        assert!(q.matches_shape(&a, Relation::Touches));
        assert!(q.matches_shape(&a, Relation::Intersects));
        assert!(!q.matches_shape(&a, Relation::Overlaps));
        assert!(!q.matches_shape(&a, Relation::Contains));
        let half = Query::new(sq(0.5, 0.0, 2.0, 1.0));
        assert!(half.matches_shape(&a, Relation::Overlaps));
        let inner = Query::new(sq(0.25, 0.25, 0.75, 0.75));
        assert!(inner.matches_shape(&a, Relation::Contains));
        let outer = Query::new(sq(-1.0, -1.0, 2.0, 2.0));
        assert!(outer.matches_shape(&a, Relation::Within));
    }

    #[test]
    fn lines_cross_and_point_features() {
        let l = Shape::new(Geometry::LineString(
            line_string![(x: -1.0, y: 0.5), (x: 2.0, y: 0.5)],
        ))
        .unwrap();
        let q = Query::new(sq(0.0, 0.0, 1.0, 1.0));
        assert!(q.matches_shape(&l, Relation::Crosses));
        assert!(!q.matches_shape(&l, Relation::Within));
        // Point features: inside or on, whatever the relation.
        for rel in Relation::ALL {
            assert!(q.matches_point(0.0, 0.5, rel), "{rel:?} on edge");
            assert!(q.matches_point(0.5, 0.5, rel), "{rel:?} inside");
            assert!(!q.matches_point(1.5, 0.5, rel), "{rel:?} outside");
        }
        let p = Query::new(Geometry::Point(point!(x: 3.0, y: 4.0)));
        assert!(p.matches_point(3.0, 4.0, Relation::Contains));
        assert!(!p.matches_point(3.0, 4.000001, Relation::Contains));
    }

    #[test]
    fn rect_detection() {
        assert!(matches!(
            Query::new(sq(0.0, 0.0, 1.0, 2.0)).kind,
            QueryKind::Rect
        ));
        let tri = Geometry::Polygon(
            polygon![(x: 0., y: 0.), (x: 1., y: 0.), (x: 0., y: 1.), (x: 0., y: 0.)],
        );
        assert!(matches!(Query::new(tri).kind, QueryKind::Shape(_)));
    }

    /// A rectangle meets a line or polygon exactly when geo's relate says they intersect:
    /// rectangles inside, around, across, touching and apart, over a polygon with a hole, a
    /// concave polygon, a multipolygon and a line.
    #[test]
    fn rect_intersects_agrees_with_relate() {
        let ring = |pts: &[(f64, f64)]| geo::LineString::from(pts.to_vec());
        let holed = Geometry::Polygon(geo::Polygon::new(
            ring(&[(0., 0.), (10., 0.), (10., 10.), (0., 10.), (0., 0.)]),
            vec![ring(&[(3., 3.), (7., 3.), (7., 7.), (3., 7.), (3., 3.)])],
        ));
        let concave = Geometry::Polygon(geo::Polygon::new(
            ring(&[
                (0., 0.),
                (10., 0.),
                (10., 10.),
                (8., 10.),
                (8., 2.),
                (2., 2.),
                (2., 10.),
                (0., 10.),
                (0., 0.),
            ]),
            vec![],
        ));
        let multi = Geometry::MultiPolygon(geo::MultiPolygon(vec![
            geo::Polygon::new(
                ring(&[(0., 0.), (2., 0.), (2., 2.), (0., 2.), (0., 0.)]),
                vec![],
            ),
            geo::Polygon::new(
                ring(&[(8., 8.), (10., 8.), (10., 10.), (8., 10.), (8., 8.)]),
                vec![],
            ),
        ]));
        let line = Geometry::LineString(ring(&[(0., 0.), (10., 10.), (10., 0.)]));
        let mut checked = 0;
        for g in [holed, concave, multi, line] {
            let f = Shape::new(g.clone()).unwrap();
            for x0 in [-2.0, 0.0, 1.0, 3.5, 4.0, 8.5, 10.0, 11.0] {
                for y0 in [-2.0, 0.0, 1.0, 3.5, 4.0, 8.5, 10.0, 11.0] {
                    for (w, h) in [(0.5, 0.5), (1.0, 3.0), (6.0, 1.0), (14.0, 14.0)] {
                        let q = Query::new(sq(x0, y0, x0 + w, y0 + h));
                        let want = relate_holds(&g, q.geometry(), Relation::Intersects);
                        assert_eq!(
                            q.matches_shape(&f, Relation::Intersects),
                            want,
                            "{g:?} and the box at ({x0}, {y0}) {w} by {h}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 4 * 8 * 8 * 4);
    }
}
