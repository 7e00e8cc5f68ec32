//! Digest nonces: signed so that any process holding the key can check one without having
//! kept it, then tracked per user so that no `nc` is accepted twice.
//!
//! A nonce is `base64url(issued_secs[8] || serial[8] || key_id[4] || hmac_sha256(key,
//! first 20)[..12])`. The key is kept in the store (`Security` saves it; a cluster shares it
//! through its log), so a nonce outlives a restart of the process that issued it and is good
//! on every node. A serial is this run's random 24-bit id and a 40-bit counter.
//!
//! Once used, a nonce is tracked under its user with the highest `nc` seen and a 64-bit
//! window below it, as IPsec does: clients that share a nonce across parallel connections may
//! send `nc` values slightly out of order, and those still pass, but no value passes twice.
//! A tracked nonce that leaves memory (unused for `idle_secs`, pushed out by the bounds, or at
//! a clean stop) is not forgotten: its highest `nc` is handed to [`NonceTable::take_saves`]
//! for the store, and its next use must send a higher one. A nonce is good for
//! `lifetime_secs` from its issue; an issued nonce must be used first within `ttl_secs`.
//!
//! A nonce of this run that is in neither place is new only if it was never tracked: each
//! user has a floor, raised to the serial of a nonce that left memory before its save was
//! read back, and serials of one run only grow. A nonce of another run or node that is in
//! neither place (its process crashed before saving it, or it was tracked elsewhere) is
//! taken at the `nc` it comes with, and nothing at or below that `nc` passes after it: a
//! request captured before such a crash could be replayed once, which is the price of a
//! client that never asks for a new nonce (see the README).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use parking_lot::{Mutex, RwLock};
use sha2::Sha256;

const SHARDS: usize = 16;
/// Bytes of a nonce: issue time, serial, key id, MAC.
const RAW_LEN: usize = 32;
const MAC_LEN: usize = 12;
/// Bits of a serial that count; the rest are the run's id.
const COUNTER_BITS: u32 = 40;

/// A key nonces are signed with, by its id.
pub type NonceKey = ([u8; 4], [u8; 32]);

/// What the table says about a nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonceCheck {
    /// Ours, live, and this `nc` is new.
    Fresh,
    /// Expired, or not ours (signed with a key we do not know): the client should retry with
    /// a new nonce, which the 401 carries.
    Stale,
    /// This `nc` was already used with this nonce.
    Replayed,
}

/// The bounds of the table (`nonce_*` settings).
#[derive(Debug, Clone, Copy)]
pub struct NonceLimits {
    /// Longest wait from a challenge to the first use of its nonce.
    pub ttl_secs: u64,
    /// Longest time a nonce in use stays in memory unused; then its state goes to the store.
    pub idle_secs: u64,
    /// Longest life of a nonce from its issue, however it is used; at least `idle_secs`.
    pub lifetime_secs: u64,
    /// Most nonces tracked in all.
    pub capacity: usize,
    /// Most nonces tracked for one user; past it the user's least recently used goes.
    pub per_user: usize,
}

/// A nonce's state handed out for the store: whose, which, and its highest `nc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedNonce {
    pub user: String,
    /// The nonce's key id and serial, which name it.
    pub id: [u8; 12],
    pub issued: u64,
    pub max: u64,
}

impl SavedNonce {
    /// The record's key in the store's `nonces` table.
    pub fn record_key(user: &str, id: &[u8; 12]) -> String {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        format!("nc/{user}/{hex}")
    }

    /// The record's value: issue time and highest `nc`.
    pub fn value(&self) -> Vec<u8> {
        let mut v = self.issued.to_be_bytes().to_vec();
        v.extend_from_slice(&self.max.to_be_bytes());
        v
    }

    /// `(issued, max)` of a stored value.
    pub fn parse_value(v: &[u8]) -> Option<(u64, u64)> {
        Some((
            u64::from_be_bytes(v.get(..8)?.try_into().ok()?),
            u64::from_be_bytes(v.get(8..16)?.try_into().ok()?),
        ))
    }
}

/// Where state beyond memory is read from: the store, in the service.
pub trait NonceVault: Send + Sync {
    /// The key of this id, when one was saved.
    fn key(&self, id: [u8; 4]) -> Option<[u8; 32]>;
    /// `(issued, max nc)` saved for a user's nonce.
    fn saved(&self, user: &str, id: &[u8; 12]) -> Option<(u64, u64)>;
}

/// No state beyond memory (tests, and a table with no store).
pub struct NoVault;

