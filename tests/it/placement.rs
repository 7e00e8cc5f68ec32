//! Shard placement: nodes that each hold some of the cluster's shards answer, together, every
//! query kind as one node holding everything does. Four services opened in this process on
//! copies of one data directory (the counties and the 144,563 GeoNames places): one holds
//! every row, three hold four of six shards each (every shard on two of them). Each query is
//! routed as a cluster node routes it (one node when one holds the query's whole cover, else
//! every shard given to one node and the parts merged; a deep page in two rounds) and its
//! answer compared with the full node's, before and after writes that move, delete and add
//! places, and with a node gone.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use common::layers::{more_queries, queries};
use common::*;
use geoshard::acl::Caller;
use geoshard::config::Config;
use geoshard::features::FeatureRequest;
use geoshard::features::placement::Route;
use geoshard::features::query::{Partial, Round};
use geoshard::http::App;
use geoshard::store::{Format, Op, PutDocument};
use serde_json::{Value, json};

const HOLDS: [&[usize]; 3] = [&[0, 1, 2, 3], &[2, 3, 4, 5], &[4, 5, 0, 1]];

fn open(dir: &Path, shards: usize, hold: &[usize]) -> Arc<App> {
    geoshard::node::open(Config {
        data_dir: dir.to_path_buf(),
        cluster_shards: shards,
        cluster_resolution: 2,
        hold: hold.to_vec(),
        view_save_secs: 0,
        ..Config::default()
    })
    .unwrap()
}

/// Each node's part for its shards in `round`, sent through postcard as a node sends it.
fn parts_of(
    nodes: &[Arc<App>],
    req: &FeatureRequest,
    asks: &[(usize, Vec<usize>)],
    rounds: &[Round],
) -> Vec<Partial> {
    asks.iter()
        .zip(rounds)
        .map(|((n, shards), round)| {
            let part = nodes[*n]
                .features
                .queries()
                .execute_partial(&Caller::system(), req, Some(shards), None, round)
                .unwrap();
            let bytes = postcard::to_stdvec(&part).unwrap();
            postcard::from_bytes(&bytes).unwrap()
        })
        .collect()
}

/// How a query went: to one node, spread in one round, spread in two.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Went {
    One,
    Spread,
    TwoRounds,
}

/// The answer of the placed nodes `live` (indexes into `nodes`, in the order preferred), as a
/// cluster node routes and merges it; and how it went.
fn routed(nodes: &[Arc<App>], live: &[usize], body: &Value) -> (Value, Went) {
    let caller = Caller::system();
    let req = FeatureRequest::parse(body.to_string().as_bytes()).unwrap();
    let placement = nodes[0].features.placement().unwrap();
    let held: Vec<(usize, Vec<usize>)> = live.iter().map(|&i| (i, HOLDS[i].to_vec())).collect();
    match placement.route(req.region().as_ref(), &held).unwrap() {
        Route::One(n) => {
            let answer = nodes[n].features.queries().execute(&caller, &req).unwrap();
            (serde_json::from_slice(&answer).unwrap(), Went::One)
        }
        Route::Spread(asks) => {
            let merger = &nodes[live[0]].features;
            let max_records = merger.settings().max_record_count;
            let (parts, went) = if req.deep_page(max_records) {
                let keys = parts_of(nodes, &req, &asks, &vec![Round::Keys; asks.len()]);
                let rounds = merger
                    .queries()
                    .second_round(&caller, &req, &keys)
                    .unwrap()
                    .unwrap();
                (parts_of(nodes, &req, &asks, &rounds), Went::TwoRounds)
            } else {
                let one = vec![Round::One; asks.len()];
                (parts_of(nodes, &req, &asks, &one), Went::Spread)
            };
            let answer = merger
                .queries()
                .merge_partials(&caller, &req, parts)
                .unwrap();
            (serde_json::from_slice(&answer).unwrap(), went)
        }
    }
}

/// Every query kind through the nodes `live`; how many went to one node, spread in one
/// round, in two.
fn check_all(full: &App, nodes: &[Arc<App>], live: &[usize], when: &str) -> (usize, usize, usize) {
    let (mut alone, mut spread, mut two) = (0, 0, 0);
    for (name, body) in queries().into_iter().chain(more_queries()) {
        let req = FeatureRequest::parse(body.to_string().as_bytes()).unwrap();
        let want: Value = serde_json::from_slice(
            &full
                .features
                .queries()
                .execute(&Caller::system(), &req)
                .unwrap(),
        )
        .unwrap();
        let (got, went) = routed(nodes, live, &body);
        if let Err(e) = same_json(&got, &want, "") {
            panic!("{when}, {name} ({went:?}): {e}");
        }
        match went {
            Went::One => alone += 1,
            Went::Spread => spread += 1,
            Went::TwoRounds => two += 1,
        }
    }
    (alone, spread, two)
}

