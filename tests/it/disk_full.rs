//! A full disk, for real: the server's data directory on a 48 MB tmpfs that the test mounts
//! and fills. Writes get a 507 naming the setting, reads go on, and writes succeed again once
//! space is freed; what was acknowledged survives a restart. Mounting needs root (CI runs as
//! root); elsewhere the test says why it did not run.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, megabytes: u64) -> Result<Tmpfs, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn free_bytes(path: &Path) -> u64 {
    let s = rustix::fs::statvfs(path).unwrap();
    s.f_bavail * s.f_frsize
}

#[test]
fn a_full_disk_refuses_writes_keeps_reads_and_recovers() {
    use std::io::Write;
    let root = temp_dir("diskfull");
    let mount = match Tmpfs::mount(&root, 48) {
        Ok(m) => m,
        Err(why) => {
            eprintln!("SKIPPED: cannot mount a tmpfs for the disk-full test (needs root): {why}");
            return;
        }
    };
    let data = mount.0.join("data");
    seed_users(&data);
    let min = 16 * 1024 * 1024u64;
    let env = [("GEOSHARD_MIN_FREE_DISK_BYTES", "16777216")];
    let srv = ChildServer::start(&data, &env);
    let mut w = srv.client(WRITER);
    let r = w.put_json("/v1/documents?uri=/before.json", r#"{"n":1}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    // A layer with a row, whose view a clean stop would save beside the store.
    let mut admin = srv.client(ADMIN);
    common::layers::polygon_layer(&mut admin, "Full", "full");
    let square = serde_json::json!({"id": 1, "name": "a",
        "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]]}});
    let r = common::layers::put(&mut admin, "/full/1.json", "&collection=full", &square);
    assert_eq!(r.status, 201, "{}", r.text());

    // Fill the disk to below the bound.
    let filler = mount.0.join("filler");
    {
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![7u8; 1024 * 1024];
        while free_bytes(&mount.0) >= min - 4 * 1024 * 1024 {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
    let free = free_bytes(&mount.0);
    assert!(free < min, "{free} bytes free");
    // Writes of every kind: a 507 naming the setting, nothing written.
    let r = w.put_json("/v1/documents?uri=/during.json", r#"{"n":2}"#);
    assert_eq!(r.status, 507, "{}", r.text());
    let (_, code, message) = r.error();
    assert_eq!(code, "XDMP-NOSPACE");
    assert!(
        message.contains("min_free_disk_bytes (16777216)"),
        "{message}"
    );
    let bulk = b"--b\r\nContent-Type: application/json\r\nContent-Disposition: attachment; \
                 filename=\"/bulk.json\"\r\n\r\n{\"n\":3}\r\n--b--\r\n";
    let r = w.request(
        "POST",
        "/v1/documents",
        &[("Content-Type", "multipart/mixed; boundary=b")],
        bulk,
    );
    assert_eq!(r.status, 507, "{}", r.text());
    assert_eq!(w.delete("/v1/documents?uri=/before.json").status, 507);
    // Reads go on.
    let mut reader = srv.client(READER);
    let r = reader.get("/v1/documents?uri=/before.json");
    assert_eq!((r.status, r.text().as_str()), (200, r#"{"n":1}"#));
    assert_eq!(reader.get("/v1/documents?uri=/during.json").status, 404);
    assert_eq!(Client::new(srv.addr, Auth::None).get("/health").status, 200);

    // A clean stop does not save the views into the space the store keeps; the start after
    // it builds them from the documents.
    let log = srv.log.clone();
    assert!(srv.stop().success());
    assert!(
        log.lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("view not saved") && l.contains("too little free disk")),
        "{:?}",
        log.lock().unwrap()
    );
    let saved: Vec<String> = std::fs::read_dir(data.join("views"))
        .into_iter()
        .flatten()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".seg"))
        .collect();
    assert!(saved.is_empty(), "{saved:?}");
    let srv = ChildServer::start(&data, &env);
    let mut w = srv.client(WRITER);
    let q = serde_json::json!({"params": {"id": "Full", "layer": 0, "method": "query"},
        "query": {"returnCountOnly": true}});
    let r = srv
        .client(ADMIN)
        .post_json("/v1/resources/geoQueryService", &q.to_string());
    assert_eq!(
        (r.status, r.json()["count"].clone()),
        (200, serde_json::json!(1)),
        "{}",
        r.text()
    );

    // Space returns: writes go on.
    std::fs::remove_file(&filler).unwrap();
    let r = w.put_json("/v1/documents?uri=/after.json", r#"{"n":4}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    srv.kill();
    let srv = ChildServer::start(&data, &env);
    let mut reader = srv.client(READER);
    for (uri, want) in [
        ("/before.json", r#"{"n":1}"#),
        ("/after.json", r#"{"n":4}"#),
    ] {
        let r = reader.get(&format!("/v1/documents?uri={uri}"));
        assert_eq!((r.status, r.text().as_str()), (200, want), "{uri}");
    }
    assert_eq!(reader.get("/v1/documents?uri=/bulk.json").status, 404);
    srv.kill();
    drop(mount);
}
