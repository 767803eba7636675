//! Forking a session at rest: its kernel is gone (evicted, reaped, or the
//! host restarted) and its state rests in the snapshot taken as the kernel
//! stopped. Each new session gets a link to that snapshot as its own (the
//! source keeps its own for its next cell) and a copy of the source's
//! workspace files; its first kernel loads it, as after any fork by
//! snapshot. The answer's `fallback_reason` says why no process was forked.

use std::time::Instant;

use cellhost_protocol::{ForkPath, ForkReport, Forked};

use super::fork::Copy;
use super::snapshots::{self, Meta};
use super::{KernelManager, ManagerError};
use crate::kernel::SnapshotSummary;

/// Why a session at rest is forked by snapshot.
const AT_REST: &str = "the source has no live kernel (it was evicted, reaped or the host \
                       restarted); its state was copied from the snapshot taken as its kernel \
                       stopped";

impl KernelManager {
    /// Fork `source`, which has no live kernel, from the snapshot its
    /// state rests in. `None`: it got a kernel meanwhile (fork that).
    ///
    /// # Errors
    /// No snapshot stands for its state (it has no kernel and no state to
    /// fork), a target that is not new, a workspace copy.
    pub(super) async fn fork_resting(
        &self,
        source: &str,
        into: &[String],
    ) -> Result<Option<ForkReport>, ManagerError> {
        // Neither the source's next kernel (which consumes its snapshot)
        // nor a target's starts, nor is any disposed, while the copies are
        // made.
        let owners: Vec<String> = into.iter().chain([&source.to_owned()]).cloned().collect();
        let mut held = Vec::new();
        for stripe in self.shared.starts.stripes_of(&owners) {
            held.push(stripe.write().await);
        }
        // A snapshot still being written as its kernel stopped.
        snapshots::written(&self.shared, |o| o == source).await;
        if self.shared.state().slots.keys().any(|k| k.owner == source) {
            return Ok(None);
        }
        let (zst, json) = snapshots::paths(&self.shared, source);
        let meta: Option<Meta> = std::fs::read(&json)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        // A remote session's stream stays on its host: not here.
        let (Some(meta), Ok(file)) = (meta, std::fs::metadata(&zst)) else {
            return Err(crate::kernel::SnapshotError::NoKernel.into());
        };
        for t in into {
            self.check_new(t).await?;
        }
        let taken = SnapshotSummary {
            names: meta.names,
            skipped: meta.skipped.clone(),
            raw_bytes: 0,
            bytes: file.len(),
        };
        let from_ws = self.workspace(source)?;
        let mut report = ForkReport {
            from: source.to_owned(),
            into: Vec::with_capacity(into.len()),
        };
        for (i, t) in into.iter().enumerate() {
            let started = Instant::now();
            let made = match self.copy_into(t, &from_ws).await {
                Ok(bytes) => self
                    .make_fork(source, t, Copy::Linked(&zst, &taken, meta.whole))
                    .await
                    .map(|()| bytes),
                Err(e) => Err(e),
            };
            match made {
                Ok(workspace_bytes) => report.into.push(Forked {
                    session: t.clone(),
                    child: None,
                    kernel_id: None,
                    path: ForkPath::Snapshot,
                    fallback_reason: Some(AT_REST.to_owned()),
                    workspace_bytes,
                    seconds: started.elapsed().as_secs_f64(),
                }),
                Err(e) => {
                    for done in &into[..=i] {
                        self.undo_fork(done).await;
                    }
                    return Err(e);
                }
            }
        }
        let mut state = self.shared.state();
        for f in &report.into {
            state.forks.insert(f.session.clone(), source.to_owned());
        }
        drop(state);
        drop(held);
        Ok(Some(report))
    }
}
