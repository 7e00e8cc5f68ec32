//! Failed authentications, counted in one-minute windows per client address and per user,
//! so that guessing a password takes minutes a thousand guesses.
//!
//! A client address past its limit is refused (429) before its credentials are checked, for
//! the rest of the window; so is any request naming a user past the user limit, from
//! anywhere. The user limit is the higher one, so that one address cannot lock a user out.
//! IPv6 addresses count by their /64, which one client usually holds whole. Only users that
//! exist are counted by name (a client cannot fill the table with made-up names), and each
//! table is bounded: when it is full of live windows, new keys go uncounted until a window
//! ends (a flood of addresses fails open rather than growing memory).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Most keys each table tracks.
const MAX_KEYS: usize = 65_536;
/// The window, in seconds.
const WINDOW_SECS: u64 = 60;

/// The limits, per window (`auth_failures_per_*` settings); 0 = none.
#[derive(Debug, Clone, Copy)]
pub struct ThrottleLimits {
    pub per_address: u32,
    pub per_user: u32,
}

/// An address as counted: IPv4 whole, IPv6 by its /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum AddressKey {
    V4(u32),
    V6(u64),
}

impl AddressKey {
    fn of(addr: IpAddr) -> AddressKey {
        match addr {
            IpAddr::V4(a) => AddressKey::V4(a.into()),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => AddressKey::V4(v4.into()),
                None => AddressKey::V6((u128::from(a) >> 64) as u64),
            },
        }
    }
}

/// Failures per key in the current window of each.
struct Windows<K> {
    /// Key -> (window start, failures in it).
    counts: crate::FastMap<K, (u64, u32)>,
}

/// A table and the end of the latest window in which one of its keys reached the limit:
/// before that time nothing in it can be refused, and a check needs no lock.
struct Table<K> {
    windows: Mutex<Windows<K>>,
    hot_until: AtomicU64,
}

impl<K: std::hash::Hash + Eq> Table<K> {
    fn new() -> Self {
        Table {
            windows: Mutex::new(Windows::new()),
            hot_until: AtomicU64::new(0),
        }
    }

    fn refused<Q>(&self, key: &Q, limit: u32, now: u64) -> Option<u64>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        if limit == 0 || now >= self.hot_until.load(Ordering::Relaxed) {
            return None;
        }
        self.windows.lock().refused(key, limit, now)
    }

    fn fail(&self, key: K, limit: u32, now: u64) {
        if limit == 0 {
            return;
        }
        if let Some(end) = self.windows.lock().fail(key, limit, now) {
            self.hot_until.fetch_max(end, Ordering::Relaxed);
        }
    }
}

impl<K: std::hash::Hash + Eq> Windows<K> {
    fn new() -> Self {
        Windows {
            counts: Default::default(),
        }
    }

    /// Seconds until `key`'s window ends, when it has reached `limit` failures.
    fn refused<Q>(&self, key: &Q, limit: u32, now: u64) -> Option<u64>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        let (start, count) = *self.counts.get(key)?;
        let end = start + WINDOW_SECS;
        (limit > 0 && now < end && count >= limit).then(|| (end - now).max(1))
    }

    /// Count a failure; the end of its window when the key has now reached `limit`.
    fn fail(&mut self, key: K, limit: u32, now: u64) -> Option<u64> {
        if self.counts.len() >= MAX_KEYS && !self.counts.contains_key(&key) {
            self.counts
                .retain(|_, (start, _)| now < *start + WINDOW_SECS);
            if self.counts.len() >= MAX_KEYS {
                return None;
            }
        }
        let entry = self.counts.entry(key).or_insert((now, 0));
        if now >= entry.0 + WINDOW_SECS {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
        (entry.1 >= limit).then_some(entry.0 + WINDOW_SECS)
    }
}

pub struct Throttle {
    limits: ThrottleLimits,
    addresses: Table<AddressKey>,
    users: Table<String>,
}

impl Throttle {
    pub fn new(limits: ThrottleLimits) -> Throttle {
        Throttle {
            limits,
            addresses: Table::new(),
            users: Table::new(),
        }
    }

    /// Seconds to wait, when `addr` is past its limit.
    pub(crate) fn address_refused(&self, addr: Option<IpAddr>, now: u64) -> Option<u64> {
        self.addresses
            .refused(&AddressKey::of(addr?), self.limits.per_address, now)
    }

    /// Seconds to wait, when `user` is past its limit.
    pub(crate) fn user_refused(&self, user: &str, now: u64) -> Option<u64> {
        self.users.refused(user, self.limits.per_user, now)
    }

    /// Count a failure from `addr`, naming `user` when it exists.
    pub fn failed(&self, addr: Option<IpAddr>, user: Option<&str>, now: u64) {
        if let Some(addr) = addr {
            self.addresses
                .fail(AddressKey::of(addr), self.limits.per_address, now);
        }
        if let Some(user) = user {
            self.users.fail(user.to_string(), self.limits.per_user, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn an_address_past_its_limit_waits_for_the_window() {
        let t = Throttle::new(ThrottleLimits {
            per_address: 3,
            per_user: 100,
        });
        for _ in 0..3 {
            assert_eq!(t.address_refused(ip("10.0.0.1"), 1_000), None);
            t.failed(ip("10.0.0.1"), None, 1_000);
        }
        assert_eq!(t.address_refused(ip("10.0.0.1"), 1_000), Some(60));
        assert_eq!(t.address_refused(ip("10.0.0.1"), 1_059), Some(1));
        assert_eq!(t.address_refused(ip("10.0.0.2"), 1_000), None);
        // The same client over IPv4-mapped IPv6.
        assert_eq!(t.address_refused(ip("::ffff:10.0.0.1"), 1_030), Some(30));
        // The next window starts afresh.
        assert_eq!(t.address_refused(ip("10.0.0.1"), 1_060), None);
        t.failed(ip("10.0.0.1"), None, 1_060);
        assert_eq!(t.address_refused(ip("10.0.0.1"), 1_061), None);
    }

    #[test]
    fn ipv6_counts_by_its_64() {
        let t = Throttle::new(ThrottleLimits {
            per_address: 2,
            per_user: 0,
        });
        t.failed(ip("2001:db8:1:2::1"), None, 0);
        t.failed(ip("2001:db8:1:2:ffff::9"), None, 0);
        assert!(t.address_refused(ip("2001:db8:1:2::77"), 1).is_some());
        assert!(t.address_refused(ip("2001:db8:1:3::1"), 1).is_none());
    }

    #[test]
    fn users_count_from_every_address_and_zero_is_no_limit() {
        let t = Throttle::new(ThrottleLimits {
            per_address: 0,
            per_user: 2,
        });
        t.failed(ip("10.0.0.1"), Some("ann"), 5);
        t.failed(ip("10.0.0.2"), Some("ann"), 5);
        assert_eq!(t.user_refused("ann", 6), Some(59));
        assert_eq!(t.user_refused("bob", 6), None);
        assert_eq!(t.address_refused(ip("10.0.0.1"), 6), None);
    }

    #[test]
    fn the_tables_are_bounded() {
        let t = Throttle::new(ThrottleLimits {
            per_address: 1,
            per_user: 1,
        });
        for i in 0..(MAX_KEYS as u32 + 10) {
            t.failed(Some(IpAddr::V4(i.into())), None, 0);
        }
        assert_eq!(t.addresses.windows.lock().counts.len(), MAX_KEYS);
        // Once the window is over, room is made for new ones.
        t.failed(ip("192.168.0.1"), None, 61);
        assert_eq!(t.addresses.windows.lock().counts.len(), 1);
    }
}
