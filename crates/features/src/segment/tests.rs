//! Unit tests of `segment`.

use super::*;
use crate::template::{Cell, parse_template};
use crate::view::{GeometryOut, GeometryRef, NewRow};
use serde_json::json;

const UNLIMITED: SaveLimits = SaveLimits {
    cancelled: &|| false,
    room: &|_| true,
};

const ENGINE: crate::spatial::EngineConfig = crate::spatial::EngineConfig {
    shards: 4,
    resolution: 2,
};

fn saving(fingerprint: &str, point: u64) -> Saving<'_> {
    Saving {
        fingerprint,
        point,
        engine: ENGINE,
    }
}

fn template() -> Template {
    let column =
        |name: &str, t: &str| json!({"name": name, "scalarType": t, "val": name, "nullable": true});
    let doc = json!({"template": {"context": "/", "collections": ["c"], "rows": [{
        "schemaName": "s", "viewName": "v", "columns": [
            {"name": "OBJECTID", "scalarType": "long", "val": "id"},
            column("f", "double"), column("t", "string"), column("b", "boolean"),
            column("d", "dateTime")]}]}});
    parse_template("/t.json", &doc).unwrap()
}

fn row(id: i64, t: Option<&str>, g: Option<GeometryOut>) -> NewRow {
    NewRow {
        cells: vec![
            Some(Cell::Int(id)),
            (id % 2 == 0).then_some(Cell::Float(id as f64 / 3.0)),
            t.map(|t| Cell::Str(Arc::from(t))),
            Some(Cell::Bool(id % 3 == 0)),
            (id % 4 != 0).then_some(Cell::Date(id * 86_400_000)),
        ],
        geometries: vec![("geometry".to_string(), g)],
    }
}

/// Every row as its cells and geometry, documents in URI order, with its URI and
/// readers.
fn dump(view: &RwLock<ViewData>) -> Vec<String> {
    let listing = Listing::of(view);
    let data = view.read();
    let mut out = Vec::new();
    for (uri, readers, slots) in listing.iter() {
        for &s in slots {
            let cells: Vec<String> = data
                .columns
                .iter()
                .map(|c| format!("{:?}", c.get(s as usize)))
                .collect();
            let g = data.geometry_column("geometry").get(s).map(|g| match g {
                GeometryRef::Point(x, y) => format!("{x},{y}"),
                GeometryRef::Json(j) => String::from_utf8_lossy(j).into_owned(),
            });
            out.push(format!("{uri} {readers:?} {cells:?} {g:?}"));
        }
    }
    out
}

