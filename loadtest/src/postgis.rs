//! The PostGIS peer: the same dataset in a table with a GiST index, and the same query points
//! as prepared `ST_Contains` / `ST_Intersects` statements over a local socket. PostGIS pays
//! no HTTP cost here; the report says so.

use tokio_postgres::{Client, NoTls};

use crate::client::BoxError;
use crate::data::{Dataset, Jitter, places, polygons};
use crate::drive::Sender;
use crate::workload::{QuerySet, Workload};

pub async fn connect(conn: &str) -> Result<Client, BoxError> {
    let (client, connection) = tokio_postgres::connect(conn, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

fn table(dataset: Dataset) -> String {
    dataset.collection().replace('-', "_")
}

/// Create the table, load the dataset, build the GiST index.
pub async fn load(conn: &str, dataset: Dataset) -> Result<usize, BoxError> {
    let mut c = connect(conn).await?;
    let t = table(dataset);
    c.batch_execute(&format!(
        "CREATE EXTENSION IF NOT EXISTS postgis;
         DROP TABLE IF EXISTS {t};
         CREATE TABLE {t} (id bigint PRIMARY KEY, name text, geom geometry(Geometry, 4326));"
    ))
    .await?;
    let mut n = 0usize;
    match dataset {
        Dataset::Counties | Dataset::Countries => {
            let tx = c.transaction().await?;
            let stmt = tx
                .prepare(&format!(
                    "INSERT INTO {t} VALUES ($1, $2, ST_SetSRID(ST_GeomFromGeoJSON($3), 4326))"
                ))
                .await?;
            for f in polygons(dataset)?.features {
                tx.execute(&stmt, &[&f.id, &f.name, &f.json.to_string()])
                    .await?;
                n += 1;
            }
            tx.commit().await?;
        }
        Dataset::Places(count) => {
            let places = places()?;
            let tx = c.transaction().await?;
            let insert = tx
                .prepare(&format!(
                    "INSERT INTO {t} (id, name, geom)
                     SELECT id, name, ST_SetSRID(ST_MakePoint(x, y), 4326)
                     FROM UNNEST($1::bigint[], $2::text[], $3::float8[], $4::float8[]) AS u(id, name, x, y)"
                ))
                .await?;
            let mut batch: (Vec<i64>, Vec<String>, Vec<f64>, Vec<f64>) = Default::default();
            for (k, (x, y, p)) in Jitter::new(&places).take(count).enumerate() {
                batch.0.push(k as i64 + 1);
                batch.1.push(p.name.clone());
                batch.2.push(x);
                batch.3.push(y);
                if batch.0.len() == 10_000 {
                    tx.execute(&insert, &[&batch.0, &batch.1, &batch.2, &batch.3])
                        .await?;
                    n += batch.0.len();
                    batch = Default::default();
                }
            }
            if !batch.0.is_empty() {
                tx.execute(&insert, &[&batch.0, &batch.1, &batch.2, &batch.3])
                    .await?;
                n += batch.0.len();
            }
            tx.commit().await?;
        }
    }
    c.batch_execute(&format!(
        "CREATE INDEX ON {t} USING GIST (geom); ANALYZE {t};"
    ))
    .await?;
    Ok(n)
}

/// Connections with the workload's statement prepared. With `geometry`, the statement
/// returns each match's geometry as GeoJSON, as geoshard does with `returnGeometry`.
pub async fn senders(
    conn: &str,
    set: &QuerySet,
    n: usize,
    geometry: bool,
) -> Result<Vec<Sender>, BoxError> {
    let t = table(set.dataset);
    let geo = if geometry { ", ST_AsGeoJSON(geom)" } else { "" };
    let sql = match set.workload {
        Workload::PipCounties | Workload::PipCountries | Workload::PointEq => format!(
            "SELECT id, name{geo} FROM {t} WHERE ST_Contains(geom, ST_SetSRID(ST_MakePoint($1, $2), 4326))"
        ),
        Workload::Envelope => format!(
            "SELECT id, name{geo} FROM {t} WHERE ST_Intersects(geom, ST_MakeEnvelope($1, $2, $3, $4, 4326)) ORDER BY id LIMIT 5000"
        ),
        Workload::Mixed => return Err("the PostGIS peer runs query workloads only".into()),
    };
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let client = connect(conn).await?;
        let statement = client.prepare(&sql).await?;
        out.push(Sender::Postgres { client, statement });
    }
    Ok(out)
}
