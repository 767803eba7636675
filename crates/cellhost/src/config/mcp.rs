//! `[mcp]`: how the daemon's `/mcp` endpoint treats its MCP sessions.

use std::time::Duration;

use serde::Deserialize;

/// `[mcp]` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// Seconds an MCP session may go without a request and without a
    /// running cell before it is closed and its implicit kernel disposed
    /// (0: never; named sessions are left to the kernel idle reaper).
    pub idle_session_seconds: u64,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            idle_session_seconds: 600,
        }
    }
}

impl McpConfig {
    /// The idle period, `None` when idle sessions are never closed.
    pub fn idle_session(&self) -> Option<Duration> {
        (self.idle_session_seconds > 0).then(|| Duration::from_secs(self.idle_session_seconds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_session_defaults_to_ten_minutes_and_zero_is_never() {
        assert_eq!(
            McpConfig::default().idle_session(),
            Some(Duration::from_secs(600))
        );
        let c: McpConfig = toml::from_str("idle_session_seconds = 0").unwrap();
        assert_eq!(c.idle_session(), None);
        let err = toml::from_str::<McpConfig>("idle_seconds = 5")
            .unwrap_err()
            .to_string();
        assert!(err.contains("idle_seconds"), "{err}");
    }
}
