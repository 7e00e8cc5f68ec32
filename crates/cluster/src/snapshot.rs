//! Snapshots and the log's retention.
//!
//! Every `cluster_snapshot_entries` log entries, one node (of the caught-up live nodes that
//! take snapshots, the one with the smallest name) copies its store, as of one commit, into
//! a JetStream object store bucket (`geoshard_<cluster>_snapshots`, as many replicas as the
//! log), with the log entry the copy has applied. Then it drops from the log the entries
//! that both the snapshot before this one and every live node have applied: a node down for
//! less than a snapshot's interval still finds the entries it needs, and a node that does not
//! (new, or gone longer) installs the snapshot before it opens its store (`prepare`) and
//! follows the log from there.
//!
//! A node whose store keeps only some shards' documents whole (`cluster_shards` with `hold`)
//! makes a snapshot that serves only nodes holding those shards, so snapshots are taken per
//! *group*, the nodes keeping the same documents: object `store` for the nodes that keep
//! every document, `store-0-1-2-3` for those holding shards 0 to 3, each group's taken by its
//! caught-up node of the smallest name. The log keeps the entries after every group's latest
//! snapshot, so a group whose nodes are all gone holds it back until one returns.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::object_store::{InfoErrorKind, ObjectMetadata, ObjectStore};

use super::{ClusterError, ClusterSettings, Inner, js_error};
use crate::store::snapshot as copies;

/// The object holding the latest snapshot of the nodes that keep every document, and its
/// metadata key for the log entry.
const OBJECT: &str = "store";
const SEQUENCE: &str = "sequence";
/// The metadata key of the snapshot's MAC, over its log entry and its SHA-256 digest.
const MAC: &str = "mac";
/// How often the node that takes snapshots looks at the log's length.
const CHECK: Duration = Duration::from_secs(2);
/// A snapshot download that receives nothing this long is given up and made again, as often
/// as `DOWNLOADS` in all.
const STALLED: Duration = Duration::from_secs(10);
const DOWNLOADS: usize = 5;

impl ClusterSettings {
    pub fn snapshot_bucket(&self) -> String {
        format!("geoshard_{}_snapshots", self.name)
    }

    /// The object of this node's group's snapshots.
    pub(super) fn snapshot_object(&self) -> String {
        group_object(self.keeps_all, &self.shards)
    }
}

/// The snapshot object of the nodes keeping every document (`keeps_all`), else of those
/// holding exactly `shards`.
fn group_object(keeps_all: bool, shards: &[usize]) -> String {
    if keeps_all {
        return OBJECT.to_string();
    }
    let mut s = shards.to_vec();
    s.sort_unstable();
    s.dedup();
    let names: Vec<String> = s.iter().map(usize::to_string).collect();
    format!("{OBJECT}-{}", names.join("-"))
}

/// The snapshot bucket, made on first use (as `create_object_store` makes it).
pub(super) async fn bucket(
    js: &jetstream::Context,
    settings: &ClusterSettings,
) -> Result<ObjectStore, ClusterError> {
    let name = settings.snapshot_bucket();
    if let Ok(store) = js.get_object_store(&name).await {
        return Ok(store);
    }
    js.get_or_create_stream(jetstream::stream::Config {
        name: format!("OBJ_{name}"),
        subjects: vec![format!("$O.{name}.C.>"), format!("$O.{name}.M.>")],
        storage: jetstream::stream::StorageType::File,
        num_replicas: settings.replicas,
        discard: jetstream::stream::DiscardPolicy::New,
        allow_rollup: true,
        allow_direct: true,
        ..Default::default()
    })
    .await
    .map_err(js_error)?;
    js.get_object_store(&name).await.map_err(js_error)
}

/// The log entry the latest snapshot in `object` has applied; 0 when there is none.
pub(super) async fn latest(objects: &ObjectStore, object: &str) -> Result<u64, ClusterError> {
    match objects.info(object).await {
        Ok(info) => info
            .metadata
            .get(SEQUENCE)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ClusterError::JetStream("a snapshot without its log entry".into())),
        Err(e) if e.kind() == InfoErrorKind::NotFound => Ok(0),
        Err(e) => Err(js_error(e)),
    }
}

