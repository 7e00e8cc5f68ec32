//! The fuzz corpora, replayed on stable: every committed input of every target in
//! `fuzz/corpus/<target>/` goes through the target's properties (`geoshard::fuzzing`), so what
//! the fuzzers found stays tested without nightly or libFuzzer.

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut inputs = 0;
    for path in entries {
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let outcome = std::panic::catch_unwind(|| check(&bytes));
        assert!(outcome.is_ok(), "{target}: {} fails", path.display());
        inputs += 1;
    }
    assert!(
        inputs >= 10,
        "{target}: only {inputs} inputs in {}",
        dir.display()
    );
}

#[test]
fn where_clause() {
    replay("where_clause", geoshard::fuzzing::where_clause);
}

#[test]
fn geojson() {
    replay("geojson", geoshard::fuzzing::geojson);
}

#[test]
fn query_request() {
    replay("query_request", geoshard::fuzzing::query_request);
}

#[test]
fn template_path() {
    replay("template_path", geoshard::fuzzing::template_path);
}

#[test]
fn multipart() {
    replay("multipart", geoshard::fuzzing::multipart);
}

#[test]
fn digest_header() {
    replay("digest_header", geoshard::fuzzing::digest_header);
}

#[test]
fn point_location() {
    replay("point_location", geoshard::fuzzing::point_location);
}
