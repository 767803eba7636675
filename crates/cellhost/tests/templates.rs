//! Warm templates (docs/templates.md): new `none` kernels are forks of
//! one idle kernel per flavour, each re-homed as a kernel of its own.
//! Real processes: parents read from /proc.

mod common;

use std::time::Duration;

use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{Cell, CellResult};
use common::parent_of;
use common::registry::{eventually, manager_options, template_pids};
use common::venv_python;

fn options(dir: &tempfile::TempDir) -> ManagerOptions {
    let o = manager_options(dir);
    let kernel = o.kernel.clone().python(venv_python());
    o.kernel(kernel).preload(vec!["colorsys".into()])
}

async fn run(m: &KernelManager, owner: &str, code: &str) -> CellResult {
    let r = m.execute(owner, Cell::new(code)).await.expect("execute");
    assert!(r.is_success(), "{owner}: {r:?}");
    r
}

async fn value(m: &KernelManager, owner: &str, code: &str) -> String {
    run(m, owner, code).await.value.expect("a value")
}

async fn pid_of(m: &KernelManager, owner: &str) -> u32 {
    value(m, owner, "import os; os.getpid()")
        .await
        .parse()
        .unwrap()
}

#[tokio::test]
async fn new_kernels_are_forks_of_one_warm_template_each_a_kernel_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(options(&dir)).await;
    run(&m, "a", "x = 1").await;
    run(&m, "b", "y = 2").await;
    let (a, b) = (pid_of(&m, "a").await, pid_of(&m, "b").await);
    let templates = template_pids(std::process::id());
    assert_eq!(templates.len(), 1, "one template for one flavour");
    let template = templates[0];
    assert_eq!(parent_of(a), Some(template), "a is a fork of the template");
    assert_eq!(parent_of(b), Some(template), "b is a fork of the template");
    let stats = m.stats();
    assert_eq!((stats.templates, stats.template_forks), (1, 2), "{stats:?}");
    // Each its own: state, process group, cwd (its workspace), name.
    assert_eq!(
        value(&m, "b", "'x' in globals(), y").await,
        "(False, 2)",
        "b does not see a's state"
    );
    for (owner, pid) in [("a", a), ("b", b)] {
        assert_eq!(
            value(&m, owner, "import os; os.getpgid(0) == os.getpid()").await,
            "True",
            "{owner} leads a process group of its own"
        );
        let cwd = value(&m, owner, "os.getcwd()").await;
        let ws = m.workspace(owner).unwrap();
        assert_eq!(
            cwd.trim_matches('\''),
            ws.root().to_string_lossy(),
            "{owner}'s cwd is its workspace"
        );
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        assert_ne!(
            comm.trim(),
            "cellhost-tmpl",
            "{owner} is named a kernel again"
        );
    }
    // The template imported the preload once; its forks have it.
    assert_eq!(
        value(&m, "a", "import sys; 'colorsys' in sys.modules").await,
        "True"
    );
    // A fork that dies is one kernel: its session restarts it, and the
    // template and the other session live on.
    let r = m
        .execute("a", Cell::new("import os; os._exit(3)"))
        .await
        .unwrap();
    assert!(!r.is_success());
    assert!(common::pid_alive(template), "the template lives on");
    assert_eq!(value(&m, "b", "y").await, "2");
    m.shutdown().await;
    assert!(
        eventually(Duration::from_secs(5), || !common::pid_alive(template)).await,
        "the template goes with the manager"
    );
    assert!(!common::pid_alive(b));
    // Its spare (the next kernel, forked ahead) too: nothing of the
    // manager's runs on.
    let run = dir.path().join("run");
    assert!(
        eventually(Duration::from_secs(5), || started_under(&run).is_empty()).await,
        "left running: {:?}",
        started_under(&run)
    );
}

/// Live processes whose command line names `dir` (kernels, templates and
/// spares alike: a fork keeps its template's command line).
fn started_under(dir: &std::path::Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    common::registry::live_pids()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        })
        .collect()
}

