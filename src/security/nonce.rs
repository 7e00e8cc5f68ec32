//! Digest nonces: issued with a timestamp, a serial and a MAC so they can be checked without
//! state until first used, then tracked per user so that no `nc` is accepted twice.
//!
//! A nonce is `base64url(issued_secs[8] || serial[8] || random[4] || hmac_sha256(secret,
//! first 20)[..12])`. Once used, a nonce is tracked under its user with the highest `nc` seen
//! and a 64-bit window below it, as IPsec does: clients that share a nonce across parallel
//! connections may send `nc` values slightly out of order, and those still pass, but no value
//! passes twice.
//!
//! Replay safety does not depend on the table's size. Each user has a floor: when one of the
//! user's nonces leaves the table before it expired, the floor rises to its serial, and a
//! nonce at or below the floor that is not tracked is stale, never new. Serials only grow, so
//! an evicted nonce can never come back as a first use. A nonce in use stays valid while it is
//! used (long-lived clients keep their first nonce); it expires after `idle_secs` without use,
//! and an issued nonce must be used within `ttl_secs`. A nonce that fails the MAC (another
//! process's, or this one's before a restart) is stale too, so the client retries at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use parking_lot::Mutex;
use sha2::Sha256;

const SHARDS: usize = 16;
/// Bytes of a nonce: issue time, serial, random, MAC.
const RAW_LEN: usize = 32;
const MAC_LEN: usize = 12;

/// What the table says about a nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonceCheck {
    /// Ours, live, and this `nc` is new.
    Fresh,
    /// Expired, evicted, or not ours (another process, a restart): the client should retry
    /// with a new nonce, which the 401 carries.
    Stale,
    /// This `nc` was already used with this nonce.
    Replayed,
}

/// The bounds of the table (`nonce_*` settings).
#[derive(Debug, Clone, Copy)]
pub struct NonceLimits {
    /// Longest wait from a challenge to the first use of its nonce.
    pub ttl_secs: u64,
    /// Longest time a nonce in use may go unused before it expires; at least `ttl_secs`.
    pub idle_secs: u64,
    /// Most nonces tracked in all.
    pub capacity: usize,
    /// Most nonces tracked for one user; past it the user's least recently used goes.
    pub per_user: usize,
}

/// One tracked nonce.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    /// The nonce's MAC, telling it apart from a nonce of the same serial made up by a client.
    mac: [u8; MAC_LEN],
    issued: u64,
    last_used: u64,
    /// Highest `nc` accepted.
    max: u64,
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

/// One user's nonces.
#[derive(Debug, Default)]
struct UserNonces {
    /// By serial.
    live: crate::FastMap<u64, Tracked>,
    /// Serials at or below this that are not in `live` are stale: they left it unexpired.
    floor: u64,
    /// The issue time of the floor's nonce: once `ttl_secs` past it, every nonce at or below
    /// the floor is too old for a first use anyway, and the floor can go.
    floor_issued: u64,
}

