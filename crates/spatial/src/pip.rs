//! Exact point location in polygons, fast on real boundaries.
//!
//! A polygon's edges are bucketed into horizontal stripes, so locating a point tests only the
//! edges of one stripe, not all of them. Polygons with many edges are also cut into
//! horizontal bands ("parts"), each with its own tight bounding box and its own stripes:
//! the R-tree then hands only the band that holds the point to the exact test, and a band's
//! stripes stay short. No clipping is involved, so there are no artificial edges and no
//! rounding at the cuts: a band simply holds every edge that overlaps its y-range.
//!
//! The test is the ray-crossing rule of GEOS's `RayCrossingCounter` (half-open in y, exact
//! orientation from the `robust` crate), applied ring by ring as GEOS's
//! `SimplePointInAreaLocator` does: a point is inside a polygon when it is inside the shell
//! and inside no hole, holes taken in order. For valid polygons that is plain parity; for
//! invalid ones (self-intersecting rings, a hole sticking out of its shell) it gives GEOS's
//! answers. A point on an edge or vertex is `Boundary`.

use geo::{Coord, LineString, Polygon};

/// Where a point lies relative to a geometry. Ordered so that `max` combines the answers of
/// several parts: interior anywhere wins, then boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Location {
    Exterior,
    Boundary,
    Interior,
}

/// An edge as `[x0, y0, x1, y1]`.
pub(crate) type Edge = [f64; 4];

/// Below this many edges a band is one stripe: a plain scan is as fast.
const SCAN_EDGES: usize = 16;
/// Polygons above this many edges are cut into bands of about this many.
pub(crate) const BAND_EDGES: usize = 256;

#[inline]
fn orient(ax: f64, ay: f64, bx: f64, by: f64, px: f64, py: f64) -> f64 {
    robust::orient2d(
        robust::Coord { x: ax, y: ay },
        robust::Coord { x: bx, y: by },
        robust::Coord { x: px, y: py },
    )
}

/// Crossing-number test of `(px, py)` against one ring's edges (every edge of the ring
/// whose y-range includes `py` and that is not wholly left of `px` must be there, once; the
/// ring's other edges may be there too, and change nothing).
#[inline]
fn locate_in_ring(edges: &[Edge], px: f64, py: f64) -> Location {
    locate_crossing(edges.iter().copied(), px, py)
}

/// The crossing test of `locate_in_ring` over a chain of vertices, an edge from each to the
/// next; with `mirror`, of the chain and the point with `x` negated (exact), so that the ray
/// runs leftward.
#[inline]
pub(crate) fn locate_on_chain(chain: &[Coord<f64>], mirror: bool, px: f64, py: f64) -> Location {
    let s = if mirror { -1.0 } else { 1.0 };
    let edges = chain
        .windows(2)
        .map(|w| [s * w[0].x, w[0].y, s * w[1].x, w[1].y]);
    locate_crossing(edges, s * px, py)
}

#[inline]
fn locate_crossing(edges: impl Iterator<Item = Edge>, px: f64, py: f64) -> Location {
    let mut inside = false;
    for [ax, ay, bx, by] in edges {
        let a_above = ay > py;
        let b_above = by > py;
        if a_above != b_above {
            // The edge straddles the horizontal line through p (half-open in y).
            if ax > px && bx > px {
                inside = !inside; // wholly to the right: the rightward ray crosses it
                continue;
            }
            if ax < px && bx < px {
                continue; // wholly to the left
            }
            let o = orient(ax, ay, bx, by, px, py);
            if o == 0.0 {
                return Location::Boundary;
            }
            if (o > 0.0) == (by > ay) {
                inside = !inside;
            }
        } else if !a_above {
            // Both ends at or below p: p can only touch a horizontal edge at its height,
            // or the edge's upper vertex.
            if ay == py && by == py {
                if (ax <= px && px <= bx) || (bx <= px && px <= ax) {
                    return Location::Boundary;
                }
            } else if (ay == py && ax == px) || (by == py && bx == px) {
                return Location::Boundary;
            }
        }
    }
    if inside {
        Location::Interior
    } else {
        Location::Exterior
    }
}

