//! Records of live kernel processes, kept in a directory so that a host
//! started after a crash can find and reap what its predecessor left.
//!
//! One small JSON file per process, named after the process id (`k-…`),
//! written when the process starts and removed when it is torn down. A
//! record names its processes by pid *and* start time, so a pid that the
//! system has since given to an unrelated process is never signalled.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::process::Process;
use crate::sys::process_start_time;

/// One process and how to recognise it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessId {
    /// The process id (which the system may have reused since).
    pub pid: u32,
    /// Clock ticks since boot (see [`process_start_time`]).
    pub start_time: u64,
}

impl ProcessId {
    /// The process as it is now, if it is alive.
    pub fn of(pid: u32) -> Option<ProcessId> {
        Some(ProcessId {
            pid,
            start_time: process_start_time(pid)?,
        })
    }

    /// `true` when the pid still names this very process.
    pub fn is_same_live_process(&self) -> bool {
        crate::sys::live_start_time(self.pid) == Some(self.start_time)
    }

    /// This host process, read from /proc once.
    pub(crate) fn this_host() -> Option<ProcessId> {
        static HOST: std::sync::OnceLock<Option<ProcessId>> = std::sync::OnceLock::new();
        HOST.get_or_init(|| ProcessId::of(std::process::id()))
            .clone()
    }
}

/// What a crashed host left behind for one kernel process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelRecord {
    /// The kernel process id (`k-…`), also the staging dir's name.
    pub id: String,
    /// The host that started it: a record whose host still runs belongs
    /// to that host, not to us.
    pub host: ProcessId,
    /// The Python runner (under a sandbox, bwrap's grandchild).
    pub runner: ProcessId,
    /// The host's child and leader of the kernel's process group: the
    /// runner itself, or bwrap under the strict sandbox.
    pub leader: ProcessId,
    /// The kernel's process group id (the leader's pid): teardown signals the
    /// whole group.
    pub pgid: u32,
    /// The death-pipe watcher (its own session), if it started.
    pub watcher: Option<ProcessId>,
    /// The kernel's private staging dir on the host (runner sources, control
    /// sockets), removed at teardown.
    pub staging: PathBuf,
}

/// The file in each staging dir naming the host that made it
/// (`<pid> <start_time>`). Written right after the dir, before the kernel
/// starts (its record comes only once the runner answered), so recovery
/// can remove the dirs of a host SIGKILLed mid-spawn, which no record names.
pub(crate) const STAGING_HOST_FILE: &str = ".host";

impl ProcessId {
    /// Mark `staging` as made by this host.
    pub(crate) fn mark_staging(staging: &Path) -> std::io::Result<()> {
        let host = ProcessId::this_host()
            .ok_or_else(|| std::io::Error::other("this host's start time is unreadable"))?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(staging.join(STAGING_HOST_FILE))?;
        write!(f, "{} {}", host.pid, host.start_time)
    }

    /// The host that made `staging`, if it says.
    pub(crate) fn staging_host(staging: &Path) -> Option<ProcessId> {
        let text = std::fs::read_to_string(staging.join(STAGING_HOST_FILE)).ok()?;
        let (pid, start) = text.trim().split_once(' ')?;
        Some(ProcessId {
            pid: pid.parse().ok()?,
            start_time: start.parse().ok()?,
        })
    }
}

impl KernelRecord {
    pub(crate) fn of(proc: &Process) -> Option<KernelRecord> {
        Some(KernelRecord {
            id: proc.id.clone(),
            host: ProcessId::this_host()?,
            runner: ProcessId::of(proc.pid)?,
            leader: ProcessId::of(proc.pgid())?,
            pgid: proc.pgid(),
            watcher: proc.watcher_pid().and_then(ProcessId::of),
            staging: proc.staging().to_owned(),
        })
    }

    fn path(dir: &Path, id: &str) -> PathBuf {
        dir.join(format!("{id}.json"))
    }

    /// Write the record (atomically: temp file, then rename). Failure is
    /// not fatal to the kernel: the death pipe still reaps it.
    pub(crate) fn write(&self, dir: &Path) -> std::io::Result<()> {
        crate::sys::private_dir(dir)?;
        let tmp = dir.join(format!(".{}.tmp", self.id));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(&serde_json::to_vec(self).map_err(std::io::Error::other)?)?;
        drop(f);
        std::fs::rename(&tmp, Self::path(dir, &self.id))
    }

    pub(crate) fn remove(dir: &Path, id: &str) {
        let _ = std::fs::remove_file(Self::path(dir, id));
    }

    /// Every readable record in `dir`, with its file. Unreadable or
    /// foreign files are skipped (and left alone).
    pub fn read_all(dir: &Path) -> Vec<(PathBuf, KernelRecord)> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .filter_map(|p| {
                let meta = std::fs::symlink_metadata(&p).ok()?;
                if !meta.is_file() {
                    return None;
                }
                let text = std::fs::read(&p).ok()?;
                let record = serde_json::from_slice(&text).ok()?;
                Some((p, record))
            })
            .collect()
    }
}
