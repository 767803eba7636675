//! Forking a session (docs/snapshots.md): new sessions that start with an
//! independent copy of a source session's interpreter state and workspace
//! files.
//!
//! The path built is snapshot and restore: between the source's cells
//! (its turn held, so its state and files hold still), its namespace is
//! snapshotted once and its workspace's files are copied into each new
//! session's workspace, through the same `openat` walks the file API uses
//! (never through a symlink, counted against the target's quota). Each
//! target gets the snapshot as its own, and its first kernel loads it
//! before its first cell, which says so (`kernel.restored` with `from:
//! "fork"`; every result of that kernel carries `kernel.forked_from`).
//! Nothing is shared after the fork: each side's variables and files are
//! its own. A target must be new: no kernel, no snapshot, no files.
//!
//! A remote source's copy stays on its host (`snapshots.rs`): it is
//! snapshotted once per target there, and each target session runs on
//! the source's backend.
//!
//! Where the source is a local `none` kernel, each target is first tried
//! by process fork (`kernel/fork.rs`): the runner `fork()`s and the child
//! is re-homed as the target's own kernel, copy-on-write, installed in
//! its entry before its first cell (which says so, `restored.from =
//! "fork"`). A strict or remote source, or a kernel the runner will not
//! fork (threads of its own, open files), falls back to the snapshot
//! path, and the answer says which path ran for each target and why.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

use cellhost_protocol::{ForkPath, ForkReport, Forked, RestoreFrom};

use super::key::validate_owner;
use super::snapshots::{self, Meta};
use super::{KernelManager, ManagerError};
use crate::files::{EntryType, FileError, Opened, Workspace, WriteLimits};
use crate::kernel::{SnapshotError, StateChange};

/// At most this many new sessions per fork.
pub const MAX_FORK_TARGETS: usize = 16;

/// At most this many workspace entries are copied per fork.
const MAX_ENTRIES: usize = 100_000;

/// Why a remote session is not forked by process.
const REMOTE: &str = "the source runs on a remote backend, where the host cannot re-home a \
                      forked process; its state was copied by snapshot and restore on its host";

/// The one snapshot of a local source, shared by its targets.
struct Once {
    tmp: std::path::PathBuf,
    taken: crate::kernel::SnapshotSummary,
    seconds: f64,
}

/// Why a fork was refused or failed (besides its snapshot's reasons).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForkError {
    /// No target was named.
    #[error("name at least one new session to fork into (`into`: a name or a list of names)")]
    NoTargets,
    /// Too many targets at once.
    #[error("a fork makes at most {max} sessions at once; {asked} were asked for")]
    TooMany {
        /// [`MAX_FORK_TARGETS`].
        max: usize,
        /// How many were asked for.
        asked: usize,
    },
    /// A target was named twice, or is the source.
    #[error("session {0} is named twice (or is the source); name each new session once")]
    Repeated(String),
    /// A target already has a kernel, a snapshot or files.
    #[error("session {target} {why}: fork into a new session, or dispose of this one first")]
    TargetInUse {
        /// The target.
        target: String,
        /// What it has.
        why: &'static str,
    },
    /// A delegated child target would run on another backend than the
    /// remote source (whose copy stays on its host).
    #[error("{target} runs on backend {theirs}, not on {source_backend}, where its copy of the state would be; fork into a new session instead")]
    OtherBackend {
        /// The target.
        target: String,
        /// Its backend.
        theirs: String,
        /// The source's.
        source_backend: String,
    },
    /// The source's workspace could not be copied (the target's quota,
    /// or a file operation).
    #[error("could not copy the workspace into {target}")]
    Workspace {
        /// The target.
        target: String,
        /// The failure.
        #[source]
        err: FileError,
    },
}

