//! Packages and remote-file benchmark, figures as ratios against a
//! reference measured in the same run (samples interleaved):
//!
//! 1. `%pip install` of a small wheel from a local PEP 503 index into a
//!    strict kernel (the host runs the installer in its own bwrap
//!    sandbox) against `pip install --target` of the same wheel outside
//!    any sandbox; with pip and with uv (`uv pip install --target` as
//!    the reference). Target ≤ 1.5×.
//! 2. A new session's time to its first `import pandas;
//!    pd.DataFrame({"a": [1]})` (from `execute` to the result, pooled
//!    kernel), with and without `[kernel] preload = ["pandas"]`, and with
//!    preload but `[kernel] warmup = false`. Target with preload ≤ 10 ms
//!    p50.
//! 3. Remote workspace download (ssh): a file of BENCH_FILE_MIB (256)
//!    through the workspace handle against `cat` of the same file over
//!    the same multiplexed ssh connection (the manager's own control
//!    socket). Target ≥ 0.5× the throughput of `cat`.
//!
//! Usage: scripts/bench-packages (needs the test hosts of
//! scripts/testenv-up for 3, the test venv with pandas and uv). BENCH_N
//! (7) samples per figure; writes bench/results/packages.json.

#[allow(dead_code)]
#[path = "stats.rs"]
mod stats;

// The tests' local PEP 503 index (it allows its own dead code).
#[path = "../../crates/cellhost/tests/common/index.rs"]
mod index;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cellhost::config::{BackendConfig, SshConfig};
use cellhost::packages::PackageOptions;
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{Cell, KernelOptions, Sandbox, Status, StrictSandbox};
use serde_json::json;
use stats::Summary;

/// The interpreter with pandas (and uv beside it): the test venv.
fn venv_python() -> PathBuf {
    std::env::var_os("CELLHOST_TEST_VENV_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv-test/bin/python")
        })
}

fn uv() -> PathBuf {
    std::env::var_os("CELLHOST_TEST_UV")
        .map(PathBuf::from)
        .unwrap_or_else(|| venv_python().with_file_name("uv"))
}

fn env(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: run scripts/bench-packages"))
}

fn samples() -> usize {
    std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7)
}

fn ms(s: &Summary) -> f64 {
    s.p50 / 1e3
}

async fn start(
    dir: &tempfile::TempDir,
    f: impl FnOnce(ManagerOptions) -> ManagerOptions,
) -> KernelManager {
    let opts = ManagerOptions::new(dir.path().join("data"))
        .warm_pool(0)
        .idle_timeout(None);
    KernelManager::start(f(opts)).await
}

fn strict(
    dir: &tempfile::TempDir,
    policy: std::sync::Arc<cellhost::config::PackagesConfig>,
) -> KernelOptions {
    let mut k = KernelOptions::default()
        .runtime_dir(dir.path().join("run"))
        .python(venv_python())
        .sandbox(Sandbox::Strict(StrictSandbox::default()));
    k.packages = PackageOptions {
        policy,
        ..PackageOptions::default()
    };
    k.default_timeout = Some(Duration::from_secs(300));
    k
}

