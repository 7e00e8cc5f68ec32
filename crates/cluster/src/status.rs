//! The node registry (a JetStream key-value bucket whose entries expire with their lease)
//! and `geoshard cluster status`.

use std::time::Duration;

use async_nats::jetstream;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use super::{ClusterError, ClusterSettings, LEASE, js_error};

/// What a node says of itself in the registry, renewed every heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeRecord {
    pub node: String,
    /// Its HTTP address (empty until it listens).
    pub http: String,
    /// The last log entry it applied.
    pub applied: u64,
    /// Whether it has applied what the log held when it started.
    pub caught_up: bool,
    /// When it started, in seconds since the Unix epoch.
    pub started: u64,
    pub version: String,
    /// The cluster's shards as this node cuts them (empty: every node holds every row).
    #[serde(default)]
    pub partition: String,
    /// The shards it holds.
    #[serde(default)]
    pub shards: Vec<usize>,
    /// Its `cluster_snapshot_entries` (0: it takes no snapshots).
    #[serde(default)]
    pub snapshot_entries: u64,
}

/// The registry bucket, made on first use. An entry not renewed within the lease is gone.
pub(super) async fn registry(
    js: &jetstream::Context,
    settings: &ClusterSettings,
) -> Result<jetstream::kv::Store, ClusterError> {
    if let Ok(kv) = js.get_key_value(settings.bucket()).await {
        return Ok(kv);
    }
    // The bucket's stream is made here as `create_key_value` would make it: that call first
    // asks for the account's limits in a form NATS 2.9 does not answer.
    js.get_or_create_stream(jetstream::stream::Config {
        name: format!("KV_{}", settings.bucket()),
        subjects: vec![format!("$KV.{}.>", settings.bucket())],
        max_messages_per_subject: 1,
        max_age: LEASE,
        duplicate_window: LEASE,
        storage: jetstream::stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: jetstream::stream::DiscardPolicy::New,
        num_replicas: settings.replicas,
        ..Default::default()
    })
    .await
    .map_err(js_error)?;
    js.get_key_value(settings.bucket()).await.map_err(js_error)
}

/// The registry's entries, by node name.
pub(super) async fn live_nodes(kv: &jetstream::kv::Store) -> Result<Vec<NodeRecord>, ClusterError> {
    let mut keys = kv.keys().await.map_err(js_error)?;
    let mut nodes = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(js_error)?;
        if let Some(bytes) = kv.get(&key).await.map_err(js_error)?
            && let Ok(rec) = serde_json::from_slice::<NodeRecord>(&bytes)
        {
            nodes.push(rec);
        }
    }
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(nodes)
}

/// What the cluster looks like from NATS: the log, and each live node with its lag.
pub async fn status_report(settings: &ClusterSettings) -> Result<String, ClusterError> {
    let urls: Vec<&str> = settings.url.split(',').map(str::trim).collect();
    let client = tokio::time::timeout(
        Duration::from_secs(10),
        async_nats::connect(urls.as_slice()),
    )
    .await
    .map_err(|_| ClusterError::Connect {
        url: settings.url.clone(),
        message: "no answer within 10 s".into(),
    })?
    .map_err(|e| ClusterError::Connect {
        url: settings.url.clone(),
        message: e.to_string(),
    })?;
    let js = jetstream::new(client);
    // A NATS server that has just started, or a log electing its leader, answers after a
    // few seconds.
    let mut tries = 0;
    let info = loop {
        let asked = async {
            let mut stream = js.get_stream(settings.stream()).await.map_err(|e| {
                ClusterError::JetStream(format!("stream {}: {e}", settings.stream()))
            })?;
            Ok::<_, ClusterError>(stream.info().await.map_err(js_error)?.clone())
        }
        .await;
        match asked {
            Ok(info) => break info,
            Err(_) if tries < 10 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let last = info.state.last_sequence;
    let mut out = format!(
        "cluster {name}: log {stream}, {entries} entries (first {first}, last {last}), \
         {replicas} replicas\n",
        name = settings.name,
        stream = settings.stream(),
        entries = info.state.messages,
        first = info.state.first_sequence,
        replicas = info.config.num_replicas,
    );
    if let Some(c) = &info.cluster {
        let peers: Vec<String> = c
            .replicas
            .iter()
            .map(|p| {
                let state = if p.current { "current" } else { "behind" };
                format!("{} ({state})", p.name)
            })
            .collect();
        out.push_str(&format!(
            "NATS: leader {}, replicas {}\n",
            c.leader.as_deref().unwrap_or("none"),
            if peers.is_empty() {
                "none".to_string()
            } else {
                peers.join(", ")
            }
        ));
    }
    out.push_str(&super::snapshot::describe(&js, settings).await);
    let kv = registry(&js, settings).await?;
    let nodes = live_nodes(&kv).await?;
    out.push_str(&format!(
        "nodes: {} live (entries renewed within {} s)\n",
        nodes.len(),
        LEASE.as_secs()
    ));
    out.push_str("node\thttp\tapplied\tlag\tstate\tshards\n");
    for n in &nodes {
        let state = if n.caught_up {
            "serving"
        } else {
            "catching up"
        };
        let shards = if n.partition.is_empty() {
            "all".to_string()
        } else {
            n.shards
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\t{state}\t{shards}\n",
            n.node,
            if n.http.is_empty() { "-" } else { &n.http },
            n.applied,
            last.saturating_sub(n.applied),
        ));
    }
    out.push_str(&shard_holders(&nodes));
    Ok(out)
}

/// Each shard with its live holders, or that every node holds every shard.
fn shard_holders(nodes: &[NodeRecord]) -> String {
    let Some(partition) = nodes.iter().map(|n| &n.partition).find(|p| !p.is_empty()) else {
        return "shards: every live node holds every shard\n".to_string();
    };
    let count = partition
        .split_whitespace()
        .rev()
        .nth(1)
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    let mut out = format!("shards: {partition}\n");
    for s in 0..count {
        let holders: Vec<&str> = nodes
            .iter()
            .filter(|n| n.partition == *partition && n.shards.contains(&s))
            .map(|n| n.node.as_str())
            .collect();
        let list = if holders.is_empty() {
            "NONE (its rows cannot be queried)".to_string()
        } else {
            holders.join(", ")
        };
        out.push_str(&format!("shard {s}\t{list}\n"));
    }
    out
}
