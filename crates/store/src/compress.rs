//! Documents compressed with a zstd dictionary trained on the store's own documents.
//!
//! Small JSON documents compress poorly one by one, and well against a dictionary of what
//! they share (member names, common values). A dictionary is trained by [`crate::repack`]
//! from a sample of the documents, kept in the `dictionaries` table under an id that is a
//! checksum of its bytes, and used by every later write of the store. A stored value names
//! its dictionary, so values of an older dictionary stay readable until a repack rewrites
//! them. Dictionaries are registered once per process, by id, and never dropped: a store
//! has one or two in its life.

use std::cell::RefCell;
use std::sync::LazyLock;

use parking_lot::RwLock;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use zstd::bulk::{Compressor, Decompressor};
use zstd::dict::{DecoderDictionary, EncoderDictionary};

use super::{FastMap, StoreError, storage};

/// Dictionary id -> the dictionary's bytes; key [`CURRENT`] holds the id new writes use.
pub(crate) const DICTIONARIES: TableDefinition<u32, &[u8]> = TableDefinition::new("dictionaries");
/// The key of the current dictionary's id (no dictionary has id 0).
const CURRENT: u32 = 0;
/// zstd's level: its default, which compresses these documents as well as higher levels do.
const LEVEL: i32 = 3;
/// The size a dictionary is trained to.
pub(crate) const DICTIONARY_BYTES: usize = 64 * 1024;
/// Contents shorter than this, or longer than the largest, are stored as they are.
const MIN_BYTES: usize = 32;
/// The largest content compressed: a frame claiming more is damaged, and its claim never
/// sizes an allocation.
const MAX_BYTES: usize = 64 * 1024 * 1024;

struct Dictionary {
    bytes: Vec<u8>,
    encoder: EncoderDictionary<'static>,
    decoder: DecoderDictionary<'static>,
}

static REGISTRY: LazyLock<RwLock<FastMap<u32, &'static Dictionary>>> =
    LazyLock::new(Default::default);

thread_local! {
    static COMPRESSOR: RefCell<Option<Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<Decompressor<'static>>> = const { RefCell::new(None) };
    static LEAN_DECOMPRESSOR: RefCell<Option<Decompressor<'static>>> = const { RefCell::new(None) };
}

/// The id of a dictionary: a checksum of its bytes, never 0.
pub(crate) fn id_of(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes).max(1)
}

/// Make a dictionary usable by this process; its id.
pub(crate) fn register(bytes: &[u8]) -> Result<u32, StoreError> {
    let id = id_of(bytes);
    if let Some(known) = REGISTRY.read().get(&id) {
        return if known.bytes == bytes {
            Ok(id)
        } else {
            Err(StoreError::Corrupt(format!(
                "two different compression dictionaries have the id {id}"
            )))
        };
    }
    let dictionary: &'static Dictionary = Box::leak(Box::new(Dictionary {
        bytes: bytes.to_vec(),
        encoder: EncoderDictionary::copy(bytes, LEVEL),
        decoder: DecoderDictionary::copy(bytes),
    }));
    REGISTRY.write().entry(id).or_insert(dictionary);
    Ok(id)
}

fn get(id: u32) -> Option<&'static Dictionary> {
    REGISTRY.read().get(&id).copied()
}

/// Register the dictionaries of a store; the id its writes use (0: none, stored plainly).
pub(crate) fn load(db: &redb::Database) -> Result<u32, StoreError> {
    let txn = db.begin_read().map_err(storage)?;
    let table = match txn.open_table(DICTIONARIES) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(storage(e)),
    };
    let mut current = 0;
    for entry in table.iter().map_err(storage)? {
        let (k, v) = entry.map_err(storage)?;
        if k.value() == CURRENT {
            let b = v.value();
            let id: [u8; 4] = b.try_into().map_err(|_| {
                StoreError::Corrupt("the current dictionary's id is not 4 bytes".into())
            })?;
            current = u32::from_le_bytes(id);
        } else if register(v.value())? != k.value() {
            return Err(StoreError::Corrupt(format!(
                "compression dictionary {} does not match its id",
                k.value()
            )));
        }
    }
    if current != 0 && get(current).is_none() {
        return Err(StoreError::Corrupt(format!(
            "the current compression dictionary {current} is missing"
        )));
    }
    Ok(current)
}

/// Write `dictionary` (already registered) as the one writes use, in a new store's write
/// transaction.
pub(crate) fn store_current(
    txn: &redb::WriteTransaction,
    id: u32,
    dictionary: &[u8],
) -> Result<(), StoreError> {
    let mut table = txn.open_table(DICTIONARIES).map_err(storage)?;
    table.insert(id, dictionary).map_err(storage)?;
    table
        .insert(CURRENT, id.to_le_bytes().as_slice())
        .map_err(storage)?;
    Ok(())
}

