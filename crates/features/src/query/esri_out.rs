//! The Esri JSON answers of the native FeatureServer (`f=json`), written straight from the
//! view as the GeoJSON ones are: feature sets, id lists and counts. Geometries become Esri's
//! points, paths and rings (outer rings clockwise, holes counterclockwise), in WGS84 or Web
//! Mercator, generalized and rounded as asked ([`EsriShape`]).

use super::*;

const EARTH_RADIUS: f64 = 6_378_137.0;
/// Web Mercator's latitude limit.
const MAX_LAT: f64 = 85.051_128_779_806_59;

/// How an Esri answer writes geometries: the spatial reference, the largest offset a
/// generalized line may have from the original (in the output's units), and the decimals
/// kept.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EsriShape {
    pub web_mercator: bool,
    pub max_offset: Option<f64>,
    pub precision: Option<i32>,
    /// `f=pbf`: Esri's protobuf feature format, quantized so.
    pub pbf: Option<Quantization>,
}

impl EsriShape {
    /// The output's spatial reference, as Esri writes it.
    pub fn spatial_reference(&self) -> Value {
        if self.web_mercator {
            json!({"wkid": 102100, "latestWkid": 3857})
        } else {
            json!({"wkid": 4326, "latestWkid": 4326})
        }
    }

    /// A WGS84 position in the output's reference, not rounded.
    pub fn project(&self, [x, y]: [f64; 2]) -> [f64; 2] {
        if self.web_mercator {
            let lat = y.clamp(-MAX_LAT, MAX_LAT);
            [
                EARTH_RADIUS * x.to_radians(),
                EARTH_RADIUS
                    * (std::f64::consts::FRAC_PI_4 + lat.to_radians() / 2.0)
                        .tan()
                        .ln(),
            ]
        } else {
            [x, y]
        }
    }

    fn round(&self, [x, y]: [f64; 2]) -> [f64; 2] {
        match self.precision {
            Some(p) => {
                let f = 10f64.powi(p);
                [(x * f).round() / f, (y * f).round() / f]
            }
            None => [x, y],
        }
    }

    /// The positions of a line or ring, projected, generalized and rounded; a ring keeps
    /// at least four.
    fn line(&self, v: &Value, ring: bool) -> Vec<[f64; 2]> {
        let mut out: Vec<[f64; 2]> = positions(v).into_iter().map(|p| self.project(p)).collect();
        if let Some(eps) = self.max_offset {
            use geo::Simplify;
            let line: geo::LineString<f64> = out.iter().map(|&[x, y]| (x, y)).collect();
            let simple: Vec<[f64; 2]> = line.simplify(eps).0.iter().map(|c| [c.x, c.y]).collect();
            if simple.len() >= if ring { 4 } else { 2 } {
                out = simple;
            }
        }
        if self.precision.is_some() {
            for q in &mut out {
                *q = self.round(*q);
            }
        }
        out
    }

    /// A GeoJSON geometry as an Esri geometry object (without its spatial reference), or
    /// null for none and for a geometry collection, which Esri has no form for.
    pub fn geometry(&self, g: &Value) -> Value {
        let coords = &g["coordinates"];
        let lines = |v: &Value, ring: bool| -> Vec<Vec<[f64; 2]>> {
            v.as_array()
                .map(|a| a.iter().map(|l| self.line(l, ring)).collect())
                .unwrap_or_default()
        };
        // Outer rings clockwise, holes counterclockwise.
        let rings = |polygons: Vec<&Value>| -> Value {
            let mut out = Vec::new();
            for p in polygons {
                for (i, mut ring) in lines(p, true).into_iter().enumerate() {
                    let area = signed_area(&ring);
                    if (i == 0 && area > 0.0) || (i > 0 && area < 0.0) {
                        ring.reverse();
                    }
                    out.push(ring);
                }
            }
            json!({ "rings": out })
        };
        match g["type"].as_str().unwrap_or_default() {
            "Point" => match position(coords) {
                Some(p) => {
                    let [x, y] = self.round(self.project(p));
                    json!({"x": x, "y": y})
                }
                None => Value::Null,
            },
            "MultiPoint" => {
                let points: Vec<[f64; 2]> = positions(coords)
                    .into_iter()
                    .map(|p| self.round(self.project(p)))
                    .collect();
                json!({ "points": points })
            }
            "LineString" => json!({"paths": [self.line(coords, false)]}),
            "MultiLineString" => json!({"paths": lines(coords, false)}),
            "Polygon" => rings(vec![coords]),
            "MultiPolygon" => rings(
                coords
                    .as_array()
                    .map(|a| a.iter().collect())
                    .unwrap_or_default(),
            ),
            _ => Value::Null,
        }
    }