fn rows(app: &App, service: &str) -> usize {
    app.features
        .sizes()
        .0
        .iter()
        .filter(|(s, _, _)| s == service)
        .map(|(_, _, n)| n)
        .sum()
}

fn write(apps: &[&App], ops: Vec<Op>) {
    for a in apps {
        a.store
            .write_blocking(&Caller::system(), ops.clone())
            .unwrap();
    }
}

#[test]
fn nodes_holding_some_shards_answer_together_as_one_node_holding_all() {
    let base = temp_dir("placement");
    for (service, file) in [
        ("Counties", "real/us-counties.geojson"),
        ("Places", "real/geonames-cities1000.csv"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_geoshard"))
            .args(["load", "--quiet", "--service", service, "--data-dir"])
            .arg(base.path())
            .arg(data_dir().join(file))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let dirs: Vec<TestDir> = (0..4).map(|i| temp_dir(&format!("placed-{i}"))).collect();
    for d in &dirs {
        common::copy_dir(base.path(), d.path());
    }
    let full = open(dirs[3].path(), 0, &[]);
    let nodes: Vec<Arc<App>> = (0..3).map(|i| open(dirs[i].path(), 6, HOLDS[i])).collect();

    // Each node holds a part: a place on the shards it holds, a county that reaches one.
    let all_places = rows(&full, "Places");
    assert_eq!(all_places, 144_563);
    assert_eq!(rows(&full, "Counties"), 3_231);
    for (i, n) in nodes.iter().enumerate() {
        let held = rows(n, "Places");
        assert!(
            held > all_places / 5 && held < all_places * 9 / 10,
            "node {i} holds {held} of {all_places} places"
        );
    }
    let (alone, spread, two) = check_all(&full, &nodes, &[0, 1, 2], "as loaded");
    // The point goes to one node; boxes at this resolution cover more shards than one node
    // holds; the three pages at an offset past their length go in two rounds.
    assert!(
        alone >= 1 && spread >= 10 && two == 3,
        "{alone} alone, {spread} spread, {two} in two rounds"
    );

    // Writes reach every node (as the log brings them): places moved a third of the world
    // away, places deleted, places added; the nodes that held a moved place drop it.
    let system = Caller::system();
    let mut ops = Vec::new();
    for id in 1..=400i64 {
        let uri = format!("/Places/0/{id}.json");
        let doc = full.store.get(&system, &uri).unwrap().expect(&uri);
        let mut v: Value = serde_json::from_slice(&doc.content).unwrap();
        let c = v["geometry"]["coordinates"].as_array().unwrap().clone();
        let x = c[0].as_f64().unwrap();
        let moved = if x > 60.0 { x - 120.0 } else { x + 120.0 };
        v["geometry"]["coordinates"] = json!([moved, c[1]]);
        let put = |uri: String, v: &Value| {
            Op::PutDocument(PutDocument {
                uri,
                content: Bytes::from(serde_json::to_vec(v).unwrap()),
                format: Format::Json,
                collections: None,
                permissions: None,
                default_permissions: doc.permissions,
            })
        };
        match id % 4 {
            0 => ops.push(Op::DeleteDocument { uri }),
            1 => {
                let new_id = 1_000_000 + id;
                v["properties"]["OBJECTID"] = json!(new_id);
                ops.push(put(format!("/Places/0/{new_id}.json"), &v));
                ops.push(put(uri, &v));
            }
            _ => ops.push(put(uri, &v)),
        }
    }
    let node_refs: Vec<&App> = nodes
        .iter()
        .map(|n| n.as_ref())
        .chain([full.as_ref()])
        .collect();
    write(&node_refs, ops);
    check_all(&full, &nodes, &[0, 1, 2], "after writes");
    check_all(&full, &nodes, &[2, 0, 1], "after writes, node 2 merging");

    // Any two nodes still hold every shard.
    for live in [[0, 1], [1, 2], [2, 0]] {
        check_all(&full, &nodes, &live, &format!("nodes {live:?} alone"));
    }
}
