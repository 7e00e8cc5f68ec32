//! Digest nonces: issued with a timestamp and a MAC so they can be checked without state,
//! and tracked in a bounded table once used, so a replayed `nc` is refused.
//!
//! A nonce is `base64url(issued_secs[8] || random[8] || hmac_sha256(secret, first 16)[..12])`.
//! The replay table keeps, per nonce, the highest `nc` seen and a 64-bit window below it, as
//! IPsec does: clients that share a nonce across parallel connections may send `nc` values
//! slightly out of order, and those still pass, but no value passes twice.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use parking_lot::Mutex;
use sha2::Sha256;

const SHARDS: usize = 16;
/// A character of the nonce's text drawn only from its random bytes: base64 character 12
/// holds bits 72..78, inside bytes 8..16.
const RANDOM_CHAR: usize = 12;

/// What the table says about a nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonceCheck {
    /// Ours, fresh, and this `nc` is new.
    Fresh,
    /// Ours (or once ours) but expired: the client should retry with a new one.
    Stale,
    /// This `nc` was already used with this nonce.
    Replayed,
    /// Not a nonce this service issued.
    Unknown,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    issued: u64,
    max: u64,
    /// Bit i set = `max - i` seen.
    seen: u64,
}

impl Window {
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

pub struct NonceTable {
    /// The MAC key; random per process, so a restart makes old nonces stale, not valid.
    secret: [u8; 32],
    ttl_secs: u64,
    /// Most tracked nonces per shard (the configured capacity split across shards).
    shard_capacity: usize,
    shards: Vec<Shard>,
}

/// Nonces by text. Only nonces this process issued and authenticated are ever inserted, so a
/// client cannot choose keys to collide.
type Shard = Mutex<crate::FastMap<String, Window>>;

/// The shard for a URL-safe base64 character: its six-bit value, modulo the shard count (the
/// ASCII code modulo 16 would be uneven: the alphabet's runs do not start on multiples of 16).
fn shard_of(c: u8) -> usize {
    let value = match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'-' => 62,
        b'_' => 63,
        _ => 0,
    };
    value as usize % SHARDS
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl NonceTable {
    pub fn new(ttl_secs: u64, capacity: usize) -> NonceTable {
        let mut secret = [0u8; 32];
        rand::fill(&mut secret);
        NonceTable {
            secret,
            ttl_secs,
            shard_capacity: capacity.div_ceil(SHARDS).max(1),
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
        }
    }

    fn mac(&self, data: &[u8]) -> [u8; 12] {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.secret)
            .expect("HMAC takes a key of any length");
        m.update(data);
        let full = m.finalize().into_bytes();
        let mut out = [0u8; 12];
        out.copy_from_slice(&full[..12]);
        out
    }

    /// A new nonce for a challenge.
    pub fn issue(&self) -> String {
        self.issue_at(now_secs())
    }

    fn issue_at(&self, issued: u64) -> String {
        let mut raw = [0u8; 28];
        raw[..8].copy_from_slice(&issued.to_be_bytes());
        rand::fill(&mut raw[8..16]);
        let mac = self.mac(&raw[..16]);
        raw[16..].copy_from_slice(&mac);
        URL_SAFE_NO_PAD.encode(raw)
    }

    fn shard(&self, nonce: &str) -> &Shard {
        // Character RANDOM_CHAR of an issued nonce encodes six of its random bits, and 16
        // divides 64, so the shards fill evenly without hashing the whole string. Anything
        // else (too short, not ours) only has to land somewhere.
        let c = nonce.as_bytes().get(RANDOM_CHAR).copied().unwrap_or(0);
        &self.shards[shard_of(c)]
    }

    /// Decode and authenticate a nonce; its issue time if it is ours.
    fn issued_at(&self, nonce: &str) -> Option<u64> {
        let raw = URL_SAFE_NO_PAD.decode(nonce).ok()?;
        if raw.len() != 28 {
            return None;
        }
        let mac = self.mac(&raw[..16]);
        if !super::digest::constant_time_eq(&mac, &raw[16..]) {
            return None;
        }
        Some(u64::from_be_bytes(raw[..8].try_into().ok()?))
    }

    /// Check a nonce and record its `nc` (hex, as sent). Call only after the response hash
    /// matched, so a forger cannot burn a client's `nc` values.
    pub fn check(&self, nonce: &str, nc_hex: &str) -> NonceCheck {
        self.check_at(nonce, nc_hex, now_secs())
    }

