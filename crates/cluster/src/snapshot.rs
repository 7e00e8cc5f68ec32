//! Snapshots and the log's retention.
//!
//! Every `cluster_snapshot_entries` log entries, one node (of the caught-up live nodes that
//! take snapshots, the one with the smallest name) copies its store, as of one commit, into
//! a JetStream object store bucket (`geoshard_<cluster>_snapshots`, as many replicas as the
//! log), with the log entry the copy has applied. Then it drops from the log the entries
//! that both the snapshot before this one and every live node have applied: a node down for
//! less than a snapshot's interval still finds the entries it needs, and a node that does not
//! (new, or gone longer) installs the snapshot before it opens its store (`prepare`) and
//! follows the log from there. Only a node whose store keeps every document's content takes
//! them, so any snapshot serves any node; a cluster of nodes that each keep some shards'
//! documents only (`cluster_shards` with `hold`) takes none, and its log keeps every entry.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::object_store::{InfoErrorKind, ObjectMetadata, ObjectStore};

use super::{ClusterError, ClusterSettings, Inner, js_error};
use crate::store::snapshot as copies;

/// The object holding the latest snapshot, and its metadata key for the log entry.
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

/// The log entry the latest snapshot has applied; 0 when there is none.
pub(super) async fn latest(objects: &ObjectStore) -> Result<u64, ClusterError> {
    match objects.info(OBJECT).await {
        Ok(info) => info
            .metadata
            .get(SEQUENCE)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ClusterError::JetStream("a snapshot without its log entry".into())),
        Err(e) if e.kind() == InfoErrorKind::NotFound => Ok(0),
        Err(e) => Err(js_error(e)),
    }
}

/// The latest snapshot, for `geoshard cluster status`.
pub(super) async fn describe(js: &jetstream::Context, settings: &ClusterSettings) -> String {
    let Ok(objects) = js.get_object_store(settings.snapshot_bucket()).await else {
        return "snapshot: none\n".to_string();
    };
    match objects.info(OBJECT).await {
        Ok(info) => format!(
            "snapshot: log entry {}, {} bytes\n",
            info.metadata.get(SEQUENCE).map_or("?", String::as_str),
            info.size
        ),
        Err(e) if e.kind() == InfoErrorKind::NotFound => "snapshot: none\n".to_string(),
        Err(e) => format!("snapshot: unknown ({e})\n"),
    }
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
        let seq = latest(&objects).await?;
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
        while let Err(e) = download(&objects, &incoming, &signer).await {
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
/// (`SHA-256=` and the digest in padded base64url), which the download checks.
fn snapshot_parts<'a>(seq: &'a str, digest: &'a str) -> [&'a [u8]; 3] {
    [b"snapshot", seq.as_bytes(), digest.as_bytes()]
}

/// Download the latest snapshot to `path`, if it is signed with the cluster's key; an error
/// when it stops coming for [`STALLED`].
async fn download(
    objects: &ObjectStore,
    path: &Path,
    signer: &super::trust::Signer,
) -> Result<(), ClusterError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut object = objects.get(OBJECT).await.map_err(js_error)?;
    let info = &object.info;
    let meta = |k: &str| info.metadata.get(k).map(String::as_str);
    let parts = snapshot_parts(
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
        if taker(&peers) != Some(inner.settings.node.as_str()) {
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
            let latest = latest(store).await?;
            if *inner.visible.borrow() >= latest + every {
                take(&inner, store).await?;
                kept_snapshot = Some(latest);
            }
            // Trimmed at every check, not only after a snapshot: a node whose lease ends
            // between snapshots stops holding the log back then.
            let Some(previous) = kept_snapshot else {
                return Ok(());
            };
            let oldest = peers.iter().map(|p| p.applied).min().unwrap_or(0);
            let keep_from = previous.min(oldest) + 1;
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

/// The node that takes the cluster's snapshots: of the caught-up live nodes that take them,
/// the one with the smallest name (so one node, whatever the others' settings).
fn taker(peers: &[super::NodeRecord]) -> Option<&str> {
    peers
        .iter()
        .filter(|p| p.caught_up && p.snapshot_entries > 0 && p.keeps_all)
        .map(|p| p.node.as_str())
        .min()
}

/// Copy the store and put the copy in the bucket; the log entry it has applied.
async fn take(inner: &Arc<Inner>, objects: &ObjectStore) -> Result<u64, ClusterError> {
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
            if let Some(mac) = inner.signer.sign(&snapshot_parts(&sequence, &digest)) {
                metadata.insert(MAC.to_string(), mac);
            }
        }
        let mut file = tokio::fs::File::open(&path).await.map_err(js_error)?;
        let meta = ObjectMetadata {
            name: OBJECT.to_string(),
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
        super::super::NodeRecord {
            node: name.into(),
            http: String::new(),
            applied: 0,
            caught_up,
            started: 0,
            version: String::new(),
            partition: String::new(),
            shards: Vec::new(),
            keeps_all: true,
            snapshot_entries,
            ask: String::new(),
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
        assert_eq!(taker(&peers), Some("c"));
        assert_eq!(taker(&peers[..2]), None);
        // A record written before the setting was in the registry reads as taking none.
        let old: super::super::NodeRecord = serde_json::from_str(
            r#"{"node":"x","http":"","applied":1,"caught_up":true,"started":0,"version":"0"}"#,
        )
        .unwrap();
        assert_eq!(old.snapshot_entries, 0);
    }
}