/// Every group's latest snapshot: (object, log entry), in name order.
async fn every_latest(objects: &ObjectStore) -> Result<Vec<(String, u64)>, ClusterError> {
    use futures_util::StreamExt as _;
    let mut list = objects.list().await.map_err(js_error)?;
    let mut out = Vec::new();
    while let Some(info) = list.next().await {
        let info = info.map_err(js_error)?;
        if info.deleted || !(info.name == OBJECT || info.name.starts_with("store-")) {
            continue;
        }
        let seq = info.metadata.get(SEQUENCE).and_then(|s| s.parse().ok());
        out.push((info.name, seq.unwrap_or(0)));
    }
    out.sort();
    Ok(out)
}

/// The snapshot a node of group `own` installs when the log starts at entry `first`: its
/// group's, else the newest of a group keeping every document it needs (every document, or
/// a superset of its shards); `None` when none reaches the log.
fn pick(groups: &[(String, u64)], own: &str, first: u64) -> Option<(String, u64)> {
    let shards = |name: &str| -> Option<Vec<usize>> {
        if name == OBJECT {
            return None;
        }
        name.strip_prefix("store-")?
            .split('-')
            .map(|s| s.parse().ok())
            .collect()
    };
    let needed = shards(own);
    let serves = |name: &str| match (&needed, shards(name)) {
        (_, None) => name == OBJECT,
        (None, Some(_)) => false,
        (Some(need), Some(kept)) => need.iter().all(|s| kept.contains(s)),
    };
    let reaching = groups.iter().filter(|(_, seq)| seq + 1 >= first);
    if let Some(g) = groups.iter().find(|(n, seq)| n == own && seq + 1 >= first) {
        return Some(g.clone());
    }
    reaching
        .filter(|(n, _)| serves(n))
        .max_by_key(|(_, seq)| *seq)
        .cloned()
}

/// The latest snapshots, for `geoshard cluster status`.
pub(super) async fn describe(js: &jetstream::Context, settings: &ClusterSettings) -> String {
    let Ok(objects) = js.get_object_store(settings.snapshot_bucket()).await else {
        return "snapshot: none\n".to_string();
    };
    let mut out = String::new();
    let names = match every_latest(&objects).await {
        Ok(list) => list,
        Err(e) => return format!("snapshot: unknown ({e})\n"),
    };
    for (name, _) in names {
        match objects.info(&name).await {
            Ok(info) => out.push_str(&format!(
                "snapshot{}: log entry {}, {} bytes\n",
                name.strip_prefix(OBJECT).unwrap_or(""),
                info.metadata.get(SEQUENCE).map_or("?", String::as_str),
                info.size
            )),
            Err(e) => out.push_str(&format!("snapshot {name}: unknown ({e})\n")),
        }
    }
    if out.is_empty() {
        out.push_str("snapshot: none\n");
    }
    out
}

/// Before a node opens its store: when the log no longer holds the entries after the last
/// the store in `dir` applied, install the latest snapshot in its place.
pub fn prepare(settings: &ClusterSettings, dir: &Path) -> Result<(), ClusterError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClusterError::Runtime(e.to_string()))?;
    runtime.block_on(async {
        let (client, js, _) = super::nats(settings).await?;
        super::log_stream(&js, settings).await?;
        let first = js
            .get_stream(settings.stream())
            .await
            .map_err(js_error)?
            .info()
            .await
            .map_err(js_error)?
            .state
            .first_sequence;
        let applied = copies::stored_applied(dir).map_err(js_error)?;
        if applied + 1 >= first {
            return Ok(());
        }
        let objects = bucket(&js, settings).await?;
        let own = settings.snapshot_object();
        let (object, seq) = pick(&every_latest(&objects).await?, &own, first)
            .unwrap_or((own.clone(), latest(&objects, &own).await?));
        if seq + 1 < first {
            return Err(ClusterError::JetStream(format!(
                "the log starts at entry {first} and the latest snapshot holds entries up to \
                 {seq} only: entries {} to {} are in neither",
                seq + 1,
                first - 1
            )));
        }
        tracing::info!(
            applied,
            log_first = first,
            snapshot = seq,
            "the log no longer holds the entries this node needs: installing the snapshot"
        );
        let incoming = dir.join("geoshard.redb.incoming");
        std::fs::create_dir_all(dir).map_err(js_error)?;
        // A snapshot replaced while it is read loses its chunks: read the newer one.
        let mut tries = 0;
        let signer = super::trust::Signer::new(settings.secret.as_ref());
        while let Err(e) = download(&objects, &object, &incoming, &signer).await {
            tries += 1;
            if tries == DOWNLOADS {
                return Err(e);
            }
            tracing::warn!(error = %e, "reading the snapshot again");
        }
        let installed = copies::stored_applied_in(&incoming).map_err(js_error)?;
        copies::install(dir, &incoming).map_err(js_error)?;
        tracing::info!(applied = installed, "snapshot installed");
        drop(client);
        Ok(())
    })
}

