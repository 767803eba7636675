//! Helpers shared by the kernel integration tests: real processes only.
#![allow(dead_code)]

pub mod display;
pub mod index;
pub mod registry;
pub mod remote;
pub mod sshd;
pub mod tools;

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

/// A kernel of `opts`: spawned, or with `CELLHOST_TEST_KERNELS=forked`
/// (scripts/test runs the sandbox suites a second time so) a strict one is
/// forked from a warm template of its own, which is then shut down (its
/// forks outlive it), so every sandbox test checks forked kernels too
/// (docs/templates.md, "Strict kernels").
pub async fn kernel_with(opts: KernelOptions, dir: tempfile::TempDir) -> TestKernel {
    let kernel = if opts.sandbox.is_strict() && forked_kernels() {
        let template = cellhost::Template::start(&opts)
            .await
            .expect("a strict template starts");
        let kernel = template.fork(opts).await.expect("a kernel forks from it");
        // Forked indeed: the runner, its namespace's init, the fork, then
        // the template.
        let runner = kernel.pid().expect("a live kernel");
        let up = |pid| parent_of(pid).expect("a live parent");
        assert_eq!(
            Some(up(up(up(runner)))),
            template.pid(),
            "a fork of the template"
        );
        template.shutdown().await;
        kernel
    } else {
        Kernel::spawn(opts).await.expect("kernel starts")
    };
    TestKernel { kernel, dir }
}

/// `CELLHOST_TEST_KERNELS=forked`: strict test kernels are template forks.
pub fn forked_kernels() -> bool {
    std::env::var("CELLHOST_TEST_KERNELS").is_ok_and(|v| v == "forked")
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
    // Without `..` hops: a sandbox binds the venv, not the dirs on the way.
    // The venv's `python` symlink itself is kept (it makes the venv).
    let dir = path.parent().unwrap().canonicalize().unwrap();
    dir.join(path.file_name().unwrap())
}

/// bubblewrap must be installed for the sandbox tests: they fail, never
/// skip, without it.
pub fn require_bwrap() {
    let found = ["/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap"]
        .iter()
        .any(|p| std::path::Path::new(p).exists());
    assert!(
        found,
        "bubblewrap (bwrap) is missing; run scripts/test, which installs it"
    );
}

/// Options for a strict-sandbox kernel on the test venv's interpreter.
pub fn strict_options(dir: &tempfile::TempDir, strict: cellhost::StrictSandbox) -> KernelOptions {
    require_bwrap();
    options(dir)
        .python(venv_python())
        .sandbox(cellhost::Sandbox::Strict(strict))
}

/// A strict-sandbox kernel with default settings and limits.
pub async fn strict_kernel() -> TestKernel {
    let dir = tempfile::tempdir().unwrap();
    let opts = strict_options(&dir, cellhost::StrictSandbox::default());
    kernel_with(opts, dir).await
}

// /proc facts about processes, from the library (not every test binary
// uses both: the module's `dead_code` allowance, for imports).
#[allow(unused_imports)]
pub use cellhost::sys::{descendants, parent_pid as parent_of};
