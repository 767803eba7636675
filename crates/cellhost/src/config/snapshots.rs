//! `[snapshots]`: how large a session's snapshot may be (docs/snapshots.md);
//! when snapshots are taken is `[lifecycle] snapshots`.

use serde::Deserialize;

/// `[snapshots]` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SnapshotsConfig {
    /// Largest snapshot stream in MiB before compression (default 1024).
    /// A state over it keeps no snapshot; its loss is reported as before.
    pub max_mib: u64,
    /// Seconds one snapshot or restore may take (default 60): past them
    /// the kernel is interrupted (killed after the interrupt grace) and
    /// nothing is kept. A shutdown waits at most this for its snapshots.
    pub timeout_seconds: u64,
}

impl Default for SnapshotsConfig {
    fn default() -> Self {
        SnapshotsConfig {
            max_mib: 1024,
            timeout_seconds: 60,
        }
    }
}

impl SnapshotsConfig {
    /// `max_mib` in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_mib.saturating_mul(1024 * 1024)
    }

    /// `timeout_seconds` as a duration.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_seconds)
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        if self.max_mib == 0 {
            return Err("[snapshots] max_mib must be at least 1 (turn snapshots off with [lifecycle] snapshots = \"off\")".into());
        }
        if self.timeout_seconds == 0 {
            return Err("[snapshots] timeout_seconds must be at least 1".into());
        }
        Ok(())
    }
}
