//! Per-kernel cgroups for the memory and process limits.
//!
//! Probed once per host process: for each controller (`memory`, `pids`)
//! we look for the host's own cgroup in a v1 hierarchy that has it, else
//! in the v2 hierarchy when the controller is enabled for children there.
//! Each kernel gets `cellhost-<kernel id>` under it, with `memory.max` /
//! `memory.limit_in_bytes` and `pids.max` set, and the kernel is moved in
//! before it runs any cell, so everything it forks, including
//! `setsid`/double-forked grandchildren, stays inside. At teardown every
//! member is killed (v2 `cgroup.kill` when present, else each pid in
//! `cgroup.procs`) and the dir removed.
//!
//! Moving a process between cgroups makes the kernel wait for an RCU
//! grace period after a quiet spell (~10–15 ms here), so the host does it
//! in the background while the new process starts ([`KernelCgroup::adopt`]):
//! a plain runner forks nothing before its first cell; under bwrap, the
//! sandbox's first process waits on `--block-fd` until it has been moved,
//! and everything after it is forked inside.
//!
//! A controller that is not available, or a cgroup that cannot be created
//! (read-only hierarchy, no delegation), falls back to rlimits.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

#[derive(Debug, Clone)]
struct Parent {
    dir: PathBuf,
    version: Version,
}

/// Where per-kernel cgroups go, per controller.
#[derive(Debug, Clone, Default)]
struct Parents {
    memory: Option<Parent>,
    pids: Option<Parent>,
}

fn parents() -> &'static Parents {
    static PARENTS: OnceLock<Parents> = OnceLock::new();
    PARENTS.get_or_init(|| {
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        Parents {
            memory: find_parent("memory", &cgroups, &mounts),
            pids: find_parent("pids", &cgroups, &mounts),
        }
    })
}

fn find_parent(controller: &str, cgroups: &str, mounts: &str) -> Option<Parent> {
    // v1: a hierarchy mounted with this controller.
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        if ctrls.split(',').any(|c| c == controller) {
            let mount = mounts.lines().find_map(|m| {
                let f: Vec<&str> = m.split_whitespace().collect();
                (f.len() >= 4 && f[2] == "cgroup" && f[3].split(',').any(|o| o == controller))
                    .then(|| PathBuf::from(f[1]))
            })?;
            let dir = mount.join(path.trim_start_matches('/'));
            if writable_dir(&dir) {
                return Some(Parent {
                    dir,
                    version: Version::V1,
                });
            }
        }
    }
    // v2: the unified hierarchy, if it delegates the controller to children.
    let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mount = mounts.lines().find_map(|m| {
        let f: Vec<&str> = m.split_whitespace().collect();
        (f.len() >= 3 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
    })?;
    let dir = mount.join(path.trim_start_matches('/'));
    let enabled = |d: &Path| {
        std::fs::read_to_string(d.join("cgroup.subtree_control"))
            .map(|s| s.split_whitespace().any(|c| c == controller))
            .unwrap_or(false)
    };
    if !enabled(&dir) {
        // Enabling works only where no process lives (the root, or a
        // delegated subtree); failing is fine: rlimits take over.
        let _ = std::fs::write(dir.join("cgroup.subtree_control"), format!("+{controller}"));
    }
    (enabled(&dir) && writable_dir(&dir)).then_some(Parent {
        dir,
        version: Version::V2,
    })
}

