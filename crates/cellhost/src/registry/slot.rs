//! One registry entry: a kernel key, its (lazily started) kernel, the
//! turn lock that runs its cells one at a time, and its bookkeeping.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use cellhost_protocol::CellResult;

use super::key::KernelKey;
use crate::kernel::{Kernel, StateChange};
use crate::tools::ToolSet;

/// Why an owner's previous kernel is gone; told to its next call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tombstone {
    Evicted { max_kernels: usize },
    Reaped { idle: Duration },
    Disposed,
}

impl Tombstone {
    /// Make `result` (the first cell of the replacement kernel) say what
    /// happened to the previous one.
    pub(crate) fn tell(&self, result: &mut CellResult) {
        let change = match self {
            Tombstone::Evicted { max_kernels } => StateChange::Evicted {
                max_kernels: *max_kernels,
            },
            Tombstone::Reaped { idle } => StateChange::Reaped { idle: *idle },
            Tombstone::Disposed => StateChange::Disposed,
        };
        change.tell(&mut result.kernel);
    }
}

/// Bookkeeping read and written under a short std lock.
#[derive(Debug)]
pub(crate) struct Meta {
    /// The kernel, once started. Shared here (not only under the turn
    /// lock) so housekeeping can shut it down while a cell runs.
    pub kernel: Option<Kernel>,
    pub last_used: Instant,
    pub last_used_wall: SystemTime,
    /// Cells running or queued on this entry.
    pub in_flight: usize,
    pub starting: bool,
    /// Removed from the registry; callers queued on it start over.
    pub removed: bool,
    /// Told to the first result of this entry's kernel.
    pub tombstone: Option<Tombstone>,
}

#[derive(Debug)]
pub(crate) struct Slot {
    pub key: KernelKey,
    pub created: SystemTime,
    /// Held for the whole of a cell: cells run in arrival order (tokio's
    /// mutex is fair) and only one caller ever starts the kernel.
    pub turn: tokio::sync::Mutex<()>,
    /// The key's tools (the same set every cell, so a kernel's `tools`
    /// module is sent once).
    pub tools: Option<ToolSet>,
    meta: Mutex<Meta>,
}

impl Slot {
    pub(crate) fn new(
        key: KernelKey,
        tools: Option<ToolSet>,
        tombstone: Option<Tombstone>,
    ) -> Slot {
        Slot {
            key,
            tools,
            created: SystemTime::now(),
            turn: tokio::sync::Mutex::new(()),
            meta: Mutex::new(Meta {
                kernel: None,
                last_used: Instant::now(),
                last_used_wall: SystemTime::now(),
                in_flight: 0,
                starting: false,
                removed: false,
                tombstone,
            }),
        }
    }

    /// The bookkeeping. A panic elsewhere never poisons it for good: the
    /// data stays consistent field by field.
    pub(crate) fn meta(&self) -> MutexGuard<'_, Meta> {
        self.meta.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn touch(meta: &mut Meta) {
        meta.last_used = Instant::now();
        meta.last_used_wall = SystemTime::now();
    }

    /// A kernel runs, is being started, or is about to be (a call is in
    /// flight): it counts against the cap.
    pub(crate) fn is_live(meta: &Meta) -> bool {
        meta.kernel.is_some() || meta.starting || meta.in_flight > 0
    }
}

/// Decrements `in_flight` when a call leaves the entry, however it leaves.
pub(crate) struct InFlight<'a>(pub &'a Slot);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut meta = self.0.meta();
        meta.in_flight = meta.in_flight.saturating_sub(1);
        Slot::touch(&mut meta);
    }
}
