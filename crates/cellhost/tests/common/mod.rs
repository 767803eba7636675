//! Helpers shared by the kernel integration tests: real processes only.
#![allow(dead_code)]

pub mod display;
pub mod registry;

use std::time::{Duration, Instant};

use cellhost::{Cell, CellResult, Kernel, KernelOptions};

pub use cellhost::kernel::pid_alive;

pub struct TestKernel {
    pub kernel: Kernel,
    pub dir: tempfile::TempDir,
}

pub fn options(dir: &tempfile::TempDir) -> KernelOptions {
    KernelOptions::default()
        .runtime_dir(dir.path())
        .interrupt_grace(Duration::from_millis(1500))
}

pub async fn kernel() -> TestKernel {
    let dir = tempfile::tempdir().unwrap();
    kernel_with(options(&dir), dir).await
}

pub async fn kernel_with(opts: KernelOptions, dir: tempfile::TempDir) -> TestKernel {
    let kernel = Kernel::spawn(opts).await.expect("kernel starts");
    TestKernel { kernel, dir }
}

/// A kernel whose host environment is PATH plus `vars` (no passthrough).
pub async fn kernel_with_env(vars: &[(&str, &str)], passthrough: &[String]) -> TestKernel {
    use std::ffi::OsString;
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec![(OsString::from("PATH"), std::env::var_os("PATH").unwrap())];
    all.extend(
        vars.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    let opts = options(&dir).env(cellhost::env::ChildEnv::from_vars(all, passthrough));
    kernel_with(opts, dir).await
}

impl TestKernel {
    pub async fn run(&self, code: &str) -> CellResult {
        self.kernel.execute(Cell::new(code)).await.expect("execute")
    }

    pub async fn run_cell(&self, cell: Cell) -> CellResult {
        self.kernel.execute(cell).await.expect("execute")
    }

    pub fn staging_dirs(&self) -> Vec<std::path::PathBuf> {
        match std::fs::read_dir(self.dir.path().join("kernels")) {
            Ok(rd) => rd.map(|e| e.unwrap().path()).collect(),
            Err(_) => Vec::new(),
        }
    }
}

/// Wait until `pid` is gone (or the deadline passes); true when gone.
pub fn wait_gone(pid: u32, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if !pid_alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    !pid_alive(pid)
}

pub fn self_rss() -> u64 {
    cellhost::kernel::rss_bytes(std::process::id()).unwrap()
}

/// The interpreter of the test venv with numpy, pandas, matplotlib and
/// pillow (`scripts/test` creates it and sets `CELLHOST_TEST_VENV_PYTHON`).
/// Tests that need it fail, never skip, when it is missing.
pub fn venv_python() -> std::path::PathBuf {
    let path = match std::env::var_os("CELLHOST_TEST_VENV_PYTHON") {
        Some(p) => std::path::PathBuf::from(p),
        None => {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-test/bin/python")
        }
    };
    assert!(
        path.exists(),
        "the test venv is missing ({}); run scripts/test, which creates it",
        path.display()
    );
    path
}
