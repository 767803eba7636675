//! `[lifecycle]`: how many kernels live, for how long, and how many wait
//! warm in the pool.

use std::time::Duration;

use serde::Deserialize;

/// Limits of the kernel registry (see `registry`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LifecycleConfig {
    /// Most live kernels across all owners (LRU eviction past it).
    pub max_kernels: usize,
    /// Seconds a kernel may sit idle before it is reaped (0: never).
    pub idle_timeout: u64,
    /// Spawned, idle, unowned kernels kept ready for new owners.
    pub warm_pool: usize,
    /// When a session's state is snapshotted so that it outlives its
    /// kernel (`"on_stop"`, the default: on eviction, idle reaping and
    /// shutdown; `"off"`: never). See docs/snapshots.md.
    pub snapshots: SnapshotMode,
}

/// `[lifecycle] snapshots`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// On eviction, idle reaping and shutdown; restored on the next cell.
    #[default]
    OnStop,
    /// Never: a stopped kernel's state is lost (and said so).
    Off,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        LifecycleConfig {
            max_kernels: 32,
            idle_timeout: 1800,
            warm_pool: 2,
            snapshots: SnapshotMode::OnStop,
        }
    }
}

impl LifecycleConfig {
    /// The idle timeout, `None` when reaping is off.
    pub fn idle_timeout(&self) -> Option<Duration> {
        (self.idle_timeout > 0).then(|| Duration::from_secs(self.idle_timeout))
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        if self.max_kernels == 0 {
            return Err("[lifecycle] max_kernels must be at least 1".into());
        }
        if self.warm_pool > self.max_kernels {
            return Err(format!(
                "[lifecycle] warm_pool ({}) must not exceed max_kernels ({})",
                self.warm_pool, self.max_kernels
            ));
        }
        Ok(())
    }
}
