//! Snapshot and restore time against the floor: for 1 MB, 100 MB and
//! 1 GB of numpy state (random float64, so compression cannot hide the
//! size), a kernel's `snapshot_to` (the runner's pickling, the FIFO, zstd
//! and the atomic write) and a fresh kernel's `restore_from`, against
//! `pickle.dumps` / `pickle.loads` of the same array in a plain
//! interpreter, in the same run. Target: ≤ 1.5× the floor plus
//! compression.
//!
//! Then forks, through a `KernelManager`, by each path: the process path
//! (the source's runner forks; target ≤ 10 ms p50 whatever the state
//! size) and the snapshot path (forced by an open file in the source,
//! which the runner refuses to share with a forked child). For each: the
//! `fork` call alone, and the fork plus the new session's first reply,
//! against the way to the same state without a fork: a new session whose
//! first cell re-runs the cell that built it.
//!
//! Usage: cellhost-bench-snapshots [--python PATH] [--out FILE]
//! (PATH must have numpy.) Environment: BENCH_SIZES_MB (1,100,1000),
//! BENCH_REPS (5; 2 for sizes ≥ 500 MB).

#[path = "args.rs"]
mod args;
#[allow(dead_code)]
#[path = "stats.rs"]
mod stats;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use args::Args;
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{Cell, ForkPath, Kernel, KernelOptions};
use serde_json::json;
use stats::Summary;

const MAX: u64 = 4 << 30;

fn make(mb: usize) -> String {
    format!(
        "import numpy as np\na = np.random.default_rng(0).random({} // 8)",
        mb << 20
    )
}

/// `pickle.dumps` and `pickle.loads` of the same array in a plain
/// interpreter, each timed `reps` times.
fn floor(
    python: &std::path::Path,
    mb: usize,
    reps: usize,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let script = format!(
        "{}\nimport pickle, time, json\nd, l = [], []\nfor _ in range({reps}):\n    t = time.perf_counter()\n    b = pickle.dumps(a, protocol=5)\n    d.append(time.perf_counter() - t)\n    t = time.perf_counter()\n    pickle.loads(b)\n    l.append(time.perf_counter() - t)\n    del b\nprint(json.dumps([d, l]))",
        make(mb)
    );
    let out = Command::new(python).arg("-c").arg(&script).output()?;
    if !out.status.success() {
        bail!(
            "the floor script failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: (Vec<f64>, Vec<f64>) = serde_json::from_slice(&out.stdout)?;
    let d = |xs: Vec<f64>| xs.into_iter().map(Duration::from_secs_f64).collect();
    Ok((d(v.0), d(v.1)))
}

async fn kernel(python: &std::path::Path, dir: &tempfile::TempDir) -> Result<Kernel> {
    Ok(Kernel::spawn(
        KernelOptions::default()
            .python(python)
            .runtime_dir(dir.path()),
    )
    .await?)
}

fn ms(s: &Summary) -> serde_json::Value {
    json!({"p50_ms": s.p50 / 1e3, "min_ms": s.min / 1e3, "n": s.n})
}

async fn run(args: &Args) -> Result<()> {
    let sizes: Vec<usize> = std::env::var("BENCH_SIZES_MB")
        .unwrap_or_else(|_| "1,100,1000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .context("BENCH_SIZES_MB is a list of whole MB")
        })
        .collect::<Result<_>>()?;
    let reps_default = args::env_usize("BENCH_REPS", 5)?;
    let mut rows = Vec::new();
    for mb in sizes {
        let reps = if mb >= 500 {
            reps_default.min(2)
        } else {
            reps_default
        };
        let dir = tempfile::tempdir()?;
        let src = kernel(&args.python, &dir).await?;
        let r = src.execute(Cell::new(make(mb))).await?;
        if !r.is_success() {
            bail!(
                "making {mb} MB of state failed: {:?} (does {} have numpy?)",
                r.error,
                args.python.display()
            );
        }
        let path = dir.path().join("bench.zst");
        let (mut takes, mut loads) = (Vec::new(), Vec::new());
        let mut bytes = 0;
        for _ in 0..reps {
            let t = Instant::now();
            let s = src.snapshot_to(&path, MAX).await?;
            takes.push(t.elapsed());
            bytes = s.bytes;
            let fresh_dir = tempfile::tempdir()?;
            let fresh = kernel(&args.python, &fresh_dir).await?;
            let t = Instant::now();
            fresh.restore_from(&path, MAX).await?;
            loads.push(t.elapsed());
            fresh.shutdown().await;
        }
        src.shutdown().await;
        let (fd, fl) = floor(&args.python, mb, reps)?;
        let (take, load) = (Summary::of(&takes).unwrap(), Summary::of(&loads).unwrap());
        let (fd, fl) = (Summary::of(&fd).unwrap(), Summary::of(&fl).unwrap());
        println!(
            "{mb:>5} MB  snapshot p50 {:>9.1} ms = {:>5.2}x pickle.dumps ({:.1} ms)   restore p50 {:>9.1} ms = {:>5.2}x pickle.loads ({:.1} ms)   file {:.1} MB",
            take.p50 / 1e3,
            take.p50 / fd.p50,
            fd.p50 / 1e3,
            load.p50 / 1e3,
            load.p50 / fl.p50,
            fl.p50 / 1e3,
            bytes as f64 / 1e6,
        );
        let rebuild = Summary::of(&rebuilds(&args.python, mb, reps).await?).unwrap();
        let mut row = json!({
            "mb": mb, "reps": reps, "file_bytes": bytes,
            "snapshot": ms(&take), "restore": ms(&load),
            "pickle_dumps": ms(&fd), "pickle_loads": ms(&fl),
            "ratio_snapshot": take.p50 / fd.p50, "ratio_restore": load.p50 / fl.p50,
            "new_session_rerun": ms(&rebuild),
        });
        for path in [ForkPath::Process, ForkPath::Snapshot] {
            let (calls, replies) = forks(&args.python, mb, reps, path).await?;
            let (call, reply) = (Summary::of(&calls).unwrap(), Summary::of(&replies).unwrap());
            let name = serde_json::to_value(path)?;
            let name = name.as_str().unwrap_or("?");
            let target = if call.p50 <= 10e3 { "met" } else { "unmet" };
            println!(
                "{mb:>5} MB  {name:>8} fork p50 {:>9.1} ms (target 10 ms: {target})   to first reply p50 {:>9.1} ms = {:>5.2}x a new session re-running the cell ({:.1} ms)",
                call.p50 / 1e3,
                reply.p50 / 1e3,
                reply.p50 / rebuild.p50,
                rebuild.p50 / 1e3,
            );
            row[name] = json!({
                "fork": ms(&call), "fork_to_first_reply": ms(&reply),
                "ratio_fork_to_first_reply": reply.p50 / rebuild.p50,
            });
        }
        rows.push(row);
    }
    let figures = json!({"python": args.python, "sizes": rows});
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&figures)? + "\n")?;
    eprintln!("figures written to {}", args.out.display());
    Ok(())
}

