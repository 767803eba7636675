//! What the manager reports: its counters and its kernels, one line each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use cellhost_protocol::{KernelState, KernelSummary};

use super::slot::Slot;
use super::KernelManager;
use crate::kernel::Kernel;

/// Counters since the manager started (for metrics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ManagerStats {
    /// Kernel processes started (for owners and for the warm pool).
    pub spawns: u64,
    /// Owners' first cells served by a kernel from the warm pool.
    pub pool_hits: u64,
    /// Idle kernels killed to stay within `max_kernels`.
    pub evictions: u64,
    /// Kernels killed for being idle past `idle_timeout`.
    pub reaps: u64,
    /// Kernels killed by [`KernelManager::dispose_owner`] or
    /// [`KernelManager::dispose_child`].
    pub disposals: u64,
    /// Tool calls that reached a tool.
    pub tool_calls: u64,
    /// Warm templates started (one per flavour, again after one failed).
    pub templates: u64,
    /// New kernels forked from a warm template (counted in `spawns` too).
    pub template_forks: u64,
}

/// The live counters behind [`ManagerStats`].
#[derive(Default)]
pub(super) struct Counters {
    pub(super) spawns: AtomicU64,
    pub(super) pool_hits: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) reaps: AtomicU64,
    pub(super) disposals: AtomicU64,
    pub(super) tool_calls: AtomicU64,
    pub(super) templates: AtomicU64,
    pub(super) template_forks: AtomicU64,
}

impl KernelManager {
    /// One line per owned kernel, oldest first.
    pub fn list(&self) -> Vec<KernelSummary> {
        let slots: Vec<Arc<Slot>> = self.shared.state().slots.values().cloned().collect();
        let now = std::time::Instant::now();
        let mut out: Vec<KernelSummary> = slots
            .iter()
            .map(|slot| {
                let meta = slot.meta();
                let kernel = meta.kernel();
                let state = if kernel.is_none() {
                    KernelState::Starting
                } else if meta.in_flight > 0 || kernel.is_some_and(Kernel::is_busy) {
                    KernelState::Busy
                } else {
                    KernelState::Idle
                };
                let pid = kernel.and_then(Kernel::pid);
                KernelSummary {
                    owner: slot.key.owner.clone(),
                    key: slot.key.to_string(),
                    id: kernel.map(Kernel::process_id).unwrap_or_default(),
                    backend: slot.key.backend.clone(),
                    pid,
                    state,
                    execution_count: kernel.map_or(0, Kernel::execution_count),
                    queued: meta.in_flight.saturating_sub(1),
                    created: unix_seconds(slot.created),
                    last_used: unix_seconds(meta.last_used_wall),
                    idle_seconds: if meta.in_flight > 0 {
                        0.0
                    } else {
                        now.duration_since(meta.last_used).as_secs_f64()
                    },
                    rss_bytes: pid
                        .filter(|_| slot.key.backend == "local")
                        .and_then(crate::kernel::rss_bytes),
                }
            })
            .collect();
        out.sort_by(|a, b| a.created.total_cmp(&b.created));
        out
    }

    /// Kernels waiting in the warm pool.
    pub fn pooled(&self) -> usize {
        self.shared.pool.len()
    }

    /// The counters since [`KernelManager::start`].
    pub fn stats(&self) -> ManagerStats {
        let c = &self.shared.counters;
        ManagerStats {
            spawns: c.spawns.load(Ordering::Relaxed) + self.shared.pool.spawned(),
            pool_hits: c.pool_hits.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            reaps: c.reaps.load(Ordering::Relaxed),
            disposals: c.disposals.load(Ordering::Relaxed),
            tool_calls: c.tool_calls.load(Ordering::Relaxed),
            templates: c.templates.load(Ordering::Relaxed),
            template_forks: c.template_forks.load(Ordering::Relaxed),
        }
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
