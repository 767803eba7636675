//! The kernel registry: which kernel belongs to whom, how many live, and
//! when they die.
//!
//! A [`KernelManager`] maps a [`KernelKey`] (owner, backend, interpreter,
//! cwd, tool set) to one kernel. Cells for one key run one at a time in
//! arrival order; parallel callers share one process. The manager caps
//! live kernels (LRU, never a busy or pinned one), reaps idle ones on
//! every call and from a background task, keeps a warm pool of unowned
//! kernels for new owners, records live processes for crash recovery and
//! reaps what a crashed predecessor left. It tears kernels down outside
//! its lock.
//!
//! Concepts live in their own files: owners and keys in `key.rs`, one
//! entry in `slot.rs`, eviction and reaping in `housekeeping.rs`, the warm
//! pool in `pool.rs`, crash recovery in `recovery.rs`.

mod dispose;
mod housekeeping;
mod key;
mod options;
mod pool;
mod recovery;
mod remote;
mod slot;
mod uids;
mod volume;
mod workspace;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use cellhost_protocol::{CellResult, KernelState, KernelSummary};

use crate::events::{EventBus, KernelChange};
use crate::kernel::{Cell, CellEvent, Kernel, KernelError};
use crate::tools::{ToolSet, ToolSetError};
use slot::{InFlight, Life, Slot, Tombstone};
use tokio::sync::mpsc;

pub use key::{
    belongs_to_session, child_owner, is_child, validate_owner, KernelKey, KernelSpec, OwnerError,
    CHILD_SEPARATOR,
};
pub use options::{default_data_dir, ManagerOptions};
pub use recovery::RecoveryReport;
pub(crate) use workspace::dir_name as workspace_dir_name;

/// Failure of a manager call. A cell that fails is not an error: it is a
/// [`CellResult`] that says so.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// The owner (session id) is not a valid name.
    #[error(transparent)]
    Owner(#[from] OwnerError),
    /// The owner's kernel could not be started.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// [`KernelManager::shutdown`] has run; the manager takes no cells.
    #[error("the kernel manager has shut down; start a new one")]
    ShutDown,
    /// The kernel spec names a tool the manager does not have.
    #[error(transparent)]
    Tools(#[from] ToolSetError),
}

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
}

#[derive(Default)]
struct Counters {
    spawns: AtomicU64,
    pool_hits: AtomicU64,
    evictions: AtomicU64,
    reaps: AtomicU64,
    disposals: AtomicU64,
    tool_calls: AtomicU64,
}

#[derive(Default)]
struct State {
    slots: HashMap<KernelKey, Arc<Slot>>,
    /// Why a key's previous kernel is gone, until its next call. Bounded:
    /// see `housekeeping::remember`.
    tombstones: HashMap<KernelKey, Tombstone>,
    /// Attachments per owner: attached owners are never reaped.
    attached: HashMap<String, usize>,
    /// Kills under way outside the lock (housekeeping, disposals), so
    /// `shutdown` can wait for them.
    killing: usize,
    closed: bool,
}

struct Shared {
    opts: ManagerOptions,
    backends: crate::remote::Backends,
    state: Mutex<State>,
    pool: pool::Pool,
    counters: Counters,
    recovery: RecoveryReport,
    /// Why workspaces are not on volumes of their own, when asked for.
    fs_warning: Option<String>,
    events: EventBus,
    /// Where hidden cells publish: nowhere.
    muted: EventBus,
    /// Serializes kernel starts with disposals of the same session.
    starts: dispose::Starts,
}