    /// A view's geometry, written as an Esri geometry.
    fn write_geometry(&self, out: &mut Vec<u8>, g: GeometryRef<'_>) {
        match g {
            GeometryRef::Point(x, y) => {
                let [x, y] = self.round(self.project([x, y]));
                out.extend_from_slice(b"{\"x\":");
                write_float(out, x);
                out.extend_from_slice(b",\"y\":");
                write_float(out, y);
                out.push(b'}');
            }
            GeometryRef::Json(bytes) => {
                let start = out.len();
                if *self == EsriShape::default() && write_text(out, bytes).is_some() {
                    return;
                }
                out.truncate(start);
                let v: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
                let _ = serde_json::to_writer(&mut *out, &self.geometry(&v));
            }
        }
    }
}

/// A position as written: its coordinates' text, and their values.
struct Position<'a> {
    x: &'a [u8],
    y: &'a [u8],
    at: [f64; 2],
}

/// A reader of GeoJSON coordinate text (nested arrays of numbers), keeping each number's
/// text.
struct Coordinates<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Coordinates<'a> {
    fn skip_space(&mut self) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.skip_space();
        let here = self.s.get(self.i) == Some(&b);
        self.i += usize::from(here);
        here
    }

    fn number(&mut self) -> Option<(&'a [u8], f64)> {
        self.skip_space();
        let start = self.i;
        while self
            .s
            .get(self.i)
            .is_some_and(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'))
        {
            self.i += 1;
        }
        let text = &self.s[start..self.i];
        let v: f64 = std::str::from_utf8(text).ok()?.parse().ok()?;
        v.is_finite().then_some((text, v))
    }

    /// `[x, y, …]`: the first two numbers; a third (z) and more are read and left out.
    fn position(&mut self) -> Option<Position<'a>> {
        if !self.eat(b'[') {
            return None;
        }
        let (x, fx) = self.number()?;
        if !self.eat(b',') {
            return None;
        }
        let (y, fy) = self.number()?;
        while self.eat(b',') {
            self.number()?;
        }
        self.eat(b']').then_some(Position { x, y, at: [fx, fy] })
    }

    /// `[[x, y], …]`.
    fn line(&mut self) -> Option<Vec<Position<'a>>> {
        self.list(Coordinates::position)
    }

    /// `[item, …]`.
    fn list<T>(&mut self, mut item: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        if !self.eat(b'[') {
            return None;
        }
        let mut out = Vec::new();
        if self.eat(b']') {
            return Some(out);
        }
        loop {
            out.push(item(self)?);
            if self.eat(b']') {
                return Some(out);
            }
            if !self.eat(b',') {
                return None;
            }
        }
    }
}

fn write_position(out: &mut Vec<u8>, p: &Position<'_>) {
    out.push(b'[');
    out.extend_from_slice(p.x);
    out.push(b',');
    out.extend_from_slice(p.y);
    out.push(b']');
}

/// Lines (paths or rings) as Esri writes them; a ring reversed when its winding is not
/// Esri's (`outer`: the polygon's first ring, clockwise; holes counterclockwise).
fn write_lines(out: &mut Vec<u8>, lines: &[(Vec<Position<'_>>, Option<bool>)]) {
    out.push(b'[');
    for (i, (line, outer)) in lines.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let reverse = outer.is_some_and(|outer| {
            let ring: Vec<[f64; 2]> = line.iter().map(|p| p.at).collect();
            let area = signed_area(&ring);
            (outer && area > 0.0) || (!outer && area < 0.0)
        });
        out.push(b'[');
        let mut first = true;
        let mut put = |p: &Position<'_>| {
            if !first {
                out.push(b',');
            }
            first = false;
            write_position(out, p);
        };
        if reverse {
            line.iter().rev().for_each(&mut put);
        } else {
            line.iter().for_each(&mut put);
        }
        out.push(b']');
    }
    out.push(b']');
}

