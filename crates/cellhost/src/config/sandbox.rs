//! `[sandbox]`: how kernels are isolated from the host.

use std::path::PathBuf;

use serde::Deserialize;

use crate::sandbox::{Sandbox, StrictSandbox};

/// The profile names accepted in the file and by `--sandbox`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    None,
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

/// `[sandbox]` keys. `profile` unset means the front end's default:
/// `strict` for the daemon (it serves agents), `none` for `cellhost run`
/// (the operator runs their own script).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    pub profile: Option<Profile>,
    /// strict: keep the host network (default false: no network).
    pub network: bool,
    /// strict, host running as root: the uid/gid kernels run as.
    pub uid: u32,
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
            network: strict.network,
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
                network: self.network,
                workspace: None,
                uid: self.uid,
                gid: self.gid,
                uid_range: match self.uid_range[..] {
                    [lo, hi] => Some((lo, hi)),
                    _ => None,
                },
                ro_binds: self.ro_binds.clone(),
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
