//! The store's commit counter, and the documents each commit changed since derived data
//! (the views' segments) was last saved.
//!
//! Every transaction that changes documents gets the next commit number. While a save point
//! is set (`changes.from`), each such commit also records its URIs in the `changes` table, so
//! that data saved at that point can be brought up to date by reading only those documents.
//! The record is bounded: past [`MAX_RECORDED`] URIs it is dropped with the save point, and
//! what was saved is rebuilt instead.

use std::collections::BTreeSet;

use redb::{ReadableTable, TableDefinition, WriteTransaction};

use super::{StoreError, Table, storage};

/// Commit number -> the URIs it changed (each a `u32` length and the bytes).
pub(super) const CHANGES: TableDefinition<u64, &[u8]> = TableDefinition::new("changes");
/// The `Meta` key of the last commit's number.
pub(super) const COMMITS_KEY: &str = "commits";
/// The `Meta` key of the save point: the changes of every later commit are recorded.
const FROM_KEY: &str = "changes.from";
/// The `Meta` key of the URIs recorded since the save point.
const COUNT_KEY: &str = "changes.count";

/// Most URIs recorded after a save point; past it, the record is dropped.
#[cfg(not(test))]
pub(super) const MAX_RECORDED: u64 = 1_000_000;
#[cfg(test)]
pub(super) const MAX_RECORDED: u64 = 6;

pub(super) fn read_number(
    meta: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<Option<u64>, StoreError> {
    match meta.get(key).map_err(storage)? {
        None => Ok(None),
        Some(v) => String::from_utf8_lossy(v.value())
            .parse()
            .map(Some)
            .map_err(|_| StoreError::Corrupt(format!("meta {key}"))),
    }
}

fn encode<'a>(uris: impl Iterator<Item = &'a str>) -> Vec<u8> {
    let mut out = Vec::new();
    for u in uris {
        out.extend_from_slice(&(u.len() as u32).to_le_bytes());
        out.extend_from_slice(u.as_bytes());
    }
    out
}

fn decode(mut bytes: &[u8], into: &mut BTreeSet<String>) -> Result<(), StoreError> {
    while !bytes.is_empty() {
        let corrupt = || StoreError::Corrupt("a changes record".into());
        let (len, rest) = bytes.split_first_chunk::<4>().ok_or_else(corrupt)?;
        let len = u32::from_le_bytes(*len) as usize;
        let uri = rest.get(..len).ok_or_else(corrupt)?;
        into.insert(String::from_utf8(uri.to_vec()).map_err(|_| corrupt())?);
        bytes = &rest[len..];
    }
    Ok(())
}

/// Number this commit, inside its transaction, and record its URIs while a save point is
/// set. Returns the commit's number.
pub(super) fn record<'a>(
    txn: &WriteTransaction,
    uris: impl Iterator<Item = &'a str>,
    count: usize,
) -> Result<u64, StoreError> {
    let mut meta = txn.open_table(Table::Meta.definition()).map_err(storage)?;
    let commit = read_number(&meta, COMMITS_KEY)?.unwrap_or(0) + 1;
    meta.insert(COMMITS_KEY, commit.to_string().as_bytes())
        .map_err(storage)?;
    if read_number(&meta, FROM_KEY)?.is_none() {
        return Ok(commit);
    }
    let recorded = read_number(&meta, COUNT_KEY)?.unwrap_or(0) + count as u64;
    if recorded > MAX_RECORDED {
        drop_record(txn, meta)?;
        tracing::info!(
            commit,
            "more documents changed than are recorded for the saved views; they will be rebuilt at the next start"
        );
        return Ok(commit);
    }
    meta.insert(COUNT_KEY, recorded.to_string().as_bytes())
        .map_err(storage)?;
    drop(meta);
    let mut changes = txn.open_table(CHANGES).map_err(storage)?;
    changes
        .insert(commit, encode(uris).as_slice())
        .map_err(storage)?;
    Ok(commit)
}

