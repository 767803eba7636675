//! `[sandbox]`: how kernels are isolated from the host.

use std::path::PathBuf;

use serde::Deserialize;

use crate::sandbox::{Sandbox, StrictSandbox};

/// The profile names accepted in the file and by `--sandbox`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// `none`: no isolation ([`Sandbox::None`]).
    None,
    /// `strict`: bubblewrap isolation ([`Sandbox::Strict`]).
    Strict,
}

impl std::str::FromStr for Profile {
    type Err = String;

    fn from_str(s: &str) -> Result<Profile, String> {
        match s {
            "none" => Ok(Profile::None),
            "strict" => Ok(Profile::Strict),
            other => Err(format!(
                "unknown sandbox profile `{other}`: use `strict` or `none`"
            )),
        }
    }
}

/// `[sandbox] network`: what a strict kernel may reach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Network {
    /// Nothing: a private loopback only.
    #[default]
    Off,
    /// Only the host's egress proxy, to `allow_hosts`.
    Allowlist,
    /// The host's network (needs a daemon token; see docs/packages.md).
    Host,
}

impl<'de> Deserialize<'de> for Network {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Network, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Network;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"off\", \"allowlist\" or \"host\" (or a boolean: true is \"host\")")
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Network, E> {
                Ok(if b { Network::Host } else { Network::Off })
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Network, E> {
                match s {
                    "off" => Ok(Network::Off),
                    "allowlist" => Ok(Network::Allowlist),
                    "host" => Ok(Network::Host),
                    other => Err(E::custom(format!(
                        "unknown network mode {other:?}: use \"off\", \"allowlist\" or \"host\""
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `[sandbox]` keys. `profile` unset means the front end's default:
/// `strict` for the daemon (it serves agents), `none` for `cellhost run`
/// (the operator runs their own script).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    /// `profile`: `"none"` or `"strict"` (unset: the front end's default).
    pub profile: Option<Profile>,
    /// strict: `"off"` (default: no network), `"allowlist"` (only the
    /// host's egress proxy, to `allow_hosts`) or `"host"` (the host's
    /// network). The old booleans still work: `true` is `"host"`, `false`
    /// `"off"`.
    pub network: Network,
    /// `network = "allowlist"`: host names (`*.` wildcards) kernels reach.
    pub allow_hosts: Vec<String>,
    /// `network = "allowlist"`: address ranges otherwise refused
    /// (loopback, private, link-local) that the proxy may dial anyway. For
    /// tests that host an "allowed" server on this machine; never in
    /// production (`127.0.0.0/8` opens the daemon's own loopback).
    pub allow_private_cidrs: Vec<String>,
    /// strict, host running as root: the uid kernels run as (default
    /// 65534).
    pub uid: u32,
    /// strict, host running as root: the gid kernels run as (default
    /// 65534).
    pub gid: u32,
    /// strict, host running as root, daemon: one uid per session from this
    /// inclusive range, `[lo, hi]` (default `[200000, 265535]`); `[]`:
    /// every kernel runs as `uid`/`gid`.
    pub uid_range: Vec<u32>,
    /// strict: extra host paths mounted read-only at the same path.
    pub ro_binds: Vec<PathBuf>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        let strict = StrictSandbox::default();
        SandboxConfig {
            profile: None,
            network: Network::Off,
            allow_hosts: Vec::new(),
            allow_private_cidrs: Vec::new(),
            uid: strict.uid,
            gid: strict.gid,
            uid_range: strict
                .uid_range
                .map(|(lo, hi)| vec![lo, hi])
                .unwrap_or_default(),
            ro_binds: Vec::new(),
        }
    }
}

impl SandboxConfig {
    /// The sandbox for `profile` (or the configured one, or `default`).
    pub fn sandbox(&self, profile: Option<Profile>, default: Profile) -> Sandbox {
        match profile.or(self.profile).unwrap_or(default) {
            Profile::None => Sandbox::None,
            Profile::Strict => Sandbox::Strict(StrictSandbox {
                network: self.network == Network::Host,
                workspace: None,
                uid: self.uid,
                gid: self.gid,
                uid_range: match self.uid_range[..] {
                    [lo, hi] => Some((lo, hi)),
                    _ => None,
                },
                ro_binds: self.ro_binds.clone(),
                bench_omit: Default::default(),
                template: Default::default(),
                egress: (self.network == Network::Allowlist).then(|| {
                    std::sync::Arc::new(crate::egress::EgressPolicy {
                        allow_hosts: self.allow_hosts.clone(),
                        allow_cidrs: self
                            .allow_private_cidrs
                            .iter()
                            .filter_map(|c| c.parse().ok())
                            .collect(),
                        deny_hosts: Vec::new(),
                    })
                }),
            }),
        }
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        if self.uid == 0 || self.gid == 0 {
            return Err(
                "[sandbox] uid and gid must not be 0: kernels never run as root (the default is 65534, nobody)"
                    .into(),
            );
        }
        for c in &self.allow_private_cidrs {
            c.parse::<crate::egress::Cidr>()
                .map_err(|e| format!("[sandbox] allow_private_cidrs: {e}"))?;
        }
        if let Some(h) = self
            .allow_hosts
            .iter()
            .find(|h| h.trim_start_matches("*.").is_empty() || h.contains(['/', ':', ' ']))
        {
            return Err(format!(
                "[sandbox] allow_hosts entries are host names like \"pypi.org\" or \"*.example.com\", not {h:?}"
            ));
        }
        match self.uid_range[..] {
            [] => {}
            [lo, hi] if lo > 0 && lo <= hi => {}
            _ => {
                return Err(format!(
                    "[sandbox] uid_range = {:?} is not a range: use two uids [lo, hi] with 0 < lo <= hi (default [200000, 265535]), or [] for one uid for every kernel",
                    self.uid_range
                ))
            }
        }
        if let Some(p) = self.ro_binds.iter().find(|p| !p.is_absolute()) {
            return Err(format!(
                "[sandbox] ro_binds entries must be absolute paths, not {}",
                p.display()
            ));
        }
        Ok(())
    }
}
