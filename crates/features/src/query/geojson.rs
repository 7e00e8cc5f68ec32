//! The response writer: GeoJSON features, metadata, statistics and the envelope, written
//! as bytes directly.

use super::*;

/// The JSON text of a value.
pub(super) fn write_value(out: &mut Vec<u8>, v: &Datum<'_>) {
    match v {
        Datum::Null => out.extend_from_slice(b"null"),
        Datum::Int(i) => write_int(out, *i),
        Datum::Float(f) if f.is_finite() => {
            let _ = serde_json::to_writer(&mut *out, f);
        }
        Datum::Float(_) => out.extend_from_slice(b"null"),
        Datum::Str(s) => {
            let _ = serde_json::to_writer(&mut *out, s.as_ref());
        }
        Datum::Bool(b) => out.push(if *b { b'1' } else { b'0' }),
        Datum::Date(ms) => {
            let _ = serde_json::to_writer(&mut *out, &format_datetime(*ms));
        }
    }
}

/// An integer's JSON text, without a temporary String (this runs per feature).
pub(super) fn write_int(out: &mut Vec<u8>, i: impl serde::Serialize) {
    let _ = serde_json::to_writer(&mut *out, &i);
}

/// `s` as a JSON string, as serde_json writes it. serde_json escapes only `"`, `\` and
/// control characters, and most strings (names, ids, ordinary attribute text) have none of
/// them: those are copied as they are.
pub(super) fn write_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

pub(super) fn write_geometry(out: &mut Vec<u8>, g: Option<GeometryRef<'_>>) {
    match g {
        None => out.extend_from_slice(b"null"),
        Some(GeometryRef::Point(x, y)) => {
            out.extend_from_slice(b"{\"type\":\"Point\",\"coordinates\":[");
            let _ = serde_json::to_writer(&mut *out, &x);
            out.push(b',');
            let _ = serde_json::to_writer(&mut *out, &y);
            out.extend_from_slice(b"]}");
        }
        Some(GeometryRef::Json(bytes)) => out.extend_from_slice(bytes),
    }
}

/// `"$version"` and `"$timestamp"` as the first members of a response object.
pub(super) fn envelope_start(out: &mut Vec<u8>) {
    // The version is plain semver: nothing to escape.
    out.extend_from_slice(
        concat!(
            "{\"$version\":\"",
            env!("CARGO_PKG_VERSION"),
            "\",\"$timestamp\":\""
        )
        .as_bytes(),
    );
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    write_timestamp(out, ms);
    out.push(b'"');
}

thread_local! {
    /// The last timestamp text written on this thread. At thousands of answers a second, most
    /// share their millisecond with the one before.
    static LAST_TIMESTAMP: Cell<(i64, [u8; 24])> = const { Cell::new((i64::MIN, [0; 24])) };
}

/// [`write_datetime`], from the thread's last text when `ms` is the same millisecond.
pub(super) fn write_timestamp(out: &mut Vec<u8>, ms: i64) {
    LAST_TIMESTAMP.with(|last| {
        let (at, text) = last.get();
        if at == ms {
            out.extend_from_slice(&text);
            return;
        }
        let start = out.len();
        write_datetime(out, ms);
        // Years 0 to 9999 (every real clock) give 24 bytes; others are not kept.
        if let Ok(text) = <[u8; 24]>::try_from(&out[start..]) {
            last.set((ms, text));
        }
    });
}

