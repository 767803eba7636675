//! `[files]`: the workspace file routes (uploads and downloads).

use serde::Deserialize;

/// `[files]` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FilesConfig {
    /// Largest upload in MiB (default 1024; 0: no limit but the quota).
    pub max_upload_mib: u64,
}

impl Default for FilesConfig {
    fn default() -> Self {
        FilesConfig {
            max_upload_mib: 1024,
        }
    }
}

impl FilesConfig {
    /// `max_upload_mib` in bytes (`None` for 0).
    pub fn max_upload_bytes(&self) -> Option<u64> {
        (self.max_upload_mib > 0).then(|| self.max_upload_mib.saturating_mul(1024 * 1024))
    }
}
