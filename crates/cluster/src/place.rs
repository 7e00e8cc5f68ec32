//! Shards placed automatically over the live nodes (`cluster_placement = "auto"`).
//!
//! Who decides: every such node alike, from the registry. The assignment is a function of
//! the live auto nodes' names alone ([`assign`]), so nodes that see the same registry agree
//! without a leader or a record of their own. A node then moves itself toward its share:
//! - it **takes** a shard assigned to it: it advertises it as taking, holds it from then on
//!   (writes keep its documents whole), copies in the documents it kept stubs of from the
//!   shard's holders, builds its views again, and only then answers for it;
//! - it **lets go** of a shard no longer assigned to it only once every node assigned that
//!   shard is caught up and answers for it. It first stops answering for it, waits until
//!   the other nodes have read that from the registry, and then holds it no more. What it
//!   kept of the shard stays, current, until written again.
//!
//! A shard is so answered for by its old holders until its new ones have it, whether a node
//! joined, returned, or was gone past its lease.

use std::sync::Arc;
use std::time::Duration;

use crate::spread::Spread;
use geoshard_features::Features;
use geoshard_features::placement::Placement;

/// How often a node compares its shards with its share.
const EVERY: Duration = Duration::from_secs(1);

/// How long a node that stopped answering for a shard keeps its rows, so that questions
/// routed by a registry read from before are still answered whole.
const LET_GO_AFTER: Duration = Duration::from_secs(12);

/// Each shard's holders among `nodes`: for each shard in turn, the `replicas` nodes ranked
/// highest by a hash of the shard and the node's name whose count of shards is still under
/// the even share (`replicas × shards / nodes`, rounded up). Every node computing it from
/// the same names gets the same answer; a node that joins or leaves moves a few shards.
pub fn assign(shards: usize, replicas: usize, nodes: &[&str]) -> Vec<Vec<String>> {
    let mut nodes: Vec<&str> = nodes.to_vec();
    nodes.sort_unstable();
    nodes.dedup();
    if nodes.is_empty() {
        return vec![Vec::new(); shards];
    }
    let r = replicas.clamp(1, nodes.len());
    let share = (r * shards).div_ceil(nodes.len());
    let mut count = vec![0usize; nodes.len()];
    let mut picks: Vec<Vec<usize>> = (0..shards)
        .map(|s| {
            let mut ranked: Vec<usize> = (0..nodes.len()).collect();
            ranked.sort_by_key(|&i| std::cmp::Reverse((score(s, nodes[i]), i)));
            let mut picked = Vec::with_capacity(r);
            for under_share in [true, false] {
                for &i in &ranked {
                    if picked.len() < r
                        && !picked.contains(&i)
                        && (!under_share || count[i] < share)
                    {
                        count[i] += 1;
                        picked.push(i);
                    }
                }
            }
            picked
        })
        .collect();
    // The last shards may have found room only on nodes already past their share: give
    // such a copy to a node under it that does not hold that shard.
    while let Some(over) = (0..nodes.len()).find(|&i| count[i] > share) {
        let Some((s, under)) = (0..shards).find_map(|s| {
            let p = &picks[s];
            if !p.contains(&over) {
                return None;
            }
            (0..nodes.len())
                .find(|&u| count[u] < share && !p.contains(&u))
                .map(|u| (s, u))
        }) else {
            break;
        };
        for i in picks[s].iter_mut() {
            if *i == over {
                *i = under;
            }
        }
        count[over] -= 1;
        count[under] += 1;
    }
    picks
        .iter_mut()
        .map(|p| {
            p.sort_unstable();
            p.iter().map(|&i| nodes[i].to_string()).collect()
        })
        .collect()
}

/// A hash of (shard, node) fixed across processes and builds (FNV-1a, then a mix).
fn score(shard: usize, node: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in node.bytes().chain((shard as u64).to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51afd7ed558ccd);
    h ^ (h >> 33)
}

