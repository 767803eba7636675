//! Sessions that outlive their kernels (docs/snapshots.md): a local
//! kernel's state is snapshotted when housekeeping or shutdown stops it,
//! and on request; the session's next fresh kernel loads it before its
//! first cell, and that cell says what came back.
//!
//! Files: `<data_dir>/snapshots/<key>.zst` (the stream, zstd) and
//! `<key>.json` (why and when it was taken, what it kept), each written
//! beside itself and renamed into place. A snapshot is consumed when a
//! kernel loads it (or fails to), and removed when the session is
//! disposed, reset, or gets a fresh kernel for any reason a snapshot does
//! not stand for (a kernel that died in a cell: its state is told lost).
//! A stopping kernel's snapshot is gated: the session's next kernel and
//! its disposal wait until it is written (`stopping`, `written`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use cellhost_protocol::{RestoreFrom, Restored, Skipped, SnapshotReport};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::key::KernelKey;
use super::slot::Tombstone;
use super::workspace::dir_name;
use super::{Shared, State};
use crate::kernel::{Kernel, SnapshotError, SnapshotLimits, StateChange};

/// What the `.json` beside a snapshot says.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Meta {
    /// The session it is of.
    pub owner: String,
    /// Why it was taken.
    pub from: RestoreFrom,
    /// Unix seconds.
    pub taken: u64,
    /// Taken as the kernel stopped (so it is the state as it ended), not
    /// while it lived on.
    pub whole: bool,
    pub names: u64,
    #[serde(default)]
    pub skipped: Vec<Skipped>,
    /// The session this one is a fork of (`fork.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<String>,
}

/// Whether `key`'s kernels take snapshots, with snapshots on: local and
/// remote ones (a remote snapshot stays on its host) of the manager's
/// interpreter and cwd, with no tools or all of them
/// (the session's default kernel over HTTP, MCP and the library), one
/// snapshot per session.
pub(super) fn applies(shared: &Shared, key: &KernelKey) -> Option<SnapshotLimits> {
    let max = shared.opts.snapshot_limits()?;
    eligible(shared, key).then_some(max)
}

/// Whether `key`'s kernels can be snapshotted at all (see [`applies`]).
pub(super) fn eligible(shared: &Shared, key: &KernelKey) -> bool {
    let spec = &key.spec;
    let tools_ok = spec.tools.is_empty()
        || spec
            .tools
            .iter()
            .map(String::as_str)
            .eq(shared.opts.tools.names());
    spec.python.is_none() && spec.cwd.is_none() && tools_ok
}

/// `owner`'s live kernel that can be snapshotted, and its entry (whose
/// turn the caller takes).
pub(super) fn live_source(
    shared: &Shared,
    owner: &str,
) -> Result<std::sync::Arc<super::slot::Slot>, SnapshotError> {
    let slots: Vec<_> = {
        let state = shared.state();
        state
            .slots
            .values()
            .filter(|s| s.key.owner == owner)
            .cloned()
            .collect()
    };
    if let Some(slot) = slots.iter().find(|s| eligible(shared, &s.key)) {
        return Ok(slot.clone());
    }
    Err(match slots.first() {
        Some(s) if s.key.backend != "local" => SnapshotError::Unsupported {
            backend: s.key.backend.clone(),
        },
        _ => SnapshotError::NoKernel,
    })
}

/// The kernel of `slot` (its turn held), if it lives.
pub(super) fn live_kernel(slot: &super::slot::Slot) -> Result<Kernel, SnapshotError> {
    let kernel = slot.meta().kernel().cloned();
    kernel
        .filter(|k| k.pid().is_some())
        .ok_or(SnapshotError::NoKernel)
}

pub(super) fn paths(shared: &Shared, owner: &str) -> (PathBuf, PathBuf) {
    let dir = shared.opts.snapshot_dir();
    let name = dir_name(owner);
    (
        dir.join(format!("{name}.zst")),
        dir.join(format!("{name}.json")),
    )
}

pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Remove `owner`'s snapshot, if it has one.
pub(super) fn remove(shared: &Shared, owner: &str) {
    let (zst, json) = paths(shared, owner);
    let _ = std::fs::remove_file(json);
    let _ = std::fs::remove_file(zst);
}

/// The owners whose snapshots a previous host left (their next fresh
/// kernel loads them, told as a restart), as their descriptions name
/// them.
pub(super) fn left_by_predecessor(dir: &Path) -> HashSet<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return HashSet::new();
    };
    let entries: Vec<_> = rd.flatten().collect();
    // Half-written files of a host killed mid-snapshot (or mid-fork)
    // never count.
    for e in &entries {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(".tmp-") || name.starts_with(".fork-") || name.ends_with(".json.tmp") {
            let _ = std::fs::remove_file(e.path());
        }
    }
    entries
        .into_iter()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| {
            let bytes = std::fs::read(e.path()).ok()?;
            let meta: Meta = serde_json::from_slice(&bytes).ok()?;
            Some(meta.owner)
        })
        .collect()
}

