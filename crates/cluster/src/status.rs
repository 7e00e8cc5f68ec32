//! The node registry (a JetStream key-value bucket whose entries expire with their lease)
//! and `geoshard cluster status`.

use std::time::Duration;

use async_nats::jetstream;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use super::trust::{Refused, Signer};
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
    /// Whether its store keeps every document's content (records before partitioned
    /// storage did).
    #[serde(default = "yes")]
    pub keeps_all: bool,
    /// Its `cluster_snapshot_entries` (0: it takes no snapshots).
    #[serde(default)]
    pub snapshot_entries: u64,
    /// Where it listens for questions over direct connections (empty: over NATS only).
    #[serde(default)]
    pub ask: String,
    /// Whether its shards are placed automatically (`cluster_placement = "auto"`): it is one
    /// of the nodes the shards are spread over.
    #[serde(default)]
    pub auto: bool,
    /// Shards it is taking: copying their documents in, not answering for them yet.
    #[serde(default)]
    pub taking: Vec<usize>,
    /// Shards it no longer answers for and still holds for a moment, so that questions routed
    /// before the others saw that are answered whole.
    #[serde(default)]
    pub letting_go: Vec<usize>,
    /// The MAC of the record without it, under the cluster's key (none without a secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

fn yes() -> bool {
    true
}

impl NodeRecord {
    /// The record as the registry keeps it, signed.
    pub(super) fn signed_bytes(&self, signer: &Signer) -> Vec<u8> {
        let mut record = self.clone();
        record.mac = None;
        let bare = serde_json::to_vec(&record).unwrap_or_default();
        record.mac = signer.sign(&[b"record", &bare]);
        match record.mac {
            Some(_) => serde_json::to_vec(&record).unwrap_or_default(),
            None => bare,
        }
    }

    /// A record read from the registry, and whether it is signed as this node signs: under
    /// its key, or not at all when it has no secret.
    fn read(bytes: &[u8], signer: &Signer) -> Option<(NodeRecord, bool)> {
        let mut record = serde_json::from_slice::<NodeRecord>(bytes).ok()?;
        let mac = record.mac.take();
        let bare = serde_json::to_vec(&record).ok()?;
        let alike = match signer.on() {
            true => signer.verify(&[b"record", &bare], mac.as_deref()),
            false => mac.is_none(),
        };
        Some((record, alike))
    }