#[test]
fn a_view_reads_back_as_it_was_saved_and_any_changed_byte_is_found() {
    let t = template();
    let def = t.views[0].clone();
    let mut data = ViewData::new(def.clone());
    let square = r#"{"type":"Polygon","coordinates":[[[0,0],[1,0],[1,1],[0,1],[0,0]]]}"#;
    let readers = RoleSet::from_bits(0b101);
    data.add_rows(
        &Arc::from("/b.json"),
        readers,
        vec![row(2, Some("zwei"), Some(GeometryOut::Point(1.5, -2.25)))],
    );
    // Two rows of one document, a shared string, no geometry, a polygon.
    data.add_rows(
        &Arc::from("/a.json"),
        RoleSet::EMPTY,
        vec![
            row(
                1,
                Some("eins"),
                Some(GeometryOut::Json(Arc::from(square.as_bytes()))),
            ),
            row(3, None, None),
        ],
    );
    data.add_rows(
        &Arc::from("/c.json"),
        readers,
        vec![row(4, Some("zwei"), Some(GeometryOut::Point(0.0, 0.0)))],
    );
    let mut paths = BTreeMap::new();
    paths.insert("geometry".to_string(), Path::parse("geometry").unwrap());
    let print = fingerprint(&t, &def, &paths, 100, "");
    let diagnostics = vec![("/x.json".to_string(), "no geometry".to_string(), false)];
    let dir = geoshard_core::testing::tempdir();
    let file = dir.join("s.v.seg");
    let data = RwLock::new(data);
    assert_eq!(
        save(
            &file,
            &data,
            &paths,
            &saving(&print, 42),
            &diagnostics,
            &UNLIMITED
        )
        .unwrap(),
        4
    );
    // Without room for the third section, a save stops there and leaves no file of its
    // own; the file it would have replaced stays whole.
    let asked = std::sync::atomic::AtomicUsize::new(0);
    let room = |_: u64| asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 2;
    for target in [dir.join("t.v.seg"), file.clone()] {
        asked.store(0, std::sync::atomic::Ordering::Relaxed);
        let limits = SaveLimits {
            cancelled: &|| false,
            room: &room,
        };
        let e = save(&target, &data, &paths, &saving(&print, 43), &[], &limits).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::StorageFull);
        assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 3);
        assert!(!target.with_extension("seg.tmp").exists());
    }
    assert!(!dir.join("t.v.seg").exists());

    let points = std::sync::atomic::AtomicUsize::new(0);
    let index = |items: Vec<(u32, geo::Geometry<f64>)>| -> Result<Arc<Engine>, Fault> {
        points.store(items.len(), std::sync::atomic::Ordering::Relaxed);
        let engine = Engine::new(Default::default()).map_err(|e| e.to_string())?;
        engine.bulk_load(items);
        Ok(Arc::new(engine))
    };
    // `file` as built from `print`, its sections up to `check` bytes checked at open.
    let read = |file: &std::path::Path, print: &str, check: usize| {
        load(file, def.clone(), &paths, print, &index, (ENGINE, check))
    };
    let loaded = read(&file, &print, usize::MAX).unwrap();
    assert_eq!(loaded.point, 42);
    assert_eq!(loaded.diagnostics, diagnostics);
    assert_eq!(loaded.data.len(), 4);
    // Rows in URI order, as a build from the documents gives them.
    assert_eq!(*loaded.data.slots_of("/a.json"), [0, 1]);
    assert_eq!(*loaded.data.slots_of("/c.json"), [3]);
    assert_eq!(dump(&RwLock::new(loaded.data)), dump(&data));
    // Three geometries indexed: the polygon and the two points.
    assert_eq!(points.load(std::sync::atomic::Ordering::Relaxed), 3);
    assert_eq!(loaded.indexes["geometry"].len(), 3);

    // Another fingerprint is refused; so is every file with one byte changed, or cut.
    assert!(read(&file, &fingerprint(&t, &def, &paths, 99, ""), usize::MAX).is_err());
    // Checked whole at open, or its sections' sums left for later: either way a changed
    // byte is found, at open or by the check after it.
    let bytes = std::fs::read(&file).unwrap();
    let damaged = dir.join("damaged.seg");
    let whole = read(&file, &print, 0).unwrap();
    assert!(whole.unchecked.bytes() > 0);
    assert!(whole.unchecked.verify().is_ok());
    let open = |check| read(&damaged, &print, check);
    let mut later = 0;
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x01;
        std::fs::write(&damaged, &b).unwrap();
        assert!(open(usize::MAX).is_err(), "byte {i}");
        match open(0) {
            Err(_) => {}
            Ok(l) => {
                assert!(l.unchecked.verify().is_err(), "byte {i}, checked later");
                later += 1;
            }
        }
    }
    // Many bytes (values, points) are in sections whose damage only their sum shows.
    assert!(later > bytes.len() / 10, "{later} of {}", bytes.len());
    for len in [0, 10, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&damaged, &bytes[..len]).unwrap();
        assert!(open(usize::MAX).is_err(), "{len} bytes");
    }
}

