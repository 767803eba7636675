//! `%pip` (through `pipmagic.pip_magic`, what the dialect transform calls)
//! against a local index: real pip, run by the host in its own sandbox,
//! into the session's package dir that a strict kernel (no network,
//! read-only site-packages) imports from on the next line.

mod common;

use std::time::Duration;

use cellhost::packages::PackageOptions;
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{Cell, CellResult, Status, StrictSandbox};
use common::index;

fn strict_with(
    dir: &tempfile::TempDir,
    policy: std::sync::Arc<cellhost::config::PackagesConfig>,
) -> cellhost::KernelOptions {
    let mut opts = common::strict_options(dir, StrictSandbox::default());
    opts.packages = PackageOptions {
        policy,
        ..PackageOptions::default()
    };
    opts.default_timeout = Some(Duration::from_secs(120));
    opts
}

fn ok(r: &CellResult) {
    assert_eq!(r.status, Status::Success, "{r:#?}");
}

/// Times (from the cell's start) of pip's first output and of the return.
const STREAMED: &str = r#"
import sys, time
from pipmagic import pip_magic
t0 = time.monotonic()
writes = []
class Rec:
    def write(self, s):
        writes.append((time.monotonic() - t0, s))
        return len(s)
    def flush(self):
        pass
real, sys.stdout = sys.stdout, Rec()
try:
    status = pip_magic("install tinypkg")
finally:
    sys.stdout = real
done = time.monotonic() - t0
import tinypkg
text = "".join(s for _, s in writes)
print(status, tinypkg.VALUE, tinypkg.__file__)
print("first-output-before-end:", done - writes[0][0])
print(text)
"#;

#[tokio::test]
async fn pip_install_in_a_strict_kernel_imports_on_the_next_line_and_streams_its_output() {
    let idx = index::serve();
    let dir = tempfile::tempdir().unwrap();
    let k = common::kernel_with(strict_with(&dir, index::policy(&idx, "")), dir).await;
    // The sandbox itself has no network and cannot write site-packages.
    let r = k.run("import tinypkg").await;
    assert!(
        r.error
            .as_deref()
            .unwrap_or("")
            .contains("ModuleNotFoundError"),
        "{r:#?}"
    );
    // A cell's own `pipmagic.py` in the cwd does not stand in for it.
    let r = k
        .run("open('pipmagic.py', 'w').write('raise SystemExit(3)')")
        .await;
    ok(&r);
    let r = k.run(STREAMED).await;
    ok(&r);
    let out = &r.stdout;
    assert!(
        out.contains("0 42 /run/cellhost/packages/tinypkg/__init__.py"),
        "{out}"
    );
    assert!(out.contains("Successfully installed tinypkg-1.0"), "{out}");
    // pip's first lines arrived while it still ran, not all at the end.
    let lead: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("first-output-before-end: "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(lead > 0.05, "output came only at the end ({lead} s): {out}");
    // The kernel cannot write its package dir.
    let r = k.run("open('/run/cellhost/packages/x', 'w')").await;
    assert!(
        r.error.as_deref().unwrap_or("").contains("Read-only"),
        "{r:#?}"
    );
}

#[tokio::test]
async fn deny_and_only_binary_refuse_with_the_rule_that_refused() {
    let idx = index::serve();
    let dir = tempfile::tempdir().unwrap();
    let policy = index::policy(&idx, "deny = [\"evil*\"]\n");
    let k = common::kernel_with(strict_with(&dir, policy), dir).await;
    let r = k
        .run("from pipmagic import pip_magic\npip_magic('install evilpkg')")
        .await;
    let e = r.error.clone().unwrap_or_default();
    assert!(
        e.contains("PipError") && e.contains("deny pattern \"evil*\""),
        "{r:#?}"
    );
    let r = k.run("pip_magic('install sdistpkg')").await;
    let e = r.error.clone().unwrap_or_default();
    assert!(e.contains("only_binary = true"), "{r:#?}");
    assert!(
        e.contains("from versions: none"),
        "pip's own last lines: {r:#?}"
    );
    let r = k.run("pip_magic('install -r /etc/passwd')").await;
    assert!(r.error.unwrap_or_default().contains("not supported"));
    let r = k.run("import evilpkg").await;
    assert!(r.error.unwrap_or_default().contains("ModuleNotFoundError"));
}

async fn manager(
    dir: &tempfile::TempDir,
    idx: &index::Index,
    f: impl FnOnce(ManagerOptions) -> ManagerOptions,
) -> KernelManager {
    let opts = ManagerOptions::new(dir.path().join("data"))
        .kernel(strict_with(dir, index::policy(idx, "")))
        .warm_pool(0)
        .idle_timeout(None);
    KernelManager::start(f(opts)).await
}

async fn run(m: &KernelManager, owner: &str, cell: Cell) -> CellResult {
    m.execute(owner, cell).await.expect("execute")
}

#[tokio::test]
async fn packages_survive_reset_and_restart_and_stay_in_their_session() {
    let idx = index::serve();
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&dir, &idx, |o| o).await;
    let install = "from pipmagic import pip_magic\npip_magic('install tinypkg')\nimport tinypkg\ntinypkg.VALUE";
    let r = run(&m, "a", Cell::new(install)).await;
    ok(&r);
    assert_eq!(r.value.as_deref(), Some("42"));
    let r = run(
        &m,
        "a",
        Cell::new("import tinypkg\ntinypkg.VALUE").reset(true),
    )
    .await;
    ok(&r);
    assert!(r.kernel.state_reset, "{r:#?}");
    let r = run(&m, "b", Cell::new("import tinypkg")).await;
    assert!(
        r.error.unwrap_or_default().contains("ModuleNotFoundError"),
        "another session sees none"
    );
    m.shutdown().await;
    // A new manager on the same data dir (a daemon restart).
    let m = manager(&dir, &idx, |o| o).await;
    let r = run(&m, "a", Cell::new("import tinypkg\ntinypkg.VALUE")).await;
    ok(&r);
    assert_eq!(r.value.as_deref(), Some("42"));
    // Deleting the session removes its packages.
    m.dispose_owner("a").await;
    let r = run(&m, "a", Cell::new("import tinypkg")).await;
    assert!(r.error.unwrap_or_default().contains("ModuleNotFoundError"));
    m.shutdown().await;
}