/// What a snapshot's MAC is over: its log entry and its digest as the object store gives it
/// (`SHA-256=` and the digest in padded base64url), which the download checks; and a group's
/// object name, so that one group's snapshot put in another's place is refused.
fn snapshot_parts<'a>(name: &'a str, seq: &'a str, digest: &'a str) -> Vec<&'a [u8]> {
    let mut parts: Vec<&[u8]> = vec![b"snapshot", seq.as_bytes(), digest.as_bytes()];
    if name != OBJECT {
        parts.push(name.as_bytes());
    }
    parts
}

/// Download the latest snapshot to `path`, if it is signed with the cluster's key; an error
/// when it stops coming for [`STALLED`].
async fn download(
    objects: &ObjectStore,
    name: &str,
    path: &Path,
    signer: &super::trust::Signer,
) -> Result<(), ClusterError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut object = objects.get(name).await.map_err(js_error)?;
    let info = &object.info;
    let meta = |k: &str| info.metadata.get(k).map(String::as_str);
    let parts = snapshot_parts(
        name,
        meta(SEQUENCE).unwrap_or(""),
        info.digest.as_deref().unwrap_or(""),
    );
    if !signer.verify(&parts, meta(MAC)) {
        super::trust::Refused::Snapshot.record("the snapshot in the object store");
        return Err(ClusterError::JetStream(
            "the snapshot is not signed with this cluster's secret".into(),
        ));
    }
    let mut file = tokio::fs::File::create(path).await.map_err(js_error)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        // The object checks its SHA-256 digest as it ends.
        let n = tokio::time::timeout(STALLED, object.read(&mut buf))
            .await
            .map_err(|_| {
                ClusterError::JetStream(format!(
                    "the snapshot stopped coming for {} s",
                    STALLED.as_secs()
                ))
            })?
            .map_err(js_error)?;
        if n == 0 {
            return file.flush().await.map_err(js_error);
        }
        file.write_all(&buf[..n]).await.map_err(js_error)?;
        geoshard_core::metrics::record(|m| {
            m.cluster_copied
                .with_label_values(&["snapshot"])
                .inc_by(n as u64)
        });
    }
}

