//! Copies of the whole store: what a cluster's snapshot is made of (`cluster::snapshot`).
//!
//! A copy is written from one read transaction, so it is the store exactly as of one commit,
//! with the log entry it had applied; writes go on meanwhile. Installing a copy replaces a
//! stopped node's store file and drops its saved views, which belong to the store replaced.

use std::path::{Path, PathBuf};

#[cfg(test)]
use redb::ReadableTableMetadata;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::{APPLIED_KEY, DOCUMENTS, Store, StoreError, Table, changes, compress, storage};
#[cfg(test)]
use crate::acl::Caller;

/// Rows copied in one transaction of the copy, to bound its memory.
const ROWS_A_COMMIT: usize = 50_000;

/// The store file in a data directory.
pub fn store_file(dir: &Path) -> PathBuf {
    dir.join("geoshard.redb")
}

impl Store {
    /// Write a copy of every table, as of one read transaction, to the new file `path`, and
    /// return the log entry the copy has applied.
    pub fn export(&self, path: &Path) -> Result<u64, StoreError> {
        let _ = std::fs::remove_file(path);
        let read = self.db.begin_read().map_err(storage)?;
        let out = Database::builder().create(path).map_err(storage)?;
        copy_table(&read, &out, DOCUMENTS)?;
        for t in Table::ALL {
            copy_table(&read, &out, t.definition())?;
        }
        copy_table(&read, &out, changes::CHANGES)?;
        copy_table(&read, &out, compress::DICTIONARIES)?;
        let meta = read.open_table(Table::Meta.definition()).map_err(storage)?;
        Ok(changes::read_number(&meta, APPLIED_KEY)?.unwrap_or(0))
    }
}

pub(crate) fn copy_table<K, V>(
    read: &redb::ReadTransaction,
    out: &Database,
    table: TableDefinition<'static, K, V>,
) -> Result<(), StoreError>
where
    K: redb::Key + 'static,
    V: redb::Value + 'static,
    for<'a> K::SelfType<'a>: std::borrow::Borrow<K::SelfType<'a>>,
    for<'a> V::SelfType<'a>: std::borrow::Borrow<V::SelfType<'a>>,
{
    let source = read.open_table(table).map_err(storage)?;
    let mut rows = source.iter().map_err(storage)?.peekable();
    // One commit even for an empty table, so that the copy has every table.
    loop {
        let txn = out.begin_write().map_err(storage)?;
        {
            let mut target = txn.open_table(table).map_err(storage)?;
            for _ in 0..ROWS_A_COMMIT {
                let Some(row) = rows.next() else { break };
                let (k, v) = row.map_err(storage)?;
                target.insert(k.value(), v.value()).map_err(storage)?;
            }
        }
        txn.commit().map_err(storage)?;
        if rows.peek().is_none() {
            return Ok(());
        }
    }
}

/// The log entry the store in `dir` has applied; 0 when it has none or there is no store yet.
/// For a store that is not open.
pub fn stored_applied(dir: &Path) -> Result<u64, StoreError> {
    stored_applied_in(&store_file(dir))
}

/// The log entry the store file at `path` has applied (0 when there is none).
pub fn stored_applied_in(path: &Path) -> Result<u64, StoreError> {
    if !path.exists() {
        return Ok(0);
    }
    let db = Database::open(path).map_err(|e| StoreError::Open {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let txn = db.begin_read().map_err(storage)?;
    match txn.open_table(Table::Meta.definition()) {
        Ok(meta) => Ok(changes::read_number(&meta, APPLIED_KEY)?.unwrap_or(0)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
        Err(e) => Err(storage(e)),
    }
}

/// Make the copy at `copy` the store of `dir` (not open), dropping the views saved from the
/// store it replaces.
pub fn install(dir: &Path, copy: &Path) -> Result<(), StoreError> {
    let io = |e: std::io::Error| StoreError::Open {
        path: dir.display().to_string(),
        message: e.to_string(),
    };
    std::fs::File::open(copy)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    let target = store_file(dir);
    let views = target.with_file_name("views");
    if views.exists() {
        std::fs::remove_dir_all(&views).map_err(io)?;
    }
    std::fs::rename(copy, &target).map_err(io)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreOptions;
    use crate::tests::{apply, put, tempdir, writer};

    #[test]
    fn a_copy_is_the_store_as_of_one_commit_and_installs_over_another() {
        let dir = tempdir();
        let (a, b) = (dir.join("a"), dir.join("b"));
        let store = Store::open(&a, StoreOptions::default()).unwrap();
        let rows = ROWS_A_COMMIT / 2 + 7;
        for seq in 1..=3 {
            let ops = (0..rows)
                .map(|i| put(&format!("/d/{seq}/{i}.json"), &i.to_string()))
                .collect();
            apply(&store, seq, writer(), ops).unwrap();
        }
        let copy = dir.join("copy.redb");
        assert_eq!(store.export(&copy).unwrap(), 3);
        apply(&store, 4, writer(), vec![put("/after.json", "1")]).unwrap();
        store.shutdown_blocking();

        // b has a store and saved views of its own: both replaced.
        let other = Store::open(&b, StoreOptions::default()).unwrap();
        apply(&other, 1, writer(), vec![put("/only-b.json", "2")]).unwrap();
        other.shutdown_blocking();
        drop(other);
        assert_eq!(stored_applied(&b).unwrap(), 1);
        std::fs::create_dir_all(b.join("views")).unwrap();
        install(&b, &copy).unwrap();
        assert!(!copy.exists() && !b.join("views").exists());
        assert_eq!(stored_applied(&b).unwrap(), 3);
        assert_eq!(stored_applied(&dir.join("none")).unwrap(), 0);
        let b = Store::open(&b, StoreOptions::default()).unwrap();
        assert_eq!(b.applied(), 3);
        let last = format!("/d/3/{}.json", rows - 1);
        for (uri, there) in [
            ("/d/1/0.json", true),
            (last.as_str(), true),
            ("/after.json", false),
            ("/only-b.json", false),
        ] {
            let doc = b.get(&Caller::system(), uri).unwrap();
            assert_eq!(doc.is_some(), there, "{uri}");
        }
        let n =
            b.db.begin_read()
                .unwrap()
                .open_table(DOCUMENTS)
                .unwrap()
                .len()
                .unwrap();
        assert_eq!(n as usize, 3 * rows);
        b.shutdown_blocking();
    }
}