#[tokio::test]
async fn a_pooled_kernel_hands_its_package_dir_to_its_owner() {
    let idx = index::serve();
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&dir, &idx, |o| o.warm_pool(1)).await;
    assert!(common::registry::eventually(Duration::from_secs(30), || m.pooled() == 1).await);
    let r = run(
        &m,
        "p",
        Cell::new("from pipmagic import pip_magic\npip_magic('install tinypkg')\nimport tinypkg"),
    )
    .await;
    ok(&r);
    assert_eq!(m.stats().pool_hits, 1, "served by the pooled kernel");
    let r = run(
        &m,
        "p",
        Cell::new("import tinypkg\ntinypkg.VALUE").reset(true),
    )
    .await;
    assert_eq!(r.value.as_deref(), Some("42"), "{r:#?}");
    m.shutdown().await;
}

#[tokio::test]
async fn preload_makes_the_first_import_in_a_new_pooled_session_cheap() {
    let dir = tempfile::tempdir().unwrap();
    let idx = index::serve();
    let m = manager(&dir, &idx, |o| {
        o.warm_pool(1)
            .preload(vec!["pandas".into(), "no_such_module_here".into()])
    })
    .await;
    assert!(common::registry::eventually(Duration::from_secs(60), || m.pooled() == 1).await);
    let code = "import sys, time\nwas = 'pandas' in sys.modules\nt = time.perf_counter()\nimport pandas as pd\npd.DataFrame({'a': [1]})\n(was, time.perf_counter() - t)";
    let r = run(&m, "s", Cell::new(code)).await;
    ok(&r);
    let v = r.value.unwrap();
    assert!(v.starts_with("(True, "), "{v}");
    let secs: f64 = v
        .trim_start_matches("(True, ")
        .trim_end_matches(')')
        .parse()
        .unwrap();
    assert!(secs < 0.05, "first import took {secs} s");
    m.shutdown().await;
}

/// What the first cell of a pooled session sees of the pool's warm-up:
/// the heap frozen, the lazily imported modules behind a first HTML table
/// and a first rendered figure loaded, and nothing left in its namespace,
/// its figures or its result.
const WARMED: &str = "import gc, sys\nimport matplotlib.pyplot as plt\n(gc.get_freeze_count() > 0, 'pandas.io.formats.html' in sys.modules, 'matplotlib.backends.backend_agg' in sys.modules, plt.get_fignums(), [k for k in ('df', 'fig', 'ax', 'a', 'np', 'pd') if k in globals()])";