#[tokio::test]
async fn with_templates_off_a_kernel_is_the_hosts_own_child() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(options(&dir).templates(false)).await;
    let pid = pid_of(&m, "a").await;
    assert_eq!(parent_of(pid), Some(std::process::id()));
    assert!(template_pids(std::process::id()).is_empty());
    assert_eq!(m.stats().template_forks, 0);
    m.shutdown().await;
}

#[tokio::test]
async fn a_template_killed_costs_no_kernel_and_new_ones_start_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(options(&dir)).await;
    let first = pid_of(&m, "a").await;
    let template = parent_of(first).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(template as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(eventually(Duration::from_secs(5), || !common::pid_alive(template)).await);
    // The fork outlives its template (it has its own death pipe).
    assert_eq!(pid_of(&m, "a").await, first, "a's kernel lives on");
    // New sessions still get kernels: the spare forked before the kill
    // (a whole kernel-to-be of its own), then plain spawns while the
    // broken template's flavour waits to be tried again.
    let b = pid_of(&m, "b").await;
    assert_ne!(parent_of(b), Some(template));
    let c = pid_of(&m, "c").await;
    assert_eq!(parent_of(c), Some(std::process::id()), "spawned plainly");
    assert_eq!(value(&m, "b", "1 + 1").await, "2");
    m.shutdown().await;
    assert!(!common::pid_alive(b), "b goes with the manager too");
}

#[tokio::test]
async fn a_session_with_packages_installed_spawns_plainly_and_imports_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(&dir).preload(vec!["tmplprobe".into()]);
    o.max_kernels = 1;
    let m = KernelManager::start(o).await;
    let first = pid_of(&m, "a").await;
    assert_ne!(
        parent_of(first),
        Some(std::process::id()),
        "a fork at first"
    );
    // What `%pip install` leaves: a module in the session's package dir
    // (on sys.path), here one the template preloads (it had none, so
    // skipped it) and the session now has a version of its own.
    run(
        &m,
        "a",
        "import sys\n\
         d = [p for p in sys.path if p.endswith('pkgs') or p.endswith('.pkgs')][0]\n\
         open(d + '/tmplprobe.py', 'w').write('WHO = \"the session\"')",
    )
    .await;
    // Evicted by b (max_kernels = 1), then back: its next kernel starts
    // with the packages it has, read at its start.
    pid_of(&m, "b").await;
    let again = pid_of(&m, "a").await;
    assert_ne!(again, first, "a was evicted");
    assert_eq!(
        parent_of(again),
        Some(std::process::id()),
        "spawned plainly"
    );
    assert_eq!(
        value(&m, "a", "import tmplprobe; tmplprobe.WHO").await,
        "'the session'"
    );
    m.shutdown().await;
}

/// A fork's memory limit is its own cgroup's (its template has none where
/// that is so): 400 MiB, once (bounded: no bomb outside a sandbox), in a
/// kernel limited to 256 MiB is killed and named; the template and the
/// next kernel live on.
#[tokio::test]
async fn a_forks_memory_limit_holds_and_its_template_outlives_the_kill() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let o = options(&dir);
    let kernel = o
        .kernel
        .clone()
        .limits(cellhost::ResourceLimits::default().memory_bytes(Some(256 * MIB)));
    let m = KernelManager::start(o.kernel(kernel)).await;
    let first = pid_of(&m, "a").await;
    let template = parent_of(first).unwrap();
    assert_ne!(template, std::process::id(), "a fork");
    let r = m
        .execute("a", Cell::new("b = bytearray(400 << 20)"))
        .await
        .unwrap();
    let err = r.error.clone().unwrap_or_default();
    assert!(err.contains("memory limit 256 MiB exceeded"), "{r:?}");
    assert!(r.kernel.state_lost, "{r:?}");
    assert!(common::pid_alive(template), "the template lives on");
    // Well within the limit, a fork holds 100 MiB.
    run(&m, "b", "b = bytearray(100 << 20)").await;
    assert_eq!(parent_of(pid_of(&m, "b").await), Some(template));
    m.shutdown().await;
}
