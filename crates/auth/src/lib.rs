//! Who is calling: users and their roles, and Digest/Basic verification.
//!
//! Authentication happens here, at the edge; authorization of documents happens in the
//! store, with the [`Caller`] this module produces. No HTTP types: the HTTP layer hands in
//! the method, the request target and the `Authorization` header as text.
//!
//! Passwords are never stored. A user record keeps `HA1 = MD5(user:realm:password)`, which
//! Digest needs by construction (RFC 7616 §3.4.2; Apache's htdigest and the peer system keep
//! the same) and which also checks a Basic password with one MD5. A slower hash kept beside
//! HA1 would add no protection, since HA1 is what an attacker holding the file would attack.
//! Verification costs two or three MD5s and two hash-map lookups, so no credential cache is
//! needed: a password change is effective on the next request.

// Sibling crates under the module names the code uses.
use geoshard_core::{FastMap, acl, error, metrics};
use geoshard_store as store;

mod digest;
mod nonce;
mod throttle;
mod token;

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use thiserror::Error;

use crate::acl::{Caller, Role, RoleSet};
use crate::error::{ApiError, ErrorCode};
use crate::store::{Op, Store, StoreError, Table};

pub use digest::{DigestResponse, HeaderCache, expected_response, ha1, parse_digest};
pub use nonce::{NonceCheck, NonceKey, NonceLimits, NonceTable, NonceVault, SavedNonce};
pub use throttle::{Throttle, ThrottleLimits};
pub use token::{DEFAULT_TOKEN_MINUTES, MAX_TOKEN_MINUTES, TokenRefusal};

#[derive(Debug, Error)]
pub enum SecurityError {
    #[error("Role {0} does not exist")]
    UnknownRole(String),
    #[error("user {0} already exists")]
    UserExists(String),
    #[error("user {0} does not exist")]
    NoSuchUser(String),
    #[error("invalid user record: {0}")]
    InvalidUser(String),
    #[error("user {0} is the last admin: make another admin first")]
    LastAdmin(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<SecurityError> for ApiError {
    fn from(e: SecurityError) -> ApiError {
        let code = match &e {
            SecurityError::UnknownRole(_) => ErrorCode::InvalidParam,
            SecurityError::UserExists(_) => ErrorCode::Conflict,
            SecurityError::NoSuchUser(_) => ErrorCode::NoDocument,
            SecurityError::InvalidUser(_) => ErrorCode::InvalidRequest,
            SecurityError::LastAdmin(_) => ErrorCode::InvalidRequest,
            SecurityError::Store(inner) => return ApiError::from(inner.clone()),
        };
        ApiError::new(code, e.to_string())
    }
}

/// A user as stored: no password, only its Digest hash for the realm it was set in.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UserRecord {
    #[serde(rename = "user-name")]
    pub name: String,
    #[serde(rename = "role")]
    pub roles: Vec<String>,
    /// Lowercase hex MD5 of `user:realm:password`.
    pub ha1: String,
    pub realm: String,
}

/// A user as the request path needs it.
#[derive(Debug)]
struct UserEntry {
    roles: RoleSet,
    ha1: [u8; 32],
}

pub(crate) fn parse_roles<S: AsRef<str>>(names: &[S]) -> Result<RoleSet, SecurityError> {
    let mut set = RoleSet::EMPTY;
    for n in names {
        let role = Role::parse(n.as_ref())
            .ok_or_else(|| SecurityError::UnknownRole(n.as_ref().to_string()))?;
        set.insert(role);
    }
    Ok(set)
}

/// A user name is 1-256 characters, none of them `:` (it ends the name in Basic and in HA1),
/// `"` (it ends a Digest parameter), `/` (it ends a path segment of the management API) or a
/// control character.
fn validate_name(name: &str) -> Result<(), SecurityError> {
    if name.is_empty()
        || name.len() > 256
        || name.contains([':', '"', '/'])
        || name.chars().any(char::is_control)
    {
        return Err(SecurityError::InvalidUser(format!(
            "user name {name:?} must be 1-256 characters without ':', '\"', '/' or control \
             characters"
        )));
    }
    Ok(())
}

/// Build the stored record for a new password.
pub(crate) fn make_record(
    name: &str,
    password: &str,
    roles: &[String],
    realm: &str,
) -> Result<UserRecord, SecurityError> {
    validate_name(name)?;
    if password.is_empty() {
        return Err(SecurityError::InvalidUser(
            "password must not be empty".into(),
        ));
    }
    parse_roles(roles)?;
    let h = ha1(name, realm, password);
    Ok(UserRecord {
        name: name.to_string(),
        roles: roles.to_vec(),
        ha1: String::from_utf8_lossy(&h).into_owned(),
        realm: realm.to_string(),
    })
}

/// Read every user record from the store.
pub fn load_users(store: &Store) -> Result<Vec<UserRecord>, SecurityError> {
    let mut out = Vec::new();
    for (name, bytes) in store.records(Table::Users, "")? {
        let rec: UserRecord = serde_json::from_slice(&bytes)
            .map_err(|e| SecurityError::InvalidUser(format!("stored user {name}: {e}")))?;
        out.push(rec);
    }
    Ok(out)
}

/// The record of a nonce key in the store's `nonces` table.
fn key_record(id: [u8; 4]) -> String {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!("key/{hex}")
}

/// The nonce key every node and run agrees on: the stored key of the lowest id.
fn stored_key(store: &Store) -> Result<Option<NonceKey>, SecurityError> {
    Ok(store
        .records(Table::Nonces, "key/")?
        .into_iter()
        .find_map(|(name, value)| key_of(&name, &value)))
}

fn key_of(name: &str, value: &[u8]) -> Option<NonceKey> {
    let hex = name.strip_prefix("key/")?;
    let id = u32::from_str_radix(hex, 16).ok()?.to_be_bytes();
    Some((id, value.try_into().ok()?))
}

/// Nonce state beyond memory, in the store: keys (a cluster's other nodes' arrive through
/// its log) and the highest `nc` of nonces that left memory.
struct StoreVault(Arc<Store>);

impl NonceVault for StoreVault {
    fn key(&self, id: [u8; 4]) -> Option<[u8; 32]> {
        let name = key_record(id);
        let value = self.0.get_record(Table::Nonces, &name).ok()??;
        key_of(&name, &value).map(|k| k.1)
    }