/// Shell first, then holes in order. `rings[i]` is the ring of `edges[i]` (ascending); an
/// empty `rings` means every edge is the shell's.
#[inline]
fn locate_in_rings(edges: &[Edge], rings: &[u32], px: f64, py: f64) -> Location {
    if rings.is_empty() {
        return locate_in_ring(edges, px, py);
    }
    let mut start = 0;
    let mut first = true;
    while start < edges.len() {
        let ring = rings[start];
        let end = start + rings[start..].iter().take_while(|r| **r == ring).count();
        let loc = locate_in_ring(&edges[start..end], px, py);
        if first {
            // No shell edge at this height means the point is outside the shell.
            if ring != 0 || loc != Location::Interior {
                return if ring == 0 { loc } else { Location::Exterior };
            }
            first = false;
        } else {
            match loc {
                Location::Boundary => return Location::Boundary,
                Location::Interior => return Location::Exterior,
                Location::Exterior => {}
            }
        }
        start = end;
    }
    if first {
        Location::Exterior
    } else {
        Location::Interior
    }
}

/// Edges bucketed by horizontal stripes over `[y0, y0 + n / inv_h]`.
#[derive(Debug, Clone)]
struct Stripes {
    y0: f64,
    inv_h: f64,
    /// `offsets[k]..offsets[k+1]` are the edges of stripe `k`.
    offsets: Box<[u32]>,
    edges: Box<[Edge]>,
    /// The ring of each edge (0 = shell), parallel to `edges`; empty when there are no holes.
    rings: Box<[u32]>,
}

/// Most copies of its edges a band's stripes hold, as a multiple of the band's edges. An edge
/// is copied into every stripe its y-range meets, so long edges (zig-zags, combs, spikes)
/// would make a fine striping quadratic; past this, stripes are halved until they fit, and a
/// probe scans more edges instead of the index taking more memory.
const STRIPE_COPIES: usize = 4;

/// How `count` stripes over `[ylo, yhi]` number a height.
#[derive(Clone, Copy)]
struct StripeLayout {
    ylo: f64,
    inv_h: f64,
    count: usize,
    /// Widening of an edge's y-range, so that a query's rounding of its stripe misses none.
    pad: f64,
}

impl StripeLayout {
    fn new(ylo: f64, yhi: f64, count: usize) -> StripeLayout {
        let height = (yhi - ylo).max(f64::MIN_POSITIVE);
        StripeLayout {
            ylo,
            inv_h: count as f64 / height,
            count,
            pad: height * 1e-9 + 1e-12,
        }
    }

    fn stripe_of(&self, y: f64) -> usize {
        let k = ((y - self.ylo) * self.inv_h).floor();
        if k <= 0.0 {
            0
        } else {
            (k as usize).min(self.count - 1)
        }
    }

    /// The stripes edge `e` goes to: every one its closed y-range, widened, meets.
    fn span(&self, e: &Edge) -> (usize, usize) {
        let (lo, hi) = if e[1] <= e[3] {
            (e[1], e[3])
        } else {
            (e[3], e[1])
        };
        (self.stripe_of(lo - self.pad), self.stripe_of(hi + self.pad))
    }

    fn copies(&self, edges: &[Edge]) -> usize {
        edges
            .iter()
            .map(|e| {
                let (a, b) = self.span(e);
                b - a + 1
            })
            .sum()
    }
}