    /// A record read from the registry, if it is signed with the cluster's key (any record
    /// without a secret).
    fn checked(bytes: &[u8], signer: &Signer) -> Option<NodeRecord> {
        let (record, alike) = NodeRecord::read(bytes, signer)?;
        if !alike && signer.on() {
            Refused::Record.record(&format!("the registry record of node {:?}", record.node));
            return None;
        }
        Some(record)
    }
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

/// Refuse to join when the live nodes' registry records show that they sign with another
/// secret, or sign when this node has none, or do not when it has one: every entry would be
/// applied here and refused there (or the other way round), and the stores would part.
pub(super) async fn check_secret(
    js: &jetstream::Context,
    settings: &ClusterSettings,
    signer: &Signer,
) -> Result<(), ClusterError> {
    let kv = registry(js, settings).await?;
    let mut keys = kv.keys().await.map_err(js_error)?;
    let (mut others, mut alike) = (0, 0);
    while let Some(key) = keys.next().await {
        let key = key.map_err(js_error)?;
        if key == settings.node {
            continue;
        }
        let Some(bytes) = kv.get(&key).await.map_err(js_error)? else {
            continue;
        };
        let Some((_, same)) = NodeRecord::read(&bytes, signer) else {
            continue;
        };
        others += 1;
        alike += usize::from(same);
    }
    if others > 0 && alike == 0 {
        return Err(ClusterError::Trust(format!(
            "none of the {others} live nodes of cluster {name:?} signs with {what}: set the \
             same cluster_secret on every node",
            name = settings.name,
            what = if signer.on() {
                "this node's cluster_secret"
            } else {
                "no secret, as this node (cluster_secret is not set)"
            }
        )));
    }
    Ok(())
}

/// The registry's entries, by node name: those signed with the cluster's key.
pub(super) async fn live_nodes(
    kv: &jetstream::kv::Store,
    signer: &Signer,
) -> Result<Vec<NodeRecord>, ClusterError> {
    let mut keys = kv.keys().await.map_err(js_error)?;
    let mut nodes = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(js_error)?;
        if let Some(bytes) = kv.get(&key).await.map_err(js_error)?
            && let Some(rec) = NodeRecord::checked(&bytes, signer)
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
    let (options, _) = settings
        .access
        .options("geoshard cluster status")
        .await
        .map_err(|message| ClusterError::Connect {
            url: settings.url.clone(),
            message,
        })?;
    let client = tokio::time::timeout(Duration::from_secs(10), options.connect(urls.as_slice()))
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
    let nodes = live_nodes(&kv, &Signer::new(settings.secret.as_ref())).await?;
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

/// The number of shards a partition names (`h3 r3 / 6 shards`).
fn shard_count(partition: &str) -> usize {
    partition
        .split_whitespace()
        .rev()
        .nth(1)
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0)
}

/// Each shard with its live holders, or that every node holds every shard.
fn shard_holders(nodes: &[NodeRecord]) -> String {
    let Some(partition) = nodes.iter().map(|n| &n.partition).find(|p| !p.is_empty()) else {
        return "shards: every live node holds every shard\n".to_string();
    };
    let mut out = format!("shards: {partition}\n");
    for (s, holders) in holders(nodes, partition, false).iter().enumerate() {
        let list = if holders.is_empty() {
            "NONE (its rows cannot be queried)".to_string()
        } else {
            holders.join(", ")
        };
        out.push_str(&format!("shard {s}\t{list}\n"));
    }
    out
}

/// The live nodes of `partition` holding each of its shards (only the caught-up ones when
/// `serving`).
fn holders<'a>(nodes: &'a [NodeRecord], partition: &str, serving: bool) -> Vec<Vec<&'a str>> {
    (0..shard_count(partition))
        .map(|s| {
            nodes
                .iter()
                .filter(|n| {
                    n.partition == partition
                        && (n.shards.contains(&s) || (!serving && n.taking.contains(&s)))
                })
                .filter(|n| n.caught_up || !serving)
                .map(|n| n.node.as_str())
                .collect()
        })
        .collect()
}