    fn saved(&self, user: &str, id: &[u8; 12]) -> Option<(u64, u64)> {
        let value = self
            .0
            .get_record(Table::Nonces, &SavedNonce::record_key(user, id))
            .ok()??;
        SavedNonce::parse_value(&value)
    }
}

/// Saved nonce states are pruned at most this often.
const PRUNE_EVERY_SECS: u64 = 3600;
/// Most records one save of nonce states writes or deletes, so that it fits one entry of a
/// cluster's log; the rest goes with the next save.
const NONCE_OPS_A_WRITE: usize = 20_000;

fn record_op(rec: &UserRecord) -> Op {
    Op::PutRecord {
        table: Table::Users,
        key: rec.name.clone(),
        value: serde_json::to_vec(rec).unwrap_or_default(),
    }
}

/// The result of checking a request's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthOutcome {
    Authenticated(Caller),
    /// Answer 401 with fresh challenges; `stale` when the password was right but the nonce
    /// expired, so the client retries without asking its user.
    Challenge {
        stale: bool,
    },
    /// Answer 429: too many failed authentications from this address or for this user.
    Throttled {
        retry_after_secs: u64,
    },
}

/// What checking one set of credentials found.
enum Verdict<'a> {
    Authenticated(Caller),
    /// The right password with an old or foreign nonce.
    Stale,
    /// Refused; names the user when it exists (counted by name too).
    Failed {
        user: Option<&'a str>,
    },
    /// The user is past its limit of failures.
    Throttled(u64),
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Users in memory plus the Digest state. One per service.
pub struct Security {
    realm: String,
    /// Echoed by clients; the realm's, on every node and run.
    opaque: String,
    users: RwLock<crate::FastMap<String, Arc<UserEntry>>>,
    nonces: NonceTable,
    /// This run's nonce key when the store has none yet: saved with the next nonce states.
    unsaved_key: parking_lot::Mutex<Option<NonceKey>>,
    /// When saved nonce states were last pruned (seconds since the epoch).
    pruned: std::sync::atomic::AtomicU64,
    throttle: Throttle,
    /// Held across a user change's check and write, so that two changes cannot each leave
    /// the other's admin as the last one and then both remove it.
    user_changes: tokio::sync::Mutex<()>,
}