impl Stripes {
    /// `edges` in ring order; `rings` parallel to it, or empty for a shell alone.
    ///
    /// Half as many stripes as edges, or fewer: as many as keep the copies within
    /// [`STRIPE_COPIES`] times the edges. Each try costs one pass over the edges, and a
    /// try halves the count, so the build is O(n log n) whatever the shape.
    fn build(edges: &[Edge], rings: &[u32], ylo: f64, yhi: f64) -> Stripes {
        let mut n = if edges.len() <= SCAN_EDGES || yhi <= ylo {
            1
        } else {
            edges.len().div_ceil(2)
        };
        let budget = edges.len().saturating_mul(STRIPE_COPIES);
        // An edge of height h meets about 1 + h k / H of k stripes over a height H, so the
        // copies grow about linearly in k: start at the count that fits by that estimate
        // (ignoring the rounding of each edge's ends), then halve while the exact count
        // says otherwise.
        let heights: f64 = edges.iter().map(|e| (e[1] - e[3]).abs()).sum();
        if n > 1 && heights > 0.0 {
            let room = budget.saturating_sub(edges.len()) as f64;
            let fits = (room * (yhi - ylo) / heights).max(1.0);
            if fits < n as f64 {
                n = fits as usize;
            }
        }
        let mut layout = StripeLayout::new(ylo, yhi, n);
        while n > 1 && layout.copies(edges) > budget {
            n /= 2;
            layout = StripeLayout::new(ylo, yhi, n);
        }
        let mut counts = vec![0u32; n + 1];
        for e in edges {
            let (a, b) = layout.span(e);
            for c in &mut counts[a..=b] {
                *c += 1;
            }
        }
        let mut offsets = vec![0u32; n + 1];
        for k in 0..n {
            offsets[k + 1] = offsets[k] + counts[k];
        }
        let mut fill = offsets.clone();
        let mut out = vec![[0.0; 4]; offsets[n] as usize];
        let mut out_rings = vec![0u32; if rings.is_empty() { 0 } else { out.len() }];
        // Edges arrive in ring order, so each stripe's edges stay in ring order.
        for (i, e) in edges.iter().enumerate() {
            let (a, b) = layout.span(e);
            for f in &mut fill[a..=b] {
                out[*f as usize] = *e;
                if !rings.is_empty() {
                    out_rings[*f as usize] = rings[i];
                }
                *f += 1;
            }
        }
        Stripes {
            y0: ylo,
            inv_h: layout.inv_h,
            offsets: offsets.into_boxed_slice(),
            edges: out.into_boxed_slice(),
            rings: out_rings.into_boxed_slice(),
        }
    }

    #[inline]
    fn locate(&self, px: f64, py: f64) -> Location {
        let n = self.offsets.len() - 1;
        let k = ((py - self.y0) * self.inv_h).floor();
        let k = if k <= 0.0 { 0 } else { (k as usize).min(n - 1) };
        let (a, b) = (self.offsets[k] as usize, self.offsets[k + 1] as usize);
        let rings = if self.rings.is_empty() {
            &[][..]
        } else {
            &self.rings[a..b]
        };
        locate_in_rings(&self.edges[a..b], rings, px, py)
    }

    /// Most edges one probe scans: the longest stripe.
    fn longest(&self) -> usize {
        self.offsets
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0)
    }

    fn heap_bytes(&self) -> usize {
        self.offsets.len() * 4
            + self.edges.len() * std::mem::size_of::<Edge>()
            + self.rings.len() * 4
    }
}

/// An axis-aligned box `[xmin, ymin, xmax, ymax]`.
pub type BBox = [f64; 4];

pub(crate) fn bbox_contains(b: &BBox, x: f64, y: f64) -> bool {
    b[0] <= x && x <= b[2] && b[1] <= y && y <= b[3]
}

pub(crate) fn bbox_intersects(a: &BBox, b: &BBox) -> bool {
    a[0] <= b[2] && b[0] <= a[2] && a[1] <= b[3] && b[1] <= a[3]
}

/// One band of one polygon: the unit the R-tree indexes.
#[derive(Debug, Clone)]
pub struct PolygonPart {
    /// Box of the polygon within the band (every point of the polygon in the band is in it).
    pub bbox: BBox,
    /// Which polygon of a multipolygon this band belongs to.
    pub element: u32,
    stripes: Stripes,
}

