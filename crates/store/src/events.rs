//! Records the commit hook decides from a commit's changes (geofence events), kept in that
//! commit's own transaction: a record is durable exactly when its write is, so a crash never
//! keeps an event whose write was lost, nor loses one whose write was acknowledged.
//!
//! Records are numbered in commit order from 1, grouped by topic (a fence's name) for
//! reading, and trimmed by age and total bytes as new ones arrive. The store does not know
//! what a record says.

use redb::{ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use super::{StoreError, Table, changes::read_number, storage};

/// Number -> the record (time, topic, body).
pub(super) const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
/// (topic, number) -> nothing: the numbers of each topic's records, in order.
pub(super) const TOPICS: TableDefinition<(&str, u64), ()> = TableDefinition::new("events.topics");
/// The `Meta` key of the last record's number.
const LAST_KEY: &str = "events.last";
/// The `Meta` key of the bytes the kept records take.
const BYTES_KEY: &str = "events.bytes";

/// One record a commit keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// What it is read by (a fence's name).
    pub topic: String,
    /// Milliseconds since the epoch: retention counts from it.
    pub time_ms: u64,
    pub body: Vec<u8>,
}

/// How long records are kept: past either bound the oldest go first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_age_ms: u64,
    pub max_bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_age_ms: 7 * 24 * 3600 * 1000,
            max_bytes: 256 * 1024 * 1024,
        }
    }
}

fn encode(r: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + r.topic.len() + r.body.len());
    out.extend_from_slice(&r.time_ms.to_le_bytes());
    out.extend_from_slice(&(r.topic.len() as u16).to_le_bytes());
    out.extend_from_slice(r.topic.as_bytes());
    out.extend_from_slice(&r.body);
    out
}

fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
    let corrupt = || StoreError::Corrupt("an event record".into());
    let (time, rest) = bytes.split_first_chunk::<8>().ok_or_else(corrupt)?;
    let (len, rest) = rest.split_first_chunk::<2>().ok_or_else(corrupt)?;
    let len = u16::from_le_bytes(*len) as usize;
    let topic = rest.get(..len).ok_or_else(corrupt)?;
    Ok(Record {
        topic: String::from_utf8(topic.to_vec()).map_err(|_| corrupt())?,
        time_ms: u64::from_le_bytes(*time),
        body: rest[len..].to_vec(),
    })
}

/// Keep `records` in `txn` after the last kept, and drop the oldest past `retention`.
/// Returns the first record's number.
pub(super) fn append(
    txn: &WriteTransaction,
    records: &[Record],
    retention: Retention,
    now_ms: u64,
) -> Result<u64, StoreError> {
    let mut meta = txn.open_table(Table::Meta.definition()).map_err(storage)?;
    let mut events = txn.open_table(EVENTS).map_err(storage)?;
    let mut topics = txn.open_table(TOPICS).map_err(storage)?;
    let last = read_number(&meta, LAST_KEY)?.unwrap_or(0);
    let mut bytes = read_number(&meta, BYTES_KEY)?.unwrap_or(0);
    for (i, r) in records.iter().enumerate() {
        let n = last + 1 + i as u64;
        let encoded = encode(r);
        bytes += encoded.len() as u64;
        events.insert(n, encoded.as_slice()).map_err(storage)?;
        topics.insert((r.topic.as_str(), n), ()).map_err(storage)?;
    }
    let oldest = now_ms.saturating_sub(retention.max_age_ms);
    loop {
        let Some((n, record)) = events
            .first()
            .map_err(storage)?
            .map(|(k, v)| (k.value(), v.value().to_vec()))
        else {
            break;
        };
        let r = decode(&record)?;
        if bytes <= retention.max_bytes && r.time_ms >= oldest {
            break;
        }
        events.remove(n).map_err(storage)?;
        topics.remove((r.topic.as_str(), n)).map_err(storage)?;
        bytes = bytes.saturating_sub(record.len() as u64);
    }
    meta.insert(
        LAST_KEY,
        (last + records.len() as u64).to_string().as_bytes(),
    )
    .map_err(storage)?;
    meta.insert(BYTES_KEY, bytes.to_string().as_bytes())
        .map_err(storage)?;
    Ok(last + 1)
}

/// What the store keeps of a topic: its records after number `after`, at most `max`, and the
/// number of the oldest record kept of any topic (records before it were trimmed).
#[derive(Debug, Default)]
pub struct Kept {
    pub records: Vec<(u64, Record)>,
    pub oldest: Option<u64>,
    pub last: u64,
}

impl super::Store {
    /// The records of `topic` numbered after `after`, oldest first, at most `max`.
    pub fn events_after(&self, topic: &str, after: u64, max: usize) -> Result<Kept, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let events = txn.open_table(EVENTS).map_err(storage)?;
        let topics = txn.open_table(TOPICS).map_err(storage)?;
        let meta = txn.open_table(Table::Meta.definition()).map_err(storage)?;
        let mut kept = Kept {
            oldest: events.first().map_err(storage)?.map(|(k, _)| k.value()),
            last: read_number(&meta, LAST_KEY)?.unwrap_or(0),
            records: Vec::new(),
        };
        let from = after.saturating_add(1);
        for entry in topics
            .range((topic, from)..=(topic, u64::MAX))
            .map_err(storage)?
        {
            if kept.records.len() >= max {
                break;
            }
            let (key, _) = entry.map_err(storage)?;
            let n = key.value().1;
            if let Some(bytes) = events.get(n).map_err(storage)? {
                kept.records.push((n, decode(bytes.value())?));
            }
        }
        Ok(kept)
    }

    /// The number of the last record kept (0 before any).
    pub fn last_event(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let meta = txn.open_table(Table::Meta.definition()).map_err(storage)?;
        Ok(read_number(&meta, LAST_KEY)?.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let r = Record {
            topic: "downtown".into(),
            time_ms: 1_700_000_000_123,
            body: br#"{"detect":"enter"}"#.to_vec(),
        };
        assert_eq!(decode(&encode(&r)).unwrap(), r);
        assert!(decode(&[1, 2, 3]).is_err());
        let mut bad = encode(&r);
        bad[8] = 200;
        assert!(decode(&bad).is_err());
    }
}
