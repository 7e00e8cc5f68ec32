//! A fast reader for the common shape of a geoQueryService body.
//!
//! It reads the same members as the serde derive on [`RawRequest`], in one pass over the
//! bytes, and only for bodies in a plain subset of JSON:
//!
//! - strings of printable ASCII without escapes;
//! - numbers in strict JSON grammar;
//! - skipped values nested under 64 levels;
//! - no known member given twice.
//!
//! The members that stay JSON values are read whole by serde_json, so the rules above are
//! serde's own inside them.
//!
//! Anything else, valid or not, gives `None`, and the caller falls back to serde. serde then
//! gives the same answer, or the error message. Where this reader does answer, the answer is
//! the one serde gives: the tests compare the two on generated bodies. Numbers other than
//! small integers, and the members that stay JSON values (`coordinates`, `objectIds`,
//! `outStatistics`, `groupByFieldsForStatistics`, `time`), are handed to serde_json, so
//! floating-point rounding is serde_json's own.

use std::borrow::Cow;

use serde_json::Value;

use super::{Coercible, RawExtension, RawGeometry, RawParams, RawQuery, RawRequest};

/// A skipped value nested deeper than this makes the reader give up (serde_json allows 128;
/// the members this reader walks add at most four levels).
const MAX_DEPTH: usize = 64;

struct Reader<'a> {
    /// The body, checked as UTF-8 once, so strings are sliced from it without a check each.
    text: &'a str,
    b: &'a [u8],
    i: usize,
    /// Where the geometry's `coordinates` value lies, when it is an array.
    coordinates: Option<(usize, usize)>,
}