impl Drop for Shared {
    /// A manager dropped without `shutdown` (a panicking caller) still
    /// detaches its volumes; only a killed process leaves them mounted
    /// (the next start reuses them).
    fn drop(&mut self) {
        // The kernels' staging tmpfs mounts and the /etc template's: the
        // kernels go later (their sandboxes keep their own mounts).
        let staging = &self.opts.kernel.staging_root;
        crate::sys::mount::unmount_under(staging);
        crate::sandbox::etc::release(staging);
        if self.opts.volumes() {
            let root = self.opts.workspace_root();
            // Our own pool's volumes first: `unmount_all` keeps the pools
            // of live hosts, and this process is one.
            for (_, ws) in self.pool.close() {
                if let Some(ws) = ws {
                    workspace::remove_pooled(&root, &ws);
                }
            }
            volume::unmount_all(&root, |m| workspace::in_live_pool(&root, m), false);
        }
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The registry of session kernels. Cheap to clone; clones share it.
#[derive(Clone)]
pub struct KernelManager {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for KernelManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelManager")
            .field("data_dir", &self.shared.opts.data_dir)
            .finish_non_exhaustive()
    }
}

impl KernelManager {
    /// Start a manager: reap what a crashed host left in `data_dir`, sweep
    /// stale staging dirs, fill the warm pool and start the background
    /// reaper. Must be called within a tokio runtime.
    pub async fn start(mut opts: ManagerOptions) -> KernelManager {
        opts.kernel.record_dir = Some(opts.record_dir());
        let fs_warning = match (opts.workspace_fs, opts.workspace_quota) {
            (true, Some(quota)) => volume::unavailable().map(|why| {
                opts.workspace_fs = false;
                format!(
                    "cellhost: warning: workspaces are not on filesystems of their own ({why}): \
                     the quota ([limits] workspace_mib = {}) bounds uploads only; a cell's own \
                     writes are bounded per file ([limits] max_file_size_mib), not per workspace, \
                     and can fill the data dir's filesystem",
                    quota / (1024 * 1024)
                )
            }),
            _ => None,
        };
        let recovery = {
            let (records, staging, age, workspaces) = (
                opts.record_dir(),
                opts.kernel.staging_root.clone(),
                opts.stale_staging_age,
                opts.workspace_root(),
            );
            tokio::task::spawn_blocking(move || {
                let mut report = recovery::recover(&records, &staging, age);
                report.pool_workspaces_removed = workspace::sweep_pool_dirs(&workspaces);
                report
            })
            .await
            .unwrap_or_default()
        };
        let shared = Arc::new(Shared {
            fs_warning,
            backends: remote::backends(&opts),
            pool: pool::Pool::new(opts.warm_pool),
            events: EventBus::new(opts.event_buffer).redacting(opts.kernel.env.secrets.clone()),
            muted: EventBus::muted(),
            opts,
            state: Mutex::new(State::default()),
            counters: Counters::default(),
            recovery,
            starts: dispose::Starts::default(),
        });
        pool::refill(&shared);
        housekeeping::start_reaper(&shared);
        KernelManager { shared }
    }

    /// What start-up recovery found.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.shared.recovery
    }

    /// Set when workspace filesystems were asked for and the host cannot
    /// have them: what is unbounded (front ends print it at start).
    pub fn workspace_fs_warning(&self) -> Option<&str> {
        self.shared.fs_warning.as_deref()
    }

    /// The session event bus: watch a session's cells, output and kernels
    /// live ([`EventBus::subscribe`]).
    pub fn events(&self) -> &EventBus {
        &self.shared.events
    }

    /// The options this manager runs with.
    pub fn options(&self) -> &ManagerOptions {
        &self.shared.opts
    }

    /// Whether [`shutdown`](Self::shutdown) has begun (every later call
    /// fails with [`ManagerError::ShutDown`]).
    pub fn is_shut_down(&self) -> bool {
        self.shared.state().closed
    }

    /// Run `cell` in `owner`'s default kernel.
    pub async fn execute(&self, owner: &str, cell: Cell) -> Result<CellResult, ManagerError> {
        self.execute_with(owner, &KernelSpec::default(), cell).await
    }

    /// Run `cell` in the kernel of `(owner, spec)`, starting it if needed.
    ///
    /// The kernel's `tools` module offers `spec.tools`, which must all be
    /// registered ([`ManagerOptions::tools`]); the cell's allow-list and
    /// budget are its own ([`Cell::allow`], [`Cell::max_tool_calls`]).
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
            let explained = untold.tombstone.is_some();
            if let Some(t) = untold.tombstone.take() {
                t.tell(&mut result);
            }
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