/// Number a commit that replaced the documents wholesale (a bulk load's): data saved before
/// it is of no use, so the record and the save point go. Returns the commit's number.
pub(super) fn record_wholesale(txn: &WriteTransaction) -> Result<u64, StoreError> {
    let mut meta = txn.open_table(Table::Meta.definition()).map_err(storage)?;
    let commit = read_number(&meta, COMMITS_KEY)?.unwrap_or(0) + 1;
    meta.insert(COMMITS_KEY, commit.to_string().as_bytes())
        .map_err(storage)?;
    drop_record(txn, meta)?;
    Ok(commit)
}

/// Drop the save point and the changes recorded since it.
fn drop_record(
    txn: &WriteTransaction,
    mut meta: redb::Table<'_, &'static str, &'static [u8]>,
) -> Result<(), StoreError> {
    meta.remove(FROM_KEY).map_err(storage)?;
    meta.remove(COUNT_KEY).map_err(storage)?;
    drop(meta);
    txn.delete_table(CHANGES).map_err(storage)?;
    Ok(())
}

/// The URIs changed by the commits after `point`, or `None` when they were not all recorded.
pub(super) fn since(
    txn: &redb::ReadTransaction,
    point: u64,
) -> Result<Option<BTreeSet<String>>, StoreError> {
    let meta = txn.open_table(Table::Meta.definition()).map_err(storage)?;
    match read_number(&meta, FROM_KEY)? {
        Some(from) if from <= point => {}
        _ => return Ok(None),
    }
    let mut out = BTreeSet::new();
    let changes = match txn.open_table(CHANGES) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Some(out)),
        Err(e) => return Err(storage(e)),
    };
    for entry in changes.range(point + 1..).map_err(storage)? {
        let (_, v) = entry.map_err(storage)?;
        decode(v.value(), &mut out)?;
    }
    Ok(Some(out))
}

/// Record from now on, if not already recording; returns the point from which every change
/// is recorded.
pub(super) fn start(txn: &WriteTransaction) -> Result<u64, StoreError> {
    let mut meta = txn.open_table(Table::Meta.definition()).map_err(storage)?;
    if let Some(from) = read_number(&meta, FROM_KEY)? {
        return Ok(from);
    }
    let from = read_number(&meta, COMMITS_KEY)?.unwrap_or(0);
    meta.insert(FROM_KEY, from.to_string().as_bytes())
        .map_err(storage)?;
    meta.insert(COUNT_KEY, b"0".as_slice()).map_err(storage)?;
    Ok(from)
}

/// How many URIs were recorded since the save point (a URI changed twice counts twice), or
/// `None` when not recording.
pub(super) fn recorded(txn: &redb::ReadTransaction) -> Result<Option<u64>, StoreError> {
    let meta = txn.open_table(Table::Meta.definition()).map_err(storage)?;
    if read_number(&meta, FROM_KEY)?.is_none() {
        return Ok(None);
    }
    Ok(Some(read_number(&meta, COUNT_KEY)?.unwrap_or(0)))
}

/// Data derived from the store was saved at commit `point`: record from there on, and forget
/// what came before. With `writes_went_on`, only when every change since `point` was
/// recorded (the record may have been dropped during the save); `false` when not.
pub(super) fn saved_at(
    txn: &WriteTransaction,
    point: u64,
    writes_went_on: bool,
) -> Result<bool, StoreError> {
    if writes_went_on {
        let meta = txn.open_table(Table::Meta.definition()).map_err(storage)?;
        if read_number(&meta, FROM_KEY)?.is_none_or(|from| from > point) {
            return Ok(false);
        }
    }
    let mut left = BTreeSet::new();
    {
        let mut changes = txn.open_table(CHANGES).map_err(storage)?;
        changes.retain_in(..=point, |_, _| false).map_err(storage)?;
        for entry in changes.range(point + 1..).map_err(storage)? {
            let (_, v) = entry.map_err(storage)?;
            decode(v.value(), &mut left)?;
        }
    }
    let mut meta = txn.open_table(Table::Meta.definition()).map_err(storage)?;
    meta.insert(FROM_KEY, point.to_string().as_bytes())
        .map_err(storage)?;
    meta.insert(COUNT_KEY, left.len().to_string().as_bytes())
        .map_err(storage)?;
    Ok(true)
}
