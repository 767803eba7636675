//! Eviction past the cap, idle reaping, and the background pass.
//!
//! Victims are chosen and removed from the registry under its lock, then
//! killed (and waited on) outside it. A kernel with a running or queued
//! cell is never a victim of housekeeping; neither is a pinned (delegated
//! child's) kernel for the cap, nor an attached owner's for reaping.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::key::{is_child, KernelKey};
use super::slot::{Meta, Slot, Tombstone};
use super::{Shared, State};
use crate::kernel::Kernel;
use cellhost_protocol::RestoreFrom;

/// Tombstones kept at most; past it an arbitrary one is forgotten (its
/// owner then gets a fresh kernel without the explanation).
const MAX_TOMBSTONES: usize = 10_000;

/// Remember why `key`'s kernel went away, for its next call.
pub(super) fn remember(state: &mut State, key: KernelKey, why: Tombstone) {
    if state.tombstones.len() >= MAX_TOMBSTONES {
        if let Some(k) = state.tombstones.keys().next().cloned() {
            state.tombstones.remove(&k);
        }
    }
    state.tombstones.insert(key, why);
}

/// Flag a slot just removed from the registry; returns its kernel to kill.
pub(super) fn mark_removed(slot: &Slot) -> Option<Kernel> {
    let mut meta = slot.meta();
    meta.remove()
}

/// Take `k`'s entry out for a stop (a reap, an eviction): its kernel, if
/// it had one. A process fork's kernel stopped before its first cell
/// leaves its source for the session's next kernel, which then says it is
/// a fork (the copy it holds is in the snapshot taken as it stops).
fn remove_for_stop(state: &mut super::State, k: &KernelKey) -> Option<Kernel> {
    let slot = state.slots.remove(k)?;
    let untold_fork = {
        let meta = slot.meta();
        meta.pending.as_ref().and(meta.forked_from.clone())
    };
    let kernel = mark_removed(&slot)?;
    if let Some(from) = untold_fork {
        state.forks.insert(k.owner.clone(), from);
    }
    Some(kernel)
}

/// Kill `kernels` concurrently and wait until every one is gone.
pub(super) async fn kill_all(kernels: Vec<Kernel>) {
    let mut set = tokio::task::JoinSet::new();
    for k in kernels {
        set.spawn(async move { k.shutdown().await });
    }
    while set.join_next().await.is_some() {}
}

/// One housekeeping pass: reap idle kernels, then evict least recently
/// used ones until at most `max_kernels` are live.
pub(super) async fn run(shared: &Arc<Shared>) {
    let now = Instant::now();
    let opts = &shared.opts;
    let mut told = Vec::new();
    let (stopping, owners) = {
        let mut state = shared.state();
        if state.closed {
            return;
        }
        let mut reaped = Vec::new();
        if let Some(idle) = opts.idle_timeout {
            let keys: Vec<KernelKey> = state
                .slots
                .iter()
                .filter(|(k, s)| {
                    let m = s.meta();
                    idle_kernel(&m)
                        && !state.attached.contains_key(&k.owner)
                        && now.duration_since(m.last_used) >= idle
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in keys {
                if let Some(kernel) = remove_for_stop(&mut state, &k) {
                    reaped.push((k.clone(), RestoreFrom::Reaped, kernel));
                    told.push((k.owner.clone(), Tombstone::Reaped { idle }));
                }
                remember(&mut state, k, Tombstone::Reaped { idle });
            }
        }
        let mut evicted = Vec::new();
        let live = state
            .slots
            .values()
            .filter(|s| Slot::is_live(&s.meta()))
            .count();
        if live > opts.max_kernels {
            let mut candidates: Vec<(Instant, KernelKey)> = state
                .slots
                .iter()
                .filter(|(k, s)| idle_kernel(&s.meta()) && !is_child(&k.owner))
                .map(|(k, s)| (s.meta().last_used, k.clone()))
                .collect();
            candidates.sort();
            for (_, k) in candidates.into_iter().take(live - opts.max_kernels) {
                let max_kernels = opts.max_kernels;
                if let Some(kernel) = remove_for_stop(&mut state, &k) {
                    evicted.push((k.clone(), RestoreFrom::Evicted, kernel));
                    told.push((k.owner.clone(), Tombstone::Evicted { max_kernels }));
                }
                remember(&mut state, k, Tombstone::Evicted { max_kernels });
            }
        }
        if reaped.is_empty() && evicted.is_empty() {
            return;
        }
        state.killing += 1;
        let c = &shared.counters;
        c.reaps.fetch_add(reaped.len() as u64, Ordering::Relaxed);
        c.evictions
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        let mut all = reaped;
        all.extend(evicted);
        let owners: Vec<String> = all
            .iter()
            .filter(|(k, _, _)| k.backend == "local")
            .map(|(k, _, _)| k.owner.clone())
            .collect();
        // Each one's state is snapshotted first, where snapshots are on.
        (super::snapshots::stopping(shared, &mut state, all), owners)
    };
    super::snapshots::stop_all(shared, stopping).await;
    release_volumes(shared, owners).await;
    shared.state().killing -= 1;
    for (owner, why) in told {
        let (change, note) = why.event();
        shared.events.kernel(&owner, change, &note);
    }
}

/// Detach the volumes of `owners` left without a local kernel: 10,000
/// sessions over 64 kernels hold about 64 mounts, not 10,000. A session's
/// next cell or file call mounts its volume again.
async fn release_volumes(shared: &Arc<Shared>, owners: Vec<String>) {
    if !shared.opts.volumes() {
        return;
    }
    let root = shared.opts.workspace_root();
    for owner in owners {
        // No kernel of this owner starts meanwhile.
        let _start = shared.starts.of(&owner).write().await;
        let ws = super::workspace::of_owner(&root, &owner, true);
        let Some(vol) = super::volume::of_workspace(&ws).map(Path::to_path_buf) else {
            continue;
        };
        let shared = shared.clone();
        let _ = tokio::task::spawn_blocking(move || {
            super::volume::release(&vol, || {
                let state = shared.state();
                state.closed || state.slots.keys().any(|k| k.owner == owner)
            })
        })
        .await;
    }
}

/// A started kernel with no call in flight and no cell running (a caller
/// that gave up leaves its cell running: that kernel is busy).
fn idle_kernel(m: &Meta) -> bool {
    m.in_flight == 0 && m.kernel().is_some_and(|k| !k.is_busy())
}

/// Wait until no housekeeping or disposal kill is under way.
pub(super) async fn settled(shared: &Shared) {
    while shared.state().killing > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// The background pass: every reap interval, independent of traffic. It
/// holds the manager weakly and stops when the manager is gone or shut
/// down.
pub(super) fn start_reaper(shared: &Arc<Shared>) {
    let Some(every) = shared.opts.effective_reap_interval() else {
        return;
    };
    let weak: Weak<Shared> = Arc::downgrade(shared);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate
        loop {
            tick.tick().await;
            let Some(shared) = weak.upgrade() else { return };
            if shared.state().closed {
                return;
            }
            run(&shared).await;
            super::pool::refill(&shared);
        }
    });
}