    fn check_at(&self, nonce: &str, nc_hex: &str, now: u64) -> NonceCheck {
        let Ok(nc) = u64::from_str_radix(nc_hex, 16) else {
            return NonceCheck::Replayed;
        };
        let mut shard = self.shard(nonce).lock();
        if let Some(w) = shard.get_mut(nonce) {
            if now >= w.issued.saturating_add(self.ttl_secs) {
                shard.remove(nonce);
                return NonceCheck::Stale;
            }
            return if w.accept(nc) {
                NonceCheck::Fresh
            } else {
                NonceCheck::Replayed
            };
        }
        // First use: authenticate it (the only HMAC on the path).
        drop(shard);
        let Some(issued) = self.issued_at(nonce) else {
            return NonceCheck::Unknown;
        };
        if now >= issued.saturating_add(self.ttl_secs) {
            return NonceCheck::Stale;
        }
        let mut shard = self.shard(nonce).lock();
        if shard.len() >= self.shard_capacity {
            let ttl = self.ttl_secs;
            shard.retain(|_, w| now < w.issued.saturating_add(ttl));
            if shard.len() >= self.shard_capacity {
                // Still full of live nonces: drop the oldest; its client gets stale=true.
                if let Some(oldest) = shard
                    .iter()
                    .min_by_key(|(_, w)| w.issued)
                    .map(|(k, _)| k.clone())
                {
                    shard.remove(&oldest);
                }
            }
        }
        let w = shard.entry(nonce.to_string()).or_insert(Window {
            issued,
            max: 0,
            seen: 0,
        });
        if w.accept(nc) {
            NonceCheck::Fresh
        } else {
            NonceCheck::Replayed
        }
    }

    pub fn tracked(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_then_replay_then_window() {
        let t = NonceTable::new(60, 100);
        let n = t.issue();
        assert_eq!(t.check(&n, "00000001"), NonceCheck::Fresh);
        assert_eq!(t.check(&n, "00000001"), NonceCheck::Replayed);
        assert_eq!(t.check(&n, "00000003"), NonceCheck::Fresh);
        // Out of order but unseen: accepted once.
        assert_eq!(t.check(&n, "00000002"), NonceCheck::Fresh);
        assert_eq!(t.check(&n, "00000002"), NonceCheck::Replayed);
        assert_eq!(t.check(&n, "00000100"), NonceCheck::Fresh);
        // Too far behind the window.
        assert_eq!(t.check(&n, "00000004"), NonceCheck::Replayed);
        assert_eq!(t.check(&n, "zz"), NonceCheck::Replayed);
    }

    #[test]
    fn expired_is_stale_and_forged_is_unknown() {
        let t = NonceTable::new(10, 100);
        let old = t.issue_at(now_secs() - 11);
        assert_eq!(t.check(&old, "1"), NonceCheck::Stale);
        let n = t.issue_at(1000);
        assert_eq!(t.check_at(&n, "1", 1005), NonceCheck::Fresh);
        assert_eq!(t.check_at(&n, "2", 1010), NonceCheck::Stale);
        let other = NonceTable::new(10, 100);
        assert_eq!(t.check(&other.issue(), "1"), NonceCheck::Unknown);
        assert_eq!(t.check("not-base64!", "1"), NonceCheck::Unknown);
    }

    /// The shard is picked from one character of the nonce, so that character must be random
    /// and map evenly: 16,000 issued nonces give each shard 1,000 ± 20%.
    #[test]
    fn nonces_spread_evenly_over_the_shards() {
        let t = NonceTable::new(600, 100);
        let mut counts = [0usize; SHARDS];
        for _ in 0..16_000 {
            let n = t.issue();
            let shard = t.shard(&n) as *const _;
            let i = t
                .shards
                .iter()
                .position(|s| std::ptr::eq(s, shard))
                .unwrap();
            counts[i] += 1;
        }
        for (i, &n) in counts.iter().enumerate() {
            assert!(
                (800..=1200).contains(&n),
                "shard {i}: {n} of 16000 ({counts:?})"
            );
        }
        // Every character of the alphabet has a shard; anything else still lands in one.
        for c in 0..=255u8 {
            assert!(shard_of(c) < SHARDS);
        }
        // Exactly: the 64 characters give each shard four.
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut per_shard = [0usize; SHARDS];
        for &c in alphabet {
            per_shard[shard_of(c)] += 1;
        }
        assert_eq!(per_shard, [4; SHARDS]);
    }

    #[test]
    fn table_is_bounded() {
        let t = NonceTable::new(600, 32);
        for _ in 0..1000 {
            let n = t.issue();
            assert_eq!(t.check(&n, "1"), NonceCheck::Fresh);
        }
        assert!(t.tracked() <= 32, "tracked {}", t.tracked());
    }
}