    /// After a failed start: drop the entry if no one else uses it, so a
    /// bad interpreter or cwd leaves nothing behind (its tombstone stays
    /// for the owner's next call).
    fn forget_unstarted(&self, slot: &Arc<Slot>) {
        let mut state = self.shared.state();
        if !state
            .slots
            .get(&slot.key)
            .is_some_and(|s| Arc::ptr_eq(s, slot))
        {
            return;
        }
        let tombstone = {
            let mut meta = slot.meta();
            if !matches!(meta.life, Life::Empty) || meta.in_flight > 1 {
                return;
            }
            meta.life = Life::Removed;
            meta.tombstone.take()
        };
        state.slots.remove(&slot.key);
        if let Some(t) = tombstone {
            housekeeping::remember(&mut state, slot.key.clone(), t);
        }
    }

    /// Get or create the entry for `key`, counted as in flight.
    fn check_out(&self, key: &KernelKey) -> Result<Arc<Slot>, ManagerError> {
        let mut state = self.shared.state();
        if state.closed {
            return Err(ManagerError::ShutDown);
        }
        let slot = match state.slots.get(key) {
            Some(s) => s.clone(),
            None => {
                let tools = if key.spec.tools.is_empty() {
                    None
                } else {
                    Some(self.shared.opts.tools.subset(&key.spec.tools)?)
                };
                let tombstone = state.tombstones.remove(key);
                let s = Arc::new(Slot::new(key.clone(), tools, tombstone));
                state.slots.insert(key.clone(), s.clone());
                s
            }
        };
        let mut meta = slot.meta();
        meta.in_flight += 1;
        Slot::touch(&mut meta);
        drop(meta);
        Ok(slot)
    }

    /// The entry's kernel, started (or taken from the pool) under its turn
    /// lock, and whether the pool wants a refill after the cell. `None`
    /// when the entry was removed meanwhile.
    async fn kernel_of(&self, slot: &Slot) -> Result<Option<(Kernel, bool)>, ManagerError> {
        {
            let mut meta = slot.meta();
            match &meta.life {
                Life::Running(k) => return Ok(Some((k.clone(), false))),
                Life::Removed => return Ok(None),
                Life::Empty | Life::Starting => meta.life = Life::Starting,
            }
        }
        // Back to empty however this future ends (a caller may give up
        // mid-spawn).
        let starting = Starting(slot);
        // Never while the session is being disposed: its workspace would
        // be removed under the new kernel.
        let start_turn = self.shared.starts.of(&slot.key.owner).read().await;
        if slot.meta().is_removed() {
            return Ok(None); // disposed while we waited: start over
        }
        let started = self.new_kernel(&slot.key).await;
        drop(start_turn);
        let removed = {
            let mut meta = slot.meta();
            match &started {
                Ok((k, _)) if matches!(meta.life, Life::Starting) => {
                    meta.life = Life::Running(k.clone());
                }
                _ => {}
            }
            meta.is_removed()
        };
        drop(starting);
        let (kernel, refill) = started.map_err(KernelError::from)?;
        if removed {
            kernel.shutdown().await;
            if refill {
                pool::refill(&self.shared);
            }
            return Ok(None);
        }
        Ok(Some((kernel, refill)))
    }