impl Queries<'_> {
    /// `returnCountOnly`: the count and no features.
    pub(super) fn write_count(
        &self,
        descriptor: &Descriptor,
        resolved: &Resolved<'_>,
        def: &ViewDef,
        count: usize,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        envelope_start(&mut out);
        out.extend_from_slice(b",\"count\":");
        write_int(&mut out, count);
        self.write_tail(&mut out, descriptor, resolved, Some(def), false, true);
        out.extend_from_slice(b",\"features\":[]}");
        out
    }

    /// `returnIdsOnly`: the ids, and features of the id alone.
    pub(super) fn write_ids(
        &self,
        descriptor: &Descriptor,
        resolved: &Resolved<'_>,
        def: &ViewDef,
        rows: &[(i64, u32)],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        envelope_start(&mut out);
        out.extend_from_slice(b",\"objectIdFieldName\":");
        write_str(&mut out, &def.columns[def.id_column].name);
        out.extend_from_slice(b",\"objectIds\":[");
        for (i, (id, _)) in rows.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_int(&mut out, *id);
        }
        out.push(b']');
        self.write_tail(&mut out, descriptor, resolved, Some(def), false, true);
        out.extend_from_slice(b",\"features\":[");
        let id_name = &def.columns[def.id_column].name;
        for (i, (id, _)) in rows.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"type\":\"Feature\",\"id\":");
            write_int(&mut out, *id);
            out.extend_from_slice(b",\"properties\":{");
            write_str(&mut out, id_name);
            out.push(b':');
            write_int(&mut out, *id);
            out.extend_from_slice(b"},\"geometry\":null}");
        }
        out.extend_from_slice(b"]}");
        out
    }

    /// `"metadata"` and `"filtersApplied"`, after the leading members.
    pub(super) fn write_tail(
        &self,
        out: &mut Vec<u8>,
        descriptor: &Descriptor,
        resolved: &Resolved<'_>,
        def: Option<&ViewDef>,
        exceeded: bool,
        with_type: bool,
    ) {
        if with_type {
            out.extend_from_slice(b",\"type\":\"FeatureCollection\"");
        }
        out.extend_from_slice(b",\"metadata\":{\"name\":");
        write_str(out, &descriptor.name);
        out.extend_from_slice(b",\"maxRecordCount\":");
        write_int(out, self.features.settings.max_record_count);
        out.extend_from_slice(b",\"fields\":");
        match def {
            Some(d) => out.extend_from_slice(&d.fields_json),
            None => out.extend_from_slice(b"[]"),
        }
        out.extend_from_slice(b",\"limitExceeded\":");
        out.extend_from_slice(if exceeded { b"true" } else { b"false" });
        out.extend_from_slice(b",\"idField\":");
        write_str(out, &resolved.layer.id_field);
        if let Some(d) = &resolved.layer.display_field {
            out.extend_from_slice(b",\"displayField\":");
            write_str(out, d);
        }
        out.extend_from_slice(
            concat!(
                "},\"filtersApplied\":{\"geometry\":true,\"where\":true,\"offset\":true,",
                "\"limit\":true,\"resultRecordCount\":true,\"objectIds\":true,",
                "\"orderByFields\":true}"
            )
            .as_bytes(),
        );
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_features(
        &self,
        descriptor: &Descriptor,
        resolved: &Resolved<'_>,
        data: Option<&ViewData>,
        page: &[u32],
        out_cols: &[usize],
        exceeded: bool,
        q: &QuerySpec,
        bytes: usize,
    ) -> Vec<u8> {
        let geometries = match data {
            Some(d) if q.return_geometry => {
                Some(d.geometry_column(resolved.layer.geometry_path.text()))
            }
            _ => None,
        };
        // `bytes`: the page's size as `answer_fits` found it.
        let mut out = Vec::with_capacity(768 + bytes);
        envelope_start(&mut out);
        self.write_tail(
            &mut out,
            descriptor,
            resolved,
            data.map(|d| d.def.as_ref()),
            exceeded,
            true,
        );
        out.extend_from_slice(b",\"features\":[");
        if let Some(data) = data {
            for (i, &slot) in page.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_feature(&mut out, data, slot, out_cols, geometries);
            }
        }
        out.extend_from_slice(b"]}");
        out
    }

    /// [`Features::write_features`] for features already written (by [`write_feature`]).
    pub(super) fn write_written_features(
        &self,
        descriptor: &Descriptor,
        resolved: &Resolved<'_>,
        def: &ViewDef,
        page: &[&[u8]],
        exceeded: bool,
    ) -> Vec<u8> {
        let bytes: usize = page.iter().map(|f| f.len() + 1).sum();
        let mut out = Vec::with_capacity(768 + bytes);
        envelope_start(&mut out);
        self.write_tail(&mut out, descriptor, resolved, Some(def), exceeded, true);
        out.extend_from_slice(b",\"features\":[");
        for (i, f) in page.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(f);
        }
        out.extend_from_slice(b"]}");
        out
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_statistics(
        &self,
        descriptor: &Descriptor,
        resolved: &Resolved<'_>,
        data: &ViewData,
        rows: &[(i64, u32)],
        cols: &[Option<usize>],
        groups: &[usize],
        q: &QuerySpec,
    ) -> Vec<u8> {
        let specs = q.statistics.as_deref().unwrap_or(&[]);
        let mut grouped = group_rows(data, rows, groups);
        if groups.is_empty() && grouped.is_empty() {
            grouped.insert(Vec::new(), (Vec::new(), Vec::new()));
        }
        let mut out = Vec::new();
        envelope_start(&mut out);
        self.write_tail(&mut out, descriptor, resolved, Some(&data.def), false, true);
        out.extend_from_slice(b",\"statistics\":[");
        for (gi, (_, (slots, members))) in grouped.iter().enumerate() {
            if gi > 0 {
                out.push(b',');
            }
            out.push(b'{');
            out.extend_from_slice(members);
            let mut first = members.is_empty();
            for (spec, col) in specs.iter().zip(cols) {
                if !first {
                    out.push(b',');
                }
                first = false;
                write_str(&mut out, &spec.out_name);
                out.push(b':');
                write_value(&mut out, &statistic(spec.kind, *col, data, slots));
            }
            out.push(b'}');
        }
        out.extend_from_slice(b"],\"features\":[]}");
        out
    }
}