impl Security {
    /// Load the users from the store.
    pub fn open(
        store: &Arc<Store>,
        realm: &str,
        nonces: NonceLimits,
        throttle: ThrottleLimits,
    ) -> Result<Security, SecurityError> {
        // The opaque value is the realm's, so that it is the same after a restart and on
        // every node (clients echo it for the life of their nonce); nonces carry the secret.
        let (key, unsaved) = match stored_key(store)? {
            Some(key) => (key, None),
            None => {
                let key = nonce::new_key();
                (key, Some(key))
            }
        };
        let opaque =
            sha2::Sha256::digest([b"geoshard opaque:".as_slice(), realm.as_bytes()].concat());
        let sec = Security {
            realm: realm.to_string(),
            opaque: opaque[..16].iter().map(|b| format!("{b:02x}")).collect(),
            users: RwLock::new(crate::FastMap::default()),
            nonces: NonceTable::with_key(nonces, key, Box::new(StoreVault(store.clone()))),
            unsaved_key: parking_lot::Mutex::new(unsaved),
            pruned: std::sync::atomic::AtomicU64::new(0),
            throttle: Throttle::new(throttle),
            user_changes: tokio::sync::Mutex::new(()),
        };
        for rec in load_users(store)? {
            if rec.realm != realm {
                tracing::warn!(user = %rec.name, stored = %rec.realm, realm,
                    "user's password was set for another realm; reset it to log in");
            }
            sec.remember(&rec)?;
        }
        Ok(sec)
    }

    fn remember(&self, rec: &UserRecord) -> Result<(), SecurityError> {
        let entry = user_entry(rec)?;
        self.users.write().insert(rec.name.clone(), entry);
        Ok(())
    }

    /// Read the users again from the store, after a change this node did not make itself
    /// (cluster mode: another node's, applied from the log).
    pub fn reload_users(&self, store: &Store) -> Result<(), SecurityError> {
        let mut users = crate::FastMap::default();
        for rec in load_users(store)? {
            users.insert(rec.name.clone(), user_entry(&rec)?);
        }
        *self.users.write() = users;
        Ok(())
    }

    pub fn realm(&self) -> &str {
        &self.realm
    }

    /// Write the nonce states that left memory (and this run's nonce key, the first time) to
    /// the store, so that a restart, another node or a later use after a quiet night knows
    /// their `nc`; `checkpoint` also saves the `nc` of nonces in use. Past a nonce's lifetime
    /// its state is pruned, and at most `keep` states are kept (the newest). Whether it wrote
    /// a full batch, so that more may be waiting.
    pub async fn save_nonces(&self, store: &Store, checkpoint: bool, keep: usize) -> bool {
        if checkpoint {
            self.nonces.checkpoint();
        }
        let saves = self.nonces.take_saves(NONCE_OPS_A_WRITE);
        let key = *self.unsaved_key.lock();
        let mut ops: Vec<Op> = saves
            .iter()
            .map(|s| Op::PutRecord {
                table: Table::Nonces,
                key: SavedNonce::record_key(&s.user, &s.id),
                value: s.value(),
            })
            .collect();
        if let Some((id, k)) = key {
            ops.push(Op::PutRecord {
                table: Table::Nonces,
                key: key_record(id),
                value: k.to_vec(),
            });
        }
        let now = now_secs();
        let last = self.pruned.load(std::sync::atomic::Ordering::Relaxed);
        if now >= last + PRUNE_EVERY_SECS {
            self.pruned.store(now, std::sync::atomic::Ordering::Relaxed);
            ops.extend(self.prune_ops(store, now, keep));
        }
        if ops.is_empty() {
            return false;
        }
        match store.write(&Caller::system(), ops).await {
            Ok(_) => {
                self.nonces.stored(&saves);
                if key.is_some() {
                    *self.unsaved_key.lock() = None;
                }
                saves.len() == NONCE_OPS_A_WRITE
            }
            Err(e) => {
                tracing::warn!(error = %e, "nonce states not saved; kept for the next try");
                false
            }
        }
    }

