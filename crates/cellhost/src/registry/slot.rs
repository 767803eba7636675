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
    /// The state change this removal is.
    fn change(&self) -> StateChange {
        match self {
            Tombstone::Evicted { max_kernels } => StateChange::Evicted {
                max_kernels: *max_kernels,
            },
            Tombstone::Reaped { idle } => StateChange::Reaped { idle: *idle },
            Tombstone::Disposed => StateChange::Disposed,
        }
    }

    /// Make `result` (the first cell of the replacement kernel) say what
    /// happened to the previous one.
    pub(crate) fn tell(&self, result: &mut CellResult) {
        self.change().tell(&mut result.kernel);
    }

    /// The `kernel` event this removal is told to watchers as: the same
    /// sentence the next result carries.
    pub(crate) fn event(&self) -> (crate::events::KernelChange, String) {
        use crate::events::KernelChange;
        let kind = match self {
            Tombstone::Evicted { .. } => KernelChange::Evicted,
            Tombstone::Reaped { .. } => KernelChange::Reaped,
            Tombstone::Disposed => KernelChange::Disposed,
        };
        (kind, self.change().note())
    }
}

/// Where an entry's kernel is in its life.
#[derive(Debug)]
pub(crate) enum Life {
    /// No kernel yet (or its start failed).
    Empty,
    /// A caller is starting it, under the entry's turn lock.
    Starting,
    /// It runs. Shared here (not only under the turn lock) so
    /// housekeeping can shut it down while a cell runs.
    Running(Kernel),
    /// Removed from the registry; callers queued on it start over.
    Removed,
}

/// Bookkeeping read and written under a short std lock.
#[derive(Debug)]
pub(crate) struct Meta {
    pub life: Life,
    pub last_used: Instant,
    pub last_used_wall: SystemTime,
    /// Cells running or queued on this entry.
    pub in_flight: usize,
    /// Told to the first result of this entry's kernel.
    pub tombstone: Option<Tombstone>,
    /// The session this entry's kernel is a fork of (every result says
    /// so as `kernel.forked_from`).
    pub forked_from: Option<String>,
    /// Told to the first result instead of a restore: what this entry's
    /// kernel already holds (a process fork's copy of its source).
    pub pending: Option<super::snapshots::Loaded>,
}

impl Meta {
    /// The running kernel, if any.
    pub(crate) fn kernel(&self) -> Option<&Kernel> {
        match &self.life {
            Life::Running(k) => Some(k),
            _ => None,
        }
    }

    pub(crate) fn is_removed(&self) -> bool {
        matches!(self.life, Life::Removed)
    }

    /// Mark the entry removed, returning its kernel to kill.
    pub(crate) fn remove(&mut self) -> Option<Kernel> {
        match std::mem::replace(&mut self.life, Life::Removed) {
            Life::Running(k) => Some(k),
            _ => None,
        }
    }
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
                life: Life::Empty,
                last_used: Instant::now(),
                last_used_wall: SystemTime::now(),
                in_flight: 0,
                tombstone,
                forked_from: None,
                pending: None,
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
        matches!(meta.life, Life::Running(_) | Life::Starting) || meta.in_flight > 0
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