impl PolygonPart {
    /// Location relative to this part's polygon; exact for points inside `bbox`.
    #[inline]
    pub fn locate(&self, x: f64, y: f64) -> Location {
        if !bbox_contains(&self.bbox, x, y) {
            return Location::Exterior;
        }
        self.stripes.locate(x, y)
    }

    /// Every edge of the part, `[x0, y0, x1, y1]`, some more than once (an edge is listed in
    /// each stripe it crosses).
    pub fn edges(&self) -> &[[f64; 4]] {
        &self.stripes.edges
    }

    /// Most edges a location in this part tests.
    pub(crate) fn probe_cost(&self) -> usize {
        self.stripes.longest()
    }

    pub fn heap_bytes(&self) -> usize {
        self.stripes.heap_bytes()
    }
}

fn ring_edges(ring: &LineString<f64>, index: u32, out: &mut Vec<Edge>, rings: &mut Vec<u32>) {
    for w in ring.0.windows(2) {
        out.push([w[0].x, w[0].y, w[1].x, w[1].y]);
        rings.push(index);
    }
}

/// Most copies of its edges the bands of one polygon hold, as a multiple of its edges. An
/// edge goes to every band its y-range meets; past this, there are half as many bands until
/// the copies fit.
const BAND_COPIES: usize = 2;

/// The bands edges `[lo, hi]` (closed y-ranges) go to, for bands `[cuts[k], cuts[k + 1]]`:
/// every band whose closed range meets the edge's.
fn band_span(cuts: &[f64], lo: f64, hi: f64) -> (usize, usize) {
    let bands = cuts.len() - 1;
    let first = cuts[1..].partition_point(|c| *c < lo);
    let last = cuts[..bands].partition_point(|c| *c <= hi);
    (
        first.min(bands - 1),
        last.saturating_sub(1).max(first.min(bands - 1)),
    )
}

/// Band boundaries at quantiles of the edges' lower ends (`lows`, sorted), so that bands
/// hold similar counts: at most `bands` bands over `[ylo, yhi]`.
fn band_cuts(lows: &[f64], bands: usize, ylo: f64, yhi: f64) -> Vec<f64> {
    let mut cuts = vec![ylo];
    for b in 1..bands {
        let y = lows[b * lows.len() / bands];
        if y > *cuts.last().unwrap_or(&ylo) && y < yhi {
            cuts.push(y);
        }
    }
    cuts.push(yhi);
    cuts
}