async fn pip_figures(n: usize, out: &mut serde_json::Map<String, serde_json::Value>) -> Result<()> {
    let idx = index::serve();
    let uv = uv();
    if !uv.exists() {
        bail!(
            "{} is missing: scripts/test installs uv into the test venv",
            uv.display()
        );
    }
    for installer in ["pip", "uv"] {
        let dir = tempfile::tempdir()?;
        let extra = format!(
            "installer = {installer:?}\nuv = {:?}\n",
            uv.display().to_string()
        );
        let policy = index::policy(&idx, &extra);
        let m = start(&dir, |o| o.kernel(strict(&dir, policy))).await;
        let r = m
            .execute("bench", Cell::new("from pipmagic import pip_magic"))
            .await?;
        if r.status != Status::Success {
            bail!("kernel start failed: {r:?}");
        }
        let target = tempfile::tempdir()?;
        let (mut ours, mut plain) = (Vec::new(), Vec::new());
        for i in 0..=n {
            let t = Instant::now();
            let r = m
                .execute("bench", Cell::new("pip_magic('install -q -U tinypkg')"))
                .await?;
            let d = t.elapsed();
            if r.status != Status::Success {
                bail!("%pip failed: {r:?}");
            }
            let mut cmd = if installer == "uv" {
                let mut c = Command::new(&uv);
                c.args(["pip", "install", "-q", "-U", "--python"])
                    .arg(venv_python())
                    .args([
                        "--only-binary",
                        ":all:",
                        "--index-url",
                        &idx.url,
                        "--target",
                    ]);
                c
            } else {
                let mut c = Command::new(venv_python());
                c.args([
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "-U",
                    "--disable-pip-version-check",
                ])
                .args([
                    "--only-binary=:all:",
                    "--index-url",
                    &idx.url,
                    "--target",
                ]);
                c
            };
            let t = Instant::now();
            let o = cmd
                .arg(target.path())
                .arg("tinypkg")
                .stdout(Stdio::null())
                .output()?;
            let p = t.elapsed();
            if !o.status.success() {
                bail!("the reference install failed: {o:?}");
            }
            if i > 0 {
                // The first of each is a warm-up (caches, the interpreter's pages).
                ours.push(d);
                plain.push(p);
            }
        }
        m.shutdown().await;
        let (a, b) = (
            Summary::of(&ours).expect("samples"),
            Summary::of(&plain).expect("samples"),
        );
        let ratio = a.p50 / b.p50;
        println!(
            "  %pip install ({installer}, host-side in bwrap, strict kernel) {:>8.1} ms   {installer} install --target unsandboxed {:>8.1} ms   ratio {ratio:.2}x (target <= 1.5x){}",
            ms(&a),
            ms(&b),
            if ratio <= 1.5 { "" } else { "  MISSED" }
        );
        out.insert(
            format!("pip_install_{installer}"),
            json!({"cellhost": a.to_json(), "reference": b.to_json(), "ratio_p50": ratio}),
        );
    }
    Ok(())
}

/// The cell; it also says how long the import and the frame (with its
/// repr, the cell's value) took inside the kernel.
const FIRST_PANDAS: &str = "import time as _t\n_t0 = _t.perf_counter()\nimport pandas as pd\n_df = pd.DataFrame({'a': [1]})\n_r = repr(_df)\nprint(_t.perf_counter() - _t0)\n_df";