    /// Deletes of saved nonce states past their lifetime, and of the oldest past `keep`.
    fn prune_ops(&self, store: &Store, now: u64, keep: usize) -> Vec<Op> {
        let Ok(records) = store.records(Table::Nonces, "nc/") else {
            return Vec::new();
        };
        let lifetime = self.nonces.lifetime_secs();
        let mut live: Vec<(u64, String)> = Vec::new();
        let mut ops = Vec::new();
        for (name, value) in records {
            match SavedNonce::parse_value(&value) {
                Some((issued, _)) if now < issued.saturating_add(lifetime) => {
                    live.push((issued, name))
                }
                _ => ops.push(Op::DeleteRecord {
                    table: Table::Nonces,
                    key: name,
                }),
            }
        }
        if live.len() > keep {
            live.sort_unstable();
            let over = live.len() - keep;
            ops.extend(live.drain(..over).map(|(_, name)| Op::DeleteRecord {
                table: Table::Nonces,
                key: name,
            }));
        }
        // What is past the batch is deleted at a later prune.
        ops.truncate(NONCE_OPS_A_WRITE);
        ops
    }

    /// At a clean stop: every tracked nonce's state to the store.
    pub async fn save_all_nonces(&self, store: &Store, keep: usize) {
        self.nonces.save_all();
        // A batch at a time, while full batches go through.
        while self.save_nonces(store, false, keep).await {}
    }

    /// The two `WWW-Authenticate` values of a 401, Digest first.
    pub fn challenges(&self, stale: bool) -> [String; 2] {
        let nonce = self.nonces.issue();
        let digest = if stale {
            format!(
                "Digest realm=\"{}\", qop=\"auth\", nonce=\"{}\", opaque=\"{}\", algorithm=MD5, stale=true",
                self.realm, nonce, self.opaque
            )
        } else {
            format!(
                "Digest realm=\"{}\", qop=\"auth\", nonce=\"{}\", opaque=\"{}\", algorithm=MD5",
                self.realm, nonce, self.opaque
            )
        };
        [digest, format!("Basic realm=\"{}\"", self.realm)]
    }

    /// Check the `Authorization` header of a request.
    /// `target` is the request target as sent (path and query).
    pub fn authenticate(&self, method: &str, target: &str, header: Option<&str>) -> AuthOutcome {
        self.authenticate_on(method, target, header, None, None)
    }

    /// [`Security::authenticate`], for a request from `peer` over a connection that keeps its
    /// last Digest header in `kept`. Failures are counted against the peer's address and the
    /// user named, and either past its limit is refused before anything is checked.
    pub fn authenticate_on(
        &self,
        method: &str,
        target: &str,
        header: Option<&str>,
        kept: Option<&HeaderCache>,
        peer: Option<std::net::IpAddr>,
    ) -> AuthOutcome {
        let Some(header) = header else {
            return AuthOutcome::Challenge { stale: false };
        };
        let now = now_secs();
        if let Some(retry_after_secs) = self.throttle.address_refused(peer, now) {
            return AuthOutcome::Throttled { retry_after_secs };
        }
        let header = header.trim_start();
        let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
        let verdict = if scheme.eq_ignore_ascii_case("digest") {
            self.digest(method, target, rest, kept, now)
        } else if scheme.eq_ignore_ascii_case("basic") {
            self.basic(rest.trim(), now)
        } else {
            Verdict::Failed { user: None }
        };
        match verdict {
            Verdict::Authenticated(caller) => AuthOutcome::Authenticated(caller),
            Verdict::Stale => AuthOutcome::Challenge { stale: true },
            Verdict::Throttled(retry_after_secs) => AuthOutcome::Throttled { retry_after_secs },
            Verdict::Failed { user } => {
                crate::metrics::record(|m| m.auth_failures.inc());
                self.throttle.failed(peer, user, now);
                AuthOutcome::Challenge { stale: false }
            }
        }
    }

    /// The user `name`, unless it is past its limit of failures.
    fn user(&self, name: &str, now: u64) -> Result<Option<Arc<UserEntry>>, u64> {
        let Some(user) = self.users.read().get(name).cloned() else {
            return Ok(None);
        };
        match self.throttle.user_refused(name, now) {
            Some(retry_after) => Err(retry_after),
            None => Ok(Some(user)),
        }
    }

