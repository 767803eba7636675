//! `[history]`: how much cell history the daemon keeps.

use serde::Deserialize;

/// `[history]` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryConfig {
    /// Record cells at all.
    pub enabled: bool,
    /// Most cells kept (oldest go first; 0: no limit).
    pub max_rows: u64,
    /// Days a cell is kept (0: no limit).
    pub max_days: u64,
    /// Answer a cell only once its row has committed, so every cell a
    /// client saw survives a daemon SIGKILL (costs ~0.1 ms per cell);
    /// `false` answers at once and a kill may lose the last ~5 ms of rows.
    pub wait_for_commit: bool,
    /// Largest code, stdout, stderr, value or error stored per row, in
    /// bytes; longer text keeps its head and tail around a marker that
    /// says how much was cut (for code, with the full code's sha256).
    pub max_field_bytes: usize,
}

impl HistoryConfig {
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.max_field_bytes < 1024 {
            return Err("[history] max_field_bytes must be at least 1024".into());
        }
        Ok(())
    }
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            enabled: true,
            max_rows: 100_000,
            max_days: 30,
            wait_for_commit: true,
            max_field_bytes: 64 * 1024,
        }
    }
}