fn manager(python: &std::path::Path, dir: &tempfile::TempDir) -> ManagerOptions {
    ManagerOptions::new(dir.path().join("data"))
        .kernel(KernelOptions::default().python(python))
        .warm_pool(0)
        .idle_timeout(None)
        .snapshots(Some(MAX))
}

/// `reps` forks by `path` of a session holding `mb` of state: each the
/// `fork` call alone, and the fork to its first reply.
async fn forks(
    python: &std::path::Path,
    mb: usize,
    reps: usize,
    path: ForkPath,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let dir = tempfile::tempdir()?;
    let m = KernelManager::start(manager(python, &dir)).await;
    let mut code = make(mb);
    if path == ForkPath::Snapshot {
        // An open file a forked child would share: the runner refuses.
        code.push_str(
            "
import os
_held = open(os.devnull)",
        );
    }
    let r = m.execute("src", Cell::new(code)).await?;
    if !r.is_success() {
        bail!("making {mb} MB of state failed: {:?}", r.error);
    }
    let (mut calls, mut replies) = (Vec::new(), Vec::new());
    for i in 0..reps {
        let target = format!("fork-{i}");
        let t = Instant::now();
        let report = m.fork("src", std::slice::from_ref(&target)).await?;
        calls.push(t.elapsed());
        let r = m.execute(&target, Cell::new("a.shape")).await?;
        replies.push(t.elapsed());
        let ran = report.into.first().map(|f| f.path);
        if ran != Some(path) {
            bail!("the fork took the {ran:?} path, not {path:?}: {report:?}");
        }
        if r.kernel.restored.is_none() || !r.is_success() {
            bail!("the fork's first cell did not have the state: {r:?}");
        }
        m.dispose_owner(&target).await;
    }
    m.shutdown().await;
    Ok((calls, replies))
}

/// `reps` new sessions whose first cell re-runs the cell that built the
/// state: the way to it without a fork.
async fn rebuilds(python: &std::path::Path, mb: usize, reps: usize) -> Result<Vec<Duration>> {
    let dir = tempfile::tempdir()?;
    let m = KernelManager::start(manager(python, &dir)).await;
    let mut times = Vec::new();
    for i in 0..reps {
        let fresh = format!("rebuild-{i}");
        let t = Instant::now();
        let r = m
            .execute(&fresh, Cell::new(format!("{}\na.shape", make(mb))))
            .await?;
        times.push(t.elapsed());
        if !r.is_success() {
            bail!("re-running the cell failed: {:?}", r.error);
        }
        m.dispose_owner(&fresh).await;
    }
    m.shutdown().await;
    Ok(times)
}

fn main() {
    let args = match args::parse("bench/results/snapshots.json") {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cellhost-bench-snapshots: {e:#}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(&args)) {
        eprintln!("cellhost-bench-snapshots: could not run: {e:#}");
        std::process::exit(1);
    }
}