impl UserNonces {
    /// Drop `serial`, raising the floor when the nonce could otherwise come back.
    fn drop_nonce(&mut self, serial: u64, now: u64, ttl: u64) {
        let Some(t) = self.live.remove(&serial) else {
            return;
        };
        if now < t.issued.saturating_add(ttl) && serial > self.floor {
            self.floor = serial;
            self.floor_issued = t.issued;
        }
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

#[derive(Default)]
struct Shard {
    users: crate::FastMap<String, UserNonces>,
    /// Nonces tracked in this shard, over all its users.
    tracked: usize,
}

impl Shard {
    fn drop_nonce(&mut self, user: &str, serial: u64, now: u64, ttl: u64) {
        if let Some(u) = self.users.get_mut(user) {
            let before = u.live.len();
            u.drop_nonce(serial, now, ttl);
            self.tracked -= before - u.live.len();
        }
    }

    /// Make room for one more nonce: drop expired ones, then, if the shard is still nearly
    /// full, the least recently used nonces of its largest users until it is well below its
    /// bound (so that a sweep comes at most every eighth of the bound).
    fn make_room(&mut self, capacity: usize, now: u64, limits: &NonceLimits) {
        if self.tracked < capacity {
            return;
        }
        let (ttl, idle) = (limits.ttl_secs, limits.idle_secs);
        for u in self.users.values_mut() {
            let expired: Vec<u64> = u
                .live
                .iter()
                .filter(|(_, t)| now >= t.last_used.saturating_add(idle))
                .map(|(s, _)| *s)
                .collect();
            for s in expired {
                u.drop_nonce(s, now, ttl);
            }
        }
        self.users.retain(|_, u| !u.is_moot(now, ttl));
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
            self.drop_nonce(&name, serial, now, ttl);
        }
    }
}

pub struct NonceTable {
    /// The MAC key; random per process, so a restart makes old nonces stale, not valid.
    secret: [u8; 32],
    limits: NonceLimits,
    /// Most nonces tracked per shard (the capacity split across shards).
    shard_capacity: usize,
    next_serial: AtomicU64,
    /// Picks a user's shard.
    hasher: foldhash::fast::RandomState,
    shards: Vec<Mutex<Shard>>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A nonce's parts: issue time, serial, MAC.
fn decode(nonce: &str) -> Option<([u8; RAW_LEN], u64, u64, [u8; MAC_LEN])> {
    let mut raw = [0u8; RAW_LEN];
    let n = URL_SAFE_NO_PAD.decode_slice(nonce, &mut raw).ok()?;
    if n != RAW_LEN {
        return None;
    }
    let issued = u64::from_be_bytes(raw[..8].try_into().ok()?);
    let serial = u64::from_be_bytes(raw[8..16].try_into().ok()?);
    let mac = raw[RAW_LEN - MAC_LEN..].try_into().ok()?;
    Some((raw, issued, serial, mac))
}

impl NonceTable {
    pub fn new(limits: NonceLimits) -> NonceTable {
        let mut secret = [0u8; 32];
        rand::fill(&mut secret);
        let limits = NonceLimits {
            idle_secs: limits.idle_secs.max(limits.ttl_secs),
            capacity: limits.capacity.max(1),
            per_user: limits.per_user.max(1),
            ..limits
        };
        NonceTable {
            secret,
            shard_capacity: limits.capacity.div_ceil(SHARDS).max(2),
            limits,
            next_serial: AtomicU64::new(1),
            hasher: Default::default(),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    fn mac(&self, data: &[u8]) -> [u8; MAC_LEN] {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.secret)
            .expect("HMAC takes a key of any length");
        m.update(data);
        let full = m.finalize().into_bytes();
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&full[..MAC_LEN]);
        out
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
        rand::fill(&mut raw[16..20]);
        let mac = self.mac(&raw[..RAW_LEN - MAC_LEN]);
        raw[RAW_LEN - MAC_LEN..].copy_from_slice(&mac);
        URL_SAFE_NO_PAD.encode(raw)
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
        let Some((raw, issued, serial, mac)) = decode(nonce) else {
            return NonceCheck::Stale;
        };
        let Ok(nc) = u64::from_str_radix(nc_hex, 16) else {
            return NonceCheck::Replayed;
        };
        let NonceLimits {
            ttl_secs,
            idle_secs,
            ..
        } = self.limits;
        let shard = self.shard(user);
        if let Some(check) = self.check_tracked(&mut shard.lock(), user, serial, &mac, nc, now) {
            return check;
        }
        // Not tracked: a first use. Authenticate it (the only HMAC on the path).
        let ours = self.mac(&raw[..RAW_LEN - MAC_LEN]);
        if !super::digest::constant_time_eq(&ours, &mac) || now >= issued.saturating_add(ttl_secs) {
            return NonceCheck::Stale;
        }
        let mut shard = shard.lock();
        // Another request of the same client may have got here first.
        if let Some(check) = self.check_tracked(&mut shard, user, serial, &mac, nc, now) {
            return check;
        }
        shard.make_room(self.shard_capacity, now, &self.limits);
        let shard = &mut *shard;
        let u = shard.users.entry(user.to_string()).or_default();
        if now >= u.floor_issued.saturating_add(ttl_secs) {
            u.floor = 0;
        }
        if serial <= u.floor {
            return NonceCheck::Stale;
        }
        if u.live.len() >= self.limits.per_user
            && let Some(lru) = u.least_recent()
        {
            u.drop_nonce(lru, now, ttl_secs);
            shard.tracked -= 1;
        }
        let mut t = Tracked {
            mac,
            issued,
            last_used: now,
            max: 0,
            seen: 0,
        };
        let fresh = t.accept(nc);
        u.live.insert(serial, t);
        shard.tracked += 1;
        debug_assert!(idle_secs >= ttl_secs);
        if fresh {
            NonceCheck::Fresh
        } else {
            NonceCheck::Replayed
        }
    }