async fn preload_figures(
    n: usize,
    out: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    let mut without = None;
    for (preload, warmup) in [(false, false), (true, false), (true, true)] {
        let dir = tempfile::tempdir()?;
        let k = KernelOptions::default()
            .runtime_dir(dir.path().join("run"))
            .python(venv_python());
        let m = start(&dir, |o| {
            o.kernel(k).warm_pool(1).warmup(warmup).preload(if preload {
                vec!["pandas".into()]
            } else {
                vec![]
            })
        })
        .await;
        let mut times = Vec::new();
        let mut inside = Vec::new();
        for i in 0..n {
            let deadline = Instant::now() + Duration::from_secs(120);
            while m.pooled() < 1 {
                if Instant::now() > deadline {
                    bail!("the pool did not refill");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // Let the pooled kernel finish its preload before it is taken.
            tokio::time::sleep(Duration::from_millis(if preload { 3000 } else { 300 })).await;
            let t = Instant::now();
            let r = m.execute(&format!("s{i}"), Cell::new(FIRST_PANDAS)).await?;
            let d = t.elapsed();
            if r.status != Status::Success {
                bail!("the first pandas cell failed: {r:?}");
            }
            times.push(d);
            let secs: f64 = r.stdout.trim().parse().unwrap_or(0.0);
            inside.push(Duration::from_secs_f64(secs));
        }
        m.shutdown().await;
        let s = Summary::of(&times).expect("samples");
        let inner = Summary::of(&inside).expect("samples");
        let (label, key) = match (preload, warmup) {
            (false, _) => ("without preload        ", "first_pandas_no_preload"),
            (true, false) => ("preload, warmup = false", "first_pandas_preload_no_warmup"),
            (true, true) => ("with preload (+warmup) ", "first_pandas_preload"),
        };
        let mut row = json!({"execute": s.to_json(), "in_kernel": inner.to_json()});
        let mut note = String::new();
        match without {
            None => without = Some(ms(&s)),
            Some(reference) => {
                let ratio = reference / ms(&s);
                row["faster_than_no_preload_p50"] = json!(ratio);
                note = format!("  {ratio:.0}x faster than without preload");
                if warmup {
                    note.push_str(if ms(&s) <= 10.0 {
                        " (target <= 10 ms)"
                    } else {
                        " (target <= 10 ms)  MISSED"
                    });
                }
            }
        }
        println!(
            "  new session, first `import pandas; pd.DataFrame(...)` {label}: {:>8.1} ms p50 (in the kernel: import + frame + repr {:.1} ms){note}",
            ms(&s),
            ms(&inner),
        );
        out.insert(key.into(), row);
    }
    Ok(())
}

async fn download_figures(
    n: usize,
    out: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    let mib: u64 = std::env::var("BENCH_FILE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let (host, port, user, key) = (
        env("CELLHOST_TEST_SSH_HOST")?,
        env("CELLHOST_TEST_SSH_PORT")?,
        env("CELLHOST_TEST_SSH_USER")?,
        env("CELLHOST_TEST_SSH_KEY")?,
    );
    let dir = tempfile::tempdir()?;
    let ssh = BackendConfig::Ssh(SshConfig {
        host: Some(host.clone()),
        user: Some(user.clone()),
        port: Some(port.parse()?),
        identity: Some(key.clone().into()),
        ..SshConfig::default()
    });
    let m = start(&dir, |o| {
        o.kernel(KernelOptions::default().runtime_dir(dir.path().join("run")))
            .backend("box", ssh)
            .default_backend("box")
    })
    .await;
    let code = format!(
        "import os\nwith open('big.bin', 'wb') as f:\n    for _ in range({mib}):\n        f.write(os.urandom(1 << 20))\nos.path.abspath('big.bin')"
    );
    let r = m.execute("bench", Cell::new(code)).await?;
    if r.status != Status::Success {
        bail!("could not write the file: {r:?}");
    }
    let remote_path = r.value.unwrap_or_default().trim_matches('\'').to_owned();
    let ws = m.workspace("bench")?;
    // The manager's own control socket: `cat` rides the same connection.
    let socket = std::fs::read_dir(dir.path().join("run/ssh"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("cm-"))
        })
        .context("the manager's ssh control socket")?;
    let (mut ours, mut cat) = (Vec::new(), Vec::new());
    let bytes = mib << 20;
    for _ in 0..n.min(5) {
        let t = Instant::now();
        let got = ws.read_to("big.bin", None, &mut tokio::io::sink()).await?;
        ours.push(t.elapsed());
        if got != bytes {
            bail!("downloaded {got} bytes, not {bytes}");
        }
        let t = Instant::now();
        let o = Command::new("ssh")
            .args(["-p", &port, "-i", &key, "-l", &user, "-o", "BatchMode=yes"])
            .args(["-o", "ControlMaster=no", "-o"])
            .arg(format!("ControlPath={}", socket.display()))
            .args(["-T", &host, "cat"])
            .arg(&remote_path)
            .stdout(Stdio::piped())
            .spawn()?
            .wait_with_output()?;
        cat.push(t.elapsed());
        if o.stdout.len() as u64 != bytes {
            bail!("cat gave {} bytes", o.stdout.len());
        }
    }
    let rss = cellhost::kernel::rss_bytes(std::process::id()).unwrap_or(0);
    m.shutdown().await;
    let (a, b) = (
        Summary::of(&ours).expect("samples"),
        Summary::of(&cat).expect("samples"),
    );
    let (ta, tb) = (bytes as f64 / (a.p50 / 1e6), bytes as f64 / (b.p50 / 1e6));
    let ratio = ta / tb;
    println!(
        "  remote download ({mib} MiB, ssh): workspace handle {:>7.1} MiB/s   `cat` on the same ssh connection {:>7.1} MiB/s   ratio {ratio:.2}x (target >= 0.5x){}; bench RSS after {:.0} MiB",
        ta / 1048576.0,
        tb / 1048576.0,
        if ratio >= 0.5 { "" } else { "  MISSED" },
        rss as f64 / 1048576.0
    );
    out.insert(
        "remote_download".into(),
        json!({"mib": mib, "cellhost": a.to_json(), "cat": b.to_json(), "throughput_ratio": ratio, "rss_bytes": rss}),
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let n = samples();
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results/packages.json");
    // One part run: the other parts' last figures stay in the file.
    let mut out = match std::fs::read(&path) {
        Ok(bytes) if !only.is_empty() => match serde_json::from_slice(&bytes) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        },
        _ => serde_json::Map::new(),
    };
    let run = json!({
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "n": n,
        "loadavg": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    });
    for part in ["pip", "preload", "download"] {
        if only.is_empty() || only == part {
            out.insert(format!("run_{part}"), run.clone());
        }
    }
    println!("packages and remote files, p50 of {n} (interleaved with the reference; a shared machine: noisy)");
    if only.is_empty() || only == "pip" {
        pip_figures(n, &mut out).await?;
    }
    if only.is_empty() || only == "preload" {
        preload_figures(n, &mut out).await?;
    }
    if only.is_empty() || only == "download" {
        download_figures(n, &mut out).await?;
    }
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&serde_json::Value::Object(out))?,
    )?;
    println!("wrote {}", path.display());
    Ok(())
}