#[tokio::test]
async fn pooled_kernels_warm_their_preloaded_modules_up_unless_warmup_is_off() {
    let idx = index::serve();
    for (warmup, want) in [
        (true, "(True, True, True, [], [])"),
        (false, "(False, False, False, [], [])"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let m = manager(&dir, &idx, |o| {
            o.warm_pool(1)
                .warmup(warmup)
                .preload(vec!["pandas".into(), "matplotlib.pyplot".into()])
        })
        .await;
        assert!(common::registry::eventually(Duration::from_secs(90), || m.pooled() == 1).await);
        let r = run(&m, "s", Cell::new(WARMED)).await;
        ok(&r);
        assert_eq!(r.value.as_deref(), Some(want), "warmup = {warmup}");
        assert!(r.displays.is_empty(), "{:?}", r.displays);
        m.shutdown().await;
    }
}

#[tokio::test]
async fn none_profile_kernels_install_into_the_same_per_session_dir() {
    let idx = index::serve();
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(&dir).python(common::venv_python());
    opts.packages = PackageOptions {
        policy: index::policy(&idx, ""),
        ..PackageOptions::default()
    };
    let m = KernelManager::start(
        ManagerOptions::new(dir.path().join("data"))
            .kernel(opts)
            .warm_pool(0)
            .idle_timeout(None),
    )
    .await;
    let code = "from pipmagic import pip_magic\npip_magic('install tinypkg')\nimport tinypkg\ntinypkg.__file__";
    let r = run(&m, "n", Cell::new(code)).await;
    ok(&r);
    let f = r.value.unwrap_or_default();
    assert!(
        f.contains("/data/workspaces/n-") && f.contains("/pkgs/tinypkg/__init__.py"),
        "{f}"
    );
    let r = run(&m, "other", Cell::new("import tinypkg")).await;
    assert!(r.error.unwrap_or_default().contains("ModuleNotFoundError"));
    m.shutdown().await;
}

/// The `uv` binary scripts/test installs into the test venv
/// (scripts/test-requirements.txt), or `$CELLHOST_TEST_UV`.
fn uv() -> std::path::PathBuf {
    let path = std::env::var_os("CELLHOST_TEST_UV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| common::venv_python().with_file_name("uv"));
    assert!(
        path.exists(),
        "{} is missing: scripts/test installs uv into the test venv (scripts/test-requirements.txt); \
         or point CELLHOST_TEST_UV at a uv binary",
        path.display()
    );
    path
}

/// Install, import, uninstall, and the import fails again; `installer`
/// says which tool the host runs.
async fn install_then_uninstall(installer: &str, want_output: &str) {
    let idx = index::serve();
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "installer = {installer:?}\nuv = {:?}\n",
        uv().display().to_string()
    );
    let k = common::kernel_with(strict_with(&dir, index::policy(&idx, &extra)), dir).await;
    let r = k
        .run("from pipmagic import pip_magic\npip_magic('install tinypkg')\nimport tinypkg\ntinypkg.VALUE")
        .await;
    ok(&r);
    assert_eq!(r.value.as_deref(), Some("42"));
    assert!(r.stdout.contains(want_output), "{installer}: {}", r.stdout);
    let r = k.run("pip_magic('install sdistpkg')").await;
    assert!(
        r.error.as_deref().unwrap_or("").contains("only_binary"),
        "{installer}: {r:#?}"
    );
    let r = k.run("pip_magic('uninstall -y tinypkg')").await;
    ok(&r);
    assert!(
        r.stdout.contains("Successfully uninstalled tinypkg"),
        "{}",
        r.stdout
    );
    let r = k
        .run("import os, sys\ndel sys.modules['tinypkg']\nsorted(n for n in os.listdir('/run/cellhost/packages') if n != '.lock')")
        .await;
    ok(&r);
    // (uv leaves its `.lock` in the target.)
    assert_eq!(
        r.value.as_deref(),
        Some("[]"),
        "everything it installed is gone"
    );
    let r = k.run("import tinypkg").await;
    assert!(
        r.error
            .as_deref()
            .unwrap_or("")
            .contains("ModuleNotFoundError"),
        "{r:#?}"
    );
    let r = k.run("pip_magic('uninstall tinypkg')").await;
    assert!(
        r.error.as_deref().unwrap_or("").contains("not installed"),
        "{r:#?}"
    );
}

#[tokio::test]
async fn pip_uninstall_removes_what_pip_installed() {
    install_then_uninstall("pip", "Successfully installed tinypkg-1.0").await;
}

#[tokio::test]
async fn uv_installs_when_configured_and_uninstall_removes_it() {
    install_then_uninstall("uv", "+ tinypkg==1.0").await;
}
