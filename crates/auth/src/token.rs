//! Bearer tokens, as ArcGIS clients get them from `generateToken` and send them back
//! (`token=`, `Authorization: Bearer`, `X-Esri-Authorization: Bearer`).
//!
//! A token is `name.expires.mac` (the name in unpadded base64url, the expiry in milliseconds
//! since the epoch), the MAC an HMAC-SHA256 under a key derived from the nonce key (kept in
//! the store, so tokens outlive a restart and hold on every node) over the name, the expiry,
//! the user's role bits and its HA1. Nothing is kept per token: a password or role change
//! ends every token of the user, and so does its removal.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use geoshard_core::time::now_ms;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::*;

/// The longest life a token is given, in minutes (ArcGIS Server's default maximum: 15 days).
pub const MAX_TOKEN_MINUTES: u64 = 21_600;
/// The life of a token whose request names none, in minutes.
pub const DEFAULT_TOKEN_MINUTES: u64 = 60;

/// Why no token was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRefusal {
    /// Wrong user or password.
    Credentials,
    /// Too many failures from this address or for this user.
    Throttled(u64),
}

impl Security {
    fn token_mac(&self, name: &str, expires: u64, user: &UserEntry) -> [u8; 32] {
        let (_, key) = self.nonces.own_key();
        let mut derive =
            <Hmac<Sha256> as KeyInit>::new_from_slice(&key).expect("HMAC takes any key");
        derive.update(b"geoshard token key");
        let derived = derive.finalize().into_bytes();
        let mut m =
            <Hmac<Sha256> as KeyInit>::new_from_slice(&derived).expect("HMAC takes any key");
        m.update(name.as_bytes());
        m.update(&[0]);
        m.update(&expires.to_be_bytes());
        m.update(&[user.roles.bits()]);
        m.update(&user.ha1);
        m.finalize().into_bytes().into()
    }

    /// A token for `name`, whose password is checked (and failures counted and throttled) as
    /// Basic's is, valid for `minutes` (bounded by [`MAX_TOKEN_MINUTES`]): the token and its
    /// expiry in milliseconds since the epoch. The nonce key is saved first when this run
    /// made it, so the token outlives a restart.
    pub async fn issue_token(
        &self,
        store: &Store,
        name: &str,
        password: &str,
        minutes: u64,
        peer: Option<std::net::IpAddr>,
    ) -> Result<(String, u64), TokenRefusal> {
        let now = now_secs();
        if let Some(retry) = self.throttle.address_refused(peer, now) {
            return Err(TokenRefusal::Throttled(retry));
        }
        let user = match self.user(name, now) {
            Ok(Some(user)) => user,
            Ok(None) => {
                crate::metrics::record(|m| m.auth_failures.inc());
                self.throttle.failed(peer, None, now);
                return Err(TokenRefusal::Credentials);
            }
            Err(retry) => return Err(TokenRefusal::Throttled(retry)),
        };
        if !digest::constant_time_eq(&ha1(name, &self.realm, password), &user.ha1) {
            crate::metrics::record(|m| m.auth_failures.inc());
            self.throttle.failed(peer, Some(name), now);
            return Err(TokenRefusal::Credentials);
        }
        if self.unsaved_key.lock().is_some() {
            self.save_nonces(store, false, usize::MAX).await;
        }
        let minutes = minutes.clamp(1, MAX_TOKEN_MINUTES);
        let expires = now_ms().saturating_add(minutes * 60_000);
        let mac = self.token_mac(name, expires, &user);
        let token = format!(
            "{}.{expires}.{}",
            URL_SAFE_NO_PAD.encode(name),
            URL_SAFE_NO_PAD.encode(mac)
        );
        Ok((token, expires))
    }

    /// The caller a token stands for, while it is unexpired and its user, password and roles
    /// are what they were when it was made.
    pub fn token_caller(&self, token: &str) -> Option<Caller> {
        let mut parts = token.trim().splitn(3, '.');
        let name = URL_SAFE_NO_PAD.decode(parts.next()?).ok()?;
        let name = String::from_utf8(name).ok()?;
        let expires: u64 = parts.next()?.parse().ok()?;
        let mac = URL_SAFE_NO_PAD.decode(parts.next()?).ok()?;
        if expires <= now_ms() {
            return None;
        }
        let user = self.users.read().get(&name).cloned()?;
        let want = self.token_mac(&name, expires, &user);
        digest::constant_time_eq(&want, &mac).then(|| Caller::new(name, user.roles))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(store: &Arc<Store>) -> Security {
        let throttle = ThrottleLimits {
            per_address: 0,
            per_user: 0,
        };
        let nonces = NonceLimits {
            ttl_secs: 60,
            idle_secs: 60,
            lifetime_secs: 3600,
            capacity: 100,
            per_user: 10,
        };
        Security::open(store, "public", nonces, throttle).unwrap()
    }

    #[tokio::test]
    async fn a_token_names_its_user_until_it_expires_or_the_user_changes() {
        let dir = geoshard_core::testing::tempdir();
        let store = Arc::new(Store::open(&dir, crate::store::StoreOptions::default()).unwrap());
        put_user_offline(&store, "ann", "secret", &["rest-reader".into()], "public").unwrap();
        let sec = open(&store);
        let (token, expires) = sec
            .issue_token(&store, "ann", "secret", 5, None)
            .await
            .unwrap();
        assert!(expires > now_ms() + 4 * 60_000 && expires <= now_ms() + 5 * 60_000);
        let caller = sec.token_caller(&token).unwrap();
        assert_eq!(caller.name(), "ann");
        assert!(caller.has(Role::RestReader));
        // The key was saved: a second opening of the store takes the same token.
        let again = open(&store);
        assert_eq!(again.token_caller(&token).unwrap().name(), "ann");
        // A wrong password, an altered token, an expired one, a changed user: none.
        assert_eq!(
            sec.issue_token(&store, "ann", "wrong", 5, None).await,
            Err(TokenRefusal::Credentials)
        );
        assert_eq!(
            sec.issue_token(&store, "bob", "secret", 5, None).await,
            Err(TokenRefusal::Credentials)
        );
        let (name, rest) = token.split_once('.').unwrap();
        let (exp, mac) = rest.split_once('.').unwrap();
        let later = format!("{name}.{}.{mac}", exp.parse::<u64>().unwrap() + 1);
        assert!(sec.token_caller(&later).is_none());
        let other = format!("{}.{exp}.{mac}", URL_SAFE_NO_PAD.encode("admin"));
        assert!(sec.token_caller(&other).is_none());
        assert!(sec.token_caller("garbage").is_none());
        let past = format!("{name}.1.{mac}");
        assert!(sec.token_caller(&past).is_none());
        put_user_offline(&store, "ann", "new", &["rest-reader".into()], "public").unwrap();
        sec.reload_users(&store).unwrap();
        assert!(sec.token_caller(&token).is_none(), "a new password ends it");
    }
}