impl NonceVault for NoVault {
    fn key(&self, _: [u8; 4]) -> Option<[u8; 32]> {
        None
    }
    fn saved(&self, _: &str, _: &[u8; 12]) -> Option<(u64, u64)> {
        None
    }
}

/// One tracked nonce.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    /// The nonce's MAC, telling it apart from a nonce of the same serial made up by a client.
    mac: [u8; MAC_LEN],
    /// Its key id, part of its name.
    key: [u8; 4],
    /// Issued by this run: only such a nonce raises its user's floor when it leaves.
    ours: bool,
    issued: u64,
    last_used: u64,
    /// Highest `nc` accepted.
    max: u64,
    /// Highest `nc` handed to the saves while tracked ([`NonceTable::checkpoint`]).
    saved_max: u64,
    /// Bit i set = `max - i` accepted.
    seen: u64,
}

impl Tracked {
    fn accept(&mut self, nc: u64) -> bool {
        if nc > self.max {
            let shift = nc - self.max;
            self.seen = if shift >= 64 { 0 } else { self.seen << shift };
            self.seen |= 1;
            self.max = nc;
            return true;
        }
        let back = self.max - nc;
        if back >= 64 {
            return false;
        }
        let bit = 1u64 << back;
        if self.seen & bit != 0 {
            return false;
        }
        self.seen |= bit;
        true
    }
}

fn nonce_id(key: [u8; 4], serial: u64) -> [u8; 12] {
    let mut id = [0u8; 12];
    id[..4].copy_from_slice(&key);
    id[4..].copy_from_slice(&serial.to_be_bytes());
    id
}

/// One user's nonces.
#[derive(Debug, Default)]
struct UserNonces {
    /// By serial.
    live: crate::FastMap<u64, Tracked>,
    /// Serials of this run at or below this that are in neither `live` nor the saves are
    /// stale: they left memory and their save was lost.
    floor: u64,
    /// The issue time of the floor's nonce: once `ttl_secs` past it, every nonce at or below
    /// the floor is too old for a first use anyway, and the floor can go.
    floor_issued: u64,
}

impl UserNonces {
    /// Take `serial` out of memory, for the store.
    fn drop_nonce(&mut self, user: &str, serial: u64, saves: &mut Saves) {
        let Some(t) = self.live.remove(&serial) else {
            return;
        };
        if t.ours && serial > self.floor {
            self.floor = serial;
            self.floor_issued = t.issued;
        }
        saves.put(SavedNonce {
            user: user.to_string(),
            id: nonce_id(t.key, serial),
            issued: t.issued,
            max: t.max,
        });
    }

    /// The least recently used nonce (the lowest serial among equals).
    fn least_recent(&self) -> Option<u64> {
        self.live
            .iter()
            .min_by_key(|(serial, t)| (t.last_used, **serial))
            .map(|(serial, _)| *serial)
    }

    fn is_moot(&self, now: u64, ttl: u64) -> bool {
        self.live.is_empty() && now >= self.floor_issued.saturating_add(ttl)
    }
}

/// Nonce states that left memory and are not yet in the store, by user and nonce id; read
/// like the store until [`NonceTable::saved`] says they are there. Bounded: past its bound
/// the oldest go, and the floor keeps this run's from coming back.
#[derive(Default)]
struct Saves {
    pending: crate::FastMap<(String, [u8; 12]), SavedNonce>,
    bound: usize,
}

impl Saves {
    fn put(&mut self, s: SavedNonce) {
        if self.pending.len() >= self.bound.max(1)
            && let Some(oldest) = self
                .pending
                .iter()
                .min_by_key(|(_, v)| v.issued)
                .map(|(k, _)| k.clone())
        {
            self.pending.remove(&oldest);
        }
        self.pending.insert((s.user.clone(), s.id), s);
    }
}

#[derive(Default)]
struct Shard {
    users: crate::FastMap<String, UserNonces>,
    /// Nonces tracked in this shard, over all its users.
    tracked: usize,
}

impl Shard {
    fn drop_nonce(&mut self, user: &str, serial: u64, saves: &mut Saves) {
        if let Some(u) = self.users.get_mut(user) {
            let before = u.live.len();
            u.drop_nonce(user, serial, saves);
            self.tracked -= before - u.live.len();
        }
    }