/// Move this node's shards toward its share for as long as it runs. `record` is told each
/// placement whose documents the store keeps whole once it does.
pub async fn place(spread: Arc<Spread>, replicas: usize, record: impl Fn(&Placement) + Send) {
    let (cluster, features) = (spread.cluster.clone(), spread.features.clone());
    let me = cluster.node().to_string();
    loop {
        tokio::time::sleep(EVERY).await;
        if !cluster.log_caught_up() {
            continue;
        }
        let Some(placement) = features.placement() else {
            return;
        };
        let peers = cluster.peers();
        if !peers.iter().any(|p| p.node == me) {
            // The registry as last read does not name this node yet.
            continue;
        }
        let members: Vec<&str> = peers
            .iter()
            .filter(|p| p.auto && p.partition == placement.partition())
            .map(|p| p.node.as_str())
            .collect();
        let assigned = assign(placement.shards(), replicas, &members);
        let target: Vec<usize> = (0..placement.shards())
            .filter(|&s| assigned[s].contains(&me))
            .collect();
        let serving = cluster.serving();
        let taking: Vec<usize> = target
            .iter()
            .copied()
            .filter(|s| !serving.contains(s))
            .collect();
        if !taking.is_empty() {
            match take(&spread, &placement, &serving, &taking).await {
                Ok(p) => record(&p),
                Err(e) => {
                    tracing::warn!(shards = ?taking, error = %e, "taking shards; trying again");
                    cluster.set_shards(serving, Vec::new(), keeps_all(&placement));
                }
            }
            continue;
        }
        // A shard held but neither served nor assigned (a take given up when the shards
        // moved again) is dropped at once: nobody asks this node for it.
        let held = placement.held();
        if held
            .iter()
            .any(|s| !serving.contains(s) && !target.contains(s))
        {
            let keep: Vec<usize> = held
                .into_iter()
                .filter(|s| serving.contains(s) || target.contains(s))
                .collect();
            if let Ok(p) = placement.new_held(&keep) {
                set_placement(&features, p, false).await;
                if let Some(p) = features.placement() {
                    record(&p);
                }
            }
            continue;
        }
        // A shard is let go once every node now assigned it answers for it.
        let letting_go: Vec<usize> = serving
            .iter()
            .copied()
            .filter(|s| !target.contains(s))
            .filter(|&s| {
                assigned[s].iter().all(|n| {
                    peers
                        .iter()
                        .any(|p| &p.node == n && p.caught_up && p.shards.contains(&s))
                })
            })
            .collect();
        if !letting_go.is_empty() {
            let held: Vec<usize> = placement
                .held()
                .into_iter()
                .filter(|s| !letting_go.contains(s))
                .collect();
            let left: Vec<usize> = serving
                .iter()
                .copied()
                .filter(|s| !letting_go.contains(s))
                .collect();
            tracing::info!(shards = ?letting_go, serving = ?left, "letting shards go");
            cluster.set_shards(left, Vec::new(), false);
            cluster.set_letting_go(letting_go.clone());
            tokio::time::sleep(LET_GO_AFTER).await;
            match placement.new_held(&held) {
                Ok(p) => {
                    set_placement(&features, p, false).await;
                    if let Some(p) = features.placement() {
                        record(&p);
                    }
                }
                Err(e) => tracing::error!(error = %e, "the placement after letting shards go"),
            }
            cluster.set_letting_go(Vec::new());
        }
    }
}

/// [`Features::set_placement`] off the async threads: it may wait for a running build.
async fn set_placement(
    features: &Arc<Features>,
    placement: Placement,
    rebuild: bool,
) -> Option<geoshard_core::oneshot::Receiver<()>> {
    let features = features.clone();
    tokio::task::spawn_blocking(move || features.set_placement(placement, rebuild))
        .await
        .ok()
        .flatten()
}

fn keeps_all(p: &Placement) -> bool {
    p.held().len() == p.shards()
}

