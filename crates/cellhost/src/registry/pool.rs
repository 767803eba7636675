//! The warm pool: spawned, idle, unowned kernels ready for new owners, so a
//! new session's first cell costs about what a warm cell costs.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use std::path::{Path, PathBuf};

use super::{workspace, Shared};
use crate::kernel::Kernel;

pub(super) struct Pool {
    target: usize,
    ready: Mutex<Ready>,
    /// Spawns in progress.
    filling: AtomicUsize,
    spawned: AtomicU64,
}

/// A pooled kernel and its own workspace (under a managed sandbox).
pub(super) type Pooled = (Kernel, Option<PathBuf>);

#[derive(Default)]
struct Ready {
    kernels: Vec<Pooled>,
    closed: bool,
    /// Set when a spawn failed: the pool stops refilling rather than
    /// retry in a loop (owners still get kernels spawned on demand).
    broken: bool,
}

impl Pool {
    pub(super) fn new(target: usize) -> Pool {
        Pool {
            target,
            ready: Mutex::new(Ready::default()),
            filling: AtomicUsize::new(0),
            spawned: AtomicU64::new(0),
        }
    }

    fn ready(&self) -> MutexGuard<'_, Ready> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A pooled kernel whose process is alive, if any. Dead ones are
    /// dropped (their actors clean up) and their workspaces removed.
    pub(super) fn take(&self, workspaces: &Path) -> Option<Pooled> {
        let mut ready = self.ready();
        while let Some((k, ws)) = ready.kernels.pop() {
            if k.pid().is_some_and(crate::sys::pid_alive) {
                return Some((k, ws));
            }
            if let Some(dir) = ws {
                workspace::remove_pooled(workspaces, &dir);
            }
        }
        None
    }

    /// Return a kernel taken but not used (its workspace could not be
    /// handed to the owner that asked).
    pub(super) fn put_back(&self, pooled: Pooled) {
        self.ready().kernels.push(pooled);
    }

    pub(super) fn target(&self) -> usize {
        self.target
    }

    pub(super) fn len(&self) -> usize {
        self.ready().kernels.len()
    }

    pub(super) fn spawned(&self) -> u64 {
        self.spawned.load(Ordering::Relaxed)
    }

    /// Wait until no pool spawn is in progress (after [`Pool::close`]).
    pub(super) async fn settled(&self) {
        while self.filling.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Stop refilling and hand back the pooled kernels to kill.
    pub(super) fn close(&self) -> Vec<Pooled> {
        let mut ready = self.ready();
        ready.closed = true;
        std::mem::take(&mut ready.kernels)
    }
}

/// Top the pool up to its target in the background. Returns at once: each
/// missing kernel is made by a task of its own, its workspace (a volume
/// to copy and mount, a uid to allocate, a dir to make) on a blocking
/// thread, so the caller (the first cell of a session that just took a
/// pooled kernel) never waits for any of it.
pub(super) fn refill(shared: &Arc<Shared>) {
    let pool = &shared.pool;
    loop {
        {
            let ready = pool.ready();
            let want = pool.target;
            let have = ready.kernels.len() + pool.filling.load(Ordering::SeqCst);
            if ready.closed || ready.broken || have >= want {
                return;
            }
            pool.filling.fetch_add(1, Ordering::SeqCst);
        }
        tokio::spawn(fill(Arc::downgrade(shared)));
    }
}

/// What a refill's blocking half made.
enum Prepared {
    Ready(Box<crate::kernel::KernelOptions>, Unclaimed),
    /// No uid or workspace for a pooled kernel.
    Failed,
    /// The manager is gone.
    Gone,
}

/// The options and workspace of one pooled kernel (blocking: volumes,
/// uids and dirs are made here).
fn prepare(weak: &Weak<Shared>) -> Prepared {
    let Some(shared) = weak.upgrade() else {
        return Prepared::Gone;
    };
    let root = shared.opts.workspace_root();
    let vols = shared.opts.volumes();
    // Removes the pooled workspace (a mounted volume) unless the kernel
    // reaches the pool: on every failure below, and when the task that
    // waits for this one is dropped halfway (its runtime shut down
    // during the spawn), as the guard then drops with the task's output.
    let mut unclaimed = Unclaimed {
        root: root.clone(),
        dir: None,
    };
    let made = shared.opts.kernel_with_workspace(
        || {
            let dir = workspace::pool_dir(&root, vols);
            unclaimed.dir = Some(dir.clone());
            dir
        },
        &crate::kernel::random_hex(6),
    );
    match made {
        Ok(mut opts) => {
            opts.preload.clone_from(&shared.opts.preload);
            opts.warmup = shared.opts.warmup;
            Prepared::Ready(Box::new(opts), unclaimed)
        }
        Err(_) => Prepared::Failed,
    }
}

/// Make one pooled kernel (a refill's share, counted in `filling`).
async fn fill(weak: Weak<Shared>) {
    let prepared = {
        let weak = weak.clone();
        tokio::task::spawn_blocking(move || prepare(&weak)).await
    };
    let done = |shared: &Shared, broken: bool| {
        let pool = &shared.pool;
        if broken {
            pool.ready().broken = true;
        }
        pool.filling.fetch_sub(1, Ordering::SeqCst);
    };
    let (opts, mut unclaimed) = match prepared {
        Ok(Prepared::Ready(opts, unclaimed)) => (opts, unclaimed),
        Ok(Prepared::Failed) => {
            // Stop refilling (owners still get kernels spawned on
            // demand, which say why).
            if let Some(shared) = weak.upgrade() {
                done(&shared, true);
            }
            return;
        }
        Ok(Prepared::Gone) | Err(_) => {
            if let Some(shared) = weak.upgrade() {
                done(&shared, false);
            }
            return;
        }
    };
    if let Some(shared) = weak.upgrade() {
        if shared.pool.ready().closed {
            // Shut down while the workspace was made: no spawn.
            drop(unclaimed);
            done(&shared, false);
            return;
        }
    }
    let forked = match weak.upgrade() {
        Some(shared) => super::template::fork(&shared, &opts).await,
        None => None,
    };
    let spawned = match forked {
        Some(k) => Ok(k),
        None => Kernel::spawn(*opts).await,
    };
    let Some(shared) = weak.upgrade() else {
        // The manager was dropped while this kernel started: its
        // workspace (a mounted volume) goes with it (the guard).
        if let Ok(k) = spawned {
            k.shutdown().await;
        }
        return;
    };
    let pool = &shared.pool;
    let leftover = match spawned {
        Ok(k) => {
            let mut ready = pool.ready();
            if ready.closed {
                Some(k)
            } else {
                pool.spawned.fetch_add(1, Ordering::Relaxed);
                ready.kernels.push((k, unclaimed.claim()));
                // Under the lock: a refill never counts this kernel twice.
                pool.filling.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        }
        Err(_) => None,
    };
    // Spawned after shutdown: kill it and remove its workspace before
    // saying the spawn is over, so `shutdown` (waiting on `filling`)
    // never returns while either lives.
    if let Some(k) = leftover {
        k.shutdown().await;
        drop(unclaimed);
        done(&shared, false);
    } else {
        drop(unclaimed);
        done(&shared, true);
    }
}

/// A pooled kernel's workspace not (yet) in the pool: removed on drop.
struct Unclaimed {
    root: std::path::PathBuf,
    dir: Option<std::path::PathBuf>,
}

impl Unclaimed {
    /// The kernel is in the pool: its workspace is the pool's now.
    fn claim(&mut self) -> Option<PathBuf> {
        self.dir.take()
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            workspace::remove_pooled(&self.root, &dir);
        }
    }
}