/// The index of the first byte of `b` from `start` that is `"`, `\`, or not printable ASCII.
/// Eight bytes a step (SWAR): each test flags the first matching byte of a word exactly (a
/// borrow or carry only runs on from a byte that is itself flagged), so the lowest flag of all
/// four is the answer. Keys and names here are a few to a few dozen bytes: too short for a
/// vector search to pay for its set-up, too long for a byte loop to be cheap.
fn first_special(b: &[u8], start: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let mut i = start;
    while let Some(word) = b.get(i..i + 8) {
        let w = u64::from_le_bytes(word.try_into().ok()?);
        let special = zero_byte(w ^ (ONES * u64::from(b'"')))
            | zero_byte(w ^ (ONES * u64::from(b'\\')))
            // below 0x20
            | (w.wrapping_sub(ONES * 0x20) & !w & HIGH)
            // above 0x7e
            | ((w.wrapping_add(ONES) | w) & HIGH);
        if special != 0 {
            return Some(i + (special.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    let tail = b.get(i..)?;
    let at = tail
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || !(0x20..0x7f).contains(&c))?;
    Some(i + at)
}

/// `None` means "not in the subset": the caller asks serde.
type R<T> = Option<T>;

impl<'a> Reader<'a> {
    fn ws(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            if matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    fn peek(&mut self) -> R<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> R<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// A string of printable ASCII without escapes.
    fn string(&mut self) -> R<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        let end = first_special(self.b, start)?;
        if self.b[end] != b'"' {
            return None;
        }
        self.i = end + 1;
        // Printable ASCII only, so both ends are character boundaries.
        self.text.get(start..end)
    }

    fn literal(&mut self, word: &[u8]) -> R<()> {
        let end = self.i.checked_add(word.len())?;
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// The bytes of a number in strict JSON grammar, and whether it is a plain integer.
    fn number(&mut self) -> R<(&'a [u8], bool)> {
        self.ws();
        let b = self.b;
        let start = self.i;
        let mut i = start;
        let digits = |mut i: usize| {
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            i
        };
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        i = match b.get(i)? {
            b'0' => i + 1,
            b'1'..=b'9' => digits(i + 1),
            _ => return None,
        };
        let mut integer = true;
        if b.get(i) == Some(&b'.') {
            integer = false;
            let end = digits(i + 1);
            if end == i + 1 {
                return None;
            }
            i = end;
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            integer = false;
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            let end = digits(i);
            if end == i {
                return None;
            }
            i = end;
        }
        self.i = i;
        Some((&b[start..i], integer))
    }

    /// Skip any value; the bytes it spanned.
    fn skip(&mut self, depth: usize) -> R<&'a [u8]> {
        if depth > MAX_DEPTH {
            return None;
        }
        let c = self.peek()?;
        let start = self.i;
        match c {
            b'"' => {
                self.string()?;
            }
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'n' => self.literal(b"null")?,
            b'[' => {
                self.i += 1;
                if self.peek()? == b']' {
                    self.i += 1;
                } else {
                    loop {
                        self.skip(depth + 1)?;
                        match self.peek()? {
                            b',' => self.i += 1,
                            b']' => {
                                self.i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
            }
            b'{' => self.object(|r, _| r.skip(depth + 1).map(drop))?,
            _ => {
                self.number()?;
            }
        }
        Some(&self.b[start..self.i])
    }

    /// An object: `member` reads each value after its key.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a str) -> R<()>) -> R<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            member(self, key)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// `None` for `null`, else what `read` makes of the value (serde's `Option<T>`).
    fn nullable<T>(&mut self, read: impl FnOnce(&mut Self) -> R<T>) -> R<Option<T>> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Some(None);
        }
        read(self).map(Some)
    }

    /// A scalar member as [`Coercible`] reads it.
    fn flex(&mut self) -> R<Coercible<'a>> {
        Some(match self.peek()? {
            b'"' => Coercible::Str(Cow::Borrowed(self.string()?)),
            b't' => {
                self.literal(b"true")?;
                Coercible::Bool(true)
            }
            b'f' => {
                self.literal(b"false")?;
                Coercible::Bool(false)
            }
            b'n' => {
                self.literal(b"null")?;
                Coercible::Null
            }
            b'[' | b'{' => {
                self.skip(0)?;
                Coercible::Other
            }
            _ => {
                let (text, integer) = self.number()?;
                // Up to 18 digits cannot overflow an i64; anything else is serde_json's.
                if integer && text.len() <= 18 {
                    let (neg, digits) = match text.split_first() {
                        Some((b'-', rest)) => (true, rest),
                        _ => (false, text),
                    };
                    let n = digits
                        .iter()
                        .fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
                    match (neg, n) {
                        // serde_json reads `-0` as a float.
                        (true, 0) => Coercible::Float(-0.0),
                        (true, n) => Coercible::Int(-n),
                        (false, n) => Coercible::Int(n),
                    }
                } else {
                    serde_json::from_slice(text).ok()?
                }
            }
        })
    }

    /// A member that stays a JSON value (`Option<Value>` in serde: null is `None`).
    /// Read by serde_json straight from the body, in one pass: it stops after the value and
    /// says where.
    fn value(&mut self) -> R<Option<Value>> {
        self.nullable(|r| {
            let mut one = serde_json::Deserializer::from_slice(r.b.get(r.i..)?).into_iter();
            let v: Value = one.next()?.ok()?;
            r.i += one.byte_offset();
            Some(v)
        })
    }
}

/// Set `slot`, or give up if it was already set (serde calls that a duplicate field).
fn once<T>(seen: &mut u32, bit: u32, slot: &mut T, value: T) -> R<()> {
    if *seen & bit != 0 {
        return None;
    }
    *seen |= bit;
    *slot = value;
    Some(())
}

fn params<'a>(r: &mut Reader<'a>) -> R<RawParams<'a>> {
    let mut p = RawParams::default();
    let mut seen = 0;
    r.object(|r, key| match key {
        "id" => once(&mut seen, 1, &mut p.id, r.flex()?),
        "layer" => once(&mut seen, 2, &mut p.layer, r.flex()?),
        "method" => once(&mut seen, 4, &mut p.method, r.flex()?),
        _ => r.skip(0).map(drop),
    })?;
    Some(p)
}

fn geometry<'a>(r: &mut Reader<'a>) -> R<RawGeometry<'a>> {
    let mut kind = None;
    let mut coordinates = None;
    let mut seen = 0;
    r.object(|r, key| match key {
        "type" => {
            let v = r.nullable(|r| r.string().map(Cow::Borrowed))?;
            once(&mut seen, 1, &mut kind, v)
        }
        "coordinates" => {
            r.ws();
            let start = r.i;
            let v = r.value()?;
            if matches!(v, Some(Value::Array(_))) {
                r.coordinates = Some((start, r.i));
            }
            once(&mut seen, 2, &mut coordinates, v)
        }
        _ => r.skip(0).map(drop),
    })?;
    Some(RawGeometry { kind, coordinates })
}