    /// Make room for one more nonce: drop idle ones, then, if the shard is still nearly
    /// full, the least recently used nonces of its largest users until it is well below its
    /// bound (so that a sweep comes at most every eighth of the bound).
    fn make_room(&mut self, capacity: usize, now: u64, limits: &NonceLimits, saves: &mut Saves) {
        if self.tracked < capacity {
            return;
        }
        for (name, u) in self.users.iter_mut() {
            let idle: Vec<u64> = u
                .live
                .iter()
                .filter(|(_, t)| now >= t.last_used.saturating_add(limits.idle_secs))
                .map(|(s, _)| *s)
                .collect();
            for s in idle {
                u.drop_nonce(name, s, saves);
            }
        }
        self.users.retain(|_, u| !u.is_moot(now, limits.ttl_secs));
        self.tracked = self.users.values().map(|u| u.live.len()).sum();
        let target = capacity - capacity / 8;
        while self.tracked > target.min(capacity.saturating_sub(1)) {
            let Some((name, serial)) = self
                .users
                .iter()
                .max_by_key(|(_, u)| u.live.len())
                .and_then(|(name, u)| Some((name.clone(), u.least_recent()?)))
            else {
                break;
            };
            self.drop_nonce(&name, serial, saves);
        }
    }
}

pub struct NonceTable {
    /// The key new nonces are signed with.
    own: NonceKey,
    /// Other keys met (another node's, an earlier one), read from the vault once each.
    keys: RwLock<Vec<NonceKey>>,
    limits: NonceLimits,
    /// Most nonces tracked per shard (the capacity split across shards).
    shard_capacity: usize,
    /// This run's id, in the high bits of every serial it issues.
    run: u64,
    next_serial: AtomicU64,
    /// Picks a user's shard.
    hasher: foldhash::fast::RandomState,
    shards: Vec<Mutex<Shard>>,
    saves: Mutex<Saves>,
    vault: Box<dyn NonceVault>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A nonce's bytes, issue time, serial, key id and MAC.
type Parts = ([u8; RAW_LEN], u64, u64, [u8; 4], [u8; MAC_LEN]);

/// A nonce's parts.
fn decode(nonce: &str) -> Option<Parts> {
    let mut raw = [0u8; RAW_LEN];
    let n = URL_SAFE_NO_PAD.decode_slice(nonce, &mut raw).ok()?;
    if n != RAW_LEN {
        return None;
    }
    let issued = u64::from_be_bytes(raw[..8].try_into().ok()?);
    let serial = u64::from_be_bytes(raw[8..16].try_into().ok()?);
    let key = raw[16..20].try_into().ok()?;
    let mac = raw[RAW_LEN - MAC_LEN..].try_into().ok()?;
    Some((raw, issued, serial, key, mac))
}

fn mac_with(key: &[u8; 32], data: &[u8]) -> [u8; MAC_LEN] {
    let mut m =
        <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length");
    m.update(data);
    let full = m.finalize().into_bytes();
    let mut out = [0u8; MAC_LEN];
    out.copy_from_slice(&full[..MAC_LEN]);
    out
}

/// A new random key.
pub fn new_key() -> NonceKey {
    let mut id = [0u8; 4];
    let mut key = [0u8; 32];
    rand::fill(&mut id);
    rand::fill(&mut key);
    (id, key)
}

impl NonceTable {
    /// A table with a key of its own and nothing beyond memory.
    pub fn new(limits: NonceLimits) -> NonceTable {
        NonceTable::with_key(limits, new_key(), Box::new(NoVault))
    }

    /// A table signing with `own`, reading other keys and saved states from `vault`.
    pub fn with_key(limits: NonceLimits, own: NonceKey, vault: Box<dyn NonceVault>) -> NonceTable {
        let idle_secs = limits.idle_secs.max(limits.ttl_secs);
        let limits = NonceLimits {
            idle_secs,
            lifetime_secs: limits.lifetime_secs.max(idle_secs),
            capacity: limits.capacity.max(1),
            per_user: limits.per_user.max(1),
            ..limits
        };
        let mut run = [0u8; 4];
        rand::fill(&mut run);
        let run = u64::from(u32::from_be_bytes(run) & 0x00ff_ffff) << COUNTER_BITS;
        NonceTable {
            own,
            keys: RwLock::new(Vec::new()),
            shard_capacity: limits.capacity.div_ceil(SHARDS).max(2),
            saves: Mutex::new(Saves {
                pending: Default::default(),
                bound: limits.capacity.max(1024),
            }),
            limits,
            run,
            next_serial: AtomicU64::new(run | 1),
            hasher: Default::default(),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            vault,
        }
    }

    /// The key new nonces are signed with.
    pub fn own_key(&self) -> NonceKey {
        self.own
    }

    /// A new nonce for a challenge.
    pub fn issue(&self) -> String {
        self.issue_at(now_secs())
    }

