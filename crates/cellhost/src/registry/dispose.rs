//! Disposing of a session's or a delegated child's kernels (reset or
//! close): kill them outside the lock, tell their next call, and remove
//! their sandbox workspaces.

use std::sync::atomic::Ordering;

use super::key::{belongs_to_session, child_owner, KernelKey, OwnerError};
use super::slot::Tombstone;
use super::{housekeeping, workspace, KernelManager};

impl KernelManager {
    /// Kill all kernels of `session` and of its delegated children (session
    /// reset or close), and remove their sandbox workspaces. Returns how
    /// many kernels were killed.
    pub async fn dispose_owner(&self, session: &str) -> usize {
        let _no_starts = self.shared.starts.of(session).write().await;
        let n = self
            .dispose_where(|owner| belongs_to_session(owner, session))
            .await;
        self.remove_workspaces(session).await;
        n
    }

    /// Kill only the kernels of `parent`'s delegated child `child` (and of
    /// that child's own children), and remove their workspaces.
    pub async fn dispose_child(&self, parent: &str, child: &str) -> Result<usize, OwnerError> {
        let owner = child_owner(parent, child)?;
        let _no_starts = self.shared.starts.of(&owner).write().await;
        let n = self.dispose_where(|o| belongs_to_session(o, &owner)).await;
        self.remove_workspaces(&owner).await;
        Ok(n)
    }

    /// The workspace of `owner` (a session, or a delegated child
    /// `"{parent}::child::{id}"`): read and write its files, before its
    /// first cell (a write creates it) or while its kernel is busy. A
    /// child's workspace is its own: the parent's handle never sees it.
    ///
    /// # Errors
    /// [`ManagerError::Owner`](super::ManagerError::Owner) for an invalid owner.
    pub fn workspace(&self, owner: &str) -> Result<crate::files::Workspace, super::ManagerError> {
        super::key::validate_owner(owner)?;
        let opts = &self.shared.opts;
        if let Some(backend) = super::remote::workspace_backend(opts, &self.shared.backends, owner)
        {
            if let Some(ws) = self
                .shared
                .backends
                .workspace(&backend, owner, opts.workspace_quota)
            {
                return Ok(crate::files::Workspace::remote(ws));
            }
        }
        let dir = workspace::of_owner(&opts.workspace_root(), owner, opts.volumes());
        opts.remount_volume(&dir);
        Ok(crate::files::Workspace::new(
            dir.clone(),
            opts.workspace_in_kernel(&dir),
            opts.workspace_quota,
            opts.prepare_workspace(),
        ))
    }

    /// The workspaces of `owner` and its children (after its kernels died),
    /// here and on the remote backend its files live on.
    async fn remove_workspaces(&self, owner: &str) {
        let root = self.shared.opts.workspace_root();
        workspace::remove(&root, &workspace::home(&root, owner));
        let opts = &self.shared.opts;
        if let Some(backend) = super::remote::workspace_backend(opts, &self.shared.backends, owner)
        {
            self.shared.backends.drop_workspace(&backend, owner).await;
        }
    }

    async fn dispose_where(&self, pick: impl Fn(&str) -> bool) -> usize {
        let mut told: Vec<String> = Vec::new();
        let mut snapshots: Vec<String> = Vec::new();
        let victims = {
            let mut state = self.shared.state();
            let keys: Vec<KernelKey> = state
                .slots
                .keys()
                .filter(|k| pick(&k.owner))
                .cloned()
                .collect();
            state.killing += 1;
            // Whatever an owner's next call would have been told (its
            // kernel was evicted, say), it is now told the session was
            // reset: that is what its caller asked for.
            for (k, why) in state.tombstones.iter_mut().filter(|(k, _)| pick(&k.owner)) {
                *why = Tombstone::Disposed;
                snapshots.push(k.owner.clone());
            }
            // A disposed session's state never comes back: not from an
            // eviction's snapshot, nor from one a previous host left.
            let left: Vec<String> = state
                .restart_snapshots
                .iter()
                .filter(|name| pick(name))
                .cloned()
                .collect();
            for name in left {
                state.restart_snapshots.remove(&name);
                snapshots.push(name);
            }
            // Nor does a fork's copy that no kernel loaded yet.
            let forks: Vec<String> = state.forks.keys().filter(|n| pick(n)).cloned().collect();
            for name in forks {
                state.forks.remove(&name);
                snapshots.push(name);
            }
            let mut victims = Vec::new();
            for k in keys {
                let Some(slot) = state.slots.remove(&k) else {
                    continue;
                };
                if !told.contains(&k.owner) {
                    told.push(k.owner.clone());
                }
                // Also an entry whose kernel is still starting: its
                // caller starts over and must hear of the reset.
                victims.extend(housekeeping::mark_removed(&slot));
                housekeeping::remember(&mut state, k, Tombstone::Disposed);
            }
            victims
        };
        let n = victims.len();
        self.shared
            .counters
            .disposals
            .fetch_add(n as u64, Ordering::Relaxed);
        housekeeping::kill_all(victims).await;
        // A snapshot still being written of a kernel that stopped just
        // before would land after the removal below.
        super::snapshots::written(&self.shared, &pick).await;
        for owner in told.iter().chain(&snapshots) {
            super::snapshots::remove(&self.shared, owner);
        }
        self.shared.state().killing -= 1;
        let (change, note) = Tombstone::Disposed.event();
        for owner in told {
            self.shared.events.kernel(&owner, change, &note);
        }
        n
    }
}

/// A disposal holds its session's turn exclusively, from the kill of its
/// kernels to the removal of its workspaces; a kernel start holds it
/// shared. So a start never runs in a workspace being removed, and one
/// queued behind a disposal finds its entry removed and starts over.
/// Striped by session (a session and its children share a stripe).
#[derive(Default)]
pub(super) struct Starts([tokio::sync::RwLock<()>; 16]);

impl Starts {
    pub(super) fn of(&self, owner: &str) -> &tokio::sync::RwLock<()> {
        &self.0[Self::stripe(owner)]
    }

    /// The stripes of `owners`, each once, in order (so that whoever holds
    /// several takes them in the same order: no deadlock).
    pub(super) fn stripes_of<'a>(
        &self,
        owners: impl IntoIterator<Item = &'a String>,
    ) -> Vec<&tokio::sync::RwLock<()>> {
        let mut idx: Vec<usize> = owners.into_iter().map(|o| Self::stripe(o)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| &self.0[i]).collect()
    }

    fn stripe(owner: &str) -> usize {
        use std::hash::{Hash, Hasher};
        let session = owner
            .split(crate::owner::CHILD_SEPARATOR)
            .next()
            .unwrap_or(owner);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        session.hash(&mut h);
        (h.finish() % 16) as usize
    }
}
