//! Roles, capabilities and document permissions: the vocabulary of authorization.
//!
//! A leaf module shared by `security` (which decides who a caller is) and `store` (which
//! decides what that caller may do with each document). It holds no state and does no I/O.
//! Role sets and permissions are bitmasks, so a permission check on the query hot path is a
//! couple of AND instructions.

use std::fmt;

/// A built-in role. The contract names these seven; there are no user-defined roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Role {
    Admin = 0,
    RestReader = 1,
    RestWriter = 2,
    RestExtensionUser = 3,
    GeoReader = 4,
    GeoWriter = 5,
    /// Writes and deletes templates (the TDE collection).
    TdeAdmin = 6,
}

impl Role {
    pub const ALL: [Role; 7] = [
        Role::Admin,
        Role::RestReader,
        Role::RestWriter,
        Role::RestExtensionUser,
        Role::GeoReader,
        Role::GeoWriter,
        Role::TdeAdmin,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::RestReader => "rest-reader",
            Role::RestWriter => "rest-writer",
            Role::RestExtensionUser => "rest-extension-user",
            Role::GeoReader => "geo-data-services-reader",
            Role::GeoWriter => "geo-data-services-writer",
            Role::TdeAdmin => "tde-admin",
        }
    }

    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The collection of templates (TDE): schema that only `tde-admin` (or `admin`) writes.
pub const TEMPLATE_COLLECTION: &str = "http://marklogic.com/xdmp/tde";
/// The collection of service descriptors: schema that only `geo-data-services-writer` (or
/// `admin`) writes.
pub const DESCRIPTOR_COLLECTION: &str = "http://marklogic.com/feature-services";

/// The collection of geofences. Written through `/v1/fences` (which needs
/// `geo-data-services-writer` and records its caller's roles in the fence), so through the
/// documents API only `admin` may write it.
pub const FENCE_COLLECTION: &str = "http://geoshard.dev/fences";

/// The role (besides `admin`) that writing or deleting a document of `collection` needs,
/// when that collection holds schema: templates and service descriptors change what every
/// user's writes and queries mean, so `rest-writer` alone may not touch them.
pub fn schema_role(collection: &str) -> Option<Role> {
    match collection {
        TEMPLATE_COLLECTION => Some(Role::TdeAdmin),
        DESCRIPTOR_COLLECTION => Some(Role::GeoWriter),
        FENCE_COLLECTION => Some(Role::Admin),
        _ => None,
    }
}

/// A set of roles, as a bitmask over [`Role`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct RoleSet(u8);

impl RoleSet {
    pub const EMPTY: RoleSet = RoleSet(0);

    pub fn from_roles(roles: impl IntoIterator<Item = Role>) -> RoleSet {
        RoleSet(roles.into_iter().fold(0, |m, r| m | r.bit()))
    }

    pub fn contains(self, role: Role) -> bool {
        self.0 & role.bit() != 0
    }

    pub fn insert(&mut self, role: Role) {
        self.0 |= role.bit();
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn roles(self) -> impl Iterator<Item = Role> {
        Role::ALL.into_iter().filter(move |r| self.contains(*r))
    }

    /// The roles granted directly plus the ones they inherit: a writer role includes its
    /// reader role, and `admin` includes every role.
    pub fn effective(self) -> RoleSet {
        if self.contains(Role::Admin) {
            return RoleSet::from_roles(Role::ALL);
        }
        let mut out = self;
        if self.contains(Role::RestWriter) {
            out.insert(Role::RestReader);
        }
        if self.contains(Role::GeoWriter) {
            out.insert(Role::GeoReader);
        }
        out
    }

    /// The bitmask, for encodings (the inverse of [`RoleSet::from_bits`]).
    pub fn bits(self) -> u8 {
        self.0
    }

    pub fn from_bits(bits: u8) -> RoleSet {
        RoleSet(bits & ((1 << Role::ALL.len()) - 1))
    }
}

/// What a role may do with a document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Capability {
    Read = 0,
    Update = 1,
    Insert = 2,
    Execute = 3,
}

impl Capability {
    pub const ALL: [Capability; 4] = [
        Capability::Read,
        Capability::Update,
        Capability::Insert,
        Capability::Execute,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Capability::Read => "read",
            Capability::Update => "update",
            Capability::Insert => "insert",
            Capability::Execute => "execute",
        }
    }

    pub fn parse(name: &str) -> Option<Capability> {
        Capability::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// The permissions of one document: for each capability, the set of roles holding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Permissions {
    /// Indexed by `Capability as usize`.
    holders: [RoleSet; 4],
}

impl Permissions {
    pub fn new() -> Permissions {
        Permissions::default()
    }

    /// `rest-reader: read`, `rest-writer: update`: what a document written without `perm:` gets.
    pub fn document_default() -> Permissions {
        let mut p = Permissions::new();
        p.grant(Role::RestReader, Capability::Read);
        p.grant(Role::RestWriter, Capability::Update);
        p
    }

    pub fn grant(&mut self, role: Role, cap: Capability) {
        self.holders[cap as usize].insert(role);
    }

    /// The roles that hold `cap` on the document.
    pub fn holders(&self, cap: Capability) -> RoleSet {
        self.holders[cap as usize]
    }