/// A view's GeoJSON geometry text written as an Esri geometry with its numbers' text copied
/// (WGS84, no generalization or rounding); `None`, having written part of it, for a text
/// this does not read.
fn write_text(out: &mut Vec<u8>, bytes: &[u8]) -> Option<()> {
    #[derive(serde::Deserialize)]
    struct Geometry<'a> {
        #[serde(rename = "type", borrow)]
        kind: Cow<'a, str>,
        #[serde(borrow)]
        coordinates: &'a serde_json::value::RawValue,
    }
    let g: Geometry<'_> = serde_json::from_slice(bytes).ok()?;
    let mut c = Coordinates {
        s: g.coordinates.get().as_bytes(),
        i: 0,
    };
    match g.kind.as_ref() {
        "Point" => {
            let p = c.position()?;
            out.extend_from_slice(b"{\"x\":");
            out.extend_from_slice(p.x);
            out.extend_from_slice(b",\"y\":");
            out.extend_from_slice(p.y);
            out.push(b'}');
        }
        "MultiPoint" => {
            let points = c.line()?;
            out.extend_from_slice(b"{\"points\":[");
            for (i, p) in points.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_position(out, p);
            }
            out.extend_from_slice(b"]}");
        }
        "LineString" => {
            let l = c.line()?;
            out.extend_from_slice(b"{\"paths\":");
            write_lines(out, &[(l, None)]);
            out.push(b'}');
        }
        "MultiLineString" => {
            let ls = c.list(Coordinates::line)?;
            let ls: Vec<_> = ls.into_iter().map(|l| (l, None)).collect();
            out.extend_from_slice(b"{\"paths\":");
            write_lines(out, &ls);
            out.push(b'}');
        }
        "Polygon" | "MultiPolygon" => {
            let polygons = if g.kind == "Polygon" {
                vec![c.list(Coordinates::line)?]
            } else {
                c.list(|c| c.list(Coordinates::line))?
            };
            let rings: Vec<_> = polygons
                .into_iter()
                .flat_map(|rings| {
                    rings
                        .into_iter()
                        .enumerate()
                        .map(|(i, r)| (r, Some(i == 0)))
                })
                .collect();
            out.extend_from_slice(b"{\"rings\":");
            write_lines(out, &rings);
            out.push(b'}');
        }
        _ => return None,
    }
    Some(())
}

/// How positions are quantized: integers of `scale` output units from `origin`, the
/// upper left corner (x grows right, y grows down) unless `lower_left`. From the request's
/// `quantizationParameters` (`tolerance` and the `extent`'s corner), else a nanodegree (or a
/// tenth of a millimetre in Web Mercator) from the world's upper left corner. In `view` mode
/// (the JS API's), positions that quantize to the one before are left out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantization {
    pub scale: f64,
    pub origin: [f64; 2],
    pub lower_left: bool,
    pub view: bool,
}

impl Quantization {
    /// The default for an output in WGS84 or in Web Mercator.
    pub fn default_for(web_mercator: bool) -> Quantization {
        if web_mercator {
            const HALF: f64 = 20_037_508.342_789_244;
            Quantization {
                scale: 1e-4,
                origin: [-HALF, HALF],
                lower_left: false,
                view: false,
            }
        } else {
            Quantization {
                scale: 1e-9,
                origin: [-180.0, 90.0],
                lower_left: false,
                view: false,
            }
        }
    }

    pub(super) fn quantize(&self, [x, y]: [f64; 2]) -> [i64; 2] {
        let qx = ((x - self.origin[0]) / self.scale).round() as i64;
        let qy = if self.lower_left {
            ((y - self.origin[1]) / self.scale).round() as i64
        } else {
            ((self.origin[1] - y) / self.scale).round() as i64
        };
        [qx, qy]
    }
}

fn write_float(out: &mut Vec<u8>, f: f64) {
    if f.is_finite() {
        let _ = serde_json::to_writer(&mut *out, &f);
    } else {
        out.extend_from_slice(b"null");
    }
}

/// The positions of a GeoJSON coordinate list (`[[x, y, …], …]`).
fn positions(v: &Value) -> Vec<[f64; 2]> {
    v.as_array()
        .map(|a| a.iter().filter_map(position).collect())
        .unwrap_or_default()
}

fn position(v: &Value) -> Option<[f64; 2]> {
    let a = v.as_array()?;
    Some([a.first()?.as_f64()?, a.get(1)?.as_f64()?])
}