    /// The answer for a nonce the user already uses; `None` when it is not tracked.
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
                // Same serial, another MAC: not the nonce we issued.
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
        Some(match accepted {
            Some(true) => NonceCheck::Fresh,
            Some(false) => NonceCheck::Replayed,
            None => {
                shard.drop_nonce(user, serial, now, self.limits.ttl_secs);
                NonceCheck::Stale
            }
        })
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
            capacity,
            per_user,
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
    }

    /// The finding of issue 33: a nonce evicted from a full table came back as a first use,
    /// so a captured request could be replayed. Now it is stale, whatever evicted it.
    #[test]
    fn an_evicted_nonce_is_stale_not_new() {
        let t = NonceTable::new(limits(10_000, 4));
        let captured = t.issue();
        assert_eq!(t.check("admin", &captured, "00000001"), NonceCheck::Fresh);
        // The same user's other clients push it out of the user's four places.
        for _ in 0..10 {
            let n = t.issue();
            assert_eq!(t.check("admin", &n, "00000001"), NonceCheck::Fresh);
        }
        assert!(t.tracked() <= 4);
        assert_eq!(t.check("admin", &captured, "00000001"), NonceCheck::Stale);
        assert_eq!(t.check("admin", &captured, "00000002"), NonceCheck::Stale);
        // Nonces issued before the eviction and never used are stale too (they retry);
        // nonces issued after it are fresh.
        let later = t.issue();
        assert_eq!(t.check("admin", &later, "00000001"), NonceCheck::Fresh);
    }

    /// Many users, each within their own bound, fill the table: the total stays bounded,
    /// and still nothing evicted comes back.
    #[test]
    fn the_total_is_bounded_and_eviction_stays_safe() {
        let t = NonceTable::new(limits(64, 1_000));
        let mut used = Vec::new();
        for i in 0..2_000 {
            let user = format!("user{}", i % 50);
            let n = t.issue();
            assert_eq!(t.check(&user, &n, "1"), NonceCheck::Fresh);
            used.push((user, n));
        }
        assert!(t.tracked() <= 64 + SHARDS, "tracked {}", t.tracked());
        let mut replayed_fresh = 0;
        for (user, n) in &used {
            // A new nc on an old nonce: only a tracked (never evicted) one may pass.
            if t.check(user, n, "2") == NonceCheck::Fresh {
                replayed_fresh += 1;
            }
            assert_ne!(t.check(user, n, "1"), NonceCheck::Fresh, "{user}");
        }
        assert!(replayed_fresh <= 64 + SHARDS, "{replayed_fresh}");
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
    /// unused for the idle limit expires.
    #[test]
    fn a_nonce_in_use_lives_until_it_idles() {
        let t = NonceTable::new(NonceLimits {
            ttl_secs: 10,
            idle_secs: 60,
            capacity: 100,
            per_user: 10,
        });
        let n = t.issue_at(1_000);
        assert_eq!(t.check_at("ann", &n, "1", 1_005), NonceCheck::Fresh);
        // Every 50 s, for far longer than the first-use limit.
        let mut at = 1_005;
        for nc in 2..100u64 {
            at += 50;
            assert_eq!(
                t.check_at("ann", &n, &format!("{nc:x}"), at),
                NonceCheck::Fresh,
                "nc {nc} at {at}"
            );
        }
        // Idle for the whole limit, counted in whole seconds: still in use; a second more,
        // stale.
        assert_eq!(t.check_at("ann", &n, "100", at + 60), NonceCheck::Fresh);
        assert_eq!(t.check_at("ann", &n, "101", at + 121), NonceCheck::Stale);
        assert_eq!(t.check_at("ann", &n, "102", at + 122), NonceCheck::Stale);
        // First use past the first-use limit.
        let late = t.issue_at(2_000);
        assert_eq!(t.check_at("ann", &late, "1", 2_010), NonceCheck::Stale);
    }

    #[test]
    fn foreign_and_forged_nonces_are_stale() {
        let t = NonceTable::new(limits(100, 10));
        let other = NonceTable::new(limits(100, 10));
        // Another process's (or this one's before a restart): stale, so the client retries.
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
    }

    /// Serials grow, so nonces issued concurrently are distinct and ordered.
    #[test]
    fn serials_grow() {
        let t = NonceTable::new(limits(100, 10));
        let serials: Vec<u64> = (0..100).map(|_| decode(&t.issue()).unwrap().2).collect();
        assert!(serials.windows(2).all(|w| w[0] < w[1]), "{serials:?}");
    }
}