    /// Whether a caller with `roles` (already [`RoleSet::effective`]) may do `cap`.
    pub fn allows(&self, roles: RoleSet, cap: Capability) -> bool {
        roles.contains(Role::Admin) || self.holders[cap as usize].0 & roles.0 != 0
    }

    pub fn is_empty(&self) -> bool {
        self.holders.iter().all(|s| s.is_empty())
    }

    /// Whether effective `roles` may read a document whose readers are `readers` (the
    /// holders of `read`): the one check derived indexes keep per row.
    #[inline]
    pub fn readable_by(readers: RoleSet, roles: RoleSet) -> bool {
        roles.contains(Role::Admin) || readers.0 & roles.0 != 0
    }

    /// Default permissions of a feature-service descriptor (INTERFACE §2.4 rule 2).
    pub fn descriptor_default() -> Permissions {
        let mut p = Permissions::new();
        p.grant(Role::GeoReader, Capability::Read);
        p.grant(Role::GeoWriter, Capability::Update);
        p
    }

    /// `(role, capability)` pairs, ordered by role then capability.
    pub fn pairs(&self) -> Vec<(Role, Capability)> {
        let mut out = Vec::new();
        for role in Role::ALL {
            for cap in Capability::ALL {
                if self.holders(cap).contains(role) {
                    out.push((role, cap));
                }
            }
        }
        out
    }

    /// Four bytes, one role set per capability: the stored form.
    pub fn to_bytes(self) -> [u8; 4] {
        [
            self.holders[0].0,
            self.holders[1].0,
            self.holders[2].0,
            self.holders[3].0,
        ]
    }

    pub fn from_bytes(b: [u8; 4]) -> Permissions {
        Permissions {
            holders: [
                RoleSet::from_bits(b[0]),
                RoleSet::from_bits(b[1]),
                RoleSet::from_bits(b[2]),
                RoleSet::from_bits(b[3]),
            ],
        }
    }
}

/// An authenticated principal: the only thing that opens the store.
///
/// Only `security` makes callers for requests; [`Caller::system`] is for offline tools and
/// for the service's own rebuilds, and is never handed to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The user name, for logs and traces.
    name: String,
    /// Effective roles (inheritance applied), so checks are one mask.
    roles: RoleSet,
}

impl Caller {
    pub fn new(name: impl Into<String>, granted: RoleSet) -> Caller {
        Caller {
            name: name.into(),
            roles: granted.effective(),
        }
    }

    /// The service itself: full rights.
    pub fn system() -> Caller {
        Caller::new("(system)", RoleSet::from_roles([Role::Admin]))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn roles(&self) -> RoleSet {
        self.roles
    }

    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(role)
    }

    pub fn may(&self, perms: &Permissions, cap: Capability) -> bool {
        perms.allows(self.roles, cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_roles_include_reader_roles() {
        let w = RoleSet::from_roles([Role::GeoWriter]).effective();
        assert!(w.contains(Role::GeoReader));
        assert!(!w.contains(Role::RestReader));
        let a = RoleSet::from_roles([Role::Admin]).effective();
        assert!(Role::ALL.iter().all(|r| a.contains(*r)));
    }

    #[test]
    fn default_permissions() {
        let p = Permissions::document_default();
        let reader = Caller::new("r", RoleSet::from_roles([Role::RestReader]));
        let writer = Caller::new("w", RoleSet::from_roles([Role::RestWriter]));
        let geo = Caller::new("g", RoleSet::from_roles([Role::GeoWriter]));
        assert!(reader.may(&p, Capability::Read));
        assert!(!reader.may(&p, Capability::Update));
        assert!(writer.may(&p, Capability::Read)); // via inheritance
        assert!(writer.may(&p, Capability::Update));
        assert!(!geo.may(&p, Capability::Read));
        assert!(Caller::system().may(&p, Capability::Update));
    }

    #[test]
    fn permissions_round_trip_bytes() {
        let mut p = Permissions::new();
        p.grant(Role::GeoReader, Capability::Read);
        p.grant(Role::GeoWriter, Capability::Update);
        p.grant(Role::Admin, Capability::Execute);
        assert_eq!(Permissions::from_bytes(p.to_bytes()), p);
        assert_eq!(
            p.pairs(),
            vec![
                (Role::Admin, Capability::Execute),
                (Role::GeoReader, Capability::Read),
                (Role::GeoWriter, Capability::Update)
            ]
        );
    }

    #[test]
    fn schema_collections_name_their_roles() {
        assert_eq!(schema_role(TEMPLATE_COLLECTION), Some(Role::TdeAdmin));
        assert_eq!(schema_role(DESCRIPTOR_COLLECTION), Some(Role::GeoWriter));
        assert_eq!(schema_role("places"), None);
        // The new role survives the stored form of a role set.
        let set = RoleSet::from_roles([Role::TdeAdmin, Role::RestWriter]);
        assert_eq!(RoleSet::from_bits(set.bits()), set);
        assert!(
            RoleSet::from_roles([Role::Admin])
                .effective()
                .contains(Role::TdeAdmin)
        );
    }

    #[test]
    fn role_names_parse() {
        for r in Role::ALL {
            assert_eq!(Role::parse(r.name()), Some(r));
        }
        assert_eq!(Role::parse("nobody"), None);
    }
}
