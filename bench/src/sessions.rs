//! Many sessions, few kernels: `BENCH_SESSIONS` (10,000) sessions over a
//! manager capped at `BENCH_KERNELS` (64) live kernels. Each session's
//! first cell binds `x` to the session's number and a small list; then
//! `BENCH_ACCESSES` (2,000) cells go to sessions picked at random, each
//! checking its own `x`. With snapshots on, a session whose kernel was
//! evicted comes back with its state (`kernel.restored`); without them
//! every such cell reports `state_lost`. Prints p50/p99 of a random
//! session's next cell (against a warm session's cell in the same run),
//! how many kept their state, the host's RSS and the disk the data dir
//! uses.
//!
//! Usage: cellhost-bench-sessions [--python PATH] [--out FILE]
//! Environment: BENCH_SESSIONS, BENCH_KERNELS, BENCH_ACCESSES,
//! BENCH_SNAPSHOTS (1; 0 turns snapshots off for the comparison).

#[path = "args.rs"]
mod args;
#[allow(dead_code)]
#[path = "stats.rs"]
mod stats;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use args::{env_usize, Args};
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{Cell, KernelOptions};
use serde_json::json;
use stats::Summary;

/// Bytes allocated to regular files under `dir` (sparse volume images
/// count what they hold), never through a symlink.
fn disk_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => disk_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.blocks() * 512),
            _ => 0,
        })
        .sum()
}

/// A small, seeded generator (xorshift64*): the same accesses every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

fn ms(s: &Summary) -> serde_json::Value {
    json!({"p50_ms": s.p50 / 1e3, "p99_ms": s.p99 / 1e3, "n": s.n})
}

async fn run(args: &Args) -> Result<()> {
    let sessions = env_usize("BENCH_SESSIONS", 10_000)?;
    let kernels = env_usize("BENCH_KERNELS", 64)?;
    let accesses = env_usize("BENCH_ACCESSES", 2_000)?;
    // BENCH_SNAPSHOTS=0: the same run without snapshots (every evicted
    // session loses its state), for the comparison.
    let snapshots = env_usize("BENCH_SNAPSHOTS", 1)? != 0;
    if sessions == 0 || kernels == 0 {
        bail!("BENCH_SESSIONS and BENCH_KERNELS must be at least 1");
    }
    eprintln!(
        "sessions bench: {sessions} sessions over {kernels} kernels, {accesses} random cells, snapshots {}, python {}",
        if snapshots { "on" } else { "off" },
        args.python.display()
    );
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let m = KernelManager::start(
        ManagerOptions::new(&data)
            .kernel(
                KernelOptions::default()
                    .python(&args.python)
                    .runtime_dir(dir.path().join("run")),
            )
            .idle_timeout(None)
            .warm_pool(2)
            .max_kernels(kernels)
            .snapshots(snapshots.then_some(1 << 30)),
    )
    .await;
    let owner = |i: usize| format!("s-{i}");

    let t = Instant::now();
    for i in 0..sessions {
        let code = format!("x = {i}\nrows = list(range(100))");
        let r = m.execute(&owner(i), Cell::new(code)).await?;
        if !r.is_success() {
            bail!("the first cell of {} failed: {:?}", owner(i), r.error);
        }
        if i % 1000 == 999 {
            eprintln!(
                "  {} sessions made in {:.0} s",
                i + 1,
                t.elapsed().as_secs_f64()
            );
        }
    }
    let made = t.elapsed();

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut next, mut warm) = (Vec::with_capacity(accesses), Vec::with_capacity(accesses));
    let (mut kept, mut restored, mut lost) = (0usize, 0usize, 0usize);
    m.execute("warm", Cell::new("w = 1")).await?;
    for _ in 0..accesses {
        let t = Instant::now();
        m.execute("warm", Cell::new("w")).await?;
        warm.push(t.elapsed());
        let i = rng.below(sessions);
        let t = Instant::now();
        let r = m
            .execute(&owner(i), Cell::new("x if 'x' in globals() else None"))
            .await?;
        next.push(t.elapsed());
        if r.value.as_deref() == Some(i.to_string().as_str()) {
            kept += 1;
        }
        if r.kernel.restored.is_some() {
            restored += 1;
        }
        if r.kernel.state_lost {
            lost += 1;
        }
    }
    let host_rss = cellhost::kernel::rss_bytes(std::process::id()).unwrap_or(0);
    let disk = disk_bytes(&data);
    let live = m.list().len();
    m.shutdown().await;

    let next = Summary::of(&next).context("no samples")?;
    let warm = Summary::of(&warm).context("no samples")?;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "{sessions} sessions made in {:.1} s ({:.1} ms each)",
        made.as_secs_f64(),
        made.as_secs_f64() * 1e3 / sessions as f64
    );
    println!(
        "random session's next cell  p50 {:>8.3} ms  p99 {:>8.3} ms  ({:.1}x / {:.1}x a warm cell)",
        next.p50 / 1e3,
        next.p99 / 1e3,
        next.p50 / warm.p50,
        next.p99 / warm.p99,
    );
    println!(
        "state kept {kept}/{accesses} ({restored} restored from a snapshot, {lost} told state_lost); {live} kernels live"
    );
    println!(
        "host RSS {:.1} MiB, data dir {:.1} MiB on disk ({:.1} KiB per session)",
        mib(host_rss),
        mib(disk),
        disk as f64 / 1024.0 / sessions as f64
    );
    let figures = json!({
        "python": args.python,
        "snapshots": snapshots,
        "sessions": sessions,
        "max_kernels": kernels,
        "accesses": accesses,
        "make_seconds": made.as_secs_f64(),
        "next_cell": ms(&next),
        "warm_cell": ms(&warm),
        "ratio_next_to_warm_p50": next.p50 / warm.p50,
        "kept": kept,
        "restored": restored,
        "state_lost": lost,
        "host_rss_mib": mib(host_rss),
        "data_dir_mib": mib(disk),
    });
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&figures)? + "\n")
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("figures written to {}", args.out.display());
    Ok(())
}

fn main() {
    let args = match args::parse("bench/results/sessions.json") {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cellhost-bench-sessions: {e:#}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(&args)) {
        eprintln!("cellhost-bench-sessions: could not run: {e:#}");
        std::process::exit(1);
    }
}