    fn issue_at(&self, issued: u64) -> String {
        let mut raw = [0u8; RAW_LEN];
        raw[..8].copy_from_slice(&issued.to_be_bytes());
        let serial = self.next_serial.fetch_add(1, Ordering::Relaxed);
        raw[8..16].copy_from_slice(&serial.to_be_bytes());
        raw[16..20].copy_from_slice(&self.own.0);
        let mac = mac_with(&self.own.1, &raw[..RAW_LEN - MAC_LEN]);
        raw[RAW_LEN - MAC_LEN..].copy_from_slice(&mac);
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// The key of id `id`: ours, one met before, or the vault's.
    fn key(&self, id: [u8; 4]) -> Option<[u8; 32]> {
        if id == self.own.0 {
            return Some(self.own.1);
        }
        if let Some((_, k)) = self.keys.read().iter().find(|(i, _)| *i == id) {
            return Some(*k);
        }
        let k = self.vault.key(id)?;
        let mut keys = self.keys.write();
        // Keys are few (one a node that ever made one); a forged id finds none above.
        if keys.len() < 256 {
            keys.push((id, k));
        }
        Some(k)
    }

    fn shard(&self, user: &str) -> &Mutex<Shard> {
        use std::hash::BuildHasher;
        let h = self.hasher.hash_one(user);
        &self.shards[(h as usize) % SHARDS]
    }

    /// Check `user`'s nonce and record its `nc` (hex, as sent). Call only after the response
    /// hash matched, so that only a holder of the password can touch a user's nonces.
    pub fn check(&self, user: &str, nonce: &str, nc_hex: &str) -> NonceCheck {
        self.check_at(user, nonce, nc_hex, now_secs())
    }

    /// [`NonceTable::check`] at `now` (seconds since the epoch), for a caller that has read
    /// the clock already.
    pub(crate) fn check_at(&self, user: &str, nonce: &str, nc_hex: &str, now: u64) -> NonceCheck {
        let Some((raw, issued, serial, key_id, mac)) = decode(nonce) else {
            return NonceCheck::Stale;
        };
        // RFC 7616: nc counts the requests made with the nonce, from 1.
        let nc = match u64::from_str_radix(nc_hex, 16) {
            Ok(nc) if nc > 0 => nc,
            _ => return NonceCheck::Replayed,
        };
        if now >= issued.saturating_add(self.limits.lifetime_secs) {
            return NonceCheck::Stale;
        }
        let shard = self.shard(user);
        if let Some(check) = self.check_tracked(&mut shard.lock(), user, serial, &mac, nc, now) {
            return check;
        }
        // Not tracked: authenticate it (the only HMAC on the path).
        let Some(key) = self.key(key_id) else {
            return NonceCheck::Stale;
        };
        let ours = mac_with(&key, &raw[..RAW_LEN - MAC_LEN]);
        if !super::digest::constant_time_eq(&ours, &mac) {
            return NonceCheck::Stale;
        }
        let id = nonce_id(key_id, serial);
        let this_run = key_id == self.own.0 && serial & !((1 << COUNTER_BITS) - 1) == self.run;
        let ttl = self.limits.ttl_secs;
        // A first use of this run's nonce, within its time and above its user's floor, was
        // never tracked, so nothing of it was saved: no read of the store for it.
        let first_use = this_run && now < issued.saturating_add(ttl) && {
            let shard = shard.lock();
            shard
                .users
                .get(user)
                .is_none_or(|u| serial > u.floor || now >= u.floor_issued.saturating_add(ttl))
        };
        let saved = if first_use {
            None
        } else {
            self.saved(user, &id)
        };
        let mut shard = shard.lock();
        // Another request of the same client may have got here first.
        if let Some(check) = self.check_tracked(&mut shard, user, serial, &mac, nc, now) {
            return check;
        }
        let mut t = Tracked {
            mac,
            key: key_id,
            ours: this_run,
            issued,
            last_used: now,
            max: 0,
            saved_max: 0,
            seen: 0,
        };
        match saved {
            // Back from the store: only a higher nc passes.
            Some((_, max)) => {
                if nc <= max {
                    return NonceCheck::Replayed;
                }
                t.max = nc;
                t.seen = u64::MAX;
            }
            None if this_run => {
                let u = shard.users.entry(user.to_string()).or_default();
                if now >= u.floor_issued.saturating_add(ttl) {
                    u.floor = 0;
                }
                // A first use, late; or one that left memory and whose save was lost.
                if now >= issued.saturating_add(ttl) || serial <= u.floor {
                    return NonceCheck::Stale;
                }
                t.accept(nc);
            }
            // Another run's or node's, never saved: taken at this nc, nothing below it after.
            None => {
                t.max = nc;
                t.seen = u64::MAX;
            }
        }
        let mut saves = self.saves.lock();
        shard.make_room(self.shard_capacity, now, &self.limits, &mut saves);
        let shard = &mut *shard;
        let u = shard.users.entry(user.to_string()).or_default();
        if u.live.len() >= self.limits.per_user
            && let Some(lru) = u.least_recent()
        {
            u.drop_nonce(user, lru, &mut saves);
            shard.tracked -= 1;
        }
        u.live.insert(serial, t);
        shard.tracked += 1;
        NonceCheck::Fresh
    }

    /// `(issued, max)` of a nonce that left memory: from the saves not yet stored, else the
    /// vault.
    fn saved(&self, user: &str, id: &[u8; 12]) -> Option<(u64, u64)> {
        if let Some(s) = self.saves.lock().pending.get(&(user.to_string(), *id)) {
            return Some((s.issued, s.max));
        }
        self.vault.saved(user, id)
    }

    /// The answer for a nonce the user already uses; `None` when it is not tracked (or was
    /// idle past `idle_secs`: it then leaves memory for the saves, and is checked from there).
    fn check_tracked(
        &self,
        shard: &mut Shard,
        user: &str,
        serial: u64,
        mac: &[u8; MAC_LEN],
        nc: u64,
        now: u64,
    ) -> Option<NonceCheck> {
        let accepted = {
            let t = shard.users.get_mut(user)?.live.get_mut(&serial)?;
            if &t.mac != mac {
                // Same serial, another MAC: not the nonce we track.
                return Some(NonceCheck::Stale);
            }
            // Whole seconds: a nonce idle for idle_secs and a fraction is still in use (at
            // idle_secs = 1, a client calling every 100 ms crossed a second's edge and lost it).
            if now > t.last_used.saturating_add(self.limits.idle_secs) {
                None
            } else {
                t.last_used = t.last_used.max(now);
                Some(t.accept(nc))
            }
        };
        match accepted {
            Some(true) => Some(NonceCheck::Fresh),
            Some(false) => Some(NonceCheck::Replayed),
            None => {
                shard.drop_nonce(user, serial, &mut self.saves.lock());
                None
            }
        }
    }

    /// At most `most` of the states that left memory, for the store. They are still read
    /// from here until [`NonceTable::stored`] says they are there.
    pub fn take_saves(&self, most: usize) -> Vec<SavedNonce> {
        self.saves
            .lock()
            .pending
            .values()
            .take(most)
            .cloned()
            .collect()
    }

    /// These saves are in the store now: read them from there. A state saved again since (a
    /// higher `nc`) stays.
    pub fn stored(&self, saved: &[SavedNonce]) {
        let mut saves = self.saves.lock();
        for s in saved {
            let k = (s.user.clone(), s.id);
            if saves.pending.get(&k) == Some(s) {
                saves.pending.remove(&k);
            }
        }
    }

    /// Every tracked nonce out of memory into the saves: at a clean stop, so that the next run
    /// knows their `nc`.
    pub fn save_all(&self) {
        self.saves.lock().bound = usize::MAX;
        // Shard before saves, as on the request path.
        for shard in &self.shards {
            let mut shard = shard.lock();
            let mut saves = self.saves.lock();
            let users: Vec<(String, Vec<u64>)> = shard
                .users
                .iter()
                .map(|(n, u)| (n.clone(), u.live.keys().copied().collect()))
                .collect();
            for (name, serials) in users {
                for s in serials {
                    shard.drop_nonce(&name, s, &mut saves);
                }
            }
        }
    }

    /// Hand the saves the `nc` of every tracked nonce used since the last checkpoint,
    /// keeping them tracked: after a crash, the next run knows them up to then.
    pub fn checkpoint(&self) {
        for shard in &self.shards {
            let mut shard = shard.lock();
            let mut saves = self.saves.lock();
            for (name, u) in shard.users.iter_mut() {
                for (serial, t) in u.live.iter_mut().filter(|(_, t)| t.max > t.saved_max) {
                    t.saved_max = t.max;
                    saves.put(SavedNonce {
                        user: name.clone(),
                        id: nonce_id(t.key, *serial),
                        issued: t.issued,
                        max: t.max,
                    });
                }
            }
        }
    }

    /// Longest life of a nonce, for pruning saved states.
    pub fn lifetime_secs(&self) -> u64 {
        self.limits.lifetime_secs
    }

    #[cfg(test)]
    /// Nonces tracked now, over all users.
    pub(crate) fn tracked(&self) -> usize {
        self.shards.iter().map(|s| s.lock().tracked).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(capacity: usize, per_user: usize) -> NonceLimits {
        NonceLimits {
            ttl_secs: 300,
            idle_secs: 3600,
            lifetime_secs: 30 * 86_400,
            capacity,
            per_user,
        }
    }

    /// Keys, and saved states by record key.
    type Held = (Vec<NonceKey>, crate::FastMap<String, Vec<u8>>);

    /// A vault over a map, as the store is: keys and saved states.
    #[derive(Default, Clone)]
    struct MapVault(std::sync::Arc<Mutex<Held>>);

    impl MapVault {
        fn store(&self, t: &NonceTable) {
            let saves = t.take_saves(usize::MAX);
            let mut v = self.0.lock();
            for s in &saves {
                v.1.insert(SavedNonce::record_key(&s.user, &s.id), s.value());
            }
            drop(v);
            t.stored(&saves);
        }
    }

    impl NonceVault for MapVault {
        fn key(&self, id: [u8; 4]) -> Option<[u8; 32]> {
            self.0.lock().0.iter().find(|(i, _)| *i == id).map(|k| k.1)
        }
        fn saved(&self, user: &str, id: &[u8; 12]) -> Option<(u64, u64)> {
            let v = self.0.lock();
            SavedNonce::parse_value(v.1.get(&SavedNonce::record_key(user, id))?)
        }
    }

    #[test]
    fn fresh_then_replay_then_window() {
        let t = NonceTable::new(limits(100, 10));
        let n = t.issue();
        assert_eq!(t.check("ann", &n, "00000001"), NonceCheck::Fresh);
        assert_eq!(t.check("ann", &n, "00000001"), NonceCheck::Replayed);
        assert_eq!(t.check("ann", &n, "00000003"), NonceCheck::Fresh);
        // Out of order but unseen: accepted once.
        assert_eq!(t.check("ann", &n, "00000002"), NonceCheck::Fresh);
        assert_eq!(t.check("ann", &n, "00000002"), NonceCheck::Replayed);
        assert_eq!(t.check("ann", &n, "00000100"), NonceCheck::Fresh);
        // Too far behind the window.
        assert_eq!(t.check("ann", &n, "00000004"), NonceCheck::Replayed);
        assert_eq!(t.check("ann", &n, "zz"), NonceCheck::Replayed);
        // Another user's use of the same nonce is tracked apart (its hashes differ).
        assert_eq!(t.check("bob", &n, "00000001"), NonceCheck::Fresh);
        // nc counts from 1 (RFC 7616): zero is no count.
        let m = t.issue();
        assert_eq!(t.check("ann", &m, "00000000"), NonceCheck::Replayed);
        assert_eq!(t.check("ann", &m, "00000001"), NonceCheck::Fresh);
    }

    /// A nonce evicted from a full table once came back as a first use,
    /// so a captured request could be replayed. Now its highest nc goes to the saves when
    /// it is pushed out: the captured request is still a replay, and the client's next nc
    /// still passes (a client that never asks for a new nonce keeps working).
    #[test]
    fn an_evicted_nonce_keeps_its_nc() {
        let t = NonceTable::new(limits(10_000, 4));
        let captured = t.issue();
        assert_eq!(t.check("admin", &captured, "00000001"), NonceCheck::Fresh);
        assert_eq!(t.check("admin", &captured, "00000002"), NonceCheck::Fresh);
        // The same user's other clients push it out of the user's four places.
        for _ in 0..10 {
            let n = t.issue();
            assert_eq!(t.check("admin", &n, "00000001"), NonceCheck::Fresh);
        }
        assert!(t.tracked() <= 4);
        assert_eq!(
            t.check("admin", &captured, "00000001"),
            NonceCheck::Replayed
        );
        assert_eq!(
            t.check("admin", &captured, "00000002"),
            NonceCheck::Replayed
        );
        assert_eq!(t.check("admin", &captured, "00000003"), NonceCheck::Fresh);
        assert_eq!(
            t.check("admin", &captured, "00000003"),
            NonceCheck::Replayed
        );
    }

    /// Saves lost (past their bound) before the store had them: this run's nonce below the
    /// floor is stale, never new.
    #[test]
    fn a_nonce_whose_save_was_lost_is_stale_not_new() {
        let t = NonceTable::new(limits(10_000, 1));
        t.saves.lock().bound = 1;
        let a = t.issue();
        assert_eq!(t.check("u", &a, "1"), NonceCheck::Fresh);
        let b = t.issue();
        assert_eq!(t.check("u", &b, "1"), NonceCheck::Fresh);
        let c = t.issue();
        // Pushes b out; its save pushes a's out of the bounded saves.
        assert_eq!(t.check("u", &c, "1"), NonceCheck::Fresh);
        assert_eq!(t.check("u", &a, "2"), NonceCheck::Stale);
        assert_eq!(t.check("u", &a, "1"), NonceCheck::Stale);
    }

    /// Many users, each within their own bound, fill the table: the total stays bounded,
    /// and no nc passes twice, whether its nonce stayed or left.
    #[test]
    fn the_total_is_bounded_and_eviction_stays_safe() {
        let vault = MapVault::default();
        let t = NonceTable::with_key(limits(64, 1_000), new_key(), Box::new(vault.clone()));
        let mut used = Vec::new();
        for i in 0..2_000 {
            if i % 100 == 0 {
                vault.store(&t);
            }
            let user = format!("user{}", i % 50);
            let n = t.issue();
            assert_eq!(t.check(&user, &n, "1"), NonceCheck::Fresh);
            used.push((user, n));
        }
        assert!(t.tracked() <= 64 + SHARDS, "tracked {}", t.tracked());
        vault.store(&t);
        for (i, (user, n)) in used.iter().enumerate() {
            if i % 100 == 0 {
                vault.store(&t);
            }
            assert_ne!(t.check(user, n, "1"), NonceCheck::Fresh, "{user}");
            assert_eq!(t.check(user, n, "2"), NonceCheck::Fresh, "{user}");
            assert_ne!(t.check(user, n, "2"), NonceCheck::Fresh, "{user}");
        }
    }

    /// One user's flood of nonces evicts only that user's own.
    #[test]
    fn one_users_flood_does_not_evict_anothers_nonce() {
        let t = NonceTable::new(limits(100_000, 8));
        let mine = t.issue();
        assert_eq!(t.check("koop", &mine, "1"), NonceCheck::Fresh);
        for _ in 0..10_000 {
            let n = t.issue();
            t.check("mallory", &n, "1");
        }
        assert_eq!(t.check("koop", &mine, "2"), NonceCheck::Fresh);
        assert!(t.tracked() <= 9, "tracked {}", t.tracked());
    }

    /// A nonce in use stays valid while its nc grows, past the first-use limit; one left
    /// unused past the idle limit leaves memory and is still good with a higher nc, until
    /// its lifetime ends.
    #[test]
    fn a_nonce_lives_its_lifetime_idle_or_not() {
        let t = NonceTable::new(NonceLimits {
            ttl_secs: 10,
            idle_secs: 60,
            lifetime_secs: 10_000,
            capacity: 100,
            per_user: 10,
        });
        let n = t.issue_at(1_000);
        assert_eq!(t.check_at("ann", &n, "1", 1_005), NonceCheck::Fresh);
        let mut at = 1_005;
        for nc in 2..100u64 {
            at += 50;
            assert_eq!(
                t.check_at("ann", &n, &format!("{nc:x}"), at),
                NonceCheck::Fresh
            );
        }
        // A quiet night (past the idle limit): the next nc passes, an old one does not.
        at += 3_000;
        assert_eq!(t.check_at("ann", &n, "100", at), NonceCheck::Fresh);
        assert_eq!(t.check_at("ann", &n, "63", at + 1), NonceCheck::Replayed);
        // Past its lifetime: stale, so the client asks again.
        assert_eq!(t.check_at("ann", &n, "101", 11_000), NonceCheck::Stale);
        // First use past the first-use limit.
        let late = t.issue_at(2_000);
        assert_eq!(t.check_at("ann", &late, "1", 2_010), NonceCheck::Stale);
    }

    /// A restart: a new table with the same key (read from the store) takes the old run's
    /// nonces; a nonce saved at the clean stop goes on from its nc, one never saved (a crash)
    /// is taken at the nc it comes with and nothing below passes after.
    #[test]
    fn nonces_outlive_a_restart_with_their_nc() {
        let vault = MapVault::default();
        let key = new_key();
        vault.0.lock().0.push(key);
        let before = NonceTable::with_key(limits(100, 10), key, Box::new(vault.clone()));
        let kept = before.issue();
        let crashed = before.issue();
        for nc in 1..=5 {
            assert_eq!(
                before.check("koop", &kept, &format!("{nc:x}")),
                NonceCheck::Fresh
            );
        }
        assert_eq!(before.check("koop", &crashed, "9"), NonceCheck::Fresh);
        before.save_all();
        let saves = before.take_saves(usize::MAX);
        // Only `kept` reaches the store; `crashed`'s save is lost with its process.
        let kept_save: Vec<SavedNonce> = saves.into_iter().filter(|s| s.max == 5).collect();
        {
            let mut v = vault.0.lock();
            for s in &kept_save {
                v.1.insert(SavedNonce::record_key(&s.user, &s.id), s.value());
            }
        }
        let after = NonceTable::with_key(limits(100, 10), key, Box::new(vault.clone()));
        assert_eq!(after.check("koop", &kept, "5"), NonceCheck::Replayed);
        assert_eq!(after.check("koop", &kept, "6"), NonceCheck::Fresh);
        assert_eq!(after.check("koop", &crashed, "a"), NonceCheck::Fresh);
        assert_eq!(after.check("koop", &crashed, "9"), NonceCheck::Replayed);
        assert_eq!(after.check("koop", &crashed, "b"), NonceCheck::Fresh);
        // Another node's table (its own key, the first one in the vault too) takes them.
        let other_key = new_key();
        let node_b = NonceTable::with_key(limits(100, 10), other_key, Box::new(vault.clone()));
        assert_eq!(node_b.check("koop", &kept, "7"), NonceCheck::Fresh);
        // A nonce of a key nobody saved is stale.
        let stranger = NonceTable::new(limits(100, 10));
        assert_eq!(
            after.check("koop", &stranger.issue(), "1"),
            NonceCheck::Stale
        );
        // Saves that reached the store are read from there.
        after.save_all();
        vault.store(&after);
        assert!(after.take_saves(usize::MAX).is_empty());
        assert_eq!(after.check("koop", &kept, "6"), NonceCheck::Replayed);
        assert_eq!(after.check("koop", &kept, "8"), NonceCheck::Fresh);
    }

    /// A checkpoint hands out the nonces used since the last one, and they stay tracked.
    #[test]
    fn a_checkpoint_saves_what_was_used_since() {
        let t = NonceTable::new(limits(100, 10));
        let (a, b) = (t.issue(), t.issue());
        assert_eq!(t.check("u", &a, "3"), NonceCheck::Fresh);
        assert_eq!(t.check("u", &b, "1"), NonceCheck::Fresh);
        t.checkpoint();
        let mut got: Vec<u64> = t.take_saves(usize::MAX).iter().map(|s| s.max).collect();
        got.sort();
        assert_eq!(got, [1, 3]);
        t.stored(&t.take_saves(usize::MAX));
        assert_eq!(t.check("u", &a, "4"), NonceCheck::Fresh);
        t.checkpoint();
        let saves = t.take_saves(usize::MAX);
        assert_eq!(saves.len(), 1);
        assert_eq!(saves[0].max, 4);
        assert_eq!(t.tracked(), 2);
        assert_eq!(t.check("u", &a, "4"), NonceCheck::Replayed);
    }

    #[test]
    fn foreign_and_forged_nonces_are_stale() {
        let t = NonceTable::new(limits(100, 10));
        let other = NonceTable::new(limits(100, 10));
        // Another process's key, which the store does not have: stale, so the client retries.
        assert_eq!(t.check("ann", &other.issue(), "1"), NonceCheck::Stale);
        assert_eq!(t.check("ann", "not-base64!", "1"), NonceCheck::Stale);
        assert_eq!(t.check("ann", "", "1"), NonceCheck::Stale);
        // A tracked nonce's serial with another MAC is not that nonce.
        let n = t.issue();
        assert_eq!(t.check("ann", &n, "1"), NonceCheck::Fresh);
        let (mut raw, ..) = decode(&n).unwrap();
        raw[RAW_LEN - 1] ^= 1;
        assert_eq!(
            t.check("ann", &URL_SAFE_NO_PAD.encode(raw), "2"),
            NonceCheck::Stale
        );
        assert_eq!(t.check("ann", &n, "2"), NonceCheck::Fresh);
        // Our key id with a forged MAC, untracked: stale.
        let m = t.issue();
        let (mut raw, ..) = decode(&m).unwrap();
        raw[RAW_LEN - 2] ^= 1;
        assert_eq!(
            t.check("ann", &URL_SAFE_NO_PAD.encode(raw), "1"),
            NonceCheck::Stale
        );
    }

    /// Serials grow, so nonces issued concurrently are distinct and ordered.
    #[test]
    fn serials_grow() {
        let t = NonceTable::new(limits(100, 10));
        let serials: Vec<u64> = (0..100).map(|_| decode(&t.issue()).unwrap().2).collect();
        assert!(serials.windows(2).all(|w| w[0] < w[1]), "{serials:?}");
    }
}