fn extension<'a>(r: &mut Reader<'a>) -> R<RawExtension<'a>> {
    let mut e = RawExtension::default();
    let mut seen = 0;
    r.object(|r, key| match key {
        "geometry" => once(&mut seen, 1, &mut e.geometry, r.nullable(geometry)?),
        _ => r.skip(0).map(drop),
    })?;
    Some(e)
}

fn query<'a>(r: &mut Reader<'a>) -> R<RawQuery<'a>> {
    let mut q = RawQuery::default();
    let mut seen = 0u32;
    r.object(|r, key| {
        let s = &mut seen;
        match key {
            "where" => once(s, 1, &mut q.where_, r.flex()?),
            "objectIds" => once(s, 1 << 1, &mut q.object_ids, r.value()?),
            "outFields" => once(s, 1 << 2, &mut q.out_fields, r.flex()?),
            "returnGeometry" => once(s, 1 << 3, &mut q.return_geometry, r.flex()?),
            "returnCountOnly" => once(s, 1 << 4, &mut q.return_count_only, r.flex()?),
            "returnIdsOnly" => once(s, 1 << 5, &mut q.return_ids_only, r.flex()?),
            "orderByFields" => once(s, 1 << 6, &mut q.order_by_fields, r.flex()?),
            "resultOffset" => once(s, 1 << 7, &mut q.result_offset, r.flex()?),
            "resultRecordCount" => once(s, 1 << 8, &mut q.result_record_count, r.flex()?),
            "outStatistics" => once(s, 1 << 9, &mut q.out_statistics, r.value()?),
            "groupByFieldsForStatistics" => once(
                s,
                1 << 10,
                &mut q.group_by_fields_for_statistics,
                r.value()?,
            ),
            "time" => once(s, 1 << 11, &mut q.time, r.value()?),
            "geometryType" => once(s, 1 << 12, &mut q.geometry_type, r.flex()?),
            "spatialRel" => once(s, 1 << 13, &mut q.spatial_rel, r.flex()?),
            "extension" => once(s, 1 << 14, &mut q.extension, r.nullable(extension)?),
            "geometry" => once(s, 1 << 15, &mut q.geometry, r.value()?),
            "inSR" => once(s, 1 << 16, &mut q.in_sr, r.value()?),
            "distance" => once(s, 1 << 17, &mut q.distance, r.flex()?),
            "units" => once(s, 1 << 18, &mut q.units, r.flex()?),
            _ => r.skip(0).map(drop),
        }
    })?;
    Some(q)
}

/// The members of `body`, as serde would read them, or `None` to ask serde.
#[cfg(test)]
pub(super) fn read(body: &[u8]) -> Option<RawRequest<'_>> {
    read_spanned(body).map(|(raw, _)| raw)
}