    async fn new_kernel(
        &self,
        key: &KernelKey,
    ) -> Result<(Kernel, bool), crate::kernel::SpawnError> {
        let opts = &self.shared.opts;
        let root = opts.workspace_root();
        let vols = opts.volumes();
        // A miss (an empty pool, or dead pooled kernels) asks for a refill
        // too: refills otherwise follow only pool hits.
        let mut refill = false;
        if key.backend != "local" {
            let k = remote::spawn(opts, &self.shared.backends, key).await?;
            self.shared.counters.spawns.fetch_add(1, Ordering::Relaxed);
            return Ok((k, false));
        }
        if key.spec.is_default_process() && self.shared.pool.target() > 0 {
            refill = true;
            if let Some((k, ws)) = self.shared.pool.take(&root) {
                // Under a managed sandbox the pooled kernel's workspace
                // becomes the owner's, unless the owner already has files.
                match ws {
                    Some(dir) if !workspace::adopt(&root, &dir, &key.owner) => {
                        self.shared.pool.put_back((k, Some(dir)));
                    }
                    adopted => {
                        if adopted.is_some() {
                            k.workspace_moved(workspace::of_owner(&root, &key.owner, vols));
                        }
                        k.packages_moved(workspace::packages_of_owner(&root, &key.owner, vols));
                        let hits = &self.shared.counters.pool_hits;
                        hits.fetch_add(1, Ordering::Relaxed);
                        return Ok((k, true));
                    }
                }
            }
        }
        let mut kernel = opts
            .kernel_with_workspace(|| workspace::of_owner(&root, &key.owner, vols), &key.owner)?;
        if !kernel.sandbox.is_strict() && kernel.packages.dir.is_none() {
            // `none` kernels install into the same per-session dir.
            kernel.packages.dir = Some(workspace::packages_of_owner(&root, &key.owner, vols));
        }
        if let Some(p) = &key.spec.python {
            kernel.python = Some(p.clone());
        }
        if let Some(c) = &key.spec.cwd {
            kernel.cwd = Some(c.clone());
        }
        let k = Kernel::spawn(kernel).await?;
        self.shared.counters.spawns.fetch_add(1, Ordering::Relaxed);
        Ok((k, refill))
    }

    /// The remote backends (session defaults, fleet loads, placement).
    pub fn backends(&self) -> &crate::remote::Backends {
        &self.shared.backends
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

    /// Keep `owner`'s kernels from being reaped while the guard lives (a
    /// front end streaming them, a user attached from the dashboard).
    pub fn attach(&self, owner: &str) -> Attachment {
        *self
            .shared
            .state()
            .attached
            .entry(owner.to_owned())
            .or_default() += 1;
        Attachment {
            shared: self.shared.clone(),
            owner: owner.to_owned(),
        }
    }

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
        }
    }

    /// Reap idle kernels and enforce the cap now (the background task and
    /// every call do this too).
    pub async fn housekeep(&self) {
        housekeeping::run(&self.shared).await;
    }

    /// Kill every kernel (owned and pooled) and wait until all are gone.
    /// Later calls fail with [`ManagerError::ShutDown`]. Idempotent.
    pub async fn shutdown(&self) {
        let drained: Vec<Arc<Slot>> = {
            let mut state = self.shared.state();
            state.closed = true;
            state.slots.drain().map(|(_, slot)| slot).collect()
        };
        let mut all: Vec<Kernel> = drained
            .iter()
            .filter_map(|slot| housekeeping::mark_removed(slot))
            .collect();
        let pooled = self.shared.pool.close();
        let root = self.shared.opts.workspace_root();
        let pool_dirs: Vec<_> = pooled.iter().filter_map(|(_, ws)| ws.clone()).collect();
        all.extend(pooled.into_iter().map(|(k, _)| k));
        housekeeping::kill_all(all).await;
        // A caller still starting a kernel holds its entry's turn until it
        // has killed what it started; kills begun by housekeeping or a
        // disposal just before are waited for too.
        for slot in &drained {
            drop(slot.turn.lock().await);
        }
        housekeeping::settled(&self.shared).await;
        self.shared.pool.settled().await;
        for dir in pool_dirs {
            workspace::remove_pooled(&root, &dir);
        }
        // No volume of ours stays mounted (a restart mounts them again).
        let _ = tokio::task::spawn_blocking(move || {
            volume::unmount_all(&root, |m| workspace::in_live_pool(&root, m), true)
        })
        .await;
        self.shared.backends.shutdown().await;
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

/// An entry still starting when dropped (its start failed or was given
/// up) is empty again.
struct Starting<'a>(&'a Slot);

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        let mut meta = self.0.meta();
        if matches!(meta.life, Life::Starting) {
            meta.life = Life::Empty;
        }
    }
}

/// Keeps an owner's kernels from idle reaping while alive.
#[derive(Debug)]
pub struct Attachment {
    shared: Arc<Shared>,
    owner: String,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        if let Some(n) = state.attached.get_mut(&self.owner) {
            *n -= 1;
            if *n == 0 {
                state.attached.remove(&self.owner);
            }
        }
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