/// Twice the signed area of a ring: positive when it runs counterclockwise.
pub fn signed_area(ring: &[[f64; 2]]) -> f64 {
    ring.windows(2)
        .map(|w| w[0][0] * w[1][1] - w[1][0] * w[0][1])
        .sum()
}

/// A layer's geometry type as Esri names it.
pub fn esri_geometry_type(t: &str) -> &'static str {
    match t.to_ascii_lowercase().as_str() {
        "multipoint" | "esrigeometrymultipoint" => "esriGeometryMultipoint",
        "linestring" | "multilinestring" | "polyline" | "esrigeometrypolyline" => {
            "esriGeometryPolyline"
        }
        "polygon" | "multipolygon" | "esrigeometrypolygon" | "envelope" => "esriGeometryPolygon",
        _ => "esriGeometryPoint",
    }
}

/// A field type of the geo data services (`Integer`, `Double`, `String`, `Date`) as Esri
/// names it; the layer's id field is the object id.
pub fn esri_field_type(kind: &str, is_id: bool) -> &'static str {
    if is_id {
        return "esriFieldTypeOID";
    }
    match kind {
        "Integer" => "esriFieldTypeInteger",
        "Double" => "esriFieldTypeDouble",
        "Date" => "esriFieldTypeDate",
        _ => "esriFieldTypeString",
    }
}

/// One Esri field.
fn write_field(out: &mut Vec<u8>, name: &str, kind: &str, is_id: bool) {
    let t = esri_field_type(kind, is_id);
    out.extend_from_slice(b"{\"name\":");
    write_str(out, name);
    out.extend_from_slice(b",\"type\":\"");
    out.extend_from_slice(t.as_bytes());
    out.extend_from_slice(b"\",\"alias\":");
    write_str(out, name);
    out.extend_from_slice(b",\"sqlType\":\"sqlTypeOther\",\"domain\":null,\"defaultValue\":null");
    if t == "esriFieldTypeString" {
        out.extend_from_slice(b",\"length\":1024");
    }
    out.push(b'}');
}

/// An attribute value as Esri writes it: dates as milliseconds since the epoch.
fn write_attribute(out: &mut Vec<u8>, v: &Datum<'_>) {
    match v {
        Datum::Date(ms) => write_int(out, *ms),
        other => write_value(out, other),
    }
}

/// What an Esri answer holds: a count, ids, or a page of features (a layer with no view
/// yet has no data and no definition).
pub(super) enum EsriAnswer<'a> {
    Count(usize),
    Ids(&'a [(i64, u32)]),
    Page {
        data: Option<&'a ViewData>,
        def: Option<&'a ViewDef>,
        page: &'a [u32],
        out_cols: &'a [usize],
        exceeded: bool,
        /// The page's size as `answer_fits` found it.
        bytes: usize,
    },
}

