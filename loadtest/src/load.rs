//! `prepare`: load a dataset into a server by the fastest path it has, the bulk form of the
//! documents API (`POST /v1/documents`, multipart/mixed, one transaction per batch), over
//! several keep-alive connections. Documents go first and the template last, so the server
//! builds the view with its parallel bulk path instead of one document at a time.

use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use serde_json::json;
use tokio::sync::mpsc;

use crate::client::{BoxError, Conn};
use crate::data::{Dataset, Jitter, place_document, places, polygons};

const BOUNDARY: &str = "geoshard-lt-boundary";

fn multipart(dataset: Dataset, docs: &[(String, Vec<u8>)]) -> Bytes {
    let meta = json!({
        "collections": [dataset.collection()],
        "permissions": [
            {"role-name": "rest-reader", "capabilities": ["read"]},
            {"role-name": "rest-writer", "capabilities": ["update"]},
            {"role-name": "geo-data-services-reader", "capabilities": ["read"]},
            {"role-name": "geo-data-services-writer", "capabilities": ["update"]}
        ]
    });
    let size: usize = docs.iter().map(|d| d.1.len() + d.0.len() + 120).sum();
    let mut out = Vec::with_capacity(size + 512);
    out.extend_from_slice(
        format!("--{BOUNDARY}\r\nContent-Type: application/json\r\nContent-Disposition: inline; category=metadata\r\n\r\n{meta}\r\n").as_bytes(),
    );
    for (uri, body) in docs {
        out.extend_from_slice(
            format!("--{BOUNDARY}\r\nContent-Type: application/json\r\nContent-Disposition: attachment; filename=\"{uri}\"; category=content\r\n\r\n").as_bytes(),
        );
        out.extend_from_slice(body);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    Bytes::from(out)
}

async fn put_json(
    c: &mut Conn,
    uri: &str,
    collection: &str,
    body: &serde_json::Value,
) -> Result<(), BoxError> {
    let target = format!(
        "/v1/documents?uri={uri}&collection={}",
        collection.replace(':', "%3A").replace('/', "%2F")
    );
    let r = c
        .request(
            "PUT",
            &target,
            Some("application/json"),
            Bytes::from(body.to_string()),
        )
        .await?;
    if r.status != 201 && r.status != 204 {
        return Err(format!(
            "PUT {uri}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        )
        .into());
    }
    Ok(())
}

pub struct Prepared {
    pub documents: usize,
    pub seconds: f64,
    pub index_seconds: f64,
}

/// Load `dataset` with `parallel` connections and `batch` documents per request.
pub async fn prepare(
    addr: SocketAddr,
    user: &str,
    password: &str,
    dataset: Dataset,
    parallel: usize,
    batch: usize,
) -> Result<Prepared, BoxError> {
    let t0 = Instant::now();
    let (tx, rx) = mpsc::channel::<Bytes>(parallel * 2);
    let rx = std::sync::Arc::new(tokio::sync::Mutex::new(rx));
    let mut senders = Vec::new();
    for _ in 0..parallel.max(1) {
        let mut conn = Conn::connect(addr, user, password).await?;
        // Negotiate Digest with a cheap request, not with a large body.
        let _ = conn.request("GET", "/v1/ping", None, Bytes::new()).await?;
        let rx = rx.clone();
        senders.push(tokio::spawn(async move {
            loop {
                let next = rx.lock().await.recv().await;
                let Some(body) = next else {
                    return Ok::<(), BoxError>(());
                };
                let r = conn
                    .request(
                        "POST",
                        "/v1/documents",
                        Some(&format!("multipart/mixed; boundary={BOUNDARY}")),
                        body,
                    )
                    .await?;
                if r.status != 200 {
                    return Err(format!(
                        "bulk write: {} {}",
                        r.status,
                        String::from_utf8_lossy(&r.body)
                    )
                    .into());
                }
            }
        }));
    }
    let mut documents = 0usize;
    match dataset {
        Dataset::Counties | Dataset::Countries => {
            let docs = polygons(dataset)?.documents(dataset);
            for chunk in docs.chunks(batch.max(1)) {
                documents += chunk.len();
                tx.send(multipart(dataset, chunk)).await?;
            }
        }
        Dataset::Places(n) => {
            let places = places()?;
            let mut chunk = Vec::with_capacity(batch);
            for (k, (x, y, p)) in Jitter::new(&places).take(n).enumerate() {
                chunk.push(place_document(k, x, y, p));
                if chunk.len() == batch {
                    documents += chunk.len();
                    tx.send(multipart(dataset, &chunk)).await?;
                    chunk.clear();
                }
            }
            if !chunk.is_empty() {
                documents += chunk.len();
                tx.send(multipart(dataset, &chunk)).await?;
            }
        }
    }
    drop(tx);
    for s in senders {
        s.await??;
    }
    let loaded = t0.elapsed().as_secs_f64();
    // The definitions last: the template's arrival builds the view and its index in bulk.
    let mut c = Conn::connect(addr, user, password).await?;
    let t1 = Instant::now();
    put_json(
        &mut c,
        &format!("/lt/services/{}.json", dataset.collection()),
        "http://marklogic.com/feature-services",
        &dataset.descriptor(),
    )
    .await?;
    put_json(
        &mut c,
        &format!("/lt/tde/{}.json", dataset.collection()),
        "http://marklogic.com/xdmp/tde",
        &dataset.template(),
    )
    .await?;
    Ok(Prepared {
        documents,
        seconds: loaded,
        index_seconds: t1.elapsed().as_secs_f64(),
    })
}