fn writable_dir(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

/// The cgroups of one kernel.
#[derive(Debug)]
pub(crate) struct KernelCgroup {
    memory: Option<(PathBuf, Version)>,
    pids: Option<(PathBuf, Version)>,
    /// `cgroup.procs` of each dir.
    procs: Vec<PathBuf>,
}

impl KernelCgroup {
    /// Create the kernel's cgroups for the limits that are set. Returns
    /// `None` when neither controller is usable.
    pub(crate) fn create(
        id: &str,
        memory_bytes: Option<u64>,
        max_processes: Option<u64>,
    ) -> Option<KernelCgroup> {
        let p = parents();
        let name = format!("cellhost-{id}");
        let mut cg = KernelCgroup {
            memory: None,
            pids: None,
            procs: Vec::new(),
        };
        if let (Some(bytes), Some(parent)) = (memory_bytes, &p.memory) {
            let dir = parent.dir.join(&name);
            if make(&dir).is_ok() && set_memory(&dir, parent.version, bytes).is_ok() {
                cg.memory = Some((dir, parent.version));
            } else {
                let _ = std::fs::remove_dir(&dir);
            }
        }
        if let (Some(max), Some(parent)) = (max_processes, &p.pids) {
            let dir = parent.dir.join(&name);
            let shared = cg.memory.as_ref().is_some_and(|(d, _)| *d == dir);
            if (shared || make(&dir).is_ok())
                && std::fs::write(dir.join("pids.max"), max.to_string()).is_ok()
            {
                cg.pids = Some((dir, parent.version));
            } else if !shared {
                let _ = std::fs::remove_dir(&dir);
            }
        }
        let mut dirs: Vec<&PathBuf> = cg.memory.iter().chain(&cg.pids).map(|(d, _)| d).collect();
        dirs.dedup();
        cg.procs = dirs.into_iter().map(|d| d.join("cgroup.procs")).collect();
        (!cg.procs.is_empty()).then_some(cg)
    }

    pub(crate) fn limits_memory(&self) -> bool {
        self.memory.is_some()
    }

    pub(crate) fn limits_processes(&self) -> bool {
        self.pids.is_some()
    }

    /// Move the just-spawned `leader` (and, when `unblock` is given, the
    /// bwrap child waiting on it) into the kernel's cgroups, in a blocking
    /// task. Fails closed: on any error the process group is killed before
    /// the bwrap child could be released.
    pub(crate) fn adopt(
        &self,
        leader: u32,
        unblock: Option<OwnedFd>,
    ) -> tokio::task::JoinHandle<io::Result<()>> {
        let procs = self.procs.clone();
        tokio::task::spawn_blocking(move || {
            let moved = (|| {
                move_pid(&procs, leader)?;
                if let Some(w) = &unblock {
                    for child in children_of(leader)? {
                        move_pid(&procs, child)?;
                    }
                    nix::unistd::write(w, b"x").map_err(io::Error::from)?;
                }
                Ok(())
            })();
            // Only while the leader is alive: once it is gone (a failed
            // start, reaped by the host) its group id may be reused.
            if moved.is_err() && crate::sys::pid_alive(leader) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(leader as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            drop(unblock);
            moved
        })
    }

    /// How many times the OOM killer acted in the memory cgroup.
    pub(crate) fn oom_kills(&self) -> u64 {
        let Some((dir, version)) = &self.memory else {
            return 0;
        };
        let file = match version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        counter(&dir.join(file), "oom_kill")
    }

    /// How many forks failed at `pids.max`.
    pub(crate) fn pids_max_hits(&self) -> u64 {
        match &self.pids {
            Some((dir, _)) => counter(&dir.join("pids.events"), "max"),
            None => 0,
        }
    }

    fn dirs(&self) -> Vec<&PathBuf> {
        let mut dirs: Vec<&PathBuf> = self
            .memory
            .iter()
            .chain(&self.pids)
            .map(|(d, _)| d)
            .collect();
        dirs.dedup();
        dirs
    }

    /// SIGKILL every member and remove the dirs, blocking for at most
    /// `within` (for `Drop` backstops, e.g. a runtime shut down with
    /// live kernels: no async teardown runs there).
    fn kill_and_remove_blocking(&self, within: Duration) {
        let end = std::time::Instant::now() + within;
        for dir in self.dirs() {
            loop {
                kill_members_of(dir);
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) if std::time::Instant::now() < end => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Err(_) => break,
                }
            }
        }
    }

    /// SIGKILL every member (escapees of the process group included),
    /// then remove the dirs. Waits up to ~1 s for members to exit.
    pub(crate) async fn kill_and_remove(&self) {
        for dir in self.dirs() {
            for _ in 0..100 {
                kill_members_of(dir);
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        }
    }
}

/// Kill what is left in the cgroups of kernel `id` (a crashed host's) and
/// remove them. Membership is definitive, so no pid can be mistaken here.
/// Returns how many cgroup dirs were removed.
/// Whether kernels' memory limits can be cgroups on this host (else
/// they are `RLIMIT_AS`, which a forked process inherits).
pub(crate) fn memory_available() -> bool {
    parents().memory.is_some()
}

pub(crate) fn reap_leftover(id: &str) -> usize {
    let p = parents();
    let name = format!("cellhost-{id}");
    let existing = |parent: &Option<Parent>| {
        parent
            .as_ref()
            .map(|pa| (pa.dir.join(&name), pa.version))
            .filter(|(dir, _)| dir.is_dir())
    };
    let view = KernelCgroup {
        memory: existing(&p.memory),
        pids: existing(&p.pids),
        procs: Vec::new(),
    };
    let n = view.dirs().len();
    // Dropping the view kills the members and removes the dirs.
    drop(view);
    n
}

impl Drop for KernelCgroup {
    /// The backstop for every path that skipped the async teardown (a
    /// failed launch, a runtime shut down with live kernels or mid-
    /// teardown). Dirs already removed cost one failed `rmdir` each.
    fn drop(&mut self) {
        self.kill_and_remove_blocking(Duration::from_millis(500));
    }
}

fn kill_members_of(dir: &Path) {
    let kill = dir.join("cgroup.kill");
    if kill.exists() {
        let _ = std::fs::write(&kill, "1");
    }
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn move_pid(procs: &[PathBuf], pid: u32) -> io::Result<()> {
    for file in procs {
        std::fs::write(file, pid.to_string())?;
    }
    Ok(())
}

/// The children of `pid` once it has any (bwrap clones its sandbox child
/// right after exec); at most 2 s.
fn children_of(pid: u32) -> io::Result<Vec<u32>> {
    let end = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
        let kids: Vec<u32> = list
            .split_whitespace()
            .filter_map(|k| k.parse().ok())
            .collect();
        if !kids.is_empty() {
            return Ok(kids);
        }
        if std::time::Instant::now() > end {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "bwrap did not start its sandbox within 2 s",
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn make(dir: &Path) -> io::Result<()> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        r => r,
    }
}

fn set_memory(dir: &Path, version: Version, bytes: u64) -> io::Result<()> {
    match version {
        Version::V1 => {
            std::fs::write(dir.join("memory.limit_in_bytes"), bytes.to_string())?;
            // With swap, v1 needs memsw too, or the kernel swaps instead.
            let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), bytes.to_string());
        }
        Version::V2 => {
            std::fs::write(dir.join("memory.max"), bytes.to_string())?;
            let _ = std::fs::write(dir.join("memory.swap.max"), "0");
        }
    }
    Ok(())
}

/// The value of `key N` in a flat keyed cgroup file.
fn counter(file: &Path, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok())?
            })
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("memory.events");
        std::fs::write(&f, "low 0\noom 2\noom_kill 3\n").unwrap();
        assert_eq!(counter(&f, "oom_kill"), 3);
        assert_eq!(counter(&f, "max"), 0);
    }

    #[test]
    fn a_v1_hierarchy_is_found_from_proc_files() {
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path().join("memory");
        std::fs::create_dir_all(mount.join("a/b")).unwrap();
        let cgroups = "4:memory:/a/b\n0::/\n";
        let mounts = format!("cgroup {} cgroup rw,relatime,memory 0 0\n", mount.display());
        let p = find_parent("memory", cgroups, &mounts).unwrap();
        assert_eq!(p.dir, mount.join("a/b"));
        assert_eq!(p.version, Version::V1);
        assert!(find_parent("pids", cgroups, &mounts).is_none());
    }
}