    fn digest<'h>(
        &self,
        method: &str,
        target: &str,
        params: &'h str,
        kept: Option<&HeaderCache>,
        now: u64,
    ) -> Verdict<'h> {
        let parsed = match kept {
            Some(k) => k.parse(params),
            None => parse_digest(params),
        };
        let Some(r) = parsed else {
            return Verdict::Failed { user: None };
        };
        let user = match self.user(r.username, now) {
            Ok(Some(user)) => user,
            Ok(None) => return Verdict::Failed { user: None },
            Err(retry_after) => return Verdict::Throttled(retry_after),
        };
        let fail = Verdict::Failed {
            user: Some(r.username),
        };
        if r.realm != self.realm
            || r.opaque.is_some_and(|o| o != self.opaque)
            || r.algorithm.is_some_and(|a| !a.eq_ignore_ascii_case("md5"))
        {
            return fail;
        }
        // The digest covers the request target the client sent, query included; a digest of
        // another target (or of the path alone) does not authenticate this one.
        if r.uri != target {
            return fail;
        }
        let Some(want) = digest::expected_response_on(&user.ha1, method, &r, kept) else {
            return fail;
        };
        if !digest::constant_time_eq(&want, r.response.as_bytes()) {
            return fail;
        }
        match self
            .nonces
            .check_at(r.username, r.nonce, r.nc.unwrap_or(""), now)
        {
            NonceCheck::Fresh => Verdict::Authenticated(Caller::new(r.username, user.roles)),
            // Right password, old or foreign nonce: let the client retry transparently.
            NonceCheck::Stale => Verdict::Stale,
            NonceCheck::Replayed => fail,
        }
    }

    fn basic<'h>(&self, token: &str, now: u64) -> Verdict<'h> {
        let fail = Verdict::Failed { user: None };
        let Ok(decoded) = STANDARD.decode(token) else {
            return fail;
        };
        let Ok(text) = std::str::from_utf8(&decoded) else {
            return fail;
        };
        let Some((name, password)) = digest::split_basic(text) else {
            return fail;
        };
        let user = match self.user(name, now) {
            Ok(Some(user)) => user,
            Ok(None) => return fail,
            Err(retry_after) => return Verdict::Throttled(retry_after),
        };
        if digest::constant_time_eq(&ha1(name, &self.realm, password), &user.ha1) {
            Verdict::Authenticated(Caller::new(name, user.roles))
        } else {
            // The name lives in the decoded token; the user's own key is counted instead.
            crate::metrics::record(|m| m.auth_failures.inc());
            self.throttle.failed(None, Some(name), now);
            fail
        }
    }

    /// Create a user (admin only, through the store's check). Fails if it exists.
    pub async fn create_user(
        &self,
        store: &Store,
        caller: &Caller,
        name: &str,
        password: &str,
        roles: &[String],
    ) -> Result<(), SecurityError> {
        let rec = make_record(name, password, roles, &self.realm)?;
        let _changing = self.user_changes.lock().await;
        if self.users.read().contains_key(name) || store.get_record(Table::Users, name)?.is_some() {
            return Err(SecurityError::UserExists(name.to_string()));
        }
        store.write(caller, vec![record_op(&rec)]).await?;
        self.remember(&rec)
    }

    /// Change a user's password and/or roles (admin only).
    pub async fn update_user(
        &self,
        store: &Store,
        caller: &Caller,
        name: &str,
        password: Option<&str>,
        roles: Option<&[String]>,
    ) -> Result<(), SecurityError> {
        let _changing = self.user_changes.lock().await;
        let bytes = store
            .get_record(Table::Users, name)?
            .ok_or_else(|| SecurityError::NoSuchUser(name.to_string()))?;
        let mut rec: UserRecord = serde_json::from_slice(&bytes)
            .map_err(|e| SecurityError::InvalidUser(format!("stored user {name}: {e}")))?;
        if let Some(roles) = roles {
            if !parse_roles(roles)?.contains(Role::Admin) {
                self.keep_an_admin(store, name)?;
            }
            rec.roles = roles.to_vec();
        }
        if let Some(password) = password {
            rec = make_record(name, password, &rec.roles, &self.realm)?;
        }
        store.write(caller, vec![record_op(&rec)]).await?;
        self.remember(&rec)
    }

    pub async fn remove_user(
        &self,
        store: &Store,
        caller: &Caller,
        name: &str,
    ) -> Result<(), SecurityError> {
        let _changing = self.user_changes.lock().await;
        if store.get_record(Table::Users, name)?.is_none() {
            return Err(SecurityError::NoSuchUser(name.to_string()));
        }
        self.keep_an_admin(store, name)?;
        store
            .write(
                caller,
                vec![Op::DeleteRecord {
                    table: Table::Users,
                    key: name.to_string(),
                }],
            )
            .await?;
        self.users.write().remove(name);
        Ok(())
    }

    /// Refuse to take the admin role from `name` (or remove it) when it is the only admin
    /// left: with none, only the offline command line could manage users again.
    fn keep_an_admin(&self, store: &Store, name: &str) -> Result<(), SecurityError> {
        let admin = |rec: &UserRecord| rec.roles.iter().any(|r| r == Role::Admin.name());
        let users = load_users(store)?;
        let others = users.iter().filter(|u| u.name != name && admin(u)).count();
        let is_admin = users.iter().any(|u| u.name == name && admin(u));
        if is_admin && others == 0 {
            return Err(SecurityError::LastAdmin(name.to_string()));
        }
        Ok(())
    }

    pub fn list_users(&self, store: &Store) -> Result<Vec<UserRecord>, SecurityError> {
        load_users(store)
    }
}