/// The cluster as one node sees it, for `GET /v1/cluster`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Overview {
    pub cluster: String,
    /// The node answering.
    pub node: String,
    /// The log's last entry as of the last heartbeat.
    pub log_last: u64,
    /// Whether log entries, questions and registry records are signed and checked.
    pub signed: bool,
    pub nodes: Vec<NodeState>,
    /// With `cluster_shards`: each shard's holders; `None` when every node holds every row.
    pub shards: Option<Shards>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NodeState {
    pub node: String,
    pub http: String,
    /// Where it answers other nodes' questions directly (empty: over NATS only).
    pub ask: String,
    pub applied: u64,
    /// Entries of the log it has not applied.
    pub lag: u64,
    /// `serving`, or `catching up` until it has applied what the log held when it started.
    pub state: &'static str,
    pub started: u64,
    pub version: String,
    /// The shards it holds; `None`: every row.
    pub shards: Option<Vec<usize>>,
    /// Shards moving to it: their documents are being copied in, and it does not answer for
    /// them yet.
    pub taking: Vec<usize>,
    /// Shards moving away from it: it no longer answers for them, and holds them a moment
    /// longer.
    pub letting_go: Vec<usize>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Shards {
    pub partition: String,
    /// The live, caught-up holders a shard should have (`cluster_shard_replicas`).
    pub replicas: usize,
    pub holders: Vec<ShardHolders>,
    /// Shards with fewer caught-up holders than `replicas`.
    pub under_replicated: Vec<usize>,
    /// Shards no caught-up node holds: their rows cannot be queried.
    pub unheld: Vec<usize>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ShardHolders {
    pub shard: usize,
    /// Live nodes holding it that serve queries.
    pub serving: Vec<String>,
    /// Live nodes holding it still catching up, or taking it.
    pub catching_up: Vec<String>,
}

/// What [`Overview`] says of `nodes` (the registry's live records).
pub(super) fn overview(
    cluster: &str,
    node: &str,
    log_last: u64,
    signed: bool,
    nodes: &[NodeRecord],
    replicas: usize,
) -> Overview {
    let states = nodes
        .iter()
        .map(|n| NodeState {
            node: n.node.clone(),
            http: n.http.clone(),
            ask: n.ask.clone(),
            applied: n.applied,
            lag: log_last.saturating_sub(n.applied),
            state: if n.caught_up {
                "serving"
            } else {
                "catching up"
            },
            started: n.started,
            version: n.version.clone(),
            shards: (!n.partition.is_empty()).then(|| n.shards.clone()),
            taking: n.taking.clone(),
            letting_go: n.letting_go.clone(),
        })
        .collect();
    let partition = nodes.iter().map(|n| &n.partition).find(|p| !p.is_empty());
    let shards = partition.map(|partition| {
        let all = holders(nodes, partition, false);
        let serving = holders(nodes, partition, true);
        let list: Vec<ShardHolders> = all
            .iter()
            .zip(&serving)
            .enumerate()
            .map(|(shard, (all, serving))| ShardHolders {
                shard,
                serving: serving.iter().map(|n| n.to_string()).collect(),
                catching_up: all
                    .iter()
                    .filter(|n| !serving.contains(n))
                    .map(|n| n.to_string())
                    .collect(),
            })
            .collect();
        Shards {
            partition: partition.clone(),
            replicas,
            under_replicated: list
                .iter()
                .filter(|h| h.serving.len() < replicas)
                .map(|h| h.shard)
                .collect(),
            unheld: list
                .iter()
                .filter(|h| h.serving.is_empty())
                .map(|h| h.shard)
                .collect(),
            holders: list,
        }
    });
    Overview {
        cluster: cluster.to_string(),
        node: node.to_string(),
        log_last,
        signed,
        nodes: states,
        shards,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(node: &str, caught_up: bool, shards: &[usize]) -> NodeRecord {
        NodeRecord {
            node: node.into(),
            http: format!("127.0.0.1:{}", node.len()),
            applied: 7,
            caught_up,
            started: 1,
            version: "1".into(),
            partition: "h3 r3 / 4 shards".into(),
            shards: shards.to_vec(),
            keeps_all: false,
            snapshot_entries: 0,
            ask: String::new(),
            auto: false,
            taking: Vec::new(),
            letting_go: Vec::new(),
            mac: None,
        }
    }

    #[test]
    fn the_overview_counts_serving_holders_per_shard() {
        let nodes = [
            record("a", true, &[0, 1, 2]),
            record("b", true, &[1, 2]),
            record("c", false, &[0, 2]),
        ];
        let o = overview("test", "a", 9, true, &nodes, 2);
        let s = o.shards.unwrap();
        assert_eq!(s.holders.len(), 4);
        assert_eq!(s.holders[0].serving, ["a"]);
        assert_eq!(s.holders[0].catching_up, ["c"]);
        assert_eq!(s.holders[2].serving, ["a", "b"]);
        // Shard 0 has one serving holder, shard 3 none.
        assert_eq!(s.under_replicated, [0, 3]);
        assert_eq!(s.unheld, [3]);
        assert_eq!(o.nodes[2].state, "catching up");
        assert_eq!(o.nodes[2].lag, 2);
    }

    #[test]
    fn a_record_signed_under_another_key_is_left_out() {
        use crate::trust::Signer;
        use geoshard_core::secret::Secret;
        let ours = Signer::new(Some(&Secret::new("the cluster's own secret")));
        let theirs = Signer::new(Some(&Secret::new("someone else's secret!!")));
        let r = record("a", true, &[0]);
        assert_eq!(
            NodeRecord::checked(&r.signed_bytes(&ours), &ours),
            Some(r.clone())
        );
        assert_eq!(NodeRecord::checked(&r.signed_bytes(&theirs), &ours), None);
        assert_eq!(
            NodeRecord::checked(&r.signed_bytes(&Signer::new(None)), &ours),
            None
        );
        let mut forged: NodeRecord = serde_json::from_slice(&r.signed_bytes(&ours)).unwrap();
        forged.shards = vec![0, 1, 2, 3];
        let forged = serde_json::to_vec(&forged).unwrap();
        assert_eq!(NodeRecord::checked(&forged, &ours), None);
    }
}
