//! Crash recovery: reap kernels a dead host left behind, and sweep stale
//! staging dirs.
//!
//! Each live kernel process has a record in the data dir (see
//! `kernel::record`). At start, for every record whose host is gone, the
//! runner's group is killed, but only when its pid still names the very
//! process recorded (same start time, same group); a pid reused by an
//! unrelated process is left alone. The kernel's cgroups (when limits use
//! them) are emptied and removed too. Records of a host that still runs (a
//! second manager on the same data dir) are not touched. A staging dir no
//! record names (its host was killed while the kernel started) is removed
//! when the host named in its `.host` file is gone.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use crate::kernel::process_group;
use crate::kernel::record::{KernelRecord, ProcessId};

/// What start-up recovery did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Records of a dead host whose runner still ran and was killed.
    pub orphans_killed: usize,
    /// Records of a dead host whose processes were already gone.
    pub records_cleared: usize,
    /// Records naming a pid now used by an unrelated process (left alone).
    pub pids_reused: usize,
    /// Staging dirs removed: those of reaped kernels and stale ones.
    pub staging_dirs_removed: usize,
    /// Per-kernel cgroup dirs of dead hosts' kernels, emptied and removed.
    pub cgroups_removed: usize,
    /// Workspaces of a previous host's pooled (never owned) kernels.
    pub pool_workspaces_removed: usize,
}

pub(super) fn recover(records: &Path, staging_root: &Path, max_age: Duration) -> RecoveryReport {
    let mut report = RecoveryReport::default();
    let mut kept_staging = Vec::new();
    for (file, rec) in KernelRecord::read_all(records) {
        if rec.host.is_same_live_process() {
            kept_staging.push(rec.staging.clone());
            continue; // a live host's kernel: not ours to judge
        }
        let group_is_ours =
            rec.leader.is_same_live_process() && process_group(rec.leader.pid) == Some(rec.pgid);
        if group_is_ours {
            let _ = killpg(Pid::from_raw(rec.pgid as i32), Signal::SIGKILL);
            report.orphans_killed += 1;
        } else if crate::sys::pid_alive(rec.leader.pid) {
            report.pids_reused += 1;
        } else {
            report.records_cleared += 1;
        }
        // Cgroup membership names the kernel's processes for sure, also
        // those that left its group (setsid, double fork).
        report.cgroups_removed += crate::sandbox::cgroup::reap_leftover(&rec.id);
        if let Some(w) = &rec.watcher {
            if w.is_same_live_process() {
                let _ = kill(Pid::from_raw(w.pid as i32), Signal::SIGKILL);
            }
        }
        if remove_staging_dir(staging_root, &rec.staging) {
            report.staging_dirs_removed += 1;
        }
        let _ = std::fs::remove_file(file);
    }
    report.staging_dirs_removed += sweep_stale(staging_root, max_age, &kept_staging);
    report.staging_dirs_removed += sweep_dead_hosts(staging_root, &kept_staging);
    report
}

/// Remove staging dirs under `root` whose `.host` names a host that is
/// gone (a kernel that never got its record), except live hosts' kernels.
fn sweep_dead_hosts(root: &Path, keep: &[std::path::PathBuf]) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut removed = 0;
    for path in entries.filter_map(Result::ok).map(|e| e.path()) {
        if keep.contains(&path) {
            continue;
        }
        let dead = ProcessId::staging_host(&path).is_some_and(|h| !h.is_same_live_process());
        if dead && remove_staging_dir(root, &path) {
            removed += 1;
        }
    }
    removed
}

/// `k-` followed by 12 lowercase hex digits: the only names we create.
fn is_staging_name(name: &str) -> bool {
    name.strip_prefix("k-").is_some_and(|hex| {
        hex.len() == 12
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Remove `dir` if it is one of our staging dirs directly under `root`: a
/// real directory (never a symlink) with a staging name, owned by us.
fn remove_staging_dir(root: &Path, dir: &Path) -> bool {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return false;
    };
    if parent != root || !name.to_str().is_some_and(is_staging_name) {
        return false;
    }
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return false;
    };
    // Ours, or (for a root host) handed to a sandboxed kernel's uid: in
    // the 0700 staging root only we can have made it.
    let me = nix::unistd::geteuid();
    if !meta.is_dir() || (meta.uid() != me.as_raw() && !me.is_root()) {
        return false;
    }
    // A dead host's staging tmpfs, when it was not in a namespace of its own.
    crate::sys::mount::remove_dir(dir).is_ok()
}

/// Remove staging dirs under `root` not modified for `max_age`, except
/// those of live hosts' kernels.
fn sweep_stale(root: &Path, max_age: Duration, keep: &[std::path::PathBuf]) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let now = SystemTime::now();
    let mut removed = 0;
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if keep.contains(&path) {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age >= max_age);
        if old && remove_staging_dir(root, &path) {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_names_are_staging_dirs() {
        assert!(is_staging_name("k-0123456789ab"));
        assert!(!is_staging_name("k-0123456789AB"));
        assert!(!is_staging_name("k-0123"));
        assert!(!is_staging_name("notes"));
        assert!(!is_staging_name("k-0123456789abc"));
    }

    #[test]
    fn staging_dirs_of_a_dead_host_without_records_are_removed() {
        let root = tempfile::tempdir().unwrap();
        let me = ProcessId::this_host().unwrap();
        let dir = |name: &str, host: Option<&str>| {
            let d = root.path().join(name);
            std::fs::create_dir(&d).unwrap();
            if let Some(h) = host {
                std::fs::write(d.join(".host"), h).unwrap();
            }
            d
        };
        // Same pid, another start time: a host that is gone.
        let dead = dir(
            "k-aaaaaaaaaaaa",
            Some(&format!("{} {}", me.pid, me.start_time + 1)),
        );
        let live = dir(
            "k-bbbbbbbbbbbb",
            Some(&format!("{} {}", me.pid, me.start_time)),
        );
        let unmarked = dir("k-cccccccccccc", None);
        let report = recover(
            &root.path().join("none"),
            root.path(),
            Duration::from_secs(3600),
        );
        assert_eq!(report.staging_dirs_removed, 1);
        assert!(!dead.exists());
        assert!(live.exists() && unmarked.exists());
    }

    #[test]
    fn symlinks_and_dirs_elsewhere_are_never_removed() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let link = root.path().join("k-aaaaaaaaaaaa");
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        assert!(!remove_staging_dir(root.path(), &link));
        assert!(outside.path().exists());
        let elsewhere = outside.path().join("k-bbbbbbbbbbbb");
        std::fs::create_dir(&elsewhere).unwrap();
        assert!(!remove_staging_dir(root.path(), &elsewhere));
        assert!(elsewhere.exists());
    }
}