impl Queries<'_> {
    /// An answer of the native FeatureServer, as Esri JSON or, with `shape.pbf`, as Esri's
    /// protobuf features.
    pub(super) fn write_esri(
        &self,
        resolved: &Resolved<'_>,
        q: &QuerySpec,
        shape: &EsriShape,
        answer: EsriAnswer<'_>,
    ) -> Vec<u8> {
        let id_name = match &answer {
            EsriAnswer::Page { def: Some(d), .. } => d.columns[d.id_column].name.as_str(),
            _ => resolved.layer.id_field.as_str(),
        };
        match (answer, &shape.pbf) {
            (EsriAnswer::Count(n), Some(_)) => self.write_pbf_count(n),
            (EsriAnswer::Count(n), None) => self.write_esri_count(n),
            (EsriAnswer::Ids(rows), Some(_)) => self.write_pbf_ids(id_name, rows),
            (EsriAnswer::Ids(rows), None) => self.write_esri_ids(id_name, rows),
            (
                EsriAnswer::Page {
                    data,
                    def,
                    page,
                    out_cols,
                    exceeded,
                    ..
                },
                Some(quant),
            ) => self.write_pbf_features(
                resolved, data, def, page, out_cols, exceeded, q, shape, quant,
            ),
            (
                EsriAnswer::Page {
                    data,
                    def,
                    page,
                    out_cols,
                    exceeded,
                    bytes,
                },
                None,
            ) => self.write_esri_features(
                resolved, data, def, page, out_cols, exceeded, q, shape, bytes,
            ),
        }
    }

    /// `returnCountOnly`, as Esri writes it.
    pub(super) fn write_esri_count(&self, count: usize) -> Vec<u8> {
        let mut out = b"{\"count\":".to_vec();
        write_int(&mut out, count);
        out.push(b'}');
        out
    }

    /// `returnIdsOnly`, as Esri writes it.
    pub(super) fn write_esri_ids(&self, id_name: &str, rows: &[(i64, u32)]) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + rows.len() * 8);
        out.extend_from_slice(b"{\"objectIdFieldName\":");
        write_str(&mut out, id_name);
        out.extend_from_slice(b",\"objectIds\":[");
        for (i, (id, _)) in rows.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_int(&mut out, *id);
        }
        out.extend_from_slice(b"]}");
        out
    }

    /// A page of features as an Esri feature set: the id field, the geometry type and
    /// spatial reference (when geometries are returned), the fields of `out_cols`,
    /// `exceededTransferLimit`, then each feature's attributes and geometry.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_esri_features(
        &self,
        resolved: &Resolved<'_>,
        data: Option<&ViewData>,
        def: Option<&ViewDef>,
        page: &[u32],
        out_cols: &[usize],
        exceeded: bool,
        q: &QuerySpec,
        shape: &EsriShape,
        bytes: usize,
    ) -> Vec<u8> {
        let id_name = def.map_or(resolved.layer.id_field.as_str(), |d| {
            d.columns[d.id_column].name.as_str()
        });
        let mut out = Vec::with_capacity(512 + bytes);
        out.extend_from_slice(b"{\"objectIdFieldName\":");
        write_str(&mut out, id_name);
        out.extend_from_slice(b",\"uniqueIdField\":{\"name\":");
        write_str(&mut out, id_name);
        out.extend_from_slice(b",\"isSystemMaintained\":true},\"globalIdFieldName\":\"\"");
        if q.return_geometry {
            out.extend_from_slice(b",\"geometryType\":\"");
            out.extend_from_slice(esri_geometry_type(&resolved.layer.geometry_type).as_bytes());
            out.extend_from_slice(b"\",\"spatialReference\":");
            let _ = serde_json::to_writer(&mut out, &shape.spatial_reference());
        }
        out.extend_from_slice(b",\"fields\":[");
        if let Some(def) = def {
            for (j, &c) in out_cols.iter().enumerate() {
                if j > 0 {
                    out.push(b',');
                }
                let col = &def.columns[c];
                write_field(
                    &mut out,
                    &col.name,
                    col.scalar.field_type(),
                    c == def.id_column,
                );
            }
        }
        out.push(b']');
        if exceeded {
            out.extend_from_slice(b",\"exceededTransferLimit\":true");
        }
        out.extend_from_slice(b",\"features\":[");
        if let Some(data) = data {
            let geometries = q
                .return_geometry
                .then(|| data.geometry_column(resolved.layer.geometry_path.text()));
            for (i, &slot) in page.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(b"{\"attributes\":{");
                for (j, &c) in out_cols.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    write_str(&mut out, &data.def.columns[c].name);
                    out.push(b':');
                    write_attribute(&mut out, &data.columns[c].get(slot as usize));
                }
                out.push(b'}');
                if let Some(g) = geometries.and_then(|g| g.get(slot)) {
                    out.extend_from_slice(b",\"geometry\":");
                    shape.write_geometry(&mut out, g);
                }
                out.push(b'}');
            }
        }
        out.extend_from_slice(b"]}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_are_wound_as_esri_winds_them() {
        let plain = EsriShape::default();
        // GeoJSON's winding: the shell counterclockwise, the hole clockwise.
        let g = json!({"type": "Polygon", "coordinates": [
            [[0.0, 0.0], [10.0, 0.0], [10.0, 10.0], [0.0, 10.0], [0.0, 0.0]],
            [[2.0, 2.0], [2.0, 4.0], [4.0, 4.0], [4.0, 2.0], [2.0, 2.0]]]});
        let e = plain.geometry(&g);
        let rings: Vec<Vec<[f64; 2]>> = serde_json::from_value(e["rings"].clone()).unwrap();
        assert_eq!(rings.len(), 2);
        assert!(signed_area(&rings[0]) < 0.0, "the shell is clockwise");
        assert!(signed_area(&rings[1]) > 0.0, "the hole is counterclockwise");
        // Wound the other way already: kept.
        let mut reversed = g.clone();
        for r in reversed["coordinates"].as_array_mut().unwrap() {
            r.as_array_mut().unwrap().reverse();
        }
        assert_eq!(plain.geometry(&reversed), e);
        let m =
            json!({"type": "MultiPolygon", "coordinates": [g["coordinates"], g["coordinates"]]});
        assert_eq!(plain.geometry(&m)["rings"].as_array().unwrap().len(), 4);
    }

    /// The text path writes what the value path writes, for every geometry type, with
    /// z values, spaces and both windings.
    #[test]
    fn geometry_text_is_written_as_its_value_is() {
        let plain = EsriShape::default();
        let square = json!([
            [0.0, 0.0],
            [10.0, 0.0],
            [10.0, 10.0],
            [0.0, 10.0],
            [0.0, 0.0]
        ]);
        let hole = json!([[2.0, 2.0], [2.0, 4.0], [4.0, 4.0], [4.0, 2.0], [2.0, 2.0]]);
        let mut cw = square.clone();
        cw.as_array_mut().unwrap().reverse();
        for g in [
            json!({"type": "Point", "coordinates": [1.5, -2.25]}),
            json!({"coordinates": [1.5, -2.25, 7.0], "type": "Point"}),
            json!({"type": "MultiPoint", "coordinates": [[1.0, 2.0], [3.0, 4.5]]}),
            json!({"type": "LineString", "coordinates": [[1.0, 2.0, 9.0], [3.0, 4.0, 9.0]]}),
            json!({"type": "MultiLineString", "coordinates": [[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]]}),
            json!({"type": "Polygon", "coordinates": [square, hole]}),
            json!({"type": "Polygon", "coordinates": [cw]}),
            json!({"type": "MultiPolygon", "coordinates": [[square, hole], [cw]], "bbox": [0, 0, 10, 10]}),
        ] {
            let mut fast = Vec::new();
            write_text(&mut fast, &serde_json::to_vec(&g).unwrap()).unwrap();
            let fast: Value = serde_json::from_slice(&fast).unwrap();
            assert_eq!(fast, plain.geometry(&g), "{g}");
            let spaced = serde_json::to_vec_pretty(&g).unwrap();
            let mut again = Vec::new();
            write_text(&mut again, &spaced).unwrap();
            assert_eq!(
                serde_json::from_slice::<Value>(&again).unwrap(),
                fast,
                "{g}"
            );
        }
        for bad in [
            &br#"{"type":"Point","coordinates":[1]}"#[..],
            br#"{"type":"GeometryCollection","geometries":[]}"#,
            br#"{"type":"Polygon","coordinates":[[[1,2],[3,"x"]]]}"#,
        ] {
            assert!(write_text(&mut Vec::new(), bad).is_none());
        }
    }

    #[test]
    fn points_lines_and_web_mercator() {
        let plain = EsriShape::default();
        let merc = EsriShape {
            web_mercator: true,
            precision: Some(2),
            ..EsriShape::default()
        };
        let p = merc.geometry(&json!({"type": "Point", "coordinates": [180.0, 0.0]}));
        assert_eq!(p, json!({"x": 20037508.34, "y": 0.0}));
        let p = merc.geometry(&json!({"type": "Point", "coordinates": [0.0, 45.0]}));
        assert_eq!(p["y"], json!(5621521.49));
        let mut out = Vec::new();
        merc.write_geometry(&mut out, GeometryRef::Point(0.0, 45.0));
        assert_eq!(out, br#"{"x":0.0,"y":5621521.49}"#);
        let l = plain
            .geometry(&json!({"type": "LineString", "coordinates": [[1.0, 2.0, 7.0], [3.0, 4.0]]}));
        assert_eq!(l, json!({"paths": [[[1.0, 2.0], [3.0, 4.0]]]}));
        let general = EsriShape {
            max_offset: Some(0.5),
            ..plain
        };
        let l = general.geometry(
            &json!({"type": "LineString", "coordinates": [[0.0, 0.0], [1.0, 0.1], [2.0, 0.0]]}),
        );
        assert_eq!(l, json!({"paths": [[[0.0, 0.0], [2.0, 0.0]]]}));
        assert_eq!(
            plain.geometry(&json!({"type": "GeometryCollection", "geometries": []})),
            Value::Null
        );
    }
}
