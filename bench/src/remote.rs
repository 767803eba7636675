//! Remote-kernel benchmark: a trivial cell (`x=1`) round trip over
//! multiplexed ssh and over `docker exec`, p50, beside the bare transport
//! (`ssh … true` on its own multiplexed connection, `docker exec … true`)
//! in the same run, samples interleaved so both see the same noise.
//! Target: cellhost ≤ 2.5× the bare round trip. Hermes-agent's remote
//! kernel polls every 0.5 s, so its cells cost ≥ 500 ms.
//!
//! Usage: scripts/bench-remote (starts and stops the test hosts). Reads
//! the CELLHOST_TEST_* variables of scripts/testenv-up. BENCH_N (200)
//! cells per figure; writes bench/results/remote.json.

#[allow(dead_code)]
#[path = "stats.rs"]
mod stats;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cellhost::config::{BackendConfig, DockerConfig, SshConfig};
use cellhost::registry::{KernelManager, KernelSpec, ManagerOptions};
use cellhost::{Cell, KernelOptions, Status};
use serde_json::json;
use stats::Summary;

fn env(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: run scripts/bench-remote"))
}

fn timed(cmd: &mut Command) -> Result<Duration> {
    let t = Instant::now();
    let st = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status()?;
    let d = t.elapsed();
    if !st.success() {
        bail!("{cmd:?} failed: {st}");
    }
    Ok(d)
}

async fn cell(m: &KernelManager, spec: &KernelSpec) -> Result<Duration> {
    let t = Instant::now();
    let r = m.execute_with("bench", spec, Cell::new("x=1")).await?;
    let d = t.elapsed();
    if r.status != Status::Success || !r.kernel.reused {
        bail!("a bench cell failed or was not warm: {r:?}");
    }
    Ok(d)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir()?;
    let (host, port, user, key) = (
        env("CELLHOST_TEST_SSH_HOST")?,
        env("CELLHOST_TEST_SSH_PORT")?,
        env("CELLHOST_TEST_SSH_USER")?,
        env("CELLHOST_TEST_SSH_KEY")?,
    );
    let container = env("CELLHOST_TEST_DOCKER_CONTAINER")?;
    let ssh = BackendConfig::Ssh(SshConfig {
        host: Some(host.clone()),
        user: Some(user.clone()),
        port: Some(port.parse()?),
        identity: Some(key.clone().into()),
        ..SshConfig::default()
    });
    let docker = BackendConfig::Docker(DockerConfig {
        container: Some(container.clone()),
        ..DockerConfig::default()
    });
    let opts = ManagerOptions::new(dir.path().join("data"))
        .kernel(KernelOptions::default().runtime_dir(dir.path().join("run")))
        .warm_pool(0)
        .idle_timeout(None)
        .backend("ssh", ssh)
        .backend("docker", docker);
    let m = KernelManager::start(opts).await;

    // The bare reference: its own multiplexed master, same options.
    let cp = dir.path().join("bare-cm");
    let ssh_base = |extra: &[&str]| {
        let mut c = Command::new("ssh");
        c.args(["-p", &port, "-i", &key, "-l", &user, "-o", "BatchMode=yes"])
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
            ])
            .args([
                "-o",
                "LogLevel=ERROR",
                "-o",
                &format!("ControlPath={}", cp.display()),
            ])
            .args(extra);
        c
    };
    let st = ssh_base(&["-M", "-N", "-f", "-o", "ControlPersist=120", &host])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !st.success() {
        bail!("cannot start the bare ssh master to {host}");
    }

    let mut out = serde_json::Map::new();
    println!(
        "remote kernels, trivial cell round trip, p50 of {n} (interleaved with the bare transport)"
    );
    for (name, spec) in [
        ("ssh", KernelSpec::default().backend("ssh")),
        ("docker", KernelSpec::default().backend("docker")),
    ] {
        let mut bare = Vec::with_capacity(n);
        let mut ours = Vec::with_capacity(n);
        m.execute_with("bench", &spec, Cell::new("x=1")).await?;
        for _ in 0..n.min(20) {
            cell(&m, &spec).await?;
        }
        for _ in 0..n {
            bare.push(match name {
                "ssh" => timed(ssh_base(&["-T", &host, "true"]).stdin(Stdio::null()))?,
                _ => timed(
                    Command::new("docker")
                        .args(["exec", "-i", &container, "true"])
                        .stdin(Stdio::null()),
                )?,
            });
            ours.push(cell(&m, &spec).await?);
        }
        let b = Summary::of(&bare).expect("samples");
        let o = Summary::of(&ours).expect("samples");
        let ratio = o.p50 / b.p50;
        println!(
            "  {name:<7} bare `{}` {:>8.2} ms   cellhost x=1 {:>8.2} ms   ratio {:.2}x (target <= 2.5x){}",
            if name == "ssh" { "ssh … true" } else { "docker exec … true" },
            b.p50 / 1e3,
            o.p50 / 1e3,
            ratio,
            if ratio <= 2.5 { "" } else { "  MISSED" }
        );
        out.insert(
            name.into(),
            json!({"bare": b.to_json(), "cellhost": o.to_json(), "ratio_p50": ratio}),
        );
    }
    m.shutdown().await;
    let _ = ssh_base(&["-O", "exit", &host])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results/remote.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&serde_json::Value::Object(out))?,
    )?;
    println!("wrote {}", path.display());
    Ok(())
}
