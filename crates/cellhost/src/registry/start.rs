//! A key's entry and its kernel: check the entry out, start its kernel
//! (or take one from the warm pool) under its turn, and forget an entry
//! whose start failed.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::key::KernelKey;
use super::slot::{Life, Slot};
use super::{housekeeping, pool, remote, template, workspace, KernelManager, ManagerError};
use crate::kernel::{Kernel, KernelError};

impl KernelManager {
    /// After a failed start: drop the entry if no one else uses it, so a
    /// bad interpreter or cwd leaves nothing behind (its tombstone stays
    /// for the owner's next call).
    pub(super) fn forget_unstarted(&self, slot: &Arc<Slot>) {
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
    pub(super) fn check_out(&self, key: &KernelKey) -> Result<Arc<Slot>, ManagerError> {
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
    pub(super) async fn kernel_of(
        &self,
        slot: &Slot,
    ) -> Result<Option<(Kernel, bool)>, ManagerError> {
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
        let opts = self.local_options(key)?;
        let k = match template::fork(&self.shared, &opts).await {
            Some(k) => k,
            None => Kernel::spawn(opts).await?,
        };
        self.shared.counters.spawns.fetch_add(1, Ordering::Relaxed);
        Ok((k, refill))
    }
}

impl KernelManager {
    /// What a new local kernel of `key` starts with: the template, its
    /// owner's workspace and package dir, the key's interpreter and cwd.
    pub(super) fn local_options(
        &self,
        key: &KernelKey,
    ) -> Result<crate::kernel::KernelOptions, crate::sandbox::SandboxError> {
        let opts = &self.shared.opts;
        let root = opts.workspace_root();
        let vols = opts.volumes();
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
        Ok(kernel)
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
