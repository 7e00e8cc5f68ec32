//! What a cluster's nodes trust. NATS servers that ask for credentials (user and password,
//! or mutual TLS) take only nodes that have them. Nodes sharing a secret refuse log entries,
//! questions and registry records that were not signed with it, whoever can publish to NATS,
//! and a node with another secret does not join. `GET /v1/cluster` shows the nodes.
//!
//! Needs Debian's `nats-server`, as the other cluster tests.

use crate::cluster::{Nats, SECRET, free_port, nats_binary, sequence, wait_ready};
use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const NATS_USER: &str = "geoshard-node";
const NATS_PASSWORD: &str = "nats-password-for-the-test";

/// `geoshard serve` with `env`, expected not to start: its exit status and standard error.
fn refused_start(dir: &Path, env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_geoshard"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env("GEOSHARD_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status, err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the node started, or hung, where it should have refused to");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A node of cluster `name` with the test's NATS user and `secret`, holding both of the
/// cluster's two shards (so that it answers other nodes' questions).
fn node(dir: &Path, nats: &Nats, i: usize, name: &str, secret: &str) -> ChildServer {
    if !dir.join("geoshard.redb").exists() {
        seed_users(dir);
    }
    let urls = nats.urls(i);
    let node = format!("t{i}");
    let server = ChildServer::start(
        dir,
        &[
            ("GEOSHARD_CLUSTER", urls.as_str()),
            ("GEOSHARD_NODE", node.as_str()),
            ("GEOSHARD_CLUSTER_NAME", name),
            ("GEOSHARD_CLUSTER_USER", NATS_USER),
            ("GEOSHARD_CLUSTER_PASSWORD", NATS_PASSWORD),
            ("GEOSHARD_CLUSTER_SECRET", secret),
            ("GEOSHARD_CLUSTER_SHARDS", "2"),
            ("GEOSHARD_HOLD", "0,1"),
        ],
    );
    wait_ready(&server);
    server
}

/// A sample of a node's `/metrics` (admin's page) with `label` (`kind=entry`, or empty for
/// none), 0 when absent.
pub(crate) fn counter(server: &ChildServer, name: &str, label: &str) -> f64 {
    let text = server.client(ADMIN).get("/metrics").text();
    let lines = text.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines)
        .unwrap()
        .samples
        .into_iter()
        .filter(|s| s.metric == name)
        .filter(|s| {
            label
                .split_once('=')
                .is_none_or(|(k, v)| s.labels.get(k) == Some(v))
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// A document's status on a node once it has applied log entry `after`.
fn status_after(server: &ChildServer, uri: &str, after: u64) -> u16 {
    server
        .client(ADMIN)
        .request(
            "GET",
            &format!("/v1/documents?uri={uri}"),
            &[("X-Geoshard-After", &after.to_string())],
            b"",
        )
        .status
}

#[test]
fn nodes_with_a_secret_refuse_what_was_not_signed_with_it() {
    let nats = Nats::start_conf(
        "trust",
        "8MB",
        &format!("authorization {{ user: {NATS_USER}, password: \"{NATS_PASSWORD}\" }}"),
    );
    let dir = temp_dir("trust");
    let name = "trust";

    // No NATS credentials, or wrong ones: the node says so and stops.
    let (status, err) = refused_start(
        &dir.path().join("none"),
        &[
            ("GEOSHARD_CLUSTER", nats.urls(0).as_str()),
            ("GEOSHARD_CLUSTER_NAME", name),
            ("GEOSHARD_CLUSTER_SECRET", SECRET),
        ],
    );
    assert!(!status.success());
    assert!(
        err.contains("refused this node's credentials"),
        "stderr: {err}"
    );

    let a = node(&dir.path().join("a"), &nats, 0, name, SECRET);
    let b = node(&dir.path().join("b"), &nats, 1, name, SECRET);

    // A node with another secret, or none, does not join a cluster that signs.
    for secret in ["another secret, as long as it is", ""] {
        let (status, err) = refused_start(
            &dir.path().join("rogue"),
            &[
                ("GEOSHARD_CLUSTER", nats.urls(2).as_str()),
                ("GEOSHARD_NODE", "rogue"),
                ("GEOSHARD_CLUSTER_NAME", name),
                ("GEOSHARD_CLUSTER_USER", NATS_USER),
                ("GEOSHARD_CLUSTER_PASSWORD", NATS_PASSWORD),
                ("GEOSHARD_CLUSTER_SECRET", secret),
            ],
        );
        assert!(!status.success());
        assert!(
            err.contains("set the same cluster_secret on every node"),
            "secret {secret:?}, stderr: {err}"
        );
    }

    // A document written and then deleted, through the nodes.
    let mut ca = a.client(ADMIN);
    let uri = "/trust/x.json";
    let put = ca.put_json(&format!("/v1/documents?uri={uri}"), r#"{"name": "x"}"#);
    assert!(put.status < 300, "{}", put.text());
    let written = sequence(&put);
    let del = ca.delete(&format!("/v1/documents?uri={uri}"));
    assert!(del.status < 300, "{}", del.text());
    let deleted = sequence(&del);
    assert_eq!(status_after(&b, uri, deleted), 404);

    // Anyone with NATS access publishes the write's entry again: as it was (JetStream drops
    // it as a duplicate), with a new message id, and with its signature taken off.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream = format!("GEOSHARD_{}", name.to_uppercase());
    let forged = rt.block_on(async {
        let client = async_nats::ConnectOptions::with_user_and_password(
            NATS_USER.into(),
            NATS_PASSWORD.into(),
        )
        .connect(nats.urls(0).split(',').collect::<Vec<_>>().as_slice())
        .await
        .unwrap();
        let js = async_nats::jetstream::new(client.clone());
        let entry = js
            .get_stream(&stream)
            .await
            .unwrap()
            .get_raw_message(written)
            .await
            .unwrap();
        let publish = |headers: async_nats::HeaderMap| {
            let (js, subject, payload) = (js.clone(), entry.subject.clone(), entry.payload.clone());
            async move {
                js.publish_with_headers(subject, headers, payload)
                    .await
                    .unwrap()
                    .await
                    .unwrap()
            }
        };
        let same = publish(entry.headers.clone()).await;
        assert!(
            same.duplicate,
            "a replay within the window is JetStream's duplicate"
        );
        let mut new_id = entry.headers.clone();
        new_id.insert("Nats-Msg-Id", "forged-1");
        let mut unsigned = async_nats::HeaderMap::new();
        for (k, values) in entry.headers.iter() {
            let name = k.to_string();
            if name == "Geoshard-Mac" || name == "Geoshard-Signed" {
                continue;
            }
            for v in values {
                unsigned.insert(name.as_str(), v.as_str());
            }
        }
        unsigned.insert("Nats-Msg-Id", "forged-2");
        let mut seqs = vec![publish(new_id).await.sequence];
        seqs.push(publish(unsigned).await.sequence);

        // A question in a node's name, unsigned: refused, with an answer that says so.
        let answer = client
            .request(format!("geoshard-ask.{name}.t1"), "what is there?".into())
            .await
            .unwrap();
        assert!(
            answer
                .headers
                .as_ref()
                .is_some_and(|h| h.get("Geoshard-Refused").is_some()),
            "{answer:?}"
        );

        // A registry record of a node that does not exist, unsigned.
        let kv = js
            .get_key_value(format!("geoshard_{name}_nodes"))
            .await
            .unwrap();
        let record = serde_json::json!({
            "node": "intruder", "http": "127.0.0.1:1", "applied": 0, "caught_up": true,
            "started": 0, "version": "0"
        });
        kv.put("intruder", record.to_string().into_bytes().into())
            .await
            .unwrap();
        seqs
    });
    // Neither landed: the document stays deleted on both nodes, and each counted two
    // refused entries.
    let last = *forged.iter().max().unwrap();
    for (n, server) in [("a", &a), ("b", &b)] {
        assert_eq!(status_after(server, uri, last), 404, "node {n}");
        assert_eq!(
            counter(server, "geoshard_cluster_refused_total", "kind=entry"),
            2.0,
            "node {n}"
        );
    }
    assert_eq!(
        counter(&b, "geoshard_cluster_refused_total", "kind=question"),
        1.0
    );

    // The cluster as an admin sees it: the two nodes serving both shards, not the intruder,
    // once a heartbeat (every 2 s) has read the registry again.
    let deadline = Instant::now() + Duration::from_secs(20);
    let v = loop {
        let r = a.client(ADMIN).get("/v1/cluster");
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let serving = &v["shards"]["holders"][1]["serving"];
        if *serving == serde_json::json!(["t0", "t1"]) || Instant::now() > deadline {
            break v;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(v["signed"], true);
    let nodes: Vec<&str> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["t0", "t1"], "{v}");
    assert_eq!(v["shards"]["replicas"], 2);
    assert_eq!(
        v["shards"]["holders"][1]["serving"],
        serde_json::json!(["t0", "t1"]),
        "{v}"
    );
    assert_eq!(v["shards"]["under_replicated"], serde_json::json!([]));
    assert!(v["nodes"][1]["http"].as_str().unwrap() == b.addr.to_string());
    assert!(counter(&a, "geoshard_cluster_refused_total", "kind=record") >= 1.0);
    assert_eq!(counter(&a, "geoshard_cluster_nodes", ""), 2.0);
    // Only for an admin.
    assert_eq!(a.client(GEO).get("/v1/cluster").status, 403);

    // A question straight to a node's port for them, unsigned: refused and counted.
    let ask = v["nodes"][1]["ask"].as_str().unwrap().to_string();
    assert!(!ask.is_empty(), "{v}");
    let before = counter(&b, "geoshard_cluster_refused_total", "kind=question");
    let (status, refused) = rt.block_on(direct_question(&ask));
    assert_eq!((status, refused), (403, true));
    assert_eq!(
        counter(&b, "geoshard_cluster_refused_total", "kind=question"),
        before + 1.0
    );
    cluster_page(&a);

    // Writes signed by the nodes still land everywhere.
    let put = b
        .client(ADMIN)
        .put_json(&format!("/v1/documents?uri={uri}"), r#"{"name": "y"}"#);
    assert!(put.status < 300, "{}", put.text());
    let r = a.client(ADMIN).request(
        "GET",
        &format!("/v1/documents?uri={uri}"),
        &[("X-Geoshard-After", &sequence(&put).to_string())],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["name"], "y");
}

/// An unsigned question over HTTP/2 to a node's address for them: the status and whether
/// the answer says it was refused for its signature.
async fn direct_question(addr: &str) -> (u16, bool) {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::post("/geoshard/ask")
        .body(Full::new(bytes::Bytes::from_static(b"what is there?")))
        .unwrap();
    let r = sender.send_request(req).await.unwrap();
    let status = r.status().as_u16();
    let refused = r.headers().contains_key("geoshard-refused");
    let _ = r.into_body().collect().await;
    (status, refused)
}

/// The cluster page in a real browser: both nodes, serving both shards.
fn cluster_page(server: &ChildServer) {
    let chromium = crate::map::need_chromium();
    crate::map::setup_clients();
    let page = crate::map::page_script(
        "cluster_page.js",
        &[
            format!("http://{}", server.addr),
            ADMIN.0.to_string(),
            ADMIN.1.to_string(),
            chromium.display().to_string(),
        ],
    );
    assert_eq!(page["state"], "ready", "{page}");
    assert_eq!(page["consoleErrors"], serde_json::json!([]), "{page}");
    let summary = page["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("2 live nodes") && summary.contains("messages signed"),
        "{summary}"
    );
    assert!(
        summary.contains("0 under-replicated, 0 unheld of 2 shards"),
        "{summary}"
    );
    let nodes: Vec<(&str, &str)> = page["nodes"].as_array().unwrap()[1..]
        .iter()
        .map(|r| (r[0].as_str().unwrap(), r[5].as_str().unwrap()))
        .collect();
    assert_eq!(nodes, [("t0", "0, 1"), ("t1", "0, 1")], "{page}");
    assert_eq!(
        page["shards"],
        serde_json::json!([
            ["shard", "t0", "t1", "serving"],
            ["0", "S", "S", "2/2"],
            ["1", "S", "S", "2/2"]
        ]),
        "{page}"
    );
}

/// Certificates for a NATS server on 127.0.0.1 and a node, both from one test CA; in `dir`.
fn certificates(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let write = |name: &str, sans: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(sans)
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    };
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    write("server", vec!["127.0.0.1".into(), "localhost".into()]);
    write("node", vec!["node.geoshard.test".into()]);
}

#[test]
fn a_node_reaches_nats_over_mutual_tls_only_with_its_certificate() {
    let dir = temp_dir("trust-tls");
    let d = dir.path();
    certificates(d);
    let port = free_port();
    let conf = format!(
        "port: {port}\nserver_name: tls0\njetstream {{ store_dir: \"{store}\" }}\n\
         tls {{ cert_file: \"{d}/server.pem\", key_file: \"{d}/server.key\", \
         ca_file: \"{d}/ca.pem\", verify: true, timeout: 2 }}\n",
        store = d.join("js").display(),
        d = d.display(),
    );
    std::fs::write(d.join("nats.conf"), conf).unwrap();
    let mut server = Command::new(nats_binary())
        .arg("-c")
        .arg(d.join("nats.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _kill = Kill(&mut server);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nats-server with TLS did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("tls://127.0.0.1:{port}");
    let path = |f: &str| d.join(f).display().to_string();
    let (ca, cert, key) = (path("ca.pem"), path("node.pem"), path("node.key"));
    let base = [
        ("GEOSHARD_CLUSTER", url.as_str()),
        ("GEOSHARD_CLUSTER_NAME", "tls"),
        ("GEOSHARD_CLUSTER_REPLICAS", "1"),
        ("GEOSHARD_CLUSTER_SECRET", SECRET),
        ("GEOSHARD_CLUSTER_CA", ca.as_str()),
    ];

    // Without a client certificate the server refuses the node.
    let (status, err) = refused_start(&d.join("without"), &base);
    assert!(!status.success());
    assert!(
        err.contains("refused this node's credentials or certificate")
            || err.contains("no NATS server answered"),
        "stderr: {err}"
    );

    // With it, the node joins and writes through the log.
    let node_dir = d.join("with");
    seed_users(&node_dir);
    let mut env = base.to_vec();
    env.extend([
        ("GEOSHARD_CLUSTER_CERT", cert.as_str()),
        ("GEOSHARD_CLUSTER_KEY", key.as_str()),
    ]);
    let node = ChildServer::start(&node_dir, &env);
    wait_ready(&node);
    let mut c = node.client(ADMIN);
    let put = c.put_json("/v1/documents?uri=/tls/a.json", r#"{"over": "tls"}"#);
    assert!(put.status < 300, "{}", put.text());
    assert!(sequence(&put) >= 1);
    assert_eq!(c.get("/v1/documents?uri=/tls/a.json").json()["over"], "tls");
}