/// One feature of a page: `{"type":"Feature","id":…,"properties":{…},"geometry":…}`.
pub(super) fn write_feature(
    out: &mut Vec<u8>,
    data: &ViewData,
    slot: u32,
    out_cols: &[usize],
    geometries: Option<GeometryColumn<'_>>,
) {
    out.extend_from_slice(b"{\"type\":\"Feature\",\"id\":");
    write_value(out, &data.id_of(slot).map_or(Datum::Null, Datum::Int));
    out.extend_from_slice(b",\"properties\":{");
    for (j, &c) in out_cols.iter().enumerate() {
        if j > 0 {
            out.push(b',');
        }
        write_str(out, &data.def.columns[c].name);
        out.push(b':');
        write_value(out, &data.columns[c].get(slot as usize));
    }
    out.extend_from_slice(b"},\"geometry\":");
    write_geometry(out, geometries.and_then(|g| g.get(slot)));
    out.push(b'}');
}

/// Rows grouped by their `groupByFieldsForStatistics` values: the values' JSON text (a
/// total, printable key) to the group's slots and its members as the answer writes them.
pub(super) fn group_rows(
    data: &ViewData,
    rows: &[(i64, u32)],
    groups: &[usize],
) -> BTreeMap<Vec<u8>, (Vec<u32>, Vec<u8>)> {
    let mut grouped: BTreeMap<Vec<u8>, (Vec<u32>, Vec<u8>)> = BTreeMap::new();
    for &(_, slot) in rows {
        let mut key = Vec::new();
        let mut members = Vec::new();
        for (i, &g) in groups.iter().enumerate() {
            let v = data.columns[g].get(slot as usize);
            write_value(&mut key, &v);
            key.push(0);
            if i > 0 {
                members.push(b',');
            }
            write_str(&mut members, &data.def.columns[g].name);
            members.push(b':');
            write_value(&mut members, &v);
        }
        grouped
            .entry(key)
            .or_insert_with(|| (Vec::new(), members))
            .0
            .push(slot);
    }
    grouped
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ASCII character alone, and strings mixing plain text with the characters that
    /// need escapes and with non-ASCII ones: each written as serde_json writes it.
    #[test]
    fn a_string_is_written_as_serde_json_writes_it() {
        let mut texts: Vec<String> = (0u8..128).map(|b| char::from(b).to_string()).collect();
        let pieces = [
            "Ada County",
            "\"",
            "\\",
            "\n",
            "\u{0}",
            "\u{1f}",
            "\u{7f}",
            "é",
            "東京",
            "🦪",
            "/",
            "'",
            " ",
            "",
        ];
        let mut state = 11u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state
        };
        for _ in 0..2_000 {
            let mut t = String::new();
            for _ in 0..(next() % 6) {
                t.push_str(pieces[(next() >> 33) as usize % pieces.len()]);
            }
            texts.push(t);
        }
        let mut out = b"x".to_vec();
        for t in &texts {
            out.truncate(1);
            write_str(&mut out, t);
            assert_eq!(out[1..], serde_json::to_vec(t).unwrap()[..], "{t:?}");
        }
    }

    /// The kept timestamp text is the one of the same millisecond, and a new millisecond,
    /// earlier or later, is written afresh.
    #[test]
    fn timestamps_are_kept_only_for_their_millisecond() {
        let fresh = |ms: i64| {
            let mut v = Vec::new();
            write_datetime(&mut v, ms);
            v
        };
        for ms in [
            1_763_700_000_123,
            1_763_700_000_123,
            1_763_700_000_124,
            1_763_700_000_123,
            0,
            // Outside years 0 to 9999: not kept, still right.
            -62_200_000_000_000,
            253_402_300_800_000,
            1_763_700_000_124,
        ] {
            let mut out = b"x".to_vec();
            write_timestamp(&mut out, ms);
            assert_eq!(out[1..], fresh(ms), "{ms}");
        }
        let mut out = Vec::new();
        envelope_start(&mut out);
        out.extend_from_slice(b"}");
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["$version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(v["$timestamp"].as_str().unwrap().len(), 24);
    }
}