impl KernelManager {
    /// Fork `source`'s live (local, default-spec) kernel into each of
    /// `into` (new sessions, or delegated children): each starts with an
    /// independent copy of the source's state (loaded before its first
    /// cell) and of its workspace files. The source runs on untouched. A
    /// source at rest (its kernel evicted, reaped or gone with a restart)
    /// is forked from the snapshot its state rests in.
    ///
    /// # Errors
    /// Invalid names, too many or repeated targets, a target in use, the
    /// source's snapshot (no live kernel, the cap, the runner's reason),
    /// or the workspace copy (a target's quota).
    pub async fn fork(&self, source: &str, into: &[String]) -> Result<ForkReport, ManagerError> {
        validate_owner(source)?;
        if into.is_empty() {
            return Err(ForkError::NoTargets.into());
        }
        if into.len() > MAX_FORK_TARGETS {
            return Err(ForkError::TooMany {
                max: MAX_FORK_TARGETS,
                asked: into.len(),
            }
            .into());
        }
        let mut seen = HashSet::from([source]);
        for t in into {
            validate_owner(t)?;
            if !seen.insert(t.as_str()) {
                return Err(ForkError::Repeated(t.clone()).into());
            }
        }
        // A kernel evicted between the look and the turn leaves its
        // snapshot: then that is forked (and the other way round).
        for _ in 0..3 {
            let slot = match snapshots::live_source(&self.shared, source) {
                Ok(slot) => Some(slot),
                Err(SnapshotError::NoKernel) => None,
                Err(e) => return Err(e.into()),
            };
            if let Some(slot) = slot {
                let _turn = slot.turn.lock().await;
                match snapshots::live_kernel(&slot) {
                    Ok(kernel) => return self.fork_live(&slot, into, &kernel).await,
                    Err(SnapshotError::NoKernel) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            // Its kernel is gone (evicted, reaped, a restart): from the
            // snapshot its state rests in, if one does.
            if let Some(report) = self.fork_resting(source, into).await? {
                self.tell_forked(source, into.len());
                return Ok(report);
            }
        }
        Err(SnapshotError::NoKernel.into())
    }

    /// Fork `slot`'s live `kernel` (its turn held).
    async fn fork_live(
        &self,
        slot: &super::slot::Slot,
        into: &[String],
        kernel: &crate::kernel::Kernel,
    ) -> Result<ForkReport, ManagerError> {
        let source = slot.key.owner.as_str();
        let backend = slot.key.backend.clone();
        // No kernel of a target starts, and none is disposed, while its
        // copy is made (striped locks, each once, in order).
        let mut held = Vec::new();
        for stripe in self.shared.starts.stripes_of(into) {
            held.push(stripe.write().await);
        }
        // A remote source's copy stays on its host: the new sessions run
        // on its backend too.
        let placed = self.place_targets(into, &backend)?;
        let made = self.fork_into(slot, into, kernel, &backend).await;
        if made.is_err() {
            self.unplace(placed);
        }
        let report = made?;
        drop(held);
        self.tell_forked(source, into.len());
        Ok(report)
    }

    /// Tell `source`'s watchers it was forked into `n` new sessions.
    fn tell_forked(&self, source: &str, n: usize) {
        let plural = if n == 1 { "session" } else { "sessions" };
        self.shared.events.kernel(
            source,
            crate::events::KernelChange::Forked,
            &format!(
                "This session was forked into {n} new {plural}: each starts with a copy of its \
                 state and files as they are now."
            ),
        );
    }

    /// Whether `owner`'s state rests in a snapshot on this host (its
    /// kernel is gone), so it can be forked without a live kernel.
    pub fn has_snapshot(&self, owner: &str) -> bool {
        let (zst, json) = snapshots::paths(&self.shared, owner);
        zst.is_file() && json.is_file()
    }

    /// For a source on remote `backend`: each target runs there too (a
    /// session's default backend is set; a child must already be on it).
    /// Returns the sessions whose default was set, with the one each had.
    fn place_targets(&self, into: &[String], backend: &str) -> Result<Placed, ManagerError> {
        let mut placed = Vec::new();
        if backend == "local" {
            return Ok(placed);
        }
        let backends = &self.shared.backends;
        for t in into {
            let spec = super::key::KernelSpec::default();
            let theirs = super::remote::key_for(&self.shared.opts, backends, t, &spec).backend;
            if theirs == backend {
                continue;
            }
            if crate::owner::session_of(t) != t.as_str() {
                self.unplace(placed);
                return Err(ForkError::OtherBackend {
                    target: t.clone(),
                    theirs,
                    source_backend: backend.to_owned(),
                }
                .into());
            }
            let before = backends.session_default(t);
            if backends.set_session_default(t, Some(backend)).is_ok() {
                placed.push((t.clone(), before));
            }
        }
        Ok(placed)
    }

    /// Give the sessions [`Self::place_targets`] placed their default back
    /// (a fork that failed or was refused changes nothing).
    fn unplace(&self, placed: Placed) {
        for (t, before) in placed {
            let _ = self
                .shared
                .backends
                .set_session_default(&t, before.as_deref());
        }
    }

    /// The copies, all or nothing: a process fork per target where the
    /// source's kernel allows one, else (and from the first refusal on)
    /// one snapshot, loaded by each target's first kernel.
    async fn fork_into(
        &self,
        source_slot: &super::slot::Slot,
        into: &[String],
        kernel: &crate::kernel::Kernel,
        backend: &str,
    ) -> Result<ForkReport, ManagerError> {
        let source = source_slot.key.owner.as_str();
        for t in into {
            self.check_new(t).await?;
        }
        let from_ws = self.workspace(source)?;
        let mut report = ForkReport {
            from: source.to_owned(),
            into: Vec::with_capacity(into.len()),
        };
        let mut refused = (backend != "local").then(|| REMOTE.to_owned());
        let mut once: Option<Once> = None;
        for (i, t) in into.iter().enumerate() {
            let started = Instant::now();
            let made = match self.copy_into(t, &from_ws).await {
                Ok(workspace_bytes) => {
                    let by_process = match &refused {
                        None => self.process_fork(source_slot, t, kernel).await,
                        Some(why) => Err(why.clone()),
                    };
                    match by_process {
                        Ok(kernel_id) => Ok(Forked {
                            session: t.clone(),
                            child: None,
                            kernel_id: Some(kernel_id),
                            path: ForkPath::Process,
                            fallback_reason: None,
                            workspace_bytes,
                            seconds: 0.0,
                        }),
                        Err(why) => {
                            let snapshot = self
                                .snapshot_fork(source, t, kernel, backend, &mut once)
                                .await;
                            let forked = snapshot.map(|seconds| Forked {
                                session: t.clone(),
                                child: None,
                                kernel_id: None,
                                path: ForkPath::Snapshot,
                                fallback_reason: Some(why.clone()),
                                workspace_bytes,
                                seconds,
                            });
                            refused = Some(why);
                            forked
                        }
                    }
                }
                Err(e) => Err(e),
            };
            match made {
                Ok(mut forked) => {
                    forked.seconds += started.elapsed().as_secs_f64();
                    report.into.push(forked);
                }
                Err(e) => {
                    // All or nothing: the targets made so far go too.
                    for done in &into[..=i] {
                        self.undo_fork(done).await;
                    }
                    if let Some(once) = once {
                        let _ = std::fs::remove_file(&once.tmp);
                    }
                    return Err(e);
                }
            }
        }
        if let Some(once) = once {
            let _ = std::fs::remove_file(&once.tmp);
        }
        let mut state = self.shared.state();
        for f in &report.into {
            if f.path == ForkPath::Snapshot {
                state.forks.insert(f.session.clone(), source.to_owned());
            }
        }
        Ok(report)
    }

    /// Copy `from_ws`'s files into `target`'s workspace (both paths do).
    /// Returns the bytes copied.
    pub(super) async fn copy_into(
        &self,
        target: &str,
        from_ws: &Workspace,
    ) -> Result<u64, ManagerError> {
        let to_ws = self.workspace(target)?;
        let bytes = copy_workspace(from_ws, &to_ws)
            .await
            .map_err(|err| ForkError::Workspace {
                target: target.to_owned(),
                err,
            })?;
        Ok(bytes)
    }

    /// One target by process fork (its workspace copied already): the
    /// source's process forked into its kernel, installed as the target's
    /// own. Returns the new kernel's id, or why the process path does not
    /// apply (nothing of the target's is left but its files).
    async fn process_fork(
        &self,
        source_slot: &super::slot::Slot,
        target: &str,
        kernel: &crate::kernel::Kernel,
    ) -> Result<String, String> {
        if self.shared.opts.kernel.sandbox.is_strict() {
            return Err(crate::kernel::FORK_STRICT.into());
        }
        let source = source_slot.key.owner.as_str();
        // The source's spec (interpreter, cwd, tools): the key the
        // target's cells come with from the same front end.
        let key = super::key::KernelKey {
            owner: target.to_owned(),
            ..source_slot.key.clone()
        };
        let opts = self
            .local_options(&key)
            .map_err(|e| crate::error_chain(&e))?;
        let (child, names) = kernel.fork_process(opts).await?;
        let kernel_id = child.process_id();
        let slot = std::sync::Arc::new(super::slot::Slot::new(
            key.clone(),
            source_slot.tools.clone(),
            None,
        ));
        {
            let mut meta = slot.meta();
            meta.life = super::slot::Life::Running(child);
            meta.forked_from = Some(source.to_owned());
            meta.pending = Some(snapshots::Loaded::Restored(
                StateChange::ProcessForked {
                    from: source.to_owned(),
                    names,
                },
                cellhost_protocol::Restored {
                    names,
                    skipped: Vec::new(),
                    from: RestoreFrom::Fork,
                    age_seconds: 0,
                },
                Some(source.to_owned()),
            ));
        }
        self.shared.state().slots.insert(key, slot);
        self.shared.counters.spawns.fetch_add(1, Ordering::Relaxed);
        Ok(kernel_id)
    }

    /// One target by snapshot and restore: a local source is snapshotted
    /// once (`once`), the file linked to each target; a remote one once
    /// per target, on its host. Returns the seconds the snapshot took.
    async fn snapshot_fork(
        &self,
        source: &str,
        target: &str,
        kernel: &crate::kernel::Kernel,
        backend: &str,
        once: &mut Option<Once>,
    ) -> Result<f64, ManagerError> {
        if backend == "local" && once.is_none() {
            let dir = self.shared.opts.snapshot_dir();
            std::fs::create_dir_all(&dir).map_err(|err| SnapshotError::Io {
                about: "make the snapshot directory",
                err,
            })?;
            let started = Instant::now();
            let tmp = dir.join(format!(".fork-{}.zst", crate::sys::random_hex(6)));
            let taken = kernel
                .snapshot_to(&tmp, self.shared.opts.fork_limits())
                .await;
            match taken {
                Ok(taken) => {
                    *once = Some(Once {
                        tmp,
                        taken,
                        seconds: started.elapsed().as_secs_f64(),
                    })
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e.into());
                }
            }
        }
        let (copy, seconds) = match once {
            Some(o) => (Copy::Linked(&o.tmp, &o.taken, true), o.seconds),
            None => (Copy::Remote(kernel), 0.0),
        };
        self.make_fork(source, target, copy).await?;
        Ok(seconds)
    }

    /// Refuse a target that is not new.
    pub(super) async fn check_new(&self, target: &str) -> Result<(), ManagerError> {
        let in_use = |why| ForkError::TargetInUse {
            target: target.to_owned(),
            why,
        };
        let has_kernel = {
            let state = self.shared.state();
            state.slots.keys().any(|k| k.owner == target) || state.forks.contains_key(target)
        };
        if has_kernel {
            return Err(in_use("has a kernel (or a fork waiting for its first cell)").into());
        }
        if snapshots::paths(&self.shared, target).1.exists() {
            return Err(in_use("has a snapshot of its own state").into());
        }
        let listing = self
            .workspace(target)?
            .list("", false, 1)
            .await
            .map_err(|err| ForkError::Workspace {
                target: target.to_owned(),
                err,
            })?;
        if !listing.entries.is_empty() {
            return Err(in_use("has files in its workspace").into());
        }
        Ok(())
    }

    /// One target's snapshot of its own (its workspace copied already).
    pub(super) async fn make_fork(
        &self,
        source: &str,
        target: &str,
        copy: Copy<'_>,
    ) -> Result<(), ManagerError> {
        let (zst, json) = snapshots::paths(&self.shared, target);
        let mut whole = true;
        let taken = match copy {
            Copy::Linked(tmp, taken, all) => {
                whole = all;
                let linked =
                    std::fs::hard_link(tmp, &zst).or_else(|_| std::fs::copy(tmp, &zst).map(drop));
                linked.map_err(|err| SnapshotError::Io {
                    about: "copy the fork's snapshot",
                    err,
                })?;
                taken.clone()
            }
            // The target's own snapshot, on the source's host.
            Copy::Remote(kernel) => {
                kernel
                    .snapshot_to(&zst, self.shared.opts.fork_limits())
                    .await?
            }
        };
        let meta = Meta {
            owner: target.to_owned(),
            from: RestoreFrom::Fork,
            taken: snapshots::now(),
            whole,
            names: taken.names,
            skipped: taken.skipped.clone(),
            forked_from: Some(source.to_owned()),
        };
        snapshots::write_meta(&json, &meta)?;
        Ok(())
    }

    /// Take back what a failed fork made for `target`.
    pub(super) async fn undo_fork(&self, target: &str) {
        let kernels: Vec<crate::kernel::Kernel> = {
            let mut state = self.shared.state();
            let keys: Vec<_> = state
                .slots
                .keys()
                .filter(|k| k.owner == target)
                .cloned()
                .collect();
            keys.iter()
                .filter_map(|k| state.slots.remove(k))
                .filter_map(|s| super::housekeeping::mark_removed(&s))
                .collect()
        };
        super::housekeeping::kill_all(kernels).await;
        snapshots::remove(&self.shared, target);
        if let Ok(ws) = self.workspace(target) {
            if let Ok(listing) = ws.list("", false, MAX_ENTRIES).await {
                for e in listing.entries {
                    let _ = ws.remove(&e.path, true).await;
                }
            }
        }
    }
}

/// Targets whose default backend a fork set, and the default each had.
type Placed = Vec<(String, Option<String>)>;

/// How a target gets its snapshot.
pub(super) enum Copy<'a> {
    /// The one taken of a local source (a hard link, else a copy);
    /// whether it stands for the source's whole state (see `Meta::whole`).
    Linked(
        &'a std::path::Path,
        &'a crate::kernel::SnapshotSummary,
        bool,
    ),
    /// One of its own, taken of the remote source on its host.
    Remote(&'a crate::kernel::Kernel),
}

/// Copy every regular file of `from` into `to` (directories made on the
/// way; symlinks and special files are not copied). Returns the bytes.
async fn copy_workspace(from: &Workspace, to: &Workspace) -> Result<u64, FileError> {
    let listing = from.list("", true, MAX_ENTRIES).await?;
    if listing.truncated {
        return Err(FileError::Io {
            about: "list the workspace: it has over 100000 entries, too many to fork",
            err: std::io::Error::other("too many entries"),
        });
    }
    let mut bytes = 0;
    for entry in listing.entries {
        if entry.kind != EntryType::File || entry.name.starts_with(crate::files::UPLOAD_PREFIX) {
            continue;
        }
        // Gone or changed into something else since the listing: skipped.
        let Ok(Opened::File(reader)) = from.open(&entry.path).await else {
            continue;
        };
        let size = reader.size;
        let body = reader.range(0, size).await.map_err(|err| FileError::Io {
            about: "read a workspace file",
            err,
        })?;
        let written = to
            .write(&entry.path, body, WriteLimits { max_bytes: None })
            .await?;
        bytes += written.size;
    }
    Ok(bytes)
}
