//! Map tiles kept once made, bounded in bytes. A tile is keyed by its collection, the
//! catalog's generation (a definition change starts afresh), the rows its caller may read
//! (readability is a function of the roles alone) and z/x/y. A write drops exactly the tiles
//! of its view whose buffered bounds meet the box of the row's old or new geometry, and a
//! tile made while such a write went by is not kept. Eviction is CLOCK: a tile asked for
//! since the hand last passed gets another round.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::acl::{Role, RoleSet};
use crate::spatial::tile::{BUFFER, EXTENT, HALF, mercator_bounds, to_lon_lat};
use crate::template::ViewKey;

/// A box, `[xmin, ymin, xmax, ymax]` in degrees.
pub type BBox = [f64; 4];

/// Invalidations remembered for tiles being made; one made across more is not kept.
const RECENT: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TileKey {
    pub collection: Arc<str>,
    pub generation: u64,
    /// The caller's effective roles, or every bit for an admin, who reads every row.
    pub readers: u8,
    pub z: u32,
    pub x: u32,
    pub y: u32,
}

impl TileKey {
    /// The readers part of a key for a caller with these effective roles.
    pub fn readers_of(roles: RoleSet) -> u8 {
        if roles.contains(Role::Admin) {
            u8::MAX
        } else {
            roles.bits()
        }
    }
}

/// A tile as served: its bytes and their entity tag.
#[derive(Debug, Clone)]
pub struct Tile {
    pub bytes: Bytes,
    pub etag: Arc<str>,
    /// The bytes gzipped, made once by the first answer that sends them so, and kept with
    /// the tile (outside the budget, which counts the bytes).
    pub gzip: Arc<std::sync::OnceLock<Bytes>>,
}

impl Tile {
    /// A strong entity tag of the bytes (CRC-32 and length: a tag only tells versions apart).
    pub fn new(bytes: Bytes) -> Tile {
        let etag = format!("\"{:08x}-{:x}\"", crc32fast::hash(&bytes), bytes.len());
        Tile {
            bytes,
            etag: Arc::from(etag),
            gzip: Arc::default(),
        }
    }
}

struct Entry {
    tile: Tile,
    view: ViewKey,
    used: bool,
}

/// A view's tiles held, by (z, x, y): several collections and sets of readers each.
type ByPlace = BTreeMap<(u32, u32, u32), Vec<TileKey>>;

#[derive(Default)]
struct Inner {
    entries: HashMap<TileKey, Entry>,
    /// The keys held per view, by (z, x, y), for a write's range lookups.
    by_view: HashMap<ViewKey, ByPlace>,
    /// The CLOCK's ring: each key held, once.
    ring: VecDeque<TileKey>,
    bytes: usize,
    /// Counts invalidations; `recent` holds the last ones with their epoch.
    epoch: u64,
    recent: VecDeque<(u64, ViewKey, BBox)>,
}

pub struct TileCache {
    budget: usize,
    inner: Mutex<Inner>,
    /// Tiles being made now; with none and nothing held, a write has nothing to do here.
    making: AtomicUsize,
    held: AtomicUsize,
}

/// A tile being made: what the cache knew when it started. Dropped, it is no longer counted.
pub struct Making<'c> {
    cache: &'c TileCache,
    epoch: u64,
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        self.cache.making.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The box in degrees a tile's query covers: its bounds and buffer.
pub fn tile_box(z: u32, x: u32, y: u32) -> BBox {
    let (left, bottom, right, top) = mercator_bounds(z, x, y);
    let pad = BUFFER * (right - left) / f64::from(EXTENT);
    let (w, s) = to_lon_lat((left - pad).max(-HALF), (bottom - pad).max(-HALF));
    let (e, n) = to_lon_lat((right + pad).min(HALF), (top + pad).min(HALF));
    [w, s, e, n]
}

fn meets(a: &BBox, b: &BBox) -> bool {
    a[0] <= b[2] && b[0] <= a[2] && a[1] <= b[3] && b[1] <= a[3]
}

/// The tiles at zoom `z` whose buffered bounds may meet `b`: x and y ranges, inclusive.
fn tile_range(z: u32, b: &BBox) -> ((u32, u32), (u32, u32)) {
    use crate::spatial::tile::to_mercator;
    let size = 2.0 * HALF / f64::from(1u32 << z.min(31));
    let pad = BUFFER * size / f64::from(EXTENT);
    let lat = |v: f64| v.clamp(-85.06, 85.06);
    let lo = to_mercator(geo::coord! {x: b[0].clamp(-180.0, 180.0), y: lat(b[1])});
    let hi = to_mercator(geo::coord! {x: b[2].clamp(-180.0, 180.0), y: lat(b[3])});
    let last = (1u64 << z) - 1;
    let cell = |m: f64| ((m / size).floor().max(0.0) as u64).min(last) as u32;
    let xs = (cell(lo.x - pad + HALF), cell(hi.x + pad + HALF));
    let ys = (cell(HALF - hi.y - pad), cell(HALF - lo.y + pad));
    (xs, ys)
}

