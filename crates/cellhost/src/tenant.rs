//! Tenants: clients of one daemon kept apart (`[[tenants]]`).
//!
//! Each tenant has its own session namespace. The library's owner key of
//! tenant `t`'s session `s` is `"t:s"`; the admin (the `[server] token`,
//! or anyone on a tokenless daemon) names sessions by their keys, so
//! `"alice:s1"` is tenant alice's `s1` and `"s1"` is the admin's own.
//! Every route maps the caller's session name through [`Caller::key`]
//! and shows keys back through [`Caller::name_of`]; a key outside the
//! caller's namespace is never reached, so another tenant's session
//! looks exactly like one that does not exist. Workspaces and uids are
//! derived from the key (see `registry::workspace` and `registry::uids`),
//! so two tenants' same-named sessions never share either.

use std::sync::Arc;

use crate::config::TenantConfig;

/// Between the tenant's name and its session in an owner key.
pub const SEPARATOR: char = ':';

/// Who sent a request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Caller {
    /// The `[server] token` (or no token configured): every session.
    #[default]
    Admin,
    /// A `[[tenants]]` token: that tenant's sessions only.
    Tenant(Arc<str>),
}

impl Caller {
    /// The tenant's name; `None` for the admin.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Caller::Admin => None,
            Caller::Tenant(t) => Some(t),
        }
    }

    /// The owner key of the session this caller calls `session`.
    pub fn key(&self, session: &str) -> String {
        match self {
            Caller::Admin => session.to_owned(),
            Caller::Tenant(t) => format!("{t}{SEPARATOR}{session}"),
        }
    }

    /// What this caller calls the owner `key`; `None` when it is not the
    /// caller's (another tenant's, or the admin's own).
    pub fn name_of<'a>(&self, key: &'a str) -> Option<&'a str> {
        match self {
            Caller::Admin => Some(key),
            Caller::Tenant(t) => key.strip_prefix(&**t)?.strip_prefix(SEPARATOR),
        }
    }

    /// `true` when the owner `key` is this caller's to see.
    pub fn sees(&self, key: &str) -> bool {
        self.name_of(key).is_some()
    }
}

/// Limits of one tenant (`None`: unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantLimits {
    /// Most live kernels at once; a cell that would start another is
    /// refused (HTTP 429).
    pub max_kernels: Option<usize>,
    /// Most sessions with live kernels at once; a cell of another session
    /// is refused (429).
    pub max_sessions: Option<usize>,
    /// Most cells started in any 60 seconds (429 past it).
    pub max_cells_per_minute: Option<u32>,
}

/// One configured tenant.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// The `[[tenants]] name`: the prefix of its owner keys (before
    /// [`SEPARATOR`]).
    pub name: Arc<str>,
    digest: [u8; 32],
    /// Its `[[tenants]]` limits.
    pub limits: TenantLimits,
}

/// The configured tenants.
#[derive(Debug, Clone, Default)]
pub struct Tenants {
    list: Vec<Tenant>,
}

impl Tenants {
    /// The tenants of validated `[[tenants]]` entries, in config order;
    /// only each token's SHA-256 is kept.
    pub fn new(config: &[TenantConfig]) -> Tenants {
        Tenants {
            list: config
                .iter()
                .map(|t| Tenant {
                    name: t.name.as_str().into(),
                    digest: t.digest(),
                    limits: TenantLimits {
                        max_kernels: t.max_kernels,
                        max_sessions: t.max_sessions,
                        max_cells_per_minute: t.max_cells_per_minute,
                    },
                })
                .collect(),
        }
    }

    /// No tenants configured: every caller that gets in is the admin.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The tenants, in config order.
    pub fn iter(&self) -> impl Iterator<Item = &Tenant> {
        self.list.iter()
    }

    /// The tenant whose token is `token`. The token's SHA-256 is compared
    /// with every tenant's in constant time (no early exit, no length
    /// difference), so timing tells nothing about which bytes matched.
    pub fn authenticate(&self, token: &[u8]) -> Option<&Tenant> {
        use sha2::{Digest, Sha256};
        let digest: [u8; 32] = Sha256::digest(token).into();
        let mut found = None;
        for t in &self.list {
            let diff = t
                .digest
                .iter()
                .zip(&digest)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if std::hint::black_box(diff) == 0 {
                found = Some(t);
            }
        }
        found
    }

    /// The tenant called `name` (exact match).
    pub fn get(&self, name: &str) -> Option<&Tenant> {
        self.list.iter().find(|t| &*t.name == name)
    }

    /// The tenant the owner `key` belongs to (`None`: the admin's own).
    pub fn tenant_of(&self, key: &str) -> Option<&Tenant> {
        let (prefix, _) = key.split_once(SEPARATOR)?;
        self.get(prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_names_map_to_keys_only_they_see() {
        let a = Caller::Tenant("a".into());
        let b = Caller::Tenant("b".into());
        assert_eq!(a.key("s1"), "a:s1");
        assert_eq!(a.name_of("a:s1"), Some("s1"));
        assert_eq!(a.name_of("a:x:y"), Some("x:y"));
        assert_eq!(b.name_of("a:s1"), None);
        assert_eq!(a.name_of("ab:s1"), None);
        assert_eq!(a.name_of("s1"), None);
        assert_eq!(Caller::Admin.key("a:s1"), "a:s1");
        assert!(Caller::Admin.sees("a:s1") && !b.sees(&a.key("s1")));
    }

    #[test]
    fn tokens_find_their_tenant_and_keys_name_it() {
        let cfg = |name: &str, token: &str| TenantConfig {
            name: name.into(),
            token: Some(token.into()),
            ..TenantConfig::default()
        };
        let t = Tenants::new(&[cfg("a", "ta"), cfg("b", "tb")]);
        assert_eq!(t.authenticate(b"tb").map(|t| &*t.name), Some("b"));
        assert!(t.authenticate(b"t").is_none() && t.authenticate(b"").is_none());
        assert_eq!(t.tenant_of("a:s").map(|t| &*t.name), Some("a"));
        assert!(t.tenant_of("c:s").is_none() && t.tenant_of("s").is_none());
    }
}