/// Taking snapshots: every [`CHECK`], if this node is the [`taker`] and the log has grown by
/// `snapshot_entries` since the latest snapshot, take one; and drop what the log no longer
/// needs.
pub(super) async fn snapshots(inner: Arc<Inner>) {
    let every = inner.settings.snapshot_entries;
    if every == 0 {
        return;
    }
    let mut objects = None;
    // The snapshot before the latest this node took: the log keeps the entries after it, for
    // a node that installed it just before the latest replaced it.
    let mut kept_snapshot: Option<u64> = None;
    let mut trimmed_to = 1;
    loop {
        tokio::time::sleep(CHECK).await;
        if !inner.caught_up.load(Ordering::Acquire) {
            continue;
        }
        let peers = inner.peers.lock().clone();
        // Shards placed automatically move: the group is the one the node serves now.
        let group = group_object(
            inner.keeps_all.load(Ordering::Acquire),
            &inner.serving.lock(),
        );
        if taker(&peers, &group) != Some(inner.settings.node.as_str()) {
            continue;
        }
        if objects.is_none() {
            match bucket(&inner.js, &inner.settings).await {
                Ok(o) => objects = Some(o),
                Err(e) => {
                    tracing::warn!(error = %e, "the snapshot bucket");
                    continue;
                }
            }
        }
        let Some(store) = &objects else { continue };
        let result = async {
            let latest = latest(store, &group).await?;
            if *inner.visible.borrow() >= latest + every {
                take(&inner, store, &group).await?;
                kept_snapshot = Some(latest);
            }
            // Trimmed at every check, not only after a snapshot: a node whose lease ends
            // between snapshots stops holding the log back then.
            let Some(previous) = kept_snapshot else {
                return Ok(());
            };
            let oldest = peers.iter().map(|p| p.applied).min().unwrap_or(0);
            // Another group's nodes start from their own group's snapshot: the log keeps
            // what follows the oldest of them.
            let others = every_latest(store)
                .await?
                .into_iter()
                .filter(|(name, _)| *name != group)
                .map(|(_, seq)| seq)
                .min()
                .unwrap_or(u64::MAX);
            let keep_from = previous.min(oldest).min(others) + 1;
            if keep_from > trimmed_to {
                let stream = inner
                    .js
                    .get_stream(inner.settings.stream())
                    .await
                    .map_err(js_error)?;
                let purged = stream
                    .purge()
                    .sequence(keep_from)
                    .await
                    .map_err(js_error)?
                    .purged;
                trimmed_to = keep_from;
                tracing::info!(
                    snapshot = previous,
                    keep_from,
                    purged,
                    "log entries dropped"
                );
            }
            Ok::<_, ClusterError>(())
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, "taking a snapshot");
        }
    }
}

/// The node that takes the snapshots of group `group`: of its caught-up live nodes that take
/// them, the one with the smallest name (so one node, whatever the others' settings).
fn taker<'a>(peers: &'a [super::NodeRecord], group: &str) -> Option<&'a str> {
    peers
        .iter()
        .filter(|p| p.caught_up && p.snapshot_entries > 0)
        .filter(|p| group_object(p.keeps_all, &p.shards) == group)
        .map(|p| p.node.as_str())
        .min()
}

/// Copy the store and put the copy in the bucket; the log entry it has applied.
async fn take(inner: &Arc<Inner>, objects: &ObjectStore, group: &str) -> Result<u64, ClusterError> {
    let started = std::time::Instant::now();
    let path = inner.store.path().with_file_name("snapshot.redb.tmp");
    let store = inner.store.clone();
    let copy = path.clone();
    let exported = tokio::task::spawn_blocking(move || store.export(&copy)).await;
    let seq = match exported.map_err(js_error).and_then(|r| r.map_err(js_error)) {
        Ok(seq) => seq,
        Err(e) => {
            // A copy cut short (a full disk) is not left to take the room.
            let _ = tokio::fs::remove_file(&path).await;
            return Err(e);
        }
    };
    let put = async {
        let mut metadata = HashMap::from([(SEQUENCE.to_string(), seq.to_string())]);
        if inner.signer.on() {
            let digest = file_digest(&path).await?;
            let sequence = seq.to_string();
            if let Some(mac) = inner
                .signer
                .sign(&snapshot_parts(group, &sequence, &digest))
            {
                metadata.insert(MAC.to_string(), mac);
            }
        }
        let mut file = tokio::fs::File::open(&path).await.map_err(js_error)?;
        let meta = ObjectMetadata {
            name: group.to_string(),
            description: Some(format!("geoshard's store as of log entry {seq}")),
            metadata,
            ..Default::default()
        };
        objects.put(meta, &mut file).await.map_err(js_error)
    }
    .await;
    let _ = tokio::fs::remove_file(&path).await;
    let info = put?;
    tracing::info!(
        seq,
        bytes = info.size,
        secs = started.elapsed().as_secs_f64(),
        "snapshot taken"
    );
    Ok(seq)
}