impl TileCache {
    /// A cache of at most `budget` bytes of tiles; 0 keeps none.
    pub fn new(budget: usize) -> TileCache {
        TileCache {
            budget,
            inner: Mutex::new(Inner::default()),
            making: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
        }
    }

    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// The tile, if held; it is marked as used.
    pub fn get(&self, key: &TileKey) -> Option<Tile> {
        if !self.enabled() {
            return None;
        }
        let mut inner = self.inner.lock();
        let e = inner.entries.get_mut(key)?;
        e.used = true;
        Some(e.tile.clone())
    }

    /// Say a tile is being made: call before its query reads the view.
    pub fn making(&self) -> Making<'_> {
        self.making.fetch_add(1, Ordering::SeqCst);
        let epoch = self.inner.lock().epoch;
        Making { cache: self, epoch }
    }

    /// Keep a tile made since `making`, unless a write to its view met it meanwhile.
    pub fn put(&self, key: TileKey, view: ViewKey, making: Making<'_>, tile: Tile) {
        let size = tile.bytes.len() + key.collection.len() + 128;
        if !self.enabled() || size > self.budget / 4 {
            return;
        }
        let bounds = tile_box(key.z, key.x, key.y);
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let since = making.epoch;
        let forgotten = inner.recent.front().is_some_and(|(e, _, _)| *e > since + 1)
            || (inner.recent.is_empty() && inner.epoch > since);
        let met = inner
            .recent
            .iter()
            .rev()
            .take_while(|(e, _, _)| *e > since)
            .any(|(_, v, b)| *v == view && meets(b, &bounds));
        if forgotten || met {
            return;
        }
        if let Some(old) = inner.entries.insert(
            key.clone(),
            Entry {
                tile,
                view: view.clone(),
                used: false,
            },
        ) {
            inner.bytes -= old.tile.bytes.len() + key.collection.len() + 128;
        } else {
            inner.ring.push_back(key.clone());
            inner
                .by_view
                .entry(view)
                .or_default()
                .entry((key.z, key.x, key.y))
                .or_default()
                .push(key);
        }
        inner.bytes += size;
        while inner.bytes > self.budget {
            let Some(k) = inner.ring.pop_front() else {
                break;
            };
            match inner.entries.get_mut(&k) {
                Some(e) if e.used => {
                    e.used = false;
                    inner.ring.push_back(k);
                }
                Some(_) => Self::remove(inner, &k),
                None => {}
            }
        }
        self.held.store(inner.entries.len(), Ordering::SeqCst);
    }

    fn remove(inner: &mut Inner, key: &TileKey) {
        let Some(e) = inner.entries.remove(key) else {
            return;
        };
        inner.bytes -= e.tile.bytes.len() + key.collection.len() + 128;
        if let Some(tiles) = inner.by_view.get_mut(&e.view) {
            let at = (key.z, key.x, key.y);
            if let Some(keys) = tiles.get_mut(&at) {
                keys.retain(|k| k != key);
                if keys.is_empty() {
                    tiles.remove(&at);
                }
            }
            if tiles.is_empty() {
                inner.by_view.remove(&e.view);
            }
        }
    }

    /// Whether a write to `view` must say which boxes it changed.
    pub fn watching(&self, view: &ViewKey) -> bool {
        if !self.enabled() {
            return false;
        }
        if self.making.load(Ordering::SeqCst) > 0 {
            return true;
        }
        self.held.load(Ordering::SeqCst) > 0 && self.inner.lock().by_view.contains_key(view)
    }

    /// A row of `view` changed within `b` (its old or new geometry's box), after the view
    /// shows the change: drop the tiles it meets.
    pub fn changed(&self, view: &ViewKey, b: BBox) {
        if !self.enabled() {
            return;
        }
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        inner.epoch += 1;
        let epoch = inner.epoch;
        inner.recent.push_back((epoch, view.clone(), b));
        if inner.recent.len() > RECENT {
            inner.recent.pop_front();
        }
        let Some(tiles) = inner.by_view.get(view) else {
            return;
        };
        let mut gone = Vec::new();
        // Each zoom held, found by a jump to the next one rather than a walk over every tile.
        let mut next = tiles.range((0, 0, 0)..).next().map(|(k, _)| k.0);
        while let Some(z) = next {
            let ((x0, x1), (y0, y1)) = tile_range(z, &b);
            for ((_, _, y), keys) in tiles.range((z, x0, 0)..=(z, x1, u32::MAX)) {
                if (y0..=y1).contains(y) {
                    gone.extend(keys.iter().cloned());
                }
            }
            next = z
                .checked_add(1)
                .and_then(|n| tiles.range((n, 0, 0)..).next().map(|(k, _)| k.0));
        }
        for k in &gone {
            Self::remove(inner, k);
        }
        self.held.store(inner.entries.len(), Ordering::SeqCst);
    }

    /// Tiles and bytes held.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.inner.lock();
        (inner.entries.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(z: u32, x: u32, y: u32) -> TileKey {
        TileKey {
            collection: Arc::from("c.0"),
            generation: 1,
            readers: 1,
            z,
            x,
            y,
        }
    }

    fn tile(n: usize) -> Tile {
        Tile::new(Bytes::from(vec![7u8; n]))
    }

    /// The tile holding a lon/lat at zoom z, by the slippy-map formula.
    fn tile_of(z: u32, lon: f64, lat: f64) -> (u32, u32) {
        let n = f64::from(1u32 << z);
        let x = ((lon + 180.0) / 360.0 * n).floor() as u32;
        let r = lat.to_radians();
        let y = ((1.0 - (r.tan() + 1.0 / r.cos()).ln() / std::f64::consts::PI) / 2.0 * n).floor()
            as u32;
        (x, y)
    }

    #[test]
    fn a_write_drops_the_tiles_it_meets_and_no_other() {
        let cache = TileCache::new(1 << 20);
        let view = ViewKey::new("s", "v");
        let other = ViewKey::new("s", "w");
        // Denver's tiles at zooms 0 to 14, and at zoom 10 the tile two to its east.
        let (lon, lat) = (-104.99, 39.74);
        for z in 0..=14 {
            let (x, y) = tile_of(z, lon, lat);
            cache.put(key(z, x, y), view.clone(), cache.making(), tile(100));
        }
        let (x10, y10) = tile_of(10, lon, lat);
        cache.put(
            key(10, x10 + 2, y10),
            view.clone(),
            cache.making(),
            tile(100),
        );
        cache.put(key(3, 0, 0), other.clone(), cache.making(), tile(100));
        assert_eq!(cache.usage().0, 17);
        // A point moves within Denver: every Denver tile goes, the neighbour and the other
        // view's tile stay.
        cache.changed(&view, [lon, lat, lon, lat]);
        assert_eq!(cache.usage().0, 2);
        assert!(cache.get(&key(10, x10 + 2, y10)).is_some());
        assert!(cache.get(&key(3, 0, 0)).is_some());
        // A write to another view does not touch this one's.
        cache.changed(&other, [-180.0, -85.0, 180.0, 85.0]);
        assert!(cache.get(&key(10, x10 + 2, y10)).is_some());
        assert!(cache.get(&key(3, 0, 0)).is_none());
    }

    #[test]
    fn a_tile_made_across_a_write_that_meets_it_is_not_kept() {
        let cache = TileCache::new(1 << 20);
        let view = ViewKey::new("s", "v");
        let making = cache.making();
        cache.changed(&view, [-105.0, 39.0, -104.0, 40.0]);
        cache.put(key(0, 0, 0), view.clone(), making, tile(10));
        assert!(cache.get(&key(0, 0, 0)).is_none());
        // A write elsewhere does not keep a tile from being kept.
        let making = cache.making();
        cache.changed(&view, [10.0, 10.0, 11.0, 11.0]);
        let (x, y) = tile_of(8, -104.5, 39.5);
        cache.put(key(8, x, y), view.clone(), making, tile(10));
        assert!(cache.get(&key(8, x, y)).is_some());
    }

    #[test]
    fn the_bytes_held_stay_within_the_budget_and_used_tiles_last_longer() {
        let cache = TileCache::new(10_000);
        let view = ViewKey::new("s", "v");
        for i in 0..5 {
            cache.put(key(20, i, 0), view.clone(), cache.making(), tile(1_000));
        }
        assert!(cache.get(&key(20, 0, 0)).is_some());
        for i in 5..40 {
            cache.put(key(20, i, 0), view.clone(), cache.making(), tile(1_000));
            assert!(cache.usage().1 <= 10_000);
        }
        assert!(cache.usage().0 >= 8, "{:?}", cache.usage());
        assert!(cache.get(&key(20, 1, 0)).is_none());
        assert!(cache.get(&key(20, 39, 0)).is_some());
    }
}