/// What authentication keeps of a stored user.
fn user_entry(rec: &UserRecord) -> Result<Arc<UserEntry>, SecurityError> {
    let roles = parse_roles(&rec.roles)?;
    let mut ha1 = [0u8; 32];
    if rec.ha1.len() == 32 {
        ha1.copy_from_slice(rec.ha1.as_bytes());
    }
    Ok(Arc::new(UserEntry { roles, ha1 }))
}

/// Offline administration on a stopped server's store: add or replace a user.
pub fn put_user_offline(
    store: &Store,
    name: &str,
    password: &str,
    roles: &[String],
    realm: &str,
) -> Result<bool, SecurityError> {
    let rec = make_record(name, password, roles, realm)?;
    let existed = store.get_record(Table::Users, name)?.is_some();
    store.write_blocking(&Caller::system(), vec![record_op(&rec)])?;
    Ok(!existed)
}

pub fn remove_user_offline(store: &Store, name: &str) -> Result<(), SecurityError> {
    if store.get_record(Table::Users, name)?.is_none() {
        return Err(SecurityError::NoSuchUser(name.to_string()));
    }
    store.write_blocking(
        &Caller::system(),
        vec![Op::DeleteRecord {
            table: Table::Users,
            key: name.to_string(),
        }],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreOptions;

    fn no_throttle() -> ThrottleLimits {
        ThrottleLimits {
            per_address: 0,
            per_user: 0,
        }
    }

    fn test_limits() -> NonceLimits {
        NonceLimits {
            ttl_secs: 60,
            idle_secs: 60,
            lifetime_secs: 3600,
            capacity: 100,
            per_user: 10,
        }
    }

    fn digest_header(
        user: &str,
        pass: &str,
        realm: &str,
        method: &str,
        uri: &str,
        challenge: &str,
        nc: u32,
    ) -> String {
        let nonce = challenge
            .split("nonce=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let opaque = challenge
            .split("opaque=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let h1 = ha1(user, realm, pass);
        let nc = format!("{nc:08x}");
        let r = DigestResponse {
            username: user,
            realm,
            nonce,
            uri,
            response: "",
            qop: Some("auth"),
            nc: Some(&nc),
            cnonce: Some("abc"),
            opaque: Some(opaque),
            algorithm: None,
        };
        let resp = expected_response(&h1, method, &r).unwrap();
        format!(
            "Digest username=\"{user}\", realm=\"{realm}\", nonce=\"{nonce}\", uri=\"{uri}\", qop=auth, nc={nc}, cnonce=\"abc\", response=\"{}\", opaque=\"{opaque}\"",
            String::from_utf8_lossy(&resp)
        )
    }

    /// Over a connection that keeps its last header, bound headers are checked in full:
    /// replays, wrong passwords and other users are refused or seen as such.
    #[test]
    fn a_connections_kept_header_still_checks_every_request() {
        let dir = geoshard_core::testing::tempdir();
        let store = Arc::new(Store::open(&dir, StoreOptions::default()).unwrap());
        put_user_offline(&store, "ann", "secret", &["rest-reader".into()], "public").unwrap();
        put_user_offline(&store, "bob", "hidden", &["rest-writer".into()], "public").unwrap();
        let sec = Security::open(&store, "public", test_limits(), no_throttle()).unwrap();
        let kept = HeaderCache::default();
        let ch = sec.challenges(false);
        let auth = |h: &str| sec.authenticate_on("GET", "/v1/ping", Some(h), Some(&kept), None);
        let name = |out: AuthOutcome| match out {
            AuthOutcome::Authenticated(c) => c.name().to_string(),
            other => format!("{other:?}"),
        };
        let ann =
            |pass: &str, nc| digest_header("ann", pass, "public", "GET", "/v1/ping", &ch[0], nc);
        let refused = format!("{:?}", AuthOutcome::Challenge { stale: false });
        assert_eq!(name(auth(&ann("secret", 1))), "ann");
        assert_eq!(name(auth(&ann("secret", 2))), "ann");
        // The same header again: bound, and a replay.
        assert_eq!(name(auth(&ann("secret", 2))), refused);
        // The wrong password, in a header of the same shape.
        assert_eq!(name(auth(&ann("secreT", 3))), refused);
        assert_eq!(name(auth(&ann("secret", 4))), "ann");
        // Another user on the same connection, with a name of the same length.
        let ch2 = sec.challenges(false);
        let bob = digest_header("bob", "hidden", "public", "GET", "/v1/ping", &ch2[0], 1);
        assert_eq!(name(auth(&bob)), "bob");
        assert_eq!(name(auth(&ann("secret", 5))), "ann");
    }

    #[test]
    fn digest_basic_and_password_change() {
        let dir = geoshard_core::testing::tempdir();
        let store = Arc::new(Store::open(&dir, StoreOptions::default()).unwrap());
        put_user_offline(&store, "ann", "secret", &["rest-reader".into()], "public").unwrap();
        let sec = Security::open(&store, "public", test_limits(), no_throttle()).unwrap();
        let ch = sec.challenges(false);
        assert!(ch[0].starts_with("Digest realm=\"public\", qop=\"auth\", nonce=\""));
        assert_eq!(ch[1], "Basic realm=\"public\"");

        let h = digest_header("ann", "secret", "public", "GET", "/v1/ping", &ch[0], 1);
        let out = sec.authenticate("GET", "/v1/ping", Some(&h));
        let AuthOutcome::Authenticated(caller) = out else {
            panic!("{out:?}")
        };
        assert_eq!(caller.name(), "ann");
        assert!(caller.has(Role::RestReader));
        // Same nc again: replay.
        assert_eq!(
            sec.authenticate("GET", "/v1/ping", Some(&h)),
            AuthOutcome::Challenge { stale: false }
        );
        // Wrong password, and a digest for another URI.
        let bad = digest_header("ann", "nope", "public", "GET", "/v1/ping", &ch[0], 2);
        assert_eq!(
            sec.authenticate("GET", "/v1/ping", Some(&bad)),
            AuthOutcome::Challenge { stale: false }
        );
        let other = digest_header("ann", "secret", "public", "GET", "/x", &ch[0], 3);
        assert_eq!(
            sec.authenticate("GET", "/v1/ping", Some(&other)),
            AuthOutcome::Challenge { stale: false }
        );

        let basic = format!("Basic {}", STANDARD.encode("ann:secret"));
        assert!(matches!(
            sec.authenticate("GET", "/", Some(&basic)),
            AuthOutcome::Authenticated(_)
        ));
        let basic_bad = format!("Basic {}", STANDARD.encode("ann:secreT"));
        assert_eq!(
            sec.authenticate("GET", "/", Some(&basic_bad)),
            AuthOutcome::Challenge { stale: false }
        );
        assert_eq!(
            sec.authenticate("GET", "/", Some("Bearer x")),
            AuthOutcome::Challenge { stale: false }
        );

        // A password change takes effect at once.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(sec.update_user(&store, &Caller::system(), "ann", Some("new"), None))
            .unwrap();
        assert_eq!(
            sec.authenticate("GET", "/", Some(&basic)),
            AuthOutcome::Challenge { stale: false }
        );
        let basic_new = format!("Basic {}", STANDARD.encode("ann:new"));
        assert!(matches!(
            sec.authenticate("GET", "/", Some(&basic_new)),
            AuthOutcome::Authenticated(_)
        ));
        // Nothing stored contains the password.
        let stored = store.get_record(Table::Users, "ann").unwrap().unwrap();
        let text = String::from_utf8(stored).unwrap();
        assert!(
            !text.contains("\"new\"") && !text.contains("secret"),
            "{text}"
        );
        store.shutdown_blocking();
    }

    #[test]
    fn unknown_roles_are_refused() {
        assert!(matches!(
            make_record("a", "p", &["superuser".into()], "public"),
            Err(SecurityError::UnknownRole(r)) if r == "superuser"
        ));
        assert!(make_record("a:b", "p", &[], "public").is_err());
        assert!(make_record("a", "", &[], "public").is_err());
    }
}