/// A file's SHA-256 as the object store writes an object's digest.
async fn file_digest(path: &Path) -> Result<String, ClusterError> {
    use base64::Engine as _;
    use sha2::Digest as _;
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        use std::io::Read as _;
        let mut file = std::fs::File::open(&path)?;
        let mut hash = sha2::Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
        }
        Ok::<_, std::io::Error>(format!(
            "SHA-256={}",
            base64::engine::general_purpose::URL_SAFE.encode(hash.finalize())
        ))
    })
    .await
    .map_err(js_error)?
    .map_err(js_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, caught_up: bool, snapshot_entries: u64) -> super::super::NodeRecord {
        placed(name, caught_up, snapshot_entries, &[])
    }

    fn placed(
        name: &str,
        caught_up: bool,
        snapshot_entries: u64,
        shards: &[usize],
    ) -> super::super::NodeRecord {
        super::super::NodeRecord {
            node: name.into(),
            http: String::new(),
            applied: 0,
            caught_up,
            started: 0,
            version: String::new(),
            partition: String::new(),
            shards: shards.to_vec(),
            keeps_all: shards.is_empty(),
            snapshot_entries,
            ask: String::new(),
            auto: false,
            taking: Vec::new(),
            letting_go: Vec::new(),
            mac: None,
        }
    }

    #[test]
    fn the_taker_is_the_first_caught_up_node_that_takes_snapshots() {
        let peers = [
            node("a", true, 0),
            node("b", false, 100),
            node("c", true, 100),
            node("d", true, 50),
        ];
        assert_eq!(taker(&peers, OBJECT), Some("c"));
        assert_eq!(taker(&peers[..2], OBJECT), None);
        // Nodes keeping some shards' documents take their own group's, one per group.
        let groups = [
            placed("a", true, 100, &[0, 1, 2, 3]),
            placed("b", true, 100, &[3, 2, 1, 0]),
            placed("c", true, 100, &[2, 3, 4, 5]),
            node("d", true, 100),
        ];
        assert_eq!(group_object(false, &[3, 2, 1, 0]), "store-0-1-2-3");
        assert_eq!(taker(&groups, "store-0-1-2-3"), Some("a"));
        assert_eq!(taker(&groups, "store-2-3-4-5"), Some("c"));
        assert_eq!(taker(&groups, OBJECT), Some("d"));
        assert_eq!(taker(&groups, "store-4-5"), None);
        // A group's snapshot is signed over its name.
        assert_ne!(
            snapshot_parts("store-0-1", "7", "d"),
            snapshot_parts("store-2-3", "7", "d")
        );
        assert_eq!(snapshot_parts(OBJECT, "7", "d").len(), 3);
    }

    #[test]
    fn a_node_installs_its_groups_snapshot_or_one_that_keeps_more() {
        let g = |list: &[(&str, u64)]| -> Vec<(String, u64)> {
            list.iter().map(|(n, s)| (n.to_string(), *s)).collect()
        };
        let groups = g(&[
            ("store", 50),
            ("store-0-1-2-3", 90),
            ("store-0-1-4-5", 120),
            ("store-2-3-4-5", 80),
        ]);
        let at = |own: &str, first: u64| pick(&groups, own, first).map(|(n, _)| n);
        // Its own group's, when it reaches the log.
        assert_eq!(at("store-0-1-2-3", 60).as_deref(), Some("store-0-1-2-3"));
        // Else the newest that keeps its shards: a superset, or every document.
        assert_eq!(at("store-0-1", 100).as_deref(), Some("store-0-1-4-5"));
        assert_eq!(at("store-0-1-2-3", 100), None);
        assert_eq!(at("store-2-3", 60).as_deref(), Some("store-0-1-2-3"));
        assert_eq!(at("store-9", 10).as_deref(), Some("store"));
        // A node keeping every document takes only such a snapshot.
        assert_eq!(at("store", 60), None);
        assert_eq!(at("store", 40).as_deref(), Some("store"));
        // A record written before the setting was in the registry reads as taking none.
        let old: super::super::NodeRecord = serde_json::from_str(
            r#"{"node":"x","http":"","applied":1,"caught_up":true,"started":0,"version":"0"}"#,
        )
        .unwrap();
        assert_eq!(old.snapshot_entries, 0);
    }
}
