//! Rewriting a closed store whole: documents in key order, so that every B-tree page is full,
//! compressed with a dictionary trained on a sample of them; every other table copied. The
//! new file is written beside the old one and renamed over it once synced, so a crash at any
//! moment leaves one whole store: the old one, or the new one.

use std::path::Path;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::snapshot::{copy_table, store_file};
use super::{DOCUMENTS, StoreError, Table, changes, codec, compress, storage};

/// Documents sampled to train a dictionary, spread evenly over the store.
pub const SAMPLES: usize = 20_000;
/// Documents written in one transaction of the new file.
const ROWS_A_COMMIT: usize = 50_000;

/// What a repack did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repacked {
    pub documents: u64,
    /// The store file's size before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Whether a new dictionary was trained (else the documents kept the one they had, or
    /// none, being too few to train one).
    pub trained: bool,
    pub took: Duration,
}

/// The file a repack writes before it replaces the store with it.
pub(crate) fn repack_file(dir: &Path) -> std::path::PathBuf {
    dir.join("geoshard.redb.repack")
}

/// What a repack compresses the documents with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dictionary {
    /// A dictionary trained on a sample of the whole store (`geoshard compact`).
    Train,
    /// The store's current one, when it has one: documents already compressed with it are
    /// copied as they are (an offline load, which trained it on its first documents).
    Keep,
}

/// Repack the store in `dir`, which no process may have open, with a dictionary trained on
/// it. `progress` is told the documents written so far and in all.
pub fn repack(dir: &Path, progress: impl FnMut(u64, u64)) -> Result<Repacked, StoreError> {
    repack_with(dir, Dictionary::Train, progress)
}

/// [`repack`], compressing with `dictionary`.
pub fn repack_with(
    dir: &Path,
    dictionary: Dictionary,
    mut progress: impl FnMut(u64, u64),
) -> Result<Repacked, StoreError> {
    let started = Instant::now();
    let path = store_file(dir);
    let io = |e: std::io::Error| StoreError::Open {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let bytes_before = std::fs::metadata(&path).map_err(io)?.len();
    let tmp = repack_file(dir);
    let _ = std::fs::remove_file(&tmp);
    let db = Database::open(&path).map_err(|e| StoreError::Open {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let kept = compress::load(&db)?;
    let read = db.begin_read().map_err(storage)?;
    let docs = read.open_table(DOCUMENTS).map_err(storage)?;
    let total = docs.len().map_err(storage)?;

    let dictionary = if dictionary == Dictionary::Keep && kept != 0 {
        None
    } else {
        compress::train(&sample(&docs, total)?)
    };
    let trained = started.elapsed();
    let id = match &dictionary {
        Some(d) => compress::register(d)?,
        None => kept,
    };
    let mut out = Database::builder().create(&tmp).map_err(storage)?;
    match &dictionary {
        Some(d) => {
            let txn = out.begin_write().map_err(storage)?;
            compress::store_current(&txn, id, d)?;
            txn.commit().map_err(storage)?;
        }
        // Every dictionary kept: the documents keep theirs.
        None => copy_table(&read, &out, compress::DICTIONARIES)?,
    }

    let written = copy_documents(&docs, &out, id, total, &mut progress)?;
    let copied = started.elapsed();
    for t in Table::ALL {
        copy_table(&read, &out, t.definition())?;
    }
    copy_table(&read, &out, changes::CHANGES)?;
    drop(docs);
    drop(read);
    drop(db);
    // The documents' transactions left the pages they replaced free: give them back.
    while out.compact().map_err(storage)? {}
    drop(out);
    tracing::info!(
        documents = written,
        dictionary = dictionary.is_some(),
        trained_s = trained.as_secs_f64(),
        copied_s = (copied - trained).as_secs_f64(),
        compacted_s = (started.elapsed() - copied).as_secs_f64(),
        "store repacked"
    );

    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)?;
    Ok(Repacked {
        documents: written,
        bytes_before,
        bytes_after: std::fs::metadata(&path).map_err(io)?.len(),
        trained: dictionary.is_some(),
        took: started.elapsed(),
    })
}

/// Compact the closed store in `dir`: redb moves its pages down over the free ones and
/// shortens the file (after a bulk load, whose many transactions each left the pages they
/// replaced free). Returns the file's size after.
pub fn compact(dir: &Path) -> Result<u64, StoreError> {
    let path = store_file(dir);
    let mut db = Database::open(&path).map_err(|e| StoreError::Open {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let (started, before) = (
        Instant::now(),
        std::fs::metadata(&path).map_err(storage)?.len(),
    );
    while db.compact().map_err(storage)? {}
    drop(db);
    let after = std::fs::metadata(&path).map_err(storage)?.len();
    tracing::info!(
        before,
        after,
        secs = started.elapsed().as_secs_f64(),
        "store compacted"
    );
    Ok(after)
}

/// Every document of `docs`, in key order, into `out`, its content compressed with
/// dictionary `id` (re-encoded on rayon a commit's worth at a time, unless it is already);
/// how many.
fn copy_documents(
    docs: &redb::ReadOnlyTable<&'static str, &'static [u8]>,
    out: &Database,
    id: u32,
    total: u64,
    progress: &mut impl FnMut(u64, u64),
) -> Result<u64, StoreError> {
    let mut rows = docs.iter().map_err(storage)?.peekable();
    let mut written = 0u64;
    loop {
        let mut chunk = Vec::with_capacity(ROWS_A_COMMIT);
        for row in rows.by_ref().take(ROWS_A_COMMIT) {
            let (k, v) = row.map_err(storage)?;
            chunk.push((k.value().to_string(), v.value().to_vec()));
        }
        let encoded: Vec<(String, Vec<u8>)> = chunk
            .into_par_iter()
            .map(|(uri, stored)| {
                if codec::is_elsewhere(&stored)
                    || (id != 0 && codec::dictionary_of(&stored) == Some(id))
                {
                    return Ok((uri, stored));
                }
                let doc = codec::decode(&uri, &stored)?;
                Ok((uri, codec::encode(&doc, id)))
            })
            .collect::<Result<_, StoreError>>()?;
        let txn = out.begin_write().map_err(storage)?;
        {
            let mut table = txn.open_table(DOCUMENTS).map_err(storage)?;
            for (uri, stored) in &encoded {
                table
                    .insert(uri.as_str(), stored.as_slice())
                    .map_err(storage)?;
            }
        }
        txn.commit().map_err(storage)?;
        written += encoded.len() as u64;
        progress(written, total);
        if rows.peek().is_none() {
            return Ok(written);
        }
    }
}

/// The contents of up to [`SAMPLES`] documents spread evenly over the table.
fn sample(
    docs: &redb::ReadOnlyTable<&'static str, &'static [u8]>,
    total: u64,
) -> Result<Vec<Vec<u8>>, StoreError> {
    let step = (total / SAMPLES as u64).max(1) as usize;
    let mut samples = Vec::with_capacity(SAMPLES.min(total as usize));
    for row in docs.iter().map_err(storage)?.step_by(step) {
        let (k, v) = row.map_err(storage)?;
        if !codec::is_elsewhere(v.value()) {
            samples.push(codec::decode(k.value(), v.value())?.content.to_vec());
        }
    }
    Ok(samples)
}