/// Cut one polygon (shell and holes together) into banded, striped parts.
///
/// About [`BAND_EDGES`] edges a band, or fewer bands where long edges would copy into many
/// (see `BAND_COPIES`); each edge is placed by binary search over the cuts, so the cut
/// costs O(n log n) and its parts O(n) memory for any ring.
pub(crate) fn polygon_parts(element: u32, poly: &Polygon<f64>) -> Vec<PolygonPart> {
    let mut edges = Vec::new();
    let mut rings = Vec::new();
    ring_edges(poly.exterior(), 0, &mut edges, &mut rings);
    for (i, hole) in poly.interiors().iter().enumerate() {
        ring_edges(hole, i as u32 + 1, &mut edges, &mut rings);
    }
    let has_holes = !poly.interiors().is_empty();
    if edges.is_empty() {
        return Vec::new();
    }
    let y_range = |e: &Edge| {
        if e[1] <= e[3] {
            (e[1], e[3])
        } else {
            (e[3], e[1])
        }
    };
    let (ylo, yhi) = edges
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), e| {
            (lo.min(e[1]).min(e[3]), hi.max(e[1]).max(e[3]))
        });
    let mut bands = edges.len().div_ceil(BAND_EDGES).max(1);
    let mut cuts = vec![ylo, yhi];
    if bands > 1 {
        let mut lows: Vec<f64> = edges.iter().map(|e| y_range(e).0).collect();
        lows.sort_by(f64::total_cmp);
        let budget = edges.len().saturating_mul(BAND_COPIES);
        // As for stripes: the copies grow about linearly in the bands, so start where that
        // estimate fits (bands cut at quantiles are not even, hence the exact check).
        let heights: f64 = edges.iter().map(|e| (e[1] - e[3]).abs()).sum();
        if heights > 0.0 {
            let room = budget.saturating_sub(edges.len()) as f64;
            let fits = (room * (yhi - ylo) / heights).max(1.0);
            if fits < bands as f64 {
                bands = fits as usize;
            }
        }
        loop {
            cuts = band_cuts(&lows, bands, ylo, yhi);
            let copies: usize = edges
                .iter()
                .map(|e| {
                    let (lo, hi) = y_range(e);
                    let (a, b) = band_span(&cuts, lo, hi);
                    b - a + 1
                })
                .sum();
            if copies <= budget || bands == 1 {
                break;
            }
            bands /= 2;
        }
    }
    // Each band's edges, in ring order: counted, then placed.
    let nb = cuts.len() - 1;
    let spans: Vec<(u32, u32)> = edges
        .iter()
        .map(|e| {
            let (lo, hi) = y_range(e);
            let (a, b) = band_span(&cuts, lo, hi);
            (a as u32, b as u32)
        })
        .collect();
    let mut offsets = vec![0usize; nb + 1];
    for &(a, b) in &spans {
        for k in a..=b {
            offsets[k as usize + 1] += 1;
        }
    }
    for k in 0..nb {
        offsets[k + 1] += offsets[k];
    }
    let mut fill = offsets.clone();
    let mut placed = vec![0u32; offsets[nb]];
    for (i, &(a, b)) in spans.iter().enumerate() {
        for k in a..=b {
            placed[fill[k as usize]] = i as u32;
            fill[k as usize] += 1;
        }
    }
    drop(spans);
    let mut parts = Vec::with_capacity(nb);
    let mut band_edges = Vec::new();
    let mut band_rings = Vec::new();
    for k in 0..nb {
        let (b0, b1) = (cuts[k], cuts[k + 1]);
        band_edges.clear();
        band_rings.clear();
        let (mut xmin, mut xmax) = (f64::INFINITY, f64::NEG_INFINITY);
        for &i in &placed[offsets[k]..offsets[k + 1]] {
            let e = &edges[i as usize];
            band_edges.push(*e);
            if has_holes {
                band_rings.push(rings[i as usize]);
            }
            // The edge's x-extent within the band: clip it to [b0, b1].
            let (x0, x1) = clip_x(e, b0, b1);
            xmin = xmin.min(x0);
            xmax = xmax.max(x1);
        }
        if band_edges.is_empty() {
            continue;
        }
        // A hair of padding: the clipped extents are computed in floating point.
        let pad = 1e-9;
        parts.push(PolygonPart {
            bbox: [xmin - pad, b0, xmax + pad, b1],
            element,
            stripes: Stripes::build(&band_edges, &band_rings, b0, b1),
        });
    }
    parts
}

/// The x-range of the piece of an edge with y in `[y0, y1]`.
fn clip_x(e: &Edge, y0: f64, y1: f64) -> (f64, f64) {
    let [ax, ay, bx, by] = *e;
    if ay == by {
        return (ax.min(bx), ax.max(bx));
    }
    let at = |y: f64| ax + (bx - ax) * ((y - ay) / (by - ay));
    let (lo, hi) = if ay <= by { (ay, by) } else { (by, ay) };
    let ya = y0.max(lo);
    let yb = y1.min(hi);
    let (xa, xb) = (at(ya), at(yb));
    // Endpoints inside the band are exact vertices; use them as they are.
    let xa = if ya == ay {
        ax
    } else if ya == by {
        bx
    } else {
        xa
    };
    let xb = if yb == ay {
        ax
    } else if yb == by {
        bx
    } else {
        xb
    };
    (xa.min(xb), xa.max(xb))
}