#[test]
fn a_view_saved_while_written_is_right_once_the_documents_changed_are_applied() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let t = template();
    let def = t.views[0].clone();
    let readers = RoleSet::from_bits(0b11);
    let point = |i: i64| Some(GeometryOut::Point(i as f64 * 1e-3, (i % 90) as f64));
    let view = RwLock::new(ViewData::new(def.clone()));
    const DOCS: i64 = 200_000;
    {
        let mut data = view.write();
        for i in 0..DOCS {
            let name = format!("n{}", i % 1000);
            data.add_rows(
                &format!("/d/{i}.json"),
                readers,
                vec![row(i, Some(&name), point(i))],
            );
        }
    }
    let mut paths = BTreeMap::new();
    paths.insert("geometry".to_string(), Path::parse("geometry").unwrap());
    let print = fingerprint(&t, &def, &paths, 100, "");
    let dir = geoshard_core::testing::tempdir();
    let file = dir.join("s.v.seg");

    // Replacements, removals and new documents, as the writer thread makes them, from
    // before the save starts until it ends; each value new, so dictionary numbers are
    // freed and reused meanwhile.
    let done = AtomicBool::new(false);
    let writes = AtomicUsize::new(0);
    let (during, last) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut last: HashMap<String, Option<NewRow>> = HashMap::new();
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            let mut k: i64 = 0;
            while !done.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let uri = format!("/d/{}.json", x % (DOCS as u64 + DOCS as u64 / 10));
                let new = (!x.is_multiple_of(5))
                    .then(|| row(1_000_000 + k, Some(&format!("w{k}")), point(1_000_000 + k)));
                let mut data = view.write();
                let old = data.kill_rows(&uri);
                if let Some(r) = &new {
                    data.add_rows(&uri, readers, vec![r.clone()]);
                }
                data.release(&old);
                drop(data);
                last.insert(uri, new);
                k += 1;
                writes.store(k as usize, Ordering::Relaxed);
            }
            last
        });
        while writes.load(Ordering::Relaxed) < 100 {
            std::thread::yield_now();
        }
        let before = writes.load(Ordering::Relaxed);
        save(&file, &view, &paths, &saving(&print, 7), &[], &UNLIMITED).unwrap();
        let during = writes.load(Ordering::Relaxed) - before;
        done.store(true, Ordering::Relaxed);
        (during, writer.join().unwrap())
    });
    assert!(during > 0, "no write while saving");

    let built = AtomicBool::new(false);
    let index = |items: Vec<(u32, geo::Geometry<f64>)>| -> Result<Arc<Engine>, Fault> {
        built.store(true, Ordering::Relaxed);
        let engine = Engine::new(Default::default()).map_err(|e| e.to_string())?;
        engine.bulk_load(items);
        Ok(Arc::new(engine))
    };
    // `file`, every section's sum checked at open, indexed under `engine`'s settings.
    let read = |file: &std::path::Path, engine| {
        load(
            file,
            def.clone(),
            &paths,
            &print,
            &index,
            (engine, usize::MAX),
        )
    };
    let mut loaded = read(&file, ENGINE).unwrap();
    assert_eq!(loaded.point, 7);
    // The points' index was read back, not built, and finds every row at its point.
    assert!(!built.load(Ordering::Relaxed));
    let engine = &loaded.indexes["geometry"];
    let with_points = loaded
        .data
        .live_slots()
        .filter(|&s| loaded.data.geometry_column("geometry").get(s).is_some())
        .count();
    assert_eq!(engine.len(), with_points);
    for slot in loaded.data.live_slots().step_by(37) {
        // A row whose document changed while saving may have none.
        let Some(GeometryRef::Point(x, y)) = loaded.data.geometry_column("geometry").get(slot)
        else {
            continue;
        };
        let q = crate::spatial::predicate::Query::point(x, y);
        let found = engine.query(&q, crate::spatial::predicate::Relation::Intersects);
        assert!(found.contains(&slot), "{slot} at {x} {y}: {found:?}");
    }
    // Saved for other spatial settings, the index is built again.
    let other = crate::spatial::EngineConfig {
        shards: 3,
        ..ENGINE
    };
    read(&file, other).unwrap();
    assert!(built.load(Ordering::Relaxed));
    let before = dump(&RwLock::new(read(&file, ENGINE).unwrap().data));
    // A start applies every document changed since the save's point: its rows replaced.
    for (uri, new) in last {
        let old = loaded.data.kill_rows(&uri);
        if let Some(r) = new {
            loaded.data.add_rows(&uri, readers, vec![r]);
        }
        loaded.data.release(&old);
    }
    let want = dump(&view);
    let loaded = RwLock::new(loaded.data);
    let got = dump(&loaded);
    assert!(want.len() > DOCS as usize / 2);
    let same = |got: &[String]| {
        let wrong: Vec<_> = got
            .iter()
            .zip(&want)
            .filter(|(g, w)| g != w)
            .take(3)
            .collect();
        assert!(wrong.is_empty(), "{wrong:?}");
        assert_eq!(got.len(), want.len());
    };
    same(&got);
    // The file read back in place was not written by those changes.
    let reread = read(&file, ENGINE).unwrap();
    assert_eq!(dump(&RwLock::new(reread.data)), before);
    // A view read back and changed saves and reads back again as it is.
    let again = dir.join("again.seg");
    save(&again, &loaded, &paths, &saving(&print, 8), &[], &UNLIMITED).unwrap();
    let third = read(&again, ENGINE).unwrap();
    same(&dump(&RwLock::new(third.data)));
}

#[test]
fn file_names_escape_what_a_path_must_not_hold() {
    assert_eq!(
        file_name(&ViewKey::new("Places", "places_0")),
        "places.places_0.seg"
    );
    assert_eq!(file_name(&ViewKey::new("a/b", "..")), "a%2fb....seg");
}