/// `read`, and where the geometry's `coordinates` lie in `body` when they are an array: from
/// its `[` to just after its `]`.
pub(super) fn read_spanned(body: &[u8]) -> Option<(RawRequest<'_>, Option<(usize, usize)>)> {
    let text = std::str::from_utf8(body).ok()?;
    let mut r = Reader {
        text,
        b: body,
        i: 0,
        coordinates: None,
    };
    let mut params_ = None;
    let mut query_ = None;
    let mut seen = 0;
    r.object(|r, key| match key {
        "params" => once(&mut seen, 1, &mut params_, r.nullable(params)?),
        "query" => once(&mut seen, 2, &mut query_, r.nullable(query)?),
        _ => r.skip(0).map(drop),
    })?;
    r.ws();
    let raw = RawRequest {
        params: params_,
        query: query_,
    };
    (r.i == body.len()).then_some((raw, r.coordinates))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// serde's reading of a body (the oracle), as the parser did before this reader.
    fn serde_read(body: &[u8]) -> Result<RawRequest<'_>, String> {
        serde_json::from_slice(body).map_err(|e| e.to_string())
    }

    /// The word-at-a-time search finds what a byte loop finds, at every offset and length,
    /// with the special byte anywhere in a word or none at all.
    #[test]
    fn first_special_matches_a_byte_loop() {
        let naive = |b: &[u8], start: usize| {
            (start..b.len())
                .find(|&i| b[i] == b'"' || b[i] == b'\\' || !(0x20..0x7f).contains(&b[i]))
        };
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let specials = [b'"', b'\\', 0x00, 0x1f, 0x7f, 0x80, 0xff, b'\n'];
        let plain = [0x20, b'a', b'~', 0x7e, b'0', b'!', b'#', b'[', b']'];
        for _ in 0..20_000 {
            let len = (next() % 40) as usize;
            let mut b: Vec<u8> = (0..len)
                .map(|_| plain[(next() % plain.len() as u64) as usize])
                .collect();
            // None, one or two specials, anywhere.
            for _ in 0..next() % 3 {
                if len > 0 {
                    let at = (next() % len as u64) as usize;
                    b[at] = specials[(next() % specials.len() as u64) as usize];
                }
            }
            let start = if len > 0 {
                (next() % (len as u64 + 1)) as usize
            } else {
                0
            };
            assert_eq!(
                first_special(&b, start),
                naive(&b, start),
                "{b:?} from {start}"
            );
        }
        // Every byte value in every position of a word.
        for v in 0..=255u8 {
            for at in 0..16 {
                let mut b = vec![b'x'; 16];
                b[at] = v;
                assert_eq!(first_special(&b, 0), naive(&b, 0), "byte {v:#x} at {at}");
            }
        }
    }

    fn agree(body: &str) -> Option<RawRequest<'_>> {
        let fast = read(body.as_bytes());
        if let Some(f) = &fast {
            let slow = serde_read(body.as_bytes());
            assert_eq!(Ok(f), slow.as_ref(), "{body}");
        }
        fast
    }

    #[test]
    fn reads_the_load_test_shape() {
        let body = r#"{"params":{"id":"lt-counties","layer":0,"method":"query"},"query":{"returnGeometry":1,"geometryType":"gisGeometryPoint","spatialRel":"gisSpatialRelContains","extension":{"geometry":{"type":"Point","coordinates":[-100.26183662316625,45.246596062450614]}}}}"#;
        let r = agree(body).expect("in the subset");
        let p = r.params.unwrap();
        assert_eq!(p.id, Coercible::Str(Cow::Borrowed("lt-counties")));
        assert_eq!(p.layer, Coercible::Int(0));
        let q = r.query.unwrap();
        assert_eq!(q.return_geometry, Coercible::Int(1));
        let g = q.extension.unwrap().geometry.unwrap();
        assert_eq!(g.kind.as_deref(), Some("Point"));
        assert_eq!(
            g.coordinates,
            Some(serde_json::json!([-100.26183662316625, 45.246596062450614]))
        );
    }

    #[test]
    fn reads_koop_members() {
        let body = r#" {"params": {"id": "GDeltGKG", "layer": "3", "method": "query", "extra": [1, {"a": null}]},
            "query": {"f": "json", "inSR": 4326, "outSR": {"wkid": 4326}, "returnGeometry": "true",
            "returnCountOnly": false, "resultRecordCount": "10", "resultOffset": 5, "where": "a > 1.5e3",
            "outStatistics": [{"statisticType": "count", "onStatisticField": "OBJECTID"}],
            "groupByFieldsForStatistics": "a,b", "time": [1495605600000, null], "objectIds": [1, 2, 3],
            "orderByFields": "a DESC", "outFields": "*", "returnIdsOnly": 0.0, "layerDefs": null,
            "extension": {"geometry": {"type": "Polygon", "coordinates": [[[0,0],[1,0],[1,1],[0,1],[0,0]]],
            "spatialReference": {"wkid": 4326}}}}}
        "#;
        let q = agree(body).expect("in the subset").query.unwrap();
        assert_eq!(q.return_ids_only, Coercible::Float(0.0));
        assert_eq!(q.object_ids, Some(serde_json::json!([1, 2, 3])));
        assert_eq!(q.where_, Coercible::Str(Cow::Borrowed("a > 1.5e3")));
    }

    #[test]
    fn leaves_the_rest_to_serde() {
        for body in [
            // Escapes, non-ASCII and control characters in strings.
            r#"{"params":{"id":"a\"b"}}"#,
            r#"{"params":{"id":"é"}}"#,
            "{\"params\":{\"id\":\"a\tb\"}}",
            // Duplicate known members (serde refuses them).
            r#"{"params":{"id":"a","id":"b"}}"#,
            r#"{"query":{},"query":{}}"#,
            // Not JSON, or not this shape.
            r#"{"params":{"id":"a"}} x"#,
            r#"{"params":{"id":"a"},}"#,
            r#"{"params":{"id":01}}"#,
            r#"{"params":{"id":1.}}"#,
            r#"{"params":{"id":-}}"#,
            r#"{"params":"s"}"#,
            r#"{"query":{"extension":{"geometry":{"type":3}}}}"#,
            r#"["params"]"#,
            "",
            "{",
            // Nesting deeper than the reader goes.
            &format!(
                "{}{}",
                r#"{"params":{"layer":"#,
                "[".repeat(100) + &"]".repeat(100) + "}}"
            ),
        ] {
            assert!(read(body.as_bytes()).is_none(), "{body}");
        }
        // Long integers are read through serde_json, as serde reads them.
        let big =
            r#"{"params":{"layer":123456789012345678901,"id":-9223372036854775808,"method":-0}}"#;
        let p = agree(big).expect("in the subset").params.unwrap();
        assert_eq!(p.id, Coercible::Int(i64::MIN));
        assert!(matches!(p.method, Coercible::Float(f) if f == 0.0 && f.is_sign_negative()));
    }

    /// A JSON value from a small grammar that reaches every branch of the reader.
    fn value(depth: u32) -> BoxedStrategy<String> {
        let leaf = prop_oneof![
            4 => Just("null".to_string()),
            4 => Just("true".to_string()),
            4 => Just("false".to_string()),
            8 => any::<i64>().prop_map(|i| i.to_string()),
            4 => any::<u64>().prop_map(|i| i.to_string()),
            4 => (-99i64..99).prop_map(|i| i.to_string()),
            8 => any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| f.to_string()),
            4 => (-1e6..1e6f64).prop_map(|f| format!("{f:e}")),
            8 => "[ -~&&[^\"\\\\]]{0,8}".prop_map(|s| format!("\"{s}\"")),
            1 => Just("\"a\\nb\"".to_string()),
            1 => Just("-0".to_string()),
            1 => Just("01".to_string()),
        ];
        if depth == 0 {
            return leaf.boxed();
        }
        let inner = value(depth - 1);
        prop_oneof![
            2 => leaf,
            1 => prop::collection::vec(inner, 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            2 => object(depth - 1),
        ]
        .boxed()
    }

    /// An object with the members the reader knows, and others; now and then one twice.
    fn object(depth: u32) -> BoxedStrategy<String> {
        let key = prop::sample::select(vec![
            "id",
            "layer",
            "method",
            "where",
            "objectIds",
            "returnGeometry",
            "resultOffset",
            "outStatistics",
            "time",
            "spatialRel",
            "extension",
            "geometry",
            "type",
            "coordinates",
            "other",
            "f",
        ]);
        let twice = prop::option::weighted(0.05, key.clone());
        (prop::collection::btree_map(key, value(depth), 0..6), twice)
            .prop_map(|(m, twice)| {
                let mut members: Vec<String> =
                    m.iter().map(|(k, v)| format!("\"{k}\" :{v}")).collect();
                if let Some(k) = twice {
                    members.push(format!("\"{k}\":null"));
                }
                format!("{{ {} }}", members.join(","))
            })
            .boxed()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Wherever the reader answers, serde gives the same members.
        #[test]
        fn agrees_with_serde(params in object(1), query in object(3), extra in value(1)) {
            let body = format!("{{\"params\":{params},\"query\":{query},\"x\":{extra}}}");
            agree(&body);
        }
    }

    #[test]
    fn generated_bodies_are_mostly_read() {
        // The agreement test means little if the reader gave up on nearly everything.
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let s = (object(1), object(3));
        let mut read_ok = 0;
        for _ in 0..500 {
            let (p, q) = s.new_tree(&mut runner).unwrap().current();
            let body = format!("{{\"params\":{p},\"query\":{q}}}");
            if agree(&body).is_some() {
                read_ok += 1;
            }
        }
        assert!(read_ok > 100, "only {read_ok} of 500 read");
    }
}
