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
//! entry in `slot.rs`, running a cell in `execute.rs`, starting an entry's
//! kernel in `start.rs`, eviction and reaping in `housekeeping.rs`,
//! disposal in `dispose.rs`, attachments in `attach.rs`, counters and the
//! kernel list in `stats.rs`, the warm pool in `pool.rs`, crash recovery
//! in `recovery.rs`.

mod attach;
mod dispose;
mod execute;
mod fork;
mod housekeeping;
mod key;
mod options;
mod pool;
mod recovery;
mod remote;
mod resting;
mod slot;
mod snapshots;
mod start;
mod stats;
mod template;
mod uids;
mod volume;
mod workspace;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::events::EventBus;
use crate::kernel::{Kernel, KernelError};
use crate::tools::ToolSetError;
use slot::{Slot, Tombstone};
use stats::Counters;

pub use attach::Attachment;
pub use fork::{ForkError, MAX_FORK_TARGETS};
pub use key::{
    belongs_to_session, child_owner, is_child, validate_owner, KernelKey, KernelSpec, OwnerError,
    CHILD_SEPARATOR,
};
pub use options::{default_data_dir, ManagerOptions};
pub use recovery::RecoveryReport;
pub use stats::ManagerStats;
pub(crate) use workspace::dir_name as workspace_dir_name;

/// Failure of a manager call. A cell that fails is not an error: it is a
/// [`CellResult`](cellhost_protocol::CellResult) that says so.
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
    /// A snapshot asked for could not be taken.
    #[error(transparent)]
    Snapshot(#[from] crate::kernel::SnapshotError),
    /// A fork was refused or failed (its snapshot's reasons are
    /// [`ManagerError::Snapshot`]).
    #[error(transparent)]
    Fork(#[from] fork::ForkError),
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
    /// Owners whose snapshots a previous host left, until their first
    /// kernel here (`snapshots.rs`).
    restart_snapshots: std::collections::HashSet<String>,
    /// New sessions a fork made (their snapshot waits beside the others),
    /// and the session each is a fork of, until their first kernel.
    forks: HashMap<String, String>,
    /// Sessions whose stopped kernel's snapshot is being written, and the
    /// gate their next kernel and their disposal wait on (`snapshots.rs`).
    snapshotting: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
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
    /// Warm templates new kernels are forked from (`template.rs`).
    templates: template::Templates,
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
        let snapshot_dir = opts.snapshot_dir();
        let shared = Arc::new(Shared {
            fs_warning,
            backends: remote::backends(&opts),
            pool: pool::Pool::new(opts.warm_pool),
            events: EventBus::new(opts.event_buffer).redacting(opts.kernel.env.secrets.clone()),
            muted: EventBus::muted(),
            opts,
            state: Mutex::new(State {
                restart_snapshots: snapshots::left_by_predecessor(&snapshot_dir),
                ..State::default()
            }),
            counters: Counters::default(),
            recovery,
            starts: dispose::Starts::default(),
            templates: template::Templates::default(),
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

    /// The remote backends (session defaults, fleet loads, placement).
    pub fn backends(&self) -> &crate::remote::Backends {
        &self.shared.backends
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
        let owned: Vec<_> = drained
            .iter()
            .filter_map(|slot| {
                let k = housekeeping::mark_removed(slot)?;
                Some((slot.key.clone(), cellhost_protocol::RestoreFrom::Restart, k))
            })
            .collect();
        let owned = snapshots::stopping(&self.shared, &mut self.shared.state(), owned);
        let pooled = self.shared.pool.close();
        let root = self.shared.opts.workspace_root();
        let pool_dirs: Vec<_> = pooled.iter().filter_map(|(_, ws)| ws.clone()).collect();
        let mut unowned: Vec<Kernel> = pooled.into_iter().map(|(k, _)| k).collect();
        unowned.extend(self.shared.templates.close().await);
        // Idle owned kernels leave a snapshot for the next host (where
        // snapshots are on); the pool's are just killed.
        tokio::join!(
            snapshots::stop_all(&self.shared, owned),
            housekeeping::kill_all(unowned)
        );
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

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
}
