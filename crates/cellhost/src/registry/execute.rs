//! The cell path: a caller's cell from its kernel entry to its result,
//! published to the owner's watchers as it runs, and interrupting it.

use std::sync::atomic::Ordering;

use cellhost_protocol::CellResult;
use tokio::sync::mpsc;

use super::key::{validate_owner, KernelSpec};
use super::slot::{InFlight, Slot, Tombstone};
use super::snapshots::{self, Loaded};
use super::{housekeeping, pool, remote, KernelManager, ManagerError};
use crate::events::{EventBus, KernelChange};
use crate::kernel::{Cell, CellEvent, Kernel, KernelError};
use crate::tools::{ToolSet, ToolSetError};

impl KernelManager {
    /// Run `cell` in `owner`'s default kernel.
    pub async fn execute(&self, owner: &str, cell: Cell) -> Result<CellResult, ManagerError> {
        self.execute_with(owner, &KernelSpec::default(), cell).await
    }

    /// Run `cell` in the kernel of `(owner, spec)`, starting it if needed.
    ///
    /// The kernel's `tools` module offers `spec.tools`, which must all be
    /// registered ([`ManagerOptions::tools`](super::ManagerOptions::tools));
    /// the cell's allow-list and budget are its own ([`Cell::allow`],
    /// [`Cell::max_tool_calls`]).
    ///
    /// # Cancel safety
    /// Dropping the future gives the turn to the next caller; a cell
    /// already sent still runs to completion (interrupt it to stop it).
    pub async fn execute_with(
        &self,
        owner: &str,
        spec: &KernelSpec,
        cell: Cell,
    ) -> Result<CellResult, ManagerError> {
        validate_owner(owner)?;
        let key = remote::key_for(&self.shared.opts, &self.shared.backends, owner, spec);
        let mut cell = cell;
        if let Some(allow) = &cell.allow {
            if let Some(stray) = allow.iter().find(|n| !spec.tools.contains(*n)) {
                return Err(ToolSetError::NotInKernel {
                    tool: stray.clone(),
                    kernel: ToolSet::known_names(&spec.tools),
                }
                .into());
            }
        }
        loop {
            let slot = self.check_out(&key)?;
            let _in_flight = InFlight(&slot);
            housekeeping::run(&self.shared).await;
            let _turn = slot.turn.lock().await;
            if slot.meta().is_removed() {
                continue; // disposed or evicted while we queued: start over
            }
            let fresh = slot.meta().kernel().is_none();
            let (kernel, refill) = match self.kernel_of(&slot).await {
                Ok(Some(k)) => k,
                Ok(None) => continue,
                Err(e) => {
                    self.forget_unstarted(&slot);
                    return Err(e);
                }
            };
            let mut untold = Untold {
                slot: &slot,
                tombstone: slot.meta().tombstone.take(),
            };
            // A fresh kernel loads the snapshot that stands for the
            // session's state, if one does, before the cell runs.
            let loaded = if fresh {
                slot.meta().forked_from = None;
                let (restart, forked) = {
                    let mut state = self.shared.state();
                    (
                        state.restart_snapshots.remove(owner),
                        state.forks.remove(owner),
                    )
                };
                snapshots::restore(
                    &self.shared,
                    &key,
                    &kernel,
                    untold.tombstone.as_ref(),
                    restart,
                    cell.reset,
                    forked.as_deref(),
                )
                .await
            } else {
                let pending = slot.meta().pending.take();
                // A reset discards what a process fork copied.
                pending.filter(|_| !cell.reset).unwrap_or(Loaded::Nothing)
            };
            let bus = if cell.hidden {
                &self.shared.muted
            } else {
                &self.shared.events
            };
            if fresh {
                let pid = kernel
                    .pid()
                    .map_or(String::new(), |p| format!(" (pid {p})"));
                bus.kernel(
                    owner,
                    KernelChange::Spawned,
                    &format!("A kernel process{pid} started for this session."),
                );
            } else if cell.reset {
                bus.kernel(
                    owner,
                    KernelChange::Reset,
                    "The kernel is being reset as asked: earlier state is discarded and the cell \
                     runs in a fresh process.",
                );
            }
            // The key's tools, never the caller's own: every tool is one
            // registered with the manager.
            cell.tools.clone_from(&slot.tools);
            let (result, count) = Self::run_watched(bus, owner, &kernel, &cell).await;
            if refill {
                // Refill only now: a spawn started during the cell would
                // compete with it for the runtime and the CPU.
                pool::refill(&self.shared);
            }
            if matches!(result, Err(KernelError::Closed)) && slot.meta().is_removed() {
                // Disposed between taking the kernel and sending the cell:
                // the cell never ran, so it runs on the owner's next kernel.
                if let Some(n) = count {
                    let why = "the session was disposed as the cell started; it runs again on a fresh kernel";
                    bus.cell_failed(owner, n, "disposed", why);
                }
                continue;
            }
            let mut result = match result {
                Ok(r) => r,
                Err(e) => {
                    if let Some(n) = count {
                        bus.cell_failed(owner, n, "kernel", &crate::error_chain(&e));
                    }
                    return Err(e.into());
                }
            };
            let calls = &self.shared.counters.tool_calls;
            calls.fetch_add(result.tool_calls_made, Ordering::Relaxed);
            let explained = untold.tombstone.is_some() || !matches!(loaded, Loaded::Nothing);
            match loaded {
                Loaded::Restored(change, restored, forked_from) => {
                    untold.tombstone = None;
                    change.tell(&mut result.kernel);
                    result.kernel.restored = Some(restored);
                    if forked_from.is_some() {
                        slot.meta().forked_from = forked_from;
                    }
                    bus.kernel(owner, KernelChange::Restored, &change.note());
                }
                Loaded::Failed(change) => {
                    untold.tombstone = None;
                    change.tell(&mut result.kernel);
                }
                Loaded::Nothing => {
                    if let Some(t) = untold.tombstone.take() {
                        t.tell(&mut result);
                    }
                }
            }
            result.kernel.forked_from = slot.meta().forked_from.clone();
            let k = &result.kernel;
            if k.ended || (k.state_lost && !explained) {
                let note = k
                    .note
                    .as_deref()
                    .unwrap_or("The kernel died during the cell.");
                bus.kernel(owner, KernelChange::Died, note);
            }
            if !cell.caller_finishes {
                let n = count.unwrap_or(result.kernel.execution_count);
                bus.cell_finished(owner, n, &result);
            }
            return Ok(result);
        }
    }

