//! The warm pool: spawned, idle, unowned kernels ready for new owners, so a
//! new session's first cell costs about what a warm cell costs.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

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

/// Top the pool up to its target in the background.
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
        let weak = Arc::downgrade(shared);
        let root = shared.opts.workspace_root();
        let vols = shared.opts.volumes();
        let mut ws = None;
        let made = shared.opts.kernel_with_workspace(
            || {
                let dir = workspace::pool_dir(&root, vols);
                ws = Some(dir.clone());
                dir
            },
            &crate::kernel::random_hex(6),
        );
        let mut opts = match made {
            Ok(opts) => opts,
            Err(_) => {
                // No uid or workspace for a pooled kernel: stop refilling
                // (owners still get kernels spawned on demand, which say why).
                if let Some(dir) = &ws {
                    workspace::remove_pooled(&root, dir);
                }
                pool.ready().broken = true;
                pool.filling.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        };
        opts.preload.clone_from(&shared.opts.preload);
        // Removes the pooled workspace (a mounted volume) unless the kernel
        // reaches the pool, also when this task is dropped halfway (its
        // runtime shut down during the spawn).
        let mut unclaimed = Unclaimed {
            root: root.clone(),
            dir: ws.clone(),
        };
        tokio::spawn(async move {
            let spawned = Kernel::spawn(opts).await;
            if spawned.is_err() {
                if let Some(dir) = &ws {
                    workspace::remove_pooled(&root, dir);
                }
            }
            let Some(shared) = weak.upgrade() else {
                // The manager was dropped while this kernel started: its
                // workspace (a mounted volume) goes with it.
                if let Ok(k) = spawned {
                    k.shutdown().await;
                    if let Some(dir) = &ws {
                        workspace::remove_pooled(&root, dir);
                    }
                }
                return;
            };
            let pool = &shared.pool;
            let leftover = {
                let mut ready = pool.ready();
                let leftover = match spawned {
                    Ok(k) if !ready.closed => {
                        pool.spawned.fetch_add(1, Ordering::Relaxed);
                        unclaimed.claim();
                        ready.kernels.push((k, ws.take()));
                        None
                    }
                    Ok(k) => Some(k),
                    Err(_) => {
                        ready.broken = true;
                        None
                    }
                };
                if leftover.is_none() {
                    pool.filling.fetch_sub(1, Ordering::SeqCst);
                }
                leftover
            };
            // Spawned after shutdown: kill it before saying the spawn is
            // over, so `shutdown` (waiting on `filling`) never returns
            // while it lives.
            if let Some(k) = leftover {
                k.shutdown().await;
                if let Some(dir) = &ws {
                    workspace::remove_pooled(&root, dir);
                }
                pool.filling.fetch_sub(1, Ordering::SeqCst);
            }
        });
    }
}

/// A pooled kernel's workspace not (yet) in the pool: removed on drop.
struct Unclaimed {
    root: std::path::PathBuf,
    dir: Option<std::path::PathBuf>,
}

impl Unclaimed {
    /// The kernel is in the pool: its workspace is the pool's now.
    fn claim(&mut self) {
        self.dir = None;
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            workspace::remove_pooled(&self.root, &dir);
        }
    }
}
