//! Helpers for the registry tests: a manager on private dirs, and a count
//! of the real runner processes it started.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{Cell, CellResult, KernelOptions};

pub struct TestManager {
    pub manager: KernelManager,
    pub dir: tempfile::TempDir,
}

/// Options on fresh private dirs: no pool, no background reaping.
pub fn manager_options(dir: &tempfile::TempDir) -> ManagerOptions {
    ManagerOptions::new(dir.path().join("data"))
        .kernel(KernelOptions::default().runtime_dir(dir.path().join("run")))
        .warm_pool(0)
        .idle_timeout(None)
}

pub async fn manager_with(f: impl FnOnce(ManagerOptions) -> ManagerOptions) -> TestManager {
    let dir = tempfile::tempdir().unwrap();
    let manager = KernelManager::start(f(manager_options(&dir))).await;
    TestManager { manager, dir }
}

impl TestManager {
    pub async fn run(&self, owner: &str, code: &str) -> CellResult {
        self.manager
            .execute(owner, Cell::new(code))
            .await
            .expect("execute")
    }

    pub fn run_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("run")
    }

    /// Live runner processes started under this manager's runtime dir.
    pub fn runner_pids(&self) -> Vec<u32> {
        runner_pids(&self.run_dir())
    }
}

/// Pids of live kernel processes whose command line names a runner script
/// under `run_dir` (read from /proc: real processes, not registry
/// entries). Warm templates (named `cellhost-tmpl`; their forks share
/// their command line) and their spares (`cellhost-spare`, forked ahead of
/// a request) are not kernels: see [`template_pids`].
pub fn runner_pids(run_dir: &Path) -> Vec<u32> {
    let needle = run_dir.to_string_lossy().into_owned();
    live_pids()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let cmdline = String::from_utf8_lossy(&c);
                cmdline.contains("runner.py") && cmdline.contains(&needle)
            }) && !is_template(*pid)
                && !is_spare(*pid)
        })
        .collect()
}

/// Every live process's pid (from /proc).
pub fn live_pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| super::pid_alive(*pid))
}

/// Whether `pid` is a template's spare (it names itself so until it is
/// handed over).
pub fn is_spare(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "cellhost-spare")
}

/// Whether `pid` is a warm template (it names itself so).
pub fn is_template(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "cellhost-tmpl")
}

/// Live warm templates anywhere on the machine whose parent is `parent`.
pub fn template_pids(parent: u32) -> Vec<u32> {
    live_pids()
        .filter(|pid| is_template(*pid) && super::parent_of(*pid) == Some(parent))
        .collect()
}

/// Poll `f` until it holds or `within` passes.
pub async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + within;
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}