/// Snapshot `kernel` (owner `owner`) now; `whole`: it is stopping.
pub(super) async fn keep(
    shared: &Shared,
    owner: &str,
    kernel: &Kernel,
    max: SnapshotLimits,
    from: RestoreFrom,
    whole: bool,
) -> Result<SnapshotReport, SnapshotError> {
    let (zst, json) = paths(shared, owner);
    let started = Instant::now();
    let taken = match kernel.snapshot_to(&zst, max).await {
        Ok(t) => t,
        Err(e) => {
            // No snapshot stands for this state: an older one must not.
            remove(shared, owner);
            return Err(e);
        }
    };
    let meta = Meta {
        owner: owner.to_owned(),
        from,
        taken: now(),
        whole,
        names: taken.names,
        skipped: taken.skipped.clone(),
        forked_from: None,
    };
    if let Err(e) = write_meta(&json, &meta) {
        remove(shared, owner);
        return Err(e);
    }
    Ok(SnapshotReport {
        names: taken.names,
        skipped: taken.skipped,
        bytes: taken.bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Write a snapshot's description beside it (atomically).
pub(super) fn write_meta(json: &Path, meta: &Meta) -> Result<(), SnapshotError> {
    let tmp = json.with_extension("json.tmp");
    let text = serde_json::to_vec(meta).unwrap_or_default();
    // A remote kernel's stream stayed on its host: the dir may be new.
    let dir = json.parent().map(std::fs::create_dir_all);
    dir.unwrap_or(Ok(()))
        .and_then(|()| std::fs::write(&tmp, text))
        .and_then(|()| std::fs::rename(&tmp, json))
        .map_err(|err| SnapshotError::Io {
            about: "write the snapshot's description",
            err,
        })
}

/// A kernel leaving the registry, and whether its state is snapshotted
/// first: then the gate its session's next kernel and its disposal wait
/// on, held until the snapshot is written (or failed).
pub(super) struct Stopping {
    key: KernelKey,
    from: RestoreFrom,
    kernel: Kernel,
    snapshot: Option<(SnapshotLimits, OwnedMutexGuard<()>)>,
}

/// Decide which of `victims` (just removed from `state`, its lock still
/// held) are snapshotted as they stop, and close each one's gate in that
/// same step: a call that comes in after the removal can then never start
/// the session's next kernel, nor dispose of it, before the snapshot that
/// stands for its state is on disk (a snapshot written after the next
/// kernel came up would stand for a state the session no longer has).
/// One per session: a second victim of the same session is just stopped.
pub(super) fn stopping(
    shared: &Shared,
    state: &mut State,
    victims: Vec<(KernelKey, RestoreFrom, Kernel)>,
) -> Vec<Stopping> {
    victims
        .into_iter()
        .map(|(key, from, kernel)| {
            let snapshot = applies(shared, &key)
                .filter(|_| !kernel.is_busy() && kernel.pid().is_some())
                .filter(|_| !state.snapshotting.contains_key(&key.owner))
                .and_then(|max| {
                    let gate = Arc::new(Mutex::new(()));
                    let held = gate.clone().try_lock_owned().ok()?;
                    state.snapshotting.insert(key.owner.clone(), gate);
                    Some((max, held))
                });
            Stopping {
                key,
                from,
                kernel,
                snapshot,
            }
        })
        .collect()
}

/// Snapshot each stopping kernel that takes snapshots, then kill them
/// all, concurrently.
pub(super) async fn stop_all(shared: &Arc<Shared>, victims: Vec<Stopping>) {
    let mut set = tokio::task::JoinSet::new();
    let mut plain = Vec::new();
    for v in victims {
        match v.snapshot {
            Some((max, gate)) => {
                set.spawn(snapshot_then_stop(
                    Arc::downgrade(shared),
                    v.key,
                    v.from,
                    v.kernel,
                    max,
                    gate,
                ));
            }
            None => plain.push(v.kernel),
        }
    }
    super::housekeeping::kill_all(plain).await;
    while set.join_next().await.is_some() {}
}

async fn snapshot_then_stop(
    shared: std::sync::Weak<Shared>,
    key: KernelKey,
    from: RestoreFrom,
    kernel: Kernel,
    max: SnapshotLimits,
    gate: OwnedMutexGuard<()>,
) {
    if let Some(shared) = shared.upgrade() {
        if let Err(e) = keep(&shared, &key.owner, &kernel, max, from, true).await {
            eprintln!(
                "cellhost: session {}: no snapshot kept as its kernel stopped: {}",
                key.owner,
                crate::error_chain(&e)
            );
        }
        let mut state = shared.state();
        let ours = state
            .snapshotting
            .get(&key.owner)
            .is_some_and(|g| Arc::ptr_eq(g, OwnedMutexGuard::mutex(&gate)));
        if ours {
            state.snapshotting.remove(&key.owner);
        }
    }
    drop(gate);
    kernel.shutdown().await;
}

/// Wait until no snapshot is being taken of a stopping kernel of an owner
/// `pick` chooses (the gates open as of now: see [`stopping`]).
pub(super) async fn written(shared: &Shared, pick: impl Fn(&str) -> bool) {
    let gates: Vec<Arc<Mutex<()>>> = shared
        .state()
        .snapshotting
        .iter()
        .filter(|(owner, _)| pick(owner))
        .map(|(_, gate)| gate.clone())
        .collect();
    for gate in gates {
        drop(gate.lock().await);
    }
}

/// What to tell (and what happened) when a fresh kernel came up.
#[derive(Debug)]
pub(super) enum Loaded {
    /// Nothing to restore.
    Nothing,
    /// The snapshot was loaded: the first cell is told this instead of
    /// the tombstone; the session this one is a fork of, if it is one.
    Restored(StateChange, Restored, Option<String>),
    /// It could not be: the first cell is told this instead.
    Failed(StateChange),
}

/// A fresh kernel for `key` came up (`tombstone`: why the last one went;
/// `restart`: the session's first since the host started): load its
/// snapshot when one stands for the state the session had.
pub(super) async fn restore(
    shared: &Shared,
    key: &KernelKey,
    kernel: &Kernel,
    tombstone: Option<&Tombstone>,
    restart: bool,
    reset: bool,
    forked: Option<&str>,
) -> Loaded {
    // The snapshot of the kernel this one follows may still be being
    // written: neither load nor remove what is there before it is.
    written(shared, |o| o == key.owner).await;
    // A fork's copy is loaded even with snapshots off: it was asked for.
    let limits = match (applies(shared, key), forked) {
        (Some(max), _) => max,
        (None, Some(_)) if eligible(shared, key) => shared.opts.fork_limits(),
        _ => return Loaded::Nothing,
    };
    let owner = &key.owner;
    let (zst, json) = paths(shared, owner);
    let why = match (tombstone, forked) {
        _ if reset => None,
        (_, Some(from)) => Some(StateChange::Forked {
            from: from.to_owned(),
        }),
        (Some(Tombstone::Evicted { max_kernels }), None) => Some(StateChange::Evicted {
            max_kernels: *max_kernels,
        }),
        (Some(Tombstone::Reaped { idle }), None) => Some(StateChange::Reaped { idle: *idle }),
        (Some(Tombstone::Disposed), None) => None,
        (None, None) if restart => Some(StateChange::DaemonRestarted),
        (None, None) => None,
    };
    let Some(why) = why else {
        // A fresh kernel the snapshot does not stand for (reset, disposed,
        // died in a cell): it must never come back later.
        remove(shared, owner);
        return Loaded::Nothing;
    };
    let meta: Option<Meta> = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let Some(meta) = meta else {
        remove(shared, owner);
        return Loaded::Nothing;
    };
    let age = now().saturating_sub(meta.taken);
    let loaded = kernel.restore_from(&zst, limits).await;
    remove(shared, owner); // consumed, loaded or not
    let why = Box::new(why);
    match loaded {
        Ok(summary) => {
            let mut skipped = meta.skipped.clone();
            skipped.extend(summary.skipped);
            let change = StateChange::Restored {
                why,
                names: summary.names,
                skipped: skipped
                    .iter()
                    .map(|s| (s.name.clone(), s.kind.clone()))
                    .collect(),
                stale_age: (!meta.whole).then_some(age),
            };
            // A fork's copy, whichever stop wrote it (a process fork's
            // kernel evicted before its first cell: `from` says evicted).
            let from = if forked.is_some() {
                RestoreFrom::Fork
            } else if meta.whole && restart && meta.from == RestoreFrom::Restart {
                RestoreFrom::Restart
            } else {
                meta.from
            };
            let restored = Restored {
                names: summary.names,
                skipped,
                from,
                age_seconds: age,
            };
            let forked_from = forked.map(str::to_owned).or(meta.forked_from);
            Loaded::Restored(change, restored, forked_from)
        }
        Err(e) => Loaded::Failed(StateChange::RestoreFailed {
            why,
            reason: crate::error_chain(&e),
        }),
    }
}

impl super::KernelManager {
    /// Snapshot `owner`'s live (local, default-spec) kernel now, between
    /// its cells: the snapshot stays until the kernel is stopped (then a
    /// newer one replaces it) or the session is disposed, and a host that
    /// starts after this one was killed restores it, saying how old it is.
    ///
    /// # Errors
    /// No live kernel, snapshots off or not supported for its kernel, the
    /// cap, or the runner's reason.
    pub async fn snapshot(&self, owner: &str) -> Result<SnapshotReport, super::ManagerError> {
        super::key::validate_owner(owner)?;
        let Some(max) = self.shared.opts.snapshot_limits() else {
            return Err(SnapshotError::Off.into());
        };
        let slot = live_source(&self.shared, owner)?;
        let _turn = slot.turn.lock().await;
        let kernel = live_kernel(&slot)?;
        Ok(keep(
            &self.shared,
            owner,
            &kernel,
            max,
            RestoreFrom::Snapshot,
            false,
        )
        .await?)
    }
}
