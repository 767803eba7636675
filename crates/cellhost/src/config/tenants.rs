//! `[[tenants]]`: clients of one daemon kept apart. Each has a name, a
//! token (or its SHA-256, so the file need not hold the secret) and
//! optional limits; see [`crate::tenant`] and docs/tenants.md.

use serde::Deserialize;

/// One `[[tenants]]` entry.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant's name: 1 to 64 of `A-Z a-z 0-9 _ . -`. The admin names
    /// the tenant's session `s` as `NAME:s`.
    pub name: String,
    /// The tenant's bearer token.
    #[serde(default)]
    pub token: Option<String>,
    /// The SHA-256 of the tenant's bearer token, 64 hex digits (instead
    /// of `token`).
    #[serde(default)]
    pub token_sha256: Option<String>,
    /// Most live kernels at once; a cell that would start another gets 429.
    #[serde(default)]
    pub max_kernels: Option<usize>,
    /// Most sessions with live kernels at once; a cell of another gets 429.
    #[serde(default)]
    pub max_sessions: Option<usize>,
    /// Most cells started in any 60 seconds (429 past it).
    #[serde(default)]
    pub max_cells_per_minute: Option<u32>,
}

impl TenantConfig {
    /// The SHA-256 of the tenant's token.
    pub fn digest(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        if let Some(t) = &self.token {
            return Sha256::digest(t.as_bytes()).into();
        }
        let hex = self.token_sha256.as_deref().unwrap_or_default();
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = hex
                .get(2 * i..2 * i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .unwrap_or(0);
        }
        out
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        let n = &self.name;
        if n.is_empty()
            || n.len() > 64
            || !n
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err(format!(
                "[[tenants]] name = {n:?}: a name is 1 to 64 of A-Z a-z 0-9 _ . -"
            ));
        }
        match (&self.token, &self.token_sha256) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(format!(
                    "[[tenants]] {n:?}: give exactly one of token and token_sha256"
                ))
            }
            (Some(t), None) if t.trim().is_empty() => {
                return Err(format!("[[tenants]] {n:?}: token must not be empty"))
            }
            (None, Some(h)) if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) => {
                return Err(format!(
                    "[[tenants]] {n:?}: token_sha256 must be 64 hex digits (sha256sum of the \
                     token, e.g. `printf %s \"$TOKEN\" | sha256sum`)"
                ))
            }
            _ => {}
        }
        for (key, v) in [
            ("max_kernels", self.max_kernels),
            ("max_sessions", self.max_sessions),
            (
                "max_cells_per_minute",
                self.max_cells_per_minute.map(|v| v as usize),
            ),
        ] {
            if v == Some(0) {
                return Err(format!(
                    "[[tenants]] {n:?}: {key} must be at least 1 (remove the key for no limit)"
                ));
            }
        }
        Ok(())
    }
}

/// Checks the whole list: each entry, unique names, unique tokens.
pub(super) fn validate(tenants: &[TenantConfig]) -> Result<(), String> {
    let mut names = std::collections::BTreeSet::new();
    let mut digests = std::collections::BTreeSet::new();
    for t in tenants {
        t.validate()?;
        if !names.insert(t.name.as_str()) {
            return Err(format!(
                "[[tenants]]: a tenant named {:?} is already configured; names must be unique",
                t.name
            ));
        }
        if !digests.insert(t.digest()) {
            return Err(format!(
                "[[tenants]] {:?} has the same token as another tenant; each needs its own",
                t.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, token: Option<&str>, sha: Option<&str>) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            token: token.map(Into::into),
            token_sha256: sha.map(Into::into),
            ..TenantConfig::default()
        }
    }

    #[test]
    fn a_token_and_its_sha256_are_the_same_tenant_key() {
        // sha256("secret")
        let sha = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b";
        assert_eq!(
            t("a", Some("secret"), None).digest(),
            t("a", None, Some(sha)).digest()
        );
        assert!(
            validate(&[t("a", Some("secret"), None), t("b", None, Some(sha))])
                .unwrap_err()
                .contains("same token")
        );
    }

    #[test]
    fn bad_entries_are_refused_with_the_reason() {
        for (entry, why) in [
            (t("a:b", Some("x"), None), "name"),
            (t("", Some("x"), None), "name"),
            (t("a", None, None), "exactly one"),
            (t("a", Some("x"), Some(&"0".repeat(64))), "exactly one"),
            (t("a", None, Some("abc")), "64 hex"),
            (t("a", Some(" "), None), "empty"),
        ] {
            let err = entry.validate().unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        let zero = TenantConfig {
            max_kernels: Some(0),
            ..t("a", Some("x"), None)
        };
        assert!(zero.validate().unwrap_err().contains("max_kernels"));
        assert!(
            validate(&[t("a", Some("x"), None), t("a", Some("y"), None)])
                .unwrap_err()
                .contains("unique")
        );
    }
}