    /// Run `cell` on `kernel`, publishing its start and its output to the
    /// owner's watchers as they happen (and passing the output on to the
    /// cell's own sink). Returns the result and the execution count the
    /// cell was announced with (`None`: it never reached a process).
    async fn run_watched(
        bus: &EventBus,
        owner: &str,
        kernel: &Kernel,
        cell: &Cell,
    ) -> (Result<CellResult, KernelError>, Option<u64>) {
        let (started_tx, mut started) = mpsc::unbounded_channel();
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let mut run = cell.clone();
        let sink = run.events.replace(events_tx);
        run.started = Some(started_tx);
        let mut count: Option<u64> = None;
        let announce = |count: &mut Option<u64>, n: u64| {
            *count = Some(n);
            bus.cell_started(owner, n, &cell.code, cell.front_end);
        };
        let pass = |count: &mut Option<u64>, e: CellEvent| {
            if count.is_none() {
                // Not told yet (a backend that does not say): the next one.
                let n = kernel.execution_count() + 1;
                *count = Some(n);
                bus.cell_started(owner, n, &cell.code, cell.front_end);
            }
            bus.cell_event(owner, count.unwrap_or_default(), &e);
            if let Some(sink) = &sink {
                let _ = sink.send(e);
            }
        };
        let exec = kernel.execute(run);
        tokio::pin!(exec);
        let result = loop {
            tokio::select! {
                biased;
                Some(n) = started.recv(), if count.is_none() => announce(&mut count, n),
                Some(e) = events.recv() => pass(&mut count, e),
                r = &mut exec => break r,
            }
        };
        if count.is_none() {
            if let Ok(n) = started.try_recv() {
                announce(&mut count, n);
            }
        }
        while let Ok(e) = events.try_recv() {
            pass(&mut count, e);
        }
        (result, count)
    }

    /// Interrupt the running cell of each of `owner`'s kernels (not its
    /// children's). Returns how many cells were interrupted.
    pub async fn interrupt(&self, owner: &str) -> usize {
        let kernels: Vec<Kernel> = {
            let state = self.shared.state();
            state
                .slots
                .values()
                .filter(|s| s.key.owner == owner)
                .filter_map(|s| s.meta().kernel().cloned())
                .collect()
        };
        let mut n = 0;
        for k in kernels {
            if k.interrupt().await.unwrap_or(false) {
                n += 1;
            }
        }
        n
    }
}

/// Holds a tombstone until the result that tells it is in hand; a call
/// that fails or is dropped first puts it back for the next one.
struct Untold<'a> {
    slot: &'a Slot,
    tombstone: Option<Tombstone>,
}

impl Drop for Untold<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.tombstone.take() {
            self.slot.meta().tombstone.get_or_insert(t);
        }
    }
}