/// Take `taking`: hold them, copy their documents in, build the views again; then answer
/// for them. The placement held after.
async fn take(
    spread: &Spread,
    placement: &Placement,
    serving: &[usize],
    taking: &[usize],
) -> Result<Arc<Placement>, String> {
    let (cluster, features) = (&spread.cluster, &spread.features);
    tracing::info!(shards = ?taking, "taking shards");
    cluster.set_shards(serving.to_vec(), taking.to_vec(), keeps_all(placement));
    let mut held = placement.held();
    held.extend_from_slice(taking);
    let wider = placement.new_held(&held)?;
    let all = keeps_all(&wider);
    set_placement(features, placement.new_held(&held)?, false).await;
    // Writes the writer checked under the old placement commit before this answers: the
    // stubs they leave are listed below.
    features
        .store()
        .fill(Vec::new())
        .await
        .map_err(|e| e.to_string())?;
    let copied = spread.fill_once(taking).await?;
    if let Some(built) = set_placement(features, wider, true).await {
        built
            .await
            .map_err(|_| "the views were not built again".to_string())?;
    }
    let mut now: Vec<usize> = serving.iter().chain(taking).copied().collect();
    now.sort_unstable();
    now.dedup();
    tracing::info!(shards = ?taking, documents = copied, serving = ?now, "shards taken");
    cluster.set_shards(now, Vec::new(), all);
    features
        .placement()
        .ok_or_else(|| "no placement".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    fn per_node(a: &[Vec<String>]) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for h in a {
            for n in h {
                *m.entry(n.clone()).or_insert(0) += 1;
            }
        }
        m
    }

    #[test]
    fn every_shard_gets_r_distinct_holders_and_shares_are_even() {
        for nodes in 1..=7 {
            for shards in [1, 6, 12, 64] {
                let all = names(nodes);
                let refs: Vec<&str> = all.iter().map(String::as_str).collect();
                let a = assign(shards, 2, &refs);
                assert_eq!(a.len(), shards);
                let r = 2.min(nodes);
                for h in &a {
                    let mut d = h.clone();
                    d.dedup();
                    assert_eq!(d.len(), r, "{nodes} nodes, {shards} shards: {a:?}");
                }
                let share = (r * shards).div_ceil(nodes);
                for (n, c) in per_node(&a) {
                    assert!(c <= share, "{n} holds {c} of {shards}, share {share}");
                }
                // Every node gets some when there are enough shards for all.
                if r * shards >= nodes {
                    assert_eq!(per_node(&a).len(), nodes, "{a:?}");
                }
            }
        }
    }

    #[test]
    fn the_order_names_are_given_in_does_not_matter() {
        let a = assign(12, 2, &["c", "a", "b"]);
        let b = assign(12, 2, &["b", "c", "a", "a"]);
        assert_eq!(a, b);
    }

    #[test]
    fn a_node_that_joins_or_leaves_moves_some_shards_only() {
        let three = assign(64, 2, &["a", "b", "c"]);
        let four = assign(64, 2, &["a", "b", "c", "d"]);
        // Copies that stay where they were, against what a fresh deal would keep by chance.
        let kept: usize = three
            .iter()
            .zip(&four)
            .map(|(x, y)| x.iter().filter(|n| y.contains(n)).count())
            .sum();
        assert!(
            kept >= 64,
            "only {kept} of 128 copies stay: {three:?} {four:?}"
        );
        let gone = assign(64, 2, &["a", "c", "d"]);
        for (s, (before, after)) in four.iter().zip(&gone).enumerate() {
            // A survivor holding a shard before still holds it, unless the even share moves it.
            let stay = before
                .iter()
                .filter(|n| *n != "b" && after.contains(n))
                .count();
            let could = before.iter().filter(|n| *n != "b").count();
            assert!(stay + 1 >= could, "shard {s}: {before:?} -> {after:?}");
        }
    }
}