/// Location of a point relative to a set of parts (one polygon or a multipolygon's
/// elements): interior of any element wins, then boundary.
pub(crate) fn locate_in_parts(parts: &[PolygonPart], x: f64, y: f64) -> Location {
    let mut best = Location::Exterior;
    for p in parts {
        let l = p.locate(x, y);
        if l == Location::Interior {
            return l;
        }
        best = best.max(l);
    }
    best
}

/// Location of a point relative to lines, as GEOS's `PointLocator` has it: an endpoint of
/// an open line counts once per line, and an odd count is `Boundary` (the mod-2 rule);
/// anywhere else on a line is `Interior`.
pub(crate) fn locate_on_lines(lines: &[LineString<f64>], x: f64, y: f64) -> Location {
    let p = Coord { x, y };
    let mut ends = 0usize;
    let mut on = false;
    for l in lines {
        let (Some(first), Some(last)) = (l.0.first(), l.0.last()) else {
            continue;
        };
        if first != last && (p == *first || p == *last) {
            ends += 1;
            continue;
        }
        on = on
            || l.0.windows(2).any(|w| {
                let (a, b) = (w[0], w[1]);
                a.x.min(b.x) <= x
                    && x <= a.x.max(b.x)
                    && a.y.min(b.y) <= y
                    && y <= a.y.max(b.y)
                    && orient(a.x, a.y, b.x, b.y, x, y) == 0.0
            });
    }
    if ends % 2 == 1 {
        Location::Boundary
    } else if ends > 0 || on {
        Location::Interior
    } else {
        Location::Exterior
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use geo::{Contains, Intersects, coord, polygon};

    fn square_with_hole() -> Polygon<f64> {
        polygon!(
            exterior: [(x: 0., y: 0.), (x: 10., y: 0.), (x: 10., y: 10.), (x: 0., y: 10.), (x: 0., y: 0.)],
            interiors: [[(x: 4., y: 4.), (x: 6., y: 4.), (x: 6., y: 6.), (x: 4., y: 6.), (x: 4., y: 4.)]],
        )
    }

    #[test]
    fn boundary_cases() {
        let parts = polygon_parts(0, &square_with_hole());
        let at = |x, y| locate_in_parts(&parts, x, y);
        assert_eq!(at(1.0, 1.0), Location::Interior);
        assert_eq!(at(5.0, 5.0), Location::Exterior); // in the hole
        assert_eq!(at(11.0, 5.0), Location::Exterior);
        assert_eq!(at(0.0, 5.0), Location::Boundary); // on an edge
        assert_eq!(at(10.0, 10.0), Location::Boundary); // on a vertex
        assert_eq!(at(5.0, 0.0), Location::Boundary); // on a horizontal edge
        assert_eq!(at(4.0, 5.0), Location::Boundary); // on the hole's edge
        assert_eq!(at(6.0, 6.0), Location::Boundary); // the hole's vertex
        assert_eq!(at(-1.0, 0.0), Location::Exterior); // level with a horizontal edge
        assert_eq!(at(3.0, 4.0), Location::Interior); // level with the hole's bottom
    }

    #[test]
    fn banded_polygon_agrees_with_geo() {
        // A star with many spikes: several bands, many stripes.
        let n = 1500;
        let mut pts = Vec::new();
        for i in 0..n {
            let a = i as f64 / n as f64 * std::f64::consts::TAU;
            let r = if i % 2 == 0 {
                10.0
            } else {
                4.0 + (i % 7) as f64 * 0.5
            };
            pts.push(coord! { x: r * a.cos(), y: r * a.sin() });
        }
        pts.push(pts[0]);
        let poly = Polygon::new(LineString(pts), vec![]);
        let parts = polygon_parts(0, &poly);
        assert!(parts.len() >= 5, "{} parts", parts.len());
        let mut state = 12345u64;
        let mut rnd = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64 / (1u64 << 53) as f64) * 24.0 - 12.0
        };
        for _ in 0..20_000 {
            let (x, y) = (rnd(), rnd());
            let p = geo::Point::new(x, y);
            let want = if poly.contains(&p) {
                Location::Interior
            } else if poly.intersects(&p) {
                Location::Boundary
            } else {
                Location::Exterior
            };
            assert_eq!(locate_in_parts(&parts, x, y), want, "({x}, {y})");
        }
        // Every vertex is on the boundary.
        for c in poly.exterior().0.iter() {
            assert_eq!(locate_in_parts(&parts, c.x, c.y), Location::Boundary);
        }
    }

    #[test]
    fn collapsed_ring_point_is_boundary() {
        let poly = Polygon::new(LineString(vec![coord! {x: 1., y: 1.}; 4]), vec![]);
        let parts = polygon_parts(0, &poly);
        assert_eq!(locate_in_parts(&parts, 1.0, 1.0), Location::Boundary);
        assert_eq!(locate_in_parts(&parts, 1.0, 1.5), Location::Exterior);
    }

    #[test]
    fn lines_and_endpoints() {
        let l = LineString(vec![
            coord! {x: 0., y: 0.},
            coord! {x: 2., y: 0.},
            coord! {x: 2., y: 2.},
        ]);
        let ls = [l];
        assert_eq!(locate_on_lines(&ls, 1.0, 0.0), Location::Interior);
        assert_eq!(locate_on_lines(&ls, 2.0, 0.0), Location::Interior); // inner vertex
        assert_eq!(locate_on_lines(&ls, 0.0, 0.0), Location::Boundary);
        assert_eq!(locate_on_lines(&ls, 2.0, 2.0), Location::Boundary);
        assert_eq!(locate_on_lines(&ls, 1.0, 1.0), Location::Exterior);
    }
}

