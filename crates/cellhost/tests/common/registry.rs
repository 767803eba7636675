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

/// Pids of live processes whose command line names a runner script under
/// `run_dir` (read from /proc: real processes, not registry entries).
pub fn runner_pids(run_dir: &Path) -> Vec<u32> {
    let needle = run_dir.to_string_lossy().into_owned();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains("runner.py") && cmdline.contains(&needle) && super::pid_alive(pid) {
            pids.push(pid);
        }
    }
    pids
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