/// Append `content` compressed with dictionary `id` to `out`: a lean zstd frame, with no
/// magic number, dictionary id, content size or checksum (the stored value has the
/// dictionary's id and the size, and redb its pages' checksums); false (and `out` unchanged)
/// when it would not be smaller, or is too short or too long to try.
pub(crate) fn compress(id: u32, content: &[u8], out: &mut Vec<u8>) -> bool {
    let Some(dictionary) = get(id) else {
        return false;
    };
    if !(MIN_BYTES..=MAX_BYTES).contains(&content.len()) {
        return false;
    }
    let frame = COMPRESSOR.with_borrow_mut(|c| {
        let c = match c {
            Some(c) => c,
            None => c.insert(lean_compressor()?),
        };
        c.set_prepared_dictionary(&dictionary.encoder).ok()?;
        c.compress(content).ok()
    });
    match frame {
        Some(frame) if frame.len() < content.len() => {
            out.extend_from_slice(&frame);
            true
        }
        _ => false,
    }
}

fn lean_compressor() -> Option<Compressor<'static>> {
    use zstd::zstd_safe::{CParameter, FrameFormat};
    let mut c = Compressor::new(LEVEL).ok()?;
    for p in [
        CParameter::Format(FrameFormat::Magicless),
        CParameter::DictIdFlag(false),
        CParameter::ContentSizeFlag(false),
        CParameter::ChecksumFlag(false),
    ] {
        c.set_parameter(p).ok()?;
    }
    Some(c)
}

/// The content of a frame compressed with dictionary `id`: a standard frame (which records
/// the content's size; codec version 2) when `lean` is `None`, else a lean one of
/// [`compress`] whose content is `lean` bytes long.
pub(crate) fn decompress(id: u32, frame: &[u8], lean: Option<usize>) -> Result<Vec<u8>, String> {
    let dictionary = get(id).ok_or_else(|| format!("compression dictionary {id} is unknown"))?;
    let len = match lean {
        Some(len) if len <= MAX_BYTES => len,
        Some(len) => return Err(format!("a compressed content claims {len} bytes")),
        None => match zstd::zstd_safe::get_frame_content_size(frame) {
            Ok(Some(len)) if len <= MAX_BYTES as u64 => len as usize,
            Ok(Some(len)) => return Err(format!("a compressed content claims {len} bytes")),
            Ok(None) | Err(_) => return Err("the compressed content's frame is damaged".into()),
        },
    };
    let decompress = |slot: &mut Option<Decompressor<'static>>, magicless: bool| {
        let d = match slot {
            Some(d) => d,
            None => {
                let mut d = Decompressor::new().map_err(|e| e.to_string())?;
                if magicless {
                    use zstd::zstd_safe::{DParameter, FrameFormat};
                    d.set_parameter(DParameter::Format(FrameFormat::Magicless))
                        .map_err(|e| e.to_string())?;
                }
                slot.insert(d)
            }
        };
        d.set_prepared_dictionary(&dictionary.decoder)
            .map_err(|e| e.to_string())?;
        d.decompress(frame, len).map_err(|e| e.to_string())
    };
    let content = if lean.is_some() {
        LEAN_DECOMPRESSOR.with_borrow_mut(|d| decompress(d, true))?
    } else {
        DECOMPRESSOR.with_borrow_mut(|d| decompress(d, false))?
    };
    if content.len() != len {
        return Err(format!(
            "the content is {} bytes, not the {len} its value records",
            content.len()
        ));
    }
    Ok(content)
}

/// A standard frame, as codec version 2 stored them: for tests that read those.
#[cfg(test)]
pub(crate) fn compress_standard(id: u32, content: &[u8]) -> Vec<u8> {
    let mut c = Compressor::new(LEVEL).unwrap();
    c.set_prepared_dictionary(&get(id).unwrap().encoder)
        .unwrap();
    c.compress(content).unwrap()
}

/// A dictionary trained on `samples` (documents' contents), or `None` when they are too few
/// or too alike to train one.
pub(crate) fn train(samples: &[Vec<u8>]) -> Option<Vec<u8>> {
    let total: usize = samples.iter().map(Vec::len).sum();
    // zstd's trainer wants about a hundred times the dictionary's size in samples.
    let size = DICTIONARY_BYTES.min(total / 100);
    if samples.len() < 100 || size < 1024 {
        return None;
    }
    zstd::dict::from_samples(samples, size).ok()
}