#[cfg(test)]
mod ring_rule_tests {
    use super::*;
    use geo::coord;

    fn ring(pts: &[(f64, f64)]) -> LineString<f64> {
        LineString(pts.iter().map(|&(x, y)| coord! {x: x, y: y}).collect())
    }

    /// A hole outside its shell (as in a real Antarctica): GEOS's rule says outside the
    /// shell is exterior, whatever the hole; parity over all rings would say interior.
    #[test]
    fn hole_outside_shell_is_exterior() {
        let shell = ring(&[(0., 0.), (1., 0.), (1., 1.), (0., 1.), (0., 0.)]);
        let stray = ring(&[(5., 5.), (6., 5.), (6., 6.), (5., 6.), (5., 5.)]);
        let parts = polygon_parts(0, &Polygon::new(shell, vec![stray]));
        assert_eq!(locate_in_parts(&parts, 5.5, 5.5), Location::Exterior);
        assert_eq!(locate_in_parts(&parts, 0.5, 0.5), Location::Interior);
        // On the stray hole's edge, outside the shell: still exterior.
        assert_eq!(locate_in_parts(&parts, 5.0, 5.5), Location::Exterior);
    }

    #[test]
    fn overlapping_holes_take_the_first() {
        let shell = ring(&[(0., 0.), (10., 0.), (10., 10.), (0., 10.), (0., 0.)]);
        let h1 = ring(&[(2., 2.), (6., 2.), (6., 6.), (2., 6.), (2., 2.)]);
        let h2 = ring(&[(4., 4.), (8., 4.), (8., 8.), (4., 8.), (4., 4.)]);
        let parts = polygon_parts(0, &Polygon::new(shell, vec![h1, h2]));
        assert_eq!(locate_in_parts(&parts, 5.0, 5.0), Location::Exterior);
        assert_eq!(locate_in_parts(&parts, 7.0, 7.0), Location::Exterior);
        assert_eq!(locate_in_parts(&parts, 9.0, 9.0), Location::Interior);
        assert_eq!(locate_in_parts(&parts, 6.0, 5.0), Location::Boundary);
    }
}
